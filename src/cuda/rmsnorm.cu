// RMSNorm on the device: one block per row for the statistics; the backward walks a chunk of rows per
// block, writing dx row by row and keeping that chunk's dw partial sums (each thread owns its columns), so
// dw = a fixed-order sum of the chunks' partials: deterministic. Rows of up to 8192 columns (16-byte
// accesses) keep the row and the partials in registers (rmsnorm_bwd_reg_kernel); wider or unaligned ones
// go through memory.
#include "ops_common.cuh"

// V = 4: rows walked in 16-byte (f32) / 8-byte (bf16) accesses (d % 4 == 0, aligned rows)
template <typename TX, int V>
static __global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d,
                                          float eps) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const TX *xr = x + r * d;
        float ss = 0, xv[V], wv[V], yv[V];
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
            ldv<V>(xr, j, xv);
#pragma unroll
            for (int k = 0; k < V; k++) ss += xv[k] * xv[k];
        }
        ss = block_sum(ss, sh);
        const float rs = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));
        if (rstd && threadIdx.x == 0) rstd[r] = rs;
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
            ldv<V>(xr, j, xv), ldv<V>(w, j, wv);
#pragma unroll
            for (int k = 0; k < V; k++) yv[k] = wv[k] * (xv[k] * rs);
            stv<V>(y, r * d + j, yv);
        }
    }
}

// block c: rows [c*rows_per, (c+1)*rows_per); dwp: [chunks, d] partials (NULL: no dw)
template <typename TX, typename TDX, int V>
static __global__ void rmsnorm_bwd_kernel(TDX *dx, float *dwp, const bf16 *dy, const TX *x, const float *w,
                                          const float *rstd, int64_t n, int64_t d, int64_t rows_per) {
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    float *part = dwp ? dwp + blockIdx.x * d : NULL;
    float xv[V], gv[V], wv[V], pv[V], dv[V];
    if (part) // zeroed with the same ownership of columns as the updates below
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
#pragma unroll
            for (int k = 0; k < V; k++) pv[k] = 0.0f;
            stv<V>(part, j, pv);
        }
    for (int64_t r = r0; r < r1; r++) {
        const TX *xr = x + r * d;
        const bf16 *gr = dy + r * d;
        const float rs = rstd[r];
        float dot = 0;
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
            ldv<V>(xr, j, xv), ldv<V>(gr, j, gv), ldv<V>(w, j, wv);
            if (part) { // each thread owns its columns of the partial: no race; explicit roundings so that dw does
                        // not depend on whether dx is asked for (contraction differs between loop versions)
                ldv<V>(part, j, pv);
#pragma unroll
                for (int k = 0; k < V; k++) pv[k] = __fadd_rn(pv[k], __fmul_rn(gv[k], __fmul_rn(xv[k], rs)));
                stv<V>(part, j, pv);
            }
#pragma unroll
            for (int k = 0; k < V; k++) dot += gv[k] * wv[k] * xv[k];
        }
        if (!dx) continue;
        dot = block_sum(dot, sh);
        const float c = dot * rs * rs * rs / (float)d;
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
            ldv<V>(xr, j, xv), ldv<V>(gr, j, gv), ldv<V>(w, j, wv);
            if constexpr (sizeof(TDX) == 4) ldv<V>(dx + r * d, j, dv); // f32 gradients accumulate
            else
#pragma unroll
                for (int k = 0; k < V; k++) dv[k] = 0.0f; // bf16 ones are written
#pragma unroll
            for (int k = 0; k < V; k++) dv[k] += rs * gv[k] * wv[k] - c * xv[k];
            stv<V>(dx + r * d, j, dv);
        }
    }
}

// The same backward with the row kept in registers between its dot product and dx (each input read once,
// a row's loads issued together before its reduction: one memory latency per row), w and the dw partial in
// registers over the chunk: NV units of V columns per thread, unit k at column (threadIdx.x + k*blockDim.x)*V.
// Same arithmetic as above, so the same dw bits.
template <typename TX, typename TDX, int V, int NV>
static __global__ void __launch_bounds__(512)
    rmsnorm_bwd_reg_kernel(TDX *dx, float *dwp, const bf16 *dy, const TX *x, const float *w, const float *rstd,
                           int64_t n, int d, int64_t rows_per) {
    __shared__ float sh[32];
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    float pw[NV][V], wv[NV][V];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int j = (threadIdx.x + k * blockDim.x) * V;
#pragma unroll
        for (int q = 0; q < V; q++) pw[k][q] = 0.0f, wv[k][q] = 0.0f;
        if (j < d) ldv<V>(w, j, wv[k]);
    }
    for (int64_t r = r0; r < r1; r++) {
        const float rs = rstd[r];
        float xv[NV][V], gv[NV][V], dv[NV][V], dot = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = (threadIdx.x + k * blockDim.x) * V;
            if (j >= d) continue;
            ldv<V>(x + r * d, j, xv[k]), ldv<V>(dy + r * d, j, gv[k]);
            if constexpr (sizeof(TDX) == 4) { // f32 gradients accumulate
                if (dx) ldv<V>(dx + r * d, j, dv[k]);
            } else {
#pragma unroll
                for (int q = 0; q < V; q++) dv[k][q] = 0.0f; // bf16 ones are written
            }
#pragma unroll
            for (int q = 0; q < V; q++) {
                pw[k][q] = __fadd_rn(pw[k][q], __fmul_rn(gv[k][q], __fmul_rn(xv[k][q], rs)));
                dot += gv[k][q] * wv[k][q] * xv[k][q];
            }
        }
        if (!dx) continue;
        dot = block_sum(dot, sh);
        const float c = dot * rs * rs * rs / (float)d;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = (threadIdx.x + k * blockDim.x) * V;
            if (j >= d) continue;
#pragma unroll
            for (int q = 0; q < V; q++) dv[k][q] += rs * gv[k][q] * wv[k][q] - c * xv[k][q];
            stv<V>(dx + r * d, j, dv[k]);
        }
    }
    if (dwp)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int j = (threadIdx.x + k * blockDim.x) * V;
            if (j < d) stv<V>(dwp + blockIdx.x * (int64_t)d, j, pw[k]);
        }
}

static int threads_for_row(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : d >= 128 ? 64 : 32; }

template <typename TX>
static kiln_error *rmsnorm_fwd(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d, float eps,
                               void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int grid = (int)(n < 1048576 ? n : 1048576);
    if (d % 4 == 0 && aligned16(y) && aligned16(x) && aligned16(w))
        rmsnorm_fwd_kernel<TX, 4><<<grid, threads_for_row(d / 4), 0, (cudaStream_t)stream>>>(y, rstd, x, w, n, d, eps);
    else
        rmsnorm_fwd_kernel<TX, 1><<<grid, threads_for_row(d), 0, (cudaStream_t)stream>>>(y, rstd, x, w, n, d, eps);
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
    const int vec = d % 4 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w);
    const int64_t units = vec ? d / 4 : d;
    const int threads = units >= 512 ? 512 : (int)((units + 31) / 32 * 32);
    const int64_t nv = (units + threads - 1) / threads;
    // narrow rows make small blocks: more chunks, so that enough rows are in flight (512 per block of 512)
    const int64_t target = vec && nv <= 4 ? 512 * (512 / threads) : 512;
    const int64_t rows_per = chunk_rows(n, target), chunks = (n + rows_per - 1) / rows_per;
    if (n <= 0 || d <= 0 || (!dx && !dw)) return NULL;
    if (dw) CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(chunks * d) * sizeof(float), st));
    if (vec && nv <= 4) { // registers hold the row: the common widths
        const int di = (int)d;
        if (nv == 1)
            rmsnorm_bwd_reg_kernel<TX, TDX, 4, 1><<<(int)chunks, threads, 0, st>>>(dx, part, (const bf16 *)dy, x, w, rstd, n, di, rows_per);
        else if (nv == 2)
            rmsnorm_bwd_reg_kernel<TX, TDX, 4, 2><<<(int)chunks, threads, 0, st>>>(dx, part, (const bf16 *)dy, x, w, rstd, n, di, rows_per);
        else
            rmsnorm_bwd_reg_kernel<TX, TDX, 4, 4><<<(int)chunks, threads, 0, st>>>(dx, part, (const bf16 *)dy, x, w, rstd, n, di, rows_per);
    } else if (vec)
        rmsnorm_bwd_kernel<TX, TDX, 4><<<(int)chunks, threads_for_row(d / 4), 0, st>>>(dx, part, (const bf16 *)dy, x, w,
                                                                                     rstd, n, d, rows_per);
    else
        rmsnorm_bwd_kernel<TX, TDX, 1><<<(int)chunks, threads_for_row(d), 0, st>>>(dx, part, (const bf16 *)dy, x, w, rstd,
                                                                                 n, d, rows_per);
    LAUNCH_CHECK("rmsnorm backward");
    if (dw) CUDA_TRY(colsum_add(dw, part, chunks, d, st));
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}

// The f32 form runs residual_norm.cu's row kernel (y = x, no join) for the widths that kernel takes, so that a
// norm computed here and one fused into a residual join (the model's ln1 with and without recomputation)
// give the same bits.
extern "C" kiln_error *kiln_rmsnorm_forward_cuda(kiln_bf16 *y, float *rstd, const float *x, const float *w, int64_t n,
                                                 int64_t d, float eps, void *stream) {
    const int64_t widest = d % 4 == 0 && aligned16(y) && aligned16(x) && aligned16(w) ? 16384 : 4096;
    if (d <= widest)
        return kiln_residual_norm_forward_cuda(NULL, y, rstd, x, NULL, NULL, NULL, NULL, NULL, NULL, w, n, d, eps, stream);
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
