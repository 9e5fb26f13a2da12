/* Model shapes and their parameter counts. The ZAYA count walks the architecture in the order of
 * src/models/zaya_params.c (a test compares it with the allocated table tensor by tensor class),
 * and also sorts each tensor into the optimizer that src/train/optim.c gives it. */
#include <stdio.h>
#include <string.h>

#include "kiln/sizing.h"

void kiln_size_shape_zaya_default(kiln_size_shape *s) {
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    kiln_size_shape_from_zaya(&c, s);
}

void kiln_size_shape_from_zaya(const kiln_zaya_config *c, kiln_size_shape *s) {
    memset(s, 0, sizeof *s);
    s->arch = KILN_ARCH_ZAYA;
    s->vocab = c->vocab_size;
    s->hidden = c->hidden_size;
    s->layers = c->num_layers;
    s->heads = c->num_heads;
    s->kv_heads = c->num_kv_heads;
    s->head_dim = c->head_dim;
    s->experts = c->num_experts;
    s->top_k = c->top_k;
    s->expert_inter = c->moe_intermediate;
    s->router_hidden = c->router_hidden;
    s->cca_time0 = c->cca_time0;
    s->cca_time1 = c->cca_time1;
    s->sliding_window = c->sliding_window;
    for (int64_t l = 0; l < c->num_layers; l++) s->sliding_layers += c->layer_types[l] == KILN_LAYER_HYBRID_SLIDING;
    s->tied = c->tie_word_embeddings;
    s->attention_bias = c->attention_bias;
    s->lm_head_bias = c->lm_head_bias;
}

kiln_error *kiln_size_shape_validate(const kiln_size_shape *s) {
    struct { const char *f; int64_t v, lo; } r[] = {
        {"vocab", s->vocab, 1}, {"hidden", s->hidden, 1}, {"layers", s->layers, 1}, {"heads", s->heads, 1},
        {"kv_heads", s->kv_heads, 1}, {"head_dim", s->head_dim, 1},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo) return kiln_errorf(KILN_EINVAL, "shape: %s = %lld must be at least %lld", r[i].f,
                                                 (long long)r[i].v, (long long)r[i].lo);
    if (s->heads % s->kv_heads)
        return kiln_errorf(KILN_EINVAL, "shape: heads %lld is not a multiple of kv_heads %lld", (long long)s->heads,
                           (long long)s->kv_heads);
    if (s->arch == KILN_ARCH_ZAYA) {
        if (s->experts < 1 || s->top_k < 1 || s->top_k > s->experts || s->expert_inter < 1 || s->router_hidden < 1 ||
            s->cca_time0 < 1 || s->cca_time1 < 1)
            return kiln_errorf(KILN_EINVAL, "shape: experts %lld, top_k %lld, expert width %lld, router %lld, cca "
                               "kernels %lld/%lld must be positive with top_k <= experts",
                               (long long)s->experts, (long long)s->top_k, (long long)s->expert_inter,
                               (long long)s->router_hidden, (long long)s->cca_time0, (long long)s->cca_time1);
        if ((s->kv_heads * s->head_dim) % 2)
            return kiln_errorf(KILN_EINVAL, "shape: kv_heads * head_dim must be even (CCA splits values in halves)");
    } else if (s->ffn < 1) {
        return kiln_errorf(KILN_EINVAL, "shape: ffn = %lld must be positive", (long long)s->ffn);
    }
    if (s->sliding_layers < 0 || s->sliding_layers > s->layers || (s->sliding_layers && s->sliding_window < 1))
        return kiln_errorf(KILN_EINVAL, "shape: %lld sliding layers of %lld need a positive window",
                           (long long)s->sliding_layers, (long long)s->layers);
    return NULL;
}

kiln_error *kiln_size_shape_to_zaya(const kiln_size_shape *s, kiln_zaya_config *c) {
    KILN_TRY(kiln_size_shape_validate(s));
    if (s->arch != KILN_ARCH_ZAYA) return kiln_errorf(KILN_EINVAL, "shape: a dense shape has no ZAYA config");
    if (s->layers > KILN_ZAYA_MAX_LAYERS)
        return kiln_errorf(KILN_EINVAL, "shape: %lld layers exceed %d", (long long)s->layers, KILN_ZAYA_MAX_LAYERS);
    kiln_zaya_config_default(c);
    c->vocab_size = s->vocab;
    c->hidden_size = s->hidden;
    c->num_layers = s->layers;
    c->num_heads = s->heads;
    c->num_kv_heads = s->kv_heads;
    c->head_dim = s->head_dim;
    c->num_experts = s->experts;
    c->top_k = s->top_k;
    c->moe_intermediate = s->expert_inter;
    c->router_hidden = s->router_hidden;
    c->cca_time0 = s->cca_time0;
    c->cca_time1 = s->cca_time1;
    c->sliding_window = s->sliding_layers ? s->sliding_window : 0;
    /* sliding layers interleaved from the first, as HF's default alternation */
    for (int64_t l = 0; l < s->layers; l++)
        c->layer_types[l] = (s->sliding_layers && l * s->sliding_layers / s->layers !=
                             (l + 1) * s->sliding_layers / s->layers) ? KILN_LAYER_HYBRID_SLIDING : KILN_LAYER_HYBRID;
    c->tie_word_embeddings = s->tied;
    c->attention_bias = s->attention_bias;
    c->lm_head_bias = s->lm_head_bias;
    if (c->pad_token_id >= c->vocab_size) c->pad_token_id = -1;
    return kiln_zaya_config_validate(c, "shape");
}

void kiln_size_shape_str(const kiln_size_shape *s, char *buf, size_t cap) {
    if (s->arch == KILN_ARCH_ZAYA)
        snprintf(buf, cap, "zaya h%lld L%lld q%lldx%lld kv%lld E%lld k%lld I%lld V%lld", (long long)s->hidden,
                 (long long)s->layers, (long long)s->heads, (long long)s->head_dim, (long long)s->kv_heads,
                 (long long)s->experts, (long long)s->top_k, (long long)s->expert_inter, (long long)s->vocab);
    else
        snprintf(buf, cap, "dense h%lld L%lld q%lldx%lld kv%lld F%lld V%lld", (long long)s->hidden,
                 (long long)s->layers, (long long)s->heads, (long long)s->head_dim, (long long)s->kv_heads,
                 (long long)s->ffn, (long long)s->vocab);
}

/* One tensor into the totals; `muon`: whether optim.c gives it Muon (2-D and expert matrices
 * other than the embedding and lm_head). */
static void add(kiln_size_params *p, int64_t numel, int muon) {
    p->total += numel;
    if (muon) p->muon += numel;
    else p->adamw += numel;
}

static void count_zaya(const kiln_size_shape *s, kiln_size_params *p) {
    const int64_t H = s->hidden, Q = s->heads * s->head_dim, K = s->kv_heads * s->head_dim, C = Q + K;
    const int64_t R = s->router_hidden, E = s->experts, I = s->expert_inter, ab = s->attention_bias;
    /* attention (CCA): q, k, the two value halves, two convolutions, temperature, o */
    int64_t attn_m = Q * H + K * H + 2 * (K / 2) * H + H * Q;        /* Muon matrices */
    int64_t attn_a = ab * (Q + K + 2 * (K / 2) + H)                   /* biases */
                     + C * s->cca_time0 + C + C * s->head_dim * s->cca_time1 + C + s->kv_heads; /* convs */
    int64_t norms = H + H + 4 * H + 4 * H; /* two RMSNorms, two residual scalings of 4 vectors */
    int64_t router_m = R * H + R * R + R * R + (E + 1) * R;
    int64_t router_a = R + R + R + R; /* down bias, norm, fc1/fc2 biases (+ states scale from layer 1) */
    int64_t experts = E * 2 * I * H + E * H * I;
    for (int64_t l = 0; l < s->layers; l++) {
        add(p, attn_m, 1);
        add(p, attn_a + norms + router_a + (l > 0 ? R : 0), 0);
        add(p, router_m, 1);
        add(p, experts, 1);
    }
    p->attn_per_layer = attn_m + attn_a;
    p->router_per_layer = router_m + router_a + R;
    p->expert_one = 3 * I * H;
    p->experts_total = experts * s->layers;
    add(p, s->vocab * H, 0);   /* embedding */
    add(p, 2 * H + H, 0);      /* input scale and bias, final norm */
    p->embedding = s->vocab * H;
    if (!s->tied) { add(p, s->vocab * H, 0); p->embedding += s->vocab * H; }
    if (s->lm_head_bias) { add(p, s->vocab, 0); p->embedding += s->vocab; }
    p->active = p->total - p->experts_total + s->top_k * p->expert_one * s->layers;
}

static void count_dense(const kiln_size_shape *s, kiln_size_params *p) {
    const int64_t H = s->hidden, Q = s->heads * s->head_dim, K = s->kv_heads * s->head_dim, F = s->ffn;
    int64_t attn_m = Q * H + 2 * K * H + H * Q, attn_a = s->attention_bias * (Q + 2 * K + H);
    for (int64_t l = 0; l < s->layers; l++) {
        add(p, attn_m + 3 * H * F, 1);
        add(p, attn_a + 2 * H, 0);
    }
    p->attn_per_layer = attn_m + attn_a;
    p->mlp_dense_per_layer = 3 * H * F;
    add(p, s->vocab * H + H, 0); /* embedding, final norm */
    p->embedding = s->vocab * H;
    if (!s->tied) { add(p, s->vocab * H, 0); p->embedding += s->vocab * H; }
    if (s->lm_head_bias) { add(p, s->vocab, 0); p->embedding += s->vocab; }
    p->active = p->total;
}

void kiln_size_count(const kiln_size_shape *s, kiln_size_params *p) {
    memset(p, 0, sizeof *p);
    if (s->arch == KILN_ARCH_ZAYA) count_zaya(s, p);
    else count_dense(s, p);
    p->total_nonembed = p->total - p->embedding;
    p->active_nonembed = p->active - p->embedding;
}
