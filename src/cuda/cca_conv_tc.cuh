// The grouped convolution's three GEMMs (forward, input gradient, weight gradient) on tensor cores: WMMA
// TF32 16x16x8 with each f32 operand split as hi + lo (both TF32) and the products hi*hi + hi*lo + lo*hi
// accumulated in f32 ("3xTF32"), which keeps f32-level accuracy (the dropped lo*lo term is ~2^-22
// relative) at a fraction of the SIMT FMA time. Same tiles and the same K order as the SIMT kernels of
// cca_conv.cu; included there only.
#include <mma.h>

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

// MODE 0 forward (y bf16), MODE 1 input gradient (dmid f32); grid as grp_gemm_kernel; 128 threads = 4 warps,
// each a 32 x 32 quarter of the tile
template <int MODE>
static __global__ void __launch_bounds__(128)
    gemm_kernel(void *out, const float *mid, const bf16 *dy, const float *w1, const float *b1, kiln_conv_shape s) {
    __shared__ __align__(32) float smem[TCT * LDC > TCT * LDA + TCK * LDB ? TCT * LDC : TCT * LDA + TCK * LDB];
    __shared__ int tj[TCK], tc[TCK];
    float *sa = smem, *sw = smem + TCT * LDA, *sc = smem;
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = (int)(s.C / s.groups), K = cg * k1;
    const int R = MODE == 0 ? T : M, r0 = blockIdx.x * TCT, n0 = blockIdx.y * TCT;
    const int64_t b = blockIdx.z / s.groups, g0 = (blockIdx.z % s.groups) * (int64_t)cg;
    const float *midb = MODE == 0 ? mid + b * M * C + g0 : NULL;
    const bf16 *dyb = MODE == 1 ? dy + b * T * C + g0 : NULL;
    const float *wg = w1 + g0 * cg * k1;
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    facc acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += TCK) {
        if (threadIdx.x < TCK) {
            const int kk = k0 + threadIdx.x;
            tj[threadIdx.x] = kk < K ? kk / cg : -1;
            tc[threadIdx.x] = kk < K ? kk % cg : 0;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < TCT * TCK; e += 128) {
            const int rr = e / TCK, kl = e % TCK, r = r0 + rr, j = tj[kl], c = tc[kl];
            float v = 0.0f;
            if (r < R && j >= 0) {
                if (MODE == 0) v = midb[(r + j) * C + c];
                else if (r - j >= 0 && r - j < T) v = __bfloat162float(dyb[(r - j) * C + c]);
            }
            sa[rr * LDA + kl] = v;
        }
        for (int e = threadIdx.x; e < TCT * TCK; e += 128) {
            const int kl = MODE == 0 ? e % TCK : e / TCT, nl = MODE == 0 ? e / TCK : e % TCT;
            const int n = n0 + nl, j = tj[kl], c = tc[kl];
            float v = 0.0f;
            if (j >= 0 && n < cg) v = MODE == 0 ? wg[(n * cg + c) * k1 + j] : wg[(c * cg + n) * k1 + j];
            sw[kl * LDB + nl] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TCK; kk += 8) {
            fa_row ah[2], al[2];
            fb_row bh[2], bl[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(ah[i], sa + (wy * 32 + i * 16) * LDA + kk, LDA);
                split(ah[i], al[i]);
                wmma::load_matrix_sync(bh[i], sw + kk * LDB + wx * 32 + i * 16, LDB);
                split(bh[i], bl[i]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) mma3(acc[i][j], ah[i], al[i], bh[j], bl[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(sc + (wy * 32 + i * 16) * LDC + wx * 32 + j * 16, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < TCT * TCT; e += 128) {
        const int rr = e / TCT, nl = e % TCT, r = r0 + rr, n = n0 + nl;
        if (r >= R || n >= cg) continue;
        if (MODE == 0) ((bf16 *)out)[(b * T + r) * C + g0 + n] = __float2bfloat16_rn(b1[g0 + n] + sc[rr * LDC + nl]);
        else ((float *)out)[(b * M + r) * C + g0 + n] = sc[rr * LDC + nl];
    }
}

// dw1 partials, grid and output as grp_bwd_w_kernel: out[co, col] over the chunk's steps = dyᵀ (M x K,
// staged K x M: a column-major A) times mid shifted (K x N)
static __global__ void __launch_bounds__(128)
    dw1_kernel(float *part, const bf16 *dy, const float *mid, kiln_conv_shape s, int64_t chunks_per_seq) {
    __shared__ __align__(32) float smem[2 * TCK * LDB > TCT * LDC ? 2 * TCK * LDB : TCT * LDC];
    __shared__ int moff[TCT];
    float *sdy = smem, *smid = smem + TCK * LDB, *sc = smem;
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = (int)(s.C / s.groups), nc = cg * k1;
    const int64_t ne = s.C * nc;
    const int col_tiles = (nc + TCT - 1) / TCT, co0 = (blockIdx.x / col_tiles) * TCT, col0 = (blockIdx.x % col_tiles) * TCT;
    const int64_t chunk = blockIdx.y, b = chunk / chunks_per_seq;
    const int t0 = (int)(chunk % chunks_per_seq) * CHUNK_T, t1 = t0 + CHUNK_T < T ? t0 + CHUNK_T : T;
    const int64_t g0 = (int64_t)blockIdx.z * cg;
    const bf16 *dyb = dy + b * T * C + g0;
    const float *midb = mid + b * M * C + g0;
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    if (threadIdx.x < TCT) {
        const int col = col0 + threadIdx.x;
        moff[threadIdx.x] = col < nc ? (col % k1) * C + col / k1 : -1;
    }
    facc acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    __syncthreads();
    for (int ts = t0; ts < t1; ts += TCK) {
        for (int e = threadIdx.x; e < TCK * TCT; e += 128) {
            const int kt = e / TCT, c = e % TCT, t = ts + kt, co = co0 + c, off = moff[c];
            sdy[kt * LDB + c] = t < t1 && co < cg ? __bfloat162float(dyb[t * C + co]) : 0.0f;
            smid[kt * LDB + c] = t < t1 && off >= 0 ? midb[t * C + off] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TCK; kk += 8) {
            fa_col ah[2], al[2];
            fb_row bh[2], bl[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(ah[i], sdy + kk * LDB + wy * 32 + i * 16, LDB);
                split(ah[i], al[i]);
                wmma::load_matrix_sync(bh[i], smid + kk * LDB + wx * 32 + i * 16, LDB);
                split(bh[i], bl[i]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) mma3(acc[i][j], ah[i], al[i], bh[j], bl[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(sc + (wy * 32 + i * 16) * LDC + wx * 32 + j * 16, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < TCT * TCT; e += 128) {
        const int rr = e / TCT, cl = e % TCT, co = co0 + rr, col = col0 + cl;
        if (co < cg && col < nc) part[chunk * ne + (g0 + co) * nc + col] = sc[rr * LDC + cl];
    }
}
} // namespace tc
