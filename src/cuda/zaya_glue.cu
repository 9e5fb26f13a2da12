// The ZAYA model's own glue on the GPU (src/models/zaya_cuda.c): the small steps between the library
// ops that only this model has: q|k packing for the CCA convolution, the router's depth averaging and the
// route counts (the coupling, the value shift and the routing decision are src/cuda/cca_couple.cu,
// value_shift.cu and router.cu).
// Each is the twin of a loop in src/models/zaya_forward.c / zaya_backward.c, computed in f32 from bf16
// activations, one rounding per output. Column sums over tokens (weight gradients) go through the fixed
// order colsum_add of ops_common.cuh, never float atomics.
#include "ops_common.cuh"
#include "launch.cuh"

// ---- q|k packing: qk [N, Q+K] = q [N,Q] | k [N,K] (also the convolution's dy from dqpre|dkpre) ----
static __global__ void pack2_kernel(bf16 *qk, const bf16 *q, const bf16 *k, int64_t N, int64_t Q, int64_t K) {
    pdl_wait();
    const int64_t C = Q + K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / C, c = i % C;
        qk[i] = c < Q ? q[n * Q + c] : k[n * K + c - Q];
    }
}
extern "C" kiln_error *kiln_zaya_pack_qk_cuda(kiln_bf16 *qk, const kiln_bf16 *q, const kiln_bf16 *k, int64_t N,
                                              int64_t Q, int64_t K, void *stream) {
    kiln_error *err = NULL;
    if (N * (Q + K) > 0)
        kiln_launch(pack2_kernel, grid_for(N * (Q + K), 256), 256, 0, (cudaStream_t)stream, (bf16 *)qk,
                    (const bf16 *)q, (const bf16 *)k, N, Q, K);
    LAUNCH_CHECK("zaya pack q|k");
done:
    return err;
}

// ---- the router's depth averaging: rdown [N,R] += prev [N,R] * scale [R] (bf16 in place, f32 math) ----
// V = 4: four columns a thread through 8-byte bf16 / 16-byte f32 accesses (R % 4 == 0 and aligned bases; the
// router's [16384, 256] took 17.5 us forward and 43 us backward with two-byte accesses, bench/kernel_trace.sh)
template <int V>
static __global__ void rstate_fwd_kernel(bf16 *rdown, const bf16 *prev, const float *scale, int64_t N, int64_t R) {
    pdl_wait();
    const int64_t nv = N * R / V;
    for (int64_t iv = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; iv < nv; iv += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = iv * V;
        float a[V], b[V], sc[V];
        ldv<V>(rdown, i, a), ldv<V>(prev, i, b), ldv<V>(scale, i % R, sc);
#pragma unroll
        for (int q = 0; q < V; q++) a[q] = a[q] + b[q] * sc[q];
        stv<V>(rdown, i, a);
    }
}
static bool rstate_vec4(int64_t R, const void *bf_a, const void *bf_b, const void *f_a, const void *f_b) {
    return !(R & 3) && !(((uintptr_t)bf_a | (uintptr_t)bf_b) & 7) && !(((uintptr_t)f_a | (uintptr_t)f_b) & 15);
}
extern "C" kiln_error *kiln_zaya_router_state_forward_cuda(kiln_bf16 *rdown, const kiln_bf16 *prev, const float *scale,
                                                           int64_t N, int64_t R, void *stream) {
    kiln_error *err = NULL;
    if (N * R > 0 && rstate_vec4(R, rdown, prev, scale, scale))
        kiln_launch(rstate_fwd_kernel<4>, grid_for(N * R / 4, 256), 256, 0, (cudaStream_t)stream, (bf16 *)rdown,
                    (const bf16 *)prev, scale, N, R);
    else if (N * R > 0)
        kiln_launch(rstate_fwd_kernel<1>, grid_for(N * R, 256), 256, 0, (cudaStream_t)stream, (bf16 *)rdown,
                    (const bf16 *)prev, scale, N, R);
    LAUNCH_CHECK("zaya router state forward");
done:
    return err;
}

// Backward, given g = the gradient of this layer's (averaged) router state as its norm's bf16 input
// gradient dxn plus what the next layer sent back (carry, f32; nullable):
//   drs_bf16 = g (the r_down projection's output gradient);
//   dprev (f32, written; nullable) = g * scale; dscale [R] += sum over tokens of g * prev (fixed order).
// prod: f32 scratch of N*R (nullable when there is no prev), here the chunks' dscale partials.
// dscale's sum is taken per chunk of rows (block c: rows [c*rp, ...), thread t the columns t, t + blockDim.x,
// ...: coalesced across the threads), in double, then one coalesced column sum of the chunks' partials (part,
// [chunks, R]): the product g * prev is never written out and then read back column by column (colsum_add: 4
// bytes per 1 KB row stride at the router's width).
// V columns a thread (j .. j + V-1), each summed over the chunk's rows in order: the same bits for any V
template <int V>
static __global__ void rstate_bwd_chunk_kernel(bf16 *drs, float *dprev, float *part, const bf16 *dxn, const float *carry,
                                               const bf16 *prev, const float *scale, int64_t N, int64_t R, int64_t rp) {
    pdl_wait();
    const int64_t r0 = blockIdx.x * rp, r1 = r0 + rp < N ? r0 + rp : N;
    for (int64_t j = threadIdx.x * V; j < R; j += blockDim.x * V) {
        float sj[V] = {};
        if (dprev) ldv<V>(scale, j, sj);
        double acc[V] = {};
#pragma unroll 4
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i = r * R + j;
            float g[V], c[V] = {}, pv[V] = {}, dp[V];
            ldv<V>(dxn, i, g);
            if (carry) ldv<V>(carry, i, c);
            if (part) ldv<V>(prev, i, pv);
#pragma unroll
            for (int q = 0; q < V; q++) {
                g[q] = g[q] + c[q];
                dp[q] = g[q] * sj[q];
                if (part) acc[q] += (double)(g[q] * pv[q]);
            }
            stv<V>(drs, i, g);
            if (dprev) stv<V>(dprev, i, dp);
        }
        if (part)
#pragma unroll
            for (int q = 0; q < V; q++) part[blockIdx.x * R + j + q] = (float)acc[q];
    }
}

extern "C" kiln_error *kiln_zaya_router_state_backward_cuda(kiln_bf16 *drs, float *dprev, float *dscale, float *prod,
                                                            const kiln_bf16 *dxn, const float *carry,
                                                            const kiln_bf16 *prev, const float *scale, int64_t N,
                                                            int64_t R, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t s = (cudaStream_t)stream;
    const int with_prev = prev && scale;
    if (N * R > 0) { // ~1024 chunks of rows (a fixed count: the same bits on any device)
        const int64_t rp = chunk_rows(N, 1024), nc = (N + rp - 1) / rp;
        float *part = with_prev && dscale ? prod : NULL; // nc*R <= N*R floats
        const int v4 = rstate_vec4(R, drs, dxn, carry, with_prev ? dprev : NULL) && rstate_vec4(R, prev, prev, scale, scale);
        const int64_t cols = v4 ? R / 4 : R;
        const int threads = cols >= 256 ? 256 : (int)((cols + 31) / 32 * 32);
        if (v4)
            kiln_launch(rstate_bwd_chunk_kernel<4>, (int)nc, threads, 0, s, (bf16 *)drs, with_prev ? dprev : NULL,
                        part, (const bf16 *)dxn, carry, (const bf16 *)prev, scale, N, R, rp);
        else
            kiln_launch(rstate_bwd_chunk_kernel<1>, (int)nc, threads, 0, s, (bf16 *)drs, with_prev ? dprev : NULL,
                        part, (const bf16 *)dxn, carry, (const bf16 *)prev, scale, N, R, rp);
        LAUNCH_CHECK("zaya router state backward");
        if (part) CUDA_TRY(colsum_add_multi(&dscale, 1, part, nc, R, s));
    }
done:
    return err;
}

// Route counts [E1] += how many of the N*top choices went to each class (integer atomics: exact). Each block
// counts its share in shared memory first: one global atomic a class a block, instead of a global atomic a
// choice on E1 addresses (the [cuda] config: 16384 choices on 17 counters, 12 us a layer).
enum { COUNT_BLOCKS = 32, COUNT_SMEM_MAX = 4096 };
static __global__ void count_kernel(int64_t *counts, const int32_t *choice, int64_t S, int64_t E1) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < S; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t e = choice[i];
        if (e >= 0 && e < E1) atomicAdd((unsigned long long *)&counts[e], 1ull);
    }
}
static __global__ void count_smem_kernel(int64_t *counts, const int32_t *choice, int64_t S, int E1) {
    pdl_wait();
    extern __shared__ unsigned int hist[];
    for (int i = threadIdx.x; i < E1; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < S; i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t e = choice[i];
        if (e >= 0 && e < E1) atomicAdd(&hist[e], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < E1; i += blockDim.x)
        if (hist[i]) atomicAdd((unsigned long long *)&counts[i], (unsigned long long)hist[i]);
}
extern "C" kiln_error *kiln_zaya_route_count_cuda(int64_t *counts, const int32_t *choice, int64_t S, int64_t E1,
                                                  void *stream) {
    kiln_error *err = NULL;
    int blocks = grid_for(S, 256);
    if (blocks > COUNT_BLOCKS) blocks = COUNT_BLOCKS;
    if (S > 0 && E1 <= COUNT_SMEM_MAX)
        kiln_launch(count_smem_kernel, (unsigned)blocks, 256, (size_t)E1 * sizeof(unsigned int), (cudaStream_t)stream,
                    counts, choice, S, (int)E1);
    else if (S > 0)
        kiln_launch(count_kernel, grid_for(S, 256), 256, 0, (cudaStream_t)stream, counts, choice, S, E1);
    LAUNCH_CHECK("zaya route counts");
done:
    return err;
}

// ---- the trainer's whole-buffer pieces ----
// x *= s over n floats.
static __global__ void scale_kernel(float *x, int64_t n, float s) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
extern "C" kiln_error *kiln_zaya_scale_cuda(float *x, int64_t n, float s, void *stream) {
    kiln_error *err = NULL;
    if (n > 0) kiln_launch(scale_kernel, grid_for(n, 256) < 4096 ? grid_for(n, 256) : 4096, 256, 0,
                           (cudaStream_t)stream, x, n, s);
    LAUNCH_CHECK("scale");
done:
    return err;
}

// Sum of squares in f64: SUMSQ_BLOCKS fixed blocks each sum a fixed strided subset in a fixed tree, then
// one block sums the partials in order; the same bits every run for the same n.
enum { SUMSQ_BLOCKS = 1024 };
static __global__ void sumsq_partial_kernel(double *part, const float *x, int64_t n) {
    pdl_wait();
    __shared__ double sh[32];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
static __global__ void sumsq_final_kernel(double *out, const double *part, int nb) {
    pdl_wait();
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = s;
}
extern "C" kiln_error *kiln_zaya_sumsq_cuda(double *out, const float *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t s = (cudaStream_t)stream;
    double *part = NULL;
    CUDA_TRY(cudaMallocAsync((void **)&part, SUMSQ_BLOCKS * sizeof(double), s));
    kiln_launch(sumsq_partial_kernel, SUMSQ_BLOCKS, 256, 0, s, part, x, n);
    LAUNCH_CHECK("sum of squares");
    kiln_launch(sumsq_final_kernel, 1, 1024, 0, s, out, part, SUMSQ_BLOCKS);
    LAUNCH_CHECK("sum of squares");
done:
    if (part) cudaFreeAsync(part, s);
    return err;
}

// ---- host words into device memory in stream order, as kernel parameters (the experts' zero mask) ----
enum { WS_WORDS = 256 };
struct words_arg { uint32_t v[WS_WORDS]; };
static __global__ void words_set_kernel(uint32_t *dst, words_arg a, int n) {
    pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = a.v[i];
}
extern "C" kiln_error *kiln_words_set_cuda(uint32_t *dst, const uint32_t *src, int64_t n, void *stream) {
    kiln_error *err = NULL;
    for (int64_t i = 0; i < n; i += WS_WORDS) {
        words_arg a;
        const int m = (int)(n - i < WS_WORDS ? n - i : WS_WORDS);
        memcpy(a.v, src + i, (size_t)m * sizeof *src);
        kiln_launch(words_set_kernel, 1, 256, 0, (cudaStream_t)stream, dst + i, a, m);
        LAUNCH_CHECK("words to the device");
    }
done:
    return err;
}

// ---- the sum of squares over segments, f32 or bf16 (the gradient with the experts' bf16 weight gradients) ----
// A fixed work list of chunks of SQ_CHUNK elements (a block each, its partial in its slot), then the partials
// summed in order by sumsq_final_kernel: the same bits every run of a plan. Each square in f64, as above.
enum { SQ_CHUNK = 1 << 18, SQ_THREADS = 256 };
struct sq_item {
    int64_t start; // the chunk's first element: a float index of x, or (bf16) an index of x read as bf16
    int n, bf16;
    int zbit1;     // > 0: the chunk is zero (its partial 0, nothing read) where bit zbit1 - 1 of the mask is set
};
static __device__ __forceinline__ double sq_bf16x2(uint32_t u) {
    const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&u);
    return (double)f.x * f.x + (double)f.y * f.y;
}
static __global__ void __launch_bounds__(SQ_THREADS) sumsq_items_kernel(double *part, const float *x, const sq_item *items,
                                                                        const uint32_t *zmask) {
    pdl_wait();
    __shared__ double sh[32];
    const sq_item q = items[blockIdx.x];
    if (q.zbit1 && zmask && mask_bit(zmask, q.zbit1 - 1)) {
        if (threadIdx.x == 0) part[blockIdx.x] = 0.0;
        return;
    }
    double s = 0;
    int i = 0; // elements before i are taken by the vector loop
    if (q.bf16) {
        const bf16 *p = (const bf16 *)x + q.start;
        if (((uintptr_t)p & 15) == 0) {
            i = q.n / 8 * 8;
            for (int j = 8 * (int)threadIdx.x; j < i; j += 8 * SQ_THREADS) {
                const uint4 v = *(const uint4 *)(p + j);
                s += sq_bf16x2(v.x) + sq_bf16x2(v.y) + sq_bf16x2(v.z) + sq_bf16x2(v.w);
            }
        }
        for (int j = i + (int)threadIdx.x; j < q.n; j += SQ_THREADS) {
            const float f = __bfloat162float(p[j]);
            s += (double)f * f;
        }
    } else {
        const float *p = x + q.start;
        if (((uintptr_t)p & 15) == 0) {
            i = q.n / 4 * 4;
            for (int j = 4 * (int)threadIdx.x; j < i; j += 4 * SQ_THREADS) {
                const float4 v = *(const float4 *)(p + j);
                s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
            }
        }
        for (int j = i + (int)threadIdx.x; j < q.n; j += SQ_THREADS) s += (double)p[j] * p[j];
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

struct kiln_sumsq_plan {
    sq_item *items; // device
    double *part;   // device, one per item
    int nitems, count;
    int *first;     // host: segment k's items are [first[k], first[k + 1])
    int *first_dev; // the same on the device (kiln_sumsq_plan_give)
    const uint32_t *zmask; // kiln_sumsq_plan_set_zero_mask's (device)
};

extern "C" void kiln_sumsq_plan_set_zero_mask(kiln_sumsq_plan *p, const uint32_t *mask) { p->zmask = mask; }

extern "C" void kiln_sumsq_plan_free(kiln_sumsq_plan *p) {
    if (!p) return;
    cudaFree(p->items);
    cudaFree(p->part);
    cudaFree(p->first_dev);
    free(p->first);
    free(p);
}

extern "C" kiln_error *kiln_sumsq_plan_create(const kiln_sumsq_seg *segs, int count, kiln_sumsq_plan **out) {
    kiln_error *err = NULL;
    *out = NULL;
    int64_t n = 0;
    for (int k = 0; k < count; k++) {
        if (segs[k].off < 0 || segs[k].n < 0 || segs[k].zbit1 < 0)
            return kiln_errorf(KILN_EINVAL, "sum of squares: segment %d at %lld, %lld elements", k, (long long)segs[k].off,
                               (long long)segs[k].n);
        n += (segs[k].n + SQ_CHUNK - 1) / SQ_CHUNK;
    }
    if (n > INT32_MAX / 2) return kiln_errorf(KILN_EINVAL, "sum of squares: %lld chunks is too many", (long long)n);
    kiln_sumsq_plan *p = (kiln_sumsq_plan *)calloc(1, sizeof *p);
    sq_item *h = (sq_item *)malloc((size_t)(n + 1) * sizeof *h);
    if (!p || !h || !(p->first = (int *)malloc(((size_t)count + 1) * sizeof(int)))) {
        if (p) free(p->first);
        free(p), free(h);
        return kiln_errorf(KILN_ENOMEM, "sum of squares: a work list of %lld chunks", (long long)n);
    }
    int m = 0;
    for (int k = 0; k < count; k++) {
        p->first[k] = m;
        for (int64_t c = 0; c < segs[k].n; c += SQ_CHUNK)
            h[m++] = sq_item{(segs[k].bf16 ? 2 * segs[k].off : segs[k].off) + c,
                             (int)(segs[k].n - c < SQ_CHUNK ? segs[k].n - c : SQ_CHUNK), segs[k].bf16 != 0,
                             segs[k].zbit1};
    }
    p->first[count] = m;
    p->nitems = m, p->count = count;
    CUDA_TRY(cudaMalloc((void **)&p->items, (size_t)(m + 1) * sizeof *h));
    CUDA_TRY(cudaMalloc((void **)&p->part, (size_t)(m + 1) * sizeof(double)));
    if (m) CUDA_TRY(cudaMemcpy(p->items, h, (size_t)m * sizeof *h, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMalloc((void **)&p->first_dev, ((size_t)count + 1) * sizeof(int)));
    CUDA_TRY(cudaMemcpy(p->first_dev, p->first, ((size_t)count + 1) * sizeof(int), cudaMemcpyHostToDevice));
    // landed before a non-blocking stream's pass reads them (a copy from pageable memory may return before)
    CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
done:
    free(h);
    if (err) kiln_sumsq_plan_free(p);
    else *out = p;
    return err;
}

extern "C" kiln_error *kiln_sumsq_plan_partial(const kiln_sumsq_plan *p, int k0, int k1, const float *x, void *stream) {
    kiln_error *err = NULL;
    if (k0 < 0 || k1 > p->count || k0 > k1)
        return kiln_errorf(KILN_EINVAL, "sum of squares: segments %d..%d of %d", k0, k1 - 1, p->count);
    const int i0 = p->first[k0], ni = p->first[k1] - i0;
    if (ni) kiln_launch(sumsq_items_kernel, (unsigned)ni, SQ_THREADS, 0, (cudaStream_t)stream, p->part + i0, x,
                        p->items + i0, p->zmask);
    LAUNCH_CHECK("sum of squares (segments)");
done:
    return err;
}

// segment k0 + blockIdx.x's sum given: its first item's partial, zeros in its others
static __global__ void sumsq_give_kernel(double *part, const int *first, int k0, const double *vals) {
    pdl_wait();
    const int k = k0 + (int)blockIdx.x, i0 = first[k], i1 = first[k + 1];
    for (int i = i0 + (int)threadIdx.x; i < i1; i += (int)blockDim.x) part[i] = i == i0 ? vals[blockIdx.x] : 0.0;
}

extern "C" kiln_error *kiln_sumsq_plan_give(const kiln_sumsq_plan *p, int k0, int k1, const double *vals, void *stream) {
    kiln_error *err = NULL;
    if (k0 < 0 || k1 > p->count || k0 > k1)
        return kiln_errorf(KILN_EINVAL, "sum of squares: segments %d..%d of %d", k0, k1 - 1, p->count);
    if (k1 > k0)
        kiln_launch(sumsq_give_kernel, (unsigned)(k1 - k0), 64, 0, (cudaStream_t)stream, p->part, (const int *)p->first_dev,
                    k0, vals);
    LAUNCH_CHECK("sum of squares (given segments)");
done:
    return err;
}

extern "C" kiln_error *kiln_sumsq_plan_total(const kiln_sumsq_plan *p, double *out, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t s = (cudaStream_t)stream;
    if (!p->nitems) {
        CUDA_TRY(cudaMemsetAsync(out, 0, sizeof *out, s));
        return NULL;
    }
    kiln_launch(sumsq_final_kernel, 1, 1024, 0, s, out, p->part, p->nitems);
    LAUNCH_CHECK("sum of squares (segments)");
done:
    return err;
}

extern "C" kiln_error *kiln_sumsq_plan_run(const kiln_sumsq_plan *p, double *out, const float *x, void *stream) {
    KILN_TRY(kiln_sumsq_plan_partial(p, 0, p->count, x, stream));
    return kiln_sumsq_plan_total(p, out, stream);
}
