// CCA's convolutions fused with the q/k residual coupling, on bf16 tensor cores: the training path of
// src/models/zaya_cuda.c (no decode history). The same semantics as kiln_cca_conv_forward/backward followed
// by the coupling of zaya_forward.c / zaya_backward.c, for the model's channel layout: groups = NH + KV
// heads of D = C/groups channels, q heads first. The convolution input x = [q | k] is read from the q and k
// projections' outputs where they are (no packed copy).
//   forward:  mid (bf16, saved) = the depthwise stage; the grouped stage is one GEMM per (sequence, head)
//             whose epilogue adds the conv bias and the coupling and writes qpre / kpre directly.
//   backward: dmid = the grouped stage's input gradient read straight from dqpre / dkpre (no packed dy);
//             dw1 (+ db1) per-chunk partials; one pass over dmid gives dw0 / db0 partials, dx and the
//             coupling's adjoint, written as the q / k projections' output gradients dq / dk.
// Precision: mid is rounded to bf16 like every other activation; the GEMMs take bf16 operands with f32
// accumulation. The convolution weight w1 (f32 master) is split as hi + lo (both bf16) and both halves are
// multiplied, so the weight keeps ~16 significant bits (KILN_CCA_W1=bf16: its bf16 rounding alone, as the
// reference's autocast conv1d, for half the MMAs; w1_lo below). dy and mid are bf16 already (exact operands).
// Weight gradients: per-block partials, then the fixed-order colsum_add: bit-identical runs.
#include <stdlib.h>
#include <string.h>

#include "cca_conv_gemm.cuh"
#include "cca_conv_wg.h"
#include "mma_bf16.cuh"
#include "launch.cuh"

namespace ccaf {
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb_row;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> facc;

#define FT 64          // output tile (rows x columns)
#define FK 32          // K per stage
#define LDA (FK + 8)   // bf16 row pitches: multiples of 8 elements, fragment pointers 32-byte aligned
#define LDB (FT + 8)
#define LDC (FT + 4)   // f32 pitch of the epilogue tile
#define W1_CHUNK 1024  // time steps per dw1 / db1 partial
#define DW_ROWS 32     // rows per block of the depthwise backward

static __device__ __forceinline__ float f(bf16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ bf16 b(float v) { return __float2bfloat16_rn(v); }

// V consecutive bf16 at p (V = 8: one 16-byte access) as f32, and back
template <int V> static __device__ __forceinline__ void ld_bf(const bf16 *p, float *o) {
    if constexpr (V == 8) {
        ld8_bf16(p, o);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) o[k] = f(p[k]);
    }
}
template <int V> static __device__ __forceinline__ void st_bf(bf16 *p, const float *o) {
    if constexpr (V == 8) {
        uint4 q;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&q;
#pragma unroll
        for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(o[2 * k], o[2 * k + 1]);
        *(uint4 *)p = q;
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = b(o[k]);
    }
}

// channel c of token row (b*T + t) of the convolution input x = [q | k], read where the projections wrote it:
// q's rows ldq elements apart, k's ldk (Q and Kc when each is its own tensor; wider when q and k are columns of
// one packed projection output)
static __device__ __forceinline__ const bf16 *xat(const bf16 *q, const bf16 *k, int64_t row, int c, int Q, int ldq,
                                                  int ldk) {
    return c < Q ? q + row * ldq + c : k + row * ldk + (c - Q);
}

// mid[b,u,c] = b0[c] + sum_j w0[c,j] xp[b,u+j,c] (xp: x after P zero rows), u < M; a thread per element. The
// shapes dw_fwd_rows_kernel does not take: channels not in 16-byte vectors, more than 4 taps, unaligned weights.
static __global__ void dw_fwd_kernel(bf16 *mid, const bf16 *xq, const bf16 *xk, const float *w0, const float *b0,
                                     kiln_conv_shape s, int Q, int ldq, int ldk) {
    pdl_wait();
    const int C = (int)s.C, T = (int)s.T, k0 = (int)s.k0, P = (int)(s.k0 - 1 + s.k1 - 1), M = T + (int)s.k1 - 1;
    const int64_t total = s.B * (int64_t)M * C;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / C, bb = row / M;
        const int c = (int)(e - row * C), u = (int)(row - bb * M);
        float acc = b0[c];
        for (int j = 0; j < k0; j++) {
            const int up = u + j;
            if (up < P) continue;
            acc += w0[c * k0 + j] * f(*xat(xq, xk, bb * T + up - P, c, Q, ldq, ldk));
        }
        mid[row * C + c] = b(acc);
    }
}

// The depthwise forward for 8 channels of DWF_ROWS consecutive rows a thread (Q % 8 == 0: a vector never
// straddles q and k), the taps K0 known at compile time: the channels' b0 and w0 (8 and 8*K0 consecutive
// floats) loaded once as 16-byte vectors and kept in registers, and each input row loaded once into a sliding
// window of K0 rows. (Loading b0 and w0 per output row, as 8 + 8*k0 scalar loads 32-64 bytes apart across a
// warp, cost 16 cache lines per load instruction, ~330 L1 wavefronts per warp: 278 against 200 us a forward
// call at the [cuda] shape, run r23.) The bias, then the taps j = 0, 1, ..., as the CPU.
#define DWF_ROWS 16
template <int K0>
static __global__ void dw_fwd_rows_kernel(bf16 *mid, const bf16 *xq, const bf16 *xk, const float *w0, const float *b0,
                                          kiln_conv_shape s, int Q, int ldq, int ldk) {
    pdl_wait();
    const int C = (int)s.C, T = (int)s.T, P = K0 - 1 + (int)s.k1 - 1, M = T + (int)s.k1 - 1;
    const int cv = C / 8, strips = (M + DWF_ROWS - 1) / DWF_ROWS;
    const int64_t total = s.B * (int64_t)strips * cv;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t sr = e / cv, bb = sr / strips;
        const int c = (int)(e - sr * cv) * 8, u0 = (int)(sr - bb * strips) * DWF_ROWS;
        const int u1 = u0 + DWF_ROWS < M ? u0 + DWF_ROWS : M;
        float bv[8], wv[8 * K0], xw[K0][8] = {};
        ldv<4>(b0 + c, 0, bv), ldv<4>(b0 + c + 4, 0, bv + 4);
#pragma unroll
        for (int q = 0; q < 2 * K0; q++) ldv<4>(w0 + (int64_t)c * K0 + 4 * q, 0, wv + 4 * q); // wv[k*K0 + j]
        // the window: xw[j] = xp[u + j] (xp: x after P zero rows), starting at u0
#pragma unroll
        for (int j = 0; j < K0 - 1; j++) {
            const int up = u0 + j;
            if (up >= P && up - P < T) ld_bf<8>(xat(xq, xk, bb * T + up - P, c, Q, ldq, ldk), xw[j + 1]);
        }
#pragma unroll 4 // several rows' loads in flight
        for (int u = u0; u < u1; u++) {
#pragma unroll
            for (int j = 0; j < K0 - 1; j++)
#pragma unroll
                for (int k = 0; k < 8; k++) xw[j][k] = xw[j + 1][k];
            const int un = u + K0 - 1; // the row entering the window (never past T: u < M = T + k1 - 1, un - P < T)
            if (un >= P) ld_bf<8>(xat(xq, xk, bb * T + un - P, c, Q, ldq, ldk), xw[K0 - 1]);
            float acc[8];
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] = bv[k];
#pragma unroll
            for (int j = 0; j < K0; j++) {
                if (u + j < P) continue;
#pragma unroll
                for (int k = 0; k < 8; k++) acc[k] += wv[k * K0 + j] * xw[j][k];
            }
            st_bf<8>(mid + ((int64_t)bb * M + u) * C + c, acc);
        }
    }
}

// w1 [C, cg, k1] split as hi + lo bf16 in the layout the grouped GEMMs' B tiles read row by row:
//   MODE 0 (forward):        wt[g][j*cg + i][n]  = w1[g0+n, i, j]
//   MODE 1 (input gradient): wt[g][j*cg + co][n] = w1[g0+co, n, j]
template <int MODE>
static __global__ void w1_split_kernel(bf16 *wh, bf16 *wl, const float *w1, int groups, int cg, int k1) {
    pdl_wait();
    const int K = cg * k1;
    const int64_t total = (int64_t)groups * K * cg;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int n = (int)(e % cg), kk = (int)(e / cg % K), g = (int)(e / ((int64_t)cg * K));
        const int j = kk / cg, c = kk % cg;
        const float v = w1[((int64_t)g * cg + (MODE == 0 ? n : c)) * cg * k1 + (MODE == 0 ? c : n) * k1 + j];
        const bf16 hi = b(v);
        wh[e] = hi;
        wl[e] = b(v - f(hi));
    }
}

// The grouped stage's two row GEMMs per (sequence, head g), K = (j, i) with j outer as the CPU:
//   MODE 0 (forward): out[t, n] = b1 + sum_{j,i} mid[t+j, g0+i] w1[g0+n, i, j], t < T; the epilogue adds the
//                     coupling and writes qpre (g < NH) or kpre;
//   MODE 1 (input gradient): dmid[u, n] = sum_{j,co} dy[u-j, co] w1[g0+co, n, j] over 0 <= u-j < T, u < M,
//                     dy of head g read from dqp (g < NH, row pitch Q) or dkp (pitch K).
// grid (row tiles, column tiles, B * groups), 128 threads = 4 warps of 32 x 32. FAST (cg a multiple of 64,
// 16-byte aligned rows): every stage lies in one tap j, tiles are loaded in 16-byte vectors and w1 comes
// pre-split (w1_split_kernel); otherwise element by element, w1 split in the loader.
template <int MODE, bool FAST, bool LO>
static __global__ void __launch_bounds__(128)
    grp_kernel(bf16 *qpre, bf16 *kpre, float *dmid, const bf16 *mid, const bf16 *xq, const bf16 *xk, const bf16 *dqp,
               const bf16 *dkp,
               const float *w1, const bf16 *wh, const bf16 *wl, const float *b1, kiln_conv_shape s, int NH, int KV,
               int ldq, int ldk) {
    pdl_wait();
    constexpr int AB = FT * LDA * 2 + 2 * FK * LDB * 2, CB = FT * LDC * 4;
    __shared__ __align__(128) unsigned char smem[AB > CB ? AB : CB];
    __shared__ int tj[FK], tc[FK];
    bf16 *sa = (bf16 *)smem, *sbh = sa + FT * LDA, *sbl = sbh + FK * LDB;
    float *sc = (float *)smem;
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = C / (int)s.groups, K = cg * k1;
    const int Q = NH * cg, Kc = KV * cg;
    const int R = MODE == 0 ? T : M, r0 = blockIdx.x * FT, n0 = blockIdx.y * FT;
    const int bb = blockIdx.z / (int)s.groups, g = blockIdx.z % (int)s.groups, g0 = g * cg;
    const bf16 *midb = MODE == 0 ? mid + (int64_t)bb * M * C + g0 : NULL;
    const int ld = g < NH ? Q : Kc;
    const bf16 *dyb = MODE == 1 ? (g < NH ? dqp + g0 : dkp + (g - NH) * cg) + (int64_t)bb * T * ld : NULL;
    const float *wg = w1 + (int64_t)g0 * cg * k1;
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    facc acc[2][2];
    wmma_zero(acc);
    const bf16 zero = b(0.0f);
    for (int kb = 0; kb < K; kb += FK) {
        if (FAST) {
            const int j = kb / cg, c0 = kb % cg;
            for (int e = threadIdx.x; e < FT * (FK / 8); e += 128) { // A: 4 vectors of 8 channels per row
                const int rr = e / (FK / 8), q = e % (FK / 8), r = r0 + rr;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (MODE == 0) {
                    if (r < R) v = *(const uint4 *)(midb + (r + j) * C + c0 + q * 8);
                } else if (r < R && r - j >= 0 && r - j < T) {
                    v = *(const uint4 *)(dyb + (int64_t)(r - j) * ld + c0 + q * 8);
                }
                *(uint4 *)(sa + rr * LDA + q * 8) = v;
            }
            const bf16 *wrh = wh + ((int64_t)g * K + kb) * cg + n0, *wrl = wl + ((int64_t)g * K + kb) * cg + n0;
            for (int e = threadIdx.x; e < FK * (FT / 8); e += 128) { // B: 8 vectors per row, hi and lo
                const int kl = e / (FT / 8), q = e % (FT / 8);
                *(uint4 *)(sbh + kl * LDB + q * 8) = *(const uint4 *)(wrh + (int64_t)kl * cg + q * 8);
                if (LO) *(uint4 *)(sbl + kl * LDB + q * 8) = *(const uint4 *)(wrl + (int64_t)kl * cg + q * 8);
            }
        } else {
            conv_k_table<FK>(tj, tc, kb, K, cg);
            for (int e = threadIdx.x; e < FT * FK; e += 128) { // A: K fastest (contiguous channels)
                const int rr = e / FK, kl = e % FK, r = r0 + rr, j = tj[kl], c = tc[kl];
                bf16 v = zero;
                if (r < R && j >= 0) {
                    if (MODE == 0) v = midb[(r + j) * C + c];
                    else if (r - j >= 0 && r - j < T) v = dyb[(int64_t)(r - j) * ld + c];
                }
                sa[rr * LDA + kl] = v;
            }
            for (int e = threadIdx.x; e < FT * FK; e += 128) {
                // forward: K fastest (w1[n, i, j] contiguous in i); input gradient: columns fastest (contiguous in n)
                const int kl = MODE == 0 ? e % FK : e / FT, nl = MODE == 0 ? e / FK : e % FT;
                const int n = n0 + nl, j = tj[kl], c = tc[kl];
                float v = 0.0f;
                if (j >= 0 && n < cg) v = MODE == 0 ? wg[(n * cg + c) * k1 + j] : wg[(c * cg + n) * k1 + j];
                const bf16 hi = b(v);
                sbh[kl * LDB + nl] = hi;
                if (LO) sbl[kl * LDB + nl] = b(v - f(hi));
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < FK; kk += 16) {
            fa_row a[2];
            fb_row bh[2], bl[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(a[i], sa + (wy * 32 + i * 16) * LDA + kk, LDA);
                wmma::load_matrix_sync(bh[i], sbh + kk * LDB + wx * 32 + i * 16, LDB);
                if (LO) wmma::load_matrix_sync(bl[i], sbl + kk * LDB + wx * 32 + i * 16, LDB);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (LO) wmma::mma_sync(acc[i][j], a[i], bl[j], acc[i][j]);
                    wmma::mma_sync(acc[i][j], a[i], bh[j], acc[i][j]);
                }
        }
        __syncthreads();
    }
    wmma_store_tile<LDC>(sc, acc, wy, wx);
    const int G = NH / KV;
    for (int e = threadIdx.x; e < FT * FT; e += 128) {
        const int rr = e / FT, nl = e % FT, r = r0 + rr, n = n0 + nl;
        if (r >= R || n >= cg) continue;
        if (MODE == 1) {
            dmid[((int64_t)bb * M + r) * C + g0 + n] = sc[rr * LDC + nl];
            continue;
        }
        // the coupling (zaya_forward.c): qpre = conv + (q + k of the KV head)/2, kpre = conv + their group mean
        const float v = sc[rr * LDC + nl] + b1[g0 + n];
        const int64_t row = (int64_t)bb * T + r;
        const bf16 *q = xq + row * ldq, *k = xk + row * ldk;
        if (g < NH) {
            const float qres = (f(q[g0 + n]) + f(k[(g / G) * cg + n])) * 0.5f;
            qpre[row * Q + g0 + n] = b(v + qres);
        } else {
            const int j = g - NH;
            const float kv = f(k[j * cg + n]);
            float sum = 0.0f;
            for (int m = 0; m < G; m++) sum += (f(q[(j * G + m) * cg + n]) + kv) * 0.5f;
            kpre[row * Kc + j * cg + n] = b(v + sum / (float)G);
        }
    }
}

// The same two GEMMs for heads of a multiple of 128 channels, as a pipelined kernel: a block computes 128 rows
// x 128 columns (8 warps of 32 x 64), K staged 32 at a time through two shared-memory buffers filled by
// cp.async (the next stage's loads in flight during this stage's MMAs; rows out of range zero-filled), w1
// pre-split (w1_split_kernel). Per block four times the MACs of grp_kernel for twice the bytes.
#define BT 128               // block tile (rows and columns)
#define LDB2 (BT + 8)        // bf16 pitch of the B tiles
#define STAGE_BYTES (BT * LDA * 2 + 2 * FK * LDB2 * 2)
#define SMEM128 (2 * STAGE_BYTES)

// Stage st of a two-buffer pipeline (grp128_kernel, dw1_128_kernel; stage 0's loads issued before the loop):
// stage st + 1's loads issued by load(st + 1, buffer) to be in flight during stage st's MMAs, stage st's landed,
// then a barrier: every thread's copies are visible
template <typename L> static __device__ __forceinline__ void pipeline_stage(int st, int stages, L &load) {
    if (st + 1 < stages) {
        load(st + 1, (st + 1) & 1);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

template <int MODE, bool LO>
static __global__ void __launch_bounds__(256, 2)
    grp128_kernel(bf16 *qpre, bf16 *kpre, float *dmid, const bf16 *mid, const bf16 *xq, const bf16 *xk,
                  const bf16 *dqp, const bf16 *dkp, const bf16 *wh, const bf16 *wl, const float *b1, kiln_conv_shape s,
                  int NH, int KV, int ldq, int ldk) {
    pdl_wait();
    extern __shared__ __align__(128) unsigned char smem128[];
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = C / (int)s.groups, K = cg * k1;
    const int Q = NH * cg, Kc = KV * cg;
    const int R = MODE == 0 ? T : M, r0 = blockIdx.x * BT, n0 = blockIdx.y * BT;
    const int bb = blockIdx.z / (int)s.groups, g = blockIdx.z % (int)s.groups, g0 = g * cg;
    const int ld = g < NH ? Q : Kc;
    const bf16 *src = MODE == 0 ? mid + (int64_t)bb * M * C + g0
                                : (g < NH ? dqp + g0 : dkp + (g - NH) * cg) + (int64_t)bb * T * ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wy = warp / 2, wx = warp % 2;
    const int stages = (K + FK - 1) / FK;
    auto load = [&](int st, int buf) {
        bf16 *sa = (bf16 *)(smem128 + buf * STAGE_BYTES), *sbh = sa + BT * LDA, *sbl = sbh + FK * LDB2;
        const int kb = st * FK, j = kb / cg, c0 = kb % cg;
        for (int e = threadIdx.x; e < BT * (FK / 8); e += 256) { // A: 128 rows x 4 vectors
            const int rr = e / (FK / 8), q = e % (FK / 8), r = r0 + rr;
            const bf16 *p = src;
            bool ok;
            if (MODE == 0) {
                ok = r < R;
                if (ok) p = src + (int64_t)(r + j) * C + c0 + q * 8;
            } else {
                ok = r < R && r - j >= 0 && r - j < T;
                if (ok) p = src + (int64_t)(r - j) * ld + c0 + q * 8;
            }
            cp_async16(sa + rr * LDA + q * 8, p, ok);
        }
        const bf16 *wrh = wh + ((int64_t)g * K + kb) * cg + n0, *wrl = wl + ((int64_t)g * K + kb) * cg + n0;
        for (int e = threadIdx.x; e < FK * (BT / 8); e += 256) { // B: 32 rows x 16 vectors, hi and lo
            const int kl = e / (BT / 8), q = e % (BT / 8);
            cp_async16(sbh + kl * LDB2 + q * 8, wrh + (int64_t)kl * cg + q * 8, true);
            if (LO) cp_async16(sbl + kl * LDB2 + q * 8, wrl + (int64_t)kl * cg + q * 8, true);
        }
        cp_async_commit();
    };
    facc acc[2][4];
    wmma_zero(acc);
    load(0, 0);
    for (int st = 0; st < stages; st++) {
        pipeline_stage(st, stages, load);
        const bf16 *sa = (const bf16 *)(smem128 + (st & 1) * STAGE_BYTES), *sbh = sa + BT * LDA,
                   *sbl = sbh + FK * LDB2;
#pragma unroll
        for (int kk = 0; kk < FK; kk += 16) {
            fa_row a[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], sa + (wy * 32 + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                fb_row bh, bl;
                wmma::load_matrix_sync(bh, sbh + kk * LDB2 + wx * 64 + j * 16, LDB2);
                if (LO) wmma::load_matrix_sync(bl, sbl + kk * LDB2 + wx * 64 + j * 16, LDB2);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (LO) wmma::mma_sync(acc[i][j], a[i], bl, acc[i][j]);
                    wmma::mma_sync(acc[i][j], a[i], bh, acc[i][j]);
                }
            }
        }
        __syncthreads(); // the buffer is refilled by the next iteration's load
    }
    // epilogue: each warp stages one 16 x 16 fragment at a time; a lane takes 8 consecutive columns of a row
    float *stg = (float *)smem128 + warp * 16 * 16;
    const int G = NH / KV, er = lane / 2, ec = (lane % 2) * 8;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            __syncwarp(); // every lane at the collective store (lanes of rows past R skipped the previous write)
            wmma::store_matrix_sync(stg, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int r = r0 + wy * 32 + i * 16 + er, n = n0 + wx * 64 + j * 16 + ec;
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = stg[er * 16 + ec + k];
            __syncwarp();
            if (r >= R) continue;
            if (MODE == 1) {
                float *o = dmid + ((int64_t)bb * M + r) * C + g0 + n;
                *(float4 *)o = make_float4(v[0], v[1], v[2], v[3]);
                *(float4 *)(o + 4) = make_float4(v[4], v[5], v[6], v[7]);
                continue;
            }
            const int64_t row = (int64_t)bb * T + r;
            const bf16 *q = xq + row * ldq, *kk = xk + row * ldk;
            float t0[8], t1[8];
            if (g < NH) {
                ld_bf<8>(q + g0 + n, t0), ld_bf<8>(kk + (g / G) * cg + n, t1);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = v[k] + b1[g0 + n + k] + (t0[k] + t1[k]) * 0.5f;
                st_bf<8>(qpre + row * Q + g0 + n, v);
            } else {
                const int jh = g - NH;
                float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                ld_bf<8>(kk + jh * cg + n, t1);
                for (int m = 0; m < G; m++) {
                    ld_bf<8>(q + (jh * G + m) * cg + n, t0);
#pragma unroll
                    for (int k = 0; k < 8; k++) sum[k] += (t0[k] + t1[k]) * 0.5f;
                }
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = v[k] + b1[g0 + n + k] + sum[k] / (float)G;
                st_bf<8>(kpre + row * Kc + jh * cg + n, v);
            }
        }
}

// The input-gradient GEMM (grp128_kernel's MODE 1) for heads of exactly 128 channels (ZAYA's), persistent:
// grp128_kernel's blocks each read their group's whole B (w1's hi and lo halves, 2 x 64 KB at two taps) beside
// 64 KB of A for 128 x 128 outputs: three times A's bytes through the L2 and into the SMs. Here a block keeps
// one group's B in shared memory and streams A (dy, 128 rows x 64 of K a chunk, three buffers, cp.async) through
// the group's row tiles: `bpg` blocks a group, tiles part, part + bpg, ... of (sequence, row tile). 8 warps of
// 32 x 64, raw mma.sync (ldmatrix; B transposed from its [k][n] rows), dmid stored from the accumulators.
// Measured (session 19, [cuda] shape): 99 us against grp128_kernel's 150. The forward's twin (the coupling in its
// epilogue) took 208 us against grp128_kernel's 170 and was dropped: one block an SM leaves the epilogue's loads of
// q and k nothing to hide behind, where grp128_kernel's two blocks an SM overlap one's epilogue with the other's MMAs
// (those rows prefetched into L1 under the tile's last K chunk: 217 us, no better).
#define PK 64              // K per chunk of A
#define PLDA (PK + 8)      // bf16 pitches: ldmatrix rows 16 bytes apart in different banks
#define PLDB (128 + 8)
#define PSTAGES 3
static size_t grpp_smem(int64_t K, bool lo) {
    return (size_t)K * PLDB * 2 * (lo ? 2 : 1) + (size_t)PSTAGES * 128 * PLDA * 2;
}

template <bool LO>
static __global__ void __launch_bounds__(256, 1)
    grpp_bwd_kernel(float *dmid, const bf16 *dqp, const bf16 *dkp, const bf16 *wh, const bf16 *wl, kiln_conv_shape s,
                    int NH, int KV, int bpg) {
    pdl_wait();
    extern __shared__ __align__(128) unsigned char smp[];
    constexpr int cg = 128;
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, K = cg * k1, KC = K / PK;
    const int tps = (M + 127) / 128, ntiles = (int)s.B * tps;
    const int g = blockIdx.x / bpg, part = blockIdx.x % bpg;
    if (g >= (int)s.groups) return;
    const int g0 = g * cg, ld = g < NH ? NH * cg : KV * cg;
    bf16 *sbh = (bf16 *)smp, *sbl = sbh + K * PLDB, *sa0 = LO ? sbl + K * PLDB : sbl;
    {   // B, once: rows kk of the group's [K][128] hi (and lo)
        const bf16 *wrh = wh + (int64_t)g * K * cg, *wrl = wl + (int64_t)g * K * cg;
        for (int e = threadIdx.x; e < K * (cg / 8); e += 256) {
            const int kk = e / (cg / 8), q = e % (cg / 8);
            cp_async16(sbh + kk * PLDB + q * 8, wrh + (int64_t)kk * cg + q * 8, true);
            if (LO) cp_async16(sbl + kk * PLDB + q * 8, wrl + (int64_t)kk * cg + q * 8, true);
        }
        cp_async_commit();
    }
    const int mine = part < ntiles ? (ntiles - part + bpg - 1) / bpg : 0, nq = mine * KC;
    // chunk qi of this block's stream (tile part + (qi / KC) * bpg, K chunk qi % KC) into buffer qi % PSTAGES:
    // dmid[u] = sum_j dy[u - j] w1[., ., j] over 0 <= u - j < T
    auto issue = [&](int qi) {
        if (qi < nq) {
            const int ti = part + (qi / KC) * bpg, kb = (qi % KC) * PK, j = kb / cg, c0 = kb % cg;
            const int bb = ti / tps, r0 = (ti % tps) * 128;
            bf16 *sa = sa0 + (qi % PSTAGES) * 128 * PLDA;
            const bf16 *src = (g < NH ? dqp + g0 : dkp + (g - NH) * cg) + (int64_t)bb * T * ld + c0;
            for (int e = threadIdx.x; e < 128 * (PK / 8); e += 256) {
                const int rr = e / (PK / 8), q = e % (PK / 8), r = r0 + rr;
                const bool ok = r < M && r - j >= 0 && r - j < T;
                cp_async16(sa + rr * PLDA + q * 8, ok ? src + (int64_t)(r - j) * ld + q * 8 : src, ok);
            }
        }
        cp_async_commit(); // an empty group past the end keeps the wait counts uniform
    };
    issue(0);
    issue(1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wy = warp / 2, wx = warp % 2;
    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; i++) zero_acc<8>(acc[i]);
    for (int qi = 0; qi < nq; qi++) {
        cp_async_wait<1>(); // chunk qi (and B) landed for this thread's copies ...
        __syncthreads();    // ... and everyone's; every warp is past chunk qi - 1, whose buffer the next issue fills
        issue(qi + 2);
        const bf16 *sa = sa0 + (qi % PSTAGES) * 128 * PLDA;
        const int kc = qi % KC;
#pragma unroll
        for (int kk = 0; kk < PK; kk += 16) {
            uint32_t af[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldsm_x4(af[i], sa + (wy * 32 + i * 16 + (lane & 15)) * PLDA + kk + (lane >> 4) * 8);
            const int kr = kc * PK + kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int n0 = 0; n0 < 64; n0 += 16) {
                uint32_t bh[4], bl[4];
                ldsm_x4_t(bh, sbh + kr * PLDB + wx * 64 + n0 + (lane >> 4) * 8);
                if (LO) ldsm_x4_t(bl, sbl + kr * PLDB + wx * 64 + n0 + (lane >> 4) * 8);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (LO) {
                        mma16816(acc[i][n0 / 8], af[i], bl[0], bl[1]);
                        mma16816(acc[i][n0 / 8 + 1], af[i], bl[2], bl[3]);
                    }
                    mma16816(acc[i][n0 / 8], af[i], bh[0], bh[1]);
                    mma16816(acc[i][n0 / 8 + 1], af[i], bh[2], bh[3]);
                }
            }
        }
        if (kc < KC - 1) continue;
        // the tile's dmid: this thread's rows wy*32 + i*16 + lane/4 (+ 8), columns wx*64 + nt*8 + (lane%4)*2
        const int ti = part + (qi / KC) * bpg, bb = ti / tps, r0 = (ti % tps) * 128;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + wy * 32 + i * 16 + (lane >> 2) + h * 8;
                if (r >= M) continue;
                float *o = dmid + ((int64_t)bb * M + r) * C + g0 + wx * 64 + (lane & 3) * 2;
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
                    *(float2 *)(o + nt * 8) = make_float2(acc[i][nt][2 * h], acc[i][nt][2 * h + 1]);
            }
#pragma unroll
        for (int i = 0; i < 2; i++) zero_acc<8>(acc[i]);
    }
    cp_async_wait<0>();
}

// dw1 (+ db1) partials as dw1_kernel<true> (columns in (j, i) order) for heads of a multiple of 128: a block
// computes 128 x 128 of one chunk, the steps staged 32 at a time through cp.async double buffers.
#define W1_CHUNK128 512
#define STAGE1_BYTES (2 * FK * LDB2 * 2)
#define SMEM128W (2 * STAGE1_BYTES)
static __global__ void __launch_bounds__(256, 2)
    dw1_128_kernel(float *part, float *partb, const bf16 *dqp, const bf16 *dkp, const bf16 *mid, kiln_conv_shape s,
                   int NH, int KV, int cps) {
    pdl_wait();
    extern __shared__ __align__(128) unsigned char smem1[];
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = C / (int)s.groups, nc = cg * k1;
    const int Q = NH * cg, Kc = KV * cg;
    const int64_t ne = (int64_t)C * nc;
    const int col_tiles = nc / BT, co0 = (blockIdx.x / col_tiles) * BT, col0 = (blockIdx.x % col_tiles) * BT;
    const int chunk = blockIdx.y, bb = chunk / cps;
    const int t0 = (chunk % cps) * W1_CHUNK128, t1 = t0 + W1_CHUNK128 < T ? t0 + W1_CHUNK128 : T;
    const int g = blockIdx.z, g0 = g * cg, ld = g < NH ? Q : Kc;
    const bf16 *dyb = (g < NH ? dqp + g0 : dkp + (g - NH) * cg) + (int64_t)bb * T * ld + co0;
    const bf16 *midb = mid + (int64_t)bb * M * C + g0 + (col0 / cg) * C + col0 % cg; // tap j = col0 / cg
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wy = warp / 2, wx = warp % 2;
    const bool do_b = partb && blockIdx.x % col_tiles == 0;
    const int stages = (t1 - t0 + FK - 1) / FK;
    auto load = [&](int st, int buf) {
        bf16 *sdy = (bf16 *)(smem1 + buf * STAGE1_BYTES), *smid = sdy + FK * LDB2;
        const int ts = t0 + st * FK;
        for (int e = threadIdx.x; e < FK * (BT / 8); e += 256) {
            const int kt = e / (BT / 8), q = e % (BT / 8), t = ts + kt;
            const bool ok = t < t1;
            cp_async16(sdy + kt * LDB2 + q * 8, ok ? dyb + (int64_t)t * ld + q * 8 : dyb, ok);
            cp_async16(smid + kt * LDB2 + q * 8, ok ? midb + (int64_t)t * C + q * 8 : midb, ok);
        }
        cp_async_commit();
    };
    facc acc[2][4];
    wmma_zero(acc);
    float bacc = 0.0f;
    if (stages > 0) load(0, 0);
    for (int st = 0; st < stages; st++) {
        pipeline_stage(st, stages, load);
        const bf16 *sdy = (const bf16 *)(smem1 + (st & 1) * STAGE1_BYTES), *smid = sdy + FK * LDB2;
        if (do_b && threadIdx.x < BT)
            for (int kt = 0; kt < FK; kt++) bacc += f(sdy[kt * LDB2 + threadIdx.x]);
#pragma unroll
        for (int kk = 0; kk < FK; kk += 16) {
            fa_col a[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], sdy + kk * LDB2 + wy * 32 + i * 16, LDB2);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                fb_row bm;
                wmma::load_matrix_sync(bm, smid + kk * LDB2 + wx * 64 + j * 16, LDB2);
#pragma unroll
                for (int i = 0; i < 2; i++) wmma::mma_sync(acc[i][j], a[i], bm, acc[i][j]);
            }
        }
        __syncthreads();
    }
    float *stg = (float *)smem1 + warp * 16 * 16;
    const int er = lane / 2, ec = (lane % 2) * 8;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            __syncwarp();
            wmma::store_matrix_sync(stg, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int co = co0 + wy * 32 + i * 16 + er, col = col0 + wx * 64 + j * 16 + ec;
            float *o = part + (int64_t)chunk * ne + (int64_t)(g0 + co) * nc + col;
            *(float4 *)o = make_float4(stg[er * 16 + ec], stg[er * 16 + ec + 1], stg[er * 16 + ec + 2],
                                       stg[er * 16 + ec + 3]);
            *(float4 *)(o + 4) = make_float4(stg[er * 16 + ec + 4], stg[er * 16 + ec + 5], stg[er * 16 + ec + 6],
                                             stg[er * 16 + ec + 7]);
        }
    if (do_b && threadIdx.x < BT) partb[(int64_t)chunk * C + g0 + co0 + threadIdx.x] = bacc;
}

// dw1 (and db1) partials over one chunk of a sequence's steps: out[co, col] = sum over t of dy[t, g0+co]
// mid[t+j, g0+i], a [cg x W1_CHUNK] x [W1_CHUNK x cg*k1] GEMM of exact bf16 operands. Columns in w1's (i, j)
// order, or with FAST (as grp_kernel) in (j, i) order so that a tile is 64 consecutive channels of one tap
// (dw1_sum_kernel puts them back). grid (output tiles, B * chunks per sequence, groups). db1: the blocks of
// column tile 0 also sum dy.
template <bool FAST>
static __global__ void __launch_bounds__(128)
    dw1_kernel(float *part, float *partb, const bf16 *dqp, const bf16 *dkp, const bf16 *mid, kiln_conv_shape s, int NH,
               int KV, int cps) {
    pdl_wait();
    constexpr int AB = 2 * FK * LDB * 2, CB = FT * LDC * 4;
    __shared__ __align__(128) unsigned char smem[AB > CB ? AB : CB];
    __shared__ int moff[FT];
    bf16 *sdy = (bf16 *)smem, *smid = sdy + FK * LDB;
    float *sc = (float *)smem;
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, M = T + k1 - 1, cg = C / (int)s.groups, nc = cg * k1;
    const int Q = NH * cg, Kc = KV * cg;
    const int64_t ne = (int64_t)C * nc;
    const int col_tiles = (nc + FT - 1) / FT, co0 = (blockIdx.x / col_tiles) * FT, col0 = (blockIdx.x % col_tiles) * FT;
    const int chunk = blockIdx.y, bb = chunk / cps;
    const int t0 = (chunk % cps) * W1_CHUNK, t1 = t0 + W1_CHUNK < T ? t0 + W1_CHUNK : T;
    const int g = blockIdx.z, g0 = g * cg, ld = g < NH ? Q : Kc;
    const bf16 *dyb = (g < NH ? dqp + g0 : dkp + (g - NH) * cg) + (int64_t)bb * T * ld;
    const bf16 *midb = mid + (int64_t)bb * M * C + g0;
    const int warp = threadIdx.x / 32, wy = warp / 2, wx = warp % 2;
    const bool do_b = partb && blockIdx.x % col_tiles == 0;
    if (threadIdx.x < FT) {
        const int col = col0 + threadIdx.x;
        moff[threadIdx.x] = col >= nc ? -1 : FAST ? (col / cg) * C + col % cg : (col % k1) * C + col / k1;
    }
    facc acc[2][2];
    wmma_zero(acc);
    float bacc = 0.0f;
    const bf16 zero = b(0.0f);
    __syncthreads();
    for (int ts = t0; ts < t1; ts += FK) {
        if (FAST) {
            const int off0 = moff[0];
            for (int e = threadIdx.x; e < FK * (FT / 8); e += 128) {
                const int kt = e / (FT / 8), q = e % (FT / 8), t = ts + kt;
                uint4 vd = make_uint4(0, 0, 0, 0), vm = make_uint4(0, 0, 0, 0);
                if (t < t1) {
                    vd = *(const uint4 *)(dyb + (int64_t)t * ld + co0 + q * 8);
                    vm = *(const uint4 *)(midb + t * C + off0 + q * 8);
                }
                *(uint4 *)(sdy + kt * LDB + q * 8) = vd;
                *(uint4 *)(smid + kt * LDB + q * 8) = vm;
            }
        } else {
            for (int e = threadIdx.x; e < FK * FT; e += 128) {
                const int kt = e / FT, c = e % FT, t = ts + kt, co = co0 + c, off = moff[c];
                sdy[kt * LDB + c] = t < t1 && co < cg ? dyb[(int64_t)t * ld + co] : zero;
                smid[kt * LDB + c] = t < t1 && off >= 0 ? midb[t * C + off] : zero;
            }
        }
        __syncthreads();
        if (do_b && threadIdx.x < FT)
            for (int kt = 0; kt < FK; kt++) bacc += f(sdy[kt * LDB + threadIdx.x]);
#pragma unroll
        for (int kk = 0; kk < FK; kk += 16) {
            fa_col a[2];
            fb_row bm[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(a[i], sdy + kk * LDB + wy * 32 + i * 16, LDB);
                wmma::load_matrix_sync(bm[i], smid + kk * LDB + wx * 32 + i * 16, LDB);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], bm[j], acc[i][j]);
        }
        __syncthreads();
    }
    wmma_store_tile<LDC>(sc, acc, wy, wx);
    for (int e = threadIdx.x; e < FT * FT; e += 128) {
        const int rr = e / FT, cl = e % FT, co = co0 + rr, col = col0 + cl;
        if (co < cg && col < nc) part[(int64_t)chunk * ne + (int64_t)(g0 + co) * nc + col] = sc[rr * LDC + cl];
    }
    if (do_b && threadIdx.x < FT && co0 + (int)threadIdx.x < cg)
        partb[(int64_t)chunk * C + g0 + co0 + threadIdx.x] = bacc;
}

// dw1[co, i, j] += the chunks' partials at (co, j, i) (dw1_kernel<true>'s order), summed in chunk order in
// f64: the fixed order of colsum_add, one thread per weight
static __global__ void dw1_sum_kernel(float *dw1, const float *part, int64_t chunks, int64_t C, int cg, int k1) {
    pdl_wait();
    const int64_t nc = (int64_t)cg * k1, ne = C * nc;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < ne; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t co = e / nc;
        const int r = (int)(e % nc), i = r / k1, j = r % k1;
        const int64_t src = co * nc + (int64_t)j * cg + i;
        double sum = 0;
        for (int64_t ch = 0; ch < chunks; ch++) sum += part[ch * ne + src];
        dw1[e] += (float)sum;
    }
}

// One pass over dmid per block of DW_ROWS rows of one sequence: dw0 / db0 partials (rows u of [0, M)), then
// dx (rows t of [0, T)) = sum_j dmid[t+P-j] w0[., j] and the coupling's adjoint (zaya_backward.c):
//   dq[h] = (dqp[h] + dkp[kv(h)]/G)/2 + dx_q[h],   dk[j] = sum over the group of those halves + dx_k[j].
// A thread owns a (KV head j, dim d): the G query channels of that group and the key channel, as
// cca_couple.cu's kernel (no atomics). grid B * chunks per sequence.
static __global__ void dw_bwd_couple_kernel(bf16 *dq, bf16 *dk, float *p0, float *pb0, const float *dmid,
                                            const bf16 *xq, const bf16 *xk, const float *w0, const bf16 *dqp,
                                            const bf16 *dkp, kiln_conv_shape s, int NH, int KV, int cps, int ldq,
                                            int ldk) {
    pdl_wait();
    const int C = (int)s.C, T = (int)s.T, k0 = (int)s.k0, k1 = (int)s.k1, P = k0 - 1 + k1 - 1, M = T + k1 - 1;
    const int D = C / (int)s.groups, Q = NH * D, Kc = KV * D, G = NH / KV;
    const int bb = blockIdx.x / cps, u0 = (blockIdx.x % cps) * DW_ROWS;
    const int u1 = u0 + DW_ROWS < M ? u0 + DW_ROWS : M, t1 = u0 + DW_ROWS < T ? u0 + DW_ROWS : T;
    const float *dmb = dmid + (int64_t)bb * M * C;
    for (int e = threadIdx.x; e < Kc; e += blockDim.x) {
        const int j = e / D, d = e % D;
        if (p0 || pb0)
            for (int m = 0; m <= G; m++) {
                const int c = m < G ? (j * G + m) * D + d : Q + j * D + d;
                for (int jj = 0; jj < k0; jj++) {
                    float acc = 0.0f, accb = 0.0f;
#pragma unroll 4
                    for (int u = u0; u < u1; u++) {
                        const float gv = dmb[u * C + c];
                        accb += gv;
                        if (u + jj >= P) acc += gv * f(*xat(xq, xk, (int64_t)bb * T + u + jj - P, c, Q, ldq, ldk));
                    }
                    if (p0) p0[(int64_t)blockIdx.x * C * k0 + c * k0 + jj] = acc;
                    if (jj == 0 && pb0) pb0[(int64_t)blockIdx.x * C + c] = accb;
                }
            }
#pragma unroll 2
        for (int t = u0; t < t1; t++) {
            const int64_t row = (int64_t)bb * T + t;
            const float dkg = f(dkp[row * Kc + j * D + d]) / (float)G;
            float sk = 0.0f;
            for (int m = 0; m <= G; m++) {
                const int c = m < G ? (j * G + m) * D + d : Q + j * D + d;
                float dx = 0.0f;
                for (int jj = 0; jj < k0; jj++) {
                    const int u = t + P - jj;
                    if (u >= 0 && u < M) dx += dmb[u * C + c] * w0[c * k0 + jj];
                }
                if (m < G) {
                    const float half = 0.5f * (f(dqp[row * Q + c]) + dkg);
                    dq[row * ldq + c] = b(half + dx);
                    sk += half;
                } else {
                    dk[row * ldk + j * D + d] = b(sk + dx);
                }
            }
        }
    }
}
// The same pass split in two for 16-byte accesses (D % 8 == 0, at most 4 taps): this kernel's dw0 / db0 partials
// with a thread per 8 channels of a block of DW_ROWS rows (the same sums in the same order as above), all K0 taps
// in one pass over the block's rows with the input rows in a sliding window (a pass over dmid per tap, 32 rows x
// C f32 = 160 KB a block, was more than L2 keeps for 516 blocks at once); and dx_couple8_rows_kernel's dx + the
// coupling's adjoint.
// Both read dmid as TD: f32, or bf16 where the grouped stage's wgmma kernel stored it so (16-byte loads of 8).
static __device__ __forceinline__ void ld8(const float *p, float *o) { ldv<4>(p, 0, o), ldv<4>(p, 4, o + 4); }
static __device__ __forceinline__ void ld8(const bf16 *p, float *o) { ld8_bf16(p, o); }
template <int K0, typename TD>
static __global__ void dw0_part8_taps_kernel(float *p0, float *pb0, const TD *dmid, const bf16 *xq, const bf16 *xk,
                                             kiln_conv_shape s, int Q, int cps, int ldq, int ldk) {
    pdl_wait();
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, P = K0 - 1 + k1 - 1, M = T + k1 - 1;
    const int bb = blockIdx.x / cps, u0 = (blockIdx.x % cps) * DW_ROWS;
    const int u1 = u0 + DW_ROWS < M ? u0 + DW_ROWS : M;
    const TD *dmb = dmid + (int64_t)bb * M * C;
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
        float acc[K0][8] = {}, accb[8] = {0, 0, 0, 0, 0, 0, 0, 0}, xw[K0][8] = {};
        // xw[jj] = x row u + jj - P (when that is >= 0), starting at u0
#pragma unroll
        for (int jj = 0; jj < K0 - 1; jj++) {
            const int up = u0 + jj;
            if (up >= P) ld_bf<8>(xat(xq, xk, (int64_t)bb * T + up - P, c, Q, ldq, ldk), xw[jj + 1]);
        }
#pragma unroll 4
        for (int u = u0; u < u1; u++) {
#pragma unroll
            for (int jj = 0; jj < K0 - 1; jj++)
#pragma unroll
                for (int k = 0; k < 8; k++) xw[jj][k] = xw[jj + 1][k];
            if (u + K0 - 1 >= P) ld_bf<8>(xat(xq, xk, (int64_t)bb * T + u + K0 - 1 - P, c, Q, ldq, ldk), xw[K0 - 1]);
            float gv[8];
            ld8(dmb + (int64_t)u * C + c, gv);
#pragma unroll
            for (int k = 0; k < 8; k++) accb[k] += gv[k];
#pragma unroll
            for (int jj = 0; jj < K0; jj++) {
                if (u + jj < P) continue;
#pragma unroll
                for (int k = 0; k < 8; k++) acc[jj][k] += gv[k] * xw[jj][k];
            }
        }
        if (p0)
#pragma unroll
            for (int jj = 0; jj < K0; jj++)
#pragma unroll
                for (int k = 0; k < 8; k++) p0[(int64_t)blockIdx.x * C * K0 + (int64_t)(c + k) * K0 + jj] = acc[jj][k];
        if (pb0) {
            stv<4>(pb0 + (int64_t)blockIdx.x * C + c, 0, accb);
            stv<4>(pb0 + (int64_t)blockIdx.x * C + c + 4, 0, accb + 4);
        }
    }
}

// dx + the coupling's adjoint (dw_bwd_couple_kernel's) with a thread per (DXR consecutive tokens, KV head,
// 8 dims), fully parallel, the taps K0 known at compile time: the loop over the group's channels m outermost, so
// each channel's 8*K0 weights are loaded once (as 16-byte vectors) for DXR tokens instead of as 8*k0 scalar loads
// per token (addresses 64 bytes apart across a warp: 16 cache lines a load instruction). Per token the same sums
// in the same order as dw_bwd_couple_kernel (dx over the taps jj = 0, 1, ...; sk over m = 0, 1, ...).
#define DXR 2
template <int K0, typename TD>
static __global__ void dx_couple8_rows_kernel(bf16 *dq, bf16 *dk, const TD *dmid, const float *w0, const bf16 *dqp,
                                              const bf16 *dkp, kiln_conv_shape s, int NH, int KV, int ldq, int ldk) {
    pdl_wait();
    const int C = (int)s.C, T = (int)s.T, k1 = (int)s.k1, P = K0 - 1 + k1 - 1, M = T + k1 - 1;
    const int D = C / (int)s.groups, D8 = D / 8, Q = NH * D, Kc = KV * D, G = NH / KV;
    const int strips = (T + DXR - 1) / DXR;
    const int64_t total = s.B * (int64_t)strips * KV * D8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t sr = e / (KV * D8);
        const int rem = (int)(e - sr * (KV * D8)), j = rem / D8, d = (rem % D8) * 8;
        const int64_t bb = sr / strips;
        const int t0 = (int)(sr - bb * strips) * DXR, nt = T - t0 < DXR ? T - t0 : DXR;
        const TD *dmb = dmid + bb * M * C;
        float sk[DXR][8];
#pragma unroll
        for (int r = 0; r < DXR; r++)
#pragma unroll
            for (int k = 0; k < 8; k++) sk[r][k] = 0.0f;
        for (int m = 0; m <= G; m++) {
            const int c = m < G ? (j * G + m) * D + d : Q + j * D + d;
            float wv[8 * K0]; // wv[k*K0 + jj] = w0[(c + k)*K0 + jj]
#pragma unroll
            for (int q = 0; q < 2 * K0; q++) ldv<4>(w0 + (int64_t)c * K0 + 4 * q, 0, wv + 4 * q);
#pragma unroll
            for (int r = 0; r < DXR; r++) {
                if (r >= nt) break;
                const int t = t0 + r;
                const int64_t row = bb * T + t;
                float dx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
                for (int jj = 0; jj < K0; jj++) {
                    const int u = t + P - jj;
                    if (u < 0 || u >= M) continue;
                    float gv[8];
                    ld8(dmb + (int64_t)u * C + c, gv);
#pragma unroll
                    for (int k = 0; k < 8; k++) dx[k] += gv[k] * wv[k * K0 + jj];
                }
                float o[8];
                if (m < G) {
                    float dqv[8], dkg[8]; // dkg read again for each m (a cache hit) rather than held in registers
                    ld_bf<8>(dqp + row * Q + c, dqv), ld_bf<8>(dkp + row * Kc + j * D + d, dkg);
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const float half = 0.5f * (dqv[k] + dkg[k] / (float)G);
                        o[k] = half + dx[k];
                        sk[r][k] += half;
                    }
                    st_bf<8>(dq + row * ldq + c, o);
                } else {
#pragma unroll
                    for (int k = 0; k < 8; k++) o[k] = sk[r][k] + dx[k];
                    st_bf<8>(dk + row * ldk + j * D + d, o);
                }
            }
        }
    }
}
} // namespace ccaf

using namespace ccaf;

// kiln_cca_conv_profile_cuda: each pass timed on request (pass_profile, ops_common.cuh)
static pass_profile<KILN_CCA_NPASS> g_cca_prof;

static cudaError_t cca_mark(int p, int end, cudaStream_t st) { return pass_profile_mark(g_cca_prof, p, end, st); }

extern "C" kiln_error *kiln_cca_conv_profile_cuda(int on) {
    return pass_profile_enable(g_cca_prof, on, "cca_conv pass profile");
}

extern "C" kiln_error *kiln_cca_conv_profile_read_cuda(double us[KILN_CCA_NPASS]) {
    return pass_profile_read(g_cca_prof, us, "cca_conv pass profile");
}

static kiln_error *check_fused(const char *op, const kiln_conv_shape *s, int64_t NH, int64_t KV, int64_t *ldq,
                               int64_t *ldk) {
    if (s->B <= 0 || s->T <= 0 || s->C <= 0 || s->groups <= 0 || s->k0 <= 0 || s->k1 <= 0 || s->C % s->groups ||
        NH <= 0 || KV <= 0 || NH % KV || NH + KV != s->groups)
        return kiln_errorf(KILN_EINVAL,
                           "%s: bad shape B=%lld T=%lld C=%lld groups=%lld k0=%lld k1=%lld heads=%lld kv_heads=%lld "
                           "(groups must be heads + kv_heads)",
                           op, (long long)s->B, (long long)s->T, (long long)s->C, (long long)s->groups,
                           (long long)s->k0, (long long)s->k1, (long long)NH, (long long)KV);
    if ((s->T + s->k1) * s->C >= INT32_MAX || (s->C / s->groups) * s->C * s->k1 >= INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "%s: one sequence (T=%lld, C=%lld, k1=%lld) exceeds 32-bit indexing", op,
                           (long long)s->T, (long long)s->C, (long long)s->k1);
    if (s->B * s->groups > 65535)
        return kiln_errorf(KILN_EINVAL, "%s: %lld sequences x %lld groups exceed the launch grid", op, (long long)s->B,
                           (long long)s->groups);
    const int64_t cg = s->C / s->groups;
    if (!*ldq) *ldq = NH * cg;
    if (!*ldk) *ldk = KV * cg;
    if (*ldq < NH * cg || *ldk < KV * cg || (s->B * s->T - 1) * (*ldq > *ldk ? *ldq : *ldk) + s->C >= INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "%s: row strides ldq=%lld (q has %lld channels), ldk=%lld (k has %lld)", op,
                           (long long)*ldq, (long long)(NH * cg), (long long)*ldk, (long long)(KV * cg));
    return NULL;
}
// 16-byte vectors along rows ld elements apart
static int rows16(const void *p, int64_t ld) { return aligned16(p) && ld % 8 == 0; }

// The grouped GEMMs' weight: hi + lo by default (~16 significant bits); KILN_CCA_W1=bf16 multiplies w1's bf16
// rounding alone, as every other GEMM weight of the model and the reference's autocast conv1d do: half the MMAs
// and weight loads (fwd 200 -> 164 us, bwd 403 -> 363 us a call at issue [cuda]'s shape; 0.5 ms of a training
// step, run s16r4 in docs/perf.md), but opt-in: under it gpu_zaya_cli_logits_cuda failed in run s16r6 (logits
// 3.0e-2 from the reference's, tolerance 2e-2, and expert gradients up to 0.32 apart: top-1 routing flips)
static int w1_lo(void) {
    const char *e = getenv("KILN_CCA_W1");
    return !(e && !strcmp(e, "bf16"));
}

// The backward's dmid (the grouped stage's input gradient, written once and read by the depthwise stage's two
// passes) in bf16 where the wgmma kernel writes it and the 16-byte kernels read it: one rounding of an f32 sum,
// as the reference's autocast conv1d keeps this gradient; 12 -> 6 bytes an element (session 26).
// KILN_CCA_DMID=f32 keeps it f32.
static int dmid_bf16_on(void) {
    const char *e = getenv("KILN_CCA_DMID");
    return !(e && !strcmp(e, "f32"));
}

// KILN_CCA_TILE=64 keeps heads of 128 channels on grp_kernel's 64 x 64 tiles (a comparison; grp128_kernel
// otherwise)
static int use_tile128(int64_t cg) {
    const char *e = getenv("KILN_CCA_TILE");
    return cg % BT == 0 && !(e && !strcmp(e, "64"));
}
// the grouped GEMMs of heads of exactly 128 channels (the forward's, and the backward's input gradient) go to the
// wgmma kernel (cca_conv_wg.cu) where it takes the call. For comparison: KILN_CCA_TILE=128 / 64 keep the tile
// kernels in both directions; `var`=`off` one direction's previous kernel alone, the other unchanged (A/B timing
// of the step): KILN_CCA_FWD=wmma grp128_kernel, KILN_CCA_BWD=mma grpp_bwd_kernel, KILN_CCA_DW1=wmma dw1_128_kernel
static int use_wgmma(int64_t cg, const char *var, const char *off) {
    const char *e = getenv("KILN_CCA_TILE"), *f = getenv(var);
    return cg == 128 && !(e && (!strcmp(e, "64") || !strcmp(e, "128"))) && !(f && !strcmp(f, off));
}
// otherwise the input-gradient GEMM of heads of exactly 128 channels goes to the persistent grpp_bwd_kernel when
// its shared memory fits (two taps with w1's hi and lo: 190 KB), `bpg` blocks a group filling the SMs;
// KILN_CCA_TILE=128 keeps grp128_kernel (and =64 grp_kernel), for comparison
static int use_persistent(int64_t cg, int64_t k1, int64_t groups, int *bpg) {
    const char *e = getenv("KILN_CCA_TILE");
    int dev, optin, nsm;
    if (cg != 128 || (e && (!strcmp(e, "64") || !strcmp(e, "128"))) || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        grpp_smem(cg * k1, w1_lo()) > (size_t)optin || groups > 65535)
        return 0;
    *bpg = nsm / groups > 1 ? (int)(nsm / groups) : 1;
    return 1;
}

// w1 split for the FAST grouped GEMMs: scratch of 2 x C*cg*k1 bf16 (hi, then lo)
template <int MODE>
static cudaError_t split_w1(bf16 **wh, const float *w1, const kiln_conv_shape *s, cudaStream_t st) {
    const int64_t cg = s->C / s->groups, ne = s->C * cg * s->k1;
    cudaError_t e = kiln_ops_scratch((void **)wh, (size_t)(2 * ne) * sizeof(bf16), st);
    if (e != cudaSuccess) return e;
    kiln_launch(w1_split_kernel<MODE>, grid_for(ne, 256), 256, 0, st, *wh, *wh + ne, w1, (int)s->groups, (int)cg,
                (int)s->k1);
    return cudaGetLastError();
}

extern "C" kiln_error *kiln_cca_conv_couple_forward_cuda(kiln_bf16 *qpre, kiln_bf16 *kpre, kiln_bf16 *mid,
                                                         const kiln_bf16 *q, const kiln_bf16 *k, const float *w0,
                                                         const float *b0, const float *w1, const float *b1,
                                                         const kiln_conv_shape *s, int64_t NH, int64_t KV,
                                                         int64_t ldq, int64_t ldk, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *wh = NULL;
    KILN_TRY(check_fused("cca_conv_couple forward", s, NH, KV, &ldq, &ldk));
    {
        const int64_t M = s->T + s->k1 - 1, cg = s->C / s->groups, ne = s->C * cg * s->k1;
        const int64_t Q = NH * cg;
        const int vec = s->C % 8 == 0 && Q % 8 == 0 && aligned16(mid) && rows16(q, ldq) && rows16(k, ldk);
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW_FWD, 0, st));
        const int64_t strips = s->B * ((M + DWF_ROWS - 1) / DWF_ROWS) * (s->C / 8);
        const int rows = vec && aligned16(w0) && aligned16(b0) && s->k0 <= 4;
        if (rows && s->k0 == 1)
            kiln_launch(dw_fwd_rows_kernel<1>, grid_for(strips, 256), 256, 0, st, (bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, w0, b0, *s, (int)Q, (int)ldq, (int)ldk);
        else if (rows && s->k0 == 2)
            kiln_launch(dw_fwd_rows_kernel<2>, grid_for(strips, 256), 256, 0, st, (bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, w0, b0, *s, (int)Q, (int)ldq, (int)ldk);
        else if (rows && s->k0 == 3)
            kiln_launch(dw_fwd_rows_kernel<3>, grid_for(strips, 256), 256, 0, st, (bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, w0, b0, *s, (int)Q, (int)ldq, (int)ldk);
        else if (rows)
            kiln_launch(dw_fwd_rows_kernel<4>, grid_for(strips, 256), 256, 0, st, (bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, w0, b0, *s, (int)Q, (int)ldq, (int)ldk);
        else
            kiln_launch(dw_fwd_kernel, grid_for(s->B * M * s->C, 256), 256, 0, st, (bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, w0, b0, *s, (int)Q, (int)ldq, (int)ldk);
        LAUNCH_CHECK("cca_conv_couple forward (depthwise)");
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW_FWD, 1, st));
        CUDA_TRY(cca_mark(KILN_CCA_PASS_GRP_FWD, 0, st));
        const dim3 grid((unsigned)((s->T + FT - 1) / FT), (unsigned)((cg + FT - 1) / FT), (unsigned)(s->B * s->groups));
        if (vec && use_wgmma(cg, "KILN_CCA_FWD", "wmma") &&
            kiln_cca_grp_fwd_wg_ok(s, NH, KV, mid, q, ldq, k, ldk, qpre, kpre, w1_lo())) {
            if ((err = kiln_cca_grp_fwd_wg(qpre, kpre, mid, q, ldq, k, ldk, w1, b1, s, NH, KV, w1_lo(), st))) goto done;
        } else if (vec && use_tile128(cg) && aligned16(qpre) && aligned16(kpre)) {
            CUDA_TRY(split_w1<0>(&wh, w1, s, st));
            auto kern = w1_lo() ? grp128_kernel<0, true> : grp128_kernel<0, false>;
            CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM128));
            const dim3 g128((unsigned)((s->T + BT - 1) / BT), (unsigned)(cg / BT), (unsigned)(s->B * s->groups));
            kiln_launch(kern, g128, 256, SMEM128, st, (bf16 *)qpre, (bf16 *)kpre, NULL, (const bf16 *)mid,
                        (const bf16 *)q, (const bf16 *)k, NULL, NULL, wh, wh + ne, b1, *s, (int)NH, (int)KV, (int)ldq,
                        (int)ldk);
        } else if (vec && cg % FT == 0) {
            CUDA_TRY(split_w1<0>(&wh, w1, s, st));
            auto kern = w1_lo() ? grp_kernel<0, true, true> : grp_kernel<0, true, false>;
            kiln_launch(kern, grid, 128, 0, st, (bf16 *)qpre, (bf16 *)kpre, NULL, (const bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, NULL, NULL, w1, wh, wh + ne, b1, *s, (int)NH, (int)KV, (int)ldq, (int)ldk);
        } else {
            auto kern = w1_lo() ? grp_kernel<0, false, true> : grp_kernel<0, false, false>;
            kiln_launch(kern, grid, 128, 0, st, (bf16 *)qpre, (bf16 *)kpre, NULL, (const bf16 *)mid, (const bf16 *)q,
                        (const bf16 *)k, NULL, NULL, w1, NULL, NULL, b1, *s, (int)NH, (int)KV, (int)ldq, (int)ldk);
        }
        LAUNCH_CHECK("cca_conv_couple forward (grouped + coupling)");
        CUDA_TRY(cca_mark(KILN_CCA_PASS_GRP_FWD, 1, st));
    }
done:
    if (wh) cudaFreeAsync(wh, st);
    return err;
}

// The depthwise stage's backward through its 16-byte kernels, the taps as a template argument: dw0 / db0 partials
// (when p0 or pb0), then dx + the coupling's adjoint; dmid as TD (f32, or bf16 from the wgmma input gradient)
template <int K0, typename TD>
static kiln_error *depthwise_bwd8_k(bf16 *dq, bf16 *dk, float *p0, float *pb0, const TD *dmid, const bf16 *q,
                                    const bf16 *k, const float *w0, const bf16 *dqpre, const bf16 *dkpre,
                                    const kiln_conv_shape *s, int64_t NH, int64_t KV, int64_t cps0, int64_t ldq,
                                    int64_t ldk, cudaStream_t st) {
    kiln_error *err = NULL;
    const int64_t C = s->C, cg = C / s->groups, Q = NH * cg;
    if (p0 || pb0) {
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW0, 0, st));
        const int64_t c8 = C / 8;
        const int threads = c8 >= 256 ? 256 : (int)((c8 + 31) / 32 * 32);
        kiln_launch(dw0_part8_taps_kernel<K0, TD>, (unsigned)(s->B * cps0), threads, 0, st, p0, pb0, dmid, q, k, *s,
                    (int)Q, (int)cps0, (int)ldq, (int)ldk);
        LAUNCH_CHECK("cca_conv_couple backward (depthwise weights)");
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW0, 1, st));
    }
    CUDA_TRY(cca_mark(KILN_CCA_PASS_DX, 0, st));
    {
        const int64_t nx = s->B * ((s->T + DXR - 1) / DXR) * KV * cg / 8;
        kiln_launch(dx_couple8_rows_kernel<K0, TD>, grid_for(nx, 256), 256, 0, st, dq, dk, dmid, w0, dqpre, dkpre, *s,
                    (int)NH, (int)KV, (int)ldq, (int)ldk);
        LAUNCH_CHECK("cca_conv_couple backward (input + coupling)");
    }
    CUDA_TRY(cca_mark(KILN_CCA_PASS_DX, 1, st));
done:
    return err;
}
template <typename TD>
static kiln_error *depthwise_bwd8(bf16 *dq, bf16 *dk, float *p0, float *pb0, const TD *dmid, const bf16 *q,
                                  const bf16 *k, const float *w0, const bf16 *dqpre, const bf16 *dkpre,
                                  const kiln_conv_shape *s, int64_t NH, int64_t KV, int64_t cps0, int64_t ldq,
                                  int64_t ldk, cudaStream_t st) {
    switch (s->k0) {
    case 1: return depthwise_bwd8_k<1>(dq, dk, p0, pb0, dmid, q, k, w0, dqpre, dkpre, s, NH, KV, cps0, ldq, ldk, st);
    case 2: return depthwise_bwd8_k<2>(dq, dk, p0, pb0, dmid, q, k, w0, dqpre, dkpre, s, NH, KV, cps0, ldq, ldk, st);
    case 3: return depthwise_bwd8_k<3>(dq, dk, p0, pb0, dmid, q, k, w0, dqpre, dkpre, s, NH, KV, cps0, ldq, ldk, st);
    default: return depthwise_bwd8_k<4>(dq, dk, p0, pb0, dmid, q, k, w0, dqpre, dkpre, s, NH, KV, cps0, ldq, ldk, st);
    }
}

extern "C" kiln_error *kiln_cca_conv_couple_backward_cuda(kiln_bf16 *dq, kiln_bf16 *dk, float *dw0, float *db0,
                                                          float *dw1, float *db1, float *dmid, int *dmid_bf16,
                                                          const kiln_bf16 *dqpre,
                                                          const kiln_bf16 *dkpre, const kiln_bf16 *q, const kiln_bf16 *k,
                                                          const kiln_bf16 *mid, const float *w0, const float *w1,
                                                          const kiln_conv_shape *s, int64_t NH, int64_t KV,
                                                          int64_t ldq, int64_t ldk, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *p1 = NULL, *pb1 = NULL, *p0 = NULL, *pb0 = NULL;
    bf16 *wh = NULL;
    KILN_TRY(check_fused("cca_conv_couple backward", s, NH, KV, &ldq, &ldk));
    if (!dq || !dk || !dmid) return kiln_errorf(KILN_EINVAL, "cca_conv_couple backward: dq, dk and dmid are required");
    if (dmid_bf16) *dmid_bf16 = 0;
    {
        const int64_t B = s->B, T = s->T, C = s->C, k0 = s->k0, k1 = s->k1, M = T + k1 - 1, cg = C / s->groups;
        const int64_t cps1 = (T + W1_CHUNK - 1) / W1_CHUNK, cps0 = (M + DW_ROWS - 1) / DW_ROWS;
        const int64_t ne1 = C * cg * k1;
        const int fast = C % 8 == 0 && cg % FT == 0 && aligned16(dqpre) && aligned16(dkpre) && aligned16(mid);
        if (B * cps1 > 65535 || B * cps0 > INT32_MAX)
            return kiln_errorf(KILN_EINVAL, "cca_conv_couple backward: %lld sequences of %lld steps", (long long)B,
                               (long long)T);
        const int t128 = fast && use_tile128(cg) && aligned16(dmid);
        // the depthwise stage through 16-byte accesses with the taps a template argument (depthwise_bwd8); the other
        // shapes (and more than 4 taps) through dw_bwd_couple_kernel, one pass for both
        const int vec8 = cg % 8 == 0 && k0 <= 4 && rows16(dq, ldq) && rows16(dk, ldk) && aligned16(dqpre) &&
                         aligned16(dkpre) && rows16(q, ldq) && rows16(k, ldk) && aligned16(dmid) && aligned16(w0);
        int dbf = 0; // dmid stored as bf16
        // dw1 on wgmma: `wparts` partials (one per CTA), else B * cpsw chunks' (KILN_CCA_DW1=wmma: dw1_128_kernel)
        const int wparts = fast && (dw1 || db1) && use_wgmma(cg, "KILN_CCA_DW1", "wmma")
                               ? kiln_cca_dw1_wg_parts(s, NH, KV, dqpre, dkpre, mid)
                               : 0;
        const int64_t cpsw = t128 ? (T + W1_CHUNK128 - 1) / W1_CHUNK128 : cps1; // dw1's chunks per sequence
        const int64_t nparts = wparts ? wparts : B * cpsw;
        if (B * cpsw > 65535)
            return kiln_errorf(KILN_EINVAL, "cca_conv_couple backward: %lld sequences of %lld steps", (long long)B,
                               (long long)T);
        if (dw1 || db1) CUDA_TRY(kiln_ops_scratch((void **)&p1, (size_t)(nparts * ne1) * sizeof(float), st));
        if (db1) CUDA_TRY(kiln_ops_scratch((void **)&pb1, (size_t)(nparts * C) * sizeof(float), st));
        if (dw0) CUDA_TRY(kiln_ops_scratch((void **)&p0, (size_t)(B * cps0 * C * k0) * sizeof(float), st));
        if (db0) CUDA_TRY(kiln_ops_scratch((void **)&pb0, (size_t)(B * cps0 * C) * sizeof(float), st));
        // the grouped stage: weights (+ bias), then its input gradient
        if (dw1 || db1) {
            CUDA_TRY(cca_mark(KILN_CCA_PASS_DW1, 0, st));
            const int64_t tiles = ((cg + FT - 1) / FT) * ((cg * k1 + FT - 1) / FT);
            const dim3 grid((unsigned)tiles, (unsigned)(B * cps1), (unsigned)s->groups);
            if (wparts) {
                if ((err = kiln_cca_dw1_wg(p1, pb1, wparts, dqpre, dkpre, mid, s, NH, KV, st))) goto done;
            } else if (t128) {
                CUDA_TRY(cudaFuncSetAttribute(dw1_128_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM128W));
                const dim3 gw((unsigned)((cg / BT) * (cg * k1 / BT)), (unsigned)(B * cpsw), (unsigned)s->groups);
                kiln_launch(dw1_128_kernel, gw, 256, SMEM128W, st, p1, pb1, (const bf16 *)dqpre, (const bf16 *)dkpre,
                            (const bf16 *)mid, *s, (int)NH, (int)KV, (int)cpsw);
            } else if (fast)
                kiln_launch(dw1_kernel<true>, grid, 128, 0, st, p1, pb1, (const bf16 *)dqpre, (const bf16 *)dkpre,
                            (const bf16 *)mid, *s, (int)NH, (int)KV, (int)cps1);
            else
                kiln_launch(dw1_kernel<false>, grid, 128, 0, st, p1, pb1, (const bf16 *)dqpre, (const bf16 *)dkpre,
                            (const bf16 *)mid, *s, (int)NH, (int)KV, (int)cps1);
            LAUNCH_CHECK("cca_conv_couple backward (grouped weights)");
            if (dw1 && fast) {
                kiln_launch(dw1_sum_kernel, grid_for(ne1, 256), 256, 0, st, dw1, p1, nparts, C, (int)cg, (int)k1);
                LAUNCH_CHECK("cca_conv_couple backward (grouped weights, sum)");
            } else if (dw1) {
                CUDA_TRY(colsum_add(dw1, p1, nparts, ne1, st));
            }
            if (db1) CUDA_TRY(colsum_add(db1, pb1, nparts, C, st));
            CUDA_TRY(cca_mark(KILN_CCA_PASS_DW1, 1, st));
        }
        CUDA_TRY(cca_mark(KILN_CCA_PASS_GRP_BWD, 0, st));
        const dim3 grid((unsigned)((M + FT - 1) / FT), (unsigned)((cg + FT - 1) / FT), (unsigned)(B * s->groups));
        int bpg;
        if (fast && use_wgmma(cg, "KILN_CCA_BWD", "mma") &&
            kiln_cca_grp_bwd_wg_ok(s, NH, KV, dmid, dqpre, dkpre, w1_lo())) {
            // dmid in bf16 where the depthwise stage's 16-byte kernels read it (KILN_CCA_DMID=f32: f32)
            dbf = vec8 && dmid_bf16_on();
            if ((err = kiln_cca_grp_bwd_wg(dmid, dbf, dqpre, dkpre, w1, s, NH, KV, w1_lo(), st))) goto done;
        } else if (fast && aligned16(dmid) && use_persistent(cg, k1, s->groups, &bpg)) {
            CUDA_TRY(split_w1<1>(&wh, w1, s, st));
            auto kern = w1_lo() ? grpp_bwd_kernel<true> : grpp_bwd_kernel<false>;
            const size_t sm = grpp_smem(cg * k1, w1_lo());
            CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            kiln_launch(kern, (unsigned)(s->groups * bpg), 256, sm, st, dmid, (const bf16 *)dqpre,
                        (const bf16 *)dkpre, wh, wh + ne1, *s, (int)NH, (int)KV, bpg);
        } else if (t128) {
            CUDA_TRY(split_w1<1>(&wh, w1, s, st));
            auto kern = w1_lo() ? grp128_kernel<1, true> : grp128_kernel<1, false>;
            CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM128));
            const dim3 g128((unsigned)((M + BT - 1) / BT), (unsigned)(cg / BT), (unsigned)(B * s->groups));
            kiln_launch(kern, g128, 256, SMEM128, st, NULL, NULL, dmid, NULL, NULL, NULL, (const bf16 *)dqpre,
                        (const bf16 *)dkpre, wh, wh + ne1, NULL, *s, (int)NH, (int)KV, 0, 0);
        } else if (fast) {
            CUDA_TRY(split_w1<1>(&wh, w1, s, st));
            auto kern = w1_lo() ? grp_kernel<1, true, true> : grp_kernel<1, true, false>;
            kiln_launch(kern, grid, 128, 0, st, NULL, NULL, dmid, NULL, NULL, NULL, (const bf16 *)dqpre,
                        (const bf16 *)dkpre, w1, wh, wh + ne1, NULL, *s, (int)NH, (int)KV, 0, 0);
        } else {
            auto kern = w1_lo() ? grp_kernel<1, false, true> : grp_kernel<1, false, false>;
            kiln_launch(kern, grid, 128, 0, st, NULL, NULL, dmid, NULL, NULL, NULL, (const bf16 *)dqpre,
                        (const bf16 *)dkpre, w1, NULL, NULL, NULL, *s, (int)NH, (int)KV, 0, 0);
        }
        LAUNCH_CHECK("cca_conv_couple backward (grouped input)");
        CUDA_TRY(cca_mark(KILN_CCA_PASS_GRP_BWD, 1, st));
        // the depthwise stage and the coupling
        const int64_t kvd = KV * cg;
        if (vec8) {
            if ((err = dbf ? depthwise_bwd8((bf16 *)dq, (bf16 *)dk, p0, pb0, (const bf16 *)dmid, (const bf16 *)q,
                                            (const bf16 *)k, w0, (const bf16 *)dqpre, (const bf16 *)dkpre, s, NH, KV,
                                            cps0, ldq, ldk, st)
                           : depthwise_bwd8((bf16 *)dq, (bf16 *)dk, p0, pb0, (const float *)dmid, (const bf16 *)q,
                                            (const bf16 *)k, w0, (const bf16 *)dqpre, (const bf16 *)dkpre, s, NH, KV,
                                            cps0, ldq, ldk, st)))
                goto done;
        } else {
            CUDA_TRY(cca_mark(KILN_CCA_PASS_DX, 0, st));
            const int threads = kvd >= 256 ? 256 : (int)((kvd + 31) / 32 * 32);
            kiln_launch(dw_bwd_couple_kernel, (unsigned)(B * cps0), threads, 0, st, (bf16 *)dq, (bf16 *)dk, p0, pb0,
                        dmid, (const bf16 *)q, (const bf16 *)k, w0, (const bf16 *)dqpre, (const bf16 *)dkpre, *s,
                        (int)NH, (int)KV, (int)cps0, (int)ldq, (int)ldk);
            LAUNCH_CHECK("cca_conv_couple backward (depthwise + coupling)");
            CUDA_TRY(cca_mark(KILN_CCA_PASS_DX, 1, st));
        }
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW0_SUM, 0, st));
        // the partials' columns summed 32 a block, rows read coalesced (colsum_add reads a column a block, 4 bytes
        // a row: 25.4 against 18.3 us a call at issue [cuda]'s 516 x (2560 + 1280), session 24 r8)
        if (dw0) CUDA_TRY(colsum_add_multi(&dw0, 1, p0, B * cps0, C * k0, st));
        if (db0) CUDA_TRY(colsum_add_multi(&db0, 1, pb0, B * cps0, C, st));
        CUDA_TRY(cca_mark(KILN_CCA_PASS_DW0_SUM, 1, st));
        if (dmid_bf16) *dmid_bf16 = dbf;
    }
done:
    if (wh) cudaFreeAsync(wh, st);
    if (p1) cudaFreeAsync(p1, st);
    if (pb1) cudaFreeAsync(pb1, st);
    if (p0) cudaFreeAsync(p0, st);
    if (pb0) cudaFreeAsync(pb0, st);
    return err;
}
