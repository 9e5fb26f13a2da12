/* The communication interface of data-parallel training: the few collectives ZeRO-1 needs,
 * behind one struct of function pointers so that the MPI backend (CPU, now) and the NCCL backend
 * (GPU, later) are interchangeable. A single process without MPI uses the "local" backend, whose
 * collectives are copies. All buffers are f32 unless named otherwise; counts are elements. */
#ifndef KILN_COMM_H
#define KILN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

typedef struct kiln_comm kiln_comm;
struct kiln_comm {
    const char *backend;
    int rank, size;
    /* sum over ranks, in place */
    kiln_error *(*allreduce_sum)(kiln_comm *c, float *buf, size_t n);
    kiln_error *(*allreduce_sum_f64)(kiln_comm *c, double *buf, size_t n);
    /* send[n_total] summed over ranks; rank r receives elements [displs[r], displs[r]+counts[r]) into recv */
    kiln_error *(*reduce_scatter_sum)(kiln_comm *c, const float *send, float *recv, const size_t *counts,
                                      const size_t *displs);
    /* rank r contributes buf[displs[r] .. +counts[r]); afterwards every rank has all of buf */
    kiln_error *(*allgather)(kiln_comm *c, float *buf, const size_t *counts, const size_t *displs);
    /* bytes from root to everyone */
    kiln_error *(*broadcast)(kiln_comm *c, void *buf, size_t bytes, int root);
    kiln_error *(*barrier)(kiln_comm *c);
    void (*finalize)(kiln_comm *c);
    void *impl;
};

/* MPI when the process was started by mpirun (and kiln was built with MPI), else local. */
kiln_error *kiln_comm_init(int *argc, char ***argv, kiln_comm **out);
kiln_error *kiln_comm_local(kiln_comm **out);
/* Built with MPI? */
int kiln_comm_have_mpi(void);

#endif
