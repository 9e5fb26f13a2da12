/* The aggregates of a scored run: verdicts (threshold or labels), CIS per image, bootstrap CIs
 * by model, culture, group, category, setting and complexity, the Western / non-Western gap with
 * permutation p-values, compositional fragility, contextual misalignment, grounding entropy,
 * judge-vs-labels agreement. Writes scores.json and the CSV files (docs/cis.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/json.h"
#include "score_internal.h"

typedef struct {
    const cJSON *rec;
    const kiln_cis_prompt *p; /* NULL for an error record */
    int ncomp;
    double *prob, *entropy;
    int *label;   /* -1 unlabelled */
    int *verdict;
    double cis, mis; /* mis NaN when the suite has no generic context */
    double *pdet;    /* per component: the detector's highest score for its COCO class, 0 where it found none (NaN: no
                        class; pdet NULL: no detections file) */
    double det, det_clip; /* over the components with a COCO class: detected / all, CLIP's present / all (else NaN) */
    char cx[16];
    int cl;          /* the row's cluster (params.unit): the unit the bootstrap and the permutations move */
} row;

typedef struct {
    int boot, perm;
    uint64_t seed;
    double threshold;
    const char *unit; /* image, prompt, scene or culture (cis_run_keep.unit) */
} params;

static const char *rstr(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsString(v) ? v->valuestring : "";
}
static double rnum(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static uint64_t key_seed(const params *pr, const char *a, const char *b, const char *c) {
    uint64_t h = kiln_fnv1a64(KILN_FNV1A64_INIT, a, strlen(a));
    h = kiln_fnv1a64(h, "\x1f", 1);
    h = kiln_fnv1a64(h, b, strlen(b));
    h = kiln_fnv1a64(h, "\x1f", 1);
    h = kiln_fnv1a64(h, c, strlen(c));
    return h ^ pr->seed;
}

/* ---- levels of a dimension ---- */

typedef const char *(*dim_fn)(const row *r);
static const char *d_model(const row *r) { return rstr(r->rec, "model"); }
static const char *d_culture(const row *r) { return r->p->culture; }
static const char *d_group(const row *r) { return r->p->group; }
static const char *d_category(const row *r) { return r->p->category; }
static const char *d_setting(const row *r) { return r->p->setting; }
static const char *d_complexity(const row *r) { return r->cx; }
static const char *d_all(const row *r) { (void)r; return "all"; }

static int cmp_level(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    char *ex, *ey;
    long ix = strtol(x, &ex, 10), iy = strtol(y, &ey, 10);
    if (*x && *y && !*ex && !*ey) return (ix > iy) - (ix < iy);
    return strcmp(x, y);
}

/* Sorted distinct levels of dim over the scored rows; returns the count (levels point into rows). */
static int levels(row *rows, int n, dim_fn dim, const char **out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!rows[i].p) continue;
        const char *l = dim(&rows[i]);
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = !strcmp(out[j], l);
        if (!seen) out[k++] = l;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_level);
    return k;
}

typedef struct {
    const char *name;
    dim_fn fn;
} dim;
static const dim dims[] = {{"all", d_all},         {"model", d_model},       {"culture", d_culture},
                           {"group", d_group},     {"category", d_category}, {"setting", d_setting},
                           {"complexity", d_complexity}};
#define NDIMS ((int)(sizeof dims / sizeof *dims))

/* RFC 4180: a field holding a comma, quote or line break is quoted, its quotes doubled. */
static void csv_field(cis_buf *b, const char *s) {
    if (strpbrk(s, ",\"\r\n")) {
        CIS_PUT(b, "\"");
        for (const char *p = s; *p; p++) {
            if (*p == '"') CIS_PUT(b, "\""); /* a quote is doubled */
            cis_buf_put(b, p, 1);
        }
        CIS_PUT(b, "\"");
    } else {
        cis_buf_put(b, s, strlen(s));
    }
}

/* A number in a CSV file: empty where it does not exist (NaN: a CI of one cluster, a p-value of one
 * group), not JSON's null, which spreadsheets and CSV readers take for text. */
static void csv_num(cis_buf *b, double v) {
    if (isfinite(v)) cis_buf_num(b, v);
}

/* A mean with its bootstrap CI, as a JSON object and a summary.csv line. */
static void add_mean(cJSON *arr, cis_buf *csv, const char *section, const char *by, const char *level,
                     const double *v, const int *cl, int n, const params *pr) {
    double lo, hi, m = kiln_cis_mean(v, n);
    kiln_cis_bootstrap_mean(v, cl, n, pr->boot, 0.95, key_seed(pr, section, by, level), &lo, &hi);
    int ncl = kiln_cis_nclusters(cl, n);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "by", by);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddNumberToObject(o, "n", n);
    cJSON_AddNumberToObject(o, "clusters", ncl);
    cJSON_AddNumberToObject(o, "mean", m);
    cJSON_AddNumberToObject(o, "lo", lo);
    cJSON_AddNumberToObject(o, "hi", hi);
    cJSON_AddItemToArray(arr, o);
    csv_field(csv, section), CIS_PUT(csv, ","), csv_field(csv, by), CIS_PUT(csv, ",");
    csv_field(csv, level);
    cis_buf_printf(csv, ",%d,", n);
    csv_num(csv, m), CIS_PUT(csv, ","), csv_num(csv, lo), CIS_PUT(csv, ",");
    csv_num(csv, hi), cis_buf_printf(csv, ",,%d,\n", ncl);
}

typedef double (*val_fn)(const row *r);
static double v_cis(const row *r) { return r->cis; }
static double v_mis(const row *r) { return r->mis; }
static double v_det(const row *r) { return r->det; }
static double v_det_clip(const row *r) { return r->det_clip; }

/* Means of val over every level of every dimension (rows where val is NaN are skipped). */
static void by_dims(cJSON *arr, cis_buf *csv, const char *section, row *rows, int n, val_fn val, const params *pr,
                    int ndims) {
    const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
    double *v = malloc((size_t)(n + 1) * sizeof *v);
    int *cl = malloc((size_t)(n + 1) * sizeof *cl);
    if (!lv || !v || !cl) goto out;
    for (int d = 0; d < ndims; d++) {
        int nl = levels(rows, n, dims[d].fn, lv);
        for (int l = 0; l < nl; l++) {
            int k = 0;
            for (int i = 0; i < n; i++)
                if (rows[i].p && !strcmp(dims[d].fn(&rows[i]), lv[l]) && !isnan(val(&rows[i])))
                    v[k] = val(&rows[i]), cl[k++] = rows[i].cl;
            if (k) add_mean(arr, csv, section, dims[d].name, lv[l], v, cl, k, pr);
        }
    }
out:
    free(lv), free(v), free(cl);
}

/* Western minus non-Western mean CIS within each level of dim, with a permutation p-value, and
 * that p-value adjusted by Holm's method over the dimension's levels (one family of tests: the
 * settings, the models or the categories). */
static void gaps(cJSON *arr, cis_buf *csv, row *rows, int n, const dim *dm, const params *pr) {
    const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
    double *v = malloc((size_t)(n + 1) * sizeof *v), *pv = malloc((size_t)(n + 1) * sizeof *pv),
           *padj = malloc((size_t)(n + 1) * sizeof *padj), *dv = malloc((size_t)(n + 1) * sizeof *dv);
    int *g = malloc((size_t)(n + 1) * sizeof *g), *cl = malloc((size_t)(n + 1) * sizeof *cl),
        *nk = malloc((size_t)(n + 1) * sizeof *nk), *nc = malloc((size_t)(n + 1) * sizeof *nc);
    cJSON **obj = malloc((size_t)(n + 1) * sizeof *obj);
    if (!lv || !v || !pv || !padj || !dv || !g || !cl || !nk || !nc || !obj) goto out;
    int nl = levels(rows, n, dm->fn, lv);
    for (int l = 0; l < nl; l++) {
        int k = 0, nw = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].p && !strcmp(dm->fn(&rows[i]), lv[l]))
                v[k] = rows[i].cis, cl[k] = rows[i].cl, nw += g[k] = rows[i].p->western, k++;
        int how = kiln_cis_perm_test(v, g, cl, k, pr->perm, key_seed(pr, "gap", dm->name, lv[l]), &dv[l], &pv[l]);
        nk[l] = k, nc[l] = kiln_cis_nclusters(cl, k);
        double sw = 0, sn = 0;
        for (int i = 0; i < k; i++) *(g[i] ? &sw : &sn) += v[i];
        cJSON *o = obj[l] = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "by", dm->name);
        cJSON_AddStringToObject(o, "level", lv[l]);
        cJSON_AddNumberToObject(o, "n_western", nw);
        cJSON_AddNumberToObject(o, "n_non_western", k - nw);
        cJSON_AddNumberToObject(o, "clusters", nc[l]);
        cJSON_AddNumberToObject(o, "western", nw ? sw / nw : NAN);
        cJSON_AddNumberToObject(o, "non_western", k - nw ? sn / (k - nw) : NAN);
        cJSON_AddNumberToObject(o, "gap", dv[l]);
        cJSON_AddNumberToObject(o, "p", pv[l]);
        cJSON_AddNumberToObject(o, "permutations", pr->perm);
        cJSON_AddBoolToObject(o, "exact", how == 1); /* every relabelling of the clusters counted */
        cJSON_AddItemToArray(arr, o);
    }
    kiln_cis_holm(pv, nl, padj);
    for (int l = 0; l < nl; l++) {
        cJSON_AddNumberToObject(obj[l], "p_holm", padj[l]);
        cis_buf_printf(csv, "gap,%s,", dm->name);
        csv_field(csv, lv[l]);
        cis_buf_printf(csv, ",%d,", nk[l]);
        csv_num(csv, dv[l]), CIS_PUT(csv, ",,,"), csv_num(csv, pv[l]), cis_buf_printf(csv, ",%d,", nc[l]);
        csv_num(csv, padj[l]), CIS_PUT(csv, "\n");
    }
out:
    free(lv), free(v), free(pv), free(padj), free(dv), free(g), free(cl), free(nk), free(nc), free(obj);
}

/* OLS slope of CIS on complexity within each level of dim, with a bootstrap CI. */
static void fragility(cJSON *arr, cis_buf *csv, row *rows, int n, const dim *dm, const params *pr) {
    const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
    double *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
    int *cl = malloc((size_t)(n + 1) * sizeof *cl);
    if (!lv || !x || !y || !cl) goto out;
    int nl = levels(rows, n, dm->fn, lv);
    for (int l = 0; l < nl; l++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].p && !strcmp(dm->fn(&rows[i]), lv[l]))
                x[k] = rows[i].ncomp, y[k] = rows[i].cis, cl[k] = rows[i].cl, k++;
        double s, c, lo, hi;
        kiln_cis_ols(x, y, k, &s, &c);
        kiln_cis_bootstrap_slope(x, y, cl, k, pr->boot, 0.95, key_seed(pr, "fragility", dm->name, lv[l]), &lo, &hi);
        int ncl = kiln_cis_nclusters(cl, k);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "by", dm->name);
        cJSON_AddStringToObject(o, "level", lv[l]);
        cJSON_AddNumberToObject(o, "n", k);
        cJSON_AddNumberToObject(o, "clusters", ncl);
        cJSON_AddNumberToObject(o, "slope", s);
        cJSON_AddNumberToObject(o, "intercept", c);
        cJSON_AddNumberToObject(o, "lo", lo);
        cJSON_AddNumberToObject(o, "hi", hi);
        cJSON_AddItemToArray(arr, o);
        cis_buf_printf(csv, "fragility,%s,", dm->name);
        csv_field(csv, lv[l]);
        cis_buf_printf(csv, ",%d,", k);
        csv_num(csv, s), CIS_PUT(csv, ","), csv_num(csv, lo), CIS_PUT(csv, ",");
        csv_num(csv, hi), cis_buf_printf(csv, ",,%d,\n", ncl);
    }
out:
    free(lv), free(x), free(y), free(cl);
}

/* ---- models against each other ---- */

typedef struct {
    const char *pid;
    double seed;
    int row;
} seed_key;

static int cmp_seed_key(const void *a, const void *b) {
    const seed_key *x = a, *y = b;
    int c = strcmp(x->pid, y->pid);
    if (c) return c;
    if (x->seed != y->seed) return (x->seed > y->seed) - (x->seed < y->seed);
    return (x->row > y->row) - (x->row < y->row);
}

/* The cells a model comparison pairs: a prompt and seed (the worklist gives every model the same
 * seeds), cell[i] for each scored row; cell_cl[c] the cell's cluster under the run's unit (the cell
 * itself under "image"). Returns the number of cells, -1 when out of memory. */
static int cell_keys(row *rows, int n, const params *pr, int *cell, int *cell_cl) {
    seed_key *k = malloc((size_t)(n + 1) * sizeof *k);
    if (!k) return -1;
    int nk = 0, m = -1;
    for (int i = 0; i < n; i++)
        if (rows[i].p) k[nk].pid = rows[i].p->id, k[nk].seed = rnum(rows[i].rec, "seed"), k[nk++].row = i;
    qsort(k, (size_t)nk, sizeof *k, cmp_seed_key);
    for (int j = 0; j < nk; j++) {
        if (!j || strcmp(k[j - 1].pid, k[j].pid) || k[j - 1].seed != k[j].seed) m++;
        cell[k[j].row] = m;
        cell_cl[m] = strcmp(pr->unit, "image") ? rows[k[j].row].cl : m;
    }
    free(k);
    return m + 1;
}

/* One comparison of two models. */
typedef struct {
    int a, b, pairs, exact;
    double diff, lo, hi, p;
} model_cmp;

/* Every pair of models a, b, paired: the cells (prompt and seed) both scored, each cell's CIS
 * under a minus under b, averaged within the run's clusters; the estimate is the mean over the
 * clusters of those differences, with a bootstrap CI over the clusters, a paired sign-flip p-value,
 * Holm-adjusted over the model pairs. A cell only one model scored (the other's image failed)
 * is left out on both sides. Returns -1 when out of memory. */
static int model_diffs(cJSON *arr, cis_buf *csv, row *rows, int n, const params *pr) {
    const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
    int *cell = malloc((size_t)(n + 1) * sizeof *cell), *cell_cl = malloc((size_t)(n + 1) * sizeof *cell_cl), ret = -1;
    double *ca = NULL, *cb = NULL, *dsum = NULL, *d = NULL, *pv = NULL, *adj = NULL;
    int *cna = NULL, *cnb = NULL, *dn = NULL;
    model_cmp *mc = NULL;
    int nm = lv ? levels(rows, n, d_model, lv) : 0, m = lv && cell && cell_cl ? cell_keys(rows, n, pr, cell, cell_cl) : -1;
    int ncmp = nm * (nm - 1) / 2;
    if (m < 0) goto out;
    ca = malloc(((size_t)m + 1) * sizeof *ca), cb = malloc(((size_t)m + 1) * sizeof *cb);
    dsum = malloc(((size_t)m + 1) * sizeof *dsum), d = malloc(((size_t)m + 1) * sizeof *d);
    cna = malloc(((size_t)m + 1) * sizeof *cna), cnb = malloc(((size_t)m + 1) * sizeof *cnb);
    dn = malloc(((size_t)m + 1) * sizeof *dn);
    pv = malloc(((size_t)ncmp + 1) * sizeof *pv), adj = malloc(((size_t)ncmp + 1) * sizeof *adj);
    mc = malloc(((size_t)ncmp + 1) * sizeof *mc);
    if (!ca || !cb || !dsum || !d || !cna || !cnb || !dn || !pv || !adj || !mc) goto out;
    char level[512];
    for (int a = 0, q = 0; a < nm; a++)
        for (int b = a + 1; b < nm; b++, q++) {
            for (int c = 0; c < m; c++) ca[c] = cb[c] = dsum[c] = 0, cna[c] = cnb[c] = dn[c] = 0;
            for (int i = 0; i < n; i++) {
                if (!rows[i].p) continue;
                const char *model = d_model(&rows[i]);
                if (!strcmp(model, lv[a])) ca[cell[i]] += rows[i].cis, cna[cell[i]]++;
                else if (!strcmp(model, lv[b])) cb[cell[i]] += rows[i].cis, cnb[cell[i]]++;
            }
            /* the cells both scored, into their clusters (the cluster ids are below m: ranks, or cells) */
            for (int c = 0; c < m; c++)
                if (cna[c] && cnb[c]) dsum[cell_cl[c]] += ca[c] / cna[c] - cb[c] / cnb[c], dn[cell_cl[c]]++;
            int k = 0;
            for (int c = 0; c < m; c++)
                if (dn[c]) d[k++] = dsum[c] / dn[c];
            snprintf(level, sizeof level, "%s - %s", lv[a], lv[b]);
            model_cmp *x = &mc[q];
            x->a = a, x->b = b, x->pairs = k;
            x->exact = kiln_cis_signflip_test(d, k, pr->perm, key_seed(pr, "model_diff", "p", level), &x->diff, &x->p) == 1;
            kiln_cis_bootstrap_mean(d, NULL, k, pr->boot, 0.95, key_seed(pr, "model_diff", "ci", level), &x->lo, &x->hi);
            pv[q] = x->p;
        }
    kiln_cis_holm(pv, ncmp, adj);
    for (int q = 0; q < ncmp; q++) {
        const model_cmp *x = &mc[q];
        snprintf(level, sizeof level, "%s - %s", lv[x->a], lv[x->b]);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "a", lv[x->a]);
        cJSON_AddStringToObject(o, "b", lv[x->b]);
        cJSON_AddNumberToObject(o, "pairs", x->pairs);
        cJSON_AddNumberToObject(o, "diff", x->diff);
        cJSON_AddNumberToObject(o, "lo", x->lo);
        cJSON_AddNumberToObject(o, "hi", x->hi);
        cJSON_AddNumberToObject(o, "p", x->p);
        cJSON_AddBoolToObject(o, "exact", x->exact);
        cJSON_AddNumberToObject(o, "p_holm", adj[q]);
        cJSON_AddItemToArray(arr, o);
        cis_buf_printf(csv, "model_diff,models,");
        csv_field(csv, level);
        cis_buf_printf(csv, ",%d,", x->pairs);
        csv_num(csv, x->diff), CIS_PUT(csv, ","), csv_num(csv, x->lo), CIS_PUT(csv, ",");
        csv_num(csv, x->hi), CIS_PUT(csv, ","), csv_num(csv, x->p), cis_buf_printf(csv, ",%d,", x->pairs);
        csv_num(csv, adj[q]), CIS_PUT(csv, "\n");
    }
    ret = 0;
out:
    free(lv), free(cell), free(cell_cl), free(ca), free(cb), free(dsum), free(d), free(cna), free(cnb), free(dn);
    free(pv), free(adj), free(mc);
    return ret;
}

/* ---- clusters ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int kiln_cis_cluster_unit_known(const char *unit) {
    return unit && (!strcmp(unit, "image") || !strcmp(unit, "prompt") || !strcmp(unit, "scene") ||
                    !strcmp(unit, "culture"));
}

static const char *cluster_key(const kiln_cis_prompt *p, const char *unit) {
    return !strcmp(unit, "prompt") ? p->id : !strcmp(unit, "scene") ? p->scene : p->culture;
}

/* Each scored row's cluster id: its index for "image", else the rank of its prompt id, scene or
 * culture among the run's distinct ones (so the ids, and with them the draws, do not depend on
 * the order of the results). */
static kiln_error *assign_clusters(row *rows, int n, const char *unit) {
    if (!strcmp(unit, "image")) {
        for (int i = 0; i < n; i++) rows[i].cl = i;
        return NULL;
    }
    const char **key = malloc((size_t)(n + 1) * sizeof *key);
    if (!key) return kiln_errorf(KILN_ENOMEM, "out of memory");
    int k = 0, u = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].p) key[k++] = cluster_key(rows[i].p, unit);
    qsort(key, (size_t)k, sizeof *key, cmp_str);
    for (int i = 0; i < k; i++) /* the distinct keys */
        if (!u || strcmp(key[u - 1], key[i])) key[u++] = key[i];
    for (int i = 0; i < n; i++) {
        if (!rows[i].p) continue;
        const char *me = cluster_key(rows[i].p, unit);
        rows[i].cl = (int)((const char **)bsearch(&me, key, (size_t)u, sizeof *key, cmp_str) - key);
    }
    free(key);
    return NULL;
}

/* ---- labels ---- */

typedef struct {
    row *rows;
    int n, matched, unmatched;
} label_ctx;

static const char *const label_fields[] = {"image", "component", "present", NULL};

static kiln_error *apply_label(const cJSON *o, int line, const char *cl, void *user) {
    (void)line;
    label_ctx *lc = user;
    KILN_TRY(cis_check_fields(o, label_fields, cl));
    const char *img, *comp;
    int present;
    KILN_TRY(kiln_json_get_string(o, "image", &img, NULL, 1, cl));
    KILN_TRY(kiln_json_get_string(o, "component", &comp, NULL, 1, cl));
    KILN_TRY(kiln_json_get_bool(o, "present", &present, 0, 1, cl));
    for (int i = 0; i < lc->n; i++) {
        row *r = &lc->rows[i];
        if (!r->p || strcmp(rstr(r->rec, "image"), img)) continue;
        for (int c = 0; c < r->ncomp; c++)
            if (!strcmp(r->p->comp[c].phrase, comp)) {
                if (r->label[c] < 0) lc->matched++;
                r->label[c] = present;
                return NULL;
            }
    }
    lc->unmatched++;
    return NULL;
}

kiln_error *cis_labels_check(const char *path) {
    char *text;
    size_t len;
    KILN_TRY(kiln_read_file(path, &text, &len));
    label_ctx lc = {NULL, 0, 0, 0}; /* no rows: every label is only checked */
    kiln_error *e = cis_jsonl_each(text, len, path, apply_label, &lc);
    free(text);
    return e;
}

/* Keeps the records of rs that the run's manifest (RUN/manifest.jsonl, the copy the last score wrote)
 * lists with the same prompt id, model and seed; frees the others and returns how many. A run from
 * before the copy keeps every record. */
static int cmp_item_image(const void *a, const void *b) {
    return strcmp((*(const kiln_cis_item *const *)a)->image, (*(const kiln_cis_item *const *)b)->image);
}
static kiln_error *keep_manifest_records(const char *dir, cis_results *rs, int *dropped) {
    *dropped = 0;
    char *mp = kiln_path_join(dir, "manifest.jsonl");
    if (!mp) return kiln_errorf(KILN_ENOMEM, "out of memory");
    kiln_cis_manifest m = {0, NULL};
    kiln_error *e = kiln_cis_manifest_load(mp, &m);
    free(mp);
    if (e && kiln_error_code(e) == KILN_ENOTFOUND) {
        kiln_error_free(e);
        return NULL;
    }
    if (e) return e;
    const kiln_cis_item **by = malloc((size_t)m.n * sizeof *by);
    if (!by) {
        kiln_cis_manifest_free(&m);
        return kiln_errorf(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0; i < m.n; i++) by[i] = &m.items[i];
    qsort(by, (size_t)m.n, sizeof *by, cmp_item_image);
    int k = 0;
    for (int i = 0; i < rs->n; i++) {
        kiln_cis_item key = {0};
        const kiln_cis_item *kp = &key, *const *hit;
        key.image = (char *)rstr(rs->rec[i], "image");
        hit = bsearch(&kp, by, (size_t)m.n, sizeof *by, cmp_item_image);
        if (hit && cis_record_matches(rs->rec[i], (*hit)->image, (*hit)->prompt_id, (*hit)->model, (long long)(*hit)->seed))
            rs->rec[k++] = rs->rec[i];
        else
            cJSON_Delete(rs->rec[i]), (*dropped)++;
    }
    rs->n = k;
    free(by);
    kiln_cis_manifest_free(&m);
    return NULL;
}

static cJSON *agreement_json(const kiln_cis_agreement *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", a->tp);
    cJSON_AddNumberToObject(o, "fp", a->fp);
    cJSON_AddNumberToObject(o, "tn", a->tn);
    cJSON_AddNumberToObject(o, "fn", a->fn);
    cJSON_AddNumberToObject(o, "accuracy", a->accuracy);
    cJSON_AddNumberToObject(o, "precision", a->precision);
    cJSON_AddNumberToObject(o, "recall", a->recall);
    cJSON_AddNumberToObject(o, "balanced_accuracy", a->balanced_accuracy);
    cJSON_AddNumberToObject(o, "kappa", a->kappa);
    return o;
}

typedef struct {
    uint64_t h;
    int cl;
} hashed_cl;

static int cmp_hashed(const void *a, const void *b) {
    const hashed_cl *x = a, *y = b;
    if (x->h != y->h) return (x->h > y->h) - (x->h < y->h);
    return (x->cl > y->cl) - (x->cl < y->cl);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Cross-validation folds of the labelled pairs: whole clusters (the run's unit) to a fold, so that
 * under prompt, scene or culture no prompt is both calibrated on and judged; the clusters in a
 * seeded hash order (of their ids' little-endian bytes: the same folds on every machine), dealt
 * round-robin to min(5, clusters) folds so that every fold holds some. Returns K, -1 when out of
 * memory. */
static int cv_folds(const int *pc, int k, uint64_t seed, int *fold) {
    int *ids = malloc((size_t)(k + 1) * sizeof *ids), *rank = malloc((size_t)(k + 1) * sizeof *rank);
    hashed_cl *u = malloc((size_t)(k + 1) * sizeof *u);
    if (!ids || !rank || !u) {
        free(ids), free(rank), free(u);
        return -1;
    }
    memcpy(ids, pc, (size_t)k * sizeof *ids);
    qsort(ids, (size_t)k, sizeof *ids, cmp_int);
    int nu = 0;
    for (int i = 0; i < k; i++) /* the distinct clusters, ascending */
        if (!nu || ids[nu - 1] != ids[i]) ids[nu++] = ids[i];
    for (int j = 0; j < nu; j++) {
        unsigned char b[12];
        for (int t = 0; t < 4; t++) b[t] = (unsigned char)((uint32_t)ids[j] >> (8 * t));
        for (int t = 0; t < 8; t++) b[4 + t] = (unsigned char)(seed >> (8 * t));
        u[j].h = kiln_fnv1a64(KILN_FNV1A64_INIT, b, sizeof b), u[j].cl = ids[j];
    }
    qsort(u, (size_t)nu, sizeof *u, cmp_hashed);
    int K = nu < 5 ? nu : 5;
    for (int j = 0; j < nu; j++) { /* rank[position of u[j].cl among ids] = j */
        const int *at = bsearch(&u[j].cl, ids, (size_t)nu, sizeof *ids, cmp_int);
        rank[at - ids] = j;
    }
    for (int i = 0; i < k; i++) {
        const int *at = bsearch(&pc[i], ids, (size_t)nu, sizeof *ids, cmp_int);
        fold[i] = rank[at - ids] % K;
    }
    free(ids), free(rank), free(u);
    return K;
}

/* Judge vs labels at threshold t over the labelled pairs. */
static void agree_at(row *rows, int n, double t, kiln_cis_agreement *a) {
    int cap = 0, k = 0;
    for (int i = 0; i < n; i++) cap += rows[i].p ? rows[i].ncomp : 0;
    int *pred = malloc((size_t)(cap + 1) * sizeof *pred), *truth = malloc((size_t)(cap + 1) * sizeof *truth);
    if (pred && truth)
        for (int i = 0; i < n; i++)
            for (int c = 0; rows[i].p && c < rows[i].ncomp; c++)
                if (rows[i].label[c] >= 0) pred[k] = rows[i].prob[c] >= t, truth[k] = rows[i].label[c], k++;
    kiln_cis_agree(pred, truth, k, a);
    free(pred), free(truth);
}

/* ---- an object detector's output ---- */

/* Each scored row's pdet from the detections file (the components with a COCO class: the
 * detector's highest score for it in that image, 0 where it found none). */
static kiln_error *detector_scores(row *rows, int n, const char *path, cis_detections *det) {
    KILN_TRY(cis_detections_load(path, det));
    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        if (!r->p) continue;
        if (!(r->pdet = malloc((size_t)r->ncomp * sizeof *r->pdet))) return kiln_errorf(KILN_ENOMEM, "out of memory");
        for (int c = 0; c < r->ncomp; c++)
            r->pdet[c] = r->p->comp[c].coco ? cis_detections_score(det, rstr(r->rec, "image"), r->p->comp[c].coco) : NAN;
    }
    return NULL;
}

/* The detector beside the judge: how often each says a COCO-classed component is there, and how
 * well they agree (and each with the labels). Sets the rows' det and det_clip. */
static cJSON *detector_json(row *rows, int n, const cis_detections *det, const char *path, double thr, int labelled) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "detections", path);
    cJSON_AddNumberToObject(o, "threshold", thr);
    cJSON_AddNumberToObject(o, "lines", det->lines);
    /* the detections' images that are no scored image of the run (a detector run over other files) */
    int unmatched = 0, distinct = 0;
    const char **img = malloc((size_t)(n + 1) * sizeof *img);
    int k = 0, cap = 0;
    for (int i = 0; i < n; i++) cap += rows[i].p ? rows[i].ncomp : 0;
    int *pc = malloc((size_t)(cap + 1) * sizeof *pc), *pd = malloc((size_t)(cap + 1) * sizeof *pd),
        *pl = malloc((size_t)(cap + 1) * sizeof *pl), *qd = malloc((size_t)(cap + 1) * sizeof *qd);
    if (!img || !pc || !pd || !pl || !qd) {
        free(img), free(pc), free(pd), free(pl), free(qd);
        cJSON_Delete(o);
        return NULL;
    }
    int ni = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].p) img[ni++] = rstr(rows[i].rec, "image");
    qsort(img, (size_t)ni, sizeof *img, cmp_str);
    for (int i = 0; i < det->n; i++) {
        if (i && !strcmp(det->d[i - 1].image, det->d[i].image)) continue;
        distinct++;
        unmatched += !bsearch(&det->d[i].image, img, (size_t)ni, sizeof *img, cmp_str);
    }
    int without = 0; /* the run's images the file says nothing about (0 for all its classes, or another path) */
    for (int i = 0; i < ni; i++) without += !cis_detections_has_image(det, img[i]);
    cJSON_AddNumberToObject(o, "images", distinct);
    cJSON_AddNumberToObject(o, "unmatched_images", unmatched);
    cJSON_AddNumberToObject(o, "run_images_without_detections", without);
    int kl = 0;
    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        r->det = r->det_clip = NAN;
        if (!r->p) continue;
        int m = 0, nd = 0, nc = 0;
        for (int c = 0; c < r->ncomp; c++) {
            if (isnan(r->pdet[c])) continue;
            int d = r->pdet[c] >= thr;
            m++, nd += d, nc += r->verdict[c];
            pc[k] = r->verdict[c], pd[k++] = d;
            if (r->label[c] >= 0) qd[kl] = d, pl[kl++] = r->label[c];
        }
        if (m) r->det = (double)nd / m, r->det_clip = (double)nc / m;
    }
    cJSON_AddNumberToObject(o, "pairs", k);
    kiln_cis_agreement a;
    kiln_cis_agree(pc, pd, k, &a); /* CLIP's verdicts against the detector's */
    cJSON_AddItemToObject(o, "clip_vs_detector", agreement_json(&a));
    if (labelled) {
        kiln_cis_agree(qd, pl, kl, &a); /* the detector's against the labels */
        cJSON *x = agreement_json(&a);
        cJSON_AddNumberToObject(x, "pairs", kl);
        cJSON_AddItemToObject(o, "detector_vs_labels", x);
    }
    free(img), free(pc), free(pd), free(pl), free(qd);
    return o;
}

static kiln_error *csv_write(cis_buf *b, const char *dir, const char *name) {
    char *path = kiln_path_join(dir, name);
    kiln_error *e = path ? cis_buf_write(b, path) : kiln_errorf(KILN_ENOMEM, "out of memory");
    free(path);
    return e;
}

kiln_error *kiln_cis_aggregate(const kiln_cis_score_opts *o) {
    const char *dir = o->out_dir;
    char *rj = kiln_path_join(dir, "run.json"), *sj = kiln_path_join(dir, "suite.jsonl"),
         *ej = kiln_path_join(dir, "embeddings.json"), *out = kiln_path_join(dir, "scores.json");
    cJSON *run = NULL, *emb = NULL, *root = NULL;
    kiln_cis_suite suite = {0, NULL};
    cis_results res = {0};
    cis_detections det = {0, 0, NULL};
    cis_run_keep keep = {"", NULL, 0, NULL, 0}; /* run.json's unit, detector and labels (cis_run_keep_read) */
    char *labels_path = NULL, *labels_text = NULL; /* the labels read: the command line's, else the run's copy */
    size_t labels_len = 0;
    int as_judge = o->labels_as_judge, dropped = 0;
    cis_stop = o->stop;
    row *rows = NULL;
    cis_buf summary = {0}, images = {0}, comps = {0}, sup = {0};
    kiln_error *e = NULL;
    if (!rj || !sj || !ej || !out) {
        e = kiln_errorf(KILN_ENOMEM, "out of memory");
        goto done;
    }
    if ((e = kiln_json_parse_file(rj, &run)) || (e = kiln_cis_suite_load(sj, &suite)) ||
        (e = kiln_json_parse_file(ej, &emb)) || (e = cis_read_results(dir, &res)) ||
        (e = keep_manifest_records(dir, &res, &dropped)))
        goto done;
    params pr;
    int64_t boot, perm, seed;
    if ((e = kiln_json_get_int(run, "bootstrap", &boot, 2000, 0, rj)) ||
        (e = kiln_json_get_int(run, "permutations", &perm, 10000, 0, rj)) ||
        (e = kiln_json_get_int(run, "seed", &seed, 0, 0, rj)) ||
        (e = kiln_json_get_double(run, "threshold", &pr.threshold, 0.5, 0, rj)))
        goto done;
    if (boot < 1 || boot > INT32_MAX || perm < 1 || perm > INT32_MAX || seed < 0 || seed > CIS_SEED_MAX) {
        e = kiln_errorf(KILN_EFORMAT, "%s: bootstrap, permutations or seed out of range", rj);
        goto done;
    }
    pr.boot = (int)boot, pr.perm = (int)perm, pr.seed = (uint64_t)seed;
    if ((e = cis_run_keep_read(run, rj, &keep))) goto done;
    pr.unit = keep.unit;
    /* the labels: the command line's (and from now on the run's: a resume or another aggregation keeps
     * the calibration), else the run's copy of those it was calibrated with */
    if (o->labels) {
        if ((e = kiln_read_file(o->labels, &labels_text, &labels_len))) goto done;
        labels_path = kiln_path_join(dir, "labels.jsonl");
        free(keep.labels);
        if (!labels_path || !(keep.labels = cis_strdup(o->labels))) {
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
        keep.labels_as_judge = o->labels_as_judge;
        cJSON_ReplaceItemInObjectCaseSensitive(run, "labels", cJSON_CreateString(o->labels));
        if (!cJSON_GetObjectItemCaseSensitive(run, "labels")) cJSON_AddStringToObject(run, "labels", o->labels);
        cJSON_DeleteItemFromObjectCaseSensitive(run, "labels_as_judge");
        cJSON_AddBoolToObject(run, "labels_as_judge", o->labels_as_judge != 0);
    } else if (keep.labels) {
        char *copy = kiln_path_join(dir, "labels.jsonl");
        e = copy ? kiln_read_file(copy, &labels_text, &labels_len) : kiln_errorf(KILN_ENOMEM, "out of memory");
        free(copy);
        if (e) goto done;
        as_judge = keep.labels_as_judge;
    }

    int n = res.n, nerr = 0;
    rows = calloc((size_t)(n ? n : 1), sizeof *rows);
    if (!rows) {
        e = kiln_errorf(KILN_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        r->rec = res.rec[i];
        r->mis = NAN;
        if (!cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r->rec, "error"))) {
            nerr++;
            continue;
        }
        int pi = kiln_cis_suite_find(&suite, rstr(r->rec, "prompt_id"));
        const cJSON *cs = cJSON_GetObjectItemCaseSensitive(r->rec, "components");
        if (pi < 0 || !cJSON_IsArray(cs) || cJSON_GetArraySize(cs) != suite.p[pi].ncomp) {
            e = kiln_errorf(KILN_EFORMAT, "%s/results: the record of image '%s' does not match the run's suite", dir,
                            rstr(r->rec, "image"));
            goto done;
        }
        r->p = &suite.p[pi];
        r->ncomp = r->p->ncomp;
        snprintf(r->cx, sizeof r->cx, "%d", r->ncomp);
        r->prob = calloc((size_t)r->ncomp, sizeof *r->prob);
        r->entropy = calloc((size_t)r->ncomp, sizeof *r->entropy);
        r->label = malloc((size_t)r->ncomp * sizeof *r->label);
        r->verdict = calloc((size_t)r->ncomp, sizeof *r->verdict);
        if (!r->prob || !r->entropy || !r->label || !r->verdict) {
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
        int c = 0;
        for (const cJSON *x = cs->child; x; x = x->next, c++) {
            r->prob[c] = rnum(x, "p");
            r->entropy[c] = rnum(x, "entropy");
            r->label[c] = -1;
        }
        r->mis = rnum(r->rec, "generic_sim") - rnum(r->rec, "context_sim");
    }
    if ((e = assign_clusters(rows, n, pr.unit))) goto done;
    if (keep.detections) { /* the run's copy (score wrote it): the original may have moved */
        char *dpath = kiln_path_join(dir, "detections.jsonl");
        e = dpath ? detector_scores(rows, n, dpath, &det) : kiln_errorf(KILN_ENOMEM, "out of memory");
        free(dpath);
        if (e) goto done;
    }

    root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "run", cJSON_Duplicate(run, 1));
    cJSON *counts = cJSON_AddObjectToObject(root, "counts");
    cJSON_AddNumberToObject(counts, "images", n);
    cJSON_AddNumberToObject(counts, "scored", n - nerr);
    cJSON_AddNumberToObject(counts, "errors", nerr);
    /* records of images the run's manifest no longer lists (or lists with another prompt id, model or seed) */
    cJSON_AddNumberToObject(counts, "not_in_manifest", dropped);

    /* labels: calibrate the threshold, measure the judge, or replace it */
    double thr = pr.threshold;
    const char *thr_source = "default";
    if (labels_text) {
        label_ctx lc = {rows, n, 0, 0};
        if ((e = cis_jsonl_each(labels_text, labels_len, o->labels ? o->labels : keep.labels, apply_label, &lc)))
            goto done;
        int cap = 0, k = 0;
        for (int i = 0; i < n; i++) cap += rows[i].ncomp;
        double *sc = malloc((size_t)(cap + 1) * sizeof *sc);
        int *lb = malloc((size_t)(cap + 1) * sizeof *lb), *pc = malloc((size_t)(cap + 1) * sizeof *pc),
            *fold = malloc((size_t)(cap + 1) * sizeof *fold);
        if (!sc || !lb || !pc || !fold) {
            free(sc), free(lb), free(pc), free(fold);
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < n; i++)
            for (int c = 0; c < rows[i].ncomp; c++)
                if (rows[i].label[c] >= 0) sc[k] = rows[i].prob[c], lb[k] = rows[i].label[c], pc[k] = rows[i].cl, k++;
        cJSON *cal = cJSON_AddObjectToObject(root, "calibration");
        cJSON_AddStringToObject(cal, "labels", keep.labels);
        cJSON_AddNumberToObject(cal, "pairs", k);
        cJSON_AddNumberToObject(cal, "unmatched_labels", lc.unmatched);
        cJSON_AddBoolToObject(cal, "labels_as_judge", as_judge != 0);
        double t, j;
        if (!kiln_cis_calibrate(sc, lb, k, &t, &j)) {
            thr = t;
            thr_source = "calibrated";
            cJSON_AddNumberToObject(cal, "threshold", t);
            cJSON_AddNumberToObject(cal, "youden_j", j);
        } else {
            cJSON_AddNullToObject(cal, "threshold");
            cJSON_AddStringToObject(cal, "note", "labels of one class only: the default threshold is kept");
        }
        kiln_cis_agreement a;
        agree_at(rows, n, thr, &a);
        cJSON_AddItemToObject(cal, "agreement", agreement_json(&a));
        agree_at(rows, n, pr.threshold, &a);
        cJSON_AddItemToObject(cal, "agreement_at_default", agreement_json(&a));
        /* the agreement above is in sample (the threshold was fitted on those labels); this one is not */
        double thr_f[5];
        int K = cv_folds(pc, k, pr.seed, fold);
        if (K < 0) {
            free(sc), free(lb), free(pc), free(fold);
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
        if (K >= 2 && kiln_cis_cv_agreement(sc, lb, fold, k, K, pr.threshold, thr_f, &a) >= 2) {
            cJSON *cv = agreement_json(&a);
            cJSON_AddNumberToObject(cv, "folds", K);
            cJSON_AddStringToObject(cv, "fold_unit", pr.unit);
            cJSON *ta = cJSON_AddArrayToObject(cv, "thresholds");
            for (int f = 0; f < K; f++) cJSON_AddItemToArray(ta, cJSON_CreateNumber(thr_f[f]));
            cJSON_AddItemToObject(cal, "agreement_cross_validated", cv);
        } else {
            cJSON_AddNullToObject(cal, "agreement_cross_validated"); /* labels from one cluster */
        }
        free(sc), free(lb), free(pc), free(fold);
    }
    cJSON_AddNumberToObject(root, "threshold", thr);
    cJSON_AddStringToObject(root, "threshold_source", thr_source);
    cJSON_AddStringToObject(root, "cluster", pr.unit); /* what the CIs and p-values resampled */

    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        if (!r->p) continue;
        int present = 0;
        for (int c = 0; c < r->ncomp; c++) {
            r->verdict[c] = as_judge && r->label[c] >= 0 ? r->label[c] : r->prob[c] >= thr;
            present += r->verdict[c];
        }
        r->cis = (double)present / r->ncomp;
    }
    if (keep.detections) {
        cJSON *dj = detector_json(rows, n, &det, keep.detections, keep.det_threshold, labels_text != NULL);
        if (!dj) {
            e = kiln_errorf(KILN_ENOMEM, "out of memory");
            goto done;
        }
        cJSON_AddItemToObject(root, "detector", dj);
    } else {
        cJSON_AddNullToObject(root, "detector");
    }

    CIS_PUT(&summary, "section,by,level,n,estimate,ci_lo,ci_hi,p_value,clusters,p_holm\n");
    by_dims(cJSON_AddArrayToObject(root, "cis"), &summary, "cis", rows, n, v_cis, &pr, NDIMS);
    cJSON *ga = cJSON_AddArrayToObject(root, "gap");
    gaps(ga, &summary, rows, n, &dims[0], &pr);
    gaps(ga, &summary, rows, n, &dims[5], &pr); /* setting */
    gaps(ga, &summary, rows, n, &dims[1], &pr); /* model */
    gaps(ga, &summary, rows, n, &dims[4], &pr); /* category */
    if (model_diffs(cJSON_AddArrayToObject(root, "model_diff"), &summary, rows, n, &pr)) {
        e = kiln_errorf(KILN_ENOMEM, "out of memory");
        goto done;
    }
    cJSON *fr = cJSON_AddArrayToObject(root, "fragility");
    fragility(fr, &summary, rows, n, &dims[0], &pr);
    fragility(fr, &summary, rows, n, &dims[3], &pr); /* group */
    fragility(fr, &summary, rows, n, &dims[1], &pr); /* model */
    /* fragility curves: mean CIS per (group, complexity) */
    cJSON *cu = cJSON_AddArrayToObject(root, "curves");
    {
        const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
        double *v = malloc((size_t)(n + 1) * sizeof *v);
        int *cl = malloc((size_t)(n + 1) * sizeof *cl);
        if (lv && v && cl) {
            int nl = levels(rows, n, d_complexity, lv);
            const char *grp[2] = {"non_western", "western"};
            for (int gi = 0; gi < 2; gi++)
                for (int l = 0; l < nl; l++) {
                    int k = 0;
                    for (int i = 0; i < n; i++)
                        if (rows[i].p && !strcmp(rows[i].p->group, grp[gi]) && !strcmp(rows[i].cx, lv[l]))
                            v[k] = rows[i].cis, cl[k++] = rows[i].cl;
                    if (k) add_mean(cu, &summary, "curve", grp[gi], lv[l], v, cl, k, &pr);
                }
        }
        free(lv), free(v), free(cl);
    }
    by_dims(cJSON_AddArrayToObject(root, "misalignment"), &summary, "misalignment", rows, n, v_mis, &pr, 4);
    if (keep.detections) { /* the COCO-classed components found by the detector, and by CLIP */
        by_dims(cJSON_AddArrayToObject(root, "detector_inclusion"), &summary, "detector", rows, n, v_det, &pr, 4);
        by_dims(cJSON_AddArrayToObject(root, "clip_inclusion_coco"), &summary, "clip_coco", rows, n, v_det_clip, &pr, 4);
    }
    /* grounding entropy over components: by group, culture and verdict */
    cJSON *gr = cJSON_AddArrayToObject(root, "grounding");
    {
        int cap = 0;
        for (int i = 0; i < n; i++) cap += rows[i].ncomp;
        /* an image's components share its cluster (one image, one prompt) */
        double *v = malloc((size_t)(cap + 1) * sizeof *v);
        int *cl = malloc((size_t)(cap + 1) * sizeof *cl);
        const char **lv = malloc((size_t)(n + 1) * sizeof *lv);
        if (v && cl && lv) {
            for (int d = 0; d < 4; d++) {
                if (d == 1) continue; /* model: not needed here */
                int nl = levels(rows, n, dims[d].fn, lv);
                for (int l = 0; l < nl; l++) {
                    int k = 0;
                    for (int i = 0; i < n; i++)
                        for (int c = 0; rows[i].p && c < rows[i].ncomp; c++)
                            if (!strcmp(dims[d].fn(&rows[i]), lv[l]) && !isnan(rows[i].entropy[c]))
                                v[k] = rows[i].entropy[c], cl[k++] = rows[i].cl;
                    if (k) add_mean(gr, &summary, "grounding", dims[d].name, lv[l], v, cl, k, &pr);
                }
            }
            for (int want = 0; want < 2; want++) {
                int k = 0;
                for (int i = 0; i < n; i++)
                    for (int c = 0; rows[i].p && c < rows[i].ncomp; c++)
                        if (rows[i].verdict[c] == want && !isnan(rows[i].entropy[c]))
                            v[k] = rows[i].entropy[c], cl[k++] = rows[i].cl;
                if (k) add_mean(gr, &summary, "grounding", "verdict", want ? "present" : "absent", v, cl, k, &pr);
            }
        }
        free(v), free(cl), free(lv);
    }
    cJSON_AddItemToObject(root, "superposition", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(emb, "superposition"), 1));
    cJSON_AddItemToObject(root, "pca", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(emb, "pca"), 1));

    /* per image */
    cJSON *ia = cJSON_AddArrayToObject(root, "images"), *ea = cJSON_AddArrayToObject(root, "errors");
    CIS_PUT(&images, "image,prompt_id,model,seed,culture,group,category,setting,complexity,present,cis,context_sim,generic_sim,misalignment,error\n");
    CIS_PUT(&comps, "image,prompt_id,model,component,p,p_whole,view,present,label,entropy,coco,p_det\n");
    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        const char *img = rstr(r->rec, "image"), *pid = rstr(r->rec, "prompt_id"), *model = rstr(r->rec, "model");
        double seedv = rnum(r->rec, "seed"); /* an integer below 2^53 (the manifest's limit): exact */
        csv_field(&images, img), CIS_PUT(&images, ","), csv_field(&images, pid), CIS_PUT(&images, ",");
        csv_field(&images, model);
        cis_buf_printf(&images, ",%lld,", (long long)seedv);
        if (!r->p) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "image", img);
            cJSON_AddStringToObject(x, "prompt_id", pid);
            cJSON_AddStringToObject(x, "model", model);
            cJSON_AddStringToObject(x, "error", rstr(r->rec, "error"));
            cJSON_AddItemToArray(ea, x);
            CIS_PUT(&images, ",,,,,,,,,,");
            csv_field(&images, rstr(r->rec, "error"));
            CIS_PUT(&images, "\n");
            continue;
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "image", img);
        cJSON_AddStringToObject(x, "path", rstr(r->rec, "path"));
        cJSON_AddStringToObject(x, "prompt_id", pid);
        cJSON_AddStringToObject(x, "model", model);
        cJSON_AddNumberToObject(x, "seed", seedv);
        cJSON_AddStringToObject(x, "culture", r->p->culture);
        cJSON_AddStringToObject(x, "group", r->p->group);
        cJSON_AddStringToObject(x, "category", r->p->category);
        cJSON_AddStringToObject(x, "setting", r->p->setting);
        cJSON_AddNumberToObject(x, "complexity", r->ncomp);
        cJSON_AddNumberToObject(x, "cis", r->cis);
        cJSON_AddNumberToObject(x, "misalignment", r->mis);
        cJSON *xc = cJSON_AddArrayToObject(x, "components");
        int present = 0;
        const cJSON *cs = cJSON_GetObjectItemCaseSensitive(r->rec, "components")->child;
        for (int c = 0; c < r->ncomp; c++, cs = cs->next) {
            present += r->verdict[c];
            cJSON *y = cJSON_CreateObject();
            cJSON_AddStringToObject(y, "phrase", r->p->comp[c].phrase);
            cJSON_AddNumberToObject(y, "p", r->prob[c]);
            cJSON_AddBoolToObject(y, "present", r->verdict[c]);
            if (r->label[c] >= 0) cJSON_AddBoolToObject(y, "label", r->label[c]);
            else cJSON_AddNullToObject(y, "label");
            cJSON_AddNumberToObject(y, "entropy", r->entropy[c]);
            if (r->p->comp[c].coco) cJSON_AddStringToObject(y, "coco", r->p->comp[c].coco);
            else cJSON_AddNullToObject(y, "coco");
            cJSON_AddNumberToObject(y, "p_det", r->pdet ? r->pdet[c] : NAN);
            cJSON_AddItemToArray(xc, y);
            csv_field(&comps, img), CIS_PUT(&comps, ","), csv_field(&comps, pid), CIS_PUT(&comps, ",");
            csv_field(&comps, model), CIS_PUT(&comps, ","), csv_field(&comps, r->p->comp[c].phrase);
            CIS_PUT(&comps, ","), csv_num(&comps, r->prob[c]), CIS_PUT(&comps, ",");
            csv_num(&comps, rnum(cs, "p_whole"));
            cis_buf_printf(&comps, ",%.0f,%d,%s,", rnum(cs, "view"), r->verdict[c],
                           r->label[c] < 0 ? "" : r->label[c] ? "1" : "0");
            csv_num(&comps, r->entropy[c]), CIS_PUT(&comps, ",");
            if (r->p->comp[c].coco) csv_field(&comps, r->p->comp[c].coco);
            CIS_PUT(&comps, ","), csv_num(&comps, r->pdet ? r->pdet[c] : NAN), CIS_PUT(&comps, "\n");
        }
        cJSON_AddItemToArray(ia, x);
        csv_field(&images, r->p->culture), CIS_PUT(&images, ","), csv_field(&images, r->p->group);
        CIS_PUT(&images, ","), csv_field(&images, r->p->category), CIS_PUT(&images, ",");
        csv_field(&images, r->p->setting);
        cis_buf_printf(&images, ",%d,%d,", r->ncomp, present);
        csv_num(&images, r->cis), CIS_PUT(&images, ",");
        csv_num(&images, rnum(r->rec, "context_sim")), CIS_PUT(&images, ",");
        csv_num(&images, rnum(r->rec, "generic_sim")), CIS_PUT(&images, ",");
        csv_num(&images, r->mis), CIS_PUT(&images, ",\n");
    }
    CIS_PUT(&sup, "phrase,culture,group,category,cos_generic,cos_western_mean,cos_western_max\n");
    for (const cJSON *s = cJSON_GetObjectItemCaseSensitive(emb, "superposition")->child; s; s = s->next) {
        csv_field(&sup, rstr(s, "phrase")), CIS_PUT(&sup, ","), csv_field(&sup, rstr(s, "culture"));
        CIS_PUT(&sup, ","), csv_field(&sup, rstr(s, "group")), CIS_PUT(&sup, ",");
        csv_field(&sup, rstr(s, "category")), CIS_PUT(&sup, ",");
        csv_num(&sup, rnum(s, "cos_generic")), CIS_PUT(&sup, ",");
        csv_num(&sup, rnum(s, "cos_western_mean")), CIS_PUT(&sup, ",");
        csv_num(&sup, rnum(s, "cos_western_max")), CIS_PUT(&sup, "\n");
    }
    if (o->stop && *o->stop) { /* the statistics were cut short: the previous outputs stay as they were */
        e = kiln_errorf(KILN_EINVAL, "interrupted while aggregating; the scored results are kept: `kiln cis score "
                                     "--resume` (or `kiln cis calibrate`) aggregates them again");
        goto done;
    }
    if (o->labels) { /* the run remembers its calibration (after every check: a bad file changes nothing) */
        char *rtxt = kiln_json_print(run, 1);
        if (!rtxt) e = kiln_errorf(KILN_ENOMEM, "out of memory");
        else if (!(e = kiln_write_file_atomic(labels_path, labels_text, labels_len)))
            e = kiln_write_file_atomic(rj, rtxt, strlen(rtxt));
        free(rtxt);
        if (e) goto done;
    }
    char *txt = kiln_json_print(root, 1);
    if (!txt) e = kiln_errorf(KILN_ENOMEM, "out of memory");
    else e = kiln_write_file_atomic(out, txt, strlen(txt));
    free(txt);
    if (!e) e = csv_write(&summary, dir, "summary.csv");
    if (!e) e = csv_write(&images, dir, "images.csv");
    if (!e) e = csv_write(&comps, dir, "components.csv");
    if (!e) e = csv_write(&sup, dir, "superposition.csv");
done:
    for (int i = 0; rows && i < res.n; i++)
        free(rows[i].prob), free(rows[i].entropy), free(rows[i].label), free(rows[i].verdict), free(rows[i].pdet);
    cis_stop = NULL;
    cis_detections_free(&det);
    cis_run_keep_free(&keep);
    free(labels_path), free(labels_text);
    free(rows);
    cis_buf_free(&summary), cis_buf_free(&images), cis_buf_free(&comps), cis_buf_free(&sup);
    cis_results_free(&res);
    kiln_cis_suite_free(&suite);
    cJSON_Delete(run), cJSON_Delete(emb), cJSON_Delete(root);
    free(rj), free(sj), free(ej), free(out);
    return e;
}
