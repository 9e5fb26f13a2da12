// Shared pieces of the row-wise/pointwise CUDA ops (src/cuda/{embedding,rmsnorm,...}.cu): bf16 loads
// and stores computed in f32, block reductions, grid sizing, the launch check, stream-ordered scratch
// memory, and the deterministic column sum every weight-gradient reduction ends with.
#ifndef KILN_CUDA_OPS_COMMON_CUH
#define KILN_CUDA_OPS_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float ld(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(bf16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// V consecutive elements (V = 1 or 4) at p[i] as f32: one 16-byte (f32) or 8-byte (bf16) access when V = 4;
// the caller guarantees the alignment
template <int V> static __device__ __forceinline__ void ldv(const float *p, int64_t i, float *o) {
    if constexpr (V == 4) {
        const float4 q = *(const float4 *)(p + i);
        o[0] = q.x, o[1] = q.y, o[2] = q.z, o[3] = q.w;
    } else {
        o[0] = p[i];
    }
}
template <int V> static __device__ __forceinline__ void ldv(const bf16 *p, int64_t i, float *o) {
    if constexpr (V == 4) {
        const uint2 q = *(const uint2 *)(p + i);
        const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&q.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&q.y);
        o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
    } else {
        o[0] = __bfloat162float(p[i]);
    }
}
template <int V> static __device__ __forceinline__ void stv(float *p, int64_t i, const float *o) {
    if constexpr (V == 4) *(float4 *)(p + i) = make_float4(o[0], o[1], o[2], o[3]);
    else p[i] = o[0];
}
template <int V> static __device__ __forceinline__ void stv(bf16 *p, int64_t i, const float *o) {
    if constexpr (V == 4) {
        uint2 q;
        *(__nv_bfloat162 *)&q.x = __floats2bfloat162_rn(o[0], o[1]);
        *(__nv_bfloat162 *)&q.y = __floats2bfloat162_rn(o[2], o[3]);
        *(uint2 *)(p + i) = q;
    } else {
        p[i] = __float2bfloat16_rn(o[0]);
    }
}
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The reduction tree is fixed, so the result does not depend on scheduling. `sh` holds 32 values.
template <typename T> static __device__ T block_sum(T v, T *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // sh may still be read by a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (T)0;
    return warp_sum(v);
}

static inline int grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 1048576 ? 1048576 : b);
}

// After a launch: the launch error, named by op.
#define LAUNCH_CHECK(op)                                                                                  \
    do {                                                                                                  \
        cudaError_t st_ = cudaGetLastError();                                                             \
        if (st_ != cudaSuccess) {                                                                         \
            err = kiln_errorf(KILN_EIO, "%s: kernel launch failed: %s", (op), cudaGetErrorString(st_));   \
            goto done;                                                                                    \
        }                                                                                                 \
    } while (0)

// out[j] += sum over i < m of in[i*d + j], the rows summed by a fixed tree in one block per column: the
// second stage of every deterministic weight-gradient reduction (per-chunk partials, then this).
static __global__ void colsum_add_kernel(float *out, const float *in, int64_t m, int64_t d) {
    __shared__ double sh[32];
    for (int64_t j = blockIdx.x; j < d; j += gridDim.x) {
        double s = 0;
        for (int64_t i = threadIdx.x; i < m; i += blockDim.x) s += in[i * d + j];
        s = block_sum(s, sh);
        if (threadIdx.x == 0) out[j] += (float)s;
    }
}
// many columns, few rows: one thread per column summing its rows in order (coalesced across the threads)
static __global__ void colsum_add_wide_kernel(float *out, const float *in, int64_t m, int64_t d) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < d; j += (int64_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int64_t i = 0; i < m; i++) s += in[i * d + j];
        out[j] += (float)s;
    }
}
static inline cudaError_t colsum_add(float *out, const float *in, int64_t m, int64_t d, cudaStream_t st) {
    if (d <= 0) return cudaSuccess;
    if (d >= 8192 && m <= 128) {
        const int64_t blocks = (d + 255) / 256;
        colsum_add_wide_kernel<<<(int)(blocks < 65535 ? blocks : 65535), 256, 0, st>>>(out, in, m, d);
    } else {
        const int threads = m >= 256 ? 256 : m > 32 ? 128 : 32;
        colsum_add_kernel<<<(int)(d < 65535 ? d : 65535), threads, 0, st>>>(out, in, m, d);
    }
    return cudaGetLastError();
}

// Scratch from the stream-ordered allocator (src/cuda/scratch.cu); free with cudaFreeAsync on the same stream.
cudaError_t kiln_ops_scratch(void **p, size_t bytes, cudaStream_t st);

// Rows of work per chunk for a deterministic reduction over n rows: about `target` chunks, at least one row.
static inline int64_t chunk_rows(int64_t n, int64_t target) {
    int64_t r = (n + target - 1) / target;
    return r < 1 ? 1 : r;
}

#endif
