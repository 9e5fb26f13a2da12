// The bf16 GEMMs of the CUDA trainer through cuBLASLt: row-major C[m,n] = op(A) op(B) computed as the
// column-major C^T = op(B)^T op(A)^T (the mapping of src/cuda/gemm_cublaslt.cu, PyTorch's), bf16 inputs,
// f32 accumulation, C bf16 or f32. Building descriptors and asking the heuristic costs tens of
// microseconds, more than a small GEMM, so each shape's plan is built once and kept: a training step
// repeats the same few dozen shapes. The linear layer's forward (bias as the epilogue) and backward (dW
// straight into the f32 master gradient with beta = 1; db by a deterministic two-pass column sum) sit on top.
#include <cuda_bf16.h>
#include <pthread.h>
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"

namespace {

struct plan {
    int64_t m, n, k;
    int ta, tb, c_f32, bias, batch; // batch > 0: pointer-array batched (the A, B, C arguments are device arrays)
    uint32_t align[3]; // of the pointers the plan was chosen for: cuBLASLt's A (our B), B (our A), C
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

enum { MAX_PLANS = 256 };
const size_t WS_BYTES = 32u << 20;

// One handle, workspace and plan table for the process. The workspace is shared by every call, so GEMMs
// on different streams must not overlap (the trainer runs one compute stream); the lock serialises the
// host side only.
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
cublasLtHandle_t g_lt;
void *g_ws;
plan g_plans[MAX_PLANS];
int g_nplans;

void plan_destroy(plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

// The heuristic assumes 256-byte aligned buffers unless told otherwise; a sub-tensor of a flat buffer
// may not be, so each plan is chosen for its pointers' alignment.
uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 2 && (uintptr_t)p % a) a >>= 1;
    return a;
}

kiln_error *plan_get(int64_t m, int64_t n, int64_t k, int ta, int tb, int c_f32, int bias, const uint32_t align[3],
                     plan **out, int batch = 0) {
    kiln_error *err = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    plan p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < g_nplans; i++) {
        plan *q = &g_plans[i];
        if (q->m == m && q->n == n && q->k == k && q->ta == ta && q->tb == tb && q->c_f32 == c_f32 && q->bias == bias &&
            q->batch == batch && !memcmp(q->align, align, sizeof q->align)) {
            *out = q;
            return NULL;
        }
    }
    if (!g_lt) CUBLAS_TRY(cublasLtCreate(&g_lt));
    if (!g_ws) CUDA_TRY(cudaMalloc(&g_ws, WS_BYTES));
    {
        const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        const uint64_t xb_rows = tb ? k : n, xb_cols = tb ? n : k, ya_rows = ta ? m : k, ya_cols = ta ? k : m;
        const cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
        p.m = m, p.n = n, p.k = k, p.ta = ta, p.tb = tb, p.c_f32 = c_f32, p.bias = bias, p.batch = batch;
        memcpy(p.align, align, sizeof p.align);
        CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        if (bias) {
            // the column-major D is [n, m]: a bias per row of D is one per output feature
            const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
            const cudaDataType_t bt = CUDA_R_16BF;
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, xb_rows, xb_cols, (int64_t)xb_rows));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, ya_rows, ya_cols, (int64_t)ya_rows));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lc, ct, (uint64_t)n, (uint64_t)m, n));
        if (batch > 0) {
            const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
            const int32_t cnt = batch;
            cublasLtMatrixLayout_t ls[3] = {p.la, p.lb, p.lc};
            for (int i = 0; i < 3; i++) {
                CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
                CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
            }
        }
        CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS_BYTES,
                                                        sizeof WS_BYTES));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0],
                                                        sizeof align[0]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1],
                                                        sizeof align[1]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
                                                        sizeof align[2]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2],
                                                        sizeof align[2]));
        CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(g_lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &heur, &found));
        if (!found || heur.state != CUBLAS_STATUS_SUCCESS) {
            err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no bf16 algorithm for %lldx%lldx%lld", (long long)m,
                              (long long)n, (long long)k);
            goto done;
        }
        p.algo = heur.algo;
        if (g_nplans == MAX_PLANS) { // a workload with this many shapes is not a training step; start over
            for (int i = 0; i < g_nplans; i++) plan_destroy(&g_plans[i]);
            g_nplans = 0;
        }
        g_plans[g_nplans] = p;
        *out = &g_plans[g_nplans++];
        memset(&p, 0, sizeof p);
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan_destroy(&p);
    return err;
}

kiln_error *gemm(void *c, int c_f32, const void *a, const void *b, const void *bias, int64_t m, int64_t n,
                 int64_t k, int ta, int tb, float beta, cudaStream_t stream) {
    kiln_error *err = NULL;
    plan *p = NULL;
    const float alpha = 1.0f;
    const uint32_t al[3] = {align_of(b), align_of(a), align_of(c)};
    if (m <= 0 || n <= 0) return NULL;
    if (k <= 0) { // an empty sum: C = 0, or C unchanged when accumulating (cuBLASLt refuses k = 0)
        cudaError_t st = beta == 0.0f ? cudaMemsetAsync(c, 0, (size_t)(m * n) * (c_f32 ? 4 : 2), stream) : cudaSuccess;
        return st == cudaSuccess ? NULL : kiln_errorf(KILN_EIO, "GEMM %lldx%lldx0: clearing C: %s", (long long)m,
                                                      (long long)n, cudaGetErrorString(st));
    }
    pthread_mutex_lock(&g_lock);
    if ((err = plan_get(m, n, k, ta, tb, c_f32, bias != NULL, al, &p))) goto done;
    if (bias) CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_TRY(cublasLtMatmul(g_lt, p->op, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc, &p->algo, g_ws, WS_BYTES,
                              stream));
done:
    pthread_mutex_unlock(&g_lock);
    if (err)
        err = kiln_error_wrap(err, "GEMM %lldx%lldx%lld (%c%c, C %s)", (long long)m, (long long)n, (long long)k,
                              ta ? 'T' : 'N', tb ? 'T' : 'N', c_f32 ? "f32" : "bf16");
    return err;
}

// db[o] += sum_r dy[r,o]: each block sums ROWS rows of 2*blockDim columns into a partial row, then one
// thread per column adds the partials in chunk order: the same bits every run, no atomics.
enum { DB_ROWS = 256, DB_THREADS = 128 };
__global__ void colsum_partial(float *part, const __nv_bfloat16 *dy, int64_t n, int64_t out, int vec) {
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
    const int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (o >= out) return;
    float s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[c * out + o];
    db[o] += s;
}

// y[r,:] = b for every row
__global__ void fill_rows(__nv_bfloat16 *y, const __nv_bfloat16 *b, int64_t n, int64_t out) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x)
        for (int64_t o = threadIdx.x; o < out; o += blockDim.x) y[r * out + o] = b[o];
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
    plan *p = NULL;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const uint32_t al[3] = {align, align, align};
    const int ta = layout[0] == 'T', tb = layout[1] == 'T';
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || batch > INT32_MAX) return NULL;
    pthread_mutex_lock(&g_lock);
    if ((err = plan_get(m, n, k, ta, tb, c_f32, 0, al, &p, (int)batch))) goto done;
    CUBLAS_TRY(cublasLtMatmul(g_lt, p->op, &alpha, (const void *)db, p->la, (const void *)da, p->lb, &beta,
                              (const void *)dc, p->lc, (void *)dc, p->lc, &p->algo, g_ws, WS_BYTES, (cudaStream_t)stream));
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
        fill_rows<<<(unsigned)(n < 65535 ? n : 65535), 256, 0, st>>>((__nv_bfloat16 *)y, (const __nv_bfloat16 *)b, n, out);
        CUDA_TRY(cudaGetLastError());
        err = gemm(y, 0, x, w, NULL, n, out, in, 0, 1, 1.0f, st);
    } else {
        err = gemm(y, 0, x, w, b, n, out, in, 0, 1, 0.0f, st);
    }
done:
    return err ? kiln_error_wrap(err, "linear forward") : NULL;
}

extern "C" kiln_error *kiln_linear_backward_cuda(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy,
                                                 const kiln_bf16 *x, const kiln_bf16 *w, int64_t n, int64_t in,
                                                 int64_t out, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *part = NULL;
    if (n < 0 || in < 1 || out < 1)
        return kiln_errorf(KILN_EINVAL, "linear backward: n=%lld in=%lld out=%lld", (long long)n, (long long)in,
                           (long long)out);
    if (n == 0) return NULL;
    if (dx && (err = gemm(dx, 0, dy, w, NULL, n, in, out, 0, 0, 1.0f, st))) goto done;   // dx[n,in] += dy w
    if (dw && (err = gemm(dw, 1, dy, x, NULL, out, in, n, 1, 0, 1.0f, st))) goto done;   // dw[out,in] += dyᵀ x
    if (db) {
        const int64_t chunks = (n + DB_ROWS - 1) / DB_ROWS;
        CUDA_TRY(cudaMallocAsync((void **)&part, (size_t)(chunks * out) * sizeof(float), st));
        dim3 grid((unsigned)((out + 2 * DB_THREADS - 1) / (2 * DB_THREADS)), (unsigned)chunks);
        colsum_partial<<<grid, DB_THREADS, 0, st>>>(part, (const __nv_bfloat16 *)dy, n, out,
                                                     !(out & 1) && !((uintptr_t)dy & 3));
        CUDA_TRY(cudaGetLastError());
        colsum_final<<<(unsigned)((out + 255) / 256), 256, 0, st>>>(db, part, chunks, out);
        CUDA_TRY(cudaGetLastError());
    }
done:
    if (part) cudaFreeAsync(part, st);
    if (err) err = kiln_error_wrap(err, "linear backward (n=%lld in=%lld out=%lld)", (long long)n, (long long)in,
                                   (long long)out);
    return err;
}
