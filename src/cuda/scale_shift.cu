// ZAYA's residual scaling y = (x + b) * s on the device, f32. The backward gives each block a tile of
// columns and a chunk of rows: dx directly, db/ds as per-chunk partials summed in a fixed order.
#include "ops_common.cuh"

// a row per block iteration, channels across the threads (no division per element)
static __global__ void scale_shift_fwd_kernel(float *y, const float *x, const float *b, const float *s, int64_t n,
                                              int64_t d, int accumulate) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const float v = (xr[j] + b[j]) * s[j];
            yr[j] = accumulate ? yr[j] + v : v;
        }
    }
}

// grid (column tiles, row chunks); dbp/dsp: [chunks, d] partials (NULL: not wanted)
static __global__ void scale_shift_bwd_kernel(float *dx, float *dbp, float *dsp, const float *dy, const float *x,
                                              const float *b, const float *s, int64_t n, int64_t d, int64_t rows_per) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= d) return;
    const int64_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
    const float sj = s[j], bj = b ? b[j] : 0.0f;
    float pb = 0, ps = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float g = dy[r * d + j];
        if (dx) dx[r * d + j] += g * sj;
        pb += g * sj;
        if (dsp) ps += g * (x[r * d + j] + bj);
    }
    if (dbp) dbp[blockIdx.y * d + j] = pb;
    if (dsp) dsp[blockIdx.y * d + j] = ps;
}

extern "C" kiln_error *kiln_scale_shift_forward_cuda(float *y, const float *x, const float *b, const float *s, int64_t n,
                                                     int64_t d, int accumulate, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    scale_shift_fwd_kernel<<<(int)(n < 65535 ? n : 65535), d >= 1024 ? 256 : d >= 256 ? 128 : 64, 0,
                             (cudaStream_t)stream>>>(y, x, b, s, n, d, accumulate);
    LAUNCH_CHECK("scale_shift forward");
done:
    return err;
}

extern "C" kiln_error *kiln_scale_shift_backward_cuda(float *dx, float *db, float *ds, const float *dy, const float *x,
                                                      const float *b, const float *s, int64_t n, int64_t d,
                                                      void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *dbp = NULL, *dsp = NULL;
    const int threads = d >= 256 ? 256 : 64;
    const int64_t tiles = (d + threads - 1) / threads;
    const int64_t rows_per = chunk_rows(n, tiles >= 512 ? 1 : 1024 / tiles > 1 ? 1024 / tiles : 1);
    const int64_t chunks = n > 0 ? (n + rows_per - 1) / rows_per : 0;
    if (n <= 0 || d <= 0 || (!dx && !db && !ds)) return NULL;
    if (chunks > 65535) return kiln_errorf(KILN_EINVAL, "scale_shift backward: %lld row chunks", (long long)chunks);
    if (db) CUDA_TRY(kiln_ops_scratch((void **)&dbp, (size_t)(chunks * d) * sizeof(float), st));
    if (ds) CUDA_TRY(kiln_ops_scratch((void **)&dsp, (size_t)(chunks * d) * sizeof(float), st));
    scale_shift_bwd_kernel<<<dim3((unsigned)tiles, (unsigned)chunks), threads, 0, st>>>(dx, dbp, dsp, dy, x, b, s, n, d,
                                                                                        rows_per);
    LAUNCH_CHECK("scale_shift backward");
    if (db) CUDA_TRY(colsum_add(db, dbp, chunks, d, st));
    if (ds) CUDA_TRY(colsum_add(ds, dsp, chunks, d, st));
done:
    if (dbp) cudaFreeAsync(dbp, st);
    if (dsp) cudaFreeAsync(dsp, st);
    return err;
}
