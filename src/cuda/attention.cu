// Flash-style causal GQA attention with an optional sliding window: the device twin of
// kiln_attention_forward/backward (src/nn/attention.c). No T x T matrix is ever stored: the forward
// streams key tiles with an online softmax and keeps only each query row's logsumexp; the backward
// recomputes the probabilities from q, k and that logsumexp (FA2): one kernel per key tile computes
// dK and dV, summing the G query heads of the tile's KV head in a fixed order (deterministic, no float
// atomics), and a second kernel per query tile computes dQ.
//
// Two paths: a generic one (any head dim <= 128, scalar f32 math on bf16 tiles in shared memory) and
// a tensor-core one for head dims 32, 64 and 128 (attention_mma.cu). Tiles that the causal mask or the
// window hide entirely are never visited. By default both calls first offer the work to cuDNN's fused
// flash attention (attention_cudnn.cu: about 3x faster on the H200, the same lse); these kernels run
// whatever it does not take, and everything under KILN_ATTENTION=own.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "attention_impl.cuh"
#include "cuda_check.h"
#include "kiln/cuda_attention.h"
#include "kiln/cuda_ops.h"
#include "kiln/log.h"
#include "launch.cuh"

#define GQ 32     // query rows per block of the generic kernels: 8 warps x 4 rows
#define GK 32     // keys per tile: one key per lane
#define GRPW 4    // query rows per warp
#define GKSTR 130 // key-tile row stride in bf16: 65 words, odd, so lane-per-key column reads are conflict-free
#define GTHREADS 256
#define BWR 16    // query rows per chunk in the dK/dV kernel: 8 warps x 2 rows

// ---- steps that the generic kernels share ----
typedef bf16 KeyTile[GKSTR]; // one row of a key tile in shared memory
// K and V rows j0 .. j0 + GK - 1 of KV head kh into ks and vs (rows >= tk zero), by the whole block
static __device__ __forceinline__ void load_kv_tile(KeyTile *ks, KeyTile *vs, const bf16 *k, const bf16 *v,
                                                    const AttnDims &a, int b, int kh, int j0) {
    const int D = a.D;
    for (int e = threadIdx.x; e < GK * D; e += GTHREADS) {
        int r = e / D, d = e % D, j = j0 + r;
        int64_t off = (((int64_t)b * a.tk_cap + j) * a.KV + kh) * D + d;
        bool ok = j < a.tk;
        ks[r][d] = ok ? k[off] : __float2bfloat16(0.f);
        vs[r][d] = ok ? v[off] : __float2bfloat16(0.f);
    }
}
// acc (columns lane + 32c of one row) += sum over the tile's keys jj of w_jj x[jj], where lane jj holds w_jj
static __device__ __forceinline__ void warp_row_axpy(float (&acc)[4], float w, const KeyTile *x, int lane, int D) {
    for (int jj = 0; jj < GK; jj++) {
        float wj = __shfl_sync(0xffffffffu, w, jj);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int d = lane + 32 * c;
            if (d < D) acc[c] += wj * __bfloat162float(x[jj][d]);
        }
    }
}
// row o (columns lane + 32c) = acc * mul, rounded to bf16
static __device__ __forceinline__ void store_row(bf16 *o, const float (&acc)[4], float mul, int lane, int D) {
#pragma unroll
    for (int c = 0; c < 4; c++) {
        int d = lane + 32 * c;
        if (d < D) o[d] = __float2bfloat16(acc[c] * mul);
    }
}

// ---- generic forward: grid (query tiles, NH, B) ----
static __global__ void __launch_bounds__(GTHREADS) attn_fwd_generic(bf16 *out, float *lse, const bf16 *q,
                                                                    const bf16 *k, const bf16 *v, AttnDims a) {
    pdl_wait();
    __shared__ bf16 qs[GQ][ATT_DMAX];
    __shared__ bf16 ks[GK][GKSTR];
    __shared__ bf16 vs[GK][GKSTR];
    const int b = blockIdx.z, h = blockIdx.y, kh = h / a.G, i0 = blockIdx.x * GQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, D = a.D;
    for (int e = tid; e < GQ * D; e += GTHREADS) {
        int r = e / D, d = e % D, i = i0 + r;
        qs[r][d] = i < a.Tq ? q[(((int64_t)b * a.Tq + i) * a.NH + h) * D + d] : __float2bfloat16(0.f);
    }
    const AttQBlock qb = att_q_block(a, i0, GQ);

    float m[GRPW], l[GRPW], acc[GRPW][4];
#pragma unroll
    for (int rr = 0; rr < GRPW; rr++) {
        m[rr] = -INFINITY, l[rr] = 0.f;
#pragma unroll
        for (int c = 0; c < 4; c++) acc[rr][c] = 0.f;
    }
    for (int j0 = qb.jlo / GK * GK; j0 <= qb.jhi; j0 += GK) {
        __syncthreads();
        load_kv_tile(ks, vs, k, v, a, b, kh, j0);
        __syncthreads();
        float s[GRPW];
#pragma unroll
        for (int rr = 0; rr < GRPW; rr++) s[rr] = 0.f;
        for (int d = 0; d < D; d++) {
            float kd = __bfloat162float(ks[lane][d]);
#pragma unroll
            for (int rr = 0; rr < GRPW; rr++) s[rr] += __bfloat162float(qs[warp * GRPW + rr][d]) * kd;
        }
        const int j = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < GRPW; rr++) {
            const int i = i0 + warp * GRPW + rr;
            const bool vis = i < a.Tq && att_visible(a, a.q_pos0 + i, j);
            float sv = vis ? s[rr] * a.scale_log2 : -INFINITY;
            float mn = fmaxf(m[rr], warp_max(sv));
            if (mn == -INFINITY) continue; // nothing visible yet for this row
            float alpha = exp2f(m[rr] - mn);
            float p = vis ? exp2f(sv - mn) : 0.f;
            l[rr] = l[rr] * alpha + warp_sum(p);
            m[rr] = mn;
#pragma unroll
            for (int c = 0; c < 4; c++) acc[rr][c] *= alpha;
            warp_row_axpy(acc[rr], p, vs, lane, D);
        }
    }
#pragma unroll
    for (int rr = 0; rr < GRPW; rr++) {
        const int i = i0 + warp * GRPW + rr;
        if (i >= a.Tq) continue;
        float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
        store_row(out + (((int64_t)b * a.Tq + i) * a.NH + h) * D, acc[rr], inv, lane, D);
        if (lane == 0 && lse) lse[((int64_t)b * a.NH + h) * a.Tq + i] = (m[rr] + log2f(l[rr])) * ATT_LN2;
    }
}

// ---- backward preprocessing: delta[b,h,i] = sum_d dout * out (= sum_j p_j dp_j), one warp per row ----
static __global__ void attn_bwd_delta(float *delta, const bf16 *dout, const bf16 *out, AttnDims a) {
    pdl_wait();
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const int64_t rows = (int64_t)a.B * a.Tq * a.NH;
    if (row >= rows) return;
    // row enumerates [B, Tq, NH] (the memory order); delta is stored [B, NH, Tq]
    const int h = (int)(row % a.NH), i = (int)(row / a.NH % a.Tq), b = (int)(row / ((int64_t)a.NH * a.Tq));
    const bf16 *go = dout + row * a.D, *o = out + row * a.D;
    float s = 0.f;
    for (int d = lane; d < a.D; d += 32) s += __bfloat162float(go[d]) * __bfloat162float(o[d]);
    s = warp_sum(s);
    if (lane == 0) delta[((int64_t)b * a.NH + h) * a.Tq + i] = s;
}

// ---- generic dQ: grid (query tiles, NH, B); like the forward with p recomputed from lse ----
static __global__ void __launch_bounds__(GTHREADS) attn_bwd_dq_generic(bf16 *dq, const bf16 *dout, const float *lse,
                                                                       const float *delta, const bf16 *q, const bf16 *k,
                                                                       const bf16 *v, AttnDims a) {
    pdl_wait();
    __shared__ bf16 qs[GQ][ATT_DMAX];
    __shared__ bf16 dos[GQ][ATT_DMAX];
    __shared__ bf16 ks[GK][GKSTR];
    __shared__ bf16 vs[GK][GKSTR];
    const int b = blockIdx.z, h = blockIdx.y, kh = h / a.G, i0 = blockIdx.x * GQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, D = a.D;
    for (int e = tid; e < GQ * D; e += GTHREADS) {
        int r = e / D, d = e % D, i = i0 + r;
        int64_t off = (((int64_t)b * a.Tq + i) * a.NH + h) * D + d;
        qs[r][d] = i < a.Tq ? q[off] : __float2bfloat16(0.f);
        dos[r][d] = i < a.Tq ? dout[off] : __float2bfloat16(0.f);
    }
    float lse2[GRPW], dl[GRPW], acc[GRPW][4];
#pragma unroll
    for (int rr = 0; rr < GRPW; rr++) {
        const int i = i0 + warp * GRPW + rr;
        const int64_t ri = ((int64_t)b * a.NH + h) * a.Tq + i;
        lse2[rr] = i < a.Tq ? lse[ri] * ATT_LOG2E : 0.f;
        dl[rr] = i < a.Tq ? delta[ri] : 0.f;
#pragma unroll
        for (int c = 0; c < 4; c++) acc[rr][c] = 0.f;
    }
    const AttQBlock qb = att_q_block(a, i0, GQ);
    for (int j0 = qb.jlo / GK * GK; j0 <= qb.jhi; j0 += GK) {
        __syncthreads();
        load_kv_tile(ks, vs, k, v, a, b, kh, j0);
        __syncthreads();
        float s[GRPW], dp[GRPW];
#pragma unroll
        for (int rr = 0; rr < GRPW; rr++) s[rr] = 0.f, dp[rr] = 0.f;
        for (int d = 0; d < D; d++) {
            float kd = __bfloat162float(ks[lane][d]), vd = __bfloat162float(vs[lane][d]);
#pragma unroll
            for (int rr = 0; rr < GRPW; rr++) {
                s[rr] += __bfloat162float(qs[warp * GRPW + rr][d]) * kd;
                dp[rr] += __bfloat162float(dos[warp * GRPW + rr][d]) * vd;
            }
        }
        const int j = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < GRPW; rr++) {
            const int i = i0 + warp * GRPW + rr;
            const bool vis = i < a.Tq && att_visible(a, a.q_pos0 + i, j);
            float p = vis ? exp2f(s[rr] * a.scale_log2 - lse2[rr]) : 0.f;
            float ds = p * (dp[rr] - dl[rr]);
            warp_row_axpy(acc[rr], ds, ks, lane, D);
        }
    }
#pragma unroll
    for (int rr = 0; rr < GRPW; rr++) {
        const int i = i0 + warp * GRPW + rr;
        if (i >= a.Tq) continue;
        store_row(dq + (((int64_t)b * a.Tq + i) * a.NH + h) * D, acc[rr], a.scale, lane, D);
    }
}

// ---- generic dK/dV: grid (key tiles, KV, B). The block owns GK keys of one KV head and walks every
// query row that can see them, for each of the G query heads of the group in turn: the sum over heads
// and rows happens in this fixed order inside one block, so the result is deterministic. ----
static __global__ void __launch_bounds__(GTHREADS) attn_bwd_dkdv_generic(bf16 *dk, bf16 *dv, const bf16 *dout,
                                                                         const float *lse, const float *delta,
                                                                         const bf16 *q, const bf16 *k,
                                                                         const bf16 *v, AttnDims a) {
    pdl_wait();
    __shared__ bf16 ks[GK][GKSTR];
    __shared__ bf16 vs[GK][GKSTR];
    __shared__ bf16 qc[BWR][ATT_DMAX];
    __shared__ bf16 doc[BWR][ATT_DMAX];
    __shared__ float ps[BWR][GK + 1];
    __shared__ float dss[BWR][GK + 1];
    __shared__ float lse2s[BWR], dls[BWR];
    const int b = blockIdx.z, kh = blockIdx.y, j0 = blockIdx.x * GK;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, D = a.D;
    load_kv_tile(ks, vs, k, v, a, b, kh, j0);
    float dka[GK * ATT_DMAX / GTHREADS], dva[GK * ATT_DMAX / GTHREADS];
#pragma unroll
    for (int c = 0; c < GK * ATT_DMAX / GTHREADS; c++) dka[c] = dva[c] = 0.f;
    const int jlast = min(j0 + GK, a.tk) - 1;
    int ilo, ihi; // query rows (indices into Tq) that see at least one key of the tile
    att_query_range(a, j0, jlast, &ilo, &ihi);
    for (int h = kh * a.G; h < (kh + 1) * a.G; h++) {
        for (int c0 = ilo; c0 <= ihi; c0 += BWR) {
            __syncthreads();
            for (int e = tid; e < BWR * D; e += GTHREADS) {
                int r = e / D, d = e % D, i = c0 + r;
                int64_t off = (((int64_t)b * a.Tq + i) * a.NH + h) * D + d;
                bool ok = i <= ihi;
                qc[r][d] = ok ? q[off] : __float2bfloat16(0.f);
                doc[r][d] = ok ? dout[off] : __float2bfloat16(0.f);
            }
            if (tid < BWR) {
                int i = c0 + tid;
                int64_t ri = ((int64_t)b * a.NH + h) * a.Tq + i;
                lse2s[tid] = i <= ihi ? lse[ri] * ATT_LOG2E : 0.f;
                dls[tid] = i <= ihi ? delta[ri] : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < BWR / 8; rr++) {
                const int r = warp * (BWR / 8) + rr, i = c0 + r, j = j0 + lane;
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < D; d++) {
                    s += __bfloat162float(qc[r][d]) * __bfloat162float(ks[lane][d]);
                    dp += __bfloat162float(doc[r][d]) * __bfloat162float(vs[lane][d]);
                }
                const bool vis = i <= ihi && j < a.tk && att_visible(a, a.q_pos0 + i, j);
                float p = vis ? exp2f(s * a.scale_log2 - lse2s[r]) : 0.f;
                ps[r][lane] = p;
                dss[r][lane] = p * (dp - dls[r]);
            }
            __syncthreads();
#pragma unroll
            for (int c = 0; c < GK * ATT_DMAX / GTHREADS; c++) {
                int e = tid + GTHREADS * c;
                if (e >= GK * D) break;
                int j = e / D, d = e % D;
                float sv = 0.f, sk = 0.f;
#pragma unroll
                for (int r = 0; r < BWR; r++) {
                    sv += ps[r][j] * __bfloat162float(doc[r][d]);
                    sk += dss[r][j] * __bfloat162float(qc[r][d]);
                }
                dva[c] += sv, dka[c] += sk;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < GK * ATT_DMAX / GTHREADS; c++) {
        int e = tid + GTHREADS * c;
        if (e >= GK * D) break;
        int j = j0 + e / D, d = e % D;
        if (j >= a.tk) continue;
        int64_t off = (((int64_t)b * a.tk_cap + j) * a.KV + kh) * D + d;
        if (dk) dk[off] = __float2bfloat16(dka[c] * a.scale);
        if (dv) dv[off] = __float2bfloat16(dva[c]);
    }
}

// ---- host side ----
static kiln_error *att_dims(const kiln_attn_shape *s, AttnDims *a, const char *op) {
    if (!s) return kiln_errorf(KILN_EINVAL, "%s: shape is NULL", op);
    if (s->B < 0 || s->Tq < 0 || s->tk < s->Tq || s->tk_cap < s->tk || s->NH < 1 || s->KV < 1 || s->NH % s->KV)
        return kiln_errorf(KILN_EINVAL,
                           "%s: bad shape B=%lld Tq=%lld tk=%lld tk_cap=%lld NH=%lld KV=%lld (need 0 <= Tq <= tk <= "
                           "tk_cap and NH a multiple of KV)",
                           op, (long long)s->B, (long long)s->Tq, (long long)s->tk, (long long)s->tk_cap,
                           (long long)s->NH, (long long)s->KV);
    if (s->D < 1 || s->D > ATT_DMAX)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: head dim %lld not supported (1..%d)", op, (long long)s->D,
                           ATT_DMAX);
    if (s->window < 0) return kiln_errorf(KILN_EINVAL, "%s: negative window %lld", op, (long long)s->window);
    if (s->B > 65535 || s->NH > 65535 || s->tk_cap > INT32_MAX / 2)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: shape too large (B=%lld NH=%lld tk_cap=%lld)", op, (long long)s->B,
                           (long long)s->NH, (long long)s->tk_cap);
    a->B = (int)s->B, a->Tq = (int)s->Tq, a->tk = (int)s->tk, a->tk_cap = (int)s->tk_cap;
    a->NH = (int)s->NH, a->KV = (int)s->KV, a->D = (int)s->D, a->G = (int)(s->NH / s->KV);
    a->q_pos0 = (int)(s->tk - s->Tq), a->window = (int)(s->window > s->tk ? 0 : s->window);
    a->scale = s->scale, a->scale_log2 = s->scale * ATT_LOG2E;
    return NULL;
}

// Which implementation runs: cuDNN's fused flash attention (attention_cudnn.cu) where it loads and takes the
// shape, else kiln's own kernels below. KILN_ATTENTION (or kiln_attention_cuda_set_impl) = cudnn (default:
// its deterministic backward, dQ through the engine's dP workspace), cudnn-nondet (its faster backward whose
// dQ accumulates with atomics: runs are not bit-identical) or own.
enum { IMPL_ENV = -1, IMPL_OWN = 0, IMPL_CUDNN = 1, IMPL_CUDNN_NONDET = 2 };
#define IMPL_DEFAULT IMPL_CUDNN
static int impl_set = IMPL_ENV, env_chosen; // env_chosen: $KILN_ATTENTION was set when impl_now first read it
static int impl_parse(const char *n) {
    if (!strcmp(n, "own")) return IMPL_OWN;
    if (!strcmp(n, "cudnn")) return IMPL_CUDNN;
    if (!strcmp(n, "cudnn-nondet")) return IMPL_CUDNN_NONDET;
    return -2;
}
static int impl_now(void) {
    if (impl_set != IMPL_ENV) return impl_set;
    static int from_env = -3;
    if (from_env == -3) {
        const char *e = getenv("KILN_ATTENTION");
        env_chosen = e && *e;
        from_env = env_chosen ? impl_parse(e) : IMPL_DEFAULT;
        if (from_env == -2) {
            kiln_log(KILN_LOG_WARN, "KILN_ATTENTION=%s: expected own, cudnn or cudnn-nondet; using %s", e,
                     IMPL_DEFAULT == IMPL_OWN ? "own" : "cudnn");
            from_env = IMPL_DEFAULT;
        }
    }
    return from_env;
}
// a choice made by set_impl or $KILN_ATTENTION, else the default (after impl_now)
static int impl_chosen(void) { return impl_set != IMPL_ENV || env_chosen; }

extern "C" kiln_error *kiln_attention_cuda_set_impl(const char *name) {
    if (!name) {
        impl_set = IMPL_ENV;
        return NULL;
    }
    int v = impl_parse(name);
    if (v < 0)
        return kiln_errorf(KILN_EINVAL, "attention implementation '%s': expected own, cudnn or cudnn-nondet", name);
    impl_set = v;
    return NULL;
}

// says once per (pass, implementation, reason) which one runs: the first line of each kind only
static void att_say(int backward, const char *what, const char *why) {
    static char said[8][160];
    static int nsaid;
    char key[160];
    snprintf(key, sizeof key, "%d %s %.100s", backward, what, why ? why : "");
    for (int i = 0; i < nsaid; i++)
        if (!strcmp(said[i], key)) return;
    if (nsaid < 8) snprintf(said[nsaid++], sizeof said[0], "%s", key);
    kiln_log(KILN_LOG_INFO, "attention %s: %s%s%s", backward ? "backward" : "forward", what, why ? ": " : "",
             why ? why : "");
}

static const char *last_impl[2] = {"own", "own"};
extern "C" const char *kiln_attention_cuda_last_impl(int backward) { return last_impl[backward != 0]; }

// whether cuDNN runs this call (else kiln's kernels, with the reason said once)
// atomic_dq: the caller allows cuDNN's atomic-dQ backward where nobody chose an implementation
static bool att_use_cudnn(const kiln_attn_shape *s, int backward, bool ptrs_ok, int *nondet, int atomic_dq = 0) {
    int impl = impl_now();
    *nondet = impl == IMPL_CUDNN_NONDET || (backward && atomic_dq && impl == IMPL_CUDNN && !impl_chosen());
    last_impl[backward] = "own";
    if (impl == IMPL_OWN) {
        att_say(backward, "kiln's flash kernels", "KILN_ATTENTION=own");
        return false;
    }
    const char *why = NULL;
    if (!ptrs_ok)
        why = "a tensor is missing or not 16-byte aligned";
    else if (att_cudnn_usable(s, NULL, backward, *nondet, &why) == 0) {
        char v[96];
        long ver = att_cudnn_version();
        snprintf(v, sizeof v, "cuDNN %ld.%ld.%ld fused flash attention%s", ver / 10000, ver / 100 % 100, ver % 100,
                 backward ? (*nondet ? " (atomic dQ)" : " (deterministic)") : "");
        att_say(backward, v, NULL);
        last_impl[backward] = backward && *nondet ? "cudnn-nondet" : "cudnn";
        return true;
    }
    att_say(backward, "kiln's flash kernels", why);
    return false;
}

// cuDNN's workspace did not fit in memory: this call runs kiln's kernels
static void att_fell_back(int backward) {
    att_say(backward, "kiln's flash kernels", "cuDNN's workspace could not be allocated (out of device memory)");
    last_impl[backward] = "own";
}

// KILN_ATTN_GENERIC=1 forces the generic kernels (the GPU tests compare both paths with the CPU)
static bool att_force_generic(void) {
    const char *e = getenv("KILN_ATTN_GENERIC");
    return e && *e && strcmp(e, "0") != 0;
}
// the tensor-core kernels read and write rows with 16-byte accesses
static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" size_t kiln_attention_backward_cuda_work(const kiln_attn_shape *s) {
    return s ? (size_t)(s->B > 0 ? s->B : 0) * (size_t)(s->NH > 0 ? s->NH : 0) * (size_t)(s->Tq > 0 ? s->Tq : 0) *
                   sizeof(float)
             : 0;
}

extern "C" kiln_error *kiln_attention_forward_cuda(kiln_bf16 *out, float *lse, const kiln_bf16 *q,
                                                   const kiln_bf16 *k, const kiln_bf16 *v, const kiln_attn_shape *s,
                                                   void *stream) {
    AttnDims a;
    kiln_error *err = att_dims(s, &a, "kiln_attention_forward_cuda");
    if (err) return err;
    if (a.B == 0 || a.Tq == 0) return NULL;
    if (!out || !q || !k || !v)
        return kiln_errorf(KILN_EINVAL, "kiln_attention_forward_cuda: out, q, k and v are required");
    cudaStream_t st = (cudaStream_t)stream;
    int nondet = 0;
    if (!att_force_generic() &&
        att_use_cudnn(s, 0, lse && aligned16(out) && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(lse),
                      &nondet)) {
        int ran = 0;
        err = att_cudnn_forward(out, lse, q, k, v, s, NULL, st, &ran);
        if (err || ran) return err;
        att_fell_back(0);
    }
    if (!att_force_generic() && att_mma_supported(a) && aligned16(out) && aligned16(q) && aligned16(k) &&
        aligned16(v)) {
        err = att_mma_forward((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, a, st);
        if (err) return err;
    } else {
        dim3 grid((a.Tq + GQ - 1) / GQ, a.NH, a.B);
        kiln_launch(attn_fwd_generic, grid, GTHREADS, 0, st, (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                    (const bf16 *)v, a);
    }
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}

extern "C" kiln_error *kiln_attention_backward_cuda(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv,
                                                    const kiln_bf16 *dout, const kiln_bf16 *out, const float *lse,
                                                    const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                                    const kiln_attn_shape *s, void *work, void *stream) {
    return kiln_attention_backward_ex_cuda(dq, dk, dv, dout, out, lse, q, k, v, s, work, 0, stream);
}

extern "C" kiln_error *kiln_attention_backward_ex_cuda(kiln_bf16 *dq, kiln_bf16 *dk, kiln_bf16 *dv,
                                                       const kiln_bf16 *dout, const kiln_bf16 *out, const float *lse,
                                                       const kiln_bf16 *q, const kiln_bf16 *k, const kiln_bf16 *v,
                                                       const kiln_attn_shape *s, void *work, int atomic_dq,
                                                       void *stream) {
    AttnDims a;
    kiln_error *err = att_dims(s, &a, "kiln_attention_backward_cuda");
    if (err) return err;
    if (a.B == 0 || a.Tq == 0) return NULL;
    if (!work) return kiln_errorf(KILN_EINVAL, "kiln_attention_backward_cuda: work is NULL (needs %zu bytes)",
                                  kiln_attention_backward_cuda_work(s));
    if (!dout || !out || !lse || !q || !k || !v)
        return kiln_errorf(KILN_EINVAL, "kiln_attention_backward_cuda: dout, out, lse, q, k and v are all required");
    cudaStream_t st = (cudaStream_t)stream;
    int nondet = 0;
    if (!att_force_generic() &&
        att_use_cudnn(s, 1,
                      dq && dk && dv && aligned16(dq) && aligned16(dk) && aligned16(dv) && aligned16(dout) &&
                          aligned16(out) && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(lse),
                      &nondet, atomic_dq)) {
        int ran = 0;
        err = att_cudnn_backward(dq, dk, dv, dout, out, lse, q, k, v, s, nondet, st, &ran);
        if (err || ran) return err;
        att_fell_back(1);
    }
    float *delta = (float *)work;
    {
        int64_t rows = (int64_t)a.B * a.Tq * a.NH;
        kiln_launch(attn_bwd_delta, (unsigned)((rows + 7) / 8), 256, 0, st, delta, (const bf16 *)dout,
                    (const bf16 *)out, a);
        CUDA_TRY(cudaGetLastError());
    }
    if (!att_force_generic() && att_mma_supported(a) && aligned16(dq) && aligned16(dk) && aligned16(dv) &&
        aligned16(dout) && aligned16(q) && aligned16(k) && aligned16(v)) {
        err = att_mma_backward((bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, lse, delta, (const bf16 *)q,
                               (const bf16 *)k, (const bf16 *)v, a, st);
        if (err) return err;
    } else {
        if (dk || dv) {
            dim3 grid((a.tk + GK - 1) / GK, a.KV, a.B);
            kiln_launch(attn_bwd_dkdv_generic, grid, GTHREADS, 0, st, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, lse,
                        delta, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, a);
            CUDA_TRY(cudaGetLastError());
        }
        if (dq) {
            dim3 grid((a.Tq + GQ - 1) / GQ, a.NH, a.B);
            kiln_launch(attn_bwd_dq_generic, grid, GTHREADS, 0, st, (bf16 *)dq, (const bf16 *)dout, lse, delta,
                        (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, a);
        }
    }
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}
