// Exact GELU (the router MLP) and SwiGLU (the experts) over bf16, computed in f32.
#include "ops_common.cuh"

#define KILN_SQRT1_2 0.70710678118654752440f
#define KILN_INV_SQRT_2PI 0.39894228040143267794f

static __global__ void gelu_fwd_kernel(bf16 *y, const bf16 *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(x[i]);
        y[i] = __float2bfloat16_rn(0.5f * v * (1.0f + erff(v * KILN_SQRT1_2)));
    }
}
static __global__ void gelu_bwd_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(x[i]);
        const float cdf = 0.5f * (1.0f + erff(v * KILN_SQRT1_2)), pdf = expf(-0.5f * v * v) * KILN_INV_SQRT_2PI;
        dx[i] = __float2bfloat16_rn(__bfloat162float(dy[i]) * (cdf + v * pdf));
    }
}

static __device__ __forceinline__ float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

// a row of [n, inter] per block iteration (gu rows are [gate | up]), channels across the threads
static __global__ void swiglu_fwd_kernel(bf16 *y, const bf16 *gu, int64_t n, int64_t inter) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const bf16 *g = gu + r * 2 * inter, *u = g + inter;
        for (int64_t j = threadIdx.x; j < inter; j += blockDim.x) {
            const float gv = __bfloat162float(g[j]), uv = __bfloat162float(u[j]);
            y[r * inter + j] = __float2bfloat16_rn(gv * sigmoidf_(gv) * uv);
        }
    }
}
static __global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dy, const bf16 *gu, int64_t n, int64_t inter) {
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
    gelu_fwd_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)y, (const bf16 *)x, n);
    LAUNCH_CHECK("gelu forward");
done:
    return err;
}
extern "C" kiln_error *kiln_gelu_backward_cuda(kiln_bf16 *dx, const kiln_bf16 *dy, const kiln_bf16 *x, int64_t n,
                                               void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    gelu_bwd_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)dx, (const bf16 *)dy, (const bf16 *)x,
                                                                        n);
    LAUNCH_CHECK("gelu backward");
done:
    return err;
}
extern "C" kiln_error *kiln_swiglu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *gu, int64_t n, int64_t inter,
                                                void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || inter <= 0) return NULL;
    swiglu_fwd_kernel<<<(int)(n < 65535 ? n : 65535), row_threads(inter), 0, (cudaStream_t)stream>>>(
        (bf16 *)y, (const bf16 *)gu, n, inter);
    LAUNCH_CHECK("swiglu forward");
done:
    return err;
}
extern "C" kiln_error *kiln_swiglu_backward_cuda(kiln_bf16 *dgu, const kiln_bf16 *dy, const kiln_bf16 *gu, int64_t n,
                                                 int64_t inter, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || inter <= 0) return NULL;
    swiglu_bwd_kernel<<<(int)(n < 65535 ? n : 65535), row_threads(inter), 0, (cudaStream_t)stream>>>(
        (bf16 *)dgu, (const bf16 *)dy, (const bf16 *)gu, n, inter);
    LAUNCH_CHECK("swiglu backward");
done:
    return err;
}
