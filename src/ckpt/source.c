/* Opening a checkpoint for conversion: verify, parse, cross-check (see source.h). */
#include "source.h"

#include <stdlib.h>
#include <string.h>

#include "kiln/ckpt.h"
#include "kiln/json.h"
#include "models/zaya_internal.h"

static kiln_error *pick(const char *path, FILE *log, char *out, size_t n) {
    char **dirs = NULL;
    int nd = 0;
    KILN_TRY(kiln_ckpt_list(path, &dirs, &nd));
    kiln_error *e = nd ? NULL : kiln_errorf(KILN_ENOTFOUND, "%s: no checkpoints", path);
    for (int i = 0; !e && i < nd; i++) {
        kiln_error *v = kiln_ckpt_verify(dirs[i]);
        if (!v) {
            snprintf(out, n, "%s", dirs[i]);
            break;
        }
        if (nd == 1 || i == nd - 1) e = kiln_error_wrap(v, "no valid checkpoint in %s", path);
        else {
            if (log) fprintf(log, "skipping %s: %s\n", dirs[i], kiln_error_msg(v));
            kiln_error_free(v);
        }
    }
    kiln_ckpt_list_free(dirs, nd);
    return e;
}

static kiln_error *parse(ckpt_src *s) {
    char ctx[1400];
    snprintf(ctx, sizeof ctx, "%s/manifest.json", s->dir);
    KILN_TRY(kiln_json_parse_file(ctx, &s->man));
    int64_t fmt = 0, world = 0;
    KILN_TRY(kiln_json_get_int(s->man, "format", &fmt, 0, 1, ctx));
    if (fmt != 1) return kiln_errorf(KILN_EUNSUPPORTED, "%s: format %lld is not 1", ctx, (long long)fmt);
    KILN_TRY(kiln_json_get_int(s->man, "step", &s->step, 0, 1, ctx));
    KILN_TRY(kiln_ckpt_manifest_world(s->man, ctx, &world));
    s->world = (int)world;
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(s->man, "config");
    if (!cJSON_IsObject(cfg)) return kiln_errorf(KILN_EFORMAT, "%s: no 'config' object", ctx);
    char *text = kiln_json_print(cfg, 0);
    if (!text) return kiln_errorf(KILN_ENOMEM, "%s", ctx);
    char cctx[1500];
    snprintf(cctx, sizeof cctx, "%s: config", ctx);
    kiln_train_config_default(&s->cfg);
    kiln_error *e = kiln_train_config_parse(text, cctx, &s->cfg);
    free(text);
    KILN_TRY(e);
    /* the parameter table this config implies, checked name for name, shape for shape */
    s->table.cfg = s->cfg.model;
    KILN_TRY(kiln_zaya_build_params(&s->table));
    const int np = s->table.nparams;
    s->op = calloc((size_t)np + 1, sizeof *s->op);
    s->owner = calloc((size_t)np + 1, sizeof *s->owner);
    s->st = calloc((size_t)world, sizeof *s->st);
    s->loaders = calloc((size_t)world, sizeof *s->loaders);
    if (!s->op || !s->owner || !s->st || !s->loaders) return kiln_errorf(KILN_ENOMEM, "%s", ctx);
    kiln_optim_classify(&s->table, &s->cfg.optim, s->op);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(s->man, "tensors");
    if (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) != np)
        return kiln_errorf(KILN_EFORMAT, "%s: lists %d tensors, its config's model has %d", ctx,
                           cJSON_IsArray(ts) ? cJSON_GetArraySize(ts) : -1, np);
    for (int t = 0; t < np; t++) {
        const cJSON *x = cJSON_GetArrayItem(ts, t);
        const kiln_param_info *p = &s->table.params[t];
        const char *name = NULL;
        int64_t owner = -1, sn = -1;
        KILN_TRY(kiln_json_get_string(x, "name", &name, NULL, 1, ctx));
        KILN_TRY(kiln_json_get_int(x, "owner", &owner, -1, 1, ctx));
        KILN_TRY(kiln_json_get_int(x, "state_numel", &sn, -1, 1, ctx));
        if (strcmp(name, p->name))
            return kiln_errorf(KILN_EFORMAT, "%s: tensor %d is '%s', its config's model has '%s' there", ctx, t, name, p->name);
        if (owner < 0 || owner >= world || (t && owner < s->owner[t - 1]))
            return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has owner %lld (world size %lld; owners must not decrease)",
                               ctx, name, (long long)owner, (long long)world);
        if (sn != kiln_optim_state_numel(&s->op[t]))
            return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has %lld optimizer-state floats, its config implies %lld", ctx,
                               name, (long long)sn, (long long)kiln_optim_state_numel(&s->op[t]));
        s->owner[t] = (int)owner;
    }
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(s->man, "loaders");
    if (!cJSON_IsArray(ld) || cJSON_GetArraySize(ld) != world)
        return kiln_errorf(KILN_EFORMAT, "%s: 'loaders' must list one position per rank (%d)", ctx, s->world);
    for (int r = 0; r < s->world; r++) {
        const cJSON *x = cJSON_GetArrayItem(ld, r);
        const char *seed = NULL, *fp = NULL;
        int64_t ep = 0, cur = 0;
        KILN_TRY(kiln_json_get_string(x, "seed", &seed, NULL, 1, ctx));
        KILN_TRY(kiln_json_get_string(x, "fingerprint", &fp, "0", 0, ctx));
        KILN_TRY(kiln_json_get_int(x, "epoch", &ep, 0, 1, ctx));
        KILN_TRY(kiln_json_get_int(x, "cursor", &cur, 0, 1, ctx));
        s->loaders[r] = (kiln_loader_state){strtoull(seed, NULL, 16), (uint64_t)ep, (uint64_t)cur, strtoull(fp, NULL, 16)};
    }
    return NULL;
}

static kiln_error *expect(const kiln_st *st, const char *file, const char *name, kiln_dtype dt, int64_t numel) {
    const kiln_st_tensor *t = kiln_st_find(st, name);
    if (!t) return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is missing (the manifest says it is here)", file, name);
    if (t->dtype != dt || t->numel != numel)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is %s with %lld elements, the manifest implies %s with %lld", file,
                           name, kiln_dtype_name(t->dtype), (long long)t->numel, kiln_dtype_name(dt), (long long)numel);
    return NULL;
}

/* Every shard holds exactly what the manifest says: its tensors' parameters and state, rank 0 the
 * balance state, nothing else. */
static kiln_error *open_shards(ckpt_src *s) {
    const int64_t bias = s->cfg.model.num_layers * (s->cfg.model.num_experts + 1);
    for (int r = 0; r < s->world; r++) {
        char path[1500], name[128];
        kiln_ckpt_shard_path(path, sizeof path, s->dir, r);
        KILN_TRY(kiln_st_open(path, &s->st[r]));
        size_t want = r == 0 ? 3 : 0;
        for (int t = 0; t < s->table.nparams; t++) {
            if (s->owner[t] != r) continue;
            snprintf(name, sizeof name, "param.%s", s->table.params[t].name);
            KILN_TRY(expect(s->st[r], path, name, KILN_DT_F32, s->table.params[t].numel));
            snprintf(name, sizeof name, "opt.%s", s->table.params[t].name);
            KILN_TRY(expect(s->st[r], path, name, KILN_DT_F32, kiln_optim_state_numel(&s->op[t])));
            want += 2;
        }
        if (r == 0) {
            KILN_TRY(expect(s->st[r], path, "balancing_biases", KILN_DT_F32, bias));
            KILN_TRY(expect(s->st[r], path, "balance.integral", KILN_DT_F64, bias));
            KILN_TRY(expect(s->st[r], path, "balance.prev_err", KILN_DT_F64, bias));
        }
        if (kiln_st_count(s->st[r]) != want)
            return kiln_errorf(KILN_EFORMAT, "%s: holds %zu tensors, the manifest implies %zu", path,
                               kiln_st_count(s->st[r]), want);
    }
    return NULL;
}

kiln_error *ckpt_src_open(const char *path, FILE *log, ckpt_src *s) {
    memset(s, 0, sizeof *s);
    kiln_error *e = pick(path, log, s->dir, sizeof s->dir);
    if (!e) e = parse(s);
    if (!e) e = open_shards(s);
    if (e) ckpt_src_close(s);
    return e;
}

void ckpt_src_close(ckpt_src *s) {
    if (s->st)
        for (int r = 0; r < s->world; r++) kiln_st_close(s->st[r]);
    free(s->st);
    free(s->op);
    free(s->owner);
    free(s->loaders);
    free(s->table.params);
    cJSON_Delete(s->man);
    memset(s, 0, sizeof *s);
}

const kiln_st_tensor *ckpt_src_tensor(const ckpt_src *s, const char *kind, int t) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", kind, s->table.params[t].name);
    return kiln_st_find(s->st[s->owner[t]], name);
}
