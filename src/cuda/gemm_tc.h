/* kiln's own Hopper (sm_90a) GEMM for the shapes where a fused epilogue saves a memory pass that cuBLASLt
 * cannot fuse (CLIP's fc1 + quick_gelu): C[M,N] = epilogue(A[M,K] · B[N,K]ᵀ), A and B bf16 row-major (B is
 * a weight stored [out, in], the "NT" layout of src/cuda/clip_gemm.cu), f32 accumulation, C bf16 with row
 * stride ldc (or f32, accumulated into). Tiles are loaded by TMA into 128-byte-swizzled shared memory
 * through a multi-stage mbarrier pipeline and multiplied by wgmma (src/cuda/gemm_tc.cu). Internal to the
 * CUDA side, its GPU tests and CLIP's fc1 + quick_gelu (the default on Hopper; KILN_CLIP_GEMM=cublaslt opts out).
 *
 * Requirements (else a kiln_error naming the field): K % 64 == 0, N % 128 == 0, M, N, K < 2^31; A, B, C
 * 16-byte aligned and lda, ldb, ldc multiples of 8 elements (TMA's 16-byte global strides), lda, ldb >= K,
 * ldc >= N; a bias aligned to two of its elements. M needs no multiple: rows past M read as zeros and are
 * not stored. Asynchronous on `stream`; launch errors are returned (cudaGetLastError). */
#ifndef KILN_CUDA_GEMM_TC_H
#define KILN_CUDA_GEMM_TC_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_GEMM_TC_NONE = 0,       /* C = A Bᵀ (bias must be NULL) */
    KILN_GEMM_TC_BIAS,           /* C = A Bᵀ + bias[N] */
    KILN_GEMM_TC_BIAS_QUICK_GELU, /* C = quick_gelu(A Bᵀ + bias[N]), quick_gelu(v) = v / (1 + exp(-1.702 v)) */
    KILN_GEMM_TC_BIAS_ADD_F32     /* C (f32) += A Bᵀ + bias[N] (f32): a projection added into an f32 residual stream */
} kiln_gemm_tc_epilogue;

/* The tile and schedule. 128x128, 128x256: both consumer warpgroups on each tile (64 rows each), epilogues
 * together; PP_*: "ping-pong", the two consumer warpgroups on alternate tiles (all rows each), one's epilogue
 * under the other's MMAs. AUTO (the fastest on the H200 at CLIP's shapes, docs/perf.md): the deferred cooperative
 * 128x256 (in 2-CTA clusters where N > 1024) with a bf16 output, ping-pong 128x128 in 2-CTA clusters for f32
 * accumulation; or the one KILN_GEMM_TC_TILE names (128x128, 128x256, pp128x128, pp64x256, 128x256c2,
 * pp128x128c2, pp128x128c2x2, 128x256d, 128x256c2d, 128x256c2x2d). */
typedef enum {
    KILN_GEMM_TC_TILE_AUTO = 0,
    KILN_GEMM_TC_TILE_128x128,
    KILN_GEMM_TC_TILE_128x256,
    KILN_GEMM_TC_TILE_PP_128x128,
    KILN_GEMM_TC_TILE_PP_64x256,
    KILN_GEMM_TC_TILE_128x256_C2,   /* cooperative 128x256 in clusters of 2 CTAs along M sharing B (TMA multicast) */
    KILN_GEMM_TC_TILE_PP_128x128_C2, /* ping-pong 128x128, the same clusters */
    KILN_GEMM_TC_TILE_PP_128x128_C2x2, /* ping-pong 128x128 in clusters of 2 x 2 CTAs sharing A and B (N % 256 == 0) */
    /* cooperative 128x256 with the deferred epilogue (a tile's activation and stores run under the next tile's
     * MMAs; quick_gelu reads the bf16-rounded pre-activation, exact formula, bit for bit cuBLASLt + kiln's pass in
     * r32; f32 accumulation stays immediate): alone, in 2-CTA clusters sharing B, in 2 x 2 clusters sharing A and
     * B (N % 512 == 0) */
    KILN_GEMM_TC_TILE_128x256_D,
    KILN_GEMM_TC_TILE_128x256_C2_D,
    KILN_GEMM_TC_TILE_128x256_C2x2_D
} kiln_gemm_tc_tile;

/* C: bf16 [M, ldc], or f32 for KILN_GEMM_TC_BIAS_ADD_F32. bias: device [N], f32 when bias_f32 else bf16 (f32
 * for the f32 epilogue); required by every epilogue but NONE. */
kiln_error *kiln_gemm_tc_cuda(int64_t M, int64_t N, int64_t K, const kiln_bf16 *A, int64_t lda, const kiln_bf16 *B,
                              int64_t ldb, void *C, int64_t ldc, kiln_gemm_tc_epilogue epi, const void *bias,
                              int bias_f32, void *stream);
/* the same with the tile chosen (tests and timing compare them); a tile N does not divide is an error */
kiln_error *kiln_gemm_tc_tile_cuda(kiln_gemm_tc_tile tile, int64_t M, int64_t N, int64_t K, const kiln_bf16 *A,
                                   int64_t lda, const kiln_bf16 *B, int64_t ldb, void *C, int64_t ldc,
                                   kiln_gemm_tc_epilogue epi, const void *bias, int bias_f32, void *stream);

/* 1 when the current device runs kiln's wgmma kernels (sm_90: wgmma, setmaxnreg) with smem bytes of shared memory
 * for a CTA (the opt-in maximum); shared by the kernels built on wgmma.cuh */
int kiln_wgmma_device_ok(size_t smem);

/* A CUtensorMap (map: 64 bytes, 64-byte aligned) over the bf16 matrix [rows, cols] with row stride ld elements,
 * read in boxes of box_rows x 64 columns into 128-byte-swizzled shared memory, rows and columns out of range
 * zero-filled (TMA's rule); cols and ld multiples of 8, p 16-byte aligned. The driver's encoder is looked up
 * through the CUDA runtime (no link to libcuda). Shared by gemm_tc.cu and cca_conv_wg.cu. */
kiln_error *kiln_tma_map_bf16(void *map, const kiln_bf16 *p, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                              const char *name);
/* the same over a batch of such matrices, rows * ld elements apart: rank 3 (a batch of one too: the kernel's
 * 3-D loads need it), the box one matrix at a time, coordinates (column, row, matrix); rows out of range,
 * negative ones too, read as zeros */
kiln_error *kiln_tma_map_bf16_3d(void *map, const kiln_bf16 *p, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                                 int box_rows, const char *name);

#ifdef __cplusplus
}
#endif
#endif
