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

/* ---- typed collectives: with one rank, each is a copy of count elements (none when in place) ---- */
static kiln_error *copy_dt(const void *send, void *recv, size_t count, kiln_dtype dt, const char *what) {
    if (dt != KILN_DT_F32 && dt != KILN_DT_BF16 && dt != KILN_DT_F64)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: dtype %s is not supported (F32, BF16, F64)", what,
                           kiln_dtype_name(dt));
    if (send != recv && count) memmove(recv, send, count * kiln_dtype_size(dt));
    return NULL;
}
static kiln_error *ar_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    (void)c;
    return copy_dt(s, r, n, dt, "all-reduce");
}
static kiln_error *rs_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    (void)c;
    return copy_dt(s, r, n, dt, "reduce-scatter");
}
static kiln_error *ag_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    (void)c;
    return copy_dt(s, r, n, dt, "all-gather");
}
static kiln_error *bc_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt, int root) {
    (void)c;
    if (root != 0) return kiln_errorf(KILN_EINVAL, "broadcast: root %d with 1 rank", root);
    return copy_dt(s, r, n, dt, "broadcast");
}
static kiln_error *a2a_dt(kiln_comm *c, const void *s, void *r, size_t n, kiln_dtype dt) {
    (void)c;
    return copy_dt(s, r, n, dt, "all-to-all");
}
static kiln_error *max64(kiln_comm *c, double *b, size_t n) { (void)c, (void)b, (void)n; return NULL; }

kiln_error *kiln_comm_local(kiln_comm **out) {
    kiln_comm *c = calloc(1, sizeof *c);
    if (!c) return kiln_errorf(KILN_ENOMEM, "communicator");
    *c = (kiln_comm){.backend = "local", .rank = 0, .size = 1, .allreduce_sum = ar, .allreduce_sum_f64 = ar64,
                     .reduce_scatter_sum = rs, .allgather = ag, .broadcast = bc, .barrier = barrier, .finalize = fin,
                     .allreduce_sum_dt = ar_dt, .reduce_scatter_sum_dt = rs_dt, .allgather_dt = ag_dt,
                     .broadcast_dt = bc_dt, .alltoall_dt = a2a_dt, .allreduce_max_f64 = max64};
    *out = c;
    return NULL;
}
