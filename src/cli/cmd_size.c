/* kiln size: hardware-aware sizing (src/sizing/, docs/sizing.md).
 *   kiln size --profile P --total-params X --active-params Y [...]   ranked candidate shapes
 *   kiln size check CONFIG --profile P [...]                         audit a config, nearest faster shapes
 *   kiln size predict CONFIG --profile P [...]                       one shape: step time, tokens/s, memory
 *   kiln size profiles                                               the built-in hardware profiles */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/json.h"
#include "kiln/sizing.h"
#include "kiln/train.h"
#include "sizing/sizing_internal.h"

static const char usage[] =
    "usage: kiln size --profile P --total-params X --active-params Y [options]\n"
    "       kiln size check CONFIG --profile P [options]\n"
    "       kiln size predict CONFIG --profile P [--micro-batch B --seq T ...]\n"
    "       kiln size profiles\n\n"
    "Enumerates ZAYA-style MoE (or dense) shapes for a non-embedding parameter budget, predicts training\n"
    "step time and inference latency on a hardware profile, and ranks them with the rule and the\n"
    "profile's evidence behind each choice. CONFIG: a HF config.json or a kiln train config.\n\n"
    "  --profile P          built-in (h100, h200, mi300x) or a profile JSON path (docs/sizing.md)\n"
    "  --bench FILE         merge `kiln bench` measurements (gemm, comm, membw, attention); repeatable\n"
    "  --total-params X     non-embedding total, decimal with K/M/B/T suffixes (8.3B), at most 10^18\n"
    "  --active-params Y    non-embedding parameters a token uses (760M); dense: defaults to the total\n"
    "  --arch zaya|dense    architecture (default zaya)\n"
    "  --context T          training sequence length and inference context, 1..2^24 (default 4096)\n"
    "  --seq T              same as --context\n"
    "  --tokens-per-step N  global batch in tokens, 1..2^40 (default 4M = 4194304; K/M suffixes)\n"
    "  --gpus G             data-parallel GPUs, ZeRO-1, 1..2^20 (default 8)\n"
    "  --micro-batch B      sequences per GPU per micro-batch, 1..2^20, B x T at most 2^32 (default 1)\n"
    "  --recompute          full activation recomputation\n"
    "  --adamw              AdamW everywhere (default: Muon for hidden and expert matrices)\n"
    "  --weights bf16|fp32  working weights (default bf16 + an fp32 master sharded by ZeRO-1; fp32: no master)\n"
    "  --grads fp32|bf16    gradient buffer (default fp32, kiln's flat buffer)\n"
    "  --vocab V            vocabulary before padding to 128, 1..2^31-1 (default 262144)\n"
    "  --tolerance F        relative budget tolerance (default 0.05)\n"
    "  --aspect MIN:MAX     hidden/layers band (default 32:128)\n"
    "  --hidden L --head-dims L --cca L --kv-heads L --experts L --top-k L --widths L\n"
    "                       comma lists of the values to enumerate (docs/sizing.md has the defaults)\n"
    "  --rank-by balanced|train|decode   ranking (default balanced)\n"
    "  --top N              rows to print (default 10)\n"
    "  --reference CONFIG   also report where this config's shape ranks, and why\n"
    "  --explain            print the rules first\n"
    "  --json               JSON on stdout instead of the table\n"
    "  --html FILE          also write an HTML page: candidates plotted, time breakdown, the table\n";

typedef struct {
    const char *profile, *reference, *config, *html;
    const char *bench[8];
    int nbench, explain, json, top, have_total, have_active, have_setup_seq, have_tps, have_mb, have_vocab;
    kiln_size_budget b;
} opts;

static kiln_error *parse_arch(const char *s, kiln_size_arch *a) {
    if (!strcmp(s, "zaya")) *a = KILN_ARCH_ZAYA;
    else if (!strcmp(s, "dense")) *a = KILN_ARCH_DENSE;
    else return kiln_errorf(KILN_EINVAL, "--arch: '%s' is not zaya or dense", s);
    return NULL;
}

/* A token count with binary K/M suffixes (4M = 4194304), as kiln bench's sizes, in 1..2^40. */
static kiln_error *parse_tokens(const char *flag, const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    int64_t mult = 1;
    if (end != s && (*end == 'K' || *end == 'k')) { mult = 1024; end++; }
    else if (end != s && (*end == 'M' || *end == 'm')) { mult = 1048576; end++; }
    /* the limit is on the count, after the suffix: 1099511627776M is 2^60 tokens (and v * mult could overflow) */
    if (end == s || *end || errno || v < 1 || v > KILN_SIZE_MAX_TOKENS_PER_STEP / mult)
        return kiln_errorf(KILN_EINVAL, "%s: '%s' is not a token count in 1..%lld (2^40 = 1048576M; e.g. 4M, 1048576)",
                           flag, s, (long long)KILN_SIZE_MAX_TOKENS_PER_STEP);
    *out = v * mult;
    return NULL;
}

/* A decimal number, all of s (no hexadecimal, inf or nan, which strtod would also read). */
static int decimal(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return 0;
    for (const char *c = s; c < end; c++)
        if (!strchr("0123456789.eE+-", *c)) return 0;
    *out = v;
    return 1;
}

/* --aspect MIN:MAX, both decimal, nothing after them. */
static kiln_error *parse_aspect(const char *v, double *lo, double *hi) {
    const char *colon = strchr(v, ':');
    char a[64];
    double x = 0, y = 0;
    int ok = colon && (size_t)(colon - v) < sizeof a;
    if (ok) {
        memcpy(a, v, (size_t)(colon - v));
        a[colon - v] = 0;
        ok = decimal(a, &x) && decimal(colon + 1, &y) && x > 0 && y >= x;
    }
    if (!ok) return kiln_errorf(KILN_EINVAL, "--aspect: '%s' is not MIN:MAX with 0 < MIN <= MAX (e.g. 32:128)", v);
    *lo = x;
    *hi = y;
    return NULL;
}

/* Parse the flags after the subcommand; positional CONFIG for check/predict. */
static kiln_error *parse(int argc, char **argv, int first, int want_config, opts *o) {
    memset(o, 0, sizeof *o);
    o->top = 10;
    kiln_size_arch arch = KILN_ARCH_ZAYA;
    for (int i = first; i < argc; i++) /* the architecture decides the default lists */
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) KILN_TRY(parse_arch(argv[i + 1], &arch));
    kiln_size_budget_default(&o->b, arch);
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (!want_config || o->config) return kiln_errorf(KILN_EINVAL, "unexpected argument '%s'", a);
            o->config = a;
            continue;
        }
        if (!strcmp(a, "--explain")) { o->explain = 1; continue; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--recompute")) { o->b.setup.train.recompute = 1; continue; }
        if (!strcmp(a, "--adamw")) { o->b.setup.train.muon = 0; continue; }
        if (i + 1 >= argc) return kiln_errorf(KILN_EINVAL, "%s needs a value", a);
        const char *v = argv[++i];
        int64_t iv;
        double dv;
        if (!strcmp(a, "--profile")) o->profile = v;
        else if (!strcmp(a, "--bench")) {
            if (o->nbench == 8) return kiln_errorf(KILN_EINVAL, "--bench: at most 8 files");
            o->bench[o->nbench++] = v;
        } else if (!strcmp(a, "--reference")) o->reference = v;
        else if (!strcmp(a, "--html")) o->html = v;
        else if (!strcmp(a, "--arch")) continue;
        else if (!strcmp(a, "--total-params")) { KILN_TRY(kiln_size_parse_count(a, v, &o->b.total)); o->have_total = 1; }
        else if (!strcmp(a, "--active-params")) { KILN_TRY(kiln_size_parse_count(a, v, &o->b.active)); o->have_active = 1; }
        else if (!strcmp(a, "--tokens-per-step")) {
            KILN_TRY(parse_tokens(a, v, &o->b.setup.tokens_per_step));
            o->have_tps = 1;
        } else if (!strcmp(a, "--context") || !strcmp(a, "--seq")) {
            KILN_TRY(cli_int_in(a, v, 1, KILN_SIZE_MAX_SEQ, &iv));
            o->b.setup.seq = iv;
            o->have_setup_seq = 1;
        } else if (!strcmp(a, "--gpus") || !strcmp(a, "--micro-batch") || !strcmp(a, "--vocab") || !strcmp(a, "--top")) {
            /* bounded: past these the step's token counts overflow (docs/sizing.md gives the ranges) */
            const int64_t max = !strcmp(a, "--gpus") ? KILN_SIZE_MAX_GPUS : !strcmp(a, "--micro-batch")
                                ? KILN_SIZE_MAX_MICRO_BATCH : !strcmp(a, "--vocab") ? KILN_SIZE_MAX_VOCAB : INT64_MAX;
            KILN_TRY(cli_int_in(a, v, 1, max, &iv));
            if (!strcmp(a, "--gpus")) o->b.setup.train.gpus = iv;
            else if (!strcmp(a, "--micro-batch")) { o->b.setup.train.micro_batch = iv; o->have_mb = 1; }
            else if (!strcmp(a, "--vocab")) { o->b.vocab = iv; o->have_vocab = 1; }
            else o->top = (int)(iv > 100000 ? 100000 : iv);
        } else if (!strcmp(a, "--tolerance")) {
            KILN_TRY(cli_double(a, v, &dv));
            if (!(dv > 0 && dv < 1)) return kiln_errorf(KILN_EINVAL, "--tolerance: %g must be in (0, 1)", dv);
            o->b.tolerance = dv;
        } else if (!strcmp(a, "--aspect")) {
            KILN_TRY(parse_aspect(v, &o->b.min_aspect, &o->b.max_aspect));
        } else if (!strcmp(a, "--weights") || !strcmp(a, "--grads")) {
            int bytes = !strcmp(v, "bf16") ? 2 : !strcmp(v, "fp32") ? 4 : 0;
            if (!bytes) return kiln_errorf(KILN_EINVAL, "%s: '%s' is not bf16 or fp32", a, v);
            if (!strcmp(a, "--weights")) o->b.setup.train.weight_bytes = bytes;
            else o->b.setup.train.grad_bytes = bytes;
        } else if (!strcmp(a, "--rank-by")) {
            if (!strcmp(v, "balanced")) o->b.rank_by = KILN_RANK_BALANCED;
            else if (!strcmp(v, "train")) o->b.rank_by = KILN_RANK_TRAIN;
            else if (!strcmp(v, "decode")) o->b.rank_by = KILN_RANK_DECODE;
            else return kiln_errorf(KILN_EINVAL, "--rank-by: '%s' is not balanced, train or decode", v);
        } else if (!strcmp(a, "--hidden")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.hiddens));
        else if (!strcmp(a, "--head-dims")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.head_dims));
        else if (!strcmp(a, "--cca")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.cca));
        else if (!strcmp(a, "--kv-heads")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.kv_heads));
        else if (!strcmp(a, "--experts")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.experts));
        else if (!strcmp(a, "--top-k")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.top_k));
        else if (!strcmp(a, "--widths")) KILN_TRY(kiln_size_parse_list(a, v, &o->b.widths));
        else return kiln_errorf(KILN_EINVAL, "unknown option '%s'", a);
    }
    o->b.setup.train.seq = o->b.setup.seq;
    /* each flag is in range; their product too (a config's values are checked when the prediction runs) */
    KILN_TRY(kiln_size_check_run("flags", o->b.setup.train.gpus, o->b.setup.train.micro_batch, o->b.setup.seq,
                                 o->b.setup.tokens_per_step));
    if (!o->profile) return kiln_errorf(KILN_EINVAL, "--profile is required (built-in: h100, h200, mi300x)");
    if (want_config && !o->config) return kiln_errorf(KILN_EINVAL, "a CONFIG (config.json or train config) is required");
    return NULL;
}

static kiln_error *load_profile(const opts *o, kiln_hw_profile **out) {
    kiln_hw_profile *p = malloc(sizeof *p);
    if (!p) return kiln_errorf(KILN_ENOMEM, "profile");
    kiln_error *e = kiln_hw_profile_load(o->profile, p);
    for (int i = 0; !e && i < o->nbench; i++) e = kiln_hw_profile_merge_bench(p, o->bench[i]);
    if (e) { free(p); return e; }
    *out = p;
    return NULL;
}

/* A HF config.json, or a kiln train config (its model section, micro-batch, sequence, accumulation,
 * optimizer) whose values become the defaults of flags not given. */
static kiln_error *load_config(const char *path, opts *o, kiln_size_shape *s) {
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse_file(path, &root));
    int train = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "model")) &&
                !cJSON_GetObjectItemCaseSensitive(root, "hidden_size");
    cJSON_Delete(root);
    if (!train) {
        kiln_zaya_config c;
        KILN_TRY(kiln_zaya_config_load(path, &c));
        kiln_size_shape_from_zaya(&c, s);
        return NULL;
    }
    kiln_train_config *t = malloc(sizeof *t);
    if (!t) return kiln_errorf(KILN_ENOMEM, "%s", path);
    kiln_train_config_default(t);
    kiln_error *e = kiln_train_config_load(path, t);
    if (!e) {
        kiln_size_shape_from_zaya(&t->model, s);
        if (!o->have_setup_seq) o->b.setup.seq = o->b.setup.train.seq = t->seq_len;
        if (!o->have_mb) o->b.setup.train.micro_batch = t->micro_batch;
        if (!o->have_tps) { /* in doubles: the product of a config's values and --gpus may pass int64 */
            double tps = (double)t->micro_batch * (double)t->seq_len * (double)t->grad_accum * (double)o->b.setup.train.gpus;
            if (!(tps <= (double)KILN_SIZE_MAX_TOKENS_PER_STEP))
                e = kiln_errorf(KILN_EINVAL, "%s: micro_batch x seq_len x grad_accum x %lld GPUs = %.4g tokens per step, "
                                "more than %lld; pass --tokens-per-step", path, (long long)o->b.setup.train.gpus, tps,
                                (long long)KILN_SIZE_MAX_TOKENS_PER_STEP);
            else o->b.setup.tokens_per_step = (int64_t)tps;
        }
        o->b.setup.train.muon = t->optim.use_muon;
        o->b.setup.train.ns_precision = (int)t->optim.muon_ns_precision;
    }
    free(t);
    return e;
}

static const double GIB = 1073741824.0;

static void print_header(FILE *f) {
    fprintf(f, "%4s  %-44s %7s %7s %9s %5s %8s %8s %9s %8s %8s %7s %6s\n", "rank", "shape", "total", "active",
            "train", "MFU", "step", "mem", "prefill", "dec b1", "dec b64", "KV b64", "score");
    fprintf(f, "%4s  %-44s %7s %7s %9s %5s %8s %8s %9s %8s %8s %7s %6s\n", "", "", "non-emb", "non-emb",
            "tok/s/GPU", "", "s", "GiB/GPU", "tok/s", "ms", "ms", "GiB", "");
}

static void print_row(FILE *f, const char *rank, const kiln_size_candidate *c) {
    char sh[160];
    kiln_size_shape_str(&c->shape, sh, sizeof sh);
    const kiln_size_pred *q = &c->pred;
    fprintf(f, "%4s  %-44s %6.2fB %6.3fB %9.0f %4.0f%% %8.2f %8.1f %9.0f %8.2f %8.2f %7.1f %6.3f\n", rank, sh,
            (double)q->params.total_nonembed / 1e9, (double)q->params.active_nonembed / 1e9, q->tokens_per_s,
            100 * q->mfu, q->t_step, q->mem.total / GIB, q->prefill_tokens_per_s, q->decode_ms_b1, q->decode_ms_b64,
            q->kv_gib_b64, c->score);
}

static void print_why(FILE *f, const kiln_size_candidate *c) {
    for (int i = 0; i < c->nwhy; i++) fprintf(f, "        - %s\n", c->why[i]);
}

static void print_setup(FILE *f, const opts *o, const kiln_hw_profile *p) {
    const kiln_size_setup *u = &o->b.setup;
    fprintf(f, "profile %s: %s (%s)\n", p->name, p->device, p->source);
    fprintf(f, "setup: %lld GPU(s), ZeRO-1; sequence %lld; micro-batch %lld; %lld tokens per step; %s; %s\n",
            (long long)u->train.gpus, (long long)u->seq, (long long)u->train.micro_batch, (long long)u->tokens_per_step,
            u->train.muon ? "Muon + AdamW" : "AdamW", u->train.recompute ? "activation recomputation" : "no recomputation");
    int64_t mbs = 0;
    const int64_t step = kiln_size_step_tokens(u, &mbs);
    if (step != u->tokens_per_step) /* the predictions are for this global batch, not the one asked */
        fprintf(f, "note: a step is whole micro-batches on every GPU: %lld x %lld GPU(s) x %lld x %lld = %lld tokens per "
                "step are predicted, %.3gx the %lld asked (--tokens-per-step, --gpus, --micro-batch, --seq)\n",
                (long long)mbs, (long long)u->train.gpus, (long long)u->train.micro_batch, (long long)u->seq,
                (long long)step, (double)step / (double)u->tokens_per_step, (long long)u->tokens_per_step);
}

/* Why a reference shape is not among the first `top`: its gaps to the leader, term by term. */
static void explain_rank(FILE *f, const kiln_size_result *r, int64_t rank, int top) {
    const kiln_size_candidate *c = &r->c[rank], *b = &r->c[0];
    int64_t by_train = 1, by_d1 = 1, by_d64 = 1;
    for (int64_t i = 0; i < r->n; i++) {
        by_train += r->c[i].pred.tokens_per_s > c->pred.tokens_per_s;
        by_d1 += r->c[i].pred.decode_ms_b1 < c->pred.decode_ms_b1;
        by_d64 += r->c[i].pred.decode_ms_b64 < c->pred.decode_ms_b64;
    }
    fprintf(f, "reference by criterion: training #%lld, decode batch 1 #%lld, decode batch 64 #%lld of %lld\n",
            (long long)by_train, (long long)by_d1, (long long)by_d64, (long long)r->n);
    if (rank < top) {
        fprintf(f, "reference: rank %lld of %lld, among the top %d\n", (long long)rank + 1, (long long)r->n, top);
        return;
    }
    fprintf(f, "reference: rank %lld of %lld, not among the top %d, because on this profile it predicts\n",
            (long long)rank + 1, (long long)r->n, top);
    fprintf(f, "  training %.1f%% %s than #1 (%.0f vs %.0f tok/s/GPU: GEMMs %.3f vs %.3f s, attention %.3f vs %.3f s per "
            "micro-batch),\n", 100 * fabs(1 - c->pred.tokens_per_s / b->pred.tokens_per_s),
            c->pred.tokens_per_s < b->pred.tokens_per_s ? "slower" : "faster", c->pred.tokens_per_s,
            b->pred.tokens_per_s, c->pred.t_gemm, b->pred.t_gemm, c->pred.t_attn, b->pred.t_attn);
    fprintf(f, "  decode %.2f vs %.2f ms at batch 1 and %.2f vs %.2f ms at batch 64 (score %.3f vs %.3f; #%d scores %.3f)\n",
            c->pred.decode_ms_b1, b->pred.decode_ms_b1, c->pred.decode_ms_b64, b->pred.decode_ms_b64, c->score,
            b->score, top, r->c[top - 1 < r->n ? top - 1 : r->n - 1].score);
}

static int add_value(kiln_size_list *l, int64_t v) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == v) return 0;
    if (l->n < KILN_SIZE_MAX_LIST) l->v[l->n++] = v;
    return 1;
}

/* Make sure a reference shape can be enumerated: its values join the lists. */
static void include_shape(kiln_size_budget *b, const kiln_size_shape *s) {
    add_value(&b->hiddens, s->hidden);
    add_value(&b->head_dims, s->head_dim);
    if (s->hidden % (s->heads * s->head_dim) == 0) add_value(&b->cca, s->hidden / (s->heads * s->head_dim));
    add_value(&b->kv_heads, s->kv_heads);
    if (s->arch == KILN_ARCH_ZAYA) {
        add_value(&b->experts, s->experts);
        add_value(&b->top_k, s->top_k);
        add_value(&b->widths, s->expert_inter);
    } else if (b->widths.n) {
        add_value(&b->widths, s->ffn);
    }
}

static int run_search(opts *o) {
    kiln_hw_profile *p = NULL;
    kiln_error *e;
    if (!o->have_total) return cli_fail("size", kiln_errorf(KILN_EINVAL, "--total-params is required"));
    if (!o->have_active) {
        if (o->b.arch != KILN_ARCH_DENSE) return cli_fail("size", kiln_errorf(KILN_EINVAL, "--active-params is required"));
        o->b.active = o->b.total;
    }
    if ((e = load_profile(o, &p))) return cli_fail("size", e);
    kiln_size_shape ref;
    if (o->reference) {
        if ((e = load_config(o->reference, o, &ref))) { free(p); return cli_fail("size", e); }
        if (ref.arch != o->b.arch) { free(p); return cli_fail("size", kiln_errorf(KILN_EINVAL, "--reference is a ZAYA config; use --arch zaya")); }
        include_shape(&o->b, &ref);
        if (!o->have_vocab) o->b.vocab = ref.vocab;
        ref.vocab = (ref.vocab + 127) / 128 * 128;
    }
    kiln_size_result r;
    if ((e = kiln_size_search(&o->b, p, &r))) { free(p); return cli_fail("size", e); }
    int top = o->top < r.n ? o->top : (int)r.n;
    for (int i = 0; i < top; i++) kiln_size_explain_candidate(p, &o->b, &r.c[i]);
    int64_t rank = o->reference ? kiln_size_find(&r, &ref) : -1;
    if (rank >= 0) kiln_size_explain_candidate(p, &o->b, &r.c[rank]);
    if (o->html && (e = kiln_size_write_html(o->html, p, &o->b, &r, top, rank))) {
        kiln_size_result_free(&r);
        free(p);
        return cli_fail("size", e);
    }
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddItemToObject(root, "profile", kiln_size_profile_json(p));
        cJSON *bud = cJSON_AddObjectToObject(root, "budget");
        cJSON_AddNumberToObject(bud, "total_nonembed", o->b.total);
        cJSON_AddNumberToObject(bud, "active_nonembed", o->b.active);
        cJSON_AddNumberToObject(bud, "tolerance", o->b.tolerance);
        cJSON_AddNumberToObject(bud, "vocab_padded", (double)r.vocab);
        cJSON_AddNumberToObject(bud, "tokens_per_step", (double)o->b.setup.tokens_per_step);
        cJSON_AddNumberToObject(bud, "tokens_per_step_predicted", (double)kiln_size_step_tokens(&o->b.setup, NULL));
        cJSON_AddNumberToObject(root, "enumerated", (double)r.enumerated);
        cJSON_AddNumberToObject(root, "candidates", (double)r.n);
        cJSON *arr = cJSON_AddArrayToObject(root, "ranked");
        for (int i = 0; i < top; i++) {
            cJSON *c = kiln_size_candidate_json(&r.c[i]);
            cJSON_AddNumberToObject(c, "rank", i + 1);
            cJSON_AddItemToArray(arr, c);
        }
        if (o->reference) {
            if (rank >= 0) {
                cJSON *c = kiln_size_candidate_json(&r.c[rank]);
                cJSON_AddNumberToObject(c, "rank", (double)rank + 1);
                cJSON_AddItemToObject(root, "reference", c);
            } else {
                cJSON_AddNullToObject(root, "reference");
            }
        }
        char *txt = kiln_json_print(root, 1);
        if (txt) puts(txt);
        free(txt);
        cJSON_Delete(root);
    } else {
        if (o->explain) kiln_size_print_rules(stdout, p, &o->b);
        print_setup(stdout, o, p);
        printf("budget: %.4gB total, %.4gB active non-embedding parameters (+-%g%%); vocab padded to %lld\n",
               o->b.total / 1e9, o->b.active / 1e9, 100 * o->b.tolerance, (long long)r.vocab);
        printf("%lld shapes enumerated: %lld miss the budget, %lld outside hidden/layers %g..%g, %lld do not fit "
               "in memory; %lld candidates\n\n", (long long)r.enumerated, (long long)r.rejected_budget,
               (long long)r.rejected_aspect, o->b.min_aspect, o->b.max_aspect, (long long)r.rejected_memory,
               (long long)r.n);
        print_header(stdout);
        for (int i = 0; i < top; i++) {
            char rk[24];
            snprintf(rk, sizeof rk, "%d", i + 1);
            print_row(stdout, rk, &r.c[i]);
            print_why(stdout, &r.c[i]);
        }
        if (o->reference) {
            printf("\n");
            if (rank < 0) {
                char sh[160];
                kiln_size_shape_str(&ref, sh, sizeof sh);
                printf("reference %s (%s) is not a candidate: its budget, hidden/layers or memory falls outside the "
                       "search (see the counts above)\n", o->reference, sh);
            } else {
                char rk[24];
                snprintf(rk, sizeof rk, "%lld", (long long)rank + 1);
                print_row(stdout, rk, &r.c[rank]);
                print_why(stdout, &r.c[rank]);
                explain_rank(stdout, &r, rank, top);
            }
        }
    }
    kiln_size_result_free(&r);
    free(p);
    return 0;
}

/* Fields that differ between two shapes: the "distance" of a suggestion. */
static int distance(const kiln_size_shape *a, const kiln_size_shape *b) {
    return (a->hidden != b->hidden) + (a->layers != b->layers) + (a->heads != b->heads) + (a->kv_heads != b->kv_heads) +
           (a->head_dim != b->head_dim) + (a->experts != b->experts) + (a->top_k != b->top_k) +
           (a->expert_inter != b->expert_inter) + (a->ffn != b->ffn) + (a->vocab != b->vocab);
}

static int run_check(opts *o) {
    kiln_hw_profile *p = NULL;
    kiln_error *e;
    kiln_size_shape s;
    if ((e = load_config(o->config, o, &s))) return cli_fail("size check", e);
    if ((e = load_profile(o, &p))) return cli_fail("size check", e);
    kiln_size_params pc;
    kiln_size_count(&s, &pc);
    kiln_size_budget *b = &o->b;
    b->arch = s.arch;
    b->base = s;
    b->vocab = s.vocab;
    if (!o->have_total) b->total = (double)pc.total_nonembed;
    if (!o->have_active) b->active = (double)pc.active_nonembed;
    include_shape(b, &s);
    double aspect = (double)s.hidden / (double)s.layers;
    if (aspect < b->min_aspect) b->min_aspect = aspect;
    if (aspect > b->max_aspect) b->max_aspect = aspect;
    kiln_size_pred own;
    if ((e = kiln_size_predict(&s, p, &b->setup, &own))) { free(p); return cli_fail("size check", e); }
    kiln_size_result r;
    if ((e = kiln_size_search(b, p, &r))) { free(p); return cli_fail("size check", e); }
    kiln_size_shape padded = s;
    padded.vocab = r.vocab;
    int64_t rank = kiln_size_find(&r, &padded);
    /* suggestions: candidates better than the config, nearest first (fewest changed fields) */
    int64_t *idx = malloc(sizeof *idx * (size_t)(r.n + 1));
    if (!idx) {
        kiln_size_result_free(&r);
        free(p);
        return cli_fail("size check", kiln_errorf(KILN_ENOMEM, "%lld candidates", (long long)r.n));
    }
    int nsug = 0;
    const double own_score = rank >= 0 ? r.c[rank].score : 1e300;
    for (int d = 1; d <= 10 && nsug < o->top; d++)
        for (int64_t i = 0; i < r.n && nsug < o->top; i++)
            if (i != rank && distance(&r.c[i].shape, &s) == d && r.c[i].score < own_score &&
                r.c[i].pred.tokens_per_s > own.tokens_per_s)
                idx[nsug++] = i;
    for (int i = 0; i < nsug; i++) kiln_size_explain_candidate(p, b, &r.c[idx[i]]);
    kiln_size_candidate self;
    memset(&self, 0, sizeof self);
    self.shape = s;
    self.pred = own;
    self.score = rank >= 0 ? r.c[rank].score : NAN;
    kiln_size_explain_candidate(p, b, &self);
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "config", o->config);
        cJSON_AddItemToObject(root, "profile", kiln_size_profile_json(p));
        cJSON *c = kiln_size_candidate_json(&self);
        cJSON_AddNumberToObject(c, "rank", rank >= 0 ? (double)rank + 1 : -1);
        cJSON_AddItemToObject(root, "config_prediction", c);
        cJSON_AddNumberToObject(root, "candidates", (double)r.n);
        cJSON *arr = cJSON_AddArrayToObject(root, "suggestions");
        for (int i = 0; i < nsug; i++) {
            const kiln_size_candidate *x = &r.c[idx[i]];
            cJSON *j = kiln_size_candidate_json(x);
            cJSON_AddNumberToObject(j, "rank", (double)idx[i] + 1);
            cJSON_AddNumberToObject(j, "changed_fields", distance(&x->shape, &s));
            cJSON_AddNumberToObject(j, "train_gain", x->pred.tokens_per_s / own.tokens_per_s - 1);
            cJSON_AddNumberToObject(j, "decode_b1_gain", own.decode_ms_b1 / x->pred.decode_ms_b1 - 1);
            cJSON_AddItemToArray(arr, j);
        }
        char *txt = kiln_json_print(root, 1);
        if (txt) puts(txt);
        free(txt);
        cJSON_Delete(root);
    } else {
        if (o->explain) kiln_size_print_rules(stdout, p, b);
        print_setup(stdout, o, p);
        printf("config %s: %.4gB total, %.4gB active non-embedding parameters; %s\n\n", o->config,
               (double)pc.total_nonembed / 1e9, (double)pc.active_nonembed / 1e9,
               rank >= 0 ? "ranked among same-budget shapes below" : "not a candidate of the search (see why below)");
        print_header(stdout);
        char rk[24];
        if (rank >= 0) snprintf(rk, sizeof rk, "%lld", (long long)rank + 1);
        else snprintf(rk, sizeof rk, "-");
        print_row(stdout, rk, &self);
        print_why(stdout, &self);
        if (s.vocab % 128)
            printf("        ! vocab %lld is not a multiple of 128: pad to %lld (whole lm_head tiles)\n",
                   (long long)s.vocab, (long long)r.vocab);
        if (!own.fits)
            printf("        ! training needs %.1f GiB per GPU, more than %.1f GiB (90%% of %.4g GiB): add GPUs (ZeRO-1), "
                   "--recompute or a smaller micro-batch\n", own.mem.total / GIB, 0.9 * p->mem_gib, p->mem_gib);
        if (!nsug) printf("\nno faster shape of the same budget among %lld candidates\n", (long long)r.n);
        else {
            printf("\nnearest faster shapes (same budget +-%g%%), fewest changes first:\n", 100 * b->tolerance);
            print_header(stdout);
            for (int i = 0; i < nsug; i++) {
                const kiln_size_candidate *x = &r.c[idx[i]];
                snprintf(rk, sizeof rk, "%lld", (long long)idx[i] + 1);
                print_row(stdout, rk, x);
                printf("        = %d field(s) changed; training %+.1f%% tokens/s; decode time %+.1f%% at batch 1, "
                       "%+.1f%% at batch 64\n", distance(&x->shape, &s), 100 * (x->pred.tokens_per_s / own.tokens_per_s - 1),
                       100 * (x->pred.decode_ms_b1 / own.decode_ms_b1 - 1),
                       100 * (x->pred.decode_ms_b64 / own.decode_ms_b64 - 1));
                print_why(stdout, x);
            }
        }
    }
    free(idx);
    kiln_size_result_free(&r);
    free(p);
    return 0;
}

static int run_predict(opts *o) {
    kiln_hw_profile *p = NULL;
    kiln_error *e;
    kiln_size_shape s;
    if ((e = load_config(o->config, o, &s))) return cli_fail("size predict", e);
    if ((e = load_profile(o, &p))) return cli_fail("size predict", e);
    kiln_size_candidate c;
    memset(&c, 0, sizeof c);
    c.shape = s;
    if ((e = kiln_size_predict(&s, p, &o->b.setup, &c.pred))) { free(p); return cli_fail("size predict", e); }
    o->b.total = (double)c.pred.params.total_nonembed;
    o->b.active = (double)c.pred.params.active_nonembed;
    if (!o->have_vocab) o->b.vocab = s.vocab; /* the config's own vocabulary, not the search's default */
    kiln_size_explain_candidate(p, &o->b, &c);
    const kiln_size_pred *q = &c.pred;
    /* ZAYA: kiln's own CUDA trainer, op class by op class, and its memory report's categories */
    kiln_size_cuda_step cs;
    kiln_size_cuda_memory cm;
    int have_cuda = 0;
    if (s.arch == KILN_ARCH_ZAYA) {
        kiln_size_train tt = o->b.setup.train;
        tt.seq = o->b.setup.seq;
        if ((e = kiln_size_cuda_step_predict(&s, p, &o->b.setup, &cs)) ||
            (e = kiln_size_cuda_memory_train(&s, &tt, p->runtime_gib * GIB, &cm))) {
            free(p);
            return cli_fail("size predict", e);
        }
        have_cuda = 1;
    }
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "config", o->config);
        cJSON_AddItemToObject(root, "profile", kiln_size_profile_json(p));
        cJSON *j = kiln_size_candidate_json(&c);
        cJSON_DeleteItemFromObject(j, "score");
        cJSON_AddItemToObject(root, "prediction", j);
        if (have_cuda) cJSON_AddItemToObject(root, "kiln_cuda", kiln_size_cuda_json(&cs, &cm));
        char *txt = kiln_json_print(root, 1);
        if (txt) puts(txt);
        free(txt);
        cJSON_Delete(root);
    } else {
        char sh[160];
        kiln_size_shape_str(&s, sh, sizeof sh);
        if (o->explain) kiln_size_print_rules(stdout, p, &o->b);
        print_setup(stdout, o, p);
        printf("shape: %s\n", sh);
        printf("parameters: %lld total, %lld active, %lld embedding (%.4gB / %.4gB non-embedding)\n",
               (long long)q->params.total, (long long)q->params.active, (long long)q->params.embedding,
               (double)q->params.total_nonembed / 1e9, (double)q->params.active_nonembed / 1e9);
        printf("FLOPs per token: forward %.4g, backward %.4g, recompute %.4g, training %.4g (attention forward %.4g)\n",
               q->flops.fwd, q->flops.bwd, q->flops.recompute, q->flops.train, q->flops.attn);
        printf("\n%-34s %12s\n", "training (per GPU)", "predicted");
        printf("%-34s %12.4f\n", "micro-batch time (s)", q->t_micro);
        printf("%-34s %12.4f\n", "  GEMMs (s)", q->t_gemm);
        printf("%-34s %12.4f\n", "  attention (s)", q->t_attn);
        printf("%-34s %12.4f\n", "  elementwise, memory-bound (s)", q->t_mem);
        printf("%-34s %12lld\n", "micro-batches per step", (long long)q->grad_accum);
        printf("%-34s %12.4f\n", "optimizer (s)", q->t_optim);
        printf("%-34s %12.4f\n", "ZeRO-1 comm (s)", q->t_comm);
        printf("%-34s %12.4f\n", "step time (s)", q->t_step);
        printf("%-34s %12.0f\n", "tokens/s per GPU", q->tokens_per_s);
        printf("%-34s %11.1f%%\n", "MFU (model FLOPs / bf16 peak)", 100 * q->mfu);
        printf("%-34s %12.1f\n", "expert GEMMs TFLOP/s", q->expert_tflops);
        printf("%-34s %12.1f\n", "attention TFLOP/s", q->attn_tflops);
        printf("\n%-34s %12s\n", "memory per GPU", "GiB");
        const kiln_size_train *tt = &o->b.setup.train;
        printf("%-34s %12.2f\n", tt->weight_bytes == 2 ? "bf16 weights" : "fp32 weights", q->mem.weights / GIB);
        printf("%-34s %12.2f\n", tt->grad_bytes == 4 ? "fp32 gradients" : "bf16 gradients", q->mem.grads / GIB);
        printf("%-34s %12.2f\n", "fp32 master (ZeRO-1 shard)", q->mem.master / GIB);
        printf("%-34s %12.2f\n", "optimizer states (ZeRO-1 shard)", q->mem.optim / GIB);
        printf("%-34s %12.2f\n", "activations", q->mem.activations / GIB);
        printf("%-34s %12.2f\n", "logits", q->mem.logits / GIB);
        printf("%-34s %12.2f%s\n", "peak (total)", q->mem.total / GIB, q->fits ? "" : "  (exceeds 90% of the device)");
        printf("\n%-34s %12s\n", "inference", "predicted");
        printf("%-34s %12.0f\n", "prefill tokens/s (batch 1)", q->prefill_tokens_per_s);
        printf("%-34s %12.3f\n", "decode ms/step, batch 1", q->decode_ms_b1);
        printf("%-34s %12.3f\n", "decode ms/step, batch 64", q->decode_ms_b64);
        printf("%-34s %12.2f\n", "KV cache GiB, batch 64", q->kv_gib_b64);
        if (have_cuda) kiln_size_cuda_print(stdout, &cs, &cm);
        printf("\n");
        print_why(stdout, &c);
    }
    free(p);
    return 0;
}

static int run_profiles(void) {
    const char *const *names = kiln_hw_builtin_names();
    kiln_hw_profile *p = malloc(sizeof *p);
    if (!p) return cli_fail("size", kiln_errorf(KILN_ENOMEM, "profile"));
    printf("%-8s %6s %10s %8s %9s  %s\n", "name", "SMs", "bf16 TF/s", "mem GiB", "mem GB/s", "device / source");
    for (int i = 0; names[i]; i++) {
        kiln_error *e = kiln_hw_profile_load(names[i], p);
        if (e) { free(p); return cli_fail("size", e); }
        printf("%-8s %6lld %10.1f %8.1f %9.0f  %s\n%48s  %s\n", p->name, (long long)p->sm_count, p->peak_bf16,
               p->mem_gib, p->mem_gbs, p->device, "", p->source);
    }
    free(p);
    return 0;
}

static int cmd(int argc, char **argv) {
    opts *o = malloc(sizeof *o);
    if (!o) return cli_fail("size", kiln_errorf(KILN_ENOMEM, "options"));
    int sub = argc > 1 && (!strcmp(argv[1], "check") || !strcmp(argv[1], "predict"));
    int rc;
    if (argc > 1 && !strcmp(argv[1], "profiles")) rc = run_profiles();
    else {
        kiln_error *e = parse(argc, argv, sub ? 2 : 1, sub, o);
        if (e) {
            fprintf(stderr, "kiln size: error: %s\n", kiln_error_msg(e));
            kiln_error_free(e);
            free(o);
            return 2;
        }
        rc = !sub ? run_search(o) : !strcmp(argv[1], "check") ? run_check(o) : run_predict(o);
    }
    free(o);
    return rc;
}

const kiln_cmd kiln_cmd_size = {"size", "hardware-aware model sizing: ranked shapes for a parameter budget", cmd, usage};
