/* Diagnostics on stderr, one line per message:
 *   kiln: error: ...     kiln: warning: ...     kiln: ...     kiln: debug: ...
 *
 * The level is read from the environment variable KILN_LOG
 * (error|warn|info|debug) on first use; the default is info. An explicit
 * kiln_log_set_level() wins over the environment.
 * Safe to call from several threads (each message is written with one call).
 */
#ifndef KILN_LOG_H
#define KILN_LOG_H

#include <stdarg.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KILN_LOG_ERROR = 0,
    KILN_LOG_WARN = 1,
    KILN_LOG_INFO = 2,
    KILN_LOG_DEBUG = 3
} kiln_log_level;

/* Messages above `level` are dropped. */
void kiln_log_set_level(kiln_log_level level);
kiln_log_level kiln_log_get_level(void);
/* Would a message at this level be printed? (Skip expensive formatting.) */
int kiln_log_enabled(kiln_log_level level);
/* "error", "warn"/"warning", "info", "debug" (any case) -> level; returns 0
 * on success, -1 for anything else (for KILN_LOG and command-line flags). */
int kiln_log_level_parse(const char *name, kiln_log_level *out);

/* printf-style; a trailing newline is added if the message lacks one. */
void kiln_log(kiln_log_level level, const char *fmt, ...) KILN_PRINTF(2, 3);
void kiln_vlog(kiln_log_level level, const char *fmt, va_list ap);

#ifdef __cplusplus
}
#endif
#endif
