// Token embedding on the device. The backward is a segmented sum: positions sorted by id with a stable
// radix sort, then each distinct id's dy rows are added in position order, which is the CPU's order, so the
// gradient is deterministic and equal to the CPU's bit for bit (no float atomics).
// The sum's work is two lists of segments (first sorted index, end; found by binary search, listed by integer
// counters: their order does not change any sum). The long ones (>= SEG_LONG positions) are cut into column
// slices handed to the blocks by a counter: one thread per column, its chain of adds serial in position order
// as the CPU's, with SEG_U rows' loads in flight per thread; then the short ones, one block each. A frequent token is
// one long chain (the [cuda] benchmark's corpus: ~178 distinct ids a step, the most frequent at ~1200 of the 16384
// positions), and its time is rows in
// flight x row bytes per memory latency: one float per thread with 64 loads in flight moves it ~16x faster
// than the float4 of a thread with 16 (the columns of a row are spread over more threads, each as deep).
#include <cub/device/device_radix_sort.cuh>

#include "ops_common.cuh"
#include "launch.cuh"

static __global__ void embedding_fwd_kernel(float *y, const float *table, const int64_t *ids, int64_t n, int64_t d,
                                            int vec) {
    pdl_wait();
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *src = table + ids[r] * d;
        float *dst = y + r * d;
        if (vec) {
            const float4 *s4 = (const float4 *)src;
            float4 *d4 = (float4 *)dst;
            for (int64_t j = threadIdx.x; j < d / 4; j += blockDim.x) d4[j] = s4[j];
        } else {
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
        }
    }
}

// keys for the sort: ids as 32-bit unsigned (vocabularies are far below 2^32), values: positions
static __global__ void embedding_keys_kernel(uint32_t *keys, int32_t *pos, const int64_t *ids, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        keys[i] = (uint32_t)ids[i];
        pos[i] = (int32_t)i;
    }
}

enum { SEG_THREADS = 256, SEG_U = 64, SEG_POS = 512, SEG_LONG = 64 };

// Segments of equal keys in the sorted keys, the padding id's left out, in two lists (first sorted index,
// end): those of at least SEG_LONG positions (cnt[0] of them, in segl) and the others (cnt[1], in segs), each
// in no particular order (integer atomics; the order changes no sum). The long ones are worked on first.
static __global__ void embedding_segments_kernel(int32_t *segl, int32_t *segs, int *cnt, const uint32_t *keys,
                                                 int64_t n, int64_t pad) {
    pdl_wait();
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t id = keys[k];
        if ((k > 0 && keys[k - 1] == id) || (pad >= 0 && (int64_t)id == pad)) continue;
        int64_t lo = k + 1, hi = n; // the first index past k whose key differs: keys are sorted
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (keys[mid] == id) lo = mid + 1;
            else hi = mid;
        }
        const int isl = lo - k >= SEG_LONG;
        int32_t *list = isl ? segl : segs;
        const int c = atomicAdd(&cnt[isl ? 0 : 1], 1);
        list[2 * c] = (int32_t)k, list[2 * c + 1] = (int32_t)lo;
    }
}

// The long segments: work item w of cnt[0] x nslice = segment w / nslice, columns (w % nslice)*SEG_THREADS +
// threadIdx.x. Each block takes its next item from a counter (next): a block that drew a frequent token does
// not hold up a fixed share of the rest. The segment's positions are staged in shared memory SEG_POS at a time.
static __global__ void __launch_bounds__(SEG_THREADS)
    embedding_seg_sum_kernel(float *dtable, const float *dy, const uint32_t *keys, const int32_t *pos,
                             const int32_t *segl, const int *cnt, unsigned long long *next, int64_t d, int nslice) {
    pdl_wait();
    __shared__ int32_t ps[SEG_POS];
    __shared__ unsigned long long wsh;
    const int64_t items = (int64_t)cnt[0] * nslice;
    for (;;) {
        __syncthreads(); // every thread has read wsh (and ps) of the previous item
        if (threadIdx.x == 0) wsh = atomicAdd(next, 1ull);
        __syncthreads();
        const int64_t w = (int64_t)wsh;
        if (w >= items) break;
        const int64_t c = w / nslice, j = (w % nslice) * SEG_THREADS + threadIdx.x;
        const int32_t s0 = segl[2 * c], s1 = segl[2 * c + 1];
        const int on = j < d;
        float *row = dtable + (int64_t)keys[s0] * d;
        float acc = on ? row[j] : 0.0f;
        for (int32_t base = s0; base < s1; base += SEG_POS) {
            const int m = s1 - base < SEG_POS ? s1 - base : SEG_POS;
            if (base > s0) __syncthreads(); // the previous piece's positions are read
            for (int i = threadIdx.x; i < m; i += SEG_THREADS) ps[i] = pos[base + i];
            __syncthreads();
            if (!on) continue;
            for (int i = 0; i < m; i += SEG_U) {
                float v[SEG_U];
#pragma unroll
                for (int u = 0; u < SEG_U; u++)
                    if (i + u < m) v[u] = dy[(int64_t)ps[i + u] * d + j];
#pragma unroll
                for (int u = 0; u < SEG_U; u++)
                    if (i + u < m) acc += v[u]; // in position order: the CPU's chain of roundings
            }
        }
        if (on) row[j] = acc;
    }
}

// The short segments (fewer than SEG_LONG positions; with many distinct ids, nearly all of them): one block per
// segment (blocks past cnt[1] return at once), each thread its columns j = threadIdx.x, + blockDim.x, ..., the
// rows added in position order, 8 loads in flight. A counter per item (the long kernel's) costs an atomic per
// 1 KB slice: 756 us for 16384 uniform ids in run r23, against 204 us for one block per id.
static __global__ void __launch_bounds__(SEG_THREADS)
    embedding_short_kernel(float *dtable, const float *dy, const uint32_t *keys, const int32_t *pos,
                           const int32_t *segs, const int *cnt, int64_t d) {
    pdl_wait();
    __shared__ int32_t ps[SEG_LONG];
    const int c = blockIdx.x;
    if (c >= cnt[1]) return; // the same for the whole block
    const int32_t s0 = segs[2 * c], m = segs[2 * c + 1] - s0; // m < SEG_LONG
    for (int i = threadIdx.x; i < m; i += blockDim.x) ps[i] = pos[s0 + i];
    __syncthreads();
    float *row = dtable + (int64_t)keys[s0] * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = row[j];
        for (int i = 0; i < m; i += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i + u < m) v[u] = dy[(int64_t)ps[i + u] * d + j];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i + u < m) acc += v[u]; // in position order
        }
        row[j] = acc;
    }
}

extern "C" kiln_error *kiln_embedding_forward_cuda(float *y, const float *table, const int64_t *ids, int64_t n,
                                                   int64_t d, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int vec = (d & 3) == 0 && ((uintptr_t)y & 15) == 0 && ((uintptr_t)table & 15) == 0; // 16-byte rows
    kiln_launch(embedding_fwd_kernel, (int)(n < 65535 ? n : 65535), 256, 0, (cudaStream_t)stream, y, table, ids, n, d,
                vec);
    LAUNCH_CHECK("embedding forward");
done:
    return err;
}

extern "C" kiln_error *kiln_embedding_backward_cuda(float *dtable, const float *dy, const int64_t *ids, int64_t n,
                                                    int64_t d, int64_t pad, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    uint32_t *keys = NULL, *skeys = NULL;
    int32_t *pos = NULL, *spos = NULL, *seg = NULL, *segl, *segs;
    int *cnt;
    unsigned long long *next;
    void *tmp = NULL;
    size_t tmp_bytes = 0;
    const int64_t nslice = (d + SEG_THREADS - 1) / SEG_THREADS; // d < 2^39: fits an int
    if (n <= 0 || d <= 0) return NULL;
    if (n > INT32_MAX) return kiln_errorf(KILN_EINVAL, "embedding backward: %lld tokens exceed 2^31", (long long)n);
    CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, tmp_bytes, keys, skeys, pos, spos, (int)n, 0, 32, st));
    CUDA_TRY(kiln_ops_scratch((void **)&keys, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&skeys, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&pos, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&spos, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch(&tmp, tmp_bytes ? tmp_bytes : 1, st));
    kiln_launch(embedding_keys_kernel, grid_for(n, 256), 256, 0, st, keys, pos, ids, n);
    LAUNCH_CHECK("embedding backward (keys)");
    CUDA_TRY(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, skeys, pos, spos, (int)n, 0, 32, st));
    // scratch: the two counts, the work counter (8-byte aligned), then the two lists of n segments each
    CUDA_TRY(kiln_ops_scratch((void **)&seg, (size_t)(8 + 4 * n) * sizeof(int32_t), st));
    cnt = seg;
    next = (unsigned long long *)(seg + 4);
    segl = seg + 8, segs = segl + 2 * n;
    CUDA_TRY(cudaMemsetAsync(seg, 0, 8 * sizeof(int32_t), st));
    kiln_launch(embedding_segments_kernel, grid_for(n, 256), 256, 0, st, segl, segs, cnt, skeys, n, pad);
    LAUNCH_CHECK("embedding backward (segments)");
    // the long segments first (the longest chains), then the short ones, one block each (up to n blocks)
    kiln_launch(embedding_seg_sum_kernel, resident_grid(embedding_seg_sum_kernel, SEG_THREADS, 0, n * nslice),
                SEG_THREADS, 0, st, dtable, dy, skeys, spos, segl, cnt, next, d, (int)nslice);
    LAUNCH_CHECK("embedding backward (long segments)");
    kiln_launch(embedding_short_kernel, (int)(n < INT32_MAX ? n : INT32_MAX), SEG_THREADS, 0, st, dtable, dy, skeys,
                spos, segs, cnt, d);
    LAUNCH_CHECK("embedding backward");
done:
    if (seg) cudaFreeAsync(seg, st);
    if (keys) cudaFreeAsync(keys, st);
    if (skeys) cudaFreeAsync(skeys, st);
    if (pos) cudaFreeAsync(pos, st);
    if (spos) cudaFreeAsync(spos, st);
    if (tmp) cudaFreeAsync(tmp, st);
    return err;
}
