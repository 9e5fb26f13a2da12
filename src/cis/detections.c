/* An object detector's output for a CIS run (docs/cis-format.md): JSON Lines of {"image", "class",
 * "score"[, "box"]}, from any detector run over the manifest's images. kiln keeps, per image and
 * class, the highest score, which is what the per-component check needs (is there a "dining
 * table" anywhere in this image, and how sure is the detector). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

static const char *const det_fields[] = {"image", "class", "score", "box", NULL};

typedef struct {
    cis_detections *t;
    int cap;
} det_ctx;

static kiln_error *parse_det(const cJSON *o, int line, const char *cl, void *user) {
    (void)line;
    det_ctx *dc = user;
    cis_detections *t = dc->t;
    KILN_TRY(cis_check_fields(o, det_fields, cl));
    const char *image, *cls;
    double score;
    KILN_TRY(kiln_json_get_string(o, "image", &image, NULL, 1, cl));
    KILN_TRY(kiln_json_get_string(o, "class", &cls, NULL, 1, cl));
    KILN_TRY(kiln_json_get_double(o, "score", &score, 0, 1, cl));
    if (!*image || !*cls) return kiln_errorf(KILN_EFORMAT, "%s: image and class must not be empty", cl);
    if (!(score >= 0 && score <= 1)) return kiln_errorf(KILN_EFORMAT, "%s: score %g is not in [0, 1]", cl, score);
    const cJSON *box = cJSON_GetObjectItemCaseSensitive(o, "box");
    if (box) { /* not used, but a detector that wrote something else than four numbers wrote the wrong file */
        int ok = cJSON_IsArray(box) && cJSON_GetArraySize(box) == 4;
        for (const cJSON *b = ok ? box->child : NULL; b; b = b->next) ok &= cJSON_IsNumber(b) && isfinite(b->valuedouble);
        if (!ok) return kiln_errorf(KILN_EFORMAT, "%s: box must be four finite numbers", cl);
    }
    if (t->n == dc->cap) {
        int cap = dc->cap ? 2 * dc->cap : 256;
        cis_det *nd = realloc(t->d, (size_t)cap * sizeof *nd);
        if (!nd) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
        t->d = nd, dc->cap = cap;
    }
    cis_det *d = &t->d[t->n];
    d->image = cis_strdup(image), d->cls = cis_strdup(cls), d->score = score;
    if (!d->image || !d->cls) {
        free(d->image), free(d->cls);
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory", cl);
    }
    t->n++, t->lines++;
    return NULL;
}

static int cmp_key(const char *ai, const char *ac, const char *bi, const char *bc) {
    int c = strcmp(ai, bi);
    return c ? c : strcmp(ac, bc);
}

static int cmp_det(const void *a, const void *b) {
    const cis_det *x = a, *y = b;
    return cmp_key(x->image, x->cls, y->image, y->cls);
}

kiln_error *cis_detections_load(const char *path, cis_detections *out) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    KILN_TRY(kiln_read_file(path, &text, &len));
    kiln_error *e = cis_detections_parse(text, len, path, out);
    free(text);
    return e;
}

kiln_error *cis_detections_parse(const char *text, size_t len, const char *ctx, cis_detections *out) {
    memset(out, 0, sizeof *out);
    det_ctx dc = {out, 0};
    kiln_error *e = cis_jsonl_each(text, len, ctx, parse_det, &dc);
    if (e) {
        cis_detections_free(out);
        return e;
    }
    /* one entry per (image, class): the highest score */
    if (out->n > 1) qsort(out->d, (size_t)out->n, sizeof *out->d, cmp_det); /* d is NULL for an empty file */
    int u = 0;
    for (int i = 0; i < out->n; i++) {
        if (u && !cmp_det(&out->d[u - 1], &out->d[i])) {
            out->d[u - 1].score = fmax(out->d[u - 1].score, out->d[i].score);
            free(out->d[i].image), free(out->d[i].cls);
        } else {
            out->d[u++] = out->d[i];
        }
    }
    out->n = u;
    return NULL;
}

double cis_detections_score(const cis_detections *t, const char *image, const char *cls) {
    int lo = 0, hi = t->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = cmp_key(t->d[mid].image, t->d[mid].cls, image, cls);
        if (!c) return t->d[mid].score;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

int cis_detections_has_image(const cis_detections *t, const char *image) {
    int lo = 0, hi = t->n; /* the first entry not before (image, "") */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cmp_key(t->d[mid].image, t->d[mid].cls, image, "") < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < t->n && !strcmp(t->d[lo].image, image);
}

void cis_detections_free(cis_detections *t) {
    for (int i = 0; i < t->n; i++) free(t->d[i].image), free(t->d[i].cls);
    free(t->d);
    memset(t, 0, sizeof *t);
}
