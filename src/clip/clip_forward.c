/* The CLIP towers on CPU: pre-LN transformer layers (LN -> fused qkv GEMM -> attention -> out
 * projection, residual; LN -> fc1 -> activation -> fc2, residual), the text tower's causal mask
 * and end-token pooling, the vision tower's patch embedding (im2col + GEMM), class token,
 * pre_layrnorm and post_layernorm, then the projections and L2 normalisation. GEMMs go through
 * OpenBLAS over every token of a chunk of images at once ([B*T, H] x Wᵀ); the out and fc2 projections
 * accumulate straight into the residual stream (beta = 1, the bias added first), fc1's bias rides along
 * with the activation (quick_gelu on vector lanes, src/nn/quick_gelu.c), so no pass over the activations
 * is spent on a bias or a residual add. When only the image embeddings are wanted (no patch embeddings), the
 * vision tower's last layer carries the class rows only past its qkv GEMM (layer_forward's xc). The rest
 * runs on OpenMP threads. The vision tower's activation buffers stay with the model between calls.
 * KILN_CLIP_PROFILE=1 prints the wall time per op class of every image call. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* wall time per op class (KILN_CLIP_PROFILE): each tick charges the time since the last one to cls */
enum { CP_PATCH, CP_LN, CP_QKV, CP_ATTN, CP_OUT, CP_FC1, CP_ACT, CP_FC2, CP_POST, CP_N };
static const char *const cp_names[CP_N] = {"patch embed", "layernorm", "qkv GEMM", "attention",
                                           "out GEMM + residual", "fc1 GEMM", "bias + activation",
                                           "fc2 GEMM + residual", "post LN + proj + L2"};
typedef struct {
    double t[CP_N], last;
} cpu_prof;

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void tick(cpu_prof *p, int cls) {
    if (!p) return;
    double n = wall();
    p->t[cls] += n - p->last;
    p->last = n;
}

/* x [n, m] = act(x + b) in one pass (b [m] nullable) */
static void bias_activation(float *x, const float *b, int64_t n, int64_t m, int act) {
    if (act == CLIP_ACT_QUICK_GELU) { /* on vector lanes, rows on threads */
        kiln_quick_gelu_forward(x, x, b, n, m);
        return;
    }
#pragma omp parallel for schedule(static) if (n * m > 65536)
    for (int64_t r = 0; r < n; r++) {
        float *xr = x + r * m;
        if (b)
            for (int64_t j = 0; j < m; j++) xr[j] += b[j];
        if (act == CLIP_ACT_GELU) kiln_gelu_forward(xr, xr, m);
        else
            for (int64_t j = 0; j < m; j++) {
                float v = xr[j];
                xr[j] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
            }
    }
}

/* x [n, out] += in [n, k] wᵀ + b: the bias into the residual first, then the GEMM with beta = 1 */
static void linear_residual(float *x, const float *in, const float *w, const float *b, int64_t n, int64_t k,
                            int64_t out) {
    if (b) {
#pragma omp parallel for schedule(static) if (n * out > 65536)
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < out; j++) x[r * out + j] += b[j];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)k, 1.0f, in, (int)k, w, (int)k, 1.0f, x,
                (int)out);
}

/* out [B, H]: attention of each sequence's first query (row 0: the class token) over its T keys, every
 * head, q/k/v read in place from the fused [B*T, 3H] projection as kiln_mha_forward reads them; s: T floats
 * of scratch per thread. The same softmax(q kᵀ · scale) v as kiln_mha_forward's row 0, by sgemv. */
static int cls_attention(float *out, const float *qkv, int64_t B, int64_t T, int64_t heads, int64_t hd, float scale) {
    int64_t H = heads * hd, stride = 3 * H, jobs = B * heads;
    int fail = 0;
#pragma omp parallel reduction(| : fail) if (jobs > 1 && T * hd * jobs > 100000)
    {
        float *s = malloc(sizeof(float) * (size_t)T);
        if (!s) fail = 1;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < jobs; j++) {
            if (!s) continue;
            int64_t b = j / heads, h = j % heads;
            const float *q = qkv + b * T * stride + h * hd, *k = q + H, *v = q + 2 * H;
            float *o = out + b * H + h * hd, mx = -INFINITY, sum = 0;
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)T, (int)hd, scale, k, (int)stride, q, 1, 0.0f, s, 1);
            for (int64_t t = 0; t < T; t++) mx = s[t] > mx ? s[t] : mx;
            for (int64_t t = 0; t < T; t++) sum += (s[t] = expf(s[t] - mx));
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)T, (int)hd, 1.0f / sum, v, (int)stride, s, 1, 0.0f, o, 1);
        }
        free(s);
    }
    return fail ? -1 : 0;
}

/* x [B, T, H] in place through one encoder layer. With xc (the vision tower's last layer when only the
 * image embeddings are wanted), only the class rows (row 0 of each sequence) come out of it, into xc
 * [B, H]: every row still feeds the keys and values (LN1 and the qkv GEMM over all B*T rows), but only
 * the class queries attend and only the B class rows go through the out projection, LN2 and the MLP.
 * The same arithmetic for those rows, ~1/L of the tower less work. */
static int layer_forward(float *x, int64_t B, int64_t T, const clip_tower_cfg *c, const clip_layer *L, scratch *s,
                         int causal, cpu_prof *p, float *xc) {
    int64_t n = B * T, H = c->hidden, hd = H / c->heads;
    float scale = (float)(1.0 / sqrt((double)hd));
    kiln_layernorm_forward(s->h, x, L->ln1_w, L->ln1_b, n, H, (float)c->eps);
    tick(p, CP_LN);
    kiln_linear_forward(s->qkv, s->h, L->qkv_w, L->qkv_b, n, H, 3 * H);
    tick(p, CP_QKV);
    if (xc) {
        if (cls_attention(s->att, s->qkv, B, T, c->heads, hd, scale)) return -1;
        for (int64_t b = 0; b < B; b++) memcpy(xc + b * H, x + b * T * H, sizeof(float) * (size_t)H);
        x = xc, n = B; /* the rest of the layer: the class rows only */
    } else if (kiln_mha_forward(s->att, s->qkv, s->qkv + H, s->qkv + 2 * H, B, T, c->heads, hd, 3 * H, H, scale,
                                causal))
        return -1;
    tick(p, CP_ATTN);
    linear_residual(x, s->att, L->o_w, L->o_b, n, H, H);
    tick(p, CP_OUT);
    kiln_layernorm_forward(s->h, x, L->ln2_w, L->ln2_b, n, H, (float)c->eps);
    tick(p, CP_LN);
    kiln_linear_forward(s->mlp, s->h, L->fc1_w, NULL, n, H, c->inter);
    tick(p, CP_FC1);
    bias_activation(s->mlp, L->fc1_b, n, c->inter, c->act);
    tick(p, CP_ACT);
    linear_residual(x, s->mlp, L->fc2_w, L->fc2_b, n, c->inter, H);
    tick(p, CP_FC2);
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
        if (layer_forward(x, 1, T, c, &m->tl[l], s, 1, NULL, NULL)) {
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
 * im2col rows in the weight's [c][ky][kx] order: one GEMM over every image's patches into pe
 * [B*G*G, H]), plus position embeddings */
static void vision_embed(const kiln_clip *m, const float *pixels, int64_t B, float *x, float *cols, float *pe) {
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(B * G * G), (int)H, (int)K, 1.0f, cols, (int)K,
                m->patch_w, (int)K, 0.0f, pe, (int)H);
#pragma omp parallel for collapse(2) schedule(static) if (B * T * H > 65536)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *xr = x + (b * T + t) * H;
            const float *src = t ? pe + (b * G * G + t - 1) * H : m->class_emb, *pos = m->vpos_emb + t * H;
            for (int64_t j = 0; j < H; j++) xr[j] = src[j] + pos[j];
        }
}

/* images per forward: bounds the activations (L/14: ~1 MB per image per buffer) */
#define CLIP_IMAGE_CHUNK 16

/* The vision tower's activations for chunks of up to bmax images. The model keeps one set between calls
 * (L/14, 16 images: ~200 MB): allocated afresh, the qkv and fc1 buffers (50 and 67 MB, above glibc's
 * largest mmap threshold) came back as new pages to fault in and zero on every call. */
struct clip_cpu_bufs {
    int64_t bmax;
    scratch s;
    float *x, *cols, *ln;
};

static void bufs_free(struct clip_cpu_bufs *b) {
    if (!b) return;
    scratch_free(&b->s);
    free(b->x);
    free(b->cols);
    free(b->ln);
    free(b);
}

static struct clip_cpu_bufs *bufs_alloc(const clip_tower_cfg *c, int64_t bmax) {
    int64_t p = c->patch_size, G = c->image_size / p, T = G * G + 1, H = c->hidden;
    struct clip_cpu_bufs *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->bmax = bmax;
    b->x = malloc(sizeof(float) * (size_t)(bmax * T * H));
    b->cols = malloc(sizeof(float) * (size_t)(bmax * G * G * 3 * p * p));
    b->ln = malloc(sizeof(float) * (size_t)(bmax * T * H));
    if (!b->x || !b->cols || !b->ln || scratch_alloc(&b->s, bmax * T, c)) {
        bufs_free(b);
        return NULL;
    }
    return b;
}

void kiln_clip_cpu_free(kiln_clip *m) {
    bufs_free(m->cpu_bufs);
    m->cpu_bufs = NULL;
}

kiln_error *kiln_clip_embed_images(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    const clip_tower_cfg *c = &m->vision;
    int64_t S = c->image_size, p = c->patch_size, G = S / p, H = c->hidden, D = m->proj_dim, T = G * G + 1;
    int64_t Bmax = n < CLIP_IMAGE_CHUNK ? n : CLIP_IMAGE_CHUNK;
    if (n <= 0) return NULL;
    if (m->gpu) return kiln_clip_embed_images_cuda(m, pixels, n, out, patches);
    kiln_error *e = NULL;
    const char *pe = getenv("KILN_CLIP_PROFILE");
    cpu_prof prof = {{0}, 0}, *pf = pe && *pe && strcmp(pe, "0") ? &prof : NULL;
    double t0 = wall();
    /* the model's buffers unless another thread's call holds them (calls may overlap on the CPU): then
     * this call's own */
    int own = !__atomic_exchange_n(&m->cpu_bufs_busy, 1, __ATOMIC_ACQUIRE);
    struct clip_cpu_bufs *bufs = own ? m->cpu_bufs : NULL;
    if (!bufs || bufs->bmax < Bmax) {
        if (own) kiln_clip_cpu_free(m);
        bufs = bufs_alloc(c, Bmax);
        if (own) m->cpu_bufs = bufs;
    }
    if (!bufs) {
        e = kiln_errorf(KILN_ENOMEM, "CLIP vision: out of memory for %lld images", (long long)Bmax);
        goto out;
    }
    scratch s = bufs->s;
    float *x = bufs->x, *cols = bufs->cols, *ln = bufs->ln;
    for (int64_t b0 = 0; b0 < n && !e; b0 += Bmax) {
        int64_t B = n - b0 < Bmax ? n - b0 : Bmax;
        prof.last = wall();
        vision_embed(m, pixels + b0 * 3 * S * S, B, x, cols, s.h); /* s.h: free until the first layer */
        tick(pf, CP_PATCH);
        kiln_layernorm_forward(x, x, m->pre_ln_w, m->pre_ln_b, B * T, H, (float)c->eps);
        tick(pf, CP_LN);
        /* without patches the last layer computes the class rows only, into ln ([B, H], free until the
         * post-layernorm, which then runs in place there) */
        int cls = !patches && c->layers > 0;
        for (int l = 0; l < c->layers && !e; l++)
            if (layer_forward(x, B, T, c, &m->vl[l], &s, 0, pf, cls && l == c->layers - 1 ? ln : NULL))
                e = kiln_errorf(KILN_ENOMEM, "CLIP vision: out of memory");
        if (e) break;
        /* post_layernorm: row 0 of each image is the pooled output, rows 1.. the patches */
        if (cls) kiln_layernorm_forward(ln, ln, m->post_ln_w, m->post_ln_b, B, H, (float)c->eps);
        else kiln_layernorm_forward(ln, x, m->post_ln_w, m->post_ln_b, B * T, H, (float)c->eps);
        /* the pooled rows of ln: compact after the class-rows-only layer, else every T-th row */
        int64_t prow = cls ? 1 : T;
        for (int64_t b = 0; b < B; b++) {
            kiln_linear_forward(out + (b0 + b) * D, ln + b * prow * H, m->vis_proj, NULL, 1, H, D);
            l2_normalize(out + (b0 + b) * D, 1, D);
            if (patches) {
                float *pp = patches + (b0 + b) * (T - 1) * D;
                kiln_linear_forward(pp, ln + (b * T + 1) * H, m->vis_proj, NULL, T - 1, H, D);
                l2_normalize(pp, T - 1, D);
            }
        }
        tick(pf, CP_POST);
    }
    if (pf && !e) {
        double tot = 0, secs = wall() - t0;
        for (int i = 0; i < CP_N; i++) tot += prof.t[i];
        fprintf(stderr, "CLIP on CPU: %d images in chunks of %lld: %.3f ms wall (%.2f images/s)\n", n, (long long)Bmax,
                secs * 1e3, n / secs);
        for (int i = 0; i < CP_N; i++)
            fprintf(stderr, "  %-22s %9.3f ms %5.1f%%\n", cp_names[i], prof.t[i] * 1e3, tot > 0 ? 100 * prof.t[i] / tot : 0);
    }
out:
    if (own) __atomic_store_n(&m->cpu_bufs_busy, 0, __ATOMIC_RELEASE);
    else bufs_free(bufs);
    return e;
}
