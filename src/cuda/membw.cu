// STREAM kernels on the GPU and host<->device copies, timed with CUDA events. Bytes counted as
// read + written: copy and scale move 2 arrays, add and triad 3.
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda.h"

// copy: four independent 16-byte loads in flight per thread before the stores (memory-level
// parallelism), then a grid-stride tail
__global__ void k_copy(const float4 *__restrict__ a, float4 *__restrict__ c, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t i = t;
    for (; i + 3 * stride < n; i += 4 * stride) {
        float4 x0 = a[i], x1 = a[i + stride], x2 = a[i + 2 * stride], x3 = a[i + 3 * stride];
        c[i] = x0;
        c[i + stride] = x1;
        c[i + 2 * stride] = x2;
        c[i + 3 * stride] = x3;
    }
    for (; i < n; i += stride) c[i] = a[i];
}
__global__ void k_scale(const float4 *a, float4 *c, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = a[i];
        c[i] = make_float4(s * v.x, s * v.y, s * v.z, s * v.w);
    }
}
__global__ void k_add(const float4 *a, const float4 *b, float4 *c, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}
__global__ void k_triad(const float4 *a, const float4 *b, float4 *c, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
    }
}

extern "C" kiln_error *kiln_cuda_membw(const char *kernel, size_t bytes, int iters, double *best_gbs, double *avg_gbs) {
    kiln_error *err = NULL;
    float4 *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const size_t n = bytes / sizeof(float4);
    // "copy" is a device-to-device cudaMemcpyAsync (what the trainer and torch's tensor copy use);
    // "copy_sm" is the same copy as a kernel on the SMs
    int which = !strcmp(kernel, "copy") ? 0 : !strcmp(kernel, "scale") ? 1 : !strcmp(kernel, "add") ? 2
              : !strcmp(kernel, "triad") ? 3 : !strcmp(kernel, "copy_sm") ? 4 : -1;
    double moved = (double)n * sizeof(float4) * (which == 2 || which == 3 ? 3 : 2), best = 0, sum = 0;
    int sms = 0, blocks;
    if (which < 0) return kiln_errorf(KILN_EINVAL, "GPU membw: unknown kernel '%s'", kernel);
    if (n == 0) return kiln_errorf(KILN_EINVAL, "GPU membw: arrays of %zu bytes are too small", bytes);
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    blocks = sms * 8;
    CUDA_TRY(cudaMalloc(&a, n * sizeof *a));
    CUDA_TRY(cudaMalloc(&b, n * sizeof *b));
    CUDA_TRY(cudaMalloc(&c, n * sizeof *c));
    CUDA_TRY(cudaMemset(a, 0, n * sizeof *a));
    CUDA_TRY(cudaMemset(b, 0, n * sizeof *b));
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    for (int it = -5; it < iters; it++) { // five warm-ups: small arrays need them to reach steady clocks
        CUDA_TRY(cudaEventRecord(e0, 0));
        if (which == 0) CUDA_TRY(cudaMemcpyAsync(c, a, n * sizeof *a, cudaMemcpyDeviceToDevice, 0));
        else if (which == 4) k_copy<<<blocks, 256>>>(a, c, n);
        else if (which == 1) k_scale<<<blocks, 256>>>(a, c, 3.0f, n);
        else if (which == 2) k_add<<<blocks, 256>>>(a, b, c, n);
        else k_triad<<<blocks, 256>>>(a, b, c, 3.0f, n);
        CUDA_TRY(cudaGetLastError());
        CUDA_TRY(cudaEventRecord(e1, 0));
        CUDA_TRY(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (it < 0) continue;
        double gbs = moved / (ms * 1e-3) / 1e9;
        best = gbs > best ? gbs : best;
        sum += gbs;
    }
    *best_gbs = best;
    *avg_gbs = sum / iters;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return err;
}

extern "C" kiln_error *kiln_cuda_hostbw(int dir, size_t bytes, int iters, double *best_gbs, double *avg_gbs) {
    kiln_error *err = NULL;
    void *h = NULL, *d = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0, sum = 0;
    CUDA_TRY(cudaMallocHost(&h, bytes));
    CUDA_TRY(cudaMalloc(&d, bytes));
    memset(h, 1, bytes);
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    for (int it = -1; it < iters; it++) {
        CUDA_TRY(cudaEventRecord(e0, 0));
        if (dir == 0) CUDA_TRY(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, 0));
        else CUDA_TRY(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, 0));
        CUDA_TRY(cudaEventRecord(e1, 0));
        CUDA_TRY(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (it < 0) continue;
        double gbs = (double)bytes / (ms * 1e-3) / 1e9;
        best = gbs > best ? gbs : best;
        sum += gbs;
    }
    *best_gbs = best;
    *avg_gbs = sum / iters;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFreeHost(h);
    cudaFree(d);
    return err;
}
