/* ZeRO-1's partition of the parameters over ranks: whole tensors (Muon orthogonalises whole
 * matrices, so a tensor must not be split), contiguous, each rank near 1/world of the elements. */
#include <stdlib.h>

#include "train_internal.h"

kiln_error *zero1_partition_make(const kiln_zaya *m, int world, zero1_partition *p) {
    p->world = world;
    p->first = calloc((size_t)world + 1, sizeof *p->first);
    p->counts = calloc((size_t)world, sizeof *p->counts);
    p->displs = calloc((size_t)world, sizeof *p->displs);
    if (!p->first || !p->counts || !p->displs) {
        zero1_partition_free(p);
        return kiln_errorf(KILN_ENOMEM, "ZeRO-1 partition");
    }
    /* rank r takes tensors until its running total passes (r+1)/world of the elements */
    int t = 0;
    for (int r = 0; r < world; r++) {
        p->first[r] = t;
        size_t goal = (size_t)((double)m->numel * (r + 1) / world);
        while (t < m->nparams && (r == world - 1 || m->params[t].offset + (size_t)m->params[t].numel / 2 < goal)) t++;
    }
    p->first[world] = m->nparams;
    for (int r = 0; r < world; r++) {
        size_t lo = p->first[r] < m->nparams ? m->params[p->first[r]].offset : m->numel;
        size_t hi = p->first[r + 1] < m->nparams ? m->params[p->first[r + 1]].offset : m->numel;
        p->displs[r] = lo;
        p->counts[r] = hi - lo;
    }
    return NULL;
}

void zero1_partition_free(zero1_partition *p) {
    free(p->first);
    free(p->counts);
    free(p->displs);
    p->first = NULL;
    p->counts = p->displs = NULL;
}

kiln_error *zero1_gather_runs(const zero1_partition *p, const size_t *off, const int64_t *numel,
                              const unsigned char *f32, zero1_run **runs, int *nruns) {
    *runs = NULL, *nruns = 0;
    const int nt = p->first[p->world];
    zero1_run *r = malloc((size_t)(nt ? nt : 1) * sizeof *r); /* at most one run a tensor */
    if (!r) return kiln_errorf(KILN_ENOMEM, "ZeRO-1 all-gather runs");
    int n = 0;
    for (int root = 0; root < p->world; root++)
        for (int i = p->first[root]; i < p->first[root + 1]; i++) {
            const int k = f32[i] != 0;
            if (n && r[n - 1].root == root && r[n - 1].f32 == k) r[n - 1].n = off[i] + (size_t)numel[i] - r[n - 1].off;
            else r[n++] = (zero1_run){.off = off[i], .n = (size_t)numel[i], .root = root, .f32 = k};
        }
    *runs = r, *nruns = n;
    return NULL;
}

void zero1_span_blocks(const size_t *counts, const size_t *displs, int world, size_t lo, size_t hi,
                       size_t *out_counts, size_t *out_displs) {
    for (int r = 0; r < world; r++) {
        const size_t a = displs[r], b = a + counts[r];
        const size_t x = a < lo ? lo : a > hi ? hi : a, y = b < lo ? lo : b > hi ? hi : b;
        out_displs[r] = x - lo, out_counts[r] = y - x;
    }
}
