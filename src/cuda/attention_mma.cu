// The tensor-core path of the attention kernels (head dims 32, 64 and 128), FA2's structure:
//   forward: a block owns 128 query rows (4 warps x 32; 64 rows = 4 x 16 for short sequences) and
//            streams key tiles; S = Q Kᵀ and O += P V run on mma.sync m16n8k16 (bf16 in, f32
//            accumulate) with the online softmax in registers;
//   dK/dV:   a block owns 64 keys of one KV head (4 warps x 16 keys) and streams 32-row query tiles of
//            each of the G query heads in turn: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, dV += Pᵀ dO, dK += dSᵀ Q, all in
//            registers, summed in a fixed order (deterministic without atomics);
//   dQ:      a block owns 64 query rows (their Q and dO fragments held in registers) and streams key
//            tiles: S, dP = dO Vᵀ, dQ += dS K.
// Streamed tiles are double-buffered with cp.async (the next one loads while the current one computes).
// P and dS are rounded to bf16 as mma operands (as flash attention does); every sum is f32. Tiles are
// staged in shared memory with rows padded by 8 bf16 so that ldmatrix reads are conflict-free; tiles
// hidden by the causal mask or the window are never visited.
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_impl.cuh"
#include "cuda_check.h"
#include "mma_bf16.cuh"
#include "launch.cuh"

#define MMA_THREADS 128

// One k-step (columns k0 .. k0 + 15 of A) of acc[16 x N] += A B for A's fragment af, B read from shared memory
// with ldmatrix (one x4 load feeds two m16n8 tiles): B given as Bᵀ [N x K] row-major (BT), or as B [K x N]
// row-major (transposed load).
template <int N, bool BT>
static __device__ __forceinline__ void mma_kstep(float (&acc)[N / 8][4], const uint32_t (&af)[4], const bf16 *Bs,
                                                 int ldb, int k0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n0 = 0; n0 < N; n0 += 16) {
        uint32_t bf[4];
        if constexpr (BT) ldsm_x4(bf, Bs + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ldb + k0 + ((lane >> 3) & 1) * 8);
        else ldsm_x4_t(bf, Bs + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb + n0 + (lane >> 4) * 8);
        mma16816(acc[n0 / 8], af, bf[0], bf[1]);
        mma16816(acc[n0 / 8 + 1], af, bf[2], bf[3]);
    }
}
// acc[16 x N] += A[16 x K] Bᵀ, A the warp's 16 rows at As, B [N x K] at Bs (both row-major in smem).
template <int N, int K>
static __device__ __forceinline__ void warp_mm_abt(float (&acc)[N / 8][4], const bf16 *As, int lda, const bf16 *Bs,
                                                   int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[4];
        ldsm_x4(af, As + (lane & 15) * lda + k0 + (lane >> 4) * 8);
        mma_kstep<N, true>(acc, af, Bs, ldb, k0);
    }
}
// acc[16 x N] += A Bᵀ with A's fragments already in registers (K/16 k-steps)
template <int N, int K>
static __device__ __forceinline__ void warp_mm_rbt(float (&acc)[N / 8][4], const uint32_t (&af)[K / 16][4],
                                                   const bf16 *Bs, int ldb) {
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) mma_kstep<N, true>(acc, af[k0 / 16], Bs, ldb, k0);
}
// acc[16 x N] += P[16 x K] B, P as A fragments in registers, B [K x N] row-major at Bs.
template <int K, int N>
static __device__ __forceinline__ void warp_mm_pb(float (&acc)[N / 8][4], const uint32_t (&pa)[K / 16][4],
                                                  const bf16 *Bs, int ldb) {
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) mma_kstep<N, false>(acc, pa[k0 / 16], Bs, ldb, k0);
}
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0));
}
// ROWS consecutive floats of x and of y (from element off) into smem, zeros past nvalid
template <int ROWS>
static __device__ __forceinline__ void load_rows_async(float *xs, float *ys, const float *x, const float *y, int64_t off,
                                                       int nvalid) {
    const int r = threadIdx.x;
    if (r < ROWS) cp_async4(xs + r, r < nvalid ? x + off + r : x, r < nvalid);
    else if (r < 2 * ROWS) cp_async4(ys + r - ROWS, r - ROWS < nvalid ? y + off + r - ROWS : y, r - ROWS < nvalid);
}
static __device__ __forceinline__ void store_bf16x2(bf16 *p, float lo, float hi) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(lo, hi);
}

// row (this thread's D/8 column pairs of accumulator row r: 0 for g, 1 for g + 8) = acc * mul, rounded to bf16
template <int D>
static __device__ __forceinline__ void store_acc_row(bf16 *row, const float (&acc)[D / 8][4], int r, int t, float mul) {
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
        store_bf16x2(row + dt * 8 + 2 * t, acc[dt][2 * r] * mul, acc[dt][2 * r + 1] * mul);
}
// forward output row i: accumulator row r of o over its softmax sum l (quad-summed), and its lse from the max m
template <int D>
static __device__ __forceinline__ void store_out_row(bf16 *out, float *lse, const AttnDims &a, int b, int h, int i,
                                                     int t, const float (&o)[D / 8][4], int r, float m, float l) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    store_acc_row<D>(out + (((int64_t)b * a.Tq + i) * a.NH + h) * D, o, r, t, inv);
    if (t == 0 && lse) lse[((int64_t)b * a.NH + h) * a.Tq + i] = (m + log2f(l)) * ATT_LN2;
}

// One m16 tile of scores to log2 units, the keys a row may not see -INFINITY (when need_mask), and the maxima of
// this thread's two rows into mx. pos(e): the position of the query row of accumulator element e; each kernel
// keeps its own expression for it (one common expression changed the code ptxas emits for the other kernel).
template <int BN, typename Pos>
static __device__ __forceinline__ void scale_mask_max(float (&s)[BN / 8][4], float (&mx)[2], const AttnDims &a, int j0,
                                                      int t, Pos pos, bool need_mask) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = j0 + nt * 8 + 2 * t + (e & 1);
            float x = s[nt][e] * a.scale_log2;
            if (need_mask && !att_visible(a, pos(e), j)) x = -INFINITY;
            s[nt][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
}
// row 0 of KV head kh of sequence b in x [B, tk_cap, KV, D] (the K and V caches)
template <int D>
static __device__ __forceinline__ const bf16 *kv_head(const bf16 *x, const AttnDims &a, int b, int kh) {
    return x + ((int64_t)b * a.tk_cap * a.KV + kh) * D;
}
// K and V rows j .. j + BN - 1 of one KV head (kb, vb: its row 0; rows >= tk zero) into buffer buf of the
// double-buffered tiles Ks, Vs (2 x BN rows of D + 8 each)
template <int D, int BN>
static __device__ __forceinline__ void load_kv_async(bf16 *Ks, bf16 *Vs, int buf, const bf16 *kb, const bf16 *vb, int j,
                                                     int64_t kstride, int tk, const bf16 *k, const bf16 *v) {
    constexpr int LD = D + 8;
    load_tile_async<D, BN, MMA_THREADS>(Ks + buf * BN * LD, LD, kb + j * kstride, kstride, tk - j, k);
    load_tile_async<D, BN, MMA_THREADS>(Vs + buf * BN * LD, LD, vb + j * kstride, kstride, tk - j, v);
}

// ---- forward: grid (query tiles, NH, B), the last query tiles (the most keys) first ----
template <int D>
static __global__ void __launch_bounds__(MMA_THREADS) attn_fwd_mma(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                                   const bf16 *v, AttnDims a) {
    pdl_wait();
    constexpr int BM = 64, BN = 64, LD = D + 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *Qs = (bf16 *)att_smem, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD; // K, V: two buffers each
    const int b = blockIdx.z, h = blockIdx.y, kh = h / a.G, i0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t qstride = (int64_t)a.NH * D, kstride = (int64_t)a.KV * D;
    load_tile_async<D, BM, MMA_THREADS>(Qs, LD, q + (((int64_t)b * a.Tq + i0) * a.NH + h) * D, qstride, a.Tq - i0, q);

    const AttQBlock qb = att_q_block(a, i0, BM);
    const int r0 = i0 + warp * 16 + g; // this thread's rows: r0 and r0 + 8
    const int p0 = a.q_pos0 + r0, p1 = p0 + 8;

    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero_acc<D / 8>(o);
    const bf16 *kb = kv_head<D>(k, a, b, kh), *vb = kv_head<D>(v, a, b, kh);
    const int jstart = qb.jlo / BN * BN;
    load_kv_async<D, BN>(Ks, Vs, 0, kb, vb, jstart, kstride, a.tk, k, v);
    cp_async_commit();
    uint32_t qf[D / 16][4];
    for (int j0 = jstart, it = 0; j0 <= qb.jhi; j0 += BN, it++) {
        const int cur = it & 1, nj = j0 + BN;
        if (nj <= qb.jhi) load_kv_async<D, BN>(Ks, Vs, cur ^ 1, kb, vb, nj, kstride, a.tk, k, v);
        cp_async_next_tile();
        if (it == 0) ldsm_a16<D>(qf, Qs, warp * 16, LD);
        const bf16 *Kc = Ks + cur * BN * LD, *Vc = Vs + cur * BN * LD;
        float s[BN / 8][4];
        zero_acc<BN / 8>(s);
        warp_mm_rbt<BN, D>(s, qf, Kc, LD);
        // masking is needed only on tiles that reach past the block's first row or into the window edge
        const bool need_mask = j0 + BN - 1 > qb.pmin || (a.window && j0 <= qb.pmax - a.window);
        float mx[2];
        scale_mask_max<BN>(s, mx, a, j0, t, [&](int e) { return e < 2 ? p0 : p1; }, need_mask);
        online_softmax_m16<BN, D / 8>(s, mx, m, l, o);
        uint32_t pa[BN / 16][4];
        pack_a<BN>(pa, s);
        warp_mm_pb<BN, D>(o, pa, Vc, LD);
        __syncthreads(); // everyone is done with buffer cur before the next iteration refills it
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r0 + 8 * r;
        if (i >= a.Tq) continue;
        store_out_row<D>(out, lse, a, b, h, i, t, o, r, m[r], l[r]);
    }
}

// ---- forward with 128-row blocks: each warp owns 32 rows (two m16 tiles), so every K/V fragment read
// from shared memory feeds two mma instead of one. ldmatrix bandwidth, not the tensor cores, bounds the
// 16-row version (64 ldmatrix.x4 per 128 mma); here it is 80 per 256. ----
template <int MT, int N, int K>
static __device__ __forceinline__ void warp_mm_abt_m(float (&acc)[MT][N / 8][4], const bf16 *As, int lda,
                                                     const bf16 *Bs, int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) ldsm_x4(af[mt], As + (mt * 16 + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t bf[4];
            ldsm_x4(bf, Bs + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ldb + k0 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(acc[mt][n0 / 8], af[mt], bf[0], bf[1]);
                mma16816(acc[mt][n0 / 8 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}
template <int MT, int K, int N>
static __device__ __forceinline__ void warp_mm_pb_m(float (&acc)[MT][N / 8][4], const uint32_t (&pa)[MT][K / 16][4],
                                                    const bf16 *Bs, int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t bf[4];
            ldsm_x4_t(bf, Bs + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb + n0 + (lane >> 4) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(acc[mt][n0 / 8], pa[mt][k0 / 16], bf[0], bf[1]);
                mma16816(acc[mt][n0 / 8 + 1], pa[mt][k0 / 16], bf[2], bf[3]);
            }
        }
    }
}

template <int D>
static __global__ void __launch_bounds__(MMA_THREADS) attn_fwd_mma2(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                                    const bf16 *v, AttnDims a) {
    pdl_wait();
    // 32-key tiles at D = 128 keep S, P and O of two m-tiles in 255 registers without spilling
    constexpr int MT = 2, BM = 64 * MT, BN = D == 128 ? 32 : 64, LD = D + 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *Qs = (bf16 *)att_smem, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD; // K, V: two buffers each
    const int b = blockIdx.z, h = blockIdx.y, kh = h / a.G, i0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t qstride = (int64_t)a.NH * D, kstride = (int64_t)a.KV * D;
    load_tile_async<D, BM, MMA_THREADS>(Qs, LD, q + (((int64_t)b * a.Tq + i0) * a.NH + h) * D, qstride, a.Tq - i0, q);

    const AttQBlock qb = att_q_block(a, i0, BM);
    const int r0 = i0 + warp * 16 * MT + g; // this thread's rows: r0 + 16 mt + 8 r
    const int p0 = a.q_pos0 + r0;

    float o[MT][D / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        zero_acc<D / 8>(o[mt]);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }
    const bf16 *kb = kv_head<D>(k, a, b, kh), *vb = kv_head<D>(v, a, b, kh);
    const int jstart = qb.jlo / BN * BN;
    load_kv_async<D, BN>(Ks, Vs, 0, kb, vb, jstart, kstride, a.tk, k, v);
    cp_async_commit();
    for (int j0 = jstart, it = 0; j0 <= qb.jhi; j0 += BN, it++) {
        const int cur = it & 1, nj = j0 + BN;
        if (nj <= qb.jhi) load_kv_async<D, BN>(Ks, Vs, cur ^ 1, kb, vb, nj, kstride, a.tk, k, v);
        cp_async_next_tile();
        const bf16 *Kc = Ks + cur * BN * LD, *Vc = Vs + cur * BN * LD;
        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) zero_acc<BN / 8>(s[mt]);
        warp_mm_abt_m<MT, BN, D>(s, Qs + warp * 16 * MT * LD, LD, Kc, LD);
        const bool need_mask = j0 + BN - 1 > qb.pmin || (a.window && j0 <= qb.pmax - a.window);
        uint32_t pa[MT][BN / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx[2];
            scale_mask_max<BN>(s[mt], mx, a, j0, t, [&](int e) { return p0 + 16 * mt + 8 * (e >> 1); }, need_mask);
            online_softmax_m16<BN, D / 8>(s[mt], mx, m[mt], l[mt], o[mt]);
            pack_a<BN>(pa[mt], s[mt]);
        }
        warp_mm_pb_m<MT, BN, D>(o, pa, Vc, LD);
        __syncthreads(); // everyone is done with buffer cur before the next iteration refills it
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lr = quad_sum(l[mt][r]);
            const int i = r0 + 16 * mt + 8 * r;
            if (i >= a.Tq) continue;
            store_out_row<D>(out, lse, a, b, h, i, t, o[mt], r, m[mt][r], lr);
        }
}

// ---- dQ: grid (query tiles, NH, B) ----
template <int D>
static __global__ void __launch_bounds__(MMA_THREADS) attn_bwd_dq_mma(bf16 *dq, const bf16 *dout, const float *lse,
                                                                      const float *delta, const bf16 *q, const bf16 *k,
                                                                      const bf16 *v, AttnDims a) {
    pdl_wait();
    constexpr int BM = 64, BN = 64, LD = D + 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *Qs = (bf16 *)att_smem, *dOs = Qs + BM * LD, *Ks = dOs + BM * LD, *Vs = Ks + 2 * BN * LD;
    const int b = blockIdx.z, h = blockIdx.y, kh = h / a.G, i0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t qstride = (int64_t)a.NH * D, kstride = (int64_t)a.KV * D;
    const int64_t qoff = (((int64_t)b * a.Tq + i0) * a.NH + h) * D;
    load_tile_async<D, BM, MMA_THREADS>(Qs, LD, q + qoff, qstride, a.Tq - i0, q);
    load_tile_async<D, BM, MMA_THREADS>(dOs, LD, dout + qoff, qstride, a.Tq - i0, dout);

    const AttQBlock qb = att_q_block(a, i0, BM);
    const int r0 = i0 + warp * 16 + g;
    const int p0 = a.q_pos0 + r0, p1 = p0 + 8;
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r0 + 8 * r;
        const int64_t ri = ((int64_t)b * a.NH + h) * a.Tq + i;
        lse2[r] = i < a.Tq ? lse[ri] * ATT_LOG2E : 0.f;
        dl[r] = i < a.Tq ? delta[ri] : 0.f;
    }
    float acc[D / 8][4];
    zero_acc<D / 8>(acc);
    const bf16 *kb = kv_head<D>(k, a, b, kh), *vb = kv_head<D>(v, a, b, kh);
    const int jstart = qb.jlo / BN * BN;
    load_kv_async<D, BN>(Ks, Vs, 0, kb, vb, jstart, kstride, a.tk, k, v);
    cp_async_commit();
    uint32_t qf[D / 16][4], dof[D / 16][4];
    for (int j0 = jstart, it = 0; j0 <= qb.jhi; j0 += BN, it++) {
        const int cur = it & 1, nj = j0 + BN;
        if (nj <= qb.jhi) load_kv_async<D, BN>(Ks, Vs, cur ^ 1, kb, vb, nj, kstride, a.tk, k, v);
        cp_async_next_tile();
        // the warp's Q and dO rows stay in registers for every key tile (one loop for both: two ldsm_a16 calls
        // would reorder the ldmatrix loads and change the code)
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
                ldsm_x4(dof[kk], dOs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
            }
        }
        const bf16 *Kc = Ks + cur * BN * LD, *Vc = Vs + cur * BN * LD;
        float s[BN / 8][4], dp[BN / 8][4];
        zero_acc<BN / 8>(s);
        zero_acc<BN / 8>(dp);
        warp_mm_rbt<BN, D>(s, qf, Kc, LD);
        warp_mm_rbt<BN, D>(dp, dof, Vc, LD);
        const bool need_mask = j0 + BN - 1 > qb.pmin || (a.window && j0 <= qb.pmax - a.window);
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), p = e < 2 ? p0 : p1;
                float pr = exp2f(s[nt][e] * a.scale_log2 - lse2[e >> 1]);
                if (need_mask && !att_visible(a, p, j)) pr = 0.f;
                s[nt][e] = pr * (dp[nt][e] - dl[e >> 1]); // dS (without the scale, applied at the end)
            }
        uint32_t da[BN / 16][4];
        pack_a<BN>(da, s);
        warp_mm_pb<BN, D>(acc, da, Kc, LD);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r0 + 8 * r;
        if (i >= a.Tq) continue;
        store_acc_row<D>(dq + (((int64_t)b * a.Tq + i) * a.NH + h) * D, acc, r, t, a.scale);
    }
}

// ---- dK/dV: grid (key tiles, KV, B) ----
template <int D>
static __global__ void __launch_bounds__(MMA_THREADS) attn_bwd_dkdv_mma(bf16 *dk, bf16 *dv, const bf16 *dout,
                                                                        const float *lse, const float *delta,
                                                                        const bf16 *q, const bf16 *k, const bf16 *v,
                                                                        AttnDims a) {
    pdl_wait();
    constexpr int BN = 64, BQ = 32, LD = D + 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *Ks = (bf16 *)att_smem, *Vs = Ks + BN * LD, *Qs = Vs + BN * LD, *dOs = Qs + 2 * BQ * LD; // Q, dO: 2 buffers
    float *lses = (float *)(dOs + 2 * BQ * LD), *dls = lses + 2 * BQ; // lse and delta of the rows: 2 buffers
    const int b = blockIdx.z, kh = blockIdx.y, j0 = blockIdx.x * BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t qstride = (int64_t)a.NH * D, kstride = (int64_t)a.KV * D;
    const int64_t koff = (((int64_t)b * a.tk_cap + j0) * a.KV + kh) * D;
    load_tile_async<D, BN, MMA_THREADS>(Ks, LD, k + koff, kstride, a.tk - j0, k);
    load_tile_async<D, BN, MMA_THREADS>(Vs, LD, v + koff, kstride, a.tk - j0, v);

    const int jlast = min(j0 + BN, a.tk) - 1;
    int ilo, ihi;
    att_query_range(a, j0, jlast, &ilo, &ihi);
    const int jr0 = j0 + warp * 16 + g; // this thread's keys: jr0 and jr0 + 8
    float dka[D / 8][4], dva[D / 8][4];
    zero_acc<D / 8>(dka);
    zero_acc<D / 8>(dva);
    // the (head, query tile) steps of this block in order, each prefetched one step ahead
    const int ntile = ilo <= ihi ? (ihi - ilo) / BQ + 1 : 0, nstep = ntile * a.G;
    if (nstep > 0) {
        const int64_t qoff = (((int64_t)b * a.Tq + ilo) * a.NH + kh * a.G) * D;
        load_tile_async<D, BQ, MMA_THREADS>(Qs, LD, q + qoff, qstride, ihi + 1 - ilo, q);
        load_tile_async<D, BQ, MMA_THREADS>(dOs, LD, dout + qoff, qstride, ihi + 1 - ilo, dout);
        load_rows_async<BQ>(lses, dls, lse, delta, ((int64_t)b * a.NH + kh * a.G) * a.Tq + ilo, ihi + 1 - ilo);
    }
    cp_async_commit();
    for (int step = 0; step < nstep; step++) {
        const int cur = step & 1, c0 = ilo + (step % ntile) * BQ;
        if (step + 1 < nstep) {
            const int nh = kh * a.G + (step + 1) / ntile, nc0 = ilo + ((step + 1) % ntile) * BQ;
            const int64_t qoff = (((int64_t)b * a.Tq + nc0) * a.NH + nh) * D;
            load_tile_async<D, BQ, MMA_THREADS>(Qs + (cur ^ 1) * BQ * LD, LD, q + qoff, qstride, ihi + 1 - nc0, q);
            load_tile_async<D, BQ, MMA_THREADS>(dOs + (cur ^ 1) * BQ * LD, LD, dout + qoff, qstride, ihi + 1 - nc0, dout);
            load_rows_async<BQ>(lses + (cur ^ 1) * BQ, dls + (cur ^ 1) * BQ, lse, delta,
                                ((int64_t)b * a.NH + nh) * a.Tq + nc0, ihi + 1 - nc0);
        }
        cp_async_next_tile();
        const bf16 *Qc = Qs + cur * BQ * LD, *dOc = dOs + cur * BQ * LD;
        const float *lsec = lses + cur * BQ, *dlcur = dls + cur * BQ;
        float st[BQ / 8][4], dpt[BQ / 8][4];
        zero_acc<BQ / 8>(st);
        zero_acc<BQ / 8>(dpt);
        warp_mm_abt<BQ, D>(st, Ks + warp * 16 * LD, LD, Qc, LD);
        warp_mm_abt<BQ, D>(dpt, Vs + warp * 16 * LD, LD, dOc, LD);
#pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = nt * 8 + 2 * t + (e & 1), i = c0 + c, j = jr0 + (e >> 1) * 8;
                float pr = exp2f(st[nt][e] * a.scale_log2 - lsec[c] * ATT_LOG2E);
                if (i > ihi || !att_visible(a, a.q_pos0 + i, j)) pr = 0.f;
                st[nt][e] = pr;
                dpt[nt][e] = pr * (dpt[nt][e] - dlcur[c]);
            }
        uint32_t pa[BQ / 16][4];
        pack_a<BQ>(pa, st);
        warp_mm_pb<BQ, D>(dva, pa, dOc, LD);
        pack_a<BQ>(pa, dpt);
        warp_mm_pb<BQ, D>(dka, pa, Qc, LD);
        __syncthreads();
    }
    cp_async_wait<0>(); // nothing in flight at exit (K and V when no query sees the tile)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = jr0 + 8 * r;
        if (j >= a.tk) continue;
        const int64_t off = (((int64_t)b * a.tk_cap + j) * a.KV + kh) * D;
        // one loop for both (two store_acc_row calls would reorder the stores and change the code)
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            if (dk) store_bf16x2(dk + off + dt * 8 + 2 * t, dka[dt][2 * r] * a.scale, dka[dt][2 * r + 1] * a.scale);
            if (dv) store_bf16x2(dv + off + dt * 8 + 2 * t, dva[dt][2 * r], dva[dt][2 * r + 1]);
        }
    }
}

// ---- host side ----
// 32: the default training config's head dim; 64 and 128: the usual ones
bool att_mma_supported(const AttnDims &a) { return a.D == 32 || a.D == 64 || a.D == 128; }

// Forward block rows: 128 (attn_fwd_mma2) unless KILN_ATTN_FWD_ROWS=64 picks the 16-rows-per-warp kernel
// (kept for short sequences and for comparison in the GPU tests).
static int fwd_rows(const AttnDims &a) {
    const char *e = getenv("KILN_ATTN_FWD_ROWS");
    if (e && atoi(e) == 64) return 64;
    return a.Tq <= 64 ? 64 : 128;
}

template <int D>
static kiln_error *fwd_launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a,
                              cudaStream_t st) {
    kiln_error *err = NULL;
    const int bm = fwd_rows(a);
    const int bn = bm == 128 && D == 128 ? 32 : 64; // key tile (as in the kernels)
    const int smem = (bm + 2 * 2 * bn) * (D + 8) * (int)sizeof(bf16); // Q, then K and V double-buffered
    const dim3 grid((a.Tq + bm - 1) / bm, a.NH, a.B);
    if (bm == 128) {
        CUDA_TRY(cudaFuncSetAttribute(attn_fwd_mma2<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kiln_launch(attn_fwd_mma2<D>, grid, MMA_THREADS, smem, st, out, lse, q, k, v, a);
    } else {
        CUDA_TRY(cudaFuncSetAttribute(attn_fwd_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kiln_launch(attn_fwd_mma<D>, grid, MMA_THREADS, smem, st, out, lse, q, k, v, a);
    }
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}

template <int D>
static kiln_error *bwd_launch(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta,
                              const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a, cudaStream_t st) {
    kiln_error *err = NULL;
    if (dk || dv) {
        // K, V, then Q and dO double-buffered, then lse and delta double-buffered
        const int smem = (2 * 64 + 2 * 2 * 32) * (D + 8) * (int)sizeof(bf16) + 2 * 2 * 32 * (int)sizeof(float);
        CUDA_TRY(cudaFuncSetAttribute(attn_bwd_dkdv_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kiln_launch(attn_bwd_dkdv_mma<D>, dim3((a.tk + 63) / 64, a.KV, a.B), MMA_THREADS, smem, st, dk, dv, dout, lse,
                    delta, q, k, v, a);
        CUDA_TRY(cudaGetLastError());
    }
    if (dq) {
        const int smem = (2 * 64 + 2 * 2 * 64) * (D + 8) * (int)sizeof(bf16); // Q, dO, then K and V double-buffered
        CUDA_TRY(cudaFuncSetAttribute(attn_bwd_dq_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kiln_launch(attn_bwd_dq_mma<D>, dim3((a.Tq + 63) / 64, a.NH, a.B), MMA_THREADS, smem, st, dq, dout, lse,
                    delta, q, k, v, a);
        CUDA_TRY(cudaGetLastError());
    }
done:
    return err;
}

kiln_error *att_mma_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a,
                            cudaStream_t st) {
    return a.D == 128  ? fwd_launch<128>(out, lse, q, k, v, a, st)
           : a.D == 64 ? fwd_launch<64>(out, lse, q, k, v, a, st)
                       : fwd_launch<32>(out, lse, q, k, v, a, st);
}

kiln_error *att_mma_backward(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta,
                             const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a, cudaStream_t st) {
    return a.D == 128  ? bwd_launch<128>(dq, dk, dv, dout, lse, delta, q, k, v, a, st)
           : a.D == 64 ? bwd_launch<64>(dq, dk, dv, dout, lse, delta, q, k, v, a, st)
                       : bwd_launch<32>(dq, dk, dv, dout, lse, delta, q, k, v, a, st);
}
