// cuDNN's fused flash attention (src/cuda/attention_cudnn.cu) behind kiln_attention_{forward,backward}_cuda
// (src/cuda/attention.cu dispatches): the same shapes, layouts and logsumexp as kiln's own kernels. CLIP's
// towers (kiln_mha_forward_cuda, src/cuda/clip_ops.cu) use the forward with their own layout.
#ifndef KILN_ATTENTION_CUDNN_H
#define KILN_ATTENTION_CUDNN_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kiln/cuda_ops.h"

// Beyond kiln_attn_shape: which keys a query sees and how q/k/v/out lie in memory. NULL everywhere below means
// the trainer's: causal (plus s->window), q/out [B, T, NH, D] and k/v [B, tk_cap, KV, D], packed.
typedef struct {
    int causal;                   // 0: every key visible to every query (window must be 0)
    int64_t q_row, kv_row, o_row; // elements from one token to the next within a sequence (0: the packed
                                  // NH·D for q/out, KV·D for k/v); a multiple of 8, head h at h·D
    int64_t q_seq;                // tokens from one sequence's q/out to the next (0: s->Tq); with causal = 0,
                                  // s->Tq < s->tk runs the first Tq queries of sequences of tk tokens
} att_cudnn_layout;

// 0 when cuDNN can run this shape on these pointers (library loaded, a plan exists), else why not in *why
// (a static string or one kept by this file); loads the library and builds the plan on first use.
// nondet selects the faster backward whose dQ accumulates with atomics (not bit-reproducible). The backward
// takes the trainer's layout only (l NULL).
int att_cudnn_usable(const kiln_attn_shape *s, const att_cudnn_layout *l, int backward, int nondet,
                     const char **why);
// *ran = 0 without an error when cuDNN's workspace could not be allocated (out of memory): run kiln's kernels.
// lse NULL: the statistics go to cuDNN's workspace (inference).
kiln_error *att_cudnn_forward(kiln_bf16 *out, float *lse, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                              const kiln_attn_shape *s, const att_cudnn_layout *l, cudaStream_t st, int *ran);
kiln_error *att_cudnn_backward(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv, const kiln_bf16 *dout,
                               const kiln_bf16 *out, const float *lse, const kiln_bf16 *q, const kiln_bf16 *k,
                               const kiln_bf16 *v, const kiln_attn_shape *s, int nondet, cudaStream_t st, int *ran);
// the loaded cuDNN's version (e.g. 91300), 0 when not loaded
long att_cudnn_version(void);

#endif
