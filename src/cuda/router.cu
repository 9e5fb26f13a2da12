// The router's decision (biased top-k, unbiased gate) and dispatch on the device. Dispatch: the routed slots grouped by expert, in the CPU's order (stable by slot
// index s = token*top + k), by a counting sort in three small kernels: per-chunk histograms, one scan that
// turns them into each (expert, chunk)'s first slot, and a scatter in which one warp walks its chunk in
// order and ranks equal experts with __match_any_sync, so the result never depends on scheduling.
#include <climits>
#include <math.h>

#include "cuda_check.h"
#include "dispatch.h"
#include "kiln/cuda_ops.h"
#include "launch.cuh"

namespace {

// Slots per block (one warp per block walks them 32 at a time): 256 up to 64K slots (the [cuda] config's 16384
// make 64 warps of 8 steps; 1024 made 16 warps of 32 steps, 13.5 us a layer on the forward's path), 1024 beyond
// (the one-block scan walks every chunk of an expert). The result does not depend on it: a stable counting sort
// by slot index.
static int dispatch_chunk(int64_t S) { return S <= 65536 ? 256 : 1024; }

__device__ __forceinline__ int bin_of(int32_t c, int32_t E) { return c >= 0 && c < E ? c : c == E ? E : E + 1; }

// cnt[bin * nblk + blk] for bins 0..E+1 (E = skip, E+1 = out of range)
__global__ void hist_kernel(int32_t *cnt, const int32_t *choice, int64_t S, int32_t E, int nblk, int chunk) {
    pdl_wait();
    extern __shared__ int32_t h[];
    for (int i = threadIdx.x; i < E + 2; i += blockDim.x) h[i] = 0;
    __syncthreads();
    const int64_t s0 = (int64_t)blockIdx.x * chunk, s1 = s0 + chunk < S ? s0 + chunk : S;
    for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) atomicAdd(&h[bin_of(choice[s], E)], 1);
    __syncthreads();
    for (int i = threadIdx.x; i < E + 2; i += blockDim.x) cnt[(int64_t)i * nblk + blockIdx.x] = h[i];
}

// One block: per-bin totals, an exclusive scan over the experts (bins 0..E-1), then every (expert, chunk)
// count is replaced by that chunk's first slot. exp_off[E] = routed slots, exp_off[E+1] = bad choices.
__global__ void scan_kernel(int32_t *cnt, int32_t *exp_off, int32_t E, int nblk) {
    pdl_wait();
    extern __shared__ int32_t tot[];
    for (int e = threadIdx.x; e < E + 2; e += blockDim.x) {
        int32_t t = 0;
        for (int b = 0; b < nblk; b++) t += cnt[(int64_t)e * nblk + b];
        tot[e] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0;
        for (int e = 0; e < E; e++) {
            int32_t t = tot[e];
            tot[e] = run;
            run += t;
        }
        exp_off[E + 1] = tot[E + 1];
        exp_off[E] = run;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = tot[e];
        exp_off[e] = run;
        for (int b = 0; b < nblk; b++) {
            int32_t c = cnt[(int64_t)e * nblk + b];
            cnt[(int64_t)e * nblk + b] = run;
            run += c;
        }
    }
}

__global__ void scatter_kernel(int32_t *slot_tok, int32_t *slot_k, int32_t *tok_slot, const int32_t *cnt,
                               const int32_t *choice, int64_t S, int32_t E, int32_t top, int nblk, int chunk) {
    pdl_wait();
    extern __shared__ int32_t base[];
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) base[e] = cnt[(int64_t)e * nblk + blockIdx.x];
    __syncwarp();
    const int64_t s0 = (int64_t)blockIdx.x * chunk, s1 = s0 + chunk < S ? s0 + chunk : S;
    for (int64_t g = s0; g < s1; g += 32) {
        const int64_t s = g + lane;
        const int32_t c = s < s1 ? choice[s] : -1;
        const int ok = c >= 0 && c < E;
        const int key = s >= s1 ? -2 : ok ? c : -1;
        const unsigned same = __match_any_sync(0xffffffffu, key);
        const int rank = __popc(same & ((1u << lane) - 1u));
        int32_t pos = -1;
        if (ok) pos = base[c] + rank;
        __syncwarp();
        if (ok && rank == 0) base[c] += __popc(same);
        __syncwarp();
        if (s < s1) {
            tok_slot[s] = pos;
            if (ok) {
                slot_tok[pos] = (int32_t)(s / top);
                slot_k[pos] = (int32_t)(s % top);
            }
        }
    }
}

// One warp per token: lane l owns classes l, l+32, ...; each of the top passes takes the lane-best
// untaken class (strict >, so the lower index wins a tie within a lane), then a shuffle reduction that
// prefers the higher value and, on equal values, the lower index: kiln_route_topk's rule exactly.
enum { TOPK_WARPS = 8, TOPK_MAX_PER_LANE = 32 };
__global__ void topk_kernel(int32_t *choice, float *gate, const float *probs, const float *bias, int64_t n, int e1,
                            int top) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * TOPK_WARPS + (threadIdx.x >> 5);
    if (t >= n) return; // whole warps leave together: t is the same for every lane of a warp
    const float *p = probs + t * e1;
    uint32_t taken = 0; // bit i: class lane + 32*i already chosen
    for (int s = 0; s < top; s++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int i = 0, c = lane; c < e1; i++, c += 32) {
            const float v = p[c] + bias[c];
            if (!(taken >> i & 1u) && (bi == INT_MAX || v > bv)) bv = v, bi = c;
        }
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            choice[t * top + s] = bi;
            gate[t * top + s] = bi == e1 - 1 ? 0.0f : p[bi];
        }
    }
}

// dprobs[t, choice] += dgate: a token's choices are distinct, so no two threads touch one element
__global__ void gate_bwd_kernel(float *dprobs, const float *dgate, const int32_t *choice, int64_t n, int64_t e1,
                                int64_t top) {
    pdl_wait();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n * top) return;
    const int32_t e = choice[i];
    if (e >= 0 && e < e1 - 1) dprobs[(i / top) * e1 + e] += dgate[i];
}

} // namespace

extern "C" kiln_error *kiln_route_topk_cuda(int32_t *choice, float *gate, const float *probs, const float *bias,
                                            int64_t n, int64_t e1, int64_t top, void *stream) {
    kiln_error *err = NULL;
    if (n < 0 || e1 < 2 || e1 > 32 * TOPK_MAX_PER_LANE || top < 1 || top > e1)
        return kiln_errorf(KILN_EINVAL, "route top-k: n=%lld classes=%lld top_k=%lld (need 2..%d classes, top_k in "
                           "1..classes)", (long long)n, (long long)e1, (long long)top, 32 * TOPK_MAX_PER_LANE);
    if (!n) return NULL;
    kiln_launch(topk_kernel, (unsigned)((n + TOPK_WARPS - 1) / TOPK_WARPS), 32 * TOPK_WARPS, 0, (cudaStream_t)stream,
                choice, gate, probs, bias, n, (int)e1, (int)top);
    CUDA_TRY(cudaGetLastError());
done:
    return err ? kiln_error_wrap(err, "route top-k") : NULL;
}

extern "C" kiln_error *kiln_route_gate_backward_cuda(float *dprobs, const float *dgate, const int32_t *choice,
                                                     int64_t n, int64_t e1, int64_t top, void *stream) {
    kiln_error *err = NULL;
    if (n < 0 || e1 < 2 || top < 1)
        return kiln_errorf(KILN_EINVAL, "route gate backward: n=%lld classes=%lld top_k=%lld", (long long)n,
                           (long long)e1, (long long)top);
    if (!n) return NULL;
    kiln_launch(gate_bwd_kernel, (unsigned)((n * top + 255) / 256), 256, 0, (cudaStream_t)stream, dprobs, dgate,
                choice, n, e1, top);
    CUDA_TRY(cudaGetLastError());
done:
    return err ? kiln_error_wrap(err, "route gate backward") : NULL;
}

// The dispatch's first half: the histograms and the scan, after which x->exp_off is final; *cnt (NULL when there
// are no slots) holds each (expert, chunk)'s first slot for the second half, which frees it.
kiln_error *kiln_experts_dispatch_offsets_cuda(kiln_experts_cuda *x, int32_t **cnt, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t S = x->N * x->top;
    *cnt = NULL;
    if (x->N < 0 || x->E < 1 || x->top < 1 || x->top > x->E || S > INT32_MAX || x->E > 8192)
        return kiln_errorf(KILN_EINVAL, "experts dispatch: N=%lld E=%lld top_k=%lld (need E in 1..8192, top_k in "
                           "1..E, N*top_k < 2^31)", (long long)x->N, (long long)x->E, (long long)x->top);
    const int32_t E = (int32_t)x->E;
    const int chunk = dispatch_chunk(S), nblk = (int)((S + chunk - 1) / chunk);
    const size_t sh = (size_t)(E + 2) * sizeof(int32_t);
    if (nblk == 0) { // no tokens: empty offsets
        CUDA_TRY(cudaMemsetAsync(x->exp_off, 0, sh, st));
        goto done;
    }
    CUDA_TRY(cudaMallocAsync((void **)cnt, (size_t)(E + 2) * nblk * sizeof(int32_t), st));
    kiln_launch(hist_kernel, nblk, 256, sh, st, *cnt, x->choice, S, E, nblk, chunk);
    CUDA_TRY(cudaGetLastError());
    kiln_launch(scan_kernel, 1, 256, sh, st, *cnt, x->exp_off, E, nblk);
    CUDA_TRY(cudaGetLastError());
done:
    if (err && *cnt) cudaFreeAsync(*cnt, st), *cnt = NULL;
    if (err) err = kiln_error_wrap(err, "experts dispatch (N=%lld E=%lld top_k=%lld)", (long long)x->N,
                                   (long long)x->E, (long long)x->top);
    return err;
}

// The second half: the scatter into slot_tok, slot_k and tok_slot; frees cnt
kiln_error *kiln_experts_dispatch_scatter_cuda(kiln_experts_cuda *x, int32_t *cnt, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t S = x->N * x->top;
    const int32_t E = (int32_t)x->E;
    const int chunk = dispatch_chunk(S), nblk = (int)((S + chunk - 1) / chunk);
    if (!cnt) return NULL;
    kiln_launch(scatter_kernel, nblk, 32, (size_t)(E + 2) * sizeof(int32_t), st, x->slot_tok, x->slot_k, x->tok_slot,
                cnt, x->choice, S, E, (int32_t)x->top, nblk, chunk);
    CUDA_TRY(cudaGetLastError());
done:
    cudaFreeAsync(cnt, st);
    if (err) err = kiln_error_wrap(err, "experts dispatch (N=%lld E=%lld top_k=%lld)", (long long)x->N,
                                   (long long)x->E, (long long)x->top);
    return err;
}

extern "C" kiln_error *kiln_experts_dispatch_cuda(kiln_experts_cuda *x, void *stream) {
    int32_t *cnt = NULL;
    KILN_TRY(kiln_experts_dispatch_offsets_cuda(x, &cnt, stream));
    return kiln_experts_dispatch_scatter_cuda(x, cnt, stream);
}
