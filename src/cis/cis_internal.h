/* Helpers shared by the CIS files: JSON Lines reading and a growable text buffer. */
#ifndef KILN_CIS_INTERNAL_H
#define KILN_CIS_INTERNAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "kiln/cis.h"
#include "kiln/error.h"

/* Calls fn(obj, line, ctx_line, user) for every non-blank line of text; ctx_line is
 * "<ctx>:<line>" for messages. A line that is not a JSON object is an error naming the line.
 * Stops at the first error fn returns. */
typedef kiln_error *(*cis_line_fn)(const cJSON *obj, int line, const char *ctx_line, void *user);
kiln_error *cis_jsonl_each(const char *text, size_t len, const char *ctx, cis_line_fn fn, void *user);
/* Error naming the first member of obj that is not in the NULL-terminated list. */
kiln_error *cis_check_fields(const cJSON *obj, const char *const *known, const char *ctx);
char *cis_strdup(const char *s); /* NULL stays NULL */
/* path relative to the directory dir (both absolute, dir without a trailing slash), e.g. the report's
 * thumbnails relative to the page: "/r/t1" + "/r/t1/img/a.png" -> "img/a.png", + "/r/t10/a.png" -> "../t10/a.png".
 * Truncated to cap - 1 characters. */
void cis_relpath(const char *dir, const char *path, char *out, size_t cap);

/* A detector's output (detections.c): the highest score per (image, class), sorted. */
typedef struct {
    char *image, *cls;
    double score;
} cis_det;
typedef struct {
    int n;      /* distinct (image, class) */
    int lines;  /* detections read */
    cis_det *d;
} cis_detections;
/* Errors name the file and line (unknown fields, a score outside [0, 1], a box of other than four numbers). */
kiln_error *cis_detections_load(const char *path, cis_detections *out);
kiln_error *cis_detections_parse(const char *text, size_t len, const char *ctx, cis_detections *out);
/* The highest score of cls in image, 0 when the detector found none. */
double cis_detections_score(const cis_detections *t, const char *image, const char *cls);
int cis_detections_has_image(const cis_detections *t, const char *image); /* any detection in image */
void cis_detections_free(cis_detections *t);

/* The first difference between a run's copy of its suite (a, read from actx) and the suite given
 * again on a resume (b, from bctx), as an error naming the prompt and component; NULL when they
 * hold the same prompts, fields and components in the same order. */
kiln_error *cis_suite_compare(const kiln_cis_suite *a, const char *actx, const kiln_cis_suite *b, const char *bctx);

/* Set (aggregate.c) to the caller's stop flag while aggregating: the bootstrap and permutation loops
 * of stats.c give up when it reads nonzero, so that Ctrl-C is not ignored for the minutes an
 * aggregation of a large run takes. NULL: never stop. */
extern const volatile int *cis_stop;

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} cis_buf;
void cis_buf_put(cis_buf *b, const char *s, size_t n);
/* lit must be a string literal ("" lit does not compile otherwise): sizeof gives its length */
#define CIS_PUT(b, lit) cis_buf_put((b), "" lit, sizeof("" lit) - 1)
void cis_buf_printf(cis_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string literal (quoted, escaped). */
void cis_buf_json_str(cis_buf *b, const char *s);
/* A double as JSON: shortest of %.6g style that round-trips is not needed: fixed %.6g, NaN -> null. */
void cis_buf_num(cis_buf *b, double v);
/* s with &<>" escaped for HTML. */
void cis_buf_html(cis_buf *b, const char *s);
/* A path as a URL path (the report's <img src>): bytes other than unreserved characters and '/' percent-encoded, so
 * that a file name with a space, '#', '?' or '%' names that file; the result needs no HTML escaping. */
void cis_buf_url_path(cis_buf *b, const char *path);
kiln_error *cis_buf_write(cis_buf *b, const char *path); /* atomic; frees nothing */
void cis_buf_free(cis_buf *b);

#endif
