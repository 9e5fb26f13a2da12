/* kiln built without CUDA: the CUDA entry points say so (see include/kiln/cuda.h). */
#ifndef KILN_HAVE_CUDA
#include "kiln/cuda.h"

static kiln_error *no_cuda(void) {
    return kiln_errorf(KILN_EUNSUPPORTED, "this kiln was built without CUDA (nvcc was not found at build time)");
}
int kiln_cuda_built(void) { return 0; }
int kiln_cuda_pdl(void) { return 0; }
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
kiln_error *kiln_cuda_device_count(int *n) { *n = 0; return no_cuda(); }
kiln_error *kiln_cuda_set_device(int device) { (void)device; return no_cuda(); }
kiln_error *kiln_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return no_cuda();
}
kiln_error *kiln_cuda_alloc(void **p, size_t bytes) { (void)bytes, *p = NULL; return no_cuda(); }
void kiln_cuda_free(void *p) { (void)p; }
kiln_error *kiln_cuda_device_sync(void) { return no_cuda(); }
kiln_error *kiln_cuda_copy(void *dst, const void *src, size_t bytes, kiln_cuda_copy_kind kind) {
    (void)dst, (void)src, (void)bytes, (void)kind;
    return no_cuda();
}
kiln_error *kiln_cuda_event_record(void **ev, void *stream) { (void)ev, (void)stream; return no_cuda(); }
kiln_error *kiln_cuda_event_sync(void *ev) { (void)ev; return no_cuda(); }
void kiln_cuda_event_free(void *ev) { (void)ev; }

/* the NCCL backend needs CUDA */
#include "kiln/comm.h"
kiln_error *kiln_comm_nccl_unique_id(unsigned char id[KILN_NCCL_ID_BYTES]) { (void)id; return no_cuda(); }
kiln_error *kiln_comm_nccl_create(const unsigned char id[KILN_NCCL_ID_BYTES], int nranks, int rank, int device,
                                  kiln_comm *boot, kiln_comm **out) {
    (void)id, (void)nranks, (void)rank, (void)device, (void)boot;
    *out = NULL;
    return no_cuda();
}
kiln_error *kiln_comm_nccl_from(kiln_comm *boot, kiln_comm **out) { (void)boot, *out = NULL; return no_cuda(); }
kiln_error *kiln_comm_pick_gpus(kiln_comm *boot, int per_rank, int *dev0) {
    (void)boot, (void)per_rank, *dev0 = -1;
    return no_cuda();
}
kiln_error *kiln_comm_nccl_version(char *buf, size_t n) { (void)buf, (void)n; return no_cuda(); }
#else
typedef int kiln_nocuda_unused; /* ISO C forbids an empty translation unit */
#endif
