/* ZAYA config.json: HF ZayaConfig's fields and defaults, validated with errors that
 * name the field. HF writes many generic keys (architectures, dtype, ...): those are
 * ignored; a known key of the wrong type is an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/zaya.h"

void kiln_zaya_config_default(kiln_zaya_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 262272;
    c->hidden_size = 2048;
    c->num_layers = 40;
    c->num_heads = 8;
    c->num_kv_heads = 2;
    c->head_dim = 128;
    c->num_experts = 16;
    c->top_k = 1;
    c->moe_intermediate = 2048;
    c->router_hidden = 256;
    c->cca_time0 = 2;
    c->cca_time1 = 2;
    c->sliding_window = 0;
    c->rms_norm_eps = 1e-5;
    c->tie_word_embeddings = 1;
    c->pad_token_id = 0;
    c->bos_token_id = 2;
    c->eos_token_id = 106;
    c->initializer_range = 0.02;
    c->rope_theta[KILN_LAYER_HYBRID] = 5000000.0;
    c->rope_theta[KILN_LAYER_HYBRID_SLIDING] = 10000.0;
    c->partial_rotary[KILN_LAYER_HYBRID] = 0.5;
    c->partial_rotary[KILN_LAYER_HYBRID_SLIDING] = 0.5;
}

static const char *type_names[2] = {"hybrid", "hybrid_sliding"};

/* An id field that may be null (-1), an integer, or (eos) a list whose first entry we keep. */
static kiln_error *get_token_id(const cJSON *root, const char *field, int64_t *out, const char *ctx) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it) return NULL;
    if (cJSON_IsNull(it)) { *out = -1; return NULL; }
    if (cJSON_IsArray(it)) {
        it = cJSON_GetArrayItem(it, 0);
        if (!it) { *out = -1; return NULL; }
        int64_t v = -1; /* 1e39 is no int64 (fuzzing found it converted) */
        if (!kiln_json_int_value(it, &v) || v < 0)
            return kiln_errorf(KILN_EINVAL, "%s: field '%s' must hold non-negative integers", ctx, field);
        *out = v;
        return NULL;
    }
    int64_t v = -1;
    KILN_TRY(kiln_json_get_int(root, field, &v, *out, 0, ctx));
    /* -1 is "none" as null is (some configs write it); other negatives would be written back as null (fuzzing) */
    if (v < -1) return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %lld must be a token id, -1 or null", ctx, field, (long long)v);
    *out = v;
    return NULL;
}

/* rope_parameters: either per layer type {"hybrid": {...}, "hybrid_sliding": {...}} or one dict
 * for all types (older configs), possibly with a stray top-level "rope_type" (hub configs). */
static kiln_error *parse_rope(const cJSON *root, kiln_zaya_config *c, const char *ctx) {
    const cJSON *rp = NULL;
    KILN_TRY(kiln_json_get_object(root, "rope_parameters", &rp, 0, ctx));
    if (!rp) {
        double theta;
        KILN_TRY(kiln_json_get_double(root, "rope_theta", &theta, -1, 0, ctx));
        if (theta > 0) c->rope_theta[0] = c->rope_theta[1] = theta;
        return NULL;
    }
    int nested = 0;
    for (int t = 0; t < 2; t++) {
        const cJSON *sub = cJSON_GetObjectItemCaseSensitive(rp, type_names[t]);
        if (!sub || cJSON_IsNull(sub)) continue;
        nested = 1;
        char sctx[512];
        snprintf(sctx, sizeof sctx, "%s: rope_parameters.%s", ctx, type_names[t]);
        if (!cJSON_IsObject(sub)) return kiln_errorf(KILN_EINVAL, "%s must be an object", sctx);
        const char *rt;
        KILN_TRY(kiln_json_get_string(sub, "rope_type", &rt, "default", 0, sctx));
        if (strcmp(rt, "default"))
            return kiln_errorf(KILN_EUNSUPPORTED, "%s: rope_type '%s' is not supported (only 'default')", sctx, rt);
        KILN_TRY(kiln_json_get_double(sub, "rope_theta", &c->rope_theta[t], c->rope_theta[t], 0, sctx));
        KILN_TRY(kiln_json_get_double(sub, "partial_rotary_factor", &c->partial_rotary[t], 1.0, 0, sctx));
    }
    if (!nested) {
        char sctx[512];
        snprintf(sctx, sizeof sctx, "%s: rope_parameters", ctx);
        double th, pf;
        KILN_TRY(kiln_json_get_double(rp, "rope_theta", &th, c->rope_theta[0], 0, sctx));
        KILN_TRY(kiln_json_get_double(rp, "partial_rotary_factor", &pf, 1.0, 0, sctx));
        c->rope_theta[0] = c->rope_theta[1] = th;
        c->partial_rotary[0] = c->partial_rotary[1] = pf;
    }
    return NULL;
}

/* The keys this parser reads; kiln's own configs use it to reject unknown model fields. */
static const char *const known_keys[] = {
    "model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "router_hidden_size", "cca_time0",
    "cca_time1", "sliding_window", "rms_norm_eps", "initializer_range", "tie_word_embeddings", "attention_bias",
    "lm_head_bias", "pad_token_id", "bos_token_id", "eos_token_id", "hidden_act", "layer_types", "rope_parameters",
    "rope_theta", NULL};

int kiln_zaya_config_known_key(const char *key) {
    for (int i = 0; known_keys[i]; i++)
        if (!strcmp(known_keys[i], key)) return 1;
    return 0;
}

static kiln_error *parse_obj(const cJSON *root, const char *ctx, kiln_zaya_config *c) {
    if (!cJSON_IsObject(root)) return kiln_errorf(KILN_EFORMAT, "%s: top level must be a JSON object", ctx);
    const char *mt;
    KILN_TRY(kiln_json_get_string(root, "model_type", &mt, "zaya", c->model_type_required, ctx));
    if (strcmp(mt, "zaya"))
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: model_type '%s' is not supported (expected 'zaya')", ctx, mt);
    struct { const char *field; int64_t *dst; } ints[] = {
        {"vocab_size", &c->vocab_size}, {"hidden_size", &c->hidden_size},
        {"num_hidden_layers", &c->num_layers}, {"num_attention_heads", &c->num_heads},
        {"num_key_value_heads", &c->num_kv_heads}, {"head_dim", &c->head_dim},
        {"num_experts", &c->num_experts}, {"num_experts_per_tok", &c->top_k},
        {"moe_intermediate_size", &c->moe_intermediate}, {"router_hidden_size", &c->router_hidden},
        {"cca_time0", &c->cca_time0}, {"cca_time1", &c->cca_time1},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        KILN_TRY(kiln_json_get_int(root, ints[i].field, ints[i].dst, *ints[i].dst, 0, ctx));
    KILN_TRY(kiln_json_get_int(root, "sliding_window", &c->sliding_window, 0, 0, ctx));
    KILN_TRY(kiln_json_get_double(root, "rms_norm_eps", &c->rms_norm_eps, c->rms_norm_eps, 0, ctx));
    KILN_TRY(kiln_json_get_double(root, "initializer_range", &c->initializer_range, c->initializer_range, 0, ctx));
    KILN_TRY(kiln_json_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, c->tie_word_embeddings, 0, ctx));
    KILN_TRY(kiln_json_get_bool(root, "attention_bias", &c->attention_bias, c->attention_bias, 0, ctx));
    KILN_TRY(kiln_json_get_bool(root, "lm_head_bias", &c->lm_head_bias, c->lm_head_bias, 0, ctx));
    KILN_TRY(get_token_id(root, "pad_token_id", &c->pad_token_id, ctx));
    KILN_TRY(get_token_id(root, "bos_token_id", &c->bos_token_id, ctx));
    KILN_TRY(get_token_id(root, "eos_token_id", &c->eos_token_id, ctx));
    const char *act;
    KILN_TRY(kiln_json_get_string(root, "hidden_act", &act, "silu", 0, ctx));
    if (strcmp(act, "silu"))
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: hidden_act '%s' is not supported (expected 'silu')", ctx, act);
    if (c->num_layers < 0 || c->num_layers > KILN_ZAYA_MAX_LAYERS)
        return kiln_errorf(KILN_EINVAL, "%s: field 'num_hidden_layers' = %lld is outside 0..%d", ctx,
                           (long long)c->num_layers, KILN_ZAYA_MAX_LAYERS);
    const cJSON *lt = NULL;
    KILN_TRY(kiln_json_get_array(root, "layer_types", &lt, 0, ctx));
    for (int64_t l = 0; l < c->num_layers; l++) c->layer_types[l] = KILN_LAYER_HYBRID;
    if (lt) {
        if (cJSON_GetArraySize(lt) != c->num_layers)
            return kiln_errorf(KILN_EINVAL, "%s: field 'layer_types' has %d entries but num_hidden_layers is %lld", ctx,
                               cJSON_GetArraySize(lt), (long long)c->num_layers);
        int64_t l = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, lt) {
            if (!cJSON_IsString(it))
                return kiln_errorf(KILN_EINVAL, "%s: layer_types[%lld] must be a string", ctx, (long long)l);
            if (!strcmp(it->valuestring, "hybrid")) c->layer_types[l] = KILN_LAYER_HYBRID;
            else if (!strcmp(it->valuestring, "hybrid_sliding")) c->layer_types[l] = KILN_LAYER_HYBRID_SLIDING;
            else
                return kiln_errorf(KILN_EUNSUPPORTED, "%s: layer_types[%lld] = '%s' is not supported "
                                   "(expected 'hybrid' or 'hybrid_sliding')", ctx, (long long)l, it->valuestring);
            l++;
        }
    }
    return parse_rope(root, c, ctx);
}

kiln_error *kiln_zaya_config_from_json(const cJSON *obj, const char *ctx, kiln_zaya_config *c) {
    KILN_TRY(parse_obj(obj, ctx, c));
    return kiln_zaya_config_validate(c, ctx);
}

kiln_error *kiln_zaya_config_parse(const char *json_text, const char *ctx, kiln_zaya_config *c) {
    cJSON *root = NULL;
    kiln_zaya_config_default(c);
    c->model_type_required = 1; /* a HF config.json must say what it is */
    KILN_TRY(kiln_json_parse(json_text, strlen(json_text), ctx, &root));
    kiln_error *e = parse_obj(root, ctx, c);
    c->model_type_required = 0;
    cJSON_Delete(root);
    if (!e) e = kiln_zaya_config_validate(c, ctx);
    return e;
}

kiln_error *kiln_zaya_config_load(const char *path, kiln_zaya_config *c) {
    char *text = NULL;
    size_t len = 0;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_error *e = kiln_zaya_config_parse(text, path, c);
    free(text);
    return e;
}

kiln_error *kiln_zaya_config_validate(const kiln_zaya_config *c, const char *ctx) {
    struct { const char *field; int64_t v, lo, hi; } r[] = {
        {"vocab_size", c->vocab_size, 1, (int64_t)1 << 31}, {"hidden_size", c->hidden_size, 1, 1 << 20},
        {"num_attention_heads", c->num_heads, 1, 4096}, {"num_key_value_heads", c->num_kv_heads, 1, 4096},
        {"head_dim", c->head_dim, 2, 1 << 16}, {"num_experts", c->num_experts, 1, 1 << 16},
        {"num_experts_per_tok", c->top_k, 1, c->num_experts + 1}, {"moe_intermediate_size", c->moe_intermediate, 1, 1 << 20},
        {"router_hidden_size", c->router_hidden, 1, 1 << 20}, {"cca_time0", c->cca_time0, 1, 64},
        {"cca_time1", c->cca_time1, 1, 64}, {"sliding_window", c->sliding_window, 0, (int64_t)1 << 40},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %lld is outside %lld..%lld", ctx, r[i].field,
                               (long long)r[i].v, (long long)r[i].lo, (long long)r[i].hi);
    if (c->num_heads % c->num_kv_heads)
        return kiln_errorf(KILN_EINVAL, "%s: num_attention_heads (%lld) must be a multiple of num_key_value_heads (%lld)",
                           ctx, (long long)c->num_heads, (long long)c->num_kv_heads);
    if ((c->num_kv_heads * c->head_dim) % 2)
        return kiln_errorf(KILN_EINVAL, "%s: num_key_value_heads * head_dim must be even (CCA splits values in halves)", ctx);
    if (!(c->rms_norm_eps > 0)) return kiln_errorf(KILN_EINVAL, "%s: field 'rms_norm_eps' must be positive", ctx);
    for (int64_t l = 0; l < c->num_layers; l++) {
        int t = c->layer_types[l];
        if (t == KILN_LAYER_HYBRID_SLIDING && c->sliding_window <= 0)
            return kiln_errorf(KILN_EINVAL, "%s: layer %lld is 'hybrid_sliding' but sliding_window is not set", ctx,
                               (long long)l);
        double pf = c->partial_rotary[t];
        /* the range first: head_dim * pf is converted to an integer only when it fits (fuzzing found 3e46) */
        if (!(pf > 0 && pf <= 1))
            return kiln_errorf(KILN_EINVAL, "%s: rope_parameters.%s.partial_rotary_factor = %g must be in (0, 1]", ctx,
                               type_names[t], pf);
        int64_t dim = (int64_t)(c->head_dim * pf), rot = 2 * ((dim + 1) / 2);
        if (rot > c->head_dim || dim < 1)
            return kiln_errorf(KILN_EINVAL, "%s: rope_parameters.%s.partial_rotary_factor = %g gives %lld rotary "
                               "channels of head_dim %lld", ctx, type_names[t], pf, (long long)rot, (long long)c->head_dim);
        if (!(c->rope_theta[t] > 0))
            return kiln_errorf(KILN_EINVAL, "%s: rope_parameters.%s.rope_theta must be positive", ctx, type_names[t]);
    }
    if (c->pad_token_id >= c->vocab_size)
        return kiln_errorf(KILN_EINVAL, "%s: pad_token_id %lld is not below vocab_size %lld", ctx,
                           (long long)c->pad_token_id, (long long)c->vocab_size);
    return NULL;
}

struct cJSON *kiln_zaya_config_to_cjson(const kiln_zaya_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("ZayaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", "zaya");
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->num_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->num_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->num_kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(o, "num_experts", (double)c->num_experts);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->top_k);
    cJSON_AddNumberToObject(o, "moe_intermediate_size", (double)c->moe_intermediate);
    cJSON_AddNumberToObject(o, "router_hidden_size", (double)c->router_hidden);
    cJSON_AddNumberToObject(o, "cca_time0", (double)c->cca_time0);
    cJSON_AddNumberToObject(o, "cca_time1", (double)c->cca_time1);
    if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
    else cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(o, "initializer_range", c->initializer_range);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
    cJSON_AddBoolToObject(o, "lm_head_bias", c->lm_head_bias);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    const char *ids[3] = {"pad_token_id", "bos_token_id", "eos_token_id"};
    int64_t idv[3] = {c->pad_token_id, c->bos_token_id, c->eos_token_id};
    for (int i = 0; i < 3; i++) {
        if (idv[i] >= 0) cJSON_AddNumberToObject(o, ids[i], (double)idv[i]);
        else cJSON_AddNullToObject(o, ids[i]);
    }
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    int used[2] = {0, 0};
    for (int64_t l = 0; l < c->num_layers; l++) {
        cJSON_AddItemToArray(lt, cJSON_CreateString(type_names[c->layer_types[l]]));
        used[c->layer_types[l]] = 1;
    }
    cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
    for (int t = 0; t < 2; t++) {
        if (!used[t] && t) continue;
        cJSON *s = cJSON_AddObjectToObject(rp, type_names[t]);
        cJSON_AddStringToObject(s, "rope_type", "default");
        cJSON_AddNumberToObject(s, "rope_theta", c->rope_theta[t]);
        cJSON_AddNumberToObject(s, "partial_rotary_factor", c->partial_rotary[t]);
    }
    return o;
}

kiln_error *kiln_zaya_config_save(const kiln_zaya_config *c, const char *path) {
    cJSON *o = kiln_zaya_config_to_cjson(c);
    char *text = o ? kiln_json_print(o, 1) : NULL;
    cJSON_Delete(o);
    if (!text) return kiln_errorf(KILN_ENOMEM, "%s", path);
    kiln_error *e = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return e;
}
