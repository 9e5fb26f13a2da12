// The router's head on the device: logits = a wᵀ over the E + 1 classes (a bf16 [n, r], w bf16 [e, r], f32 sums)
// and their row softmax, in one pass. Why: 17 classes are too narrow for cuBLASLt's tensor-core tiles; it ran the
// GEMM as an align-1 CUTLASS kernel, and the softmax read the logits back (21-22 us alone at the [cuda] shape,
// against 18 here; runs s22r7-r8 in docs/perf.md). A block takes a tile of RH_T tokens: the tile's rows of a
// (cp.async) and w (as f32: bf16 products are exact in f32) in shared memory, then every product from there; a
// thread sums 8 columns of one token's row a step (one 16-byte read; w's reads broadcast over the warp). The
// probabilities' arithmetic is softmax.cu's (a warp per token, one class a lane), so they match it bit for bit on
// the same logits. Shapes it does not take (more than 32 classes, r not a multiple of 8, rows not 16-byte aligned,
// a tile past the shared memory) go through the GEMM and softmax.cu.
// The backward: the logits' gradient in one pass (kiln_router_head_dlogits_cuda: the gate's gradient at the chosen
// classes, softmax.cu's backward and the bf16 cast, where two memsets and three kernels ran), then
// kiln_linear_backward_ex_cuda. A one-pass backward through the GEMMs too (dlogit, da = dlogit w and dw's per-tile
// partials from the same shared tiles) took 62-74 us against their 47-51 (runs s22r7-r8): its da reads w at full
// shared-memory bandwidth, 1.1 MB a tile.
#include "mma_bf16.cuh"
#include "ops_common.cuh"
#include "launch.cuh"

namespace {

enum { RH_THREADS = 256, RH_WARPS = RH_THREADS / 32, RH_T = 64 /* tokens a block */, RH_LD = 33 /* f32 pitch */ };

// bytes of shared memory: the tile of a (rows of r + 8 bf16: 16-byte aligned, and 8 rows 16 bytes apart in the
// banks for the 16-byte reads), w as f32, the tile's logits [RH_T][RH_LD] f32
size_t rh_smem(int64_t r, int64_t e) {
    return (size_t)RH_T * (size_t)(r + 8) * 2 + (size_t)(e * r) * 4 + (size_t)RH_T * RH_LD * 4;
}

// the tile's rows of a (zeros past n) and w -> shared memory; the caller waits (cp_async_wait<0>) and syncs
__device__ __forceinline__ void rh_stage(bf16 *as, float *ws, const bf16 *a, const bf16 *w, int64_t t0, int64_t n,
                                         int r, int e) {
    const int ch = r / 8;
    for (int i = threadIdx.x; i < RH_T * ch; i += RH_THREADS) {
        const int row = i / ch, c8 = i % ch;
        const bool ok = t0 + row < n;
        cp_async16(as + row * (r + 8) + c8 * 8, ok ? a + (t0 + row) * r + c8 * 8 : a, ok);
    }
    cp_async_commit();
    for (int i = threadIdx.x; i < e * ch; i += RH_THREADS) {
        float f[8];
        ld8_bf16(w + (int64_t)i * 8, f);
        *(float4 *)(ws + i * 8) = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(ws + i * 8 + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
}

// 8 f32 in shared memory (16-byte aligned)
__device__ __forceinline__ void lds8f(const float *p, float *o) {
    const float4 u = *(const float4 *)p, v = *(const float4 *)(p + 4);
    o[0] = u.x, o[1] = u.y, o[2] = u.z, o[3] = u.w, o[4] = v.x, o[5] = v.y, o[6] = v.z, o[7] = v.w;
}

// grid: tiles of RH_T tokens. Thread (token t = x % RH_T, class group g = x / RH_T) sums the logits of classes g,
// g + 4, ... over r in steps of 8 (one 16-byte read of a, w broadcast over the warp); then a warp per token: the
// softmax of softmax_fwd_kernel
__global__ void __launch_bounds__(RH_THREADS) rh_fwd_kernel(float *logits, float *probs, const bf16 *a, const bf16 *w,
                                                            int64_t n, int r, int e) {
    pdl_wait();
    extern __shared__ __align__(16) unsigned char rh_sm[];
    bf16 *as = (bf16 *)rh_sm;
    float *ws = (float *)(rh_sm + (size_t)RH_T * (r + 8) * 2), *lg = ws + e * r;
    const int64_t t0 = (int64_t)blockIdx.x * RH_T;
    rh_stage(as, ws, a, w, t0, n, r, e);
    cp_async_wait<0>();
    __syncthreads();
    {
        const int t = threadIdx.x % RH_T, g = threadIdx.x / RH_T;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < r; k += 8) {
            float x[8];
            ld8_bf16(as + t * (r + 8) + k, x);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int c = g + 4 * i;
                if (c >= e) break;
                float wv[8];
                lds8f(ws + c * r + k, wv);
#pragma unroll
                for (int q = 0; q < 8; q++) acc[i] = fmaf(x[q], wv[q], acc[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (g + 4 * i < e) lg[t * RH_LD + g + 4 * i] = acc[i];
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int i = threadIdx.x >> 5; i < RH_T && t0 + i < n; i += RH_WARPS) {
        const int64_t t = t0 + i;
        const float x = lane < e ? lg[i * RH_LD + lane] : -INFINITY;
        const float m = warp_max(x);
        const float s = warp_sum(lane < e ? expf(x - m) : 0.0f);
        if (lane < e) {
            if (logits) logits[t * e + lane] = x;
            probs[t * e + lane] = expf(x - m) * (1.0f / s);
        }
    }
}

// rh_fwd_kernel's tile fits a block's shared memory (opted in past 48 KB)
cudaError_t fwd_fits(int64_t r, int64_t e, bool *fits) {
    int dev, optin;
    *fits = false;
    cudaError_t st = cudaGetDevice(&dev);
    if (st == cudaSuccess) st = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (st != cudaSuccess || rh_smem(r, e) > (size_t)optin) return st;
    st = cudaFuncSetAttribute(rh_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rh_smem(r, e));
    *fits = st == cudaSuccess;
    return st;
}

bool fast_shape(int64_t r, int64_t e, const void *a, const void *w) {
    return e >= 1 && e <= 32 && r >= 8 && r % 8 == 0 && r <= 8192 && aligned16(a) && aligned16(w);
}

// a warp per token, a class a lane (e <= 32): dy = the gate's gradient at the token's chosen non-skip classes
// (router.cu's gate_bwd_kernel onto zeros), then softmax_bwd_kernel's arithmetic onto zeros and the bf16 rounding
// of convert.cu: the same bits as those ops
__global__ void rh_dlogit_kernel(bf16 *dl, const float *dgate, const int32_t *choice, const float *y, int64_t n, int e,
                                 int top) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); t < n; t += warps) {
        float dy = 0.0f, yv = 0.0f;
        for (int k = 0; k < top; k++) {
            const int32_t c = choice[t * top + k];
            if (c == lane && c < e - 1) dy += dgate[t * top + k];
        }
        float dot = 0;
        if (lane < e) yv = y[t * e + lane], dot += dy * yv;
        dot = warp_sum(dot);
        float dx = 0;
        dx += yv * (dy - dot);
        if (lane < e) dl[t * e + lane] = __float2bfloat16_rn(dx);
    }
}

} // namespace

extern "C" kiln_error *kiln_router_head_dlogits_cuda(kiln_bf16 *dlogits, const float *dgate, const int32_t *choice,
                                                     const float *probs, int64_t n, int64_t e, int64_t top,
                                                     void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *scratch = NULL;
    if (n <= 0) return NULL;
    if (!dlogits || !dgate || !choice || !probs || e < 2 || top < 1 || top > e)
        return kiln_errorf(KILN_EINVAL, "router head dlogits: dlogits, dgate, choice and probs, 2+ classes and top_k "
                                        "in 1..classes are required (classes %lld, top_k %lld)", (long long)e,
                           (long long)top);
    if (e > 32) { // the three ops
        CUDA_TRY(kiln_ops_scratch((void **)&scratch, (size_t)(2 * n * e) * sizeof(float), st));
        CUDA_TRY(cudaMemsetAsync(scratch, 0, (size_t)(2 * n * e) * sizeof(float), st));
        if (!(err = kiln_route_gate_backward_cuda(scratch, dgate, choice, n, e, top, stream)) &&
            !(err = kiln_softmax_backward_cuda(scratch + n * e, scratch, probs, n, e, stream)))
            err = kiln_f32_to_bf16_cuda(dlogits, scratch + n * e, n * e, stream);
        goto done;
    }
    kiln_launch(rh_dlogit_kernel, grid_for(n, 8), 256, 0, st, (bf16 *)dlogits, dgate, choice, probs, n, (int)e,
                (int)top);
    LAUNCH_CHECK("router head dlogits");
done:
    if (scratch) cudaFreeAsync(scratch, st);
    return err;
}

extern "C" kiln_error *kiln_router_head_forward_cuda(float *logits, float *probs, const kiln_bf16 *a,
                                                     const kiln_bf16 *w, int64_t n, int64_t r, int64_t e,
                                                     void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *scratch = NULL;
    if (n <= 0 || r <= 0 || e <= 0) return NULL;
    if (!probs || !a || !w) return kiln_errorf(KILN_EINVAL, "router head forward: probs, a and w are required");
    bool fits = false;
    if (fast_shape(r, e, a, w)) CUDA_TRY(fwd_fits(r, e, &fits));
    if (!fits) { // the unfused ops
        float *lg = logits;
        if (!lg) {
            CUDA_TRY(kiln_ops_scratch((void **)&scratch, (size_t)(n * e) * sizeof(float), st));
            lg = scratch;
        }
        if (!(err = kiln_gemm_bf16_cuda(lg, 1, a, w, n, e, r, "NT", 0, stream)))
            err = kiln_softmax_forward_cuda(probs, lg, n, e, stream);
        goto done;
    }
    {
        kiln_launch(rh_fwd_kernel, (unsigned)((n + RH_T - 1) / RH_T), RH_THREADS, rh_smem(r, e), st, logits, probs,
                    (const bf16 *)a, (const bf16 *)w, n, (int)r, (int)e);
        LAUNCH_CHECK("router head forward");
    }
done:
    if (scratch) cudaFreeAsync(scratch, st);
    return err;
}
