/* kiln error values.
 *
 * Every library function that can fail returns a kiln_error* (NULL on success).
 * The error owns a message that names what was wrong and where: file, tensor,
 * field, or position. Callers add context on the way up with kiln_error_wrap,
 * so the CLI can print one line such as
 *   "loading model dir/: model.safetensors: tensor 'lm_head.weight': shape [8,4] does not match config [8,6]".
 * Library code never exits or aborts on bad input.
 */
#ifndef KILN_ERROR_H
#define KILN_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_OK = 0,
    KILN_EINVAL,   /* bad argument or bad input data */
    KILN_EIO,      /* the OS refused a read/write/open */
    KILN_ENOMEM,   /* allocation failed */
    KILN_EFORMAT,  /* a file is malformed (corrupt, truncated, lies about sizes) */
    KILN_ENOTFOUND,/* a named thing (file, tensor, field) does not exist */
    KILN_EUNSUPPORTED
} kiln_errcode;

typedef struct kiln_error kiln_error;

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

/* Make a new error. Never returns NULL (falls back to a static out-of-memory error). */
kiln_error *kiln_errorf(kiln_errcode code, const char *fmt, ...) KILN_PRINTF(2, 3);
kiln_error *kiln_verrorf(kiln_errcode code, const char *fmt, va_list ap);
/* Prefix context: "<context>: <old message>". Returns e (NULL stays NULL). */
kiln_error *kiln_error_wrap(kiln_error *e, const char *fmt, ...) KILN_PRINTF(2, 3);
const char *kiln_error_msg(const kiln_error *e);
kiln_errcode kiln_error_code(const kiln_error *e);
void kiln_error_free(kiln_error *e);

/* Propagate an error from a call: KILN_TRY(kiln_st_open(path, &st)); */
#define KILN_TRY(expr)                    \
    do {                                  \
        kiln_error *kiln_try_e_ = (expr); \
        if (kiln_try_e_) return kiln_try_e_; \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
