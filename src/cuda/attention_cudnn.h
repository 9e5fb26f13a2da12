// cuDNN's fused flash attention (src/cuda/attention_cudnn.cu) behind kiln_attention_{forward,backward}_cuda
// (src/cuda/attention.cu dispatches): the same shapes, layouts and logsumexp as kiln's own kernels.
#ifndef KILN_ATTENTION_CUDNN_H
#define KILN_ATTENTION_CUDNN_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kiln/cuda_ops.h"

// 0 when cuDNN can run this shape on these pointers (library loaded, a plan exists), else why not in *why
// (a static string or one kept by this file); loads the library and builds the plan on first use.
// nondet selects the faster backward whose dQ accumulates with atomics (not bit-reproducible).
int att_cudnn_usable(const kiln_attn_shape *s, int backward, int nondet, const char **why);
// *ran = 0 without an error when cuDNN's workspace could not be allocated (out of memory): run kiln's kernels
kiln_error *att_cudnn_forward(kiln_bf16 *out, float *lse, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                              const kiln_attn_shape *s, cudaStream_t st, int *ran);
kiln_error *att_cudnn_backward(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv, const kiln_bf16 *dout,
                               const kiln_bf16 *out, const float *lse, const kiln_bf16 *q, const kiln_bf16 *k,
                               const kiln_bf16 *v, const kiln_attn_shape *s, int nondet, cudaStream_t st, int *ran);
// the loaded cuDNN's version (e.g. 91300), 0 when not loaded
long att_cudnn_version(void);

#endif
