/* Loading a HF CLIPModel directory: config.json, preprocessor_config.json, model.safetensors (one
 * file or sharded; F32, F16, BF16 or F64 weights, kept as f32) and tokenizer.json. Every tensor is
 * checked against the config by name and shape; q/k/v projections are packed into one [3H, H]
 * matrix per layer so a layer runs one GEMM for them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "clip/clip_internal.h"
#include "kiln/fsutil.h"
#include "kiln/safetensors.h"

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[4];
    size_t off; /* into m->w */
} want;

typedef struct {
    want *v;
    size_t n, cap, total;
} wantlist;

static int add(wantlist *l, const char *name, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        want *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    want *w = &l->v[l->n++];
    snprintf(w->name, sizeof w->name, "%s", name);
    w->ndim = ndim;
    int64_t s[4] = {a, b, c, d};
    size_t numel = 1;
    for (int i = 0; i < 4; i++) {
        w->shape[i] = i < ndim ? s[i] : 0;
        if (i < ndim) numel *= (size_t)s[i];
    }
    w->off = l->total;
    l->total += numel;
    return 0;
}

/* the offsets of one encoder layer's tensors, in the order listed by add_layer */
typedef struct {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    size_t k_w, v_w, k_b, v_b; /* right after q's: the packed [3H, H] matrix and [3H] bias */
} layer_off;

static int add_layer(wantlist *l, const char *prefix, int i, const clip_tower_cfg *c, layer_off *o) {
    char n[128];
    int64_t H = c->hidden, I = c->inter;
    int rc = 0;
#define ADD(field, suffix, nd, a, b)                                   \
    do {                                                               \
        snprintf(n, sizeof n, "%s.encoder.layers.%d.%s", prefix, i, suffix); \
        o->field = l->total;                                           \
        rc |= add(l, n, nd, a, b, 0, 0);                               \
    } while (0)
    ADD(ln1_w, "layer_norm1.weight", 1, H, 0);
    ADD(ln1_b, "layer_norm1.bias", 1, H, 0);
    ADD(qkv_w, "self_attn.q_proj.weight", 2, H, H);
    ADD(k_w, "self_attn.k_proj.weight", 2, H, H);
    ADD(v_w, "self_attn.v_proj.weight", 2, H, H);
    ADD(qkv_b, "self_attn.q_proj.bias", 1, H, 0);
    ADD(k_b, "self_attn.k_proj.bias", 1, H, 0);
    ADD(v_b, "self_attn.v_proj.bias", 1, H, 0);
    ADD(o_w, "self_attn.out_proj.weight", 2, H, H);
    ADD(o_b, "self_attn.out_proj.bias", 1, H, 0);
    ADD(ln2_w, "layer_norm2.weight", 1, H, 0);
    ADD(ln2_b, "layer_norm2.bias", 1, H, 0);
    ADD(fc1_w, "mlp.fc1.weight", 2, I, H);
    ADD(fc1_b, "mlp.fc1.bias", 1, I, 0);
    ADD(fc2_w, "mlp.fc2.weight", 2, H, I);
    ADD(fc2_b, "mlp.fc2.bias", 1, H, 0);
#undef ADD
    return rc;
}

static void bind_layer(const float *w, const layer_off *o, clip_layer *L) {
    L->ln1_w = w + o->ln1_w, L->ln1_b = w + o->ln1_b, L->qkv_w = w + o->qkv_w, L->qkv_b = w + o->qkv_b;
    L->o_w = w + o->o_w, L->o_b = w + o->o_b, L->ln2_w = w + o->ln2_w, L->ln2_b = w + o->ln2_b;
    L->fc1_w = w + o->fc1_w, L->fc1_b = w + o->fc1_b, L->fc2_w = w + o->fc2_w, L->fc2_b = w + o->fc2_b;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)s[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

kiln_error *kiln_clip_load_weights(kiln_clip *m) {
    const clip_tower_cfg *tc = &m->text, *vc = &m->vision;
    int64_t Ht = tc->hidden, Hv = vc->hidden, D = m->proj_dim, p = vc->patch_size, G = vc->image_size / p;
    wantlist l = {0};
    layer_off *tlo = calloc((size_t)tc->layers, sizeof *tlo), *vlo = calloc((size_t)vc->layers, sizeof *vlo);
    int rc = !tlo || !vlo;
    size_t o_tok, o_tpos, o_fln_w, o_fln_b, o_tproj, o_cls, o_patch, o_vpos, o_pre_w, o_pre_b, o_post_w, o_post_b,
        o_vproj, o_scale;
    o_tok = l.total, rc |= add(&l, "text_model.embeddings.token_embedding.weight", 2, tc->vocab, Ht, 0, 0);
    o_tpos = l.total, rc |= add(&l, "text_model.embeddings.position_embedding.weight", 2, tc->max_pos, Ht, 0, 0);
    for (int i = 0; i < tc->layers && !rc; i++) rc |= add_layer(&l, "text_model", i, tc, &tlo[i]);
    o_fln_w = l.total, rc |= add(&l, "text_model.final_layer_norm.weight", 1, Ht, 0, 0, 0);
    o_fln_b = l.total, rc |= add(&l, "text_model.final_layer_norm.bias", 1, Ht, 0, 0, 0);
    o_tproj = l.total, rc |= add(&l, "text_projection.weight", 2, D, Ht, 0, 0);
    o_cls = l.total, rc |= add(&l, "vision_model.embeddings.class_embedding", 1, Hv, 0, 0, 0);
    o_patch = l.total, rc |= add(&l, "vision_model.embeddings.patch_embedding.weight", 4, Hv, 3, p, p);
    o_vpos = l.total, rc |= add(&l, "vision_model.embeddings.position_embedding.weight", 2, G * G + 1, Hv, 0, 0);
    o_pre_w = l.total, rc |= add(&l, "vision_model.pre_layrnorm.weight", 1, Hv, 0, 0, 0);
    o_pre_b = l.total, rc |= add(&l, "vision_model.pre_layrnorm.bias", 1, Hv, 0, 0, 0);
    for (int i = 0; i < vc->layers && !rc; i++) rc |= add_layer(&l, "vision_model", i, vc, &vlo[i]);
    o_post_w = l.total, rc |= add(&l, "vision_model.post_layernorm.weight", 1, Hv, 0, 0, 0);
    o_post_b = l.total, rc |= add(&l, "vision_model.post_layernorm.bias", 1, Hv, 0, 0, 0);
    o_vproj = l.total, rc |= add(&l, "visual_projection.weight", 2, D, Hv, 0, 0);
    o_scale = l.total, rc |= add(&l, "logit_scale", 0, 0, 0, 0, 0);
    kiln_error *e = NULL;
    kiln_st *st = NULL;
    const kiln_st_tensor **src = NULL; /* the file's tensor of each wanted one, in the table's order */
    float **dst = NULL;                /* where each goes in m->w */
    if (rc || !(m->w = malloc(sizeof(float) * (l.total ? l.total : 1)))) {
        e = kiln_errorf(KILN_ENOMEM, "%s: out of memory for the CLIP weights", m->dir);
        goto out;
    }
    m->nw = l.total;
    if ((e = kiln_st_open_dir(m->dir, &st))) goto out;
    /* every tensor checked (name, shape, dtype; nothing extra) before any byte of data is read */
    if (!(src = calloc(l.n ? l.n : 1, sizeof *src)) || !(dst = calloc(l.n ? l.n : 1, sizeof *dst))) {
        e = kiln_errorf(KILN_ENOMEM, "%s: out of memory", m->dir);
        goto out;
    }
    for (size_t i = 0; i < l.n && !e; i++) {
        const want *w = &l.v[i];
        const kiln_st_tensor *t = kiln_st_find(st, w->name);
        if (!t) {
            e = kiln_errorf(KILN_ENOTFOUND, "%s: tensor '%s' is missing (not a HF CLIPModel checkpoint?)", m->dir, w->name);
            break;
        }
        int same = t->ndim == w->ndim || (w->ndim == 0 && t->numel == 1);
        for (int k = 0; k < w->ndim && same; k++) same = t->shape[k] == w->shape[k];
        if (!same) {
            char a[96], b[96];
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, w->ndim, w->shape);
            e = kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has shape %s, config.json says %s", t->file, w->name, a, b);
            break;
        }
        if (t->dtype != KILN_DT_F32 && t->dtype != KILN_DT_F16 && t->dtype != KILN_DT_BF16 && t->dtype != KILN_DT_F64) {
            e = kiln_errorf(KILN_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16, BF16 or F64 expected)", t->file,
                            w->name, kiln_dtype_name(t->dtype));
            break;
        }
        src[i] = t;
        dst[i] = m->w + w->off;
    }
    /* anything else in the file means a different architecture than the config describes */
    for (size_t i = 0; st && !e && i < kiln_st_count(st); i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        const char *dot = strrchr(t->name, '.');
        if (dot && !strcmp(dot, ".position_ids")) continue; /* a buffer older checkpoints saved */
        int known = 0;
        for (size_t k = 0; k < l.n && !known; k++) known = !strcmp(l.v[k].name, t->name);
        if (!known)
            e = kiln_errorf(KILN_EFORMAT, "%s: unexpected tensor '%s' (config.json describes %d text and %d vision layers)",
                            t->file, t->name, tc->layers, vc->layers);
    }
    /* the data, converted to f32 and hashed for the model's identity in the same pass (clip_id.c) */
    if (!e) e = clip_id_load_tensors((const kiln_st_tensor *const *)src, dst, l.n, &m->weights_digest);
    if (e) goto out;
    float *w = m->w;
    m->tok_emb = w + o_tok, m->tpos_emb = w + o_tpos, m->final_ln_w = w + o_fln_w, m->final_ln_b = w + o_fln_b;
    m->text_proj = w + o_tproj, m->class_emb = w + o_cls, m->patch_w = w + o_patch, m->vpos_emb = w + o_vpos;
    m->pre_ln_w = w + o_pre_w, m->pre_ln_b = w + o_pre_b, m->post_ln_w = w + o_post_w, m->post_ln_b = w + o_post_b;
    m->vis_proj = w + o_vproj;
    m->logit_scale = expf(w[o_scale]);
    m->tl = calloc((size_t)tc->layers, sizeof *m->tl);
    m->vl = calloc((size_t)vc->layers, sizeof *m->vl);
    if (!m->tl || !m->vl) {
        e = kiln_errorf(KILN_ENOMEM, "%s: out of memory", m->dir);
        goto out;
    }
    for (int i = 0; i < tc->layers; i++) bind_layer(w, &tlo[i], &m->tl[i]);
    for (int i = 0; i < vc->layers; i++) bind_layer(w, &vlo[i], &m->vl[i]);
out:
    kiln_st_close(st);
    free(src);
    free(dst);
    free(l.v);
    free(tlo);
    free(vlo);
    return e;
}

kiln_error *kiln_clip_load(const char *dir, kiln_clip **out) {
    *out = NULL;
    kiln_clip *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    }
    char *cfg = kiln_path_join(dir, "config.json"), *pre = kiln_path_join(dir, "preprocessor_config.json");
    kiln_error *e = NULL;
    if (!cfg || !pre) e = kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    if (!e) e = kiln_clip_read_config(cfg, &m->text, &m->vision, &m->proj_dim);
    if (!e) e = kiln_clip_read_preproc(pre, &m->pre);
    if (!e) {
        /* the processor's output must be exactly the image the vision tower takes */
        const clip_preproc_cfg *p = &m->pre;
        int h = p->do_center_crop ? p->crop_h : p->do_resize && !p->resize_shortest ? p->resize_h : -1;
        int w = p->do_center_crop ? p->crop_w : p->do_resize && !p->resize_shortest ? p->resize_w : -1;
        int S = m->vision.image_size;
        if (h < 0)
            e = kiln_errorf(KILN_EINVAL, "%s: without a center crop the shortest-edge resize makes images of varying "
                                         "size; the vision tower takes %dx%d", pre, S, S);
        else if (h != S || w != S)
            e = kiln_errorf(KILN_EINVAL, "%s: the processor makes %dx%d images, vision_config.image_size is %d", pre, w,
                            h, S);
    }
    if (!e) e = kiln_clip_load_weights(m);
    if (!e) e = kiln_clip_load_text(m);
    if (!e) e = clip_id_finish(m);
    free(cfg);
    free(pre);
    if (e) {
        kiln_clip_free(m);
        return kiln_error_wrap(e, "loading CLIP %s", dir);
    }
    *out = m;
    return NULL;
}

void kiln_clip_free(kiln_clip *m) {
    if (!m) return;
    kiln_clip_gpu_free(m);
    kiln_clip_cpu_free(m);
    kiln_tokenizer_free(m->tok);
    free(m->w);
    free(m->tl);
    free(m->vl);
    free(m->dir);
    free(m);
}

int kiln_clip_dim(const kiln_clip *m) { return m->proj_dim; }
int kiln_clip_image_size(const kiln_clip *m) { return m->vision.image_size; }
int kiln_clip_grid(const kiln_clip *m) { return m->vision.image_size / m->vision.patch_size; }
float kiln_clip_logit_scale(const kiln_clip *m) { return m->logit_scale; }
