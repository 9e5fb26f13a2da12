// Kernel launches with programmatic dependent launch (PDL, sm_90+).
//
// A kernel queued behind another one in a stream normally starts only after the first has finished and its
// blocks have drained, and the launch itself leaves the SMs idle ~1-2 us at every boundary (~500 of kiln's own
// kernels a training step). Launched through kiln_launch, the next kernel's blocks may be placed on the SMs
// while the one before it finishes; each of them then waits in pdl_wait() until that kernel has completed and
// its writes are visible. So every kernel that kiln_launch may start calls pdl_wait() before it reads or
// writes global memory (its first statement: nothing before it is worth the risk), and the stream order stays
// exactly what it was: only the launch latency is hidden. On a device older than sm_90, or with KILN_PDL=0,
// kiln_launch is a plain launch; pdl_wait() returns at once in a kernel launched without the attribute.
#ifndef KILN_CUDA_LAUNCH_CUH
#define KILN_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

extern "C" int kiln_cuda_pdl(void); // src/cuda/device.cu: 1 when launches may use PDL (device and KILN_PDL)

static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename T> struct kiln_launch_arg { typedef T type; };

// k<<<grid, block, smem, stream>>>(args...) with the PDL attribute where allowed. The arguments convert to the
// kernel's parameter types at the call (as with <<<>>>: NULL, literals), so a kernel template needs its
// arguments spelled out (k<V>). The error, as a launch's, is also left for cudaGetLastError.
template <typename... P>
static inline cudaError_t kiln_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                      typename kiln_launch_arg<P>::type... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = kiln_cuda_pdl() ? 1 : 0;
    void *pa[sizeof...(P) + 1] = {(void *)&args...};
    return cudaLaunchKernelExC(&cfg, (const void *)k, pa);
}

#endif
