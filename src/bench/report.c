/* kiln bench report PROFILE... --out report.html: one self-contained HTML page (no scripts, no
 * external assets) with inline SVG plots drawn here: bus bandwidth vs message size per collective
 * and rank count (comm), TFLOP/s per shape (gemm), GB/s vs array size per kernel (membw); each plot
 * has axes with ticks, a legend and the raw numbers in a table below; the machine and libraries
 * of every profile; a warning banner when any comm record has wrong > 0. Written atomically. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "comm_formulas.h"
#include "kiln/bench.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

/* ---- a growing string ---- */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 65536;
        while (nc - b->len <= (size_t)n) nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = nc;
    }
}

/* HTML/SVG-escaped text. */
static void sb_esc(sbuf *b, const char *t) {
    for (; t && *t; t++) {
        switch (*t) {
        case '&': sb_printf(b, "&amp;"); break;
        case '<': sb_printf(b, "&lt;"); break;
        case '>': sb_printf(b, "&gt;"); break;
        case '"': sb_printf(b, "&quot;"); break;
        default: sb_printf(b, "%c", *t);
        }
    }
}

/* ---- the records ---- */

typedef struct {
    int file;
    const char *backend, *collective, *dtype, *moved;
    int64_t ranks;
    int inplace;
    double bytes, count, tmin, tavg, tmax, algbw, busbw, wrong;
} comm_rec;

typedef struct {
    int file;
    const char *backend, *dtype, *label, *layout;
    int64_t m, n, k;
    double count, time_us, tflops;
} gemm_rec;

typedef struct {
    int file;
    const char *device, *kernel;
    double bytes, threads, best, avg;
} membw_rec;

typedef struct {
    int file;
    const char *test;
    double bytes, threads, seconds, gbs, vs_seq_write;
} io_rec;

typedef struct {
    const char *path;
    cJSON *root;
} profile;

typedef struct {
    profile *p;
    int np;
    comm_rec *c;
    size_t nc;
    gemm_rec *g;
    size_t ng;
    membw_rec *m;
    size_t nm;
    io_rec *io;
    size_t nio;
} report;

static void *grow(void *v, size_t n, size_t sz) {
    /* capacity doubles at powers of two */
    if (n && (n & (n - 1))) return v;
    return realloc(v, (n ? 2 * n : 1) * sz);
}

/* A required field that is present but null: kiln's JSON readers treat null as absent, which would report
 * it as "missing"; it is there, and null is what a writer puts where it had no finite number (an unmeasured
 * time is inf, which JSON cannot hold). Say that instead. */
static kiln_error *null_field(const cJSON *o, const char *f, int req, const char *want, const char *ctx) {
    const cJSON *v = NULL;
    if (req && cJSON_IsObject(o))
        for (const cJSON *c = o->child; c; c = c->next)
            if (c->string && !strcmp(c->string, f)) v = c; /* the last of repeated keys, as the readers take */
    if (!v || !cJSON_IsNull(v)) return NULL;
    return kiln_errorf(KILN_EINVAL, "%s: field '%s' is null, not %s (the benchmark wrote no value for it: not "
                       "measured, or not finite)", ctx, f, want);
}

static kiln_error *get_num(const cJSON *o, const char *f, double *out, double dflt, int req, const char *ctx) {
    KILN_TRY(null_field(o, f, req, "a number", ctx));
    return kiln_json_get_double(o, f, out, dflt, req, ctx);
}

static kiln_error *get_int(const cJSON *o, const char *f, int64_t *out, int64_t dflt, int req, const char *ctx) {
    KILN_TRY(null_field(o, f, req, "an integer", ctx));
    return kiln_json_get_int(o, f, out, dflt, req, ctx);
}

static kiln_error *get_str(const cJSON *o, const char *f, const char **out, const char *dflt, int req, const char *ctx) {
    KILN_TRY(null_field(o, f, req, "a string", ctx));
    return kiln_json_get_string(o, f, out, dflt, req, ctx);
}

/* Appends rec to the record array arr holding n records; out of memory is an error naming ctx (returned
 * from the calling loader, like KILN_TRY). A macro: the four record types share no array type. */
#define PUSH_REC(arr, n, rec, ctx)                                    \
    do {                                                              \
        void *nv_ = grow((arr), (n), sizeof *(arr));                  \
        if (!nv_) return kiln_errorf(KILN_ENOMEM, "%s", (ctx));       \
        (arr) = nv_;                                                  \
        (arr)[(n)++] = (rec);                                         \
    } while (0)

/* Each load_* reads one record of profile fi from the object it (ctx names it in messages) and appends
 * it to r. */
static kiln_error *load_comm(report *r, int fi, const cJSON *it, const char *ctx) {
    comm_rec c = {.file = fi};
    KILN_TRY(get_str(it, "backend", &c.backend, "?", 0, ctx));
    KILN_TRY(get_str(it, "collective", &c.collective, NULL, 1, ctx));
    KILN_TRY(get_str(it, "dtype", &c.dtype, "?", 0, ctx));
    KILN_TRY(get_int(it, "ranks", &c.ranks, 0, 1, ctx));
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(it, "inplace");
    if (cJSON_IsBool(ip)) c.inplace = cJSON_IsTrue(ip);
    else if (cJSON_IsNumber(ip)) c.inplace = ip->valuedouble != 0;
    else if (ip && !cJSON_IsNull(ip))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'inplace' must be a boolean or number, got %s", ctx,
                           kiln_json_type_name(ip));
    KILN_TRY(get_num(it, "bytes", &c.bytes, 0, 1, ctx));
    KILN_TRY(get_num(it, "count", &c.count, 0, 0, ctx));
    KILN_TRY(get_num(it, "time_us_min", &c.tmin, NAN, 0, ctx));
    KILN_TRY(get_num(it, "time_us_avg", &c.tavg, NAN, 0, ctx));
    KILN_TRY(get_num(it, "time_us_max", &c.tmax, NAN, 0, ctx));
    KILN_TRY(get_num(it, "algbw_gbs", &c.algbw, NAN, 0, ctx));
    KILN_TRY(get_num(it, "busbw_gbs", &c.busbw, 0, 1, ctx));
    KILN_TRY(get_num(it, "wrong", &c.wrong, NAN, 0, ctx)); /* null: unchecked */
    /* 0 is a size kiln bench comm writes: a size below one element per rank block (-b 8 over 3 ranks) */
    if (!(c.bytes >= 0)) return kiln_errorf(KILN_EFORMAT, "%s: field 'bytes' must be >= 0", ctx);
    if (c.ranks < 1) return kiln_errorf(KILN_EFORMAT, "%s: field 'ranks' must be >= 1", ctx);
    /* what the call moved: profiles before the field was written follow from ranks and in place */
    KILN_TRY(get_str(it, "moved", &c.moved,
                     kiln_coll_moved_name(kiln_coll_moved(c.ranks > 1 ? 2 : 1, c.inplace)), 0, ctx));
    PUSH_REC(r->c, r->nc, c, ctx);
    return NULL;
}

static kiln_error *load_gemm(report *r, int fi, const cJSON *it, const char *ctx) {
    gemm_rec g = {.file = fi};
    KILN_TRY(get_str(it, "backend", &g.backend, "?", 0, ctx));
    KILN_TRY(get_str(it, "dtype", &g.dtype, "?", 0, ctx));
    KILN_TRY(get_str(it, "label", &g.label, "", 0, ctx));
    KILN_TRY(get_str(it, "layout", &g.layout, "", 0, ctx));
    KILN_TRY(get_int(it, "m", &g.m, 0, 1, ctx));
    KILN_TRY(get_int(it, "n", &g.n, 0, 1, ctx));
    KILN_TRY(get_int(it, "k", &g.k, 0, 1, ctx));
    KILN_TRY(get_num(it, "count", &g.count, 1, 0, ctx));
    KILN_TRY(get_num(it, "time_us", &g.time_us, NAN, 0, ctx));
    KILN_TRY(get_num(it, "tflops", &g.tflops, 0, 1, ctx));
    if (g.m < 1 || g.n < 1 || g.k < 1) return kiln_errorf(KILN_EFORMAT, "%s: fields 'm', 'n', 'k' must be >= 1", ctx);
    PUSH_REC(r->g, r->ng, g, ctx);
    return NULL;
}

static kiln_error *load_membw(report *r, int fi, const cJSON *it, const char *ctx) {
    membw_rec m = {.file = fi};
    KILN_TRY(get_str(it, "device", &m.device, "cpu", 0, ctx));
    KILN_TRY(get_str(it, "kernel", &m.kernel, NULL, 1, ctx));
    KILN_TRY(get_num(it, "bytes_per_array", &m.bytes, 0, 1, ctx));
    KILN_TRY(get_num(it, "threads", &m.threads, 0, 0, ctx));
    KILN_TRY(get_num(it, "gbs_best", &m.best, 0, 1, ctx));
    KILN_TRY(get_num(it, "gbs_avg", &m.avg, NAN, 0, ctx));
    if (!(m.bytes > 0)) return kiln_errorf(KILN_EFORMAT, "%s: field 'bytes_per_array' must be > 0", ctx);
    PUSH_REC(r->m, r->nm, m, ctx);
    return NULL;
}

static kiln_error *load_io(report *r, int fi, const cJSON *it, const char *ctx) {
    io_rec x = {.file = fi};
    KILN_TRY(get_str(it, "test", &x.test, NULL, 1, ctx));
    KILN_TRY(get_num(it, "bytes", &x.bytes, 0, 1, ctx));
    KILN_TRY(get_num(it, "threads", &x.threads, 1, 0, ctx));
    KILN_TRY(get_num(it, "seconds", &x.seconds, 0, 1, ctx));
    KILN_TRY(get_num(it, "gbs", &x.gbs, 0, 1, ctx));
    KILN_TRY(get_num(it, "vs_seq_write", &x.vs_seq_write, NAN, 0, ctx));
    PUSH_REC(r->io, r->nio, x, ctx);
    return NULL;
}

/* The optional section `name` of profile fi: an array of objects, each loaded by load_rec with
 * "PATH: NAME[i]" for its messages. Sets *any when the section is there. */
static kiln_error *load_section(report *r, int fi, const char *name,
                                kiln_error *(*load_rec)(report *, int, const cJSON *, const char *), int *any) {
    const char *path = r->p[fi].path;
    const cJSON *sec, *it;
    KILN_TRY(kiln_json_get_array(r->p[fi].root, name, &sec, 0, path));
    if (!sec) return NULL;
    *any = 1;
    int idx = 0;
    cJSON_ArrayForEach(it, sec) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%s: %s[%d]", path, name, idx++);
        if (!cJSON_IsObject(it)) return kiln_errorf(KILN_EFORMAT, "%s: must be an object", ctx);
        KILN_TRY(load_rec(r, fi, it, ctx));
    }
    return NULL;
}

static kiln_error *load_profile(report *r, int fi) {
    const char *path = r->p[fi].path;
    KILN_TRY(kiln_json_parse_file(path, &r->p[fi].root));
    const cJSON *root = r->p[fi].root;
    if (!cJSON_IsObject(root)) return kiln_errorf(KILN_EFORMAT, "%s: top level must be a JSON object", path);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "kiln_profile");
    if (!v) return kiln_errorf(KILN_EFORMAT, "%s: field 'kiln_profile' is missing (not a kiln profile)", path);
    if (!cJSON_IsNumber(v))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'kiln_profile' must be a number, got %s", path,
                           kiln_json_type_name(v));
    if (v->valuedouble != KILN_PROFILE_VERSION)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: field 'kiln_profile' is version %g; this kiln reads version %d",
                           path, v->valuedouble, KILN_PROFILE_VERSION);
    const cJSON *o;
    KILN_TRY(kiln_json_get_object(root, "machine", &o, 0, path));
    KILN_TRY(kiln_json_get_object(root, "libraries", &o, 0, path));
    const char *s;
    KILN_TRY(kiln_json_get_string(root, "bench", &s, "", 0, path));
    KILN_TRY(kiln_json_get_string(root, "date", &s, "", 0, path));
    int any = 0;
    KILN_TRY(load_section(r, fi, "comm", load_comm, &any));
    KILN_TRY(load_section(r, fi, "gemm", load_gemm, &any));
    KILN_TRY(load_section(r, fi, "membw", load_membw, &any));
    KILN_TRY(load_section(r, fi, "io", load_io, &any));
    if (!any) fprintf(stderr, "kiln bench report: warning: %s has no comm, gemm, membw or io section\n", path);
    return NULL;
}

/* ---- plots ---- */

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
#define NPAL (sizeof palette / sizeof palette[0])

typedef struct {
    char name[200];
    double *x, *y;
    size_t n;
} series;

typedef struct {
    series *s;
    size_t ns;
} series_set;

static series *series_get(series_set *ss, const char *name) {
    for (size_t i = 0; i < ss->ns; i++)
        if (!strcmp(ss->s[i].name, name)) return &ss->s[i];
    series *nv = grow(ss->s, ss->ns, sizeof *nv);
    if (!nv) return NULL;
    ss->s = nv;
    series *s = &ss->s[ss->ns++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static int series_add(series *s, double x, double y) {
    double *nx = grow(s->x, s->n, sizeof *nx);
    if (!nx) return -1;
    s->x = nx;
    double *ny = grow(s->y, s->n, sizeof *ny);
    if (!ny) return -1;
    s->y = ny;
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

static void series_sort(series *s) { /* insertion sort by x: series are short */
    for (size_t i = 1; i < s->n; i++)
        for (size_t j = i; j > 0 && s->x[j - 1] > s->x[j]; j--) {
            double t = s->x[j]; s->x[j] = s->x[j - 1]; s->x[j - 1] = t;
            t = s->y[j]; s->y[j] = s->y[j - 1]; s->y[j - 1] = t;
        }
}

static void series_free(series_set *ss) {
    for (size_t i = 0; i < ss->ns; i++) {
        free(ss->s[i].x);
        free(ss->s[i].y);
    }
    free(ss->s);
}

static void fmt_bytes(char *buf, size_t cap, double b) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    snprintf(buf, cap, "%g %s", b, u[i]);
}

/* A "nice" step (1, 2, 5 x 10^k) giving about `want` intervals over span. */
static double nice_step(double span, int want) {
    if (!(span > 0)) return 1;
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

enum { PW = 900, PH = 420, ML = 80, MR = 230, MT = 40, MB = 60 };

/* A line plot of series: x log2 (byte labels) or linear, y linear from 0. */
static void line_plot(sbuf *b, const char *title, const char *xlabel, const char *ylabel, int xlog2, series_set *ss) {
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
    for (size_t i = 0; i < ss->ns; i++) {
        series_sort(&ss->s[i]);
        for (size_t j = 0; j < ss->s[i].n; j++) {
            double x = xlog2 ? log2(ss->s[i].x[j]) : ss->s[i].x[j];
            if (x < xmin) xmin = x;
            if (x > xmax) xmax = x;
            if (ss->s[i].y[j] > ymax && isfinite(ss->s[i].y[j])) ymax = ss->s[i].y[j];
        }
    }
    if (!isfinite(xmin)) { xmin = 0; xmax = 1; }
    double xstep;
    if (xlog2) {
        xmin = floor(xmin);
        xmax = ceil(xmax);
        if (xmax <= xmin) { xmin -= 1; xmax += 1; }
        xstep = ceil((xmax - xmin) / 12);
    } else {
        if (xmax <= xmin) { xmin -= 1; xmax += 1; }
        xstep = nice_step(xmax - xmin, 8);
        xmin = floor(xmin / xstep) * xstep;
        xmax = ceil(xmax / xstep) * xstep;
    }
    double ystep = nice_step(ymax > 0 ? ymax : 1, 6);
    double ytop = ceil((ymax > 0 ? ymax : 1) / ystep) * ystep;
    if (ytop <= ymax) ytop += ystep;
    int legend_h = MT + 20 * (int)ss->ns + 10;
    int H = PH > legend_h ? PH : legend_h;
    int pw = PW - ML - MR, ph = H - MT - MB;
#define SX(x) (ML + ((x) - xmin) / (xmax - xmin) * pw)
#define SY(y) (MT + ph - (y) / ytop * ph)
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
              PW, H, PW, H);
    sb_printf(b, "<title>");
    sb_esc(b, title);
    sb_printf(b, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", PW, H);
    sb_printf(b, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">", ML + pw / 2);
    sb_esc(b, title);
    sb_printf(b, "</text>\n");
    /* grid, ticks, tick labels */
    for (double y = 0; y <= ytop + ystep * 1e-9; y += ystep) {
        double py = SY(y);
        sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>", ML, py, ML + pw, py);
        sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#000\"/>", ML - 5, py, ML, py);
        sb_printf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n", ML - 8, py + 4, y);
    }
    for (double x = xmin; x <= xmax + xstep * 1e-9; x += xstep) {
        double px = SX(x);
        char lab[32];
        if (xlog2) fmt_bytes(lab, sizeof lab, pow(2, x));
        else snprintf(lab, sizeof lab, "%g", x);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>", px, MT, px, MT + ph);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\"/>", px, MT + ph, px, MT + ph + 5);
        sb_printf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", px, MT + ph + 18,
                  lab);
    }
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", ML, MT, pw, ph);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">", ML + pw / 2, H - 14);
    sb_esc(b, xlabel);
    sb_printf(b, "</text>\n<text x=\"18\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">",
              MT + ph / 2, MT + ph / 2);
    sb_esc(b, ylabel);
    sb_printf(b, "</text>\n");
    /* series and legend */
    for (size_t i = 0; i < ss->ns; i++) {
        const series *s = &ss->s[i];
        const char *col = palette[i % NPAL];
        const char *dash = i >= NPAL ? " stroke-dasharray=\"6 3\"" : "";
        sb_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col, dash);
        for (size_t j = 0; j < s->n; j++)
            sb_printf(b, "%.1f,%.1f ", SX(xlog2 ? log2(s->x[j]) : s->x[j]), SY(isfinite(s->y[j]) ? s->y[j] : 0));
        sb_printf(b, "\"/>\n");
        for (size_t j = 0; j < s->n; j++) {
            char lab[32];
            if (xlog2) fmt_bytes(lab, sizeof lab, s->x[j]);
            else snprintf(lab, sizeof lab, "%g", s->x[j]);
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>", SX(xlog2 ? log2(s->x[j]) : s->x[j]),
                      SY(isfinite(s->y[j]) ? s->y[j] : 0), col);
            sb_esc(b, s->name);
            sb_printf(b, ": %s, %.6g</title></circle>\n", lab, s->y[j]);
        }
        int ly = MT + 10 + 20 * (int)i;
        sb_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"%s/>", ML + pw + 15,
                  ly, ML + pw + 40, ly, col, dash);
        sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"12\">", ML + pw + 46, ly + 4);
        sb_esc(b, s->name);
        sb_printf(b, "</text>\n");
    }
#undef SX
#undef SY
    sb_printf(b, "</svg>\n");
}

/* A horizontal bar chart: one bar per item, value on the x axis. */
static void bar_plot(sbuf *b, const char *title, const char *xlabel, const char *const *labels, const double *vals,
                     size_t n) {
    enum { LW = 330, BH = 18 };
    double vmax = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(vals[i]) && vals[i] > vmax) vmax = vals[i];
    double step = nice_step(vmax > 0 ? vmax : 1, 6), top = ceil((vmax > 0 ? vmax : 1) / step) * step;
    if (top <= vmax) top += step;
    int pw = PW - LW - 40, ph = BH * (int)n + 10, H = MT + ph + MB;
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
              PW, H, PW, H);
    sb_printf(b, "<title>");
    sb_esc(b, title);
    sb_printf(b, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", PW, H);
    sb_printf(b, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">", LW + pw / 2);
    sb_esc(b, title);
    sb_printf(b, "</text>\n");
    for (double v = 0; v <= top + step * 1e-9; v += step) {
        double px = LW + v / top * pw;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>", px, MT, px, MT + ph);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\"/>", px, MT + ph, px, MT + ph + 5);
        sb_printf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n", px, MT + ph + 18, v);
    }
    for (size_t i = 0; i < n; i++) {
        double v = isfinite(vals[i]) && vals[i] > 0 ? vals[i] : 0;
        int y = MT + 5 + BH * (int)i;
        sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>", LW, y + 2,
                  v / top * pw, BH - 4, palette[0]);
        sb_esc(b, labels[i]);
        sb_printf(b, ": %.6g</title></rect>\n", vals[i]);
        char lab[80];
        snprintf(lab, sizeof lab, "%.56s%s", labels[i], strlen(labels[i]) > 56 ? "…" : "");
        sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">", LW - 6, y + BH - 5);
        sb_esc(b, lab);
        sb_printf(b, "</text>\n");
    }
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", LW, MT, pw, ph);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">", LW + pw / 2, H - 14);
    sb_esc(b, xlabel);
    sb_printf(b, "</text>\n</svg>\n");
}

/* ---- page ---- */

static void num_cell(sbuf *b, double v) {
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e15) sb_printf(b, "<td>%.0f</td>", v);
    else if (isfinite(v)) sb_printf(b, "<td>%.6g</td>", v);
    else sb_printf(b, "<td>–</td>");
}

static int distinct_files(const int *files, size_t n, size_t stride) {
    for (size_t i = 1; i < n; i++)
        if (*(const int *)((const char *)files + i * stride) != files[0]) return 1;
    return 0;
}

static void render_comm(sbuf *b, const report *r) {
    if (!r->nc) return;
    int multi_file = distinct_files(&r->c[0].file, r->nc, sizeof(comm_rec)), multi_be = 0, multi_dt = 0, multi_ip = 0;
    double wrong = 0;
    int one_rank = 0, zero_bytes = 0;
    for (size_t i = 0; i < r->nc; i++) {
        one_rank |= r->c[i].ranks == 1;
        zero_bytes |= !(r->c[i].bytes > 0);
        multi_be |= strcmp(r->c[i].backend, r->c[0].backend) != 0;
        multi_dt |= strcmp(r->c[i].dtype, r->c[0].dtype) != 0;
        multi_ip |= r->c[i].inplace != r->c[0].inplace;
        if (r->c[i].wrong > 0) wrong += r->c[i].wrong;
    }
    sb_printf(b, "<section id=\"comm\"><h2>Collectives (comm)</h2>\n");
    if (wrong > 0)
        sb_printf(b, "<p class=\"warn\">⚠ Warning: %g wrong elements in the comm results (rows marked in red): those "
                     "collectives returned incorrect data, their bandwidth is meaningless.</p>\n", wrong);
    if (one_rank)
        sb_printf(b, "<p class=\"note\" id=\"one-rank\">One-rank records move no data between ranks: their bus "
                     "bandwidth is 0 by definition (nccl-tests' factors), and in place a call moves nothing at all "
                     "(column <i>moved</i>). They time the call, not a link.</p>\n");
    if (zero_bytes)
        sb_printf(b, "<p class=\"note\">Records of 0 bytes (sizes below one element per rank block) are in the "
                     "table, not on the log-scale plot.</p>\n");
    series_set ss = {0};
    int oom = 0;
    for (size_t i = 0; i < r->nc && !oom; i++) {
        const comm_rec *c = &r->c[i];
        if (!(c->bytes > 0)) continue; /* no place on a log2 axis */
        char name[200];
        int n = multi_file ? snprintf(name, sizeof name, "[%d] %s, %lld ranks", c->file + 1, c->collective,
                                      (long long)c->ranks)
                           : snprintf(name, sizeof name, "%s, %lld ranks", c->collective, (long long)c->ranks);
        if (multi_be && n > 0 && (size_t)n < sizeof name) n += snprintf(name + n, sizeof name - (size_t)n, ", %s", c->backend);
        if (multi_dt && n > 0 && (size_t)n < sizeof name) n += snprintf(name + n, sizeof name - (size_t)n, ", %s", c->dtype);
        if (multi_ip && n > 0 && (size_t)n < sizeof name)
            snprintf(name + n, sizeof name - (size_t)n, c->inplace ? ", in-place" : ", out-of-place");
        series *s = series_get(&ss, name);
        oom = !s || series_add(s, c->bytes, c->busbw);
    }
    if (oom) b->oom = 1;
    else line_plot(b, "Bus bandwidth vs message size", "message size (bytes, log2 scale)", "bus bandwidth (GB/s)", 1, &ss);
    series_free(&ss);
    sb_printf(b, "<table><tr><th>file</th><th>backend</th><th>collective</th><th>dtype</th><th>ranks</th><th>in-place</th>"
                 "<th>bytes</th><th>count</th><th>time min (µs)</th><th>time avg (µs)</th><th>time max (µs)</th>"
                 "<th>algbw (GB/s)</th><th>busbw (GB/s)</th><th>wrong</th><th>moved</th></tr>\n");
    for (size_t i = 0; i < r->nc; i++) {
        const comm_rec *c = &r->c[i];
        sb_printf(b, "<tr%s><td>%d</td><td>", c->wrong > 0 ? " class=\"bad\"" : "", c->file + 1);
        sb_esc(b, c->backend);
        sb_printf(b, "</td><td>");
        sb_esc(b, c->collective);
        sb_printf(b, "</td><td>");
        sb_esc(b, c->dtype);
        sb_printf(b, "</td><td>%lld</td><td>%s</td>", (long long)c->ranks, c->inplace ? "yes" : "no");
        num_cell(b, c->bytes);
        num_cell(b, c->count);
        num_cell(b, c->tmin);
        num_cell(b, c->tavg);
        num_cell(b, c->tmax);
        num_cell(b, c->algbw);
        num_cell(b, c->busbw);
        num_cell(b, c->wrong);
        sb_printf(b, "<td class=\"l\">");
        sb_esc(b, c->moved);
        sb_printf(b, "</td></tr>\n");
    }
    sb_printf(b, "</table></section>\n");
}

static void render_gemm(sbuf *b, const report *r) {
    if (!r->ng) return;
    sb_printf(b, "<section id=\"gemm\"><h2>Matrix multiply (gemm)</h2>\n");
    for (int f = 0; f < r->np; f++) {
        size_t n = 0, first = 0;
        for (size_t i = 0; i < r->ng; i++)
            if (r->g[i].file == f && !n++) first = i;
        if (!n) continue;
        const gemm_rec *g0 = &r->g[first];
        char title[400];
        snprintf(title, sizeof title, "TFLOP/s per shape: %.100s, %.20s (file %d)", g0->backend, g0->dtype, f + 1);
        /* one dimension varies, the others are fixed: a line over that dimension */
        int vm = 0, vn = 0, vk = 0;
        for (size_t i = 0; i < r->ng; i++)
            if (r->g[i].file == f) {
                vm |= r->g[i].m != g0->m;
                vn |= r->g[i].n != g0->n;
                vk |= r->g[i].k != g0->k;
            }
        if (n >= 3 && vm + vn + vk == 1) {
            series_set ss = {0};
            char name[64];
            snprintf(name, sizeof name, "TFLOP/s vs %s", vm ? "M" : vn ? "N" : "K");
            series *s = series_get(&ss, name);
            int oom = !s;
            for (size_t i = 0; i < r->ng && !oom; i++)
                if (r->g[i].file == f)
                    oom = series_add(s, (double)(vm ? r->g[i].m : vn ? r->g[i].n : r->g[i].k), r->g[i].tflops) != 0;
            char xl[128];
            if (vm) snprintf(xl, sizeof xl, "M (N=%lld, K=%lld)", (long long)g0->n, (long long)g0->k);
            else if (vn) snprintf(xl, sizeof xl, "N (M=%lld, K=%lld)", (long long)g0->m, (long long)g0->k);
            else snprintf(xl, sizeof xl, "K (M=%lld, N=%lld)", (long long)g0->m, (long long)g0->n);
            if (oom) b->oom = 1;
            else line_plot(b, title, xl, "TFLOP/s", 0, &ss);
            series_free(&ss);
        } else {
            const char **labels = calloc(n, sizeof *labels);
            double *vals = calloc(n, sizeof *vals);
            char (*lab)[200] = calloc(n, sizeof *lab);
            if (!labels || !vals || !lab) b->oom = 1;
            else {
                size_t j = 0;
                for (size_t i = 0; i < r->ng; i++)
                    if (r->g[i].file == f) {
                        const gemm_rec *g = &r->g[i];
                        char dims[80];
                        snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)g->m, (long long)g->n,
                                 (long long)g->k);
                        /* the label (shortened to fit the margin; the table has it whole), then the dims */
                        if (g->label[0] && strcmp(g->label, dims))
                            snprintf(lab[j], sizeof lab[j], "%.34s%s %s", g->label, strlen(g->label) > 34 ? "…" : "",
                                     dims);
                        else
                            snprintf(lab[j], sizeof lab[j], "%s", dims);
                        labels[j] = lab[j];
                        vals[j++] = g->tflops;
                    }
                bar_plot(b, title, "TFLOP/s (M x N x K)", labels, vals, n);
            }
            free(labels);
            free(vals);
            free(lab);
        }
        sb_printf(b, "<table><tr><th>label</th><th>M</th><th>N</th><th>K</th><th>layout</th><th>count</th>"
                     "<th>time (µs)</th><th>TFLOP/s</th></tr>\n");
        double tot_us = 0, tot_fl = 0;
        for (size_t i = 0; i < r->ng; i++) {
            const gemm_rec *g = &r->g[i];
            if (g->file != f) continue;
            sb_printf(b, "<tr><td class=\"l\">");
            sb_esc(b, g->label);
            sb_printf(b, "</td><td>%lld</td><td>%lld</td><td>%lld</td><td>", (long long)g->m, (long long)g->n,
                      (long long)g->k);
            sb_esc(b, g->layout);
            sb_printf(b, "</td>");
            num_cell(b, g->count);
            num_cell(b, g->time_us);
            num_cell(b, g->tflops);
            sb_printf(b, "</tr>\n");
            tot_us += g->count * g->time_us;
            tot_fl += g->count * 2.0 * (double)g->m * (double)g->n * (double)g->k;
        }
        if (isfinite(tot_us) && tot_us > 0)
            sb_printf(b, "<tr class=\"total\"><td class=\"l\">total (count-weighted)</td><td></td><td></td><td></td>"
                         "<td></td><td></td><td>%.6g</td><td>%.6g</td></tr>\n",
                      tot_us, tot_fl / (tot_us * 1e-6) / 1e12);
        sb_printf(b, "</table>\n");
    }
    sb_printf(b, "</section>\n");
}

static void render_membw(sbuf *b, const report *r) {
    if (!r->nm) return;
    int multi_file = distinct_files(&r->m[0].file, r->nm, sizeof(membw_rec)), multi_th = 0, multi_dev = 0;
    for (size_t i = 0; i < r->nm; i++) {
        multi_th |= r->m[i].threads != r->m[0].threads;
        multi_dev |= strcmp(r->m[i].device, r->m[0].device) != 0;
    }
    sb_printf(b, "<section id=\"membw\"><h2>Memory bandwidth (membw)</h2>\n");
    series_set ss = {0};
    int oom = 0;
    for (size_t i = 0; i < r->nm && !oom; i++) {
        const membw_rec *m = &r->m[i];
        char name[200];
        int n = multi_file ? snprintf(name, sizeof name, "[%d] %s", m->file + 1, m->kernel)
                           : snprintf(name, sizeof name, "%s", m->kernel);
        if (multi_dev && n > 0 && (size_t)n < sizeof name) n += snprintf(name + n, sizeof name - (size_t)n, ", %s", m->device);
        if (multi_th && n > 0 && (size_t)n < sizeof name) snprintf(name + n, sizeof name - (size_t)n, ", %g threads", m->threads);
        series *s = series_get(&ss, name);
        oom = !s || series_add(s, m->bytes, m->best);
    }
    if (oom) b->oom = 1;
    else line_plot(b, "Memory bandwidth vs array size (best of iterations)", "bytes per array (log2 scale)",
                   "bandwidth (GB/s, read + written)", 1, &ss);
    series_free(&ss);
    sb_printf(b, "<table><tr><th>file</th><th>device</th><th>kernel</th><th>bytes per array</th><th>threads</th>"
                 "<th>best (GB/s)</th><th>avg (GB/s)</th></tr>\n");
    for (size_t i = 0; i < r->nm; i++) {
        const membw_rec *m = &r->m[i];
        sb_printf(b, "<tr><td>%d</td><td>", m->file + 1);
        sb_esc(b, m->device);
        sb_printf(b, "</td><td>");
        sb_esc(b, m->kernel);
        sb_printf(b, "</td>");
        num_cell(b, m->bytes);
        num_cell(b, m->threads);
        num_cell(b, m->best);
        num_cell(b, m->avg);
        sb_printf(b, "</tr>\n");
    }
    sb_printf(b, "</table></section>\n");
}

/* Storage throughput (kiln bench io): one bar per test, the checkpoint writer beside the disk. */
static void render_io(sbuf *b, const report *r) {
    if (!r->nio) return;
    int multi_file = distinct_files(&r->io[0].file, r->nio, sizeof(io_rec));
    sb_printf(b, "<section id=\"io\"><h2>Storage (io)</h2>\n");
    const char **labels = calloc(r->nio, sizeof *labels);
    char(*names)[120] = calloc(r->nio, sizeof *names);
    double *vals = calloc(r->nio, sizeof *vals);
    if (!labels || !names || !vals) b->oom = 1;
    for (size_t i = 0; labels && names && vals && i < r->nio; i++) {
        const io_rec *x = &r->io[i];
        if (multi_file) snprintf(names[i], sizeof names[i], "[%d] %s, %g threads", x->file + 1, x->test, x->threads);
        else snprintf(names[i], sizeof names[i], "%s, %g threads", x->test, x->threads);
        labels[i] = names[i];
        vals[i] = x->gbs;
    }
    if (!b->oom) bar_plot(b, "Storage throughput (best of iterations)", "GB/s", labels, vals, r->nio);
    free(labels);
    free(names);
    free(vals);
    sb_printf(b, "<table><tr><th>file</th><th>test</th><th>bytes</th><th>threads</th><th>seconds</th><th>GB/s</th>"
                 "<th>vs sequential write</th></tr>\n");
    for (size_t i = 0; i < r->nio; i++) {
        const io_rec *x = &r->io[i];
        sb_printf(b, "<tr><td>%d</td><td class=\"l\">", x->file + 1);
        sb_esc(b, x->test);
        sb_printf(b, "</td>");
        num_cell(b, x->bytes);
        num_cell(b, x->threads);
        num_cell(b, x->seconds);
        num_cell(b, x->gbs);
        if (isfinite(x->vs_seq_write)) sb_printf(b, "<td>%.0f%%</td>", 100 * x->vs_seq_write);
        else sb_printf(b, "<td>–</td>");
        sb_printf(b, "</tr>\n");
    }
    sb_printf(b, "</table></section>\n");
}

/* Flat key/value rows of an object (machine, libraries). */
static void kv_rows(sbuf *b, const cJSON *o) {
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        sb_printf(b, "<tr><th>");
        sb_esc(b, it->string);
        sb_printf(b, "</th><td class=\"l\">");
        if (cJSON_IsString(it)) sb_esc(b, it->valuestring);
        else {
            char *t = kiln_json_print(it, 0);
            sb_esc(b, t ? t : "?");
            free(t);
        }
        sb_printf(b, "</td></tr>\n");
    }
}

static void render_page(sbuf *b, const report *r) {
    double wrong = 0;
    for (size_t i = 0; i < r->nc; i++)
        if (r->c[i].wrong > 0) wrong += r->c[i].wrong;
    sb_printf(b,
              "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>kiln bench report</title>\n"
              "<style>\nbody{font-family:sans-serif;margin:24px;color:#111;max-width:1200px}\n"
              "table{border-collapse:collapse;margin:8px 0 24px;font-size:12px}\n"
              "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\ntd.l,th{text-align:left}\n"
              "tr.bad td{background:#fdd;color:#900}\ntr.total td{font-weight:bold}\n"
              ".warn{background:#fdd;border:2px solid #c00;color:#900;padding:10px;font-weight:bold}\n"
              ".note{background:#eef4ff;border:1px solid #88a;padding:8px}\n"
              "svg{display:block;margin:8px 0}\nsection{margin-top:32px}\n</style></head><body>\n"
              "<h1>kiln bench report</h1>\n");
    if (wrong > 0)
        sb_printf(b, "<p class=\"warn\" id=\"wrong-warning\">⚠ Warning: %g wrong elements across the comm records: "
                     "some collectives returned incorrect data (see the red rows under Collectives).</p>\n", wrong);
    sb_printf(b, "<section id=\"profiles\"><h2>Profiles</h2>\n");
    for (int f = 0; f < r->np; f++) {
        const cJSON *root = r->p[f].root;
        const cJSON *bench = cJSON_GetObjectItemCaseSensitive(root, "bench");
        const cJSON *date = cJSON_GetObjectItemCaseSensitive(root, "date");
        sb_printf(b, "<h3>[%d] ", f + 1);
        sb_esc(b, r->p[f].path);
        sb_printf(b, "</h3>\n<table><tr><th>bench</th><td class=\"l\">");
        sb_esc(b, cJSON_IsString(bench) ? bench->valuestring : "");
        sb_printf(b, "</td></tr><tr><th>date</th><td class=\"l\">");
        sb_esc(b, cJSON_IsString(date) ? date->valuestring : "");
        sb_printf(b, "</td></tr>\n");
        const cJSON *inc = cJSON_GetObjectItemCaseSensitive(root, "incomplete"); /* a sweep stopped early */
        if (cJSON_IsString(inc)) {
            sb_printf(b, "<tr class=\"bad\"><th>incomplete</th><td class=\"l\">");
            sb_esc(b, inc->valuestring);
            sb_printf(b, "</td></tr>\n");
        }
        kv_rows(b, cJSON_GetObjectItemCaseSensitive(root, "machine"));
        kv_rows(b, cJSON_GetObjectItemCaseSensitive(root, "libraries"));
        sb_printf(b, "</table>\n");
    }
    sb_printf(b, "</section>\n");
    render_comm(b, r);
    render_gemm(b, r);
    render_membw(b, r);
    render_io(b, r);
    sb_printf(b, "</body></html>\n");
}

static const char usage[] =
    "usage: kiln bench report PROFILE... --out report.html\n\n"
    "Renders JSON profiles written by kiln bench comm/gemm/membw --json (any mix) as one self-contained\n"
    "HTML page with SVG plots: bus bandwidth vs message size per collective and rank count, TFLOP/s per\n"
    "GEMM shape, GB/s vs array size per kernel; each with the raw numbers in a table, plus the machine and\n"
    "libraries of every profile. Comm records with wrong > 0 raise a warning at the top.\n\n"
    "  --out FILE     the HTML page (written atomically)\n";

int kiln_bench_report_main(int argc, char **argv) {
    const char *out = NULL;
    report r = {0};
    r.p = calloc((size_t)(argc > 0 ? argc : 1), sizeof *r.p);
    if (!r.p) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            free(r.p);
            return 0;
        }
        if (!strcmp(argv[i], "--out") || !strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) {
                free(r.p);
                return kiln_bench_usage_err("report", "%s needs a value", argv[i]);
            }
            out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            free(r.p);
            return kiln_bench_unknown_option("report", argv[i], usage);
        } else
            r.p[r.np++].path = argv[i];
    }
    if (!out || !r.np) {
        fprintf(stderr, "kiln bench report: error: %s\n\n%s", !r.np ? "no profiles given" : "--out FILE is required",
                usage);
        free(r.p);
        return 2;
    }
    kiln_error *e = NULL;
    for (int f = 0; f < r.np && !e; f++) e = load_profile(&r, f);
    if (!e && !r.nc && !r.ng && !r.nm && !r.nio)
        e = kiln_errorf(KILN_EINVAL, "no comm, gemm, membw or io records in the profiles");
    sbuf b = {0};
    if (!e) {
        render_page(&b, &r);
        if (b.oom) e = kiln_errorf(KILN_ENOMEM, "%s: rendering the page", out);
        else e = kiln_write_file_atomic(out, b.s, b.len);
    }
    free(b.s);
    for (int f = 0; f < r.np; f++) cJSON_Delete(r.p[f].root);
    free(r.p);
    free(r.c);
    free(r.g);
    free(r.m);
    free(r.io);
    if (e) {
        kiln_bench_fail("report", NULL, e);
        return 1;
    }
    printf("kiln bench report: wrote %s (%zu comm, %zu gemm, %zu membw, %zu io records)\n", out, r.nc, r.ng, r.nm, r.nio);
    return 0;
}
