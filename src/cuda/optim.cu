// AdamW and Muon's pointwise pieces on the device, the same arithmetic as src/train/optim.c element for
// element: explicit round-to-nearest intrinsics where the C code rounds (nvcc would otherwise fuse
// multiply-adds), f64 where it computes in f64, so that CPU and GPU steps agree to the last bit or two.
#include "ops_common.cuh"

struct adamw_k {
    double b1, one_b1, b2, one_b2, c1, c2, eps, lr;
    float wd;
};

static __global__ void adamw_kernel(float *w, const float *g, float *m, float *v, int64_t n, adamw_k k, bf16 *wb) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double gi = g[i];
        const float mi = (float)__dadd_rn(__dmul_rn(k.b1, (double)m[i]), __dmul_rn(k.one_b1, gi));
        const float vi = (float)__dadd_rn(__dmul_rn(k.b2, (double)v[i]), __dmul_rn(__dmul_rn(k.one_b2, gi), gi));
        m[i] = mi, v[i] = vi;
        const double upd = __ddiv_rn(__ddiv_rn((double)mi, k.c1), __dadd_rn(__dsqrt_rn(__ddiv_rn((double)vi, k.c2)), k.eps));
        const float wi = w[i];
        const float t = __fsub_rn(wi, __fmul_rn(k.wd, wi));
        const float nw = (float)__dsub_rn((double)t, __dmul_rn(k.lr, upd));
        w[i] = nw;
        if (wb) wb[i] = __float2bfloat16_rn(nw);
    }
}

static __global__ void muon_momentum_kernel(float *m, float *u, const float *g, int64_t n, float mu) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = g[i], mi = __fadd_rn(__fmul_rn(mu, m[i]), gi);
        m[i] = mi;
        u[i] = __fadd_rn(gi, __fmul_rn(mu, mi)); // Nesterov
    }
}

#define NRM_CHUNK 65536
// grid (chunks, mats): part[mat * chunks + chunk] = sum of squares over the chunk, in f64
static __global__ void muon_sumsq_kernel(double *part, const float *u, int64_t mn, int64_t chunks) {
    __shared__ double sh[32];
    const int64_t mat = blockIdx.y, c = blockIdx.x, i0 = c * NRM_CHUNK, i1 = i0 + NRM_CHUNK < mn ? i0 + NRM_CHUNK : mn;
    const float *um = u + mat * mn;
    double s = 0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += (double)um[i] * um[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[mat * chunks + c] = s;
}
// one thread per matrix: inv = 1 / (|u|_F + 1e-7), the chunks summed in order
static __global__ void muon_inv_kernel(float *inv, const double *part, int64_t mats, int64_t chunks) {
    const int64_t mat = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (mat >= mats) return;
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += part[mat * chunks + c];
    inv[mat] = (float)(1.0 / (sqrt(s) + 1e-7));
}
static __global__ void muon_scale_kernel(float *u, const float *inv, int64_t mn) {
    const float f = inv[blockIdx.y];
    float *um = u + blockIdx.y * mn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < mn; i += (int64_t)gridDim.x * blockDim.x)
        um[i] = __fmul_rn(um[i], f);
}

static __global__ void muon_update_kernel(float *w, const float *u, int64_t n, float wd, float lrs, bf16 *wb) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float wi = w[i];
        const float nw = __fsub_rn(__fsub_rn(wi, __fmul_rn(wd, wi)), __fmul_rn(lrs, u[i]));
        w[i] = nw;
        if (wb) wb[i] = __float2bfloat16_rn(nw);
    }
}

extern "C" kiln_error *kiln_adamw_step_cuda(float *w, const float *g, float *state, int64_t n,
                                            const kiln_optim_hparams *hp, double lr, int64_t t, int decay,
                                            kiln_bf16 *w_bf16, void *stream) {
    kiln_error *err = NULL;
    adamw_k k;
    if (n <= 0) return NULL;
    if (t < 1) return kiln_errorf(KILN_EINVAL, "adamw step: step %lld (steps count from 1)", (long long)t);
    k.b1 = hp->beta1, k.b2 = hp->beta2, k.one_b1 = 1 - hp->beta1, k.one_b2 = 1 - hp->beta2;
    k.c1 = 1.0 - pow(hp->beta1, (double)t), k.c2 = 1.0 - pow(hp->beta2, (double)t);
    k.eps = hp->eps, k.lr = lr;
    k.wd = decay ? (float)(lr * hp->weight_decay) : 0.0f;
    adamw_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(w, g, state, state + n, n, k, (bf16 *)w_bf16);
    LAUNCH_CHECK("adamw step");
done:
    return err;
}

extern "C" kiln_error *kiln_muon_momentum_cuda(float *state, float *u, const float *g, int64_t n,
                                               const kiln_optim_hparams *hp, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    muon_momentum_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(state, u, g, n, (float)hp->muon_momentum);
    LAUNCH_CHECK("muon momentum");
done:
    return err;
}

extern "C" kiln_error *kiln_muon_normalize_cuda(float *u, const kiln_opt_param *p, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t mn = p->rows * p->cols, mats = p->mats, chunks = (mn + NRM_CHUNK - 1) / NRM_CHUNK;
    double *part = NULL;
    float *inv = NULL;
    int64_t bx = (mn + 255) / 256;
    if (mn <= 0 || mats <= 0) return NULL;
    if (mats > 65535 || chunks > 65535)
        return kiln_errorf(KILN_EINVAL, "muon normalize: %lld matrices of %lld elements", (long long)mats, (long long)mn);
    if (bx > 4096) bx = 4096;
    CUDA_TRY(kiln_ops_scratch((void **)&part, (size_t)(mats * chunks) * sizeof(double), st));
    CUDA_TRY(kiln_ops_scratch((void **)&inv, (size_t)mats * sizeof(float), st));
    muon_sumsq_kernel<<<dim3((unsigned)chunks, (unsigned)mats), 256, 0, st>>>(part, u, mn, chunks);
    LAUNCH_CHECK("muon normalize (sums)");
    muon_inv_kernel<<<(int)((mats + 127) / 128), 128, 0, st>>>(inv, part, mats, chunks);
    LAUNCH_CHECK("muon normalize (norms)");
    muon_scale_kernel<<<dim3((unsigned)bx, (unsigned)mats), 256, 0, st>>>(u, inv, mn);
    LAUNCH_CHECK("muon normalize (scale)");
done:
    if (part) cudaFreeAsync(part, st);
    if (inv) cudaFreeAsync(inv, st);
    return err;
}

extern "C" kiln_error *kiln_muon_update_cuda(float *w, const float *u, const kiln_opt_param *p,
                                             const kiln_optim_hparams *hp, double lr, kiln_bf16 *w_bf16, void *stream) {
    kiln_error *err = NULL;
    const int64_t n = p->mats * p->rows * p->cols;
    const float scale = (float)(0.2 * sqrt((double)(p->rows > p->cols ? p->rows : p->cols)));
    const float wd = p->decay ? (float)(lr * hp->weight_decay) : 0.0f;
    const float lrs = (float)lr * scale; // the CPU's ((float)lr * scale) * u[i], left to right
    if (n <= 0) return NULL;
    muon_update_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(w, u, n, wd, lrs, (bf16 *)w_bf16);
    LAUNCH_CHECK("muon update");
done:
    return err;
}
