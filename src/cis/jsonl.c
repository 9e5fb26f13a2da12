/* JSON Lines reading and text buffers for the CIS files (see cis_internal.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

kiln_error *cis_jsonl_each(const char *text, size_t len, const char *ctx, cis_line_fn fn, void *user) {
    size_t pos = 0;
    int line = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && text[end] != '\n') end++;
        line++;
        size_t a = pos, b = end;
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r')) b--;
        pos = end + 1;
        if (a == b) continue;
        char cl[512];
        snprintf(cl, sizeof cl, "%s:%d", ctx ? ctx : "", line);
        cJSON *obj = NULL;
        kiln_error *e = kiln_json_parse(text + a, b - a, cl, &obj);
        if (e) return e;
        if (!cJSON_IsObject(obj)) {
            e = kiln_errorf(KILN_EFORMAT, "%s: expected a JSON object, got %s", cl, kiln_json_type_name(obj));
        } else {
            e = fn(obj, line, cl, user);
        }
        cJSON_Delete(obj);
        if (e) return e;
    }
    return NULL;
}

kiln_error *cis_check_fields(const cJSON *obj, const char *const *known, const char *ctx) {
    for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next) {
        int ok = 0;
        for (const char *const *k = known; *k; k++)
            if (c->string && !strcmp(c->string, *k)) ok = 1;
        if (!ok) return kiln_errorf(KILN_EFORMAT, "%s: unknown field '%s'", ctx, c->string ? c->string : "?");
    }
    return NULL;
}

char *cis_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void cis_buf_put(cis_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void cis_buf_printf(cis_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        cis_buf_put(b, tmp, (size_t)k);
        return;
    }
    char *big = malloc((size_t)k + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    cis_buf_put(b, big, (size_t)k);
    free(big);
}

void cis_buf_json_str(cis_buf *b, const char *s) {
    CIS_PUT(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            cis_buf_put(b, e, 2);
        } else if (*p == '\n') {
            CIS_PUT(b, "\\n");
        } else if (*p < 0x20) {
            cis_buf_printf(b, "\\u%04x", *p);
        } else {
            cis_buf_put(b, (const char *)p, 1);
        }
    }
    CIS_PUT(b, "\"");
}

void cis_buf_num(cis_buf *b, double v) {
    if (!isfinite(v)) CIS_PUT(b, "null");
    else if (v == 0) CIS_PUT(b, "0"); /* no "-0" */
    else cis_buf_printf(b, "%.6g", v);
}

void cis_buf_html(cis_buf *b, const char *s) {
    for (const char *p = s ? s : ""; *p; p++) {
        switch (*p) {
        case '&': CIS_PUT(b, "&amp;"); break;
        case '<': CIS_PUT(b, "&lt;"); break;
        case '>': CIS_PUT(b, "&gt;"); break;
        case '"': CIS_PUT(b, "&quot;"); break;
        default: cis_buf_put(b, p, 1);
        }
    }
}

kiln_error *cis_buf_write(cis_buf *b, const char *path) {
    if (b->oom) return kiln_errorf(KILN_ENOMEM, "%s: out of memory building the file", path);
    return kiln_write_file_atomic(path, b->p ? b->p : "", b->n);
}

void cis_buf_free(cis_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
