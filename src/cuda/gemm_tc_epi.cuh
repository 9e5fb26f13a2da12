// The bf16 epilogue pieces of kiln's own wgmma GEMMs, shared by gemm_tc.cu (CLIP's fc1 + quick_gelu) and
// experts_dw_wg.cu (the experts' weight gradients): the bias pair of a column, quick_gelu's two formulas, and the
// deferred ("held") epilogue that stores a tile's bf16 results under the next tile's MMAs.
#ifndef KILN_CUDA_GEMM_TC_EPI_CUH
#define KILN_CUDA_GEMM_TC_EPI_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "gemm_tc.h"
#include "wgmma.cuh"

namespace kwg {

static __device__ __forceinline__ float2 bias_pair(const float *b, int col) { return *(const float2 *)(b + col); }
static __device__ __forceinline__ float2 bias_pair(const __nv_bfloat16 *b, int col) {
    return __bfloat1622float2(*(const __nv_bfloat162 *)(b + col));
}
// quick_gelu on the f32 accumulator: two MUFU operations (ex2, rcp) per element, -1.702 log2(e) as one constant
// (__expf(-1.702f * v) multiplies twice: in clusters the epilogue's instruction count shows, docs/perf.md);
// __fdividef gives -0 for the infinite denominator of a large negative v, as the exact division does
static __device__ __forceinline__ float quick_gelu(float v) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-2.4554670f * v));
    return __fdividef(v, 1.0f + e);
}
// The default formula (KILN_GEMM_TC_QGELU=tanh; =exact picks the one above): v/2 (1 + tanh(0.851 v)), the same
// function, one MUFU operation (tanh.approx: ~5e-4 absolute in the sigmoid, so ~1e-3 absolute at v ~ -4 where the
// exact value is ~-0.005)
static __device__ __forceinline__ float quick_gelu_tanh(float v) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.851f * v));
    const float h = 0.5f * v;
    return fmaf(h, t, h);
}
// the formula QM (KILN_GEMM_TC_QGELU: 0 exact, 1 tanh). Measured and removed (docs/perf.md): the reciprocal on the
// FMA pipe by Newton steps (session 11: its held-tile kernels spilled, 583 TFLOP/s against the exact 656) and the
// exponentials of a pair as one f16x2 MUFU operation (session 12: 593 against 620 at N 3072, the conversions cost more)
template <int QM> __device__ __forceinline__ float quick_gelu_qm(float v) {
    return QM == 1 ? quick_gelu_tanh(v) : quick_gelu(v);
}

// The deferred epilogue (cooperative tiles with DEFER): a cooperative CTA's tensor cores idle while its two warpgroups
// run their epilogues: 64 scattered bf16-pair stores a thread (each instruction 8 rows of 16 bytes: 8 L1 wavefronts)
// and quick_gelu's two MUFU operations an element (2 x 32768 a 128 x 256 tile at 16 a clock: 4096 clocks), against
// 16384 clocks of MMAs at the tensor cores' peak. Instead a tile leaves its accumulators as bf16 pairs (the bias added
// in f32, one rounding) in `held` registers, and the next tile's k blocks apply quick_gelu to them and store them, an
// NCH-th after each block's wgmma group is issued (two groups queued under it); exposed stay the bias add and the
// packing (~200 instructions a thread). quick_gelu then reads the bf16-rounded pre-activation (two roundings: bit for
// bit cuBLASLt + kiln's pass in r32 with the exact formula; KILN_GEMM_TC_QGELU picks the formula). The last tile's are
// stored after the loop. r32 (N 4096, K 1024): with the bias 512 -> 671 TFLOP/s alone and 529 -> 683 in pairs (M
// 16448); with quick_gelu only 545 / 540. Session 11 (r3, Nsight Compute on the pair tile at M 32896): the chunk ran
// after wait<1>, under one queued group; the chunk bounds took a runtime integer division every k block; and the drain,
// an unrolled `if (c in range)` over 16 chunks, sent every k block through 16 compare-and-branch steps landing on 16
// chunks' code (instruction-fetch stalls: 12% of the MMA warps' samples; 36% more cycles than with the bias). Chunk
// before wait<1>, bounds counted up, a switch: with quick_gelu 634 / 643 TFLOP/s (M 16448) and 647 / 654 (M 32896);
// with the bias 685 / 705 and 700 / 717 (cuBLASLt 728 / 712 in the same run).
constexpr int NCH = 16; // k blocks a tile's stores are spread over (K = 1024: one chunk a block)

// the accumulators of a 64 x BN warpgroup tile (+ bias) as bf16 pairs: held[2j] row r0, held[2j + 1] row r0 + 8,
// columns c0 + 8j + {0, 1}
template <int EPI, int BN, typename BiasT>
__device__ __forceinline__ void hold_tile(const float (&acc)[BN / 2], uint32_t (&held)[BN / 4], const BiasT *bias, int c0) {
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        float2 b = make_float2(0.0f, 0.0f);
        if constexpr (EPI != KILN_GEMM_TC_NONE) b = bias_pair(bias, c0 + 8 * j);
        held[2 * j] = pack_bf16x2(acc[4 * j] + b.x, acc[4 * j + 1] + b.y);
        held[2 * j + 1] = pack_bf16x2(acc[4 * j + 2] + b.x, acc[4 * j + 3] + b.y);
    }
}

// chunk c of the held tile: quick_gelu (formula QM) and the stores; p0 / p1 point at rows r0 / r0 + 8 of the
// tile's first column pair of the thread (NULL for rows past M). C is a template parameter so every held index is
// a constant (the registers stay registers).
template <int QM, int EPI, int BN, int C>
__device__ __forceinline__ void drain_chunk(const uint32_t (&held)[BN / 4], uint32_t *p0, uint32_t *p1) {
    constexpr int JPC = BN / 8 / NCH; // column groups of 8 a chunk
#pragma unroll
    for (int jj = 0; jj < JPC; jj++) {
        const int j = C * JPC + jj;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t u = held[2 * j + h];
            if constexpr (EPI == KILN_GEMM_TC_BIAS_QUICK_GELU) {
                const float2 f = unpack_bf16x2(u);
                u = pack_bf16x2(quick_gelu_qm<QM>(f.x), quick_gelu_qm<QM>(f.y));
            }
            uint32_t *p = h ? p1 : p0;
            if (p) p[4 * j] = u; // 8 bf16 columns = 4 pairs further
        }
    }
}
// chunks lo..hi-1 (runtime bounds). A switch, not an unrolled loop of `if (c in range)`: session 11 r3 (ncu, fc1's shape)
// showed that chain's 16 compare-and-branch steps a k block, each landing on another chunk's code, stalled the
// MMA warps on instruction fetch (12% of their samples; 3% with the bias alone); a switch jumps to the one
// chunk a k block drains.
template <int QM, int EPI, int BN>
__device__ __forceinline__ void drain_held(const uint32_t (&held)[BN / 4], uint32_t *p0, uint32_t *p1, int lo, int hi) {
    static_assert(NCH == 16, "drain_held's cases");
    for (int c = lo; c < hi; c++) {
#define DRAIN_CASE(n)                                                                                                     \
    case n: drain_chunk<QM, EPI, BN, n>(held, p0, p1); break;
        switch (c) {
            DRAIN_CASE(0) DRAIN_CASE(1) DRAIN_CASE(2) DRAIN_CASE(3) DRAIN_CASE(4) DRAIN_CASE(5) DRAIN_CASE(6)
            DRAIN_CASE(7) DRAIN_CASE(8) DRAIN_CASE(9) DRAIN_CASE(10) DRAIN_CASE(11) DRAIN_CASE(12) DRAIN_CASE(13)
            DRAIN_CASE(14) DRAIN_CASE(15)
        }
#undef DRAIN_CASE
    }
}

} // namespace kwg

#endif
