/* Step time, throughput and inference latency of one shape on one profile.
 *
 * Training (per GPU, ZeRO-1 data parallel): every linear layer is three GEMMs per micro-batch
 * (forward y = x·Wᵀ, dX, dW, shaped as the trainer calls them), the experts' GEMMs run at the
 * balanced tokens·top_k/experts rows each; attention runs at the profile's attention efficiency
 * for the head dim; elementwise work (norms, residual scaling, SwiGLU, convolutions) is
 * memory-bound traffic; then the optimizer (memory-bound, plus Muon's Newton-Schulz GEMMs on the
 * owned matrices) and the ZeRO-1 reduce-scatter of fp32 gradients and all-gather of bf16
 * weights, not overlapped. Inference: prefill is the forward at batch 1; a decode step is the sum
 * of per-kernel times with each GEMM bounded below by reading its weights (memory-bandwidth bound
 * at small batch) and attention by reading the KV cache. */
#include <math.h>
#include <string.h>

#include "kiln/sizing.h"
#include "sizing_internal.h"

void kiln_size_setup_default(kiln_size_setup *u) {
    memset(u, 0, sizeof *u);
    u->seq = 4096;
    u->tokens_per_step = 4 << 20;
    kiln_size_train_default(&u->train);
}

int64_t kiln_size_step_tokens(const kiln_size_setup *u, int64_t *micro_batches) {
    const int64_t per_micro = u->train.gpus * u->train.micro_batch * u->seq;
    const int64_t mbs = per_micro > 0 ? (u->tokens_per_step + per_micro - 1) / per_micro : 0;
    if (micro_batches) *micro_batches = mbs;
    return mbs * per_micro;
}

kiln_error *kiln_size_check_run(const char *what, int64_t gpus, int64_t micro_batch, int64_t seq,
                                int64_t tokens_per_step) {
    const struct { const char *name; int64_t v, max; } f[] = {
        {"gpus", gpus, KILN_SIZE_MAX_GPUS}, {"micro-batch", micro_batch, KILN_SIZE_MAX_MICRO_BATCH},
        {"sequence", seq, KILN_SIZE_MAX_SEQ}, {"tokens per step", tokens_per_step, KILN_SIZE_MAX_TOKENS_PER_STEP}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (i == 3 && tokens_per_step < 0) continue;
        if (f[i].v < 1 || f[i].v > f[i].max)
            return kiln_errorf(KILN_EINVAL, "%s: %s %lld is outside 1..%lld", what, f[i].name, (long long)f[i].v,
                               (long long)f[i].max);
    }
    if (micro_batch * seq > KILN_SIZE_MAX_MICRO_TOKENS) /* both bounded above: the product fits */
        return kiln_errorf(KILN_EINVAL, "%s: a micro-batch of %lld x %lld = %lld tokens is more than %lld", what,
                           (long long)micro_batch, (long long)seq, (long long)(micro_batch * seq),
                           (long long)KILN_SIZE_MAX_MICRO_TOKENS);
    return NULL;
}

/* A linear layer over `tokens` rows: forward, or forward + dX + dW. */
static double lin(const kiln_hw_profile *p, int64_t tokens, int64_t out, int64_t in, int train) {
    double t = kiln_hw_gemm_time(p, tokens, out, in, NULL);
    if (train) t += kiln_hw_gemm_time(p, tokens, in, out, NULL) + kiln_hw_gemm_time(p, out, in, tokens, NULL);
    return t;
}

/* The same linear layer of `groups` experts in grouped GEMMs. */
static double glin(const kiln_hw_profile *p, double groups, int64_t rows, int64_t out, int64_t in, int train) {
    double t = kiln_hw_gemm_time_grouped(p, groups, rows, out, in, NULL);
    if (train)
        t += kiln_hw_gemm_time_grouped(p, groups, rows, in, out, NULL) + kiln_hw_gemm_time_grouped(p, groups, out, in, rows, NULL);
    return t;
}

/* All linear layers of one layer except the experts'. */
static double layer_dense_gemms(const kiln_size_shape *s, const kiln_hw_profile *p, int64_t n, int train) {
    const int64_t H = s->hidden, Q = s->heads * s->head_dim, K = s->kv_heads * s->head_dim;
    double t = lin(p, n, Q, H, train) + lin(p, n, K, H, train) + lin(p, n, H, Q, train);
    if (s->arch == KILN_ARCH_ZAYA) {
        const int64_t R = s->router_hidden;
        t += 2 * lin(p, n, K / 2, H, train);
        t += lin(p, n, R, H, train) + 2 * lin(p, n, R, R, train) + lin(p, n, s->experts + 1, R, train);
    } else {
        t += lin(p, n, K, H, train) + lin(p, n, 2 * s->ffn, H, train) + lin(p, n, H, s->ffn, train);
    }
    return t;
}

/* The experts of one layer over n tokens, `active` experts sharing the n·top_k slots evenly. */
static double layer_expert_gemms(const kiln_size_shape *s, const kiln_hw_profile *p, int64_t n, double active,
                                 int train) {
    if (s->arch != KILN_ARCH_ZAYA) return 0;
    int64_t rows = (int64_t)ceil((double)n * (double)s->top_k / active);
    if (rows < 1) rows = 1;
    return glin(p, active, rows, 2 * s->expert_inter, s->hidden, train) + glin(p, active, rows, s->hidden, s->expert_inter, train);
}

/* Forward attention time of one micro-batch (all layers), and its backward. */
static void attention(const kiln_size_shape *s, const kiln_hw_profile *p, int64_t b, int64_t seq, double *fwd,
                      double *bwd) {
    const double Q = (double)(s->heads * s->head_dim);
    double vis = ((double)(s->layers - s->sliding_layers) * kiln_size_visible_keys(seq, 0) +
                  (double)s->sliding_layers * kiln_size_visible_keys(seq, s->sliding_window));
    double flops = 4 * Q * vis * (double)(b * seq);
    *fwd = flops / (p->peak_bf16 * 1e12 * kiln_hw_attn_eff(p, s->head_dim, 0));
    *bwd = 2.5 * flops / (p->peak_bf16 * 1e12 * kiln_hw_attn_eff(p, s->head_dim, 1));
}

/* Muon's Newton-Schulz (5 steps of X·Xᵀ, the polynomial, B·X) on an r x c matrix, r <= c. */
static double ns_time(const kiln_hw_profile *p, double mats, int64_t rows, int64_t cols) {
    int64_t r = rows < cols ? rows : cols, c = rows < cols ? cols : rows;
    return 5 * (kiln_hw_gemm_time_grouped(p, mats, r, r, c, NULL) + kiln_hw_gemm_time_grouped(p, mats, r, r, r, NULL) +
                kiln_hw_gemm_time_grouped(p, mats, r, c, r, NULL));
}

static double muon_time(const kiln_size_shape *s, const kiln_hw_profile *p) {
    const int64_t H = s->hidden, Q = s->heads * s->head_dim, K = s->kv_heads * s->head_dim;
    double t = ns_time(p, 1, Q, H) + ns_time(p, 1, K, H) + ns_time(p, 1, H, Q);
    if (s->arch == KILN_ARCH_ZAYA) {
        const int64_t R = s->router_hidden;
        t += 2 * ns_time(p, 1, K / 2, H) + ns_time(p, 1, R, H) + 2 * ns_time(p, 1, R, R) + ns_time(p, 1, s->experts + 1, R);
        t += ns_time(p, (double)s->experts, 2 * s->expert_inter, H) + ns_time(p, (double)s->experts, H, s->expert_inter);
    } else {
        t += ns_time(p, 1, K, H) + ns_time(p, 1, 2 * s->ffn, H) + ns_time(p, 1, H, s->ffn);
    }
    return t * (double)s->layers;
}

kiln_error *kiln_size_predict(const kiln_size_shape *s, const kiln_hw_profile *p, const kiln_size_setup *u,
                              kiln_size_pred *r) {
    memset(r, 0, sizeof *r);
    KILN_TRY(kiln_size_shape_validate(s));
    const kiln_size_train *tr = &u->train;
    if ((tr->weight_bytes != 2 && tr->weight_bytes != 4) || (tr->grad_bytes != 2 && tr->grad_bytes != 4))
        return kiln_errorf(KILN_EINVAL, "predict: weights of %d and gradients of %d bytes (2 or 4)", tr->weight_bytes,
                           tr->grad_bytes);
    /* bounded above too: past the limits the step's token counts overflow int64 and the times turn negative */
    KILN_TRY(kiln_size_check_run("predict", tr->gpus, tr->micro_batch, u->seq, u->tokens_per_step));
    kiln_size_train t = *tr;
    t.seq = u->seq;
    kiln_size_count(s, &r->params);
    kiln_size_flops_per_token(s, u->seq, t.recompute, &r->flops);
    kiln_size_memory_train(s, &t, &r->mem);
    r->fits = r->mem.total <= 0.9 * p->mem_gib * 1073741824.0;

    const int64_t n = t.micro_batch * u->seq, L = s->layers;
    const double P = (double)r->params.total, G = (double)t.gpus;
    /* training micro-batch */
    double dense = layer_dense_gemms(s, p, n, 1) * (double)L;
    double experts = layer_expert_gemms(s, p, n, (double)s->experts, 1) * (double)L;
    double head = lin(p, n, s->vocab, s->hidden, 1);
    double af, ab;
    attention(s, p, t.micro_batch, u->seq, &af, &ab);
    r->t_gemm = dense + experts + head;
    r->t_attn = af + ab;
    r->t_expert_gemm = experts;
    if (s->arch == KILN_ARCH_ZAYA && experts > 0)
        r->expert_tflops = 18.0 * (double)n * (double)s->top_k * (double)s->hidden * (double)s->expert_inter *
                           (double)L / experts / 1e12;
    r->attn_tflops = 3.5 * r->flops.attn * (double)n / r->t_attn / 1e12;
    if (t.recompute) {
        r->t_gemm += (layer_dense_gemms(s, p, n, 0) + layer_expert_gemms(s, p, n, (double)s->experts, 0)) * (double)L;
        r->t_attn += af;
    }
    /* elementwise traffic: each saved activation written and read in the forward, twice that backward */
    kiln_size_train t0 = t;
    t0.recompute = 0;
    kiln_size_memory m0;
    kiln_size_memory_train(s, &t0, &m0);
    r->t_mem = (m0.activations * 3 * (t.recompute ? 4.0 / 3 : 1) + m0.logits * 2) / (p->mem_gbs * 1e9);
    r->t_micro = r->t_gemm + r->t_attn + r->t_mem;

    /* optimizer step */
    int64_t per_micro = t.gpus * n;
    r->grad_accum = (u->tokens_per_step + per_micro - 1) / per_micro;
    /* read the gradient shard, read and write the master (or fp32 weights), write the working weights */
    double opt_bytes = P / G * ((double)t.grad_bytes + 8 + (t.weight_bytes < 4 ? (double)t.weight_bytes : 0)) +
                       2 * r->mem.optim;
    r->t_optim = opt_bytes / (p->mem_gbs * 1e9) + (t.muon ? muon_time(s, p) / G : 0);
    r->t_comm = kiln_hw_comm_time(p, 0, (double)t.grad_bytes * P, t.gpus) +
                kiln_hw_comm_time(p, 1, (double)t.weight_bytes * P, t.gpus);
    r->t_step = (double)r->grad_accum * r->t_micro + r->t_optim + r->t_comm;
    r->tokens_per_s = (double)(r->grad_accum * n) / r->t_step;
    r->mfu = (r->flops.fwd + r->flops.bwd) * r->tokens_per_s / (p->peak_bf16 * 1e12);

    /* inference: prefill of one prompt of seq tokens */
    double pf = (layer_dense_gemms(s, p, u->seq, 0) + layer_expert_gemms(s, p, u->seq, (double)s->experts, 0)) * (double)L +
                lin(p, u->seq, s->vocab, s->hidden, 0);
    double paf, pab;
    attention(s, p, 1, u->seq, &paf, &pab);
    pf += paf + m0.activations / (double)t.micro_batch / (p->mem_gbs * 1e9);
    r->prefill_tokens_per_s = (double)u->seq / pf;
    /* decode steps at batch 1 and 64 with a cache of seq tokens */
    const int64_t batches[2] = {1, 64};
    for (int i = 0; i < 2; i++) {
        int64_t b = batches[i];
        double active = s->arch == KILN_ARCH_ZAYA
                            ? (double)s->experts * (1 - pow(1 - (double)s->top_k / (double)s->experts, (double)b)) : 0;
        kiln_size_kv kv;
        kiln_size_kv_cache(s, b, u->seq, 2, &kv);
        double d = (layer_dense_gemms(s, p, b, 0) + (active > 0 ? layer_expert_gemms(s, p, b, active, 0) : 0)) * (double)L +
                   lin(p, b, s->vocab, s->hidden, 0) + kv.total / (p->mem_gbs * 1e9);
        if (i == 0) r->decode_ms_b1 = d * 1e3;
        else r->decode_ms_b64 = d * 1e3;
    }
    kiln_size_kv kv64;
    kiln_size_kv_cache(s, 64, u->seq, 2, &kv64);
    r->kv_gib_b64 = kv64.total / 1073741824.0;
    return NULL;
}
