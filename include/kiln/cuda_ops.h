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
/* The same with flags: KILN_LINEAR_DX_WRITE writes dx (=, no zeroing pass needed and no read-back) instead of
 * adding to it, KILN_LINEAR_DW_WRITE likewise dw (the first writer of a gradient: the LM head's weight, whose
 * backward comes first). KILN_LINEAR_BWD=old runs the previous path (src/cuda/linear.cu). */
enum { KILN_LINEAR_DX_WRITE = 1, KILN_LINEAR_DW_WRITE = 2 };
kiln_error *kiln_linear_backward_ex_cuda(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy, const kiln_bf16 *x,
                                         const kiln_bf16 *w, int64_t n, int64_t in, int64_t out, unsigned flags,
                                         void *stream);
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
    int dw_write; /* 1: the backward WRITES dwgu/dwdn (=) instead of adding to them: the first backward after the
                   * gradients were zeroed skips reading them back (experts without rows get zeros) */
    int dw_defer; /* 1: the weight gradients are left running on side streams when the backward returns; the caller
                   * must call kiln_experts_backward_join_cuda(stream) before reading dwgu/dwdn or reusing this
                   * scratch, xe or act (KILN_EXPERTS_DW_DEFER=0 overrides: joined as before) */
    int dx_write; /* 1: the backward WRITES dx (=) instead of adding to it, so the caller need not zero it first
                   * (the trainer: the experts are the first writer of their input's gradient) */
    int dw_bf16;  /* 1 (needs dw_write): dwgu/dwdn are bf16 arrays, each weight gradient rounded to bf16 once as
                   * the GEMM writes it, as the reference's autocast rounds the gradient of its bf16 weight copy
                   * (half the bytes for the GEMM's write and for every later read: norm, optimizer) */
    int dw_keep_empty; /* 1 (with dw_write): an expert without rows keeps whatever its dwgu/dwdn held (not zeroed);
                        * the caller treats them as zero from exp_off_host (the trainer's zero mask) */
    double *dw_sq;   /* nullable (device, 2E doubles; with dw_bf16 and dw_defer): where both weight gradients run on
                      * the wgmma kernel (kiln_grouped_gemm_dw_sq_cuda_async), [0, E) gets each expert's gate_up
                      * gradient's sum of squares and [E, 2E) its down's, ready once joined (KILN_GROUPED_DW_SQ=0: not
                      * asked for) */
    int dw_sq_done;  /* set by the backward: 1 when it wrote dw_sq */
} kiln_experts_cuda_scratch;
/* The routing decision as kiln_route_topk (include/kiln/nn.h): probs [n,e1] and bias [e1] f32 (the last
 * class is the skip class) -> choice, gate [n*top] (f32, unbiased, 0 for the skip class); one warp per
 * token, e1 <= 1024. And its backward: dprobs [n,e1] += dgate at the chosen non-skip classes. */
kiln_error *kiln_route_topk_cuda(int32_t *choice, float *gate, const float *probs, const float *bias, int64_t n,
                                 int64_t e1, int64_t top, void *stream);
kiln_error *kiln_route_gate_backward_cuda(float *dprobs, const float *dgate, const int32_t *choice, int64_t n,
                                          int64_t e1, int64_t top, void *stream);
/* Router dispatch: the permutation of slots grouped by expert (counting sort: per-block histograms, one
 * exclusive scan, a stable scatter), exp_off, slot_tok, slot_k, tok_slot. Skip-routed slots are left out.
 * Asynchronous; does not fill exp_off_host or nslots. */
kiln_error *kiln_experts_dispatch_cuda(kiln_experts_cuda *x, void *stream);
/* out [N,H] (f32, overwritten) = sum over each token's slots, in k order, of gate * SwiGLU expert(in):
 * dispatch, gather (bf16), one grouped GEMM for every expert's gate_up, SwiGLU, one grouped GEMM for down,
 * the gated sum per token (no atomics). in [N,H], wgu [E,2I,H], wdn [E,H,I] bf16. Synchronizes the stream
 * once (the counts). out NULL: no gated sum (x->ye, gate and tok_slot hold it; for top-1 routing
 * kiln_residual_norm_forward_gather_cuda forms it as it reads it). */
kiln_error *kiln_experts_forward_cuda(kiln_experts_cuda *x, float *out, const kiln_bf16 *in, const kiln_bf16 *wgu,
                                      const kiln_bf16 *wdn, void *stream);
/* As kiln_experts_backward after kiln_experts_forward_cuda on the same x: dx [N,H] += (f32; = when w->dx_write); dgate [N*top]
 * = (f32, 0 for skipped slots); dwgu [E,2I,H], dwdn [E,H,I] += (f32 master gradients, grouped GEMMs with
 * f32 output; = when w->dw_write; bf16 and = when w->dw_bf16). dout [N,H] f32. */
kiln_error *kiln_experts_backward_cuda(const kiln_experts_cuda *x, float *dx, float *dgate, void *dwgu, void *dwdn,
                                       const float *dout, const kiln_bf16 *wgu, const kiln_bf16 *wdn,
                                       kiln_experts_cuda_scratch *w, void *stream);
/* the stream waits for the weight gradients a dw_defer backward left running (a no-op when none are) */
kiln_error *kiln_experts_backward_join_cuda(void *stream);
/* The experts' passes that are not GEMMs, timed by CUDA events for `kiln bench moe` (off by default: no events).
 * kiln_experts_profile_cuda(1) starts recording around each pass of every later call, (0) stops; _read waits for
 * the last recorded call of each pass and gives its microseconds (-1: not run since profiling started). */
enum {
    KILN_EXPERTS_PASS_DISPATCH,   /* router dispatch: histogram, scan, scatter (+ the pool's allocation) */
    KILN_EXPERTS_PASS_GATHER,     /* xe = rows of in in expert order */
    KILN_EXPERTS_PASS_SWIGLU_FWD, /* act = SwiGLU(gu) */
    KILN_EXPERTS_PASS_COMBINE,    /* out = gated sum of ye per token */
    KILN_EXPERTS_PASS_DYE_DGATE,  /* dye = gate * dout[token], dgate = dout . ye */
    KILN_EXPERTS_PASS_SWIGLU_BWD, /* dgu from dact and gu */
    KILN_EXPERTS_PASS_COMBINE_DX, /* dx (+)= sum of dxe per token */
    KILN_EXPERTS_NPASS
};
kiln_error *kiln_experts_profile_cuda(int on);
kiln_error *kiln_experts_profile_read_cuda(double us[KILN_EXPERTS_NPASS]);
/* One grouped GEMM over experts, row-major, as the experts call it. offs (host, E+1 entries) are the
 * experts' row offsets in expert order; expert e owns rows offs[e] .. offs[e+1]-1 (m_e rows).
 *   "NT": C[rows of e, n] = A[rows of e, k] B_eᵀ, B_e = b + e*n*k stored [n,k]  (forward)
 *   "NN": C[rows of e, n] = A[rows of e, k] B_e,  B_e = b + e*k*n stored [k,n]  (input gradient)
 *   "TN": C_e[m,n] (+)= A[rows of e, m]ᵀ B[rows of e, n], C_e = c + e*m*n; k is unused (the weight
 *         gradients: the reduction runs over the expert's m_e rows)
 * C is bf16 or f32 (c_f32); accumulate (KILN_GG_*): 0 writes C, 1 adds to it, 2 writes it but for the experts
 * without rows. Experts without rows cost nothing (TN: C_e is zeroed, or left as it is with 1 or 2). *looped (nullable) is set when the experts ran as one GEMM each.
 * How it runs is the process's "path" (src/cuda/experts_gemm.cu; bench/moe_gpu.sh measures each against
 * one dense GEMM): "grouped" (cublasGemmGroupedBatchedEx; one cublasGemmEx per expert where cuBLAS refuses
 * the types or the pointers are not 16-byte aligned), "lt_loop" (a cuBLASLt GEMM per expert), "lt_streams"
 * (the same spread over KILN_GROUPED_STREAMS side streams, default 8, joined back to `stream` by events),
 * "lt_chunks" (NT/NN as one pointer-array batched cuBLASLt GEMM over KILN_GROUPED_CHUNK-row chunks, default
 * 256; TN as lt_loop), "lt_mixed" (NT/NN: the full chunks batched, each expert's remaining rows a GEMM on a
 * side stream; TN as lt_streams, or with a bf16 C and KILN_GROUPED_DW=wg one wgmma kernel of kiln's own where the shape
 * allows, src/cuda/experts_dw_wg.h). Chosen by kiln_grouped_gemm_set_path, else the environment variable
 * KILN_GROUPED_GEMM, else the default, lt_mixed (should it fail on a call that overwrites its output, the
 * process warns and uses "grouped" from then on). Every path is deterministic
 * (KILN_GROUPED_TUNE=1, which picks each large cuBLASLt plan's algorithm by timing its candidates once, keeps
 * the bits within a process, not across processes; off by default). The
 * cuBLASLt paths keep their own workspaces: calls from different caller streams must not overlap (the
 * trainer has one compute stream). */
enum { KILN_GG_WRITE = 0, KILN_GG_ADD = 1, KILN_GG_WRITE_KEEP_EMPTY = 2 }; /* `accumulate`: = (TN: empty experts
    * zeroed), +=, or = with an empty expert's C_e (TN) left as it is */
kiln_error *kiln_grouped_gemm_cuda(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs,
                                   int64_t E, int64_t m, int64_t n, int64_t k, const char *layout, int accumulate,
                                   int *looped, void *stream);
/* The same GEMM (no `looped`), its side streams' GEMMs left running: the stream does not wait for them until
 * kiln_grouped_gemm_join(stream) (or the next grouped GEMM that joins its side streams). */
kiln_error *kiln_grouped_gemm_cuda_async(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs,
                                         int64_t E, int64_t m, int64_t n, int64_t k, const char *layout, int accumulate,
                                         void *stream);
kiln_error *kiln_grouped_gemm_join(void *stream);
/* _async's TN (the experts' weight gradients), and with sq (nullable) where the wgmma kernel runs it (a bf16 C written,
 * KILN_GROUPED_DW=wg) also sq[e] (device, E doubles) = the sum of squares of C_e as stored, 0 for an expert without
 * rows (from the tiles' registers in a fixed order: no read-back), ready in the stream's order once joined;
 * *sq_done = 1 then, else 0 and sq is not touched */
kiln_error *kiln_grouped_gemm_dw_sq_cuda_async(void *c, int c_f32, const kiln_bf16 *a, const kiln_bf16 *b,
                                               const int32_t *offs, int64_t E, int64_t m, int64_t n, int accumulate,
                                               double *sq, int *sq_done, void *stream);
/* Select the grouped GEMM's path by name for the process (NULL: back to KILN_GROUPED_GEMM or the default);
 * an unknown name is an error listing the known ones. */
kiln_error *kiln_grouped_gemm_set_path(const char *name);
/* *name = the path in effect; an error when KILN_GROUPED_GEMM names no path. */
kiln_error *kiln_grouped_gemm_path(const char **name);
/* Every path's name, NULL-terminated. */
const char *const *kiln_grouped_gemm_paths(void);
/* ==== end cudamoe ==== */

/* ==== cudaattn: attention (src/cuda/attention.cu, src/cuda/attention_mma.cu) ==== */
#include "kiln/nn.h" /* kiln_attn_shape */
/* Flash-style causal GQA attention with an optional sliding window, the twin of kiln_attention_forward/
 * backward: the same kiln_attn_shape, layouts and visibility rule (key j visible to the query at position
 * p iff j <= p and (window == 0 or j > p - window)); head dim D <= 128 (tensor cores for D = 32, 64, 128).
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
/* The same with atomic_dq = 1: where no implementation was chosen (KILN_ATTENTION unset, no
 * kiln_attention_cuda_set_impl), cuDNN runs its faster backward whose dQ accumulates with float atomics (as
 * PyTorch's), so two runs differ in the last bits; 0 is kiln_attention_backward_cuda. */
kiln_error *kiln_attention_backward_ex_cuda(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv, const kiln_bf16 *dout,
                                            const kiln_bf16 *out, const float *lse, const kiln_bf16 *q,
                                            const kiln_bf16 *k, const kiln_bf16 *v, const kiln_attn_shape *s,
                                            void *work, int atomic_dq, void *stream);
size_t kiln_attention_backward_cuda_work(const kiln_attn_shape *s);
/* ==== end cudaattn ==== */

/* ==== row-wise and pointwise ops, the loss and the optimizers (src/cuda/{embedding,rmsnorm,scale_shift,
 * activations,softmax,router_head,qk_norm_rope,cross_entropy,optim,cca_conv,cca_couple,value_shift}.cu; tests in
 * tests/gpu/test_gpu_ops*.c) ====
 * Dtypes follow the training recipe: the residual stream, saved statistics, norms' and convolutions'
 * weights, biases, scales and every weight gradient are f32; activations are bf16. Gradient outputs in
 * f32 ACCUMULATE (+=) as on the CPU; gradient outputs in bf16 are WRITTEN (an activation gradient in
 * bf16 has one consumer, and a read-add-round would add a second rounding). Weight gradients are summed
 * deterministically (per-chunk partials, then a fixed-order sum; no float atomics); scratch for the
 * partials comes from the stream-ordered allocator (cudaMallocAsync on `stream`). */
#include "kiln/nn.h"
#include "kiln/optim.h"

/* embedding: y f32 [n,d] = table f32 [V,d] rows ids [n] (int64, device). Backward: dtable[id] += dy rows,
 * the positions of each id summed in position order (a stable device radix sort by id, then the distinct ids'
 * segments cut into column slices, one thread per column), so the result equals the CPU's bit for bit; rows
 * equal to pad (pad < 0: none) are skipped. */
kiln_error *kiln_embedding_forward_cuda(float *y, const float *table, const int64_t *ids, int64_t n, int64_t d,
                                        void *stream);
kiln_error *kiln_embedding_backward_cuda(float *dtable, const float *dy, const int64_t *ids, int64_t n, int64_t d,
                                         int64_t pad, void *stream);

/* rmsnorm: x f32 (the residual stream) -> y bf16, rstd f32 [n]. Backward: dy bf16; dx f32 += (the
 * residual gradient), dw f32 +=; either may be NULL. The _bf16 forms read x bf16 (the router's norm
 * of a projection's output) and write dx bf16. */
kiln_error *kiln_rmsnorm_forward_cuda(kiln_bf16 *y, float *rstd, const float *x, const float *w, int64_t n,
                                      int64_t d, float eps, void *stream);
kiln_error *kiln_rmsnorm_backward_cuda(float *dx, float *dw, const kiln_bf16 *dy, const float *x, const float *w,
                                       const float *rstd, int64_t n, int64_t d, void *stream);
kiln_error *kiln_rmsnorm_forward_bf16_cuda(kiln_bf16 *y, float *rstd, const kiln_bf16 *x, const float *w,
                                           int64_t n, int64_t d, float eps, void *stream);
kiln_error *kiln_rmsnorm_backward_bf16_cuda(kiln_bf16 *dx, float *dw, const kiln_bf16 *dy, const kiln_bf16 *x,
                                            const float *w, const float *rstd, int64_t n, int64_t d, void *stream);

/* scale_shift: y = (x + b) * s per channel, all f32 (the residual scaling); accumulate: y +=.
 * Backward: dx += dy*s, db += sum dy*s, ds += sum dy*(x+b); any may be NULL. */
kiln_error *kiln_scale_shift_forward_cuda(float *y, const float *x, const float *b, const float *s, int64_t n,
                                          int64_t d, int accumulate, void *stream);
kiln_error *kiln_scale_shift_backward_cuda(float *dx, float *db, float *ds, const float *dy, const float *x,
                                           const float *b, const float *s, int64_t n, int64_t d, void *stream);
/* the same with dx WRITTEN (= dy*s), so that a fresh gradient needs no zeroing pass */
kiln_error *kiln_scale_shift_backward_write_cuda(float *dx, float *db, float *ds, const float *dy, const float *x,
                                                 const float *b, const float *s, int64_t n, int64_t d, void *stream);

/* A residual join and the RMSNorm that reads it, one pass (src/cuda/residual_norm.cu): y f32 [n,d] =
 * (a + ab)*as + (x + xb)*xs, a f32 or bf16 (exactly one of a / a_bf16), x nullable (no second term), shifts
 * nullable, as nullable without ab and x (then y = a); y nullable (not stored); then, when ln is given, ln
 * bf16 = rmsnorm(y) with weight w and rstd f32 [n] (nullable) saved.
 * Rows up to 16384 columns (4096 when d % 4 or an alignment rules out 16-byte accesses). */
kiln_error *kiln_residual_norm_forward_cuda(float *y, kiln_bf16 *ln, float *rstd, const float *a,
                                            const kiln_bf16 *a_bf16, const float *ab, const float *as, const float *x,
                                            const float *xb, const float *xs, const float *w, int64_t n, int64_t d,
                                            float eps, void *stream);
/* The same join with a gathered: row r of a is gate[r] * rows[slot[r]] (bf16 rows of d; slot -1: zeros), the
 * experts' gated combine for top-1 routing formed as the row is read, bit for bit kiln_experts_forward_cuda's
 * combine followed by the call above (no [n,d] f32 MoE output written and read back). Rows of the 16-byte ring
 * kernel only: kiln_residual_norm_gather_ok(d) (d % 8 == 0, at most 4096) and 16-byte aligned arrays, else
 * KILN_EUNSUPPORTED. */
int kiln_residual_norm_gather_ok(int64_t d);
kiln_error *kiln_residual_norm_forward_gather_cuda(float *y, kiln_bf16 *ln, float *rstd, const kiln_bf16 *rows,
                                                   const int32_t *slot, const float *gate, const float *ab,
                                                   const float *as, const float *x, const float *xb, const float *xs,
                                                   const float *w, int64_t n, int64_t d, float eps, void *stream);
/* Its backward, given y's other consumer z = ... + (y + upb)*ups (the next join) and z's gradient dup:
 *   g = dup*ups + rmsnorm_bwd(dln); da = bf16(g*as), dx = g*xs WRITTEN;
 *   += (each nullable): dupb = sum dup*ups, dups = sum dup*(y + upb), dw = sum dln*y*rstd, dab = sum g*as,
 *   das = sum g*(a + ab), dxb = sum g*xs, dxs = sum g*(x + xb) (per-chunk partials, fixed-order sums). */
typedef struct {
    const float *y;                /* [n,d] the join's output (read only by the element kernels: the 16-byte path
                                    * recomputes it from a and x with the forward's roundings) */
    const kiln_bf16 *dln;          /* [n,d] gradient of ln = rmsnorm(y) ... */
    const float *dln_f32;          /* ... or the same in f32 ... */
    const kiln_bf16 *dln_rows;     /* ... or the sum of two bf16 gradients in f32 (exactly one of the three): row */
    const int32_t *dln_slot;       /* r is dln_rows[dln_slot[r]] (slot -1: zeros; the experts' input gradient in */
    const kiln_bf16 *dln_add;      /* slot order, top-1) + dln_add[r] ([n,d], nullable); ring kernels only
                                    * (kiln_residual_norm_gather_ok(d), 16-byte aligned), else KILN_EUNSUPPORTED */
    const float *w, *rstd;         /* the norm's weight [d], saved 1/rms [n] */
    float *dw;
    const float *dup, *upb, *ups;  /* gradient of z [n,d]; the next join's shift (nullable) and scale for y */
    float *dupb, *dups;
    const kiln_bf16 *a;            /* [n,d] the join's first input (bf16) */
    const float *ab, *as;
    float *dab, *das;
    kiln_bf16 *da;                 /* [n,d] */
    const float *x, *xb, *xs;      /* [n,d] the second input (f32) */
    float *dxb, *dxs;
    float *dx;                     /* [n,d] */
} kiln_residual_norm_bwd;
kiln_error *kiln_residual_norm_backward_cuda(const kiln_residual_norm_bwd *p, int64_t n, int64_t d, void *stream);
/* The backward of ln = rmsnorm(y) where y = (a + ab)*as + ... came from a join, for the join's first input (f32):
 * g = gin + rmsnorm_bwd(dln) written to gout (gin nullable: 0; may equal gout); da = g*as written; += (nullable)
 * dw = sum dln*y*rstd, dab = sum g*as, das = sum g*(a + ab). Same row limits as the forward. */
typedef struct {
    const float *gin;              /* [n,d] the gradient of y from its other consumers (nullable) */
    float *gout;                   /* [n,d] the total gradient of y */
    const kiln_bf16 *dln;          /* [n,d] */
    const float *y, *w, *rstd;
    float *dw;
    const float *a, *ab, *as;      /* the join's first input [n,d], its shift (nullable) and scale [d] */
    float *dab, *das;
    float *da;                     /* [n,d] */
    const kiln_bf16 *a_rows;       /* or (a NULL) a gathered as kiln_residual_norm_forward_gather_cuda's: row r is */
    const int32_t *a_slot;         /* a_gate[r] * a_rows[a_slot[r]] (-1: zeros); the same row limits */
    const float *a_gate;
} kiln_norm_join_bwd;
kiln_error *kiln_norm_join_backward_cuda(const kiln_norm_join_bwd *p, int64_t n, int64_t d, void *stream);

/* exact (erf) GELU and SwiGLU over bf16 (y may alias x in forward; dx/dgu are written). */
kiln_error *kiln_gelu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, int64_t n, void *stream);
kiln_error *kiln_gelu_backward_cuda(kiln_bf16 *dx, const kiln_bf16 *dy, const kiln_bf16 *x, int64_t n, void *stream);
kiln_error *kiln_swiglu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *gu, int64_t n, int64_t inter, void *stream);
kiln_error *kiln_swiglu_backward_cuda(kiln_bf16 *dgu, const kiln_bf16 *dy, const kiln_bf16 *gu, int64_t n,
                                      int64_t inter, void *stream);

/* The router's head (src/cuda/router_head.cu): probs [n,e] = softmax(a wᵀ) with a bf16 [n,r], w bf16 [e,r], f32
 * sums, and logits [n,e] f32 too unless NULL: one pass for up to 32 classes (softmax.cu's arithmetic on the
 * logits), the GEMM and the softmax below otherwise. Its backward: kiln_router_head_dlogits_cuda, then
 * kiln_linear_backward_ex_cuda with them. */
kiln_error *kiln_router_head_forward_cuda(float *logits, float *probs, const kiln_bf16 *a, const kiln_bf16 *w,
                                          int64_t n, int64_t r, int64_t e, void *stream);
/* The logits' gradient, bf16 [n,e] written: the softmax backward (probs [n,e]) of the gate's gradient dgate
 * [n*top] placed at the token's chosen classes choice [n*top] (the skip class e-1 and choices out of range get
 * none); one pass for up to 32 classes, the same bits as kiln_route_gate_backward_cuda and kiln_softmax_backward_cuda
 * onto zeros and kiln_f32_to_bf16_cuda, which run otherwise. */
kiln_error *kiln_router_head_dlogits_cuda(kiln_bf16 *dlogits, const float *dgate, const int32_t *choice,
                                          const float *probs, int64_t n, int64_t e, int64_t top, void *stream);
/* softmax over rows of d, f32 (router probabilities: routing decisions are taken on them, and the
 * tensors are small), one warp per row. Backward: dx +=. */
kiln_error *kiln_softmax_forward_cuda(float *y, const float *x, int64_t n, int64_t d, void *stream);
kiln_error *kiln_softmax_backward_cuda(float *dx, const float *dy, const float *y, int64_t n, int64_t d,
                                       void *stream);

/* QK norm and partial RoPE over bf16 head vectors [rows, heads, dim] (rows = b*t tokens), dim <= 2048.
 * l2norm_scale: y = x * scale / max(|x|, eps) * t[h] (t NULL: 1), inv f32 [rows*heads] saved; backward:
 * dx written, dt f32 += (NULL: not wanted). rope: in place, positions pos0 + token index within its
 * sequence, inv_freq f32 on the device [rot_dim/2]; backward rotates back. qk_norm_rope: both in one
 * pass (y = rope(l2norm_scale(x)), one bf16 rounding), backward likewise. */
kiln_error *kiln_l2norm_scale_forward_cuda(kiln_bf16 *y, float *inv, const kiln_bf16 *x, const float *t, int64_t rows,
                                           int64_t heads, int64_t dim, float scale, float eps, void *stream);
kiln_error *kiln_l2norm_scale_backward_cuda(kiln_bf16 *dx, float *dt, const kiln_bf16 *dy, const kiln_bf16 *x,
                                            const float *t, const float *inv, int64_t rows, int64_t heads,
                                            int64_t dim, float scale, float eps, void *stream);
kiln_error *kiln_rope_forward_cuda(kiln_bf16 *x, const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                                   int64_t dim, int64_t rot_dim, int64_t pos0, void *stream);
kiln_error *kiln_rope_backward_cuda(kiln_bf16 *dx, const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                                    int64_t dim, int64_t rot_dim, int64_t pos0, void *stream);
kiln_error *kiln_qk_norm_rope_forward_cuda(kiln_bf16 *y, float *inv, const kiln_bf16 *x, const float *temp,
                                           const float *inv_freq, int64_t b, int64_t t, int64_t heads, int64_t dim,
                                           int64_t rot_dim, int64_t pos0, float scale, float eps, void *stream);
kiln_error *kiln_qk_norm_rope_backward_cuda(kiln_bf16 *dx, float *dtemp, const kiln_bf16 *dy, const kiln_bf16 *x,
                                            const float *temp, const float *inv, const float *inv_freq, int64_t b,
                                            int64_t t, int64_t heads, int64_t dim, int64_t rot_dim, int64_t pos0,
                                            float scale, float eps, void *stream);

/* Cross-entropy fused with the LM head's softmax: logits bf16 [B*T, V], ids int64 [B*T] (device).
 * Predicts ids[b, t+1] from row (b, t), t < T-1 (HF's shift with labels = input_ids); row T-1 of each
 * sequence is ignored (loss 0, gradient 0). loss_tok f32 [B*T] (nullable) the per-row loss; loss f32 [1]
 * (nullable) the mean over B*(T-1) rows, summed in a fixed order. dlogits (nullable; may equal logits:
 * written in place) gets the gradient of the mean loss in bf16. Each row read once where it fits in shared
 * memory with 16-byte alignment (V % 8 == 0, V up to ~100k), else two passes: an online max/sum, then the
 * gradient. */
kiln_error *kiln_cross_entropy_cuda(kiln_bf16 *dlogits, float *loss_tok, float *loss, const kiln_bf16 *logits,
                                    const int64_t *ids, int64_t B, int64_t T, int64_t V, void *stream);

/* AdamW, as kiln_adamw_step (same f64 arithmetic per element): w, g, state (m then v, 2n) f32 on the
 * device; hp on the host; w_bf16 (nullable) receives the updated weights rounded to bf16 in the same pass. */
kiln_error *kiln_adamw_step_cuda(float *w, const float *g, float *state, int64_t n, const kiln_optim_hparams *hp,
                                 double lr, int64_t t, int decay, kiln_bf16 *w_bf16, void *stream);
/* AdamW on many tensors in one launch (the trainer's step): tensor i has n elements at element offset off of
 * w, g and w_bf16, and its state (m then v) at element offset soff of state. create uploads the table once
 * (and a work list of fixed chunks); step runs kiln_adamw_step_cuda's arithmetic on every tensor with the
 * gradient multiplied by gscale in f32 first (g itself is only read). keep_g: a zeroing step (zero_g below)
 * leaves this tensor's gradient as it is (its next writer overwrites it: the experts' weights). g_bf16 (needs
 * keep_g and off a multiple of 4): the tensor's gradient is n bf16 values from bf16 element 2 off of g, the first
 * half of its f32 slot (the experts' bf16 weight gradients, kiln_experts_cuda_scratch.dw_bf16): the same update as
 * an f32 gradient holding those values, to the bit. */
typedef struct {
    int64_t off, soff, n;
    int decay, keep_g, g_bf16;
    /* zbit1 > 0 (with g_bf16): the tensor is groups of zn elements (zn a multiple of KILN_ADAMW_CHUNK, n a multiple
     * of zn), and group j's gradient is zero, unread and unwritten, wherever bit zbit1 - 1 + j of the step's zero
     * mask (kiln_adamw_multi_set_zero_mask) is set: the experts without rows, whose weight gradients nothing wrote */
    int zbit1;
    int64_t zn;
} kiln_adamw_tensor;
enum { KILN_ADAMW_CHUNK = 4096 }; /* AdamW's chunk of elements (its work item) */
typedef struct kiln_adamw_multi kiln_adamw_multi;
kiln_error *kiln_adamw_multi_create(const kiln_adamw_tensor *t, int count, kiln_adamw_multi **out);
void kiln_adamw_multi_free(kiln_adamw_multi *p);
kiln_error *kiln_adamw_multi_step_cuda(const kiln_adamw_multi *p, float *w, const float *g, float *state,
                                       float gscale, const kiln_optim_hparams *hp, double lr, int64_t t,
                                       kiln_bf16 *w_bf16, void *stream);
/* The same step on the table's tensors [t0, t1) only (their chunks: the same as the whole launch's). zero_g:
 * each gradient element is overwritten with 0 once read (the next step accumulates from zero without a separate
 * pass), except in the tensors marked keep_g. max_blocks > 0: launches of at most that many chunks of 4096
 * elements (and at most the blocks that fit on the GPU at once), one after the other; 0: one launch. The trainer's overlapped optimizer runs a step as one
 * such call per slice of tensors, its serial one-rank step as one over every tensor. KILN_ADAMW_GRID and
 * KILN_ADAMW_HINTS (src/cuda/optim.cu) pick the kernel and its launch for all three calls: the same bits. */
kiln_error *kiln_adamw_multi_step_range_cuda(const kiln_adamw_multi *p, int t0, int t1, float *w, float *g,
                                             float *state, float gscale, const kiln_optim_hparams *hp, double lr,
                                             int64_t t, kiln_bf16 *w_bf16, int zero_g, int64_t max_blocks,
                                             void *stream);
/* Split weights (the CUDA trainer's experts, KILN_SPLIT_MASTER): the f32 weights of a tensor held as their bf16 copy
 * hi (kiln_f32_split: to nearest, ties toward zero) and their low 16 bits lo, which together are the f32 bit for bit;
 * AdamW then reads and writes 4 bytes of weight an element instead of reading 4 and writing 6. Layout: chunks of
 * 4096 elements, a chunk's lo in the first half of its own f32 slots (AdamW's chunks; no room outside w). split:
 * w f32 [n] -> hi into w_bf16, lo into w; join: the reverse, w f32 again (w_bf16 only read). w 16-byte aligned,
 * w_bf16 8-byte aligned. set_split: the table's bf16-gradient tensors are split (every step needs w_bf16); the
 * caller keeps them so between steps (split before, join before anything else reads w). */
kiln_error *kiln_f32_split_cuda(float *w, kiln_bf16 *w_bf16, int64_t n, void *stream);
kiln_error *kiln_f32_join_cuda(float *w, const kiln_bf16 *w_bf16, int64_t n, void *stream);
void kiln_adamw_multi_set_split(kiln_adamw_multi *p, int on);
/* The zero mask of the table's zbit1 tensors (device, one bit a group; NULL: every gradient is read), read by every
 * later step until set again. */
void kiln_adamw_multi_set_zero_mask(kiln_adamw_multi *p, const uint32_t *mask);
/* Muon's pieces around the Newton-Schulz GEMMs, as kiln_muon_step does them in f32 for p->mats matrices:
 * momentum (state = mu*state + g; u = g + mu*state, Nesterov), the normalisation u /= |u|_F + 1e-7 per
 * matrix (sum of squares in f64, fixed order), and the update w = w - wd*w - lr*0.2*sqrt(max(rows,cols))*u
 * (w_bf16 as for AdamW). */
kiln_error *kiln_muon_momentum_cuda(float *state, float *u, const float *g, int64_t n, const kiln_optim_hparams *hp,
                                    void *stream);
/* the same with the gradient multiplied by gscale in f32 first (g itself is only read) */
kiln_error *kiln_muon_momentum_scaled_cuda(float *state, float *u, const float *g, int64_t n,
                                           const kiln_optim_hparams *hp, float gscale, void *stream);
kiln_error *kiln_muon_normalize_cuda(float *u, const kiln_opt_param *p, void *stream);
kiln_error *kiln_muon_update_cuda(float *w, const float *u, const kiln_opt_param *p, const kiln_optim_hparams *hp,
                                  double lr, kiln_bf16 *w_bf16, void *stream);

/* CCA's causal convolutions (kiln_cca_conv_forward): x bf16 [B,T,C], hist bf16 [B,P,C] (NULL: zeros),
 * w0 [C,k0], b0 [C], w1 [C,C/groups,k1], b1 [C] f32; mid f32 [B,T+k1-1,C] saved; y bf16. Backward: dy
 * bf16; dx bf16 written; dw0, db0, dw1, db1 f32 += (nullable); dmid: f32 workspace of B*(T+k1-1)*C. */
kiln_error *kiln_cca_conv_forward_cuda(kiln_bf16 *y, float *mid, const kiln_bf16 *x, const kiln_bf16 *hist,
                                       const float *w0, const float *b0, const float *w1, const float *b1,
                                       const kiln_conv_shape *s, void *stream);
kiln_error *kiln_cca_conv_backward_cuda(kiln_bf16 *dx, float *dw0, float *db0, float *dw1, float *db1, float *dmid,
                                        const kiln_bf16 *dy, const kiln_bf16 *x, const kiln_bf16 *hist,
                                        const float *mid, const float *w0, const float *w1, const kiln_conv_shape *s,
                                        void *stream);
/* The training path's convolutions fused with the coupling below (src/cuda/cca_conv_fused.cu), for the
 * model's layout: groups = NH + KV heads of D = C/groups channels; the input x = [q | k] given as the
 * projections' outputs q bf16 [N,NH*D] and k bf16 [N,KV*D], their rows ldq and ldk elements apart (0: NH*D and
 * KV*D, each its own tensor; wider where q and k are columns of one packed projection output); no history.
 * Forward: mid bf16 [B,T+k1-1,C] saved; qpre [N,NH*D], kpre [N,KV*D] bf16 (dense) = the convolution output plus
 * the coupling (one rounding). Backward from dqpre / dkpre (dense): dq, dk bf16 written (required) in q's and k's
 * layout (rows ldq and ldk apart) = the coupling's adjoint plus the convolution's input gradient; dw0, db0, dw1,
 * db1 f32 += (nullable); dmid a workspace of [B,T+k1-1,C] f32 that holds the grouped stage's input gradient on
 * return: as bf16 (its first half; the reference's autocast keeps this gradient bf16) where the wgmma kernels
 * take the call, else f32; *dmid_bf16 (nullable) says which (KILN_CCA_DMID=f32: always f32). bf16 tensor cores
 * (w1 split hi + lo), deterministic weight gradients. */
kiln_error *kiln_cca_conv_couple_forward_cuda(kiln_bf16 *qpre, kiln_bf16 *kpre, kiln_bf16 *mid, const kiln_bf16 *q,
                                              const kiln_bf16 *k, const float *w0, const float *b0, const float *w1,
                                              const float *b1, const kiln_conv_shape *s, int64_t NH, int64_t KV,
                                              int64_t ldq, int64_t ldk, void *stream);
kiln_error *kiln_cca_conv_couple_backward_cuda(kiln_bf16 *dq, kiln_bf16 *dk, float *dw0, float *db0, float *dw1,
                                               float *db1, float *dmid, int *dmid_bf16, const kiln_bf16 *dqpre,
                                               const kiln_bf16 *dkpre,
                                               const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *mid,
                                               const float *w0, const float *w1, const kiln_conv_shape *s, int64_t NH,
                                               int64_t KV, int64_t ldq, int64_t ldk, void *stream);
/* The fused convolutions' passes timed by CUDA events (off by default: no events), as kiln_experts_profile_cuda:
 * (1) records around each pass of every later call, (0) stops; _read waits for the last recorded call of each pass
 * and gives its microseconds (-1: not run since profiling started). */
enum {
    KILN_CCA_PASS_DW_FWD,  /* forward: depthwise stage -> mid */
    KILN_CCA_PASS_GRP_FWD, /* forward: w1 split, grouped GEMM + bias + coupling -> qpre, kpre */
    KILN_CCA_PASS_DW1,     /* backward: dw1 / db1 partials and their sums */
    KILN_CCA_PASS_GRP_BWD, /* backward: w1 split, grouped GEMM -> dmid */
    KILN_CCA_PASS_DW0,     /* backward: dw0 / db0 partials (the element path: with dx, in KILN_CCA_PASS_DX) */
    KILN_CCA_PASS_DX,      /* backward: dx + the coupling's adjoint -> dq, dk */
    KILN_CCA_PASS_DW0_SUM, /* backward: dw0 / db0 partials summed */
    KILN_CCA_NPASS
};
kiln_error *kiln_cca_conv_profile_cuda(int on);
kiln_error *kiln_cca_conv_profile_read_cuda(double us[KILN_CCA_NPASS]);
/* CCA's q/k residual coupling (zaya_forward.c): qk bf16 [N,C] is the packed [q | k] the convolution reads
 * (C = NH*D + KV*D), conv bf16 [N,C] its output; qpre [N,NH*D] = conv_q + (q + k of the head's KV head)/2 and
 * kpre [N,KV*D] = conv_k + the mean over the group of those, bf16. Backward, bf16 and written: dconv (nullable)
 * = [dq | dk], the convolution's dy; dqp [N,NH*D] / dkp [N,KV*D] (nullable) = the coupling's adjoint of (dq, dk)
 * plus dqk (the convolution's dx, nullable: not added), the q/k projections' output gradients. */
kiln_error *kiln_cca_couple_forward_cuda(kiln_bf16 *qpre, kiln_bf16 *kpre, const kiln_bf16 *conv, const kiln_bf16 *qk,
                                         int64_t N, int64_t NH, int64_t KV, int64_t D, void *stream);
kiln_error *kiln_cca_couple_backward_cuda(kiln_bf16 *dqp, kiln_bf16 *dkp, kiln_bf16 *dconv, const kiln_bf16 *dq,
                                          const kiln_bf16 *dk, const kiln_bf16 *dqk, int64_t N, int64_t NH, int64_t KV,
                                          int64_t D, void *stream);
/* CCA's value shift (training, no decode cache): v bf16 [B*T, 2*Kh] = [vc[b,t] | vd[b,t-1]], vd at t = -1 being
 * bvd (f32 [Kh], NULL: zeros); vc's and vd's rows ld elements apart (0: Kh). Backward: dvc, dvd bf16 [B*T, Kh]
 * (rows ld apart) written (nullable), dbvd f32 += the first tokens' delayed halves (nullable). */
kiln_error *kiln_value_shift_forward_cuda(kiln_bf16 *v, const kiln_bf16 *vc, const kiln_bf16 *vd, const float *bvd,
                                          int64_t B, int64_t T, int64_t Kh, int64_t ld, void *stream);
kiln_error *kiln_value_shift_backward_cuda(kiln_bf16 *dvc, kiln_bf16 *dvd, float *dbvd, const kiln_bf16 *dv, int64_t B,
                                           int64_t T, int64_t Kh, int64_t ld, void *stream);
/* ==== end of the row-wise and pointwise ops ==== */

/* ==== cudamodel: the ZAYA model's own glue (src/cuda/zaya_glue.cu; used by src/models/zaya_cuda.c) ====
 * The loops of src/models/zaya_forward.c / zaya_backward.c between the library ops; bf16 activations,
 * f32 math, weight gradients in fixed order. N = B*T tokens. */
/* qk [N,Q+K] = q [N,Q] | k [N,K] */
kiln_error *kiln_zaya_pack_qk_cuda(kiln_bf16 *qk, const kiln_bf16 *q, const kiln_bf16 *k, int64_t N, int64_t Q,
                                   int64_t K, void *stream);
/* Router depth averaging rdown += prev * scale [R]. Backward: g = dxn + carry (carry f32 nullable);
 * drs = bf16(g); dprev = g * scale (f32, written); dscale += sum over tokens of g * prev; prod: f32
 * scratch [N,R]. Without prev/scale only drs is written. */
kiln_error *kiln_zaya_router_state_forward_cuda(kiln_bf16 *rdown, const kiln_bf16 *prev, const float *scale,
                                                int64_t N, int64_t R, void *stream);
kiln_error *kiln_zaya_router_state_backward_cuda(kiln_bf16 *drs, float *dprev, float *dscale, float *prod,
                                                 const kiln_bf16 *dxn, const float *carry, const kiln_bf16 *prev,
                                                 const float *scale, int64_t N, int64_t R, void *stream);
/* counts [E1] (int64, device) += occurrences of each class among choice [S] */
kiln_error *kiln_zaya_route_count_cuda(int64_t *counts, const int32_t *choice, int64_t S, int64_t E1, void *stream);
/* x *= s (n floats); out (device, one double) = sum of x^2 in f64, a fixed-order reduction */
kiln_error *kiln_zaya_scale_cuda(float *x, int64_t n, float s, void *stream);
kiln_error *kiln_zaya_sumsq_cuda(double *out, const float *x, int64_t n, void *stream);
/* The sum of squares (f64, a fixed-order reduction) of a buffer in segments, some f32, some bf16 (the trainer's
 * gradient with the experts' bf16 weight gradients): segment k is n elements from float offset off of x, read as
 * floats, or (bf16) as the bf16 array that starts there. create uploads a fixed work list (chunks of 2^18
 * elements); run writes the sum to out (device, one double): the same bits every run. One run at a time a plan
 * (its partials are its own). */
typedef struct {
    int64_t off, n;
    int bf16;
    int zbit1; /* > 0: the segment is zero, unread, wherever bit zbit1 - 1 of the plan's zero mask is set */
} kiln_sumsq_seg;
typedef struct kiln_sumsq_plan kiln_sumsq_plan;
kiln_error *kiln_sumsq_plan_create(const kiln_sumsq_seg *segs, int count, kiln_sumsq_plan **out);
void kiln_sumsq_plan_free(kiln_sumsq_plan *p);
kiln_error *kiln_sumsq_plan_run(const kiln_sumsq_plan *p, double *out, const float *x, void *stream);
/* run in pieces: the partial sums of segments [k0, k1) (on any stream: each chunk's has a slot of its own), then
 * total sums every chunk's partial in order, once all are done: the same bits as run */
kiln_error *kiln_sumsq_plan_partial(const kiln_sumsq_plan *p, int k0, int k1, const float *x, void *stream);
kiln_error *kiln_sumsq_plan_total(const kiln_sumsq_plan *p, double *out, void *stream);
/* segments [k0, k1)'s sums given instead of read: vals[k - k0] (device, doubles) stands in segment k's first chunk's
 * partial, zeros in its other chunks' (the experts' weight gradients' sums from their GEMM,
 * kiln_grouped_gemm_dw_sq_cuda_async); total then sums them in the same order */
kiln_error *kiln_sumsq_plan_give(const kiln_sumsq_plan *p, int k0, int k1, const double *vals, void *stream);
/* dst[0..n) (device) = src[0..n) (host), queued on stream: the values travel as kernel parameters, so src may
 * change as soon as the call returns (no staging buffer to keep alive) */
kiln_error *kiln_words_set_cuda(uint32_t *dst, const uint32_t *src, int64_t n, void *stream);
/* the zero mask the zbit1 segments are checked against (device; NULL: none), read by the later partial sums */
void kiln_sumsq_plan_set_zero_mask(kiln_sumsq_plan *p, const uint32_t *mask);
/* Muon's Newton-Schulz iteration on `mats` f32 matrices x [mats, rows, cols] in place, as
 * kiln_newton_schulz (normalisation included), through strided-batched GEMMs (the Gram matrix on the short
 * side, no transposes) in `prec`: KILN_NS_FP32 strict f32 cuBLAS (the CPU's arithmetic), KILN_NS_TF32 or
 * KILN_NS_BF16 (bf16 inputs, f32 accumulation, x kept in f32) through cuBLASLt. ws:
 * kiln_zaya_newton_schulz_cuda_ws floats of device scratch (enough for every precision). */
kiln_error *kiln_zaya_newton_schulz_cuda(float *x, int64_t mats, int64_t rows, int64_t cols, int steps,
                                         kiln_ns_precision prec, float *ws, void *stream);
size_t kiln_zaya_newton_schulz_cuda_ws(int64_t mats, int64_t rows, int64_t cols);
/* ==== end cudamodel ==== */

/* ==== cisclip: CLIP inference (src/cuda/clip_ops.cu; used by src/clip/clip_cuda.c) ==== */
/* layernorm forward: y bf16 [n,d] = (x - mean) / sqrt(var + eps) * w + b, x f32 (the residual stream);
 * w, b f32, nullable. The twin of kiln_layernorm_forward. */
kiln_error *kiln_layernorm_forward_cuda(kiln_bf16 *y, const float *x, const float *w, const float *b, int64_t n,
                                        int64_t d, float eps, void *stream);
/* the same with an f32 output (y may alias x), and with rows of x x_stride floats apart (y contiguous) */
kiln_error *kiln_layernorm_forward_f32_cuda(float *y, const float *x, const float *w, const float *b, int64_t n,
                                            int64_t d, float eps, void *stream);
kiln_error *kiln_layernorm_forward_strided_cuda(kiln_bf16 *y, const float *x, int64_t x_stride, const float *w,
                                                const float *b, int64_t n, int64_t d, float eps, void *stream);
/* multi-head attention forward, the twin of kiln_mha_forward (bf16 q/k/v/out with row strides, causal or
 * not): two batched tensor-core GEMMs around a row softmax, the T x T scores in f32 scratch from the
 * stream-ordered allocator; T <= 1024 tokens (CLIP's sequences), else an error. Asynchronous. */
kiln_error *kiln_mha_forward_cuda(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                  int64_t B, int64_t T, int64_t heads, int64_t hd, int64_t stride, int64_t out_stride,
                                  float scale, int causal, void *stream);
/* quick_gelu x * sigmoid(1.702 x) over bf16 (y may alias x) */
kiln_error *kiln_quick_gelu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, int64_t n, void *stream);
/* x f32 += y bf16 (a residual add) */
kiln_error *kiln_add_bf16_cuda(float *x, const kiln_bf16 *y, int64_t n, void *stream);
/* CLIP's patch embedding input: cols bf16 [B*G*G, 3*p*p] (rows ld >= 3*p*p apart, the columns past 3*p*p
 * zero) from pixels bf16 [B,3,S,S], G = S/p */
kiln_error *kiln_clip_patchify_cuda(kiln_bf16 *cols, int64_t ld, const kiln_bf16 *pixels, int64_t B, int64_t S,
                                    int64_t p, void *stream);
/* page-locked host memory (cudaMallocHost) for staging uploads; free with kiln_clip_pinned_free */
kiln_error *kiln_clip_pinned_alloc(void **p, size_t bytes);
void kiln_clip_pinned_free(void *p);
/* x f32 [B, 1+G2, H] = [cls; patches bf16 [B*G2, H]] + pos [1+G2, H] */
kiln_error *kiln_clip_assemble_cuda(float *x, const kiln_bf16 *patches, const float *cls, const float *pos,
                                    int64_t B, int64_t G2, int64_t H, void *stream);
/* y f32 [rows, d] = x / |x| per row (x bf16) */
kiln_error *kiln_l2_normalize_rows_cuda(float *y, const kiln_bf16 *x, int64_t rows, int64_t d, void *stream);
/* ==== end cisclip ==== */

#ifdef __cplusplus
}
#endif
#endif
