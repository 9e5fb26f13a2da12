/* Helpers for the kiln bench tests (test_bench.c, test_bench_kernels.c): run a benchmark's main
 * with an argv, read its JSON profile, look up record fields, and check a CSV file. */
#ifndef KILN_BENCH_TESTUTIL_H
#define KILN_BENCH_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "test.h"

/* Calls fn with args (NULL-terminated, at most 63) as argv; stdout is flushed first. */
static inline int run_main(int (*fn)(int, char **), const char *const *args) {
    char *argv[64];
    int argc = 0;
    while (args[argc] && argc < 63) {
        argv[argc] = (char *)args[argc];
        argc++;
    }
    argv[argc] = NULL;
    fflush(stdout);
    return fn(argc, argv);
}

/* The parsed JSON file, or NULL after recording a failure. */
static inline cJSON *load_json(const char *path) {
    cJSON *j = NULL;
    kiln_error *e = kiln_json_parse_file(path, &j);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return NULL;
    }
    return j;
}

/* Field f of o as a number (NAN if absent or not a number) or a string ("" if not a string). */
static inline double num(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static inline const char *str(const cJSON *o, const char *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static inline size_t count_sub(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The CSV file at path must be readable, start with the header line hdr, have `lines` lines and, unless
 * row is NULL, contain row; failures are recorded at the caller's file and line. */
#define CHECK_CSV(path, hdr, lines, row) check_csv_(__FILE__, __LINE__, path, hdr, lines, row)
static inline void check_csv_(const char *file, int line, const char *path, const char *hdr, size_t lines,
                              const char *row) {
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(path, &text, &len);
    if (e) {
        test_fail(file, line, "kiln_read_file(%s) failed: %s", path, kiln_error_msg(e));
        kiln_error_free(e);
    }
    if (text) {
        if (strncmp(text, hdr, strlen(hdr))) test_fail(file, line, "%s: header is not '%s'", path, hdr);
        if (count_sub(text, "\n") != lines)
            test_fail(file, line, "%s: %zu lines, want %zu", path, count_sub(text, "\n"), lines);
        if (row && !strstr(text, row)) test_fail(file, line, "%s: no row '%s'", path, row);
    }
    free(text);
}

#endif
