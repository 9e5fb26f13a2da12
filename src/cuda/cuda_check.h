/* Error plumbing for the CUDA files: every CUDA/cuBLASLt status becomes a kiln_error naming the
 * call, and kernel launches are followed by a cudaGetLastError check. */
#ifndef KILN_CUDA_CHECK_H
#define KILN_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kiln/error.h"

#define CUDA_TRY(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t st_ = (call);                                                                        \
        if (st_ != cudaSuccess) {                                                                        \
            err = kiln_errorf(KILN_EIO, "%s: %s (%s:%d)", #call, cudaGetErrorString(st_), __FILE__, __LINE__); \
            goto done;                                                                                   \
        }                                                                                                \
    } while (0)

#define CUBLAS_TRY(call)                                                                                 \
    do {                                                                                                 \
        cublasStatus_t st_ = (call);                                                                     \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            err = kiln_errorf(KILN_EIO, "%s: cuBLAS status %d (%s:%d)", #call, (int)st_, __FILE__, __LINE__); \
            goto done;                                                                                   \
        }                                                                                                \
    } while (0)

#endif
