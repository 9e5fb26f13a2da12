/* The single-process backend: every collective over one rank is the identity (or a copy). */
#include <stdlib.h>
#include <string.h>

#include "kiln/comm.h"

static kiln_error *ar(kiln_comm *c, float *b, size_t n) { (void)c, (void)b, (void)n; return NULL; }
static kiln_error *ar64(kiln_comm *c, double *b, size_t n) { (void)c, (void)b, (void)n; return NULL; }
static kiln_error *rs(kiln_comm *c, const float *send, float *recv, const size_t *counts, const size_t *displs) {
    (void)c;
    if (send + displs[0] != recv) memmove(recv, send + displs[0], counts[0] * sizeof(float));
    return NULL;
}
static kiln_error *ag(kiln_comm *c, float *b, const size_t *counts, const size_t *displs) {
    (void)c, (void)b, (void)counts, (void)displs;
    return NULL;
}
static kiln_error *bc(kiln_comm *c, void *b, size_t n, int root) { (void)c, (void)b, (void)n, (void)root; return NULL; }
static kiln_error *barrier(kiln_comm *c) { (void)c; return NULL; }
static void fin(kiln_comm *c) { free(c); }

kiln_error *kiln_comm_local(kiln_comm **out) {
    kiln_comm *c = calloc(1, sizeof *c);
    if (!c) return kiln_errorf(KILN_ENOMEM, "communicator");
    *c = (kiln_comm){"local", 0, 1, ar, ar64, rs, ag, bc, barrier, fin, NULL};
    *out = c;
    return NULL;
}
