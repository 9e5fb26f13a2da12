// Device discovery for profiles and error messages.
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda.h"

extern "C" int kiln_cuda_built(void) { return 1; }

extern "C" kiln_error *kiln_cuda_device_info(kiln_cuda_info *info) {
    kiln_error *err = NULL;
    cudaDeviceProp p;
    memset(info, 0, sizeof *info);
    CUDA_TRY(cudaGetDeviceProperties(&p, 0));
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->sms = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->memory_gib = (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    CUDA_TRY(cudaDriverGetVersion(&info->driver_version));
    CUDA_TRY(cudaRuntimeGetVersion(&info->runtime_version));
    info->cublaslt_version = (int)cublasLtGetVersion();
done:
    return err;
}
