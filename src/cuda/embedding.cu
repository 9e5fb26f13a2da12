// Token embedding on the device. The backward is a segmented sum: positions sorted by id with a stable
// radix sort, then one block per distinct id adds that id's dy rows in position order, which is the
// CPU's order, so the gradient is deterministic and equal to the CPU's bit for bit (no atomics).
#include <cub/device/device_radix_sort.cuh>

#include "ops_common.cuh"

static __global__ void embedding_fwd_kernel(float *y, const float *table, const int64_t *ids, int64_t n, int64_t d,
                                            int vec) {
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
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        keys[i] = (uint32_t)ids[i];
        pos[i] = (int32_t)i;
    }
}

// block k does the segment that starts at sorted index k (others return at once)
static __global__ void embedding_bwd_kernel(float *dtable, const float *dy, const uint32_t *keys, const int32_t *pos,
                                            int64_t n, int64_t d, int64_t pad) {
    for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
        const uint32_t id = keys[k];
        if (k > 0 && keys[k - 1] == id) continue;
        if (pad >= 0 && (int64_t)id == pad) continue;
        int64_t e = k + 1;
        while (e < n && keys[e] == id) e++;
        float *row = dtable + (int64_t)id * d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float acc = row[j];
            for (int64_t i = k; i < e; i++) acc += dy[(int64_t)pos[i] * d + j];
            row[j] = acc;
        }
    }
}

extern "C" kiln_error *kiln_embedding_forward_cuda(float *y, const float *table, const int64_t *ids, int64_t n,
                                                   int64_t d, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    const int vec = (d & 3) == 0 && ((uintptr_t)y & 15) == 0 && ((uintptr_t)table & 15) == 0; // 16-byte rows
    embedding_fwd_kernel<<<(int)(n < 65535 ? n : 65535), 256, 0, (cudaStream_t)stream>>>(y, table, ids, n, d, vec);
    LAUNCH_CHECK("embedding forward");
done:
    return err;
}

extern "C" kiln_error *kiln_embedding_backward_cuda(float *dtable, const float *dy, const int64_t *ids, int64_t n,
                                                    int64_t d, int64_t pad, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    uint32_t *keys = NULL, *skeys = NULL;
    int32_t *pos = NULL, *spos = NULL;
    void *tmp = NULL;
    size_t tmp_bytes = 0;
    if (n <= 0 || d <= 0) return NULL;
    if (n > INT32_MAX) return kiln_errorf(KILN_EINVAL, "embedding backward: %lld tokens exceed 2^31", (long long)n);
    CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, tmp_bytes, keys, skeys, pos, spos, (int)n, 0, 32, st));
    CUDA_TRY(kiln_ops_scratch((void **)&keys, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&skeys, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&pos, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch((void **)&spos, (size_t)n * 4, st));
    CUDA_TRY(kiln_ops_scratch(&tmp, tmp_bytes ? tmp_bytes : 1, st));
    embedding_keys_kernel<<<grid_for(n, 256), 256, 0, st>>>(keys, pos, ids, n);
    LAUNCH_CHECK("embedding backward (keys)");
    CUDA_TRY(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, skeys, pos, spos, (int)n, 0, 32, st));
    embedding_bwd_kernel<<<(int)(n < 65535 ? n : 65535), d >= 256 ? 256 : 128, 0, st>>>(dtable, dy, skeys, spos, n, d,
                                                                                          pad);
    LAUNCH_CHECK("embedding backward");
done:
    if (keys) cudaFreeAsync(keys, st);
    if (skeys) cudaFreeAsync(skeys, st);
    if (pos) cudaFreeAsync(pos, st);
    if (spos) cudaFreeAsync(spos, st);
    if (tmp) cudaFreeAsync(tmp, st);
    return err;
}
