// The grouped convolution's three GEMMs (forward, input gradient, weight gradient) on tensor cores: WMMA
// TF32 16x16x8 with each f32 operand split as hi + lo (both TF32) and the products hi*hi + hi*lo + lo*hi
// accumulated in f32 ("3xTF32"), which keeps f32-level accuracy (the dropped lo*lo term is ~2^-22
// relative) at a fraction of the SIMT FMA time. Same tiles and the same K order as the SIMT kernels of
// cca_conv.cu; included there only.
#include <mma.h>
#include "launch.cuh"

namespace tc {
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fa_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb_row;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> facc;

template <typename F> static __device__ __forceinline__ void split(F &hi, F &lo) {
#pragma unroll
    for (int i = 0; i < hi.num_elements; i++) {
        const float v = hi.x[i], h = wmma::__float_to_tf32(v);
        hi.x[i] = h;
        lo.x[i] = wmma::__float_to_tf32(v - h);
    }
}
template <typename FA> static __device__ __forceinline__ void mma3(facc &c, FA &ah, FA &al, fb_row &bh, fb_row &bl) {
    wmma::mma_sync(c, al, bh, c);
    wmma::mma_sync(c, ah, bl, c);
    wmma::mma_sync(c, ah, bh, c);
}

#define TCT 64 // output tile
#define TCK 32 // K per step
#define LDA (TCK + 4)
#define LDB (TCT + 4)
#define LDC (TCT + 4)
static_assert(TCT == GT && TCK == GK && TCT == WT && TCK == KT, "grp_tile / dw1_tile stage the SIMT kernels' tiles");

// The operands of 8 of a K step for a warp's 32 x 32 quarter of the tile, split hi + lo: A fragment i at a(i)
// (row-major FA: [rows x K], column-major: [K x rows]), pitch lda; B fragment j at sb + j * 16 (pitch LDB).
// The MMAs stay in the kernels: a helper holding the accumulators changed their register order in the PTX and
// ptxas's allocation (gemm_kernel<0>: 126 -> 128 registers).
template <typename FA, typename AT>
static __device__ __forceinline__ void load_k8(FA (&ah)[2], FA (&al)[2], fb_row (&bh)[2], fb_row (&bl)[2], AT a,
                                               int lda, const float *sb) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        wmma::load_matrix_sync(ah[i], a(i), lda);
        split(ah[i], al[i]);
        wmma::load_matrix_sync(bh[i], sb + i * 16, LDB);
        split(bh[i], bl[i]);
    }
}

// MODE 0 forward (y bf16), MODE 1 input gradient (dmid f32); grid as grp_gemm_kernel; 128 threads = 4 warps,
// each a 32 x 32 quarter of the tile
template <int MODE>
static __global__ void __launch_bounds__(128)
    gemm_kernel(void *out, const float *mid, const bf16 *dy, const float *w1, const float *b1, kiln_conv_shape s) {
    pdl_wait();
    __shared__ __align__(32) float smem[TCT * LDC > TCT * LDA + TCK * LDB ? TCT * LDC : TCT * LDA + TCK * LDB];
    __shared__ int tj[TCK], tc[TCK];
    float *sa = smem, *sw = smem + TCT * LDA, *sc = smem;
    const grp_tile<MODE> g(mid, dy, w1, s);
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    facc acc[2][2];
    wmma_zero(acc);
    for (int k0 = 0; k0 < g.K; k0 += TCK) {
        g.stage(k0, tj, tc, sa, LDA, sw, LDB, 128);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TCK; kk += 8) {
            fa_row ah[2], al[2];
            fb_row bh[2], bl[2];
            const auto a = [&](int i) { return sa + (wy * 32 + i * 16) * LDA + kk; };
            load_k8(ah, al, bh, bl, a, LDA, sw + kk * LDB + wx * 32);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) mma3(acc[i][j], ah[i], al[i], bh[j], bl[j]);
        }
        __syncthreads();
    }
    wmma_store_tile<LDC>(sc, acc, wy, wx);
    for (int e = threadIdx.x; e < TCT * TCT; e += 128) {
        const int rr = e / TCT, nl = e % TCT, r = g.r0 + rr, n = g.n0 + nl;
        if (r >= g.R || n >= g.cg) continue;
        // (not grp_tile::put: its per-block base pointer, hoisted, would live through the K loop here)
        if (MODE == 0)
            ((bf16 *)out)[(g.b * g.T + r) * g.C + g.g0 + n] = __float2bfloat16_rn(b1[g.g0 + n] + sc[rr * LDC + nl]);
        else ((float *)out)[(g.b * g.M + r) * g.C + g.g0 + n] = sc[rr * LDC + nl];
    }
}

// dw1 partials, grid and output as grp_bwd_w_kernel: out[co, col] over the chunk's steps = dyᵀ (M x K,
// staged K x M: a column-major A) times mid shifted (K x N)
static __global__ void __launch_bounds__(128)
    dw1_kernel(float *part, const bf16 *dy, const float *mid, kiln_conv_shape s, int64_t chunks_per_seq) {
    pdl_wait();
    __shared__ __align__(32) float smem[2 * TCK * LDB > TCT * LDC ? 2 * TCK * LDB : TCT * LDC];
    __shared__ int moff[TCT];
    float *sdy = smem, *smid = smem + TCK * LDB, *sc = smem;
    const dw1_tile w(dy, mid, s, chunks_per_seq);
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    w.offsets(moff);
    facc acc[2][2];
    wmma_zero(acc);
    __syncthreads();
    for (int ts = w.t0; ts < w.t1; ts += TCK) {
        w.stage(ts, moff, sdy, smid, LDB, 128);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TCK; kk += 8) {
            fa_col ah[2], al[2];
            fb_row bh[2], bl[2];
            const auto a = [&](int i) { return sdy + kk * LDB + wy * 32 + i * 16; };
            load_k8(ah, al, bh, bl, a, LDB, smid + kk * LDB + wx * 32);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) mma3(acc[i][j], ah[i], al[i], bh[j], bl[j]);
        }
        __syncthreads();
    }
    wmma_store_tile<LDC>(sc, acc, wy, wx);
    for (int e = threadIdx.x; e < TCT * TCT; e += 128) {
        const int rr = e / TCT, cl = e % TCT, co = w.co0 + rr, col = w.col0 + cl;
        if (co < w.cg && col < w.nc) part[w.chunk * w.ne + (w.g0 + co) * w.nc + col] = sc[rr * LDC + cl];
    }
}
} // namespace tc
