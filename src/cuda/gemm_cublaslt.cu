// GEMM through cuBLASLt, the path the CUDA trainer uses: row-major C[m,n] = op(A) op(B) computed as
// the column-major C^T = op(B)^T op(A)^T, exactly as PyTorch calls cuBLAS for torch.matmul, so the
// two are timed on the same problem. bf16/fp16 inputs and outputs accumulate in fp32. FP8 (E4M3, Hopper
// and later) takes unit scales through device pointers as torch._scaled_mm passes them, writes bf16, and
// needs the NT layout (column-major TN).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <string.h>
#include <unistd.h>

#include "cuda_check.h"
#include "kiln/cuda.h"
#include "kiln/hash.h"
#include "launch.cuh"

extern "C" kiln_error *kiln_cuda_gemm_type_parse(const char *name, kiln_cuda_gemm_type *out) {
    static const struct { const char *n; kiln_cuda_gemm_type t; } types[] = {
        {"fp32", KILN_CUDA_F32}, {"tf32", KILN_CUDA_TF32}, {"bf16", KILN_CUDA_BF16}, {"fp16", KILN_CUDA_F16},
        {"fp8", KILN_CUDA_FP8}, {"fp8_e4m3", KILN_CUDA_FP8}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(name, types[i].n)) {
            *out = types[i].t;
            return NULL;
        }
    return kiln_errorf(KILN_EINVAL, "--dtype '%s': expected fp32, tf32, bf16, fp16 or fp8 on the GPU", name);
}

__global__ void fill_kernel(void *p, size_t n, int elem, unsigned seed) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        float v = (float)(h % 1000u) * 1e-3f - 0.5f;
        if (elem == 4) ((float *)p)[i] = v;
        else if (elem == 1) ((__nv_fp8_e4m3 *)p)[i] = __nv_fp8_e4m3(v);
        else if (elem == 2 && seed & 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
        else ((__half *)p)[i] = __float2half(v);
    }
}

extern "C" kiln_error *kiln_cuda_gemm_time(kiln_cuda_gemm_type t, int64_t m, int64_t n, int64_t k, const char *layout,
                                           int iters, int warmup, double *us) {
    kiln_error *err = NULL;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    void *A = NULL, *B = NULL, *C = NULL, *ws = NULL;
    float *scales = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const size_t ws_bytes = 64u << 20;
    const int fp8 = t == KILN_CUDA_FP8;
    const int elem = (t == KILN_CUDA_F32 || t == KILN_CUDA_TF32) ? 4 : fp8 ? 1 : 2, out_elem = fp8 ? 2 : elem;
    const cudaDataType_t dt = elem == 4 ? CUDA_R_32F : fp8 ? CUDA_R_8F_E4M3 : t == KILN_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cudaDataType_t dtc = fp8 ? CUDA_R_16BF : dt;
    const float one[8] = {1.0f, 0, 0, 0, 1.0f, 0, 0, 0}; // two scales, 16 bytes apart (separate tensors in torch)
    const cublasComputeType_t ct = t == KILN_CUDA_F32 ? CUBLAS_COMPUTE_32F
                                   : t == KILN_CUDA_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const int ta = layout[0] == 'T', tb = layout[1] == 'T';
    float alpha = 1.0f, beta = 0.0f;
    float ms = 0;
    int found = 0, best = -1, first_status = 0;
    float best_ms = 0;
    enum { CANDIDATES = 16 };
    cublasLtMatmulHeuristicResult_t heur[CANDIDATES];
    // column-major view: C^T[n,m] = op(B)^T [n,k] op(A)^T [k,m]; row-major X[r,c] is column-major X^T[c,r]
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    // column-major views of the stored row-major matrices: B [k,n] (N) or [n,k] (T); A [m,k] (N) or [k,m] (T)
    const uint64_t xb_rows = tb ? k : n, xb_cols = tb ? n : k;
    const uint64_t ya_rows = ta ? m : k, ya_cols = ta ? k : m;
    if (fp8 && (ta || !tb)) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "fp8 GEMM %lldx%lldx%lld: layout %s; cuBLASLt's FP8 kernels take only NT "
                          "(y = x·Wᵀ)", (long long)m, (long long)n, (long long)k, layout);
        goto done;
    }
    CUDA_TRY(cudaMalloc(&A, (size_t)m * k * elem));
    CUDA_TRY(cudaMalloc(&B, (size_t)k * n * elem));
    CUDA_TRY(cudaMalloc(&C, (size_t)m * n * out_elem));
    CUDA_TRY(cudaMalloc(&ws, ws_bytes));
    kiln_launch(fill_kernel, 1024, 256, 0, 0, A, (size_t)m * k, elem, t == KILN_CUDA_BF16 ? 1u : 2u);
    kiln_launch(fill_kernel, 1024, 256, 0, 0, B, (size_t)k * n, elem, t == KILN_CUDA_BF16 ? 3u : 4u);
    CUDA_TRY(cudaGetLastError());
    CUBLAS_TRY(cublasLtCreate(&lt));
    CUBLAS_TRY(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (fp8) {
        CUDA_TRY(cudaMalloc(&scales, sizeof one));
        CUDA_TRY(cudaMemcpy(scales, one, sizeof one, cudaMemcpyHostToDevice));
        const float *sa = scales, *sb = scales + 4;
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&la, dt, xb_rows, xb_cols, (int64_t)xb_rows));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lb, dt, ya_rows, ya_cols, (int64_t)ya_rows));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lc, dtc, (uint64_t)n, (uint64_t)m, n));
    CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
    CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, CANDIDATES, heur, &found));
    if (!found) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no algorithm for %lldx%lldx%lld %s", (long long)m,
                          (long long)n, (long long)k, layout);
        goto done;
    }
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    // autotune: the heuristic's first choice is not always the fastest; time each candidate briefly
    // (as the trainer will once per shape) and keep the best; a candidate that refuses to run (cuBLASLt
    // offers some it then reports NOT_SUPPORTED for) is skipped
    for (int c = 0; c < found; c++) {
        if (heur[c].state != CUBLAS_STATUS_SUCCESS) continue;
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        for (int i = 0; i < 2 && st == CUBLAS_STATUS_SUCCESS; i++)
            st = cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur[c].algo, ws, ws_bytes, 0);
        if (st != CUBLAS_STATUS_SUCCESS) {
            first_status = first_status ? first_status : (int)st;
            continue;
        }
        CUDA_TRY(cudaEventRecord(e0, 0));
        for (int i = 0; i < 5; i++)
            CUBLAS_TRY(cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur[c].algo, ws, ws_bytes, 0));
        CUDA_TRY(cudaEventRecord(e1, 0));
        CUDA_TRY(cudaEventSynchronize(e1));
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (best < 0 || ms < best_ms) best = c, best_ms = ms;
    }
    if (best < 0) {
        err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt: no usable algorithm for %lldx%lldx%lld %s (of %d offered, "
                          "the first failure: cuBLAS status %d)", (long long)m, (long long)n, (long long)k, layout, found,
                          first_status);
        goto done;
    }
    // the autotune above is seconds' worth of full load at large shapes, and a power-capped H200 clocks
    // down under it; a peer's timed loop starts from a few warm-up calls only. Let the clocks recover so
    // both sides time the same steady state (seen: 8192^3 bf16 8% slower straight after the autotune)
    CUDA_TRY(cudaDeviceSynchronize());
    usleep(250000);
    for (int i = 0; i < warmup; i++)
        CUBLAS_TRY(cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur[best].algo, ws, ws_bytes, 0));
    CUDA_TRY(cudaEventRecord(e0, 0));
    for (int i = 0; i < iters; i++)
        CUBLAS_TRY(cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur[best].algo, ws, ws_bytes, 0));
    CUDA_TRY(cudaEventRecord(e1, 0));
    CUDA_TRY(cudaEventSynchronize(e1));
    CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_TRY(cudaGetLastError());
    *us = (double)ms * 1e3 / iters;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(ws);
    cudaFree(scales);
    return err;
}

// ---- the shared plan (src/cuda/gemm_lt.h): every GEMM user of the CUDA side builds its cuBLASLt calls here ----

#include <pthread.h>

#include "gemm_lt.h"

namespace {
pthread_mutex_t g_lt_lock = PTHREAD_MUTEX_INITIALIZER;
cublasLtHandle_t g_lt_handle;
} // namespace

kiln_error *kiln_lt_handle(cublasLtHandle_t *out) {
    kiln_error *err = NULL;
    pthread_mutex_lock(&g_lt_lock);
    if (!g_lt_handle) CUBLAS_TRY(cublasLtCreate(&g_lt_handle));
    *out = g_lt_handle;
done:
    pthread_mutex_unlock(&g_lt_lock);
    return err;
}

uint32_t kiln_lt_align(const void *p) {
    uint32_t a = 256;
    while (a > 2 && (uintptr_t)p % a) a >>= 1;
    return a;
}

kiln_lt_key kiln_lt_key_make(int64_t m, int64_t n, int64_t k, int ta, int tb, int c_f32, const uint32_t align[3]) {
    kiln_lt_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.ta = ta, key.tb = tb, key.c_f32 = c_f32;
    memcpy(key.align, align, sizeof key.align);
    return key;
}

static int key_eq(const kiln_lt_key *x, const kiln_lt_key *y) {
    return x->m == y->m && x->n == y->n && x->k == y->k && x->batch == y->batch && x->stride[0] == y->stride[0] &&
           x->stride[1] == y->stride[1] && x->stride[2] == y->stride[2] && x->ta == y->ta && x->tb == y->tb &&
           x->c_f32 == y->c_f32 && x->mode == y->mode && x->bias == y->bias && x->bias_f32 == y->bias_f32 &&
           x->tag == y->tag && !memcmp(x->align, y->align, sizeof x->align);
}

void kiln_lt_plan_destroy(kiln_lt_plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

// The column-major view: cuBLASLt's A is our B, [xr, xc]; its B is our A, [yr, yc]; C is [n, m]; every leading
// dimension is the stored row length.
kiln_error *kiln_lt_plan_resize(kiln_lt_plan *p, int64_t m, int64_t n, int64_t k, int64_t batch) {
    kiln_error *err = NULL;
    const uint64_t xr = p->key.tb ? k : n, xc = p->key.tb ? n : k, yr = p->key.ta ? m : k, yc = p->key.ta ? k : m;
    const uint64_t cr = (uint64_t)n, cc = (uint64_t)m;
    const int64_t lx = (int64_t)xr, ly = (int64_t)yr, lcd = n;
    const int32_t cnt = (int32_t)batch;
    if (p->cm == m && p->cn == n && p->ck == k && p->cbatch == batch) return NULL;
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_ROWS, &xr, sizeof xr));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_COLS, &xc, sizeof xc));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_LD, &lx, sizeof lx));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &yr, sizeof yr));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &yc, sizeof yc));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_LD, &ly, sizeof ly));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_ROWS, &cr, sizeof cr));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cc, sizeof cc));
    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_LD, &lcd, sizeof lcd));
    if (p->key.mode != KILN_LT_SINGLE) {
        cublasLtMatrixLayout_t ls[3] = {p->la, p->lb, p->lc};
        for (int i = 0; i < 3; i++)
            CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
    }
    p->cm = m, p->cn = n, p->ck = k, p->cbatch = batch;
done:
    if (err) p->cm = -1; // unknown state: set everything next time
    return err;
}

kiln_error *kiln_lt_plan_create(kiln_lt_plan *p, const kiln_lt_key *key, size_t ws_bytes, int max_cands) {
    kiln_error *err = NULL;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur[KILN_LT_MAX_CANDS];
    int found = 0;
    const uint32_t *al = key->align;
    if (max_cands < 1) max_cands = 1;
    if (max_cands > KILN_LT_MAX_CANDS) max_cands = KILN_LT_MAX_CANDS;
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->cm = -1;
    if ((err = kiln_lt_handle(&lt))) goto done;
    {
        const cublasOperation_t opa = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        const cudaDataType_t ct = key->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
        CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        if (key->bias) {
            // the column-major D is [n, m]: a bias per row of D is one per output feature
            const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = key->bias_f32 ? CUDA_R_32F : CUDA_R_16BF;
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, 1, 1, 1));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, 1, 1, 1));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lc, ct, 1, 1, 1));
        if (key->mode != KILN_LT_SINGLE) {
            const uint32_t mode = key->mode == KILN_LT_PTR_ARRAY ? CUBLASLT_BATCH_MODE_POINTER_ARRAY
                                                                 : CUBLASLT_BATCH_MODE_STRIDED;
            cublasLtMatrixLayout_t ls[3] = {p->la, p->lb, p->lc};
            for (int i = 0; i < 3; i++)
                CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
            if (key->mode == KILN_LT_STRIDED) { // cuBLASLt's A is our B
                const int64_t s[3] = {key->stride[1], key->stride[0], key->stride[2]};
                for (int i = 0; i < 3; i++)
                    CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s[i],
                                                                sizeof s[i]));
            }
        }
        if ((err = kiln_lt_plan_resize(p, key->m, key->n, key->k, key->batch))) goto done;
        CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                        sizeof ws_bytes));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0],
                                                        sizeof al[0]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1],
                                                        sizeof al[1]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2],
                                                        sizeof al[2]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2],
                                                        sizeof al[2]));
        // a refusal (no algorithm) leaves ncand at 0 for the caller to handle, like an empty list
        if (cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, max_cands, heur, &found) !=
            CUBLAS_STATUS_SUCCESS)
            found = 0;
        for (int i = 0; i < found; i++)
            if (heur[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->ncand++] = heur[i].algo;
        if (p->ncand) p->algo = p->cand[0];
        p->tuned = p->ncand < 2;
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (err) kiln_lt_plan_destroy(p);
    return err;
}

kiln_error *kiln_lt_plan_set_bias(kiln_lt_plan *p, const void *bias) {
    kiln_error *err = NULL;
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
done:
    return err;
}

cublasStatus_t kiln_lt_plan_run(const kiln_lt_plan *p, const cublasLtMatmulAlgo_t *algo, void *c, const void *a,
                                const void *b, float beta, void *ws, size_t ws_bytes, cudaStream_t st) {
    const float alpha = 1.0f;
    return cublasLtMatmul(g_lt_handle, p->op, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc,
                          algo ? algo : &p->algo, ws, ws_bytes, st);
}

kiln_error *kiln_lt_plan_tune(kiln_lt_plan *p, void *c, const void *a, const void *b, float beta, void *ws,
                              size_t ws_bytes, cudaStream_t st) {
    return kiln_lt_plan_tune_n(p, c, a, b, beta, ws, ws_bytes, st, 3, NULL);
}

// a candidate's configuration as cuBLASLt reports it (for the tuning log)
static void algo_describe(const cublasLtMatmulAlgo_t *a, char *buf, size_t n) {
    int id = -1;
    uint32_t tile = 0, stages = 0, splitk = 0, cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    snprintf(buf, n, "algo %d tile %u stages %u splitk %u cluster %u", id, tile, stages, splitk, cluster);
}

kiln_error *kiln_lt_plan_tune_n(kiln_lt_plan *p, void *c, const void *a, const void *b, float beta, void *ws,
                                size_t ws_bytes, cudaStream_t st, int calls, FILE *log) {
    kiln_error *err = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    float best = -1.0f;
    int besti = 0;
    p->tuned = 1;
    if (p->ncand < 2) return NULL;
    CUDA_TRY(cudaEventCreate(&ev[0]));
    CUDA_TRY(cudaEventCreate(&ev[1]));
    for (int i = 0; i < p->ncand; i++) {
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        float ms = 0;
        for (int r = 0; r <= calls && s == CUBLAS_STATUS_SUCCESS; r++) {
            if (r == 1) CUDA_TRY(cudaEventRecord(ev[0], st));
            s = kiln_lt_plan_run(p, &p->cand[i], c, a, b, beta, ws, ws_bytes, st);
        }
        CUDA_TRY(cudaEventRecord(ev[1], st));
        CUDA_TRY(cudaEventSynchronize(ev[1]));
        if (s != CUBLAS_STATUS_SUCCESS) continue; // not for these sizes
        CUDA_TRY(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (log) {
            char d[128];
            const double fl = 2.0 * (double)p->cm * (double)p->cn * (double)p->ck * (p->cbatch > 0 ? p->cbatch : 1);
            algo_describe(&p->cand[i], d, sizeof d);
            fprintf(log, "lt tune %lldx%lldx%lld candidate %d (%s): %.4f ms a call over %d, %.1f TFLOP/s\n",
                    (long long)p->cm, (long long)p->cn, (long long)p->ck, i, d, ms / calls, calls,
                    fl * calls / (ms * 1e-3) / 1e12);
        }
        if (best < 0 || ms < best) best = ms, besti = i;
    }
    p->algo = p->cand[besti];
    if (log) fprintf(log, "lt tune: candidate %d kept\n", besti);
done:
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    return err;
}

// kiln's FNV-1a over the fields key_eq compares (in-process only: the bytes' order does not matter)
static uint64_t key_hash(const kiln_lt_key *k) {
    const int64_t f[] = {k->m, k->n, k->k, k->batch, k->stride[0], k->stride[1], k->stride[2], k->ta, k->tb, k->c_f32,
                         k->mode, k->bias, k->bias_f32, k->tag, k->align[0], k->align[1], k->align[2]};
    return kiln_fnv1a64(KILN_FNV1A64_INIT, f, sizeof f);
}

kiln_lt_plan *kiln_lt_cache_find(kiln_lt_cache *c, const kiln_lt_key *key) {
    const uint64_t h = key_hash(key);
    for (int i = 0; i < c->n; i++)
        if (c->hash[i] == h && key_eq(&c->plans[i].key, key)) return &c->plans[i];
    return NULL;
}

kiln_lt_plan *kiln_lt_cache_add(kiln_lt_cache *c, kiln_lt_plan *p) {
    if (c->n == c->cap) { // more shapes than a training step has: start over
        for (int i = 0; i < c->n; i++) kiln_lt_plan_destroy(&c->plans[i]);
        c->n = 0;
    }
    c->plans[c->n] = *p;
    c->hash[c->n] = key_hash(&p->key);
    memset(p, 0, sizeof *p);
    return &c->plans[c->n++];
}
