// Device discovery for profiles and error messages.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kiln/cuda.h"

extern "C" int kiln_cuda_built(void) { return 1; }

// PDL (src/cuda/launch.cuh) needs sm_90; KILN_PDL=0 turns it off. Decided once per process (a process uses
// one GPU), stored in one int (bit 0: the device has it, bit 1: the environment wants it) so that a racing
// first call only computes the same value again.
static volatile int g_pdl = -1;
extern "C" int kiln_cuda_pdl(void) {
    int v = g_pdl;
    if (v < 0) {
        int dev = 0, major = 0;
        const char *e = getenv("KILN_PDL");
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
            cudaGetLastError(), major = 0;
        g_pdl = v = (major >= 9) | (!(e && !strcmp(e, "0")) << 1);
    }
    return v == 3;
}

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

/* ---- device memory for callers in C (benchmarks, the NCCL backend's users) ---- */

extern "C" kiln_error *kiln_cuda_device_count(int *n) {
    kiln_error *err = NULL;
    *n = 0;
    CUDA_TRY(cudaGetDeviceCount(n));
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_set_device(int device) {
    kiln_error *err = NULL;
    CUDA_TRY(cudaSetDevice(device));
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    kiln_error *err = NULL;
    CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_alloc(void **p, size_t bytes) {
    kiln_error *err = NULL;
    *p = NULL;
    CUDA_TRY(cudaMalloc(p, bytes ? bytes : 1));
done:
    if (err) err = kiln_error_wrap(err, "%zu bytes of device memory", bytes);
    return err;
}

extern "C" void kiln_cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" kiln_error *kiln_cuda_device_sync(void) {
    kiln_error *err = NULL;
    CUDA_TRY(cudaDeviceSynchronize());
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_copy(void *dst, const void *src, size_t bytes, kiln_cuda_copy_kind kind) {
    kiln_error *err = NULL;
    static const cudaMemcpyKind k[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    if (bytes) CUDA_TRY(cudaMemcpy(dst, src, bytes, k[kind]));
    // cudaMemcpy from pageable host memory may return before the DMA lands, and work on other
    // (non-blocking) streams, such as NCCL's, does not wait for the legacy stream: finish it here
    CUDA_TRY(cudaDeviceSynchronize());
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_event_record(void **ev, void *stream) {
    kiln_error *err = NULL;
    if (!*ev) CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming));
    CUDA_TRY(cudaEventRecord((cudaEvent_t)*ev, (cudaStream_t)stream));
done:
    return err;
}

extern "C" kiln_error *kiln_cuda_event_sync(void *ev) {
    kiln_error *err = NULL;
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
done:
    return err;
}

extern "C" void kiln_cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
