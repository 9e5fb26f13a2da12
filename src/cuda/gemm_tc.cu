// kiln's own Hopper GEMM with fused epilogues (the contract is in gemm_tc.h). Why it exists: cuBLASLt's
// epilogues are bias, ReLU and tanh-GELU, so CLIP's fc1 + quick_gelu costs a second pass over the 4096-wide
// activations (docs/perf.md, cisattn); here the activation is applied to the f32 accumulators before the
// one bf16 store.
//
// Structure (one persistent CTA per SM, 384 threads = three warpgroups):
//  - warpgroup 0, the producer: one thread walks the CTA's tiles and their K blocks of 64 and issues the TMA
//    loads of each block (A: BM rows x 64, B: BN rows x 64, each row 128 bytes, 128-byte swizzle) into a ring
//    of STAGES shared-memory slots. `full[s]` (one arrival + the transaction bytes) says a slot has landed,
//    `empty[s]` (one arrival per consumer warp) says the MMAs reading it are done. Its registers are given
//    to the consumers (setmaxnreg).
//  - warpgroups 1 and 2, the consumers: wgmma m64nBNk16 on the slot, keeping one wgmma group in flight (a
//    slot is released once the group after it was issued and the one reading it has completed), then the
//    epilogue from the accumulator registers (bias, quick_gelu, bf16 rounding, guarded stores of bf16 pairs)
//    while the producer already fills the ring for the next tile. Cooperative: both on each tile, 64 rows
//    each; ping-pong: alternate tiles (see the kernel). The deferred cooperative tiles (128x256d, ...) keep a
//    tile's bf16 pre-activations in registers and run its quick_gelu and stores under the next tile's MMAs.
// Rates (docs/perf.md, session 11 run r4; N 4096, K 1024, M 16448 / 32896, TFLOP/s; cuBLASLt 728 / 712, + the
// quick_gelu pass 539 / 530): the deferred 128x256 in 2-CTA clusters with the bias 705 / 717, with quick_gelu
// 643 / 654 (the ping-pong 128x128 that AUTO took for it until then 573 / 580; the cooperative 128x256 storing its
// own tile 512-546: the epilogue, not the main loop, holds the cooperative tiles back).
// Why 128x256 with one m64n256 a warpgroup: every wgmma reads A and B from shared memory and TMA writes every
// slot there; per 2048 MACs (an SM's tensor rate a clock) ping-pong 128x128 moves 96 + 64 bytes, 128x256 80 + 48,
// against the 128 bytes a clock shared memory serves (the clustered ping-pong stopped at ~630 TFLOP/s whatever
// its L2 traffic: pairs and 2 x 2 alike).
// The tensor maps (cuTensorMapEncodeTiled) are encoded per call on the host: the driver entry point comes
// from the CUDA runtime (cudaGetDriverEntryPointByVersion), so kiln does not link libcuda. Rows of A past M
// are zero-filled by TMA and their outputs are not stored.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "gemm_tc.h"
#include "kiln/log.h"
#include "gemm_tc_epi.cuh"
#include "wgmma.cuh"

namespace {

using namespace kwg;

typedef __nv_bfloat16 bf16;

constexpr int BK = 64;           // K per pipeline stage: 64 bf16 = one 128-byte swizzle row
constexpr int THREADS = 384;     // producer + two consumer warpgroups
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232; // 128*40 + 256*232 <= 64K registers of the SM

template <int BM, int BN, int STAGES> struct Cfg {
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    // + 1024: the dynamic shared memory base is only 16-byte aligned; the 128-byte swizzle wants 1024
    static constexpr size_t SMEM = (size_t)STAGES * STAGE_BYTES + 2 * STAGES * sizeof(uint64_t) + 1024;
};


// the same box written at this offset into the shared memory of every CTA of the cluster in ctas (a bit per
// rank), completing on the barrier at bar's offset in each of them
__device__ __forceinline__ void tma_load_2d_multicast(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                      uint16_t ctas) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4}], [%2], %5;"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(ctas)
                 : "memory");
}
// an arrival on the barrier at bar's offset in the cluster's CTA of rank `rank` (this one included), with the
// instruction's default semantics (release at CTA scope): r26 had `.release.cluster` here and the clustered
// kernels ran at 0.5-0.7x the plain ones (a cluster-scope release waits for the thread's earlier memory
// operations, the epilogue's global stores included); the slot's reuse is ordered by the barrier itself
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// every thread of every CTA of the cluster: after it, the barriers are initialised everywhere (at the start)
// and no CTA will touch another's shared memory any more (at the end)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}


// 64 x BN: one wgmma; the B slot's BN rows are 128 bytes each in 8-row groups 1024 bytes apart, so one
// descriptor spans all 256 (the accumulators of m64n256 are those of two m64n128, columns 0..127 first)
template <int BN> __device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], uint64_t da, uint64_t db, uint32_t sc) {
    static_assert(BN == 128 || BN == 256, "BN");
    if constexpr (BN == 256) wgmma_n256(d, da, db, sc);
    else wgmma_n128(d, da, db, sc);
}

// a consumer warp is done reading a slot: tell the producer of every CTA whose loads write it (lane r of the
// warp signals the CTA of rank r, the arrivals in parallel)
template <int CL> __device__ __forceinline__ void release_slot(uint64_t *bar, int lane) {
    if constexpr (CL == 1) {
        if (lane == 0) mbar_arrive(bar);
    } else if (lane < CL) mbar_arrive_cluster(bar, (uint32_t)lane);
}

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The epilogue of one warpgroup's tile from its accumulators: in each 64-row block, thread (warp, lane) holds
// rows r0 and r0 + 8 of its warp's 16, columns c0 + 8j + {0, 1} (r0 = the block's row of the thread, c0 = the
// tile's column + 2 (lane % 4)); bias, quick_gelu (formula QM), bf16 pairs stored, or f32 pairs added into C.
template <int QM, int EPI, int BN, int MW, typename BiasT>
__device__ __forceinline__ void store_tile(float (&acc)[MW][BN / 2], void *C, int64_t ldc, const BiasT *bias, int M,
                                           int r0, int c0) {
#pragma unroll
    for (int j = 0; j < BN / 8; j++) { // columns outside: one bias load serves every 64-row block
        const int col = c0 + 8 * j;
        float2 b = make_float2(0.0f, 0.0f);
        if constexpr (EPI != KILN_GEMM_TC_NONE) b = bias_pair(bias, col);
#pragma unroll
        for (int mw = 0; mw < MW; mw++) {
            const int r = r0 + mw * 64;
            float v[4] = {acc[mw][4 * j], acc[mw][4 * j + 1], acc[mw][4 * j + 2], acc[mw][4 * j + 3]};
            if constexpr (EPI != KILN_GEMM_TC_NONE) v[0] += b.x, v[1] += b.y, v[2] += b.x, v[3] += b.y;
            if constexpr (EPI == KILN_GEMM_TC_BIAS_QUICK_GELU) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    v[e] = quick_gelu_qm<QM>(v[e]);
            }
            if constexpr (EPI == KILN_GEMM_TC_BIAS_ADD_F32) {
                // the f32 stream: one reduction per pair, done in L2 (r27's load-add-store waited on each load:
                // 239 TFLOP/s at K 1024); each element gets exactly one add, so the result is C + v as before
                float *p0 = (float *)C + (int64_t)r * ldc + col, *p1 = p0 + 8 * ldc;
                if (r < M) asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p0), "f"(v[0]), "f"(v[1]) : "memory");
                if (r + 8 < M) asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p1), "f"(v[2]), "f"(v[3]) : "memory");
            } else {
                bf16 *p0 = (bf16 *)C + (int64_t)r * ldc + col;
                if (r < M) *(__nv_bfloat162 *)p0 = __floats2bfloat162_rn(v[0], v[1]);
                if (r + 8 < M) *(__nv_bfloat162 *)(p0 + 8 * ldc) = __floats2bfloat162_rn(v[2], v[3]);
            }
        }
    }
}


// One kernel, two schedules of the consumers (the producer is the same):
//  - cooperative (PP false): both consumer warpgroups work on every tile of the CTA, 64 of its BM = 128 rows
//    each; they read the same B slot (one load of B for 128 rows). Their epilogues run together, with the
//    tensor cores idle meanwhile.
//  - ping-pong (PP true): the consumer warpgroups take the CTA's tiles in turn (tile i: warpgroup i % 2), all
//    BM rows each (BM / 64 MMAs per K step). A named barrier hands the tensor cores over: warpgroup i % 2
//    starts tile i's MMAs only once tile i-1's were all issued, so one warpgroup's epilogue (bias,
//    quick_gelu's MUFU work, stores) runs under the other's MMAs. The handover also keeps a waiter within one
//    ring pass of the producer (an mbarrier parity wait two phases ahead would pass wrongly).
// Work is dealt in units of CM x CN tiles (one per CTA of a cluster of CM x CN; 1 x 1: no cluster). The CTAs
// of a unit that share a row block of A (the same rank % CM) each load 1/CN of it and multicast it to all of
// them, and those sharing a column block of B (the same rank / CM) 1/CM of B, so L2 serves each operand once
// per unit instead of once per CTA (r26: the plain kernels moved ~8.3-8.5 TB/s out of L2 whatever the tile,
// i.e. they are bound by that read). A slot is free again only when the consumers of every CTA that writes
// into it have released it: each consumer warp arrives on the `empty` barrier of every CTA of the cluster.
// Tile i of the CTA (unit blockIdx.x / CL + i * gridDim.x / CL) uses ring iterations i * KB .. i * KB + KB - 1
// in every schedule, so producer and consumers agree on slots and parities without sharing counters.
// QM: the held tiles' quick_gelu formula, a template parameter (one drain switch a kernel: the formulas as
// run-time branches in one kernel spilled registers); the other tiles choose theirs from qmode once per tile.
template <int BM, int BN, int STAGES, bool PP, int CM, int CN, bool DEFER, int EPI, typename BiasT, int QM>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_tc_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b, void *C,
                   int64_t ldc, const BiasT *bias, int M, int N, int K, int qmode) {
    typedef Cfg<BM, BN, STAGES> cfg;
    constexpr int WG_ROWS = PP ? BM : BM / 2, MW = WG_ROWS / 64; // rows per consumer warpgroup, its m64 MMAs
    static_assert(WG_ROWS % 64 == 0 && MW * BN / 2 <= 128, "accumulators: at most 128 registers a thread");
    constexpr int CL = CM * CN;
    static_assert(CL <= 4 && (BM / CN) % 8 == 0 && (BN / CM) % 8 == 0, "clusters of up to 4 CTAs");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sa = smem, *sb = smem + STAGES * cfg::A_BYTES;
    uint64_t *full = (uint64_t *)(smem + STAGES * cfg::STAGE_BYTES), *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int units_n = N / (CN * BN), units = ((M + CM * BM - 1) / (CM * BM)) * units_n, kblocks = K / BK;
    const int unit0 = blockIdx.x / CL, unit_step = gridDim.x / CL;
    const uint32_t rank = CL > 1 ? cluster_rank() : 0, rm = rank % CM, rn = rank / CM;
    // the CTAs sharing this one's A rows (rank % CM == rm) and B columns (rank / CM == rn)
    uint16_t a_ctas = 0, b_ctas = 0;
    for (int j = 0; j < CN; j++) a_ctas |= (uint16_t)(1u << (rm + CM * j));
    for (int j = 0; j < CM; j++) b_ctas |= (uint16_t)(1u << (j + CM * rn));

    if (threadIdx.x == 0) {
        // empty: one arrival per consumer warp that reads the slot, in every CTA the slot's loads write
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], (PP ? 4 : 8) * CL);
        // the barriers' initialisation visible to the other threads and to the TMA unit (async proxy)
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CL > 1) cluster_sync();
    else __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tma_a) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tma_b) : "memory");
            uint32_t it = 0;
            for (int u = unit0; u < units; u += unit_step) {
                const int m0 = (u / units_n) * CM * BM + (int)rm * BM, n0 = ((u % units_n) * CN + (int)rn) * BN;
                for (int kb = 0; kb < kblocks; kb++, it++) {
                    const int s = it % STAGES;
                    mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                    mbar_arrive_expect_tx(&full[s], cfg::STAGE_BYTES); // all of A and B, whoever loads them
                    if constexpr (CN > 1) // this CTA's 1/CN of the A rows, into every CTA sharing them
                        tma_load_2d_multicast(sa + s * cfg::A_BYTES + rn * (BM / CN) * 128, &tma_a, &full[s], kb * BK,
                                              m0 + (int)rn * (BM / CN), a_ctas);
                    else tma_load_2d(sa + s * cfg::A_BYTES, &tma_a, &full[s], kb * BK, m0);
                    if constexpr (CM > 1) // its 1/CM of the B columns, likewise
                        tma_load_2d_multicast(sb + s * cfg::B_BYTES + rm * (BN / CM) * 128, &tma_b, &full[s], kb * BK,
                                              n0 + (int)rm * (BN / CM), b_ctas);
                    else tma_load_2d(sb + s * cfg::B_BYTES, &tma_b, &full[s], kb * BK, n0);
                }
            }
        }
        if constexpr (CL > 1) {
            __syncwarp();
            cluster_sync();
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
    // the deferred epilogue takes cooperative 64-row warpgroup tiles with a bf16 output only
    constexpr bool HOLD = DEFER && !PP && MW == 1 && EPI != KILN_GEMM_TC_BIAS_ADD_F32;
    float acc[MW][BN / 2];
    uint32_t held[HOLD ? BN / 4 : 1];
    uint32_t *hp0 = NULL, *hp1 = NULL; // the held tile's rows r0 and r0 + 8 (NULL: past M)
    bool holding = false;
    for (int i = PP ? cw : 0;; i += PP ? 2 : 1) {
        const int u = unit0 + i * unit_step;
        if (u >= units) break;
        const int m0 = (u / units_n) * CM * BM + (int)rm * BM, n0 = ((u % units_n) * CN + (int)rn) * BN;
        const bool next = u + unit_step < units;
        if (PP && i > 0) named_bar_sync(1 + cw, 256); // tile i-1's MMAs are all issued
        uint32_t it = (uint32_t)i * (uint32_t)kblocks;
        // chunks of the held tile stored so far; after block kb, ceil(NCH (kb + 1) / kblocks) of them, counted up
        // without a division (session 11 r3: a runtime division a k block sat among the MMA warps' instructions)
        int drained = 0, upto = 0, uk = 0, num = 0; // uk = upto * kblocks, num = NCH * (kb + 1)
        for (int kb = 0; kb < kblocks; kb++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const uint32_t a_addr = smem_u32(sa + s * cfg::A_BYTES + (PP ? 0 : cw * 64 * 128)),
                           b_addr = smem_u32(sb + s * cfg::B_BYTES);
#pragma unroll
            for (int mw = 0; mw < MW; mw++) fence_acc(acc[mw]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) // the first MMA of a tile overwrites the accumulators (scale-d 0)
#pragma unroll
                for (int mw = 0; mw < MW; mw++)
                    wgmma_bn<BN>(acc[mw], sw128_desc(a_addr + mw * 64 * 128 + kk * 32), sw128_desc(b_addr + kk * 32),
                                 kb > 0 || kk > 0);
            wgmma_commit();
#pragma unroll
            for (int mw = 0; mw < MW; mw++) fence_acc(acc[mw]);
            if constexpr (HOLD) {
                // the previous tile's next chunks, while this block's group and the previous one are queued (after
                // wait<1>, as before session 11, only this block's group covered them)
                num += NCH;
                while (uk < num) uk += kblocks, upto++;
                if (holding) drain_held<QM, EPI, BN>(held, hp0, hp1, drained, upto);
                drained = upto;
            }
            // the previous block's group has completed: its slot goes back to the producer(s)
            wgmma_wait<1>();
#pragma unroll
            for (int mw = 0; mw < MW; mw++) fence_acc(acc[mw]);
            if (kb > 0) release_slot<CL>(&empty[(it - 1) % STAGES], lane);
        }
        if (PP && next) named_bar_arrive(1 + (1 - cw), 256); // the other warpgroup may start tile i+1
        wgmma_wait<0>();
#pragma unroll
        for (int mw = 0; mw < MW; mw++) fence_acc(acc[mw]);
        release_slot<CL>(&empty[(it - 1) % STAGES], lane);

        // epilogue: the quick_gelu formula chosen once per launch (KILN_GEMM_TC_QGELU), outside the unrolled loop
        const int r0 = m0 + (PP ? 0 : cw * 64) + warp * 16 + lane / 4, c0 = n0 + 2 * (lane % 4);
        if constexpr (HOLD) {
            hold_tile<EPI, BN>(acc[0], held, bias, c0);
            uint32_t *p = (uint32_t *)((bf16 *)C + (int64_t)r0 * ldc + c0);
            hp0 = r0 < M ? p : NULL, hp1 = r0 + 8 < M ? p + 4 * ldc : NULL;
            holding = true;
        } else if constexpr (EPI == KILN_GEMM_TC_BIAS_QUICK_GELU) {
            if (qmode == 1) store_tile<1, EPI, BN, MW>(acc, C, ldc, bias, M, r0, c0);
            else store_tile<0, EPI, BN, MW>(acc, C, ldc, bias, M, r0, c0);
        } else store_tile<0, EPI, BN, MW>(acc, C, ldc, bias, M, r0, c0);
    }
    if constexpr (HOLD) {
        if (holding) drain_held<QM, EPI, BN>(held, hp0, hp1, 0, NCH);
    }
    if constexpr (CL > 1) cluster_sync();
}

// ---- host side ----

// A persistent grid: one CTA per SM (clusters: as many as can be resident at once, so no CTA waits for
// another's exit), never more CTAs than tiles.
template <int BM, int BN, int STAGES, bool PP, int CM, int CN, bool DEFER, int EPI, typename BiasT>
kiln_error *launch(const CUtensorMap &ta, const CUtensorMap &tb, void *C, int64_t ldc, const void *bias, int M,
                   int N, int K, int qmode, cudaStream_t st) {
    kiln_error *err = NULL;
    int dev = 0, sms = 0, clusters = 0;
    const size_t smem = Cfg<BM, BN, STAGES>::SMEM;
    constexpr int CL = CM * CN;
    const int64_t units = ((int64_t)(M + CM * BM - 1) / (CM * BM)) * (N / (CN * BN));
    auto kern = gemm_tc_kernel<BM, BN, STAGES, PP, CM, CN, DEFER, EPI, BiasT, 0>;
    if constexpr (DEFER && EPI == KILN_GEMM_TC_BIAS_QUICK_GELU) {
        if (qmode == 1) kern = gemm_tc_kernel<BM, BN, STAGES, PP, CM, CN, DEFER, EPI, BiasT, 1>;
    }
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    memset(&cfg, 0, sizeof cfg);
    cfg.blockDim = dim3(THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = CL > 1; // a plain launch without clusters
    if (CL > 1) {
        cfg.gridDim = dim3((unsigned)(sms / CL * CL), 1, 1);
        CUDA_TRY(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
        if (clusters < 1) {
            err = kiln_errorf(KILN_EUNSUPPORTED, "no cluster of %d CTAs with %zu bytes of shared memory fits", CL, smem);
            goto done;
        }
    } else clusters = sms;
    cfg.gridDim = dim3((unsigned)((units < clusters ? units : clusters) * CL), 1, 1);
    {
        static int said; // once per kernel (KILN_LOG=debug): the grid it gets
        if (!said && kiln_log_enabled(KILN_LOG_DEBUG)) {
            said = 1;
            kiln_log(KILN_LOG_DEBUG, "gemm_tc %dx%d %s%s cluster %dx%d, %d stages, %zu B shared: %u CTAs for %lld units (%d SMs)",
                     BM, BN, PP ? "ping-pong" : "cooperative", DEFER ? " deferred" : "",
                     CM, CN, STAGES, smem,
                     cfg.gridDim.x, (long long)units, sms);
        }
    }
    CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, ta, tb, C, ldc, (const BiasT *)bias, M, N, K, qmode));
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}

template <int BM, int BN, int STAGES, bool PP, int CM, int CN, bool D>
kiln_error *dispatch(const CUtensorMap &ta, const CUtensorMap &tb, void *C, int64_t ldc, kiln_gemm_tc_epilogue epi,
                     const void *bias, int bias_f32, int M, int N, int K, int qmode, cudaStream_t st) {
#define GEMM_TC_L(E, T) launch<BM, BN, STAGES, PP, CM, CN, D, E, T>(ta, tb, C, ldc, bias, M, N, K, qmode, st)
    switch (epi) {
    case KILN_GEMM_TC_NONE: return GEMM_TC_L(KILN_GEMM_TC_NONE, float);
    case KILN_GEMM_TC_BIAS: return bias_f32 ? GEMM_TC_L(KILN_GEMM_TC_BIAS, float) : GEMM_TC_L(KILN_GEMM_TC_BIAS, bf16);
    case KILN_GEMM_TC_BIAS_QUICK_GELU:
        return bias_f32 ? GEMM_TC_L(KILN_GEMM_TC_BIAS_QUICK_GELU, float) : GEMM_TC_L(KILN_GEMM_TC_BIAS_QUICK_GELU, bf16);
    case KILN_GEMM_TC_BIAS_ADD_F32: return GEMM_TC_L(KILN_GEMM_TC_BIAS_ADD_F32, float);
    }
#undef GEMM_TC_L
    return kiln_errorf(KILN_EINVAL, "unknown epilogue %d", (int)epi);
}

int misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

// the columns of C one unit of a tile covers (a cluster of 2 x 2 covers two tiles' columns)
int tile_cols(kiln_gemm_tc_tile t) {
    switch (t) {
    case KILN_GEMM_TC_TILE_128x256:
    case KILN_GEMM_TC_TILE_PP_64x256:
    case KILN_GEMM_TC_TILE_128x256_C2:
    case KILN_GEMM_TC_TILE_PP_128x128_C2x2:
    case KILN_GEMM_TC_TILE_128x256_D:
    case KILN_GEMM_TC_TILE_128x256_C2_D: return 256;
    case KILN_GEMM_TC_TILE_128x256_C2x2_D: return 512;
    default: return 128;
    }
}

// AUTO, from CLIP's shapes (K 1024, N 1024/3072/4096, M 16448 and 32896; TFLOP/s; session 11 run r4 unless said):
//  - bf16 out (bias + quick_gelu, bias, none): the deferred cooperative 128x256, in 2-CTA clusters sharing B where
//    N > 1024 (N 4096 with quick_gelu: 643 / 654 against 634 / 647 alone; N 3072 649 / 640; with the bias 705 / 717
//    against 685 / 700), alone at N 1024 (618 against 602 in pairs with quick_gelu, 674 against 651 with the bias).
//    With quick_gelu it replaced the ping-pong 128x128 (573 / 580): L/14's tower 3,306-3,355 img/s against
//    3,176-3,214 (r4).
//  - f32 accumulation: ping-pong 128x128 in 2-CTA clusters (the deferred tiles accumulate immediately, like the
//    cooperative ones r29 timed at 418 against 488).
// KILN_GEMM_TC_TILE (read at every call) picks another for timing whole workloads: 128x128, 128x256, pp128x128,
// pp64x256, 128x256c2, pp128x128c2, pp128x128c2x2, 128x256d, 128x256c2d, 128x256c2x2d;
// one whose columns do not divide N falls back to ping-pong 128x128.
kiln_gemm_tc_tile auto_tile(int64_t N, kiln_gemm_tc_epilogue epi) {
    static const struct {
        const char *name;
        kiln_gemm_tc_tile tile;
    } names[] = {{"128x128", KILN_GEMM_TC_TILE_128x128},           {"128x256", KILN_GEMM_TC_TILE_128x256},
                 {"pp128x128", KILN_GEMM_TC_TILE_PP_128x128},      {"pp64x256", KILN_GEMM_TC_TILE_PP_64x256},
                 {"128x256c2", KILN_GEMM_TC_TILE_128x256_C2},      {"pp128x128c2", KILN_GEMM_TC_TILE_PP_128x128_C2},
                 {"pp128x128c2x2", KILN_GEMM_TC_TILE_PP_128x128_C2x2}, {"128x256d", KILN_GEMM_TC_TILE_128x256_D},
                 {"128x256c2d", KILN_GEMM_TC_TILE_128x256_C2_D},   {"128x256c2x2d", KILN_GEMM_TC_TILE_128x256_C2x2_D}};
    const char *e = getenv("KILN_GEMM_TC_TILE");
    static int warned;
    kiln_gemm_tc_tile t = epi == KILN_GEMM_TC_BIAS_ADD_F32 ? KILN_GEMM_TC_TILE_PP_128x128_C2
                          : N > 1024                         ? KILN_GEMM_TC_TILE_128x256_C2_D
                                                             : KILN_GEMM_TC_TILE_128x256_D;
    if (e && *e) {
        size_t i = 0;
        while (i < sizeof names / sizeof names[0] && strcmp(e, names[i].name)) i++;
        if (i < sizeof names / sizeof names[0]) t = names[i].tile;
        else if (!warned) warned = 1, kiln_log(KILN_LOG_WARN, "KILN_GEMM_TC_TILE=%s is not a tile: the default", e);
    }
    return N % tile_cols(t) ? KILN_GEMM_TC_TILE_PP_128x128 : t;
}

// quick_gelu's formula in the epilogue: tanh (one MUFU operation), the default since session 17, or
// KILN_GEMM_TC_QGELU=exact (ex2 + rcp on the MUFU). The deferred pair tile at M 32896, N 4096: exact 656-660, tanh
// 689-692 TFLOP/s (sessions 11, 17). L/14's tower, alternating on one lease: +1% (session 11), +0% (12), +0.6-0.9%
// (14), +1.3% and +1.4% (17: 3,459 against 3,415 and 3,366 against 3,319 img/s, three rounds each). Embeddings
// against fp32: L/14 1.22e-2 against the exact formula's 1.14e-2, B/32 9.17e-3 against 9.73e-3, both below the
// peer's bf16 (1.36e-2, 1.02e-2). Session 10's ping-pong tile with tanh on the f32 accumulators (not a default tile
// any more) gave B/32 1.17e-2. A bf16x2 tanh on the held pairs (session 17, `tanh2`: four instructions a pair)
// was no faster (661 TFLOP/s, the held kernels spilled) and 1.9x over the kernel tests' tolerance: not kept.
int qmode_env(void) {
    const char *e = getenv("KILN_GEMM_TC_QGELU");
    return !(e && !strcmp(e, "exact"));
}

} // namespace

static pthread_once_t encode_once = PTHREAD_ONCE_INIT;
static PFN_cuTensorMapEncodeTiled_v12000 encode_fn;
static cudaError_t encode_err;
static cudaDriverEntryPointQueryResult encode_q;

static void encode_load(void) {
    void *fn = NULL;
    encode_err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &encode_q);
    if (encode_err == cudaSuccess && encode_q == cudaDriverEntryPointSuccess) encode_fn = (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

// the bf16 tensor map of rank 2 ([rows, cols]) or 3 (batch such matrices rows * ld elements apart)
static kiln_error *tma_map(void *map, cuuint32_t rank, const kiln_bf16 *p, int64_t batch, int64_t rows, int64_t cols,
                           int64_t ld, int box_rows, const char *name) {
    pthread_once(&encode_once, encode_load);
    if (!encode_fn)
        return kiln_errorf(KILN_EUNSUPPORTED, "cuTensorMapEncodeTiled is not available from the driver (%s, query %d)",
                           cudaGetErrorString(encode_err), (int)encode_q);
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)batch},
                     strides[2] = {(cuuint64_t)ld * 2, (cuuint64_t)(ld * rows) * 2};
    const cuuint32_t box[3] = {BK, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    const CUresult r = encode_fn((CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, (void *)p, dims, strides,
                                 box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kiln_errorf(KILN_EINVAL, "cuTensorMapEncodeTiled(%s: %lld x %lld x %lld, ld %lld, box %d x %d): CUresult %d",
                           name, (long long)batch, (long long)rows, (long long)cols, (long long)ld, box_rows, BK, (int)r);
    return NULL;
}

extern "C" int kiln_wgmma_device_ok(size_t smem) {
    int dev, major, optin;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major != 9 ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return smem <= (size_t)optin;
}

extern "C" kiln_error *kiln_tma_map_bf16(void *map, const kiln_bf16 *p, int64_t rows, int64_t cols, int64_t ld,
                                         int box_rows, const char *name) {
    return tma_map(map, 2, p, 1, rows, cols, ld, box_rows, name);
}

extern "C" kiln_error *kiln_tma_map_bf16_3d(void *map, const kiln_bf16 *p, int64_t batch, int64_t rows, int64_t cols,
                                            int64_t ld, int box_rows, const char *name) {
    return tma_map(map, 3, p, batch, rows, cols, ld, box_rows, name);
}

extern "C" kiln_error *kiln_gemm_tc_tile_cuda(kiln_gemm_tc_tile tile, int64_t M, int64_t N, int64_t K, const kiln_bf16 *A,
                                              int64_t lda, const kiln_bf16 *B, int64_t ldb, void *C, int64_t ldc,
                                              kiln_gemm_tc_epilogue epi, const void *bias, int bias_f32, void *stream) {
    kiln_error *err = NULL;
    CUtensorMap ta, tb;
    const int64_t lim = (int64_t)1 << 31;
    if (tile == KILN_GEMM_TC_TILE_AUTO) tile = auto_tile(N, epi);
    // the block tile: rows bm x columns bn per CTA; clusters of cm x cn CTAs (A's box: bm / cn rows, B's: bn / cm)
    const int cn = tile == KILN_GEMM_TC_TILE_PP_128x128_C2x2 || tile == KILN_GEMM_TC_TILE_128x256_C2x2_D ? 2 : 1,
              bn = tile_cols(tile) / cn;
    const int bm = tile == KILN_GEMM_TC_TILE_PP_64x256 ? 64 : 128;
    const int cm = tile == KILN_GEMM_TC_TILE_128x256_C2 || tile == KILN_GEMM_TC_TILE_PP_128x128_C2 ||
                           tile == KILN_GEMM_TC_TILE_PP_128x128_C2x2 || tile == KILN_GEMM_TC_TILE_128x256_C2_D ||
                           tile == KILN_GEMM_TC_TILE_128x256_C2x2_D
                       ? 2
                       : 1;
    if (M < 0 || N <= 0 || K <= 0 || M >= lim || N >= lim || K >= lim)
        err = kiln_errorf(KILN_EINVAL, "sizes M %lld, N %lld, K %lld out of range", (long long)M, (long long)N, (long long)K);
    else if (K % BK)
        err = kiln_errorf(KILN_EINVAL, "K = %lld is not a multiple of %d", (long long)K, BK);
    else if (N % (bn * cn))
        err = kiln_errorf(KILN_EINVAL, "N = %lld is not a multiple of the tile's %d columns", (long long)N, bn * cn);
    else if (lda < K || ldb < K || ldc < N || lda % 8 || ldb % 8 || ldc % 8)
        err = kiln_errorf(KILN_EINVAL, "strides lda %lld, ldb %lld, ldc %lld: need >= K (A, B), >= N (C), multiples of 8",
                          (long long)lda, (long long)ldb, (long long)ldc);
    else if (misaligned(A, 16) || misaligned(B, 16) || misaligned(C, 16))
        err = kiln_errorf(KILN_EINVAL, "A, B and C must be 16-byte aligned");
    else if ((epi != KILN_GEMM_TC_NONE) != (bias != NULL))
        err = kiln_errorf(KILN_EINVAL, "epilogue %d %s", (int)epi, bias ? "takes no bias" : "needs a bias");
    else if (epi == KILN_GEMM_TC_BIAS_ADD_F32 && !bias_f32)
        err = kiln_errorf(KILN_EINVAL, "the f32 accumulating epilogue takes an f32 bias");
    else if (bias && misaligned(bias, bias_f32 ? 8 : 4))
        err = kiln_errorf(KILN_EINVAL, "the bias must be aligned to two of its elements");
    if (err || M == 0) goto done;
    if ((err = kiln_tma_map_bf16(&ta, A, M, K, lda, bm / cn, "A")) || (err = kiln_tma_map_bf16(&tb, B, N, K, ldb, bn / cm, "B"))) goto done;
#define GEMM_TC_RUN(BM_, BN_, S_, PP_, CM_, CN_, D_) \
    dispatch<BM_, BN_, S_, PP_, CM_, CN_, D_>(ta, tb, C, ldc, epi, bias, bias_f32, (int)M, (int)N, (int)K, qmode_env(), \
                                              (cudaStream_t)stream)
    // stages: 192 KB of slots, within the 227 KB a CTA may have (the 2-CTA ping-pong with 7, 224 KB, was no faster
    // in r28: 625 / 512 TFLOP/s with the bias / quick_gelu against r27's 630 / 531 with 6)
    switch (tile) {
    case KILN_GEMM_TC_TILE_PP_128x128: err = GEMM_TC_RUN(128, 128, 6, true, 1, 1, false); break;
    case KILN_GEMM_TC_TILE_PP_64x256: err = GEMM_TC_RUN(64, 256, 5, true, 1, 1, false); break;
    case KILN_GEMM_TC_TILE_128x256_C2: err = GEMM_TC_RUN(128, 256, 4, false, 2, 1, false); break;
    case KILN_GEMM_TC_TILE_PP_128x128_C2: err = GEMM_TC_RUN(128, 128, 6, true, 2, 1, false); break;
    case KILN_GEMM_TC_TILE_PP_128x128_C2x2: err = GEMM_TC_RUN(128, 128, 6, true, 2, 2, false); break;
    case KILN_GEMM_TC_TILE_128x256_D: err = GEMM_TC_RUN(128, 256, 4, false, 1, 1, true); break;
    case KILN_GEMM_TC_TILE_128x256_C2_D: err = GEMM_TC_RUN(128, 256, 4, false, 2, 1, true); break;
    case KILN_GEMM_TC_TILE_128x256_C2x2_D: err = GEMM_TC_RUN(128, 256, 4, false, 2, 2, true); break;
    default: err = bn == 256 ? GEMM_TC_RUN(128, 256, 4, false, 1, 1, false) : GEMM_TC_RUN(128, 128, 6, false, 1, 1, false); break;
    }
#undef GEMM_TC_RUN
done:
    return err ? kiln_error_wrap(err, "kiln_gemm_tc_cuda %lldx%lldx%lld", (long long)M, (long long)N, (long long)K) : NULL;
}

extern "C" kiln_error *kiln_gemm_tc_cuda(int64_t M, int64_t N, int64_t K, const kiln_bf16 *A, int64_t lda,
                                         const kiln_bf16 *B, int64_t ldb, void *C, int64_t ldc,
                                         kiln_gemm_tc_epilogue epi, const void *bias, int bias_f32, void *stream) {
    return kiln_gemm_tc_tile_cuda(KILN_GEMM_TC_TILE_AUTO, M, N, K, A, lda, B, ldb, C, ldc, epi, bias, bias_f32, stream);
}
