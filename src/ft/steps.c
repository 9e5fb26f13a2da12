/* Step ranges: the data windows a run consumes without training ("9-9,20-22"). Kept sorted and
 * merged so that the same set always prints the same way, in logs and in the incident log. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ft.h"

static int cmp_range(const void *a, const void *b) {
    const kiln_step_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void normalize(kiln_step_ranges *r) {
    if (r->n < 2) return;
    qsort(r->r, (size_t)r->n, sizeof *r->r, cmp_range);
    int k = 0;
    for (int i = 1; i < r->n; i++) {
        if (r->r[i].lo <= r->r[k].hi + 1) {
            if (r->r[i].hi > r->r[k].hi) r->r[k].hi = r->r[i].hi;
        } else {
            r->r[++k] = r->r[i];
        }
    }
    r->n = k + 1;
}

kiln_error *kiln_step_ranges_add(kiln_step_ranges *r, int64_t lo, int64_t hi) {
    if (lo < 1 || hi < lo) return kiln_errorf(KILN_EINVAL, "step range %lld-%lld: need 1 <= first <= last", (long long)lo, (long long)hi);
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 8;
        kiln_step_range *p = realloc(r->r, (size_t)cap * sizeof *p);
        if (!p) return kiln_errorf(KILN_ENOMEM, "step ranges");
        r->r = p;
        r->cap = cap;
    }
    r->r[r->n++] = (kiln_step_range){lo, hi};
    normalize(r);
    return NULL;
}

static int parse_step(const char *s, const char *end, int64_t *out) {
    if (s == end || *s < '0' || *s > '9') return 0;
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (errno || e != end) return 0;
    *out = v;
    return 1;
}

kiln_error *kiln_step_ranges_parse(const char *s, kiln_step_ranges *out) {
    if (!s) return NULL;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *dash = memchr(p, '-', (size_t)(end - p));
        int64_t lo = 0, hi = 0;
        int ok = dash ? parse_step(p, dash, &lo) && parse_step(dash + 1, end, &hi) : parse_step(p, end, &lo);
        if (!dash) hi = lo;
        if (!ok)
            return kiln_errorf(KILN_EINVAL, "step ranges '%s': '%.*s' is not a step or a range FIRST-LAST", s,
                               (int)(end - p), p);
        kiln_error *e = kiln_step_ranges_add(out, lo, hi);
        if (e) return kiln_error_wrap(e, "step ranges '%s'", s);
        p = *end ? end + 1 : end;
    }
    return NULL;
}

int kiln_step_ranges_contains(const kiln_step_ranges *r, int64_t step) {
    for (int i = 0; i < r->n; i++)
        if (step >= r->r[i].lo && step <= r->r[i].hi) return 1;
    return 0;
}

const char *kiln_step_ranges_format(const kiln_step_ranges *r, char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < r->n && n < cap; i++) {
        int w = r->r[i].lo == r->r[i].hi
                    ? snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)r->r[i].lo)
                    : snprintf(buf + n, cap - n, "%s%lld-%lld", i ? "," : "", (long long)r->r[i].lo, (long long)r->r[i].hi);
        if (w < 0) break;
        n += (size_t)w;
    }
    return buf;
}

char *kiln_step_ranges_text(const kiln_step_ranges *r) {
    const size_t cap = (size_t)r->n * 44 + 1; /* "," + 20 digits + "-" + 20 digits per range */
    char *t = malloc(cap);
    if (t) kiln_step_ranges_format(r, t, cap);
    return t;
}

void kiln_step_ranges_free(kiln_step_ranges *r) {
    free(r->r);
    memset(r, 0, sizeof *r);
}
