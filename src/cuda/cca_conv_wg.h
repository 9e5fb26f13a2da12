/* CCA's grouped convolution on wgmma (src/cuda/cca_conv_wg.cu), internal to the CUDA side: the grouped stage of
 * kiln_cca_conv_couple_forward_cuda (and its input gradient in the backward) for heads of exactly 128 channels on
 * sm_90. Forward:
 *   qpre[t, g*128 + n] (g < NH) or kpre[t, (g-NH)*128 + n] = b1 + sum_{j,i} mid[t+j, g*128 + i] w1[g*128 + n, i, j]
 *                                                          + the q/k coupling,
 * mid [B, T + k1 - 1, C] (the depthwise stage's output), q and k rows ldq / ldk elements apart, w1 [C, 128, k1]
 * f32 multiplied as hi + lo bf16 halves (lo != 0) or its bf16 rounding alone. Asynchronous on stream. */
#ifndef KILN_CUDA_CCA_CONV_WG_H
#define KILN_CUDA_CCA_CONV_WG_H

#include <stdint.h>

#include "kiln/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* whether kiln_cca_grp_fwd_wg takes this call: 128 channels a head, K blocks of 64, 16-byte aligned rows of mid, q
 * and k, 4-byte aligned outputs, an sm_90 device whose shared memory holds w1 and the ring */
int kiln_cca_grp_fwd_wg_ok(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *mid, const void *q, int64_t ldq,
                           const void *k, int64_t ldk, const void *qpre, const void *kpre, int lo);
kiln_error *kiln_cca_grp_fwd_wg(kiln_bf16 *qpre, kiln_bf16 *kpre, const kiln_bf16 *mid, const kiln_bf16 *q, int64_t ldq,
                                const kiln_bf16 *k, int64_t ldk, const float *w1, const float *b1,
                                const kiln_conv_shape *s, int64_t NH, int64_t KV, int lo, void *stream);

/* The backward's grouped stage, its input gradient, on the same kernel: dmid [B, T + k1 - 1, C] (written: f32, or
 * bf16 when dmid_bf16, one rounding of the f32 sum) with
 * dmid[u, g*128 + n] = sum_{j,co} dy[u - j, g*128 + co] w1[g*128 + co, n, j] over 0 <= u - j < T, dy of head g
 * read from dqpre [B*T, NH*128] (g < NH) or dkpre [B*T, KV*128] (dense bf16). The _ok test: the forward's shape and
 * device conditions, 16-byte aligned dqpre / dkpre, 8-byte aligned dmid. */
int kiln_cca_grp_bwd_wg_ok(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *dmid, const void *dqpre,
                           const void *dkpre, int lo);
kiln_error *kiln_cca_grp_bwd_wg(void *dmid, int dmid_bf16, const kiln_bf16 *dqpre, const kiln_bf16 *dkpre,
                                const float *w1, const kiln_conv_shape *s, int64_t NH, int64_t KV, int lo, void *stream);

/* The backward's grouped weights' gradient as partials, for heads of 128 and k1 = 2: part [parts][C][2*128] f32 with
 * part[p][g*128 + co][j*128 + i] = the sum over part p's steps of dy[b, u, g*128 + co] * mid[b, u + j, g*128 + i]
 * (the (j, i) column order of dw1_128_kernel, which dw1_sum_kernel reorders while summing the parts in order), and
 * partb [parts][C] (nullable) the sums of dy. _parts: 0 where the call is not taken, else how many parts (a CTA
 * each: one an SM over the groups). dqpre, dkpre as above; mid [B, T + 1, C] bf16, 16-byte aligned. */
int kiln_cca_dw1_wg_parts(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *dqpre, const void *dkpre,
                          const void *mid);
kiln_error *kiln_cca_dw1_wg(float *part, float *partb, int parts, const kiln_bf16 *dqpre, const kiln_bf16 *dkpre,
                            const kiln_bf16 *mid, const kiln_conv_shape *s, int64_t NH, int64_t KV, void *stream);

#ifdef __cplusplus
}
#endif
#endif
