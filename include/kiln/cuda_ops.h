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

#ifdef __cplusplus
}
#endif
#endif
