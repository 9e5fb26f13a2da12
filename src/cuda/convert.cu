// bf16 <-> f32 conversions and the device-wide sync of include/kiln/cuda_ops.h.
#include <cuda_bf16.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"
#include "launch.cuh"

static __global__ void f32_to_bf16_kernel(__nv_bfloat16 *y, const float *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}
static __global__ void bf16_to_f32_kernel(float *y, const __nv_bfloat16 *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

static int blocks_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" kiln_error *kiln_cuda_sync(void) {
    kiln_error *err = NULL;
    CUDA_TRY(cudaDeviceSynchronize());
done:
    return err;
}

extern "C" kiln_error *kiln_f32_to_bf16_cuda(kiln_bf16 *y, const float *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    kiln_launch(f32_to_bf16_kernel, blocks_for(n), 256, 0, (cudaStream_t)stream, (__nv_bfloat16 *)y, x, n);
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}

extern "C" kiln_error *kiln_bf16_to_f32_cuda(float *y, const kiln_bf16 *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    kiln_launch(bf16_to_f32_kernel, blocks_for(n), 256, 0, (cudaStream_t)stream, y, (const __nv_bfloat16 *)x, n);
    CUDA_TRY(cudaGetLastError());
done:
    return err;
}
