/* The CUDA twins of the CPU ops in include/kiln/nn.h: same name with a _cuda suffix, same argument
 * order and meaning, device pointers, launched asynchronously on `stream` (a cudaStream_t; NULL is the
 * default stream). Each returns NULL or a kiln_error naming the op and the CUDA error of the launch
 * (cudaGetLastError after every launch). Built when KILN_CUDA is on; without CUDA each returns "built
 * without CUDA" (src/cuda/nocuda.c is not needed for these: callers are CUDA-only paths).
 *
 * Precision (the training recipe of issue [cuda]): the residual stream and everything the optimizer
 * touches are f32; activations between ops are bf16 (kiln_bf16, raw 16-bit storage); every reduction
 * and every pointwise op computes in f32. Per-op tolerances against the CPU reference are stated in
 * tests/gpu/. Ops that sum over tokens (weight gradients) are deterministic: partial sums per block,
 * then a fixed-order reduction, never float atomics. */
#ifndef KILN_CUDA_OPS_H
#define KILN_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t kiln_bf16; /* bfloat16 bits in device memory */

/* Wait for all work on the device (tests, benchmarks). */
kiln_error *kiln_cuda_sync(void);
/* f32 <-> bf16 conversion on the device (round to nearest even), n elements. */
kiln_error *kiln_f32_to_bf16_cuda(kiln_bf16 *y, const float *x, int64_t n, void *stream);
kiln_error *kiln_bf16_to_f32_cuda(float *y, const kiln_bf16 *x, int64_t n, void *stream);

/* ---- the ops: each helper's section below (keep one section per source file) ---- */

/* ==== cudamoe: GEMMs (src/cuda/linear.cu), router dispatch (src/cuda/router.cu), experts
 * (src/cuda/experts.cu) ==== */

/* y[n,out] = x[n,in] wᵀ + b through cuBLASLt (bf16 in and out, f32 accumulation, the bias as the GEMM's
 * epilogue; b may be NULL). One plan (descriptors + the heuristic's algorithm) is cached per shape. */
kiln_error *kiln_linear_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w, const kiln_bf16 *b,
                                     int64_t n, int64_t in, int64_t out, void *stream);
/* As kiln_linear_backward, each output accumulated and nullable: dx[n,in] += dy w (bf16, f32 math);
 * dw[out,in] += dyᵀ x written straight into the f32 master gradient (cuBLASLt, bf16 inputs, f32 C with
 * beta = 1); db[out] += column sums of dy, deterministic (per-chunk partials, then a fixed-order sum). */
kiln_error *kiln_linear_backward_cuda(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy, const kiln_bf16 *x,
                                      const kiln_bf16 *w, int64_t n, int64_t in, int64_t out, void *stream);
/* Row-major C[m,n] = op(A) op(B) (+ C when accumulate) with bf16 A and B, layout "NN", "NT" or "TN" as
 * kiln bench gemm; C is bf16 (c_f32 = 0) or f32 (c_f32 = 1). The building block of the two above, for
 * other ops' GEMMs. */
kiln_error *kiln_gemm_bf16_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, int64_t m, int64_t n,
                                int64_t k, const char *layout, int accumulate, void *stream);

/* The experts on the device: kiln_experts (include/kiln/nn.h) with device arrays. The caller fills N, H,
 * inter, E, top, choice [N*top] (E = the skip class) and gate [N*top] (f32, the unbiased probabilities),
 * and provides every array; dispatch/forward fill the rest.
 *   exp_off [E+2] (device): slot offsets per expert in expert order, exp_off[E] = routed slots;
 *                 exp_off[E+1] = choices outside [0, E] (forward fails naming the count if any)
 *   exp_off_host [E+2] (host): the same, copied back once per forward (the grouped GEMMs take per-expert
 *                 row counts on the host: one small device-to-host copy per layer, a stream sync)
 *   slot_tok, slot_k [N*top]: token and k of each slot in expert order, stable by token index (the CPU's order)
 *   tok_slot [N*top]: the slot of each (token, k), -1 for skip-routed ones (the deterministic scatter's map)
 *   xe [S,H], gu [S,2I], act [S,I], ye [S,H] bf16 saved activations (S = N*top at most) */
typedef struct {
    int64_t N, H, inter, E, top;
    const int32_t *choice;
    const float *gate;
    int32_t *exp_off, *exp_off_host, *slot_tok, *slot_k, *tok_slot;
    int64_t nslots;
    kiln_bf16 *xe, *gu, *act, *ye;
} kiln_experts_cuda;
typedef struct {
    kiln_bf16 *dye, *dact, *dgu, *dxe; /* [S,H], [S,I], [S,2I], [S,H] */
} kiln_experts_cuda_scratch;
/* Router dispatch: the permutation of slots grouped by expert (counting sort: per-block histograms, one
 * exclusive scan, a stable scatter), exp_off, slot_tok, slot_k, tok_slot. Skip-routed slots are left out.
 * Asynchronous; does not fill exp_off_host or nslots. */
kiln_error *kiln_experts_dispatch_cuda(kiln_experts_cuda *x, void *stream);
/* out [N,H] (f32, overwritten) = sum over each token's slots, in k order, of gate * SwiGLU expert(in):
 * dispatch, gather (bf16), one grouped GEMM for every expert's gate_up, SwiGLU, one grouped GEMM for down,
 * the gated sum per token (no atomics). in [N,H], wgu [E,2I,H], wdn [E,H,I] bf16. Synchronizes the stream
 * once (the counts). */
kiln_error *kiln_experts_forward_cuda(kiln_experts_cuda *x, float *out, const kiln_bf16 *in, const kiln_bf16 *wgu,
                                      const kiln_bf16 *wdn, void *stream);
/* As kiln_experts_backward after kiln_experts_forward_cuda on the same x: dx [N,H] += (f32); dgate [N*top]
 * = (f32, 0 for skipped slots); dwgu [E,2I,H], dwdn [E,H,I] += (f32 master gradients, grouped GEMMs with
 * f32 output). dout [N,H] f32. */
kiln_error *kiln_experts_backward_cuda(const kiln_experts_cuda *x, float *dx, float *dgate, float *dwgu, float *dwdn,
                                       const float *dout, const kiln_bf16 *wgu, const kiln_bf16 *wdn,
                                       kiln_experts_cuda_scratch *w, void *stream);
/* One grouped GEMM over experts, row-major, as the experts call it. offs (host, E+1 entries) are the
 * experts' row offsets in expert order; expert e owns rows offs[e] .. offs[e+1]-1 (m_e rows).
 *   "NT": C[rows of e, n] = A[rows of e, k] B_eᵀ, B_e = b + e*n*k stored [n,k]  (forward)
 *   "NN": C[rows of e, n] = A[rows of e, k] B_e,  B_e = b + e*k*n stored [k,n]  (input gradient)
 *   "TN": C_e[m,n] (+)= A[rows of e, m]ᵀ B[rows of e, n], C_e = c + e*m*n; k is unused (the weight
 *         gradients: the reduction runs over the expert's m_e rows)
 * C is bf16 or f32 (c_f32); accumulate adds to C. Experts without rows cost nothing (TN leaves C_e).
 * Through cublasGemmGroupedBatchedEx, one call for all experts; where cuBLAS refuses the type combination
 * it falls back to one cublasGemmEx per expert and *looped (nullable) says so. */
kiln_error *kiln_grouped_gemm_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs,
                                   int64_t E, int64_t m, int64_t n, int64_t k, const char *layout, int accumulate,
                                   int *looped, void *stream);
/* ==== end cudamoe ==== */

/* ==== cudaattn: attention (src/cuda/attention.cu, src/cuda/attention_mma.cu) ==== */
#include "kiln/nn.h" /* kiln_attn_shape */
/* Flash-style causal GQA attention with an optional sliding window, the twin of kiln_attention_forward/
 * backward: the same kiln_attn_shape, layouts and visibility rule (key j visible to the query at position
 * p iff j <= p and (window == 0 or j > p - window)); head dim D <= 128 (tensor cores for D = 64 and 128).
 *   q, out, dout, dq [B, Tq, NH, D] bf16; k, v, dk, dv [B, tk_cap, KV, D] bf16 (keys 0..tk-1 used);
 *   lse [B, NH, Tq] f32: per query row, the natural-log logsumexp of its scaled visible scores. It replaces
 *   the CPU's probabilities: the backward recomputes them from q, k and lse, so no T x T matrix exists.
 * forward: out and lse (lse nullable, as the CPU's probs). backward: WRITES dq, dk, dv (bf16; unlike the
 * CPU op it does not accumulate; each nullable; dk/dv rows tk..tk_cap-1 untouched); dK/dV of a KV head
 * sum its G query heads in a fixed order (deterministic, no atomics). work: device scratch of
 * kiln_attention_backward_cuda_work(s) bytes (per-row dout·out). */
kiln_error *kiln_attention_forward_cuda(kiln_bf16 *out, float *lse, const kiln_bf16 *q, const kiln_bf16 *k,
                                        const kiln_bf16 *v, const kiln_attn_shape *s, void *stream);
kiln_error *kiln_attention_backward_cuda(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv, const kiln_bf16 *dout,
                                         const kiln_bf16 *out, const float *lse, const kiln_bf16 *q,
                                         const kiln_bf16 *k, const kiln_bf16 *v, const kiln_attn_shape *s, void *work,
                                         void *stream);
size_t kiln_attention_backward_cuda_work(const kiln_attn_shape *s);
/* ==== end cudaattn ==== */

#ifdef __cplusplus
}
#endif
#endif
