/* The training config: one JSON file in sections (model, data, optim, balance, run). Every field
 * has a default and a line of help, kept together in one table; unknown fields and wrong types
 * are errors naming the field. The model section takes HF ZayaConfig's field names. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/json.h"
#include "kiln/train.h"

typedef enum { F_INT, F_U64, F_DBL, F_BOOL, F_STR, F_SCHED, F_NSPREC } ftype;
typedef struct {
    const char *section, *key;
    ftype type;
    size_t off;
    const char *help;
} field;

/* The largest integer a JSON number holds exactly (and kiln_json_get_int accepts): an int64_t field's natural bound,
 * since configs are written back as JSON into checkpoints' manifests and read again at resume. */
#define JSON_INT_MAX ((int64_t)1 << 53)
/* More threads per rank than any machine has cores: OpenMP would fail to create them (and abort). */
#define THREADS_MAX 4096

#define O(m) offsetof(kiln_train_config, m)
static const field fields[] = {
    {"data", "dir", F_STR, O(data_dir), "token shards made by `kiln data prepare` (train_*.bin, val_*.bin)"},
    {"data", "seq_len", F_INT, O(seq_len), "tokens per training window"},
    {"data", "micro_batch", F_INT, O(micro_batch), "windows per forward/backward on each rank"},
    {"data", "grad_accum", F_INT, O(grad_accum), "micro-batches accumulated per optimizer step on each rank"},
    {"data", "seed", F_U64, O(data_seed), "seed of the data order"},
    {"data", "batch_ramp_start", F_INT, O(batch_ramp_start), "micro-batches per step at step 0 (0: no ramp)"},
    {"data", "batch_ramp_steps", F_INT, O(batch_ramp_steps), "steps over which the batch ramps up to grad_accum"},
    {"optim", "lr", F_DBL, O(sched.lr), "peak learning rate (AdamW, and Muon through its RMS-matched scaling)"},
    {"optim", "min_lr", F_DBL, O(sched.min_lr), "learning rate at the end of the schedule"},
    {"optim", "warmup", F_INT, O(sched.warmup), "linear warm-up steps"},
    {"optim", "schedule", F_SCHED, O(sched.kind), "\"cosine\" or \"wsd\" (warmup-stable-decay)"},
    {"optim", "decay_frac", F_DBL, O(sched.decay_frac), "wsd: share of training spent decaying"},
    {"optim", "weight_decay", F_DBL, O(optim.weight_decay), "decoupled weight decay of matrices and embeddings"},
    {"optim", "beta1", F_DBL, O(optim.beta1), "AdamW first-moment decay"},
    {"optim", "beta2", F_DBL, O(optim.beta2), "AdamW second-moment decay"},
    {"optim", "eps", F_DBL, O(optim.eps), "AdamW epsilon"},
    {"optim", "muon", F_BOOL, O(optim.use_muon), "Muon for hidden matrices (false: AdamW everywhere)"},
    {"optim", "muon_momentum", F_DBL, O(optim.muon_momentum), "Muon's Nesterov momentum"},
    {"optim", "ns_steps", F_INT, O(optim.muon_ns_steps), "Newton-Schulz iterations of Muon"},
    {"optim", "muon_ns_precision", F_NSPREC, O(optim.muon_ns_precision),
     "cuda: Newton-Schulz GEMMs in \"bf16\" (bf16 inputs, f32 accumulation and iterate), \"tf32\" or \"fp32\" "
     "(strict); the CPU always uses f32"},
    {"optim", "clip", F_DBL, O(clip), "global gradient-norm clipping threshold (0: off)"},
    {"balance", "kp", F_DBL, O(bal_kp), "proportional gain of the expert-load controller"},
    {"balance", "ki", F_DBL, O(bal_ki), "integral gain"},
    {"balance", "kd", F_DBL, O(bal_kd), "derivative gain"},
    {"balance", "skip_target", F_DBL, O(bal_skip_target), "target share of tokens routed to the skip expert"},
    {"run", "steps", F_INT, O(steps), "optimizer steps"},
    {"run", "log_every", F_INT, O(log_every), "steps between log lines and metrics records"},
    {"run", "eval_every", F_INT, O(eval_every), "steps between validation losses (0: never)"},
    {"run", "eval_batches", F_INT, O(eval_batches), "micro-batches per validation loss on each rank"},
    {"run", "ckpt_every", F_INT, O(ckpt_every), "steps between checkpoints (0: only at the end)"},
    {"run", "keep_last", F_INT, O(keep_last), "checkpoints kept (older ones are deleted once a newer one is committed)"},
    {"run", "async_ckpt", F_BOOL, O(async_ckpt), "write checkpoints on a background thread while training continues"},
    {"run", "ckpt_busy", F_STR, O(ckpt_busy),
     "a save due while the previous async one is still being written: \"defer\" (keep training, save at the first "
     "step after it commits) or \"wait\" (block until it commits); the final and Ctrl-C saves always wait"},
    {"run", "out_dir", F_STR, O(out_dir), "where metrics.jsonl, ckpt/ and the final model go"},
    {"run", "init_seed", F_U64, O(init_seed), "seed of the parameter initialisation"},
    {"run", "threads", F_INT, O(threads), "CPU threads per rank (0: all cores / ranks)"},
    {"run", "skip_steps", F_STR, O(skip_steps), "steps whose data is consumed without training, e.g. \"9-12,40\" "
                                                "(what kiln run does after a NaN or a loss spike)"},
    {"run", "device", F_STR, O(device), "\"cpu\" or \"cuda\" (one GPU per rank; NCCL between ranks)"},
    {"run", "recompute", F_BOOL, O(recompute), "cuda: activation recomputation (keep each layer's input, "
                                               "re-run its forward in backward)"},
    {"run", "deterministic", F_BOOL, O(deterministic),
     "cuda: bit-identical runs and resumes (true); false lets cuDNN's attention backward accumulate dQ with float "
     "atomics, as PyTorch's does (0-1.5% faster by run; $KILN_ATTENTION, where set, decides instead)"},
    {"run", "save_final", F_BOOL, O(save_final), "write the final checkpoint and model/ (false: a benchmark run)"},
};
#define NFIELDS (sizeof fields / sizeof fields[0])

/* The F_INT fields held in an int (the rest are int64_t). */
static int is_int_field(const field *f) { return f->off == O(optim.muon_ns_steps) || f->off == O(threads); }

/* The accepted range of the F_INT fields: their natural lower bound, and at most what their C type holds. */
static const struct {
    size_t off;
    int64_t lo, hi;
} int_ranges[] = {
    {O(seq_len), 2, JSON_INT_MAX},          {O(micro_batch), 1, JSON_INT_MAX},
    {O(grad_accum), 1, JSON_INT_MAX},       {O(batch_ramp_start), 0, JSON_INT_MAX},
    {O(batch_ramp_steps), 0, JSON_INT_MAX}, {O(sched.warmup), 0, JSON_INT_MAX},
    {O(optim.muon_ns_steps), 1, INT_MAX},   {O(steps), 0, JSON_INT_MAX},
    {O(log_every), 1, JSON_INT_MAX},        {O(eval_every), 0, JSON_INT_MAX},
    {O(eval_batches), 1, JSON_INT_MAX},     {O(ckpt_every), 0, JSON_INT_MAX},
    {O(keep_last), 1, JSON_INT_MAX},        {O(threads), 0, THREADS_MAX},
};

static void int_range(const field *f, int64_t *lo, int64_t *hi) {
    /* a field added without an entry still gets its C type's range: it can never wrap */
    *lo = is_int_field(f) ? INT_MIN : -JSON_INT_MAX;
    *hi = is_int_field(f) ? INT_MAX : JSON_INT_MAX;
    for (size_t i = 0; i < sizeof int_ranges / sizeof int_ranges[0]; i++)
        if (int_ranges[i].off == f->off) *lo = int_ranges[i].lo, *hi = int_ranges[i].hi;
}

static const char *const sections[] = {"model", "data", "optim", "balance", "run", NULL};

void kiln_train_config_default(kiln_train_config *c) {
    memset(c, 0, sizeof *c);
    /* the built-in default: a small ZAYA that learns visibly on two CPU cores within minutes */
    kiln_zaya_config *m = &c->model;
    kiln_zaya_config_default(m);
    m->vocab_size = 2048;
    m->hidden_size = 128;
    m->num_layers = 4;
    m->num_heads = 4;
    m->num_kv_heads = 2;
    m->head_dim = 32;
    m->num_experts = 4;
    m->moe_intermediate = 256;
    m->router_hidden = 32;
    m->pad_token_id = -1;
    m->bos_token_id = -1;
    m->eos_token_id = 0; /* <|endoftext|>, the first special token of kiln-trained tokenizers */
    m->rope_theta[0] = 10000.0;
    c->init_seed = 1;
    snprintf(c->data_dir, sizeof c->data_dir, "runs/default/data");
    c->seq_len = 128;
    c->micro_batch = 8;
    c->grad_accum = 1;
    c->data_seed = 1;
    /* Muon's Newton-Schulz in bf16 on the GPU, as Muon's reference implementation: the iteration corrects
     * itself, and bf16 runs it on the tensor cores at ~10x the f32 rate (docs/perf.md) */
    c->optim = (kiln_optim_hparams){0.9, 0.95, 1e-8, 0.1, 0.95, 5, 1, KILN_NS_BF16};
    c->sched = (kiln_schedule){KILN_SCHED_COSINE, 3e-3, 3e-4, 50, 0, 0.2};
    c->clip = 1.0;
    c->bal_kp = 1e-2;
    c->bal_ki = 1e-4;
    c->bal_kd = 0.0;
    c->bal_skip_target = 0.0;
    c->steps = 600;
    c->log_every = 10;
    c->eval_every = 100;
    c->eval_batches = 4;
    c->ckpt_every = 200;
    c->keep_last = 2;
    c->async_ckpt = 1;
    snprintf(c->ckpt_busy, sizeof c->ckpt_busy, "defer");
    snprintf(c->out_dir, sizeof c->out_dir, "runs/default");
    c->threads = 0;
    snprintf(c->device, sizeof c->device, "cpu");
    c->recompute = 0;
    c->deterministic = 1;
    c->save_final = 1;
}

static const field *find_field(const char *section, const char *key) {
    for (size_t i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].section, section) && !strcmp(fields[i].key, key)) return &fields[i];
    return NULL;
}

static int64_t int_value(const field *f, const kiln_train_config *c) {
    const char *base = (const char *)c + f->off;
    return is_int_field(f) ? *(const int *)base : *(const int64_t *)base;
}

static kiln_error *set_field(const field *f, const cJSON *sec, const char *ctx, kiln_train_config *c) {
    char *base = (char *)c + f->off;
    switch (f->type) {
    case F_INT: {
        int64_t v;
        KILN_TRY(kiln_json_get_int(sec, f->key, &v, 0, 1, ctx));
        /* before the store: an int field would wrap (4294967297 -> 1) and pass any later check */
        int64_t lo, hi;
        int_range(f, &lo, &hi);
        if (v < lo || v > hi)
            return kiln_errorf(KILN_EINVAL, "%s: field '%s.%s' = %lld is outside %lld..%lld", ctx, f->section, f->key,
                               (long long)v, (long long)lo, (long long)hi);
        if (is_int_field(f)) *(int *)base = (int)v;
        else *(int64_t *)base = v;
        return NULL;
    }
    case F_U64: {
        int64_t v;
        KILN_TRY(kiln_json_get_int(sec, f->key, &v, 0, 1, ctx));
        if (v < 0) return kiln_errorf(KILN_EINVAL, "%s: field '%s' must be >= 0", ctx, f->key);
        *(uint64_t *)base = (uint64_t)v;
        return NULL;
    }
    case F_DBL: return kiln_json_get_double(sec, f->key, (double *)base, 0, 1, ctx);
    case F_BOOL: return kiln_json_get_bool(sec, f->key, (int *)base, 0, 1, ctx);
    case F_STR: {
        const char *s;
        KILN_TRY(kiln_json_get_string(sec, f->key, &s, NULL, 1, ctx));
        if (strlen(s) >= 1024) return kiln_errorf(KILN_EINVAL, "%s: field '%s' is longer than 1023 bytes", ctx, f->key);
        snprintf(base, 1024, "%s", s);
        return NULL;
    }
    case F_SCHED: {
        const char *s;
        KILN_TRY(kiln_json_get_string(sec, f->key, &s, NULL, 1, ctx));
        if (!strcmp(s, "cosine")) *(kiln_sched_kind *)base = KILN_SCHED_COSINE;
        else if (!strcmp(s, "wsd")) *(kiln_sched_kind *)base = KILN_SCHED_WSD;
        else return kiln_errorf(KILN_EINVAL, "%s: field '%s' must be \"cosine\" or \"wsd\", got \"%s\"", ctx, f->key, s);
        return NULL;
    }
    case F_NSPREC: {
        const char *s;
        KILN_TRY(kiln_json_get_string(sec, f->key, &s, NULL, 1, ctx));
        kiln_error *e = kiln_ns_precision_parse(s, (kiln_ns_precision *)base);
        return e ? kiln_error_wrap(e, "%s: field '%s'", ctx, f->key) : NULL;
    }
    }
    return NULL;
}

static kiln_error *parse_root(const cJSON *root, const char *ctx, kiln_train_config *c) {
    if (!cJSON_IsObject(root)) return kiln_errorf(KILN_EFORMAT, "%s: top level must be a JSON object", ctx);
    const cJSON *sec;
    cJSON_ArrayForEach(sec, root) {
        int known = 0;
        for (int i = 0; sections[i]; i++) known |= !strcmp(sections[i], sec->string);
        if (!known)
            return kiln_errorf(KILN_EINVAL, "%s: unknown section '%s' (sections: model, data, optim, balance, run)", ctx,
                               sec->string);
        if (!cJSON_IsObject(sec)) return kiln_errorf(KILN_EINVAL, "%s: section '%s' must be an object", ctx, sec->string);
        char sctx[1200];
        snprintf(sctx, sizeof sctx, "%s: %s", ctx, sec->string);
        const cJSON *it;
        if (!strcmp(sec->string, "model")) {
            cJSON_ArrayForEach(it, sec) if (!kiln_zaya_config_known_key(it->string))
                return kiln_errorf(KILN_EINVAL, "%s: unknown field '%s'", sctx, it->string);
            KILN_TRY(kiln_zaya_config_from_json(sec, sctx, &c->model));
            continue;
        }
        cJSON_ArrayForEach(it, sec) {
            const field *f = find_field(sec->string, it->string);
            if (!f) return kiln_errorf(KILN_EINVAL, "%s: unknown field '%s' (see kiln train --help-config)", sctx, it->string);
            KILN_TRY(set_field(f, sec, sctx, c));
        }
    }
    return kiln_train_config_validate(c);
}

kiln_error *kiln_train_config_parse(const char *text, const char *ctx, kiln_train_config *c) {
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse(text, strlen(text), ctx, &root));
    kiln_error *e = parse_root(root, ctx, c);
    cJSON_Delete(root);
    return e;
}

kiln_error *kiln_train_config_load(const char *path, kiln_train_config *c) {
    char *text = NULL;
    size_t len = 0;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_error *e = kiln_train_config_parse(text, path, c);
    free(text);
    return e;
}

kiln_error *kiln_train_config_validate(const kiln_train_config *c) {
    KILN_TRY(kiln_zaya_config_validate(&c->model, "config: model"));
    /* every integer field against the table's range (a config built in code, or changed by a flag, too) */
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        if (f->type != F_INT) continue;
        const int64_t v = int_value(f, c);
        int64_t lo, hi;
        int_range(f, &lo, &hi);
        if (v < lo || v > hi)
            return kiln_errorf(KILN_EINVAL, "config: field '%s.%s' = %lld is outside %lld..%lld", f->section, f->key,
                               (long long)v, (long long)lo, (long long)hi);
    }
    /* the tokens of a step are counted in a double (tokens_seen, metrics, manifests): exact up to 2^53. Divided, not
     * multiplied: each factor may be up to 2^53 itself */
    if (c->seq_len > JSON_INT_MAX / c->micro_batch || c->seq_len * c->micro_batch > JSON_INT_MAX / c->grad_accum)
        return kiln_errorf(KILN_EINVAL, "config: data.seq_len x data.micro_batch x data.grad_accum = %lld x %lld x %lld "
                           "tokens per step on each rank is more than 2^53", (long long)c->seq_len,
                           (long long)c->micro_batch, (long long)c->grad_accum);
    if (c->batch_ramp_start > c->grad_accum)
        return kiln_errorf(KILN_EINVAL, "config: data.batch_ramp_start (%lld) exceeds data.grad_accum (%lld)",
                           (long long)c->batch_ramp_start, (long long)c->grad_accum);
    if (!(c->sched.lr > 0) || c->sched.min_lr < 0 || c->sched.min_lr > c->sched.lr)
        return kiln_errorf(KILN_EINVAL, "config: need 0 <= optim.min_lr <= optim.lr and optim.lr > 0");
    if (c->sched.decay_frac < 0 || c->sched.decay_frac > 1)
        return kiln_errorf(KILN_EINVAL, "config: optim.decay_frac must be in 0..1");
    if (c->optim.beta1 < 0 || c->optim.beta1 >= 1 || c->optim.beta2 < 0 || c->optim.beta2 >= 1 || !(c->optim.eps > 0))
        return kiln_errorf(KILN_EINVAL, "config: optim.beta1 and beta2 must be in [0,1) and eps > 0");
    if ((unsigned)c->optim.muon_ns_precision > KILN_NS_BF16)
        return kiln_errorf(KILN_EINVAL, "config: optim.muon_ns_precision %d is not bf16, tf32 or fp32",
                           (int)c->optim.muon_ns_precision);
    if (c->bal_skip_target < 0 || c->bal_skip_target >= 1)
        return kiln_errorf(KILN_EINVAL, "config: balance.skip_target must be in [0,1)");
    if (!c->data_dir[0]) return kiln_errorf(KILN_EINVAL, "config: data.dir is empty");
    if (!c->out_dir[0]) return kiln_errorf(KILN_EINVAL, "config: run.out_dir is empty");
    if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        return kiln_errorf(KILN_EINVAL, "config: run.device '%s' is not \"cpu\" or \"cuda\"", c->device);
    if (strcmp(c->ckpt_busy, "defer") && strcmp(c->ckpt_busy, "wait"))
        return kiln_errorf(KILN_EINVAL, "config: run.ckpt_busy '%s' is not \"defer\" or \"wait\"", c->ckpt_busy);
    kiln_step_ranges skip = {0};
    kiln_error *e = kiln_step_ranges_parse(c->skip_steps, &skip);
    kiln_step_ranges_free(&skip);
    if (e) return kiln_error_wrap(e, "config: field 'run.skip_steps'");
    return NULL;
}

static cJSON *field_json(const field *f, const kiln_train_config *c) {
    const char *base = (const char *)c + f->off;
    switch (f->type) {
    case F_INT: return cJSON_CreateNumber((double)int_value(f, c));
    case F_U64: return cJSON_CreateNumber((double)*(const uint64_t *)base);
    case F_DBL: return cJSON_CreateNumber(*(const double *)base);
    case F_BOOL: return cJSON_CreateBool(*(const int *)base);
    case F_STR: return cJSON_CreateString(base);
    case F_SCHED: return cJSON_CreateString(*(const kiln_sched_kind *)base == KILN_SCHED_WSD ? "wsd" : "cosine");
    case F_NSPREC: return cJSON_CreateString(kiln_ns_precision_name(*(const kiln_ns_precision *)base));
    }
    return cJSON_CreateNull();
}

char *kiln_train_config_to_json(const kiln_train_config *c) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *model = kiln_zaya_config_to_cjson(&c->model); /* the model section in HF's names */
    cJSON_AddItemToObject(root, "model", model ? model : cJSON_CreateObject());
    for (int s = 1; sections[s]; s++) {
        cJSON *sec = cJSON_AddObjectToObject(root, sections[s]);
        for (size_t i = 0; i < NFIELDS; i++)
            if (!strcmp(fields[i].section, sections[s])) cJSON_AddItemToObject(sec, fields[i].key, field_json(&fields[i], c));
    }
    char *out = kiln_json_print(root, 1);
    cJSON_Delete(root);
    return out;
}

void kiln_train_config_print_help(FILE *f) {
    kiln_train_config d;
    kiln_train_config_default(&d);
    fprintf(f, "kiln train config: a JSON object with sections model, data, optim, balance, run.\n"
               "Every field is optional; the defaults below are the built-in default run.\n\n"
               "[model] HF ZayaConfig fields (vocab_size, hidden_size, num_hidden_layers, num_attention_heads,\n"
               "  num_key_value_heads, head_dim, num_experts, num_experts_per_tok, moe_intermediate_size,\n"
               "  router_hidden_size, cca_time0, cca_time1, sliding_window, layer_types, rope_parameters,\n"
               "  rms_norm_eps, initializer_range, tie_word_embeddings, attention_bias, lm_head_bias, ...)\n");
    const char *cur = "";
    for (size_t i = 0; i < NFIELDS; i++) {
        if (strcmp(cur, fields[i].section)) fprintf(f, "\n[%s]\n", cur = fields[i].section);
        cJSON *v = field_json(&fields[i], &d);
        char *s = kiln_json_print(v, 0);
        fprintf(f, "  %-18s %-22s %s\n", fields[i].key, s ? s : "?", fields[i].help);
        free(s);
        cJSON_Delete(v);
    }
}
