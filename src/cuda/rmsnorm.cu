// RMSNorm on the device: one block per row for the statistics; the backward walks a chunk of rows per
// block, writing dx row by row and keeping that chunk's dw partial sums (each thread owns its columns), so
// dw = a fixed-order sum of the chunks' partials: deterministic. Rows of up to 8192 columns (16-byte
// accesses) keep the row and the partials in registers (rmsnorm_bwd_reg_kernel); wider or unaligned ones
// go through memory.
#include "ops_common.cuh"
#include "launch.cuh"

// V = 4: rows walked in 16-byte (f32) / 8-byte (bf16) accesses (d % 4 == 0, aligned rows)
template <typename TX, int V>
static __global__ void rmsnorm_fwd_kernel(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d,
                                          float eps) {
    pdl_wait();
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
    pdl_wait();
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
    pdl_wait();
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

// Narrow bf16 rows (d % 4 == 0, d <= 512: the router's norm, 256 wide): one warp per row, U units of 4 values
// (8-byte accesses) per lane, 8 rows per block of 256 threads. The kernels above give such a row a block of 64
// threads and a block-wide reduction per row: at 16384 rows of 512 bytes that was mostly launch and barrier
// time (forward ~16 us, backward ~29 us a call for ~4 / ~6 us of bytes). The kernels above stay for the
// f32 form, wider rows, and rows whose width or alignment the 8-byte accesses do not fit.
enum { NARROW_MAX = 512 };
template <int U>
static __global__ void __launch_bounds__(256)
    rmsnorm_fwd_warp_kernel(bf16 *y, float *rstd, const bf16 *x, const float *w, int64_t n, int d, float eps) {
    pdl_wait();
    const int lane = threadIdx.x & 31, nu = d / 4;
    const int64_t step = (int64_t)gridDim.x * 8;
    for (int64_t r = blockIdx.x * (int64_t)8 + (threadIdx.x >> 5); r < n; r += step) {
        float xv[U][4], ss = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = lane + u * 32;
            if (k >= nu) continue;
            ldv<4>(x + r * d, k * 4, xv[u]);
#pragma unroll
            for (int q = 0; q < 4; q++) ss += xv[u][q] * xv[u][q];
        }
        ss = warp_sum(ss);
        const float rs = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));
        if (rstd && lane == 0) rstd[r] = rs;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = lane + u * 32;
            if (k >= nu) continue;
            float wv[4], yv[4];
            ldv<4>(w, k * 4, wv);
#pragma unroll
            for (int q = 0; q < 4; q++) yv[q] = wv[q] * (xv[u][q] * rs);
            stv<4>(y + r * d, k * 4, yv);
        }
    }
}
// block c: rows [c*rows_per, ...), warp i of the block takes rows r0 + i, r0 + i + 8, ...; dx bf16 written (NULL:
// not wanted); dwp [chunks, d]: the 8 warps' partials added in warp order (NULL: no dw)
template <int U>
static __global__ void __launch_bounds__(256)
    rmsnorm_bwd_warp_kernel(bf16 *dx, float *dwp, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                            int64_t n, int d, int64_t rows_per) {
    pdl_wait();
    __shared__ float sp[8][NARROW_MAX];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nu = d / 4;
    const int64_t r0 = blockIdx.x * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    float pw[U][4], wv[U][4];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int k = lane + u * 32;
#pragma unroll
        for (int q = 0; q < 4; q++) pw[u][q] = 0.0f, wv[u][q] = 0.0f;
        if (k < nu) ldv<4>(w, k * 4, wv[u]);
    }
    for (int64_t r = r0 + wi; r < r1; r += 8) {
        const float rs = rstd[r];
        float xv[U][4], gv[U][4], dot = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = lane + u * 32;
            if (k >= nu) continue;
            ldv<4>(x + r * d, k * 4, xv[u]), ldv<4>(dy + r * d, k * 4, gv[u]);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                pw[u][q] = __fadd_rn(pw[u][q], __fmul_rn(gv[u][q], __fmul_rn(xv[u][q], rs)));
                dot += gv[u][q] * wv[u][q] * xv[u][q];
            }
        }
        if (!dx) continue;
        dot = warp_sum(dot);
        const float c = dot * rs * rs * rs / (float)d;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = lane + u * 32;
            if (k >= nu) continue;
            float dv[4];
#pragma unroll
            for (int q = 0; q < 4; q++) dv[q] = rs * gv[u][q] * wv[u][q] - c * xv[u][q];
            stv<4>(dx + r * d, k * 4, dv);
        }
    }
    if (!dwp) return; // the same for the whole block
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int k = lane + u * 32;
        if (k < nu)
#pragma unroll
            for (int q = 0; q < 4; q++) sp[wi][k * 4 + q] = pw[u][q];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float t = sp[0][j];
        for (int i = 1; i < 8; i++) t = __fadd_rn(t, sp[i][j]);
        dwp[blockIdx.x * (int64_t)d + j] = t;
    }
}
static int narrow_units(int64_t d) { // U for a row of d bf16, 0: not narrow
    const int64_t per_lane = (d / 4 + 31) / 32;
    return d % 4 != 0 || d > NARROW_MAX ? 0 : per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : 4;
}

static int threads_for_row(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : d >= 128 ? 64 : 32; }

template <typename TX>
static kiln_error *rmsnorm_fwd(bf16 *y, float *rstd, const TX *x, const float *w, int64_t n, int64_t d, float eps,
                               void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int grid = (int)(n < 1048576 ? n : 1048576);
    const int U = sizeof(TX) == 2 && aligned16(y) && aligned16(x) && aligned16(w) ? narrow_units(d) : 0;
    if (U) {
        const int g8 = (int)((n + 7) / 8 < 1048576 ? (n + 7) / 8 : 1048576);
        const bf16 *xb = (const bf16 *)x;
        if (U == 1) kiln_launch(rmsnorm_fwd_warp_kernel<1>, g8, 256, 0, (cudaStream_t)stream, y, rstd, xb, w, n,
                                (int)d, eps);
        else if (U == 2) kiln_launch(rmsnorm_fwd_warp_kernel<2>, g8, 256, 0, (cudaStream_t)stream, y, rstd, xb, w, n,
                                     (int)d, eps);
        else kiln_launch(rmsnorm_fwd_warp_kernel<4>, g8, 256, 0, (cudaStream_t)stream, y, rstd, xb, w, n, (int)d,
                         eps);
    } else if (d % 4 == 0 && aligned16(y) && aligned16(x) && aligned16(w))
        kiln_launch(rmsnorm_fwd_kernel<TX, 4>, grid, threads_for_row(d / 4), 0, (cudaStream_t)stream, y, rstd, x, w,
                    n, d, eps);
    else
        kiln_launch(rmsnorm_fwd_kernel<TX, 1>, grid, threads_for_row(d), 0, (cudaStream_t)stream, y, rstd, x, w, n, d,
                    eps);
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
    if (sizeof(TX) == 2 && sizeof(TDX) == 2 && vec && narrow_units(d)) {
        // narrow bf16 rows: a warp per row (~512 chunks of rows; the dw partials summed in one coalesced launch)
        const int U = narrow_units(d);
        const int64_t rp = chunk_rows(n, 512), nc = (n + rp - 1) / rp;
        bf16 *dxb = (bf16 *)dx;
        const bf16 *xb = (const bf16 *)x;
        if (dw) CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(nc * d) * sizeof(float), st));
        if (U == 1) kiln_launch(rmsnorm_bwd_warp_kernel<1>, (int)nc, 256, 0, st, dxb, part, (const bf16 *)dy, xb, w,
                                rstd, n, (int)d, rp);
        else if (U == 2) kiln_launch(rmsnorm_bwd_warp_kernel<2>, (int)nc, 256, 0, st, dxb, part, (const bf16 *)dy, xb,
                                     w, rstd, n, (int)d, rp);
        else kiln_launch(rmsnorm_bwd_warp_kernel<4>, (int)nc, 256, 0, st, dxb, part, (const bf16 *)dy, xb, w, rstd, n,
                         (int)d, rp);
        LAUNCH_CHECK("rmsnorm backward");
        if (dw) CUDA_TRY(colsum_add_multi(&dw, 1, part, nc, d, st));
        goto done;
    }
    if (dw) CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(chunks * d) * sizeof(float), st));
    if (vec && nv <= 4) { // registers hold the row: the common widths
        const int di = (int)d;
        if (nv == 1)
            kiln_launch(rmsnorm_bwd_reg_kernel<TX, TDX, 4, 1>, (int)chunks, threads, 0, st, dx, part,
                        (const bf16 *)dy, x, w, rstd, n, di, rows_per);
        else if (nv == 2)
            kiln_launch(rmsnorm_bwd_reg_kernel<TX, TDX, 4, 2>, (int)chunks, threads, 0, st, dx, part,
                        (const bf16 *)dy, x, w, rstd, n, di, rows_per);
        else
            kiln_launch(rmsnorm_bwd_reg_kernel<TX, TDX, 4, 4>, (int)chunks, threads, 0, st, dx, part,
                        (const bf16 *)dy, x, w, rstd, n, di, rows_per);
    } else if (vec)
        kiln_launch(rmsnorm_bwd_kernel<TX, TDX, 4>, (int)chunks, threads_for_row(d / 4), 0, st, dx, part,
                    (const bf16 *)dy, x, w, rstd, n, d, rows_per);
    else
        kiln_launch(rmsnorm_bwd_kernel<TX, TDX, 1>, (int)chunks, threads_for_row(d), 0, st, dx, part,
                    (const bf16 *)dy, x, w, rstd, n, d, rows_per);
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
