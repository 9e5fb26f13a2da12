/* Run manifests (the images a generator made) and generation worklists (docs/cis-format.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/json.h"
#include "score_internal.h"

static const char *const item_fields[] = {"image", "prompt_id", "model", "seed", "prompt", NULL};

typedef struct {
    kiln_cis_manifest *m;
    char *dir; /* the manifest's directory: image paths are relative to it */
} load_ctx;

static kiln_error *parse_item(const cJSON *o, int line, const char *cl, void *user) {
    load_ctx *lc = user;
    kiln_cis_manifest *m = lc->m;
    KILN_TRY(cis_check_fields(o, item_fields, cl));
    const char *image, *pid, *model, *prompt;
    int64_t seed;
    KILN_TRY(kiln_json_get_string(o, "image", &image, NULL, 1, cl));
    KILN_TRY(kiln_json_get_string(o, "prompt_id", &pid, NULL, 1, cl));
    KILN_TRY(kiln_json_get_string(o, "model", &model, NULL, 1, cl));
    KILN_TRY(kiln_json_get_int(o, "seed", &seed, 0, 1, cl));
    if (seed > CIS_SEED_MAX || seed < -CIS_SEED_MAX)
        return kiln_errorf(KILN_EFORMAT, "%s: seed %lld is beyond 2^53 - 1: JSON numbers that large are not exact "
                                         "(it may have been another seed)", cl, (long long)seed);
    KILN_TRY(kiln_json_get_string(o, "prompt", &prompt, NULL, 0, cl));
    if (!*image || !*pid || !*model) return kiln_errorf(KILN_EFORMAT, "%s: image, prompt_id and model must not be empty", cl);
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->items[i].image, image))
            return kiln_errorf(KILN_EFORMAT, "%s: image '%s' is listed twice (first on line %d)", cl, image,
                               m->items[i].line);
    kiln_cis_item *ni = realloc(m->items, (size_t)(m->n + 1) * sizeof *ni);
    if (!ni) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    m->items = ni;
    kiln_cis_item *it = &m->items[m->n++];
    it->image = cis_strdup(image);
    it->path = image[0] == '/' ? cis_strdup(image) : kiln_path_join(lc->dir, image);
    it->prompt_id = cis_strdup(pid);
    it->model = cis_strdup(model);
    it->seed = seed;
    it->line = line;
    if (!it->image || !it->path || !it->prompt_id || !it->model) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    return NULL;
}

kiln_error *kiln_cis_manifest_load(const char *path, kiln_cis_manifest *out) {
    char *text;
    size_t len;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_cis_manifest m = {0, NULL};
    load_ctx lc = {&m, cis_strdup(path)};
    kiln_error *e = NULL;
    if (!lc.dir) e = kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    else {
        char *slash = strrchr(lc.dir, '/');
        if (slash) slash[slash == lc.dir ? 1 : 0] = 0;
        else lc.dir[0] = 0;
        e = cis_jsonl_each(text, len, path, parse_item, &lc);
    }
    if (!e && m.n == 0) e = kiln_errorf(KILN_EFORMAT, "%s: the manifest lists no images", path);
    free(text);
    free(lc.dir);
    if (e) {
        kiln_cis_manifest_free(&m);
        return e;
    }
    *out = m;
    return NULL;
}

void kiln_cis_manifest_free(kiln_cis_manifest *m) {
    for (int i = 0; i < m->n; i++) {
        kiln_cis_item *it = &m->items[i];
        free(it->image), free(it->path), free(it->prompt_id), free(it->model);
    }
    free(m->items);
    m->items = NULL;
    m->n = 0;
}

int64_t kiln_cis_seed(const char *prompt_id, int k) {
    char buf[32];
    snprintf(buf, sizeof buf, "#%d", k);
    uint64_t h = kiln_fnv1a64(KILN_FNV1A64_INIT, prompt_id, strlen(prompt_id));
    h = kiln_fnv1a64(h, buf, strlen(buf));
    return (int64_t)((h ^ (h >> 31) ^ (h >> 62)) & 0x7fffffffULL);
}

kiln_error *kiln_cis_worklist_write(const kiln_cis_suite *s, int images_per_prompt, const char *const *models,
                                    int nmodels, const char *path) {
    if (images_per_prompt < 1) return kiln_errorf(KILN_EINVAL, "images per prompt must be >= 1, got %d", images_per_prompt);
    static const char *const dflt[] = {"model"};
    if (!models || nmodels < 1) models = dflt, nmodels = 1;
    for (int j = 0; j < nmodels; j++)
        if (!models[j][0] || strchr(models[j], '/') || !strcmp(models[j], ".") || !strcmp(models[j], ".."))
            return kiln_errorf(KILN_EINVAL, "model name '%s' must be non-empty and usable as a folder name", models[j]);
    cis_buf b = {0};
    for (int j = 0; j < nmodels; j++)
        for (int i = 0; i < s->n; i++)
            for (int k = 0; k < images_per_prompt; k++) {
                const kiln_cis_prompt *p = &s->p[i];
                char img[1024];
                snprintf(img, sizeof img, "images/%s/%s_%d.png", models[j], p->id, k);
                CIS_PUT(&b, "{\"image\": ");
                cis_buf_json_str(&b, img);
                CIS_PUT(&b, ", \"prompt_id\": ");
                cis_buf_json_str(&b, p->id);
                CIS_PUT(&b, ", \"prompt\": ");
                cis_buf_json_str(&b, p->prompt);
                CIS_PUT(&b, ", \"model\": ");
                cis_buf_json_str(&b, models[j]);
                cis_buf_printf(&b, ", \"seed\": %lld}\n", (long long)kiln_cis_seed(p->id, k));
            }
    kiln_error *e = cis_buf_write(&b, path);
    cis_buf_free(&b);
    return e;
}
