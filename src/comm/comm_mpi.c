/* The MPI backend (OpenMPI): one process per rank, CPU buffers. Counts above INT_MAX are split
 * into chunks, since MPI's counts are ints. */
#include <stdlib.h>
#include <string.h>

#include "kiln/comm.h"

#ifdef KILN_HAVE_MPI
#include <limits.h>
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

static void fin(kiln_comm *c) {
    MPI_Finalize();
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
    if (!c) return kiln_errorf(KILN_ENOMEM, "communicator");
    *c = (kiln_comm){"mpi", 0, 1, ar, ar64, rs, ag, bc, barrier, fin, NULL};
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    *out = c;
    return NULL;
}

#else

int kiln_comm_have_mpi(void) { return 0; }

kiln_error *kiln_comm_init(int *argc, char ***argv, kiln_comm **out) {
    (void)argc, (void)argv;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
        return kiln_errorf(KILN_EUNSUPPORTED, "started by mpirun with %s ranks, but kiln was built without MPI "
                           "(install libopenmpi-dev and rebuild)", getenv("OMPI_COMM_WORLD_SIZE"));
    return kiln_comm_local(out);
}

#endif
