/* CLIP's vision tower on the GPU (kiln_clip_set_device(m, "cuda")): the weights go to the device once,
 * GEMM weights and biases in bf16 (cuBLASLt through kiln_linear_forward_cuda, f32 accumulation), norms,
 * class and position embeddings in f32; the residual stream is f32, activations between ops bf16, as
 * the CUDA ops' conventions (include/kiln/cuda_ops.h). Pixels are rounded to bf16 on the host (as a bf16
 * torch model's input is) into a page-locked buffer, halving the upload and running it at the link's
 * speed. Images run in chunks of CLIP_GPU_CHUNK. Texts
 * stay on the CPU (short, few). Without CUDA, setting the device says so. */
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/cuda.h"

#ifdef KILN_HAVE_CUDA
#include <math.h>

#include "kiln/cuda_ops.h"
#include "kiln/dtype.h"

typedef struct {
    kiln_bf16 *qkv_w, *qkv_b, *o_w, *o_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} gpu_layer;

struct clip_gpu {
    gpu_layer *L;
    kiln_bf16 *patch_w, *proj;
    float *cls, *pos, *pre_w, *pre_b, *post_w, *post_b;
    void **allocs;
    int nallocs, cap;
    uint16_t *stage; /* pinned bf16 pixels of one chunk */
    size_t stage_n;
};

static kiln_error *track(struct clip_gpu *g, void *p) {
    if (g->nallocs == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        void **v = realloc(g->allocs, sizeof(void *) * (size_t)cap);
        if (!v) {
            kiln_cuda_free(p);
            return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of host memory");
        }
        g->allocs = v;
        g->cap = cap;
    }
    g->allocs[g->nallocs++] = p;
    return NULL;
}

static kiln_error *up_f32(struct clip_gpu *g, const float *src, size_t n, float **dst) {
    void *p = NULL;
    KILN_TRY(kiln_cuda_alloc(&p, n * sizeof(float)));
    KILN_TRY(track(g, p));
    *dst = p;
    return kiln_cuda_copy(p, src, n * sizeof(float), KILN_CUDA_H2D);
}

static kiln_error *up_bf16(struct clip_gpu *g, const float *src, size_t n, kiln_bf16 **dst) {
    uint16_t *h = malloc(n * sizeof(uint16_t));
    if (!h) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of host memory");
    for (size_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(src[i]);
    void *p = NULL;
    kiln_error *e = kiln_cuda_alloc(&p, n * sizeof(uint16_t));
    if (!e) e = track(g, p);
    if (!e) e = kiln_cuda_copy(p, h, n * sizeof(uint16_t), KILN_CUDA_H2D);
    free(h);
    if (!e) *dst = p;
    return e;
}

void kiln_clip_gpu_free(kiln_clip *m) {
    struct clip_gpu *g = m->gpu;
    if (!g) return;
    for (int i = 0; i < g->nallocs; i++) kiln_cuda_free(g->allocs[i]);
    kiln_clip_pinned_free(g->stage);
    free(g->allocs);
    free(g->L);
    free(g);
    m->gpu = NULL;
}

static kiln_error *upload(kiln_clip *m, struct clip_gpu *g) {
    const clip_tower_cfg *c = &m->vision;
    int64_t H = c->hidden, I = c->inter, p = c->patch_size, G = c->image_size / p, D = m->proj_dim;
    if (!(g->L = calloc((size_t)c->layers, sizeof *g->L))) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of memory");
    KILN_TRY(up_bf16(g, m->patch_w, (size_t)(H * 3 * p * p), &g->patch_w));
    KILN_TRY(up_bf16(g, m->vis_proj, (size_t)(D * H), &g->proj));
    KILN_TRY(up_f32(g, m->class_emb, (size_t)H, &g->cls));
    KILN_TRY(up_f32(g, m->vpos_emb, (size_t)((G * G + 1) * H), &g->pos));
    KILN_TRY(up_f32(g, m->pre_ln_w, (size_t)H, &g->pre_w));
    KILN_TRY(up_f32(g, m->pre_ln_b, (size_t)H, &g->pre_b));
    KILN_TRY(up_f32(g, m->post_ln_w, (size_t)H, &g->post_w));
    KILN_TRY(up_f32(g, m->post_ln_b, (size_t)H, &g->post_b));
    for (int l = 0; l < c->layers; l++) {
        const clip_layer *s = &m->vl[l];
        gpu_layer *d = &g->L[l];
        KILN_TRY(up_bf16(g, s->qkv_w, (size_t)(3 * H * H), &d->qkv_w));
        KILN_TRY(up_bf16(g, s->qkv_b, (size_t)(3 * H), &d->qkv_b));
        KILN_TRY(up_bf16(g, s->o_w, (size_t)(H * H), &d->o_w));
        KILN_TRY(up_bf16(g, s->o_b, (size_t)H, &d->o_b));
        KILN_TRY(up_bf16(g, s->fc1_w, (size_t)(I * H), &d->fc1_w));
        KILN_TRY(up_bf16(g, s->fc1_b, (size_t)I, &d->fc1_b));
        KILN_TRY(up_bf16(g, s->fc2_w, (size_t)(H * I), &d->fc2_w));
        KILN_TRY(up_bf16(g, s->fc2_b, (size_t)H, &d->fc2_b));
        KILN_TRY(up_f32(g, s->ln1_w, (size_t)H, &d->ln1_w));
        KILN_TRY(up_f32(g, s->ln1_b, (size_t)H, &d->ln1_b));
        KILN_TRY(up_f32(g, s->ln2_w, (size_t)H, &d->ln2_w));
        KILN_TRY(up_f32(g, s->ln2_b, (size_t)H, &d->ln2_b));
    }
    return NULL;
}

kiln_error *kiln_clip_set_device(kiln_clip *m, const char *device) {
    if (!strcmp(device, "cpu")) {
        kiln_clip_gpu_free(m);
        return NULL;
    }
    if (strcmp(device, "cuda"))
        return kiln_errorf(KILN_EINVAL, "CLIP device \"%s\": expected \"cpu\" or \"cuda\"", device);
    if (m->gpu) return NULL;
    if (m->vision.act == CLIP_ACT_GELU_TANH)
        return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: hidden_act gelu_new/gelu_pytorch_tanh is not supported there");
    int n = 0;
    KILN_TRY(kiln_cuda_device_count(&n));
    if (n < 1) return kiln_errorf(KILN_ENOTFOUND, "CLIP on CUDA: no CUDA device");
    struct clip_gpu *g = calloc(1, sizeof *g);
    if (!g) return kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of memory");
    m->gpu = g;
    kiln_error *e = upload(m, g);
    if (e) {
        kiln_clip_gpu_free(m);
        return kiln_error_wrap(e, "uploading CLIP's vision tower");
    }
    return NULL;
}

/* images per forward: big GEMMs (B/32: 12800 rows), and at most ~2 GB of attention scratch for L/14 */
#define CLIP_GPU_CHUNK 256

kiln_error *kiln_clip_embed_images_cuda(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    const clip_tower_cfg *c = &m->vision;
    struct clip_gpu *g = m->gpu;
    int64_t S = c->image_size, p = c->patch_size, G = S / p, G2 = G * G, T = G2 + 1, H = c->hidden, I = c->inter,
            D = m->proj_dim, K = 3 * p * p, hd = H / c->heads;
    int64_t Bm = n < CLIP_GPU_CHUNK ? n : CLIP_GPU_CHUNK, Nm = Bm * T;
    float *x = NULL, *nrm = NULL, *host = NULL;
    kiln_bf16 *px = NULL, *cols = NULL, *pe = NULL, *h = NULL, *qkv = NULL, *att = NULL, *f = NULL, *o = NULL, *pr = NULL;
    kiln_error *e = NULL;
    float scale = (float)(1.0 / sqrt((double)hd)), eps = (float)c->eps;
    if (n <= 0) return NULL;
    size_t per = (size_t)(3 * S * S);
    if (g->stage_n < per * (size_t)Bm) {
        kiln_clip_pinned_free(g->stage);
        g->stage = NULL;
        g->stage_n = 0;
        if ((e = kiln_clip_pinned_alloc((void **)&g->stage, 2 * per * (size_t)Bm))) goto done;
        g->stage_n = per * (size_t)Bm;
    }
    if ((e = kiln_cuda_alloc((void **)&px, 2 * per * (size_t)Bm)) ||
        (e = kiln_cuda_alloc((void **)&cols, 2 * (size_t)(Bm * G2 * K))) ||
        (e = kiln_cuda_alloc((void **)&pe, 2 * (size_t)(Bm * G2 * H))) ||
        (e = kiln_cuda_alloc((void **)&x, sizeof(float) * (size_t)(Nm * H))) ||
        (e = kiln_cuda_alloc((void **)&h, 2 * (size_t)(Nm * H))) ||
        (e = kiln_cuda_alloc((void **)&qkv, 2 * (size_t)(Nm * 3 * H))) ||
        (e = kiln_cuda_alloc((void **)&att, 2 * (size_t)(Nm * H))) ||
        (e = kiln_cuda_alloc((void **)&f, 2 * (size_t)(Nm * I))) ||
        (e = kiln_cuda_alloc((void **)&o, 2 * (size_t)(Nm * H))) ||
        (e = kiln_cuda_alloc((void **)&pr, 2 * (size_t)(Nm * D))) ||
        (e = kiln_cuda_alloc((void **)&nrm, sizeof(float) * (size_t)(Nm * D))))
        goto done;
    if (patches && !(host = malloc(sizeof(float) * (size_t)(Nm * D)))) {
        e = kiln_errorf(KILN_ENOMEM, "CLIP on CUDA: out of host memory");
        goto done;
    }
    for (int64_t b0 = 0; b0 < n && !e; b0 += Bm) {
        int64_t B = n - b0 < Bm ? n - b0 : Bm, N = B * T;
        const float *src = pixels + b0 * 3 * S * S;
        uint16_t *stage = g->stage;
        int64_t np = B * 3 * S * S;
#pragma omp parallel for schedule(static) if (np > 65536)
        for (int64_t i = 0; i < np; i++) stage[i] = kiln_f32_to_bf16(src[i]);
        if ((e = kiln_cuda_copy(px, stage, 2 * (size_t)np, KILN_CUDA_H2D)) ||
            (e = kiln_clip_patchify_cuda(cols, px, B, S, p, NULL)) ||
            (e = kiln_linear_forward_cuda(pe, cols, g->patch_w, NULL, B * G2, K, H, NULL)) ||
            (e = kiln_clip_assemble_cuda(x, pe, g->cls, g->pos, B, G2, H, NULL)) ||
            (e = kiln_layernorm_forward_f32_cuda(x, x, g->pre_w, g->pre_b, N, H, eps, NULL)))
            break;
        for (int l = 0; l < c->layers && !e; l++) {
            const gpu_layer *L = &g->L[l];
            if ((e = kiln_layernorm_forward_cuda(h, x, L->ln1_w, L->ln1_b, N, H, eps, NULL)) ||
                (e = kiln_linear_forward_cuda(qkv, h, L->qkv_w, L->qkv_b, N, H, 3 * H, NULL)) ||
                (e = kiln_mha_forward_cuda(att, qkv, qkv + H, qkv + 2 * H, B, T, c->heads, hd, 3 * H, H, scale, 0, NULL)) ||
                (e = kiln_linear_forward_cuda(o, att, L->o_w, L->o_b, N, H, H, NULL)) ||
                (e = kiln_add_bf16_cuda(x, o, N * H, NULL)) ||
                (e = kiln_layernorm_forward_cuda(h, x, L->ln2_w, L->ln2_b, N, H, eps, NULL)) ||
                (e = kiln_linear_forward_cuda(f, h, L->fc1_w, L->fc1_b, N, H, I, NULL)) ||
                (e = c->act == CLIP_ACT_QUICK_GELU ? kiln_quick_gelu_forward_cuda(f, f, N * I, NULL)
                                                   : kiln_gelu_forward_cuda(f, f, N * I, NULL)) ||
                (e = kiln_linear_forward_cuda(o, f, L->fc2_w, L->fc2_b, N, I, H, NULL)) ||
                (e = kiln_add_bf16_cuda(x, o, N * H, NULL)))
                break;
        }
        if (e) break;
        if (patches) {
            /* every token through post_layernorm and the projection: row b*T is image b, the rest its patches */
            if ((e = kiln_layernorm_forward_cuda(h, x, g->post_w, g->post_b, N, H, eps, NULL)) ||
                (e = kiln_linear_forward_cuda(pr, h, g->proj, NULL, N, H, D, NULL)) ||
                (e = kiln_l2_normalize_rows_cuda(nrm, pr, N, D, NULL)) ||
                (e = kiln_cuda_copy(host, nrm, sizeof(float) * (size_t)(N * D), KILN_CUDA_D2H)))
                break;
            for (int64_t b = 0; b < B; b++) {
                memcpy(out + (b0 + b) * D, host + b * T * D, sizeof(float) * (size_t)D);
                memcpy(patches + (b0 + b) * G2 * D, host + (b * T + 1) * D, sizeof(float) * (size_t)(G2 * D));
            }
        } else {
            /* only the class tokens (every T-th row) */
            if ((e = kiln_layernorm_forward_strided_cuda(h, x, T * H, g->post_w, g->post_b, B, H, eps, NULL)) ||
                (e = kiln_linear_forward_cuda(pr, h, g->proj, NULL, B, H, D, NULL)) ||
                (e = kiln_l2_normalize_rows_cuda(nrm, pr, B, D, NULL)) ||
                (e = kiln_cuda_copy(out + b0 * D, nrm, sizeof(float) * (size_t)(B * D), KILN_CUDA_D2H)))
                break;
        }
    }
done:
    kiln_cuda_free(px);
    kiln_cuda_free(cols);
    kiln_cuda_free(pe);
    kiln_cuda_free(x);
    kiln_cuda_free(h);
    kiln_cuda_free(qkv);
    kiln_cuda_free(att);
    kiln_cuda_free(f);
    kiln_cuda_free(o);
    kiln_cuda_free(pr);
    kiln_cuda_free(nrm);
    free(host);
    return e ? kiln_error_wrap(e, "CLIP image embeddings on CUDA") : NULL;
}

#else

void kiln_clip_gpu_free(kiln_clip *m) { (void)m; }

kiln_error *kiln_clip_set_device(kiln_clip *m, const char *device) {
    (void)m;
    if (!strcmp(device, "cpu")) return NULL;
    if (strcmp(device, "cuda"))
        return kiln_errorf(KILN_EINVAL, "CLIP device \"%s\": expected \"cpu\" or \"cuda\"", device);
    return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: kiln was built without CUDA");
}

kiln_error *kiln_clip_embed_images_cuda(kiln_clip *m, const float *pixels, int n, float *out, float *patches) {
    (void)m, (void)pixels, (void)n, (void)out, (void)patches;
    return kiln_errorf(KILN_EUNSUPPORTED, "CLIP on CUDA: kiln was built without CUDA");
}

#endif
