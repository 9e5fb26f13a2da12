// CCA's grouped convolution on Hopper's wgmma for heads of exactly 128 channels (ZAYA's), persistent, in both of
// the training path's directions (the contract is in cca_conv_wg.h):
//  - the forward with the conv bias and the q/k coupling in its epilogue (cca_conv_fused.cu's grp128_kernel<0>);
//  - the backward's input gradient dmid (its grpp_bwd_kernel): the same kernel with dy for A (MODE 1), stored as
//    f32 or bf16 (session 26: bf16 where the depthwise stage's 16-byte kernels read it);
//  - the backward's weight and bias gradients dw1, db1 as per-CTA partials (its dw1_128_kernel): dw1_wg_kernel
//    below, both operands MN-major (session 25: 112 -> 45 us a call at issue [cuda]'s shape, partials and sums
//    included).
//
// Why: grp128_kernel (wmma fragments through registers, two blocks an SM, w1 re-read from L2 by every block) ran
// at ~120 TFLOP/s with w1 as hi + lo: latency-bound, its tensor pipe 21% busy (docs/perf.md, session 22 r4;
// session 23 r3: 168 us a call at issue [cuda]'s shape, 4.5x its bytes' bound); here 98 us with its helper
// kernels, and the input gradient 52 us against the mma.sync kernel's 99 (session 24). One CTA an SM with three
// warpgroups, as gemm_tc.cu:
//  - `bpg` CTAs a group. A CTA loads its group's w1 once by TMA (K-major rows [n][j*128 + i], hi rows then lo
//    rows: 128 KB at k1 = 2) and keeps it in shared memory, then walks the group's 128-row tiles (tile part,
//    part + bpg, ...);
//  - warpgroup 0's one thread streams each tile's A through a 4-slot ring: K block kb is tap j = kb*64 / 128,
//    channels c0 = kb*64 % 128, i.e. the box at row r0 + j (forward: of mid) or r0 - j (input gradient: of dy):
//    a shifted row start is all the convolution needs (rows out of the tensor read as zeros; the forward's rows
//    u >= T of a sequence are computed and not stored);
//  - warpgroups 1 and 2 take 64 rows each: wgmma m64n256k16 over w1's [hi | lo] rows (A read once for both
//    halves, summed in the epilogue), or m64n128k16 over its bf16 rounding alone (KILN_CCA_W1=bf16);
//  - the forward's epilogue inputs (q and k pairs of the thread's outputs, or for k heads the f32 sum over the
//    group's q heads, precomputed by ksum_kernel in the order grp128_kernel sums them) are loaded into registers
//    before the tile's MMAs: their latency hides under them (the wmma kernel's persistent twin, session 19,
//    waited on them after its MMAs: 208 us), and the bias comes from shared memory.
// Measured and not kept (session 24, docs/perf.md): 16-byte epilogue accesses through quad transposes, ping-pong
// warpgroups on 64-row tiles, the coupling sums written by the depthwise pass: none faster.
// Accumulation: f32 in the tensor cores; hi and lo in separate accumulators summed at the end (not the wmma
// kernel's interleaved order: the same products, rounded differently, within the op's tolerances).
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cca_conv_wg.h"
#include "gemm_tc.h"
#include "ops_common.cuh"
#include "wgmma.cuh"
#include "launch.cuh"

namespace ccawg {
using namespace kwg;

constexpr int CG = 128;      // channels a head: the group's output columns (N) and input channels
constexpr int BM = 128;      // mid rows a tile, 64 a consumer warpgroup
constexpr int BKW = 64;      // K a block: one 128-byte swizzle row of bf16
constexpr int STAGES = 4;    // A's ring
constexpr int THREADS = 384; // producer + two consumer warpgroups
constexpr int A_BYTES = BM * BKW * 2;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;

// shared memory: w1 (kb blocks of NB rows x 128 bytes), A's ring, the barriers (2 STAGES + 1, 16-byte rounded), the
// group's conv bias (128 f32); + 1024 for the swizzle's alignment
static size_t smem_bytes(int kb, bool lo) {
    return (size_t)kb * (lo ? 256 : 128) * 128 + (size_t)STAGES * A_BYTES + (2 * STAGES + 2) * sizeof(uint64_t) +
           CG * sizeof(float) + 1024;
}
// the forward's and the input gradient's shared memory: w1 (hi + lo, or hi) and A's ring
static size_t grp_smem(const kiln_conv_shape *s, int lo) { return smem_bytes((int)(CG * s->k1 / BKW), lo != 0); }


// MODE 0, the forward: tiles of 128 mid rows flat over the sequences (tm_a0: mid, 2-D), tap j the box's row start
// + j, the epilogue above. MODE 1, the input gradient dmid[u, n] = sum_{j,co} dy[u - j, co] w1[g*128 + co, n, j]
// (u < M): tiles of 128 rows of one sequence (tps a sequence), A from dqpre (tm_a0) or dkpre (tm_a1), 3-D maps
// [sequence][T][channels] whose row start u0 - j may be negative or run past T (zeros: the convolution's edges);
// the epilogue stores dmid's pairs as TD: f32, or bf16 (one rounding of the f32 sum, as the reference's autocast
// keeps this gradient: half the bytes written here and read twice by the depthwise stage's backward).
template <int MODE, bool LO, typename TD = float>
static __global__ void __launch_bounds__(THREADS, 1)
    grp_wg_kernel(const __grid_constant__ CUtensorMap tm_a0, const __grid_constant__ CUtensorMap tm_a1,
                  const __grid_constant__ CUtensorMap tm_w, bf16 *__restrict__ qpre, bf16 *__restrict__ kpre,
                  TD *__restrict__ dmid, const bf16 *__restrict__ xq, const bf16 *__restrict__ xk,
                  const float *__restrict__ ksum, const float *__restrict__ b1, int nseq, int T, int M, int kblocks,
                  int groups, int NH, int KV, int ldq, int ldk, int bpg) {
    pdl_wait();
    constexpr int NB = LO ? 256 : 128, B_BLOCK = NB * 128;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sb = smem, *sa = smem + kblocks * B_BLOCK;
    uint64_t *full = (uint64_t *)(sa + STAGES * A_BYTES), *empty = full + STAGES, *wfull = empty + STAGES;
    // the bias in shared memory: read by the epilogue between its global stores (a global read there could not be
    // hoisted above them, and each waited on L1: 46% of the warps' stalls in session 24 r2)
    float *sbias = (float *)(full + 2 * STAGES + 2);
    const int g = blockIdx.x / bpg, part = blockIdx.x % bpg, g0 = g * CG;
    const int rows = nseq * M, tps = (M + BM - 1) / BM, ntiles = MODE == 0 ? (rows + BM - 1) / BM : nseq * tps;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);
        mbar_init(wfull, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (MODE == 0 && threadIdx.x < CG) sbias[threadIdx.x] = b1 && g < groups ? b1[g0 + threadIdx.x] : 0.0f;
    __syncthreads();
    if (g >= groups) return;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (tid == 0) {
            const CUtensorMap *tm_a = MODE == 1 && g >= NH ? &tm_a1 : &tm_a0;
            const int a_col = MODE == 1 && g >= NH ? (g - NH) * CG : g0; // the head's first column in A's matrix
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)tm_a) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tm_w) : "memory");
            mbar_arrive_expect_tx(wfull, (uint32_t)(kblocks * B_BLOCK));
            for (int kb = 0; kb < kblocks; kb++) {
                tma_load_2d(sb + kb * B_BLOCK, &tm_w, wfull, kb * BKW, g0);
                if (LO) tma_load_2d(sb + kb * B_BLOCK + CG * 128, &tm_w, wfull, kb * BKW, groups * CG + g0);
            }
            uint32_t it = 0;
            for (int ti = part; ti < ntiles; ti += bpg)
                for (int kb = 0; kb < kblocks; kb++, it++) {
                    const int s = it % STAGES, j = kb * BKW / CG, c0 = kb * BKW % CG;
                    mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                    mbar_arrive_expect_tx(&full[s], A_BYTES);
                    if constexpr (MODE == 0) tma_load_2d(sa + s * A_BYTES, tm_a, &full[s], a_col + c0, ti * BM + j);
                    else tma_load_3d(sa + s * A_BYTES, tm_a, &full[s], a_col + c0, (ti % tps) * BM - j, ti / tps);
                }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32, cb = 2 * (lane & 3);
    const int G = NH / KV, Q = NH * CG, Kc = KV * CG;
    const bool qhead = g < NH;
    float acc[NB / 2];
    uint32_t pre[2][16][2]; // the epilogue's inputs: (q, k) bf16 pairs, or a k head's f32 sum pair
    mbar_wait(wfull, 0);
    uint32_t it = 0;
    for (int ti = part; ti < ntiles; ti += bpg) {
        // this thread's output rows: r and r + 8 of the tile (mid rows, flat over the sequences), as token rows
        // (MODE 1: rows u0 + ..., u0 = (ti % tps) * 128 of sequence ti / tps, valid below M)
        int64_t tok[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (MODE == 0) {
                const int fr = ti * BM + cw * 64 + warp * 16 + lane / 4 + 8 * h, bb = fr / M, u = fr - bb * M;
                tok[h] = fr < rows && u < T ? (int64_t)bb * T + u : -1;
            } else {
                const int u = (ti % tps) * BM + cw * 64 + warp * 16 + lane / 4 + 8 * h;
                tok[h] = u < M ? (int64_t)(ti / tps) * M + u : -1; // dmid's row
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (MODE == 1 || tok[h] < 0) continue;
            if (qhead) {
                const bf16 *qr = xq + tok[h] * ldq + g0 + cb, *kr = xk + tok[h] * ldk + (g / G) * CG + cb;
#pragma unroll
                for (int j = 0; j < 16; j++)
                    pre[h][j][0] = *(const uint32_t *)(qr + 8 * j), pre[h][j][1] = *(const uint32_t *)(kr + 8 * j);
            } else {
                const float *sr = ksum + tok[h] * Kc + (g - NH) * CG + cb;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const float2 v = *(const float2 *)(sr + 8 * j);
                    pre[h][j][0] = __float_as_uint(v.x), pre[h][j][1] = __float_as_uint(v.y);
                }
            }
        }
        for (int kb = 0; kb < kblocks; kb++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const uint32_t a_addr = smem_u32(sa + s * A_BYTES + cw * 64 * 128), b_addr = smem_u32(sb + kb * B_BLOCK);
            fence_acc(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BKW / 16; kk++) { // the tile's first MMA overwrites the accumulators (scale-d 0)
                if constexpr (LO)
                    wgmma_n256(acc, sw128_desc(a_addr + kk * 32), sw128_desc(b_addr + kk * 32), kb > 0 || kk > 0);
                else
                    wgmma_n128(acc, sw128_desc(a_addr + kk * 32), sw128_desc(b_addr + kk * 32), kb > 0 || kk > 0);
            }
            wgmma_commit();
            fence_acc(acc);
            ring_next<STAGES>(acc, empty, it, kb, lane);
        }
        ring_drain<STAGES>(acc, empty, it, lane);
        // epilogue: row tok[h], columns 8j + cb + {0, 1} of the head; acc[4j + 2h + e] (+ the lo half's, 64 on)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (tok[h] < 0) continue;
            if constexpr (MODE == 1) {
                TD *o = dmid + tok[h] * (groups * CG) + g0 + cb;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                    if constexpr (LO) v0 += acc[64 + 4 * j + 2 * h], v1 += acc[64 + 4 * j + 2 * h + 1];
                    if constexpr (sizeof(TD) == 2) *(__nv_bfloat162 *)(o + 8 * j) = __floats2bfloat162_rn(v0, v1);
                    else *(float2 *)(o + 8 * j) = make_float2(v0, v1);
                }
                continue;
            }
            bf16 *o = qhead ? qpre + tok[h] * Q + g0 + cb : kpre + tok[h] * Kc + (g - NH) * CG + cb;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if constexpr (LO) v0 += acc[64 + 4 * j + 2 * h], v1 += acc[64 + 4 * j + 2 * h + 1];
                const float2 bv = *(const float2 *)(sbias + 8 * j + cb);
                if (qhead) {
                    const float2 t0 = unpack_bf16x2(pre[h][j][0]), t1 = unpack_bf16x2(pre[h][j][1]);
                    v0 = v0 + bv.x + (t0.x + t1.x) * 0.5f, v1 = v1 + bv.y + (t0.y + t1.y) * 0.5f;
                } else {
                    v0 = v0 + bv.x + __uint_as_float(pre[h][j][0]) / (float)G;
                    v1 = v1 + bv.y + __uint_as_float(pre[h][j][1]) / (float)G;
                }
                *(__nv_bfloat162 *)(o + 8 * j) = __floats2bfloat162_rn(v0, v1);
            }
        }
    }
}

// ---- the grouped weights' gradient (and the conv bias's) ----
// dw1 partials for heads of 128 and k1 = 2: P[part][g*128 + co][j*128 + i] = sum over the part's steps (b, u) of
// dy[b, u, g*128 + co] * mid[b, u + j, g*128 + i], and Pb[part][g*128 + co] = sum of dy[b, u, g*128 + co]: a GEMM of
// M = co, N = (j, i), K = the head's B*T steps, split into `bpg` parts of whole 64-step blocks (one CTA each; the
// partials are summed in part order after: dw1_sum_kernel). Both operands are MN-major in memory (dy rows hold co,
// mid rows hold i), so TMA loads [64 steps x 64 channels] boxes and wgmma reads them transposed: A = dy's two
// 64-channel boxes (a consumer warpgroup each), B = mid's four boxes (tap j = 0, 1 x channel halves) 8 KB apart, i.e.
// N = 256 in one m64n256k16. db1 rides along as an m64n8k16 against a tile of ones. Steps u >= T of a sequence read
// dy as zeros (3-D maps), so they add nothing.
constexpr int W1_BK = 64;                    // steps a K block
constexpr int W1_STAGES = 4;
constexpr int W1_A_BYTES = 2 * W1_BK * 128;  // dy: 2 boxes of 64 steps x 128 bytes
constexpr int W1_B_BYTES = 4 * W1_BK * 128;  // mid: 4 boxes
constexpr int W1_BOX = W1_BK * 128;          // one box: 8 KB, the MN blocks' stride (LBO)
constexpr int W1_ONES = 512;                 // bytes of bf16 ones for db1's B operand

static size_t w1_smem_bytes() {
    return (size_t)W1_STAGES * (W1_A_BYTES + W1_B_BYTES) + 2 * W1_STAGES * sizeof(uint64_t) + W1_ONES + 1024;
}

static __global__ void __launch_bounds__(THREADS, 1)
    dw1_wg_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_mid, float *__restrict__ part, float *__restrict__ partb,
                  int nseq, int T, int groups, int NH, int bpg) {
    pdl_wait();
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sbm = smem + W1_STAGES * W1_A_BYTES;
    uint64_t *full = (uint64_t *)(sbm + W1_STAGES * W1_B_BYTES), *empty = full + W1_STAGES;
    uint32_t *ones = (uint32_t *)(empty + W1_STAGES);
    const int g = blockIdx.x / bpg, pi = blockIdx.x % bpg, g0 = g * CG, C = groups * CG;
    const int bps = (T + W1_BK - 1) / W1_BK, nk = nseq * bps; // K blocks a sequence, of the head
    const int kb0 = (int)((int64_t)nk * pi / bpg), kb1 = (int)((int64_t)nk * (pi + 1) / bpg);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < W1_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (threadIdx.x < W1_ONES / 4) ones[threadIdx.x] = 0x3F803F80u; // bf16 1.0 pairs
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // the ones, for wgmma's reads
    __syncthreads();
    if (g >= groups) return;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (tid == 0) {
            const CUtensorMap *tm_a = g < NH ? &tm_q : &tm_k;
            const int a_col = g < NH ? g0 : (g - NH) * CG;
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)tm_a) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tm_mid) : "memory");
            uint32_t it = 0;
            for (int kb = kb0; kb < kb1; kb++, it++) {
                const int s = it % W1_STAGES, b = kb / bps, u0 = (kb % bps) * W1_BK;
                mbar_wait(&empty[s], ((it / W1_STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(&full[s], W1_A_BYTES + W1_B_BYTES);
                uint8_t *a = sa + s * W1_A_BYTES, *bm = sbm + s * W1_B_BYTES;
                for (int h = 0; h < 2; h++) tma_load_3d(a + h * W1_BOX, tm_a, &full[s], a_col + h * 64, u0, b);
                for (int j = 0; j < 2; j++)
                    for (int h = 0; h < 2; h++)
                        tma_load_3d(bm + (2 * j + h) * W1_BOX, &tm_mid, &full[s], g0 + h * 64, u0 + j, b);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32, cb = 2 * (lane & 3);
    float acc[128], accb[4];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) accb[i] = 0.0f;
    const uint64_t d_ones = plain_desc(smem_u32(ones), 128, 256);
    uint32_t it = 0;
    for (int kb = kb0; kb < kb1; kb++, it++) {
        const int s = it % W1_STAGES;
        mbar_wait(&full[s], (it / W1_STAGES) & 1);
        const uint32_t a_addr = smem_u32(sa + s * W1_A_BYTES + cw * W1_BOX), b_addr = smem_u32(sbm + s * W1_B_BYTES);
        fence_acc(acc);
        fence_acc(accb);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < W1_BK / 16; kk++) { // 16 steps: two 8-row groups, 2 KB
            const uint64_t da = sw128_mn_desc(a_addr + kk * 2048, W1_BOX, 1024);
            wgmma_n256<1>(acc, da, sw128_mn_desc(b_addr + kk * 2048, W1_BOX, 1024), 1);
            wgmma_n8_mna(accb, da, d_ones, 1);
        }
        wgmma_commit();
        fence_acc(acc);
        fence_acc(accb);
        wgmma_wait<1>(); // the previous block's group has completed: its slot goes back to the producer
        fence_acc(acc);
        fence_acc(accb);
        if (kb > kb0 && lane == 0) mbar_arrive(&empty[(it - 1) % W1_STAGES]);
    }
    wgmma_wait<0>();
    fence_acc(acc);
    fence_acc(accb);
    // (no slot to release: the producer is done)
    // acc[4j + 2h + e]: row co = cw*64 + warp*16 + lane/4 + 8h, column 8j + cb + e (j < 32: tap j / 16)
    const int64_t ne = (int64_t)C * 2 * CG;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int co = cw * 64 + warp * 16 + lane / 4 + 8 * h;
        float *o = part + (int64_t)pi * ne + (int64_t)(g0 + co) * (2 * CG) + cb;
#pragma unroll
        for (int j = 0; j < 32; j++) *(float2 *)(o + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        if (partb && cb == 0) partb[(int64_t)pi * C + g0 + co] = accb[2 * h];
    }
}

// The k heads' coupling input: ks[t, jh*128 + n] = sum over the group's q heads m of (q[t, (jh*G + m)*128 + n]
// + k[t, jh*128 + n]) * 0.5, from 0, m ascending (grp128_kernel's order); 8 channels a thread
static __global__ void ksum_kernel(float *ks, const bf16 *xq, const bf16 *xk, int64_t N, int KV, int G, int ldq, int ldk) {
    pdl_wait();
    const int Kc = KV * CG, cv = Kc / 8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < N * cv; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / cv;
        const int c = (int)(e - t * cv) * 8, jh = c / CG, n = c % CG;
        float kv[8], qv[8], sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ld8_bf16(xk + t * ldk + c, kv);
        for (int m = 0; m < G; m++) {
            ld8_bf16(xq + t * ldq + (jh * G + m) * CG + n, qv);
#pragma unroll
            for (int i = 0; i < 8; i++) sum[i] += (qv[i] + kv[i]) * 0.5f;
        }
        float4 *o = (float4 *)(ks + t * Kc + c);
        o[0] = make_float4(sum[0], sum[1], sum[2], sum[3]), o[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
    }
}

// w1 [C, 128, k1] (f32) as the kernel's B, K-major: row g*128 + n, column j*128 + i holds w1[g*128 + n, i, j]
// (MODE 0: output n, input channel i) or w1[g*128 + i, n, j] (MODE 1, the transpose within the head: input
// gradient n, output channel i), rounded to bf16 (hi), and from groups*128 rows on the remainder's rounding (lo)
template <int MODE> static __global__ void w1_kmajor_kernel(bf16 *wk, const float *w1, int groups, int k1, int lo) {
    pdl_wait();
    const int K = CG * k1;
    const int64_t total = (int64_t)groups * CG * K;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / K;
        const int kk = (int)(e - row * K), j = kk / CG, i = kk % CG;
        const int64_t g = row / CG, n = row % CG;
        const float v = MODE == 0 ? w1[(row * CG + i) * k1 + j] : w1[((g * CG + i) * CG + n) * k1 + j];
        const bf16 hi = __float2bfloat16_rn(v);
        wk[e] = hi;
        if (lo) wk[total + e] = __float2bfloat16_rn(v - __bfloat162float(hi));
    }
}

// w1 in its MODE layout into stream-ordered scratch, then the tensor map of it
static kiln_error *w1_operand(bf16 **wk, CUtensorMap *tm_w, const float *w1, const kiln_conv_shape *s, int mode,
                              int lo, cudaStream_t st) {
    kiln_error *err = NULL;
    const int64_t K = CG * s->k1, ne = s->C * K;
    CUDA_TRY(kiln_ops_scratch((void **)wk, (size_t)(lo ? 2 : 1) * ne * sizeof(bf16), st));
    if (mode == 0) kiln_launch(w1_kmajor_kernel<0>, grid_for(ne, 256), 256, 0, st, *wk, w1, (int)s->groups,
                               (int)s->k1, lo);
    else kiln_launch(w1_kmajor_kernel<1>, grid_for(ne, 256), 256, 0, st, *wk, w1, (int)s->groups, (int)s->k1, lo);
    LAUNCH_CHECK("cca_conv_couple (w1, K-major)");
    err = kiln_tma_map_bf16(tm_w, (const kiln_bf16 *)*wk, (lo ? 2 : 1) * s->C, K, K, CG, "w1");
done:
    return err;
}

// the kernel for (MODE, LO), its shared memory granted; `bpg` CTAs a group: one CTA an SM
template <int MODE, typename TD = float>
static kiln_error *launch(const CUtensorMap &a0, const CUtensorMap &a1, const CUtensorMap &tw, bf16 *qpre, bf16 *kpre,
                          TD *dmid, const bf16 *q, const bf16 *k, const float *ks, const float *b1,
                          const kiln_conv_shape *s, int64_t NH, int64_t KV, int64_t ldq, int64_t ldk, int lo,
                          cudaStream_t st) {
    kiln_error *err = NULL;
    int dev, nsm;
    const int kblocks = (int)(CG * s->k1 / BKW);
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    {
        const int bpg = nsm / (int)s->groups > 1 ? nsm / (int)s->groups : 1;
        const size_t smem = grp_smem(s, lo);
        auto kern = lo ? grp_wg_kernel<MODE, true, TD> : grp_wg_kernel<MODE, false, TD>;
        CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kiln_launch(kern, (unsigned)(s->groups * bpg), THREADS, smem, st, a0, a1, tw, qpre, kpre, dmid, q, k, ks, b1,
                    (int)s->B, (int)s->T, (int)(s->T + s->k1 - 1), kblocks, (int)s->groups, (int)NH, (int)KV,
                    (int)ldq, (int)ldk, bpg);
        LAUNCH_CHECK(MODE == 0 ? "cca_conv_couple forward (grouped + coupling, wgmma)"
                               : "cca_conv_couple backward (grouped input gradient, wgmma)");
    }
done:
    return err;
}

} // namespace ccawg

using namespace ccawg;

// the shapes and device every kernel here takes: 128 channels a head, whole K blocks, sm_90 with `smem` bytes of
// shared memory for a CTA
static int wg_device_ok(const kiln_conv_shape *s, int64_t NH, int64_t KV, size_t smem) {
    if (s->C / s->groups != CG || s->C % s->groups || (CG * s->k1) % BKW || s->B * (s->T + s->k1 - 1) >= INT32_MAX ||
        NH % KV || NH + KV != s->groups)
        return 0;
    return kiln_wgmma_device_ok(smem);
}

extern "C" int kiln_cca_grp_fwd_wg_ok(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *mid, const void *q,
                                      int64_t ldq, const void *k, int64_t ldk, const void *qpre, const void *kpre,
                                      int lo) {
    if (((uintptr_t)mid & 15) || ((uintptr_t)q & 15) || ((uintptr_t)k & 15) || ldq % 8 || ldk % 8 || s->C % 8 ||
        ((uintptr_t)qpre & 3) || ((uintptr_t)kpre & 3))
        return 0;
    return wg_device_ok(s, NH, KV, grp_smem(s, lo));
}

extern "C" int kiln_cca_grp_bwd_wg_ok(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *dmid,
                                      const void *dqpre, const void *dkpre, int lo) {
    if (((uintptr_t)dmid & 7) || ((uintptr_t)dqpre & 15) || ((uintptr_t)dkpre & 15) || s->B > 65535 ||
        s->T >= INT32_MAX / 2)
        return 0;
    return wg_device_ok(s, NH, KV, grp_smem(s, lo));
}

extern "C" kiln_error *kiln_cca_grp_fwd_wg(kiln_bf16 *qpre, kiln_bf16 *kpre, const kiln_bf16 *mid, const kiln_bf16 *q,
                                           int64_t ldq, const kiln_bf16 *k, int64_t ldk, const float *w1,
                                           const float *b1, const kiln_conv_shape *s, int64_t NH, int64_t KV, int lo,
                                           void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *wk = NULL;
    float *ks = NULL;
    CUtensorMap tm_mid, tm_w;
    const int64_t M = s->T + s->k1 - 1, N = s->B * s->T;
    CUDA_TRY(kiln_ops_scratch((void **)&ks, (size_t)N * KV * CG * sizeof(float), st));
    kiln_launch(ksum_kernel, grid_for(N * KV * CG / 8, 256), 256, 0, st, ks, (const bf16 *)q, (const bf16 *)k, N,
                (int)KV, (int)(NH / KV), (int)ldq, (int)ldk);
    LAUNCH_CHECK("cca_conv_couple forward (k heads' coupling sums)");
    if (!(err = w1_operand(&wk, &tm_w, w1, s, 0, lo, st)) &&
        !(err = kiln_tma_map_bf16(&tm_mid, mid, s->B * M, s->C, s->C, BM, "mid")))
        err = launch<0, float>(tm_mid, tm_mid, tm_w, (bf16 *)qpre, (bf16 *)kpre, NULL, (const bf16 *)q, (const bf16 *)k,
                               ks, b1, s, NH, KV, ldq, ldk, lo, st);
done:
    if (wk) cudaFreeAsync(wk, st);
    if (ks) cudaFreeAsync(ks, st);
    return err;
}

extern "C" int kiln_cca_dw1_wg_parts(const kiln_conv_shape *s, int64_t NH, int64_t KV, const void *dqpre,
                                     const void *dkpre, const void *mid) {
    int dev, nsm;
    if (s->k1 != 2 || ((uintptr_t)dqpre & 15) || ((uintptr_t)dkpre & 15) || ((uintptr_t)mid & 15) || s->B > 65535 ||
        s->T >= INT32_MAX / 2 || s->B * ((s->T + W1_BK - 1) / W1_BK) >= INT32_MAX / 65536 ||
        !wg_device_ok(s, NH, KV, w1_smem_bytes()) || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    return nsm / (int)s->groups > 1 ? nsm / (int)s->groups : 1;
}

extern "C" kiln_error *kiln_cca_dw1_wg(float *part, float *partb, int parts, const kiln_bf16 *dqpre,
                                      const kiln_bf16 *dkpre, const kiln_bf16 *mid, const kiln_conv_shape *s, int64_t NH,
                                      int64_t KV, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    CUtensorMap tm_q, tm_k, tm_mid;
    const int64_t M = s->T + s->k1 - 1;
    if (!(err = kiln_tma_map_bf16_3d(&tm_q, dqpre, s->B, s->T, NH * CG, NH * CG, W1_BK, "dqpre")) &&
        !(err = kiln_tma_map_bf16_3d(&tm_k, dkpre, s->B, s->T, KV * CG, KV * CG, W1_BK, "dkpre")) &&
        !(err = kiln_tma_map_bf16_3d(&tm_mid, mid, s->B, M, s->C, s->C, W1_BK, "mid"))) {
        const size_t smem = w1_smem_bytes();
        CUDA_TRY(cudaFuncSetAttribute(dw1_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kiln_launch(dw1_wg_kernel, (unsigned)(s->groups * parts), THREADS, smem, st, tm_q, tm_k, tm_mid, part, partb,
                    (int)s->B, (int)s->T, (int)s->groups, (int)NH, parts);
        LAUNCH_CHECK("cca_conv_couple backward (grouped weights, wgmma)");
    }
done:
    return err;
}

extern "C" kiln_error *kiln_cca_grp_bwd_wg(void *dmid, int dmid_bf16, const kiln_bf16 *dqpre, const kiln_bf16 *dkpre,
                                           const float *w1, const kiln_conv_shape *s, int64_t NH, int64_t KV, int lo,
                                           void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *wk = NULL;
    CUtensorMap tm_q, tm_k, tm_w;
    if (!(err = w1_operand(&wk, &tm_w, w1, s, 1, lo, st)) &&
        !(err = kiln_tma_map_bf16_3d(&tm_q, dqpre, s->B, s->T, NH * CG, NH * CG, BM, "dqpre")) &&
        !(err = kiln_tma_map_bf16_3d(&tm_k, dkpre, s->B, s->T, KV * CG, KV * CG, BM, "dkpre")))
        err = dmid_bf16 ? launch<1>(tm_q, tm_k, tm_w, NULL, NULL, (bf16 *)dmid, NULL, NULL, NULL, NULL, s, NH, KV, 0, 0,
                                    lo, st)
                        : launch<1>(tm_q, tm_k, tm_w, NULL, NULL, (float *)dmid, NULL, NULL, NULL, NULL, s, NH, KV, 0, 0,
                                    lo, st);
    if (wk) cudaFreeAsync(wk, st);
    return err;
}
