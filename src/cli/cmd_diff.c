/* kiln diff A.safetensors B.safetensors [--tol X]
 * Compares the tensors two files share, as the tests do: per tensor max|a-b| / max|b| (B is the
 * reference). Lists tensors found in only one file. Exit 1 if any shared tensor exceeds --tol or
 * the names differ. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln/safetensors.h"

static const char usage[] =
    "usage: kiln diff A.safetensors B.safetensors [--tol X] [--all]\n\n"
    "Compares every tensor the two files share (B is the reference): relative error\n"
    "max|a-b| / max|b| per tensor. Prints the worst tensors (all with --all), exits 1 if any\n"
    "exceeds --tol (default 1e-4), holds a NaN, or an infinity the other file does not have at\n"
    "that element, or if a tensor is in only one file or has another shape.\n";

typedef struct {
    const char *name;
    double rel;
    int64_t nonfinite; /* elements with a NaN, or an infinity not on both sides */
} diff_row;

static int by_rel_desc(const void *a, const void *b) {
    double x = ((const diff_row *)a)->rel, y = ((const diff_row *)b)->rel;
    return x < y ? 1 : x > y ? -1 : 0;
}

static kiln_error *run(const char *pa, const char *pb, double tol, int all, int *bad) {
    kiln_st *a = NULL, *b = NULL;
    kiln_error *e = kiln_st_open(pa, &a);
    if (!e) e = kiln_st_open(pb, &b);
    size_t nb = b ? kiln_st_count(b) : 0;
    diff_row *rows = e ? NULL : calloc(nb + 1, sizeof *rows);
    size_t nrows = 0;
    if (!e && !rows) e = kiln_errorf(KILN_ENOMEM, "diff");
    for (size_t i = 0; !e && i < nb; i++) {
        const kiln_st_tensor *tb = kiln_st_at(b, i), *ta = kiln_st_find(a, tb->name);
        if (!ta) {
            printf("only in %s: %s\n", pb, tb->name);
            (*bad)++;
            continue;
        }
        int same = ta->ndim == tb->ndim;
        for (int d = 0; same && d < ta->ndim; d++) same = ta->shape[d] == tb->shape[d];
        if (!same) {
            printf("shape differs: %s\n", tb->name);
            (*bad)++;
            continue;
        }
        float *va = malloc((size_t)ta->numel * sizeof(float) + 1), *vb = malloc((size_t)tb->numel * sizeof(float) + 1);
        if (!va || !vb) e = kiln_errorf(KILN_ENOMEM, "diff: tensor '%s'", tb->name);
        if (!e) e = kiln_st_read_f32(ta, va, (size_t)ta->numel);
        if (!e) e = kiln_st_read_f32(tb, vb, (size_t)tb->numel);
        if (!e) {
            /* a NaN on either side, or an infinity the other side does not have, fails the tensor (fmax would drop
             * a NaN, and inf/inf is NaN, which compares false with the tolerance); the same infinity on both sides
             * agrees and is left out of max|b| */
            double md = 0, mr = 0;
            int64_t nonfinite = 0;
            for (int64_t j = 0; j < tb->numel; j++) {
                const double x = va[j], y = vb[j];
                if (!isfinite(x) || !isfinite(y)) {
                    nonfinite += isnan(x) || isnan(y) || x != y;
                    continue;
                }
                md = fmax(md, fabs(x - y));
                mr = fmax(mr, fabs(y));
            }
            const double rel = nonfinite ? INFINITY : mr > 0 ? md / mr : md;
            rows[nrows++] = (diff_row){tb->name, rel, nonfinite};
            if (rel > tol) (*bad)++;
        }
        free(va);
        free(vb);
    }
    for (size_t i = 0; !e && i < kiln_st_count(a); i++)
        if (!kiln_st_find(b, kiln_st_at(a, i)->name)) {
            printf("only in %s: %s\n", pa, kiln_st_at(a, i)->name);
            (*bad)++;
        }
    if (!e) {
        qsort(rows, nrows, sizeof *rows, by_rel_desc);
        size_t show = all ? nrows : (nrows < 5 ? nrows : 5);
        printf("%-64s %12s\n", "tensor (worst first)", "rel err");
        for (size_t i = 0; i < show; i++)
            if (rows[i].nonfinite)
                printf("%-64s %12s  %lld NaN/Inf element%s not in both\n", rows[i].name, "non-finite",
                       (long long)rows[i].nonfinite, rows[i].nonfinite == 1 ? "" : "s");
            else printf("%-64s %12.3e%s\n", rows[i].name, rows[i].rel, rows[i].rel > tol ? "  > tol" : "");
        printf("%zu tensors compared, %d problems (tolerance %.1e)\n", nrows, *bad, tol);
    }
    free(rows);
    kiln_st_close(a);
    kiln_st_close(b);
    return e;
}

static int cmd(int argc, char **argv) {
    const char *files[2] = {NULL, NULL};
    int nf = 0, all = 0;
    double tol = 1e-4;
    kiln_error *e = NULL;
    for (int i = 1; i < argc && !e; i++) {
        if (!strcmp(argv[i], "--tol")) {
            if (i + 1 >= argc) e = kiln_errorf(KILN_EINVAL, "--tol needs a value");
            else e = cli_double("--tol", argv[++i], &tol);
            if (!e && !(tol >= 0)) e = kiln_errorf(KILN_EINVAL, "--tol %s: expected a tolerance >= 0", argv[i]);
        } else if (!strcmp(argv[i], "--all")) {
            all = 1;
        } else if (argv[i][0] == '-') {
            e = kiln_errorf(KILN_EINVAL, "unknown option '%s' (see kiln diff --help)", argv[i]);
        } else if (nf < 2) {
            files[nf++] = argv[i];
        } else {
            e = kiln_errorf(KILN_EINVAL, "diff takes two files");
        }
    }
    if (!e && nf != 2) e = kiln_errorf(KILN_EINVAL, "diff takes two files (see kiln diff --help)");
    int bad = 0;
    if (!e) e = run(files[0], files[1], tol, all, &bad);
    if (e) return cli_fail("diff", e);
    return bad ? 1 : 0;
}

const kiln_cmd kiln_cmd_diff = {"diff", "compare the tensors of two safetensors files (relative error)", cmd, usage};
