/* The experts' weight gradients as ONE persistent wgmma kernel (src/cuda/experts_dw_wg.cu), the TN case of
 * kiln_grouped_gemm_cuda with a bf16 C: C_e[m, n] (=, or += with accumulate) = A_eᵀ B_e for every expert e with
 * rows, where A_e is rows offs[e] .. offs[e+1]-1 of A [S, m] and B_e the same rows of B [S, n] (bf16, row-major,
 * S = offs[E]), and C_e the e-th [m, n] matrix of C (bf16, row-major, back to back). An expert without rows is
 * not touched (the caller clears it where it must). Every element is one f32 sum over the expert's rows in row
 * order, in one CTA: the same bits on every run.
 * Why: cuBLASLt runs the 2 x E GEMMs of a layer's weight gradients one per expert (k = the expert's rows), each
 * about two waves of tiles with its own fill and drain, on side streams to fill each other's gaps (the [cuda]
 * benchmark: ~0.9 ms a layer for at most 412 GFLOP, docs/perf.md session 29); here all the experts' tiles are dealt
 * to the CTAs (one an SM by default), the largest experts first, and a tile's stores run under the next tile's MMAs.
 * Internal to the CUDA side (experts_gemm.cu, its GPU tests). */
#ifndef KILN_CUDA_EXPERTS_DW_WG_H
#define KILN_CUDA_EXPERTS_DW_WG_H

#include <stdint.h>

#include "kiln/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { KILN_DW_WG_MAXE = 256 }; /* experts a call takes (the schedule is a kernel parameter) */

/* 1 when the kernel takes this call: an sm_90 device with the shared memory, m % 128 == 0, n % 256 == 0,
 * 1 <= E <= KILN_DW_WG_MAXE, S, m, n < 2^31, a and b 16-byte aligned (TMA), c 4 (bf16 pairs) */
int kiln_experts_dw_wg_ok(int64_t E, int64_t S, int64_t m, int64_t n, const void *a, const void *b, const void *c);

/* offs: E + 1 row offsets on the host. ctas: the grid (0: one CTA an SM; never more than tiles). sq (nullable, device,
 * E doubles; written C only): sq[e] = the sum of squares of C_e as stored (the bf16 values), 0 for an expert without
 * rows, summed in a fixed order from the tiles' registers (a thread's squares in f32 chains of 32, f64 beyond: the
 * gradient norm's share of the experts without reading them back). Asynchronous on stream. */
kiln_error *kiln_experts_dw_wg(kiln_bf16 *c, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs, int64_t E,
                               int64_t m, int64_t n, int accumulate, int ctas, double *sq, void *stream);

#ifdef __cplusplus
}
#endif
#endif
