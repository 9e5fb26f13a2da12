// CCA's q/k residual coupling (src/models/zaya_forward.c after the convolutions): each query head gets the
// mean of itself and its KV head's key, each key the mean of that over its group, added to the convolution
// outputs. Backward (zaya_backward.c): the convolution's dy is [dq | dk]; the projections' gradients are the
// coupling's adjoint plus the convolution's input gradient. One thread per (token, KV head, channel), which
// owns the G query channels of that group: no atomics, the CPU's order of additions.
#include "ops_common.cuh"
#include "launch.cuh"

static __global__ void couple_fwd_kernel(bf16 *qpre, bf16 *kpre, const bf16 *conv, const bf16 *qk, int64_t N, int64_t NH,
                                         int64_t KV, int64_t D) {
    pdl_wait();
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV, total = N * K;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = e / K, jd = e % K, j = jd / D, d = jd % D;
        const float kv = __bfloat162float(qk[n * C + Q + j * D + d]);
        float s = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const int64_t h = j * G + g;
            const float qres = (__bfloat162float(qk[n * C + h * D + d]) + kv) * 0.5f;
            qpre[n * Q + h * D + d] = __float2bfloat16_rn(__bfloat162float(conv[n * C + h * D + d]) + qres);
            s += qres;
        }
        kpre[n * K + jd] = __float2bfloat16_rn(__bfloat162float(conv[n * C + Q + jd]) + s / (float)G);
    }
}

static __global__ void couple_bwd_kernel(bf16 *dqp, bf16 *dkp, bf16 *dconv, const bf16 *dq, const bf16 *dk,
                                         const bf16 *dqk, int64_t N, int64_t NH, int64_t KV, int64_t D) {
    pdl_wait();
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV, total = N * K;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = e / K, jd = e % K, j = jd / D, d = jd % D;
        const bf16 dkv = dk[n * K + jd];
        if (dconv) dconv[n * C + Q + jd] = dkv;
        const float dkg = __bfloat162float(dkv) / (float)G;
        float sk = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const int64_t i = (j * G + g) * D + d;
            if (dconv) dconv[n * C + i] = dq[n * Q + i];
            const float half = 0.5f * (__bfloat162float(dq[n * Q + i]) + dkg);
            if (dqp) dqp[n * Q + i] = __float2bfloat16_rn(dqk ? half + __bfloat162float(dqk[n * C + i]) : half);
            sk += half;
        }
        if (dkp) dkp[n * K + jd] = __float2bfloat16_rn(dqk ? sk + __bfloat162float(dqk[n * C + Q + jd]) : sk);
    }
}

static kiln_error *check(const char *op, int64_t N, int64_t NH, int64_t KV, int64_t D) {
    if (N < 0 || NH <= 0 || KV <= 0 || D <= 0 || NH % KV)
        return kiln_errorf(KILN_EINVAL, "%s: bad shape N=%lld heads=%lld kv_heads=%lld head_dim=%lld", op, (long long)N,
                           (long long)NH, (long long)KV, (long long)D);
    return NULL;
}

extern "C" kiln_error *kiln_cca_couple_forward_cuda(kiln_bf16 *qpre, kiln_bf16 *kpre, const kiln_bf16 *conv,
                                                    const kiln_bf16 *qk, int64_t N, int64_t NH, int64_t KV, int64_t D,
                                                    void *stream) {
    kiln_error *err = NULL;
    KILN_TRY(check("cca_couple forward", N, NH, KV, D));
    if (N == 0) return NULL;
    kiln_launch(couple_fwd_kernel, grid_for(N * KV * D, 256), 256, 0, (cudaStream_t)stream, (bf16 *)qpre,
                (bf16 *)kpre, (const bf16 *)conv, (const bf16 *)qk, N, NH, KV, D);
    LAUNCH_CHECK("cca_couple forward");
done:
    return err;
}

extern "C" kiln_error *kiln_cca_couple_backward_cuda(kiln_bf16 *dqp, kiln_bf16 *dkp, kiln_bf16 *dconv,
                                                     const kiln_bf16 *dq, const kiln_bf16 *dk, const kiln_bf16 *dqk,
                                                     int64_t N, int64_t NH, int64_t KV, int64_t D, void *stream) {
    kiln_error *err = NULL;
    KILN_TRY(check("cca_couple backward", N, NH, KV, D));
    if (N == 0 || (!dqp && !dkp && !dconv)) return NULL;
    kiln_launch(couple_bwd_kernel, grid_for(N * KV * D, 256), 256, 0, (cudaStream_t)stream, (bf16 *)dqp, (bf16 *)dkp,
                (bf16 *)dconv, (const bf16 *)dq, (const bf16 *)dk, (const bf16 *)dqk, N, NH, KV, D);
    LAUNCH_CHECK("cca_couple backward");
done:
    return err;
}
