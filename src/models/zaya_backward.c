/* ZAYA backward on the CPU: the forward of zaya_forward.c in reverse, step by step.
 * Gradients accumulate into m->g (bound as m->G). The routing decision itself has no
 * gradient; the chosen class's probability (the gate) does, as in the reference. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/nn.h"
#include "zaya_internal.h"

/* Scratch for one layer's backward, sized for the acts' B and T; reused across layers. */
typedef struct {
    float *dres, *dnext;        /* [N,H] grad of the layer output / input (swapped per layer) */
    float *dres1, *dln, *dmoe;  /* [N,H] */
    float *dye, *dact, *dgu, *dxe; /* [S,H], [S,I], [S,2I], [S,H] */
    float *dgate;               /* [S] */
    float *dprobs, *dlogit;     /* [N,E+1] */
    float *da2, *df2, *da1, *df1, *drn; /* [N,R] */
    float *drs, *drs_prev;      /* [N,R] grad of the router state: this layer's, the previous layer's */
    float *datt, *dqr, *dq;     /* [N,Q] */
    float *dkr, *dv, *dk;       /* [N,K] */
    float *dvd;                 /* [N,K/2] */
    float *dconv, *dqk;         /* [N,C] */
    float *dmid;                /* [B,T+k1-1,C] */
    float *dlogits;             /* [N,V] */
} bwd_scratch;

static size_t scratch_layout(const kiln_zaya_config *c, int64_t B, int64_t T, float *base, bwd_scratch *s) {
    const int64_t N = B * T, H = c->hidden_size, Q = c->num_heads * c->head_dim;
    const int64_t K = c->num_kv_heads * c->head_dim, C = Q + K, R = c->router_hidden;
    const int64_t S = N * c->top_k, I = c->moe_intermediate, E1 = c->num_experts + 1;
    size_t off = 0;
#define A(field, n) (s->field = base ? base + off : NULL, off += (size_t)(n))
    A(dres, N * H); A(dnext, N * H); A(dres1, N * H); A(dln, N * H); A(dmoe, N * H);
    A(dye, S * H); A(dact, S * I); A(dgu, S * 2 * I); A(dxe, S * H); A(dgate, S);
    A(dprobs, N * E1); A(dlogit, N * E1);
    A(da2, N * R); A(df2, N * R); A(da1, N * R); A(df1, N * R); A(drn, N * R); A(drs, N * R); A(drs_prev, N * R);
    A(datt, N * Q); A(dqr, N * Q); A(dq, N * Q); A(dkr, N * K); A(dv, N * K); A(dk, N * K); A(dvd, N * K / 2);
    A(dconv, N * C); A(dqk, N * C); A(dmid, B * (T + c->cca_time1 - 1) * C); A(dlogits, N * c->vocab_size);
#undef A
    return off;
}

#define ZERO(p, n) memset((p), 0, (size_t)(n) * sizeof(float))

/* dout: grad of this layer's output; on return s->dnext holds the grad of its input x,
 * and s->drs_prev the grad of the previous layer's router state. s->drs holds, on entry,
 * the grad reaching this layer's router state from the next layer (zeros for the last). */
static void layer_backward(kiln_zaya *m, int64_t li, const zaya_layer_acts *L, const float *prev_rdown,
                           const float *dout, bwd_scratch *s, int64_t B, int64_t T) {
    const kiln_zaya_config *c = &m->cfg;
    const kiln_zaya_layer_ptrs *W = &m->W.layers[li], *Gd = &m->G.layers[li];
    const int64_t N = B * T, H = c->hidden_size, D = c->head_dim, NH = c->num_heads, KV = c->num_kv_heads;
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV, R = c->router_hidden;
    const int64_t E = c->num_experts, E1 = E + 1, top = c->top_k;
    const int type = c->layer_types[li];

    /* post_mlp_residual_scale */
    ZERO(s->dmoe, N * H);
    ZERO(s->dres1, N * H);
    kiln_scale_shift_backward(s->dmoe, Gd->mlp_hb, Gd->mlp_hs, dout, L->moe, W->mlp_hb, W->mlp_hs, N, H);
    kiln_scale_shift_backward(s->dres1, Gd->mlp_rb, Gd->mlp_rs, dout, L->res1, W->mlp_rb, W->mlp_rs, N, H);

    /* experts: gate * SwiGLU(x) per slot */
    ZERO(s->dln, N * H);
    kiln_experts ex = experts_of(c, (zaya_layer_acts *)L, N);
    kiln_experts_scratch xs = {s->dye, s->dact, s->dgu, s->dxe};
    kiln_experts_backward(&ex, s->dln, s->dgate, Gd->gate_up, Gd->down, s->dmoe, W->gate_up, W->down, &xs);

    /* router: the gate is the unbiased probability of the chosen (non-skip) class */
    ZERO(s->dprobs, N * E1);
    kiln_route_gate_backward(s->dprobs, s->dgate, L->choice, N, E1, top);
    ZERO(s->dlogit, N * E1);
    kiln_softmax_backward(s->dlogit, s->dprobs, L->rprobs, N, E1);
    ZERO(s->da2, N * R);
    kiln_linear_backward(s->da2, Gd->r_out_w, NULL, s->dlogit, L->a2, W->r_out_w, N, R, E1);
    ZERO(s->df2, N * R);
    kiln_gelu_backward(s->df2, s->da2, L->f2, N * R);
    ZERO(s->da1, N * R);
    kiln_linear_backward(s->da1, Gd->r_fc2_w, Gd->r_fc2_b, s->df2, L->a1, W->r_fc2_w, N, R, R);
    ZERO(s->df1, N * R);
    kiln_gelu_backward(s->df1, s->da1, L->f1, N * R);
    ZERO(s->drn, N * R);
    kiln_linear_backward(s->drn, Gd->r_fc1_w, Gd->r_fc1_b, s->df1, L->rn, W->r_fc1_w, N, R, R);
    /* s->drs already holds what the next layer's depth averaging sent back */
    kiln_rmsnorm_backward(s->drs, Gd->r_norm, s->drn, L->rdown, W->r_norm, L->rn_r, N, R);
    ZERO(s->drs_prev, N * R);
    if (W->r_state_scale && prev_rdown)
        for (int64_t n = 0; n < N; n++)
            for (int64_t r = 0; r < R; r++) {
                float g = s->drs[n * R + r];
                s->drs_prev[n * R + r] = g * W->r_state_scale[r];
                Gd->r_state_scale[r] += g * prev_rdown[n * R + r];
            }
    kiln_linear_backward(s->dln, Gd->r_down_w, Gd->r_down_b, s->drs, L->ln2, W->r_down_w, N, H, R);

    /* post_attention_layernorm, post_attention_residual_scale */
    kiln_rmsnorm_backward(s->dres1, Gd->ln2, s->dln, L->res1, W->ln2, L->ln2_r, N, H);
    ZERO(s->dln, N * H); /* now: grad of the o_proj output */
    ZERO(s->dnext, N * H);
    kiln_scale_shift_backward(s->dln, Gd->attn_hb, Gd->attn_hs, s->dres1, L->o, W->attn_hb, W->attn_hs, N, H);
    kiln_scale_shift_backward(s->dnext, Gd->attn_rb, Gd->attn_rs, s->dres1, L->x, W->attn_rb, W->attn_rs, N, H);

    /* o_proj and attention */
    ZERO(s->datt, N * Q);
    kiln_linear_backward(s->datt, Gd->wo, Gd->bo, s->dln, L->att, W->wo, N, Q, H);
    ZERO(s->dqr, N * Q);
    ZERO(s->dkr, N * K);
    ZERO(s->dv, N * K);
    kiln_attn_shape as = {B, T, T, T, NH, KV, D, type == KILN_LAYER_HYBRID_SLIDING ? c->sliding_window : 0,
                          1.0f / sqrtf((float)D)};
    kiln_attention_backward(s->dqr, s->dkr, s->dv, s->datt, L->probs, L->qr, L->kr, L->v, &as);

    /* value: current half straight from ln1, delayed half shifted by one token */
    ZERO(s->dln, N * H); /* now: grad of ln1's output */
    ZERO(s->dvd, N * K / 2);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *g = s->dv + (b * T + t) * K + K / 2;
            if (t > 0) {
                float *dst = s->dvd + (b * T + t - 1) * (K / 2);
                for (int64_t j = 0; j < K / 2; j++) dst[j] += g[j];
            } else if (Gd->bvd) { /* the first token's delayed value is v_proj_delayed(0) = its bias */
                for (int64_t j = 0; j < K / 2; j++) Gd->bvd[j] += g[j];
            }
        }
    for (int64_t n = 0; n < N; n++) memcpy(s->dk + n * (K / 2), s->dv + n * K, (size_t)(K / 2) * sizeof(float));
    kiln_linear_backward(s->dln, Gd->wvc, Gd->bvc, s->dk /* dv current, packed */, L->ln1, W->wvc, N, H, K / 2);
    kiln_linear_backward(s->dln, Gd->wvd, Gd->bvd, s->dvd, L->ln1, W->wvd, N, H, K / 2);

    /* RoPE (inverse rotation), then the QK norm */
    kiln_rope_backward(s->dqr, m->inv_freq[type], B, T, NH, D, m->rot_dim[type], 0);
    kiln_rope_backward(s->dkr, m->inv_freq[type], B, T, KV, D, m->rot_dim[type], 0);
    ZERO(s->dq, N * Q); /* grad of qpre */
    ZERO(s->dk, N * K); /* grad of kpre */
    kiln_l2norm_scale_backward(s->dq, NULL, s->dqr, L->qpre, NULL, L->qinv, N, NH, D, sqrtf((float)D), FLT_EPSILON);
    kiln_l2norm_scale_backward(s->dk, Gd->temp, s->dkr, L->kpre, W->temp, L->kinv, N, KV, D, sqrtf((float)D),
                               FLT_EPSILON);

    /* residual coupling and the convolutions; dqr/dkr are reused for the projection grads */
    float *dqp = s->dqr, *dkp = s->dkr;
    ZERO(dqp, N * Q);
    ZERO(dkp, N * K);
    for (int64_t n = 0; n < N; n++) {
        memcpy(s->dconv + n * C, s->dq + n * Q, (size_t)Q * sizeof(float));
        memcpy(s->dconv + n * C + Q, s->dk + n * K, (size_t)K * sizeof(float));
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++) {
                float dqres = s->dq[n * Q + h * D + d] + s->dk[n * K + (h / G) * D + d] / (float)G;
                dqp[n * Q + h * D + d] += 0.5f * dqres;
                dkp[n * K + (h / G) * D + d] += 0.5f * dqres;
            }
    }
    kiln_conv_shape cs = {B, T, C, NH + KV, c->cca_time0, c->cca_time1};
    ZERO(s->dqk, N * C);
    kiln_cca_conv_backward(s->dqk, Gd->conv0_w, Gd->conv0_b, Gd->conv1_w, Gd->conv1_b, s->dmid, s->dconv, L->qk,
                           NULL, L->mid, W->conv0_w, W->conv1_w, &cs);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < Q; j++) dqp[n * Q + j] += s->dqk[n * C + j];
        for (int64_t j = 0; j < K; j++) dkp[n * K + j] += s->dqk[n * C + Q + j];
    }
    kiln_linear_backward(s->dln, Gd->wq, Gd->bq, dqp, L->ln1, W->wq, N, H, Q);
    kiln_linear_backward(s->dln, Gd->wk, Gd->bk, dkp, L->ln1, W->wk, N, H, K);

    /* input_layernorm */
    kiln_rmsnorm_backward(s->dnext, Gd->ln1, s->dln, L->x, W->ln1, L->ln1_r, N, H);
}

kiln_error *kiln_zaya_backward(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids) {
    const kiln_zaya_config *c = &m->cfg;
    const int64_t B = a->B, T = a->T, N = B * T, H = c->hidden_size, V = c->vocab_size;
    if (!m->g) KILN_TRY(kiln_zaya_grads_enable(m));
    if (!a->L[0].probs && c->num_layers)
        return kiln_errorf(KILN_EINVAL, "backward: these activations were made without attention probabilities");
    bwd_scratch s;
    size_t need = scratch_layout(c, B, T, NULL, &s);
    if (a->scratch_len < need) {
        free(a->scratch);
        a->scratch = malloc(need * sizeof(float));
        a->scratch_len = a->scratch ? need : 0;
        if (!a->scratch) return kiln_errorf(KILN_ENOMEM, "backward scratch (%.1f MB)", need * 4.0 / 1e6);
    }
    scratch_layout(c, B, T, a->scratch, &s);

    /* loss -> logits -> lm_head -> final norm */
    kiln_cross_entropy(s.dlogits, a->logits, ids, B, T, V);
    ZERO(s.dln, N * H);
    kiln_linear_backward(s.dln, m->G.lm_head_w, m->G.lm_head_b, s.dlogits, a->hn, m->W.lm_head_w, N, H, V);
    ZERO(s.dres, N * H);
    kiln_rmsnorm_backward(s.dres, m->G.norm, s.dln, a->xf, m->W.norm, a->hn_r, N, H);

    ZERO(s.drs, N * c->router_hidden);
    for (int64_t l = c->num_layers - 1; l >= 0; l--) {
        layer_backward(m, l, &a->L[l], l > 0 ? a->L[l - 1].rdown : NULL, s.dres, &s, B, T);
        float *t = s.dres; s.dres = s.dnext; s.dnext = t;         /* grad flows to the previous layer */
        t = s.drs; s.drs = s.drs_prev; s.drs_prev = t;
    }

    /* input hidden-state scale/bias, then the embedding (the pad row gets nothing) */
    ZERO(s.dln, N * H);
    kiln_scale_shift_backward(s.dln, m->G.in_bias, m->G.in_scale, s.dres, a->x0, m->W.in_bias, m->W.in_scale, N, H);
    kiln_embedding_backward(m->G.embed, s.dln, ids, N, H, c->pad_token_id);
    return NULL;
}
