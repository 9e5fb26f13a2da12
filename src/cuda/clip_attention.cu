// CLIP's vision attention on tensor cores: non-causal multi-head attention over short sequences (50 tokens
// for B/32, 257 for L/14, 577 for L/14-336) read straight out of the fused qkv activations [B*T, 3H] (row
// stride `stride`) and written into [B*T, out_stride], with the online softmax in registers, so no T x T matrix
// reaches memory (the batched-GEMM path of clip_ops.cu writes S in f32 and P in bf16: ~1.6 GB per L/14 layer at
// 128 images). P is rounded to bf16 as the MMA operand, as flash attention does. Four kernels:
//  - short sequences, hd 64 (clip_attn_wg_kernel): one block per (image, head) holding that head's whole K and
//    V in shared memory, m64 query tiles on wgmma; L/14 at 64 images in 0.092 ms against cuDNN's 0.123 (cuDNN's
//    128 x 128 tiles make 257 tokens 3 x 3 tiles; here keys pad to 272 and the last row is split over warps);
//  - the same at T mod 64 <= 16 and 4 tiles (clip_attn_wgp_kernel, the default there): persistent, one block
//    an SM walking (image, head) items, the next ones' K, V and Q loading into a second buffer and each item's
//    row tail run by one warpgroup beside the others' next tiles; L/14 at 64 images in 0.0765 ms (H100);
//  - short sequences, hd 32 (clip_attn_short_kernel): the same block shape on mma.sync;
//  - anything else the others do not take (clip_attn_kernel): a block owns 64 query rows of one (image, head)
//    (4 warps x 16 rows) and streams 64-key tiles of K and V (double-buffered with cp.async), mma.sync
//    m16n8k16 (bf16 in, f32 accumulate). Keys past T are masked; query rows past T are computed on zeros and
//    not stored.
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clip_attention.cuh"
#include "cuda_check.h"
#include "mma_bf16.cuh"
#include "wgmma.cuh"
#include "launch.cuh"

typedef __nv_bfloat16 bf16;

#define CA_THREADS 128
#define CA_BM 64
#define CA_BN 64

// grid (query tiles from query q0 on, heads, B)
template <int D>
static __global__ void __launch_bounds__(CA_THREADS)
    clip_attn_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int q0, int64_t stride,
                     int64_t out_stride, float scale_log2) {
    pdl_wait();
    constexpr int BM = CA_BM, BN = CA_BN, LD = D + 8; // +8 bf16 per row: conflict-free ldmatrix
    extern __shared__ __align__(16) unsigned char ca_smem_buf[];
    bf16 *Qs = (bf16 *)ca_smem_buf, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD;
    const int b = blockIdx.z, h = blockIdx.y, i0 = q0 + blockIdx.x * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t base = (int64_t)b * T * stride + (int64_t)h * D;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    load_tile_async<D, BM, CA_THREADS>(Qs, LD, qb + (int64_t)i0 * stride, stride, T - i0, q);
    load_tile_async<D, BN, CA_THREADS>(Ks, LD, kb, stride, T, k);
    load_tile_async<D, BN, CA_THREADS>(Vs, LD, vb, stride, T, v);
    cp_async_commit();

    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    zero_acc<D / 8>(o);
    uint32_t qf[D / 16][4];
    const bool active = i0 + warp * 16 < T;
    for (int j0 = 0, it = 0; j0 < T; j0 += BN, it++) {
        const int cur = it & 1, nj = j0 + BN;
        if (nj < T) {
            load_tile_async<D, BN, CA_THREADS>(Ks + (cur ^ 1) * BN * LD, LD, kb + (int64_t)nj * stride, stride, T - nj, k);
            load_tile_async<D, BN, CA_THREADS>(Vs + (cur ^ 1) * BN * LD, LD, vb + (int64_t)nj * stride, stride, T - nj, v);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
        }
        // a warp whose 16 rows all lie past T (the last query tile of L/14's 257 tokens holds one row) only
        // helps load; in the last key tile only the 16-key steps holding keys < T are computed
        if (active) {
            const int lim = T - j0; // keys of this tile that exist (> 0)
            const bf16 *Kc = Ks + cur * BN * LD, *Vc = Vs + cur * BN * LD;
            // s[16 x BN] = Q Kᵀ for this warp's 16 rows
            float s[BN / 8][4];
            zero_acc<BN / 8>(s);
#pragma unroll
            for (int k0 = 0; k0 < D; k0 += 16) {
#pragma unroll
                for (int n0 = 0; n0 < BN; n0 += 16) {
                    if (n0 >= lim) continue;
                    uint32_t bf[4];
                    ldsm_x4(bf, Kc + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8);
                    mma16816(s[n0 / 8], qf[k0 / 16], bf[0], bf[1]);
                    mma16816(s[n0 / 8 + 1], qf[k0 / 16], bf[2], bf[3]);
                }
            }
            const bool mask = nj > T; // the last tile reaches past the sequence
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[nt][e] * scale_log2;
                    if (mask && j0 + nt * 8 + 2 * t + (e & 1) >= T) x = -INFINITY;
                    s[nt][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            online_softmax_m16<BN, D / 8, false>(s, mx, m, l, o); // every tile holds at least one key < T
            uint32_t pa[BN / 16][4];
            pack_a<BN>(pa, s);
            // o[16 x D] += P[16 x BN] V[BN x D]
#pragma unroll
            for (int k0 = 0; k0 < BN; k0 += 16) {
                if (k0 >= lim) continue; // p = 0 there
#pragma unroll
                for (int n0 = 0; n0 < D; n0 += 16) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, Vc + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
                    mma16816(o[n0 / 8], pa[k0 / 16], bf[0], bf[1]);
                    mma16816(o[n0 / 8 + 1], pa[k0 / 16], bf[2], bf[3]);
                }
            }
        }
        __syncthreads(); // buffer cur is refilled by the next iteration
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
    }
    const int r0 = i0 + warp * 16 + g;
    if (!active) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = r0 + 8 * r;
        if (i >= T) continue;
        const float inv = 1.f / l[r];
        bf16 *orow = out + ((int64_t)b * T + i) * out_stride + (int64_t)h * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *(__nv_bfloat162 *)(orow + dt * 8 + 2 * t) = __floats2bfloat162_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
}

// ---- short sequences: one block per (image, head), that head's whole K and V in shared memory ----
//
// Why: cuDNN works in 128-query x 128-key tiles, so L/14's 257 tokens cost it 3 x 3 tiles for 2.01 x 2.01
// tiles' worth of work, and the streaming kernel above re-reads K/V once per 64 queries and pays a fifth
// 64-row block for the class token. Here a block loads K and V of its (image, head) once (cp.async, in
// 64-key groups so the first keys are used while the rest arrive), keys padded with zeros to a multiple of
// 16 only (257 -> 272; S skips the 8-key halves past T: 264). Each warp owns pairs of m16 query tiles
// (32 rows; one K or V fragment load feeds both tiles' MMAs, which is what took attention_mma.cu's
// attn_fwd_mma2 past the ldmatrix bound of one tile per warp) and its Q fragments come straight from global
// memory into registers (no shared memory for Q). Pairs go round-robin over the warps; the pairs of the
// last, partial round are split along the keys over all warps (L/14: rows 256..271, one valid row, over
// 4 warps = 17 key tiles of 16 split 4/4/4/5), each slice's (max, sum, unnormalised output) goes to shared
// memory (over K/V, done by then) and is combined there, so no warp does 1.5x the work of the others.
// Shared memory is unpadded with an XOR swizzle of the 16-byte chunks (conflict-free ldmatrix), so a head
// of T = 257, hd 64 takes 69.6 KB. exp2 with the scale folded into one FMA (raw scores carried as maxima).
// Measured (H200, B = 64, T = 257, 16 heads): 0.146 ms, 118 TFLOP/s, 255 registers so 2 blocks (8 warps) an
// SM, latency-bound (one warp an SM sub-partition ran 90 TFLOP/s, two 141); the wgmma kernel below replaced it
// at hd 64. It runs hd 32 (and hd 64 with KILN_CLIP_ATTN_SHORT_CFG=mma).

#define CS_LG 64 // keys per cp.async group

// a block barrier that warps may reach from different branches (each branch with the same count of them):
// bar.sync is .aligned, which requires every thread of the block to execute the same instruction
static __device__ __forceinline__ void cs_bar(void) { asm volatile("barrier.sync 0;\n" ::: "memory"); }

// element offset of (row r, 16-byte chunk c) in an unpadded [rows][D] bf16 array, chunks XOR-swizzled so
// that 8 consecutive rows at one chunk index fall in 8 different 16-byte bank groups
template <int D>
static __device__ __forceinline__ int cs_key(int r) {
    return D >= 64 ? r & 7 : (r >> 1) & 3; // D = 32: two rows per 128 bytes
}
template <int D>
static __device__ __forceinline__ int cs_swz(int r, int c) {
    return r * D + ((c ^ cs_key<D>(r)) << 3);
}

// rows r0 .. r0 + nr - 1 of one head's K and V (kb, vb: its row 0, rows `stride` apart) into the swizzled arrays,
// 16-byte cp.async copies by nth threads from tid; rows at or past T are zeros (k and v: valid addresses for the
// copies that read nothing)
template <int D>
static __device__ __forceinline__ void cs_load_kv(bf16 *Ks, bf16 *Vs, const bf16 *kb, const bf16 *vb, const bf16 *k,
                                                  const bf16 *v, int r0, int nr, int T, int64_t stride, int tid,
                                                  int nth) {
    constexpr int CH = D / 8;
    for (int e = tid; e < nr * CH; e += nth) {
        const int r = r0 + e / CH, cc = e % CH;
        const bool ok = r < T;
        cp_async16(Ks + cs_swz<D>(r, cc), ok ? kb + (int64_t)r * stride + cc * 8 : k, ok);
        cp_async16(Vs + cs_swz<D>(r, cc), ok ? vb + (int64_t)r * stride + cc * 8 : v, ok);
    }
}

static __device__ __forceinline__ float cs_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// cp.async.wait_group takes an immediate: wait until at most n groups are pending (a smaller n than asked
// for only waits longer, so counts past 7 wait for everything but 7)
static __device__ __forceinline__ void cs_wait(int n) {
    switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
    }
}

// the A fragments (m16 x k16 per kk) of MT query tiles from row0 on, straight from global memory; rows at
// or past T are zeros
template <int D, int MT>
static __device__ __forceinline__ void cs_load_q(uint32_t (&qf)[MT][D / 16][4], const bf16 *qb, int64_t stride,
                                                 int row0, int T, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = row0 + 16 * mt + g + 8 * hf;
            const unsigned int *p = (const unsigned int *)(qb + (int64_t)row * stride + 2 * t);
            const bool ok = row < T;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                qf[mt][kk][hf] = ok ? __ldg(p + kk * 8) : 0u;
                qf[mt][kk][2 + hf] = ok ? __ldg(p + kk * 8 + 4) : 0u;
            }
        }
}

// the A fragments (m16 x k16 per kk) of rows row0 .. row0 + 15 from a swizzled [rows][D] array in shared memory
template <int D>
static __device__ __forceinline__ void cs_ldsm_q(uint32_t (&qf)[D / 16][4], const bf16 *Qs, int row0, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], Qs + cs_swz<D>(row0 + (lane & 15), 2 * kk + (lane >> 4)));
}

// One online-softmax step of MT query tiles over keys j0 .. j0 + nval - 1 (0 < nval <= BN; keys past
// nval in this step are masked; 8-key halves and 16-key steps wholly past nval are skipped). m holds raw
// score maxima, c = scale * log2(e); l holds this thread's partial row sums.
template <int D, int BN, int MT>
static __device__ __forceinline__ void cs_step(float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                               const uint32_t (&qf)[MT][D / 16][4], const bf16 *Ks,
                                               const bf16 *Vs, int j0, int nval, float c, int lane) {
    const int t = lane & 3;
    // this lane's ldmatrix rows: K rows j0 + 16 n16 + rk, V rows j0 + 16 k16 + rv; j0 is a multiple of 16,
    // so their swizzle keys are the lane's alone (hoisted out of the steps)
    const int rk = (lane & 7) + ((lane >> 4) << 3), rv = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int xk = cs_key<D>(rk), xv = cs_key<D>(rv);
    const bf16 *Kl = Ks + (j0 + rk) * D, *Vl = Vs + (j0 + rv) * D;
    float s[MT][BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) zero_acc<BN / 8>(s[mt]);
#pragma unroll
    for (int n16 = 0; n16 < BN / 16; n16++) {
        if (n16 * 16 >= nval) continue;
        const bool hi = n16 * 16 + 8 < nval;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t bf[4];
            ldsm_x4(bf, Kl + n16 * 16 * D + ((2 * kk + ((lane >> 3) & 1)) ^ xk) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(s[mt][2 * n16], qf[mt][kk], bf[0], bf[1]);
                if (hi) mma16816(s[mt][2 * n16 + 1], qf[mt][kk], bf[2], bf[3]);
            }
        }
    }
    const bool part = nval < BN;
    float mc[MT][2], alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (part && nt * 8 + 2 * t + (e & 1) >= nval) s[mt][nt][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][nt][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            const float mn = fmaxf(m[mt][r], mx[r]); // finite: the step holds at least one key
            alpha[mt][r] = cs_ex2((m[mt][r] - mn) * c);
            m[mt][r] = mn;
            mc[mt][r] = mn * c;
        }
    }
    uint32_t pa[MT][BN / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            if (nt * 8 >= nval) {
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
                continue;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = cs_ex2(fmaf(s[mt][nt][e], c, -mc[mt][e >> 1]));
                s[mt][nt][e] = p;
                rs[e >> 1] += p;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) l[mt][r] = l[mt][r] * alpha[mt][r] + rs[r];
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[mt][dt][0] *= alpha[mt][0], o[mt][dt][1] *= alpha[mt][0];
            o[mt][dt][2] *= alpha[mt][1], o[mt][dt][3] *= alpha[mt][1];
        }
        pack_a<BN>(pa[mt], s[mt]);
    }
#pragma unroll
    for (int k16 = 0; k16 < BN / 16; k16++) {
        if (k16 * 16 >= nval) continue; // p = 0 there
#pragma unroll
        for (int n16 = 0; n16 < D / 16; n16++) {
            uint32_t bf[4];
            ldsm_x4_t(bf, Vl + k16 * 16 * D + ((2 * n16 + (lane >> 4)) ^ xv) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(o[mt][2 * n16], pa[mt][k16], bf[0], bf[1]);
                mma16816(o[mt][2 * n16 + 1], pa[mt][k16], bf[2], bf[3]);
            }
        }
    }
}

template <int D, int MT>
static __device__ __forceinline__ void cs_init(float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&l)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        zero_acc<D / 8>(o[mt]);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }
}

// the rows of MT tiles from row0 on that lie before T, normalised, into out (row stride out_stride)
template <int D, int MT>
static __device__ __forceinline__ void cs_store(bf16 *ob, int64_t out_stride, const float (&o)[MT][D / 8][4],
                                                const float (&l)[MT][2], int row0, int T, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lr = quad_sum(l[mt][r]);
            const int i = row0 + 16 * mt + g + 8 * r;
            if (i >= T) continue;
            const float inv = 1.f / lr;
            bf16 *orow = ob + (int64_t)i * out_stride;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++)
                *(__nv_bfloat162 *)(orow + dt * 8 + 2 * t) =
                    __floats2bfloat162_rn(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        }
}

// a key slice's partial result for R = 32 rows (16 where one m16 tile is all there is): unnormalised output
// [R][D + 4] f32 (+4: fewer bank conflicts of the 8-byte stores), then the raw maxima [R] and the row sums [R]
template <int D, int R = 32>
static __host__ __device__ constexpr int cs_part_floats() { return R * (D + 4) + 2 * R; }

template <int D, int MT, int R = 32>
static __device__ __forceinline__ void cs_store_part(float *P, const float (&o)[MT][D / 8][4], const float (&m)[MT][2],
                                                     const float (&l)[MT][2], int lane) {
    static_assert(16 * MT <= R, "the layout's rows hold the tiles'");
    const int g = lane >> 2, t = lane & 3;
    float *pm = P + R * (D + 4), *pl = pm + R;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lr = quad_sum(l[mt][r]);
            const int i = 16 * mt + g + 8 * r;
            if (t == 0) pm[i] = m[mt][r], pl[i] = lr;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++)
                *(float2 *)(P + i * (D + 4) + dt * 8 + 2 * t) = make_float2(o[mt][dt][2 * r], o[mt][dt][2 * r + 1]);
        }
}

// MT tiles of the pair whose first row is row0 over keys ka .. kb - 1 (all of them loaded), into o/m/l
template <int D, int BN, int MT>
static __device__ __forceinline__ void cs_run(float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                              const bf16 *qb, int64_t stride, int row0, int T, const bf16 *Ks,
                                              const bf16 *Vs, int ka, int kb, float c, int lane) {
    uint32_t qf[MT][D / 16][4];
    cs_load_q<D, MT>(qf, qb, stride, row0, T, lane);
    cs_init<D, MT>(o, m, l);
    for (int j0 = ka; j0 < kb; j0 += BN) cs_step<D, BN, MT>(o, m, l, qf, Ks, Vs, j0, min(BN, kb - j0), c, lane);
}

// One warp's pair (MT = 2 row tiles from row0; 1 where the second lies past T) over every key, stored: in round
// 0 chunk by chunk as the key chunks land (each wait is followed by a block barrier, the same count in every
// warp), later with everything loaded.
template <int D, int BN, int MT>
static __device__ __forceinline__ void cs_pair_first(bf16 *ob, int64_t out_stride, const bf16 *qb, int64_t stride,
                                                     int row0, int T, const bf16 *Ks, const bf16 *Vs, int nchunk,
                                                     float c, int lane) {
    float o[MT][D / 8][4], m[MT][2], l[MT][2];
    uint32_t qf[MT][D / 16][4];
    cs_load_q<D, MT>(qf, qb, stride, row0, T, lane);
    cs_init<D, MT>(o, m, l);
    for (int ch = 0; ch < nchunk; ch++) {
        cs_wait(nchunk - 1 - ch);
        cs_bar();
        for (int j0 = ch * CS_LG; j0 < min(T, (ch + 1) * CS_LG); j0 += BN)
            cs_step<D, BN, MT>(o, m, l, qf, Ks, Vs, j0, min(BN, T - j0), c, lane);
    }
    cs_store<D, MT>(ob, out_stride, o, l, row0, T, lane);
}

template <int D, int BN, int MT>
static __device__ __forceinline__ void cs_pair(bf16 *ob, int64_t out_stride, const bf16 *qb, int64_t stride, int row0,
                                               int T, const bf16 *Ks, const bf16 *Vs, float c, int lane) {
    float o[MT][D / 8][4], m[MT][2], l[MT][2];
    cs_run<D, BN, MT>(o, m, l, qb, stride, row0, T, Ks, Vs, 0, T, c, lane);
    cs_store<D, MT>(ob, out_stride, o, l, row0, T, lane);
}

// a key slice ka .. kb - 1 of a pair of the last round, its partial result into P once every warp is done
// reading K and V (the partials go over them)
template <int D, int BN, int MT>
static __device__ __forceinline__ void cs_slice(float *P, const bf16 *qb, int64_t stride, int row0, int T,
                                                const bf16 *Ks, const bf16 *Vs, int ka, int kb, float c, int lane) {
    float o[MT][D / 8][4], m[MT][2], l[MT][2];
    cs_run<D, BN, MT>(o, m, l, qb, stride, row0, T, Ks, Vs, ka, kb, c, lane);
    cs_bar();
    cs_store_part<D, MT>(P, o, m, l, lane);
}

// grid B * heads blocks (image-major), 32 * W threads with W = min(WMAX, pairs of 32 query rows), so every
// warp has a pair in the first round
template <int D, int BN, int WMAX, int MINB>
static __global__ void __launch_bounds__(WMAX * 32, MINB)
    clip_attn_short_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int heads, int64_t stride,
                           int64_t out_stride, float c) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char cs_smem_buf[];
    const int Tk = (T + 15) & ~15, nchunk = (Tk + CS_LG - 1) / CS_LG;
    bf16 *Ks = (bf16 *)cs_smem_buf, *Vs = Ks + (size_t)Tk * D;
    const int b = blockIdx.x / heads, h = blockIdx.x % heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int64_t base = (int64_t)b * T * stride + (int64_t)h * D;
    const bf16 *qb = q + base, *kb = k + base, *vb = v + base;
    bf16 *ob = out + (int64_t)b * T * out_stride + (int64_t)h * D;
    // every key chunk of K and V as its own group (rows T..Tk-1 zero: P is 0 there, and 0 * garbage could be NaN)
    for (int ch = 0; ch < nchunk; ch++) {
        const int r0 = ch * CS_LG;
        cs_load_kv<D>(Ks, Vs, kb, vb, k, v, r0, min(CS_LG, Tk - r0), T, stride, threadIdx.x, blockDim.x);
        cp_async_commit();
    }
    const int npair = (T + 31) >> 5, rounds = npair / W, left = npair - rounds * W;
    // round 0, step by step as the key chunks arrive (a pair with one row tile where the second lies past T)
    if (warp * 32 + 16 < T) cs_pair_first<D, BN, 2>(ob, out_stride, qb, stride, warp * 32, T, Ks, Vs, nchunk, c, lane);
    else cs_pair_first<D, BN, 1>(ob, out_stride, qb, stride, warp * 32, T, Ks, Vs, nchunk, c, lane);
    // the other whole rounds (everything is loaded by now)
    for (int p = warp + W; p < rounds * W; p += W) {
        if (p * 32 + 16 < T) cs_pair<D, BN, 2>(ob, out_stride, qb, stride, p * 32, T, Ks, Vs, c, lane);
        else cs_pair<D, BN, 1>(ob, out_stride, qb, stride, p * 32, T, Ks, Vs, c, lane);
    }
    if (left == 0) return; // uniform over the block
    // the last round's `left` pairs, each split along the keys into S slices of whole 16-key tiles
    const int S = W / left, j = warp / S, sl = warp % S, nk16 = Tk >> 4;
    const int pair = rounds * W + j, row0 = pair * 32;
    const int ka = sl * nk16 / S * 16, kend = min(T, (sl + 1) * nk16 / S * 16);
    float *P = (float *)cs_smem_buf + (size_t)warp * cs_part_floats<D>();
    if (j < left && row0 + 16 < T) cs_slice<D, BN, 2>(P, qb, stride, row0, T, Ks, Vs, ka, kend, c, lane);
    else if (j < left) cs_slice<D, BN, 1>(P, qb, stride, row0, T, Ks, Vs, ka, kend, c, lane);
    else cs_bar(); // the same barrier count as the slices'
    __syncthreads();
    // combine: out = sum_s w_s o_s / sum_s w_s l_s, w_s = exp2((m_s - max m) c), two columns a thread
    const float *P0 = (const float *)cs_smem_buf;
    for (int e = threadIdx.x; e < left * 32 * (D / 2); e += blockDim.x) {
        const int jj = e / (32 * (D / 2)), r = e / (D / 2) % 32, d = e % (D / 2) * 2;
        const int i = (rounds * W + jj) * 32 + r;
        if (i >= T) continue;
        float M = -INFINITY;
        for (int s = 0; s < S; s++) M = fmaxf(M, P0[(size_t)(jj * S + s) * cs_part_floats<D>() + 32 * (D + 4) + r]);
        float den = 0.f, n0 = 0.f, n1 = 0.f;
        for (int s = 0; s < S; s++) {
            const float *Ps = P0 + (size_t)(jj * S + s) * cs_part_floats<D>();
            const float w = cs_ex2((Ps[32 * (D + 4) + r] - M) * c);
            den += w * Ps[32 * (D + 4) + 32 + r];
            const float2 x = *(const float2 *)(Ps + r * (D + 4) + d);
            n0 += w * x.x, n1 += w * x.y;
        }
        const float inv = 1.f / den;
        *(__nv_bfloat162 *)(ob + (int64_t)i * out_stride + d) = __floats2bfloat162_rn(n0 * inv, n1 * inv);
    }
}

// ---- hd 64 on wgmma: a warpgroup per (image, head), S and O on the asynchronous tensor-core path ----
//
// The same block shape (K and V of the head in shared memory, the 128-byte XOR swizzle above being exactly
// wgmma's 128-byte swizzle when the arrays start on 1024 bytes: K is the K-major B operand of S = Q Kᵀ, V the
// MN-major B operand of O = P V), but one warpgroup runs m64 query tiles with wgmma: Q's and P's A fragments
// in registers (mma.sync's A layout per warp), K and V read by the tensor cores from shared memory (no
// ldmatrix). Per 64-row tile, keys in steps of 64 and a last one of NT = 16, 32 or 48 (a compile-time shape:
// ptxas serialises wgmma whose accumulator shapes or group counts vary at run time), in FlashAttention-3's
// order: S(j) issued, O rescaled, P(j-1)·V issued, the softmax of S(j) while P·V runs, P(j) packed once it has
// completed. Rows past the last multiple of 64 (L/14: one) run on the mma.sync path above, split along the
// keys over the block's warps, when they are at most 32; more than 32 make one more m64 tile with the rows
// past T computed on zeros and not stored. One warpgroup a block (3 blocks an SM at L/14) or two sharing K
// and V (2 blocks an SM, 128 registers), chosen by short_config below.
//
// Measured (H200, run r-shortattn-12 in docs/perf.md; B = 64, 16 heads, hd 64, q/k/v in place at row stride
// 3072): T = 257 0.092 ms (189 TFLOP/s) against cuDNN's 0.123 (141); T = 256 0.075 against 0.058; B/32's
// 128 x 50 tokens x 12 heads 0.015 against 0.033; 197 tokens 0.050 against 0.050; 577 0.376 against 0.294.
// Not the 0.065 ms hoped for at 257: Nsight Compute (r-shortattn-7) showed the tensor pipe 25% busy, issue
// slots 41%, 0.67 eligible warps of 2.65 per scheduler (latency-bound at 3 warpgroups an SM), and a 2.59-wave
// tail. Tried and measured no faster: the last 16 keys inside an 80-key last step, Q rows prefetched into L2,
// persistent blocks prefetching the next item's rows into L2 (slower), the row tail's queries staged in shared
// memory; the row tail costs 12 us of the 92 (wg_tail).

// wgmma's descriptor of a 128-byte-swizzled tile (8-row groups 1 KB apart), its fences and waits: wgmma.cuh's
static __device__ __forceinline__ uint64_t wg_desc(const void *p) { return kwg::sw128_desc(smem_u32(p)); }
using kwg::wgmma_commit;
using kwg::wgmma_fence;
using kwg::wgmma_wait;
using kwg::fence_acc;
// generic-proxy writes (cp.async) made visible to the tensor cores' async-proxy reads
static __device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define WG_R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// d[64 x N] (+)= a[64 x 16] (registers) b, b from shared memory: K-major (TB 0: the rows of b are n; S of a step
// of N keys, b = K) or MN-major (TB 1, N = 64: the rows of b are k; P V, b = V). One asm a width: the accumulator
// count is part of the instruction's operand list.
template <int N, int TB = 0>
static __device__ __forceinline__ void wg_mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int acc) {
    static_assert(TB == 0 || N == 64, "MN-major b only at N = 64");
    if constexpr (N == 8)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)
                     : "memory");
    else if constexpr (N == 16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                     "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                     : WG_R8(0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)
                     : "memory");
    else if constexpr (N == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                     : WG_R8(0), WG_R8(8)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)
                     : "memory");
    else if constexpr (N == 48)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
                     "{%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
                     : WG_R8(0), WG_R8(8), WG_R8(16)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)
                     : "memory");
    else if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB)
                     : "memory");
    else
        static_assert(N == 16, "S steps of 8, 16, 32, 48 or 64 keys");
}
#undef WG_R8

// S = Q K[j0 .. j0 + 8 NC)ᵀ into s (issued, committed; not waited for)
template <int NC>
static __device__ __forceinline__ void wg_issue_s(float (&s)[NC * 4], const uint32_t (&qf)[4][4], const bf16 *Ks,
                                                  int j0) {
    wgmma_fence();
    const bf16 *kr = Ks + j0 * 64;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma<NC * 8>(s, qf[kk], wg_desc(kr + kk * 16), kk > 0);
    wgmma_commit();
}

// the online softmax of one step of NC 8-key chunks: s (raw scores, nval of them before T) -> p in place (f32),
// m/l updated, alpha the factor O must be scaled by before this step's P·V is added
template <int NC>
static __device__ __forceinline__ void wg_softmax(float (&s)[NC * 4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                  int nval, float c, int lane) {
    const int t = lane & 3;
    float mx[2] = {-INFINITY, -INFINITY};
    if (nval < NC * 8) {
#pragma unroll
        for (int i = 0; i < NC; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (i * 8 + 2 * t + (e & 1) >= nval) s[4 * i + e] = -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < NC; i++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    float mc[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = quad_max(mx[r]);
        const float mn = fmaxf(m[r], mx[r]); // finite: the step holds at least one key before T
        alpha[r] = cs_ex2((m[r] - mn) * c);
        m[r] = mn;
        mc[r] = mn * c;
    }
    float rs[4] = {0.f, 0.f, 0.f, 0.f}; // two partial sums a row: shorter dependency chains
#pragma unroll
    for (int i = 0; i < NC; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = cs_ex2(fmaf(s[4 * i + e], c, -mc[e >> 1]));
            s[4 * i + e] = p;
            rs[(e >> 1) * 2 + (i & 1)] += p;
        }
    l[0] = l[0] * alpha[0] + (rs[0] + rs[1]);
    l[1] = l[1] * alpha[1] + (rs[2] + rs[3]);
}

// O *= alpha, then O += P V[j0 .. j0 + 16 N16) (issued, committed; not waited for)
template <int N16>
static __device__ __forceinline__ void wg_issue_pv(float (&o)[32], const uint32_t (&pa)[N16][4], const float (&alpha)[2],
                                                   const bf16 *Vs, int j0) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        o[4 * i] *= alpha[0], o[4 * i + 1] *= alpha[0];
        o[4 * i + 2] *= alpha[1], o[4 * i + 3] *= alpha[1];
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < N16; kk++) wg_mma<64, 1>(o, pa[kk], wg_desc(Vs + (j0 + 16 * kk) * 64), 1);
    wgmma_commit();
}

// P (f32, in s) -> the A fragments of its NC / 2 16-key steps
template <int NC>
static __device__ __forceinline__ void wg_pack(uint32_t (&pa)[NC / 2][4], const float (&s)[NC * 4]) {
#pragma unroll
    for (int kk = 0; kk < NC / 2; kk++) {
        pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
        pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

// the first step of a tile (keys 0 .. 8 NC): S, its softmax, P
template <int NC>
static __device__ __forceinline__ void wg_first(float (&sc)[NC * 4], uint32_t (&pa)[NC / 2][4], float (&m)[2],
                                                float (&l)[2], float (&alpha)[2], const uint32_t (&qf)[4][4],
                                                const bf16 *Ks, int T, float c, int lane) {
    wg_issue_s<NC>(sc, qf, Ks, 0);
    wgmma_wait<0>();
    fence_acc(sc);
    wg_softmax<NC>(sc, m, l, alpha, min(NC * 8, T), c, lane);
    wg_pack<NC>(pa, sc);
}

// The first step of a tile with the keys past the last multiple of 64 folded in (jx = 64 nfull; T - jx of them,
// 1..NX): S of keys 0..63 and of jx .. jx + NX, one softmax over both, P of keys 0..63 packed into pa for the next
// step's P·V, and O = P V of the folded keys issued now, its own wgmma group (alpha = 1: O holds this step's
// maxima, as pa does; wg_next<.., W> waits for it before it rescales O). At L/14 a tile then makes 4 S ->
// softmax -> P V round trips, not 5 (the fifth a 16-key step for one key). Keys 0..63 hold the row maximum's
// first value, so the softmax stays finite.
template <int NX>
static __device__ __forceinline__ void wg_first_x(float (&sc)[32], uint32_t (&pa)[4][4], float (&o)[32],
                                                  float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                  const uint32_t (&qf)[4][4], const bf16 *Ks, const bf16 *Vs, int jx,
                                                  int T, float c, int lane) {
    static_assert(NX == 8 || NX == 16, "8 or 16 folded keys");
    float s[32 + NX / 2], sx[NX / 2]; // s: the folded keys as if they followed key 63 (register renaming)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma<64>(sc, qf[kk], wg_desc(Ks + kk * 16), kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma<NX>(sx, qf[kk], wg_desc(Ks + jx * 64 + kk * 16), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(sc);
    fence_acc(sx);
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = sc[i];
#pragma unroll
    for (int i = 0; i < NX / 2; i++) s[32 + i] = sx[i];
    wg_softmax<8 + NX / 8>(s, m, l, alpha, 64 + T - jx, c, lane);
#pragma unroll
    for (int i = 0; i < 32; i++) sc[i] = s[i];
    wg_pack<8>(pa, sc);
    uint32_t px[4]; // keys jx .. jx + 16 as an A fragment: P = 0 past NX (V's rows there are zeros too)
    px[0] = pack_bf16(s[32], s[33]);
    px[1] = pack_bf16(s[34], s[35]);
    if constexpr (NX == 16) {
        px[2] = pack_bf16(s[36], s[37]);
        px[3] = pack_bf16(s[38], s[39]);
    } else {
        px[2] = px[3] = 0u;
    }
    alpha[0] = alpha[1] = 1.f;
    fence_acc(o); // O's registers written (zeros) before the fence, not between it and the wgmma
    wgmma_fence();
    wg_mma<64, 1>(o, px, wg_desc(Vs + jx * 64), 0);
    wgmma_commit();
}

// a later step (8 NC keys from j0): S issued, then O rescaled and the previous step's P·V (pp: NP 16-key steps
// from jp) issued, the softmax of S while P·V runs, P packed into pn once P·V has completed (pn may be pp)
template <int NC, int NP, bool W = false>
static __device__ __forceinline__ void wg_next(float (&sc)[NC * 4], float (&o)[32], const uint32_t (&pp)[NP][4],
                                               uint32_t (&pn)[NC / 2][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], const uint32_t (&qf)[4][4], const bf16 *Ks,
                                               const bf16 *Vs, int j0, int jp, int T, float c, int lane) {
    wg_issue_s<NC>(sc, qf, Ks, j0);
    if constexpr (W) { // O's wgmma before S's has completed (the folded keys' P·V of wg_first_x; else a no-op)
        wgmma_wait<1>();
        fence_acc(o);
    }
    wg_issue_pv<NP>(o, pp, alpha, Vs, jp);
    wgmma_wait<1>();
    fence_acc(sc);
    wg_softmax<NC>(sc, m, l, alpha, min(NC * 8, T - j0), c, lane);
    wgmma_wait<0>();
    fence_acc(o);
    wg_pack<NC>(pn, sc);
}

// key group ch (and those before it) in shared memory and visible to every thread and to the tensor cores
static __device__ __forceinline__ void cs_ready(int nchunk, int ch, int &loaded) {
    cs_wait(nchunk - 1 - ch);
    wg_fence_proxy();
    __syncthreads();
    loaded = ch + 1;
}

// The rows of the last rem = T mod 64 <= 32 past the m64 tiles from their tiles' S key slices' partials (S
// consecutive a tile, from P0): out = sum_s w_s o_s / sum_s w_s l_s, w_s = exp2((m_s - max m) c), two columns a
// thread (tid of nth)
template <int D, int R = 32>
static __device__ __forceinline__ void cs_combine(bf16 *ob, int64_t out_stride, const float *P0, int S, int T, float c,
                                                  int tid, int nth) {
    const int rem = T & 63;
    for (int e = tid; e < rem * (D / 2); e += nth) {
        const int r = e / (D / 2), d = e % (D / 2) * 2, i = (T & ~63) + r, rr = r & 15;
        const float *Pt = P0 + (size_t)(r >> 4) * S * cs_part_floats<D, R>(); // slice 0 of the row's tile
        float M = -INFINITY;
        for (int s = 0; s < S; s++) M = fmaxf(M, Pt[(size_t)s * cs_part_floats<D, R>() + R * (D + 4) + rr]);
        float den = 0.f, n0 = 0.f, n1 = 0.f;
        for (int s = 0; s < S; s++) {
            const float *Ps = Pt + (size_t)s * cs_part_floats<D, R>();
            const float w = cs_ex2((Ps[R * (D + 4) + rr] - M) * c);
            den += w * Ps[R * (D + 4) + R + rr];
            const float2 x = *(const float2 *)(Ps + rr * (D + 4) + d);
            n0 += w * x.x, n1 += w * x.y;
        }
        const float inv = 1.f / den;
        *(__nv_bfloat162 *)(ob + (int64_t)i * out_stride + d) = __floats2bfloat162_rn(n0 * inv, n1 * inv);
    }
}

// The last rem = T mod 64 <= 32 rows (NT / 16 m16 tiles) on mma.sync, each tile split along the keys over the
// block's warps; the slices' (max, sum, unnormalised output) meet in shared memory over K and V. Everything is
// loaded (a first tile waited for it, or the wait before the tiles). It costs more than its FLOPs (L/14: 12 us
// of the 93, run r-shortattn-9/11 in docs/perf.md): every block reaches it at about the same time, so its
// latency is not hidden; staging its queries in shared memory or one 80-key step a warp changed nothing.
template <int NT, int WGS>
static __device__ __forceinline__ void wg_tail(bf16 *ob, int64_t out_stride, const bf16 *qb, int64_t stride, int T,
                                               const bf16 *Ks, const bf16 *Vs, unsigned char *base, float c) {
    constexpr int D = 64, NTH = 128 * WGS, nt16 = NT / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, Tk = (T + 15) & ~15;
    const int nk16 = Tk >> 4, S = min(4 * WGS / nt16, nk16);
    const int sl = warp % S, ka = sl * nk16 / S * 16, kend = min(T, (sl + 1) * nk16 / S * 16);
    float *P = (float *)base + (size_t)warp * cs_part_floats<D>();
    if (warp < nt16 * S) {
        float o[1][D / 8][4], m[1][2], l[1][2];
        cs_run<D, 64, 1>(o, m, l, qb, stride, (T & ~63) + 16 * (warp / S), T, Ks, Vs, ka, kend, c, lane);
        cs_bar(); // K and V are read by all: the partials go over them
        cs_store_part<D, 1>(P, o, m, l, lane);
    } else {
        cs_bar();
    }
    __syncthreads();
    cs_combine<D>(ob, out_stride, (const float *)base, S, T, c, threadIdx.x, NTH);
}

// One (image, head) item on the block's WGS warpgroups: K and V into shared memory (base, 1024-byte aligned),
// the m64 tiles on wgmma (tiles g, g + WGS, ... on warpgroup g), the last rem <= 32 rows on mma.sync. PRE (the
// persistent kernel below): K, V and then Q's rows are in base already, loaded and visible, Q's fragments
// come from there, and the rows past the tiles are left to the caller. NX > 0 (PRE only): the keys past the last
// multiple of 64 (at most NX) go into the first step (wg_first_x) instead of a last step of their own.
template <int NT, int WGS, bool PRE = false, int NX = 0>
static __device__ __forceinline__ void wg_item(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T,
                                               int heads, int64_t stride, int64_t out_stride, float c, int item,
                                               unsigned char *base) {
    constexpr int D = 64;
    static_assert(NX == 0 || (PRE && NT == 16), "keys folded into the first step: loaded whole, one 16-key remainder");
    const int Tk = (T + 15) & ~15, nchunk = (Tk + CS_LG - 1) / CS_LG;
    bf16 *Ks = (bf16 *)base, *Vs = Ks + (size_t)Tk * D;
    const int b = item / heads, h = item % heads;
    constexpr int NTH = 128 * WGS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wgi = threadIdx.x >> 7;
    const int64_t off = (int64_t)b * T * stride + (int64_t)h * D;
    const bf16 *qb = q + off, *kb = k + off, *vb = v + off;
    bf16 *ob = out + (int64_t)b * T * out_stride + (int64_t)h * D;
    const int rem = T & 63, ntile = (T >> 6) + (rem > 32), nfull = Tk >> 6;
    int loaded = nchunk;
    if constexpr (!PRE) {
        for (int ch = 0; ch < nchunk; ch++) {
            const int r0 = ch * CS_LG;
            cs_load_kv<D>(Ks, Vs, kb, vb, k, v, r0, min(CS_LG, Tk - r0), T, stride, threadIdx.x, NTH);
            cp_async_commit();
        }
        loaded = 0;
        // every warpgroup's first tile waits for each group of keys as it is needed (the same barriers in each);
        // with fewer tiles than warpgroups, everything is waited for here
        if (ntile < WGS) {
            cp_async_wait<0>();
            wg_fence_proxy();
            __syncthreads();
            loaded = nchunk;
        }
    }
    for (int tile = wgi; tile < ntile; tile += WGS) {
        const int row0 = tile * 64 + (warp & 3) * 16;
        uint32_t qf1[1][4][4];
        if constexpr (PRE) {
            // cs_ldsm_q written out: through the helper nvcc orders the address arithmetic differently in all
            // four persistent kernels, and this is the code that was timed
            const bf16 *Qs = Vs + (size_t)Tk * D;
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                ldsm_x4(qf1[0][kk], Qs + cs_swz<D>(row0 + (lane & 15), 2 * kk + (lane >> 4)));
        } else {
            cs_load_q<D, 1>(qf1, qb, stride, row0, T, lane);
        }
        const uint32_t(&qf)[4][4] = qf1[0];
        float o[32], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2] = {1.f, 1.f};
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] = 0.f;
        // steps of 64 keys, then one of NT (a wider last step, 80 keys at L/14, measured no faster)
        if (loaded == 0) cs_ready(nchunk, 0, loaded);
        if (nfull == 0) { // T <= 48: one step of NT keys
            if constexpr (NT > 0) {
                float st[NT / 2];
                uint32_t pl[NT / 16][4];
                wg_first<NT / 8>(st, pl, m, l, alpha, qf, Ks, T, c, lane);
                wg_issue_pv<NT / 16>(o, pl, alpha, Vs, 0);
            }
        } else {
            float sc[32];
            uint32_t pa[4][4];
            if constexpr (NX > 0) {
                wg_first_x<NX>(sc, pa, o, m, l, alpha, qf, Ks, Vs, 64 * nfull, T, c, lane);
                for (int j = 1; j < nfull; j++)
                    wg_next<8, 4, true>(sc, o, pa, pa, m, l, alpha, qf, Ks, Vs, 64 * j, 64 * (j - 1), T, c, lane);
                wgmma_wait<0>(); // a no-op (the loop's last step waited): without it ptxas sees a path from
                fence_acc(o);    // wg_first_x's P·V to the rescaling below
                wg_issue_pv<4>(o, pa, alpha, Vs, 64 * (nfull - 1));
            } else {
                wg_first<8>(sc, pa, m, l, alpha, qf, Ks, T, c, lane);
                for (int j = 1; j < nfull; j++) {
                    if (j >= loaded) cs_ready(nchunk, j, loaded);
                    wg_next<8, 4>(sc, o, pa, pa, m, l, alpha, qf, Ks, Vs, 64 * j, 64 * (j - 1), T, c, lane);
                }
            }
            if constexpr (NT > 0 && NX == 0) {
                if (nchunk > loaded) cs_ready(nchunk, nchunk - 1, loaded);
                float st[NT / 2]; // its own registers: a wgmma of another width allocates its accumulators apart
                uint32_t pl[NT / 16][4];
                wg_next<NT / 8, 4>(st, o, pa, pl, m, l, alpha, qf, Ks, Vs, 64 * nfull, 64 * (nfull - 1), T, c, lane);
                wg_issue_pv<NT / 16>(o, pl, alpha, Vs, 64 * nfull);
            } else if constexpr (NX == 0) {
                wg_issue_pv<4>(o, pa, alpha, Vs, 64 * (nfull - 1));
            }
        }
        wgmma_wait<0>();
        fence_acc(o);
        float o1[1][D / 8][4], l1[1][2] = {{l[0], l[1]}};
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) o1[0][i][e] = o[4 * i + e];
        cs_store<D, 1>(ob, out_stride, o1, l1, row0, T, lane);
    }
    // rows past the last multiple of 64 exist at NT = 16 and 32 only (T mod 64 in 1..32); 33..63 made a last m64 tile
    if constexpr (!PRE && (NT == 16 || NT == 32))
        wg_tail<NT, WGS>(ob, out_stride, qb, stride, T, Ks, Vs, base, c);
}

// grid B * heads blocks (image-major), 128 WGS threads (WGS warpgroups); hd 64; NT = (T rounded up to 16) mod
// 64: the keys of the last, narrower step. One warpgroup: 3 blocks an SM (158 registers); two: 2 blocks of 2
// warpgroups sharing K and V (128 registers)
template <int NT, int WGS>
static __global__ void __launch_bounds__(128 * WGS, WGS == 1 ? 3 : 2)
    clip_attn_wg_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int heads, int64_t stride,
                        int64_t out_stride, float c) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char cs_smem_buf[];
    // wgmma's swizzle is a function of the address: K and V start on 1024 bytes (the launch adds the slack)
    unsigned char *base = cs_smem_buf + ((1024 - (smem_u32(cs_smem_buf) & 1023)) & 1023);
    wg_item<NT, WGS>(out, q, k, v, T, heads, stride, out_stride, c, blockIdx.x, base);
}

// ---- hd 64, persistent: four warpgroups a block and one block an SM; an item's loads run two items ahead and
// its row tail beside the next item's tiles ----
//
// Why: the blocks above load their item's K and V when they start and wait for them (the first 64 keys at least),
// each warpgroup then waits for its Q fragments from global memory, and at L/14 every warp of the block meets in the
// row tail (12 us of the 92). With 2 blocks an SM nothing covers those waits. Here a block keeps two buffers of K, V
// and Q (every row: the row tail's too) in shared memory and walks items n = 0, 1, ... (blockIdx.x + n gridDim.x).
// Its four warpgroups take one m64 tile of each item (L/14: 4 tiles and a row), Q's A fragments by ldmatrix, and
// share the rest round robin: warpgroup n mod 4 runs item n's row tail on mma.sync (its 4 warps a quarter of the
// keys each, combined in a small region of their own), then loads item n + 2 into that buffer, while the other three
// are already on item n + 1. Mbarriers order it: full[b] (the loading warpgroup's 128 threads, each arrival made as
// that thread's copies land: cp.async.mbarrier.arrive.noinc) and empty[b] (all 512 threads, done with the buffer's
// item: its tiles, and the tail). The loaders of items 0 and 1 are warpgroups 2 and 3, as if they had run the tails
// of items -2 and -1. Shapes: T mod 64 <= 16 (the tail one m16 tile or none), 4 tiles, both buffers in shared
// memory (L/14: 2 x 102 KB; 5 tiles would not fit).
//
// Measured (H100, session 41, B = 64, 16 heads; tests/gpu gpu_clip_attn_short_timing): T = 257 0.0881 ms against
// the two-warpgroup block's 0.0944 (-6.7%), T = 256 0.0670 against 0.0775; the L/14 tower within +-1% of the
// block kernel in the same runs (attention is ~13% of it). Steps on the way, each slower: all threads loading
// and a block barrier an item (0.1006: the row tail unhidden); the next item's copies announced by the loading
// warpgroup after its next tile (0.0973); the tail's partials over the buffer, so that the tail waited for every
// warpgroup's tiles and passed its lateness on item to item (0.0933); T = 64 n + 1's last key on the CUDA cores,
// after the last step or as the first key while the first S runs, instead of the 16-key step (+1-7%).
//
// The keys past the tiles' last multiple of 64 (T mod 64 of them, L/14: 1) can fold into each tile's first step (NX 8
// or 16: wg_first_x; KILN_CLIP_ATTN_SHORT_CFG=wgpx, session 42's default), so that a tile makes 4 round trips at L/14,
// not 5 (session 42, H100): 0.0822 ms against 0.0883-0.0889 with a step of their own (NX 0, then 36 bytes spilled; the
// default again since session 43, below); the tower +0.0-0.6% in three A/B runs (within the spread between rounds).
// ptxas serialises this variant's wgmma (C7514: it does not see that the wait before O's rescaling in the first wg_next
// retires the folded keys' P·V) and it is faster all the same; the four warpgroups an SM cover each other's waits.
// Tried and slower: the folded keys' P·V with the last step's, at its maxima (0.0899; ptxas serialises it too, for
// registers, and spills 28 bytes); Q's tile from shared memory as S's A operand with the steps unrolled (0.0916, not
// serialised, 76 bytes spilled). The row tail costs ~0.010 ms of the 0.082 (skipped, timing only: 0.0717-0.0731); its
// query rows come from the buffer since (0.0805-0.0813 against 0.0823-0.0824 from global memory, built side by side);
// an 80-key step on each of its warps, its queries still from global memory, was slower (0.0884-0.0904).
//
// Session 43 (H100, two rounds; tower: kiln_bench_clip L/14, batch 128, four rounds): with its queries from the
// buffer, the tail's last quarter in one step of up to 80 keys (not 64 and then 1) cut ptxas's spills of the
// kernel with the keys past 64 n in a step of their own (NX 0) from 36 bytes to 4, and that kernel became the
// fastest: 0.0757-0.0758 ms, against the folded keys' 0.0777-0.0779 with the same tail (KILN_CLIP_ATTN_SHORT_CFG=
// wgpx) and 0.0806-0.0817 for the folded keys with the 64-key tail before. The tower: 3,434 img/s (mean of four)
// against 3,408 for the folded keys before, +0.8%, each of the four rounds ahead; its embeddings' worst cosine to
// fp32 0.999926 (0.999923 before; the folded keys with the new tail 0.999921). So NX 0 is the default again.

// K, V and Q (Tk rows each, zeros past T: Q's rows past the m64 tiles are the row tail's) of one item into a
// buffer, by nth threads, the three in one loop (cs_load_kv loads K and V only; with it and a Q loop beside it
// ptxas spilled 44 bytes of this kernel where it spilled 36, session 41)
static __device__ __forceinline__ void wgp_load(bf16 *buf, const bf16 *q, const bf16 *k, const bf16 *v, int T, int Tk,
                                                int heads, int64_t stride, int item, int tid, int nth) {
    constexpr int D = 64, CH = D / 8;
    const int64_t off = (int64_t)(item / heads) * T * stride + (int64_t)(item % heads) * D;
    bf16 *Ks = buf, *Vs = Ks + (size_t)Tk * D, *Qs = Vs + (size_t)Tk * D;
    for (int e = tid; e < Tk * CH; e += nth) {
        const int r = e / CH, cc = e % CH;
        const bool ok = r < T;
        const int64_t src = off + (int64_t)r * stride + cc * 8;
        cp_async16(Ks + cs_swz<D>(r, cc), ok ? k + src : k, ok);
        cp_async16(Vs + cs_swz<D>(r, cc), ok ? v + src : v, ok);
        cp_async16(Qs + cs_swz<D>(r, cc), ok ? q + src : q, ok);
    }
}

// the calling warpgroup's own barrier (ids 1..4; 0 is __syncthreads)
static __device__ __forceinline__ void wgp_bar(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

// this thread's arrival on full once its cp.async copies so far have landed (.noinc: the arrival is one of the 128
// the barrier expects), so that the loading warpgroup never waits for them
static __device__ __forceinline__ void wgp_arrive_on_landing(uint64_t *full) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(full)) : "memory");
}

// Item n's rows past its m64 tiles (rem = T mod 64 in 1..16: one m16 tile) by the calling warpgroup, a quarter of
// the keys a warp. The quarters' partials meet in a region of their own (P), so that the tail waits for no other
// warpgroup's tiles; tails of consecutive items take it in turn through `turn` (128 arrivals, once item n - 1's
// tail has read it: phase n - 1; item n + 1's tail cannot run ahead of item n's release, since its item's
// copies were issued after item n - 1's tail). Its query rows come from the buffer (Qs), not from global memory:
// a load of ~1 us on the warpgroup's path otherwise.
static __device__ __forceinline__ void wgp_tail(bf16 *ob, int64_t out_stride, int T, const bf16 *Ks, const bf16 *Vs,
                                                const bf16 *Qs, float *P, uint64_t *turn, int n, float c) {
    constexpr int D = 64;
    const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int nk16 = ((T + 15) & ~15) >> 4, ka = wq * nk16 / 4 * 16, kend = min(T, (wq + 1) * nk16 / 4 * 16);
    float o[1][D / 8][4], m[1][2], l[1][2];
    uint32_t qf[1][D / 16][4];
    cs_ldsm_q<D>(qf[0], Qs, T & ~63, lane);
    // a quarter of at most 17 16-key groups (T <= 272: wgp_takes) holds at most 80 keys: one step (L/14's last
    // quarter, keys 192..256, is then one step, not 64 keys and then 1)
    cs_init<D, 1>(o, m, l);
    if (kend - ka > 64)
        cs_step<D, 80, 1>(o, m, l, qf, Ks, Vs, ka, kend - ka, c, lane);
    else
        cs_step<D, 64, 1>(o, m, l, qf, Ks, Vs, ka, kend - ka, c, lane);
    kwg::mbar_wait(turn, (uint32_t)(n + 1) & 1); // item n - 1's tail is done with P (passes at once for n = 0)
    cs_store_part<D, 1, 16>(P + (size_t)wq * cs_part_floats<D, 16>(), o, m, l, lane);
    wgp_bar(wg);
    cs_combine<D, 16>(ob, out_stride, P, 4, T, c, threadIdx.x & 127, 128);
    kwg::mbar_arrive(turn);
}

// grid: at most one block an SM and at most B * heads (items); 512 threads; NT 0 or 16; NX 0 (the keys past 64 n
// in a last step of 16) or 8 / 16 (T mod 64 <= NX: those keys folded into the first step)
template <int NT, int NX>
static __global__ void __launch_bounds__(512, 1)
    clip_attn_wgp_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int heads, int items,
                         int64_t stride, int64_t out_stride, float c) {
    static_assert(NT == 0 || NT == 16, "a row tail of T mod 64 <= 16 rows only");
    constexpr int D = 64;
    pdl_wait();
    extern __shared__ __align__(16) unsigned char cs_smem_buf[];
    unsigned char *base = cs_smem_buf + ((1024 - (smem_u32(cs_smem_buf) & 1023)) & 1023);
    const int Tk = (T + 15) & ~15, wg = threadIdx.x >> 7, tw = threadIdx.x & 127;
    const size_t bufe = (size_t)(3 * Tk) * D; // a multiple of 1024 bytes: both buffers' K and V stay aligned
    bf16 *buf0 = (bf16 *)base;
    uint64_t *full = (uint64_t *)(buf0 + 2 * bufe), *empty = full + 2, *turn = full + 4;
    float *P = (float *)(full + 8); // the row tails' partials (4 x 16 rows)
    if (threadIdx.x == 0) {
        kwg::mbar_init(&full[0], 128), kwg::mbar_init(&full[1], 128);
        kwg::mbar_init(&empty[0], 512), kwg::mbar_init(&empty[1], 512);
        kwg::mbar_init(turn, 128);
    }
    __syncthreads();
    const int G = gridDim.x, cnt = (items - (int)blockIdx.x + G - 1) / G; // this block's items
    if (wg == 2) {
        wgp_load(buf0, q, k, v, T, Tk, heads, stride, blockIdx.x, tw, 128);
        wgp_arrive_on_landing(&full[0]);
    } else if (wg == 3 && cnt > 1) {
        wgp_load(buf0 + bufe, q, k, v, T, Tk, heads, stride, blockIdx.x + G, tw, 128);
        wgp_arrive_on_landing(&full[1]);
    }
    for (int n = 0; n < cnt; n++) {
        const int b = n & 1, item = blockIdx.x + n * G;
        bf16 *cur = buf0 + b * bufe;
        kwg::mbar_wait(&full[b], (n >> 1) & 1);
        wg_fence_proxy(); // the copies' generic-proxy writes, seen through the barrier, before wgmma reads them
        wg_item<NT, 4, true, NX>(out, q, k, v, T, heads, stride, out_stride, c, item, (unsigned char *)cur);
        const bool mine = wg == n % 4; // this item's tail, then the loads into its buffer
        if (NT > 0 && mine) {
            bf16 *ob = out + (int64_t)(item / heads) * T * out_stride + (int64_t)(item % heads) * D;
            wgp_tail(ob, out_stride, T, cur, cur + (size_t)Tk * D, cur + (size_t)2 * Tk * D, P, turn, n, c);
        }
        kwg::mbar_arrive(&empty[b]); // done with this buffer: the tiles, and the tail's reads of K, V and Q
        if (mine && n + 2 < cnt) {
            kwg::mbar_wait(&empty[b], (n >> 1) & 1); // so is every warpgroup
            wgp_load(cur, q, k, v, T, Tk, heads, stride, item + 2 * G, tw, 128);
            wgp_arrive_on_landing(&full[b]);
        }
    }
}

// ---- the launchers ----

static size_t smem_bytes(int D) { return sizeof(bf16) * (size_t)(CA_BM + 4 * CA_BN) * (size_t)(D + 8); }

int clip_attention_supported(const void *q, const void *k, const void *v, const void *out, int64_t T, int64_t hd,
                             int64_t stride, int64_t out_stride) {
    const uintptr_t mis = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15;
    return (hd == 32 || hd == 64 || hd == 128) && T >= 1 && T <= 65535 * 64 && stride % 8 == 0 && !mis &&
           out_stride % 2 == 0 && ((uintptr_t)out & 3) == 0;
}

// Which short kernel runs and its shape. hd 64: the wgmma kernel, one warpgroup a block below 4 m64 tiles, two
// from 4 on (run r-shortattn-8/10: equal at T = 257, 2-11% faster at 256, 320 and 577, 1.5x slower at 50 where
// the second has no tile), one at T mod 64 in 33..48 (two would serialise their wgmma for registers). Other
// head dims: the mma.sync kernel (4 warps, 64-key steps; hd 32 only). KILN_CLIP_ATTN_SHORT=0 sends
// every call to the streaming kernel; KILN_CLIP_ATTN_SHORT_CFG=wg|wg2|mma forces one or two warpgroups or the
// mma.sync kernel at hd 64 (tests/gpu compare them). Where the persistent kernel takes the shape (above: L/14's
// 257 tokens; 256 goes to cuDNN under KILN_CLIP_ATTN=auto) it runs unless wg or wg2 is forced, the keys past 64 n
// in a step of their own; wgpx folds them into the first step instead (slower since the 80-key tail, session 43).
typedef struct {
    int wg, w, bn; // wgmma warpgroups (0: the mma.sync kernel; 4: the persistent kernel), its warps (the persistent
                   // kernel: 1 for a last step of its own for the keys past 64 n), its keys a step
} short_cfg;
static int short_on(void) {
    const char *e = getenv("KILN_CLIP_ATTN_SHORT");
    return !(e && !strcmp(e, "0"));
}
static int smem_optin(void) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return optin;
}
// the persistent kernel's two buffers of K, V and Q (T rounded up to 16 rows each), its five mbarriers (8 slots),
// the row tails' partials, + 1 KB to align the buffers on 1024 bytes (L/14: 222.6 KB)
static size_t wgp_buffer(int64_t T) { return (size_t)(3 * ((T + 15) & ~(int64_t)15)) * 128; }
static size_t wgp_smem(int64_t T) {
    return 2 * wgp_buffer(T) + 8 * sizeof(uint64_t) + 4 * sizeof(float) * cs_part_floats<64, 16>() + 1024;
}
static int wgp_takes(int64_t hd, int64_t T) { // 256 <= T <= 272: 4 m64 tiles, one a warpgroup, and a tail of <= 16
    return hd == 64 && (T & 63) <= 16 && (T >> 6) == 4 && wgp_smem(T) <= (size_t)smem_optin();
}
static short_cfg short_config(int64_t hd, int64_t T) {
    const char *e = getenv("KILN_CLIP_ATTN_SHORT_CFG");
    if (hd != 64 || (e && !strcmp(e, "mma"))) return short_cfg{0, 4, 64};
    if (!(e && (!strcmp(e, "wg") || !strcmp(e, "wg2"))) && wgp_takes(hd, T))
        return short_cfg{4, !(e && !strcmp(e, "wgpx")), 0};
    const int64_t nt = ((T + 15) & ~(int64_t)15) & 63, ntile = (T >> 6) + ((T & 63) > 32);
    const int two = e && !strcmp(e, "wg2") ? 1 : e && !strcmp(e, "wg") ? 0 : ntile >= 4;
    return short_cfg{two && (nt == 0 || nt == 16) ? 2 : 1, 0, 0};
}
// K and V of T keys (padded to 16), or the key slices' partials, whichever is larger; the wgmma kernel: + 1 KB to
// align K and V on 1024 bytes
static size_t short_smem(int64_t hd, int64_t T, short_cfg c) {
    if (c.wg == 4) return wgp_smem(T);
    const size_t Tk = (size_t)((T + 15) & ~(int64_t)15), kv = 2 * Tk * (size_t)hd * sizeof(bf16);
    const int pf = hd == 32 ? cs_part_floats<32>() : cs_part_floats<64>();
    const int64_t np = (T + 31) / 32;
    const size_t W = c.wg ? 4 * (size_t)c.wg : (size_t)(np < c.w ? np : c.w), part = W * (size_t)pf * sizeof(float);
    return (kv > part ? kv : part) + (c.wg ? 1024 : 0);
}

int clip_attention_short_takes(const void *q, const void *k, const void *v, const void *out, int64_t T,
                               int64_t hd, int64_t stride, int64_t out_stride) {
    // hd 128: two tiles' S, P and O spill at 255 registers in the mma.sync kernel; the streaming one takes it
    if (!short_on() || hd == 128 || !clip_attention_supported(q, k, v, out, T, hd, stride, out_stride) || T > 65536)
        return 0;
    return short_smem(hd, T, short_config(hd, T)) <= (size_t)smem_optin();
}

template <int D, int BN>
static cudaError_t launch_mma(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T,
                              int64_t heads, int64_t stride, int64_t out_stride, float scale, cudaStream_t st) {
    const short_cfg c = {0, 4, BN};
    const int64_t np = (T + 31) / 32;
    const int W = np < 4 ? (int)np : 4;
    const size_t sm = short_smem(D, T, c);
    if (sm > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(clip_attn_short_kernel<D, BN, 4, 2>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
    }
    kiln_launch(clip_attn_short_kernel<D, BN, 4, 2>, (unsigned)(B * heads), 32 * W, sm, st, out, q, k, v, (int)T,
                (int)heads, stride, out_stride, scale * 1.4426950408889634f);
    return cudaGetLastError();
}

template <int NT, int WGS>
static cudaError_t launch_wg(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T,
                             int64_t heads, int64_t stride, int64_t out_stride, float scale, cudaStream_t st) {
    const size_t sm = short_smem(64, T, short_cfg{WGS, 0, 0});
    cudaError_t e =
        cudaFuncSetAttribute(clip_attn_wg_kernel<NT, WGS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (e != cudaSuccess) return e;
    kiln_launch(clip_attn_wg_kernel<NT, WGS>, (unsigned)(B * heads), 128 * WGS, sm, st, out, q, k, v, (int)T,
                (int)heads, stride, out_stride, scale * 1.4426950408889634f);
    return cudaGetLastError();
}

template <int NT, int NX>
static cudaError_t launch_wgp(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T,
                              int64_t heads, int64_t stride, int64_t out_stride, float scale, cudaStream_t st) {
    const size_t sm = wgp_smem(T);
    cudaError_t e =
        cudaFuncSetAttribute(clip_attn_wgp_kernel<NT, NX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (e != cudaSuccess) return e;
    int dev = 0, nsm = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return e;
    const int64_t items = B * heads, grid = items < nsm ? items : nsm;
    kiln_launch(clip_attn_wgp_kernel<NT, NX>, (unsigned)grid, 512, sm, st, out, q, k, v, (int)T, (int)heads, (int)items,
                stride, out_stride, scale * 1.4426950408889634f);
    return cudaGetLastError();
}

static cudaError_t launch_short(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T,
                                int64_t heads, int64_t hd, int64_t stride, int64_t out_stride, float scale,
                                cudaStream_t st) {
    const short_cfg c = short_config(hd, T);
    if (hd == 32) return launch_mma<32, 64>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    if (!c.wg) return launch_mma<64, 64>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    if (c.wg == 4) {
        const int rem = (int)(T & 63);
        if (!rem) return launch_wgp<0, 0>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
        if (c.w == 1) return launch_wgp<16, 0>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
        return rem <= 8 ? launch_wgp<16, 8>(out, q, k, v, B, T, heads, stride, out_stride, scale, st)
                        : launch_wgp<16, 16>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    }
    switch ((int)(((T + 15) & ~(int64_t)15) & 63) + c.wg) { // the last step's keys; c.wg == 2 only at 0 and 16
    case 1: return launch_wg<0, 1>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    case 2: return launch_wg<0, 2>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    case 17: return launch_wg<16, 1>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    case 18: return launch_wg<16, 2>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    case 33: return launch_wg<32, 1>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    default: return launch_wg<48, 1>(out, q, k, v, B, T, heads, stride, out_stride, scale, st);
    }
}

template <int D>
static cudaError_t launch(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T, int64_t q0,
                          int64_t heads, int64_t stride, int64_t out_stride, float scale, cudaStream_t st) {
    const size_t sm = smem_bytes(D);
    if (sm > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(clip_attn_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
    }
    const dim3 grid((unsigned)((T - q0 + CA_BM - 1) / CA_BM), (unsigned)heads, (unsigned)B);
    kiln_launch(clip_attn_kernel<D>, grid, CA_THREADS, sm, st, out, q, k, v, (int)T, (int)q0, stride, out_stride,
                scale * 1.4426950408889634f);
    return cudaGetLastError();
}

kiln_error *clip_attention_forward(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                   int64_t B, int64_t T, int64_t q0, int64_t heads, int64_t hd, int64_t stride,
                                   int64_t out_stride, float scale, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (B <= 0 || T <= 0 || q0 >= T) return NULL;
    if (q0 < 0) return kiln_errorf(KILN_EINVAL, "CLIP attention (CUDA): first query %lld", (long long)q0);
    if (B > 65535 || heads > 65535)
        return kiln_errorf(KILN_EUNSUPPORTED, "CLIP attention (CUDA): %lld sequences x %lld heads is beyond the grid",
                           (long long)B, (long long)heads);
    // all queries of sequences whose K and V fit in shared memory: the short-sequence kernel
    if (q0 == 0 && B * heads <= 2147483647 && clip_attention_short_takes(q, k, v, out, T, hd, stride, out_stride)) {
        CUDA_TRY(launch_short(o, qq, kk, vv, B, T, heads, hd, stride, out_stride, scale, st));
        return NULL;
    }
    if (hd == 32) CUDA_TRY(launch<32>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
    else if (hd == 64) CUDA_TRY(launch<64>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
    else CUDA_TRY(launch<128>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
done:
    return err;
}
