// Exact GELU (the router MLP) and SwiGLU (the experts) over bf16, computed in f32.
#include "ops_common.cuh"
#include "launch.cuh"

#define KILN_SQRT1_2 0.70710678118654752440f
#define KILN_INV_SQRT_2PI 0.39894228040143267794f

static __device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * KILN_SQRT1_2)); }
static __device__ __forceinline__ float gelu_grad(float v, float d) {
    const float cdf = 0.5f * (1.0f + erff(v * KILN_SQRT1_2)), pdf = expf(-0.5f * v * v) * KILN_INV_SQRT_2PI;
    return d * (cdf + v * pdf);
}

// One element a thread, for buffers that are not 16-byte aligned
static __global__ void gelu_fwd_kernel(bf16 *y, const bf16 *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(gelu_f(__bfloat162float(x[i])));
}
static __global__ void gelu_bwd_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = __float2bfloat16_rn(gelu_grad(__bfloat162float(x[i]), __bfloat162float(dy[i])));
}

// Eight elements a thread through 16-byte accesses, grid-stride over a few waves, the last n % 8 one a thread.
// The router's [16384, 256] took 14 us forward and 29 us backward one element a thread (16,384 blocks of little
// work each, two-byte accesses; bench/kernel_trace.sh in docs/perf.md), for 8 and 24 MB of traffic.
static __global__ void __launch_bounds__(256) gelu_fwd8_kernel(bf16 *y, const bf16 *x, int64_t n) {
    pdl_wait();
    const int64_t n8 = n >> 3, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = t; i < n8; i += stride) {
        uint4 a = ((const uint4 *)x)[i], o;
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&a;
        __nv_bfloat162 *r = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 v = __bfloat1622float2(h[k]);
            r[k] = __floats2bfloat162_rn(gelu_f(v.x), gelu_f(v.y));
        }
        ((uint4 *)y)[i] = o;
    }
    if (t < (n & 7)) y[(n8 << 3) + t] = __float2bfloat16_rn(gelu_f(__bfloat162float(x[(n8 << 3) + t])));
}
static __global__ void __launch_bounds__(256) gelu_bwd8_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, int64_t n) {
    pdl_wait();
    const int64_t n8 = n >> 3, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = t; i < n8; i += stride) {
        uint4 a = ((const uint4 *)x)[i], b = ((const uint4 *)dy)[i], o;
        const __nv_bfloat162 *hx = (const __nv_bfloat162 *)&a, *hd = (const __nv_bfloat162 *)&b;
        __nv_bfloat162 *r = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 v = __bfloat1622float2(hx[k]), d = __bfloat1622float2(hd[k]);
            r[k] = __floats2bfloat162_rn(gelu_grad(v.x, d.x), gelu_grad(v.y, d.y));
        }
        ((uint4 *)dx)[i] = o;
    }
    if (t < (n & 7)) {
        const int64_t i = (n8 << 3) + t;
        dx[i] = __float2bfloat16_rn(gelu_grad(__bfloat162float(x[i]), __bfloat162float(dy[i])));
    }
}

// the 8-wide kernels' grid: 8 blocks of 256 an SM's worth of work at most (enough to fill the SMs, few waves)
static int grid8(int64_t n) {
    const int64_t b = ((n >> 3) + 255) / 256;
    return (int)(b < 1 ? 1 : b > 132 * 8 ? 132 * 8 : b);
}

static __device__ __forceinline__ float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

// a row of [n, inter] per block iteration (gu rows are [gate | up]), channels across the threads
static __global__ void swiglu_fwd_kernel(bf16 *y, const bf16 *gu, int64_t n, int64_t inter) {
    pdl_wait();
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const bf16 *g = gu + r * 2 * inter, *u = g + inter;
        for (int64_t j = threadIdx.x; j < inter; j += blockDim.x) {
            const float gv = __bfloat162float(g[j]), uv = __bfloat162float(u[j]);
            y[r * inter + j] = __float2bfloat16_rn(gv * sigmoidf_(gv) * uv);
        }
    }
}
static __global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dy, const bf16 *gu, int64_t n, int64_t inter) {
    pdl_wait();
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const bf16 *g = gu + r * 2 * inter, *u = g + inter;
        bf16 *dg = dgu + r * 2 * inter, *du = dg + inter;
        for (int64_t j = threadIdx.x; j < inter; j += blockDim.x) {
            const float gv = __bfloat162float(g[j]), uv = __bfloat162float(u[j]);
            const float sg = sigmoidf_(gv), d = __bfloat162float(dy[r * inter + j]);
            du[j] = __float2bfloat16_rn(d * gv * sg);
            dg[j] = __float2bfloat16_rn(d * uv * sg * (1.0f + gv * (1.0f - sg)));
        }
    }
}

static int row_threads(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : 64; }

extern "C" kiln_error *kiln_gelu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    if (aligned16(y) && aligned16(x)) kiln_launch(gelu_fwd8_kernel, grid8(n), 256, 0, (cudaStream_t)stream, (bf16 *)y,
                                                  (const bf16 *)x, n);
    else kiln_launch(gelu_fwd_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, (bf16 *)y, (const bf16 *)x, n);
    LAUNCH_CHECK("gelu forward");
done:
    return err;
}
extern "C" kiln_error *kiln_gelu_backward_cuda(kiln_bf16 *dx, const kiln_bf16 *dy, const kiln_bf16 *x, int64_t n,
                                               void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    if (aligned16(dx) && aligned16(dy) && aligned16(x))
        kiln_launch(gelu_bwd8_kernel, grid8(n), 256, 0, (cudaStream_t)stream, (bf16 *)dx, (const bf16 *)dy,
                    (const bf16 *)x, n);
    else
        kiln_launch(gelu_bwd_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, (bf16 *)dx, (const bf16 *)dy,
                    (const bf16 *)x, n);
    LAUNCH_CHECK("gelu backward");
done:
    return err;
}
extern "C" kiln_error *kiln_swiglu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *gu, int64_t n, int64_t inter,
                                                void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || inter <= 0) return NULL;
    kiln_launch(swiglu_fwd_kernel, (int)(n < 65535 ? n : 65535), row_threads(inter), 0, (cudaStream_t)stream,
                (bf16 *)y, (const bf16 *)gu, n, inter);
    LAUNCH_CHECK("swiglu forward");
done:
    return err;
}
extern "C" kiln_error *kiln_swiglu_backward_cuda(kiln_bf16 *dgu, const kiln_bf16 *dy, const kiln_bf16 *gu, int64_t n,
                                                 int64_t inter, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || inter <= 0) return NULL;
    kiln_launch(swiglu_bwd_kernel, (int)(n < 65535 ? n : 65535), row_threads(inter), 0, (cudaStream_t)stream,
                (bf16 *)dgu, (const bf16 *)dy, (const bf16 *)gu, n, inter);
    LAUNCH_CHECK("swiglu backward");
done:
    return err;
}
