/* CCA's grouped convolution forward on wgmma (src/cuda/cca_conv_wg.cu), internal to the CUDA side: the grouped
 * stage of kiln_cca_conv_couple_forward_cuda for heads of exactly 128 channels on sm_90:
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

#ifdef __cplusplus
}
#endif
#endif
