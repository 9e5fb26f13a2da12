/* The MPI backend (OpenMPI): one process per rank, CPU buffers. Counts above INT_MAX are split
 * into chunks, since MPI's counts are ints. */
#include <stdlib.h>
#include <string.h>

#include "kiln/comm.h"

#ifdef KILN_HAVE_MPI
#include <limits.h>
#include <stdint.h>
#include <mpi.h>

int kiln_comm_have_mpi(void) { return 1; }

static kiln_error *mpi_err(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return NULL;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return kiln_errorf(KILN_EIO, "MPI %s failed: %s", what, s);
}

#define CHUNK ((size_t)1 << 30)

static kiln_error *ar(kiln_comm *c, float *b, size_t n) {
    (void)c;
    for (size_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        KILN_TRY(mpi_err(MPI_Allreduce(MPI_IN_PLACE, b + o, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce"));
    }
    return NULL;
}

static kiln_error *ar64(kiln_comm *c, double *b, size_t n) {
    (void)c;
    return mpi_err(MPI_Allreduce(MPI_IN_PLACE, b, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "allreduce");
}

static kiln_error *counts_int(const kiln_comm *c, const size_t *counts, const size_t *displs, int *ic, int *id) {
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > INT_MAX || displs[r] > INT_MAX)
            return kiln_errorf(KILN_EUNSUPPORTED, "MPI collective: %zu elements at offset %zu exceed MPI's int counts",
                               counts[r], displs[r]);
        ic[r] = (int)counts[r];
        id[r] = (int)displs[r];
    }
    return NULL;
}

static kiln_error *rs(kiln_comm *c, const float *send, float *recv, const size_t *counts, const size_t *displs) {
    int *ic = malloc((size_t)c->size * 2 * sizeof(int));
    if (!ic) return kiln_errorf(KILN_ENOMEM, "reduce-scatter");
    kiln_error *e = counts_int(c, counts, displs, ic, ic + c->size);
    /* partitions are contiguous and in rank order, so MPI_Reduce_scatter's layout is ours */
    if (!e) e = mpi_err(MPI_Reduce_scatter(send, recv, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "reduce-scatter");
    free(ic);
    return e;
}

static kiln_error *ag(kiln_comm *c, float *b, const size_t *counts, const size_t *displs) {
    int *ic = malloc((size_t)c->size * 2 * sizeof(int));
    if (!ic) return kiln_errorf(KILN_ENOMEM, "all-gather");
    kiln_error *e = counts_int(c, counts, displs, ic, ic + c->size);
    if (!e)
        e = mpi_err(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, ic, ic + c->size, MPI_FLOAT, MPI_COMM_WORLD),
                    "all-gather");
    free(ic);
    return e;
}

static kiln_error *bc(kiln_comm *c, void *b, size_t n, int root) {
    (void)c;
    for (size_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        KILN_TRY(mpi_err(MPI_Bcast((char *)b + o, k, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast"));
    }
    return NULL;
}

static kiln_error *barrier(kiln_comm *c) {
    (void)c;
    return mpi_err(MPI_Barrier(MPI_COMM_WORLD), "barrier");
}

/* ---- typed collectives ---- */

typedef struct {
    MPI_Op bf16_sum; /* created on first use */
    int have_bf16_sum;
} mpi_impl;

/* bf16 sum: each pair summed in f32 and rounded to nearest even (a native bf16 add) */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = kiln_f32_to_bf16(kiln_bf16_to_f32(a[i]) + kiln_bf16_to_f32(b[i]));
}

static kiln_error *mpi_type(kiln_dtype dt, MPI_Datatype *t, const char *what) {
    switch (dt) {
    case KILN_DT_F32: *t = MPI_FLOAT; return NULL;
    case KILN_DT_F64: *t = MPI_DOUBLE; return NULL;
    case KILN_DT_BF16: *t = MPI_UINT16_T; return NULL;
    default:
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: dtype %s is not supported (F32, BF16, F64)", what,
                           kiln_dtype_name(dt));
    }
}

static kiln_error *sum_op(kiln_comm *c, kiln_dtype dt, MPI_Op *op) {
    if (dt != KILN_DT_BF16) {
        *op = MPI_SUM;
        return NULL;
    }
    mpi_impl *m = c->impl;
    if (!m->have_bf16_sum) {
        KILN_TRY(mpi_err(MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum), "op create"));
        m->have_bf16_sum = 1;
    }
    *op = m->bf16_sum;
    return NULL;
}

static kiln_error *int_count(size_t n, const char *what) {
    if (n > INT_MAX)
        return kiln_errorf(KILN_EUNSUPPORTED, "MPI %s: %zu elements per rank exceed MPI's int counts", what, n);
    return NULL;
}

static kiln_error *ar_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    KILN_TRY(mpi_type(dt, &t, "all-reduce"));
    KILN_TRY(sum_op(c, dt, &op));
    size_t ts = kiln_dtype_size(dt);
    for (size_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + o * ts;
        KILN_TRY(mpi_err(MPI_Allreduce(s, (char *)recv + o * ts, k, t, op, MPI_COMM_WORLD), "all-reduce"));
    }
    return NULL;
}

static kiln_error *rs_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    KILN_TRY(mpi_type(dt, &t, "reduce-scatter"));
    KILN_TRY(sum_op(c, dt, &op));
    KILN_TRY(int_count(n, "reduce-scatter"));
    size_t ts = kiln_dtype_size(dt);
    if ((const char *)send + (size_t)c->rank * n * ts == (const char *)recv) {
        /* NCCL's in-place layout; MPI's in-place result is the front of the buffer */
        void *buf = (void *)(uintptr_t)send;
        KILN_TRY(mpi_err(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)n, t, op, MPI_COMM_WORLD), "reduce-scatter"));
        if (buf != recv && n) memmove(recv, buf, n * ts);
        return NULL;
    }
    return mpi_err(MPI_Reduce_scatter_block(send, recv, (int)n, t, op, MPI_COMM_WORLD), "reduce-scatter");
}

static kiln_error *ag_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    KILN_TRY(mpi_type(dt, &t, "all-gather"));
    KILN_TRY(int_count(n, "all-gather"));
    size_t ts = kiln_dtype_size(dt);
    if ((const char *)recv + (size_t)c->rank * n * ts == (const char *)send)
        return mpi_err(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)n, t, MPI_COMM_WORLD),
                       "all-gather");
    return mpi_err(MPI_Allgather(send, (int)n, t, recv, (int)n, t, MPI_COMM_WORLD), "all-gather");
}

static kiln_error *bc_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt, int root) {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    KILN_TRY(mpi_type(dt, &t, "broadcast"));
    if (root < 0 || root >= c->size) return kiln_errorf(KILN_EINVAL, "broadcast: root %d of %d ranks", root, c->size);
    size_t ts = kiln_dtype_size(dt);
    if (c->rank == root && send != recv && n) memcpy(recv, send, n * ts);
    for (size_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        KILN_TRY(mpi_err(MPI_Bcast((char *)recv + o * ts, k, t, root, MPI_COMM_WORLD), "broadcast"));
    }
    return NULL;
}

static kiln_error *a2a_dt(kiln_comm *c, const void *send, void *recv, size_t n, kiln_dtype dt) {
    (void)c;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    KILN_TRY(mpi_type(dt, &t, "all-to-all"));
    KILN_TRY(int_count(n, "all-to-all"));
    if (send == recv)
        return mpi_err(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)n, t, MPI_COMM_WORLD),
                       "all-to-all");
    return mpi_err(MPI_Alltoall(send, (int)n, t, recv, (int)n, t, MPI_COMM_WORLD), "all-to-all");
}

static kiln_error *max64(kiln_comm *c, double *b, size_t n) {
    (void)c;
    KILN_TRY(int_count(n, "all-reduce max"));
    return mpi_err(MPI_Allreduce(MPI_IN_PLACE, b, (int)n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "all-reduce max");
}

const char *kiln_comm_mpi_version(void) {
    static char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    if (!v[0] && MPI_Get_library_version(v, &n) == MPI_SUCCESS) v[strcspn(v, "\n")] = 0;
    return v[0] ? v : NULL;
}

static void fin(kiln_comm *c) {
    mpi_impl *m = c->impl;
    if (m && m->have_bf16_sum) MPI_Op_free(&m->bf16_sum);
    MPI_Finalize();
    free(m);
    free(c);
}

/* Started by mpirun/srun? (OpenMPI, MPICH/Hydra and PMIx set these.) */
static int under_launcher(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

kiln_error *kiln_comm_init(int *argc, char ***argv, kiln_comm **out) {
    if (!under_launcher()) return kiln_comm_local(out);
    int rc = MPI_Init(argc, argv);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "init");
    kiln_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return kiln_errorf(KILN_ENOMEM, "communicator");
    }
    *c = (kiln_comm){.backend = "mpi", .rank = 0, .size = 1, .allreduce_sum = ar, .allreduce_sum_f64 = ar64,
                     .reduce_scatter_sum = rs, .allgather = ag, .broadcast = bc, .barrier = barrier, .finalize = fin,
                     .allreduce_sum_dt = ar_dt, .reduce_scatter_sum_dt = rs_dt, .allgather_dt = ag_dt,
                     .broadcast_dt = bc_dt, .alltoall_dt = a2a_dt, .allreduce_max_f64 = max64, .impl = m};
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    *out = c;
    return NULL;
}

#else

int kiln_comm_have_mpi(void) { return 0; }
const char *kiln_comm_mpi_version(void) { return NULL; }

kiln_error *kiln_comm_init(int *argc, char ***argv, kiln_comm **out) {
    (void)argc, (void)argv;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
        return kiln_errorf(KILN_EUNSUPPORTED, "started by mpirun with %s ranks, but kiln was built without MPI "
                           "(install libopenmpi-dev and rebuild)", getenv("OMPI_COMM_WORLD_SIZE"));
    return kiln_comm_local(out);
}

#endif
