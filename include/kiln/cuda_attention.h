/* Which implementation kiln_attention_forward_cuda / kiln_attention_backward_cuda (include/kiln/cuda_ops.h)
 * run: cuDNN's fused flash attention (src/cuda/attention_cudnn.cu) or kiln's own kernels
 * (src/cuda/attention.cu, attention_mma.cu). */
#ifndef KILN_CUDA_ATTENTION_H
#define KILN_CUDA_ATTENTION_H

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "cudnn" (cuDNN's fused flash attention, opened at run time from $KILN_CUDNN_LIB or libcudnn.so.9; its
 * backward computes dQ through the engine's dP workspace, so runs stay bit-identical), "cudnn-nondet"
 * (cuDNN's faster backward whose dQ accumulates with float atomics: runs differ in the last bits) or "own".
 * NULL goes back to $KILN_ATTENTION (unset: cudnn). Where cuDNN cannot run a call (library not found,
 * a KV cache, head dim not a multiple of 8 from 32 to 128, a plan it refuses) kiln's kernels run instead; one
 * log line per pass and reason says which one ran. The saved lse is the same in both (cuDNN's softmax
 * statistics are the natural-log logsumexp), so a forward of one and a backward of the other mix freely.
 * An unknown name is an error. Not thread-safe against concurrent attention calls. */
kiln_error *kiln_attention_cuda_set_impl(const char *impl);
/* what the last forward (backward = 0) or backward (1) call ran: "cudnn", "cudnn-nondet" or "own" */
const char *kiln_attention_cuda_last_impl(int backward);

#ifdef __cplusplus
}
#endif
#endif
