/* Helpers for the ZAYA tests: tiny random configs with every parameter drawn away from init. */
#ifndef KILN_ZAYA_TESTUTIL_H
#define KILN_ZAYA_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/rng.h"
#include "kiln/safetensors.h"
#include "kiln/zaya.h"

/* The HF fixtures under tests/fixtures/zaya/ (made by tests/fixtures/make_zaya_fixtures.py). */
#define ZAYA_FIXTURES {"bf16_sharded", "gqa_untied", "many_experts", "sliding_tied"}

/* A model of fixture NAME's config (FIXTURES_DIR/NAME/config.json), HF-style init, no weights read. */
static inline kiln_error *zaya_fixture_model(const char *fixtures_dir, const char *name, kiln_zaya **m) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s/config.json", fixtures_dir, name);
    kiln_zaya_config c;
    KILN_TRY(kiln_zaya_config_load(path, &c));
    return kiln_zaya_create(&c, m);
}

/* A fixture's token ids: DIR/input.safetensors, tensor input_ids [B,T] (ids malloc'd). */
static inline kiln_error *zaya_fixture_read_ids(const char *dir, int64_t **ids, int64_t *B, int64_t *T) {
    char path[1100];
    snprintf(path, sizeof path, "%s/input.safetensors", dir);
    kiln_st *st = NULL;
    KILN_TRY(kiln_st_open(path, &st));
    const kiln_st_tensor *t = kiln_st_find(st, "input_ids");
    kiln_error *e = NULL;
    if (!t || t->ndim != 2) e = kiln_errorf(KILN_EFORMAT, "%s: bad input_ids", path);
    if (!e) {
        *B = t->shape[0];
        *T = t->shape[1];
        *ids = malloc((size_t)t->numel * sizeof(int64_t));
        e = *ids ? kiln_st_read_i64(t, *ids, (size_t)t->numel) : kiln_errorf(KILN_ENOMEM, "%s", path);
    }
    kiln_st_close(st);
    return e;
}

static inline void tiny_config(kiln_zaya_config *c, int sliding) {
    kiln_zaya_config_default(c);
    c->vocab_size = 40;
    c->hidden_size = 24;
    c->num_layers = 3;
    c->num_heads = 4;
    c->num_kv_heads = 2;
    c->head_dim = 8;
    c->num_experts = 4;
    c->moe_intermediate = 12;
    c->router_hidden = 12;
    c->cca_time0 = 3;
    c->cca_time1 = 2;
    c->attention_bias = 1;
    c->lm_head_bias = 1;
    c->tie_word_embeddings = 0;
    c->partial_rotary[0] = 0.5;
    c->partial_rotary[1] = 0.25;
    c->rope_theta[0] = 100.0;
    c->rope_theta[1] = 1000.0;
    c->eos_token_id = -1;
    if (sliding) {
        c->sliding_window = 3;
        c->layer_types[1] = KILN_LAYER_HYBRID_SLIDING;
    }
}

/* Every weight, scale, bias and temperature away from its init; skip class favoured a little. */
static inline void perturb_params(kiln_zaya *m, uint64_t seed, float skip_bias) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param_info *p = &m->params[i];
        const char *n = p->name;
        size_t L = strlen(n);
        float *w = m->w + p->offset;
        int is_scale = strstr(n, "norm.weight") || (L > 6 && !strcmp(n + L - 6, "_scale"));
        int is_temp = strstr(n, "qk_norm.temp") != NULL;
        int is_bias = L > 4 && !strcmp(n + L - 4, "bias");
        double fan_in = p->shape[p->ndim - 1];
        for (int64_t j = 0; j < p->numel; j++) {
            double z = kiln_rng_normal(&r);
            w[j] = (float)(is_scale ? 1.0 + 0.15 * z
                           : is_temp ? 0.6 + 0.25 * z
                           : is_bias ? 0.1 * z
                           : strstr(n, "embed") ? 0.7 * z
                           : strstr(n, "conv_qk") ? 0.35 * z
                           : z / sqrt(fan_in));
        }
    }
    const int64_t E1 = m->cfg.num_experts + 1;
    for (int64_t l = 0; l < m->cfg.num_layers; l++) {
        for (int64_t e = 0; e < E1; e++) m->balancing[l * E1 + e] = (float)(0.02 * kiln_rng_normal(&r));
        m->balancing[l * E1 + E1 - 1] = skip_bias;
    }
}

#endif
