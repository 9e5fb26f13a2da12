// Shared by the attention kernels (attention.cu: generic path and host entry points; attention_mma.cu:
// the tensor-core path): the shape in ints, the visibility rule and the tile ranges it implies.
#ifndef KILN_ATTENTION_IMPL_CUH
#define KILN_ATTENTION_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kiln/error.h"

typedef __nv_bfloat16 bf16;

#define ATT_DMAX 128
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

struct AttnDims {
    int B, Tq, tk, tk_cap, NH, KV, D, G, q_pos0, window;
    float scale, scale_log2; // scale_log2 = scale * log2(e): the kernels use exp2
};

// key j is visible to the query at position p (the rule of src/nn/attention.c)
static __device__ __forceinline__ bool att_visible(const AttnDims &a, int p, int j) {
    return j <= p && (a.window == 0 || j > p - a.window);
}
// keys [*jlo, *jhi] that some query at positions p0..p1 can see
static __device__ __forceinline__ void att_key_range(const AttnDims &a, int p0, int p1, int *jlo, int *jhi) {
    *jlo = a.window ? max(0, p0 - a.window + 1) : 0;
    *jhi = p1;
}
// the query rows i0 .. i0 + rows - 1 of a block (those < Tq): the positions of the first and last, and the keys
// [jlo, jhi] that some of them can see
struct AttQBlock {
    int pmin, pmax, jlo, jhi;
};
static __device__ __forceinline__ AttQBlock att_q_block(const AttnDims &a, int i0, int rows) {
    AttQBlock r;
    const int ilast = min(i0 + rows, a.Tq) - 1;
    r.pmin = a.q_pos0 + i0, r.pmax = a.q_pos0 + ilast;
    att_key_range(a, r.pmin, r.pmax, &r.jlo, &r.jhi);
    return r;
}
// query rows [*ilo, *ihi] (indices into Tq) that see some key of j0..j1; empty when *ilo > *ihi
static __device__ __forceinline__ void att_query_range(const AttnDims &a, int j0, int j1, int *ilo, int *ihi) {
    int plo = max(j0, a.q_pos0), phi = a.window ? min(j1 + a.window - 1, a.tk - 1) : a.tk - 1;
    *ilo = plo - a.q_pos0, *ihi = phi - a.q_pos0;
}
static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
static __device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// the tensor-core path (attention_mma.cu): head dims 32, 64 and 128
bool att_mma_supported(const AttnDims &a);
kiln_error *att_mma_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a,
                            cudaStream_t st);
kiln_error *att_mma_backward(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse, const float *delta,
                             const bf16 *q, const bf16 *k, const bf16 *v, const AttnDims &a, cudaStream_t st);

#endif
