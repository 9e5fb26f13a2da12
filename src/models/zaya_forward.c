/* ZAYA forward and backward on the CPU, layer by layer, keeping what backward needs.
 * Each step names the reference module it reproduces. Shapes: N = B*T tokens, H hidden,
 * Q = heads*D, K = kv_heads*D, C = Q+K (the CCA convolution channels), R router width. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/nn.h"
#include "zaya_internal.h"

/* ---------- activation storage ---------- */

typedef struct {
    float *fbase;
    int32_t *ibase;
    size_t nf, ni;
} bump;

static float *F(bump *b, int64_t n) {
    float *p = b->fbase ? b->fbase + b->nf : NULL;
    b->nf += (size_t)n;
    return p;
}
static int32_t *Iv(bump *b, int64_t n) {
    int32_t *p = b->ibase ? b->ibase + b->ni : NULL;
    b->ni += (size_t)n;
    return p;
}

static void acts_layout(const kiln_zaya_config *c, kiln_zaya_acts *a, bump *b, int with_probs) {
    const int64_t N = a->B * a->T, H = c->hidden_size, Q = c->num_heads * c->head_dim;
    const int64_t K = c->num_kv_heads * c->head_dim, C = Q + K, R = c->router_hidden;
    const int64_t E1 = c->num_experts + 1, S = N * c->top_k, I = c->moe_intermediate;
    a->x0 = F(b, N * H);
    a->xf = F(b, N * H);
    a->hn = F(b, N * H);
    a->hn_r = F(b, N);
    a->logits = F(b, N * c->vocab_size);
    for (int64_t l = 0; l < c->num_layers; l++) {
        zaya_layer_acts *L = &a->L[l];
        L->x = F(b, N * H);
        L->ln1 = F(b, N * H);
        L->ln1_r = F(b, N);
        L->q = F(b, N * Q);
        L->k = F(b, N * K);
        L->qk = F(b, N * C);
        L->mid = F(b, a->B * (a->T + c->cca_time1 - 1) * C);
        L->conv = F(b, N * C);
        L->qpre = F(b, N * Q);
        L->kpre = F(b, N * K);
        L->qinv = F(b, N * c->num_heads);
        L->kinv = F(b, N * c->num_kv_heads);
        L->qr = F(b, N * Q);
        L->kr = F(b, N * K);
        L->v = F(b, N * K);
        L->vd = F(b, N * K / 2);
        L->probs = with_probs ? F(b, a->B * c->num_heads * a->T * a->T) : NULL;
        L->att = F(b, N * Q);
        L->o = F(b, N * H);
        L->res1 = F(b, N * H);
        L->ln2 = F(b, N * H);
        L->ln2_r = F(b, N);
        L->rdown = F(b, N * R);
        L->rn = F(b, N * R);
        L->rn_r = F(b, N);
        L->f1 = F(b, N * R);
        L->a1 = F(b, N * R);
        L->f2 = F(b, N * R);
        L->a2 = F(b, N * R);
        L->rlogits = F(b, N * E1);
        L->rprobs = F(b, N * E1);
        L->choice = Iv(b, S);
        L->gate = F(b, S);
        L->slot_tok = Iv(b, S);
        L->slot_k = Iv(b, S);
        L->exp_off = Iv(b, E1 + 1);
        L->fill = Iv(b, E1);
        L->xe = F(b, S * H);
        L->gu = F(b, S * 2 * I);
        L->act = F(b, S * I);
        L->ye = F(b, S * H);
        L->moe = F(b, N * H);
    }
}

kiln_error *kiln_zaya_acts_create_ex(const kiln_zaya *m, int64_t B, int64_t T, int with_probs,
                                     kiln_zaya_acts **out) {
    *out = NULL;
    if (B <= 0 || T <= 0) return kiln_errorf(KILN_EINVAL, "activations: batch %lld x seq %lld must be positive",
                                             (long long)B, (long long)T);
    kiln_zaya_acts *a = calloc(1, sizeof *a);
    if (!a) return kiln_errorf(KILN_ENOMEM, "activations");
    a->B = B;
    a->T = T;
    a->L = calloc((size_t)m->cfg.num_layers, sizeof *a->L);
    bump cnt = {0};
    if (a->L) acts_layout(&m->cfg, a, &cnt, with_probs);
    a->pool = a->L ? malloc(cnt.nf * sizeof(float)) : NULL;
    a->ipool = a->L ? malloc((cnt.ni + 1) * sizeof(int32_t)) : NULL;
    if (!a->L || !a->pool || !a->ipool) {
        kiln_zaya_acts_free(a);
        return kiln_errorf(KILN_ENOMEM, "activations for batch %lld x seq %lld (%.1f MB)", (long long)B,
                           (long long)T, cnt.nf * 4.0 / 1e6);
    }
    bump b = {a->pool, a->ipool, 0, 0};
    acts_layout(&m->cfg, a, &b, with_probs);
    *out = a;
    return NULL;
}

kiln_error *kiln_zaya_acts_create(const kiln_zaya *m, int64_t B, int64_t T, kiln_zaya_acts **out) {
    return kiln_zaya_acts_create_ex(m, B, T, 1, out);
}

void kiln_zaya_acts_free(kiln_zaya_acts *a) {
    if (!a) return;
    free(a->L);
    free(a->pool);
    free(a->ipool);
    free(a->scratch);
    free(a);
}

/* ---------- forward ---------- */

kiln_experts experts_of(const kiln_zaya_config *c, zaya_layer_acts *L, int64_t N) {
    return (kiln_experts){N, c->hidden_size, c->moe_intermediate, c->num_experts, c->top_k, L->choice, L->gate,
                          L->exp_off, L->fill, L->slot_tok, L->slot_k, L->nslots, L->xe, L->gu, L->act, L->ye};
}

static void layer_forward(kiln_zaya *m, int64_t li, zaya_layer_acts *L, const float *prev_rdown, float *out,
                          int64_t B, int64_t T, kiln_zaya_cache *cache) {
    const kiln_zaya_config *c = &m->cfg;
    const kiln_zaya_layer_ptrs *W = &m->W.layers[li];
    const int64_t N = B * T, H = c->hidden_size, D = c->head_dim, NH = c->num_heads, KV = c->num_kv_heads;
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV, R = c->router_hidden;
    const int64_t E = c->num_experts, E1 = E + 1, top = c->top_k;
    const int type = c->layer_types[li];
    const float eps = (float)c->rms_norm_eps;
    const int64_t pos0 = cache ? cache->pos : 0;

    /* input_layernorm */
    kiln_rmsnorm_forward(L->ln1, L->ln1_r, L->x, W->ln1, N, H, eps);

    /* ZayaCCAProjection: q/k projections, packed for the convolution */
    kiln_linear_forward(L->q, L->ln1, W->wq, W->bq, N, H, Q);
    kiln_linear_forward(L->k, L->ln1, W->wk, W->bk, N, H, K);
    for (int64_t n = 0; n < N; n++) {
        memcpy(L->qk + n * C, L->q + n * Q, (size_t)Q * sizeof(float));
        memcpy(L->qk + n * C + Q, L->k + n * K, (size_t)K * sizeof(float));
    }
    kiln_conv_shape cs = {B, T, C, NH + KV, c->cca_time0, c->cca_time1};
    const int64_t P = (cs.k0 - 1) + (cs.k1 - 1);
    float *hist = cache && cache->pos > 0 ? cache->hist + li * B * P * C : NULL;
    kiln_cca_conv_forward(L->conv, L->mid, L->qk, hist, W->conv0_w, W->conv0_b, W->conv1_w, W->conv1_b, &cs);
    if (cache && P > 0) { /* keep the last P convolution inputs */
        float *h = cache->hist + li * B * P * C;
        for (int64_t b = 0; b < B; b++)
            for (int64_t u = 0; u < P; u++) {
                int64_t src = T + u; /* padded index of the new history row */
                float *dst = h + (b * P + u) * C;
                if (src >= P) memcpy(dst, L->qk + (b * T + src - P) * C, (size_t)C * sizeof(float));
                else if (cache->pos > 0) memmove(dst, h + (b * P + src) * C, (size_t)C * sizeof(float));
                else memset(dst, 0, (size_t)C * sizeof(float));
            }
    }
    /* q/k residual coupling: q_res = (q + k of its kv head)/2, k_res = mean of its group's q_res */
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++) {
                float qres = (L->q[n * Q + h * D + d] + L->k[n * K + (h / G) * D + d]) * 0.5f;
                L->qpre[n * Q + h * D + d] = L->conv[n * C + h * D + d] + qres;
            }
        for (int64_t j = 0; j < KV; j++)
            for (int64_t d = 0; d < D; d++) {
                float s = 0;
                for (int64_t g = 0; g < G; g++)
                    s += (L->q[n * Q + (j * G + g) * D + d] + L->k[n * K + j * D + d]) * 0.5f;
                L->kpre[n * K + j * D + d] = L->conv[n * C + Q + j * D + d] + s / (float)G;
            }
    }
    /* value: current half and the previous token's delayed projection */
    kiln_linear_forward(L->vd, L->ln1, W->wvd, W->bvd, N, H, K / 2);
    kiln_linear_forward(L->att /* scratch */, L->ln1, W->wvc, W->bvc, N, H, K / 2);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *vr = L->v + (b * T + t) * K;
            memcpy(vr, L->att + (b * T + t) * (K / 2), (size_t)(K / 2) * sizeof(float));
            if (t > 0) memcpy(vr + K / 2, L->vd + (b * T + t - 1) * (K / 2), (size_t)(K / 2) * sizeof(float));
            else if (cache && cache->pos > 0)
                memcpy(vr + K / 2, cache->vprev + (li * B + b) * (K / 2), (size_t)(K / 2) * sizeof(float));
            else if (W->bvd) memcpy(vr + K / 2, W->bvd, (size_t)(K / 2) * sizeof(float));
            else memset(vr + K / 2, 0, (size_t)(K / 2) * sizeof(float));
        }
    if (cache)
        for (int64_t b = 0; b < B; b++)
            memcpy(cache->vprev + (li * B + b) * (K / 2), L->vd + (b * T + T - 1) * (K / 2),
                   (size_t)(K / 2) * sizeof(float));

    /* ZayaQKNorm, then partial RoPE */
    kiln_l2norm_scale_forward(L->qr, L->qinv, L->qpre, NULL, N, NH, D, sqrtf((float)D), FLT_EPSILON);
    kiln_l2norm_scale_forward(L->kr, L->kinv, L->kpre, W->temp, N, KV, D, sqrtf((float)D), FLT_EPSILON);
    kiln_rope_forward(L->qr, m->inv_freq[type], B, T, NH, D, m->rot_dim[type], pos0);
    kiln_rope_forward(L->kr, m->inv_freq[type], B, T, KV, D, m->rot_dim[type], pos0);

    /* causal GQA attention (sliding window on hybrid_sliding layers) */
    kiln_attn_shape as = {B, T, T, T, NH, KV, D, type == KILN_LAYER_HYBRID_SLIDING ? c->sliding_window : 0,
                          1.0f / sqrtf((float)D)};
    if (cache) {
        float *kc = cache->kc + li * B * cache->cap * K, *vc = cache->vc + li * B * cache->cap * K;
        for (int64_t b = 0; b < B; b++) {
            memcpy(kc + (b * cache->cap + pos0) * K, L->kr + b * T * K, (size_t)(T * K) * sizeof(float));
            memcpy(vc + (b * cache->cap + pos0) * K, L->v + b * T * K, (size_t)(T * K) * sizeof(float));
        }
        as.tk = pos0 + T;
        as.tk_cap = cache->cap;
        kiln_attention_forward(L->att, NULL, L->qr, kc, vc, &as);
    } else {
        kiln_attention_forward(L->att, L->probs, L->qr, L->kr, L->v, &as);
    }
    kiln_linear_forward(L->o, L->att, W->wo, W->bo, N, Q, H);

    /* post_attention_residual_scale: res1 = (o + hb)*hs + (x + rb)*rs */
    kiln_scale_shift_forward(L->res1, L->o, W->attn_hb, W->attn_hs, N, H, 0);
    kiln_scale_shift_forward(L->res1, L->x, W->attn_rb, W->attn_rs, N, H, 1);
    kiln_rmsnorm_forward(L->ln2, L->ln2_r, L->res1, W->ln2, N, H, eps);

    /* ZayaRouter: down-projection, depth averaging with the previous layer's state, MLP, softmax */
    kiln_linear_forward(L->rdown, L->ln2, W->r_down_w, W->r_down_b, N, H, R);
    if (W->r_state_scale && prev_rdown)
        for (int64_t n = 0; n < N; n++)
            for (int64_t r = 0; r < R; r++) L->rdown[n * R + r] += prev_rdown[n * R + r] * W->r_state_scale[r];
    kiln_rmsnorm_forward(L->rn, L->rn_r, L->rdown, W->r_norm, N, R, eps);
    kiln_linear_forward(L->f1, L->rn, W->r_fc1_w, W->r_fc1_b, N, R, R);
    kiln_gelu_forward(L->a1, L->f1, N * R);
    kiln_linear_forward(L->f2, L->a1, W->r_fc2_w, W->r_fc2_b, N, R, R);
    kiln_gelu_forward(L->a2, L->f2, N * R);
    kiln_linear_forward(L->rlogits, L->a2, W->r_out_w, NULL, N, R, E1);
    kiln_softmax_forward(L->rprobs, L->rlogits, N, E1);
    const float *bias = m->balancing + li * E1;
    kiln_route_topk(L->choice, L->gate, L->rprobs, bias, N, E1, top); /* skip class: gate 0, output zero */

    /* ZayaExperts */
    kiln_experts ex = experts_of(c, L, N);
    kiln_experts_forward(&ex, L->moe, L->ln2, W->gate_up, W->down);
    L->nslots = ex.nslots;

    /* post_mlp_residual_scale */
    kiln_scale_shift_forward(out, L->moe, W->mlp_hb, W->mlp_hs, N, H, 0);
    kiln_scale_shift_forward(out, L->res1, W->mlp_rb, W->mlp_rs, N, H, 1);
}

kiln_error *kiln_zaya_forward_impl(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids, float *logits,
                                   kiln_zaya_cache *cache) {
    const kiln_zaya_config *c = &m->cfg;
    const int64_t B = a->B, T = a->T, N = B * T, H = c->hidden_size;
    KILN_TRY(kiln_zaya_check_ids(m, ids, N));
    kiln_embedding_forward(a->x0, m->W.embed, ids, N, H);
    float *x = c->num_layers ? a->L[0].x : a->xf;
    kiln_scale_shift_forward(x, a->x0, m->W.in_bias, m->W.in_scale, N, H, 0);
    for (int64_t l = 0; l < c->num_layers; l++) {
        float *out = l + 1 < c->num_layers ? a->L[l + 1].x : a->xf;
        layer_forward(m, l, &a->L[l], l > 0 ? a->L[l - 1].rdown : NULL, out, B, T, cache);
    }
    kiln_rmsnorm_forward(a->hn, a->hn_r, a->xf, m->W.norm, N, H, (float)c->rms_norm_eps);
    kiln_linear_forward(a->logits, a->hn, m->W.lm_head_w, m->W.lm_head_b, N, H, c->vocab_size);
    if (logits && logits != a->logits) memcpy(logits, a->logits, (size_t)(N * c->vocab_size) * sizeof(float));
    if (cache) cache->pos += T;
    return NULL;
}

kiln_error *kiln_zaya_forward(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids, float *logits, double *loss) {
    KILN_TRY(kiln_zaya_forward_impl(m, a, ids, logits, NULL));
    if (loss) *loss = kiln_cross_entropy(NULL, a->logits, ids, a->B, a->T, m->cfg.vocab_size);
    return NULL;
}

const float *kiln_zaya_acts_logits(const kiln_zaya_acts *a) { return a->logits; }

void kiln_zaya_route_counts(const kiln_zaya *m, const kiln_zaya_acts *a, int64_t *counts) {
    const int64_t E1 = m->cfg.num_experts + 1, S = a->B * a->T * m->cfg.top_k;
    for (int64_t l = 0; l < m->cfg.num_layers; l++)
        for (int64_t s = 0; s < S; s++) counts[l * E1 + a->L[l].choice[s]]++;
}
