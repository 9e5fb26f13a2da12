// RMSNorm on the device: one block per row for the statistics; the backward walks a chunk of rows per
// block, writing dx row by row and keeping that chunk's dw partial sums (each thread owns its columns), so
// dw = a fixed-order sum of the chunks' partials: deterministic.
#include "ops_common.cuh"

template <typename TX>
static __global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d,
                                          float eps) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const TX *xr = x + r * d;
        float ss = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float v = ld(xr, j);
            ss += v * v;
        }
        ss = block_sum(ss, sh);
        const float rs = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));
        if (rstd && threadIdx.x == 0) rstd[r] = rs;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) st(y, r * d + j, w[j] * (ld(xr, j) * rs));
    }
}

// block c: rows [c*rows_per, (c+1)*rows_per); dwp: [chunks, d] partials (NULL: no dw)
template <typename TX, typename TDX>
static __global__ void rmsnorm_bwd_kernel(TDX *dx, float *dwp, const bf16 *dy, const TX *x, const float *w,
                                          const float *rstd, int64_t n, int64_t d, int64_t rows_per) {
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    float *part = dwp ? dwp + blockIdx.x * d : NULL;
    if (part)
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) part[j] = 0;
    for (int64_t r = r0; r < r1; r++) {
        const TX *xr = x + r * d;
        const bf16 *gr = dy + r * d;
        const float rs = rstd[r];
        if (part)
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x) part[j] += ld(gr, j) * (ld(xr, j) * rs);
        if (!dx) continue;
        float dot = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += ld(gr, j) * w[j] * ld(xr, j);
        dot = block_sum(dot, sh);
        const float c = dot * rs * rs * rs / (float)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float v = rs * ld(gr, j) * w[j] - c * ld(xr, j);
            if (sizeof(TDX) == 4) v += ld(dx, r * d + j); // f32 gradients accumulate, bf16 ones are written
            st(dx, r * d + j, v);
        }
    }
}

static int threads_for_row(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : 64; }

template <typename TX>
static kiln_error *rmsnorm_fwd(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d, float eps,
                               void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    rmsnorm_fwd_kernel<TX><<<(int)(n < 1048576 ? n : 1048576), threads_for_row(d), 0, (cudaStream_t)stream>>>(
        y, rstd, x, w, n, d, eps);
    LAUNCH_CHECK("rmsnorm forward");
done:
    return err;
}

template <typename TX, typename TDX>
static kiln_error *rmsnorm_bwd(TDX *dx, float *dw, const bf16 *dy, const TX *x, const float *w, const float *rstd,
                               int64_t n, int64_t d, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *part = NULL;
    const int64_t rows_per = chunk_rows(n, 512), chunks = (n + rows_per - 1) / rows_per;
    if (n <= 0 || d <= 0 || (!dx && !dw)) return NULL;
    if (dw) CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(chunks * d) * sizeof(float), st));
    rmsnorm_bwd_kernel<TX, TDX><<<(int)chunks, threads_for_row(d), 0, st>>>(dx, part, (const bf16 *)dy, x, w, rstd, n,
                                                                             d, rows_per);
    LAUNCH_CHECK("rmsnorm backward");
    if (dw) CUDA_TRY(colsum_add(dw, part, chunks, d, st));
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}

extern "C" kiln_error *kiln_rmsnorm_forward_cuda(kiln_bf16 *y, float *rstd, const float *x, const float *w, int64_t n,
                                                 int64_t d, float eps, void *stream) {
    return rmsnorm_fwd<float>((bf16 *)y, rstd, x, w, n, d, eps, stream);
}
extern "C" kiln_error *kiln_rmsnorm_forward_bf16_cuda(kiln_bf16 *y, float *rstd, const kiln_bf16 *x, const float *w,
                                                      int64_t n, int64_t d, float eps, void *stream) {
    return rmsnorm_fwd<bf16>((bf16 *)y, rstd, (const bf16 *)x, w, n, d, eps, stream);
}
extern "C" kiln_error *kiln_rmsnorm_backward_cuda(float *dx, float *dw, const kiln_bf16 *dy, const float *x,
                                                  const float *w, const float *rstd, int64_t n, int64_t d,
                                                  void *stream) {
    return rmsnorm_bwd<float, float>(dx, dw, (const bf16 *)dy, x, w, rstd, n, d, stream);
}
extern "C" kiln_error *kiln_rmsnorm_backward_bf16_cuda(kiln_bf16 *dx, float *dw, const kiln_bf16 *dy,
                                                       const kiln_bf16 *x, const float *w, const float *rstd,
                                                       int64_t n, int64_t d, void *stream) {
    return rmsnorm_bwd<bf16, bf16>((bf16 *)dx, dw, (const bf16 *)dy, (const bf16 *)x, w, rstd, n, d, stream);
}
