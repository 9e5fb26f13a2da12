// Row softmax on the device (the router's probabilities, rows of E+1 classes): one warp per row, f32.
#include "ops_common.cuh"
#include "launch.cuh"

static __global__ void softmax_fwd_kernel(float *y, const float *x, int64_t n, int64_t d) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < n; r += warps) {
        const float *xr = x + r * d;
        float m = -INFINITY;
        for (int64_t j = lane; j < d; j += 32) m = fmaxf(m, xr[j]);
        m = warp_max(m);
        float s = 0;
        for (int64_t j = lane; j < d; j += 32) s += expf(xr[j] - m);
        s = warp_sum(s);
        const float inv = 1.0f / s;
        for (int64_t j = lane; j < d; j += 32) y[r * d + j] = expf(xr[j] - m) * inv;
    }
}
static __global__ void softmax_bwd_kernel(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < n; r += warps) {
        float dot = 0;
        for (int64_t j = lane; j < d; j += 32) dot += dy[r * d + j] * y[r * d + j];
        dot = warp_sum(dot);
        for (int64_t j = lane; j < d; j += 32) dx[r * d + j] += y[r * d + j] * (dy[r * d + j] - dot);
    }
}

extern "C" kiln_error *kiln_softmax_forward_cuda(float *y, const float *x, int64_t n, int64_t d, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    kiln_launch(softmax_fwd_kernel, grid_for(n, 8), 256, 0, (cudaStream_t)stream, y, x, n, d);
    LAUNCH_CHECK("softmax forward");
done:
    return err;
}
extern "C" kiln_error *kiln_softmax_backward_cuda(float *dx, const float *dy, const float *y, int64_t n, int64_t d,
                                                  void *stream) {
    kiln_error *err = NULL;
    if (n <= 0 || d <= 0) return NULL;
    kiln_launch(softmax_bwd_kernel, grid_for(n, 8), 256, 0, (cudaStream_t)stream, dx, dy, y, n, d);
    LAUNCH_CHECK("softmax backward");
done:
    return err;
}
