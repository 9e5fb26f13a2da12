/* kiln cis report RUN/ --out report.html: one HTML page from RUN/scores.json with SVG charts
 * drawn here (per-culture CIS with CI bars, the gap by setting, fragility curves, the PCA of
 * component text embeddings), tables of every aggregate, and example images per culture with
 * their component verdicts (thumbnails by relative path to the images). No scripts. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

#define C_WEST "#3b6fb6"
#define C_NONWEST "#d9822b"

static const char *jstr(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsString(v) ? v->valuestring : "";
}
static double jnum(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}
static const cJSON *jget(const cJSON *o, const char *f) { return cJSON_GetObjectItemCaseSensitive(o, f); }

static void num(cis_buf *b, double v, int prec) {
    if (isnan(v)) CIS_PUT(b, "&ndash;");
    else cis_buf_printf(b, "%.*f", prec, v);
}

/* v with %.*f, or "n/a" where it does not exist (a CI of one cluster, the p of a gap with one group): for the %s of a
 * title or table cell, which would otherwise read "nan". buf: at least 48 bytes. */
static const char *fx(char *buf, double v, int prec) {
    if (isnan(v)) return "n/a";
    snprintf(buf, 48, "%.*f", prec, v);
    return buf;
}
/* the same with %.4g (p-values) */
static const char *gx(char *buf, double v) {
    if (isnan(v)) return "n/a";
    snprintf(buf, 48, "%.4g", v);
    return buf;
}

/* (cis_internal.h) A '#' in a thumbnail's path began a fragment, a '?' a query. */
void cis_buf_url_path(cis_buf *b, const char *p) {
    for (; *p; p++) {
        const unsigned char c = (unsigned char)*p;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-_.~/", c))
            cis_buf_printf(b, "%c", c);
        else cis_buf_printf(b, "%%%02X", c);
    }
}

/* The entry of arr with by == by and level == level. */
static const cJSON *find(const cJSON *arr, const char *by, const char *level) {
    for (const cJSON *x = arr ? arr->child : NULL; x; x = x->next)
        if (!strcmp(jstr(x, "by"), by) && !strcmp(jstr(x, "level"), level)) return x;
    return NULL;
}

static void svg_open(cis_buf *b, int w, int h, const char *label) {
    cis_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "role=\"img\" aria-label=\"", w, h, w, h);
    cis_buf_html(b, label);
    CIS_PUT(b, "\">\n");
}

/* A horizontal axis from 0 to 1 at the bottom of a plot area. */
static void x_axis01(cis_buf *b, double x0, double x1, double y, const char *title) {
    cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x0, y, x1, y);
    for (int t = 0; t <= 5; t++) {
        double x = x0 + (x1 - x0) * t / 5;
        cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%.1f</text>\n",
                       x, y, x, y + 4, x, y + 16, t / 5.0);
    }
    cis_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">", (x0 + x1) / 2, y + 32);
    cis_buf_html(b, title);
    CIS_PUT(b, "</text>\n");
}

/* The model comparisons as a forest plot: each difference with its CI on a scale symmetric about 0. */
static void chart_model_diff(cis_buf *b, const cJSON *md) {
    int n = cJSON_GetArraySize(md);
    if (n <= 0) return;
    double R = 0.05;
    for (const cJSON *x = md->child; x; x = x->next) {
        const double v[3] = {jnum(x, "diff"), jnum(x, "lo"), jnum(x, "hi")};
        for (int k = 0; k < 3; k++)
            if (isfinite(v[k]) && fabs(v[k]) > R) R = fabs(v[k]);
    }
    R = ceil(R * 10 - 1e-9) / 10; /* a round scale: 0.1, 0.2, ... */
    int W = 720, row = 24, top = 10, left = 160, right = 40, H = top + n * row + 50;
    svg_open(b, W, H, "paired differences in mean CIS between models, with 95% CIs");
    double x0 = left, x1 = W - right, y1 = top + n * row;
#define XOF(v) (x0 + (x1 - x0) * ((v) + R) / (2 * R))
    cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n",
                   XOF(0), top, XOF(0), y1);
    int i = 0;
    for (const cJSON *x = md->child; x; x = x->next, i++) {
        double y = top + i * row + row / 2.0, m = jnum(x, "diff"), lo = jnum(x, "lo"), hi = jnum(x, "hi");
        cis_buf_printf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">", left - 6, y + 4);
        cis_buf_html(b, jstr(x, "a"));
        CIS_PUT(b, " &minus; ");
        cis_buf_html(b, jstr(x, "b"));
        CIS_PUT(b, "</text>\n");
        if (isfinite(lo) && isfinite(hi))
            cis_buf_printf(b, "<line class=\"ci\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#111\" "
                              "stroke-width=\"1.5\"/>\n", XOF(lo), y, XOF(hi), y);
        if (isfinite(m))
        {
            char f1[48], f2[48], f4[48];
            cis_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"><title>%.3f [%s, %s], p = %s"
                              "</title></circle>\n", XOF(m), y, C_WEST, m, fx(f1, lo, 3), fx(f2, hi, 3), gx(f4, jnum(x, "p")));
        }
    }
    cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x0, y1, x1, y1);
    for (int t = -2; t <= 2; t++)
        cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%+.2f</text>\n",
                       XOF(t * R / 2), y1, XOF(t * R / 2), y1 + 4, XOF(t * R / 2), y1 + 16, t * R / 2);
#undef XOF
    cis_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">difference in mean CIS "
                      "(a &minus; b), paired over the run's units</text>\n</svg>\n", (x0 + x1) / 2, y1 + 32);
}

/* Per-culture mean CIS with 95% CI bars, Western cultures first. */
static void chart_cultures(cis_buf *b, const cJSON *s) {
    const cJSON *cis = jget(s, "cis");
    int n = 0;
    for (const cJSON *x = cis ? cis->child : NULL; x; x = x->next) n += !strcmp(jstr(x, "by"), "culture");
    if (!n) return;
    /* each culture's group from the images */
    int W = 720, row = 22, top = 10, left = 140, right = 40, H = top + n * row + 50;
    svg_open(b, W, H, "mean CIS per culture with 95% bootstrap CI");
    double x0 = left, x1 = W - right;
    int i = 0;
    for (int pass = 0; pass < 2; pass++)
        for (const cJSON *x = cis->child; x; x = x->next) {
            if (strcmp(jstr(x, "by"), "culture")) continue;
            const char *grp = "";
            for (const cJSON *im = jget(s, "images") ? jget(s, "images")->child : NULL; im && !*grp; im = im->next)
                if (!strcmp(jstr(im, "culture"), jstr(x, "level"))) grp = jstr(im, "group");
            int west = !strcmp(grp, "western");
            if (west != (pass == 0)) continue;
            double y = top + i * row, m = jnum(x, "mean"), lo = jnum(x, "lo"), hi = jnum(x, "hi");
            cis_buf_printf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">", left - 6, y + 15);
            cis_buf_html(b, jstr(x, "level"));
            cis_buf_printf(b, "</text><rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\">"
                              "<title>", x0, y + 4, (x1 - x0) * (isnan(m) ? 0 : m), row - 8, west ? C_WEST : C_NONWEST);
            cis_buf_html(b, jstr(x, "level"));
            char f0[48], f1[48], f2[48];
            cis_buf_printf(b, ": %s [%s, %s], n=%d</title></rect>\n", fx(f0, m, 3), fx(f1, lo, 3), fx(f2, hi, 3),
                           (int)jnum(x, "n"));
            if (!isnan(lo))
                cis_buf_printf(b, "<line class=\"ci\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#111\" "
                                  "stroke-width=\"1.5\"/>\n", x0 + (x1 - x0) * lo, y + row / 2.0, x0 + (x1 - x0) * hi,
                               y + row / 2.0);
            i++;
        }
    x_axis01(b, x0, x1, top + n * row + 2, "mean CIS (components present / required), 95% CI");
    CIS_PUT(b, "</svg>\n");
}

/* Western and non-Western mean CIS overall and per setting. */
static void chart_gap(cis_buf *b, const cJSON *s) {
    const char *lv[3][2] = {{"all", "all"}, {"setting", "historical"}, {"setting", "modern"}};
    int W = 720, top = 10, left = 140, right = 40, row = 20, H = top + 3 * (2 * row + 12) + 50;
    svg_open(b, W, H, "Western vs non-Western CIS by setting");
    double x0 = left, x1 = W - right;
    double y = top;
    for (int k = 0; k < 3; k++) {
        const cJSON *g = find(jget(s, "gap"), lv[k][0], lv[k][1]);
        cis_buf_printf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">%s</text>\n", left - 6,
                       y + row + 4, lv[k][1]);
        for (int w = 0; w < 2; w++) {
            double m = g ? jnum(g, w ? "western" : "non_western") : NAN;
            char f0[48];
            cis_buf_printf(b, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\">"
                              "<title>%s %s: %s</title></rect>\n", x0, y + w * row, (x1 - x0) * (isnan(m) ? 0 : m),
                           row - 4, w ? C_WEST : C_NONWEST, lv[k][1], w ? "western" : "non-western", fx(f0, m, 3));
        }
        if (g) {
            char f0[48], f1[48];
            cis_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">gap %s, p = %s</text>\n",
                           x1, y + 2 * row + 6, fx(f0, jnum(g, "gap"), 3), gx(f1, jnum(g, "p")));
        }
        y += 2 * row + 12;
    }
    x_axis01(b, x0, x1, y, "mean CIS (orange: non-Western, blue: Western)");
    CIS_PUT(b, "</svg>\n");
}

/* Mean CIS against complexity for each group, with CI bars. */
static void chart_fragility(cis_buf *b, const cJSON *s) {
    const cJSON *cu = jget(s, "curves");
    int kmax = 1;
    for (const cJSON *x = cu ? cu->child : NULL; x; x = x->next) {
        int k = atoi(jstr(x, "level"));
        if (k > kmax) kmax = k;
    }
    int W = 520, H = 320, l = 60, r = 20, t = 14, bt = 50;
    svg_open(b, W, H, "fragility curves: mean CIS vs complexity");
    double X0 = l, X1 = W - r, Y0 = H - bt, Y1 = t;
#define PX(k) (X0 + (X1 - X0) * ((kmax > 1) ? ((k) - 1.0) / (kmax - 1) : 0.5))
#define PY(v) (Y0 + (Y1 - Y0) * (v))
    cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", X0, Y0, X1, Y0);
    cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", X0, Y0, X0, Y1);
    for (int k = 1; k <= kmax; k++)
        cis_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%d</text>\n", PX(k),
                       Y0 + 16, k);
    for (int v = 0; v <= 5; v++)
        cis_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.1f</text>"
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                       X0 - 6, PY(v / 5.0) + 4, v / 5.0, X0, PY(v / 5.0), X1, PY(v / 5.0));
    cis_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">complexity (components in the "
                      "prompt)</text>\n", (X0 + X1) / 2, H - 12);
    const char *grp[2] = {"non_western", "western"};
    for (int gi = 0; gi < 2; gi++) {
        const char *col = gi ? C_WEST : C_NONWEST;
        cis_buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (const cJSON *x = cu ? cu->child : NULL; x; x = x->next)
            if (!strcmp(jstr(x, "by"), grp[gi]) && !isnan(jnum(x, "mean")))
                cis_buf_printf(b, "%.1f,%.1f ", PX(atoi(jstr(x, "level"))), PY(jnum(x, "mean")));
        CIS_PUT(b, "\"/>\n");
        for (const cJSON *x = cu ? cu->child : NULL; x; x = x->next) {
            if (strcmp(jstr(x, "by"), grp[gi])) continue;
            double px = PX(atoi(jstr(x, "level"))) + (gi ? 3 : -3);
            char f0[48], f1[48], f2[48];
            cis_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s, complexity %s: %s "
                              "[%s, %s]</title></circle>\n", px, PY(jnum(x, "mean")), col, grp[gi], jstr(x, "level"),
                           fx(f0, jnum(x, "mean"), 3), fx(f1, jnum(x, "lo"), 3), fx(f2, jnum(x, "hi"), 3));
            if (!isnan(jnum(x, "lo")))
                cis_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", px,
                               PY(jnum(x, "lo")), px, PY(jnum(x, "hi")), col);
        }
    }
    CIS_PUT(b, "</svg>\n");
#undef PX
#undef PY
}

/* The PCA of component text embeddings, coloured by group. */
static void chart_pca(cis_buf *b, const cJSON *s) {
    const cJSON *pts = jget(jget(s, "pca"), "points");
    if (!pts || !pts->child) return;
    double mnx = INFINITY, mxx = -INFINITY, mny = INFINITY, mxy = -INFINITY;
    for (const cJSON *p = pts->child; p; p = p->next) {
        double x = jnum(p, "x"), y = jnum(p, "y");
        if (x < mnx) mnx = x;
        if (x > mxx) mxx = x;
        if (y < mny) mny = y;
        if (y > mxy) mxy = y;
    }
    if (!(mxx > mnx)) mxx = mnx + 1;
    if (!(mxy > mny)) mxy = mny + 1;
    int W = 520, H = 420, m = 40;
    svg_open(b, W, H, "PCA of component text embeddings");
    cis_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", m, m / 2,
                   W - 2 * m, H - 2 * m);
    for (const cJSON *p = pts->child; p; p = p->next) {
        double x = m + (W - 2 * m) * (jnum(p, "x") - mnx) / (mxx - mnx);
        double y = H - 1.5 * m - (H - 2 * m) * (jnum(p, "y") - mny) / (mxy - mny);
        int west = !strcmp(jstr(p, "group"), "western");
        cis_buf_printf(b, "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" fill-opacity=\"0.75\"><title>",
                       x, y, west ? C_WEST : C_NONWEST);
        cis_buf_html(b, jstr(p, "phrase"));
        CIS_PUT(b, " (");
        cis_buf_html(b, jstr(p, "culture"));
        CIS_PUT(b, ")</title></circle>\n");
    }
    cis_buf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">PC1 (%.1f%% of variance); PC2 "
                      "%.1f%%</text>\n", W / 2, H - 14, 100 * jnum(jget(s, "pca"), "explained_1"),
                   100 * jnum(jget(s, "pca"), "explained_2"));
    CIS_PUT(b, "</svg>\n");
}

static void table_means(cis_buf *b, const cJSON *arr, const char *by, const char *what) {
    cis_buf_printf(b, "<table><tr><th>%s</th><th>n</th><th>clusters</th><th>%s</th><th>95%% CI</th></tr>\n", by, what);
    for (const cJSON *x = arr ? arr->child : NULL; x; x = x->next) {
        if (strcmp(jstr(x, "by"), by)) continue;
        CIS_PUT(b, "<tr><td>");
        cis_buf_html(b, jstr(x, "level"));
        cis_buf_printf(b, "</td><td>%d</td><td>", (int)jnum(x, "n"));
        num(b, jnum(x, "clusters"), 0); /* the units the CI resampled (scores.json's "cluster") */
        CIS_PUT(b, "</td><td>");
        num(b, jnum(x, "mean"), 3);
        CIS_PUT(b, "</td><td>");
        if (isnan(jnum(x, "lo"))) {
            CIS_PUT(b, "none (one cluster)");
        } else {
            num(b, jnum(x, "lo"), 3);
            CIS_PUT(b, " &ndash; ");
            num(b, jnum(x, "hi"), 3);
        }
        CIS_PUT(b, "</td></tr>\n");
    }
    CIS_PUT(b, "</table>\n");
}

/* path relative to dir (both absolute), for <img src>. */
void cis_relpath(const char *dir, const char *path, char *out, size_t cap) {
    size_t i = 0, common = 0;
    while (dir[i] && path[i] && dir[i] == path[i]) {
        if (dir[i] == '/') common = i + 1;
        i++;
    }
    /* dir wholly a directory prefix of path: nothing of dir remains (common is then one past dir's NUL) */
    const int whole = !dir[i] && path[i] == '/';
    if (whole) common = i + 1;
    out[0] = 0;
    size_t o = 0;
    for (const char *p = whole ? dir + i : dir + common; *p;) { /* one "../" per remaining component of dir */
        o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "../");
        while (*p && *p != '/') p++;
        while (*p == '/') p++;
    }
    snprintf(out + (o < cap ? o : cap - 1), o < cap ? cap - o : 1, "%s", path + common);
}

/* Two example images per culture, from different models where the run has several. */
static void examples(cis_buf *b, const cJSON *s, const char *html_dir) {
    const cJSON *imgs = jget(s, "images");
    enum { CAP = 512 };
    const cJSON *pick[CAP];
    int np = 0;
    for (int pass = 0; pass < 2; pass++)
        for (const cJSON *x = imgs ? imgs->child : NULL; x && np < CAP; x = x->next) {
            int count = 0, same_model = 0, dup = 0;
            for (int i = 0; i < np; i++) {
                if (strcmp(jstr(pick[i], "culture"), jstr(x, "culture"))) continue;
                count++;
                same_model |= !strcmp(jstr(pick[i], "model"), jstr(x, "model"));
                dup |= pick[i] == x;
            }
            if (count < 2 && !dup && (pass == 1 || !same_model)) pick[np++] = x;
        }
    CIS_PUT(b, "<div class=\"examples\">\n");
    /* grouped by culture, cultures in order of first appearance */
    for (int i = 0; i < np; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= strcmp(jstr(pick[j], "culture"), jstr(pick[i], "culture")) != 0;
        if (!first) continue;
        for (int j = i; j < np; j++) {
            const cJSON *x = pick[j];
            if (strcmp(jstr(x, "culture"), jstr(pick[i], "culture"))) continue;
            char rel[PATH_MAX + 64];
            const char *path = jstr(x, "path");
            if (path[0] == '/' && html_dir) cis_relpath(html_dir, path, rel, sizeof rel);
            else snprintf(rel, sizeof rel, "%s", path);
            CIS_PUT(b, "<figure class=\"ex\"><img src=\"");
            cis_buf_url_path(b, rel);
            CIS_PUT(b, "\" alt=\"");
            cis_buf_html(b, jstr(x, "image"));
            CIS_PUT(b, "\" width=\"160\"><figcaption><b>");
            cis_buf_html(b, jstr(x, "culture"));
            CIS_PUT(b, "</b> ");
            cis_buf_html(b, jstr(x, "prompt_id"));
            CIS_PUT(b, " (");
            cis_buf_html(b, jstr(x, "model"));
            cis_buf_printf(b, "), CIS %.2f<ul>", jnum(x, "cis"));
            for (const cJSON *c = jget(x, "components") ? jget(x, "components")->child : NULL; c; c = c->next) {
                int pres = cJSON_IsTrue(jget(c, "present"));
                cis_buf_printf(b, "<li class=\"%s\">%s ", pres ? "yes" : "no", pres ? "&#10003;" : "&#10007;");
                cis_buf_html(b, jstr(c, "phrase"));
                cis_buf_printf(b, " <small>p=%.2f</small></li>", jnum(c, "p"));
            }
            CIS_PUT(b, "</ul></figcaption></figure>\n");
        }
    }
    CIS_PUT(b, "</div>\n");
}

kiln_error *kiln_cis_report(const char *run_dir, const char *out_html) {
    char *sp = kiln_path_join(run_dir, "scores.json");
    if (!sp) return kiln_errorf(KILN_ENOMEM, "out of memory");
    cJSON *s = NULL;
    kiln_error *e = kiln_json_parse_file(sp, &s);
    free(sp);
    if (e) return kiln_error_wrap(e, "%s is not a scored run (kiln cis score writes scores.json)", run_dir);
    /* the directory the page will live in, for relative image paths */
    char html_dir[PATH_MAX], *hd = NULL, tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", out_html);
    char *slash = strrchr(tmp, '/');
    if (slash) *slash = 0;
    if (realpath(slash ? (tmp[0] ? tmp : "/") : ".", html_dir)) hd = html_dir;

    cis_buf b = {0};
    static const char head[] =
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kiln CIS report</title>\n"
        "<style>\nbody{font-family:sans-serif;margin:24px;color:#111;max-width:1200px}\n"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:first-child{text-align:left}\nsvg{display:block;margin:8px 0}\n"
        "section{margin-top:28px}.examples{display:flex;flex-wrap:wrap;gap:12px}\n"
        ".ex{width:220px;margin:0;font-size:12px}.ex img{display:block;border:1px solid #ccc}\n"
        ".ex ul{padding-left:14px;margin:4px 0}.yes{color:#186a1e}.no{color:#a31515}\n"
        ".warn{background:#fde2e2;padding:8px;border:1px solid #a31515}\n</style></head><body>\n";
    cis_buf_put(&b, head, sizeof head - 1);
    const cJSON *counts = jget(s, "counts"), *run = jget(s, "run");
    CIS_PUT(&b, "<h1>Component Inclusion Score audit</h1>\n<p>Suite <code>");
    cis_buf_html(&b, jstr(run, "suite"));
    CIS_PUT(&b, "</code>, manifest <code>");
    cis_buf_html(&b, jstr(run, "manifest"));
    CIS_PUT(&b, "</code>, CLIP <code>");
    cis_buf_html(&b, jstr(run, "clip"));
    cis_buf_printf(&b, "</code>. %d images, %d scored, %d errors. Crops <code>", (int)jnum(counts, "images"),
                   (int)jnum(counts, "scored"), (int)jnum(counts, "errors"));
    cis_buf_html(&b, jstr(run, "crops"));
    /* scores.json of runs before the field resampled images */
    const char *unit = *jstr(s, "cluster") ? jstr(s, "cluster") : "image";
    cis_buf_printf(&b, "</code>; threshold %.4f (", jnum(s, "threshold"));
    cis_buf_html(&b, jstr(s, "threshold_source"));
    cis_buf_printf(&b, "); %d bootstrap resamples and %d permutations of whole ", (int)jnum(run, "bootstrap"),
                   (int)jnum(run, "permutations"));
    cis_buf_html(&b, unit);
    cis_buf_printf(&b, "s (the unit of the CIs and p-values), seed %.0f.</p>\n", jnum(run, "seed"));
    if (jnum(counts, "errors") > 0) {
        CIS_PUT(&b, "<div class=\"warn\"><b>Items that could not be scored:</b><ul>");
        for (const cJSON *x = jget(s, "errors") ? jget(s, "errors")->child : NULL; x; x = x->next) {
            CIS_PUT(&b, "<li><code>");
            cis_buf_html(&b, jstr(x, "image"));
            CIS_PUT(&b, "</code>: ");
            cis_buf_html(&b, jstr(x, "error"));
            CIS_PUT(&b, "</li>");
        }
        CIS_PUT(&b, "</ul></div>\n");
    }
    const cJSON *all = find(jget(s, "cis"), "all", "all"), *gap = find(jget(s, "gap"), "all", "all"),
                *fr = find(jget(s, "fragility"), "all", "all");
    CIS_PUT(&b, "<section><h2>Summary</h2><table><tr><th>measure</th><th>estimate</th><th>95% CI / p</th></tr>\n");
    char f0[48], f1[48], f2[48];
    if (all)
        cis_buf_printf(&b, "<tr><td>mean CIS</td><td>%s</td><td>%s &ndash; %s</td></tr>\n", fx(f0, jnum(all, "mean"), 3),
                       fx(f1, jnum(all, "lo"), 3), fx(f2, jnum(all, "hi"), 3));
    if (gap)
        cis_buf_printf(&b, "<tr><td>gap (Western &minus; non-Western)</td><td>%s</td><td>p = %s (%d permutations)</td>"
                           "</tr>\n", fx(f0, jnum(gap, "gap"), 3), gx(f1, jnum(gap, "p")), (int)jnum(gap, "permutations"));
    if (fr)
        cis_buf_printf(&b, "<tr><td>fragility (CIS per added component)</td><td>%s</td><td>%s &ndash; %s</td></tr>\n",
                       fx(f0, jnum(fr, "slope"), 4), fx(f1, jnum(fr, "lo"), 4), fx(f2, jnum(fr, "hi"), 4));
    CIS_PUT(&b, "</table></section>\n");

    CIS_PUT(&b, "<section><h2>CIS per culture</h2>\n");
    chart_cultures(&b, s);
    table_means(&b, jget(s, "cis"), "culture", "mean CIS");
    CIS_PUT(&b, "</section>\n<section><h2>CIS per model, group, category, setting, complexity</h2>\n");
    const char *dims[] = {"model", "group", "category", "setting", "complexity"};
    for (int i = 0; i < 5; i++) table_means(&b, jget(s, "cis"), dims[i], "mean CIS");
    CIS_PUT(&b, "</section>\n<section><h2>Western vs non-Western gap</h2>\n");
    chart_gap(&b, s);
    CIS_PUT(&b, "<p>p: two-sided permutation test; Holm: adjusted over the levels of its row's <i>by</i> (one "
                "family of tests each).</p>\n<table><tr><th>by</th><th>level</th><th>clusters</th><th>Western</th>"
                "<th>non-Western</th><th>gap</th><th>p</th><th>Holm p</th></tr>\n");
    for (const cJSON *x = jget(s, "gap") ? jget(s, "gap")->child : NULL; x; x = x->next) {
        CIS_PUT(&b, "<tr><td>");
        cis_buf_html(&b, jstr(x, "by"));
        CIS_PUT(&b, "</td><td>");
        cis_buf_html(&b, jstr(x, "level"));
        CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "clusters"), 0), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "western"), 3), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "non_western"), 3), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "gap"), 3), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "p"), 4), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "p_holm"), 4), CIS_PUT(&b, "</td></tr>\n");
    }
    CIS_PUT(&b, "</table></section>\n");
    const cJSON *md = jget(s, "model_diff");
    if (cJSON_GetArraySize(md) > 0) {
        CIS_PUT(&b, "<section><h2>Models against each other</h2><p>Paired: each of the run's units (");
        if (strcmp(unit, "image")) cis_buf_html(&b, unit), CIS_PUT(&b, "s");
        else CIS_PUT(&b, "a prompt and seed");
        CIS_PUT(&b, ") compared with itself under the other model; the difference is the mean over the pairs, its CI "
                    "a bootstrap over them, p a sign-flip test, Holm over the model pairs.</p>\n");
        chart_model_diff(&b, md);
        CIS_PUT(&b, "<table><tr><th>a &minus; b</th><th>pairs</th><th>difference in CIS</th><th>95% CI</th><th>p</th>"
                    "<th>Holm p</th></tr>\n");
        for (const cJSON *x = md->child; x; x = x->next) {
            CIS_PUT(&b, "<tr><td>");
            cis_buf_html(&b, jstr(x, "a"));
            CIS_PUT(&b, " &minus; ");
            cis_buf_html(&b, jstr(x, "b"));
            cis_buf_printf(&b, "</td><td>%d</td><td>", (int)jnum(x, "pairs"));
            num(&b, jnum(x, "diff"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(x, "lo"), 3), CIS_PUT(&b, " &ndash; "), num(&b, jnum(x, "hi"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(x, "p"), 4);
            if (cJSON_IsTrue(jget(x, "exact"))) CIS_PUT(&b, " (exact)");
            CIS_PUT(&b, "</td><td>");
            num(&b, jnum(x, "p_holm"), 4), CIS_PUT(&b, "</td></tr>\n");
        }
        CIS_PUT(&b, "</table></section>\n");
    }
    CIS_PUT(&b, "<section><h2>Compositional fragility</h2>\n");
    chart_fragility(&b, s);
    CIS_PUT(&b, "<table><tr><th>by</th><th>level</th><th>n</th><th>slope</th><th>95% CI</th></tr>\n");
    for (const cJSON *x = jget(s, "fragility") ? jget(s, "fragility")->child : NULL; x; x = x->next) {
        CIS_PUT(&b, "<tr><td>");
        cis_buf_html(&b, jstr(x, "by"));
        CIS_PUT(&b, "</td><td>");
        cis_buf_html(&b, jstr(x, "level"));
        cis_buf_printf(&b, "</td><td>%d</td><td>", (int)jnum(x, "n"));
        num(&b, jnum(x, "slope"), 4), CIS_PUT(&b, "</td><td>");
        num(&b, jnum(x, "lo"), 4), CIS_PUT(&b, " &ndash; "), num(&b, jnum(x, "hi"), 4);
        CIS_PUT(&b, "</td></tr>\n");
    }
    {
        static const char t[] = "</table></section>\n<section><h2>Contextual misalignment</h2><p>cos(image, generic scene "
                                "phrase) &minus; cos(image, cultural context phrase): positive when the image matches "
                                "the generic scene better than its culture.</p>\n";
        cis_buf_put(&b, t, sizeof t - 1);
    }
    table_means(&b, jget(s, "misalignment"), "group", "mean misalignment");
    table_means(&b, jget(s, "misalignment"), "culture", "mean misalignment");
    {
        static const char t[] = "</section>\n<section><h2>Grounding entropy</h2><p>Normalised entropy of each component's "
                                "patch-level similarity map (1 = spread evenly: not grounded anywhere).</p>\n";
        cis_buf_put(&b, t, sizeof t - 1);
    }
    table_means(&b, jget(s, "grounding"), "group", "mean entropy");
    table_means(&b, jget(s, "grounding"), "verdict", "mean entropy");
    {
        static const char t[] = "</section>\n<section><h2>Embedding superposition</h2><p>Text embeddings of the "
                                "components: cosine similarity to the generic counterpart and to the Western "
                                "equivalents, and a 2-D PCA (orange: non-Western, blue: Western).</p>\n";
        cis_buf_put(&b, t, sizeof t - 1);
    }
    double sg[2] = {0, 0}, sw[2] = {0, 0};
    int ng[2] = {0, 0}, nw[2] = {0, 0};
    for (const cJSON *x = jget(s, "superposition") ? jget(s, "superposition")->child : NULL; x; x = x->next) {
        int w = !strcmp(jstr(x, "group"), "western");
        if (!isnan(jnum(x, "cos_generic"))) sg[w] += jnum(x, "cos_generic"), ng[w]++;
        if (!isnan(jnum(x, "cos_western_mean"))) sw[w] += jnum(x, "cos_western_mean"), nw[w]++;
    }
    CIS_PUT(&b, "<table><tr><th>group</th><th>mean cos to generic</th><th>mean cos to Western equivalents</th></tr>\n");
    for (int w = 0; w < 2; w++) {
        cis_buf_printf(&b, "<tr><td>%s</td><td>", w ? "western" : "non_western");
        num(&b, ng[w] ? sg[w] / ng[w] : NAN, 3), CIS_PUT(&b, "</td><td>");
        num(&b, nw[w] ? sw[w] / nw[w] : NAN, 3), CIS_PUT(&b, "</td></tr>\n");
    }
    CIS_PUT(&b, "</table>\n");
    chart_pca(&b, s);
    CIS_PUT(&b, "</section>\n");
    const cJSON *cal = jget(s, "calibration");
    if (cal) {
        cis_buf_printf(&b, "<section><h2>Judge vs human labels</h2><p>%d labelled pairs; threshold %.4f (Youden's J %.3f)"
                           "%s. The first row is in sample (the threshold was fitted on these labels); the second "
                           "judges each fold of the labels at the threshold fitted on the others.</p><table><tr>"
                           "<th></th><th>accuracy</th><th>precision</th><th>recall</th><th>balanced acc.</th>"
                           "<th>Cohen's &kappa;</th></tr>\n", (int)jnum(cal, "pairs"), jnum(s, "threshold"),
                       jnum(cal, "youden_j"), cJSON_IsTrue(jget(cal, "labels_as_judge")) ? "; labels replace the judge" : "");
        for (int row = 0; row < 2; row++) {
            const cJSON *a = jget(cal, row ? "agreement_cross_validated" : "agreement");
            if (!cJSON_IsObject(a)) continue;
            if (row) {
                cis_buf_printf(&b, "<tr><td>cross-validated (%d folds of ", (int)jnum(a, "folds"));
                cis_buf_html(&b, jstr(a, "fold_unit"));
                CIS_PUT(&b, "s)</td><td>");
            } else {
                CIS_PUT(&b, "<tr><td>in sample</td><td>");
            }
            num(&b, jnum(a, "accuracy"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(a, "precision"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(a, "recall"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(a, "balanced_accuracy"), 3), CIS_PUT(&b, "</td><td>");
            num(&b, jnum(a, "kappa"), 3), CIS_PUT(&b, "</td></tr>\n");
        }
        CIS_PUT(&b, "</table></section>\n");
    }
    const cJSON *det = jget(s, "detector");
    if (cJSON_IsObject(det)) {
        const cJSON *a = jget(det, "clip_vs_detector"), *l = jget(det, "detector_vs_labels");
        cis_buf_printf(&b, "<section><h2>Object detector</h2><p>Detections <code>");
        cis_buf_html(&b, jstr(det, "detections"));
        cis_buf_printf(&b, "</code> at score &ge; %.2f over the %d components that name a COCO class (%d of the "
                           "detections' images are not in the run). CLIP's verdicts against the detector's: accuracy ",
                       jnum(det, "threshold"), (int)jnum(det, "pairs"), (int)jnum(det, "unmatched_images"));
        num(&b, jnum(a, "accuracy"), 3), CIS_PUT(&b, ", Cohen's &kappa; "), num(&b, jnum(a, "kappa"), 3);
        if (cJSON_IsObject(l)) {
            cis_buf_printf(&b, ". The detector against the %d labelled pairs with a class: accuracy ", (int)jnum(l, "pairs"));
            num(&b, jnum(l, "accuracy"), 3), CIS_PUT(&b, ", &kappa; "), num(&b, jnum(l, "kappa"), 3);
        }
        CIS_PUT(&b, ".</p>\n");
        table_means(&b, jget(s, "detector_inclusion"), "group", "share detected (detector)");
        table_means(&b, jget(s, "clip_inclusion_coco"), "group", "share present (CLIP, same components)");
        CIS_PUT(&b, "</section>\n");
    }
    CIS_PUT(&b, "<section><h2>Examples per culture</h2>\n");
    examples(&b, s, hd);
    CIS_PUT(&b, "</section>\n</body></html>\n");
    cJSON_Delete(s);
    e = cis_buf_write(&b, out_html);
    cis_buf_free(&b);
    return e;
}
