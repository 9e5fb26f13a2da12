// The bf16 GEMMs of the CUDA trainer through cuBLASLt: row-major C[m,n] = op(A) op(B) computed as the
// column-major C^T = op(B)^T op(A)^T (the mapping of src/cuda/gemm_cublaslt.cu, PyTorch's), bf16 inputs,
// f32 accumulation, C bf16 or f32. Building descriptors and asking the heuristic costs tens of
// microseconds, more than a small GEMM, so each shape's plan (src/cuda/gemm_lt.h) is built once and kept:
// a training step repeats the same few dozen shapes. The linear layer's forward (bias as the epilogue) and
// backward sit on top.
//
// The backward (KILN_LINEAR_BWD unset or "new"):
//   dX  dy w, bf16 C; added to dx (beta = 1) or, with KILN_LINEAR_DX_WRITE, written (beta = 0: no zeroing
//       pass before it and no read-back of C).
//   dW  dyᵀ x straight into the f32 master gradient (beta = 1), one GEMM. (Splitting the small ones — k, v,
//       router: 2..32 output tiles over 16384 tokens — along the tokens into one strided-batched GEMM plus a
//       fixed-order sum was measured on the H200 and lost: router fc 13 -> 17 µs, v 25 -> 34, k and router
//       down +4%. cuBLASLt's own choice is within 1.2-1.5x of their memory bound, x read once; docs/perf.md.)
//   db  column sums of dy: blocks of 64 rows x 256 columns (16-byte loads, 8 rows per thread, all loads in
//       flight at once), then the per-block partials summed in block order (the former kernel looped 256 rows
//       per thread: 14.2 µs a call for dy [16384 x 256] on the H200, now 9.4, wall clock with the launches).
// KILN_LINEAR_BWD=old keeps the previous path (the zeroing pass for a written dx, the former column sum) so
// that one build can A/B the two.
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "gemm_lt.h"
#include "kiln/cuda_ops.h"
#include "ops_common.cuh"
#include "launch.cuh"

namespace {

enum { MAX_PLANS = 256 };
const size_t WS_BYTES = 32u << 20;

// One workspace and plan table for the process. The workspace is shared by every call, so GEMMs on different
// streams must not overlap (the trainer runs its GEMMs on one stream); the lock serialises the host side only.
// The column sums' partials come from the ops' stream-ordered pool (kiln_ops_scratch).
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
void *g_ws;
kiln_lt_plan g_plans[MAX_PLANS];
uint64_t g_hashes[MAX_PLANS];
kiln_lt_cache g_cache = {g_plans, g_hashes, 0, MAX_PLANS};

kiln_error *plan_get(const kiln_lt_key *key, kiln_lt_plan **out) {
    kiln_error *err = NULL;
    kiln_lt_plan p;
    memset(&p, 0, sizeof p);
    if ((*out = kiln_lt_cache_find(&g_cache, key))) return NULL;
    if (!g_ws) CUDA_TRY(cudaMalloc(&g_ws, WS_BYTES));
    if ((err = kiln_lt_plan_create(&p, key, WS_BYTES, 1))) goto done;
    if (!p.ncand) {
        kiln_lt_plan_destroy(&p);
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no bf16 algorithm for %lldx%lldx%lld%s", (long long)key->m,
                          (long long)key->n, (long long)key->k, key->batch ? " (batched)" : "");
        goto done;
    }
    *out = kiln_lt_cache_add(&g_cache, &p);
done:
    return err;
}

// C (+)= op(A) op(B) (+ bias), called with g_lock held
kiln_error *gemm_locked(void *c, int c_f32, const void *a, const void *b, const void *bias, int64_t m, int64_t n,
                        int64_t k, int ta, int tb, float beta, cudaStream_t stream) {
    kiln_error *err = NULL;
    kiln_lt_plan *p = NULL;
    const uint32_t al[3] = {kiln_lt_align(b), kiln_lt_align(a), kiln_lt_align(c)};
    kiln_lt_key key = kiln_lt_key_make(m, n, k, ta, tb, c_f32, al);
    key.bias = bias != NULL;
    if (m <= 0 || n <= 0) return NULL;
    if (k <= 0) { // an empty sum: C = 0, or C unchanged when accumulating (cuBLASLt refuses k = 0)
        cudaError_t st = beta == 0.0f ? cudaMemsetAsync(c, 0, (size_t)(m * n) * (c_f32 ? 4 : 2), stream) : cudaSuccess;
        return st == cudaSuccess ? NULL : kiln_errorf(KILN_EIO, "GEMM %lldx%lldx0: clearing C: %s", (long long)m,
                                                      (long long)n, cudaGetErrorString(st));
    }
    if ((err = plan_get(&key, &p))) goto done;
    if (bias && (err = kiln_lt_plan_set_bias(p, bias))) goto done;
    CUBLAS_TRY(kiln_lt_plan_run(p, NULL, c, a, b, beta, g_ws, WS_BYTES, stream));
done:
    if (err)
        err = kiln_error_wrap(err, "GEMM %lldx%lldx%lld (%c%c, C %s)", (long long)m, (long long)n, (long long)k,
                              ta ? 'T' : 'N', tb ? 'T' : 'N', c_f32 ? "f32" : "bf16");
    return err;
}

kiln_error *gemm(void *c, int c_f32, const void *a, const void *b, const void *bias, int64_t m, int64_t n,
                 int64_t k, int ta, int tb, float beta, cudaStream_t stream) {
    pthread_mutex_lock(&g_lock);
    kiln_error *err = gemm_locked(c, c_f32, a, b, bias, m, n, k, ta, tb, beta, stream);
    pthread_mutex_unlock(&g_lock);
    return err;
}

// ---- db: column sums ----

// db[o] += sum_r dy[r,o]: each block sums ROWS rows of 2*blockDim columns into a partial row, then one
// thread per column adds the partials in chunk order: the same bits every run, no atomics. (KILN_LINEAR_BWD=old)
enum { DB_ROWS = 256, DB_THREADS = 128 };
__global__ void colsum_partial(float *part, const __nv_bfloat16 *dy, int64_t n, int64_t out, int vec) {
    pdl_wait();
    const int64_t o = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 2, r0 = (int64_t)blockIdx.y * DB_ROWS;
    if (o >= out) return;
    const int64_t r1 = r0 + DB_ROWS < n ? r0 + DB_ROWS : n;
    float s0 = 0, s1 = 0;
    if (vec) { // bf16x2 loads: out even and dy 4-byte aligned keep every pair aligned
        for (int64_t r = r0; r < r1; r++) {
            float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)(dy + r * out + o));
            s0 += v.x, s1 += v.y;
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            s0 += __bfloat162float(dy[r * out + o]);
            if (o + 1 < out) s1 += __bfloat162float(dy[r * out + o + 1]);
        }
    }
    part[blockIdx.y * out + o] = s0;
    if (o + 1 < out) part[blockIdx.y * out + o + 1] = s1;
}
__global__ void colsum_final(float *db, const float *part, int64_t chunks, int64_t out) {
    pdl_wait();
    const int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (o >= out) return;
    float s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[c * out + o];
    db[o] += s;
}

// The new column sum. A block is CS_LANES row lanes x CS_COLS column threads, each thread V columns (V = 8:
// one 16-byte load per row); lane j sums rows j, j + LANES, ... of the block's `rows` (a multiple of LANES),
// all its loads independent; the lanes then add up in lane order through shared memory.
enum { CS_LANES = 8, CS_COLS = 32 };
template <int V>
__global__ void __launch_bounds__(CS_LANES * CS_COLS) colsum2_partial(float *part, const __nv_bfloat16 *dy, int64_t n,
                                                                      int64_t out, int64_t rows) {
    pdl_wait();
    __shared__ float sh[CS_LANES][CS_COLS * V];
    const int lane = threadIdx.y, ct = threadIdx.x;
    const int64_t o = ((int64_t)blockIdx.x * CS_COLS + ct) * V, r0 = (int64_t)blockIdx.y * rows;
    float s[V];
#pragma unroll
    for (int v = 0; v < V; v++) s[v] = 0;
    if (o < out) {
        const int64_t r1 = r0 + rows < n ? r0 + rows : n;
#pragma unroll 8
        for (int64_t r = r0 + lane; r < r1; r += CS_LANES) {
            if constexpr (V == 8) {
                const uint4 u = *(const uint4 *)(dy + r * out + o);
                const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const float2 f = __bfloat1622float2(h[v]);
                    s[2 * v] += f.x, s[2 * v + 1] += f.y;
                }
            } else {
#pragma unroll
                for (int v = 0; v < V; v++)
                    if (o + v < out) s[v] += __bfloat162float(dy[r * out + o + v]);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++) sh[lane][ct * V + v] = s[v];
    __syncthreads();
    // thread t of the block adds the lanes of the block's column t (CS_COLS * V columns, 256 threads)
    for (int t = lane * CS_COLS + ct; t < CS_COLS * V; t += CS_LANES * CS_COLS) {
        const int64_t oc = (int64_t)blockIdx.x * CS_COLS * V + t;
        if (oc >= out) continue;
        float acc = sh[0][t];
#pragma unroll
        for (int j = 1; j < CS_LANES; j++) acc += sh[j][t];
        part[blockIdx.y * out + oc] = acc;
    }
}
// db[o] += sum over chunks c (in order) of part[c,o]: lane j adds chunks j, j + LANES, ...; then the lanes
// in order
__global__ void __launch_bounds__(CS_LANES * CS_COLS) colsum2_final(float *db, const float *part, int64_t chunks,
                                                                    int64_t out) {
    pdl_wait();
    __shared__ float sh[CS_LANES][CS_COLS];
    const int lane = threadIdx.y, ct = threadIdx.x;
    const int64_t o = (int64_t)blockIdx.x * CS_COLS + ct;
    float s = 0;
    if (o < out)
#pragma unroll 8
        for (int64_t c = lane; c < chunks; c += CS_LANES) s += part[c * out + o];
    sh[lane][ct] = s;
    __syncthreads();
    if (lane == 0 && o < out) {
        float acc = sh[0][ct];
#pragma unroll
        for (int j = 1; j < CS_LANES; j++) acc += sh[j][ct];
        db[o] += acc;
    }
}

// db += column sums of dy [n, out]
kiln_error *colsum(float *db, const __nv_bfloat16 *dy, int64_t n, int64_t out, int old, cudaStream_t st) {
    kiln_error *err = NULL;
    float *part = NULL;
    if (old) {
        const int64_t chunks = (n + DB_ROWS - 1) / DB_ROWS;
        CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(chunks * out) * sizeof(float), st));
        dim3 grid((unsigned)((out + 2 * DB_THREADS - 1) / (2 * DB_THREADS)), (unsigned)chunks);
        kiln_launch(colsum_partial, grid, DB_THREADS, 0, st, part, dy, n, out, !(out & 1) && !((uintptr_t)dy & 3));
        CUDA_TRY(cudaGetLastError());
        kiln_launch(colsum_final, (unsigned)((out + 255) / 256), 256, 0, st, db, part, chunks, out);
        CUDA_TRY(cudaGetLastError());
    } else {
        // rows per block: 64, or more (a multiple of the lanes) so that there are at most 256 chunks (an LM
        // head's bias: 256 x 50304 partials)
        const int64_t want = (n + 255) / 256;
        const int64_t rows = want <= 64 ? 64 : (want + CS_LANES - 1) / CS_LANES * CS_LANES;
        const int64_t chunks = (n + rows - 1) / rows;
        const int vec8 = !(out & 7) && !((uintptr_t)dy & 15);
        const int V = vec8 ? 8 : 1;
        CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(chunks * out) * sizeof(float), st));
        const dim3 block(CS_COLS, CS_LANES), grid((unsigned)((out + CS_COLS * V - 1) / (CS_COLS * V)), (unsigned)chunks);
        if (vec8) kiln_launch(colsum2_partial<8>, grid, block, 0, st, part, dy, n, out, rows);
        else kiln_launch(colsum2_partial<1>, grid, block, 0, st, part, dy, n, out, rows);
        CUDA_TRY(cudaGetLastError());
        kiln_launch(colsum2_final, (unsigned)((out + CS_COLS - 1) / CS_COLS), block, 0, st, db, part, chunks, out);
        CUDA_TRY(cudaGetLastError());
    }
done:
    if (part) cudaFreeAsync(part, st);
    return err;
}

// y[r,:] = b for every row
__global__ void fill_rows(__nv_bfloat16 *y, const __nv_bfloat16 *b, int64_t n, int64_t out) {
    pdl_wait();
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x)
        for (int64_t o = threadIdx.x; o < out; o += blockDim.x) y[r * out + o] = b[o];
}

// KILN_LINEAR_BWD: "old" (the previous backward), else the new one
kiln_error *bwd_old(int *old) {
    const char *v = getenv("KILN_LINEAR_BWD");
    *old = 0;
    if (!v || !*v || !strcmp(v, "new")) return NULL;
    if (!strcmp(v, "old")) {
        *old = 1;
        return NULL;
    }
    return kiln_errorf(KILN_EINVAL, "environment variable KILN_LINEAR_BWD='%s': expected old or new", v);
}

} // namespace

// Pointer-array batched GEMM (internal, src/cuda/experts.cu's chunked experts): for i < batch, row-major
// C_i[m,n] = op(A_i) op(B_i) (+ C_i), with da, db, dc device arrays of the batch's pointers, every pointer
// aligned to at least `align` bytes.
extern "C" kiln_error *kiln_gemm_bf16_ptr_batched_cuda(void *const *dc, int c_f32, const void *const *da,
                                                       const void *const *db, int64_t batch, int64_t m, int64_t n,
                                                       int64_t k, const char *layout, int accumulate, uint32_t align,
                                                       void *stream) {
    kiln_error *err = NULL;
    kiln_lt_plan *p = NULL;
    const float beta = accumulate ? 1.0f : 0.0f;
    const uint32_t al[3] = {align, align, align};
    const int ta = layout[0] == 'T', tb = layout[1] == 'T';
    kiln_lt_key key = kiln_lt_key_make(m, n, k, ta, tb, c_f32, al);
    key.mode = KILN_LT_PTR_ARRAY, key.batch = batch;
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || batch > INT32_MAX) return NULL;
    pthread_mutex_lock(&g_lock);
    if ((err = plan_get(&key, &p))) goto done;
    CUBLAS_TRY(kiln_lt_plan_run(p, NULL, (void *)dc, (const void *)da, (const void *)db, beta, g_ws, WS_BYTES,
                                (cudaStream_t)stream));
done:
    pthread_mutex_unlock(&g_lock);
    if (err)
        err = kiln_error_wrap(err, "batched GEMM %lld x %lldx%lldx%lld (%s, C %s)", (long long)batch, (long long)m,
                              (long long)n, (long long)k, layout, c_f32 ? "f32" : "bf16");
    return err;
}

extern "C" kiln_error *kiln_gemm_bf16_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, int64_t m,
                                           int64_t n, int64_t k, const char *layout, int accumulate, void *stream) {
    if (!layout || strlen(layout) != 2 || (layout[0] != 'N' && layout[0] != 'T') || (layout[1] != 'N' && layout[1] != 'T'))
        return kiln_errorf(KILN_EINVAL, "GEMM %lldx%lldx%lld: layout '%s', expected NN, NT, TN or TT", (long long)m,
                           (long long)n, (long long)k, layout ? layout : "(null)");
    if (m < 0 || n < 0 || k < 0)
        return kiln_errorf(KILN_EINVAL, "GEMM %lldx%lldx%lld: negative size", (long long)m, (long long)n, (long long)k);
    return gemm(c, c_f32, a, b, NULL, m, n, k, layout[0] == 'T', layout[1] == 'T', accumulate ? 1.0f : 0.0f,
                (cudaStream_t)stream);
}

extern "C" kiln_error *kiln_linear_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w,
                                                const kiln_bf16 *b, int64_t n, int64_t in, int64_t out, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    if (n < 0 || in < 1 || out < 1)
        return kiln_errorf(KILN_EINVAL, "linear forward: n=%lld in=%lld out=%lld", (long long)n, (long long)in,
                           (long long)out);
    if (!n) return NULL;
    // The bias epilogue reads the bias with vector loads and the heuristic cannot be told its alignment:
    // a bias inside a flat bf16 weight buffer (2-byte aligned) faults or is refused. Such a bias is written
    // into y first and the GEMM adds onto it (beta = 1): still one rounding of the f32 sum.
    if (b && ((uintptr_t)b & 15)) {
        kiln_launch(fill_rows, (unsigned)(n < 65535 ? n : 65535), 256, 0, st, (__nv_bfloat16 *)y,
                    (const __nv_bfloat16 *)b, n, out);
        CUDA_TRY(cudaGetLastError());
        err = gemm(y, 0, x, w, NULL, n, out, in, 0, 1, 1.0f, st);
    } else {
        err = gemm(y, 0, x, w, b, n, out, in, 0, 1, 0.0f, st);
    }
done:
    return err ? kiln_error_wrap(err, "linear forward") : NULL;
}

extern "C" kiln_error *kiln_linear_backward_ex_cuda(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy,
                                                    const kiln_bf16 *x, const kiln_bf16 *w, int64_t n, int64_t in,
                                                    int64_t out, unsigned flags, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    int old = 0, locked = 0;
    const int dx_write = (flags & KILN_LINEAR_DX_WRITE) != 0, dw_write = (flags & KILN_LINEAR_DW_WRITE) != 0;
    if (n < 0 || in < 1 || out < 1)
        return kiln_errorf(KILN_EINVAL, "linear backward: n=%lld in=%lld out=%lld", (long long)n, (long long)in,
                           (long long)out);
    if (flags & ~(unsigned)(KILN_LINEAR_DX_WRITE | KILN_LINEAR_DW_WRITE))
        return kiln_errorf(KILN_EINVAL, "linear backward: unknown flags 0x%x", flags);
    if ((err = bwd_old(&old))) return err;
    if (n == 0) return NULL;
    pthread_mutex_lock(&g_lock);
    locked = 1;
    if (dx) {
        if (dx_write && old) CUDA_TRY(cudaMemsetAsync(dx, 0, (size_t)(n * in) * 2, st)); // the former zeroing pass
        // dx[n,in] (+)= dy w
        if ((err = gemm_locked(dx, 0, dy, w, NULL, n, in, out, 0, 0, dx_write && !old ? 0.0f : 1.0f, st))) goto done;
    }
    if (dw) {
        if (dw_write && old) CUDA_TRY(cudaMemsetAsync(dw, 0, (size_t)(out * in) * 4, st));
        // dw[out,in] (+)= dyᵀ x
        if ((err = gemm_locked(dw, 1, dy, x, NULL, out, in, n, 1, 0, dw_write && !old ? 0.0f : 1.0f, st))) goto done;
    }
    if (db && (err = colsum(db, (const __nv_bfloat16 *)dy, n, out, old, st))) goto done;
done:
    if (locked) pthread_mutex_unlock(&g_lock);
    if (err) err = kiln_error_wrap(err, "linear backward (n=%lld in=%lld out=%lld)", (long long)n, (long long)in,
                                   (long long)out);
    return err;
}

extern "C" kiln_error *kiln_linear_backward_cuda(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy,
                                                 const kiln_bf16 *x, const kiln_bf16 *w, int64_t n, int64_t in,
                                                 int64_t out, void *stream) {
    return kiln_linear_backward_ex_cuda(dx, dw, db, dy, x, w, n, in, out, 0, stream);
}
