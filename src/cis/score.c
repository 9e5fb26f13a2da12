/* kiln cis score: judge every component of every manifest image with CLIP and record the
 * results part by part, so that a crash or Ctrl-C keeps what was finished and --resume
 * continues. Layout of the run directory: docs/cis.md. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/image.h"
#include "kiln/json.h"
#include "kiln/progress.h"
#include "score_internal.h"
#include "textset.h"

/* grids NULL, boot and perm 0, seed UINT64_MAX and threshold NaN mean "not given": a new run takes
 * the defaults (1,2,3, 2000, 10000, 0, 0.5), a resumed one its own run.json's values (a resume must
 * not judge the rest of the images with other settings than the scored ones). */
void kiln_cis_score_opts_default(kiln_cis_score_opts *o) {
    memset(o, 0, sizeof *o);
    o->grids = NULL;
    o->chunk = 16;
    o->boot = 0;
    o->perm = 0;
    o->seed = UINT64_MAX;
    o->threshold = NAN;
    o->cluster = NULL;    /* a new run: prompt; a resumed one: its own */
    o->detections = NULL; /* a new run: none; a resumed one: its own */
    o->det_threshold = NAN;
}

kiln_error *cis_mkdir(const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST)
        return kiln_errorf(KILN_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return kiln_errorf(KILN_EINVAL, "%s: not a directory", dir);
    return NULL;
}

/* Highest part number in RUN/results, or -1. */
static int last_part(const char *results) {
    DIR *d = opendir(results);
    if (!d) return -1;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int k;
        char tail[8];
        if (sscanf(e->d_name, "part-%d.%7s", &k, tail) == 2 && !strcmp(tail, "jsonl") && k > best) best = k;
    }
    closedir(d);
    return best;
}

kiln_error *cis_read_results(const char *run_dir, cis_results *r) {
    memset(r, 0, sizeof *r);
    char *results = kiln_path_join(run_dir, "results");
    if (!results) return kiln_errorf(KILN_ENOMEM, "out of memory");
    int last = last_part(results);
    kiln_error *e = NULL;
    for (int k = 0; k <= last && !e; k++) {
        char name[64];
        snprintf(name, sizeof name, "part-%06d.jsonl", k);
        char *path = kiln_path_join(results, name), *text = NULL;
        size_t len;
        if (!path) e = kiln_errorf(KILN_ENOMEM, "out of memory");
        else if ((e = kiln_read_file(path, &text, &len)) && kiln_error_code(e) == KILN_ENOTFOUND) {
            kiln_error_free(e); /* numbering gaps are harmless */
            e = NULL;
        } else if (!e) {
            cJSON *arr = NULL;
            /* each line one record; later records of an image replace earlier ones (a retried error) */
            size_t pos = 0;
            int line = 0;
            while (pos < len && !e) {
                size_t end = pos;
                while (end < len && text[end] != '\n') end++;
                line++;
                if (end > pos) {
                    char ctx[600];
                    snprintf(ctx, sizeof ctx, "%s:%d", path, line);
                    cJSON *o = NULL;
                    const char *img;
                    if (!(e = kiln_json_parse(text + pos, end - pos, ctx, &o)) &&
                        !(e = kiln_json_get_string(o, "image", &img, NULL, 1, ctx))) {
                        int at = -1;
                        for (int i = 0; i < r->n; i++)
                            if (!strcmp(cJSON_GetObjectItemCaseSensitive(r->rec[i], "image")->valuestring, img)) at = i;
                        if (at >= 0) {
                            cJSON_Delete(r->rec[at]);
                            r->rec[at] = o;
                            o = NULL;
                        } else {
                            cJSON **nr = realloc(r->rec, (size_t)(r->n + 1) * sizeof *nr);
                            if (!nr) e = kiln_errorf(KILN_ENOMEM, "out of memory");
                            else r->rec = nr, r->rec[r->n++] = o, o = NULL;
                        }
                    }
                    cJSON_Delete(o);
                }
                pos = end + 1;
            }
            (void)arr;
        }
        free(text);
        free(path);
    }
    r->next_part = last + 1;
    free(results);
    if (e) cis_results_free(r);
    return e;
}

void cis_results_free(cis_results *r) {
    for (int i = 0; i < r->n; i++) cJSON_Delete(r->rec[i]);
    free(r->rec);
    memset(r, 0, sizeof *r);
}

/* ---- the run's fixed inputs ---- */

kiln_error *cis_run_keep_read(const cJSON *run, const char *ctx, cis_run_keep *k) {
    const char *u;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(run, "detections");
    KILN_TRY(kiln_json_get_string(run, "cluster", &u, "image", 0, ctx));
    KILN_TRY(kiln_json_get_double(run, "detector_threshold", &k->det_threshold, 0.5, 0, ctx));
    if (!kiln_cis_cluster_unit_known(u))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'cluster': '%s' is not one of image, prompt, scene, culture", ctx, u);
    if (d && !cJSON_IsString(d) && !cJSON_IsNull(d))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'detections': expected a path or null", ctx);
    if (!(k->det_threshold >= 0 && k->det_threshold <= 1))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'detector_threshold': %g is not in [0, 1]", ctx, k->det_threshold);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(run, "labels");
    if (l && !cJSON_IsString(l) && !cJSON_IsNull(l))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'labels': expected a path or null", ctx);
    KILN_TRY(kiln_json_get_bool(run, "labels_as_judge", &k->labels_as_judge, 0, 0, ctx));
    snprintf(k->unit, sizeof k->unit, "%s", u);
    free(k->detections), free(k->labels);
    k->detections = k->labels = NULL;
    if ((cJSON_IsString(d) && !(k->detections = cis_strdup(d->valuestring))) ||
        (cJSON_IsString(l) && !(k->labels = cis_strdup(l->valuestring))))
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    return NULL;
}

void cis_run_keep_free(cis_run_keep *k) {
    free(k->detections), free(k->labels);
    k->detections = k->labels = NULL;
}

int cis_record_matches(const cJSON *rec, const char *image, const char *prompt_id, const char *model, long long seed) {
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(rec, "image"), *p = cJSON_GetObjectItemCaseSensitive(rec, "prompt_id"),
                *m = cJSON_GetObjectItemCaseSensitive(rec, "model"), *s = cJSON_GetObjectItemCaseSensitive(rec, "seed");
    return cJSON_IsString(i) && !strcmp(i->valuestring, image) && cJSON_IsString(p) &&
           !strcmp(p->valuestring, prompt_id) && cJSON_IsString(m) && !strcmp(m->valuestring, model) &&
           cJSON_IsNumber(s) && s->valuedouble == (double)seed; /* seeds are below 2^53: exact as doubles */
}

/* The CLIP model's identity of runs written before kiln_clip_id (run.json's clip_id "fnv1a64:..."):
 * FNV-1a 64 over the name, size and contents of each of the directory's .json, .txt and .safetensors
 * files, in name order. A second read of every file (about a second per GB), so only a resume of such
 * a run computes it, once: run.json then records kiln_clip_id's form (docs/cis-format.md). */
static int is_fnv_id_file(const char *name) {
    const char *ext = strrchr(name, '.');
    return name[0] != '.' && ext && (!strcmp(ext, ".json") || !strcmp(ext, ".txt") || !strcmp(ext, ".safetensors"));
}

static kiln_error *clip_identity_fnv1a64(const char *dir, char *out, size_t cap) {
    char **names = NULL;
    size_t n = 0;
    kiln_error *e = kiln_dir_names(dir, is_fnv_id_file, &names, &n);
    if (e) return e;
    uint64_t h = KILN_FNV1A64_INIT;
    for (size_t i = 0; i < n && !e; i++) {
        char *path = kiln_path_join(dir, names[i]);
        uint64_t fh = 0, size = 0;
        struct stat st;
        if (!path) e = kiln_errorf(KILN_ENOMEM, "out of memory");
        else if (!stat(path, &st) && S_ISREG(st.st_mode) && !(e = kiln_fnv1a64_file(path, &fh, &size))) {
            unsigned char b[16];
            for (int t = 0; t < 8; t++) b[t] = (unsigned char)(size >> (8 * t)), b[8 + t] = (unsigned char)(fh >> (8 * t));
            h = kiln_fnv1a64(h, names[i], strlen(names[i]) + 1);
            h = kiln_fnv1a64(h, b, sizeof b);
        }
        free(path);
    }
    kiln_dir_names_free(names, n);
    if (!e) snprintf(out, cap, "fnv1a64:%016llx", (unsigned long long)h);
    return e;
}

/* The settings a run is scored and aggregated with: the command line's over a resumed run's own
 * (run.json) over the defaults. */
typedef struct {
    const char *grids;
    int boot, perm;
    uint64_t seed;
    double threshold;
    char clip_id[40]; /* kiln_clip_id of the model */
} run_settings;

static kiln_error *write_run_json(const kiln_cis_score_opts *o, const run_settings *rs, const char *run_dir,
                                  const cis_run_keep *k) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "suite", o->suite);
    cJSON_AddStringToObject(j, "manifest", o->manifest);
    cJSON_AddStringToObject(j, "clip", o->clip_dir);
    cJSON_AddStringToObject(j, "clip_id", rs->clip_id);
    cJSON_AddStringToObject(j, "crops", rs->grids);
    cJSON_AddNumberToObject(j, "bootstrap", rs->boot);
    cJSON_AddNumberToObject(j, "permutations", rs->perm);
    cJSON_AddNumberToObject(j, "seed", (double)rs->seed); /* <= CIS_SEED_MAX: exact */
    cJSON_AddNumberToObject(j, "threshold", rs->threshold);
    cJSON_AddStringToObject(j, "cluster", k->unit);
    if (k->detections) cJSON_AddStringToObject(j, "detections", k->detections);
    else cJSON_AddNullToObject(j, "detections");
    cJSON_AddNumberToObject(j, "detector_threshold", k->det_threshold);
    if (k->labels) cJSON_AddStringToObject(j, "labels", k->labels);
    else cJSON_AddNullToObject(j, "labels");
    cJSON_AddBoolToObject(j, "labels_as_judge", k->labels_as_judge);
    cJSON_AddStringToObject(j, "absence_text", CIS_ABSENCE_TEXT);
    char *s = kiln_json_print(j, 1);
    cJSON_Delete(j);
    if (!s) return kiln_errorf(KILN_ENOMEM, "out of memory");
    char *path = kiln_path_join(run_dir, "run.json");
    kiln_error *e = path ? kiln_write_file_atomic(path, s, strlen(s)) : kiln_errorf(KILN_ENOMEM, "out of memory");
    free(path);
    free(s);
    return e;
}

/* Embedding superposition and the PCA of component text embeddings (docs/cis.md). */
static kiln_error *write_embeddings(const kiln_cis_suite *s, const cis_textset *ts, const float *T, int D,
                                    const char *run_dir) {
    cJSON *root = cJSON_CreateObject(), *sup = cJSON_AddArrayToObject(root, "superposition");
    /* one row per distinct (culture, phrase) */
    int cap = 0;
    for (int i = 0; i < s->n; i++) cap += s->p[i].ncomp;
    int *pi = malloc((size_t)cap * sizeof *pi), *ci = malloc((size_t)cap * sizeof *ci), n = 0;
    if (!pi || !ci) {
        free(pi), free(ci), cJSON_Delete(root);
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0; i < s->n; i++)
        for (int c = 0; c < s->p[i].ncomp; c++) {
            int dup = 0;
            for (int k = 0; k < n && !dup; k++)
                dup = ts->pc[pi[k]][ci[k]].text == ts->pc[i][c].text && !strcmp(s->p[pi[k]].culture, s->p[i].culture);
            if (!dup) pi[n] = i, ci[n] = c, n++;
        }
    float *X = malloc((size_t)(n ? n : 1) * D * sizeof *X);
    double *xy = malloc((size_t)(n ? n : 1) * 2 * sizeof *xy), ex[2] = {0, 0};
    if (!X || !xy) {
        free(pi), free(ci), free(X), free(xy), cJSON_Delete(root);
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        const kiln_cis_prompt *p = &s->p[pi[k]];
        const cis_comp_texts *ct = &ts->pc[pi[k]][ci[k]];
        const float *e = T + (size_t)ct->text * D;
        memcpy(X + (size_t)k * D, e, (size_t)D * sizeof *X);
        cJSON *row = cJSON_CreateObject();
        cJSON_AddStringToObject(row, "phrase", p->comp[ci[k]].phrase);
        cJSON_AddStringToObject(row, "culture", p->culture);
        cJSON_AddStringToObject(row, "group", p->group);
        cJSON_AddStringToObject(row, "category", p->category);
        if (ct->generic >= 0) cJSON_AddNumberToObject(row, "cos_generic", kiln_cis_dot(e, T + (size_t)ct->generic * D, D));
        else cJSON_AddNullToObject(row, "cos_generic");
        /* Western counterparts: the same position in the same category's Western scenes */
        double sum = 0, mx = -2;
        int cnt = 0;
        for (int k2 = 0; k2 < n; k2++) {
            const kiln_cis_prompt *q = &s->p[pi[k2]];
            if (!q->western || !strcmp(q->culture, p->culture) || strcmp(q->category, p->category) || ci[k2] != ci[k])
                continue;
            double c = kiln_cis_dot(e, T + (size_t)ts->pc[pi[k2]][ci[k2]].text * D, D);
            sum += c, cnt++;
            if (c > mx) mx = c;
        }
        if (cnt) {
            cJSON_AddNumberToObject(row, "cos_western_mean", sum / cnt);
            cJSON_AddNumberToObject(row, "cos_western_max", mx);
        } else {
            cJSON_AddNullToObject(row, "cos_western_mean");
            cJSON_AddNullToObject(row, "cos_western_max");
        }
        cJSON_AddItemToArray(sup, row);
    }
    cJSON *pca = cJSON_AddObjectToObject(root, "pca");
    if (n >= 2 && !kiln_cis_pca2(X, n, D, xy, ex)) {
        cJSON *pts = cJSON_AddArrayToObject(pca, "points");
        for (int k = 0; k < n; k++) {
            cJSON *pt = cJSON_CreateObject();
            cJSON_AddStringToObject(pt, "phrase", s->p[pi[k]].comp[ci[k]].phrase);
            cJSON_AddStringToObject(pt, "culture", s->p[pi[k]].culture);
            cJSON_AddStringToObject(pt, "group", s->p[pi[k]].group);
            cJSON_AddNumberToObject(pt, "x", xy[2 * k]);
            cJSON_AddNumberToObject(pt, "y", xy[2 * k + 1]);
            cJSON_AddItemToArray(pts, pt);
        }
        cJSON_AddNumberToObject(pca, "explained_1", ex[0]);
        cJSON_AddNumberToObject(pca, "explained_2", ex[1]);
    }
    free(pi), free(ci), free(X), free(xy);
    char *txt = kiln_json_print(root, 1);
    cJSON_Delete(root);
    char *path = kiln_path_join(run_dir, "embeddings.json");
    kiln_error *err = txt && path ? kiln_write_file_atomic(path, txt, strlen(txt)) : kiln_errorf(KILN_ENOMEM, "out of memory");
    free(txt), free(path);
    return err;
}

/* ---- one image ---- */

typedef struct {
    kiln_clip *clip;
    const kiln_cis_suite *suite;
    const cis_textset *ts;
    const float *T;
    int D, S, G;
    float scale;
    const int *grids;
    int ngrids;
} scorer;

static void put_common(cis_buf *b, const kiln_cis_item *it) {
    CIS_PUT(b, "{\"image\": ");
    cis_buf_json_str(b, it->image);
    CIS_PUT(b, ", \"prompt_id\": ");
    cis_buf_json_str(b, it->prompt_id);
    CIS_PUT(b, ", \"model\": ");
    cis_buf_json_str(b, it->model);
    cis_buf_printf(b, ", \"seed\": %lld", (long long)it->seed);
    /* the resolved path, for the report's thumbnails */
    char abs[PATH_MAX];
    CIS_PUT(b, ", \"path\": ");
    cis_buf_json_str(b, realpath(it->path, abs) ? abs : it->path);
}

/* One image's views go through CLIP in their own calls, never batched with other images: GEMM
 * results can depend on the batch's shape, and an image's numbers must not depend on which other
 * images were scored with it (a resumed run ends with the same bytes as an uninterrupted one). */
static kiln_error *score_item(scorer *sc, const kiln_cis_item *it, cis_buf *b) {
    int pidx = kiln_cis_suite_find(sc->suite, it->prompt_id);
    if (pidx < 0) return kiln_errorf(KILN_ENOTFOUND, "prompt id '%s' is not in the suite", it->prompt_id);
    const kiln_cis_prompt *p = &sc->suite->p[pidx];
    kiln_image img = {0};
    KILN_TRY(kiln_image_load(it->path, &img));
    kiln_cis_view views[1 + 4 + 9 + 16 + 25 + 36 + 49 + 64];
    int nv = kiln_cis_views(img.width, img.height, sc->grids, sc->ngrids, views, (int)(sizeof views / sizeof *views));
    size_t px = (size_t)3 * sc->S * sc->S;
    int np = sc->G * sc->G;
    float *pixels = malloc((size_t)nv * px * sizeof *pixels), *emb = malloc((size_t)nv * sc->D * sizeof *emb),
          *patches = malloc((size_t)np * sc->D * sizeof *patches), *con = NULL;
    kiln_error *e = NULL;
    if (!pixels || !emb || !patches) e = kiln_errorf(KILN_ENOMEM, "out of memory");
    for (int v = 0; v < nv && !e; v++) {
        kiln_image crop = {0};
        if (v == 0) e = kiln_clip_preprocess(sc->clip, &img, pixels);
        else if (!(e = kiln_image_crop(&img, views[v].x, views[v].y, views[v].w, views[v].h, &crop)))
            e = kiln_clip_preprocess(sc->clip, &crop, pixels + v * px);
        kiln_image_free(&crop);
    }
    if (!e) e = kiln_clip_embed_images(sc->clip, pixels, 1, emb, patches);
    if (!e && nv > 1) e = kiln_clip_embed_images(sc->clip, pixels + px, nv - 1, emb + sc->D, NULL);
    if (!e) {
        put_common(b, it);
        CIS_PUT(b, ", \"error\": null, \"components\": [");
        for (int c = 0; c < p->ncomp && !e; c++) {
            const cis_comp_texts *ct = &sc->ts->pc[pidx][c];
            float *nc = realloc(con, (size_t)(ct->ncontrast ? ct->ncontrast : 1) * sc->D * sizeof *nc);
            if (!nc) {
                e = kiln_errorf(KILN_ENOMEM, "out of memory");
                break;
            }
            con = nc;
            for (int j = 0; j < ct->ncontrast; j++)
                memcpy(con + (size_t)j * sc->D, sc->T + (size_t)ct->contrast[j] * sc->D, (size_t)sc->D * sizeof *con);
            const float *te = sc->T + (size_t)ct->text * sc->D;
            double best = -1, whole = 0;
            int bv = 0;
            for (int v = 0; v < nv; v++) {
                double pr = kiln_cis_judge_view(emb + (size_t)v * sc->D, te, con, ct->ncontrast, sc->D, sc->scale);
                if (v == 0) whole = pr;
                if (pr > best) best = pr, bv = v;
            }
            double h = kiln_cis_grounding_entropy(te, patches, np, sc->D, sc->scale);
            cis_buf_put(b, c ? ", {\"phrase\": " : "{\"phrase\": ", c ? 13 : 11);
            cis_buf_json_str(b, p->comp[c].phrase);
            CIS_PUT(b, ", \"p\": ");
            cis_buf_num(b, best);
            CIS_PUT(b, ", \"p_whole\": ");
            cis_buf_num(b, whole);
            cis_buf_printf(b, ", \"view\": %d, \"entropy\": ", bv);
            cis_buf_num(b, h);
            CIS_PUT(b, "}");
        }
        CIS_PUT(b, "], \"context_sim\": ");
        cis_buf_num(b, kiln_cis_dot(emb, sc->T + (size_t)sc->ts->context[pidx] * sc->D, sc->D));
        CIS_PUT(b, ", \"generic_sim\": ");
        if (sc->ts->generic_context[pidx] >= 0)
            cis_buf_num(b, kiln_cis_dot(emb, sc->T + (size_t)sc->ts->generic_context[pidx] * sc->D, sc->D));
        else CIS_PUT(b, "null");
        cis_buf_printf(b, ", \"width\": %d, \"height\": %d}\n", img.width, img.height);
    }
    free(pixels), free(emb), free(patches), free(con);
    kiln_image_free(&img);
    return e;
}

static kiln_error *flush_part(const char *results, int *part, cis_buf *b) {
    if (!b->n) return NULL;
    char name[64];
    snprintf(name, sizeof name, "part-%06d.jsonl", *part);
    char *path = kiln_path_join(results, name);
    kiln_error *e = path ? cis_buf_write(b, path) : kiln_errorf(KILN_ENOMEM, "out of memory");
    free(path);
    if (!e) (*part)++;
    b->n = 0;
    return e;
}

/* Same grid sizes (as parsed: "1,2" and "2" are one setting, the whole image is always a view). */
static int same_grids(const char *a, const char *b) {
    int ga[8], gb[8], na, nb;
    kiln_error *e1 = kiln_cis_parse_grids(a, ga, &na, 8), *e2 = kiln_cis_parse_grids(b, gb, &nb, 8);
    int same = !e1 && !e2 && na == nb && !memcmp(ga, gb, (size_t)na * sizeof *ga);
    kiln_error_free(e1), kiln_error_free(e2);
    return same;
}

/* A resume keeps the run's settings: each option the command line left out takes run.json's value;
 * one given with another value is refused where it changes how images are judged (--crops, the CLIP
 * model), and recomputes the statistics where it only changes those (--bootstrap, --permutations,
 * --seed, --threshold; docs/cis.md). */
static kiln_error *resume_settings(const kiln_cis_score_opts *o, const cJSON *old, const char *runjson,
                                   run_settings *rs, FILE *note) {
    const char *crops, *old_id, *old_clip;
    int64_t boot, perm, seed;
    double thr;
    KILN_TRY(kiln_json_get_string(old, "crops", &crops, "1,2,3", 0, runjson));
    KILN_TRY(kiln_json_get_string(old, "clip_id", &old_id, NULL, 0, runjson));
    KILN_TRY(kiln_json_get_string(old, "clip", &old_clip, "?", 0, runjson));
    KILN_TRY(kiln_json_get_int(old, "bootstrap", &boot, 2000, 0, runjson));
    KILN_TRY(kiln_json_get_int(old, "permutations", &perm, 10000, 0, runjson));
    KILN_TRY(kiln_json_get_int(old, "seed", &seed, 0, 0, runjson));
    KILN_TRY(kiln_json_get_double(old, "threshold", &thr, 0.5, 0, runjson));
    if (o->grids && !same_grids(o->grids, crops))
        return kiln_errorf(KILN_EINVAL,
                           "--crops %s: the run was scored with crops %s (%s); a resume keeps the run's settings: "
                           "leave --crops out, or score into a new --out", o->grids, crops, runjson);
    if (old_id) {
        /* the model's identity in the form run.json has it: kiln_clip_id's, or a run's from before it */
        const char *cur = rs->clip_id;
        char legacy[40];
        if (!strncmp(old_id, "fnv1a64:", 8)) {
            fprintf(note, "note: %s holds the CLIP model's identity in the older fnv1a64 form: checking --clip %s "
                          "against it by reading its files once more (about a second per GB); run.json records "
                          "the newer form from now on\n", runjson, o->clip_dir);
            KILN_TRY(clip_identity_fnv1a64(o->clip_dir, legacy, sizeof legacy));
            cur = legacy;
        } else if (strncmp(old_id, "xxh64:", 6)) {
            return kiln_errorf(KILN_EFORMAT,
                               "%s: clip_id '%s' is in a form this kiln does not know (it writes xxh64:..., and checks "
                               "fnv1a64:... of older runs): resume with the kiln that wrote the run, or score into a new "
                               "--out", runjson, old_id);
        }
        if (strcmp(old_id, cur))
            return kiln_errorf(KILN_EINVAL,
                               "--clip %s: another CLIP model (%s) than the one the run was scored with (%s, %s in %s); "
                               "a resume must use the same model, or score into a new --out", o->clip_dir, cur,
                               old_clip, old_id, runjson);
    }
    if (boot < 1 || perm < 1 || boot > INT_MAX || perm > INT_MAX || seed < 0 || seed > CIS_SEED_MAX || !(thr >= 0 && thr <= 1))
        return kiln_errorf(KILN_EFORMAT, "%s: bootstrap, permutations, seed or threshold out of range", runjson);
    if (!o->grids && !(rs->grids = cis_strdup(crops))) return kiln_errorf(KILN_ENOMEM, "out of memory");
    if (!o->boot) rs->boot = (int)boot;
    if (!o->perm) rs->perm = (int)perm;
    if (o->seed == UINT64_MAX) rs->seed = (uint64_t)seed;
    if (isnan(o->threshold)) rs->threshold = thr;
    return NULL;
}

kiln_error *kiln_cis_score(const kiln_cis_score_opts *o, int *nscored, int *nerrors) {
    *nscored = *nerrors = 0;
    if (!o->suite || !o->manifest || !o->clip_dir || !o->out_dir)
        return kiln_errorf(KILN_EINVAL, "score needs a suite, a manifest, a CLIP directory and an output directory");
    if (o->chunk < 1) return kiln_errorf(KILN_EINVAL, "chunk must be >= 1");
    if (o->cluster && !kiln_cis_cluster_unit_known(o->cluster))
        return kiln_errorf(KILN_EINVAL, "cluster: '%s' is not one of image, prompt, scene, culture", o->cluster);
    if (!isnan(o->det_threshold) && !(o->det_threshold >= 0 && o->det_threshold <= 1))
        return kiln_errorf(KILN_EINVAL, "detector threshold %g is not in [0, 1]", o->det_threshold);
    /* every option is checked before the hours of scoring, not by the aggregation after them */
    if (o->boot < 0 || o->perm < 0) return kiln_errorf(KILN_EINVAL, "--bootstrap and --permutations must be >= 1");
    if (o->seed != UINT64_MAX && o->seed > (uint64_t)CIS_SEED_MAX)
        return kiln_errorf(KILN_EINVAL, "--seed %llu: seeds are 0 .. 2^53 - 1 (run.json keeps them as exact JSON numbers)",
                           (unsigned long long)o->seed);
    if (!isnan(o->threshold) && !(o->threshold >= 0 && o->threshold <= 1))
        return kiln_errorf(KILN_EINVAL, "--threshold %g is not in [0, 1]", o->threshold);
    if (o->labels_as_judge && !o->labels) return kiln_errorf(KILN_EINVAL, "--labels-as-judge needs --labels");
    if (o->labels) KILN_TRY(cis_labels_check(o->labels));
    int grids[8], ngrids;
    if (o->grids) KILN_TRY(kiln_cis_parse_grids(o->grids, grids, &ngrids, 8));
    run_settings rs = {o->grids ? o->grids : "1,2,3", o->boot ? o->boot : 2000, o->perm ? o->perm : 10000,
                       o->seed == UINT64_MAX ? 0 : o->seed, isnan(o->threshold) ? 0.5 : o->threshold, ""};
    char *grids_own = NULL; /* rs.grids when it came from run.json */
    kiln_cis_suite suite = {0, NULL}, run_suite = {0, NULL};
    kiln_cis_manifest man = {0, NULL};
    cis_textset ts = {0};
    kiln_clip *clip = NULL;
    float *T = NULL;
    cis_results prev = {0};
    cis_buf b = {0};
    cJSON *old = NULL;
    cis_run_keep keep = {"prompt", NULL, 0.5, NULL, 0}; /* a new run's; the command line's over it */
    char *det_text = NULL, *man_text = NULL; /* the detections file's and the manifest's bytes, copied into the run */
    size_t det_len = 0, man_len = 0;
    char *runjson = kiln_path_join(o->out_dir, "run.json"), *results = kiln_path_join(o->out_dir, "results"),
         *suite_copy = kiln_path_join(o->out_dir, "suite.jsonl"),
         *man_copy = kiln_path_join(o->out_dir, "manifest.jsonl"), *suite_text = NULL;
    size_t suite_len;
    kiln_error *e = NULL;
    FILE *note = o->progress ? o->progress : stderr;
    if (!runjson || !results || !suite_copy || !man_copy) {
        e = kiln_errorf(KILN_ENOMEM, "out of memory");
        goto done;
    }
    if ((e = kiln_read_file(o->suite, &suite_text, &suite_len)) ||
        (e = kiln_cis_suite_parse(suite_text, suite_len, o->suite, &suite)))
        goto done;
    if ((e = kiln_read_file(o->manifest, &man_text, &man_len)) || (e = kiln_cis_manifest_load(o->manifest, &man)))
        goto done;
    /* every input is checked before the run directory is touched */
    if (o->detections) {
        /* read once: the bytes checked are the bytes the run keeps */
        cis_detections det;
        if ((e = kiln_read_file(o->detections, &det_text, &det_len)) ||
            (e = cis_detections_parse(det_text, det_len, o->detections, &det)))
            goto done;
        cis_detections_free(&det);
    }
    if ((e = kiln_clip_load(o->clip_dir, &clip))) {
        e = kiln_error_wrap(e, "--clip %s", o->clip_dir);
        goto done;
    }
    snprintf(rs.clip_id, sizeof rs.clip_id, "%s", kiln_clip_id(clip)); /* hashed as the weights were read */
    struct stat st;
    int have_run = !stat(runjson, &st);
    if (!o->resume && have_run) {
        e = kiln_errorf(KILN_EINVAL, "%s already holds a run: pass --resume to continue it, or choose another --out",
                        o->out_dir);
        goto done;
    }
    if (o->resume && have_run) {
        /* the run's own settings, suite and model, checked before anything of it is rewritten */
        if ((e = kiln_json_parse_file(runjson, &old)) || (e = cis_run_keep_read(old, runjson, &keep)) ||
            (e = resume_settings(o, old, runjson, &rs, note)))
            goto done;
        if (!o->grids) grids_own = (char *)rs.grids;
        if ((e = kiln_cis_parse_grids(rs.grids, grids, &ngrids, 8))) goto done;
        if ((e = kiln_cis_suite_load(suite_copy, &run_suite)) ||
            (e = cis_suite_compare(&run_suite, suite_copy, &suite, o->suite))) {
            e = kiln_error_wrap(e, "--suite %s differs from the run's (a resume must score with the run's suite; "
                                   "score into a new --out for another)", o->suite);
            goto done;
        }
        if ((e = cis_read_results(o->out_dir, &prev))) goto done;
    } else if (!o->grids && (e = kiln_cis_parse_grids(rs.grids, grids, &ngrids, 8))) {
        goto done;
    }
    /* the resampling unit, the detections and their threshold: the command line's, else a resumed
     * run's own (image for runs from before the field, as they were aggregated), else the defaults */
    if (o->cluster) snprintf(keep.unit, sizeof keep.unit, "%s", o->cluster);
    if (o->detections) {
        free(keep.detections);
        if (!(keep.detections = cis_strdup(o->detections))) {
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
    }
    if (!isnan(o->det_threshold)) keep.det_threshold = o->det_threshold;
    if ((e = cis_mkdir(o->out_dir)) || (e = cis_mkdir(results))) goto done;
    /* the run keeps copies of the suite, the manifest and the detections it was aggregated with (run.json
     * names the originals): aggregation counts only the images the manifest lists */
    if (det_text) {
        char *det_copy = kiln_path_join(o->out_dir, "detections.jsonl");
        e = det_copy ? kiln_write_file_atomic(det_copy, det_text, det_len) : kiln_errorf(KILN_ENOMEM, "out of memory");
        free(det_copy);
        if (e) goto done;
    }
    if ((!have_run || !o->resume) && (e = kiln_write_file_atomic(suite_copy, suite_text, suite_len))) goto done;
    if ((e = kiln_write_file_atomic(man_copy, man_text, man_len)) || (e = write_run_json(o, &rs, o->out_dir, &keep)))
        goto done;
    if ((e = cis_textset_build(&suite, &ts))) goto done;
    int D = kiln_clip_dim(clip);
    if (!(T = malloc((size_t)ts.ntext * D * sizeof *T))) {
        e = kiln_errorf(KILN_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < ts.ntext && !e; i += 64) {
        int n = ts.ntext - i < 64 ? ts.ntext - i : 64;
        e = kiln_clip_embed_texts(clip, (const char *const *)ts.text + i, n, T + (size_t)i * D);
    }
    if (e || (e = write_embeddings(&suite, &ts, T, D, o->out_dir))) goto done;

    scorer sc = {clip, &suite, &ts, T, D, kiln_clip_image_size(clip), kiln_clip_grid(clip), kiln_clip_logit_scale(clip),
                 grids, ngrids};
    int part = prev.next_part, changed = 0;
    const char *changed_first = NULL;
    kiln_progress pg;
    if (o->progress) kiln_progress_start_to(&pg, "cis score", (uint64_t)man.n, "img", o->progress, 0);
    else kiln_progress_start(&pg, "cis score", (uint64_t)man.n, "img");
    int inchunk = 0;
    for (int i = 0; i < man.n && !e; i++) {
        const kiln_cis_item *it = &man.items[i];
        /* done when the run holds an error-free record of this image with the item's prompt id, model
         * and seed; a record of the image with other metadata is stale (the manifest changed): scored
         * again, and the new record replaces it */
        int done_before = 0;
        for (int k = 0; k < prev.n && !done_before; k++) {
            const cJSON *im = cJSON_GetObjectItemCaseSensitive(prev.rec[k], "image");
            if (strcmp(im->valuestring, it->image)) continue;
            if (!cis_record_matches(prev.rec[k], it->image, it->prompt_id, it->model, (long long)it->seed)) {
                if (!changed++) changed_first = it->image;
                break;
            }
            done_before = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(prev.rec[k], "error"));
        }
        if (done_before) {
            (*nscored)++;
            kiln_progress_update(&pg, (uint64_t)i + 1);
            continue;
        }
        if (o->stop && *o->stop) {
            e = kiln_errorf(KILN_EINVAL, "interrupted after %d of %d images; finished results are kept, --resume continues",
                            i, man.n);
            break;
        }
        size_t mark = b.n;
        kiln_error *ie = score_item(&sc, it, &b);
        if (ie) {
            b.n = mark; /* drop a half-written record */
            put_common(&b, it);
            CIS_PUT(&b, ", \"error\": ");
            cis_buf_json_str(&b, kiln_error_msg(ie));
            CIS_PUT(&b, "}\n");
            kiln_error_free(ie);
            (*nerrors)++;
        } else {
            (*nscored)++;
        }
        if (++inchunk == o->chunk) {
            e = flush_part(results, &part, &b);
            inchunk = 0;
        }
        kiln_progress_update(&pg, (uint64_t)i + 1);
    }
    kiln_error *fe = flush_part(results, &part, &b);
    if (!e) e = fe;
    else kiln_error_free(fe);
    kiln_progress_finish(&pg);
    if (changed)
        fprintf(note, "note: %d image(s) of the run had another prompt_id, model or seed in the manifest (first: %s): "
                      "scored again\n", changed, changed_first);
    if (!e) e = kiln_cis_aggregate(o);
done:
    cis_buf_free(&b);
    cis_results_free(&prev);
    free(T);
    free(grids_own);
    cJSON_Delete(old);
    cis_textset_free(&ts, &suite);
    kiln_clip_free(clip);
    kiln_cis_manifest_free(&man);
    kiln_cis_suite_free(&suite);
    kiln_cis_suite_free(&run_suite);
    cis_run_keep_free(&keep);
    free(runjson), free(results), free(suite_copy), free(man_copy), free(suite_text), free(det_text), free(man_text);
    return e;
}
