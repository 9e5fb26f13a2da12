/* FLOPs per token and memory per GPU. Conventions (docs/sizing.md): a GEMM of an [n, in] input by
 * an [out, in] weight costs 2·in·out FLOPs per token forward, and its backward (dX and dW) twice
 * that; attention costs 4·(query channels) FLOPs per visible key forward and 2.5× that backward
 * (FlashAttention, which recomputes the scores); the GPU trainer keeps bf16 weights, fp32
 * gradients (the flat buffer reduce-scattered in place) and, sharded by ZeRO-1, the fp32 master
 * copy and the optimizer states. */
#include <string.h>

#include "kiln/sizing.h"

double kiln_size_visible_keys(int64_t T, int64_t W) {
    if (T <= 0) return 0;
    double t = (double)T, w = (double)W;
    if (W <= 0 || W >= T) return (t + 1) / 2;
    return (w * (w + 1) / 2 + (t - w) * w) / t;
}

/* Mean over layers of the visible keys of a query (sliding layers see at most the window). */
static double mean_visible(const kiln_size_shape *s, int64_t seq) {
    double full = kiln_size_visible_keys(seq, 0), slid = kiln_size_visible_keys(seq, s->sliding_window);
    return ((double)(s->layers - s->sliding_layers) * full + (double)s->sliding_layers * slid) / (double)s->layers;
}

void kiln_size_flops_per_token(const kiln_size_shape *s, int64_t seq, int recompute, kiln_size_flops *f) {
    memset(f, 0, sizeof *f);
    const double H = (double)s->hidden, Q = (double)(s->heads * s->head_dim), K = (double)(s->kv_heads * s->head_dim);
    const double L = (double)s->layers, V = (double)s->vocab;
    double per_layer;
    if (s->arch == KILN_ARCH_ZAYA) {
        const double R = (double)s->router_hidden, E = (double)s->experts, I = (double)s->expert_inter;
        per_layer = Q * H + K * H + K * H + H * Q                  /* q, k, v halves, o */
                    + R * H + 2 * R * R + (E + 1) * R              /* router */
                    + (double)s->top_k * 3 * I * H;                /* experts */
        const double C = Q + K;
        f->conv = 2 * L * (C * (double)s->cca_time0 + C * (double)s->head_dim * (double)s->cca_time1);
    } else {
        per_layer = Q * H + 2 * K * H + H * Q + 3 * H * (double)s->ffn;
    }
    f->gemm = 2 * (L * per_layer + V * H);
    f->attn = 4 * Q * mean_visible(s, seq) * L;
    f->fwd = f->gemm + f->attn + f->conv;
    f->bwd = 2 * f->gemm + 2 * f->conv + 2.5 * f->attn;
    f->recompute = recompute ? f->fwd : 0;
    f->train = f->fwd + f->bwd + f->recompute;
}

void kiln_size_train_default(kiln_size_train *t) {
    memset(t, 0, sizeof *t);
    t->gpus = 8;
    t->micro_batch = 1;
    t->seq = 4096;
    t->muon = 1;
    t->recompute = 0;
    t->weight_bytes = 2;
    t->grad_bytes = 4;
    t->ns_precision = 2; /* bf16, the training config's default */
}

/* bf16 elements a layer saves per token for its backward (flash attention: no scores). */
static double saved_per_token(const kiln_size_shape *s) {
    const double H = (double)s->hidden, Q = (double)(s->heads * s->head_dim), K = (double)(s->kv_heads * s->head_dim);
    const double heads = (double)s->heads;
    if (s->arch == KILN_ARCH_ZAYA) {
        const double C = Q + K, R = (double)s->router_hidden, E = (double)s->experts, I = (double)s->expert_inter;
        const double k = (double)s->top_k;
        /* residual in, norm out, 2 residual scalings, norm 2 in/out, o out, mlp out: 8H; q|k through
         * projections, two convolutions, QK norm and RoPE: 5C; values K; attention out Q; fp32 log-sum-exp;
         * router: down, averaged state, norm, fc1, GELU, fc2 (6R) and fp32 logits; per routed slot the
         * gathered input, gate|up, SwiGLU, down out */
        return 8 * H + 5 * C + K + Q + 2 * heads + 6 * R + 2 * (E + 1) + k * (2 * H + 3 * I);
    }
    const double F = (double)s->ffn;
    return 6 * H + 3 * Q + 3 * K + 2 * heads + 4 * F;
}

void kiln_size_memory_train(const kiln_size_shape *s, const kiln_size_train *t, kiln_size_memory *m) {
    memset(m, 0, sizeof *m);
    kiln_size_params p;
    kiln_size_count(s, &p);
    const double P = (double)p.total, G = (double)(t->gpus > 0 ? t->gpus : 1);
    m->weights = (double)t->weight_bytes * P;
    m->grads = (double)t->grad_bytes * P;
    m->master = t->weight_bytes < 4 ? 4 * P / G : 0;
    m->optim = (t->muon ? 4 * (double)p.muon + 8 * (double)p.adamw : 8 * P) / G;
    const double tokens = (double)t->micro_batch * (double)t->seq, per = 2 * saved_per_token(s);
    const double L = (double)s->layers, H = (double)s->hidden;
    /* recomputation keeps each layer's input and rebuilds one layer at a time */
    m->activations = t->recompute ? tokens * (L * 2 * H + per) : tokens * L * per;
    m->activations += tokens * 2 * H * 2; /* embedding output and final norm */
    m->logits = tokens * (double)s->vocab * 6; /* bf16 logits and their fp32 gradient */
    m->total = m->weights + m->grads + m->master + m->optim + m->activations + m->logits;
}

void kiln_size_kv_cache(const kiln_size_shape *s, int64_t batch, int64_t capacity, double bytes, kiln_size_kv *k) {
    memset(k, 0, sizeof *k);
    const double L = (double)s->layers, B = (double)batch, K = (double)(s->kv_heads * s->head_dim);
    k->kv = 2 * L * B * (double)capacity * K * bytes;
    if (s->arch == KILN_ARCH_ZAYA) {
        const double C = (double)(s->heads * s->head_dim) + K;
        k->conv_state = L * B * (double)((s->cca_time0 - 1) + (s->cca_time1 - 1)) * C * bytes;
        k->vprev = L * B * (K / 2) * bytes;
    }
    k->total = k->kv + k->conv_state + k->vprev;
}
