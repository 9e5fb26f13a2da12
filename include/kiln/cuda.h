/* The CUDA side of kiln, as C functions (host code stays C11). Built when CMake finds nvcc
 * (KILN_CUDA); otherwise every function returns an error saying so. */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Built with CUDA? (Says nothing about a device being present.) */
int kiln_cuda_built(void);
/* Programmatic dependent launch of kiln's own kernels (src/cuda/launch.cuh): 1 when on, that is on an sm_90+
 * device unless KILN_PDL=0 (read once per process). The same results either way. */
int kiln_cuda_pdl(void);
/* Device 0's name, multiprocessors, memory and the driver/runtime versions. */
typedef struct {
    char name[256];
    int sms, cc_major, cc_minor, driver_version, runtime_version, cublaslt_version;
    double memory_gib;
} kiln_cuda_info;
kiln_error *kiln_cuda_device_info(kiln_cuda_info *info);

/* GEMM element types through cuBLASLt (the trainer's GEMM path). FP8 is E4M3 inputs with unit scales,
 * bf16 output, fp32 accumulation, and only the NT layout (y = x·Wᵀ), the one cuBLASLt's FP8 kernels take. */
typedef enum { KILN_CUDA_F32 = 0, KILN_CUDA_TF32, KILN_CUDA_BF16, KILN_CUDA_F16, KILN_CUDA_FP8 } kiln_cuda_gemm_type;
kiln_error *kiln_cuda_gemm_type_parse(const char *name, kiln_cuda_gemm_type *out);
/* C[m,n] = op(A) op(B), row-major, layout "NN"/"NT"/"TN" as the CPU bench; mean microseconds of
 * one GEMM over iters after warmup, timed with CUDA events. */
kiln_error *kiln_cuda_gemm_time(kiln_cuda_gemm_type t, int64_t m, int64_t n, int64_t k, const char *layout, int iters,
                                int warmup, double *us);

/* STREAM kernels on the GPU: "copy", "scale", "add", "triad" over arrays of `bytes` each; GB/s
 * counting bytes read + written (best and mean over iters). */
kiln_error *kiln_cuda_membw(const char *kernel, size_t bytes, int iters, double *best_gbs, double *avg_gbs);
/* Host<->device copies from/to pinned memory: dir 0 = host to device, 1 = device to host. */
kiln_error *kiln_cuda_hostbw(int dir, size_t bytes, int iters, double *best_gbs, double *avg_gbs);

/* Device memory for C callers (benchmarks, users of the NCCL backend); the calling thread's device. */
kiln_error *kiln_cuda_device_count(int *n);
kiln_error *kiln_cuda_set_device(int device);
kiln_error *kiln_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
kiln_error *kiln_cuda_alloc(void **p, size_t bytes);
void kiln_cuda_free(void *p);
typedef enum { KILN_CUDA_H2D = 0, KILN_CUDA_D2H, KILN_CUDA_D2D } kiln_cuda_copy_kind;
/* Wait for all work on the calling thread's device (every stream). */
kiln_error *kiln_cuda_device_sync(void);
/* synchronous */
kiln_error *kiln_cuda_copy(void *dst, const void *src, size_t bytes, kiln_cuda_copy_kind kind);
/* An event marking the work queued so far on `stream` (a cudaStream_t; NULL: the legacy stream): *ev is created on
 * first use and recorded again by later calls; kiln_cuda_event_sync waits for it, kiln_cuda_event_free frees it. */
kiln_error *kiln_cuda_event_record(void **ev, void *stream);
kiln_error *kiln_cuda_event_sync(void *ev);
void kiln_cuda_event_free(void *ev);

#ifdef __cplusplus
}
#endif
#endif
