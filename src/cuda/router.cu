// Router dispatch on the device: the routed slots grouped by expert, in the CPU's order (stable by slot
// index s = token*top + k), by a counting sort in three small kernels: per-chunk histograms, one scan that
// turns them into each (expert, chunk)'s first slot, and a scatter in which one warp walks its chunk in
// order and ranks equal experts with __match_any_sync, so the result never depends on scheduling.
#include "cuda_check.h"
#include "kiln/cuda_ops.h"

namespace {

enum { CHUNK = 1024 }; // slots per block; one warp per block walks them 32 at a time

__device__ __forceinline__ int bin_of(int32_t c, int32_t E) { return c >= 0 && c < E ? c : c == E ? E : E + 1; }

// cnt[bin * nblk + blk] for bins 0..E+1 (E = skip, E+1 = out of range)
__global__ void hist_kernel(int32_t *cnt, const int32_t *choice, int64_t S, int32_t E, int nblk) {
    extern __shared__ int32_t h[];
    for (int i = threadIdx.x; i < E + 2; i += blockDim.x) h[i] = 0;
    __syncthreads();
    const int64_t s0 = (int64_t)blockIdx.x * CHUNK, s1 = s0 + CHUNK < S ? s0 + CHUNK : S;
    for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) atomicAdd(&h[bin_of(choice[s], E)], 1);
    __syncthreads();
    for (int i = threadIdx.x; i < E + 2; i += blockDim.x) cnt[(int64_t)i * nblk + blockIdx.x] = h[i];
}

// One block: per-bin totals, an exclusive scan over the experts (bins 0..E-1), then every (expert, chunk)
// count is replaced by that chunk's first slot. exp_off[E] = routed slots, exp_off[E+1] = bad choices.
__global__ void scan_kernel(int32_t *cnt, int32_t *exp_off, int32_t E, int nblk) {
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
                               const int32_t *choice, int64_t S, int32_t E, int32_t top, int nblk) {
    extern __shared__ int32_t base[];
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) base[e] = cnt[(int64_t)e * nblk + blockIdx.x];
    __syncwarp();
    const int64_t s0 = (int64_t)blockIdx.x * CHUNK, s1 = s0 + CHUNK < S ? s0 + CHUNK : S;
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

} // namespace

extern "C" kiln_error *kiln_experts_dispatch_cuda(kiln_experts_cuda *x, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    int32_t *cnt = NULL;
    const int64_t S = x->N * x->top;
    if (x->N < 0 || x->E < 1 || x->top < 1 || x->top > x->E || S > INT32_MAX || x->E > 8192)
        return kiln_errorf(KILN_EINVAL, "experts dispatch: N=%lld E=%lld top_k=%lld (need E in 1..8192, top_k in "
                           "1..E, N*top_k < 2^31)", (long long)x->N, (long long)x->E, (long long)x->top);
    const int32_t E = (int32_t)x->E;
    const int nblk = (int)((S + CHUNK - 1) / CHUNK);
    const size_t sh = (size_t)(E + 2) * sizeof(int32_t);
    if (nblk == 0) { // no tokens: empty offsets
        CUDA_TRY(cudaMemsetAsync(x->exp_off, 0, sh, st));
        goto done;
    }
    CUDA_TRY(cudaMallocAsync((void **)&cnt, (size_t)(E + 2) * nblk * sizeof(int32_t), st));
    hist_kernel<<<nblk, 256, sh, st>>>(cnt, x->choice, S, E, nblk);
    CUDA_TRY(cudaGetLastError());
    scan_kernel<<<1, 256, sh, st>>>(cnt, x->exp_off, E, nblk);
    CUDA_TRY(cudaGetLastError());
    scatter_kernel<<<nblk, 32, sh, st>>>(x->slot_tok, x->slot_k, x->tok_slot, cnt, x->choice, S, E, (int32_t)x->top,
                                         nblk);
    CUDA_TRY(cudaGetLastError());
done:
    if (cnt) cudaFreeAsync(cnt, st);
    if (err) err = kiln_error_wrap(err, "experts dispatch (N=%lld E=%lld top_k=%lld)", (long long)x->N,
                                   (long long)x->E, (long long)x->top);
    return err;
}
