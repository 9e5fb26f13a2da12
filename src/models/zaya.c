/* ZAYA model lifetime: create, initialise, load from and save to HF directories. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/fsutil.h"
#include "kiln/nn.h"
#include "kiln/progress.h"
#include "kiln/rng.h"
#include "kiln/safetensors.h"
#include "zaya_internal.h"

kiln_error *kiln_zaya_create(const kiln_zaya_config *cfg, kiln_zaya **out) {
    *out = NULL;
    KILN_TRY(kiln_zaya_config_validate(cfg, "config"));
    kiln_zaya *m = calloc(1, sizeof *m);
    if (!m) return kiln_errorf(KILN_ENOMEM, "model");
    m->cfg = *cfg;
    kiln_error *e = kiln_zaya_build_params(m);
    const int64_t L = cfg->num_layers, E1 = cfg->num_experts + 1;
    if (!e) {
        m->w = calloc(m->numel ? m->numel : 1, sizeof(float));
        m->balancing = calloc((size_t)(L * E1 + 1), sizeof(float));
        m->W.layers = calloc((size_t)L + 1, sizeof(kiln_zaya_layer_ptrs));
        m->G.layers = calloc((size_t)L + 1, sizeof(kiln_zaya_layer_ptrs));
        for (int t = 0; t < 2; t++) m->inv_freq[t] = calloc((size_t)cfg->head_dim, sizeof(float));
        if (!m->w || !m->balancing || !m->W.layers || !m->G.layers || !m->inv_freq[0] || !m->inv_freq[1])
            e = kiln_errorf(KILN_ENOMEM, "model of %zu parameters (%.1f MB)", m->numel, m->numel * 4.0 / 1e6);
    }
    if (e) {
        kiln_zaya_free(m);
        return e;
    }
    kiln_zaya_bind(m, m->w, &m->W);
    for (int t = 0; t < 2; t++)
        m->rot_dim[t] = kiln_rope_inv_freq(m->inv_freq[t], cfg->head_dim, cfg->partial_rotary[t],
                                                  cfg->rope_theta[t]);
    for (int64_t l = 0; l < L; l++) m->balancing[l * E1 + E1 - 1] = -1.0f; /* the skip class starts disfavoured */
    *out = m;
    return NULL;
}

void kiln_zaya_free(kiln_zaya *m) {
    if (!m) return;
    free(m->params);
    free(m->w);
    free(m->g);
    free(m->balancing);
    free(m->W.layers);
    free(m->G.layers);
    free(m->inv_freq[0]);
    free(m->inv_freq[1]);
    free(m);
}

kiln_error *kiln_zaya_grads_enable(kiln_zaya *m) {
    if (m->g) return NULL;
    m->g = calloc(m->numel ? m->numel : 1, sizeof(float));
    if (!m->g) return kiln_errorf(KILN_ENOMEM, "gradients of %zu parameters", m->numel);
    kiln_zaya_bind(m, m->g, &m->G);
    return NULL;
}

void kiln_zaya_grads_zero(kiln_zaya *m) {
    if (m->g) memset(m->g, 0, m->numel * sizeof(float));
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* splitmix64's finaliser: a block's stream from (seed, tensor, block) */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Normal(0, std) weights, one random stream per block of 64k elements of a tensor, so that the blocks are
 * generated in parallel and the weights are the same whatever the thread count (one serial stream took
 * ~50 s for a 1.8B-parameter model: Box-Muller's log and cos per element); both of Box-Muller's outputs
 * are used. */
void kiln_zaya_init_random(kiln_zaya *m, uint64_t seed) {
    enum { BLOCK = 1 << 16 };
    const double std = m->cfg.initializer_range;
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param_info *p = &m->params[i];
        float *w = m->w + p->offset;
        float fill = 0.0f;
        int random = 0;
        if (ends_with(p->name, "norm.weight") || ends_with(p->name, "_scale") || ends_with(p->name, "residual_scale"))
            fill = 1.0f;
        else if (ends_with(p->name, "bias") || ends_with(p->name, "qk_norm.temp"))
            fill = 0.0f;
        else
            random = 1; /* matrices, convolution kernels, experts, embeddings */
        const int64_t n = p->numel, nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t j0 = b * BLOCK, j1 = j0 + BLOCK < n ? j0 + BLOCK : n;
            if (!random) {
                for (int64_t j = j0; j < j1; j++) w[j] = fill;
                continue;
            }
            kiln_rng r;
            kiln_rng_seed(&r, mix64(mix64(seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)) + (uint64_t)b));
            for (int64_t j = j0; j < j1; j += 2) {
                double u1 = kiln_rng_uniform(&r), u2 = kiln_rng_uniform(&r);
                if (u1 < 1e-300) u1 = 1e-300;
                const double rad = sqrt(-2.0 * log(u1)) * std, a = 2.0 * M_PI * u2;
                w[j] = (float)(rad * cos(a));
                if (j + 1 < j1) w[j + 1] = (float)(rad * sin(a));
            }
        }
    }
    if (m->cfg.pad_token_id >= 0) /* nn.Embedding zeroes its padding row */
        memset(m->W.embed + m->cfg.pad_token_id * m->cfg.hidden_size, 0, (size_t)m->cfg.hidden_size * sizeof(float));
}

kiln_error *kiln_zaya_check_ids(const kiln_zaya *m, const int64_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return kiln_errorf(KILN_EINVAL, "token id %lld at position %lld is outside the vocabulary 0..%lld",
                               (long long)ids[i], (long long)i, (long long)m->cfg.vocab_size - 1);
    return NULL;
}

static void balancing_name(char *buf, size_t n, int64_t l) {
    snprintf(buf, n, "model.layers.%lld.mlp.gate.balancing_biases", (long long)l);
}

static int is_float_dtype(kiln_dtype dt) {
    return dt == KILN_DT_F32 || dt == KILN_DT_BF16 || dt == KILN_DT_F16 || dt == KILN_DT_F64;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Copy one checkpoint tensor into dst after checking dtype and shape against what the config implies. */
static kiln_error *load_tensor(const kiln_st *st, const char *name, int ndim, const int64_t *shape, float *dst,
                               const char *cfgpath) {
    const kiln_st_tensor *t = kiln_st_find(st, name);
    if (!t) return kiln_errorf(KILN_ENOTFOUND, "tensor '%s' is missing", name);
    if (!is_float_dtype(t->dtype))
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has dtype %s, expected a float type", t->file, name,
                           kiln_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[128], b[128];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, ndim, shape);
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has shape %s but %s implies %s", t->file, name, a, cfgpath, b);
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    return kiln_st_read_f32(t, dst, (size_t)numel);
}

/* Models above this many parameters show a progress bar while loading (reading and converting
 * gigabytes takes seconds); small ones load silently. */
#define LOAD_PROGRESS_MIN_PARAMS (64u * 1000u * 1000u)

static kiln_error *load_weights(kiln_zaya *m, const kiln_st *st, const char *cfgpath) {
    const kiln_zaya_config *c = &m->cfg;
    const int64_t E1 = c->num_experts + 1;
    kiln_progress bar;
    int show = m->numel >= LOAD_PROGRESS_MIN_PARAMS;
    if (show) kiln_progress_start(&bar, "loading", (uint64_t)m->numel, "params");
    uint64_t done = 0;
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param_info *p = &m->params[i];
        kiln_error *e = load_tensor(st, p->name, p->ndim, p->shape, m->w + p->offset, cfgpath);
        if (e) {
            if (show) kiln_progress_finish(&bar);
            return e;
        }
        done += (uint64_t)p->numel;
        if (show) kiln_progress_update(&bar, done);
    }
    if (show) kiln_progress_finish(&bar);
    char name[128];
    for (int64_t l = 0; l < c->num_layers; l++) {
        balancing_name(name, sizeof name, l);
        if (kiln_st_find(st, name)) KILN_TRY(load_tensor(st, name, 1, &E1, m->balancing + l * E1, cfgpath));
        /* else: a non-persistent copy; keep the reference's init (zeros, skip -1) */
    }
    /* Anything else in the checkpoint means it was made for another architecture or shape. */
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        if (kiln_zaya_find_param(m, t->name)) continue;
        if (strstr(t->name, "mlp.gate.balancing_biases")) {
            long long l = -1;
            char tail[8];
            if (sscanf(t->name, "model.layers.%lld.mlp.gate.balancing_biases%7s", &l, tail) == 1 && l >= 0 &&
                l < c->num_layers)
                continue;
        }
        if (c->tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) continue; /* tied: ignored like HF */
        return kiln_errorf(KILN_EFORMAT, "%s: unexpected tensor '%s' (not part of a ZAYA model with this %s)", t->file,
                           t->name, cfgpath);
    }
    return NULL;
}

kiln_error *kiln_zaya_load_dir(const char *dir, kiln_zaya **out) {
    *out = NULL;
    char *cfgpath = kiln_path_join(dir, "config.json");
    if (!cfgpath) return kiln_errorf(KILN_ENOMEM, "%s", dir);
    kiln_zaya_config cfg;
    kiln_error *e = kiln_zaya_config_load(cfgpath, &cfg);
    kiln_zaya *m = NULL;
    kiln_st *st = NULL;
    if (!e) e = kiln_zaya_create(&cfg, &m);
    if (!e) e = kiln_st_open_dir(dir, &st);
    if (!e) e = load_weights(m, st, cfgpath);
    kiln_st_close(st);
    free(cfgpath);
    if (e) {
        kiln_zaya_free(m);
        return kiln_error_wrap(e, "loading model %s", dir);
    }
    *out = m;
    return NULL;
}

kiln_error *kiln_zaya_save_dir(const kiln_zaya *m, const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST)
        return kiln_errorf(KILN_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
    const int64_t L = m->cfg.num_layers, E1 = m->cfg.num_experts + 1;
    size_t n = (size_t)m->nparams + (size_t)L;
    kiln_st_entry *ent = calloc(n, sizeof *ent);
    int64_t(*shapes)[3] = calloc(n, sizeof *shapes);
    char(*names)[128] = calloc((size_t)L + 1, sizeof *names);
    kiln_error *e = NULL;
    if (!ent || !shapes || !names) e = kiln_errorf(KILN_ENOMEM, "%s", dir);
    for (int i = 0; !e && i < m->nparams; i++) {
        const kiln_param_info *p = &m->params[i];
        ent[i] = (kiln_st_entry){p->name, KILN_DT_F32, p->ndim, p->shape, m->w + p->offset};
    }
    for (int64_t l = 0; !e && l < L; l++) {
        balancing_name(names[l], sizeof names[l], l);
        shapes[l][0] = E1;
        ent[m->nparams + l] = (kiln_st_entry){names[l], KILN_DT_F32, 1, shapes[l], m->balancing + l * E1};
    }
    char *path = e ? NULL : kiln_path_join(dir, "model.safetensors");
    const char *meta[] = {"format", "pt", NULL};
    if (!e) e = path ? kiln_st_write(path, ent, n, meta) : kiln_errorf(KILN_ENOMEM, "%s", dir);
    free(path);
    if (!e) {
        char *cp = kiln_path_join(dir, "config.json");
        e = cp ? kiln_zaya_config_save(&m->cfg, cp) : kiln_errorf(KILN_ENOMEM, "%s", dir);
        free(cp);
    }
    free(ent);
    free(shapes);
    free(names);
    return e;
}
