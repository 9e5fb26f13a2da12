// ZAYA's experts on the device, the steps of src/nn/experts.c: dispatch (src/cuda/router.cu), gather the
// routed rows in expert order, one grouped GEMM for every expert's gate_up, SwiGLU, one grouped GEMM for
// down, then the gated sum back to the tokens. Each token reads its own top_k slots through tok_slot and
// adds them in k order, so the scatter needs no atomics and gives the same bits every run; the backward
// sums dx the same way. Skip-routed slots never enter the permutation, so they cost nothing.
//
// The grouped GEMMs (src/cuda/experts_gemm.cu) take each expert's row count on the host, hence one small
// device-to-host copy of the offsets per forward; the backward reuses it. The copy goes to pinned memory
// behind an event, and the gather is queued before the host waits for it, so the device has work while
// the host wakes up.
//
// The backward's weight gradients (f32, per-expert GEMMs on side streams) need nothing that comes after them in
// the layer's backward. With kiln_experts_cuda_scratch.dw_defer they are issued last (after gate_up's dX) and
// left running on the side streams: the caller's stream goes on (the gated sum's dx, the router's backward:
// small, memory-bound ops that leave SMs idle) and joins them with kiln_experts_backward_join_cuda before it
// reuses the scratch or reads the gradients (the next backward call joins too). KILN_EXPERTS_DW_DEFER=0 turns
// it off (same bits either way: the same GEMMs in another order).
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "dispatch.h"
#include "kiln/cuda_ops.h"
#include "ops_common.cuh"
#include "launch.cuh"

namespace {

__device__ __forceinline__ float bf(__nv_bfloat16 v) { return __bfloat162float(v); }

// xe[s,:] = in[slot_tok[s],:] for s < *nslots (the device's count: the grid is launched for every slot
// before the host knows how many were routed), 8 bf16 (16 bytes) per load where rows allow it
__global__ void gather_kernel(__nv_bfloat16 *xe, const __nv_bfloat16 *in, const int32_t *slot_tok, const int32_t *nslots,
                              int64_t H, int vec) {
    pdl_wait();
    const int64_t s = blockIdx.x;
    if (s >= *nslots) return;
    const __nv_bfloat16 *src = in + (int64_t)slot_tok[s] * H;
    __nv_bfloat16 *dst = xe + s * H;
    if (vec) {
        for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x) ((int4 *)dst)[i] = ((const int4 *)src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
    }
}

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + __expf(-g)); }

// act[s,j] = silu(gu[s,j]) * gu[s,I+j]; P (1 or 2) neighbouring columns per thread, bf16x2 loads when 2.
// The fallback for widths that are not a multiple of 8 (swiglu_fwd8_kernel below is the usual one).
template <int P>
__global__ void swiglu_fwd_kernel(__nv_bfloat16 *act, const __nv_bfloat16 *gu, int64_t rows, int64_t I) {
    pdl_wait();
    const int64_t IP = I / P, n = rows * IP;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / IP, j = (t - r * IP) * P;
        const __nv_bfloat16 *g = gu + r * 2 * I + j, *u = g + I;
        if (P == 2) {
            const float2 gv = __bfloat1622float2(*(const __nv_bfloat162 *)g), uv = __bfloat1622float2(*(const __nv_bfloat162 *)u);
            *(__nv_bfloat162 *)(act + r * I + j) =
                __floats2bfloat162_rn(gv.x * sigmoidf_(gv.x) * uv.x, gv.y * sigmoidf_(gv.y) * uv.y);
        } else {
            const float gv = bf(*g), uv = bf(*u);
            act[r * I + j] = __float2bfloat16_rn(gv * sigmoidf_(gv) * uv);
        }
    }
}

// dgu = d/d(gu) of act given dact (overwritten: the buffer is this op's own); the fallback of swiglu_bwd8_kernel
template <int P>
__global__ void swiglu_bwd_kernel(__nv_bfloat16 *dgu, const __nv_bfloat16 *dact, const __nv_bfloat16 *gu, int64_t rows,
                                  int64_t I) {
    pdl_wait();
    const int64_t IP = I / P, n = rows * IP;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / IP, j = (t - r * IP) * P;
        float g[2], u[2], d[2], dg[2], du[2];
        for (int q = 0; q < P; q++) {
            g[q] = bf(gu[r * 2 * I + j + q]), u[q] = bf(gu[r * 2 * I + I + j + q]), d[q] = bf(dact[r * I + j + q]);
            const float sg = sigmoidf_(g[q]);
            dg[q] = d[q] * u[q] * sg * (1.0f + g[q] * (1.0f - sg));
            du[q] = d[q] * g[q] * sg;
        }
        if (P == 2) {
            *(__nv_bfloat162 *)(dgu + r * 2 * I + j) = __floats2bfloat162_rn(dg[0], dg[1]);
            *(__nv_bfloat162 *)(dgu + r * 2 * I + I + j) = __floats2bfloat162_rn(du[0], du[1]);
        } else {
            dgu[r * 2 * I + j] = __float2bfloat16_rn(dg[0]);
            dgu[r * 2 * I + I + j] = __float2bfloat16_rn(du[0]);
        }
    }
}

// The SwiGLU passes move 192 MB (forward) and 320 MB (backward) a layer at the [cuda] size: pure memory
// traffic. The kernels above index a flat element space (a 64-bit division per pair: about as many integer
// instructions as the bytes they move allow) and the backward reads with 2-byte loads. These take one block
// per row and 8 columns (16 bytes of each operand) per thread: no division, one 16-byte load or store per
// operand, the same float expressions per element (the same bits). Needs I % 8 == 0 and 16-byte aligned rows.
enum { SWIGLU8_THREADS = 128 };
union bf8 {
    int4 v;
    __nv_bfloat162 p[4];
};

__global__ void swiglu_fwd8_kernel(__nv_bfloat16 *act, const __nv_bfloat16 *gu, int64_t I) {
    pdl_wait();
    const int64_t r = blockIdx.x, I8 = I / 8;
    const int4 *g = (const int4 *)(gu + r * 2 * I), *u = (const int4 *)(gu + r * 2 * I + I);
    int4 *a = (int4 *)(act + r * I);
    for (int64_t j = threadIdx.x; j < I8; j += blockDim.x) {
        bf8 gv, uv, o;
        gv.v = g[j], uv.v = u[j];
        for (int q = 0; q < 4; q++) {
            const float2 gf = __bfloat1622float2(gv.p[q]), uf = __bfloat1622float2(uv.p[q]);
            o.p[q] = __floats2bfloat162_rn(gf.x * sigmoidf_(gf.x) * uf.x, gf.y * sigmoidf_(gf.y) * uf.y);
        }
        a[j] = o.v;
    }
}

__global__ void swiglu_bwd8_kernel(__nv_bfloat16 *dgu, const __nv_bfloat16 *dact, const __nv_bfloat16 *gu, int64_t I) {
    pdl_wait();
    const int64_t r = blockIdx.x, I8 = I / 8;
    const int4 *g = (const int4 *)(gu + r * 2 * I), *u = (const int4 *)(gu + r * 2 * I + I);
    const int4 *d = (const int4 *)(dact + r * I);
    int4 *dg = (int4 *)(dgu + r * 2 * I), *du = (int4 *)(dgu + r * 2 * I + I);
    for (int64_t j = threadIdx.x; j < I8; j += blockDim.x) {
        bf8 gv, uv, dv, og, ou;
        gv.v = g[j], uv.v = u[j], dv.v = d[j];
        for (int q = 0; q < 4; q++) {
            const float2 gf = __bfloat1622float2(gv.p[q]), uf = __bfloat1622float2(uv.p[q]), df = __bfloat1622float2(dv.p[q]);
            float rg[2], ru[2];
            const float gg[2] = {gf.x, gf.y}, uu[2] = {uf.x, uf.y}, dd[2] = {df.x, df.y};
            for (int h = 0; h < 2; h++) {
                const float sg = sigmoidf_(gg[h]);
                rg[h] = dd[h] * uu[h] * sg * (1.0f + gg[h] * (1.0f - sg));
                ru[h] = dd[h] * gg[h] * sg;
            }
            og.p[q] = __floats2bfloat162_rn(rg[0], rg[1]), ou.p[q] = __floats2bfloat162_rn(ru[0], ru[1]);
        }
        dg[j] = og.v, du[j] = ou.v;
    }
}

// V consecutive bf16 as floats, and back (V = 8: one 16-byte access, V = 4: one 8-byte access; the caller
// checks the alignment)
template <int V> __device__ __forceinline__ void load_bf(float *v, const __nv_bfloat16 *p) {
    if (V == 8) {
        const int4 raw = *(const int4 *)p;
        const __nv_bfloat162 *q = (const __nv_bfloat162 *)&raw;
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(q[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else if (V == 4) {
        const uint2 raw = *(const uint2 *)p;
        const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.x);
        const float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.y);
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    } else {
        for (int q = 0; q < V; q++) v[q] = bf(p[q]);
    }
}
template <int V> __device__ __forceinline__ void store_bf(__nv_bfloat16 *p, const float *v) {
    if (V == 8) {
        int4 raw;
        __nv_bfloat162 *q = (__nv_bfloat162 *)&raw;
        for (int i = 0; i < 4; i++) q[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        *(int4 *)p = raw;
    } else if (V == 4) {
        const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        uint2 raw;
        raw.x = *(const unsigned *)&a, raw.y = *(const unsigned *)&b;
        *(uint2 *)p = raw;
    } else {
        for (int q = 0; q < V; q++) p[q] = __float2bfloat16_rn(v[q]);
    }
}
template <int V> __device__ __forceinline__ void load_f(float *v, const float *p) {
    if (V == 4 || V == 8) {
        for (int i = 0; i < V; i += 4) {
            const float4 x = *(const float4 *)(p + i);
            v[i] = x.x, v[i + 1] = x.y, v[i + 2] = x.z, v[i + 3] = x.w;
        }
    } else {
        for (int q = 0; q < V; q++) v[q] = p[q];
    }
}
template <int V> __device__ __forceinline__ void store_f(float *p, const float *v) {
    if (V == 4 || V == 8)
        for (int i = 0; i < V; i += 4) *(float4 *)(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    else
        for (int q = 0; q < V; q++) p[q] = v[q];
}

// out[n,h] = sum over k (in order) of gate[n,k] * ye[tok_slot[n,k], h]; skipped slots add nothing.
// V = 8 columns per thread where H % 8 == 0 and the rows are aligned for it (vec8_rows), 4 where H % 4 == 0
// (vec4_ok), else 1: at the [cuda] size each of the 256 threads then moves one 16-byte piece of a bf16 row.
template <int V>
__global__ void combine_kernel(float *out, const __nv_bfloat16 *ye, const float *gate, const int32_t *tok_slot,
                               int64_t H, int64_t top) {
    pdl_wait();
    const int64_t n = blockIdx.x;
    for (int64_t h = threadIdx.x * V; h < H; h += blockDim.x * V) {
        float acc[V], v[V];
        for (int q = 0; q < V; q++) acc[q] = 0;
        for (int64_t k = 0; k < top; k++) {
            const int32_t s = tok_slot[n * top + k];
            if (s < 0) continue;
            const float g = gate[n * top + k];
            load_bf<V>(v, ye + (int64_t)s * H + h);
            for (int q = 0; q < V; q++) acc[q] += g * v[q];
        }
        store_f<V>(out + n * H + h, acc);
    }
}

// dx[n,h] += sum over k (in order) of dxe[tok_slot[n,k], h]; with write, dx[n,h] = that sum (no read of dx: the
// caller skips zeroing it, 128 MB of memset and 128 MB of reads a layer at the [cuda] size; the same bits as
// adding the sum to a zeroed dx, since 0 + s == s)
template <int V>
__global__ void combine_dx_kernel(float *dx, const __nv_bfloat16 *dxe, const int32_t *tok_slot, int64_t H, int64_t top,
                                  int write) {
    pdl_wait();
    const int64_t n = blockIdx.x;
    for (int64_t h = threadIdx.x * V; h < H; h += blockDim.x * V) {
        float acc[V], v[V], d[V];
        for (int q = 0; q < V; q++) acc[q] = 0;
        for (int64_t k = 0; k < top; k++) {
            const int32_t s = tok_slot[n * top + k];
            if (s < 0) continue;
            load_bf<V>(v, dxe + (int64_t)s * H + h);
            for (int q = 0; q < V; q++) acc[q] += v[q];
        }
        if (write) {
            store_f<V>(dx + n * H + h, acc);
            continue;
        }
        load_f<V>(d, dx + n * H + h);
        for (int q = 0; q < V; q++) d[q] += acc[q];
        store_f<V>(dx + n * H + h, d);
    }
}

// per slot: dye = gate * dout[token], dgate = dout[token] . ye (per-thread sums, then a block reduction in a
// fixed tree)
enum { DG_THREADS = 256 };
template <int V>
__global__ void dye_dgate_kernel(__nv_bfloat16 *dye, float *dgate, const float *dout, const __nv_bfloat16 *ye,
                                 const float *gate, const int32_t *slot_tok, const int32_t *slot_k, int64_t H,
                                 int64_t top) {
    pdl_wait();
    __shared__ float red[DG_THREADS / 32];
    const int64_t s = blockIdx.x, n = slot_tok[s], gi = n * top + slot_k[s];
    const float g = gate[gi];
    float acc = 0;
    for (int64_t h = threadIdx.x * V; h < H; h += blockDim.x * V) {
        float d[V], y[V], o[V];
        load_f<V>(d, dout + n * H + h);
        load_bf<V>(y, ye + s * H + h);
        for (int q = 0; q < V; q++) o[q] = g * d[q], acc += d[q] * y[q];
        store_bf<V>(dye + s * H + h, o);
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int w = 0; w < DG_THREADS / 32; w++) t += red[w];
        dgate[gi] = t;
    }
}

// pinned staging for the offsets' device-to-host copy (an async copy into pageable memory returns only
// once it is done), shared by every call: the lock covers copy, wait and read-out
pthread_mutex_t g_stage_lock = PTHREAD_MUTEX_INITIALIZER;
int32_t *g_stage;
int64_t g_stage_n;
cudaEvent_t g_stage_ev;

int grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// 8 columns per thread: H % 8 == 0 keeps every row 16 bytes aligned (bf16 and f32) if the bases are
bool vec8_rows(int64_t H, const void *f32a, const void *f32b, const void *bf16a, const void *bf16b) {
    return !(H & 7) && !(((uintptr_t)f32a | (uintptr_t)f32b | (uintptr_t)bf16a | (uintptr_t)bf16b) & 15);
}

// 4 columns per thread: H % 4 == 0 keeps every row 8 bytes (bf16) / 16 bytes (f32) aligned if the bases are
bool vec4_ok(int64_t H, const void *f32a, const void *f32b, const void *bf16a, const void *bf16b) {
    return !(H & 3) && !(((uintptr_t)f32a | (uintptr_t)f32b) & 15) && !(((uintptr_t)bf16a | (uintptr_t)bf16b) & 7);
}

// 16-byte access to rows of I bf16: I % 8 == 0 keeps every row (and gu's up half) 16-byte aligned if the bases are
bool vec8_ok(int64_t I, const void *a, const void *b, const void *c) {
    return !(I & 7) && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15);
}

// bf16x2 access is safe when I is even and the buffers are 4-byte aligned
bool pairs(int64_t I, const void *a, const void *b, const void *c) {
    return !(I & 1) && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 3);
}

// kiln_experts_profile_cuda: each pass that is not a GEMM timed on request (pass_profile, ops_common.cuh), so
// `kiln bench moe` can set each pass's time beside the bytes it moves
pass_profile<KILN_EXPERTS_NPASS> g_prof;

cudaError_t pass_mark(int p, int end, cudaStream_t st) { return pass_profile_mark(g_prof, p, end, st); }

} // namespace

extern "C" kiln_error *kiln_experts_profile_cuda(int on) {
    return pass_profile_enable(g_prof, on, "experts pass profile");
}

extern "C" kiln_error *kiln_experts_profile_read_cuda(double us[KILN_EXPERTS_NPASS]) {
    return pass_profile_read(g_prof, us, "experts pass profile");
}

extern "C" kiln_error *kiln_experts_forward_cuda(kiln_experts_cuda *x, float *out, const kiln_bf16 *in,
                                                 const kiln_bf16 *wgu, const kiln_bf16 *wdn, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t E = x->E, H = x->H, I = x->inter, N = x->N, top = x->top;
    int64_t S;
    int staged = 0;
    int32_t *cnt = NULL; // the dispatch's counts between its two halves
    if (H < 1 || I < 1)
        return kiln_errorf(KILN_EINVAL, "experts forward: hidden=%lld inter=%lld", (long long)H, (long long)I);
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_DISPATCH, 0, st));
    // the offsets go to the host as soon as the scan has them: the scatter and the gather run while it waits
    if ((err = kiln_experts_dispatch_offsets_cuda(x, &cnt, stream))) goto done;
    pthread_mutex_lock(&g_stage_lock);
    staged = 1;
    if (g_stage_n < E + 2) {
        if (g_stage) cudaFreeHost(g_stage);
        g_stage = NULL, g_stage_n = 0;
        CUDA_TRY(cudaHostAlloc((void **)&g_stage, (size_t)(E + 2) * sizeof(int32_t), cudaHostAllocDefault));
        g_stage_n = E + 2;
    }
    if (!g_stage_ev) CUDA_TRY(cudaEventCreateWithFlags(&g_stage_ev, cudaEventDisableTiming));
    CUDA_TRY(cudaMemcpyAsync(g_stage, x->exp_off, (size_t)(E + 2) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaEventRecord(g_stage_ev, st));
    err = kiln_experts_dispatch_scatter_cuda(x, cnt, stream);
    cnt = NULL;
    if (err) goto done;
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_DISPATCH, 1, st));
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_GATHER, 0, st));
    if (N * top) {
        kiln_launch(gather_kernel, (unsigned)(N * top), 128, 0, st, (__nv_bfloat16 *)x->xe, (const __nv_bfloat16 *)in,
                    x->slot_tok, x->exp_off + E, H, !(H & 7) && !(((uintptr_t)in | (uintptr_t)x->xe) & 15));
        CUDA_TRY(cudaGetLastError());
    }
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_GATHER, 1, st));
    CUDA_TRY(cudaEventSynchronize(g_stage_ev));
    memcpy(x->exp_off_host, g_stage, (size_t)(E + 2) * sizeof(int32_t));
    pthread_mutex_unlock(&g_stage_lock);
    staged = 0;
    if (x->exp_off_host[E + 1]) {
        err = kiln_errorf(KILN_EINVAL, "%d of %lld expert choices are outside 0..%lld (%lld experts + the skip class)",
                          x->exp_off_host[E + 1], (long long)(N * top), (long long)E, (long long)E);
        goto done;
    }
    S = x->nslots = x->exp_off_host[E];
    if (out && N && !S) CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)(N * H) * sizeof(float), st));
    if (!S) goto done;
    if ((err = kiln_grouped_gemm_cuda(x->gu, 0, x->xe, wgu, x->exp_off_host, E, 0, 2 * I, H, "NT", 0, NULL, stream)))
        goto done;
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_SWIGLU_FWD, 0, st));
    if (vec8_ok(I, x->act, x->gu, x->gu))
        kiln_launch(swiglu_fwd8_kernel, (unsigned)S, SWIGLU8_THREADS, 0, st, (__nv_bfloat16 *)x->act,
                    (const __nv_bfloat16 *)x->gu, I);
    else if (pairs(I, x->act, x->gu, x->gu))
        kiln_launch(swiglu_fwd_kernel<2>, grid_for(S * I / 2), 256, 0, st, (__nv_bfloat16 *)x->act,
                    (const __nv_bfloat16 *)x->gu, S, I);
    else
        kiln_launch(swiglu_fwd_kernel<1>, grid_for(S * I), 256, 0, st, (__nv_bfloat16 *)x->act,
                    (const __nv_bfloat16 *)x->gu, S, I);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_SWIGLU_FWD, 1, st));
    if ((err = kiln_grouped_gemm_cuda(x->ye, 0, x->act, wdn, x->exp_off_host, E, 0, H, I, "NT", 0, NULL, stream)))
        goto done;
    if (!out) goto done; // the caller forms the gated sum where it reads it (kiln_residual_norm_forward_gather_cuda)
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_COMBINE, 0, st));
    if (vec8_rows(H, out, out, x->ye, x->ye))
        kiln_launch(combine_kernel<8>, (unsigned)N, 256, 0, st, out, (const __nv_bfloat16 *)x->ye, x->gate,
                    x->tok_slot, H, top);
    else if (vec4_ok(H, out, out, x->ye, x->ye))
        kiln_launch(combine_kernel<4>, (unsigned)N, 256, 0, st, out, (const __nv_bfloat16 *)x->ye, x->gate,
                    x->tok_slot, H, top);
    else
        kiln_launch(combine_kernel<1>, (unsigned)N, 256, 0, st, out, (const __nv_bfloat16 *)x->ye, x->gate,
                    x->tok_slot, H, top);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_COMBINE, 1, st));
done:
    if (cnt) cudaFreeAsync(cnt, st);
    if (staged) pthread_mutex_unlock(&g_stage_lock);
    if (err) err = kiln_error_wrap(err, "experts forward (tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld)",
                                   (long long)N, (long long)H, (long long)I, (long long)E, (long long)top);
    return err;
}

extern "C" kiln_error *kiln_experts_backward_cuda(const kiln_experts_cuda *x, float *dx, float *dgate, void *dwgu,
                                                  void *dwdn, const float *dout, const kiln_bf16 *wgu,
                                                  const kiln_bf16 *wdn, kiln_experts_cuda_scratch *w, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    if (w->dw_bf16 && !w->dw_write)
        return kiln_errorf(KILN_EINVAL, "experts backward: bf16 weight gradients (dw_bf16) are written, not added to: "
                           "set dw_write too");
    const int64_t E = x->E, H = x->H, I = x->inter, N = x->N, top = x->top, S = x->nslots;
    if (S != x->exp_off_host[E])
        return kiln_errorf(KILN_EINVAL, "experts backward: %lld slots but the forward's offsets say %d (run "
                           "kiln_experts_forward_cuda on this struct first)", (long long)S, x->exp_off_host[E]);
    // the weight gradients' element: f32 (added to or written), or bf16 (written)
    const int dw_f32 = !w->dw_bf16;
    const size_t dwe = dw_f32 ? sizeof(float) : 2;
    // the weight gradients' GEMMs: =, += or = with the empty experts left to the caller
    const int dwmode = !w->dw_write ? KILN_GG_ADD : w->dw_keep_empty ? KILN_GG_WRITE_KEEP_EMPTY : KILN_GG_WRITE;
    const char *dv = getenv("KILN_EXPERTS_DW_DEFER");
    const int defer = w->dw_defer && !(dv && !strcmp(dv, "0"));
    const char *sqv = getenv("KILN_GROUPED_DW_SQ"); // =0: the caller reads the gradients back for their norm, as before
    const int want_sq = w->dw_sq && !(sqv && !strcmp(sqv, "0"));
    w->dw_sq_done = 0;
    // weight gradients a previous call left running read and write buffers this call may reuse
    if ((err = kiln_grouped_gemm_join(stream))) goto done;
    if (N) CUDA_TRY(cudaMemsetAsync(dgate, 0, (size_t)(N * top) * sizeof(float), st));
    if (!S) { // no rows: written gradients are empty sums (kept as they are for dw_keep_empty)
        if (w->dx_write && dx && N) CUDA_TRY(cudaMemsetAsync(dx, 0, (size_t)(N * H) * sizeof(float), st));
        if (w->dw_write && !w->dw_keep_empty && dwgu) CUDA_TRY(cudaMemsetAsync(dwgu, 0, (size_t)(E * 2 * I * H) * dwe, st));
        if (w->dw_write && !w->dw_keep_empty && dwdn) CUDA_TRY(cudaMemsetAsync(dwdn, 0, (size_t)(E * H * I) * dwe, st));
        goto done;
    }
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_DYE_DGATE, 0, st));
    if (vec8_rows(H, dout, dout, w->dye, x->ye))
        kiln_launch(dye_dgate_kernel<8>, (unsigned)S, DG_THREADS, 0, st, (__nv_bfloat16 *)w->dye, dgate, dout,
                    (const __nv_bfloat16 *)x->ye, x->gate, x->slot_tok, x->slot_k, H, top);
    else if (vec4_ok(H, dout, dout, w->dye, x->ye))
        kiln_launch(dye_dgate_kernel<4>, (unsigned)S, DG_THREADS, 0, st, (__nv_bfloat16 *)w->dye, dgate, dout,
                    (const __nv_bfloat16 *)x->ye, x->gate, x->slot_tok, x->slot_k, H, top);
    else
        kiln_launch(dye_dgate_kernel<1>, (unsigned)S, DG_THREADS, 0, st, (__nv_bfloat16 *)w->dye, dgate, dout,
                    (const __nv_bfloat16 *)x->ye, x->gate, x->slot_tok, x->slot_k, H, top);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_DYE_DGATE, 1, st));
    // down: dact = dye wdn_e, dwdn_e += dyeᵀ act (deferred: after gate_up's dX, see below)
    if ((err = kiln_grouped_gemm_cuda(w->dact, 0, w->dye, wdn, x->exp_off_host, E, 0, I, H, "NN", 0, NULL, stream)))
        goto done;
    if (!defer && dwdn &&
        (err = kiln_grouped_gemm_cuda(dwdn, dw_f32, w->dye, x->act, x->exp_off_host, E, H, I, 0, "TN", dwmode, NULL,
                                      stream)))
        goto done;
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_SWIGLU_BWD, 0, st));
    if (vec8_ok(I, w->dgu, w->dact, x->gu))
        kiln_launch(swiglu_bwd8_kernel, (unsigned)S, SWIGLU8_THREADS, 0, st, (__nv_bfloat16 *)w->dgu,
                    (const __nv_bfloat16 *)w->dact, (const __nv_bfloat16 *)x->gu, I);
    else if (pairs(I, w->dgu, w->dact, x->gu))
        kiln_launch(swiglu_bwd_kernel<2>, grid_for(S * I / 2), 256, 0, st, (__nv_bfloat16 *)w->dgu,
                    (const __nv_bfloat16 *)w->dact, (const __nv_bfloat16 *)x->gu, S, I);
    else
        kiln_launch(swiglu_bwd_kernel<1>, grid_for(S * I), 256, 0, st, (__nv_bfloat16 *)w->dgu,
                    (const __nv_bfloat16 *)w->dact, (const __nv_bfloat16 *)x->gu, S, I);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_SWIGLU_BWD, 1, st));
    // gate_up: dxe = dgu wgu_e, dwgu_e += dguᵀ xe
    if ((err = kiln_grouped_gemm_cuda(w->dxe, 0, w->dgu, wgu, x->exp_off_host, E, 0, H, 2 * I, "NN", 0, NULL, stream)))
        goto done;
    if (defer) {
        // both weight gradients on the side streams, left running: the caller's stream goes on with the gated
        // sum's dx and whatever follows (the router's backward) while they fill the SMs around it; the caller
        // joins (kiln_experts_backward_join_cuda) before dye/dgu/act/xe are reused or the gradients read. Their sums
        // of squares come along where asked for and the wgmma kernel runs both (the gradient norm's share).
        double *sq = want_sq && !dw_f32 && dwgu && dwdn ? w->dw_sq : NULL;
        int done_dn = 0, done_gu = 0;
        if (dwdn && (err = kiln_grouped_gemm_dw_sq_cuda_async(dwdn, dw_f32, w->dye, x->act, x->exp_off_host, E, H, I,
                                                              dwmode, sq ? sq + E : NULL, &done_dn, stream)))
            goto done;
        if (dwgu && (err = kiln_grouped_gemm_dw_sq_cuda_async(dwgu, dw_f32, w->dgu, x->xe, x->exp_off_host, E, 2 * I, H,
                                                              dwmode, sq, &done_gu, stream)))
            goto done;
        w->dw_sq_done = sq && done_dn && done_gu;
    } else if (dwgu &&
               (err = kiln_grouped_gemm_cuda(dwgu, dw_f32, w->dgu, x->xe, x->exp_off_host, E, 2 * I, H, 0, "TN", dwmode,
                                             NULL, stream))) {
        goto done;
    }
    if (dx) {
        CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_COMBINE_DX, 0, st));
        if (vec8_rows(H, dx, dx, w->dxe, w->dxe))
            kiln_launch(combine_dx_kernel<8>, (unsigned)N, 256, 0, st, dx, (const __nv_bfloat16 *)w->dxe, x->tok_slot,
                        H, top, w->dx_write);
        else if (vec4_ok(H, dx, dx, w->dxe, w->dxe))
            kiln_launch(combine_dx_kernel<4>, (unsigned)N, 256, 0, st, dx, (const __nv_bfloat16 *)w->dxe, x->tok_slot,
                        H, top, w->dx_write);
        else
            kiln_launch(combine_dx_kernel<1>, (unsigned)N, 256, 0, st, dx, (const __nv_bfloat16 *)w->dxe, x->tok_slot,
                        H, top, w->dx_write);
        CUDA_TRY(cudaGetLastError());
        CUDA_TRY(pass_mark(KILN_EXPERTS_PASS_COMBINE_DX, 1, st));
    }
done:
    if (err) err = kiln_error_wrap(err, "experts backward (tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld)",
                                   (long long)N, (long long)H, (long long)I, (long long)E, (long long)top);
    return err;
}

extern "C" kiln_error *kiln_experts_backward_join_cuda(void *stream) { return kiln_grouped_gemm_join(stream); }
