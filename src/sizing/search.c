/* Candidate shapes for a parameter budget, ranked by predicted cost, each with the rules and the
 * profile's evidence behind its choices. Only hardware cost is modelled: choices that trade model
 * quality (KV heads, CCA compression) are enumerated only over the values given, ZAYA1's by default. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/sizing.h"
#include "sizing_internal.h"

static void list_set(kiln_size_list *l, const int64_t *v, int n) {
    l->n = n;
    for (int i = 0; i < n; i++) l->v[i] = v[i];
}

void kiln_size_budget_default(kiln_size_budget *b, kiln_size_arch arch) {
    memset(b, 0, sizeof *b);
    b->arch = arch;
    b->tolerance = 0.05;
    b->vocab = 262144;
    b->min_aspect = 32;
    b->max_aspect = 128;
    kiln_size_setup_default(&b->setup);
    if (arch == KILN_ARCH_ZAYA) kiln_size_shape_zaya_default(&b->base);
    else {
        memset(&b->base, 0, sizeof b->base);
        b->base.arch = KILN_ARCH_DENSE;
        b->base.tied = 0;
    }
    static const int64_t H[] = {768, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 8192};
    static const int64_t D[] = {64, 96, 128, 256}, C[] = {2}, KVz[] = {2}, KVd[] = {8};
    static const int64_t E[] = {8, 16, 32, 64, 128}, K[] = {1, 2, 4};
    static const int64_t I[] = {512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 6144, 8192};
    list_set(&b->hiddens, H, sizeof H / sizeof H[0]);
    list_set(&b->head_dims, D, 4);
    if (arch == KILN_ARCH_ZAYA) {
        list_set(&b->cca, C, 1);
        list_set(&b->kv_heads, KVz, 1);
        list_set(&b->experts, E, 5);
        list_set(&b->top_k, K, 3);
        list_set(&b->widths, I, sizeof I / sizeof I[0]);
    } else {
        static const int64_t one[] = {1};
        list_set(&b->cca, one, 1);
        list_set(&b->kv_heads, KVd, 1);
        list_set(&b->experts, one, 1);
        list_set(&b->top_k, one, 1);
        b->widths.n = 0;
    }
}

kiln_error *kiln_size_parse_count(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s) return kiln_errorf(KILN_EINVAL, "%s: '%s' is not a parameter count (e.g. 8.3B, 760M)", flag, s);
    /* strtod also reads hexadecimal ("0x2B" would be 43), "inf", "nan" and leading blanks: a count is decimal
     * digits, a point and an exponent, then the suffix */
    for (const char *c = s; c < end; c++)
        if (!strchr("0123456789.eE+-", *c))
            return kiln_errorf(KILN_EINVAL, "%s: '%s' is not a decimal parameter count (digits with an optional K, M, "
                               "B or T suffix, e.g. 8.3B, 760M, 1.5e9; no hexadecimal)", flag, s);
    double mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1e3; break;
        case 'M': mult = 1e6; break;
        case 'B': case 'G': mult = 1e9; break;
        case 'T': mult = 1e12; break;
        default: return kiln_errorf(KILN_EINVAL, "%s: '%s' has an unknown suffix (K, M, B or T)", flag, s);
        }
        if (end[1]) return kiln_errorf(KILN_EINVAL, "%s: '%s' has trailing characters", flag, s);
    }
    if (!(v > 0) || !isfinite(v)) return kiln_errorf(KILN_EINVAL, "%s: '%s' must be a positive count", flag, s);
    /* the product checked, not v alone: "1e300T" is inf (fuzzing found it) */
    if (!(v * mult <= 1e18)) return kiln_errorf(KILN_EINVAL, "%s: '%s' is beyond 10^18", flag, s);
    *out = v * mult;
    return NULL;
}

kiln_error *kiln_size_parse_list(const char *flag, const char *s, kiln_size_list *l) {
    l->n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 1 || v > (1 << 20) || (*end && *end != ','))
            return kiln_errorf(KILN_EINVAL, "%s: '%s' is not a comma list of positive integers", flag, s);
        if (l->n >= KILN_SIZE_MAX_LIST) return kiln_errorf(KILN_EINVAL, "%s: more than %d values", flag, KILN_SIZE_MAX_LIST);
        l->v[l->n++] = v;
        p = *end ? end + 1 : end;
    }
    if (!l->n) return kiln_errorf(KILN_EINVAL, "%s: empty list", flag);
    return NULL;
}

void kiln_size_result_free(kiln_size_result *r) {
    free(r->c);
    memset(r, 0, sizeof *r);
}

static int same(const kiln_size_shape *a, const kiln_size_shape *b) {
    return a->arch == b->arch && a->vocab == b->vocab && a->hidden == b->hidden && a->layers == b->layers &&
           a->heads == b->heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           (a->arch == KILN_ARCH_DENSE ? a->ffn == b->ffn
                                       : a->experts == b->experts && a->top_k == b->top_k &&
                                             a->expert_inter == b->expert_inter && a->router_hidden == b->router_hidden);
}

int64_t kiln_size_find(const kiln_size_result *r, const kiln_size_shape *s) {
    for (int64_t i = 0; i < r->n; i++)
        if (same(&r->c[i].shape, s)) return i;
    return -1;
}

static double score_of(const kiln_size_budget *b, const kiln_size_pred *p, double best_tps, double best_d1,
                       double best_d64) {
    double tr = best_tps / p->tokens_per_s, d1 = p->decode_ms_b1 / best_d1, d64 = p->decode_ms_b64 / best_d64;
    if (b->rank_by == KILN_RANK_TRAIN) return tr;
    if (b->rank_by == KILN_RANK_DECODE) return 0.5 * d1 + 0.5 * d64;
    return 0.6 * tr + 0.2 * d1 + 0.2 * d64;
}

static int cmp_score(const void *a, const void *b) {
    const kiln_size_candidate *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return x->pred.tokens_per_s > y->pred.tokens_per_s ? -1 : x->pred.tokens_per_s < y->pred.tokens_per_s;
}

/* Solve the layer count from the active budget: active_nonembed is affine in the layers. */
static int64_t solve_layers(const kiln_size_shape *s, double active) {
    kiln_size_shape t = *s;
    kiln_size_params p1, p2;
    t.layers = 1;
    kiln_size_count(&t, &p1);
    t.layers = 2;
    kiln_size_count(&t, &p2);
    double per = (double)(p2.active_nonembed - p1.active_nonembed), fixed = (double)p1.active_nonembed - per;
    if (per <= 0) return 0;
    return (int64_t)llround((active - fixed) / per);
}

static kiln_error *push(kiln_size_result *r, int64_t *cap, const kiln_size_candidate *c) {
    if (r->n == *cap) {
        int64_t nc = *cap ? 2 * *cap : 256;
        kiln_size_candidate *n = realloc(r->c, (size_t)nc * sizeof *n);
        if (!n) return kiln_errorf(KILN_ENOMEM, "size: %lld candidates", (long long)nc);
        r->c = n;
        *cap = nc;
    }
    r->c[r->n++] = *c;
    return NULL;
}

kiln_error *kiln_size_search(const kiln_size_budget *b, const kiln_hw_profile *p, kiln_size_result *r) {
    memset(r, 0, sizeof *r);
    if (!(b->total > 0) || !(b->active > 0))
        return kiln_errorf(KILN_EINVAL, "budget: total %.4g and active %.4g parameters must be positive", b->total,
                           b->active);
    if (b->arch == KILN_ARCH_ZAYA && b->active > b->total * (1 + b->tolerance))
        return kiln_errorf(KILN_EINVAL, "budget: active parameters (%.4g) exceed the total (%.4g): a token cannot use "
                           "more parameters than the model has", b->active, b->total);
    if (b->vocab < 1 || b->vocab > KILN_SIZE_MAX_VOCAB) /* the padding to 128 below must not overflow */
        return kiln_errorf(KILN_EINVAL, "budget: vocab %lld is outside 1..%lld", (long long)b->vocab,
                           (long long)KILN_SIZE_MAX_VOCAB);
    const int64_t V = (b->vocab + 127) / 128 * 128;
    r->vocab = V;
    int64_t cap = 0;
    double smallest_layer = 1e300;
    const kiln_size_list one = {1, {1}};
    const kiln_size_list *E = b->arch == KILN_ARCH_ZAYA ? &b->experts : &one, *K = b->arch == KILN_ARCH_ZAYA ? &b->top_k : &one;
    for (int ih = 0; ih < b->hiddens.n; ih++)
    for (int id = 0; id < b->head_dims.n; id++)
    for (int ic = 0; ic < b->cca.n; ic++)
    for (int ikv = 0; ikv < b->kv_heads.n; ikv++)
    for (int ie = 0; ie < E->n; ie++)
    for (int ik = 0; ik < K->n; ik++) {
        const int64_t H = b->hiddens.v[ih], hd = b->head_dims.v[id], c = b->cca.v[ic];
        if (H % c || (H / c) % hd) continue;
        const int64_t heads = H / c / hd, kv = b->kv_heads.v[ikv];
        if (heads < 1 || kv > heads || heads % kv || (kv * hd) % 2) continue;
        kiln_size_list dense_w = {0, {0}};
        const kiln_size_list *W = &b->widths;
        if (b->arch == KILN_ARCH_DENSE && !b->widths.n) {
            const double ratios[] = {8.0 / 3, 3, 3.5, 4};
            for (int i = 0; i < 4; i++) dense_w.v[dense_w.n++] = ((int64_t)ceil(ratios[i] * (double)H) + 255) / 256 * 256;
            W = &dense_w;
        }
        for (int iw = 0; iw < W->n; iw++) {
            kiln_size_candidate cd;
            memset(&cd, 0, sizeof cd);
            kiln_size_shape *s = &cd.shape;
            *s = b->base;
            s->arch = b->arch;
            s->vocab = V;
            s->hidden = H;
            s->head_dim = hd;
            s->heads = heads;
            s->kv_heads = kv;
            if (b->arch == KILN_ARCH_ZAYA) {
                s->experts = E->v[ie];
                s->top_k = K->v[ik];
                s->expert_inter = W->v[iw];
                if (s->top_k > s->experts) continue;
            } else {
                s->ffn = W->v[iw];
            }
            s->sliding_layers = 0;
            r->enumerated++;
            s->layers = 1;
            kiln_size_params one_layer;
            kiln_size_count(s, &one_layer);
            if ((double)one_layer.active_nonembed < smallest_layer) smallest_layer = (double)one_layer.active_nonembed;
            double target = b->arch == KILN_ARCH_ZAYA ? b->active : b->total;
            int64_t L = solve_layers(s, target);
            if (L < 1 || L > KILN_ZAYA_MAX_LAYERS) { r->rejected_budget++; continue; }
            s->layers = L;
            if (b->base.sliding_layers) /* keep the base's share of sliding layers */
                s->sliding_layers = (int64_t)llround((double)b->base.sliding_layers * (double)L / (double)b->base.layers);
            kiln_size_params pc;
            kiln_size_count(s, &pc);
            if (fabs((double)pc.active_nonembed - b->active) > b->tolerance * b->active ||
                fabs((double)pc.total_nonembed - b->total) > b->tolerance * b->total) {
                r->rejected_budget++;
                continue;
            }
            double aspect = (double)H / (double)L;
            if (aspect < b->min_aspect || aspect > b->max_aspect) { r->rejected_aspect++; continue; }
            kiln_error *e = kiln_size_predict(s, p, &b->setup, &cd.pred);
            if (e) { kiln_size_result_free(r); return e; }
            if (!cd.pred.fits) { r->rejected_memory++; continue; }
            if ((e = push(r, &cap, &cd))) { kiln_size_result_free(r); return e; }
        }
    }
    if (!r->n) {
        kiln_error *e;
        if (!r->enumerated) { /* smallest_layer is still its sentinel: say what kept every combination out */
            char lists[400] = "";
            const struct { const char *flag; const kiln_size_list *l; } ls[] = {
                {"--hidden", &b->hiddens}, {"--head-dims", &b->head_dims}, {"--cca", &b->cca}, {"--kv-heads", &b->kv_heads},
                {"--experts", E}, {"--top-k", K}};
            for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
                if (b->arch != KILN_ARCH_ZAYA && i >= 4) break;
                size_t at = strlen(lists);
                snprintf(lists + at, sizeof lists - at, "%s%s ", i ? "; " : "", ls[i].flag);
                for (int j = 0; j < ls[i].l->n && j < 12; j++) {
                    at = strlen(lists);
                    snprintf(lists + at, sizeof lists - at, "%s%lld", j ? "," : "", (long long)ls[i].l->v[j]);
                }
                at = strlen(lists);
                if (ls[i].l->n > 12) snprintf(lists + at, sizeof lists - at, ",...");
            }
            e = kiln_errorf(KILN_EINVAL, "budget: the lists form no shape: a shape needs a hidden size that is a multiple "
                            "of cca x head dim, KV heads that divide the query heads (hidden / cca / head dim) with KV "
                            "heads x head dim even%s (%s)", b->arch == KILN_ARCH_ZAYA ? ", and top-k at most the experts" : "",
                            lists);
        } else if (smallest_layer > b->active * (1 + b->tolerance))
            e = kiln_errorf(KILN_EINVAL, "budget: %.4g active parameters are too small for one layer of any candidate "
                            "(the smallest layer has %.4g non-embedding parameters)", b->active, smallest_layer);
        else
            e = kiln_errorf(KILN_EINVAL, "budget: no shape fits: %lld enumerated, %lld miss the budget (total %.4g, "
                            "active %.4g, tolerance %g%%), %lld outside hidden/layers %g..%g, %lld do not fit in "
                            "%.1f GiB per GPU (90%% of the profile's %.4g GiB); widen the lists or the tolerance",
                            (long long)r->enumerated, (long long)r->rejected_budget, b->total, b->active,
                            100 * b->tolerance, (long long)r->rejected_aspect, b->min_aspect, b->max_aspect,
                            (long long)r->rejected_memory, 0.9 * p->mem_gib, p->mem_gib);
        kiln_size_result_free(r);
        return e;
    }
    double best_tps = 0, best_d1 = 1e300, best_d64 = 1e300;
    for (int64_t i = 0; i < r->n; i++) {
        const kiln_size_pred *q = &r->c[i].pred;
        if (q->tokens_per_s > best_tps) best_tps = q->tokens_per_s;
        if (q->decode_ms_b1 < best_d1) best_d1 = q->decode_ms_b1;
        if (q->decode_ms_b64 < best_d64) best_d64 = q->decode_ms_b64;
    }
    for (int64_t i = 0; i < r->n; i++) r->c[i].score = score_of(b, &r->c[i].pred, best_tps, best_d1, best_d64);
    qsort(r->c, (size_t)r->n, sizeof r->c[0], cmp_score);
    return NULL;
}

/* ---- rules and evidence ---- */

/* Attention time per FLOP at head dim D relative to the kernel's peak: forward + 2.5x backward. */
static double attn_cost(const kiln_hw_profile *p, int64_t D) {
    return 1 / kiln_hw_attn_eff(p, D, 0) + 2.5 / kiln_hw_attn_eff(p, D, 1);
}

static double gemm_rate(const kiln_hw_profile *p, int64_t m, int64_t n, int64_t k, kiln_hw_gemm_why *w) {
    kiln_hw_gemm_time(p, m, n, k, w);
    return w->tflops;
}

static void why(kiln_size_candidate *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static void why(kiln_size_candidate *c, const char *fmt, ...) {
    if (c->nwhy >= (int)(sizeof c->why / sizeof c->why[0])) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why[c->nwhy++], sizeof c->why[0], fmt, ap);
    va_end(ap);
}

void kiln_size_explain_candidate(const kiln_hw_profile *p, const kiln_size_budget *b, kiln_size_candidate *c) {
    const kiln_size_shape *s = &c->shape;
    const int64_t n = b->setup.train.micro_batch * b->setup.seq, Q = s->heads * s->head_dim;
    kiln_hw_gemm_why w;
    c->nwhy = 0;
    double r = gemm_rate(p, n, s->hidden, Q, &w);
    why(c, "hidden %lld (%lld layers, hidden/layers %.0f in %g..%g): o_proj [%lld x %lld x %lld] %.0f TFLOP/s, "
        "%lldx%lld tiles %.0f%% full, %.0f wave(s) %.0f%% full over %lld SMs",
        (long long)s->hidden, (long long)s->layers, (double)s->hidden / (double)s->layers, b->min_aspect,
        b->max_aspect, (long long)n, (long long)s->hidden, (long long)Q, r, (long long)w.tile_m, (long long)w.tile_n,
        100 * w.tile_util, w.waves, 100 * w.wave_util, (long long)p->sm_count);
    /* head dim against the other enumerated ones */
    char alt[160] = "";
    for (int i = 0; i < b->head_dims.n; i++) {
        int64_t d = b->head_dims.v[i];
        if (d == s->head_dim) continue;
        size_t len = strlen(alt);
        double ratio = attn_cost(p, d) / attn_cost(p, s->head_dim);
        snprintf(alt + len, sizeof alt - len, "%s%.2fx %s than %lld", len ? ", " : "", ratio >= 1 ? ratio : 1 / ratio,
                 ratio >= 1 ? "faster" : "slower", (long long)d);
    }
    kiln_size_kv kv;
    kiln_size_kv_cache(s, 1, 1024, 2, &kv);
    why(c, "head dim %lld: attention %s on this profile (%lld query heads, %lld KV heads; forward efficiency %.2f, "
        "head dims padded to %lld); KV cache %.1f MiB per 1k tokens of a sequence", (long long)s->head_dim,
        alt[0] ? alt : "is the only head dim enumerated", (long long)s->heads, (long long)s->kv_heads,
        kiln_hw_attn_eff(p, s->head_dim, 0), (long long)p->head_dim_tile, kv.total / 1048576.0);
    if (s->arch == KILN_ARCH_ZAYA) {
        int64_t rows = (int64_t)ceil((double)n * (double)s->top_k / (double)s->experts);
        kiln_hw_gemm_time_grouped(p, (double)s->experts, rows, 2 * s->expert_inter, s->hidden, &w);
        /* the alternative with the same total AND active parameters: twice the experts at half the width with
         * twice the top-k, so the same rows per expert (at the same top-k it would hold half the active
         * parameters and see half the rows: not the same model budget) */
        kiln_hw_gemm_why w2;
        int64_t rows2 = (int64_t)ceil((double)n * (double)(2 * s->top_k) / (double)(2 * s->experts));
        kiln_hw_gemm_time_grouped(p, 2.0 * (double)s->experts, rows2 < 1 ? 1 : rows2, s->expert_inter, s->hidden, &w2);
        why(c, "%lld experts x width %lld, top-%lld: %lld rows per expert per micro-batch, grouped gate_up at %.0f "
            "TFLOP/s (%lldx%lld tiles %.0f%% full, %.0f wave(s) %.0f%% full); the same total and active parameters as "
            "%lld x %lld top-%lld: %.0f TFLOP/s; decode reads %.2f GB of expert weights per step at batch 1",
            (long long)s->experts, (long long)s->expert_inter, (long long)s->top_k, (long long)rows, w.tflops,
            (long long)w.tile_m, (long long)w.tile_n, 100 * w.tile_util, w.waves, 100 * w.wave_util, (long long)(2 * s->experts), (long long)(s->expert_inter / 2),
            (long long)(2 * s->top_k), w2.tflops,
            2.0 * 3 * (double)s->top_k * (double)s->expert_inter * (double)s->hidden * (double)s->layers / 1e9);
    } else {
        double rf = gemm_rate(p, n, 2 * s->ffn, s->hidden, &w);
        why(c, "SwiGLU width %lld (%.2f x hidden): gate_up at %.0f TFLOP/s (tiles %.0f%%, waves %.0f%%)",
            (long long)s->ffn, (double)s->ffn / (double)s->hidden, rf, 100 * w.tile_util, 100 * w.wave_util);
    }
    double rv = gemm_rate(p, n, s->vocab, s->hidden, &w);
    char pad[96] = "no padding needed";
    if (s->vocab % 128) /* kiln size check keeps a config's own vocabulary: say what it is, not "= 0 x 128" */
        snprintf(pad, sizeof pad, "not a multiple of 128; %lld is", (long long)((s->vocab + 127) / 128 * 128));
    else if (s->vocab != b->vocab) snprintf(pad, sizeof pad, "padded from %lld", (long long)b->vocab);
    if (s->vocab % 128)
        why(c, "vocab %lld (%s): lm_head at %.0f TFLOP/s, %lldx%lld tiles %.0f%% full", (long long)s->vocab, pad, rv,
            (long long)w.tile_m, (long long)w.tile_n, 100 * w.tile_util);
    else
        why(c, "vocab %lld = %lld x 128 (%s): lm_head at %.0f TFLOP/s, %lldx%lld tiles %.0f%% full",
            (long long)s->vocab, (long long)(s->vocab / 128), pad, rv, (long long)w.tile_m, (long long)w.tile_n,
            100 * w.tile_util);
    why(c, "%lld layers fill the budget: %.3gB total, %.3gB active (non-embedding; target %.3gB / %.3gB +-%g%%)",
        (long long)s->layers, (double)c->pred.params.total_nonembed / 1e9, (double)c->pred.params.active_nonembed / 1e9,
        b->total / 1e9, b->active / 1e9, 100 * b->tolerance);
    why(c, "step: GEMMs %.0f%%, attention %.0f%%, elementwise %.0f%% of a micro-batch; optimizer %.2f s, ZeRO-1 "
        "comm %.2f s per step of %lld micro-batches",
        100 * c->pred.t_gemm / c->pred.t_micro, 100 * c->pred.t_attn / c->pred.t_micro,
        100 * c->pred.t_mem / c->pred.t_micro, c->pred.t_optim, c->pred.t_comm, (long long)c->pred.grad_accum);
}

void kiln_size_print_rules(FILE *f, const kiln_hw_profile *p, const kiln_size_budget *b) {
    char comm_src[600];
    kiln_hw_comm_source(p, b->setup.train.gpus, comm_src, sizeof comm_src);
    fprintf(f,
        "Rules (docs/sizing.md):\n"
        "  1. Budget: non-embedding parameters within +-%g%% of the total and the active targets; the layer\n"
        "     count is solved from the active budget, every other choice is enumerated.\n"
        "  2. Depth/width: hidden/layers within %g..%g (a modelling prior, not a hardware rule).\n"
        "  3. GEMM time = 2MNK / (peak x efficiency x tile utilisation x wave utilisation), at least the\n"
        "     bytes moved / memory bandwidth. Tiles of %lld x %lld outputs (or halved along M and/or N at 90%%\n"
        "     per-tile efficiency when that quantizes better; skinny dims take tiles down to 16); a partial\n"
        "     tile costs a whole one; the experts of a layer are one grouped launch.\n"
        "     Waves of %lld tiles (one per SM/CU); a partial wave costs a whole one. Efficiency before\n"
        "     quantization: %s.\n"
        "  4. Attention: 4 x query channels FLOPs per visible key forward (causal, sliding windows), 2.5x\n"
        "     that backward, at the profile's efficiency for the head dim; head dims are padded to %lld.\n"
        "     Source: %s.\n"
        "  5. Experts: balanced routing, tokens x top_k / experts rows per expert GEMM. At one top-k, fewer,\n"
        "     wider experts give taller GEMMs; at the same total and active parameters (2E experts of half the\n"
        "     width at twice the top-k, what each candidate's evidence compares) the rows per expert and the\n"
        "     weights read per token are the same, and only the quantization of the narrower GEMMs differs.\n"
        "  6. Vocabulary padded up to a multiple of 128 (whole lm_head tiles, divisible by 64 too).\n"
        "  7. Memory per GPU: bf16 weights + fp32 gradients + (fp32 master + optimizer states)/G (ZeRO-1;\n"
        "     Muon 1 state for hidden and expert matrices, AdamW 2 for the rest) + activations (+ logits);\n"
        "     a candidate must fit in 90%% of %.4g GiB.\n"
        "  8. Comm: ZeRO-1 reduce-scatter of fp32 gradients and all-gather of bf16 weights, not overlapped;\n"
        "     bus bandwidth: %s.\n"
        "  9. Inference: prefill = forward of one prompt; decode step = sum over kernels of max(FLOPs, bytes)\n"
        "     at batch 1 and 64, experts touched = E(1-(1-k/E)^batch), plus reading the KV cache (memory\n"
        "     bandwidth %.0f GB/s, %s).\n"
        " 10. Rank: %s.\n"
        " 11. KV heads and CCA compression trade model quality for cache size, which kiln cannot measure: they\n"
        "     are enumerated only over the values given (--kv-heads, --cca).\n",
        100 * b->tolerance, b->min_aspect, b->max_aspect, (long long)p->tile_m, (long long)p->tile_n,
        (long long)p->sm_count,
        p->ngemm ? "interpolated over log2(MNK) between the measured shapes, each divided by its own quantization"
                 : "the profile's gemm_efficiency (no GEMM measured)",
        (long long)p->head_dim_tile, p->attention_source, p->mem_gib,
        comm_src,
        p->mem_gbs, p->memory_source,
        b->rank_by == KILN_RANK_TRAIN ? "training tokens/s per GPU only"
        : b->rank_by == KILN_RANK_DECODE ? "decode latency only (0.5 batch 1 + 0.5 batch 64)"
                                          : "0.6 x training time + 0.2 x decode batch 1 + 0.2 x decode batch 64, each "
                                            "relative to the best candidate (1.0 = best at everything)");
    fprintf(f, "Profile %s (%s): %s\n", p->name, p->device, p->source);
    fprintf(f, "  compute: %s\n  memory: %s\n  interconnect: %s\n  gemm: %s\n", p->compute_source, p->memory_source,
            p->interconnect_source, p->gemm_source);
}

cJSON *kiln_size_candidate_json(const kiln_size_candidate *c) {
    const kiln_size_shape *s = &c->shape;
    const kiln_size_pred *q = &c->pred;
    cJSON *o = cJSON_CreateObject();
    cJSON *sh = cJSON_AddObjectToObject(o, "shape");
    cJSON_AddStringToObject(sh, "arch", s->arch == KILN_ARCH_ZAYA ? "zaya" : "dense");
#define N(obj, k, v) cJSON_AddNumberToObject(obj, k, (double)(v))
    N(sh, "vocab", s->vocab); N(sh, "hidden", s->hidden); N(sh, "layers", s->layers); N(sh, "heads", s->heads);
    N(sh, "kv_heads", s->kv_heads); N(sh, "head_dim", s->head_dim);
    if (s->arch == KILN_ARCH_ZAYA) {
        N(sh, "experts", s->experts); N(sh, "top_k", s->top_k); N(sh, "expert_inter", s->expert_inter);
        N(sh, "router_hidden", s->router_hidden);
    } else {
        N(sh, "ffn", s->ffn);
    }
    cJSON *pa = cJSON_AddObjectToObject(o, "params");
    N(pa, "total", q->params.total); N(pa, "active", q->params.active); N(pa, "embedding", q->params.embedding);
    N(pa, "total_nonembed", q->params.total_nonembed); N(pa, "active_nonembed", q->params.active_nonembed);
    cJSON *fl = cJSON_AddObjectToObject(o, "flops_per_token");
    N(fl, "forward", q->flops.fwd); N(fl, "backward", q->flops.bwd); N(fl, "recompute", q->flops.recompute);
    N(fl, "train", q->flops.train); N(fl, "attention_forward", q->flops.attn);
    cJSON *me = cJSON_AddObjectToObject(o, "memory_gib");
    const double G = 1073741824.0;
    N(me, "weights", q->mem.weights / G); N(me, "grads", q->mem.grads / G); N(me, "master", q->mem.master / G);
    N(me, "optimizer", q->mem.optim / G); N(me, "activations", q->mem.activations / G);
    N(me, "logits", q->mem.logits / G); N(me, "total", q->mem.total / G);
    cJSON *tr = cJSON_AddObjectToObject(o, "train");
    N(tr, "tokens_per_s_per_gpu", q->tokens_per_s); N(tr, "mfu", q->mfu); N(tr, "step_s", q->t_step);
    N(tr, "micro_batch_s", q->t_micro); N(tr, "gemm_s", q->t_gemm); N(tr, "attention_s", q->t_attn);
    N(tr, "elementwise_s", q->t_mem); N(tr, "optimizer_s", q->t_optim); N(tr, "comm_s", q->t_comm);
    N(tr, "grad_accum", q->grad_accum); N(tr, "expert_tflops", q->expert_tflops);
    N(tr, "attention_tflops", q->attn_tflops);
    cJSON *in = cJSON_AddObjectToObject(o, "inference");
    N(in, "prefill_tokens_per_s", q->prefill_tokens_per_s); N(in, "decode_ms_batch1", q->decode_ms_b1);
    N(in, "decode_ms_batch64", q->decode_ms_b64); N(in, "kv_cache_gib_batch64", q->kv_gib_b64);
    N(o, "score", c->score);
#undef N
    cJSON *wy = cJSON_AddArrayToObject(o, "why");
    for (int i = 0; i < c->nwhy; i++) cJSON_AddItemToArray(wy, cJSON_CreateString(c->why[i]));
    return o;
}

cJSON *kiln_size_profile_json(const kiln_hw_profile *p) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", p->name);
    cJSON_AddStringToObject(o, "device", p->device);
    cJSON_AddStringToObject(o, "source", p->source);
    cJSON_AddNumberToObject(o, "sm_count", (double)p->sm_count);
    cJSON_AddNumberToObject(o, "peak_bf16_tflops", p->peak_bf16);
    cJSON_AddNumberToObject(o, "memory_gib", p->mem_gib);
    cJSON_AddNumberToObject(o, "memory_gbs", p->mem_gbs);
    cJSON_AddNumberToObject(o, "gemm_records", p->ngemm);
    return o;
}
