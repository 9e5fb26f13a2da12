// The ops of CLIP's inference on the GPU (src/clip/clip_cuda.c): layernorm (f32 residual in, bf16 out),
// non-causal/causal multi-head attention forward for short sequences, quick_gelu, the residual add, the
// patch im2col, the embedding assembly (class token + patches + positions) and the L2 normalisation of
// rows. Everything computes in f32; activations between ops are bf16 (the cuda_ops.h conventions).
#include "ops_common.cuh"

// one block per row; y = (x - mean) * rstd * w + b, statistics in f32 over the row. Rows of x are
// x_stride apart (CLIP's pooled class tokens are every T-th row); y is contiguous and may alias x when
// x_stride == d (each element is read and written by the same thread, after the statistics).
template <typename Y>
static __global__ void layernorm_fwd_kernel(Y *y, const float *x, int64_t x_stride, const float *w, const float *b,
                                            int64_t n, int64_t d, float eps) {
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *xr = x + r * x_stride;
        float s = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
        const float mean = block_sum(s, sh) / (float)d;
        float v = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const float c = xr[j] - mean;
            v += c * c;
        }
        const float rstd = rsqrtf(block_sum(v, sh) / (float)d + eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            st(y, r * d + j, (xr[j] - mean) * rstd * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f));
    }
}

template <typename Y>
static kiln_error *layernorm(Y *y, const float *x, int64_t x_stride, const float *w, const float *b, int64_t n,
                             int64_t d, float eps, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    layernorm_fwd_kernel<Y><<<(int)(n < 65535 ? n : 65535), d >= 512 ? 256 : 128, 0, (cudaStream_t)stream>>>(
        y, x, x_stride, w, b, n, d, eps);
    LAUNCH_CHECK("layernorm forward");
done:
    return err;
}

extern "C" kiln_error *kiln_layernorm_forward_cuda(kiln_bf16 *y, const float *x, const float *w, const float *b,
                                                   int64_t n, int64_t d, float eps, void *stream) {
    return layernorm((bf16 *)y, x, d, w, b, n, d, eps, stream);
}
extern "C" kiln_error *kiln_layernorm_forward_f32_cuda(float *y, const float *x, const float *w, const float *b,
                                                       int64_t n, int64_t d, float eps, void *stream) {
    return layernorm(y, x, d, w, b, n, d, eps, stream);
}
extern "C" kiln_error *kiln_layernorm_forward_strided_cuda(kiln_bf16 *y, const float *x, int64_t x_stride,
                                                           const float *w, const float *b, int64_t n, int64_t d,
                                                           float eps, void *stream) {
    return layernorm((bf16 *)y, x, x_stride, w, b, n, d, eps, stream);
}

static __global__ void quick_gelu_kernel(bf16 *y, const bf16 *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(x[i]);
        y[i] = __float2bfloat16_rn(v / (1.0f + expf(-1.702f * v)));
    }
}

extern "C" kiln_error *kiln_quick_gelu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    quick_gelu_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)y, (const bf16 *)x, n);
    LAUNCH_CHECK("quick_gelu forward");
done:
    return err;
}

static __global__ void add_bf16_kernel(float *x, const bf16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += __bfloat162float(y[i]);
}

extern "C" kiln_error *kiln_add_bf16_cuda(float *x, const kiln_bf16 *y, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    add_bf16_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, (const bf16 *)y, n);
    LAUNCH_CHECK("residual add");
done:
    return err;
}

// Attention for sequences of at most 1024 tokens and head dims of at most 128 (CLIP: 50..577 tokens,
// 64 dims): one warp per query row, its scores in shared memory, softmax by warp reductions, then each
// lane owns head dims lane, lane+32, ... K and V rows stay in global memory (they are re-read by every
// query of the block and live in L1/L2).
#define MHA_WARPS 4
#define MHA_TMAX 1024
#define MHA_DMAX 128
static __global__ void mha_fwd_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t T, int heads,
                                      int hd, int64_t stride, int64_t out_stride, float scale, int causal) {
    __shared__ float scores[MHA_WARPS][MHA_TMAX];
    __shared__ float qs[MHA_WARPS][MHA_DMAX];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads;
    const int64_t i = (int64_t)blockIdx.y * MHA_WARPS + warp;
    if (i >= T) return;
    const bf16 *qr = q + (b * T + i) * stride + h * hd;
    for (int d = lane; d < hd; d += 32) qs[warp][d] = __bfloat162float(qr[d]) * scale;
    __syncwarp();
    const int64_t n = causal ? i + 1 : T;
    float mx = -INFINITY;
    for (int64_t j = lane; j < n; j += 32) {
        const bf16 *kr = k + (b * T + j) * stride + h * hd;
        float s = 0;
        for (int d = 0; d < hd; d++) s += qs[warp][d] * __bfloat162float(kr[d]);
        scores[warp][j] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    float sum = 0;
    for (int64_t j = lane; j < n; j += 32) {
        const float e = expf(scores[warp][j] - mx);
        scores[warp][j] = e;
        sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    __syncwarp();
    bf16 *orow = out + (b * T + i) * out_stride + h * hd;
    for (int d = lane; d < hd; d += 32) {
        float o = 0;
        const bf16 *vc = v + b * T * stride + h * hd + d;
        for (int64_t j = 0; j < n; j++) o += scores[warp][j] * __bfloat162float(vc[j * stride]);
        orow[d] = __float2bfloat16_rn(o * inv);
    }
}

extern "C" kiln_error *kiln_mha_forward_cuda(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k,
                                             const kiln_bf16 *v, int64_t B, int64_t T, int64_t heads, int64_t hd,
                                             int64_t stride, int64_t out_stride, float scale, int causal,
                                             void *stream) {
    kiln_error *err = NULL;
    if (B <= 0 || T <= 0) return NULL;
    if (T > MHA_TMAX || hd > MHA_DMAX || B * heads > 2147483647)
        return kiln_errorf(KILN_EUNSUPPORTED, "attention forward (CUDA): %lld tokens x head dim %lld is beyond this "
                                              "kernel (at most %d tokens, %d dims)",
                           (long long)T, (long long)hd, MHA_TMAX, MHA_DMAX);
    dim3 grid((unsigned)(B * heads), (unsigned)((T + MHA_WARPS - 1) / MHA_WARPS));
    mha_fwd_kernel<<<grid, 32 * MHA_WARPS, 0, (cudaStream_t)stream>>>(
        (bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, (int)heads, (int)hd, stride, out_stride,
        scale, causal);
    LAUNCH_CHECK("attention forward");
done:
    return err;
}

// cols [B*G*G, 3*p*p] (bf16) from pixels [B,3,S,S] (f32): the conv's im2col in the weight's [c][ky][kx] order
static __global__ void patchify_kernel(bf16 *cols, const float *px, int64_t B, int S, int p) {
    const int G = S / p, K = 3 * p * p;
    const int64_t total = B * G * G * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / K;
        const int kk = (int)(i - row * K), c = kk / (p * p), ky = (kk / p) % p, kx = kk % p;
        const int64_t b = row / (G * G);
        const int g = (int)(row - b * G * G), gy = g / G, gx = g % G;
        cols[i] = __float2bfloat16_rn(px[((b * 3 + c) * S + gy * p + ky) * (int64_t)S + gx * p + kx]);
    }
}

extern "C" kiln_error *kiln_clip_patchify_cuda(kiln_bf16 *cols, const float *pixels, int64_t B, int64_t S, int64_t p,
                                               void *stream) {
    kiln_error *err = NULL;
    const int64_t n = B * (S / p) * (S / p) * 3 * p * p;
    if (n <= 0) return NULL;
    patchify_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)cols, pixels, B, (int)S, (int)p);
    LAUNCH_CHECK("patchify");
done:
    return err;
}

// x [B, 1+G2, H] f32 = [class; patches] + positions
static __global__ void assemble_kernel(float *x, const bf16 *patches, const float *cls, const float *pos, int64_t B,
                                       int64_t G2, int64_t H) {
    const int64_t T = G2 + 1, total = B * T * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / (T * H), t = (i / H) % T, j = i % H;
        const float e = t == 0 ? cls[j] : __bfloat162float(patches[(b * G2 + t - 1) * H + j]);
        x[i] = e + pos[t * H + j];
    }
}

extern "C" kiln_error *kiln_clip_assemble_cuda(float *x, const kiln_bf16 *patches, const float *cls, const float *pos,
                                               int64_t B, int64_t G2, int64_t H, void *stream) {
    kiln_error *err = NULL;
    const int64_t n = B * (G2 + 1) * H;
    if (n <= 0) return NULL;
    assemble_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, (const bf16 *)patches, cls, pos, B, G2, H);
    LAUNCH_CHECK("clip embedding assembly");
done:
    return err;
}

// y [rows, d] f32 = x / |x| per row (one warp per row)
static __global__ void l2norm_rows_kernel(float *y, const bf16 *x, int64_t rows, int64_t d) {
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float s = 0;
    for (int64_t j = lane; j < d; j += 32) {
        const float v = __bfloat162float(x[r * d + j]);
        s += v * v;
    }
    s = warp_sum(s);
    const float inv = s > 0 ? rsqrtf(s) : 0.0f;
    for (int64_t j = lane; j < d; j += 32) y[r * d + j] = __bfloat162float(x[r * d + j]) * inv;
}

extern "C" kiln_error *kiln_l2_normalize_rows_cuda(float *y, const kiln_bf16 *x, int64_t rows, int64_t d,
                                                   void *stream) {
    kiln_error *err = NULL;
    if (rows <= 0) return NULL;
    l2norm_rows_kernel<<<grid_for(rows * 32, 256), 256, 0, (cudaStream_t)stream>>>(y, (const bf16 *)x, rows, d);
    LAUNCH_CHECK("l2 normalize rows");
done:
    return err;
}
