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
