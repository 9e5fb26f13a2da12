// The class token's attention in CLIP's last vision layer when only the image embeddings are wanted
// (src/clip/clip_cuda.c): one query (row 0 of each sequence) per (image, head) over the sequence's T keys,
// q/k/v read in place from the fused qkv projection. It is ~1/T of the full attention's work, so CUDA cores:
// one block per (image, head), the scores in shared memory (one warp per key, the lanes across the head dim:
// coalesced reads of each key row), the softmax in f32, then the output with the threads across the head dim (coalesced
// reads of each value row) and the keys split into threads/hd groups summed in a fixed order. Deterministic.
#include <math.h>

#include "clip_ops.h"
#include "ops_common.cuh"
#include "launch.cuh"

namespace {

enum { CLS_HD_MAX = 256 };

// the block's max / sum of one value per thread (blockDim.x a multiple of 32); every thread gets it
__device__ float block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp_max(lane < nw ? sh[lane] : -INFINITY);
}

// shared memory: q [hd], scores [T], partial outputs [blockDim], reductions [32]
__global__ void attention_cls_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int T, int heads,
                                     int hd, int64_t stride, int64_t out_stride, float scale) {
    pdl_wait();
    extern __shared__ float sm[];
    float *qs = sm, *s = qs + hd, *part = s + T, *red = part + blockDim.x;
    const int b = blockIdx.x / heads, h = blockIdx.x % heads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5,
              nw = blockDim.x >> 5;
    const int64_t base = (int64_t)b * T * stride + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = __bfloat162float(q[base + d]);
    __syncthreads();
    // scores: a warp per key
    for (int j = warp; j < T; j += nw) {
        const bf16 *kr = k + base + (int64_t)j * stride;
        float a = 0;
        for (int d = lane; d < hd; d += 32) a += qs[d] * __bfloat162float(kr[d]);
        a = warp_sum(a);
        if (lane == 0) s[j] = a * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < T; j += blockDim.x) mx = fmaxf(mx, s[j]);
    mx = block_max(mx, red);
    float sum = 0;
    for (int j = threadIdx.x; j < T; j += blockDim.x) sum += (s[j] = expf(s[j] - mx));
    sum = block_sum(sum, red); // its barriers also order the s[] writes before the reads below
    // output: thread t takes dim t % hd over the keys j ≡ t / hd (mod groups)
    const int groups = blockDim.x / hd, d = threadIdx.x % hd, g = threadIdx.x / hd;
    float o = 0;
    if (g < groups)
        for (int j = g; j < T; j += groups) o += s[j] * __bfloat162float(v[base + (int64_t)j * stride + d]);
    part[threadIdx.x] = o;
    __syncthreads();
    if (threadIdx.x < hd) {
        float t = 0;
        for (int i = 0; i < groups; i++) t += part[i * hd + threadIdx.x];
        out[(int64_t)b * out_stride + (int64_t)h * hd + threadIdx.x] = __float2bfloat16_rn(t / sum);
    }
}

} // namespace

extern "C" kiln_error *kiln_clip_attention_cls_cuda(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k,
                                                    const kiln_bf16 *v, int64_t B, int64_t T, int64_t heads,
                                                    int64_t hd, int64_t stride, int64_t out_stride, float scale,
                                                    void *stream) {
    kiln_error *err = NULL;
    const int threads = hd <= 128 ? 128 : 256;
    if (B <= 0 || heads <= 0) return NULL;
    if (T <= 0 || hd <= 0 || hd > CLS_HD_MAX)
        return kiln_errorf(KILN_EINVAL, "class-token attention (CUDA): %lld tokens, head dim %lld (1..%d)",
                           (long long)T, (long long)hd, CLS_HD_MAX);
    const size_t smem = sizeof(float) * (size_t)(hd + T + threads + 32);
    if (smem > 48 * 1024 || B * heads > 2147483647)
        return kiln_errorf(KILN_EUNSUPPORTED, "class-token attention (CUDA): %lld tokens x %lld sequences is beyond "
                           "this kernel", (long long)T, (long long)(B * heads));
    kiln_launch(attention_cls_kernel, (int)(B * heads), threads, smem, (cudaStream_t)stream, (bf16 *)out,
                (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (int)T, (int)heads, (int)hd, stride, out_stride,
                scale);
    LAUNCH_CHECK("class-token attention");
done:
    return err;
}
