// The tensor-core attention of CLIP's vision tower (clip_attention.cu), behind kiln_mha_forward_cuda
// (clip_ops.cu) for non-causal calls it supports.
#ifndef KILN_CLIP_ATTENTION_CUH
#define KILN_CLIP_ATTENTION_CUH

#include <stdint.h>

#include "kiln/cuda_ops.h"

// head dims 32, 64, 128; q/k/v 16-byte aligned with row strides a multiple of 8 elements; out 4-byte aligned
// with an even row stride
int clip_attention_supported(const void *q, const void *k, const void *v, const void *out, int64_t T, int64_t hd,
                             int64_t stride, int64_t out_stride);
// 1 when clip_attention_forward runs the short-sequence kernel (one block per sequence and head) for calls
// with q0 == 0: the shape is supported as above, a head's K and V (T keys padded to 16) fit in shared memory
// and KILN_CLIP_ATTN_SHORT is not 0
int clip_attention_short_takes(const void *q, const void *k, const void *v, const void *out, int64_t T,
                               int64_t hd, int64_t stride, int64_t out_stride);
// queries q0..T-1 of each sequence (0: all of them) over all T keys
kiln_error *clip_attention_forward(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                   int64_t B, int64_t T, int64_t q0, int64_t heads, int64_t hd, int64_t stride,
                                   int64_t out_stride, float scale, void *stream);

#endif
