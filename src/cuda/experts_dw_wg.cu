// The experts' weight gradients in one persistent wgmma kernel (the contract and the why are in experts_dw_wg.h).
//
// C_e[m, n] = sum over expert e's rows r of A[r, m] B[r, n]: a GEMM whose K is the expert's rows. Both operands are
// MN-major in memory (a row of A holds m, a row of B holds n), as in CCA's dw1_wg_kernel (cca_conv_wg.cu): TMA loads
// [64 rows x 64 columns] boxes into 128-byte-swizzled shared memory and wgmma reads them transposed. A tile is
// 128 x 256 of one expert's C_e: A's two boxes (a consumer warpgroup each, m64), B's four (N = 256 in one
// m64n256k16, the boxes 8 KB apart), over the expert's rows in K blocks of 64.
//  - One CTA an SM, three warpgroups (as gemm_tc.cu): warpgroup 0's one thread walks the CTA's tiles and their K
//    blocks and issues the loads into a 4-slot ring; warpgroups 1 and 2 run the MMAs, 64 rows of the tile each.
//  - The tiles of every expert with rows are dealt round-robin (tile t to CTA t % grid), the experts with the most
//    rows first, so the kernel's last round is of the cheapest tiles. A CTA holds its SM until its tiles are done
//    (nothing else fits beside it); a grid of several CTAs an SM (KILN_GROUPED_DW_CTAS) runs in waves instead, so
//    that other streams' kernels (the router's backward) get SMs between them, at the cost of a deferred epilogue
//    a wave. The schedule (experts, first rows, counts)
//    is a kernel parameter written on the host, which knows the offsets: no device read before the first load.
//  - An expert's K blocks start at its first row, so its last block may run into the next expert's rows: the
//    consumers zero those rows of the A and B boxes before their MMAs (whole 128-byte rows: the swizzle only
//    permutes 16-byte chunks within a row), so they add nothing. Rows past S read as zeros (TMA).
//  - The stores are deferred (gemm_tc_epi.cuh): a tile's bf16 results wait in registers and are stored in 16
//    chunks under the next tile's MMAs; with accumulate the tile is added to C right after its MMAs.
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "cuda_check.h"
#include "experts_dw_wg.h"
#include "gemm_tc_epi.cuh"
#include "launch.cuh"
#include "wgmma.cuh"

namespace edw {
using namespace kwg;

typedef __nv_bfloat16 bf16;

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
constexpr int BOX = BK * 128; // one [64 rows x 64 columns] box: 8 KB; also the MN blocks' stride (LBO)
constexpr int A_BYTES = 2 * BOX, B_BYTES = 4 * BOX, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
// the ring, the barriers, + 1024 for the swizzle's alignment (the dynamic shared memory base is 16-byte aligned)
constexpr size_t SMEM = (size_t)STAGES * STAGE_BYTES + 2 * STAGES * sizeof(uint64_t) + 1024;

// The tiles in dealing order: expert slot x (x < n) covers tiles x * tpe .. x * tpe + tpe - 1, tile lt of it
// row block lt / tn and column block lt % tn of C_e, over rows r0[x] .. r0[x] + rows[x] - 1 (rows[x] > 0).
struct sched {
    int n, tiles, tn, tpe;
    int e[KILN_DW_WG_MAXE], r0[KILN_DW_WG_MAXE], rows[KILN_DW_WG_MAXE];
};

template <bool ACC>
__global__ void __launch_bounds__(THREADS, 1)
    dw_wg_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b, bf16 *C, int M,
                 int N, double *sqp, const __grid_constant__ sched s) {
    pdl_wait();
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sb = smem + STAGES * A_BYTES;
    uint64_t *full = (uint64_t *)(smem + STAGES * STAGE_BYTES), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        // empty: one arrival per consumer warp
        for (int q = 0; q < STAGES; q++) mbar_init(&full[q], 1), mbar_init(&empty[q], 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tm_a) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tm_b) : "memory");
            uint32_t it = 0;
            for (int t = blockIdx.x; t < s.tiles; t += gridDim.x) {
                const int x = t / s.tpe, lt = t - x * s.tpe;
                const int m0 = (lt / s.tn) * BM, n0 = (lt % s.tn) * BN, r0 = s.r0[x];
                const int kbn = (s.rows[x] + BK - 1) / BK;
                for (int kb = 0; kb < kbn; kb++, it++) {
                    const int q = it % STAGES, row = r0 + kb * BK;
                    mbar_wait(&empty[q], ((it / STAGES) & 1) ^ 1);
                    mbar_arrive_expect_tx(&full[q], STAGE_BYTES);
                    uint8_t *a = sa + q * A_BYTES, *b = sb + q * B_BYTES;
                    for (int h = 0; h < 2; h++) tma_load_2d(a + h * BOX, &tm_a, &full[q], m0 + h * 64, row);
                    for (int h = 0; h < 4; h++) tma_load_2d(b + h * BOX, &tm_b, &full[q], n0 + h * 64, row);
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
    float acc[BN / 2];
    uint32_t held[ACC ? 1 : BN / 4];
    uint32_t *hp0 = NULL, *hp1 = NULL; // the held tile's rows r and r + 8 (every row of C_e exists: M % 128 == 0)
    bool holding = false;
    uint32_t it = 0;
    for (int t = blockIdx.x; t < s.tiles; t += gridDim.x) {
        const int x = t / s.tpe, lt = t - x * s.tpe;
        const int m0 = (lt / s.tn) * BM, n0 = (lt % s.tn) * BN, rows = s.rows[x];
        const int kbn = (rows + BK - 1) / BK, tail = rows - (kbn - 1) * BK; // the last block's rows of this expert
        // chunks of the held tile stored so far; after block kb, ceil(NCH (kb + 1) / kbn) of them, counted up
        int drained = 0, upto = 0, uk = 0, num = 0; // uk = upto * kbn, num = NCH * (kb + 1)
        for (int kb = 0; kb < kbn; kb++, it++) {
            const int q = it % STAGES;
            mbar_wait(&full[q], (it / STAGES) & 1);
            uint8_t *abox = sa + q * A_BYTES + cw * BOX, *bslot = sb + q * B_BYTES;
            if (kb == kbn - 1 && tail < BK) {
                // rows tail.. of the block are the next expert's (or zeros past S): cleared in both operands (an Inf
                // there times a zero would still be NaN), this warpgroup's A box and half of the B boxes, made
                // visible to the tensor cores' reads (async proxy) before either warpgroup's MMAs
                uint4 *za = (uint4 *)abox, *zb = (uint4 *)(bslot + 2 * cw * BOX);
                for (int i = tail * 8 + tid; i < BK * 8; i += 128) {
                    za[i] = make_uint4(0u, 0u, 0u, 0u);
                    zb[i] = make_uint4(0u, 0u, 0u, 0u), zb[BK * 8 + i] = make_uint4(0u, 0u, 0u, 0u);
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                asm volatile("bar.sync 1, 256;\n" ::: "memory");
            }
            const uint32_t a_addr = smem_u32(abox), b_addr = smem_u32(bslot);
            fence_acc(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) // 16 rows a step: two 8-row groups, 2 KB; the tile's first overwrites
                wgmma_n256<1>(acc, sw128_mn_desc(a_addr + kk * 2048, BOX, 1024),
                              sw128_mn_desc(b_addr + kk * 2048, BOX, 1024), kb > 0 || kk > 0);
            wgmma_commit();
            fence_acc(acc);
            if constexpr (!ACC) {
                // the previous tile's next chunks, while this block's group and the one before are queued
                num += NCH;
                while (uk < num) uk += kbn, upto++;
                if (holding) drain_held<0, KILN_GEMM_TC_NONE, BN>(held, hp0, hp1, drained, upto);
                drained = upto;
            }
            ring_next<STAGES>(acc, empty, it, kb, lane);
        }
        ring_drain<STAGES>(acc, empty, it, lane);

        // acc[4j + 2h + i]: row r + 8h, column c + 8j + i of the tile's expert
        const int r = m0 + cw * 64 + warp * 16 + lane / 4, c = n0 + 2 * (lane % 4);
        uint32_t *p0 = (uint32_t *)(C + ((int64_t)s.e[x] * M + r) * N + c), *p1 = p0 + 4 * (int64_t)N;
        if constexpr (ACC) {
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t *p = (h ? p1 : p0) + 4 * j;
                    const float2 o = unpack_bf16x2(*p);
                    *p = pack_bf16x2(o.x + acc[4 * j + 2 * h], o.y + acc[4 * j + 2 * h + 1]);
                }
        } else {
            hold_tile<KILN_GEMM_TC_NONE, BN, float>(acc, held, NULL, c);
            hp0 = p0, hp1 = p1, holding = true;
            if (sqp) {
                // the tile's sum of squares as stored (the bf16 values), in a fixed order: a thread's 128 in four f32
                // chains (this runs with the tensor cores idle: f32 FMAs, not f64), then f64 across the warp
                float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < BN / 4; j++) {
                    const float2 v = unpack_bf16x2(held[j]);
                    s4[j & 3] = fmaf(v.x, v.x, s4[j & 3]), s4[j & 3] = fmaf(v.y, v.y, s4[j & 3]);
                }
                double ss = ((double)s4[0] + (double)s4[1]) + ((double)s4[2] + (double)s4[3]);
#pragma unroll
                for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                if (lane == 0) sqp[(int64_t)t * 8 + cw * 4 + warp] = ss;
            }
        }
    }
    if constexpr (!ACC) {
        if (holding) drain_held<0, KILN_GEMM_TC_NONE, BN>(held, hp0, hp1, 0, NCH);
    }
}

// sq[e] = the sum of expert e's tiles' parts (8 a tile, in tile order), in f64 and a fixed order; 0 for an expert
// without rows. One block an expert.
constexpr int SQ_THREADS = 256;
__global__ void __launch_bounds__(SQ_THREADS)
    dw_sq_kernel(double *sq, const double *sqp, const __grid_constant__ sched s) {
    pdl_wait();
    __shared__ double red[SQ_THREADS];
    const int e = blockIdx.x;
    int x = 0;
    while (x < s.n && s.e[x] != e) x++;
    double v = 0.0;
    if (x < s.n)
        for (int64_t i = (int64_t)x * s.tpe * 8 + threadIdx.x; i < (int64_t)(x + 1) * s.tpe * 8; i += SQ_THREADS) v += sqp[i];
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = SQ_THREADS / 2; h; h >>= 1) {
        if ((int)threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) sq[e] = red[0];
}

} // namespace edw

using namespace edw;

extern "C" int kiln_experts_dw_wg_ok(int64_t E, int64_t S, int64_t m, int64_t n, const void *a, const void *b,
                                     const void *c) {
    const int64_t lim = (int64_t)1 << 31;
    if (E < 1 || E > KILN_DW_WG_MAXE || S < 0 || S + BK >= lim || m < BM || n < BN || m % BM || n % BN || m >= lim ||
        n >= lim || (m / BM) * (n / BN) * E >= lim || ((uintptr_t)a | (uintptr_t)b) & 15 || (uintptr_t)c & 3)
        return 0;
    return kiln_wgmma_device_ok(SMEM);
}

extern "C" kiln_error *kiln_experts_dw_wg(kiln_bf16 *c, const kiln_bf16 *a, const kiln_bf16 *b, const int32_t *offs,
                                         int64_t E, int64_t m, int64_t n, int accumulate, int ctas, double *sq,
                                         void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    CUtensorMap tm_a, tm_b;
    sched s;
    int dev = 0, grid = 0;
    double *sqp = NULL;
    const int64_t S = E >= 1 && E <= KILN_DW_WG_MAXE ? offs[E] : 0;
    if (!kiln_experts_dw_wg_ok(E, S, m, n, a, b, c))
        return kiln_errorf(KILN_EUNSUPPORTED, "experts' weight gradients on wgmma: E=%lld S=%lld m=%lld n=%lld (needs "
                           "sm_90, m %% %d == 0, n %% %d == 0, E <= %d, A and B 16-byte aligned, C 4)",
                           (long long)E, (long long)S, (long long)m, (long long)n, BM, BN, (int)KILN_DW_WG_MAXE);
    if (sq && accumulate)
        return kiln_errorf(KILN_EINVAL, "experts' weight gradients on wgmma: sums of squares of added-to gradients");
    memset(&s, 0, sizeof s);
    s.tn = (int)(n / BN), s.tpe = (int)(m / BM) * s.tn;
    for (int64_t e = 0; e < E; e++) {
        if (offs[e + 1] < offs[e] || offs[e] < 0)
            return kiln_errorf(KILN_EINVAL, "experts' weight gradients: expert %lld's offsets %d..%d decrease",
                               (long long)e, offs[e], offs[e + 1]);
        if (offs[e + 1] == offs[e]) continue;
        // insertion by row count, most first (ties: expert order), so the last round deals the cheapest tiles
        int x = s.n++;
        for (; x > 0 && s.rows[x - 1] < offs[e + 1] - offs[e]; x--)
            s.e[x] = s.e[x - 1], s.r0[x] = s.r0[x - 1], s.rows[x] = s.rows[x - 1];
        s.e[x] = (int)e, s.r0[x] = offs[e], s.rows[x] = offs[e + 1] - offs[e];
    }
    if (!s.n) { // nothing to compute: every sum of squares is 0
        if (sq) CUDA_TRY(cudaMemsetAsync(sq, 0, (size_t)E * sizeof *sq, st));
        goto done;
    }
    s.tiles = s.n * s.tpe;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&grid, cudaDevAttrMultiProcessorCount, dev));
    if (ctas > 0) grid = ctas; // fewer: SMs left to other streams; more: CTAs in waves, other kernels between them
    if (grid > s.tiles) grid = s.tiles;
    if ((err = kiln_tma_map_bf16(&tm_a, a, S, m, m, BK, "the experts' output gradients (A)")) ||
        (err = kiln_tma_map_bf16(&tm_b, b, S, n, n, BK, "the experts' inputs (B)")))
        goto done;
    if (sq) CUDA_TRY(cudaMallocAsync((void **)&sqp, (size_t)s.tiles * 8 * sizeof *sqp, st));
    if (accumulate) {
        CUDA_TRY(cudaFuncSetAttribute(dw_wg_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
        kiln_launch(dw_wg_kernel<true>, (unsigned)grid, THREADS, SMEM, st, tm_a, tm_b, (bf16 *)c, (int)m, (int)n, sqp,
                    s);
    } else {
        CUDA_TRY(cudaFuncSetAttribute(dw_wg_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
        kiln_launch(dw_wg_kernel<false>, (unsigned)grid, THREADS, SMEM, st, tm_a, tm_b, (bf16 *)c, (int)m, (int)n, sqp,
                    s);
    }
    CUDA_TRY(cudaGetLastError());
    if (sq) {
        kiln_launch(dw_sq_kernel, (unsigned)E, SQ_THREADS, 0, st, sq, (const double *)sqp, s);
        CUDA_TRY(cudaGetLastError());
    }
done:
    if (sqp) cudaFreeAsync(sqp, st);
    return err ? kiln_error_wrap(err, "experts' weight gradients on wgmma (%lld experts, %lld x %lld)", (long long)E,
                                 (long long)m, (long long)n)
               : NULL;
}
