// The linear layers of CLIP's vision tower on the GPU through cuBLASLt: y[n,out] = x[n,in] wᵀ + b, x and w
// bf16, f32 accumulation, y bf16 (the qkv and fc1 projections) or f32 with y added in (the out and fc2
// projections write straight into the f32 residual stream: beta = 1, so the residual add is the GEMM's
// epilogue instead of a pass over the stream). The bias is the BIAS epilogue, in y's type. Where cuBLASLt has
// no fused algorithm for a shape, the plan says so and a row-broadcast kernel adds the bias after.
// Plans (descriptors + the heuristic's algorithm) are built once per shape and kept: a tower repeats four
// shapes per chunk size. One handle, workspace and plan table for the process, behind a lock (the model is
// used by one thread at a time on CUDA: include/kiln/clip.h). KILN_CLIP_GEMM_TUNE=1 times the heuristic's
// first 8 candidates once per plan (on the call's inputs, into a scratch output) and keeps the fastest;
// off by default: two processes may then pick different algorithms (last-bit differences).
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clip_ops.h"
#include "cuda_check.h"

namespace {

enum { MAX_CPLANS = 128, TUNE_MAX = 8 };

struct cplan {
    int64_t n, in, out;
    int y_f32, bias, acc;
    uint32_t align[3];
    int fused; // the bias is the epilogue (else a kernel adds it)
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lw, lx, ly;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t cand[TUNE_MAX]; // the heuristic's candidates, best first
    int ncand, tuned;
};

const size_t CWS_BYTES = 32u << 20;
pthread_mutex_t c_lock = PTHREAD_MUTEX_INITIALIZER;
cublasLtHandle_t c_lt;
void *c_ws;
cplan c_plans[MAX_CPLANS];
int c_nplans;

void cplan_destroy(cplan *p) {
    if (p->lw) cublasLtMatrixLayoutDestroy(p->lw);
    if (p->lx) cublasLtMatrixLayoutDestroy(p->lx);
    if (p->ly) cublasLtMatrixLayoutDestroy(p->ly);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

uint32_t c_align(const void *p) {
    uint32_t a = 256;
    while (a > 2 && (uintptr_t)p % a) a >>= 1;
    return a;
}

// descriptors for one shape, with or without the bias epilogue; *found = 0 when the heuristic has nothing
kiln_error *cplan_build(cplan *p, int with_bias_epilogue, int *found) {
    kiln_error *err = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur[TUNE_MAX];
    int nres = 0;
    *found = 0;
    {
        // row-major y[n,out] = x wᵀ is column-major yᵀ[out,n] = w xᵀ: cuBLASLt's A = w (stored [in, out]
        // column-major, transposed), B = x (stored [in, n] column-major)
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        const cudaDataType_t yt = p->y_f32 ? CUDA_R_32F : CUDA_R_16BF;
        CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (with_bias_epilogue) {
            const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
            CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &yt, sizeof yt));
        }
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lw, CUDA_R_16BF, (uint64_t)p->in, (uint64_t)p->out, p->in));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lx, CUDA_R_16BF, (uint64_t)p->in, (uint64_t)p->n, p->in));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->ly, yt, (uint64_t)p->out, (uint64_t)p->n, p->out));
        CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &CWS_BYTES,
                                                        sizeof CWS_BYTES));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align[0],
                                                        sizeof p->align[0]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align[1],
                                                        sizeof p->align[1]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align[2],
                                                        sizeof p->align[2]));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align[2],
                                                        sizeof p->align[2]));
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c_lt, p->op, p->lw, p->lx, p->ly, p->ly, pref, TUNE_MAX,
                                                          heur, &nres);
        p->ncand = 0;
        for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < nres; i++)
            if (heur[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->ncand++] = heur[i].algo;
        if (p->ncand > 0) {
            p->algo = p->cand[0];
            *found = 1;
        }
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return err;
}

kiln_error *cplan_get(int64_t n, int64_t in, int64_t out, int y_f32, int bias, int acc, const uint32_t align[3],
                      cplan **res) {
    kiln_error *err = NULL;
    int found = 0;
    cplan p;
    for (int i = 0; i < c_nplans; i++) {
        cplan *q = &c_plans[i];
        if (q->n == n && q->in == in && q->out == out && q->y_f32 == y_f32 && q->bias == bias && q->acc == acc &&
            !memcmp(q->align, align, sizeof q->align)) {
            *res = q;
            return NULL;
        }
    }
    if (!c_lt) CUBLAS_TRY(cublasLtCreate(&c_lt));
    if (!c_ws) CUDA_TRY(cudaMalloc(&c_ws, CWS_BYTES));
    memset(&p, 0, sizeof p);
    p.n = n, p.in = in, p.out = out, p.y_f32 = y_f32, p.bias = bias, p.acc = acc;
    memcpy(p.align, align, sizeof p.align);
    if (bias) {
        const cplan key = p;
        if ((err = cplan_build(&p, 1, &found))) goto done;
        p.fused = found;
        if (!found) {
            cplan_destroy(&p);
            p = key;
        }
    }
    if (!found) {
        if ((err = cplan_build(&p, 0, &found))) goto done;
        if (!found) {
            err = kiln_errorf(KILN_EUNSUPPORTED, "cuBLASLt has no bf16 algorithm for %lldx%lldx%lld (y %s)",
                              (long long)n, (long long)out, (long long)in, y_f32 ? "f32" : "bf16");
            goto done;
        }
    }
    if (c_nplans == MAX_CPLANS) { // many chunk sizes: start over
        for (int i = 0; i < c_nplans; i++) cplan_destroy(&c_plans[i]);
        c_nplans = 0;
    }
    c_plans[c_nplans] = p;
    *res = &c_plans[c_nplans++];
    memset(&p, 0, sizeof p);
done:
    cplan_destroy(&p);
    return err;
}

int tune_on(void) {
    const char *e = getenv("KILN_CLIP_GEMM_TUNE");
    return e && *e && strcmp(e, "0");
}

// the fastest candidate on this call's inputs: 1 warm-up + 3 timed runs each into a scratch output (so an
// accumulating call's y is untouched); a candidate that fails is skipped
kiln_error *cplan_tune(cplan *p, const void *w, const void *x, const void *bias, cudaStream_t st) {
    kiln_error *err = NULL;
    void *ys = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    const float alpha = 1.0f, beta = 0.0f;
    float best = 1e30f;
    int besti = 0;
    p->tuned = 1;
    if (p->ncand < 2) return NULL;
    CUDA_TRY(cudaMalloc(&ys, (size_t)(p->n * p->out) * (p->y_f32 ? 4 : 2)));
    CUDA_TRY(cudaEventCreate(&ev[0]));
    CUDA_TRY(cudaEventCreate(&ev[1]));
    if (bias && p->fused)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    for (int i = 0; i < p->ncand; i++) {
        bool ok = true;
        for (int r = 0; r < 4 && ok; r++) {
            if (r == 1) CUDA_TRY(cudaEventRecord(ev[0], st));
            ok = cublasLtMatmul(c_lt, p->op, &alpha, w, p->lw, x, p->lx, &beta, ys, p->ly, ys, p->ly, &p->cand[i], c_ws,
                                CWS_BYTES, st) == CUBLAS_STATUS_SUCCESS;
        }
        if (!ok) continue;
        float ms = 0;
        CUDA_TRY(cudaEventRecord(ev[1], st));
        CUDA_TRY(cudaEventSynchronize(ev[1]));
        CUDA_TRY(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (ms < best) best = ms, besti = i;
    }
    p->algo = p->cand[besti];
done:
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    if (ys) cudaFree(ys);
    return err;
}

// y[r, :] += b (the bias when no fused algorithm exists)
template <typename Y> __global__ void add_bias_rows(Y *y, const Y *b, int64_t n, int64_t out) {
    const int64_t total = n * out;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        if constexpr (sizeof(Y) == 4) y[i] += b[i % out];
        else y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(b[i % out]));
    }
}

} // namespace

extern "C" kiln_error *kiln_clip_linear_cuda(void *y, int y_f32, const kiln_bf16 *x, const kiln_bf16 *w,
                                             const void *bias, int64_t n, int64_t in, int64_t out, int accumulate,
                                             void *stream) {
    kiln_error *err = NULL;
    cplan *p = NULL;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const uint32_t al[3] = {c_align(w), c_align(x), c_align(y)};
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || out <= 0) return NULL;
    if (in <= 0 || (accumulate && !y_f32))
        return kiln_errorf(KILN_EINVAL, "CLIP linear (CUDA): %lld inputs%s", (long long)in,
                           accumulate && !y_f32 ? ", accumulating into bf16" : "");
    pthread_mutex_lock(&c_lock);
    if ((err = cplan_get(n, in, out, y_f32, bias != NULL, accumulate, al, &p))) goto done;
    if (!p->tuned && tune_on() && (err = cplan_tune(p, w, x, bias, st))) goto done;
    if (bias && p->fused)
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_TRY(cublasLtMatmul(c_lt, p->op, &alpha, w, p->lw, x, p->lx, &beta, y, p->ly, y, p->ly, &p->algo, c_ws,
                              CWS_BYTES, st));
    if (bias && !p->fused) {
        const int64_t total = n * out, blocks = (total + 255) / 256;
        const int g = (int)(blocks < 1048576 ? blocks : 1048576);
        if (y_f32) add_bias_rows<float><<<g, 256, 0, st>>>((float *)y, (const float *)bias, n, out);
        else add_bias_rows<__nv_bfloat16><<<g, 256, 0, st>>>((__nv_bfloat16 *)y, (const __nv_bfloat16 *)bias, n, out);
        CUDA_TRY(cudaGetLastError());
    }
done:
    pthread_mutex_unlock(&c_lock);
    return err ? kiln_error_wrap(err, "CLIP linear %lldx%lldx%lld (CUDA)", (long long)n, (long long)out, (long long)in)
               : NULL;
}
