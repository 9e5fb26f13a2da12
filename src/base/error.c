/* kiln_error: heap-allocated message + code. See include/kiln/error.h. */
#include "kiln/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_error {
    kiln_errcode code;
    int is_static;
    char *msg;
};

/* Returned when we cannot even allocate the error: must never be freed. */
static struct kiln_error oom_error = {KILN_ENOMEM, 1, "out of memory"};

kiln_error *kiln_verrorf(kiln_errcode code, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    kiln_error *e = malloc(sizeof *e);
    char *msg = malloc((size_t)n + 1);
    if (!e || !msg) {
        free(e);
        free(msg);
        return &oom_error;
    }
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    e->code = code;
    e->is_static = 0;
    e->msg = msg;
    return e;
}

kiln_error *kiln_errorf(kiln_errcode code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_error *e = kiln_verrorf(code, fmt, ap);
    va_end(ap);
    return e;
}

kiln_error *kiln_error_wrap(kiln_error *e, const char *fmt, ...) {
    if (!e || e->is_static) return e;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return e;
    size_t old = strlen(e->msg);
    char *msg = malloc((size_t)n + 2 + old + 1);
    if (!msg) return e; /* keep the inner message rather than lose it */
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
    memcpy(msg + n, ": ", 2);
    memcpy(msg + n + 2, e->msg, old + 1);
    free(e->msg);
    e->msg = msg;
    return e;
}

const char *kiln_error_msg(const kiln_error *e) { return e ? e->msg : "ok"; }
kiln_errcode kiln_error_code(const kiln_error *e) { return e ? e->code : KILN_OK; }

void kiln_error_free(kiln_error *e) {
    if (!e || e->is_static) return;
    free(e->msg);
    free(e);
}
