// Shared pieces of the row-wise/pointwise CUDA ops (src/cuda/{embedding,rmsnorm,...}.cu): bf16 loads
// and stores computed in f32, block reductions, grid sizing, the launch check, stream-ordered scratch
// memory, and the deterministic column sum every weight-gradient reduction ends with.
#ifndef KILN_CUDA_OPS_COMMON_CUH
#define KILN_CUDA_OPS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"
#include "launch.cuh"

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
// 8 consecutive bf16 at p (16-byte aligned; global or shared memory) as f32: one 16-byte access
static __device__ __forceinline__ void ld8_bf16(const bf16 *p, float *o) {
    const uint4 q = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 t = __bfloat1622float2(h[k]);
        o[2 * k] = t.x, o[2 * k + 1] = t.y;
    }
}
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
// bit b of a device bit mask (the trainer's zero mask of experts without rows: AdamW, the gradient's sum of squares)
static __device__ __forceinline__ bool mask_bit(const uint32_t *m, int b) { return (__ldg(&m[b >> 5]) >> (b & 31)) & 1u; }

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
    pdl_wait();
    __shared__ double sh[32];
    for (int64_t j = blockIdx.x; j < d; j += gridDim.x) {
        double s = 0;
#pragma unroll 8
        for (int64_t i = threadIdx.x; i < m; i += blockDim.x) s += in[i * d + j];
        s = block_sum(s, sh);
        if (threadIdx.x == 0) out[j] += (float)s;
    }
}
// many columns, few rows: one thread per column summing its rows in order (coalesced across the threads)
static __global__ void colsum_add_wide_kernel(float *out, const float *in, int64_t m, int64_t d) {
    pdl_wait();
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
        kiln_launch(colsum_add_wide_kernel, (int)(blocks < 65535 ? blocks : 65535), 256, 0, st, out, in, m, d);
    } else {
        // tall and narrow (QK norm's temperature: 16384 rows, 2 columns): 1024 threads a column, each thread's 16
        // loads in flight together, not 64 one after another (16 us a call at 256 threads)
        const int threads = m >= 4096 ? 1024 : m >= 256 ? 256 : m > 32 ? 128 : 32;
        kiln_launch(colsum_add_kernel, (int)(d < 65535 ? d : 65535), threads, 0, st, out, in, m, d);
    }
    return cudaGetLastError();
}

// outs[i][j] += sum over r < m of part[(i*m + r)*d + j], for each non-null outs[i] (i < np <= 8): all the
// weight gradients of a fused backward in one launch (one block per 32 columns and output). Thread row ty
// sums rows ty, ty+8, ... in double, then the 8 sums are added in order: a fixed order, deterministic; each
// warp reads 128 consecutive bytes of a row (colsum_add_kernel reads one column per block, 4 bytes per row).
struct colsum_outs {
    float *p[8];
};
static __global__ void __launch_bounds__(256) colsum_multi_kernel(colsum_outs outs, const float *part, int64_t m, int64_t d) {
    pdl_wait();
    __shared__ double sh[8][33];
    float *out = outs.p[blockIdx.y];
    if (!out) return; // the same for the whole block
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t j = (int64_t)blockIdx.x * 32 + tx;
    const float *in = part + (int64_t)blockIdx.y * m * d;
    double s = 0;
    if (j < d) {
#pragma unroll 8
        for (int64_t r = ty; r < m; r += 8) s += in[r * d + j];
    }
    sh[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && j < d) {
        double t = 0;
        for (int k = 0; k < 8; k++) t += sh[k][tx];
        out[j] += (float)t;
    }
}
static inline cudaError_t colsum_add_multi(float *const *outs, int np, const float *part, int64_t m, int64_t d,
                                           cudaStream_t st) {
    colsum_outs o = {};
    int any = 0;
    for (int i = 0; i < np && i < 8; i++) o.p[i] = outs[i], any |= outs[i] != NULL;
    if (d <= 0 || m <= 0 || !any) return cudaSuccess;
    kiln_launch(colsum_multi_kernel, dim3((unsigned)((d + 31) / 32), (unsigned)(np < 8 ? np : 8)), 256, 0, st, o,
                part, m, d);
    return cudaGetLastError();
}

// BYTES (4, 8 or 16, aligned so) from global to shared memory by cp.async: the copy lands while the thread
// goes on. __pipeline_commit() closes a group of copies, __pipeline_wait_prior(k) waits until at most the k
// newest groups are outstanding; the thread that issued a copy may then read it (other threads only after a
// barrier). The row kernels use it as a ring of row stages per block: each thread copies and later reads only
// its own columns, so the ring needs no barrier, and the next rows' loads are in flight while a row is reduced.
template <int BYTES> static __device__ __forceinline__ void cp_async(void *smem, const void *gmem) {
    __pipeline_memcpy_async(smem, gmem, BYTES);
}
// the same, or BYTES zeros into smem (nothing read from gmem) when zero
template <int BYTES> static __device__ __forceinline__ void cp_async_zf(void *smem, const void *gmem, bool zero) {
    __pipeline_memcpy_async(smem, gmem, BYTES, zero ? BYTES : 0);
}

// Blocks of `threads` that fit on the device at once with `smem` dynamic shared memory each, at most `work`
// (a persistent grid; 1 when the queries fail).
template <typename K> static int resident_grid(K kernel, int threads, size_t smem, int64_t work) {
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, threads, smem) != cudaSuccess)
        sms = 1, per = 1, (void)cudaGetLastError(); // not left for the next launch check
    const int64_t g = (int64_t)(per < 1 ? 1 : per) * (sms < 1 ? 1 : sms);
    return (int)(g < work ? g : work < 1 ? 1 : work);
}

// Optional timing of an op's N passes (the experts' memory passes, the CCA convolutions' passes): a pair of
// CUDA events around each pass, recorded only while enabled (no events otherwise), read back as the last
// call's microseconds (-1 for a pass that did not run), so a benchmark can set each pass beside its bytes.
template <int N> struct pass_profile {
    int on;
    cudaEvent_t ev[N][2];
    int recorded[N];
};
template <int N> static cudaError_t pass_profile_mark(pass_profile<N> &pp, int p, int end, cudaStream_t st) {
    if (!pp.on) return cudaSuccess;
    if (end) pp.recorded[p] = 1;
    return cudaEventRecord(pp.ev[p][end], st);
}
template <int N> static kiln_error *pass_profile_enable(pass_profile<N> &pp, int on, const char *what) {
    kiln_error *err = NULL;
    if (on)
        for (int p = 0; p < N; p++)
            for (int i = 0; i < 2; i++)
                if (!pp.ev[p][i]) CUDA_TRY(cudaEventCreate(&pp.ev[p][i]));
    pp.on = on;
    for (int p = 0; p < N; p++) pp.recorded[p] = 0;
done:
    return err ? kiln_error_wrap(err, "%s", what) : NULL;
}
template <int N> static kiln_error *pass_profile_read(pass_profile<N> &pp, double *us, const char *what) {
    kiln_error *err = NULL;
    for (int p = 0; p < N; p++) {
        float ms = 0;
        us[p] = -1;
        if (!pp.recorded[p]) continue;
        CUDA_TRY(cudaEventSynchronize(pp.ev[p][1]));
        CUDA_TRY(cudaEventElapsedTime(&ms, pp.ev[p][0], pp.ev[p][1]));
        us[p] = ms * 1e3;
    }
done:
    return err ? kiln_error_wrap(err, "%s", what) : NULL;
}

// Scratch from the stream-ordered allocator (src/cuda/scratch.cu); free with cudaFreeAsync on the same stream.
cudaError_t kiln_ops_scratch(void **p, size_t bytes, cudaStream_t st);

// Rows of work per chunk for a deterministic reduction over n rows: about `target` chunks, at least one row.
static inline int64_t chunk_rows(int64_t n, int64_t target) {
    int64_t r = (n + target - 1) / target;
    return r < 1 ? 1 : r;
}

#endif
