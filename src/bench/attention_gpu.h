/* The device side of `kiln bench attention --device cuda` (src/bench/attention_gpu.c). */
#ifndef KILN_BENCH_ATTENTION_GPU_H
#define KILN_BENCH_ATTENTION_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

/* Mean microseconds of kiln_attention_forward_cuda (us[0], with the logsumexp saved as in training) and
 * of forward + kiln_attention_backward_cuda (us[1]) on GPU 0, bf16, over `iters` calls after `warmup`,
 * on deterministic inputs; fails naming the shape when the device is missing or a result is not finite.
 * impl: "own", "cudnn" or "cudnn-nondet" (kiln_attention_cuda_set_impl), NULL for the trainer's default;
 * ran gets what ran ("own" when cuDNN could not take the shape; the backward's name when it differs). */
kiln_error *kiln_bench_attention_cuda(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t window,
                                      const char *impl, int iters, int warmup, double us[2], char *ran,
                                      size_t ran_size);

#endif
