// The grouped convolutions' GEMM pieces shared by cca_conv.cu (its SIMT tiles and cca_conv_tc.cuh) and
// cca_conv_fused.cu.
#ifndef KILN_CCA_CONV_GEMM_CUH
#define KILN_CCA_CONV_GEMM_CUH

#include <mma.h>

#include "ops_common.cuh"

// K index kb + t (t < N) of a GEMM whose K runs over (tap j, channel i < cg), j outer as the CPU: the tap tj (-1
// past K) and channel tc, one division per index (by a runtime cg) instead of one per staged element; then a
// barrier, as the step's loads read them.
template <int N> static __device__ __forceinline__ void conv_k_table(int *tj, int *tc, int kb, int K, int cg) {
    if (threadIdx.x < N) {
        const int kk = kb + threadIdx.x;
        tj[threadIdx.x] = kk < K ? kk / cg : -1;
        tc[threadIdx.x] = kk < K ? kk % cg : 0;
    }
    __syncthreads();
}

// A warp's I x J WMMA accumulator fragments (any shape and precision) zeroed; and the 64 x 64 output tile of 4
// warps of 32 x 32 (2 x 2 fragments each, warp (wy, wx)) stored to shared memory sc (row-major f32, pitch LD),
// then a barrier, as the epilogue reads other warps' fragments.
template <typename Acc, int I, int J> static __device__ __forceinline__ void wmma_zero(Acc (&acc)[I][J]) {
#pragma unroll
    for (int i = 0; i < I; i++)
#pragma unroll
        for (int j = 0; j < J; j++) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}
template <int LD, typename Acc>
static __device__ __forceinline__ void wmma_store_tile(float *sc, Acc (&acc)[2][2], int wy, int wx) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            nvcuda::wmma::store_matrix_sync(sc + (wy * 32 + i * 16) * LD + wx * 32 + j * 16, acc[i][j], LD,
                                            nvcuda::wmma::mem_row_major);
    __syncthreads();
}

#endif
