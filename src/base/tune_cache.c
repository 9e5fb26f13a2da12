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

/* A "key<TAB>integer" line (NUL-terminated, without its newline): its key's length and value; 0 when the line is
 * not one (no tab, an empty key, not an integer). */
static int parse_line(const char *line, size_t *klen, long *value) {
    const char *tab = strchr(line, '\t');
    if (!tab || tab == line) return 0;
    char *end = NULL;
    errno = 0;
    const long v = strtol(tab + 1, &end, 10);
    if (errno || end == tab + 1 || *end) return 0;
    *klen = (size_t)(tab - line), *value = v;
    return 1;
}

static int is_key(const char *line, size_t klen, const char *key) { return klen == strlen(key) && !memcmp(line, key, klen); }

/* out[n..] = data[0..len), growing out */
static kiln_error *append(char **out, size_t *n, size_t *cap, const char *data, size_t len) {
    if (*n + len > *cap) {
        const size_t c = 2 * (*n + len) + 256;
        char *o = realloc(*out, c);
        if (!o) return kiln_errorf(KILN_ENOMEM, "tuning cache: out of memory");
        *out = o, *cap = c;
    }
    memcpy(*out + *n, data, len);
    *n += len;
    return NULL;
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
        size_t kl;
        long v;
        if (parse_line(line, &kl, &v) && is_key(line, kl, key)) *value = v, *found = 1; /* the last line of a key wins */
    }
    free(text);
    return NULL;
}

kiln_error *kiln_tune_cache_put(const char *path, const char *key, long value) {
    char *text = NULL, *out = NULL, mine[32];
    int missing = 0;
    size_t n = 0, cap = 0;
    kiln_error *e = check_key(key);
    if (!e) e = read_text(path, &text, &missing);
    /* the other keys' well-formed lines in their order, then this key's */
    for (char *line = text, *next; !e && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t kl;
        long v;
        if (!parse_line(line, &kl, &v) || is_key(line, kl, key)) continue;
        const size_t l = strlen(line);
        line[l] = '\n'; /* back over the NUL (the last line's is read_file's extra byte) */
        e = append(&out, &n, &cap, line, l + 1);
    }
    snprintf(mine, sizeof mine, "\t%ld\n", value);
    if (!e) e = append(&out, &n, &cap, key, strlen(key));
    if (!e) e = append(&out, &n, &cap, mine, strlen(mine));
    if (!e) e = kiln_write_file_atomic(path, out, n);
    free(text);
    free(out);
    return e;
}
