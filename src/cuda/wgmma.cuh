// Hopper's asynchronous pieces shared by kiln's own wgmma kernels (gemm_tc.cu: the GEMM with fused epilogues;
// cca_conv_wg.cu: CCA's grouped convolution and its weights' gradient; experts_dw_wg.cu: the experts' weight
// gradients; clip_attention.cu): mbarriers, TMA 2-D and 3-D loads into 128-byte-swizzled shared memory, wgmma's
// shared-memory descriptors (K-major, MN-major, unswizzled) and its m64n128k16 / m64n256k16 / m64n8k16 bf16
// instructions with f32 accumulators; the epilogues' bf16 pairs.
// sm_90a only (wgmma, setmaxnreg); the host encodes the tensor maps (kiln_tma_map_bf16, gemm_tc.h).
#ifndef KILN_CUDA_WGMMA_CUH
#define KILN_CUDA_WGMMA_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace kwg {

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// the producer's arrival, announcing the bytes the TMA loads will complete on this barrier
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// wait until the phase of parity `parity` has completed (a fresh barrier counts its "previous" phase, parity
// 1, as complete: the producer's first pass over the ring does not wait)
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t a = smem_u32(bar);
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
// a 2-D box of the tensor map at (c0 = column/K, c1 = row) into shared memory, completing on bar
static __device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
                 : "memory");
}
// a 3-D box at (c0 = column, c1 = row, c2 = matrix of a batch), completing on bar; coordinates out of range (a
// negative row too) read as zeros
static __device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                   int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

// wgmma's shared-memory matrix descriptor for a K-major tile written by TMA with the 128-byte swizzle: rows
// of 128 bytes, 8-row groups 1024 bytes apart (the stride byte offset); the leading byte offset is unused
// for swizzled K-major layouts (set to 1 as the encoding's "none"). Bits: 0-13 address >> 4, 16-29 LBO >> 4,
// 32-45 SBO >> 4, 62-63 swizzle (1 = 128 bytes). The slot is 1024-byte aligned, so the base offset is 0;
// the 16-wide K steps inside the 128-byte row advance the address by 32 bytes.
static __device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma boundaries
template <int R> static __device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// The consumer side of a ring of STAGES slots whose `empty` barriers take one arrival per consumer warp. After the
// wgmma group of K block kb (ring iteration it) is committed: wait until the block before it has completed, and give
// that block's slot back to the producer.
template <int STAGES, int R>
static __device__ __forceinline__ void ring_next(float (&acc)[R], uint64_t *empty, uint32_t it, int kb, int lane) {
    wgmma_wait<1>();
    fence_acc(acc);
    if (kb > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
}
// after a tile's last K block (it: one past its ring iteration): every group completed, the last slot given back
template <int STAGES, int R>
static __device__ __forceinline__ void ring_drain(float (&acc)[R], uint64_t *empty, uint32_t it, int lane) {
    wgmma_wait<0>();
    fence_acc(acc);
    if (lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
}

// wgmma's accumulator operands: the register numbers in the instruction text and the C++ operands beside them
#define WG_REGS_0_63 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_64_127 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_F64(i) WG_F8(i), WG_F8(i + 8), WG_F8(i + 16), WG_F8(i + 24), WG_F8(i + 32), WG_F8(i + 40), WG_F8(i + 48), WG_F8(i + 56)

// D[64 x 128] += A[64 x 16] (smem, K-major) * B[128 x 16]^T (smem, K-major), f32 accumulators
static __device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db, uint32_t scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS_0_63 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_F64(0)
                 : "l"(da), "l"(db), "r"(scale_d)
                 : "memory");
}
// D[64 x 256] += A[64 x 16] * B[256 x 16]^T: one instruction reads A once for 256 columns (two m64n128 read it
// twice: 12 KB of shared memory per 64 x 256 x 16 step instead of 10). MN = 1: both operands MN-major instead
// (imm-trans-a = imm-trans-b = 1; sw128_mn_desc below)
template <int MN = 0>
static __device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db, uint32_t scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_REGS_0_63 ", " WG_REGS_64_127
                 "}, %128, %129, p, 1, 1, %131, %131;\n}\n"
                 : WG_F64(0), WG_F64(64)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(MN)
                 : "memory");
}

// sw128_desc's twin for MN-major operands (the elements contiguous along M or N, as TMA writes a row-major [K][MN]
// box of 64 MN elements): 8-row K groups SBO bytes apart, 64-element MN blocks LBO bytes apart (the canonical layout
// ((8,8,m),(8,k)) : ((1,8,LBO),(64,SBO)) in elements), the 128-byte swizzle
static __device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           ((uint64_t)1 << 62);
}
// an unswizzled operand of 16-byte core rows (LBO between K's core matrices, SBO between MN's)
static __device__ __forceinline__ uint64_t plain_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
// D[64 x 8] += A[64 x 16] (MN-major) * B[8 x 16] (K-major)
static __device__ __forceinline__ void wgmma_n8_mna(float (&d)[4], uint64_t da, uint64_t db, uint32_t scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(scale_d)
                 : "memory");
}

// two f32 as a bf16 pair (round to nearest even), and back (exact: the bits shifted up)
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
static __device__ __forceinline__ float2 unpack_bf16x2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}

} // namespace kwg

#endif
