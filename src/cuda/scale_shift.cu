// ZAYA's residual scaling y = (x + b) * s on the device, f32. The backward gives each block a tile of
// columns and a chunk of rows: dx directly, db/ds as per-chunk partials summed in a fixed order.
#include "ops_common.cuh"
#include "launch.cuh"

// a row per block iteration, channels across the threads (no division per element); V = 4: 16-byte accesses
template <int V>
static __global__ void scale_shift_fwd_kernel(float *y, const float *x, const float *b, const float *s, int64_t n,
                                              int64_t d, int accumulate) {
    pdl_wait();
    float xv[V], bv[V], sv[V], yv[V];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
            ldv<V>(x + r * d, j, xv), ldv<V>(b, j, bv), ldv<V>(s, j, sv);
            if (accumulate) ldv<V>(y + r * d, j, yv);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float v = (xv[k] + bv[k]) * sv[k];
                yv[k] = accumulate ? yv[k] + v : v;
            }
            stv<V>(y + r * d, j, yv);
        }
    }
}

// grid (column tiles, row chunks), V columns per thread; dbp/dsp: [chunks, d] partials (NULL: not wanted);
// dx accumulates, or with write is written (the caller then needs no zeroing pass)
template <int V>
static __global__ void scale_shift_bwd_kernel(float *dx, float *dbp, float *dsp, const float *dy, const float *x,
                                              const float *b, const float *s, int64_t n, int64_t d, int64_t rows_per,
                                              int write) {
    pdl_wait();
    const int64_t j = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V;
    if (j >= d) return;
    const int64_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    float sv[V], bv[V], pb[V], ps[V], g[V], xv[V], dv[V];
    ldv<V>(s, j, sv);
#pragma unroll
    for (int k = 0; k < V; k++) bv[k] = 0.0f, pb[k] = 0.0f, ps[k] = 0.0f;
    if (b) ldv<V>(b, j, bv);
    // explicit roundings (no fused multiply-add): the sums must not depend on which outputs are asked for,
    // and the compiler contracts differently in the loop versions it makes for them
    for (int64_t r = r0; r < r1; r++) {
        float gs[V];
        ldv<V>(dy + r * d, j, g);
#pragma unroll
        for (int k = 0; k < V; k++) gs[k] = __fmul_rn(g[k], sv[k]);
        if (dx && write) {
            stv<V>(dx + r * d, j, gs);
        } else if (dx) {
            ldv<V>(dx + r * d, j, dv);
#pragma unroll
            for (int k = 0; k < V; k++) dv[k] = __fadd_rn(dv[k], gs[k]);
            stv<V>(dx + r * d, j, dv);
        }
        if (dsp) ldv<V>(x + r * d, j, xv);
#pragma unroll
        for (int k = 0; k < V; k++) {
            pb[k] = __fadd_rn(pb[k], gs[k]);
            if (dsp) ps[k] = __fadd_rn(ps[k], __fmul_rn(g[k], __fadd_rn(xv[k], bv[k])));
        }
    }
    if (dbp) stv<V>(dbp + blockIdx.y * d, j, pb);
    if (dsp) stv<V>(dsp + blockIdx.y * d, j, ps);
}

extern "C" kiln_error *kiln_scale_shift_forward_cuda(float *y, const float *x, const float *b, const float *s, int64_t n,
                                                     int64_t d, int accumulate, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int grid = (int)(n < 65535 ? n : 65535);
    if (d % 4 == 0 && aligned16(y) && aligned16(x) && aligned16(b) && aligned16(s))
        kiln_launch(scale_shift_fwd_kernel<4>, grid, d >= 2048 ? 256 : d >= 512 ? 128 : 32, 0, (cudaStream_t)stream,
                    y, x, b, s, n, d, accumulate);
    else
        kiln_launch(scale_shift_fwd_kernel<1>, grid, d >= 1024 ? 256 : d >= 256 ? 128 : 64, 0, (cudaStream_t)stream,
                    y, x, b, s, n, d, accumulate);
    LAUNCH_CHECK("scale_shift forward");
done:
    return err;
}

static kiln_error *scale_shift_bwd(float *dx, float *db, float *ds, const float *dy, const float *x, const float *b,
                                   const float *s, int64_t n, int64_t d, int write, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *dbp = NULL, *dsp = NULL;
    const int vec = d % 4 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(b) && aligned16(s);
    const int64_t dv = vec ? d / 4 : d; // threads' worth of columns
    const int threads = dv >= 256 ? 256 : 64;
    const int64_t tiles = (dv + threads - 1) / threads;
    const int64_t rows_per = chunk_rows(n, tiles >= 512 ? 1 : 1024 / tiles > 1 ? 1024 / tiles : 1);
    const int64_t chunks = n > 0 ? (n + rows_per - 1) / rows_per : 0;
    if (n <= 0 || d <= 0 || (!dx && !db && !ds)) return NULL;
    if (chunks > 65535) return kiln_errorf(KILN_EINVAL, "scale_shift backward: %lld row chunks", (long long)chunks);
    if (db) CUDA_TRY(kiln_ops_scratch((void **)&dbp, (size_t)(chunks * d) * sizeof(float), st));
    if (ds) CUDA_TRY(kiln_ops_scratch((void **)&dsp, (size_t)(chunks * d) * sizeof(float), st));
    if (vec)
        kiln_launch(scale_shift_bwd_kernel<4>, dim3((unsigned)tiles, (unsigned)chunks), threads, 0, st, dx, dbp, dsp,
                    dy, x, b, s, n, d, rows_per, write);
    else
        kiln_launch(scale_shift_bwd_kernel<1>, dim3((unsigned)tiles, (unsigned)chunks), threads, 0, st, dx, dbp, dsp,
                    dy, x, b, s, n, d, rows_per, write);
    LAUNCH_CHECK("scale_shift backward");
    if (db) CUDA_TRY(colsum_add(db, dbp, chunks, d, st));
    if (ds) CUDA_TRY(colsum_add(ds, dsp, chunks, d, st));
done:
    if (dbp) cudaFreeAsync(dbp, st);
    if (dsp) cudaFreeAsync(dsp, st);
    return err;
}

extern "C" kiln_error *kiln_scale_shift_backward_cuda(float *dx, float *db, float *ds, const float *dy, const float *x,
                                                      const float *b, const float *s, int64_t n, int64_t d,
                                                      void *stream) {
    return scale_shift_bwd(dx, db, ds, dy, x, b, s, n, d, 0, stream);
}
extern "C" kiln_error *kiln_scale_shift_backward_write_cuda(float *dx, float *db, float *ds, const float *dy,
                                                            const float *x, const float *b, const float *s, int64_t n,
                                                            int64_t d, void *stream) {
    return scale_shift_bwd(dx, db, ds, dy, x, b, s, n, d, 1, stream);
}
