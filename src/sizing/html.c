/* The `kiln size --html` page: self-contained (no scripts, no external assets), SVG drawn here. A
 * scatter of every candidate (decode latency against training throughput: the trade the ranking
 * makes), the micro-batch time of the leaders split by kind of work, and the ranked table with the
 * rules and evidence. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/sizing.h"

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = 1; return; }
        if (b->s && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t nc = (b->cap ? b->cap * 2 : 65536) + (size_t)k;
        char *t = realloc(b->s, nc);
        if (!t) { b->oom = 1; return; }
        b->s = t;
        b->cap = nc;
    }
}

static void sb_esc(sbuf *b, const char *t) {
    for (; *t; t++) {
        switch (*t) {
        case '<': sb_printf(b, "&lt;"); break;
        case '>': sb_printf(b, "&gt;"); break;
        case '&': sb_printf(b, "&amp;"); break;
        case '"': sb_printf(b, "&quot;"); break;
        default: sb_printf(b, "%c", *t);
        }
    }
}

static double nice_step(double span, int want) {
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

enum { PW = 900, PH = 460, ML = 80, MR = 30, MT = 40, MB = 55 };

static void axes(sbuf *b, const char *title, const char *xl, const char *yl, double x0, double x1, double xs,
                 double y0, double y1, double ys) {
    const int pw = PW - ML - MR, ph = PH - MT - MB;
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                 "role=\"img\"><title>", PW, PH, PW, PH);
    sb_esc(b, title);
    sb_printf(b, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", PW, PH);
    sb_printf(b, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">", ML + pw / 2);
    sb_esc(b, title);
    sb_printf(b, "</text>\n");
    for (double y = y0; y <= y1 + ys * 1e-9; y += ys) {
        double py = MT + ph - (y - y0) / (y1 - y0) * ph;
        sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n",
                  ML, py, ML + pw, py, ML - 6, py + 4, y);
    }
    for (double x = x0; x <= x1 + xs * 1e-9; x += xs) {
        double px = ML + (x - x0) / (x1 - x0) * pw;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                  px, MT, px, MT + ph, px, MT + ph + 16, x);
    }
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", ML, MT, pw, ph);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">", ML + pw / 2, PH - 14);
    sb_esc(b, xl);
    sb_printf(b, "</text><text x=\"18\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">",
              MT + ph / 2, MT + ph / 2);
    sb_esc(b, yl);
    sb_printf(b, "</text>\n");
}

static void range(double lo, double hi, double *a, double *z, double *step) {
    if (!(hi > lo)) { lo = lo > 0 ? lo * 0.9 : 0; hi = hi > 0 ? hi * 1.1 : 1; }
    double pad = (hi - lo) * 0.08;
    *step = nice_step(hi - lo + 2 * pad, 8);
    *a = floor((lo - pad) / *step) * *step;
    if (*a < 0 && lo >= 0) *a = 0;
    *z = ceil((hi + pad) / *step) * *step;
}

static void scatter(sbuf *b, const kiln_size_result *r, int top, int64_t ref) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int64_t i = 0; i < r->n; i++) {
        const kiln_size_pred *q = &r->c[i].pred;
        if (q->decode_ms_b1 < x0) x0 = q->decode_ms_b1;
        if (q->decode_ms_b1 > x1) x1 = q->decode_ms_b1;
        if (q->tokens_per_s < y0) y0 = q->tokens_per_s;
        if (q->tokens_per_s > y1) y1 = q->tokens_per_s;
    }
    double xa, xz, xs, ya, yz, ys;
    range(x0, x1, &xa, &xz, &xs);
    range(y0, y1, &ya, &yz, &ys);
    axes(b, "Candidates: training throughput vs decode latency (up and left is better)",
         "decode ms per step at batch 1", "training tokens/s per GPU", xa, xz, xs, ya, yz, ys);
    const int pw = PW - ML - MR, ph = PH - MT - MB;
    for (int pass = 0; pass < 3; pass++) /* the rest, then the leaders, then the reference on top */
        for (int64_t i = r->n - 1; i >= 0; i--) {
            int lead = i < top, isref = i == ref;
            if ((pass == 0 && (lead || isref)) || (pass == 1 && (!lead || isref)) || (pass == 2 && !isref)) continue;
            const kiln_size_candidate *c = &r->c[i];
            double px = ML + (c->pred.decode_ms_b1 - xa) / (xz - xa) * pw;
            double py = MT + ph - (c->pred.tokens_per_s - ya) / (yz - ya) * ph;
            char sh[160];
            kiln_size_shape_str(&c->shape, sh, sizeof sh);
            const char *fill = isref ? "#d62728" : lead ? "#1f77b4" : "#bbbbbb";
            sb_printf(b, "<circle class=\"cand\" cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"#333\"><title>#%lld ",
                      px, py, isref ? 7 : 5, fill, (long long)i + 1);
            sb_esc(b, sh);
            sb_printf(b, ": %.0f tok/s/GPU, decode %.3f ms, score %.3f</title></circle>\n", c->pred.tokens_per_s,
                      c->pred.decode_ms_b1, c->score);
            if (lead || isref)
                sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">%s%lld</text>\n", px + 8, py - 6,
                          fill, isref ? "ref #" : "#", (long long)i + 1);
        }
    sb_printf(b, "</svg>\n");
}

static void breakdown(sbuf *b, const kiln_size_result *r, int top, int64_t ref) {
    int64_t rows[64];
    int n = 0;
    for (int i = 0; i < top && n < 63; i++) rows[n++] = i;
    if (ref >= top) rows[n++] = ref;
    double xmax = 0;
    for (int i = 0; i < n; i++)
        if (r->c[rows[i]].pred.t_micro > xmax) xmax = r->c[rows[i]].pred.t_micro;
    xmax *= 1e3;
    double xs = nice_step(xmax > 0 ? xmax : 1, 8), xz = ceil((xmax > 0 ? xmax : 1) / xs) * xs;
    const int LW = 330, BH = 20, H = MT + 30 + n * (BH + 6) + 50, pw = PW - LW - MR;
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">"
                 "<title>Micro-batch time by kind of work</title>\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n"
                 "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">Micro-batch time "
                 "by kind of work (ms)</text>\n", PW, H, PW, H, PW, H, LW + pw / 2);
    static const char *const names[3] = {"GEMMs", "attention", "elementwise (memory-bound)"};
    static const char *const cols[3] = {"#1f77b4", "#ff7f0e", "#2ca02c"};
    for (int k = 0; k < 3; k++)
        sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" "
                     "font-size=\"12\">%s</text>\n", LW + k * 190, MT - 2, cols[k], LW + 16 + k * 190, MT + 9, names[k]);
    const int top_y = MT + 24, ph = n * (BH + 6);
    for (double x = 0; x <= xz + xs * 1e-9; x += xs) {
        double px = LW + x / xz * pw;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/><text x=\"%.1f\" y=\"%d\" "
                     "font-size=\"11\" text-anchor=\"middle\">%g</text>\n", px, top_y, px, top_y + ph, px, top_y + ph + 16, x);
    }
    for (int i = 0; i < n; i++) {
        const kiln_size_candidate *c = &r->c[rows[i]];
        const double parts[3] = {c->pred.t_gemm, c->pred.t_attn, c->pred.t_mem};
        int y = top_y + i * (BH + 6) + 3;
        char sh[160];
        kiln_size_shape_str(&c->shape, sh, sizeof sh);
        sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\"%s>#%lld ", LW - 6, y + 14,
                  rows[i] == ref ? " fill=\"#d62728\"" : "", (long long)rows[i] + 1);
        sb_esc(b, sh);
        sb_printf(b, "</text>\n");
        double x = 0;
        for (int k = 0; k < 3; k++) {
            double w = parts[k] * 1e3 / xz * pw;
            sb_printf(b, "<rect class=\"bar\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s: "
                         "%.3f ms</title></rect>\n", LW + x, y, w, BH, cols[k], names[k], parts[k] * 1e3);
            x += w;
        }
    }
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\">ms per micro-batch (forward + "
                 "backward%s)</text>\n</svg>\n", LW + pw / 2, H - 12, "");
}

static void row(sbuf *b, const kiln_size_candidate *c, int64_t rank, int isref) {
    char sh[160];
    kiln_size_shape_str(&c->shape, sh, sizeof sh);
    const kiln_size_pred *q = &c->pred;
    sb_printf(b, "<tr%s><td>%lld</td><td class=\"shape\">", isref ? " class=\"ref\"" : "", (long long)rank + 1);
    sb_esc(b, sh);
    sb_printf(b, "</td><td>%.3f</td><td>%.4f</td><td>%.0f</td><td>%.1f%%</td><td>%.2f</td><td>%.1f</td><td>%.0f</td>"
                 "<td>%.3f</td><td>%.3f</td><td>%.2f</td><td>%.3f</td></tr>\n",
              (double)q->params.total_nonembed / 1e9, (double)q->params.active_nonembed / 1e9, q->tokens_per_s,
              100 * q->mfu, q->t_step, q->mem.total / 1073741824.0, q->prefill_tokens_per_s, q->decode_ms_b1,
              q->decode_ms_b64, q->kv_gib_b64, c->score);
    if (c->nwhy) {
        sb_printf(b, "<tr%s><td></td><td colspan=\"12\"><ul>", isref ? " class=\"ref\"" : "");
        for (int i = 0; i < c->nwhy; i++) {
            sb_printf(b, "<li>");
            sb_esc(b, c->why[i]);
            sb_printf(b, "</li>");
        }
        sb_printf(b, "</ul></td></tr>\n");
    }
}

kiln_error *kiln_size_write_html(const char *path, const kiln_hw_profile *p, const kiln_size_budget *bu,
                                 const kiln_size_result *r, int top, int64_t ref) {
    sbuf b = {0};
    if (top > r->n) top = (int)r->n;
    sb_printf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kiln size: ");
    sb_esc(&b, p->name);
    sb_printf(&b, "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1400px}"
                  "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;"
                  "text-align:right}td.shape{text-align:left;font-family:monospace}td ul{margin:2px 0;text-align:left;"
                  "font-size:12px}tr.ref td{background:#fde8e8}svg{display:block;margin:16px 0}</style></head><body>\n");
    sb_printf(&b, "<h1>kiln size on ");
    sb_esc(&b, p->name);
    sb_printf(&b, "</h1>\n<p>");
    sb_esc(&b, p->device);
    sb_printf(&b, " &mdash; ");
    sb_esc(&b, p->source);
    const kiln_size_setup *u = &bu->setup;
    sb_printf(&b, "</p>\n<p>Budget %.4gB total, %.4gB active non-embedding parameters (&plusmn;%g%%), vocab padded to "
                  "%lld. Setup: %lld GPU(s), ZeRO-1, sequence %lld, micro-batch %lld, %lld tokens per step, %s, %s.</p>\n"
                  "<p>%lld shapes enumerated: %lld miss the budget, %lld outside hidden/layers %g..%g, %lld do not fit "
                  "in memory; %lld candidates.</p>\n",
              bu->total / 1e9, bu->active / 1e9, 100 * bu->tolerance, (long long)r->vocab, (long long)u->train.gpus,
              (long long)u->seq, (long long)u->train.micro_batch, (long long)u->tokens_per_step,
              u->train.muon ? "Muon + AdamW" : "AdamW", u->train.recompute ? "recomputation" : "no recomputation",
              (long long)r->enumerated, (long long)r->rejected_budget, (long long)r->rejected_aspect, bu->min_aspect,
              bu->max_aspect, (long long)r->rejected_memory, (long long)r->n);
    int64_t mbs = 0;
    const int64_t step = kiln_size_step_tokens(u, &mbs);
    if (step != u->tokens_per_step)
        sb_printf(&b, "<p><b>Note:</b> a step is whole micro-batches on every GPU: %lld &times; %lld GPU(s) &times; %lld "
                      "&times; %lld = %lld tokens per step are predicted, not the %lld asked.</p>\n",
                  (long long)mbs, (long long)u->train.gpus, (long long)u->train.micro_batch, (long long)u->seq,
                  (long long)step, (long long)u->tokens_per_step);
    scatter(&b, r, top, ref);
    breakdown(&b, r, top, ref);
    sb_printf(&b, "<table>\n<tr><th>rank</th><th>shape</th><th>total B</th><th>active B</th><th>train tok/s/GPU</th>"
                  "<th>MFU</th><th>step s</th><th>mem GiB/GPU</th><th>prefill tok/s</th><th>decode b1 ms</th>"
                  "<th>decode b64 ms</th><th>KV b64 GiB</th><th>score</th></tr>\n");
    for (int i = 0; i < top; i++) row(&b, &r->c[i], i, i == ref);
    if (ref >= top && ref < r->n) row(&b, &r->c[ref], ref, 1);
    sb_printf(&b, "</table>\n<h2>Profile sources</h2>\n<ul>");
    const char *const lab[5] = {"compute", "memory", "interconnect", "GEMM", "attention"};
    const char *const src[5] = {p->compute_source, p->memory_source, p->interconnect_source, p->gemm_source,
                                p->attention_source};
    for (int i = 0; i < 5; i++) {
        sb_printf(&b, "<li>%s: ", lab[i]);
        sb_esc(&b, src[i]);
        sb_printf(&b, "</li>");
    }
    sb_printf(&b, "</ul>\n</body></html>\n");
    if (b.oom) {
        free(b.s);
        return kiln_errorf(KILN_ENOMEM, "%s: building the page", path);
    }
    kiln_error *e = kiln_write_file_atomic(path, b.s, b.n);
    free(b.s);
    return e;
}
