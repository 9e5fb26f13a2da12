// The ops of CLIP's inference on the GPU (src/clip/clip_cuda.c): layernorm (f32 or bf16 residual in, bf16 out),
// non-causal/causal multi-head attention forward for short sequences, quick_gelu, the residual add, the
// patch im2col, the embedding assembly (class token + patches + positions) and the L2 normalisation of
// rows. Everything computes in f32; activations between ops are bf16 (the cuda_ops.h conventions).
#include <stdlib.h>
#include <string.h>

#include "attention_cudnn.h"
#include "clip_attention.cuh"
#include "clip_ops.h"
#include "kiln/log.h"
#include "ops_common.cuh"
#include "launch.cuh"

// one block per row; y = (x - mean) * rstd * w + b, statistics in f32 over the row. Rows of x are
// x_stride apart (CLIP's pooled class tokens are every T-th row); y is contiguous and may alias x when
// x_stride == d (each element is read and written by the same thread, after the statistics).
template <typename Y, typename X>
static __global__ void layernorm_fwd_kernel(Y *y, const X *x, int64_t x_stride, const float *w, const float *b,
                                            int64_t n, int64_t d, float eps) {
    pdl_wait();
    __shared__ float sh[32];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const X *xr = x + r * x_stride;
        float s = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += ld(xr, j);
        const float mean = block_sum(s, sh) / (float)d;
        float v = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const float c = ld(xr, j) - mean;
            v += c * c;
        }
        const float rstd = rsqrtf(block_sum(v, sh) / (float)d + eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            st(y, r * d + j, (ld(xr, j) - mean) * rstd * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f));
    }
}

// One warp per row for widths that are a multiple of 128 up to 2048 (CLIP's 768, 1024, 1280, ...): the row is
// read once into registers as float4 (NV per lane), both statistics come from registers, and the output
// leaves as 4-wide stores. The block-per-row kernel above re-reads the row three times.
template <typename Y, typename X, int NV>
static __global__ void layernorm_warp_kernel(Y *y, const X *x, int64_t x_stride, const float *w, const float *b,
                                             int64_t n, float eps) {
    pdl_wait();
    constexpr int d = NV * 128;
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n) return;
    const X *xr = x + r * x_stride;
    float v[NV][4];
    float s = 0;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        ldv<4>(xr, (int64_t)(i * 32 + lane) * 4, v[i]);
        s += v[i][0] + v[i][1] + v[i][2] + v[i][3];
    }
    const float mean = warp_sum(s) / (float)d;
    float q = 0;
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[i][e] -= mean;
            q += v[i][e] * v[i][e];
        }
    const float rstd = rsqrtf(warp_sum(q) / (float)d + eps);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int64_t j = (int64_t)(i * 32 + lane) * 4;
        float wv[4] = {1.f, 1.f, 1.f, 1.f}, bv[4] = {0.f, 0.f, 0.f, 0.f}, o[4];
        if (w) ldv<4>(w, j, wv);
        if (b) ldv<4>(b, j, bv);
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = v[i][e] * rstd * wv[e] + bv[e];
        stv<4>(y, r * d + j, o);
    }
}

template <typename Y, typename X, int NV>
static void layernorm_warp(Y *y, const X *x, int64_t x_stride, const float *w, const float *b, int64_t n,
                           float eps, cudaStream_t st) {
    kiln_launch(layernorm_warp_kernel<Y, X, NV>, grid_for(n * 32, 256), 256, 0, st, y, x, x_stride, w, b, n, eps);
}

template <typename Y, typename X>
static kiln_error *layernorm(Y *y, const X *x, int64_t x_stride, const float *w, const float *b, int64_t n,
                             int64_t d, float eps, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0) return NULL;
    // the warp kernel needs 16-byte aligned rows; in place (y == x) is safe: a warp reads its whole row
    // into registers before writing it
    const bool vec = d % 128 == 0 && d <= 2048 && x_stride % 4 == 0 && aligned16(x) && aligned16(y) &&
                     (!w || aligned16(w)) && (!b || aligned16(b)) && n <= (int64_t)1048576 * 8;
    switch (vec ? d / 128 : 0) {
    case 1: layernorm_warp<Y, X, 1>(y, x, x_stride, w, b, n, eps, st); break;
    case 2: layernorm_warp<Y, X, 2>(y, x, x_stride, w, b, n, eps, st); break;
    case 3: layernorm_warp<Y, X, 3>(y, x, x_stride, w, b, n, eps, st); break;
    case 4: layernorm_warp<Y, X, 4>(y, x, x_stride, w, b, n, eps, st); break;
    case 5: layernorm_warp<Y, X, 5>(y, x, x_stride, w, b, n, eps, st); break;
    case 6: layernorm_warp<Y, X, 6>(y, x, x_stride, w, b, n, eps, st); break;
    case 8: layernorm_warp<Y, X, 8>(y, x, x_stride, w, b, n, eps, st); break;
    case 10: layernorm_warp<Y, X, 10>(y, x, x_stride, w, b, n, eps, st); break;
    case 12: layernorm_warp<Y, X, 12>(y, x, x_stride, w, b, n, eps, st); break;
    case 16: layernorm_warp<Y, X, 16>(y, x, x_stride, w, b, n, eps, st); break;
    default:
        kiln_launch(layernorm_fwd_kernel<Y, X>, (int)(n < 65535 ? n : 65535), d >= 512 ? 256 : 128, 0, st, y, x,
                    x_stride, w, b, n, d, eps);
    }
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
// the residual stream's layernorms, its element type a parameter (f32 or bf16 in, f32 or bf16 out)
extern "C" kiln_error *kiln_clip_layernorm_cuda(void *y, kiln_clip_dtype yt, const void *x, kiln_clip_dtype xt,
                                                int64_t x_stride, const float *w, const float *b, int64_t n,
                                                int64_t d, float eps, void *stream) {
    if (xt == KILN_CLIP_BF16)
        return yt == KILN_CLIP_BF16 ? layernorm((bf16 *)y, (const bf16 *)x, x_stride, w, b, n, d, eps, stream)
                                    : layernorm((float *)y, (const bf16 *)x, x_stride, w, b, n, d, eps, stream);
    return yt == KILN_CLIP_BF16 ? layernorm((bf16 *)y, (const float *)x, x_stride, w, b, n, d, eps, stream)
                                : layernorm((float *)y, (const float *)x, x_stride, w, b, n, d, eps, stream);
}

static __global__ void quick_gelu_kernel(bf16 *y, const bf16 *x, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(x[i]);
        y[i] = __float2bfloat16_rn(v / (1.0f + expf(-1.702f * v)));
    }
}

// 8 elements (16 bytes) per thread and step
static __global__ void quick_gelu8_kernel(uint4 *y, const uint4 *x, int64_t n8) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 u = x[i];
        __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __bfloat1622float2(h[e]);
            h[e] = __floats2bfloat162_rn(f.x / (1.0f + __expf(-1.702f * f.x)), f.y / (1.0f + __expf(-1.702f * f.y)));
        }
        y[i] = u;
    }
}

extern "C" kiln_error *kiln_quick_gelu_forward_cuda(kiln_bf16 *y, const kiln_bf16 *x, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    if (n % 8 == 0 && aligned16(x) && aligned16(y))
        kiln_launch(quick_gelu8_kernel, grid_for(n / 8, 256), 256, 0, (cudaStream_t)stream, (uint4 *)y,
                    (const uint4 *)x, n / 8);
    else kiln_launch(quick_gelu_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, (bf16 *)y, (const bf16 *)x,
                     n);
    LAUNCH_CHECK("quick_gelu forward");
done:
    return err;
}

static __global__ void add_bf16_kernel(float *x, const bf16 *y, int64_t n) {
    pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += __bfloat162float(y[i]);
}

extern "C" kiln_error *kiln_add_bf16_cuda(float *x, const kiln_bf16 *y, int64_t n, void *stream) {
    kiln_error *err = NULL;
    if (n <= 0) return NULL;
    kiln_launch(add_bf16_kernel, grid_for(n, 256), 256, 0, (cudaStream_t)stream, x, (const bf16 *)y, n);
    LAUNCH_CHECK("residual add");
done:
    return err;
}

// Attention as two batched tensor-core GEMMs around a row softmax: S = scale * Q Kᵀ (f32, one T x T
// matrix per sequence and head), P = softmax(S) (bf16, causal mask applied here), O = P V written in
// place into the [B*T, out_stride] output. CLIP's sequences are short (50..577 tokens), so S fits; the
// per-(sequence, head) pointers go through cublasGemmBatchedEx. Rows of at most 1024 keys.
#include <cublas_v2.h>

static cublasHandle_t g_clip_blas;

#define SOFTMAX_TMAX 1024
// one warp per row of S; each lane holds NC scores in registers (NC * 32 >= T)
template <int NC>
static __global__ void softmax_rows_kernel(bf16 *p, const float *s, int64_t rows, int64_t T, int causal) {
    pdl_wait();
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int64_t i = r % T, n = causal ? i + 1 : T;
    const float *sr = s + r * T;
    float v[NC];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int64_t j = lane + 32 * c;
        v[c] = j < n ? sr[j] : -INFINITY;
        mx = fmaxf(mx, v[c]);
    }
    mx = warp_max(mx);
    float sum = 0;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        v[c] = lane + 32 * c < n ? expf(v[c] - mx) : 0.0f;
        sum += v[c];
    }
    const float inv = 1.0f / warp_sum(sum);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int64_t j = lane + 32 * c;
        if (j < T) p[r * T + j] = __float2bfloat16_rn(v[c] * inv);
    }
}

static void softmax_rows(bf16 *p, const float *s, int64_t rows, int64_t T, int causal, cudaStream_t st) {
    const int g = grid_for(rows * 32, 256);
    if (T <= 64) kiln_launch(softmax_rows_kernel<2>, g, 256, 0, st, p, s, rows, T, causal);
    else if (T <= 128) kiln_launch(softmax_rows_kernel<4>, g, 256, 0, st, p, s, rows, T, causal);
    else if (T <= 256) kiln_launch(softmax_rows_kernel<8>, g, 256, 0, st, p, s, rows, T, causal);
    else if (T <= 384) kiln_launch(softmax_rows_kernel<12>, g, 256, 0, st, p, s, rows, T, causal);
    else if (T <= 608) kiln_launch(softmax_rows_kernel<19>, g, 256, 0, st, p, s, rows, T, causal);
    else kiln_launch(softmax_rows_kernel<SOFTMAX_TMAX / 32>, g, 256, 0, st, p, s, rows, T, causal);
}

// the per-(sequence, head) pointers of the two batched GEMMs, written on the device (no host round trip)
static __global__ void mha_ptrs_kernel(void **ptr, const bf16 *q, const bf16 *k, const bf16 *v, float *S, bf16 *P,
                                       bf16 *out, int64_t B, int64_t T, int64_t heads, int64_t hd, int64_t stride,
                                       int64_t out_stride) {
    pdl_wait();
    const int64_t nb = B * heads;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < nb; j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = j / heads, h = j % heads;
        ptr[0 * nb + j] = (void *)(q + b * T * stride + h * hd);
        ptr[1 * nb + j] = (void *)(k + b * T * stride + h * hd);
        ptr[2 * nb + j] = (void *)(v + b * T * stride + h * hd);
        ptr[3 * nb + j] = (void *)(S + j * T * T);
        ptr[4 * nb + j] = (void *)(P + j * T * T);
        ptr[5 * nb + j] = (void *)(out + b * T * out_stride + h * hd);
    }
}

// Which implementation kiln_mha_forward_cuda runs, from KILN_CLIP_ATTN (read at every call: the GPU tests
// switch it): auto (the default: non-causal hd 64 calls where clip_attention.cu's short-sequence kernel beats
// cuDNN's padded 128-row tiles run it, see short_beats_cudnn — L/14's 257 tokens and B/32's 50 —, everything
// else as cudnn; in the L/14 tower 3,213 against 3,150 img/s with cudnn, B/32 37,103 against 35,066, run r32),
// cudnn (cuDNN's fused flash attention through attention_cudnn.cu, where the library loads and takes the call),
// own (clip_attention.cu's tensor-core kernels for non-causal calls they take: the short-sequence kernel where a
// head's K and V fit in shared memory, else the streaming one; else the batched GEMMs below) or gemm (the
// batched GEMMs). A call cuDNN cannot run takes the own path and a debug line says why, once per reason.
enum { CA_CUDNN, CA_OWN, CA_GEMM, CA_AUTO };
static const char *g_clip_attn_last = "none";
extern "C" const char *kiln_clip_attention_last_impl(void) { return g_clip_attn_last; }

static void clip_attn_say(const char *what, const char *why) {
    static char said[8][200];
    static int nsaid;
    char key[200];
    snprintf(key, sizeof key, "%s: %.150s", what, why ? why : "");
    for (int i = 0; i < nsaid; i++)
        if (!strcmp(said[i], key)) return;
    if (nsaid < 8) snprintf(said[nsaid++], sizeof said[0], "%s", key);
    kiln_log(KILN_LOG_DEBUG, "CLIP attention: %s%s%s", what, why ? ": " : "", why ? why : "");
}

static int clip_attn_impl(void) {
    const char *e = getenv("KILN_CLIP_ATTN");
    if (!e || !*e || !strcmp(e, "auto")) return CA_AUTO;
    if (!strcmp(e, "cudnn")) return CA_CUDNN;
    if (!strcmp(e, "own")) return CA_OWN;
    if (!strcmp(e, "gemm")) return CA_GEMM;
    clip_attn_say("KILN_CLIP_ATTN is not auto, cudnn, own or gemm; using auto", e);
    return CA_AUTO;
}

// cuDNN over the call's sequences: its plans are built per batch size (on first use, then kept), so the call
// runs as pieces of power-of-two sequence counts, largest first: any count needs at most log2 of them per
// shape. Returns with *done = the sequences it ran (all of them, or the pieces before one cuDNN refused).
static kiln_error *mha_cudnn(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int64_t B, int64_t T,
                             int64_t heads, int64_t hd, int64_t stride, int64_t out_stride, float scale, int causal,
                             cudaStream_t st, int64_t *done) {
    *done = 0;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out)) {
        clip_attn_say("the own path runs", "q, k, v or out is not 16-byte aligned (cuDNN)");
        return NULL;
    }
    const att_cudnn_layout l = {causal, stride, stride, out_stride, T};
    kiln_error *err = NULL;
    while (*done < B) {
        int64_t n = 1;
        while (2 * n <= B - *done) n *= 2;
        kiln_attn_shape s = {n, T, T, T, heads, heads, hd, 0, scale};
        const char *why = NULL;
        if (att_cudnn_usable(&s, &l, 0, 0, &why)) {
            clip_attn_say("the own path runs", why);
            break;
        }
        const int64_t b = *done;
        int ran = 0;
        if ((err = att_cudnn_forward((kiln_bf16 *)(out + b * T * out_stride), NULL,
                                     (const kiln_bf16 *)(q + b * T * stride), (const kiln_bf16 *)(k + b * T * stride),
                                     (const kiln_bf16 *)(v + b * T * stride), &s, &l, st, &ran)))
            return err;
        if (!ran) {
            clip_attn_say("the own path runs", "cuDNN's workspace could not be allocated");
            break;
        }
        *done += n;
    }
    if (*done == B) {
        const long ver = att_cudnn_version();
        char what[128];
        snprintf(what, sizeof what, "cuDNN %ld.%ld.%ld fused flash attention", ver / 10000, ver / 100 % 100,
                 ver % 100);
        clip_attn_say(what, NULL);
    }
    return err;
}

// KILN_CLIP_ATTN=auto at hd 64: the short-sequence kernel where cuDNN's 128-query x 128-key tiles pad the T x T
// work by 1.3x or more ((T rounded up to 128)² over T · (T rounded up to 16), the short kernel's own padding).
// On the H200 (docs/perf.md, session 8, B = 64) the short kernel ran at ~0.77x cuDNN's rate where cuDNN's
// tiles fit (T = 256: 0.075 vs 0.058 ms) and ahead where they pad: T = 257 (2.1x) 0.092 vs 0.123 ms, 320
// (1.44x) 0.107 vs 0.123, 50 (5.1x, 128 images) 0.015 vs 0.033; even at 197 (1.6x) 0.050 vs 0.050; cuDNN ahead
// at 577 (1.2x: 0.376 vs 0.294) and 240 (1.14x). Not yet the default: its effect in the tower is unmeasured.
static int short_beats_cudnn(int64_t T) {
    const double t128 = (double)((T + 127) / 128 * 128), t16 = (double)((T + 15) / 16 * 16);
    return t128 * t128 >= 1.3 * (double)T * t16;
}

extern "C" kiln_error *kiln_mha_forward_cuda(kiln_bf16 *out, const kiln_bf16 *q, const kiln_bf16 *k,
                                             const kiln_bf16 *v, int64_t B, int64_t T, int64_t heads, int64_t hd,
                                             int64_t stride, int64_t out_stride, float scale, int causal,
                                             void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    float *S = NULL;
    bf16 *P = NULL;
    void **ptr = NULL;
    const float one = 1.0f, zero = 0.0f;
    if (B <= 0 || T <= 0) return NULL;
    int impl = clip_attn_impl();
    if (impl == CA_AUTO)
        impl = !causal && hd == 64 && short_beats_cudnn(T) &&
                       clip_attention_short_takes(q, k, v, out, T, hd, stride, out_stride)
                   ? CA_OWN
                   : CA_CUDNN;
    int64_t done = 0;
    if (impl == CA_CUDNN) {
        err = mha_cudnn((bf16 *)out, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, heads, hd, stride,
                        out_stride, scale, causal, st, &done);
        if (err) return kiln_error_wrap(err, "attention forward (CUDA)");
        if (done) g_clip_attn_last = "cudnn";
        if (done == B) return NULL;
        // the sequences cuDNN did not take run below
        out += done * T * out_stride, q += done * T * stride, k += done * T * stride, v += done * T * stride;
        B -= done;
    }
    const int64_t nb = B * heads;
    // non-causal (the vision tower): the tensor-core kernel of clip_attention.cu, unless it cannot take the
    // shape or KILN_CLIP_ATTN=gemm asks for the batched GEMMs (the comparison in tests/gpu)
    if (!causal && impl != CA_GEMM && clip_attention_supported(q, k, v, out, T, hd, stride, out_stride)) {
        const int sh = clip_attention_short_takes(q, k, v, out, T, hd, stride, out_stride);
        g_clip_attn_last = done ? (sh ? "cudnn+short" : "cudnn+own") : sh ? "short" : "own";
        return clip_attention_forward(out, q, k, v, B, T, 0, heads, hd, stride, out_stride, scale, stream);
    }
    g_clip_attn_last = done ? "cudnn+gemm" : "gemm";
    if (T > SOFTMAX_TMAX || nb > 2147483647)
        return kiln_errorf(KILN_EUNSUPPORTED, "attention forward (CUDA): %lld tokens is beyond this kernel (at most %d)",
                           (long long)T, SOFTMAX_TMAX);
    if (!g_clip_blas) CUBLAS_TRY(cublasCreate(&g_clip_blas));
    CUBLAS_TRY(cublasSetStream(g_clip_blas, st));
    CUDA_TRY(cudaMallocAsync((void **)&S, sizeof(float) * (size_t)(nb * T * T), st));
    CUDA_TRY(cudaMallocAsync((void **)&P, 2 * (size_t)(nb * T * T), st));
    CUDA_TRY(cudaMallocAsync((void **)&ptr, sizeof(void *) * (size_t)(6 * nb), st));
    kiln_launch(mha_ptrs_kernel, grid_for(nb, 256), 256, 0, st, ptr, (const bf16 *)q, (const bf16 *)k,
                (const bf16 *)v, S, P, (bf16 *)out, B, T, heads, hd, stride, out_stride);
    LAUNCH_CHECK("attention pointer table");
    // row-major S = scale * Q Kᵀ is column-major Sᵀ = K Qᵀ: A = K (as [hd x T], transposed), B = Q
    CUBLAS_TRY(cublasGemmBatchedEx(g_clip_blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)T, (int)T, (int)hd, &scale,
                                   (const void *const *)(ptr + nb), CUDA_R_16BF, (int)stride,
                                   (const void *const *)ptr, CUDA_R_16BF, (int)stride, &zero, ptr + 3 * nb,
                                   CUDA_R_32F, (int)T, (int)nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    softmax_rows(P, S, nb * T, T, causal, st);
    LAUNCH_CHECK("attention softmax");
    // row-major O = P V is column-major Oᵀ = Vᵀ Pᵀ: A = V (as [hd x T]), B = P (as [T x T])
    CUBLAS_TRY(cublasGemmBatchedEx(g_clip_blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)hd, (int)T, (int)T, &one,
                                   (const void *const *)(ptr + 2 * nb), CUDA_R_16BF, (int)stride,
                                   (const void *const *)(ptr + 4 * nb), CUDA_R_16BF, (int)T, &zero, ptr + 5 * nb,
                                   CUDA_R_16BF, (int)out_stride, (int)nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
done:
    if (S) cudaFreeAsync(S, st);
    if (P) cudaFreeAsync(P, st);
    if (ptr) cudaFreeAsync(ptr, st);
    return err ? kiln_error_wrap(err, "attention forward (CUDA)") : NULL;
}

// cols [B*G*G, 3*p*p] (rows ld apart, the columns past 3*p*p zeroed) from pixels [B,3,S,S] (bf16, or f32 rounded
// to bf16 here): the conv's im2col in the weight's [c][ky][kx] order. Why ld: L/14's 588 columns make rows
// 1,176 bytes apart, off the 16-byte alignment cuBLASLt's fast kernels need (the patch GEMM ran at 176 TFLOP/s,
// session 15); the tower pads them to 592. One block a patch, 32-bit index math per element: an element-wise
// grid spent its time in 64-bit divisions (the tower's whole patch embedding, these kernels with the patch GEMM
// and the pre-layernorm, took 0.70 ms per 128 L/14 images, several times what its bytes and FLOPs need).
template <typename P>
static __global__ void patchify_kernel(bf16 *cols, int lda, const P *px, int64_t G2, int G, int S, int p) {
    pdl_wait();
    const int64_t row = blockIdx.x, b = row / G2;
    const int g = (int)(row - b * G2), gy = g / G, gx = g - gy * G, pp = p * p, K = 3 * pp;
    const P *src = px + b * 3 * (int64_t)S * S + (int64_t)(gy * p) * S + gx * p;
    bf16 *dst = cols + row * lda;
    for (int kk = threadIdx.x; kk < lda; kk += blockDim.x) {
        const int c = kk / pp, r = kk - c * pp, ky = r / p, kx = r - ky * p;
        dst[kk] = kk < K ? __float2bfloat16_rn(ld(src, (int64_t)c * S * S + ky * S + kx)) : __float2bfloat16_rn(0.0f);
    }
}

template <typename P>
static kiln_error *patchify(kiln_bf16 *cols, int64_t ld, const P *pixels, int64_t B, int64_t S, int64_t p,
                            void *stream, const char *what) {
    kiln_error *err = NULL;
    const int64_t G = p > 0 ? S / p : 0, rows = B * G * G;
    if (rows <= 0) return NULL;
    if (rows > INT32_MAX) return kiln_errorf(KILN_EINVAL, "%s: %lld patches (at most %d)", what, (long long)rows, INT32_MAX);
    if (ld < 3 * p * p || ld > INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "%s: row stride %lld for %lld columns", what, (long long)ld, (long long)(3 * p * p));
    kiln_launch(patchify_kernel<P>, (unsigned)rows, 128, 0, (cudaStream_t)stream, (bf16 *)cols, (int)ld, pixels,
                G * G, (int)G, (int)S, (int)p);
    LAUNCH_CHECK(what);
done:
    return err;
}

extern "C" kiln_error *kiln_clip_patchify_f32_cuda(kiln_bf16 *cols, int64_t ld, const float *pixels, int64_t B,
                                                   int64_t S, int64_t p, void *stream) {
    return patchify(cols, ld, pixels, B, S, p, stream, "patchify (f32 pixels)");
}

extern "C" kiln_error *kiln_clip_patchify_cuda(kiln_bf16 *cols, int64_t ld, const kiln_bf16 *pixels, int64_t B,
                                               int64_t S, int64_t p, void *stream) {
    return patchify(cols, ld, (const bf16 *)pixels, B, S, p, stream, "patchify");
}

// x [B, 1+G2, H] = [class; patches] + positions, in the residual stream's type X (one rounding when bf16); one
// block a token row (no per-element divisions, as in patchify)
template <typename X>
static __global__ void assemble_kernel(X *x, const bf16 *patches, const float *cls, const float *pos, int64_t G2,
                                       int H) {
    pdl_wait();
    const int64_t row = blockIdx.x, b = row / (G2 + 1);
    const int t = (int)(row - b * (G2 + 1));
    const float *pr = pos + (int64_t)t * H;
    const bf16 *src = patches + (t ? (b * G2 + t - 1) * H : 0);
    X *dst = x + row * H;
    for (int j = threadIdx.x; j < H; j += blockDim.x) st(dst, j, (t ? __bfloat162float(src[j]) : cls[j]) + pr[j]);
}

extern "C" kiln_error *kiln_clip_assemble_x_cuda(void *x, kiln_clip_dtype xt, const kiln_bf16 *patches,
                                                 const float *cls, const float *pos, int64_t B, int64_t G2, int64_t H,
                                                 void *stream) {
    kiln_error *err = NULL;
    const int64_t rows = B * (G2 + 1);
    cudaStream_t st = (cudaStream_t)stream;
    if (rows <= 0 || H <= 0) return NULL;
    if (rows > INT32_MAX || H > INT32_MAX)
        return kiln_errorf(KILN_EINVAL, "clip embedding assembly: %lld rows of %lld (at most %d each)", (long long)rows,
                           (long long)H, INT32_MAX);
    if (xt == KILN_CLIP_BF16)
        kiln_launch(assemble_kernel<bf16>, (unsigned)rows, 256, 0, st, (bf16 *)x, (const bf16 *)patches, cls, pos, G2,
                    (int)H);
    else kiln_launch(assemble_kernel<float>, (unsigned)rows, 256, 0, st, (float *)x, (const bf16 *)patches, cls, pos,
                     G2, (int)H);
    LAUNCH_CHECK("clip embedding assembly");
done:
    return err;
}

extern "C" kiln_error *kiln_clip_assemble_cuda(float *x, const kiln_bf16 *patches, const float *cls, const float *pos,
                                               int64_t B, int64_t G2, int64_t H, void *stream) {
    return kiln_clip_assemble_x_cuda(x, KILN_CLIP_F32, patches, cls, pos, B, G2, H, stream);
}

// y [rows, d] f32 = x / |x| per row (one warp per row)
static __global__ void l2norm_rows_kernel(float *y, const bf16 *x, int64_t rows, int64_t d) {
    pdl_wait();
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
    kiln_launch(l2norm_rows_kernel, grid_for(rows * 32, 256), 256, 0, (cudaStream_t)stream, y, (const bf16 *)x, rows,
                d);
    LAUNCH_CHECK("l2 normalize rows");
done:
    return err;
}

// page-locked host memory: the pixel staging buffer, so uploads run at the link's speed
extern "C" kiln_error *kiln_clip_pinned_alloc(void **p, size_t bytes) {
    kiln_error *err = NULL;
    *p = NULL;
    CUDA_TRY(cudaMallocHost(p, bytes));
done:
    return err;
}
extern "C" void kiln_clip_pinned_free(void *p) {
    if (p) cudaFreeHost(p);
}
