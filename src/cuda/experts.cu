// ZAYA's experts on the device, the steps of src/nn/experts.c: dispatch (src/cuda/router.cu), gather the
// routed rows in expert order, one grouped GEMM for every expert's gate_up, SwiGLU, one grouped GEMM for
// down, then the gated sum back to the tokens. Each token reads its own top_k slots through tok_slot and
// adds them in k order, so the scatter needs no atomics and gives the same bits every run; the backward
// sums dx the same way. Skip-routed slots never enter the permutation, so they cost nothing.
//
// The grouped GEMMs take each expert's row count on the host (cuBLAS's grouped API wants host arrays of
// m, n, k), hence one small device-to-host copy of the offsets per forward; the backward reuses it.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"

namespace {

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
cublasHandle_t g_blas;
int g_grouped_f32_refused; // this cuBLAS has no grouped kernel with f32 C for bf16 inputs

__device__ __forceinline__ float bf(__nv_bfloat16 v) { return __bfloat162float(v); }

// xe[s,:] = in[slot_tok[s],:], 8 bf16 (16 bytes) per load where rows allow it
__global__ void gather_kernel(__nv_bfloat16 *xe, const __nv_bfloat16 *in, const int32_t *slot_tok, int64_t H, int vec) {
    const int64_t s = blockIdx.x;
    const __nv_bfloat16 *src = in + (int64_t)slot_tok[s] * H;
    __nv_bfloat16 *dst = xe + s * H;
    if (vec) {
        for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x) ((int4 *)dst)[i] = ((const int4 *)src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
    }
}

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + __expf(-g)); }

// act[s,j] = silu(gu[s,j]) * gu[s,I+j]; P (1 or 2) neighbouring columns per thread, bf16x2 loads when 2
template <int P>
__global__ void swiglu_fwd_kernel(__nv_bfloat16 *act, const __nv_bfloat16 *gu, int64_t rows, int64_t I) {
    const int64_t IP = I / P, n = rows * IP;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / IP, j = (t - r * IP) * P;
        const __nv_bfloat16 *g = gu + r * 2 * I + j, *u = g + I;
        if (P == 2) {
            const float2 gv = __bfloat1622float2(*(const __nv_bfloat162 *)g), uv = __bfloat1622float2(*(const __nv_bfloat162 *)u);
            *(__nv_bfloat162 *)(act + r * I + j) =
                __floats2bfloat162_rn(gv.x * sigmoidf_(gv.x) * uv.x, gv.y * sigmoidf_(gv.y) * uv.y);
        } else {
            const float gv = bf(*g), uv = bf(*u);
            act[r * I + j] = __float2bfloat16_rn(gv * sigmoidf_(gv) * uv);
        }
    }
}

// dgu = d/d(gu) of act given dact (overwritten: the buffer is this op's own)
template <int P>
__global__ void swiglu_bwd_kernel(__nv_bfloat16 *dgu, const __nv_bfloat16 *dact, const __nv_bfloat16 *gu, int64_t rows,
                                  int64_t I) {
    const int64_t IP = I / P, n = rows * IP;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / IP, j = (t - r * IP) * P;
        float g[2], u[2], d[2], dg[2], du[2];
        for (int q = 0; q < P; q++) {
            g[q] = bf(gu[r * 2 * I + j + q]), u[q] = bf(gu[r * 2 * I + I + j + q]), d[q] = bf(dact[r * I + j + q]);
            const float sg = sigmoidf_(g[q]);
            dg[q] = d[q] * u[q] * sg * (1.0f + g[q] * (1.0f - sg));
            du[q] = d[q] * g[q] * sg;
        }
        if (P == 2) {
            *(__nv_bfloat162 *)(dgu + r * 2 * I + j) = __floats2bfloat162_rn(dg[0], dg[1]);
            *(__nv_bfloat162 *)(dgu + r * 2 * I + I + j) = __floats2bfloat162_rn(du[0], du[1]);
        } else {
            dgu[r * 2 * I + j] = __float2bfloat16_rn(dg[0]);
            dgu[r * 2 * I + I + j] = __float2bfloat16_rn(du[0]);
        }
    }
}

// out[n,h] = sum over k (in order) of gate[n,k] * ye[tok_slot[n,k], h]; skipped slots add nothing
__global__ void combine_kernel(float *out, const __nv_bfloat16 *ye, const float *gate, const int32_t *tok_slot,
                               int64_t H, int64_t top) {
    const int64_t n = blockIdx.x;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0;
        for (int64_t k = 0; k < top; k++) {
            const int32_t s = tok_slot[n * top + k];
            if (s >= 0) acc += gate[n * top + k] * bf(ye[(int64_t)s * H + h]);
        }
        out[n * H + h] = acc;
    }
}

// dx[n,h] += sum over k (in order) of dxe[tok_slot[n,k], h]
__global__ void combine_dx_kernel(float *dx, const __nv_bfloat16 *dxe, const int32_t *tok_slot, int64_t H, int64_t top) {
    const int64_t n = blockIdx.x;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0;
        for (int64_t k = 0; k < top; k++) {
            const int32_t s = tok_slot[n * top + k];
            if (s >= 0) acc += bf(dxe[(int64_t)s * H + h]);
        }
        dx[n * H + h] += acc;
    }
}

// per slot: dye = gate * dout[token], dgate = dout[token] . ye (block reduction in a fixed tree)
enum { DG_THREADS = 256 };
__global__ void dye_dgate_kernel(__nv_bfloat16 *dye, float *dgate, const float *dout, const __nv_bfloat16 *ye,
                                 const float *gate, const int32_t *slot_tok, const int32_t *slot_k, int64_t H,
                                 int64_t top) {
    __shared__ float red[DG_THREADS / 32];
    const int64_t s = blockIdx.x, n = slot_tok[s], gi = n * top + slot_k[s];
    const float g = gate[gi];
    float acc = 0;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        const float d = dout[n * H + h];
        dye[s * H + h] = __float2bfloat16_rn(g * d);
        acc += d * bf(ye[s * H + h]);
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int w = 0; w < DG_THREADS / 32; w++) t += red[w];
        dgate[gi] = t;
    }
}

// The grouped GEMM's pointer arrays (A, B, C of each group), carried to the device as a kernel argument
// (3 * 128 pointers: 3 KB, under the 4 KB argument limit) and written at dptrs, dptrs + E, dptrs + 2E.
enum { PTR_PACK = 384 };
struct ptr_pack {
    const void *v[PTR_PACK];
    int n;
};
__global__ void put_ptrs_kernel(void **dptrs, const ptr_pack pk, int G, int E) {
    for (int i = threadIdx.x; i < pk.n; i += blockDim.x) dptrs[(i / G) * E + i % G] = (void *)pk.v[i];
}

// KILN_GROUPED_GEMM: unset, cuBLAS's grouped call (0); "lt_loop", one cuBLASLt GEMM per expert (1);
// "lt_chunks", the forward and input-gradient GEMMs as one cuBLASLt pointer-array batched GEMM over
// chunks of CHUNK_ROWS rows (2). For measuring them against each other (bench/moe_gpu.sh); read on every
// call so a test can switch it.
int grouped_mode() {
    const char *v = getenv("KILN_GROUPED_GEMM");
    return !v ? 0 : !strcmp(v, "lt_loop") ? 1 : !strcmp(v, "lt_chunks") ? 2 : 0;
}

} // namespace

extern "C" kiln_error *kiln_gemm_bf16_ptr_batched_cuda(void *const *dc, int c_f32, const void *const *da,
                                                       const void *const *db, int64_t batch, int64_t m, int64_t n,
                                                       int64_t k, const char *layout, int accumulate, uint32_t align,
                                                       void *stream); // linear.cu

namespace {

// NT/NN over experts as ONE batched GEMM of equal shapes: each expert's rows cut into chunks of CHUNK_ROWS,
// its last chunk ending at its last row (overlapping the previous one: the overlap is computed twice with
// the same inputs, weights and kernel, so both writes carry the same bits). Experts with fewer rows than a
// chunk get a GEMM of their own.
enum { CHUNK_ROWS = 256 };
kiln_error *chunked(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs, int64_t E,
                    int64_t n, int64_t k, const char *layout, int accumulate, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const size_t ce = c_f32 ? 4 : 2;
    int64_t nch = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e];
        if (me >= CHUNK_ROWS) nch += (me + CHUNK_ROWS - 1) / CHUNK_ROWS;
    }
    const void **h = (const void **)malloc((size_t)(3 * nch + 1) * sizeof *h);
    void **d = NULL;
    uintptr_t bits = 0;
    int64_t i = 0;
    if (!h) return kiln_errorf(KILN_ENOMEM, "chunked GEMM: %lld chunks", (long long)nch);
    for (int64_t e = 0; e < E && !err; e++) {
        const int64_t me = offs[e + 1] - offs[e], o = offs[e];
        if (!me) continue;
        if (me < CHUNK_ROWS) {
            err = kiln_gemm_bf16_cuda((char *)c + (size_t)(o * n) * ce, c_f32, a + o * k, b + e * n * k, me, n, k, layout,
                                      accumulate, stream);
            continue;
        }
        for (int64_t r = 0; r < me; r += CHUNK_ROWS, i++) {
            const int64_t s0 = o + (r + CHUNK_ROWS <= me ? r : me - CHUNK_ROWS);
            h[i] = a + s0 * k, h[nch + i] = b + e * n * k, h[2 * nch + i] = (char *)c + (size_t)(s0 * n) * ce;
            bits |= (uintptr_t)h[i] | (uintptr_t)h[nch + i] | (uintptr_t)h[2 * nch + i];
        }
    }
    if (!err && nch) {
        if (accumulate) // overlapping chunks would add their shared rows twice
            err = kiln_errorf(KILN_EUNSUPPORTED, "chunked GEMM: accumulation");
        if (!err && cudaMallocAsync((void **)&d, (size_t)(3 * nch) * sizeof *d, st) != cudaSuccess)
            err = kiln_errorf(KILN_ENOMEM, "chunked GEMM: %lld pointers on the device", (long long)(3 * nch));
        if (!err && cudaMemcpyAsync(d, h, (size_t)(3 * nch) * sizeof *d, cudaMemcpyHostToDevice, st) != cudaSuccess)
            err = kiln_errorf(KILN_EIO, "chunked GEMM: copying the pointers");
        uint32_t align = 256;
        while (align > 2 && (bits % align)) align >>= 1;
        if (!err)
            err = kiln_gemm_bf16_ptr_batched_cuda(d + 2 * nch, c_f32, (const void *const *)d,
                                                  (const void *const *)(d + nch), nch, CHUNK_ROWS, n, k, layout, 0,
                                                  align, stream);
        if (d) cudaFreeAsync(d, st);
    }
    free(h);
    return err;
}

int grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// bf16x2 access is safe when I is even and the buffers are 4-byte aligned
bool pairs(int64_t I, const void *a, const void *b, const void *c) {
    return !(I & 1) && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 3);
}

kiln_error *blas_handle(cudaStream_t st) {
    kiln_error *err = NULL;
    if (!g_blas) CUBLAS_TRY(cublasCreate(&g_blas));
    CUBLAS_TRY(cublasSetStream(g_blas, st));
done:
    return err;
}

} // namespace

extern "C" kiln_error *kiln_grouped_gemm_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b,
                                              const int32_t *offs, int64_t E, int64_t m, int64_t n, int64_t k,
                                              const char *layout, int accumulate, int *looped, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int tn = layout && !strcmp(layout, "TN"), nt = layout && !strcmp(layout, "NT"),
              nn = layout && !strcmp(layout, "NN");
    const size_t ce = c_f32 ? 4 : 2;
    int G = 0, locked = 0, odd = 0;
    cublasOperation_t *ta = NULL, *tb = NULL;
    int *mm = NULL, *nv = NULL, *kv = NULL, *lda = NULL, *ldb = NULL, *ldc = NULL, *gs = NULL;
    float *alpha = NULL, *beta = NULL;
    const void **ptrs = NULL;
    void **dptrs = NULL;
    if (looped) *looped = 0;
    if (!(tn || nt || nn))
        return kiln_errorf(KILN_EINVAL, "grouped GEMM: layout '%s', expected NT, NN or TN", layout ? layout : "(null)");
    if (E < 1 || m < 0 || n < 1 || (!tn && k < 1) || (tn && m < 1) || n > INT32_MAX || k > INT32_MAX || m > INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "grouped GEMM %s: E=%lld m=%lld n=%lld k=%lld", layout, (long long)E,
                           (long long)m, (long long)n, (long long)k);
    for (int64_t e = 0; e < E; e++)
        if (offs[e + 1] < offs[e] || offs[e] < 0)
            return kiln_errorf(KILN_EINVAL, "grouped GEMM %s: expert %lld's offsets %d..%d decrease", layout,
                               (long long)e, offs[e], offs[e + 1]);
    if (!tn && grouped_mode() == 2) { // KILN_GROUPED_GEMM=lt_chunks
        err = chunked(c, c_f32, a, b, offs, E, n, k, layout, accumulate, stream);
        if (looped) *looped = 0;
        goto done;
    }
    if (grouped_mode()) { // KILN_GROUPED_GEMM=lt_loop (and lt_chunks' weight gradients): one cuBLASLt GEMM per expert through linear.cu's cached plans
        if (looped) *looped = 1;
        for (int64_t e = 0; e < E && !err; e++) {
            const int64_t me = offs[e + 1] - offs[e], o = offs[e];
            if (tn) err = kiln_gemm_bf16_cuda((char *)c + (size_t)(e * m * n) * ce, c_f32, a + o * m, b + o * n, m, n, me,
                                              "TN", accumulate, stream);
            else if (me) err = kiln_gemm_bf16_cuda((char *)c + (size_t)(o * n) * ce, c_f32, a + o * k,
                                                   b + e * n * k, me, n, k, layout, accumulate, stream);
        }
        goto done;
    }
    ta = (cublasOperation_t *)malloc((size_t)E * sizeof *ta);
    tb = (cublasOperation_t *)malloc((size_t)E * sizeof *tb);
    mm = (int *)malloc((size_t)E * 7 * sizeof(int));
    alpha = (float *)malloc((size_t)E * 2 * sizeof(float));
    ptrs = (const void **)malloc((size_t)E * 3 * sizeof *ptrs);
    if (!ta || !tb || !mm || !alpha || !ptrs) {
        err = kiln_errorf(KILN_ENOMEM, "grouped GEMM: %lld experts", (long long)E);
        goto done;
    }
    nv = mm + E, kv = mm + 2 * E, lda = mm + 3 * E, ldb = mm + 4 * E, ldc = mm + 5 * E, gs = mm + 6 * E;
    beta = alpha + E;
    // row-major C[M,N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our B
    for (int64_t e = 0; e < E; e++) {
        const int64_t me = offs[e + 1] - offs[e], o = offs[e];
        if (!me) { // an expert without rows: its weight gradient is an empty sum
            if (tn && !accumulate) CUDA_TRY(cudaMemsetAsync((char *)c + (size_t)(e * m * n) * ce, 0, (size_t)(m * n) * ce, st));
            continue;
        }
        const int64_t M = tn ? m : me, K = tn ? me : k; // the row-major problem C[M,n] = op(A)[M,K] op(B)[K,n]
        const int tra = tn, trb = nt;
        const void *A = tn ? (const void *)(a + o * m) : (const void *)(a + o * k);
        const void *B = tn ? (const void *)(b + o * n) : (const void *)(b + e * n * k);
        void *C = tn ? (char *)c + (size_t)(e * m * n) * ce : (char *)c + (size_t)(o * n) * ce;
        ta[G] = trb ? CUBLAS_OP_T : CUBLAS_OP_N;
        tb[G] = tra ? CUBLAS_OP_T : CUBLAS_OP_N;
        mm[G] = (int)n, nv[G] = (int)M, kv[G] = (int)K;
        lda[G] = (int)(trb ? K : n);
        ldb[G] = (int)(tra ? M : K);
        ldc[G] = (int)n;
        gs[G] = 1;
        alpha[G] = 1.0f, beta[G] = accumulate ? 1.0f : 0.0f;
        ptrs[G] = B, ptrs[E + G] = A, ptrs[2 * E + G] = C;
        odd |= (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) & 15) || ((size_t)lda[G] * 2 & 15) ||
               ((size_t)ldb[G] * 2 & 15) || ((size_t)ldc[G] * ce & 15);
        G++;
    }
    if (!G) goto done;
    pthread_mutex_lock(&g_lock);
    locked = 1;
    if ((err = blas_handle(st))) goto done;
    {
        const cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
        // the pointer arrays live on the device
        const void **pa = ptrs, **pb = ptrs + E;
        void **pc = (void **)(ptrs + 2 * E);
        cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
        // cuBLAS cannot look at pointers that live on the device: it assumes them aligned as far as the leading
        // dimensions allow (weights 2 bytes into a flat buffer faulted with "misaligned address"). Such groups
        // take the per-expert path below, whose cublasGemmEx sees each pointer.
        if (!odd && !(c_f32 && g_grouped_f32_refused)) {
            CUDA_TRY(cudaMallocAsync((void **)&dptrs, (size_t)E * 3 * sizeof *dptrs, st));
            if (G <= PTR_PACK / 3) {
                // through a kernel argument: stream-ordered, no pageable copy that may wait for the device
                ptr_pack pk;
                for (int g = 0; g < G; g++) pk.v[g] = pa[g], pk.v[G + g] = pb[g], pk.v[2 * G + g] = pc[g];
                pk.n = 3 * G;
                put_ptrs_kernel<<<1, 128, 0, st>>>(dptrs, pk, G, (int)E);
                CUDA_TRY(cudaGetLastError());
            } else {
                CUDA_TRY(cudaMemcpyAsync(dptrs, pa, (size_t)G * sizeof *dptrs, cudaMemcpyHostToDevice, st));
                CUDA_TRY(cudaMemcpyAsync(dptrs + E, pb, (size_t)G * sizeof *dptrs, cudaMemcpyHostToDevice, st));
                CUDA_TRY(cudaMemcpyAsync(dptrs + 2 * E, pc, (size_t)G * sizeof *dptrs, cudaMemcpyHostToDevice, st));
            }
            s = cublasGemmGroupedBatchedEx(g_blas, ta, tb, mm, nv, kv, alpha, (const void *const *)dptrs, CUDA_R_16BF, lda,
                                           (const void *const *)(dptrs + E), CUDA_R_16BF, ldb, beta, dptrs + 2 * E, ct, ldc,
                                           G, gs, CUBLAS_COMPUTE_32F);
        }
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
            // unaligned, or no grouped kernel for the combination (cuBLAS 13.1 has none for bf16 in, f32 out):
            // one GEMM per expert
            if (!odd && c_f32) g_grouped_f32_refused = 1; // asked once per process
            if (looped) *looped = 1;
            for (int g = 0; g < G; g++)
                CUBLAS_TRY(cublasGemmEx(g_blas, ta[g], tb[g], mm[g], nv[g], kv[g], &alpha[g], pa[g], CUDA_R_16BF, lda[g],
                                        pb[g], CUDA_R_16BF, ldb[g], &beta[g], pc[g], ct, ldc[g], CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
        } else {
            CUBLAS_TRY(s);
        }
    }
done:
    if (locked) pthread_mutex_unlock(&g_lock);
    if (dptrs) cudaFreeAsync(dptrs, st);
    free(ta), free(tb), free(mm), free(alpha), free(ptrs);
    if (err)
        err = kiln_error_wrap(err, "grouped GEMM %s (%lld experts, m=%lld n=%lld k=%lld, C %s)", layout, (long long)E,
                              (long long)m, (long long)n, (long long)k, c_f32 ? "f32" : "bf16");
    return err;
}

extern "C" kiln_error *kiln_experts_forward_cuda(kiln_experts_cuda *x, float *out, const kiln_bf16 *in,
                                                 const kiln_bf16 *wgu, const kiln_bf16 *wdn, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t E = x->E, H = x->H, I = x->inter, N = x->N, top = x->top;
    int64_t S;
    if (H < 1 || I < 1)
        return kiln_errorf(KILN_EINVAL, "experts forward: hidden=%lld inter=%lld", (long long)H, (long long)I);
    if ((err = kiln_experts_dispatch_cuda(x, stream))) goto done;
    CUDA_TRY(cudaMemcpyAsync(x->exp_off_host, x->exp_off, (size_t)(E + 2) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    if (x->exp_off_host[E + 1]) {
        err = kiln_errorf(KILN_EINVAL, "%d of %lld expert choices are outside 0..%lld (%lld experts + the skip class)",
                          x->exp_off_host[E + 1], (long long)(N * top), (long long)E, (long long)E);
        goto done;
    }
    S = x->nslots = x->exp_off_host[E];
    if (N && !S) CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)(N * H) * sizeof(float), st));
    if (!S) goto done;
    gather_kernel<<<(unsigned)S, 128, 0, st>>>((__nv_bfloat16 *)x->xe, (const __nv_bfloat16 *)in, x->slot_tok, H,
                                               !(H & 7) && !(((uintptr_t)in | (uintptr_t)x->xe) & 15));
    CUDA_TRY(cudaGetLastError());
    if ((err = kiln_grouped_gemm_cuda(x->gu, 0, x->xe, wgu, x->exp_off_host, E, 0, 2 * I, H, "NT", 0, NULL, stream)))
        goto done;
    if (pairs(I, x->act, x->gu, x->gu))
        swiglu_fwd_kernel<2><<<grid_for(S * I / 2), 256, 0, st>>>((__nv_bfloat16 *)x->act, (const __nv_bfloat16 *)x->gu, S, I);
    else
        swiglu_fwd_kernel<1><<<grid_for(S * I), 256, 0, st>>>((__nv_bfloat16 *)x->act, (const __nv_bfloat16 *)x->gu, S, I);
    CUDA_TRY(cudaGetLastError());
    if ((err = kiln_grouped_gemm_cuda(x->ye, 0, x->act, wdn, x->exp_off_host, E, 0, H, I, "NT", 0, NULL, stream)))
        goto done;
    combine_kernel<<<(unsigned)N, 256, 0, st>>>(out, (const __nv_bfloat16 *)x->ye, x->gate, x->tok_slot, H, top);
    CUDA_TRY(cudaGetLastError());
done:
    if (err) err = kiln_error_wrap(err, "experts forward (tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld)",
                                   (long long)N, (long long)H, (long long)I, (long long)E, (long long)top);
    return err;
}

extern "C" kiln_error *kiln_experts_backward_cuda(const kiln_experts_cuda *x, float *dx, float *dgate, float *dwgu,
                                                  float *dwdn, const float *dout, const kiln_bf16 *wgu,
                                                  const kiln_bf16 *wdn, kiln_experts_cuda_scratch *w, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t E = x->E, H = x->H, I = x->inter, N = x->N, top = x->top, S = x->nslots;
    if (S != x->exp_off_host[E])
        return kiln_errorf(KILN_EINVAL, "experts backward: %lld slots but the forward's offsets say %d (run "
                           "kiln_experts_forward_cuda on this struct first)", (long long)S, x->exp_off_host[E]);
    if (N) CUDA_TRY(cudaMemsetAsync(dgate, 0, (size_t)(N * top) * sizeof(float), st));
    if (!S) goto done;
    dye_dgate_kernel<<<(unsigned)S, DG_THREADS, 0, st>>>((__nv_bfloat16 *)w->dye, dgate, dout,
                                                          (const __nv_bfloat16 *)x->ye, x->gate, x->slot_tok, x->slot_k,
                                                          H, top);
    CUDA_TRY(cudaGetLastError());
    // down: dact = dye wdn_e, dwdn_e += dyeᵀ act
    if ((err = kiln_grouped_gemm_cuda(w->dact, 0, w->dye, wdn, x->exp_off_host, E, 0, I, H, "NN", 0, NULL, stream)))
        goto done;
    if (dwdn && (err = kiln_grouped_gemm_cuda(dwdn, 1, w->dye, x->act, x->exp_off_host, E, H, I, 0, "TN", 1, NULL, stream)))
        goto done;
    if (pairs(I, w->dgu, w->dact, x->gu))
        swiglu_bwd_kernel<2><<<grid_for(S * I / 2), 256, 0, st>>>((__nv_bfloat16 *)w->dgu, (const __nv_bfloat16 *)w->dact,
                                                                  (const __nv_bfloat16 *)x->gu, S, I);
    else
        swiglu_bwd_kernel<1><<<grid_for(S * I), 256, 0, st>>>((__nv_bfloat16 *)w->dgu, (const __nv_bfloat16 *)w->dact,
                                                              (const __nv_bfloat16 *)x->gu, S, I);
    CUDA_TRY(cudaGetLastError());
    // gate_up: dxe = dgu wgu_e, dwgu_e += dguᵀ xe
    if ((err = kiln_grouped_gemm_cuda(w->dxe, 0, w->dgu, wgu, x->exp_off_host, E, 0, H, 2 * I, "NN", 0, NULL, stream)))
        goto done;
    if (dwgu &&
        (err = kiln_grouped_gemm_cuda(dwgu, 1, w->dgu, x->xe, x->exp_off_host, E, 2 * I, H, 0, "TN", 1, NULL, stream)))
        goto done;
    if (dx) {
        combine_dx_kernel<<<(unsigned)N, 256, 0, st>>>(dx, (const __nv_bfloat16 *)w->dxe, x->tok_slot, H, top);
        CUDA_TRY(cudaGetLastError());
    }
done:
    if (err) err = kiln_error_wrap(err, "experts backward (tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld)",
                                   (long long)N, (long long)H, (long long)I, (long long)E, (long long)top);
    return err;
}
