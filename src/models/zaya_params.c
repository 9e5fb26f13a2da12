/* The ZAYA parameter table: names (HF's), shapes, and where each lives in the flat buffer.
 * One walk over the architecture both builds the table and binds pointers, so the layout
 * is written down exactly once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/zaya.h"

typedef struct {
    kiln_param_info *info; /* NULL: only count */
    int n;
    size_t off;
    float *base;           /* NULL: do not bind */
} walker;

static float *add(walker *wk, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2}, numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (wk->info) {
        kiln_param_info *p = &wk->info[wk->n];
        snprintf(p->name, sizeof p->name, "%s", name);
        p->ndim = ndim;
        memcpy(p->shape, shape, sizeof shape);
        p->numel = numel;
        p->offset = wk->off;
    }
    float *ptr = wk->base ? wk->base + wk->off : NULL;
    wk->n++;
    wk->off += (size_t)numel;
    return ptr;
}

/* Walk every parameter in storage order; fills P's pointers when wk->base is set. */
static void walk(const kiln_zaya_config *c, walker *wk, kiln_zaya_ptrs *P) {
    const int64_t H = c->hidden_size, Q = c->num_heads * c->head_dim, K = c->num_kv_heads * c->head_dim;
    const int64_t C = Q + K, R = c->router_hidden, E = c->num_experts, I = c->moe_intermediate;
    const int ab = c->attention_bias;
    char n[96];
    kiln_zaya_ptrs dummy = {0};
    kiln_zaya_layer_ptrs dl;
    if (!P) P = &dummy;
    P->embed = add(wk, "model.embed_tokens.weight", 2, c->vocab_size, H, 0);
    P->in_scale = add(wk, "model.input_hidden_states_scale", 1, H, 0, 0);
    P->in_bias = add(wk, "model.input_hidden_states_bias", 1, H, 0, 0);
    for (int64_t l = 0; l < c->num_layers; l++) {
        kiln_zaya_layer_ptrs *L = P->layers ? &P->layers[l] : &dl;
        memset(L, 0, sizeof *L);
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%lld." fmt, (long long)l), n)
        L->ln1 = add(wk, NAME("input_layernorm.weight"), 1, H, 0, 0);
        L->wq = add(wk, NAME("self_attn.qkv_proj.q_proj.weight"), 2, Q, H, 0);
        if (ab) L->bq = add(wk, NAME("self_attn.qkv_proj.q_proj.bias"), 1, Q, 0, 0);
        L->wk = add(wk, NAME("self_attn.qkv_proj.k_proj.weight"), 2, K, H, 0);
        if (ab) L->bk = add(wk, NAME("self_attn.qkv_proj.k_proj.bias"), 1, K, 0, 0);
        L->wvc = add(wk, NAME("self_attn.qkv_proj.v_proj_current.weight"), 2, K / 2, H, 0);
        if (ab) L->bvc = add(wk, NAME("self_attn.qkv_proj.v_proj_current.bias"), 1, K / 2, 0, 0);
        L->wvd = add(wk, NAME("self_attn.qkv_proj.v_proj_delayed.weight"), 2, K / 2, H, 0);
        if (ab) L->bvd = add(wk, NAME("self_attn.qkv_proj.v_proj_delayed.bias"), 1, K / 2, 0, 0);
        L->conv0_w = add(wk, NAME("self_attn.qkv_proj.conv_qk_depthwise.weight"), 3, C, 1, c->cca_time0);
        L->conv0_b = add(wk, NAME("self_attn.qkv_proj.conv_qk_depthwise.bias"), 1, C, 0, 0);
        L->conv1_w = add(wk, NAME("self_attn.qkv_proj.conv_qk_grouped.weight"), 3, C, c->head_dim, c->cca_time1);
        L->conv1_b = add(wk, NAME("self_attn.qkv_proj.conv_qk_grouped.bias"), 1, C, 0, 0);
        L->temp = add(wk, NAME("self_attn.qk_norm.temp"), 1, c->num_kv_heads, 0, 0);
        L->wo = add(wk, NAME("self_attn.o_proj.weight"), 2, H, Q, 0);
        if (ab) L->bo = add(wk, NAME("self_attn.o_proj.bias"), 1, H, 0, 0);
        L->ln2 = add(wk, NAME("post_attention_layernorm.weight"), 1, H, 0, 0);
        L->attn_hs = add(wk, NAME("post_attention_residual_scale.hidden_states_scale"), 1, H, 0, 0);
        L->attn_hb = add(wk, NAME("post_attention_residual_scale.hidden_states_bias"), 1, H, 0, 0);
        L->attn_rs = add(wk, NAME("post_attention_residual_scale.residual_scale"), 1, H, 0, 0);
        L->attn_rb = add(wk, NAME("post_attention_residual_scale.residual_bias"), 1, H, 0, 0);
        L->r_down_w = add(wk, NAME("mlp.gate.down_proj.weight"), 2, R, H, 0);
        L->r_down_b = add(wk, NAME("mlp.gate.down_proj.bias"), 1, R, 0, 0);
        if (l > 0) L->r_state_scale = add(wk, NAME("mlp.gate.router_states_scale"), 1, R, 0, 0);
        L->r_norm = add(wk, NAME("mlp.gate.router_mlp.norm.weight"), 1, R, 0, 0);
        L->r_fc1_w = add(wk, NAME("mlp.gate.router_mlp.fc1.weight"), 2, R, R, 0);
        L->r_fc1_b = add(wk, NAME("mlp.gate.router_mlp.fc1.bias"), 1, R, 0, 0);
        L->r_fc2_w = add(wk, NAME("mlp.gate.router_mlp.fc2.weight"), 2, R, R, 0);
        L->r_fc2_b = add(wk, NAME("mlp.gate.router_mlp.fc2.bias"), 1, R, 0, 0);
        L->r_out_w = add(wk, NAME("mlp.gate.router_mlp.out_proj.weight"), 2, E + 1, R, 0);
        L->gate_up = add(wk, NAME("mlp.experts.gate_up_proj"), 3, E, 2 * I, H);
        L->down = add(wk, NAME("mlp.experts.down_proj"), 3, E, H, I);
        L->mlp_hs = add(wk, NAME("post_mlp_residual_scale.hidden_states_scale"), 1, H, 0, 0);
        L->mlp_hb = add(wk, NAME("post_mlp_residual_scale.hidden_states_bias"), 1, H, 0, 0);
        L->mlp_rs = add(wk, NAME("post_mlp_residual_scale.residual_scale"), 1, H, 0, 0);
        L->mlp_rb = add(wk, NAME("post_mlp_residual_scale.residual_bias"), 1, H, 0, 0);
#undef NAME
    }
    P->norm = add(wk, "model.norm.weight", 1, H, 0, 0);
    P->lm_head_w = c->tie_word_embeddings ? P->embed : add(wk, "lm_head.weight", 2, c->vocab_size, H, 0);
    P->lm_head_b = c->lm_head_bias ? add(wk, "lm_head.bias", 1, c->vocab_size, 0, 0) : NULL;
}

/* Build the table (m->params, m->nparams, m->numel). */
kiln_error *kiln_zaya_build_params(kiln_zaya *m) {
    walker count = {0};
    walk(&m->cfg, &count, NULL);
    m->params = calloc((size_t)count.n, sizeof *m->params);
    if (!m->params) return kiln_errorf(KILN_ENOMEM, "parameter table of %d entries", count.n);
    walker wk = {m->params, 0, 0, NULL};
    walk(&m->cfg, &wk, NULL);
    m->nparams = wk.n;
    m->numel = wk.off;
    return NULL;
}

/* Point P's fields into base (m->w or m->g). P->layers must have num_layers entries. */
void kiln_zaya_bind(const kiln_zaya *m, float *base, kiln_zaya_ptrs *P) {
    walker wk = {NULL, 0, 0, base};
    walk(&m->cfg, &wk, P);
}

const kiln_param_info *kiln_zaya_find_param(const kiln_zaya *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}
