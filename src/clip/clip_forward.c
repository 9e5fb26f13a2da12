/* The CLIP towers on CPU: pre-LN transformer layers (LN -> fused qkv GEMM -> attention -> out
 * projection, residual; LN -> fc1 -> activation -> fc2, residual), the text tower's causal mask
 * and end-token pooling, the vision tower's patch embedding (im2col + GEMM), class token,
 * pre_layrnorm and post_layernorm, then the projections and L2 normalisation. GEMMs go through
 * OpenBLAS; the rest runs on OpenMP threads. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/nn.h"

/* scratch for one layer over n rows */
typedef struct {
    float *h, *qkv, *att, *mlp;
} scratch;

static int scratch_alloc(scratch *s, int64_t n, const clip_tower_cfg *c) {
    int64_t H = c->hidden;
    s->h = malloc(sizeof(float) * (size_t)(n * H));
    s->qkv = malloc(sizeof(float) * (size_t)(n * 3 * H));
    s->att = malloc(sizeof(float) * (size_t)(n * H));
    s->mlp = malloc(sizeof(float) * (size_t)(n * c->inter));
    return s->h && s->qkv && s->att && s->mlp ? 0 : -1;
}

static void scratch_free(scratch *s) {
    free(s->h);
    free(s->qkv);
    free(s->att);
    free(s->mlp);
}

static void activation(float *x, int64_t n, int act) {
    if (act == CLIP_ACT_GELU) {
        kiln_gelu_forward(x, x, n);
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (act == CLIP_ACT_QUICK_GELU) x[i] = v / (1.0f + expf(-1.702f * v));
        else x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}

static void add_into(float *x, const float *y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* x [B, T, H] in place through one encoder layer */
static int layer_forward(float *x, int64_t B, int64_t T, const clip_tower_cfg *c, const clip_layer *L, scratch *s,
                         int causal) {
    int64_t n = B * T, H = c->hidden, hd = H / c->heads;
    kiln_layernorm_forward(s->h, x, L->ln1_w, L->ln1_b, n, H, (float)c->eps);
    kiln_linear_forward(s->qkv, s->h, L->qkv_w, L->qkv_b, n, H, 3 * H);
    if (kiln_mha_forward(s->att, s->qkv, s->qkv + H, s->qkv + 2 * H, B, T, c->heads, hd, 3 * H, H,
                         (float)(1.0 / sqrt((double)hd)), causal))
        return -1;
    kiln_linear_forward(s->h, s->att, L->o_w, L->o_b, n, H, H);
    add_into(x, s->h, n * H);
    kiln_layernorm_forward(s->h, x, L->ln2_w, L->ln2_b, n, H, (float)c->eps);
    kiln_linear_forward(s->mlp, s->h, L->fc1_w, L->fc1_b, n, H, c->inter);
    activation(s->mlp, n * c->inter, c->act);
    kiln_linear_forward(s->h, s->mlp, L->fc2_w, L->fc2_b, n, c->inter, H);
    add_into(x, s->h, n * H);
    return 0;
}

static void l2_normalize(float *v, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += (double)v[r * d + j] * v[r * d + j];
        float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int64_t j = 0; j < d; j++) v[r * d + j] *= inv;
    }
}

/* One text through the tower into out[D]; x and s are the caller's scratch for max_pos tokens. */
static kiln_error *embed_one_text(kiln_clip *m, const char *text, float *out, float *x, float *pooled, scratch *s) {
    const clip_tower_cfg *c = &m->text;
    int64_t H = c->hidden, D = m->proj_dim;
    int64_t *ids = NULL;
    int T = 0;
    KILN_TRY(kiln_clip_text_ids(m, text, &ids, &T));
    for (int t = 0; t < T; t++) {
        const float *te = m->tok_emb + ids[t] * H, *pe = m->tpos_emb + (int64_t)t * H;
        for (int64_t j = 0; j < H; j++) x[t * H + j] = te[j] + pe[j];
    }
    for (int l = 0; l < c->layers; l++)
        if (layer_forward(x, 1, T, c, &m->tl[l], s, 1)) {
            free(ids);
            return kiln_errorf(KILN_ENOMEM, "CLIP text: out of memory");
        }
    int at = kiln_clip_eos_index(m, ids, T);
    kiln_layernorm_forward(pooled, x + (int64_t)at * H, m->final_ln_w, m->final_ln_b, 1, H, (float)c->eps);
    kiln_linear_forward(out, pooled, m->text_proj, NULL, 1, H, D);
    l2_normalize(out, 1, D);
    free(ids);
    return NULL;
}

/* Texts run one per thread (each at most max_pos tokens: too small to split across threads, and the
 * causal mask makes padding them into a batch pointless); OpenBLAS runs single-threaded inside. */
kiln_error *kiln_clip_embed_texts(kiln_clip *m, const char *const *texts, int n, float *out) {
    const clip_tower_cfg *c = &m->text;
    int64_t H = c->hidden, D = m->proj_dim;
    kiln_error *first = NULL;
    int first_at = n;
#pragma omp parallel if (n > 1)
    {
        scratch s = {0};
        float *x = malloc(sizeof(float) * (size_t)(c->max_pos * H)), *pooled = malloc(sizeof(float) * (size_t)H);
        int ok = x && pooled && !scratch_alloc(&s, c->max_pos, c);
#pragma omp for schedule(dynamic)
        for (int i = 0; i < n; i++) {
            kiln_error *e = ok ? embed_one_text(m, texts[i], out + (int64_t)i * D, x, pooled, &s)
                               : kiln_errorf(KILN_ENOMEM, "CLIP text: out of memory");
            if (e) {
                e = kiln_error_wrap(e, "text %d", i);
#pragma omp critical(kiln_clip_text_error)
                {
                    /* report the first failing text in input order, whatever thread saw it */
                    if (i < first_at) {
                        kiln_error_free(first);
                        first = e;
                        first_at = i;
                        e = NULL;
                    }
                }
                kiln_error_free(e);
            }
        }
        scratch_free(&s);
        free(x);
        free(pooled);
    }
    return first;
}

/* x [B, 1 + G*G, H]: class token then the patches (conv with stride = kernel = p, no bias, as
 * im2col rows in the weight's [c][ky][kx] order), plus position embeddings */
static void vision_embed(const kiln_clip *m, const float *pixels, int64_t B, float *x, float *cols) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G = S / p, H = c->hidden, K = 3 * p * p, T = G * G + 1;
#pragma omp parallel for collapse(2) schedule(static) if (B * G * G * K > 65536)
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < G * G; g++) {
            int64_t gy = g / G, gx = g % G;
            float *row = cols + (b * G * G + g) * K;
            for (int64_t ch = 0; ch < 3; ch++)
                for (int64_t ky = 0; ky < p; ky++)
                    memcpy(row + (ch * p + ky) * p, pixels + ((b * 3 + ch) * S + gy * p + ky) * S + gx * p,
                           sizeof(float) * (size_t)p);
        }
    /* patches land in rows 1..G*G of each image: one GEMM per image keeps the class row free */
    for (int64_t b = 0; b < B; b++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(G * G), (int)H, (int)K, 1.0f, cols + b * G * G * K,
                    (int)K, m->patch_w, (int)K, 0.0f, x + (b * T + 1) * H, (int)H);
#pragma omp parallel for schedule(static) if (B * T * H > 65536)
    for (int64_t b = 0; b < B; b++) {
        float *xb = x + b * T * H;
        for (int64_t j = 0; j < H; j++) xb[j] = m->class_emb[j];
        for (int64_t i = 0; i < T * H; i++) xb[i] += m->vpos_emb[i];
    }
}

/* images per forward: bounds the activations (L/14: ~1 MB per image per buffer) */
#define CLIP_IMAGE_CHUNK 16

kiln_error *kiln_clip_embed_images(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G = S / p, H = c->hidden, D = m->proj_dim, T = G * G + 1;
    int64_t Bmax = n < CLIP_IMAGE_CHUNK ? n : CLIP_IMAGE_CHUNK;
    if (n <= 0) return NULL;
    if (m->gpu) return kiln_clip_embed_images_cuda(m, pixels, n, out, patches);
    kiln_error *e = NULL;
    scratch s = {0};
    float *x = malloc(sizeof(float) * (size_t)(Bmax * T * H)), *cols = malloc(sizeof(float) * (size_t)(Bmax * G * G * 3 * p * p));
    float *ln = malloc(sizeof(float) * (size_t)(Bmax * T * H));
    if (!x || !cols || !ln || scratch_alloc(&s, Bmax * T, c)) {
        e = kiln_errorf(KILN_ENOMEM, "CLIP vision: out of memory for %lld images", (long long)Bmax);
        goto out;
    }
    for (int64_t b0 = 0; b0 < n && !e; b0 += Bmax) {
        int64_t B = n - b0 < Bmax ? n - b0 : Bmax;
        vision_embed(m, pixels + b0 * 3 * S * S, B, x, cols);
        kiln_layernorm_forward(x, x, m->pre_ln_w, m->pre_ln_b, B * T, H, (float)c->eps);
        for (int l = 0; l < c->layers && !e; l++)
            if (layer_forward(x, B, T, c, &m->vl[l], &s, 0)) e = kiln_errorf(KILN_ENOMEM, "CLIP vision: out of memory");
        if (e) break;
        /* post_layernorm over every token: row 0 is the pooled output, rows 1.. the patches */
        kiln_layernorm_forward(ln, x, m->post_ln_w, m->post_ln_b, B * T, H, (float)c->eps);
        for (int64_t b = 0; b < B; b++) {
            kiln_linear_forward(out + (b0 + b) * D, ln + b * T * H, m->vis_proj, NULL, 1, H, D);
            l2_normalize(out + (b0 + b) * D, 1, D);
            if (patches) {
                float *pp = patches + (b0 + b) * (T - 1) * D;
                kiln_linear_forward(pp, ln + (b * T + 1) * H, m->vis_proj, NULL, T - 1, H, D);
                l2_normalize(pp, T - 1, D);
            }
        }
    }
out:
    scratch_free(&s);
    free(x);
    free(cols);
    free(ln);
    return e;
}
