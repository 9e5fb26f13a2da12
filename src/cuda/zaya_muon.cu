// Muon's Newton-Schulz iteration on the GPU for the ZAYA trainer (src/models/zaya_cuda_train.c): the
// quintic of kiln_newton_schulz (src/train/optim.c) on every matrix of a tensor at once, each product one
// strided-batched GEMM over the matrices (the experts' E matrices in one call). The Gram matrix is taken on
// the short side without transposing: for a wide x [r, c] (r <= c) A = x xᵀ and x <- a x + B x, for a tall
// one A = xᵀ x and x <- a x + x B (B is symmetric).
//
// Three arithmetics (kiln_ns_precision, the config's optim.muon_ns_precision):
//  - fp32: cuBLAS f32 GEMMs in pedantic mode (no TF32), the CPU's arithmetic; ~50 TFLOP/s on an H200.
//  - tf32: the same f32 data through cuBLASLt with TF32 tensor-core products and f32 accumulation.
//  - bf16: cuBLASLt with bf16 inputs and f32 accumulation, as Muon's reference implementation (Keller
//    Jordan's) runs it: the iteration converges toward the orthogonal polar factor from wherever it is, so
//    the inputs' rounding does not build up. A and B are kept in bf16 (they are only ever GEMM inputs), but
//    the iterate x stays in f32 between steps, rounded to a bf16 copy for each step's products: x <- a x +
//    B x reads and writes the f32 x as the GEMM's C and D. This costs one conversion pass and the f32 C/D
//    traffic per step (about 10 bytes an element, ~15% of the GEMM time at the experts' shapes), and it
//    buys accuracy where it matters: a momentum matrix has a few large singular values above a bulk of
//    small ones, and storing x in bf16 rounds every element to 2^-9 of the large part, which swamps the
//    small directions that the iteration then scales up to 1. Simulated on the CPU (bf16 rounding, f32
//    accumulation) for a rank-8 matrix plus 5% noise, 256 x 1024: relative distance to the f32 result
//    1.1e-3 with the f32 iterate, 7.0e-2 with a bf16 iterate; on uniform random matrices both ~1.5e-2.
//    The GPU tests check both kinds of matrix (tests/gpu/test_gpu_zaya_train.c).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <pthread.h>
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"
#include "launch.cuh"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

namespace {
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
cublasHandle_t g_handle;

// cuBLASLt for tf32 and bf16: one handle and workspace for the process (one compute stream per process, as
// src/cuda/linear.cu assumes), and each GEMM's plan (descriptors and the heuristic's algorithm) kept: a
// training step repeats a few shapes five times over, and building a plan costs tens of microseconds.
// The cuBLAS handle (fp32, and the fallback) uses the same workspace, set after every cublasSetStream (which
// hands the handle back to cuBLAS's default workspace, one per stream): a process that destroys a model and its
// stream and makes another (the GPU tests do) must not leave the handle on the old stream's workspace.
cublasLtHandle_t g_lt;
void *g_lt_ws;
const size_t LT_WS_BYTES = 32u << 20;

struct gemm_key {
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
    int ta, tb, in_t, out_t, ct;
    uint32_t align[4]; // of cuBLASLt's A (our b), B (our a), C, D over every matrix of the batch
};
struct plan {
    gemm_key key;
    int lt; // 0: cuBLASLt has no algorithm for it (odd leading dimensions): cublasGemmStridedBatchedEx
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
enum { MAX_PLANS = 64 };
plan g_plans[MAX_PLANS];
int g_nplans;

void plan_destroy(plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

// the alignment every matrix of a strided batch has: the base pointer's and the stride's in bytes
uint32_t align_of(const void *p, int64_t stride_bytes) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a || stride_bytes % a)) a >>= 1;
    return a;
}

size_t dt_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// Row-major over `batch` matrices: D[m,n] = alpha op(A) op(B) + beta C, C and D of one layout (C may be D).
struct gemm_args {
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const void *a, *b, *c;
    void *d;
    int64_t lda, sa, ldb, sb, ldc, sc, batch;
};

kiln_error *plan_get(const gemm_key *key, plan **out) {
    kiln_error *err = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    plan p;
    memset(&p, 0, sizeof p);
    memset(&heur, 0, sizeof heur);
    for (int i = 0; i < g_nplans; i++)
        if (!memcmp(&g_plans[i].key, key, sizeof *key)) {
            *out = &g_plans[i];
            return NULL;
        }
    if (!g_lt) CUBLAS_TRY(cublasLtCreate(&g_lt));
    if (!g_lt_ws) CUDA_TRY(cudaMalloc(&g_lt_ws, LT_WS_BYTES));
    {
        // the column-major view: Dᵀ[n,m] = op(B)ᵀ op(A)ᵀ, cuBLASLt's A is our b and its B our a
        const cudaDataType_t in_t = (cudaDataType_t)key->in_t, out_t = (cudaDataType_t)key->out_t;
        const cublasOperation_t opa = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        const uint64_t b_rows = key->tb ? key->k : key->n, b_cols = key->tb ? key->n : key->k;
        const uint64_t a_rows = key->ta ? key->m : key->k, a_cols = key->ta ? key->k : key->m;
        const int32_t cnt = (int32_t)key->batch;
        p.key = *key;
        CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, (cublasComputeType_t)key->ct, CUDA_R_32F));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.la, in_t, b_rows, b_cols, key->ldb));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lb, in_t, a_rows, a_cols, key->lda));
        CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.lc, out_t, (uint64_t)key->n, (uint64_t)key->m, key->ldc));
        const cublasLtMatrixLayout_t ls[3] = {p.la, p.lb, p.lc};
        const int64_t strides[3] = {key->sb, key->sa, key->sc};
        for (int i = 0; i < 3; i++) {
            CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
            CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                        sizeof strides[i]));
        }
        CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &LT_WS_BYTES,
                                                        sizeof LT_WS_BYTES));
        const cublasLtMatmulPreferenceAttributes_t al[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &key->align[i], sizeof key->align[i]));
        // no algorithm is not an error: odd shapes (leading dimensions no tensor-core kernel takes) go to the
        // cuBLAS GEMM below, which has a kernel for every shape
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g_lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &heur, &found);
        if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_TRY(hs);
        p.lt = hs == CUBLAS_STATUS_SUCCESS && found > 0 && heur.state == CUBLAS_STATUS_SUCCESS;
        p.algo = heur.algo;
        if (g_nplans == MAX_PLANS) { // more shapes than a training step has: start over
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

// One strided-batched GEMM in tf32 (in_t = out_t = f32) or bf16 (in_t bf16, out_t bf16 or f32): cuBLASLt when
// it has an algorithm for the shape, else cublasGemmStridedBatchedEx (in place: C copied to D first).
kiln_error *lt_gemm(cudaStream_t st, cublasComputeType_t ct, cudaDataType_t in_t, cudaDataType_t out_t,
                    const gemm_args &g) {
    kiln_error *err = NULL;
    plan *p = NULL;
    const size_t ie = dt_size(in_t), oe = dt_size(out_t);
    gemm_key key;
    memset(&key, 0, sizeof key); // the padding too: keys are compared with memcmp
    key.m = g.m, key.n = g.n, key.k = g.k, key.lda = g.lda, key.ldb = g.ldb, key.ldc = g.ldc;
    key.sa = g.sa, key.sb = g.sb, key.sc = g.sc, key.batch = g.batch;
    key.ta = g.ta, key.tb = g.tb, key.in_t = (int)in_t, key.out_t = (int)out_t, key.ct = (int)ct;
    key.align[0] = align_of(g.b, g.sb * (int64_t)ie), key.align[1] = align_of(g.a, g.sa * (int64_t)ie);
    key.align[2] = align_of(g.c, g.sc * (int64_t)oe), key.align[3] = align_of(g.d, g.sc * (int64_t)oe);
    KILN_TRY(plan_get(&key, &p));
    if (p->lt) {
        cublasStatus_t s = cublasLtMatmul(g_lt, p->op, &g.alpha, g.b, p->la, g.a, p->lb, &g.beta, g.c, p->lc, g.d,
                                          p->lc, &p->algo, g_lt_ws, LT_WS_BYTES, st);
        if (s != CUBLAS_STATUS_NOT_SUPPORTED) { // an algorithm the heuristic offered may still refuse: fall back
            CUBLAS_TRY(s);
            return NULL;
        }
        p->lt = 0;
    }
    if (g.c != g.d && g.beta != 0.0f)
        CUDA_TRY(cudaMemcpyAsync(g.d, g.c, (size_t)(g.batch * g.sc) * oe, cudaMemcpyDeviceToDevice, st));
    CUBLAS_TRY(cublasSetMathMode(g_handle, CUBLAS_DEFAULT_MATH)); // the compute type says tf32 or f32
    CUBLAS_TRY(cublasGemmStridedBatchedEx(g_handle, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          (int)g.n, (int)g.m, (int)g.k, &g.alpha, g.b, in_t, (int)g.ldb, g.sb, g.a,
                                          in_t, (int)g.lda, g.sa, &g.beta, g.d, out_t, (int)g.ldc, g.sc, (int)g.batch,
                                          ct, CUBLAS_GEMM_DEFAULT));
done:
    return err;
}

// Row-major C[m,n] = alpha op(A) op(B) + beta C over `batch` matrices: cuBLAS's column-major view of a
// row-major matrix is its transpose, so this is Cᵀ = op(B)ᵀ op(A)ᵀ with the operands swapped.
cublasStatus_t rm_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       int64_t sa, const float *b, int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc,
                       int64_t sc, int64_t batch) {
    return cublasSgemmStridedBatched(g_handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                                     (int)m, (int)k, &alpha, b, (int)ldb, sb, a, (int)lda, sa, &beta, c, (int)ldc, sc,
                                     (int)batch);
}

// f32 -> bf16, round to nearest even; four elements a thread where both buffers allow 16/8-byte accesses
__global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, int64_t n, int vec) {
    pdl_wait();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t done4 = 0;
    if (vec) {
        const int64_t n4 = n / 4;
        for (int64_t i = t; i < n4; i += stride) {
            const float4 v = reinterpret_cast<const float4 *>(x)[i];
            __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
            uint2 o;
            memcpy(&o.x, &lo, 4);
            memcpy(&o.y, &hi, 4);
            reinterpret_cast<uint2 *>(y)[i] = o;
        }
        done4 = n4 * 4;
    }
    for (int64_t i = done4 + t; i < n; i += stride) y[i] = __float2bfloat16_rn(x[i]);
}

kiln_error *to_bf16(__nv_bfloat16 *y, const float *x, int64_t n, cudaStream_t st) {
    kiln_error *err = NULL;
    const int vec = (uintptr_t)x % 16 == 0 && (uintptr_t)y % 8 == 0;
    int64_t blocks = ((vec ? n / 4 : n) + 255) / 256;
    blocks = blocks < 1 ? 1 : blocks > 8192 ? 8192 : blocks;
    kiln_launch(to_bf16_kernel, (unsigned)blocks, 256, 0, st, y, x, n, vec);
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}

// The Gram matrices' batch stride, padded to 128 elements so that every matrix of the batch starts 256-byte
// aligned in bf16 (tensor-core kernels want 16 bytes at least; the trainer's r x r is often odd-sized, 17 x 17)
int64_t gram_stride(int64_t r) { return (r * r + 127) / 128 * 128; }

// tf32: A, B and the next x in f32 (the workspace's A | B | X2); x and X2 alternate as the iterate, so no
// step copies (C = the current x, D = the other); the result ends in x.
kiln_error *ns_tf32(float *x, int64_t mats, int64_t rows, int64_t cols, int steps, float *ws, cudaStream_t st) {
    kiln_error *err = NULL;
    const bool tall = rows > cols;
    const int64_t r = tall ? cols : rows, mn = rows * cols, sr = gram_stride(r);
    float *A = ws, *B = A + mats * sr, *X2 = B + mats * sr, *cur = x, *nxt = X2;
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    for (int s = 0; s < steps; s++) {
        gemm_args g;
        // A = x xᵀ (wide) or xᵀ x (tall)
        g = {tall, !tall, r, r, tall ? rows : cols, 1.0f, 0.0f, cur, cur, A, A, cols, mn, cols, mn, r, sr, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_32F, CUDA_R_32F, g));
        // B = b A + c A A
        g = {false, false, r, r, r, NS_C, NS_B, A, A, A, B, r, sr, r, sr, r, sr, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_32F, CUDA_R_32F, g));
        // next = a x + B x (wide) or a x + x B (tall)
        if (tall) g = {false, false, rows, cols, r, 1.0f, NS_A, cur, B, cur, nxt, cols, mn, r, sr, cols, mn, mats};
        else g = {false, false, rows, cols, r, 1.0f, NS_A, B, cur, cur, nxt, r, sr, cols, mn, cols, mn, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_32F, CUDA_R_32F, g));
        float *t = cur;
        cur = nxt, nxt = t;
    }
    if (cur != x) CUDA_TRY(cudaMemcpyAsync(x, cur, (size_t)(mats * mn) * sizeof(float), cudaMemcpyDeviceToDevice, st));
done:
    return err;
}

// bf16: A and B in bf16, x in f32 with a bf16 copy xb made at each step (the workspace's A | B | xb, bf16)
kiln_error *ns_bf16(float *x, int64_t mats, int64_t rows, int64_t cols, int steps, float *ws, cudaStream_t st) {
    const bool tall = rows > cols;
    const int64_t r = tall ? cols : rows, mn = rows * cols, sr = gram_stride(r);
    __nv_bfloat16 *A = (__nv_bfloat16 *)ws, *B = A + mats * sr, *xb = B + mats * sr;
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    for (int s = 0; s < steps; s++) {
        gemm_args g;
        KILN_TRY(to_bf16(xb, x, mats * mn, st));
        // A = xb xbᵀ (wide) or xbᵀ xb (tall), rounded to bf16
        g = {tall, !tall, r, r, tall ? rows : cols, 1.0f, 0.0f, xb, xb, A, A, cols, mn, cols, mn, r, sr, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_16BF, CUDA_R_16BF, g));
        // B = b A + c A A, rounded to bf16
        g = {false, false, r, r, r, NS_C, NS_B, A, A, A, B, r, sr, r, sr, r, sr, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_16BF, CUDA_R_16BF, g));
        // x = a x + B xb (wide) or a x + xb B (tall), x f32 as C and D
        if (tall) g = {false, false, rows, cols, r, 1.0f, NS_A, xb, B, x, x, cols, mn, r, sr, cols, mn, mats};
        else g = {false, false, rows, cols, r, 1.0f, NS_A, B, xb, x, x, r, sr, cols, mn, cols, mn, mats};
        KILN_TRY(lt_gemm(st, ct, CUDA_R_16BF, CUDA_R_32F, g));
    }
    return NULL;
}
} // namespace

extern "C" size_t kiln_zaya_newton_schulz_cuda_ws(int64_t mats, int64_t rows, int64_t cols) {
    int64_t r = rows < cols ? rows : cols;
    // fp32: A, B, BX (r*r, r*r, rows*cols floats); tf32: the same with the Gram stride padded; bf16 half that
    return (size_t)(mats * (2 * gram_stride(r) + rows * cols));
}

extern "C" kiln_error *kiln_zaya_newton_schulz_cuda(float *x, int64_t mats, int64_t rows, int64_t cols, int steps,
                                                    kiln_ns_precision prec, float *ws, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const bool tall = rows > cols;
    const int64_t r = tall ? cols : rows, mn = rows * cols;
    float *A = ws, *B = A + mats * r * r, *BX = B + mats * r * r;
    kiln_opt_param p = {0, mats * mn, KILN_OPT_MUON, mats, rows, cols, 0};
    if (mats <= 0 || mn <= 0) return NULL;
    if (prec != KILN_NS_FP32 && prec != KILN_NS_TF32 && prec != KILN_NS_BF16)
        return kiln_errorf(KILN_EINVAL, "Newton-Schulz on %lld matrices of %lldx%lld: precision %d is not fp32, tf32 "
                           "or bf16", (long long)mats, (long long)rows, (long long)cols, (int)prec);
    pthread_mutex_lock(&g_lock);
    if (!g_handle) CUBLAS_TRY(cublasCreate(&g_handle));
    if (!g_lt_ws) CUDA_TRY(cudaMalloc(&g_lt_ws, LT_WS_BYTES));
    CUBLAS_TRY(cublasSetStream(g_handle, st));
    CUBLAS_TRY(cublasSetWorkspace(g_handle, g_lt_ws, LT_WS_BYTES));
    err = kiln_muon_normalize_cuda(x, &p, stream);
    if (err) goto done;
    if (prec == KILN_NS_TF32) {
        err = ns_tf32(x, mats, rows, cols, steps, ws, st);
        goto done;
    }
    if (prec == KILN_NS_BF16) {
        err = ns_bf16(x, mats, rows, cols, steps, ws, st);
        goto done;
    }
    CUBLAS_TRY(cublasSetMathMode(g_handle, CUBLAS_PEDANTIC_MATH)); // true f32, no TF32: the CPU's arithmetic
    for (int s = 0; s < steps; s++) {
        // A = x xᵀ (wide) or xᵀ x (tall)
        if (tall) CUBLAS_TRY(rm_gemm(true, false, r, r, rows, 1.0f, x, cols, mn, x, cols, mn, 0.0f, A, r, r * r, mats));
        else CUBLAS_TRY(rm_gemm(false, true, r, r, cols, 1.0f, x, cols, mn, x, cols, mn, 0.0f, A, r, r * r, mats));
        // B = b A + c A A
        CUDA_TRY(cudaMemcpyAsync(B, A, (size_t)(mats * r * r) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        CUBLAS_TRY(rm_gemm(false, false, r, r, r, NS_C, A, r, r * r, A, r, r * r, NS_B, B, r, r * r, mats));
        // x = a x + B x (wide) or a x + x B (tall)
        CUDA_TRY(cudaMemcpyAsync(BX, x, (size_t)(mats * mn) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        if (tall) CUBLAS_TRY(rm_gemm(false, false, rows, cols, r, 1.0f, x, cols, mn, B, r, r * r, NS_A, BX, cols, mn, mats));
        else CUBLAS_TRY(rm_gemm(false, false, rows, cols, r, 1.0f, B, r, r * r, x, cols, mn, NS_A, BX, cols, mn, mats));
        CUDA_TRY(cudaMemcpyAsync(x, BX, (size_t)(mats * mn) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    }
done:
    pthread_mutex_unlock(&g_lock);
    if (err) err = kiln_error_wrap(err, "Newton-Schulz (%s) on %lld matrices of %lldx%lld", kiln_ns_precision_name(prec),
                                   (long long)mats, (long long)rows, (long long)cols);
    return err;
}
