/* The prompt suite: JSON Lines, one prompt per line (docs/cis-format.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

static const char *const prompt_fields[] = {"id", "prompt", "culture", "region", "group", "category", "setting",
                                            "scene", "context", "generic_context", "components", "complexity",
                                            NULL};
static const char *const comp_fields[] = {"phrase", "generic", "coco", NULL};

static void prompt_free(kiln_cis_prompt *p) {
    free(p->id), free(p->prompt), free(p->culture), free(p->region), free(p->group), free(p->category);
    free(p->setting), free(p->scene), free(p->context), free(p->generic_context);
    for (int i = 0; i < p->ncomp; i++) free(p->comp[i].phrase), free(p->comp[i].generic), free(p->comp[i].coco);
    free(p->comp);
}

/* A required string that must not be empty. */
static kiln_error *need_str(const cJSON *o, const char *f, const char **v, const char *ctx) {
    KILN_TRY(kiln_json_get_string(o, f, v, NULL, 1, ctx));
    if (!**v) return kiln_errorf(KILN_EFORMAT, "%s: field '%s' is empty", ctx, f);
    return NULL;
}

static kiln_error *parse_prompt(const cJSON *o, int line, const char *cl, void *user) {
    kiln_cis_suite *s = user;
    KILN_TRY(cis_check_fields(o, prompt_fields, cl));
    const char *id, *prompt, *culture, *region, *group, *category, *setting, *scene, *context, *gctx;
    KILN_TRY(need_str(o, "id", &id, cl));
    KILN_TRY(need_str(o, "prompt", &prompt, cl));
    KILN_TRY(need_str(o, "culture", &culture, cl));
    KILN_TRY(kiln_json_get_string(o, "region", &region, NULL, 0, cl));
    KILN_TRY(need_str(o, "group", &group, cl));
    KILN_TRY(need_str(o, "category", &category, cl));
    KILN_TRY(need_str(o, "setting", &setting, cl));
    KILN_TRY(kiln_json_get_string(o, "scene", &scene, id, 0, cl));
    KILN_TRY(kiln_json_get_string(o, "context", &context, NULL, 0, cl));
    KILN_TRY(kiln_json_get_string(o, "generic_context", &gctx, NULL, 0, cl));
    /* the id names files (the worklist's images/<model>/<id>_<k>.png): no path outside that folder */
    if (strchr(id, '/') || strchr(id, '\\') || !strcmp(id, ".") || !strcmp(id, ".."))
        return kiln_errorf(KILN_EFORMAT, "%s: prompt id '%s' must not contain '/' or '\\' or be '.' or '..'", cl, id);
    if (strcmp(group, "western") && strcmp(group, "non_western"))
        return kiln_errorf(KILN_EFORMAT, "%s: prompt '%s': group must be \"western\" or \"non_western\", got \"%s\"",
                           cl, id, group);
    if (strcmp(setting, "historical") && strcmp(setting, "modern"))
        return kiln_errorf(KILN_EFORMAT, "%s: prompt '%s': setting must be \"historical\" or \"modern\", got \"%s\"",
                           cl, id, setting);
    const cJSON *comps;
    int64_t complexity;
    KILN_TRY(kiln_json_get_array(o, "components", &comps, 1, cl));
    KILN_TRY(kiln_json_get_int(o, "complexity", &complexity, 0, 1, cl));
    int nc = cJSON_GetArraySize(comps);
    if (nc == 0) return kiln_errorf(KILN_EFORMAT, "%s: prompt '%s' has zero components", cl, id);
    if (complexity != nc)
        return kiln_errorf(KILN_EFORMAT, "%s: prompt '%s': complexity %lld does not match its %d components", cl, id,
                           (long long)complexity, nc);
    if (kiln_cis_suite_find(s, id) >= 0)
        return kiln_errorf(KILN_EFORMAT, "%s: duplicate prompt id '%s' (first on line %d)", cl, id,
                           s->p[kiln_cis_suite_find(s, id)].line);
    int i = 0;
    for (const cJSON *c = comps->child; c; c = c->next, i++) {
        char cc[600];
        snprintf(cc, sizeof cc, "%s: prompt '%s': components[%d]", cl, id, i);
        if (!cJSON_IsObject(c)) return kiln_errorf(KILN_EFORMAT, "%s: expected an object", cc);
        KILN_TRY(cis_check_fields(c, comp_fields, cc));
        const char *ph, *gen, *coco;
        KILN_TRY(need_str(c, "phrase", &ph, cc));
        KILN_TRY(kiln_json_get_string(c, "generic", &gen, NULL, 0, cc));
        KILN_TRY(kiln_json_get_string(c, "coco", &coco, NULL, 0, cc));
        for (const cJSON *d = comps->child; d != c; d = d->next) {
            const cJSON *dp = cJSON_GetObjectItemCaseSensitive(d, "phrase");
            if (cJSON_IsString(dp) && !strcmp(dp->valuestring, ph))
                return kiln_errorf(KILN_EFORMAT, "%s: phrase \"%s\" repeats an earlier component", cc, ph);
        }
    }
    kiln_cis_prompt *np = realloc(s->p, (size_t)(s->n + 1) * sizeof *np);
    if (!np) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    s->p = np;
    kiln_cis_prompt *p = &s->p[s->n];
    memset(p, 0, sizeof *p);
    p->line = line;
    p->id = cis_strdup(id), p->prompt = cis_strdup(prompt), p->culture = cis_strdup(culture);
    p->region = cis_strdup(region), p->group = cis_strdup(group), p->category = cis_strdup(category);
    p->setting = cis_strdup(setting), p->scene = cis_strdup(scene), p->generic_context = cis_strdup(gctx);
    if (context) p->context = cis_strdup(context);
    else {
        size_t n = strlen(prompt) + 16;
        if ((p->context = malloc(n))) snprintf(p->context, n, "a photo of %s", prompt);
    }
    p->western = !strcmp(group, "western");
    p->comp = calloc((size_t)nc, sizeof *p->comp);
    s->n++; /* from here prompt_free releases whatever was allocated */
    if (!p->comp || !p->id || !p->prompt || !p->culture || !p->group || !p->category || !p->setting || !p->scene ||
        !p->context || (region && !p->region) || (gctx && !p->generic_context))
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    for (const cJSON *c = comps->child; c; c = c->next) {
        kiln_cis_component *k = &p->comp[p->ncomp++];
        const cJSON *v;
        k->phrase = cis_strdup(cJSON_GetObjectItemCaseSensitive(c, "phrase")->valuestring);
        if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "generic"))) k->generic = cis_strdup(v->valuestring);
        if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(c, "coco"))) k->coco = cis_strdup(v->valuestring);
        if (!k->phrase) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    }
    return NULL;
}

kiln_error *kiln_cis_suite_parse(const char *text, size_t len, const char *ctx, kiln_cis_suite *out) {
    kiln_cis_suite s = {0, NULL};
    kiln_error *e = cis_jsonl_each(text, len, ctx, parse_prompt, &s);
    if (!e && s.n == 0) e = kiln_errorf(KILN_EFORMAT, "%s: the suite has no prompts", ctx ? ctx : "suite");
    if (e) {
        kiln_cis_suite_free(&s);
        return e;
    }
    *out = s;
    return NULL;
}

kiln_error *kiln_cis_suite_load(const char *path, kiln_cis_suite *out) {
    char *text;
    size_t len;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_error *e = kiln_cis_suite_parse(text, len, path, out);
    free(text);
    return e;
}

void kiln_cis_suite_free(kiln_cis_suite *s) {
    for (int i = 0; i < s->n; i++) prompt_free(&s->p[i]);
    free(s->p);
    s->p = NULL;
    s->n = 0;
}

int kiln_cis_suite_find(const kiln_cis_suite *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->p[i].id, id)) return i;
    return -1;
}

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }
static const char *or_none(const char *s) { return s ? s : "(none)"; }

kiln_error *cis_suite_compare(const kiln_cis_suite *a, const char *actx, const kiln_cis_suite *b, const char *bctx) {
    /* a resume judges the remaining images against the run's prompts: a renamed phrase would report
     * the scored images' probabilities under a phrase they were never compared with */
    for (int i = 0; i < a->n || i < b->n; i++) {
        if (i >= a->n)
            return kiln_errorf(KILN_EINVAL, "%s:%d: prompt '%s' is not in the run's suite %s (%d prompts)", bctx,
                               b->p[i].line, b->p[i].id, actx, a->n);
        if (i >= b->n)
            return kiln_errorf(KILN_EINVAL, "%s: prompt '%s' of the run's suite (%s:%d) is missing (%d prompts)", bctx,
                               a->p[i].id, actx, a->p[i].line, b->n);
        const kiln_cis_prompt *x = &a->p[i], *y = &b->p[i];
        if (strcmp(x->id, y->id))
            return kiln_errorf(KILN_EINVAL, "%s:%d: prompt %d is '%s', the run's suite (%s:%d) has '%s'", bctx, y->line,
                               i + 1, y->id, actx, x->line, x->id);
        const struct {
            const char *name, *u, *v;
        } f[] = {{"prompt", x->prompt, y->prompt},          {"culture", x->culture, y->culture},
                 {"region", x->region, y->region},          {"group", x->group, y->group},
                 {"category", x->category, y->category},    {"setting", x->setting, y->setting},
                 {"scene", x->scene, y->scene},             {"context", x->context, y->context},
                 {"generic_context", x->generic_context, y->generic_context}};
        for (size_t k = 0; k < sizeof f / sizeof *f; k++)
            if (!same_str(f[k].u, f[k].v))
                return kiln_errorf(KILN_EINVAL, "%s:%d: prompt '%s': %s \"%s\", the run's suite (%s:%d) has \"%s\"", bctx,
                                   y->line, y->id, f[k].name, or_none(f[k].v), actx, x->line, or_none(f[k].u));
        if (x->ncomp != y->ncomp)
            return kiln_errorf(KILN_EINVAL, "%s:%d: prompt '%s' has %d components, the run's suite (%s:%d) has %d", bctx,
                               y->line, y->id, y->ncomp, actx, x->line, x->ncomp);
        for (int c = 0; c < x->ncomp; c++) {
            const kiln_cis_component *p = &x->comp[c], *q = &y->comp[c];
            const struct {
                const char *name, *u, *v;
            } g[] = {{"phrase", p->phrase, q->phrase}, {"generic", p->generic, q->generic}, {"coco", p->coco, q->coco}};
            for (size_t k = 0; k < sizeof g / sizeof *g; k++)
                if (!same_str(g[k].u, g[k].v))
                    return kiln_errorf(KILN_EINVAL,
                                       "%s:%d: prompt '%s': components[%d] %s \"%s\", the run's suite (%s:%d) has \"%s\"",
                                       bctx, y->line, y->id, c, g[k].name, or_none(g[k].v), actx, x->line,
                                       or_none(g[k].u));
        }
    }
    return NULL;
}
