/* The CUDA ops of CLIP's vision tower added after include/kiln/cuda_ops.h's cisclip section (same
 * conventions: device pointers, asynchronous on `stream`, a kiln_error naming the op). Used by
 * src/clip/clip_cuda.c; defined in src/cuda/clip_gemm.cu and clip_ops.cu. */
#ifndef KILN_CUDA_CLIP_OPS_H
#define KILN_CUDA_CLIP_OPS_H

#include "kiln/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[n,out] = x[n,in] wᵀ + bias (+ y when accumulate) through cuBLASLt, x and w bf16, f32 accumulation.
 * y_f32 = 0: y bf16, bias bf16 [out] (nullable), accumulate must be 0. y_f32 = 1: y f32, bias f32 [out]
 * (nullable); accumulate adds into y (the residual stream: the residual add as the GEMM's epilogue). */
kiln_error *kiln_clip_linear_cuda(void *y, int y_f32, const kiln_bf16 *x, const kiln_bf16 *w, const void *bias,
                                  int64_t n, int64_t in, int64_t out, int accumulate, void *stream);
/* KILN_CLIP_GEMM=own (read at every call; off by default): 1 when CLIP's fc1 + quick_gelu run as one GEMM of
 * kiln's own with quick_gelu in its epilogue (src/cuda/gemm_tc.cu) instead of cuBLASLt + a quick_gelu pass.
 * KILN_CLIP_GEMM=own-all: that, and kiln_clip_linear_cuda runs every projection the own GEMM takes through it
 * (bf16 out with or without the bias; f32 out accumulated with an f32 bias; in % 64, out % 128). */
int kiln_clip_gemm_own(void);
/* y[n,out] = quick_gelu(x[n,in] wᵀ + bias) in that one GEMM: x, w, y and bias bf16 (in % 64 == 0,
 * out % 128 == 0, 16-byte aligned rows) */
kiln_error *kiln_clip_linear_quick_gelu_cuda(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w, const kiln_bf16 *bias,
                                             int64_t n, int64_t in, int64_t out, void *stream);
/* what kiln_mha_forward_cuda's last call ran (KILN_CLIP_ATTN): "cudnn", "own", "gemm", "cudnn+own" /
 * "cudnn+gemm" (cuDNN took the first sequences only), "none" before any call */
const char *kiln_clip_attention_last_impl(void);
/* kiln_clip_patchify_cuda from f32 pixels [B,3,S,S] (rounded to bf16 on the device) */
kiln_error *kiln_clip_patchify_f32_cuda(kiln_bf16 *cols, const float *pixels, int64_t B, int64_t S, int64_t p,
                                        void *stream);

#ifdef __cplusplus
}
#endif
#endif
