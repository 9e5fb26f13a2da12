/* config.json and preprocessor_config.json of a HF CLIPModel directory, with HF's defaults for
 * missing fields (CLIPTextConfig / CLIPVisionConfig / CLIPImageProcessor) and errors naming the
 * file and field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/json.h"

static kiln_error *act_of(const cJSON *o, const char *ctx, int *act) {
    const char *a;
    KILN_TRY(kiln_json_get_string(o, "hidden_act", &a, "quick_gelu", 0, ctx));
    if (!strcmp(a, "quick_gelu")) *act = CLIP_ACT_QUICK_GELU;
    else if (!strcmp(a, "gelu")) *act = CLIP_ACT_GELU;
    else if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_fast"))
        *act = CLIP_ACT_GELU_TANH;
    else
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (quick_gelu, gelu, gelu_new, "
                                              "gelu_pytorch_tanh)", ctx, a);
    return NULL;
}

static kiln_error *geti(const cJSON *o, const char *f, int *out, int64_t dflt, const char *ctx) {
    int64_t v;
    KILN_TRY(kiln_json_get_int(o, f, &v, dflt, 0, ctx));
    if (v <= 0 || v > (1 << 24)) return kiln_errorf(KILN_EINVAL, "%s: field '%s' = %lld is out of range", ctx, f, (long long)v);
    *out = (int)v;
    return NULL;
}

static kiln_error *tower(const cJSON *o, const char *ctx, int vision, clip_tower_cfg *c) {
    memset(c, 0, sizeof *c);
    KILN_TRY(geti(o, "hidden_size", &c->hidden, vision ? 768 : 512, ctx));
    KILN_TRY(geti(o, "intermediate_size", &c->inter, vision ? 3072 : 2048, ctx));
    KILN_TRY(geti(o, "num_hidden_layers", &c->layers, 12, ctx));
    KILN_TRY(geti(o, "num_attention_heads", &c->heads, vision ? 12 : 8, ctx));
    KILN_TRY(kiln_json_get_double(o, "layer_norm_eps", &c->eps, 1e-5, 0, ctx));
    if (!(c->eps >= 0)) return kiln_errorf(KILN_EINVAL, "%s: field 'layer_norm_eps' = %g must not be negative", ctx, c->eps);
    KILN_TRY(act_of(o, ctx, &c->act));
    if (c->hidden % c->heads)
        return kiln_errorf(KILN_EINVAL, "%s: hidden_size %d is not a multiple of num_attention_heads %d", ctx,
                           c->hidden, c->heads);
    if (vision) {
        KILN_TRY(geti(o, "image_size", &c->image_size, 224, ctx));
        KILN_TRY(geti(o, "patch_size", &c->patch_size, 32, ctx));
        KILN_TRY(geti(o, "num_channels", &c->channels, 3, ctx));
        if (c->channels != 3)
            return kiln_errorf(KILN_EUNSUPPORTED, "%s: num_channels %d is not supported (RGB images: 3)", ctx, c->channels);
        if (c->image_size % c->patch_size)
            return kiln_errorf(KILN_EINVAL, "%s: image_size %d is not a multiple of patch_size %d", ctx, c->image_size,
                               c->patch_size);
    } else {
        int64_t v;
        KILN_TRY(geti(o, "max_position_embeddings", &c->max_pos, 77, ctx));
        KILN_TRY(kiln_json_get_int(o, "vocab_size", &v, 49408, 0, ctx));
        if (v < 1 || v > (1 << 30)) return kiln_errorf(KILN_EINVAL, "%s: field 'vocab_size' = %lld is out of range", ctx, (long long)v);
        c->vocab = v;
        KILN_TRY(kiln_json_get_int(o, "eos_token_id", &c->eos_token_id, 49407, 0, ctx));
        if (c->max_pos < 3) return kiln_errorf(KILN_EINVAL, "%s: max_position_embeddings %d is too small", ctx, c->max_pos);
    }
    return NULL;
}

kiln_error *kiln_clip_read_config(const char *path, clip_tower_cfg *text, clip_tower_cfg *vision, int *proj_dim) {
    cJSON *root;
    KILN_TRY(kiln_json_parse_file(path, &root));
    kiln_error *e = NULL;
    const char *mt = NULL;
    const cJSON *tc = NULL, *vc = NULL;
    char ctx[1100];
    if ((e = kiln_json_get_string(root, "model_type", &mt, NULL, 1, path))) goto out;
    if (strcmp(mt, "clip")) {
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: model_type is \"%s\", not \"clip\" (kiln reads HF CLIPModel checkpoints)",
                        path, mt);
        goto out;
    }
    if ((e = kiln_json_get_object(root, "text_config", &tc, 1, path))) goto out;
    if ((e = kiln_json_get_object(root, "vision_config", &vc, 1, path))) goto out;
    snprintf(ctx, sizeof ctx, "%s: text_config", path);
    if ((e = tower(tc, ctx, 0, text))) goto out;
    snprintf(ctx, sizeof ctx, "%s: vision_config", path);
    if ((e = tower(vc, ctx, 1, vision))) goto out;
    e = geti(root, "projection_dim", proj_dim, 512, path);
out:
    cJSON_Delete(root);
    return e;
}

/* size / crop_size: an int (old configs) or {"shortest_edge"} / {"height", "width"} */
static kiln_error *size_of(const cJSON *root, const char *field, const char *path, int shortest_ok, int dflt, int *shortest,
                           int *h, int *w) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, field);
    char ctx[1100];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    *h = *w = 0;
    if (shortest) *shortest = 0;
    if (!s || cJSON_IsNull(s)) {
        if (shortest) *shortest = dflt;
        else *h = *w = dflt;
        return NULL;
    }
    if (cJSON_IsNumber(s)) {
        int64_t v64 = 0; /* 1e10 is no int */
        if (!kiln_json_int_value(s, &v64) || v64 < 1 || v64 > (1 << 24))
            return kiln_errorf(KILN_EINVAL, "%s must be a positive integer up to %d", ctx, 1 << 24);
        const int v = (int)v64;
        if (shortest) *shortest = v; /* CLIP: get_size_dict(size, default_to_square=False) */
        else *h = *w = v;
        return NULL;
    }
    if (!cJSON_IsObject(s)) return kiln_errorf(KILN_EFORMAT, "%s must be an integer or an object", ctx);
    if (shortest_ok && cJSON_GetObjectItemCaseSensitive(s, "shortest_edge")) {
        if (cJSON_GetObjectItemCaseSensitive(s, "longest_edge"))
            return kiln_errorf(KILN_EUNSUPPORTED, "%s: longest_edge is not supported", ctx);
        return geti(s, "shortest_edge", shortest, 0, ctx);
    }
    if (!cJSON_GetObjectItemCaseSensitive(s, "height") || !cJSON_GetObjectItemCaseSensitive(s, "width"))
        return kiln_errorf(KILN_EFORMAT, "%s must have %s\"height\" and \"width\"", ctx,
                           shortest_ok ? "\"shortest_edge\" or " : "");
    KILN_TRY(geti(s, "height", h, 0, ctx));
    return geti(s, "width", w, 0, ctx);
}

static kiln_error *triple(const cJSON *root, const char *field, const char *path, const double dflt[3], double out[3]) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!a || cJSON_IsNull(a)) {
        memcpy(out, dflt, 3 * sizeof(double));
        return NULL;
    }
    if (cJSON_IsNumber(a)) {
        out[0] = out[1] = out[2] = a->valuedouble;
        return NULL;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
        return kiln_errorf(KILN_EFORMAT, "%s: %s must be a list of 3 numbers", path, field);
    for (int i = 0; i < 3; i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(x)) return kiln_errorf(KILN_EFORMAT, "%s: %s[%d] must be a number", path, field, i);
        out[i] = x->valuedouble;
    }
    return NULL;
}

kiln_error *kiln_clip_read_preproc(const char *path, clip_preproc_cfg *p) {
    static const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, std[3] = {0.26862954, 0.26130258, 0.27577711};
    cJSON *root;
    KILN_TRY(kiln_json_parse_file(path, &root));
    kiln_error *e = NULL;
    int64_t resample;
    memset(p, 0, sizeof *p);
    if ((e = kiln_json_get_bool(root, "do_resize", &p->do_resize, 1, 0, path)) ||
        (e = size_of(root, "size", path, 1, 224, &p->resize_shortest, &p->resize_h, &p->resize_w)) ||
        (e = kiln_json_get_int(root, "resample", &resample, 3, 0, path)) ||
        (e = kiln_json_get_bool(root, "do_center_crop", &p->do_center_crop, 1, 0, path)) ||
        (e = size_of(root, "crop_size", path, 0, 224, NULL, &p->crop_h, &p->crop_w)) ||
        (e = kiln_json_get_bool(root, "do_rescale", &p->do_rescale, 1, 0, path)) ||
        (e = kiln_json_get_double(root, "rescale_factor", &p->rescale_factor, 1.0 / 255, 0, path)) ||
        (e = kiln_json_get_bool(root, "do_normalize", &p->do_normalize, 1, 0, path)) ||
        (e = triple(root, "image_mean", path, mean, p->mean)) || (e = triple(root, "image_std", path, std, p->std)))
        goto out;
    if (resample != 3)
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: resample %lld is not supported (only 3, PIL bicubic, as CLIP uses)", path,
                        (long long)resample);
    for (int i = 0; i < 3 && !e; i++)
        if (!(p->std[i] != 0)) e = kiln_errorf(KILN_EINVAL, "%s: image_std[%d] is zero", path, i);
out:
    cJSON_Delete(root);
    return e;
}
