/* KILN_FAULT: the fault-injection spec, a testing hook ("kill:rank=1:step=7,nan:rank=0:step=9").
 * Each fault fires in one launch only (attempt=, default 1), so the restarted run gets past it and
 * a test can compare its final weights with a fault-free run's. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ft.h"

static const struct { const char *name; kiln_fault_kind kind; } kinds[] = {
    {"kill", KILN_FAULT_KILL}, {"stop", KILN_FAULT_STOP}, {"nan", KILN_FAULT_NAN}, {"spike", KILN_FAULT_SPIKE},
    {"slow", KILN_FAULT_SLOW}, {"disk-full", KILN_FAULT_DISK_FULL}, {"crash-in-save", KILN_FAULT_CRASH_IN_SAVE},
    {"slow-save", KILN_FAULT_SLOW_SAVE},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static kiln_error *parse_one(const char *item, kiln_fault *f) {
    char buf[512];
    if (strlen(item) >= sizeof buf) return kiln_errorf(KILN_EINVAL, "KILN_FAULT: '%.40s...' is too long", item);
    snprintf(buf, sizeof buf, "%s", item);
    char *save = NULL, *tok = strtok_r(buf, ":", &save);
    if (!tok) return kiln_errorf(KILN_EINVAL, "KILN_FAULT: empty fault");
    size_t k = 0;
    while (k < NKINDS && strcmp(kinds[k].name, tok)) k++;
    if (k == NKINDS)
        return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': unknown kind '%s' (kill, stop, nan, spike, slow, disk-full, "
                           "crash-in-save, slow-save)", item, tok);
    *f = (kiln_fault){kinds[k].kind, 0, 1, -1, 4096, 200, 0};
    while ((tok = strtok_r(NULL, ":", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq) return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': '%s' is not key=value", item, tok);
        *eq = 0;
        char *end;
        errno = 0;
        long long v = strtoll(eq + 1, &end, 10);
        if (errno || end == eq + 1 || *end || v < 0)
            return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': %s='%s' is not a non-negative integer", item, tok, eq + 1);
        /* rank and attempt are ints: a larger value must not wrap onto a real rank (4294967296 -> 0) */
        if ((!strcmp(tok, "rank") || !strcmp(tok, "attempt")) && v > INT_MAX)
            return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': %s=%lld is out of range (0..%d)", item, tok, v, INT_MAX);
        if (!strcmp(tok, "rank")) f->rank = (int)v;
        else if (!strcmp(tok, "step")) f->step = v;
        else if (!strcmp(tok, "attempt")) f->attempt = (int)v;
        else if (!strcmp(tok, "bytes")) f->bytes = v;
        else if (!strcmp(tok, "ms")) f->ms = v;
        else if (!strcmp(tok, "steps")) f->steps = v;
        else return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': unknown key '%s' (rank, step, attempt, bytes, ms, steps)",
                                item, tok);
    }
    if (f->step < 1) return kiln_errorf(KILN_EINVAL, "KILN_FAULT '%s': needs step=N (N >= 1)", item);
    return NULL;
}

kiln_error *kiln_faults_parse(const char *spec, kiln_faults *out) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return NULL;
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (out->n == (int)(sizeof out->f / sizeof out->f[0]))
            return kiln_errorf(KILN_EINVAL, "KILN_FAULT: more than %d faults", out->n);
        char item[300];
        snprintf(item, sizeof item, "%.*s", (int)(end - p), p);
        KILN_TRY(parse_one(item, &out->f[out->n]));
        out->n++;
        p = *end ? end + 1 : end;
    }
    return NULL;
}

const kiln_fault *kiln_faults_find(const kiln_faults *f, kiln_fault_kind kind, int rank, int64_t step, int attempt) {
    for (int i = 0; i < f->n; i++) {
        const kiln_fault *x = &f->f[i];
        if (x->kind != kind || x->rank != rank || x->attempt != attempt) continue;
        if (x->step == step || ((kind == KILN_FAULT_SLOW || kind == KILN_FAULT_SLOW_SAVE) && step >= x->step)) return x;
    }
    return NULL;
}
