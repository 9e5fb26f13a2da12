/* kiln built without CUDA: the CUDA entry points say so (see include/kiln/cuda.h). */
#ifndef KILN_HAVE_CUDA
#include "kiln/cuda.h"

static kiln_error *no_cuda(void) {
    return kiln_errorf(KILN_EUNSUPPORTED, "this kiln was built without CUDA (nvcc was not found at build time)");
}
int kiln_cuda_built(void) { return 0; }
kiln_error *kiln_cuda_device_info(kiln_cuda_info *info) { (void)info; return no_cuda(); }
kiln_error *kiln_cuda_gemm_type_parse(const char *name, kiln_cuda_gemm_type *out) { (void)name, (void)out; return no_cuda(); }
kiln_error *kiln_cuda_gemm_time(kiln_cuda_gemm_type t, int64_t m, int64_t n, int64_t k, const char *layout, int iters,
                                int warmup, double *us) {
    (void)t, (void)m, (void)n, (void)k, (void)layout, (void)iters, (void)warmup, (void)us;
    return no_cuda();
}
kiln_error *kiln_cuda_membw(const char *kernel, size_t bytes, int iters, double *best_gbs, double *avg_gbs) {
    (void)kernel, (void)bytes, (void)iters, (void)best_gbs, (void)avg_gbs;
    return no_cuda();
}
kiln_error *kiln_cuda_hostbw(int dir, size_t bytes, int iters, double *best_gbs, double *avg_gbs) {
    (void)dir, (void)bytes, (void)iters, (void)best_gbs, (void)avg_gbs;
    return no_cuda();
}
#else
typedef int kiln_nocuda_unused; /* ISO C forbids an empty translation unit */
#endif
