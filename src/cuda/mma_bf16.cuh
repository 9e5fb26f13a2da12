/* The warp-level tensor-core primitives of kiln's own attention kernels (src/cuda/attention_mma.cu for the
 * trainer, src/cuda/clip_attention.cu for CLIP): ldmatrix loads of bf16 fragments from shared memory,
 * the m16n8k16 bf16 MMA with f32 accumulators, and cp.async tile loads that stream the next tile in while
 * the current one is computed. Internal to the CUDA files (sm_80 and later). */
#ifndef KILN_CUDA_MMA_BF16_CUH
#define KILN_CUDA_MMA_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// four 8x8 b16 matrices from shared memory (each lane gives one row address)
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// the same, transposed
static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// the A fragments of rows row0 .. row0 + 15 (all K columns) of a row-major tile in shared memory (row stride ld),
// for a warp that keeps them in registers across several MMAs
template <int K>
static __device__ __forceinline__ void ldsm_a16(uint32_t (&af)[K / 16][4], const __nv_bfloat16 *As, int row0, int ld) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) ldsm_x4(af[kk], As + (row0 + (lane & 15)) * ld + kk * 16 + (lane >> 4) * 8);
}
// c[16 x 8] += a[16 x 16] b[16 x 8], bf16 in, f32 accumulators
static __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
// accumulator tiles [16 x K] (f32) -> A fragments [16 x K] (bf16): the C layout of m16n8 tiles 2kk and
// 2kk+1 is the A layout of k-step kk
template <int K>
static __device__ __forceinline__ void pack_a(uint32_t (&pa)[K / 16][4], const float (&s)[K / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}
// max / sum over the four lanes that hold one accumulator row of an m16n8 tile (lanes 4g .. 4g + 3)
static __device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The online-softmax update of one m16 tile for this thread's two rows (r = 0: row g, 1: row g + 8). s holds
// the tile's scores in log2 units (masked keys -INFINITY) and mx this thread's maxima of them; the running
// maxima m, sums l and output o (DN n8 tiles) are moved to the new maxima, and s becomes p = exp2(s - m). With
// EMPTY_ROWS, a row that has seen no visible key yet (causal or windowed masks) keeps p = 0 and its state;
// callers whose every tile holds a visible key for every row leave it out (one select less a row: CLIP's hd 128
// streaming kernel spills 8 bytes with it).
template <int BN, int DN, bool EMPTY_ROWS = true>
static __device__ __forceinline__ void online_softmax_m16(float (&s)[BN / 8][4], float (&mx)[2], float (&m)[2],
                                                          float (&l)[2], float (&o)[DN][4]) {
    float alpha[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = quad_max(mx[r]);
        const float mn = fmaxf(m[r], mx[r]);
        mu[r] = EMPTY_ROWS && mn == -INFINITY ? 0.f : mn;
        alpha[r] = exp2f(m[r] - mu[r]);
        m[r] = mn;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = exp2f(s[nt][e] - mu[e >> 1]);
            s[nt][e] = p;
            rs[e >> 1] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
    for (int dt = 0; dt < DN; dt++) {
        o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
    }
}

template <int N>
static __device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}
// 16 bytes global -> shared without passing through registers; ok == false zero-fills (src is not read)
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// the step of a double-buffered loop: commit the copies just issued (the next tile), wait until only they are in
// flight (the current tile has landed) and make the current tile visible to the whole block
static __device__ __forceinline__ void cp_async_next_tile(void) {
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
}
// ROWS rows of D bf16 from global (row stride `stride` elements) into shared memory (row stride ld) by a
// block of THREADS threads, 16 bytes a copy (D a multiple of 8, 16-byte aligned rows); rows at or past
// nvalid zero-filled. `any` is a valid address given to the copies that read nothing.
template <int D, int ROWS, int THREADS>
static __device__ __forceinline__ void load_tile_async(__nv_bfloat16 *dst, int ld, const __nv_bfloat16 *src,
                                                       int64_t stride, int nvalid, const __nv_bfloat16 *any) {
    constexpr int CH = D / 8;
    for (int e = threadIdx.x; e < ROWS * CH; e += THREADS) {
        const int r = e / CH, c = (e % CH) * 8;
        const bool ok = r < nvalid;
        cp_async16(dst + r * ld + c, ok ? src + r * stride + c : any, ok);
    }
}

#endif
