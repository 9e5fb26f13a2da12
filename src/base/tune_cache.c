#define _POSIX_C_SOURCE 200809L
#include "kiln/tune_cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"

static kiln_error *check_key(const char *key) {
    if (!key || !*key) return kiln_errorf(KILN_EINVAL, "tuning cache: an empty key");
    for (const char *s = key; *s; s++)
        if (*s == '\t' || *s == '\n' || *s == '\r')
            return kiln_errorf(KILN_EINVAL, "tuning cache: key \"%.60s\" holds a tab or a line break", key);
    return NULL;
}

kiln_error *kiln_tune_cache_path(const char *name, char **path) {
    const char *d = getenv("KILN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char *dir = NULL;
    *path = NULL;
    if (d && *d) dir = strdup(d);
    else if (x && *x) dir = kiln_path_join(x, "kiln");
    else if (h && *h) dir = kiln_path_join(h, ".cache/kiln");
    else return kiln_errorf(KILN_ENOTFOUND, "tuning cache: none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME is set");
    if (!dir) return kiln_errorf(KILN_ENOMEM, "tuning cache: out of memory");
    kiln_error *e = kiln_mkdirs(dir);
    if (!e && !(*path = kiln_path_join(dir, name))) e = kiln_errorf(KILN_ENOMEM, "tuning cache: out of memory");
    free(dir);
    return e;
}

/* the value of a "key<TAB>value" line when the line is one (the line NUL-terminated, without its newline) */
static int parse_line(const char *line, const char *key, long *value) {
    const char *tab = strchr(line, '\t');
    const size_t kl = strlen(key);
    if (!tab || (size_t)(tab - line) != kl || memcmp(line, key, kl)) return 0;
    char *end = NULL;
    errno = 0;
    const long v = strtol(tab + 1, &end, 10);
    if (errno || end == tab + 1 || *end) return 0;
    *value = v;
    return 1;
}

/* whether a line has the cache's shape (key, tab, an integer): the lines a store keeps */
static int well_formed(const char *line) {
    const char *tab = strchr(line, '\t');
    if (!tab || tab == line) return 0;
    char *end = NULL;
    errno = 0;
    (void)strtol(tab + 1, &end, 10);
    return !errno && end != tab + 1 && !*end;
}

static kiln_error *read_text(const char *path, char **text, int *missing) {
    size_t len = 0;
    *missing = 0;
    kiln_error *e = kiln_read_file(path, text, &len);
    if (e && kiln_error_code(e) == KILN_ENOTFOUND) {
        kiln_error_free(e);
        *missing = 1;
        return NULL;
    }
    return e;
}

kiln_error *kiln_tune_cache_get(const char *path, const char *key, long *value, int *found) {
    char *text = NULL;
    int missing = 0;
    *found = 0;
    KILN_TRY(check_key(key));
    KILN_TRY(read_text(path, &text, &missing));
    if (missing) return NULL;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        long v;
        if (parse_line(line, key, &v)) *value = v, *found = 1; /* the last line of a key wins */
    }
    free(text);
    return NULL;
}

kiln_error *kiln_tune_cache_put(const char *path, const char *key, long value) {
    char *text = NULL, *out = NULL;
    int missing = 0;
    size_t n = 0, cap = 0;
    kiln_error *e = check_key(key);
    if (!e) e = read_text(path, &text, &missing);
    if (e) return kiln_error_wrap(e, "tuning cache %s", path);
    char mine[64];
    snprintf(mine, sizeof mine, "\t%ld\n", value);
    /* the other keys' well-formed lines in their order, then this key's */
    for (char *line = text, *next; line && *line && !e; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        long v;
        if (!well_formed(line) || parse_line(line, key, &v)) continue;
        const size_t l = strlen(line) + 1;
        if (n + l + 1 > cap) {
            char *o = realloc(out, cap = 2 * (n + l) + 256);
            if (!o) e = kiln_errorf(KILN_ENOMEM, "tuning cache %s: out of memory", path);
            else out = o;
        }
        if (!e) memcpy(out + n, line, l - 1), out[n + l - 1] = '\n', n += l;
    }
    const size_t kl = strlen(key), ml = strlen(mine);
    if (!e && n + kl + ml + 1 > cap) {
        char *o = realloc(out, cap = n + kl + ml + 1);
        if (!o) e = kiln_errorf(KILN_ENOMEM, "tuning cache %s: out of memory", path);
        else out = o;
    }
    if (!e) {
        memcpy(out + n, key, kl), memcpy(out + n + kl, mine, ml), n += kl + ml;
        e = kiln_write_file_atomic(path, out, n);
    }
    free(text);
    free(out);
    return e;
}
