// CLIP's vision attention on tensor cores: non-causal multi-head attention over short sequences (50 tokens
// for B/32, 257 for L/14, 577 for L/14-336) read straight out of the fused qkv activations [B*T, 3H] (row
// stride `stride`) and written into [B*T, out_stride]. Flash-style: a block owns 64 query rows of one
// (image, head) (4 warps x 16 rows) and streams 64-key tiles of K and V (double-buffered with cp.async);
// S = Q Kᵀ and O += P V run on mma.sync m16n8k16 (bf16 in, f32 accumulate) with the online softmax in
// registers, so no T x T matrix reaches memory (the batched-GEMM path of clip_ops.cu writes S in f32 and
// P in bf16: ~1.6 GB per L/14 layer at 128 images). P is rounded to bf16 as the mma operand, as flash
// attention does. Keys past T are masked; query rows past T are computed on zeros and not stored.
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "clip_attention.cuh"
#include "cuda_check.h"
#include "mma_bf16.cuh"

typedef __nv_bfloat16 bf16;

#define CA_THREADS 128
#define CA_BM 64
#define CA_BN 64

// grid (query tiles from query q0 on, heads, B)
template <int D>
static __global__ void __launch_bounds__(CA_THREADS)
    clip_attn_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int q0, int64_t stride,
                     int64_t out_stride, float scale_log2) {
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
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mn = fmaxf(m[r], mx[r]); // finite: every tile holds at least one key < T
                alpha[r] = exp2f(m[r] - mn);
                m[r] = mn;
            }
            float rs[2] = {0.f, 0.f};
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = exp2f(s[nt][e] - m[e >> 1]);
                    s[nt][e] = p;
                    rs[e >> 1] += p;
                }
#pragma unroll
            for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
                o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
            }
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
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
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

static size_t smem_bytes(int D) { return sizeof(bf16) * (size_t)(CA_BM + 4 * CA_BN) * (size_t)(D + 8); }

int clip_attention_supported(const void *q, const void *k, const void *v, const void *out, int64_t T, int64_t hd,
                             int64_t stride, int64_t out_stride) {
    const uintptr_t mis = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15;
    return (hd == 32 || hd == 64 || hd == 128) && T >= 1 && T <= 65535 * 64 && stride % 8 == 0 && !mis &&
           out_stride % 2 == 0 && ((uintptr_t)out & 3) == 0;
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
    clip_attn_kernel<D><<<grid, CA_THREADS, sm, st>>>(out, q, k, v, (int)T, (int)q0, stride, out_stride,
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
    if (hd == 32) CUDA_TRY(launch<32>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
    else if (hd == 64) CUDA_TRY(launch<64>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
    else CUDA_TRY(launch<128>(o, qq, kk, vv, B, T, q0, heads, stride, out_stride, scale, st));
done:
    return err;
}
