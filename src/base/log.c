/* Leveled logging to stderr. See include/kiln/log.h. */
#include "kiln/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* -1 until the first use reads KILN_LOG. Atomic so that threads racing on
 * the first message at worst both read the environment, to the same effect. */
static _Atomic int current_level = -1;

int kiln_log_level_parse(const char *name, kiln_log_level *out) {
    static const struct {
        const char *name;
        kiln_log_level level;
    } names[] = {{"error", KILN_LOG_ERROR}, {"warn", KILN_LOG_WARN}, {"warning", KILN_LOG_WARN},
                 {"info", KILN_LOG_INFO},   {"debug", KILN_LOG_DEBUG}};
    if (!name) return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    }
    return -1;
}

kiln_log_level kiln_log_get_level(void) {
    int lvl = atomic_load(&current_level);
    if (lvl >= 0) return (kiln_log_level)lvl;
    kiln_log_level parsed = KILN_LOG_INFO;
    const char *env = getenv("KILN_LOG");
    int bad = env && *env && kiln_log_level_parse(env, &parsed) != 0;
    /* Only the first thread to get here installs the level (and complains),
     * so a kiln_log_set_level() that raced with us is not overwritten. */
    int expected = -1;
    if (atomic_compare_exchange_strong(&current_level, &expected, (int)parsed)) {
        if (bad) fprintf(stderr, "kiln: warning: KILN_LOG='%s' is not one of error|warn|info|debug; using info\n", env);
        return parsed;
    }
    return (kiln_log_level)expected;
}

void kiln_log_set_level(kiln_log_level level) {
    if (level < KILN_LOG_ERROR) level = KILN_LOG_ERROR;
    if (level > KILN_LOG_DEBUG) level = KILN_LOG_DEBUG;
    atomic_store(&current_level, (int)level);
}

int kiln_log_enabled(kiln_log_level level) { return level <= kiln_log_get_level(); }

void kiln_vlog(kiln_log_level level, const char *fmt, va_list ap) {
    if (!kiln_log_enabled(level)) return;
    const char *tag = level <= KILN_LOG_ERROR  ? "kiln: error: "
                      : level == KILN_LOG_WARN ? "kiln: warning: "
                      : level == KILN_LOG_INFO ? "kiln: "
                                               : "kiln: debug: ";
    /* Format the whole line first and write it with one call, so lines from
     * different threads do not interleave mid-line. Long messages fall back
     * to a heap buffer. */
    char small[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    char *msg = small;
    if ((size_t)n >= sizeof small) {
        msg = malloc((size_t)n + 1);
        if (!msg) {
            fprintf(stderr, "%s(message lost: out of memory)\n", tag);
            return;
        }
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
    }
    const char *nl = (n > 0 && msg[n - 1] == '\n') ? "" : "\n";
    fprintf(stderr, "%s%s%s", tag, msg, nl);
    if (msg != small) free(msg);
}

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_vlog(level, fmt, ap);
    va_end(ap);
}
