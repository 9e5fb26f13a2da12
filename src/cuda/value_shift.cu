// CCA's value shift (src/models/zaya_forward.c): v[b,t] = [v_current(x_t) | v_delayed(x_{t-1})], the first
// token's delayed half being v_proj_delayed(0) = its bias (or zeros without one). Training path: no decode
// cache. Backward: the delayed half's gradient moves one step back; token 0's goes to the bias, summed over
// the sequences in order (one thread per channel: deterministic, the CPU's order).
#include "ops_common.cuh"
#include "launch.cuh"

static __global__ void vshift_fwd_kernel(bf16 *v, const bf16 *vc, const bf16 *vd, const float *bvd, int64_t B, int64_t T,
                                         int64_t Kh, int64_t ld) {
    pdl_wait();
    const int64_t total = B * T * Kh;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = e / Kh, j = e % Kh, t = bt % T;
        v[bt * 2 * Kh + j] = vc[bt * ld + j];
        v[bt * 2 * Kh + Kh + j] = t > 0 ? vd[(bt - 1) * ld + j] : __float2bfloat16_rn(bvd ? bvd[j] : 0.0f);
    }
}

static __global__ void vshift_bwd_kernel(bf16 *dvc, bf16 *dvd, const bf16 *dv, int64_t B, int64_t T, int64_t Kh,
                                         int64_t ld) {
    pdl_wait();
    const int64_t total = B * T * Kh;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = e / Kh, j = e % Kh, t = bt % T;
        if (dvc) dvc[bt * ld + j] = dv[bt * 2 * Kh + j];
        if (dvd) dvd[bt * ld + j] = t < T - 1 ? dv[(bt + 1) * 2 * Kh + Kh + j] : __float2bfloat16_rn(0.0f);
    }
}

// The same two copies 8 channels (16 bytes) a thread where Kh, ld and the pointers allow (the model's packed
// projections: Kh = 128, rows 1536 apart): a thread per element took 16 us a layer each way at issue [cuda]'s shape
static __global__ void vshift_fwd8_kernel(bf16 *v, const bf16 *vc, const bf16 *vd, const float *bvd, int64_t B,
                                          int64_t T, int64_t Kh, int64_t ld) {
    pdl_wait();
    const int64_t k8 = Kh / 8, total = B * T * k8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = e / k8, j = (e - bt * k8) * 8, t = bt % T;
        *(uint4 *)(v + bt * 2 * Kh + j) = *(const uint4 *)(vc + bt * ld + j);
        uint4 d;
        if (t > 0) {
            d = *(const uint4 *)(vd + (bt - 1) * ld + j);
        } else {
            __nv_bfloat162 *h = (__nv_bfloat162 *)&d;
            for (int k = 0; k < 4; k++)
                h[k] = bvd ? __floats2bfloat162_rn(bvd[j + 2 * k], bvd[j + 2 * k + 1]) : __floats2bfloat162_rn(0.0f, 0.0f);
        }
        *(uint4 *)(v + bt * 2 * Kh + Kh + j) = d;
    }
}

static __global__ void vshift_bwd8_kernel(bf16 *dvc, bf16 *dvd, const bf16 *dv, int64_t B, int64_t T, int64_t Kh,
                                          int64_t ld) {
    pdl_wait();
    const int64_t k8 = Kh / 8, total = B * T * k8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = e / k8, j = (e - bt * k8) * 8, t = bt % T;
        if (dvc) *(uint4 *)(dvc + bt * ld + j) = *(const uint4 *)(dv + bt * 2 * Kh + j);
        if (dvd)
            *(uint4 *)(dvd + bt * ld + j) =
                t < T - 1 ? *(const uint4 *)(dv + (bt + 1) * 2 * Kh + Kh + j) : make_uint4(0, 0, 0, 0);
    }
}

static __global__ void vshift_bias_kernel(float *dbvd, const bf16 *dv, int64_t B, int64_t T, int64_t Kh) {
    pdl_wait();
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= Kh) return;
    float acc = dbvd[j];
    for (int64_t b = 0; b < B; b++) acc += __bfloat162float(dv[(b * T) * 2 * Kh + Kh + j]);
    dbvd[j] = acc;
}

extern "C" kiln_error *kiln_value_shift_forward_cuda(kiln_bf16 *v, const kiln_bf16 *vc, const kiln_bf16 *vd,
                                                     const float *bvd, int64_t B, int64_t T, int64_t Kh, int64_t ld,
                                                     void *stream) {
    kiln_error *err = NULL;
    if (B <= 0 || T <= 0 || Kh <= 0) return NULL;
    if (!ld) ld = Kh;
    if (ld < Kh)
        return kiln_errorf(KILN_EINVAL, "value_shift forward: row stride %lld < %lld channels", (long long)ld,
                           (long long)Kh);
    if (Kh % 8 == 0 && ld % 8 == 0 && aligned16(v) && aligned16(vc) && aligned16(vd))
        kiln_launch(vshift_fwd8_kernel, grid_for(B * T * Kh / 8, 256), 256, 0, (cudaStream_t)stream, (bf16 *)v,
                    (const bf16 *)vc, (const bf16 *)vd, bvd, B, T, Kh, ld);
    else
        kiln_launch(vshift_fwd_kernel, grid_for(B * T * Kh, 256), 256, 0, (cudaStream_t)stream, (bf16 *)v,
                    (const bf16 *)vc, (const bf16 *)vd, bvd, B, T, Kh, ld);
    LAUNCH_CHECK("value_shift forward");
done:
    return err;
}

extern "C" kiln_error *kiln_value_shift_backward_cuda(kiln_bf16 *dvc, kiln_bf16 *dvd, float *dbvd, const kiln_bf16 *dv,
                                                      int64_t B, int64_t T, int64_t Kh, int64_t ld, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    if (B <= 0 || T <= 0 || Kh <= 0) return NULL;
    if (!ld) ld = Kh;
    if (ld < Kh)
        return kiln_errorf(KILN_EINVAL, "value_shift backward: row stride %lld < %lld channels", (long long)ld,
                           (long long)Kh);
    if (dvc || dvd) {
        if (Kh % 8 == 0 && ld % 8 == 0 && aligned16(dv) && aligned16(dvc) && aligned16(dvd))
            kiln_launch(vshift_bwd8_kernel, grid_for(B * T * Kh / 8, 256), 256, 0, st, (bf16 *)dvc, (bf16 *)dvd,
                        (const bf16 *)dv, B, T, Kh, ld);
        else
            kiln_launch(vshift_bwd_kernel, grid_for(B * T * Kh, 256), 256, 0, st, (bf16 *)dvc, (bf16 *)dvd,
                        (const bf16 *)dv, B, T, Kh, ld);
        LAUNCH_CHECK("value_shift backward");
    }
    if (dbvd) {
        kiln_launch(vshift_bias_kernel, (int)((Kh + 127) / 128), 128, 0, st, dbvd, (const bf16 *)dv, B, T, Kh);
        LAUNCH_CHECK("value_shift backward (bias)");
    }
done:
    return err;
}
