/* The CUDA ops of CLIP's vision tower added after include/kiln/cuda_ops.h's cisclip section (same
 * conventions: device pointers, asynchronous on `stream`, a kiln_error naming the op). Used by
 * src/clip/clip_cuda.c; defined in src/cuda/clip_gemm.cu, clip_ops.cu and clip_attention_cls.cu. */
#ifndef KILN_CUDA_CLIP_OPS_H
#define KILN_CUDA_CLIP_OPS_H

#include "kiln/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the element type of CLIP's residual stream on the GPU (KILN_CLIP_RESIDUAL: bf16 by default, or f32) */
typedef enum { KILN_CLIP_F32 = 0, KILN_CLIP_BF16 = 1 } kiln_clip_dtype;

/* y[n,out] = x[n,in] wᵀ + bias (+ y when accumulate) through cuBLASLt, x and w bf16, f32 accumulation.
 * y_f32 = 0: y bf16, bias bf16 [out] (nullable). y_f32 = 1: y f32, bias f32 [out] (nullable). accumulate
 * adds into y (C = D, beta = 1: the residual stream's add as the GEMM's epilogue, one rounding to y's type). */
kiln_error *kiln_clip_linear_cuda(void *y, int y_f32, const kiln_bf16 *x, const kiln_bf16 *w, const void *bias,
                                  int64_t n, int64_t in, int64_t out, int accumulate, void *stream);
/* 1 when CLIP's fc1 + quick_gelu run as one GEMM of kiln's own with quick_gelu in its epilogue
 * (src/cuda/gemm_tc.cu) instead of cuBLASLt + a quick_gelu pass: the default on a Hopper (sm_90) device;
 * KILN_CLIP_GEMM (read at every call) =own forces it, =cublaslt turns it off, =own-all: that, and
 * kiln_clip_linear_cuda runs every projection the own GEMM takes through it (bf16 out with or without the
 * bias; f32 out accumulated with an f32 bias; in % 64, out % 128). */
int kiln_clip_gemm_own(void);
/* y[n,out] = quick_gelu(x[n,in] wᵀ + bias) in that one GEMM: x, w, y and bias bf16 (in % 64 == 0,
 * out % 128 == 0, 16-byte aligned rows) */
kiln_error *kiln_clip_linear_quick_gelu_cuda(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w, const kiln_bf16 *bias,
                                             int64_t n, int64_t in, int64_t out, void *stream);
/* what kiln_mha_forward_cuda's last call ran (KILN_CLIP_ATTN): "cudnn", "short" (clip_attention.cu's
 * short-sequence kernel), "own" (its streaming kernel), "gemm", "cudnn+short" / "cudnn+own" / "cudnn+gemm"
 * (cuDNN took the first sequences only), "none" before any call */
const char *kiln_clip_attention_last_impl(void);
/* layernorm of rows x_stride elements apart of x (type xt) into contiguous y (type yt; may alias x when
 * x_stride == d), statistics in f32: the residual stream's layernorms in either stream type */
kiln_error *kiln_clip_layernorm_cuda(void *y, kiln_clip_dtype yt, const void *x, kiln_clip_dtype xt, int64_t x_stride,
                                     const float *w, const float *b, int64_t n, int64_t d, float eps, void *stream);
/* x [B, 1+G2, H] of type xt = [cls; patches bf16 [B*G2, H]] + pos [1+G2, H] (kiln_clip_assemble_cuda for xt) */
kiln_error *kiln_clip_assemble_x_cuda(void *x, kiln_clip_dtype xt, const kiln_bf16 *patches, const float *cls,
                                      const float *pos, int64_t B, int64_t G2, int64_t H, void *stream);
/* out [B, heads*hd] (rows out_stride apart) = the attention of each sequence's first query (the class token)
 * over its T keys, every head: softmax(q₀ kᵀ · scale) v, q/k/v bf16 read in place ([B*T] rows `stride` apart,
 * as kiln_mha_forward_cuda reads them), f32 inside, bf16 out; the row 0 of kiln_mha_forward_cuda's output.
 * hd <= 256 (src/cuda/clip_attention_cls.cu). */
kiln_error *kiln_clip_attention_cls_cuda(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                         int64_t B, int64_t T, int64_t heads, int64_t hd, int64_t stride,
                                         int64_t out_stride, float scale, void *stream);
/* kiln_clip_patchify_cuda from f32 pixels [B,3,S,S] (rounded to bf16 on the device) */
kiln_error *kiln_clip_patchify_f32_cuda(kiln_bf16 *cols, int64_t ld, const float *pixels, int64_t B, int64_t S,
                                        int64_t p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
