/* CLIP: the new ops (layernorm, multi-head attention) against naive float64 loops; CLIP's tokenizer
 * pipeline on a hand-made vocabulary; the whole model (both towers, patch embeddings, f32 and bf16
 * weights, quick_gelu and gelu, legacy and new end-token pooling) against a float64 reference
 * written here from the HF definitions; preprocessing; bad directories. The fixture tests compare
 * with transformers itself (tests/fixtures/clip, made by make_clip_fixtures.py on the GPU machine). */
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clip_testutil.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/json.h"
#include "kiln/nn.h"
#include "kiln/rng.h"
#include "kiln/safetensors.h"
#include "kiln/tokenizer.h"
#include "test.h"

/* max |a - b| / max |b| (NaN: infinite), b given as doubles (bd) or floats (bf) */
static double rel_err_of(const float *a, const double *bd, const float *bf, size_t n) {
    double md = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        const double bi = bd ? bd[i] : (double)bf[i], d = fabs((double)a[i] - bi);
        if (d > md || d != d) md = d != d ? INFINITY : d;
        if (fabs(bi) > mx) mx = fabs(bi);
    }
    return mx > 0 ? md / mx : md;
}
static double rel_err(const float *a, const double *b, size_t n) { return rel_err_of(a, b, NULL, n); }
static double rel_err_ff(const float *a, const float *b, size_t n) { return rel_err_of(a, NULL, b, n); }

static void randn(float *x, size_t n, uint64_t seed, double scale) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * kiln_rng_normal(&r));
}

/* ---------------------------------------------------------------- ops */

/* the vector ISAs the ops may run (src/nn/simd.h); each test below runs in every one this CPU has */
static const char *const clip_isas[] = {"generic", "avx2", "avx512"};

/* y = layernorm(x) * w + b over rows of d, eps 1e-5, in float64 */
static void ref_ln(double *y, const double *x, const double *w, const double *b, int n, int d) {
    for (int i = 0; i < n; i++) {
        double m = 0, v = 0;
        for (int j = 0; j < d; j++) m += x[i * d + j];
        m /= d;
        for (int j = 0; j < d; j++) v += (x[i * d + j] - m) * (x[i * d + j] - m);
        v /= d;
        for (int j = 0; j < d; j++) y[i * d + j] = (x[i * d + j] - m) / sqrt(v + 1e-5) * w[j] + b[j];
    }
}

static void check_layernorm(void) {
    int64_t n = 7, d = 301;
    float *x = malloc(sizeof(float) * n * d), *w = malloc(sizeof(float) * d), *b = malloc(sizeof(float) * d),
          *y = malloc(sizeof(float) * n * d);
    double *ref = malloc(sizeof(double) * n * d);
    randn(x, (size_t)(n * d), 1, 3.0);
    for (int64_t i = 0; i < n * d; i++) x[i] += 5.0f; /* an offset the mean must remove */
    randn(w, (size_t)d, 2, 1.0);
    randn(b, (size_t)d, 3, 1.0);
    kiln_layernorm_forward(y, x, w, b, n, d, 1e-5f);
    double *in = malloc(sizeof(double) * (n + 2) * d); /* x, w and b as doubles, for ref_ln */
    for (int64_t i = 0; i < n * d; i++) in[i] = x[i];
    for (int64_t j = 0; j < d; j++) in[n * d + j] = w[j], in[(n + 1) * d + j] = b[j];
    ref_ln(ref, in, in + n * d, in + (n + 1) * d, (int)n, (int)d);
    free(in);
    CHECK(rel_err(y, ref, (size_t)(n * d)) < 1e-6);
    kiln_layernorm_forward(x, x, w, b, n, d, 1e-5f); /* in place */
    CHECK(memcmp(x, y, sizeof(float) * n * d) == 0);
    free(x), free(w), free(b), free(y), free(ref);
}

TEST(clip_op_layernorm_matches_float64) {
    for (int i = 0; i < 3; i++)
        if (!kiln_simd_set_isa(clip_isas[i])) check_layernorm();
    kiln_simd_set_isa(NULL);
}

static void check_mha(int causal) {
    int64_t B = 3, T = 11, heads = 4, hd = 8, H = heads * hd, stride = 3 * H;
    float *qkv = malloc(sizeof(float) * B * T * stride), *out = malloc(sizeof(float) * B * T * H);
    double *ref = malloc(sizeof(double) * B * T * H), *p = malloc(sizeof(double) * T);
    randn(qkv, (size_t)(B * T * stride), 10 + causal, 1.0);
    float scale = 1.0f / sqrtf((float)hd);
    CHECK(kiln_mha_forward(out, qkv, qkv + H, qkv + 2 * H, B, T, heads, hd, stride, H, scale, causal) == 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < T; i++) {
                double mx = -1e300, s = 0;
                int64_t n = causal ? i + 1 : T;
                for (int64_t j = 0; j < n; j++) {
                    double d = 0;
                    for (int64_t k = 0; k < hd; k++)
                        d += (double)qkv[(b * T + i) * stride + h * hd + k] * qkv[(b * T + j) * stride + H + h * hd + k];
                    p[j] = d * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < n; j++) s += (p[j] = exp(p[j] - mx));
                for (int64_t k = 0; k < hd; k++) {
                    double o = 0;
                    for (int64_t j = 0; j < n; j++) o += p[j] / s * qkv[(b * T + j) * stride + 2 * H + h * hd + k];
                    ref[(b * T + i) * H + h * hd + k] = o;
                }
            }
    double e = rel_err(out, ref, (size_t)(B * T * H));
    CHECK_MSG(e < 1e-5, "causal=%d, %s: relative error %g", causal, kiln_simd_isa(), e);
    free(qkv), free(out), free(ref), free(p);
}

TEST(clip_op_attention_matches_float64) {
    for (int i = 0; i < 3; i++)
        if (!kiln_simd_set_isa(clip_isas[i])) {
            check_mha(0);
            check_mha(1);
        }
    kiln_simd_set_isa(NULL);
}

/* ---------------------------------------------------------------- tokenizer */

static void expect_ids(kiln_tokenizer *t, const char *text, const int64_t *want, size_t nwant) {
    int64_t *ids = NULL;
    size_t n = 0;
    kiln_error *e = kiln_tokenizer_encode(t, text, strlen(text), &ids, &n);
    if (e) {
        test_fail(__FILE__, __LINE__, "encode '%s': %s", text, kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    int same = n == nwant;
    for (size_t i = 0; i < n && same; i++) same = ids[i] == want[i];
    if (!same) {
        char got[512] = "";
        for (size_t i = 0; i < n && strlen(got) < 480; i++) snprintf(got + strlen(got), 512 - strlen(got), "%lld ", (long long)ids[i]);
        test_fail(__FILE__, __LINE__, "encode '%s': got [%s], %zu ids expected", text, got, nwant);
    }
    free(ids);
}

#define IDS(t, text, ...)                                            \
    do {                                                             \
        const int64_t w_[] = {__VA_ARGS__};                          \
        expect_ids(t, text, w_, sizeof w_ / sizeof w_[0]);           \
    } while (0)

TEST(clip_tokenizer_pipeline_by_hand) {
    const char *dir = test_tmpdir();
    const char *p = test_join(dir, "tokenizer.json");
    CHECK(clip_test_write_tokenizer(p) == 0);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(p, &t));
    if (!t) return;
    int64_t the = 513, cat = 522, photo = 520, of = 516, W = 256; /* W + byte: the byte ending a word */
    /* Lowercase + whitespace runs + the split regex; "the</w>" from t h -> th, th e</w> -> the</w> */
    IDS(t, "The  THE\tthe\n", the, the, the);
    IDS(t, "a photo of a cat", W + 'a', photo, of, W + 'a', cat);
    /* contractions split off, one digit per word, punctuation runs kept together */
    IDS(t, "it's 42!!", 'i', W + 't', '\'', W + 's', W + '4', W + '2', '!', W + '!');
    IDS(t, "cat.", cat, W + '.');
    /* special tokens are cut out first */
    IDS(t, "cat<|endoftext|>", cat, CLIP_TEST_EOS);
    /* é (C3 A9) as byte-level characters: Ã then ©</w>; É lowercases to é first */
    IDS(t, "\xC3\x89", 0xC3, W + 0xA9);
    int64_t *ids = NULL;
    size_t n = 9;
    CHECK_OK(kiln_tokenizer_encode(t, "  \t ", 4, &ids, &n));
    CHECK(n == 0);
    free(ids);
    kiln_tokenizer_free(t);
}

/* ---------------------------------------------------------------- float64 reference model */

typedef struct {
    kiln_st *st;
} ref_model;

static double *W(ref_model *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static double *W(ref_model *r, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const kiln_st_tensor *t = kiln_st_find(r->st, name);
    if (!t) {
        test_fail(__FILE__, __LINE__, "reference: tensor %s missing", name);
        return calloc(1, sizeof(double));
    }
    float *f = malloc(sizeof(float) * (size_t)t->numel);
    double *d = malloc(sizeof(double) * (size_t)t->numel);
    kiln_error *e = kiln_st_read_f32(t, f, (size_t)t->numel);
    if (e) kiln_error_free(e);
    for (int64_t i = 0; i < t->numel; i++) d[i] = f[i];
    free(f);
    return d;
}

/* y[n,o] = x[n,i] w[o,i]^T + b */
static void ref_lin(double *y, const double *x, const double *w, const double *b, int n, int in, int out) {
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int k = 0; k < in; k++) s += x[r * in + k] * w[o * in + k];
            y[r * out + o] = s;
        }
}

/* one HF CLIPEncoderLayer over x[T,H] in place */
static void ref_layer(ref_model *r, const char *tower, int l, double *x, int T, int H, int heads, int I, int gelu,
                      int causal) {
    double *ln1w = W(r, "%s.encoder.layers.%d.layer_norm1.weight", tower, l), *ln1b = W(r, "%s.encoder.layers.%d.layer_norm1.bias", tower, l);
    double *qw = W(r, "%s.encoder.layers.%d.self_attn.q_proj.weight", tower, l), *qb = W(r, "%s.encoder.layers.%d.self_attn.q_proj.bias", tower, l);
    double *kw = W(r, "%s.encoder.layers.%d.self_attn.k_proj.weight", tower, l), *kb = W(r, "%s.encoder.layers.%d.self_attn.k_proj.bias", tower, l);
    double *vw = W(r, "%s.encoder.layers.%d.self_attn.v_proj.weight", tower, l), *vb = W(r, "%s.encoder.layers.%d.self_attn.v_proj.bias", tower, l);
    double *ow = W(r, "%s.encoder.layers.%d.self_attn.out_proj.weight", tower, l), *ob = W(r, "%s.encoder.layers.%d.self_attn.out_proj.bias", tower, l);
    double *ln2w = W(r, "%s.encoder.layers.%d.layer_norm2.weight", tower, l), *ln2b = W(r, "%s.encoder.layers.%d.layer_norm2.bias", tower, l);
    double *f1w = W(r, "%s.encoder.layers.%d.mlp.fc1.weight", tower, l), *f1b = W(r, "%s.encoder.layers.%d.mlp.fc1.bias", tower, l);
    double *f2w = W(r, "%s.encoder.layers.%d.mlp.fc2.weight", tower, l), *f2b = W(r, "%s.encoder.layers.%d.mlp.fc2.bias", tower, l);
    double *h = malloc(sizeof(double) * T * H), *q = malloc(sizeof(double) * T * H), *k = malloc(sizeof(double) * T * H),
           *v = malloc(sizeof(double) * T * H), *a = malloc(sizeof(double) * T * H), *m = malloc(sizeof(double) * T * I),
           *p = malloc(sizeof(double) * T);
    int hd = H / heads;
    ref_ln(h, x, ln1w, ln1b, T, H);
    ref_lin(q, h, qw, qb, T, H, H);
    ref_lin(k, h, kw, kb, T, H, H);
    ref_lin(v, h, vw, vb, T, H, H);
    for (int hh = 0; hh < heads; hh++)
        for (int i = 0; i < T; i++) {
            double mx = -1e300, s = 0;
            for (int j = 0; j < T; j++) {
                double d = 0;
                for (int c = 0; c < hd; c++) d += q[i * H + hh * hd + c] * k[j * H + hh * hd + c];
                p[j] = (causal && j > i) ? -INFINITY : d / sqrt((double)hd);
                if (p[j] > mx) mx = p[j];
            }
            for (int j = 0; j < T; j++) s += (p[j] = exp(p[j] - mx));
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int j = 0; j < T; j++) o += p[j] / s * v[j * H + hh * hd + c];
                a[i * H + hh * hd + c] = o;
            }
        }
    ref_lin(h, a, ow, ob, T, H, H);
    for (int i = 0; i < T * H; i++) x[i] += h[i];
    ref_ln(h, x, ln2w, ln2b, T, H);
    ref_lin(m, h, f1w, f1b, T, H, I);
    for (int i = 0; i < T * I; i++) m[i] = gelu ? 0.5 * m[i] * (1 + erf(m[i] / sqrt(2.0))) : m[i] / (1 + exp(-1.702 * m[i]));
    ref_lin(h, m, f2w, f2b, T, I, H);
    for (int i = 0; i < T * H; i++) x[i] += h[i];
    double *all[] = {ln1w, ln1b, qw, qb, kw, kb, vw, vb, ow, ob, ln2w, ln2b, f1w, f1b, f2w, f2b, h, q, k, v, a, m, p};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void ref_normalize(double *v, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += v[i] * v[i];
    for (int i = 0; i < d; i++) v[i] /= sqrt(s);
}

/* text embedding of ids[T] (pooled at position `at`) */
static void ref_text(ref_model *r, const clip_test_cfg *c, const int64_t *ids, int T, int at, double *out) {
    int H = c->text_hidden;
    double *tok = W(r, "text_model.embeddings.token_embedding.weight"), *pos = W(r, "text_model.embeddings.position_embedding.weight");
    double *x = malloc(sizeof(double) * T * H), *y = malloc(sizeof(double) * H);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < H; j++) x[t * H + j] = tok[ids[t] * H + j] + pos[t * H + j];
    for (int l = 0; l < c->text_layers; l++)
        ref_layer(r, "text_model", l, x, T, H, c->text_heads, c->text_inter, !strcmp(c->act, "gelu"), 1);
    double *fw = W(r, "text_model.final_layer_norm.weight"), *fb = W(r, "text_model.final_layer_norm.bias"),
           *pw = W(r, "text_projection.weight");
    ref_ln(y, x + at * H, fw, fb, 1, H);
    ref_lin(out, y, pw, NULL, 1, H, c->proj_dim);
    ref_normalize(out, c->proj_dim);
    free(tok), free(pos), free(x), free(y), free(fw), free(fb), free(pw);
}

/* image embedding and patch embeddings of pixels[3,S,S] */
static void ref_image(ref_model *r, const clip_test_cfg *c, const float *px, double *out, double *patches) {
    int H = c->vis_hidden, S = c->image_size, p = c->patch_size, G = S / p, T = G * G + 1, D = c->proj_dim;
    double *cls = W(r, "vision_model.embeddings.class_embedding"), *pw = W(r, "vision_model.embeddings.patch_embedding.weight"),
           *pos = W(r, "vision_model.embeddings.position_embedding.weight"), *prew = W(r, "vision_model.pre_layrnorm.weight"),
           *preb = W(r, "vision_model.pre_layrnorm.bias"), *postw = W(r, "vision_model.post_layernorm.weight"),
           *postb = W(r, "vision_model.post_layernorm.bias"), *proj = W(r, "visual_projection.weight");
    double *x = malloc(sizeof(double) * T * H), *y = malloc(sizeof(double) * T * H);
    for (int j = 0; j < H; j++) x[j] = cls[j];
    for (int gy = 0; gy < G; gy++)
        for (int gx = 0; gx < G; gx++)
            for (int o = 0; o < H; o++) {
                double s = 0; /* Conv2d(3, H, p, stride p, no bias) */
                for (int ch = 0; ch < 3; ch++)
                    for (int ky = 0; ky < p; ky++)
                        for (int kx = 0; kx < p; kx++)
                            s += pw[((o * 3 + ch) * p + ky) * p + kx] * px[(ch * S + gy * p + ky) * S + gx * p + kx];
                x[(1 + gy * G + gx) * H + o] = s;
            }
    for (int i = 0; i < T * H; i++) x[i] += pos[i];
    ref_ln(y, x, prew, preb, T, H);
    memcpy(x, y, sizeof(double) * T * H);
    for (int l = 0; l < c->vis_layers; l++)
        ref_layer(r, "vision_model", l, x, T, H, c->vis_heads, c->vis_inter, !strcmp(c->act, "gelu"), 0);
    ref_ln(y, x, postw, postb, T, H);
    ref_lin(out, y, proj, NULL, 1, H, D);
    ref_normalize(out, D);
    for (int t = 1; t < T; t++) {
        ref_lin(patches + (t - 1) * D, y + t * H, proj, NULL, 1, H, D);
        ref_normalize(patches + (t - 1) * D, D);
    }
    double *all[] = {cls, pw, pos, prew, preb, postw, postb, proj, x, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void check_model(const clip_test_cfg *c, uint64_t seed) {
    const char *dir = test_tmpdir();
    CHECK(clip_test_make_dir(dir, c, seed) == 0);
    kiln_clip *m = NULL;
    CHECK_OK(kiln_clip_load(dir, &m));
    if (!m) return;
    int D = c->proj_dim, S = c->image_size, G = S / c->patch_size, n = 3;
    CHECK(kiln_clip_dim(m) == D && kiln_clip_image_size(m) == S && kiln_clip_grid(m) == G);
    CHECK_NEAR(kiln_clip_logit_scale(m), exp(2.0), 1e-4);
    ref_model r;
    CHECK_OK(kiln_st_open(test_join(dir, "model.safetensors"), &r.st));

    float *px = malloc(sizeof(float) * n * 3 * S * S), *emb = malloc(sizeof(float) * n * D),
          *pat = malloc(sizeof(float) * n * G * G * D);
    double *rp = malloc(sizeof(double) * n * G * G * D), *re = malloc(sizeof(double) * n * D);
    randn(px, (size_t)(n * 3 * S * S), seed + 1, 1.0);
    CHECK_OK(kiln_clip_embed_images(m, px, n, emb, pat));
    for (int i = 0; i < n; i++) ref_image(&r, c, px + i * 3 * S * S, re + i * D, rp + i * G * G * D);
    double ei = rel_err(emb, re, (size_t)(n * D)), ep = rel_err(pat, rp, (size_t)(n * G * G * D));
    CHECK_MSG(ei < 1e-4 && ep < 1e-4, "image embeds rel err %g, patch embeds %g", ei, ep);
    /* patches are optional: without them the last layer runs on the class rows only (other GEMM shapes,
     * the same arithmetic per row) */
    float *emb2 = malloc(sizeof(float) * n * D), *emb1 = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, px, n, emb1, NULL));
    double e1 = rel_err_ff(emb1, emb, (size_t)(n * D));
    CHECK_MSG(e1 <= 1e-5, "image embeds without patches vs with: rel err %g", e1);
    /* pixels from kiln_clip_pixels_alloc (plain memory on the CPU): the same bits */
    float *apx = NULL;
    CHECK_OK(kiln_clip_pixels_alloc(m, n, &apx));
    if (apx) {
        memcpy(apx, px, sizeof(float) * n * 3 * S * S);
        memset(emb2, 0, sizeof(float) * n * D);
        CHECK_OK(kiln_clip_embed_images(m, apx, n, emb2, NULL));
        CHECK(memcmp(emb1, emb2, sizeof(float) * n * D) == 0);
        kiln_clip_pixels_free(apx);
    }
    kiln_clip_pixels_free(NULL);
    /* the CPU tower keeps its activation buffers in the model: calls may overlap (one takes them, the
     * others allocate their own), and a call with more images than they hold replaces them */
    float *embc = malloc(sizeof(float) * 4 * n * D);
    int errs = 0;
#pragma omp parallel for schedule(static, 1) num_threads(4) reduction(+ : errs)
    for (int t = 0; t < 4; t++) {
        kiln_error *ce = kiln_clip_embed_images(m, px, t % 2 ? n : 1, embc + t * n * D, NULL);
        if (ce) errs++, kiln_error_free(ce);
    }
    CHECK(errs == 0);
    kiln_clip *m2 = NULL;
    CHECK_OK(kiln_clip_load(dir, &m2));
    if (m2) {
        CHECK_OK(kiln_clip_embed_images(m2, px, 1, emb2, NULL));
        CHECK_OK(kiln_clip_embed_images(m2, px, n, emb2, NULL));
        kiln_clip_free(m2);
    }
    double mxe = 0; /* every call below ran without patches: compared with the first such call (emb1) */
    for (int i = 0; i < n * D; i++) mxe = fmax(mxe, fabs(emb1[i]));
    for (int t = 0; t < 5; t++) {
        int k = t == 4 || t % 2 ? n : 1, bad = 0;
        for (int i = 0; i < k * D; i++) {
            float v = t < 4 ? embc[t * n * D + i] : emb2[i];
            bad += !(fabs(v - emb1[i]) <= 1e-6 * mxe); /* NaN counts */
        }
        CHECK_MSG(bad == 0, "call %d of %d images: %d values differ from the first call's", t, k, bad);
    }
    free(embc);

    /* texts: pooled at <|endoftext|> (also a literal one mid-text: HF picks the first) */
    const char *texts[] = {"a photo of a cat", "The THE and", "x<|endoftext|> then more words", ""};
    int nt = 4;
    float *te = malloc(sizeof(float) * nt * D);
    double *rt = malloc(sizeof(double) * nt * D);
    CHECK_OK(kiln_clip_embed_texts(m, texts, nt, te));
    kiln_tokenizer *tok = NULL;
    CHECK_OK(kiln_tokenizer_load(test_join(dir, "tokenizer.json"), &tok));
    for (int i = 0; i < nt && tok; i++) {
        int64_t *ids = NULL, full[80];
        size_t k = 0;
        CHECK_OK(kiln_tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids, &k));
        full[0] = CLIP_TEST_BOS;
        for (size_t j = 0; j < k; j++) full[j + 1] = ids[j];
        full[k + 1] = CLIP_TEST_EOS;
        int T = (int)k + 2, at = T - 1;
        if (c->eos_token_id == 2) { /* legacy: argmax of the ids, first maximum */
            at = 0;
            for (int j = 1; j < T; j++)
                if (full[j] > full[at]) at = j;
        } else {
            for (int j = T - 1; j >= 0; j--)
                if (full[j] == CLIP_TEST_EOS) at = j;
        }
        if (i == 2) CHECK(at == 2); /* x, <|endoftext|> */
        ref_text(&r, c, full, T, at, rt + i * D);
        free(ids);
    }
    double et = rel_err(te, rt, (size_t)(nt * D));
    CHECK_MSG(et < 1e-4, "text embeds rel err %g", et);
    /* a text longer than 77 tokens is truncated, as HF's truncation=True does */
    char longtext[2000] = "";
    for (int i = 0; i < 120; i++) strcat(longtext, "cat ");
    const char *lt[] = {longtext};
    CHECK_OK(kiln_clip_embed_texts(m, lt, 1, te));
    kiln_tokenizer_free(tok);
    kiln_st_close(r.st);
    kiln_clip_free(m);
    free(px), free(emb), free(emb1), free(emb2), free(pat), free(rp), free(re), free(te), free(rt);
}

TEST(clip_model_matches_float64_reference) {
    check_model(&clip_test_default, 100);
}

TEST(clip_model_gelu_bf16_legacy_eos_matches_reference) {
    clip_test_cfg c = clip_test_default;
    c.act = "gelu";
    c.bf16 = 1;
    c.eos_token_id = 2;
    c.text_hidden = 24, c.text_heads = 2, c.text_layers = 3;
    c.vis_hidden = 40, c.vis_heads = 5, c.image_size = 28, c.patch_size = 7, c.proj_dim = 12, c.shortest_edge = 28;
    check_model(&c, 200);
}

/* The vision tower's last layer on the class rows only (image embeddings without patch embeddings) against
 * the full last layer (the same images with patch embeddings asked for): the same math, other GEMM shapes
 * and the class query's attention by its own loop, so equal to float rounding (rel. err <= 1e-5). ViT-B/32-
 * and L/14-like geometry (50 and 257 tokens) at tiny widths; 17 images: a full chunk of 16 and an odd one,
 * and 5 images in one chunk. */
TEST(clip_class_rows_last_layer_matches_full) {
    clip_test_cfg cs[2] = {clip_test_default, clip_test_default};
    cs[0].vis_hidden = 64, cs[0].vis_heads = 4, cs[0].vis_inter = 256, cs[0].vis_layers = 3;
    cs[0].image_size = 224, cs[0].patch_size = 32, cs[0].shortest_edge = 224; /* B/32: 50 tokens */
    cs[1] = cs[0];
    cs[1].vis_heads = 2, cs[1].vis_layers = 2, cs[1].patch_size = 14; /* L/14: 257 tokens, head dim 32 */
    for (int c = 0; c < 2; c++) {
        const char *dir = test_join(test_tmpdir(), c ? "l14" : "b32");
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        CHECK(system(cmd) == 0);
        CHECK(clip_test_make_dir(dir, &cs[c], 300 + c) == 0);
        kiln_clip *m = NULL;
        CHECK_OK(kiln_clip_load(dir, &m));
        if (!m) continue;
        int64_t S = cs[c].image_size, G = S / cs[c].patch_size, D = cs[c].proj_dim;
        const int ns[] = {17, 5};
        for (int k = 0; k < 2; k++) {
            int64_t n = ns[k];
            float *px = malloc(sizeof(float) * n * 3 * S * S), *full = malloc(sizeof(float) * n * D),
                  *pat = malloc(sizeof(float) * n * G * G * D), *cls = malloc(sizeof(float) * n * D);
            randn(px, (size_t)(n * 3 * S * S), 310 + c * 2 + k, 1.0);
            CHECK_OK(kiln_clip_embed_images(m, px, (int)n, full, pat));
            CHECK_OK(kiln_clip_embed_images(m, px, (int)n, cls, NULL));
            double e = rel_err_ff(cls, full, (size_t)(n * D));
            printf("    %s, %lld images: class rows only vs full last layer: rel err %.3g\n", c ? "L/14-like" : "B/32-like",
                   (long long)n, e);
            CHECK_MSG(e <= 1e-5, "%s, %lld images: rel err %g", c ? "L/14-like" : "B/32-like", (long long)n, e);
            free(px), free(full), free(pat), free(cls);
        }
        kiln_clip_free(m);
    }
}

/* ---------------------------------------------------------------- preprocessing */

TEST(clip_preprocess_layout_crop_and_padding) {
    clip_test_cfg c = clip_test_default; /* S = 32, shortest_edge 36 */
    const char *dir = test_tmpdir();
    CHECK(clip_test_make_dir(dir, &c, 7) == 0);
    kiln_clip *m = NULL;
    CHECK_OK(kiln_clip_load(dir, &m));
    if (!m) return;
    int S = 32;
    static const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, sd[3] = {0.26862954, 0.26130258, 0.27577711};
    float *px = malloc(sizeof(float) * 3 * S * S);
    /* a constant image of any shape gives the constant, normalized */
    kiln_image img = {.width = 50, .height = 90, .rgb = malloc(50 * 90 * 3)};
    for (int i = 0; i < 50 * 90; i++) img.rgb[3 * i] = 10, img.rgb[3 * i + 1] = 200, img.rgb[3 * i + 2] = 255;
    CHECK_OK(kiln_clip_preprocess(m, &img, px));
    int v[3] = {10, 200, 255}, bad = 0;
    for (int ch = 0; ch < 3; ch++)
        for (int i = 0; i < S * S; i++) bad += fabs(px[ch * S * S + i] - (v[ch] / 255.0 - mean[ch]) / sd[ch]) > 1e-5;
    CHECK_MSG(bad == 0, "%d values differ", bad);
    /* a 36x36 image is not resized (shortest edge 36): the crop takes rows/cols 2..33 as they are */
    kiln_image sq = {.width = 36, .height = 36, .rgb = malloc(36 * 36 * 3)};
    for (int i = 0; i < 36 * 36 * 3; i++) sq.rgb[i] = (uint8_t)(i * 7919 % 251);
    CHECK_OK(kiln_clip_preprocess(m, &sq, px));
    bad = 0;
    for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                double want = (sq.rgb[((y + 2) * 36 + x + 2) * 3 + ch] / 255.0 - mean[ch]) / sd[ch];
                bad += fabs(px[(ch * S + y) * S + x] - want) > 1e-5;
            }
    CHECK_MSG(bad == 0, "crop/layout: %d values differ", bad);
    kiln_clip_free(m);
    /* crop larger than the resize: HF pads with zeros (before normalisation) */
    c.shortest_edge = 30;
    const char *dir2 = test_join(dir, "pad");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir2);
    CHECK(system(cmd) == 0);
    CHECK(clip_test_make_dir(dir2, &c, 7) == 0);
    CHECK_OK(kiln_clip_load(dir2, &m));
    if (!m) return;
    CHECK_OK(kiln_clip_preprocess(m, &img, px)); /* 50x90 -> 30x54, crop 32x32: 1 zero column each side */
    for (int ch = 0; ch < 3; ch++) {
        CHECK_NEAR(px[(ch * S + 5) * S + 0], (0 - mean[ch]) / sd[ch], 1e-5);
        CHECK_NEAR(px[(ch * S + 5) * S + 31], (0 - mean[ch]) / sd[ch], 1e-5);
        CHECK_NEAR(px[(ch * S + 5) * S + 1], (v[ch] / 255.0 - mean[ch]) / sd[ch], 1e-5);
    }
    kiln_clip_free(m);
    free(px), free(img.rgb), free(sq.rgb);
}

/* ---------------------------------------------------------------- bad directories */

static void rewrite(const char *path, const char *from, const char *to) {
    char *d = NULL;
    size_t n;
    CHECK_OK(kiln_read_file(path, &d, &n));
    if (!d) return;
    char *at = strstr(d, from);
    CHECK(at != NULL);
    if (at) {
        FILE *f = fopen(path, "wb");
        fwrite(d, 1, (size_t)(at - d), f);
        fputs(to, f);
        fputs(at + strlen(from), f);
        fclose(f);
    }
    free(d);
}

/* With the first `from` in the file at path replaced by `to`, loading dir fails naming want; path is
 * restored after. */
static void load_fails_with(const char *dir, const char *path, const char *from, const char *to, const char *want) {
    kiln_clip *m = NULL;
    rewrite(path, from, to);
    CHECK_ERR(kiln_clip_load(dir, &m), want);
    rewrite(path, to, from);
}

TEST(clip_load_errors_name_the_problem) {
    const char *dir = test_tmpdir();
    kiln_clip *m = NULL;
    CHECK_ERR(kiln_clip_load(dir, &m), "config.json");
    CHECK(clip_test_make_dir(dir, &clip_test_default, 3) == 0);
    const char *cfg = test_join(dir, "config.json"), *pre = test_join(dir, "preprocessor_config.json");
    load_fails_with(dir, cfg, "\"model_type\":\"clip\"", "\"model_type\":\"siglip\"",
                    "model_type is \"siglip\", not \"clip\"");
    /* the text tower's (the first) layer count: one layer too many, one too few */
    load_fails_with(dir, cfg, "\"num_hidden_layers\":2", "\"num_hidden_layers\":3",
                    "tensor 'text_model.encoder.layers.2.layer_norm1.weight' is missing");
    load_fails_with(dir, cfg, "\"num_hidden_layers\":2", "\"num_hidden_layers\":1",
                    "unexpected tensor 'text_model.encoder.layers.1.");
    load_fails_with(dir, cfg, "\"projection_dim\":16", "\"projection_dim\":17",
                    "tensor 'text_projection.weight' has shape [16,32], config.json says [17,32]");
    load_fails_with(dir, pre, "\"height\":32,\"width\":32", "\"height\":30,\"width\":32",
                    "the processor makes 32x30 images, vision_config.image_size is 32");
    load_fails_with(dir, pre, "\"resample\":3", "\"resample\":2", "resample 2 is not supported");
    /* numbers out of range are errors before any conversion (the class fuzzing found in configs, docs/fuzzing.md) */
    load_fails_with(dir, pre, "\"crop_size\":{\"height\":32,\"width\":32}", "\"crop_size\":1e10",
                    "crop_size must be a positive integer up to 16777216");
    load_fails_with(dir, pre, "\"crop_size\":{\"height\":32,\"width\":32}", "\"crop_size\":32.5",
                    "crop_size must be a positive integer");
    load_fails_with(dir, cfg, "\"layer_norm_eps\":1e-05}}", "\"layer_norm_eps\":-1e-05}}",
                    "vision_config: field 'layer_norm_eps' = -1e-05 must not be negative");
    load_fails_with(dir, cfg, "\"vocab_size\":", "\"vocab_size\":-", "field 'vocab_size' = -");
    CHECK_OK(kiln_clip_load(dir, &m));
    /* devices: "cpu" always works; "cuda" works or says why (no CUDA build, no device) */
    CHECK_OK(kiln_clip_set_device(m, "cpu"));
    CHECK_ERR(kiln_clip_set_device(m, "tpu"), "CLIP device \"tpu\": expected \"cpu\" or \"cuda\"");
    kiln_error *de = kiln_clip_set_device(m, "cuda");
    if (de) {
        CHECK(strstr(kiln_error_msg(de), "CUDA") != NULL || strstr(kiln_error_msg(de), "cuda") != NULL);
        kiln_error_free(de);
    }
    CHECK_OK(kiln_clip_set_device(m, "cpu"));
    /* a bad text is named by its index, the first in input order */
    const char *texts[] = {"fine", "bad \xff utf-8", "fine", "also bad \xfe"};
    float emb[4 * 16];
    CHECK_ERR(kiln_clip_embed_texts(m, texts, 4, emb), "text 1:");
    kiln_clip_free(m);
    m = NULL;
    CHECK(remove(test_join(dir, "tokenizer.json")) == 0);
    CHECK_ERR(kiln_clip_load(dir, &m), "tokenizer.json");
    CHECK(m == NULL);
}

/* ---- the model's identity (kiln_clip_id, src/clip/clip_id.c) ---- */

/* XXH64 against libxxhash's values (bytes i*7+1, lengths across every tail case, two seeds), and the
 * streaming form against the one-shot for every split */
TEST(clip_id_xxh64_matches_xxhash) {
    static const struct {
        size_t n;
        uint64_t seed, want;
    } v[] = {{0, 0, 0xef46db3751d8e999ULL},    {1, 0, 0x8a4127811b21e730ULL},    {3, 0, 0xb6e6c910c2fd373aULL},
             {4, 0, 0x22eda2cf6af4c124ULL},    {8, 0, 0xc6f1803a5e0b3222ULL},    {31, 0, 0x6ab1c40e29f50073ULL},
             {32, 0, 0x5a0756fbe9ecd3d1ULL},   {33, 0, 0xdc50cdc37bb9c183ULL},   {100, 0, 0xd248bfc5208b0b16ULL},
             {1000, 0, 0x6be03acbf959c413ULL}, {0, 0x9e3779b97f4a7c15ULL, 0xc4349fc93c010000ULL},
             {1, 0x9e3779b97f4a7c15ULL, 0x32888f619f930a8fULL},  {3, 0x9e3779b97f4a7c15ULL, 0xac68126d7acfce15ULL},
             {4, 0x9e3779b97f4a7c15ULL, 0xd8d778ded6ee56b4ULL},  {8, 0x9e3779b97f4a7c15ULL, 0x81c06e0c87ca2c12ULL},
             {31, 0x9e3779b97f4a7c15ULL, 0x407e1b0246aa4c89ULL}, {32, 0x9e3779b97f4a7c15ULL, 0x0fdbc75cbf63f5bdULL},
             {33, 0x9e3779b97f4a7c15ULL, 0x199870762697ae29ULL}, {100, 0x9e3779b97f4a7c15ULL, 0x8d818c65ab873d61ULL},
             {1000, 0x9e3779b97f4a7c15ULL, 0xc7fe574d3ee26a09ULL}};
    unsigned char b[1000];
    for (int i = 0; i < 1000; i++) b[i] = (unsigned char)(i * 7 + 1);
    CHECK(kiln_xxh64("abc", 3, 0) == 0x44bc2cf5ad770999ULL);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        CHECK_MSG(kiln_xxh64(b, v[i].n, v[i].seed) == v[i].want, "n %zu seed %llx: %016llx", v[i].n,
                  (unsigned long long)v[i].seed, (unsigned long long)kiln_xxh64(b, v[i].n, v[i].seed));
        for (size_t a = 0; a <= v[i].n; a += v[i].n > 40 ? 13 : 1)
            for (size_t c = a; c <= v[i].n; c += v[i].n > 40 ? 29 : 1) {
                kiln_xxh64_state s;
                kiln_xxh64_init(&s, v[i].seed);
                kiln_xxh64_update(&s, b, a);
                kiln_xxh64_update(&s, b + a, c - a);
                kiln_xxh64_update(&s, b + c, v[i].n - c);
                if (kiln_xxh64_digest(&s) != v[i].want) {
                    CHECK_MSG(0, "streaming n %zu split at %zu, %zu", v[i].n, a, c);
                    return;
                }
            }
    }
}

static int id_of(const char *dir, char *id, size_t cap) {
    kiln_clip *m = NULL;
    kiln_error *e = kiln_clip_load(dir, &m);
    if (e) {
        CHECK_MSG(0, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return -1;
    }
    snprintf(id, cap, "%s", kiln_clip_id(m));
    kiln_clip_free(m);
    return 0;
}

/* flip bit `bit` of byte `off` of the file's data section (after the header), keeping its size and times */
static void flip_data_bit(const char *path, size_t off, int bit) {
    struct stat st;
    CHECK(stat(path, &st) == 0);
    FILE *f = fopen(path, "r+b");
    unsigned char h8[8], c;
    CHECK(f && fread(h8, 1, 8, f) == 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | h8[i];
    CHECK(fseek(f, (long)(8 + hl + off), SEEK_SET) == 0 && fread(&c, 1, 1, f) == 1);
    c ^= (unsigned char)(1u << bit);
    CHECK(fseek(f, (long)(8 + hl + off), SEEK_SET) == 0 && fwrite(&c, 1, 1, f) == 1);
    fclose(f);
    struct timespec t[2] = {st.st_atim, st.st_mtim};
    CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
}

/* The id is a content hash of what the model is: the same bytes give the same id (another directory,
 * any thread count, tensors resharded and reordered); any changed weight bit, another checkpoint of the
 * same shapes, or a changed config/tokenizer file gives another, whatever the files' sizes and times. */
TEST(clip_id_is_the_models_content) {
    const char *d = test_tmpdir();
    char a[512], b[512], c[512], cmd[2048], id0[40], id[40];
    snprintf(a, sizeof a, "%s/a", d);
    snprintf(b, sizeof b, "%s/b", d);
    snprintf(c, sizeof c, "%s/c", d);
    mkdir(a, 0755), mkdir(b, 0755), mkdir(c, 0755);
    if (clip_test_make_dir(a, &clip_test_default, 11) || clip_test_make_dir(b, &clip_test_default, 12)) {
        CHECK_MSG(0, "could not write the tiny CLIPs");
        return;
    }
    if (id_of(a, id0, sizeof id0)) return;
    CHECK_MSG(!strncmp(id0, "xxh64:", 6) && strlen(id0) == 22, "%s", id0);
    /* another checkpoint of the same shapes (the same file sizes) */
    CHECK(!id_of(b, id, sizeof id) && strcmp(id, id0));
    /* the same files elsewhere, on one thread */
    snprintf(cmd, sizeof cmd, "cp -p '%s'/* '%s'/", a, c);
    CHECK(system(cmd) == 0);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(!id_of(c, id, sizeof id) && !strcmp(id, id0));
    omp_set_num_threads(threads > 1 ? threads : 3);
    CHECK(!id_of(c, id, sizeof id) && !strcmp(id, id0));
    omp_set_num_threads(threads);
    /* one weight's sign, or two (in FNV-1a over 8-byte words, h = (h ^ w) * p, two words' top bits cancel:
     * a multiplication carries bits only upwards), with the file's size and times kept */
    const char *st_c = test_join(c, "model.safetensors");
    size_t size = 0;
    {
        kiln_st *st = NULL;
        CHECK_OK(kiln_st_open(st_c, &st));
        if (!st) return;
        for (size_t i = 0; i < kiln_st_count(st); i++) size += kiln_st_at(st, i)->nbytes;
        kiln_st_close(st);
    }
    /* byte 7 of a 64-bit word: an f32's sign bit, and the top bit of the word */
    size_t off1 = ((size - 4096) & ~(size_t)7) | 7, off2 = ((size / 2) & ~(size_t)7) | 7;
    flip_data_bit(st_c, off1, 7);
    CHECK(!id_of(c, id, sizeof id) && strcmp(id, id0));
    flip_data_bit(st_c, off2, 7);
    CHECK(!id_of(c, id, sizeof id) && strcmp(id, id0));
    flip_data_bit(st_c, off1, 7);
    flip_data_bit(st_c, off2, 7);
    CHECK(!id_of(c, id, sizeof id) && !strcmp(id, id0));
    /* the tokenizer and config files count; files of other kinds do not */
    FILE *f = fopen(test_join(c, "README.md"), "w");
    fputs("notes\n", f), fclose(f);
    CHECK(!id_of(c, id, sizeof id) && !strcmp(id, id0));
    f = fopen(test_join(c, "tokenizer.json"), "a");
    fputs(" ", f), fclose(f);
    CHECK(!id_of(c, id, sizeof id) && strcmp(id, id0));
    snprintf(cmd, sizeof cmd, "cp -p '%s/tokenizer.json' '%s/'", a, c);
    CHECK(system(cmd) == 0 && !id_of(c, id, sizeof id) && !strcmp(id, id0));
    /* resharded: the tensors in two files in reverse order, with an index */
    {
        kiln_st *st = NULL;
        CHECK_OK(kiln_st_open(st_c, &st));
        if (!st) return;
        size_t n = kiln_st_count(st), half = n / 2;
        kiln_st_entry *e = calloc(n, sizeof *e);
        char *index = malloc(256 * n + 64); /* names are < 128 bytes */
        size_t k = (size_t)sprintf(index, "{\"metadata\": {}, \"weight_map\": {");
        for (size_t i = 0; i < n; i++) {
            const kiln_st_tensor *t = kiln_st_at(st, n - 1 - i);
            e[i] = (kiln_st_entry){t->name, t->dtype, t->ndim, t->shape, t->data};
            k += (size_t)sprintf(index + k, "%s\"%s\": \"%s\"", i ? ", " : "", t->name,
                                 i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
        }
        sprintf(index + k, "}}\n");
        CHECK_OK(kiln_st_write(test_join(b, "model-00001-of-00002.safetensors"), e, half, NULL));
        CHECK_OK(kiln_st_write(test_join(b, "model-00002-of-00002.safetensors"), e + half, n - half, NULL));
        f = fopen(test_join(b, "model.safetensors.index.json"), "w");
        fputs(index, f), fclose(f);
        free(index), free(e);
        kiln_st_close(st);
        CHECK(remove(test_join(b, "model.safetensors")) == 0);
        CHECK(!id_of(b, id, sizeof id) && !strcmp(id, id0));
    }
}
