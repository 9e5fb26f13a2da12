/* The step of `kiln train --device cuda` by the op classes of its per-op profile (KILN_CUDA_PROFILE=1),
 * each from the profile's measured tables of kiln's own kernels:
 *  - linear layers and the LM head: every GEMM the layer runs (forward y = x·Wᵀ [N,out,in], dX [N,in,out],
 *    dW [out,in,N]) from the GEMM table, an exact measured shape first (kiln bench gemm --model);
 *  - attention: the timed kernel of the same (batch, seq, heads, KV heads, head dim, window) (kiln bench
 *    attention --device cuda), else the nearest timed shape's rate on this shape's FLOPs, else the
 *    efficiency table;
 *  - experts: the timed op of the same (tokens, hidden, width, experts, top-k) (kiln bench moe --device
 *    cuda), else the nearest timed shape's rate, else grouped GEMMs plus their gather/scatter traffic;
 *  - memory-bound ops (norms, QK norm + RoPE, the pointwise glue, cross-entropy, embedding, gradient norm,
 *    the optimizer): the bytes each call moves over the bandwidth the membw copy sweep measured at that
 *    size (small calls are slower);
 *  - CCA convolutions (SIMT f32 tiles): their FLOPs over the fp32 peak at the GEMM efficiency;
 *  - work the profiler does not see: the gradient buffers the backward zeroes (cudaMemsetAsync, outside
 *    the timed ops), as bytes written over the sweep's bandwidth;
 *  - a class with a scale in the profile's kernel_rates (measured time / this model's time on a calibration
 *    shape: bench/size_validate.sh), its own or its group's, is the model's time times that scale: the size
 *    dependence stays the model's (bytes over the sweep at that size, FLOPs), the kernels' own efficiency
 *    is measured. Groups make this robust to kernels being fused or renamed (the trainer's classes change
 *    as its kernels do).
 * The bytes per call follow src/models/zaya_cuda.c's forward and backward (bf16 activations, f32 residual
 * stream, f32 router logits); docs/sizing.md lists them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln/sizing.h"
#include "sizing_internal.h"

const char *kiln_size_op_group(const char *c) {
    if (!strncmp(c, "linear", 6) || !strncmp(c, "LM head", 7)) return "GEMMs";
    if (!strncmp(c, "attention", 9)) return "attention";
    if (!strncmp(c, "experts", 7)) return "experts";
    if (!strncmp(c, "CCA conv", 8)) return "CCA convolutions";
    if (!strncmp(c, "optimizer", 9) || !strncmp(c, "bf16 weight copy", 16) || !strncmp(c, "gradient norm", 13))
        return "optimizer"; /* passes over the parameters */
    if (!strncmp(c, "outside", 7)) return "outside the profiled ops";
    return "memory-bound ops";
}

static kiln_size_op_class *cls(kiln_size_cuda_step *r, const char *name, int bytes) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].cls, name)) return &r->c[i];
    if (r->n == KILN_SIZE_MAX_CLASSES) return &r->c[r->n - 1];
    kiln_size_op_class *c = &r->c[r->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->cls, sizeof c->cls, "%s", name);
    snprintf(c->group, sizeof c->group, "%s", kiln_size_op_group(name));
    c->bytes = bytes;
    return c;
}

/* Copy bandwidth (GB/s) for a kernel moving `bytes`: the membw sweep, linear in log2(bytes), clamped. */
static double bw_at(const kiln_hw_profile *p, double bytes) {
    if (!p->nbw) return p->mem_gbs;
    double x = log2(bytes > 1 ? bytes : 1), lo_x = -1e300, hi_x = 1e300, lo = 0, hi = 0;
    for (int i = 0; i < p->nbw; i++) {
        double px = log2(p->bw[i].bytes);
        if (px <= x && px > lo_x) lo_x = px, lo = p->bw[i].gbs;
        if (px >= x && px < hi_x) hi_x = px, hi = p->bw[i].gbs;
    }
    if (lo_x < -1e299) return hi;
    if (hi_x > 1e299 || hi_x - lo_x < 1e-12) return lo;
    return lo + (hi - lo) * (x - lo_x) / (hi_x - lo_x);
}

/* `calls` kernels of one class, each moving `bytes`. */
static void mem(const kiln_hw_profile *p, kiln_size_cuda_step *r, const char *name, double calls, double bytes) {
    if (calls <= 0 || bytes <= 0) return;
    kiln_size_op_class *c = cls(r, name, 1);
    c->work += calls * bytes;
    c->ms += calls * bytes / (bw_at(p, bytes) * 1e9) * 1e3;
    snprintf(c->how, sizeof c->how, "bytes / membw copy sweep");
}

static void flops(kiln_size_cuda_step *r, const char *name, double f, double ms, const char *how) {
    kiln_size_op_class *c = cls(r, name, 0);
    c->work += f;
    c->ms += ms;
    snprintf(c->how, sizeof c->how, "%s", how);
}

/* A linear layer over n rows: `nf` forwards into `fwd`, `nb` backwards (dX + dW) into `bwd`. */
static void linear(const kiln_hw_profile *p, kiln_size_cuda_step *r, const char *fwd, const char *bwd, double nf,
                   double nb, int64_t n, int64_t out, int64_t in) {
    double f = 2.0 * (double)n * (double)out * (double)in;
    flops(r, fwd, nf * f, nf * kiln_hw_gemm_time(p, n, out, in, NULL) * 1e3, "GEMM table");
    flops(r, bwd, nb * 2 * f,
          nb * (kiln_hw_gemm_time(p, n, in, out, NULL) + kiln_hw_gemm_time(p, out, in, n, NULL)) * 1e3, "GEMM table");
}

static double attn_flops(int64_t B, int64_t T, int64_t NH, int64_t D, int64_t W) {
    return 4.0 * (double)B * (double)NH * (double)D * kiln_size_visible_keys(T, W) * (double)T;
}

/* One layer's attention, forward and backward, in ms. */
static void attention(const kiln_hw_profile *p, const kiln_size_shape *s, int64_t B, int64_t T, int64_t W,
                      double *fwd, double *bwd, const char **how) {
    const double f = attn_flops(B, T, s->heads, s->head_dim, W);
    const kiln_hw_attn_timed *best = NULL;
    double best_d = 1e300;
    for (int i = 0; i < p->nattn_t; i++) {
        const kiln_hw_attn_timed *a = &p->attn_t[i];
        if (a->head_dim != s->head_dim || (a->window > 0) != (W > 0)) continue;
        /* distance in log2 over the work's factors; the group size (heads per KV head) counts too */
        double d = fabs(log2((double)a->batch * (double)a->seq / ((double)B * (double)T))) +
                   fabs(log2((double)a->seq / (double)T)) + fabs(log2((double)a->heads / (double)s->heads)) +
                   fabs(log2((double)(a->heads * s->kv_heads) / (double)(s->heads * a->kv_heads))) +
                   (W > 0 ? fabs(log2((double)a->window / (double)W)) : 0);
        if (d < best_d) best_d = d, best = a;
    }
    if (best && best_d < 1e-9) {
        *fwd = best->fwd_us * 1e-3, *bwd = best->bwd_us * 1e-3, *how = "timed kernel, same shape";
        return;
    }
    if (best) {
        double bf = attn_flops(best->batch, best->seq, best->heads, best->head_dim, best->window);
        *fwd = f / bf * best->fwd_us * 1e-3, *bwd = f / bf * best->bwd_us * 1e-3;
        *how = "nearest timed kernel's rate";
        return;
    }
    *fwd = f / (p->peak_bf16 * 1e12 * kiln_hw_attn_eff(p, s->head_dim, 0)) * 1e3;
    *bwd = 2.5 * f / (p->peak_bf16 * 1e12 * kiln_hw_attn_eff(p, s->head_dim, 1)) * 1e3;
    *how = "attention efficiency table";
}

/* One layer's experts over n tokens, forward and backward, in ms. */
static void experts(const kiln_hw_profile *p, const kiln_size_shape *s, int64_t n, double *fwd, double *bwd,
                    const char **how) {
    const double f = 6.0 * (double)n * (double)s->top_k * (double)s->hidden * (double)s->expert_inter;
    const double rows = (double)n * (double)s->top_k / (double)s->experts;
    const kiln_hw_moe_timed *best = NULL;
    double best_d = 1e300;
    for (int i = 0; i < p->nmoe_t; i++) {
        const kiln_hw_moe_timed *m = &p->moe_t[i];
        double mrows = (double)m->tokens * (double)m->top_k / (double)m->experts;
        double d = fabs(log2(mrows / rows)) + fabs(log2((double)m->hidden / (double)s->hidden)) +
                   fabs(log2((double)m->inter / (double)s->expert_inter)) +
                   fabs(log2((double)m->experts / (double)s->experts)) + fabs(log2((double)m->top_k / (double)s->top_k));
        if (d < best_d) best_d = d, best = m;
    }
    if (best && best_d < 1e-9 && best->tokens == n) {
        *fwd = best->fwd_us * 1e-3, *bwd = best->bwd_us * 1e-3, *how = "timed op, same shape";
        return;
    }
    if (best) {
        double bf = 6.0 * (double)best->tokens * (double)best->top_k * (double)best->hidden * (double)best->inter;
        *fwd = f / bf * best->fwd_us * 1e-3, *bwd = f / bf * best->bwd_us * 1e-3;
        *how = "nearest timed op's rate";
        return;
    }
    /* grouped GEMMs (gate_up [rows, 2I, H], down [rows, H, I] per expert) and the gather / SwiGLU / scatter */
    const double E = (double)s->experts, H = (double)s->hidden, I = (double)s->expert_inter, S = (double)n * (double)s->top_k;
    int64_t m = (int64_t)ceil(rows);
    double g_f = kiln_hw_gemm_time_grouped(p, E, m, 2 * s->expert_inter, s->hidden, NULL) +
                 kiln_hw_gemm_time_grouped(p, E, m, s->hidden, s->expert_inter, NULL);
    double g_b = kiln_hw_gemm_time_grouped(p, E, m, s->hidden, 2 * s->expert_inter, NULL) +
                 kiln_hw_gemm_time_grouped(p, E, 2 * s->expert_inter, s->hidden, m, NULL) +
                 kiln_hw_gemm_time_grouped(p, E, m, s->expert_inter, s->hidden, NULL) +
                 kiln_hw_gemm_time_grouped(p, E, s->hidden, s->expert_inter, m, NULL);
    double glue_f = S * (2 * H + 2 * H + 2 * 2 * I + 2 * I) + (double)n * 4 * H; /* gather, SwiGLU, scatter */
    double glue_b = 2 * glue_f;
    *fwd = (g_f + glue_f / (bw_at(p, glue_f) * 1e9)) * 1e3;
    *bwd = (g_b + glue_b / (bw_at(p, glue_b) * 1e9)) * 1e3;
    *how = "grouped GEMM model";
}

typedef struct {
    const kiln_hw_profile *p;
    kiln_size_cuda_step *r;
    const char *name;
    int muon;    /* Muon on: its tensors take Muon's passes */
    int ns_steps;
    int ns_precision; /* kiln_size_train.ns_precision */
} opt_walk;

/* The optimizer runs one kernel per tensor (zaya_cuda_train.c): small tensors pay the small-kernel rate.
 * AdamW moves 30 bytes an element (w, g, m, v read; w, m, v and the bf16 w written); Muon's momentum 16
 * (g, state read; state, u written) and update 14 (w, u read; w, bf16 w written), and between them the
 * Newton-Schulz iteration: per step on each r x c matrix (r <= c) X·Xᵀ, the polynomial's B = bA + cA² and
 * B·X (3 x 2r²c + 2r³ FLOPs) at the GEMM efficiency of the peak of optim.muon_ns_precision's arithmetic: bf16
 * (the default), TF32 (half the bf16 peak on H100/H200) or strict f32. */
static void opt_tensor(void *ctx, const kiln_size_tensor *x) {
    opt_walk *o = ctx;
    if (!(x->muon && o->muon)) {
        mem(o->p, o->r, o->name, 1, 30 * (double)x->numel);
        return;
    }
    mem(o->p, o->r, o->name, 1, 16 * (double)x->numel);
    mem(o->p, o->r, o->name, 1, 14 * (double)x->numel);
    double r = (double)(x->rows < x->cols ? x->rows : x->cols), c = (double)(x->rows < x->cols ? x->cols : x->rows);
    double f = (double)o->ns_steps * (double)x->mats * (4 * r * r * c + 2 * r * r * r);
    const double peak = o->ns_precision == 2   ? o->p->peak_bf16
                        : o->ns_precision == 1 ? o->p->peak_bf16 / 2
                                               : (o->p->peak_fp32 > 0 ? o->p->peak_fp32 : o->p->peak_bf16 / 16);
    double rate = peak * (o->p->gemm_efficiency > 0 ? o->p->gemm_efficiency : 0.5);
    kiln_size_op_class *k = cls(o->r, o->name, 1);
    k->ms += f / (rate * 1e12) * 1e3;
}

static const kiln_hw_rate *rate_of(const kiln_hw_profile *p, const char *name) {
    for (int i = 0; i < p->nrate; i++)
        if (!strcmp(p->rate[i].cls, name)) return &p->rate[i];
    return NULL;
}

kiln_error *kiln_size_cuda_step_predict(const kiln_size_shape *s, const kiln_hw_profile *p, const kiln_size_setup *u,
                                        kiln_size_cuda_step *r) {
    memset(r, 0, sizeof *r);
    KILN_TRY(kiln_size_shape_validate(s));
    if (s->arch != KILN_ARCH_ZAYA)
        return kiln_errorf(KILN_EINVAL, "kiln's CUDA trainer trains ZAYA shapes (this one is dense)");
    const kiln_size_train *t = &u->train;
    KILN_TRY(kiln_size_check_run("CUDA step", t->gpus, t->micro_batch, u->seq, u->tokens_per_step));
    const int64_t B = t->micro_batch, T = u->seq, N = B * T, L = s->layers, V = s->vocab;
    const int64_t H = s->hidden, NH = s->heads, KV = s->kv_heads, D = s->head_dim, Q = NH * D, K = KV * D, C = Q + K;
    const int64_t R = s->router_hidden, E1 = s->experts + 1, I = s->expert_inter;
    const double n = (double)N, S = n * (double)s->top_k, Ld = (double)L;
    const int64_t per_micro = t->gpus * N;
    r->grad_accum = (u->tokens_per_step + per_micro - 1) / per_micro;
    const double A = (double)r->grad_accum;
    /* recomputation re-runs every layer's forward but the last before its backward */
    const double fw = 1 + (t->recompute ? (Ld - 1) / Ld : 0);

    /* ---- GEMMs ---- */
    const char *lf = "linear (cuBLASLt) fwd", *lb = "linear (cuBLASLt) bwd";
    /* CCA's four projections (q, k, the value halves): one GEMM of Q + 2K outputs without biases (zaya_cuda.c's
     * proj_view), four with */
    const int64_t outs[9] = {Q, K, K / 2, K / 2, H, R, R, R, E1}, ins[9] = {H, H, H, H, Q, H, R, R, R};
    if (!s->attention_bias) linear(p, r, lf, lb, A * Ld * fw, A * Ld, N, Q + 2 * K, H);
    for (int i = s->attention_bias ? 0 : 4; i < 9; i++) linear(p, r, lf, lb, A * Ld * fw, A * Ld, N, outs[i], ins[i]);
    linear(p, r, "LM head (cuBLASLt) fwd", "LM head (cuBLASLt) bwd", A, A, N, V, H);

    /* ---- attention ---- */
    for (int slid = 0; slid < 2; slid++) {
        double layers = slid ? (double)s->sliding_layers : (double)(s->layers - s->sliding_layers);
        if (layers <= 0) continue;
        int64_t W = slid ? s->sliding_window : 0;
        double af, ab;
        const char *how;
        attention(p, s, B, T, W, &af, &ab, &how);
        double f = attn_flops(B, T, NH, D, W);
        flops(r, "attention (flash) fwd", A * layers * fw * f, A * layers * fw * af, how);
        flops(r, "attention (flash) bwd", A * layers * 2.5 * f, A * layers * ab, how);
    }

    /* ---- experts ---- */
    {
        double ef, eb;
        const char *how;
        experts(p, s, N, &ef, &eb, &how);
        double f = 6.0 * S * (double)H * (double)I;
        flops(r, "experts (dispatch + grouped GEMMs) fwd", A * Ld * fw * f, A * Ld * fw * ef, how);
        flops(r, "experts (dispatch + grouped GEMMs) bwd", A * Ld * 2 * f, A * Ld * eb, how);
    }

    /* ---- CCA convolutions: depthwise (k0 taps) then grouped (D inputs x k1 taps) per channel ---- */
    {
        double f = 2.0 * n * (double)C * ((double)s->cca_time0 + (double)D * (double)s->cca_time1);
        double rate = p->peak_fp32 > 0 ? p->peak_fp32 : p->peak_bf16 / 16;
        double eff = p->gemm_efficiency > 0 ? p->gemm_efficiency : 0.5;
        flops(r, "CCA convolutions fwd", A * Ld * fw * f, A * Ld * fw * f / (rate * 1e12 * eff) * 1e3,
              "fp32 peak x GEMM efficiency");
        flops(r, "CCA convolutions bwd", A * Ld * 2 * f, A * Ld * 2 * f / (rate * 1e12 * eff) * 1e3,
              "fp32 peak x GEMM efficiency");
    }

    /* ---- memory-bound ops, per micro-batch: calls x bytes per call ---- */
    const double nH = n * (double)H, nR = n * (double)R, nE = n * (double)E1, nC = n * (double)C;
    const double nQ = n * (double)Q, nK = n * (double)K, AL = A * Ld, ALf = A * Ld * fw;
    const char *rf = "RMSNorm fwd", *rb = "RMSNorm bwd", *pf = "pointwise + glue fwd", *pb = "pointwise + glue bwd";
    mem(p, r, rf, 2 * ALf, 6 * nH + 4 * n);   /* ln1, ln2: f32 in, bf16 out, rstd */
    mem(p, r, rf, ALf, 4 * nR + 4 * n);       /* the router's norm, bf16 */
    mem(p, r, rf, A, 6 * nH + 4 * n);         /* the final norm */
    mem(p, r, rb, 2 * AL, 14 * nH);           /* dy bf16, x f32, dx f32 accumulated */
    mem(p, r, rb, AL, 6 * nR);
    mem(p, r, rb, A, 14 * nH);
    mem(p, r, "QK norm + RoPE fwd", ALf, 4 * nQ + 4 * n * (double)NH);
    mem(p, r, "QK norm + RoPE fwd", ALf, 4 * nK + 4 * n * (double)KV);
    mem(p, r, "QK norm + RoPE bwd", AL, 6 * nQ + 4 * n * (double)NH);
    mem(p, r, "QK norm + RoPE bwd", AL, 6 * nK + 4 * n * (double)KV);
    /* forward glue: pack q|k, the q/k coupling, the value shift, o to f32, four residual scalings,
     * router depth averaging (from layer 1), two GELUs, softmax, top-k */
    mem(p, r, pf, ALf, 4 * nC);
    mem(p, r, pf, ALf, 6 * nC);
    mem(p, r, pf, ALf, 4 * nK);
    mem(p, r, pf, ALf, 6 * nH);
    mem(p, r, pf, 2 * ALf, 8 * nH);
    mem(p, r, pf, 2 * ALf, 12 * nH);
    mem(p, r, pf, A * (Ld - 1) * fw, 6 * nR);
    mem(p, r, pf, 2 * ALf, 4 * nR);
    mem(p, r, pf, ALf, 8 * nE);
    mem(p, r, pf, ALf, 4 * nE + 8 * S);
    mem(p, r, pf, A, 8 * nH);                 /* input scale and bias */
    /* the backward's three conversions to bf16 are profiled as forward glue */
    mem(p, r, pf, AL, 6 * nE);
    mem(p, r, pf, 2 * AL, 6 * nH);
    /* backward glue: four residual-scaling backwards, the gate, softmax, two GELUs, depth averaging,
     * value shift, two coupling passes, the input scaling */
    mem(p, r, pb, 4 * AL, 16 * nH);
    mem(p, r, pb, AL, 4 * nE + 8 * S);
    mem(p, r, pb, AL, 16 * nE);
    mem(p, r, pb, 2 * AL, 6 * nR);
    mem(p, r, pb, AL, 18 * nR);
    mem(p, r, pb, AL, 4 * nK);
    mem(p, r, pb, AL, 4 * nC);
    mem(p, r, pb, AL, 6 * nC);
    mem(p, r, pb, A, 16 * nH);
    mem(p, r, "cross-entropy fwd", A, 2 * n * (double)V);
    mem(p, r, "cross-entropy bwd", A, 6 * n * (double)V);
    mem(p, r, "embedding fwd", A, 8 * nH);
    mem(p, r, "embedding bwd", A, 12 * nH);

    /* ---- outside the profiled ops: the backward's cudaMemsetAsync of accumulated gradients (per layer:
     * dmoe, dres1, dln2f, do32, dnext f32 [N,H]; dln1 bf16; datt [N,Q]; dprobs, dlogit [N,E1]; da2, da1, drn
     * [N,R]; per micro-batch dhn, dres, dx0) and the gradients the backward adds to, before each step ---- */
    const char *zs = "outside the profiled ops"; /* memsets, host work, gaps */
    mem(p, r, zs, 5 * AL, 4 * nH);
    mem(p, r, zs, AL, 2 * nH + 2 * nQ + 8 * nE + 6 * nR);
    mem(p, r, zs, A, 10 * nH);

    /* ---- once per step: gradient norm, optimizer (one kernel per tensor), bf16 copy, collectives ---- */
    kiln_size_cuda_memory cm;
    KILN_TRY(kiln_size_cuda_memory_train(s, t, 0, &cm));
    const double G = (double)t->gpus, padded = (double)cm.numel_padded;
    /* the step's gradient zeroing (KILN_OPT_ZERO_GRADS=1, the trainer's default): every gradient but the
     * experts' weights and the LM head's, which their first backward GEMM of the step writes instead of adding to */
    const double written = Ld * (double)s->experts * 3.0 * (double)I * (double)H + (double)V * (double)H;
    mem(p, r, zs, 1, 4 * fmax(padded - written, 0));
    mem(p, r, "gradient norm", 1, 4 * padded / G);
    const char *oname = t->muon ? "optimizer (Muon + AdamW)" : "optimizer (AdamW)";
    /* the clip scale (x *= s over the shard: read + write), then tensor by tensor */
    mem(p, r, oname, 1, 8 * padded / G);
    kiln_size_cuda_step ro;
    memset(&ro, 0, sizeof ro);
    opt_walk ow = {p, &ro, oname, t->muon, 5, t->ns_precision};
    kiln_size_tensor_walk(s, opt_tensor, &ow);
    kiln_size_op_class *oc = cls(r, oname, 1); /* ZeRO-1: a rank updates its share of the tensors */
    oc->ms += ro.c[0].ms / G, oc->work += ro.c[0].work / G;
    if (t->muon)
        snprintf(oc->how, sizeof oc->how, "bytes / membw copy sweep; Newton-Schulz at %s peak x GEMM eff.",
                 t->ns_precision == 2 ? "bf16" : t->ns_precision == 1 ? "tf32" : "fp32");
    if (t->gpus > 1) mem(p, r, "bf16 weight copy", 1, 6 * padded);

    /* measured scales, of the class or else of its group */
    for (int i = 0; i < r->n; i++) {
        const kiln_hw_rate *k = rate_of(p, r->c[i].cls);
        if (!k) k = rate_of(p, r->c[i].group);
        if (k && k->scale > 0) {
            char how[sizeof r->c[i].how];
            snprintf(how, sizeof how, "%.60s, x %.2f (calibration run)", r->c[i].how, k->scale);
            r->c[i].ms *= k->scale;
            memcpy(r->c[i].how, how, sizeof how);
        }
    }
    for (int i = 0; i < r->n; i++) r->ms_ops += r->c[i].ms;
    double comm = kiln_hw_comm_time(p, 0, 4 * padded, t->gpus) + kiln_hw_comm_time(p, 1, 4 * padded, t->gpus);
    r->ms_step = r->ms_ops + comm * 1e3;
    r->tokens_per_s = A * n / (r->ms_step * 1e-3);
    return NULL;
}

cJSON *kiln_size_cuda_json(const kiln_size_cuda_step *st, const kiln_size_cuda_memory *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *mo = cJSON_AddObjectToObject(o, "memory_gib");
    const double G = 1073741824.0;
    cJSON_AddNumberToObject(mo, "parameters", m->params / G);
    cJSON_AddNumberToObject(mo, "gradients", m->grads / G);
    cJSON_AddNumberToObject(mo, "optimizer_state", m->optim / G);
    cJSON_AddNumberToObject(mo, "muon_work", m->muon_work / G);
    cJSON_AddNumberToObject(mo, "activations", m->activations / G);
    cJSON_AddNumberToObject(mo, "backward_scratch", m->scratch / G);
    cJSON_AddNumberToObject(mo, "pool", m->pool / G);
    cJSON_AddNumberToObject(mo, "runtime", m->runtime / G);
    cJSON_AddNumberToObject(mo, "device_peak", m->total / G);
    cJSON_AddNumberToObject(o, "numel_padded", (double)m->numel_padded);
    cJSON *so = cJSON_AddObjectToObject(o, "step");
    cJSON_AddNumberToObject(so, "ms", st->ms_step);
    cJSON_AddNumberToObject(so, "ms_ops", st->ms_ops);
    cJSON_AddNumberToObject(so, "tokens_per_s", st->tokens_per_s);
    cJSON_AddNumberToObject(so, "grad_accum", (double)st->grad_accum);
    cJSON *arr = cJSON_AddArrayToObject(so, "classes");
    for (int i = 0; i < st->n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "class", st->c[i].cls);
        cJSON_AddStringToObject(c, "group", st->c[i].group);
        cJSON_AddNumberToObject(c, "ms", st->c[i].ms);
        cJSON_AddNumberToObject(c, "work", st->c[i].work);
        cJSON_AddStringToObject(c, "unit", st->c[i].bytes ? "bytes" : "flops");
        cJSON_AddStringToObject(c, "from", st->c[i].how);
        cJSON_AddItemToArray(arr, c);
    }
    return o;
}

void kiln_size_cuda_print(FILE *f, const kiln_size_cuda_step *st, const kiln_size_cuda_memory *m) {
    const double G = 1073741824.0;
    fprintf(f, "\nkiln train --device cuda, by the op classes of its per-op profile (KILN_CUDA_PROFILE=1):\n");
    fprintf(f, "  %-42s %9s %6s  %s\n", "op class", "ms/step", "share", "from");
    int order[KILN_SIZE_MAX_CLASSES];
    for (int i = 0; i < st->n; i++) order[i] = i;
    for (int i = 1; i < st->n; i++) /* largest first, as the trainer prints them */
        for (int j = i; j > 0 && st->c[order[j]].ms > st->c[order[j - 1]].ms; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < st->n; i++) {
        const kiln_size_op_class *c = &st->c[order[i]];
        fprintf(f, "  %-42s %9.2f %5.1f%%  %s\n", c->cls, c->ms, 100 * c->ms / st->ms_step, c->how);
    }
    fprintf(f, "  %-42s %9.2f\n", "step", st->ms_step);
    fprintf(f, "  %-42s %9.0f\n", "tokens/s per GPU", st->tokens_per_s);
    fprintf(f, "GPU memory: parameters %.2f GiB, gradients %.2f GiB, optimizer state %.2f GiB, activations %.2f GiB "
               "(+ backward scratch %.2f GiB), ops' pool peak %.2f GiB, runtime %.2f GiB%s; device peak in use %.2f GiB\n",
            m->params / G, m->grads / G, m->optim / G, m->activations / G, m->scratch / G, m->pool / G, m->runtime / G,
            m->muon_work > 0 ? " (+ Muon's update buffer)" : "", m->total / G);
}
