/* The staged backend of kiln_comm: device buffers (device_buffers = 1, as NCCL's), each data collective
 * copied to host memory, run by the host backend under it (MPI, or local at one rank) and copied back.
 *
 * Why it exists: NCCL refuses two ranks on one GPU, so without it the GPU trainer's several-rank path
 * (the reduce-scatter into each rank's shard, the sharded optimizer, the all-gather, the ranks' checkpoints)
 * could only run on a machine with several GPUs. Staged, `mpirun -np 2 kiln train --device cuda` runs on one
 * GPU (KILN_COMM=staged), so that path is tested wherever a GPU is (tests/gpu/test_gpu_zaya_train.c). It also
 * serves machines whose GPUs have no NCCL. It is slow by design: every collective crosses PCIe twice and is
 * synchronous (sync is NULL).
 *
 * The device is synchronised before each collective reads a device buffer: the callers' kernels may be on
 * non-blocking streams that a copy on the legacy stream would not wait for (kiln_cuda_copy synchronises after
 * its copy, so nothing reads a result before it has landed). After after_stream, the next collective waits only
 * for the work queued on that stream, as NCCL's would: what else is running (the rest of the backward, its side
 * streams) goes on while its buffer is copied, so a span of the gradient handed over before its last writer
 * finished is read unfinished here too, and a test sees it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/comm.h"
#include "kiln/cuda.h"

typedef struct {
    kiln_comm *host;   /* the backend the collectives run on; finalized with this comm */
    void *a, *b;       /* host staging: send side, receive side */
    size_t a_cap, b_cap;
    void *after;       /* after_stream's event (kiln_cuda_event_record) */
    int after_pending; /* the next collective waits for it instead of the whole device */
} staged;

static kiln_error *stage_reserve(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return NULL;
    void *q = realloc(*p, bytes);
    if (!q) return kiln_errorf(KILN_ENOMEM, "staged collective: %zu bytes of host memory", bytes);
    *p = q, *cap = bytes;
    return NULL;
}

/* host staging a (and b when bb > 0), the device idle (or, after after_stream, that stream's work done); NULL on
 * success */
static kiln_error *stage_begin(kiln_comm *c, size_t ab, size_t bb) {
    staged *s = c->impl;
    KILN_TRY(stage_reserve(&s->a, &s->a_cap, ab ? ab : 1));
    if (bb) KILN_TRY(stage_reserve(&s->b, &s->b_cap, bb));
    if (!s->after_pending) return kiln_cuda_device_sync();
    s->after_pending = 0;
    return kiln_cuda_event_sync(s->after);
}

static kiln_error *after(kiln_comm *c, void *stream) {
    staged *s = c->impl;
    KILN_TRY(kiln_cuda_event_record(&s->after, stream));
    s->after_pending = 1;
    return NULL;
}

static kiln_error *down(void *host, const void *dev, size_t bytes) {
    return bytes ? kiln_cuda_copy(host, dev, bytes, KILN_CUDA_D2H) : NULL;
}
static kiln_error *up(void *dev, const void *host, size_t bytes) {
    return bytes ? kiln_cuda_copy(dev, host, bytes, KILN_CUDA_H2D) : NULL;
}

static kiln_error *ar(kiln_comm *c, float *buf, size_t n) {
    staged *s = c->impl;
    KILN_TRY(stage_begin(c, n * sizeof(float), 0));
    KILN_TRY(down(s->a, buf, n * sizeof(float)));
    KILN_TRY(s->host->allreduce_sum(s->host, s->a, n));
    return up(buf, s->a, n * sizeof(float));
}

/* the elements a partition covers: the end of its furthest block */
static size_t part_end(const kiln_comm *c, const size_t *counts, const size_t *displs) {
    size_t n = 0;
    for (int r = 0; r < c->size; r++)
        if (displs[r] + counts[r] > n) n = displs[r] + counts[r];
    return n;
}

static kiln_error *rs(kiln_comm *c, const float *send, float *recv, const size_t *counts, const size_t *displs) {
    staged *s = c->impl;
    const size_t n = part_end(c, counts, displs), mine = counts[c->rank];
    KILN_TRY(stage_begin(c, n * sizeof(float), (mine ? mine : 1) * sizeof(float)));
    KILN_TRY(down(s->a, send, n * sizeof(float)));
    KILN_TRY(s->host->reduce_scatter_sum(s->host, s->a, s->b, counts, displs));
    return up(recv, s->b, mine * sizeof(float));
}

static kiln_error *ag(kiln_comm *c, float *buf, const size_t *counts, const size_t *displs) {
    staged *s = c->impl;
    const size_t n = part_end(c, counts, displs);
    KILN_TRY(stage_begin(c, n * sizeof(float), 0));
    /* the host all-gather reads this rank's block and writes the others' */
    KILN_TRY(down((float *)s->a + displs[c->rank], buf + displs[c->rank], counts[c->rank] * sizeof(float)));
    KILN_TRY(s->host->allgather(s->host, s->a, counts, displs));
    return up(buf, s->a, n * sizeof(float));
}

/* ---- typed collectives: send staged into a, the host's out-of-place call into b, b copied to recv ---- */
static kiln_error *typed(kiln_comm *c, const void *send, size_t send_n, size_t recv_n, kiln_dtype dt, int read_send,
                         const char *what) {
    if (dt != KILN_DT_F32 && dt != KILN_DT_BF16 && dt != KILN_DT_F64)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: dtype %s is not supported (F32, BF16, F64)", what,
                           kiln_dtype_name(dt));
    staged *s = c->impl;
    const size_t es = kiln_dtype_size(dt);
    KILN_TRY(stage_begin(c, send_n * es, (recv_n ? recv_n : 1) * es));
    return read_send ? down(s->a, send, send_n * es) : NULL;
}

static kiln_error *ar_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    staged *s = c->impl;
    KILN_TRY(typed(c, send, n, n, dt, 1, "all-reduce"));
    KILN_TRY(s->host->allreduce_sum_dt(s->host, s->a, s->b, n, dt));
    return up(recv, s->b, n * kiln_dtype_size(dt));
}
static kiln_error *rs_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    staged *s = c->impl;
    KILN_TRY(typed(c, send, n * (size_t)c->size, n, dt, 1, "reduce-scatter"));
    KILN_TRY(s->host->reduce_scatter_sum_dt(s->host, s->a, s->b, n, dt));
    return up(recv, s->b, n * kiln_dtype_size(dt));
}
static kiln_error *ag_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    staged *s = c->impl;
    KILN_TRY(typed(c, send, n, n * (size_t)c->size, dt, 1, "all-gather"));
    KILN_TRY(s->host->allgather_dt(s->host, s->a, s->b, n, dt));
    return up(recv, s->b, n * (size_t)c->size * kiln_dtype_size(dt));
}
static kiln_error *bc_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt, int root) {
    staged *s = c->impl;
    if (root < 0 || root >= c->size) return kiln_errorf(KILN_EINVAL, "broadcast: root %d is not a rank of %d", root, c->size);
    /* send is read on the root only */
    KILN_TRY(typed(c, send, n, n, dt, c->rank == root, "broadcast"));
    KILN_TRY(s->host->broadcast_dt(s->host, s->a, s->b, n, dt, root));
    return up(recv, s->b, n * kiln_dtype_size(dt));
}
static kiln_error *a2a_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    staged *s = c->impl;
    KILN_TRY(typed(c, send, n * (size_t)c->size, n * (size_t)c->size, dt, 1, "all-to-all"));
    KILN_TRY(s->host->alltoall_dt(s->host, s->a, s->b, n, dt));
    return up(recv, s->b, n * (size_t)c->size * kiln_dtype_size(dt));
}

/* ---- the control plane is host memory: the host backend's own calls ---- */
static kiln_error *ar64(kiln_comm *c, double *b, size_t n) {
    staged *s = c->impl;
    return s->host->allreduce_sum_f64(s->host, b, n);
}
static kiln_error *max64(kiln_comm *c, double *b, size_t n) {
    staged *s = c->impl;
    return s->host->allreduce_max_f64(s->host, b, n);
}
static kiln_error *bc(kiln_comm *c, void *b, size_t n, int root) {
    staged *s = c->impl;
    return s->host->broadcast(s->host, b, n, root);
}
static kiln_error *barrier(kiln_comm *c) {
    staged *s = c->impl;
    return s->host->barrier(s->host);
}
static void fin(kiln_comm *c) {
    staged *s = c->impl;
    s->host->finalize(s->host);
    kiln_cuda_event_free(s->after);
    free(s->a), free(s->b), free(s), free(c);
}

kiln_error *kiln_comm_staged_from(kiln_comm *host, kiln_comm **out) {
    *out = NULL;
    if (host->device_buffers)
        return kiln_errorf(KILN_EINVAL, "staged collectives need a host backend under them, not %s", host->backend);
    kiln_host_layout h;
    KILN_TRY(kiln_comm_host_layout(host, &h));
    const int lr = h.local_rank;
    int ndev = 0;
    kiln_error *e = kiln_cuda_device_count(&ndev);
    if (!e && ndev < 1) e = kiln_errorf(KILN_EIO, "rank %d: no CUDA device", host->rank);
    /* the ranks of a host share its GPUs round robin (several on one GPU is what this backend allows) */
    if (!e) e = kiln_cuda_set_device(lr % ndev);
    /* every rank learns whether all can go on: one that returned alone would leave the others waiting */
    double bad = e != NULL;
    kiln_error *ae = host->allreduce_sum_f64(host, &bad, 1);
    if (e || ae) {
        kiln_error_free(ae);
        return e ? e : kiln_errorf(KILN_EIO, "rank %d: agreeing on the staged backend failed", host->rank);
    }
    if (bad > 0) return kiln_errorf(KILN_EIO, "rank %d: another rank has no usable GPU", host->rank);
    kiln_comm *c = calloc(1, sizeof *c);
    staged *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c), free(s);
        return kiln_errorf(KILN_ENOMEM, "communicator");
    }
    s->host = host;
    *c = (kiln_comm){.backend = "staged", .rank = host->rank, .size = host->size, .allreduce_sum = ar,
                     .allreduce_sum_f64 = ar64, .reduce_scatter_sum = rs, .allgather = ag, .broadcast = bc,
                     .barrier = barrier, .finalize = fin, .allreduce_sum_dt = ar_dt, .reduce_scatter_sum_dt = rs_dt,
                     .allgather_dt = ag_dt, .broadcast_dt = bc_dt, .alltoall_dt = a2a_dt,
                     .allreduce_max_f64 = max64, .after_stream = after, .device_buffers = 1, .device = lr % ndev, .impl = s};
    *out = c;
    return NULL;
}
