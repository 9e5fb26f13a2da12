// Scratch memory of the ops (partial sums, sort buffers): the stream-ordered allocator. Its default pool
// hands memory back to the driver at every synchronisation unless told otherwise, and the next step would
// pay for cudaMalloc again; so the first use on a device keeps freed memory in the pool (release threshold
// = unlimited). The pool's high-water mark is then the scratch part of peak memory.
#include <stdint.h>

#include "ops_common.cuh"

static int pool_ready[64];

cudaError_t kiln_ops_scratch(void **p, size_t bytes, cudaStream_t st) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64 && !__atomic_load_n(&pool_ready[dev], __ATOMIC_ACQUIRE)) {
        cudaMemPool_t pool;
        uint64_t threshold = UINT64_MAX;
        e = cudaDeviceGetDefaultMemPool(&pool, dev);
        if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
        if (e != cudaSuccess) return e;
        __atomic_store_n(&pool_ready[dev], 1, __ATOMIC_RELEASE);
    }
    return cudaMallocAsync(p, bytes ? bytes : 1, st);
}
