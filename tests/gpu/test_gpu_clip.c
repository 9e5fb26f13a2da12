/* CLIP on the GPU against the CPU (f32) path: the layernorm (f32 or bf16 residual stream in), attention
 * (cuDNN's fused flash attention, the tensor-core kernel and the batched-GEMM path, at CLIP's sequence lengths
 * and head dims; the class token's own kernel of the last layer), linear (bf16 out; accumulated into an f32
 * or a bf16 residual stream) and quick_gelu ops on random inputs, then whole vision towers (the transformers
 * fixtures, and random ViT-B/32- and L/14-shaped towers with more images than one chunk; chunks on one stream
 * and on two to four) with the bf16 and the f32 residual stream (KILN_CLIP_RESIDUAL), with and without patch embeddings (without: the last layer on the
 * class rows only), with cuDNN's attention and with kiln's own kernel. bf16 activations and weights:
 * embeddings are compared by cosine similarity per row (>= 0.998) and max |difference| (<= 4e-2 on unit
 * vectors); the class-rows-only last layer against the full one on the GPU closer (>= 0.9995, <= 2e-2). With KILN_CUDNN_LIB set (the GPU machine's build script sets it) cuDNN must run every
 * attention call whose head dim it takes (64 in the shaped towers). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "clip_testutil.h"
#include "cuda/clip_ops.h"
#include "gpu_testutil.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/nn.h"
#include "kiln/tune_cache.h"

TEST(gpu_clip_layernorm_and_attention_ops) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 21);
    const int64_t n = 300, d = 768;
    float *x = gt_rand(&rng, n * d, 3.0f), *w = gt_rand(&rng, d, 1.0f), *b = gt_rand(&rng, d, 1.0f);
    float *ref = malloc(sizeof(float) * n * d);
    kiln_layernorm_forward(ref, x, w, b, n, d, 1e-5f);
    float *dx = gt_up_f32(x, n * d), *dw = gt_up_f32(w, d), *db = gt_up_f32(b, d);
    kiln_bf16 *dy = gt_dev((size_t)n * d * 2);
    CHECK_OK(kiln_layernorm_forward_cuda(dy, dx, dw, db, n, d, 1e-5f, NULL));
    float *y = gt_down_bf16(dy, n * d);
    GT_CLOSE("layernorm", y, ref, n * d, 1e-2);
    CHECK_OK(kiln_layernorm_forward_f32_cuda(dx, dx, dw, db, n, d, 1e-5f, NULL)); /* in place, f32 */
    float *y32 = gt_down_f32(dx, n * d);
    GT_CLOSE("layernorm f32 in place", y32, ref, n * d, 1e-5);
    for (int causal = 0; causal < 2; causal++) {
        const int64_t B = 3, T = 257, heads = 4, hd = 64, H = heads * hd, stride = 3 * H;
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *out = malloc(sizeof(float) * B * T * H);
        gt_round_bf16(qkv, B * T * stride);
        CHECK(kiln_mha_forward(out, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, 0.125f, causal) == 0);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, causal, NULL));
        float *got = gt_down_bf16(dout, B * T * H);
        GT_CLOSE(causal ? "attention causal" : "attention", got, out, B * T * H, 1e-2);
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv), free(out), free(got);
    }
    kiln_cuda_free(dx), kiln_cuda_free(dw), kiln_cuda_free(db), kiln_cuda_free(dy);
    free(x), free(w), free(b), free(ref), free(y), free(y32);
}

TEST(gpu_clip_attention_kernel_shapes) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 23);
    /* B/32 (50 tokens), L/14 (257), L/14-336 (577), a partial tile (70); head dims 32, 64, 128 */
    const int64_t Ts[] = {50, 257, 577, 70, 1}, hds[] = {64, 64, 64, 32, 128};
    for (int c = 0; c < 5; c++) {
        const int64_t B = 2, T = Ts[c], hd = hds[c], heads = 3, H = heads * hd, stride = 3 * H;
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *ref = malloc(sizeof(float) * B * T * H);
        gt_round_bf16(qkv, B * T * stride);
        const float scale = (float)(1.0 / sqrt((double)hd));
        CHECK(kiln_mha_forward(ref, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, scale, 0) == 0);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        /* the default (cuDNN where it loads), kiln's kernel, the batched GEMMs */
        static const char *const paths[] = {"cudnn", "own", "gemm"};
        for (int path = 0; path < 3; path++) {
            setenv("KILN_CLIP_ATTN", paths[path], 1);
            CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, 0, NULL));
            unsetenv("KILN_CLIP_ATTN");
            float *got = gt_down_bf16(dout, B * T * H);
            char name[64];
            snprintf(name, sizeof name, "%s T=%lld hd=%lld (ran %s)", paths[path], (long long)T, (long long)hd,
                     kiln_clip_attention_last_impl());
            GT_CLOSE(name, got, ref, B * T * H, 1e-2);
            free(got);
        }
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv), free(ref);
    }
}

/* The class token's attention (the last layer without patch embeddings: one query per image and head over
 * its T keys, src/cuda/clip_attention_cls.cu) against row 0 of the CPU attention (kiln_mha_forward on the same
 * bf16 q/k/v, read in place from a fused [B·T, 3H] buffer) and row 0 of the GPU's full attention. Tolerance
 * 1e-2 relative to the largest output, as the full attention's (bf16 output: 2^-9 relative per value). L/14
 * (257 tokens, 16 heads of 64), L/14-336 (577), B/32 (50, 12 heads), head dims 32, 80, 128 and 256, one key,
 * output rows 2H apart; a head dim past 256 is refused. */
TEST(gpu_clip_attention_cls) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 27);
    const struct {
        int64_t B, T, heads, hd, out_mult;
    } cs[] = {{5, 257, 16, 64, 1}, {3, 577, 16, 64, 1}, {7, 50, 12, 64, 2}, {2, 70, 3, 32, 1},
              {2, 1, 2, 128, 1},   {2, 197, 2, 256, 1}, {3, 130, 2, 80, 2}};
    unsetenv("KILN_CLIP_ATTN");
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t B = cs[c].B, T = cs[c].T, heads = cs[c].heads, hd = cs[c].hd, H = heads * hd, stride = 3 * H,
                      os = cs[c].out_mult * H;
        const float scale = (float)(1.0 / sqrt((double)hd));
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *full = malloc(sizeof(float) * B * T * H);
        float *ref = malloc(sizeof(float) * B * H), *got = malloc(sizeof(float) * B * H);
        gt_round_bf16(qkv, B * T * stride);
        CHECK(kiln_mha_forward(full, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, scale, 0) == 0);
        for (int64_t b = 0; b < B; b++) memcpy(ref + b * H, full + b * T * H, sizeof(float) * H);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * os * 2),
                  *dfull = gt_dev((size_t)B * T * H * 2);
        CHECK_OK(kiln_clip_attention_cls_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, os, scale, NULL));
        float *o = gt_down_bf16(dout, B * os);
        for (int64_t b = 0; b < B; b++) memcpy(got + b * H, o + b * os, sizeof(float) * H);
        char name[80];
        snprintf(name, sizeof name, "cls T=%lld heads=%lld hd=%lld vs CPU", (long long)T, (long long)heads, (long long)hd);
        GT_CLOSE(name, got, ref, B * H, 1e-2);
        CHECK_OK(kiln_mha_forward_cuda(dfull, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, 0, NULL));
        float *gf = gt_down_bf16(dfull, B * T * H);
        for (int64_t b = 0; b < B; b++) memcpy(ref + b * H, gf + b * T * H, sizeof(float) * H);
        snprintf(name, sizeof name, "cls T=%lld hd=%lld vs GPU row 0 (%s)", (long long)T, (long long)hd,
                 kiln_clip_attention_last_impl());
        GT_CLOSE(name, got, ref, B * H, 1e-2);
        kiln_cuda_free(dq), kiln_cuda_free(dout), kiln_cuda_free(dfull);
        free(qkv), free(full), free(ref), free(got), free(o), free(gf);
    }
    kiln_bf16 *d = gt_dev(3 * 300 * 2 * 10);
    CHECK_ERR(kiln_clip_attention_cls_cuda(d, d, d, d, 1, 10, 1, 300, 900, 300, 0.1f, NULL), "head dim");
    kiln_cuda_free(d);
}

/* the embedding assembly x = [class; patches] + positions into an f32 and a bf16 residual stream, against the
 * CPU's sums: f32 exact to 1e-6, bf16 one rounding (2^-9 relative per value; 4e-3 of the largest) */
TEST(gpu_clip_assemble_f32_and_bf16) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 28);
    const int64_t B = 3, G2 = 49, T = G2 + 1, H = 96;
    float *pe = gt_rand(&rng, B * G2 * H, 2.0f), *cls = gt_rand(&rng, H, 1.0f), *pos = gt_rand(&rng, T * H, 1.0f);
    float *ref = malloc(sizeof(float) * B * T * H);
    gt_round_bf16(pe, B * G2 * H);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < H; j++)
                ref[(b * T + t) * H + j] = (t ? pe[(b * G2 + t - 1) * H + j] : cls[j]) + pos[t * H + j];
    kiln_bf16 *dpe = gt_up_bf16(pe, B * G2 * H), *dx16 = gt_dev((size_t)B * T * H * 2);
    float *dcls = gt_up_f32(cls, H), *dpos = gt_up_f32(pos, T * H), *dx = gt_dev(sizeof(float) * B * T * H);
    CHECK_OK(kiln_clip_assemble_x_cuda(dx, KILN_CLIP_F32, dpe, dcls, dpos, B, G2, H, NULL));
    CHECK_OK(kiln_clip_assemble_x_cuda(dx16, KILN_CLIP_BF16, dpe, dcls, dpos, B, G2, H, NULL));
    float *g32 = gt_down_f32(dx, B * T * H), *g16 = gt_down_bf16(dx16, B * T * H);
    GT_CLOSE("assembly f32", g32, ref, B * T * H, 1e-6);
    GT_CLOSE("assembly bf16", g16, ref, B * T * H, 4e-3);
    kiln_cuda_free(dpe), kiln_cuda_free(dx16), kiln_cuda_free(dcls), kiln_cuda_free(dpos), kiln_cuda_free(dx);
    free(pe), free(cls), free(pos), free(ref), free(g32), free(g16);
}

/* the patch im2col from f32 and bf16 pixels against a CPU loop in the weight's [c][ky][kx] order: exact (one
 * rounding to bf16 of each pixel), at B/32's, L/14's and B/16's patch sizes and an odd one, rows padded to 16
 * columns with zeros (as the tower runs them) and a wider stride (the pad columns start as NaN) */
TEST(gpu_clip_patchify_f32_and_bf16) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 29);
    const int64_t shapes[][3] = {{2, 64, 32}, {3, 56, 14}, {2, 48, 16}, {5, 21, 7}}; /* B, S, p */
    for (int c = 0; c < 8; c++) {
        const int64_t B = shapes[c / 2][0], S = shapes[c / 2][1], p = shapes[c / 2][2], G = S / p, K = 3 * p * p,
                      ld = c % 2 ? K + 24 : (K + 15) / 16 * 16, n = B * G * G * ld;
        float *px = gt_rand(&rng, B * 3 * S * S, 2.0f), *ref = calloc((size_t)n, sizeof(float));
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < G * G; g++)
                for (int64_t k = 0; k < K; k++) {
                    const int64_t ch = k / (p * p), ky = k / p % p, kx = k % p;
                    const float v = px[((b * 3 + ch) * S + g / G * p + ky) * S + g % G * p + kx];
                    ref[(b * G * G + g) * ld + k] = kiln_bf16_to_f32(kiln_f32_to_bf16(v));
                }
        float *dpx = gt_up_f32(px, B * 3 * S * S);
        kiln_bf16 *dpx16 = gt_up_bf16(px, B * 3 * S * S), *dcols = gt_dev((size_t)n * 2);
        CHECK(cudaMemset(dcols, 0xFF, (size_t)n * 2) == cudaSuccess); /* NaN: the pad columns must be written */
        CHECK_OK(kiln_clip_patchify_f32_cuda(dcols, ld, dpx, B, S, p, NULL));
        float *g32 = gt_down_bf16(dcols, n);
        CHECK(cudaMemset(dcols, 0xFF, (size_t)n * 2) == cudaSuccess);
        CHECK_OK(kiln_clip_patchify_cuda(dcols, ld, dpx16, B, S, p, NULL));
        float *g16 = gt_down_bf16(dcols, n);
        char name[80];
        snprintf(name, sizeof name, "patchify f32 S=%lld p=%lld ld=%lld", (long long)S, (long long)p, (long long)ld);
        GT_CLOSE(name, g32, ref, n, 0);
        snprintf(name, sizeof name, "patchify bf16 S=%lld p=%lld ld=%lld", (long long)S, (long long)p, (long long)ld);
        GT_CLOSE(name, g16, ref, n, 0);
        kiln_cuda_free(dpx), kiln_cuda_free(dpx16), kiln_cuda_free(dcols);
        free(px), free(ref), free(g32), free(g16);
    }
    CHECK_ERR(kiln_clip_patchify_cuda(NULL, 3 * 14 * 14 - 1, NULL, 1, 28, 14, NULL), "row stride");
}

/* whether cuDNN must have run: the GPU machine's build script points KILN_CUDNN_LIB at the library */
static int cudnn_expected(void) {
    const char *e = getenv("KILN_CUDNN_LIB");
    return e && *e;
}

/* The cuDNN plan cache past its size (KILN_CUDNN_PLANS=3 here, 64 by default): every new shape still runs
 * cuDNN (the least recently used plan is destroyed to make room), right to the same tolerance as the CPU, and
 * the first shape, evicted by then, gets a plan again. A full suite in one process met more than 64 shapes
 * (run r27), and every shape after them ran kiln's own kernel. */
TEST(gpu_clip_attention_cudnn_plan_cache) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 26);
    setenv("KILN_CUDNN_PLANS", "3", 1);
    setenv("KILN_CLIP_ATTN", "cudnn", 1); /* the default (auto) runs kiln's kernel at some of these lengths */
    const int64_t Ts[] = {40, 48, 56, 64, 72, 40}, B = 2, heads = 2, hd = 64, H = heads * hd, stride = 3 * H;
    for (int c = 0; c < 6; c++) {
        const int64_t T = Ts[c];
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *ref = malloc(sizeof(float) * B * T * H);
        gt_round_bf16(qkv, B * T * stride);
        CHECK(kiln_mha_forward(ref, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0) == 0);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
        float *got = gt_down_bf16(dout, B * T * H);
        const char *ran = kiln_clip_attention_last_impl();
        char name[64];
        snprintf(name, sizeof name, "shape %d: T=%lld (ran %s)", c + 1, (long long)T, ran);
        GT_CLOSE(name, got, ref, B * T * H, 1e-2);
        if (cudnn_expected()) CHECK_MSG(!strcmp(ran, "cudnn"), "%s: with a cache of 3 plans, cuDNN did not run", name);
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv), free(ref), free(got);
    }
    unsetenv("KILN_CUDNN_PLANS");
    unsetenv("KILN_CLIP_ATTN");
}

/* cuDNN's fused flash attention (KILN_CLIP_ATTN=cudnn; the default, auto, runs it where kiln's short-sequence
 * kernel is not faster) on q/k/v read in place from a fused
 * [B·T, 3H] projection, against the CPU (f32 from the same bf16 inputs) and kiln's own kernel: the shapes of
 * ViT-L/14 at 224 (257 tokens, 16 heads of 64) and 336 (577), B/16 (197, 12 heads), B/32 (50, 12 heads), and
 * the causal text tower (77 tokens). Image counts that are not powers of two run as power-of-two pieces
 * (5 = 4 + 1, 6 = 4 + 2, 3 = 2 + 1). Tolerance as the other paths: max |gpu - cpu| / max |cpu| <= 1e-2 (bf16
 * output, a relative rounding of 2^-9 each; P rounded to bf16 before P·V, as flash attention does); cuDNN
 * against the own kernel the same 1e-2 (two such roundings, in other orders). */
TEST(gpu_clip_attention_cudnn) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 25);
    const struct {
        int64_t B, T, heads, causal;
        const char *name;
    } cs[] = {{5, 257, 16, 0, "L/14"}, {2, 577, 16, 0, "L/14-336"}, {3, 197, 12, 0, "B/16"},
              {6, 50, 12, 0, "B/32"},  {3, 77, 12, 1, "text, causal"}, {3, 130, 4, 0, "T=130"}};
    setenv("KILN_CLIP_ATTN", "cudnn", 1);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t B = cs[c].B, T = cs[c].T, heads = cs[c].heads, hd = 64, H = heads * hd, stride = 3 * H;
        const int causal = (int)cs[c].causal;
        const float scale = 0.125f; /* 1/sqrt(64) */
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *ref = malloc(sizeof(float) * B * T * H);
        gt_round_bf16(qkv, B * T * stride);
        CHECK(kiln_mha_forward(ref, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, scale, causal) == 0);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, causal, NULL));
        const char *ran = kiln_clip_attention_last_impl();
        float *got = gt_down_bf16(dout, B * T * H);
        printf("    %s: B=%lld T=%lld heads=%lld ran %s\n", cs[c].name, (long long)B, (long long)T, (long long)heads,
               ran);
        if (cudnn_expected()) CHECK_MSG(!strcmp(ran, "cudnn"), "%s: attention ran %s, not cudnn", cs[c].name, ran);
        char name[64];
        snprintf(name, sizeof name, "%s vs CPU", cs[c].name);
        GT_CLOSE(name, got, ref, B * T * H, 1e-2);
        /* the same call again: the same bits expected (no atomics in the forward), printed */
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, causal, NULL));
        float *again = gt_down_bf16(dout, B * T * H);
        printf("    %s: second call %s\n", cs[c].name,
               memcmp(again, got, sizeof(float) * (size_t)(B * T * H)) ? "other bits" : "same bits");
        setenv("KILN_CLIP_ATTN", "own", 1);
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, scale, causal, NULL));
        setenv("KILN_CLIP_ATTN", "cudnn", 1);
        CHECK_MSG(strcmp(kiln_clip_attention_last_impl(), "cudnn") != 0, "KILN_CLIP_ATTN=own ran cudnn");
        float *own = gt_down_bf16(dout, B * T * H);
        snprintf(name, sizeof name, "%s own kernel vs CPU", cs[c].name);
        GT_CLOSE(name, own, ref, B * T * H, 1e-2);
        snprintf(name, sizeof name, "%s cuDNN vs own", cs[c].name);
        GT_CLOSE(name, got, own, B * T * H, 1e-2);
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv), free(ref), free(got), free(again), free(own);
    }
    /* a row stride cuDNN cannot take (not a multiple of 8 elements) falls back to the own path, same answers */
    {
        const int64_t B = 2, T = 50, heads = 2, hd = 64, H = heads * hd, stride = 3 * H + 4;
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f), *ref = malloc(sizeof(float) * B * T * H);
        gt_round_bf16(qkv, B * T * stride);
        CHECK(kiln_mha_forward(ref, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0) == 0);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
        printf("    row stride %lld: ran %s\n", (long long)stride, kiln_clip_attention_last_impl());
        CHECK(strcmp(kiln_clip_attention_last_impl(), "cudnn") != 0);
        float *got = gt_down_bf16(dout, B * T * H);
        GT_CLOSE("odd row stride (fallback)", got, ref, B * T * H, 1e-2);
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv), free(ref), free(got);
    }
    unsetenv("KILN_CLIP_ATTN");
}

/* Timings, printed and never asserted: cuDNN's forward, the default (auto: kiln's short-sequence kernel where
 * it is expected faster, else cuDNN) and the own kernels at the chunk shapes of the bench (64 L/14 images, 128
 * B/32 images) and at T = 256 beside 257 (how cuDNN's tiles meet the class token: 257 tokens are 3 tiles of 128
 * where 256 are 2). Mean of 10 calls after 2 warm-ups; TFLOP/s of the 4·B·H·T²·D useful FLOPs. */
TEST(gpu_clip_attention_timing) {
    const struct {
        int64_t B, T, heads;
    } cs[] = {{64, 257, 16}, {64, 256, 16}, {64, 240, 16}, {128, 50, 12}};
    static const char *const impls[] = {"cudnn", "auto", "own"};
    kiln_rng rng;
    kiln_rng_seed(&rng, 26);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t B = cs[c].B, T = cs[c].T, heads = cs[c].heads, hd = 64, H = heads * hd, stride = 3 * H;
        float *qkv = gt_rand(&rng, B * T * stride, 2.0f);
        kiln_bf16 *dq = gt_up_bf16(qkv, B * T * stride), *dout = gt_dev((size_t)B * T * H * 2);
        const double fl = 4.0 * (double)B * heads * (double)T * T * hd;
        for (int i = 0; i < 3; i++) {
            setenv("KILN_CLIP_ATTN", impls[i], 1);
            for (int r = 0; r < 2; r++)
                CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
            CHECK_OK(kiln_cuda_sync());
            const double t0 = gt_now_s();
            for (int r = 0; r < 10; r++)
                CHECK_OK(kiln_mha_forward_cuda(dout, dq, dq + H, dq + 2 * H, B, T, heads, hd, stride, H, 0.125f, 0, NULL));
            CHECK_OK(kiln_cuda_sync());
            const double ms = (gt_now_s() - t0) * 100;
            printf("    B=%lld T=%lld heads=%lld %-6s (ran %s): %.3f ms, %.0f TFLOP/s\n", (long long)B, (long long)T,
                   (long long)heads, impls[i], kiln_clip_attention_last_impl(), ms, fl / ms * 1e-9);
        }
        unsetenv("KILN_CLIP_ATTN");
        kiln_cuda_free(dq), kiln_cuda_free(dout);
        free(qkv);
    }
}

/* the line of the tuning cache whose key holds "|m 1024 1024 " (the plan's m n k), copied into line (its key
 * only: up to the tab); 0 when there is none */
static int cache_line(const char *path, int64_t m, char *line, size_t cap, long *value) {
    char *text = NULL, want[64];
    size_t len = 0;
    int hit = 0;
    snprintf(want, sizeof want, "|%lld 1024 1024 ", (long long)m);
    if (kiln_read_file(path, &text, &len)) return 0;
    for (char *l = text, *next; l && *l && !hit; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = 0;
        char *tab = strchr(l, '\t');
        if (tab && strstr(l, want) && (size_t)(tab - l) < cap) {
            memcpy(line, l, (size_t)(tab - l)), line[tab - l] = 0;
            *value = strtol(tab + 1, NULL, 10);
            hit = 1;
        }
    }
    free(text);
    return hit;
}

/* KILN_CLIP_GEMM_TUNE=cached: a large shape (>= 1e10 FLOP) is timed once and its pick stored in the tuning cache
 * (here under a fresh KILN_CACHE_DIR); a stored pick in range is used without timing or rewriting the file (same
 * inode); one out of range is timed again and replaced. Every result against the CPU. */
TEST(gpu_clip_linear_tuning_cache) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 31);
    const int64_t in = 1024, out = 1024, rows[3] = {8192, 8320, 8448}, nmax = 8448;
    float *x = gt_rand(&rng, nmax * in, 1.0f), *w = gt_rand(&rng, out * in, 0.05f), *b = gt_rand(&rng, out, 1.0f);
    float *ref = malloc(sizeof(float) * nmax * out);
    gt_round_bf16(x, nmax * in), gt_round_bf16(w, out * in), gt_round_bf16(b, out);
    kiln_linear_forward(ref, x, w, b, nmax, in, out);
    kiln_bf16 *dx = gt_up_bf16(x, nmax * in), *dw = gt_up_bf16(w, out * in), *db = gt_up_bf16(b, out);
    kiln_bf16 *dy = gt_dev((size_t)(nmax * out) * 2);
    const char *dir = test_join(test_tmpdir(), "cache"), *path = test_join(dir, "clip_gemm_tune.txt");
    char pathbuf[1024], key[600], key2[600];
    snprintf(pathbuf, sizeof pathbuf, "%s", path);
    setenv("KILN_CACHE_DIR", dir, 1);
    setenv("KILN_CLIP_GEMM_TUNE", "cached", 1);
    long v = -1, v2 = -1;
    struct stat s0, s1;
    /* 1: timed and stored */
    CHECK_OK(kiln_clip_linear_cuda(dy, 0, dx, dw, db, rows[0], in, out, 0, NULL));
    float *got = gt_down_bf16(dy, rows[0] * out);
    GT_CLOSE("linear, cached pick (timed)", got, ref, rows[0] * out, 1e-2);
    free(got);
    CHECK_MSG(cache_line(pathbuf, rows[0], key, sizeof key, &v) && v >= 0 && v < 16, "no valid line for m %lld in %s",
              (long long)rows[0], pathbuf);
    printf("    stored: %s -> candidate %ld\n", key, v);
    /* 2: the next shape's key stored out of range, 3: a valid pick stored: the key of 1 with m replaced */
    char *m0 = strstr(key, "|8192 1024 1024 ");
    CHECK(m0 != NULL);
    if (m0) {
        for (int r = 1; r < 3; r++) {
            snprintf(key2, sizeof key2, "%.*s|%lld%s", (int)(m0 - key), key, (long long)rows[r], m0 + 5);
            CHECK_OK(kiln_tune_cache_put(pathbuf, key2, r == 1 ? 99 : v));
        }
        CHECK(stat(pathbuf, &s0) == 0);
        CHECK_OK(kiln_clip_linear_cuda(dy, 0, dx, dw, db, rows[2], in, out, 0, NULL)); /* the stored pick */
        CHECK(stat(pathbuf, &s1) == 0 && s1.st_ino == s0.st_ino);
        got = gt_down_bf16(dy, rows[2] * out);
        GT_CLOSE("linear, cached pick (read)", got, ref, rows[2] * out, 1e-2);
        free(got);
        CHECK_OK(kiln_clip_linear_cuda(dy, 0, dx, dw, db, rows[1], in, out, 0, NULL)); /* 99: timed again */
        CHECK(cache_line(pathbuf, rows[1], key2, sizeof key2, &v2) && v2 >= 0 && v2 < 16);
        CHECK(stat(pathbuf, &s1) == 0 && s1.st_ino != s0.st_ino);
        got = gt_down_bf16(dy, rows[1] * out);
        GT_CLOSE("linear, cached pick (re-timed)", got, ref, rows[1] * out, 1e-2);
        free(got);
    }
    unsetenv("KILN_CLIP_GEMM_TUNE");
    unsetenv("KILN_CACHE_DIR");
    kiln_cuda_free(dx), kiln_cuda_free(dw), kiln_cuda_free(db), kiln_cuda_free(dy);
    free(x), free(w), free(b), free(ref);
}

TEST(gpu_clip_linear_and_quick_gelu) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 24);
    const int64_t n = 200, in = 256, out = 384;
    float *x = gt_rand(&rng, n * in, 1.0f), *w = gt_rand(&rng, out * in, 0.1f), *b = gt_rand(&rng, out, 1.0f);
    float *r0 = gt_rand(&rng, n * out, 1.0f), *ref = malloc(sizeof(float) * n * out);
    gt_round_bf16(x, n * in), gt_round_bf16(w, out * in), gt_round_bf16(b, out);
    kiln_bf16 *dx = gt_up_bf16(x, n * in), *dw = gt_up_bf16(w, out * in), *db = gt_up_bf16(b, out);
    kiln_bf16 *dy = gt_dev((size_t)n * out * 2);
    float *db32 = gt_up_f32(b, out), *dres = gt_up_f32(r0, n * out);
    /* bf16 out with the bias */
    kiln_linear_forward(ref, x, w, b, n, in, out);
    CHECK_OK(kiln_clip_linear_cuda(dy, 0, dx, dw, db, n, in, out, 0, NULL));
    float *got = gt_down_bf16(dy, n * out);
    GT_CLOSE("linear bf16 + bias", got, ref, n * out, 1e-2);
    /* a new shape (150 rows) with the algorithm chosen by timing (KILN_CLIP_GEMM_TUNE) */
    setenv("KILN_CLIP_GEMM_TUNE", "1", 1);
    CHECK_OK(kiln_clip_linear_cuda(dy, 0, dx, dw, db, 150, in, out, 0, NULL));
    unsetenv("KILN_CLIP_GEMM_TUNE");
    float *gt = gt_down_bf16(dy, 150 * out);
    GT_CLOSE("linear bf16 + bias, tuned", gt, ref, 150 * out, 1e-2);
    free(gt);
    /* f32 residual += x wᵀ + b */
    for (int64_t i = 0; i < n * out; i++) ref[i] += r0[i];
    CHECK_OK(kiln_clip_linear_cuda(dres, 1, dx, dw, db32, n, in, out, 1, NULL));
    float *got32 = gt_down_f32(dres, n * out);
    GT_CLOSE("linear f32 accumulate + bias", got32, ref, n * out, 1e-4);
    /* bf16 residual += x wᵀ + b (bf16 bias): the bf16 stream's epilogue, one rounding of the sum */
    {
        float *r16 = malloc(sizeof(float) * n * out), *ref16 = malloc(sizeof(float) * n * out);
        memcpy(r16, r0, sizeof(float) * n * out);
        gt_round_bf16(r16, n * out);
        kiln_linear_forward(ref16, x, w, b, n, in, out);
        for (int64_t i = 0; i < n * out; i++) ref16[i] += r16[i];
        kiln_bf16 *dr16 = gt_up_bf16(r16, n * out);
        CHECK_OK(kiln_clip_linear_cuda(dr16, 0, dx, dw, db, n, in, out, 1, NULL));
        float *g16 = gt_down_bf16(dr16, n * out);
        GT_CLOSE("linear bf16 accumulate + bias", g16, ref16, n * out, 1e-2);
        kiln_cuda_free(dr16);
        free(r16), free(ref16), free(g16);
    }
    /* quick_gelu, vectorized (n*out a multiple of 8) and not (an odd count) */
    for (int odd = 0; odd < 2; odd++) {
        int64_t m = n * out - odd;
        float *qr = malloc(sizeof(float) * m);
        for (int64_t i = 0; i < m; i++) qr[i] = got[i] / (1.0f + expf(-1.702f * got[i]));
        kiln_bf16 *dg = gt_up_bf16(got, m);
        CHECK_OK(kiln_quick_gelu_forward_cuda(dg, dg, m, NULL));
        float *g = gt_down_bf16(dg, m);
        GT_CLOSE(odd ? "quick_gelu (scalar)" : "quick_gelu (8-wide)", g, qr, m, 1e-2);
        kiln_cuda_free(dg);
        free(qr), free(g);
    }
    /* layernorm widths: the warp kernel (1024) and the block kernel (100), strided rows */
    const int64_t ds[] = {1024, 100};
    for (int c = 0; c < 2; c++) {
        const int64_t d = ds[c], rows = 37, xs = 3 * d;
        float *lx = gt_rand(&rng, rows * xs, 2.0f), *lw = gt_rand(&rng, d, 1.0f), *lb = gt_rand(&rng, d, 1.0f);
        float *lref = malloc(sizeof(float) * rows * d);
        for (int64_t r = 0; r < rows; r++) kiln_layernorm_forward(lref + r * d, lx + r * xs, lw, lb, 1, d, 1e-5f);
        float *dlx = gt_up_f32(lx, rows * xs), *dlw = gt_up_f32(lw, d), *dlb = gt_up_f32(lb, d);
        kiln_bf16 *dly = gt_dev((size_t)rows * d * 2);
        CHECK_OK(kiln_layernorm_forward_strided_cuda(dly, dlx, xs, dlw, dlb, rows, d, 1e-5f, NULL));
        float *ly = gt_down_bf16(dly, rows * d);
        GT_CLOSE(c ? "layernorm d=100 strided" : "layernorm d=1024 strided", ly, lref, rows * d, 1e-2);
        /* the bf16 residual stream's layernorms (kiln_clip_layernorm_cuda): bf16 in, strided, bf16 out; then
         * in place (contiguous), bf16 and f32 out; against the CPU on the same bf16 inputs */
        gt_round_bf16(lx, rows * xs);
        for (int64_t r = 0; r < rows; r++) kiln_layernorm_forward(lref + r * d, lx + r * xs, lw, lb, 1, d, 1e-5f);
        kiln_bf16 *dlx16 = gt_up_bf16(lx, rows * xs);
        CHECK_OK(kiln_clip_layernorm_cuda(dly, KILN_CLIP_BF16, dlx16, KILN_CLIP_BF16, xs, dlw, dlb, rows, d, 1e-5f, NULL));
        float *ly16 = gt_down_bf16(dly, rows * d);
        GT_CLOSE(c ? "layernorm bf16 in d=100 strided" : "layernorm bf16 in d=1024 strided", ly16, lref, rows * d, 1e-2);
        float *lc = malloc(sizeof(float) * rows * d); /* the rows made contiguous */
        for (int64_t r = 0; r < rows; r++) memcpy(lc + r * d, lx + r * xs, sizeof(float) * d);
        float *dly32 = gt_dev(sizeof(float) * rows * d);
        kiln_bf16 *dlc = gt_up_bf16(lc, rows * d);
        CHECK_OK(kiln_clip_layernorm_cuda(dly32, KILN_CLIP_F32, dlc, KILN_CLIP_BF16, d, dlw, dlb, rows, d, 1e-5f, NULL));
        float *ly32 = gt_down_f32(dly32, rows * d);
        GT_CLOSE(c ? "layernorm bf16 in f32 out d=100" : "layernorm bf16 in f32 out d=1024", ly32, lref, rows * d, 1e-5);
        CHECK_OK(kiln_clip_layernorm_cuda(dlc, KILN_CLIP_BF16, dlc, KILN_CLIP_BF16, d, dlw, dlb, rows, d, 1e-5f, NULL));
        float *lin = gt_down_bf16(dlc, rows * d);
        GT_CLOSE(c ? "layernorm bf16 in place d=100" : "layernorm bf16 in place d=1024", lin, lref, rows * d, 1e-2);
        kiln_cuda_free(dlx), kiln_cuda_free(dlw), kiln_cuda_free(dlb), kiln_cuda_free(dly), kiln_cuda_free(dlx16);
        kiln_cuda_free(dly32), kiln_cuda_free(dlc);
        free(lx), free(lw), free(lb), free(lref), free(ly), free(ly16), free(lc), free(ly32), free(lin);
    }
    kiln_cuda_free(dx), kiln_cuda_free(dw), kiln_cuda_free(db), kiln_cuda_free(dy), kiln_cuda_free(db32);
    kiln_cuda_free(dres);
    free(x), free(w), free(b), free(r0), free(ref), free(got), free(got32);
}

/* cosine per row, max |a-b| and max |a-b| / max |b| over rows of d: worst cosine >= min_cos, max |a-b| <= max_d */
static void compare_rows_tol(const char *what, const float *a, const float *b, int64_t rows, int64_t d, double min_cos,
                             double max_d) {
    double worst_cos = 1, maxd = 0, maxb = 0;
    for (int64_t r = 0; r < rows; r++) {
        double dot = 0, na = 0, nb = 0;
        for (int64_t j = 0; j < d; j++) {
            dot += (double)a[r * d + j] * b[r * d + j];
            na += (double)a[r * d + j] * a[r * d + j];
            nb += (double)b[r * d + j] * b[r * d + j];
            maxd = fmax(maxd, fabs(a[r * d + j] - b[r * d + j]));
            maxb = fmax(maxb, fabs(b[r * d + j]));
        }
        double cs = dot / sqrt(na * nb + 1e-30);
        if (!(cs >= worst_cos)) worst_cos = cs;
    }
    printf("    %-40s worst cosine %.6f, max |diff| %.3g, max rel err %.3g\n", what, worst_cos, maxd,
           maxb > 0 ? maxd / maxb : maxd);
    CHECK_MSG(worst_cos >= min_cos && maxd <= max_d, "%s: worst cosine %.6f, max |diff| %.3g", what, worst_cos, maxd);
}

/* the GPU's embeddings against the CPU's: bf16 weights and activations */
static void compare_rows(const char *what, const float *a, const float *b, int64_t rows, int64_t d) {
    compare_rows_tol(what, a, b, rows, d, 0.998, 4e-2);
}

/* expect_cudnn: the tower's head dim is one cuDNN takes, so with KILN_CUDNN_LIB set its attention must be cuDNN's
 * or, where the default (auto) prefers it, kiln's short-sequence kernel: not a fallback */
static void check_dir(const char *dir, int n, uint64_t seed, int expect_cudnn) {
    kiln_clip *m = NULL;
    CHECK_OK(kiln_clip_load(dir, &m));
    if (!m) return;
    int64_t S = kiln_clip_image_size(m), D = kiln_clip_dim(m), G2 = (int64_t)kiln_clip_grid(m) * kiln_clip_grid(m);
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    float *px = gt_rand(&rng, n * 3 * S * S, 2.0f);
    float *ce = malloc(sizeof(float) * n * D), *cp = malloc(sizeof(float) * n * G2 * D);
    float *ge = malloc(sizeof(float) * n * D), *gp = malloc(sizeof(float) * n * G2 * D), *ge2 = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, px, n, ce, cp));
    CHECK_OK(kiln_clip_set_device(m, "cuda"));
    /* both residual streams (the f32 one first: the default bf16 one's results stay for the checks below) */
    for (int rs = 0; rs < 2; rs++) {
        setenv("KILN_CLIP_RESIDUAL", rs ? "bf16" : "f32", 1);
        printf("    residual stream %s\n", rs ? "bf16" : "f32");
        /* kiln's own attention kernels first, then the default (auto: the short-sequence kernel where it beats
         * cuDNN's tiles, else cuDNN's where it loads) */
        setenv("KILN_CLIP_ATTN", "own", 1);
        CHECK_OK(kiln_clip_embed_images(m, px, n, ge, gp));
        unsetenv("KILN_CLIP_ATTN");
        printf("    attention: %s\n", kiln_clip_attention_last_impl());
        compare_rows("image embeds, own attention", ge, ce, n, D);
        compare_rows("patch embeds, own attention", gp, cp, n * G2, D);
        CHECK_OK(kiln_clip_embed_images(m, px, n, ge, gp));
        const char *ran = kiln_clip_attention_last_impl();
        printf("    attention: %s\n", ran);
        if (expect_cudnn && cudnn_expected())
            CHECK_MSG(!strcmp(ran, "cudnn") || !strcmp(ran, "short"), "the tower's attention ran %s", ran);
        CHECK_OK(kiln_clip_embed_images(m, px, n, ge2, NULL)); /* the last layer on the class rows only */
        compare_rows("image embeds", ge, ce, n, D);
        compare_rows("image embeds (no patches)", ge2, ce, n, D);
        compare_rows("patch embeds", gp, cp, n * G2, D);
        /* the class-rows-only last layer against the full one, both on the GPU: the same math; other GEMM
         * shapes and the class token's own attention kernel round differently */
        compare_rows_tol("no patches vs patches (GPU)", ge2, ge, n, D, 0.9995, 2e-2);
    }
    unsetenv("KILN_CLIP_RESIDUAL"); /* the default (bf16) below */
    setenv("KILN_CLIP_RESIDUAL", "fp8", 1);
    CHECK_ERR(kiln_clip_embed_images(m, px, n, ge, NULL), "KILN_CLIP_RESIDUAL");
    unsetenv("KILN_CLIP_RESIDUAL");
    /* the same from page-locked and from device pixels (the same chunks: the bits are expected equal and
     * reported), and in chunks of 3
     * (the upload of one chunk overlapping the previous one's compute, both pixel slots reused; other GEMM
     * shapes may sum in another order, so against the CPU again) */
    float *pin = NULL, *ge3 = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_pixels_alloc(m, n, &pin));
    if (pin) {
        memcpy(pin, px, sizeof(float) * n * 3 * S * S);
        CHECK_OK(kiln_clip_embed_images(m, pin, n, ge3, NULL));
        compare_rows("page-locked pixels", ge3, ce, n, D);
        printf("    page-locked pixels: %s\n", memcmp(ge3, ge2, sizeof(float) * n * D) ? "other bits than pageable" : "same bits");
        setenv("KILN_CLIP_CHUNK", "3", 1);
        memset(ge3, 0, sizeof(float) * n * D);
        setenv("KILN_CLIP_STREAMS", "1", 1);
        CHECK_OK(kiln_clip_embed_images(m, pin, n, ge3, NULL));
        compare_rows("chunks of 3, one stream, page-locked", ge3, ce, n, D);
        /* consecutive chunks on two streams (the default), three and four (KILN_CLIP_STREAMS): the same kernels
         * on the same shapes, so the same bits as one stream; a workspace or buffer shared between the streams
         * would not keep them */
        float *ge4 = malloc(sizeof(float) * n * D);
        const char *lanes[] = {"2", "3", "4"};
        for (int v = 0; v < 3; v++)
            for (int pl = 0; pl < 2; pl++) {
                char what[96];
                setenv("KILN_CLIP_STREAMS", lanes[v], 1);
                snprintf(what, sizeof what, "chunks of 3, %s streams%s", lanes[v], pl ? ", pageable" : "");
                memset(ge4, 0, sizeof(float) * n * D);
                CHECK_OK(kiln_clip_embed_images(m, pl ? px : pin, n, ge4, NULL));
                compare_rows(what, ge4, ce, n, D);
                CHECK_MSG(!memcmp(ge4, ge3, sizeof(float) * n * D), "%s: other bits than one stream", what);
            }
        unsetenv("KILN_CLIP_STREAMS");
        free(ge4);
        memset(ge3, 0, sizeof(float) * n * D);
        CHECK_OK(kiln_clip_embed_images(m, px, n, ge3, NULL));
        compare_rows("chunks of 3, pageable", ge3, ce, n, D);
        float *gp3 = malloc(sizeof(float) * n * G2 * D);
        CHECK_OK(kiln_clip_embed_images(m, px, n, ge3, gp3));
        compare_rows("chunks of 3, patches", gp3, cp, n * G2, D);
        free(gp3);
        unsetenv("KILN_CLIP_CHUNK");
        kiln_clip_pixels_free(pin);
    }
    float *dpx = gt_up_f32(px, n * 3 * S * S);
    memset(ge3, 0, sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, dpx, n, ge3, NULL));
    compare_rows("device pixels", ge3, ce, n, D);
    printf("    device pixels: %s\n", memcmp(ge3, ge2, sizeof(float) * n * D) ? "other bits than pageable" : "same bits");
    kiln_cuda_free(dpx);
    free(ge3);
    CHECK_OK(kiln_clip_set_device(m, "cpu"));
    CHECK_ERR(kiln_clip_set_device(m, "tpu"), "expected \"cpu\" or \"cuda\"");
    kiln_clip_free(m);
    free(px), free(ce), free(cp), free(ge), free(gp), free(ge2);
}

TEST(gpu_clip_fixtures_match_cpu) {
    const char *names[] = {"tiny_quickgelu", "tiny_gelu", "tiny_bf16"};
    for (int i = 0; i < 3; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/fixtures/clip/%s", names[i]);
        printf("    %s\n", names[i]);
        check_dir(test_src_path(rel), 5, 30 + i, 0);
    }
}

TEST(gpu_clip_b32_and_l14_shapes_match_cpu) {
    clip_test_cfg c = clip_test_default;
    c.vis_hidden = 256, c.vis_heads = 4, c.vis_inter = 1024, c.vis_layers = 3, c.image_size = 224, c.patch_size = 32;
    c.proj_dim = 128, c.shortest_edge = 224;
    const char *dir = test_tmpdir();
    CHECK(clip_test_make_dir(dir, &c, 40) == 0);
    printf("    B/32-shaped, 70 images\n");
    check_dir(dir, 70, 41, 1);
    c.patch_size = 14, c.vis_layers = 2, c.vis_heads = 2, c.vis_hidden = 128, c.vis_inter = 512;
    const char *dir2 = test_join(dir, "l14");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir2);
    CHECK(system(cmd) == 0);
    CHECK(clip_test_make_dir(dir2, &c, 42) == 0);
    printf("    L/14-shaped (257 tokens)\n");
    check_dir(dir2, 6, 43, 1);
}
