/* Hardware profiles and the time of one kernel on them.
 *
 * A GEMM's time is its FLOPs over peak x efficiency x quantization: the output is cut into tiles of
 * tile_m x tile_n (a partial tile costs a whole one) which run in waves of sm_count (a partial wave
 * costs a whole one). The efficiency left after quantization is interpolated, over log2(M·N·K),
 * between the measured shapes (each measured rate divided by its own quantization), or is the
 * profile's gemm_efficiency when nothing is measured; memory traffic bounds it from below. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/log.h"
#include "kiln/sizing.h"
#include "kiln_hw_builtin.h"

const char *const *kiln_hw_builtin_names(void) {
    static const char *names[sizeof kiln_hw_builtin / sizeof kiln_hw_builtin[0]];
    for (size_t i = 0; kiln_hw_builtin[i].name; i++) names[i] = kiln_hw_builtin[i].name;
    return names;
}

static kiln_error *get_pos(const cJSON *o, const char *f, double *out, int required, const char *ctx) {
    double v = 0;
    KILN_TRY(kiln_json_get_double(o, f, &v, -1, required, ctx));
    if (v == -1 && !required) return NULL;
    if (!(v > 0)) return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %g must be positive", ctx, f, v);
    *out = v;
    return NULL;
}

static kiln_error *get_posi(const cJSON *o, const char *f, int64_t *out, const char *ctx) {
    KILN_TRY(kiln_json_get_int(o, f, out, 0, 1, ctx));
    if (*out <= 0) return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %lld must be positive", ctx, f, (long long)*out);
    return NULL;
}

static kiln_error *section(const cJSON *root, const char *name, const cJSON **out, char *src, size_t cap,
                           const char *ctx, char *sctx, size_t scap) {
    snprintf(sctx, scap, "%s: %s", ctx, name);
    KILN_TRY(kiln_json_get_object(root, name, out, 1, ctx));
    const char *s;
    KILN_TRY(kiln_json_get_string(*out, "source", &s, NULL, 1, sctx));
    snprintf(src, cap, "%s", s);
    return NULL;
}

/* A record's positive number field (an integer where `integer`). */
static kiln_error *rec_num(const cJSON *r, const char *f, double *out, int integer, const char *rctx) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r, f);
    if (!cJSON_IsNumber(it)) return kiln_errorf(KILN_EFORMAT, "%s: field '%s' is missing or not a number", rctx, f);
    if (!(it->valuedouble > 0) || (integer && it->valuedouble != floor(it->valuedouble)))
        return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %g must be a positive %s", rctx, f, it->valuedouble,
                           integer ? "integer" : "number");
    *out = it->valuedouble;
    return NULL;
}

/* The optional section "kiln_kernels": timed attention and expert kernels of kiln's own, the copy sweep,
 * per-class scales of a calibration run (docs/sizing.md). */
static kiln_error *parse_kernels(const cJSON *root, const char *ctx, kiln_hw_profile *p) {
    const cJSON *o = NULL, *a, *r;
    char sctx[600], rctx[700];
    KILN_TRY(kiln_json_get_object(root, "kiln_kernels", &o, 0, ctx));
    if (!o) return NULL;
    snprintf(sctx, sizeof sctx, "%s: kiln_kernels", ctx);
    const char *src;
    KILN_TRY(kiln_json_get_string(o, "source", &src, NULL, 1, sctx));
    snprintf(p->timed_source, sizeof p->timed_source, "%s", src);
    double v[8];
    KILN_TRY(kiln_json_get_array(o, "attention", &a, 0, sctx));
    int i = 0;
    if (a) cJSON_ArrayForEach(r, a) {
        snprintf(rctx, sizeof rctx, "%s.attention[%d]", sctx, i++);
        if (p->nattn_t == 64) return kiln_errorf(KILN_EINVAL, "%s: more than 64 records", rctx);
        static const char *f[] = {"batch", "seq", "heads", "kv_heads", "head_dim", "fwd_us", "bwd_us"};
        for (int j = 0; j < 7; j++) KILN_TRY(rec_num(r, f[j], &v[j], j < 5, rctx));
        double w = 0;
        KILN_TRY(kiln_json_get_double(r, "window", &w, 0, 0, rctx));
        p->attn_t[p->nattn_t++] = (kiln_hw_attn_timed){(int64_t)v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3],
                                                       (int64_t)v[4], (int64_t)w, v[5], v[6]};
    }
    KILN_TRY(kiln_json_get_array(o, "moe", &a, 0, sctx));
    i = 0;
    if (a) cJSON_ArrayForEach(r, a) {
        snprintf(rctx, sizeof rctx, "%s.moe[%d]", sctx, i++);
        if (p->nmoe_t == 64) return kiln_errorf(KILN_EINVAL, "%s: more than 64 records", rctx);
        static const char *f[] = {"tokens", "hidden", "inter", "experts", "top_k", "fwd_us", "bwd_us"};
        for (int j = 0; j < 7; j++) KILN_TRY(rec_num(r, f[j], &v[j], j < 5, rctx));
        p->moe_t[p->nmoe_t++] = (kiln_hw_moe_timed){(int64_t)v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3],
                                                    (int64_t)v[4], v[5], v[6]};
    }
    KILN_TRY(kiln_json_get_array(o, "copy_sweep", &a, 0, sctx));
    i = 0;
    if (a) cJSON_ArrayForEach(r, a) {
        snprintf(rctx, sizeof rctx, "%s.copy_sweep[%d]", sctx, i++);
        if (p->nbw == 64) return kiln_errorf(KILN_EINVAL, "%s: more than 64 records", rctx);
        KILN_TRY(rec_num(r, "bytes", &v[0], 0, rctx));
        KILN_TRY(rec_num(r, "gbs", &v[1], 0, rctx));
        p->bw[p->nbw++] = (kiln_hw_bw_point){v[0], v[1]};
    }
    KILN_TRY(kiln_json_get_array(o, "rates", &a, 0, sctx));
    i = 0;
    if (a) cJSON_ArrayForEach(r, a) {
        snprintf(rctx, sizeof rctx, "%s.rates[%d]", sctx, i++);
        if (p->nrate == 32) return kiln_errorf(KILN_EINVAL, "%s: more than 32 records", rctx);
        const char *c;
        KILN_TRY(kiln_json_get_string(r, "class", &c, NULL, 1, rctx));
        KILN_TRY(rec_num(r, "scale", &v[0], 0, rctx));
        kiln_hw_rate *k = &p->rate[p->nrate++];
        snprintf(k->cls, sizeof k->cls, "%s", c);
        k->scale = v[0];
    }
    return NULL;
}

static kiln_error *parse(const cJSON *root, const char *ctx, kiln_hw_profile *p) {
    char sctx[600];
    const cJSON *o;
    const char *s;
    int64_t version = 0;
    memset(p, 0, sizeof *p);
    if (!cJSON_IsObject(root)) return kiln_errorf(KILN_EFORMAT, "%s: top level must be a JSON object", ctx);
    if (cJSON_GetObjectItemCaseSensitive(root, "kiln_profile") && !cJSON_GetObjectItemCaseSensitive(root, "kiln_hw_profile"))
        return kiln_errorf(KILN_EFORMAT, "%s is a `kiln bench` profile (measurements, no hardware description): "
                           "merge it into a hardware profile with --profile NAME --bench %s", ctx, ctx);
    KILN_TRY(kiln_json_get_int(root, "kiln_hw_profile", &version, 0, 1, ctx));
    if (version != 1) return kiln_errorf(KILN_EUNSUPPORTED, "%s: kiln_hw_profile %lld is not supported (expected 1)",
                                         ctx, (long long)version);
    KILN_TRY(kiln_json_get_string(root, "name", &s, NULL, 1, ctx));
    snprintf(p->name, sizeof p->name, "%s", s);
    KILN_TRY(kiln_json_get_string(root, "device", &s, NULL, 1, ctx));
    snprintf(p->device, sizeof p->device, "%s", s);
    KILN_TRY(kiln_json_get_string(root, "source", &s, NULL, 1, ctx));
    snprintf(p->source, sizeof p->source, "%s", s);
    KILN_TRY(kiln_json_get_string(root, "notes", &s, "", 0, ctx));
    snprintf(p->notes, sizeof p->notes, "%s", s);

    KILN_TRY(section(root, "compute", &o, p->compute_source, sizeof p->compute_source, ctx, sctx, sizeof sctx));
    KILN_TRY(get_posi(o, "sm_count", &p->sm_count, sctx));
    KILN_TRY(get_posi(o, "tile_m", &p->tile_m, sctx));
    KILN_TRY(get_posi(o, "tile_n", &p->tile_n, sctx));
    const cJSON *pk;
    KILN_TRY(kiln_json_get_object(o, "peak_tflops", &pk, 1, sctx));
    char pctx[640];
    snprintf(pctx, sizeof pctx, "%s.peak_tflops", sctx);
    KILN_TRY(get_pos(pk, "bf16", &p->peak_bf16, 1, pctx));
    KILN_TRY(get_pos(pk, "fp8", &p->peak_fp8, 0, pctx));
    KILN_TRY(get_pos(pk, "fp32", &p->peak_fp32, 0, pctx));
    KILN_TRY(get_pos(o, "gemm_efficiency", &p->gemm_efficiency, 0, sctx));
    if (p->gemm_efficiency > 1) return kiln_errorf(KILN_EINVAL, "%s: field 'gemm_efficiency' = %g is above 1", sctx,
                                                   p->gemm_efficiency);

    KILN_TRY(section(root, "memory", &o, p->memory_source, sizeof p->memory_source, ctx, sctx, sizeof sctx));
    KILN_TRY(get_pos(o, "gib", &p->mem_gib, 1, sctx));
    KILN_TRY(get_pos(o, "peak_gbs", &p->mem_peak_gbs, 1, sctx));
    p->mem_gbs = p->mem_peak_gbs;
    KILN_TRY(get_pos(o, "achieved_gbs", &p->mem_gbs, 0, sctx));
    KILN_TRY(kiln_json_get_double(o, "runtime_gib", &p->runtime_gib, 0, 0, sctx));
    if (p->runtime_gib < 0) return kiln_errorf(KILN_EINVAL, "%s: field 'runtime_gib' = %g is negative", sctx, p->runtime_gib);

    KILN_TRY(section(root, "interconnect", &o, p->interconnect_source, sizeof p->interconnect_source, ctx, sctx,
                     sizeof sctx));
    KILN_TRY(get_posi(o, "gpus_per_node", &p->gpus_per_node, sctx));
    KILN_TRY(get_pos(o, "intra_busbw_gbs", &p->intra_busbw_gbs, 1, sctx));
    KILN_TRY(get_pos(o, "inter_busbw_gbs", &p->inter_busbw_gbs, 1, sctx));
    KILN_TRY(kiln_json_get_double(o, "latency_us", &p->comm_latency_us, 0, 0, sctx));

    KILN_TRY(section(root, "attention", &o, p->attention_source, sizeof p->attention_source, ctx, sctx, sizeof sctx));
    KILN_TRY(get_posi(o, "head_dim_tile", &p->head_dim_tile, sctx));
    const cJSON *recs, *r;
    KILN_TRY(kiln_json_get_array(o, "records", &recs, 1, sctx));
    cJSON_ArrayForEach(r, recs) {
        char rctx[700];
        snprintf(rctx, sizeof rctx, "%s.records[%d]", sctx, p->nattn);
        if (p->nattn >= (int)(sizeof p->attn / sizeof p->attn[0]))
            return kiln_errorf(KILN_EINVAL, "%s: more than %d records", sctx, (int)(sizeof p->attn / sizeof p->attn[0]));
        kiln_hw_attn_point *a = &p->attn[p->nattn];
        KILN_TRY(get_posi(r, "head_dim", &a->head_dim, rctx));
        KILN_TRY(get_pos(r, "fwd_eff", &a->fwd_eff, 1, rctx));
        KILN_TRY(get_pos(r, "bwd_eff", &a->bwd_eff, 1, rctx));
        if (a->fwd_eff > 1 || a->bwd_eff > 1) return kiln_errorf(KILN_EINVAL, "%s: efficiencies must be at most 1", rctx);
        p->nattn++;
    }
    if (!p->nattn) return kiln_errorf(KILN_EINVAL, "%s: no records (one per head dim: head_dim, fwd_eff, bwd_eff)", sctx);

    KILN_TRY(section(root, "gemm", &o, p->gemm_source, sizeof p->gemm_source, ctx, sctx, sizeof sctx));
    KILN_TRY(kiln_json_get_array(o, "records", &recs, 1, sctx));
    cJSON_ArrayForEach(r, recs) {
        char rctx[700];
        snprintf(rctx, sizeof rctx, "%s.records[%d]", sctx, p->ngemm);
        const char *dt;
        KILN_TRY(kiln_json_get_string(r, "dtype", &dt, NULL, 1, rctx));
        if (strcmp(dt, "bf16")) continue;
        if (p->ngemm >= KILN_HW_MAX_POINTS) break;
        kiln_hw_gemm_point *g = &p->gemm[p->ngemm];
        KILN_TRY(get_posi(r, "m", &g->m, rctx));
        KILN_TRY(get_posi(r, "n", &g->n, rctx));
        KILN_TRY(get_posi(r, "k", &g->k, rctx));
        KILN_TRY(get_pos(r, "tflops", &g->tflops, 1, rctx));
        p->ngemm++;
    }
    if (!p->ngemm && p->gemm_efficiency <= 0)
        return kiln_errorf(KILN_EINVAL, "%s: no bf16 GEMM records and no compute.gemm_efficiency: nothing to predict "
                           "GEMM time from", ctx);
    KILN_TRY(parse_kernels(root, ctx, p));
    const cJSON *comm = NULL;
    KILN_TRY(kiln_json_get_object(root, "comm", &comm, 0, ctx));
    if (comm) {
        snprintf(sctx, sizeof sctx, "%s: comm", ctx);
        KILN_TRY(kiln_json_get_array(comm, "records", &recs, 0, sctx));
        int i = 0;
        cJSON_ArrayForEach(r, recs) {
            char rctx[700];
            snprintf(rctx, sizeof rctx, "%s.records[%d]", sctx, i++);
            const char *col;
            kiln_hw_comm_point c = {0};
            KILN_TRY(kiln_json_get_string(r, "collective", &col, NULL, 1, rctx));
            KILN_TRY(get_posi(r, "bytes", &c.bytes, rctx));
            KILN_TRY(get_posi(r, "ranks", &c.ranks, rctx));
            KILN_TRY(kiln_json_get_int(r, "hosts", &c.hosts, 0, 0, rctx)); /* optional: 0, unknown */
            if (c.hosts < 0 || c.hosts > c.ranks)
                return kiln_errorf(KILN_EINVAL, "%s: field 'hosts' is %lld: expected 1 to ranks (%lld)", rctx,
                                   (long long)c.hosts, (long long)c.ranks);
            KILN_TRY(get_pos(r, "busbw_gbs", &c.busbw_gbs, 1, rctx));
            if (!strcmp(col, "reduce_scatter") && p->nrs < KILN_HW_MAX_POINTS) p->rs[p->nrs++] = c;
            else if (!strcmp(col, "all_gather") && p->nag < KILN_HW_MAX_POINTS) p->ag[p->nag++] = c;
        }
    }
    return NULL;
}

kiln_error *kiln_hw_profile_parse(const char *text, const char *ctx, kiln_hw_profile *p) {
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse(text, strlen(text), ctx, &root));
    kiln_error *e = parse(root, ctx, p);
    cJSON_Delete(root);
    return e;
}

kiln_error *kiln_hw_profile_load(const char *name_or_path, kiln_hw_profile *p) {
    for (size_t i = 0; kiln_hw_builtin[i].name; i++)
        if (!strcmp(kiln_hw_builtin[i].name, name_or_path)) {
            char ctx[128];
            snprintf(ctx, sizeof ctx, "built-in profile %s", name_or_path);
            return kiln_hw_profile_parse(kiln_hw_builtin[i].json, ctx, p);
        }
    if (!strchr(name_or_path, '/') && !strstr(name_or_path, ".json")) {
        char list[256] = "";
        for (size_t i = 0; kiln_hw_builtin[i].name; i++) {
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, kiln_hw_builtin[i].name, sizeof list - strlen(list) - 1);
        }
        return kiln_errorf(KILN_ENOTFOUND, "unknown profile '%s' (built-in: %s; or a path to a profile JSON)",
                           name_or_path, list);
    }
    char *text = NULL;
    size_t len = 0;
    KILN_TRY(kiln_read_file(name_or_path, &text, &len));
    kiln_error *e = kiln_hw_profile_parse(text, name_or_path, p);
    free(text);
    return e;
}

static int str_is(const cJSON *r, const char *f, const char *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r, f);
    return cJSON_IsString(it) && !strcmp(it->valuestring, v);
}

static double num(const cJSON *r, const char *f) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r, f);
    return cJSON_IsNumber(it) ? it->valuedouble : -1;
}

/* Whether two `kiln bench attention` records time the same kernel on the same shape: every field that tells
 * cases apart must agree (absent on both sides agrees; no window is window 0). A sweep over KV-head counts,
 * windows or implementations (--impl own,cudnn: backend cuda / cudnn / cudnn-nondet) holds several records
 * that agree on seq, batch, heads and head dim alone. */
static int attn_same_case(const cJSON *a, const cJSON *b) {
    static const char *const strs[] = {"device", "backend", "impl", "dtype"};
    static const char *const nums[] = {"batch", "seq", "heads", "kv_heads", "head_dim"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, strs[i]), *y = cJSON_GetObjectItemCaseSensitive(b, strs[i]);
        if (cJSON_IsString(x) != cJSON_IsString(y) || (cJSON_IsString(x) && strcmp(x->valuestring, y->valuestring)))
            return 0;
    }
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (num(a, nums[i]) != num(b, nums[i])) return 0;
    const double wa = num(a, "window"), wb = num(b, "window");
    return (wa > 0 ? wa : 0) == (wb > 0 ? wb : 0);
}

/* The fwd_bwd record that goes with the fwd record r: of the same case, the k-th one for the k-th fwd of
 * that case (a case timed twice pairs in order), or NULL. */
static const cJSON *attn_partner(const cJSON *sec, const cJSON *r) {
    int k = 0;
    const cJSON *x;
    for (x = sec->child; x && x != r; x = x->next) k += str_is(x, "pass", "fwd") && attn_same_case(x, r);
    cJSON_ArrayForEach(x, sec)
        if (str_is(x, "pass", "fwd_bwd") && attn_same_case(x, r) && k-- == 0) return x;
    return NULL;
}

/* Puts "NOTE; " in front of the profile's own summary, which says what is measured and what is estimated
 * (the header of kiln size and --explain print it): after a merge, part of that is no longer so, and the
 * summary is marked as the profile's before the merge. The note goes first so that a long summary loses its
 * tail, not the note. */
static void source_note(kiln_hw_profile *p, const char *note) {
    static const char mark[] = "profile before --bench: ";
    char buf[sizeof p->source];
    const int first = !strstr(p->source, mark);
    if (snprintf(buf, sizeof buf, "%s; %s%s", note, first ? mark : "", p->source) < 0) return;
    memcpy(p->source, buf, sizeof buf);
}

/* kiln's own timed kernels from a kiln bench profile, added to the profile's tables (a shape measured
 * again replaces the earlier record): attention fwd and fwd_bwd pairs off the CPU, the expert op with
 * balanced routing (fwd and fwd_bwd), the GPU copy sweep (bytes moved = read + written). Returns 1 when
 * it found any. */
static int merge_kernels(kiln_hw_profile *p, const cJSON *root, const char *path) {
    int found = 0;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "attention"), *r, *r2;
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        if (str_is(r, "backend", "cpu") || !str_is(r, "dtype", "bf16") || !str_is(r, "pass", "fwd")) continue;
        /* the same implementation (kiln's kernels or cuDNN's) on the same shape: attn_partner */
        r2 = attn_partner(sec, r);
        if (!r2 || num(r, "time_us") <= 0 || num(r2, "time_us") <= num(r, "time_us")) continue;
        kiln_hw_attn_timed a = {(int64_t)num(r, "batch"), (int64_t)num(r, "seq"), (int64_t)num(r, "heads"),
                                (int64_t)num(r, "kv_heads"), (int64_t)num(r, "head_dim"),
                                (int64_t)(num(r, "window") > 0 ? num(r, "window") : 0), num(r, "time_us"),
                                num(r2, "time_us") - num(r, "time_us")};
        if (a.batch < 1 || a.seq < 1 || a.heads < 1 || a.kv_heads < 1 || a.head_dim < 1) continue;
        int j = 0;
        while (j < p->nattn_t && !(p->attn_t[j].batch == a.batch && p->attn_t[j].seq == a.seq &&
                                   p->attn_t[j].heads == a.heads && p->attn_t[j].kv_heads == a.kv_heads &&
                                   p->attn_t[j].head_dim == a.head_dim && p->attn_t[j].window == a.window))
            j++;
        if (j < 64) p->attn_t[j] = a, p->nattn_t += j == p->nattn_t, found++;
    }
    sec = cJSON_GetObjectItemCaseSensitive(root, "moe");
    /* with several grouped-GEMM paths timed ("path"), the one the trainer runs ("default_path": true) */
    int any_default = 0;
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) any_default |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "default_path"));
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        if (!str_is(r, "backend", "cuda") || !str_is(r, "part", "op") || !str_is(r, "pass", "fwd") ||
            !str_is(r, "routing", "balanced") || (any_default && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "default_path"))))
            continue;
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(r, "path");
        cJSON_ArrayForEach(r2, sec) {
            if (!str_is(r2, "backend", "cuda") || !str_is(r2, "part", "op") || !str_is(r2, "pass", "fwd_bwd") ||
                !str_is(r2, "routing", "balanced") || (cJSON_IsString(path) && !str_is(r2, "path", path->valuestring)))
                continue;
            static const char *key[] = {"tokens", "hidden", "inter", "experts", "top_k"};
            int same = 1;
            for (int j = 0; j < 5; j++) same &= num(r2, key[j]) == num(r, key[j]);
            if (!same || num(r, "time_us") <= 0 || num(r2, "time_us") <= num(r, "time_us")) continue;
            kiln_hw_moe_timed m = {(int64_t)num(r, "tokens"), (int64_t)num(r, "hidden"), (int64_t)num(r, "inter"),
                                   (int64_t)num(r, "experts"), (int64_t)num(r, "top_k"), num(r, "time_us"),
                                   num(r2, "time_us") - num(r, "time_us")};
            if (m.tokens < 1 || m.hidden < 1 || m.inter < 1 || m.experts < 1 || m.top_k < 1) continue;
            int j = 0;
            while (j < p->nmoe_t && !(p->moe_t[j].tokens == m.tokens && p->moe_t[j].hidden == m.hidden &&
                                      p->moe_t[j].inter == m.inter && p->moe_t[j].experts == m.experts &&
                                      p->moe_t[j].top_k == m.top_k))
                j++;
            if (j < 64) p->moe_t[j] = m, p->nmoe_t += j == p->nmoe_t, found++;
        }
    }
    sec = cJSON_GetObjectItemCaseSensitive(root, "membw");
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        /* the GPU's own copy kernel: not the host's, nor the pinned host<->device copies ("h2d", "d2h") */
        if (!str_is(r, "device", "cuda") || !str_is(r, "kernel", "copy") || num(r, "gbs_best") <= 0 ||
            num(r, "bytes_per_array") <= 0)
            continue;
        kiln_hw_bw_point b = {2 * num(r, "bytes_per_array"), num(r, "gbs_best")};
        int j = 0;
        while (j < p->nbw && p->bw[j].bytes != b.bytes) j++;
        if (j < 64) p->bw[j] = b, p->nbw += j == p->nbw, found++;
    }
    if (found && !p->timed_source[0]) snprintf(p->timed_source, sizeof p->timed_source, "measured: %s", path);
    return found > 0;
}

kiln_error *kiln_hw_profile_merge_bench(kiln_hw_profile *p, const char *path) {
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse_file(path, &root));
    kiln_error *e = NULL;
    int64_t version = 0;
    if (!cJSON_GetObjectItemCaseSensitive(root, "kiln_profile")) {
        e = kiln_errorf(KILN_EINVAL, "%s: not a kiln bench profile (no \"kiln_profile\" field)", path);
        goto out;
    }
    if ((e = kiln_json_get_int(root, "kiln_profile", &version, 0, 1, path))) goto out;
    if (version != 1) {
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: kiln_profile %lld is not supported (expected 1)", path, (long long)version);
        goto out;
    }
    int got = 0, ng = 0, nrs = 0, nag = 0, na = 0;
    double attn_work[64];
    kiln_hw_profile *q = malloc(sizeof *q);
    if (!q) { e = kiln_errorf(KILN_ENOMEM, "%s", path); goto out; }
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "gemm"), *r;
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        if (!str_is(r, "dtype", "bf16") || ng >= KILN_HW_MAX_POINTS) continue;
        kiln_hw_gemm_point g = {(int64_t)num(r, "m"), (int64_t)num(r, "n"), (int64_t)num(r, "k"), num(r, "tflops")};
        if (g.m > 0 && g.n > 0 && g.k > 0 && g.tflops > 0) q->gemm[ng++] = g;
    }
    /* Only collectives between GPUs stand for the interconnect: `kiln bench comm` writes backend "nccl" for those
     * (--backend nccl), "mpi" for CPU ranks under mpirun and "local" for one process; the last two measure the
     * host's memory or network, which a GPU's gradients do not cross. */
    int comm_skipped = 0;
    char skipped_backends[64] = "";
    int64_t comm_ranks = 0;
    sec = cJSON_GetObjectItemCaseSensitive(root, "comm");
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        if (!str_is(r, "backend", "nccl")) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(r, "backend");
            const char *bn = cJSON_IsString(b) ? b->valuestring : "none";
            comm_skipped++;
            if (!strstr(skipped_backends, bn) && strlen(skipped_backends) + strlen(bn) + 3 < sizeof skipped_backends)
                snprintf(skipped_backends + strlen(skipped_backends), sizeof skipped_backends - strlen(skipped_backends),
                         "%s%s", *skipped_backends ? ", " : "", bn);
            continue;
        }
        kiln_hw_comm_point c = {(int64_t)num(r, "bytes"), num(r, "busbw_gbs"), (int64_t)num(r, "ranks"),
                                (int64_t)num(r, "hosts")};
        if (c.bytes <= 0 || c.busbw_gbs <= 0 || c.ranks < 2) continue;
        if (c.hosts < 0 || c.hosts > c.ranks) c.hosts = 0; /* an older kiln's record (none), or nonsense: unknown */
        const int rs = str_is(r, "collective", "reduce_scatter"), ag = str_is(r, "collective", "all_gather");
        if (rs && nrs < KILN_HW_MAX_POINTS) q->rs[nrs++] = c;
        if (ag && nag < KILN_HW_MAX_POINTS) q->ag[nag++] = c;
        if ((rs || ag) && c.ranks > comm_ranks) comm_ranks = c.ranks;
    }
    char skipped[200] = "";
    if (comm_skipped)
        snprintf(skipped, sizeof skipped, "%d comm record(s) skipped: backend %s, not collectives between GPUs (kiln "
                 "bench comm --backend nccl measures those)", comm_skipped, skipped_backends);

    double copy = 0;
    sec = cJSON_GetObjectItemCaseSensitive(root, "membw");
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec)
        if (!str_is(r, "device", "cpu") && str_is(r, "kernel", "copy") && num(r, "gbs_best") > copy)
            copy = num(r, "gbs_best");
    sec = cJSON_GetObjectItemCaseSensitive(root, "attention");
    if (cJSON_IsArray(sec)) cJSON_ArrayForEach(r, sec) {
        if (str_is(r, "backend", "cpu") || !str_is(r, "dtype", "bf16") || !str_is(r, "pass", "fwd")) continue;
        /* the fwd_bwd record of the same case (shape, KV heads, implementation: attn_partner) gives the backward */
        double fwd_t = num(r, "time_us"), flops = num(r, "flops"), bwd_t = -1;
        const cJSON *r2 = attn_partner(sec, r);
        if (r2) bwd_t = num(r2, "time_us") - fwd_t;
        int64_t D = (int64_t)num(r, "head_dim");
        /* full causal only (a window's saving is in the FLOP count, not the efficiency); per head dim the
         * record with the most work */
        double work = num(r, "batch") * num(r, "seq") * num(r, "seq");
        if (D <= 0 || fwd_t <= 0 || flops <= 0 || bwd_t <= 0 || num(r, "window") > 0) continue;
        kiln_hw_attn_point a = {D, flops / (fwd_t * 1e-6) / 1e12 / p->peak_bf16,
                                2.5 * flops / (bwd_t * 1e-6) / 1e12 / p->peak_bf16};
        int j = 0;
        while (j < na && q->attn[j].head_dim != D) j++;
        if (j == na && na < 64) q->attn[na] = a, attn_work[na++] = work;
        else if (j < na && work > attn_work[j]) q->attn[j] = a, attn_work[j] = work;
    }
    char merged[160] = ""; /* the sections this file replaces, for the profile's summary */
#define MERGED(what) snprintf(merged + strlen(merged), sizeof merged - strlen(merged), "%s%s", *merged ? ", " : "", what)
    if (merge_kernels(p, root, path)) { got++; MERGED("kernel times"); }
    if (ng) { memcpy(p->gemm, q->gemm, sizeof q->gemm[0] * (size_t)ng); p->ngemm = ng; got++; MERGED("GEMMs");
              snprintf(p->gemm_source, sizeof p->gemm_source, "measured: %s", path); }
    if (nrs) { memcpy(p->rs, q->rs, sizeof q->rs[0] * (size_t)nrs); p->nrs = nrs; got++; }
    if (nag) { memcpy(p->ag, q->ag, sizeof q->ag[0] * (size_t)nag); p->nag = nag; got++; }
    if (nrs || nag) { /* --explain's interconnect line and the summary say where the figures now come from */
        MERGED("interconnect");
        /* a long path is cut: the line is a label (the return value used, so gcc does not warn of the cut) */
        if (snprintf(p->interconnect_source, sizeof p->interconnect_source, "measured: kiln bench comm over %lld GPUs "
                     "(nccl; %d reduce-scatter, %d all-gather sizes): %s%s%s", (long long)comm_ranks, nrs, nag, path,
                     comm_skipped ? "; " : "", comm_skipped ? skipped : "") >= (int)sizeof p->interconnect_source)
            p->interconnect_source[sizeof p->interconnect_source - 1] = 0;
    }
    if (copy > 0) { p->mem_gbs = copy; got++; MERGED("memory bandwidth");
                    snprintf(p->memory_source, sizeof p->memory_source, "measured copy: %s", path); }
    if (na) { /* the first measured file replaces the built-in estimates; later ones add or replace head dims */
        if (strncmp(p->attention_source, "measured", 8)) p->nattn = 0;
        for (int i = 0; i < na; i++) {
            int j = 0;
            while (j < p->nattn && p->attn[j].head_dim != q->attn[i].head_dim) j++;
            if (j < 64) p->attn[j] = q->attn[i], p->nattn += j == p->nattn;
        }
        got++;
        MERGED("attention");
        if (strncmp(p->attention_source, "measured", 8))
            snprintf(p->attention_source, sizeof p->attention_source, "measured: %s", path);
    }
#undef MERGED
    free(q);
    if (*merged) {
        char note[sizeof merged + 300];
        snprintf(note, sizeof note, "%s measured by --bench %s", merged, path);
        source_note(p, note);
    }
    if (got && comm_skipped) kiln_log(KILN_LOG_WARN, "%s: %s", path, skipped); /* else the error says it */
    if (!got)
        e = kiln_errorf(KILN_EINVAL, "%s: no GPU measurements to merge (bf16 gemm, nccl comm over 2+ ranks, membw or "
                        "bf16 attention off the CPU)%s%s", path, comm_skipped ? "; " : "", skipped);
out:
    cJSON_Delete(root);
    return e;
}

/* Libraries carry smaller tiles for skinny GEMMs (decode, few rows per expert): the tile along a
 * dimension is the smallest power of two >= the dimension, between 16 and the profile's tile. */
static int64_t tile_for(int64_t dim, int64_t tile) {
    int64_t t = 16;
    while (t < dim && t < tile) t *= 2;
    return t < tile ? t : tile;
}

static double quant_with(const kiln_hw_profile *p, double groups, int64_t m, int64_t n, int64_t tm, int64_t tn,
                         kiln_hw_gemm_why *w) {
    double nm = (double)((m + tm - 1) / tm), nn = (double)((n + tn - 1) / tn);
    double tiles = groups * nm * nn, waves = ceil(tiles / (double)p->sm_count);
    w->tile_m = tm;
    w->tile_n = tn;
    w->tiles = tiles;
    w->waves = waves;
    w->tile_util = (double)m * (double)n / (nm * nn * (double)tm * (double)tn);
    w->wave_util = tiles / (waves * (double)p->sm_count);
    return w->tile_util * w->wave_util;
}

/* The library picks, per shape, the profile's tile or one halved along M and/or N, whichever
 * quantizes best once the smaller tile's lower per-tile efficiency (KILN_HALF_TILE_EFF per halving)
 * is paid. */
#define KILN_HALF_TILE_EFF 0.9
static double quant(const kiln_hw_profile *p, double groups, int64_t m, int64_t n, kiln_hw_gemm_why *w) {
    const int64_t tm = tile_for(m, p->tile_m), tn = tile_for(n, p->tile_n);
    double best = -1;
    for (int hm = 0; hm < 2; hm++)
        for (int hn = 0; hn < 2; hn++) {
            if ((hm && tm < 32) || (hn && tn < 32)) continue;
            kiln_hw_gemm_why c = *w;
            double q = quant_with(p, groups, m, n, tm >> hm, tn >> hn, &c);
            c.tile_eff = (hm ? KILN_HALF_TILE_EFF : 1) * (hn ? KILN_HALF_TILE_EFF : 1);
            q *= c.tile_eff;
            if (q > best + 1e-12) { best = q; *w = c; }
        }
    return best;
}

/* Efficiency before quantization: piecewise linear over log2(MNK) between measured shapes. */
static double base_eff(const kiln_hw_profile *p, int64_t m, int64_t n, int64_t k) {
    if (!p->ngemm) return p->gemm_efficiency;
    double x = log2((double)m * (double)n * (double)k);
    double lo_x = -1e300, hi_x = 1e300, lo_e = 0, hi_e = 0, sum_lo = 0, sum_hi = 0;
    int cnt_lo = 0, cnt_hi = 0;
    /* nearest measured volume on each side (shapes of equal volume are averaged) */
    for (int i = 0; i < p->ngemm; i++) {
        const kiln_hw_gemm_point *g = &p->gemm[i];
        kiln_hw_gemm_why w;
        memset(&w, 0, sizeof w);
        double e = g->tflops / (p->peak_bf16 * quant(p, 1, g->m, g->n, &w));
        double gx = log2((double)g->m * (double)g->n * (double)g->k);
        if (gx <= x) {
            if (gx > lo_x + 1e-9) { lo_x = gx; sum_lo = e; cnt_lo = 1; }
            else if (fabs(gx - lo_x) <= 1e-9) { sum_lo += e; cnt_lo++; }
        }
        if (gx >= x) {
            if (gx < hi_x - 1e-9) { hi_x = gx; sum_hi = e; cnt_hi = 1; }
            else if (fabs(gx - hi_x) <= 1e-9) { sum_hi += e; cnt_hi++; }
        }
    }
    if (cnt_lo) lo_e = sum_lo / cnt_lo;
    if (cnt_hi) hi_e = sum_hi / cnt_hi;
    double e;
    if (!cnt_lo) e = hi_e;
    else if (!cnt_hi) e = lo_e;
    else if (hi_x - lo_x < 1e-9) e = (lo_e + hi_e) / 2;
    else e = lo_e + (hi_e - lo_e) * (x - lo_x) / (hi_x - lo_x);
    return e > 1 ? 1 : e;
}

double kiln_hw_gemm_time_grouped(const kiln_hw_profile *p, double groups, int64_t m, int64_t n, int64_t k,
                                 kiln_hw_gemm_why *why) {
    kiln_hw_gemm_why w;
    memset(&w, 0, sizeof w);
    if (m <= 0 || n <= 0 || k <= 0 || groups <= 0) { if (why) *why = w; return 0; }
    double q = quant(p, groups, m, n, &w);
    if (groups == 1) { /* a measured shape is its measurement (the mean of repeated ones) */
        double sum = 0;
        int cnt = 0;
        for (int i = 0; i < p->ngemm; i++)
            if (p->gemm[i].m == m && p->gemm[i].n == n && p->gemm[i].k == k) sum += p->gemm[i].tflops, cnt++;
        if (cnt) {
            w.tflops = sum / cnt;
            w.base_eff = w.tflops / (p->peak_bf16 * q);
            if (why) *why = w;
            return 2.0 * (double)m * (double)n * (double)k / (w.tflops * 1e12);
        }
    }
    w.base_eff = base_eff(p, (int64_t)ceil(groups * (double)m), n, k);
    double flops = 2.0 * groups * (double)m * (double)n * (double)k;
    double t_c = flops / (p->peak_bf16 * 1e12 * w.base_eff * q);
    double t_m = 2.0 * groups * ((double)m * (double)k + (double)k * (double)n + (double)m * (double)n) / (p->mem_gbs * 1e9);
    double t = t_c > t_m ? t_c : t_m;
    w.memory_bound = t_m > t_c;
    w.tflops = flops / t / 1e12;
    if (why) *why = w;
    return t;
}

double kiln_hw_gemm_time(const kiln_hw_profile *p, int64_t m, int64_t n, int64_t k, kiln_hw_gemm_why *why) {
    return kiln_hw_gemm_time_grouped(p, 1, m, n, k, why);
}

double kiln_hw_attn_eff(const kiln_hw_profile *p, int64_t D, int backward) {
    /* a head dim between tiles runs the padded kernel: padded rate times the useful fraction */
    int64_t padded = (D + p->head_dim_tile - 1) / p->head_dim_tile * p->head_dim_tile;
    double x = (double)padded, lo_x = -1, hi_x = 1e300, lo_e = 0, hi_e = 0;
    for (int i = 0; i < p->nattn; i++) {
        double d = (double)p->attn[i].head_dim, e = backward ? p->attn[i].bwd_eff : p->attn[i].fwd_eff;
        if (d <= x && d > lo_x) { lo_x = d; lo_e = e; }
        if (d >= x && d < hi_x) { hi_x = d; hi_e = e; }
    }
    double e;
    if (lo_x < 0) e = hi_e;
    else if (hi_x > 1e299) e = lo_e;
    else if (hi_x == lo_x) e = lo_e;
    else e = lo_e + (hi_e - lo_e) * (log2(x) - log2(lo_x)) / (log2(hi_x) - log2(lo_x));
    return e * (double)D / (double)padded;
}

/* Whether a measured record crossed nodes: by the hosts its ranks ran on when it says (kiln bench comm's records
 * do), else by its rank count against gpus_per_node (ranks packed onto nodes, as mpirun places them by default). */
static int comm_across(const kiln_hw_profile *p, const kiln_hw_comm_point *c) {
    return c->hosts > 0 ? c->hosts > 1 : c->ranks > p->gpus_per_node;
}

/* Whether a measured record stands for a job of g GPUs: both inside one node, or both across nodes. A measurement
 * inside a node (NVLink) says nothing of the network between nodes, and one across nodes nothing of NVLink. */
static int comm_same_side(const kiln_hw_profile *p, const kiln_hw_comm_point *c, int64_t g) {
    return comm_across(p, c) == (g > p->gpus_per_node);
}

/* A record of the measured set used for g GPUs (one run's records: the same rank and host counts; the nearest rank
 * count on g's side of the node boundary), or -1 when none stands for g. */
static int comm_set_for(const kiln_hw_profile *p, const kiln_hw_comm_point *pts, int n, int64_t g) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (comm_same_side(p, &pts[i], g) && (best < 0 || llabs(pts[i].ranks - g) < llabs(pts[best].ranks - g)))
            best = i;
    return best;
}

/* Bus bandwidth at `bytes` over g ranks: the measured set's records (comm_set_for), linear in log2(bytes) between
 * sizes; else the intra- or inter-node figure. */
static double busbw(const kiln_hw_profile *p, const kiln_hw_comm_point *pts, int n, double bytes, int64_t g) {
    const int best = comm_set_for(p, pts, n, g);
    if (best < 0) return g <= p->gpus_per_node ? p->intra_busbw_gbs : p->inter_busbw_gbs;
    double x = log2(bytes), lo_x = -1e300, hi_x = 1e300, lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        if (pts[i].ranks != pts[best].ranks || pts[i].hosts != pts[best].hosts) continue;
        double px = log2((double)pts[i].bytes);
        if (px <= x && px > lo_x) { lo_x = px; lo = pts[i].busbw_gbs; }
        if (px >= x && px < hi_x) { hi_x = px; hi = pts[i].busbw_gbs; }
    }
    if (lo_x < -1e299) return hi;
    if (hi_x > 1e299) return lo;
    if (hi_x - lo_x < 1e-12) return lo;
    return lo + (hi - lo) * (x - lo_x) / (hi_x - lo_x);
}

int kiln_hw_comm_source(const kiln_hw_profile *p, int64_t g, char *buf, size_t n) {
    const int inside = g <= p->gpus_per_node;
    const double fig = inside ? p->intra_busbw_gbs : p->inter_busbw_gbs;
    const kiln_hw_comm_point *pts[2] = {p->rs, p->ag};
    const int r[2] = {comm_set_for(p, p->rs, p->nrs, g), comm_set_for(p, p->ag, p->nag, g)};
    const int have[2] = {p->nrs > 0, p->nag > 0};
    static const char *const name[2] = {"reduce-scatter", "all-gather"};
    int len = snprintf(buf, n, "%lld GPUs are %s (%lld per node): ", (long long)g,
                       inside ? "inside one node" : "across nodes", (long long)p->gpus_per_node);
    for (int k = 0; k < 2 && len >= 0 && (size_t)len < n; k++) {
        if (r[k] >= 0) {
            const kiln_hw_comm_point *c = &pts[k][r[k]];
            char on[48] = "";
            if (c->hosts > 0) snprintf(on, sizeof on, " on %lld host%s", (long long)c->hosts, c->hosts > 1 ? "s" : "");
            len += snprintf(buf + len, n - (size_t)len, "%s%s measured over %lld GPUs%s (interpolated over log2 bytes)",
                            k ? "; " : "", name[k], (long long)c->ranks, on);
        } else
            len += snprintf(buf + len, n - (size_t)len, "%s%s at the profile's %s figure, %.4g GB/s%s", k ? "; " : "",
                            name[k], inside ? "intra-node" : "inter-node", fig,
                            have[k] ? (inside ? " (its measured records are all across nodes: they do not stand for "
                                                "a job inside a node)"
                                              : " (its measured records are all inside a node: NVLink says nothing of "
                                                "the network between nodes)")
                                    : "");
    }
    return r[0] >= 0 || r[1] >= 0;
}

double kiln_hw_comm_time(const kiln_hw_profile *p, int all_gather, double bytes, int64_t g) {
    if (g <= 1 || bytes <= 0) return 0;
    double bw = all_gather ? busbw(p, p->ag, p->nag, bytes, g) : busbw(p, p->rs, p->nrs, bytes, g);
    return bytes * (double)(g - 1) / (double)g / (bw * 1e9) + p->comm_latency_us * 1e-6;
}
