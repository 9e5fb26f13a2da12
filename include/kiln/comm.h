/* The communication interface of data-parallel training: the few collectives ZeRO-1 needs,
 * behind one struct of function pointers so that the MPI backend (CPU) and the NCCL backend (GPU)
 * are interchangeable. A single process without MPI uses the "local" backend, whose collectives
 * are copies. All buffers are f32 unless named otherwise; counts are elements.
 *
 * Two planes. The data collectives (allreduce_sum, reduce_scatter_sum, allgather and every *_dt
 * call) take buffers where the backend keeps data: host memory for local/MPI, memory of CUDA device
 * `device` for NCCL (device_buffers = 1), and NCCL runs them asynchronously on its stream: call
 * kiln_comm_sync before reading the result on the host. The control calls (allreduce_sum_f64,
 * allreduce_max_f64, broadcast, barrier) always take host memory and return when done: they carry
 * the trainer's and benchmarks' small bookkeeping (loss sums, seeds, times, checksums). */
#ifndef KILN_COMM_H
#define KILN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

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

    /* ---- Typed collectives with NCCL's semantics (`kiln bench comm`, the MoE dispatch, the NCCL backend).
     * dt is KILN_DT_F32, KILN_DT_BF16 or KILN_DT_F64; counts are elements. Sums of bf16 are computed in f32
     * per element and rounded back to bf16 at each reduction step (MPI: a user-defined MPI_Op on 16-bit words).
     * Out of place when the buffers do not overlap; in place exactly as NCCL defines it, noted per call. */
    /* recv[i] = sum over ranks of send[i]; in place when recv == send */
    kiln_error *(*allreduce_sum_dt)(kiln_comm *c, const void *send, void *recv, size_t count, kiln_dtype dt);
    /* send holds size*count elements; rank r gets the sum of block r (elements [r*count, (r+1)*count)) in
     * recv[count]; in place when recv == send + r*count (NCCL's layout; MPI reduces in place into the front
     * of the buffer and moves the block there) */
    kiln_error *(*reduce_scatter_sum_dt)(kiln_comm *c, const void *send, void *recv, size_t count, kiln_dtype dt);
    /* send[count] of rank r lands in recv[r*count ..] on every rank; in place when send == recv + r*count */
    kiln_error *(*allgather_dt)(kiln_comm *c, const void *send, void *recv, size_t count, kiln_dtype dt);
    /* root's send[count] into recv on every rank (send is read on the root only); in place when send == recv */
    kiln_error *(*broadcast_dt)(kiln_comm *c, const void *send, void *recv, size_t count, kiln_dtype dt, int root);
    /* send holds size blocks of count elements: block p goes to rank p and lands in its recv block r (the
     * MoE dispatch/combine exchange); in place when recv == send */
    kiln_error *(*alltoall_dt)(kiln_comm *c, const void *send, void *recv, size_t count, kiln_dtype dt);
    /* max over ranks, in place (the slowest rank's time) */
    kiln_error *(*allreduce_max_f64)(kiln_comm *c, double *buf, size_t n);
    /* wait for the data collectives issued so far (NULL: they are synchronous) */
    kiln_error *(*sync)(kiln_comm *c);
    /* NCCL's group: the data collectives issued between the two calls are launched together at group_end and may
     * run concurrently (several broadcasts from different roots, as one all-gather); every rank issues the same
     * calls in the same order. NULL: the collectives run in order as issued (synchronous backends). */
    kiln_error *(*group_start)(kiln_comm *c);
    kiln_error *(*group_end)(kiln_comm *c);
    /* The data collectives issued after this call read their device buffers after the work queued so far on the
     * CUDA stream `stream` (a cudaStream_t), whatever else the device is running: the ZeRO-1 reduce-scatter of each
     * span of the gradient the backward has finished, while it goes on. NCCL: its stream waits for an event; staged:
     * the next collective waits for that event instead of the whole device. NULL: no such order (host buffers). */
    kiln_error *(*after_stream)(kiln_comm *c, void *stream);
    int device_buffers; /* 1: data collectives take device memory of CUDA device `device` */
    int device;
    void *impl;
};

static inline kiln_error *kiln_comm_sync(kiln_comm *c) { return c->sync ? c->sync(c) : NULL; }
static inline kiln_error *kiln_comm_group_start(kiln_comm *c) { return c->group_start ? c->group_start(c) : NULL; }
static inline kiln_error *kiln_comm_group_end(kiln_comm *c) { return c->group_end ? c->group_end(c) : NULL; }

/* MPI when the process was started by mpirun (and kiln was built with MPI), else local. */
kiln_error *kiln_comm_init(int *argc, char ***argv, kiln_comm **out);
kiln_error *kiln_comm_local(kiln_comm **out);
/* Built with MPI? */
int kiln_comm_have_mpi(void);
/* The MPI library's version line ("Open MPI v4.1.4, ..."), or NULL without MPI. */
const char *kiln_comm_mpi_version(void);

/* ---- NCCL (src/comm/comm_nccl.cu; libnccl.so.2 is loaded at run time, from $KILN_NCCL_LIB when set,
 * so kiln builds without NCCL's headers and runs its CPU paths without it). */
#define KILN_NCCL_ID_BYTES 128
/* A new unique id: made by one rank and handed to the others (MPI broadcast, or shared by threads). */
kiln_error *kiln_comm_nccl_unique_id(unsigned char id[KILN_NCCL_ID_BYTES]);
/* Rank `rank` of `nranks` on CUDA device `device`; blocks until every rank has joined. The calling
 * thread's current device becomes `device`. `boot`, when not NULL, is finalized by this comm's finalize
 * (after NCCL's communicator is destroyed: MPI must outlive it). */
kiln_error *kiln_comm_nccl_create(const unsigned char id[KILN_NCCL_ID_BYTES], int nranks, int rank, int device,
                                  kiln_comm *boot, kiln_comm **out);
/* NCCL over the ranks of `boot` (MPI or local), one GPU per process picked by kiln_gpu_for_rank; an error,
 * on every rank, when a host has more ranks than GPUs or two of its ranks landed on one GPU. On success the new comm owns `boot`. */
kiln_error *kiln_comm_nccl_from(kiln_comm *boot, kiln_comm **out);
/* The first of the per_rank GPUs this rank of `boot` takes (kiln_gpu_for_rank over the host layout), checked on
 * every rank: an error everywhere when any rank has none or two ranks of a host would share one. Collective. */
kiln_error *kiln_comm_pick_gpus(kiln_comm *boot, int per_rank, int *dev0);
/* ---- Staged (src/comm/comm_staged.c): device buffers like NCCL's, each data collective copied to the host and
 * run by `host` (MPI, or local), then copied back; synchronous and slow. Several ranks may share a GPU (the
 * ranks of a host take its GPUs round robin), which NCCL refuses: it runs the GPU trainer's several-rank path
 * on one GPU (KILN_COMM=staged). On success the new comm owns `host`. */
kiln_error *kiln_comm_staged_from(kiln_comm *host, kiln_comm **out);
/* "2.27.3", or an error when libnccl cannot be loaded. */
kiln_error *kiln_comm_nccl_version(char *buf, size_t n);
/* ---- Hosts (src/comm/comm_hosts.c): which ranks share a machine, learned from the ranks themselves (any
 * launcher: mpirun, srun, PMIx), and the GPU each rank takes. A host is a running kernel (its boot id, else its
 * host name), so containers on one machine count as one host. */
typedef struct {
    int local_rank; /* this rank's place among its host's ranks, in rank order */
    int local_size; /* the ranks on its host */
    int nhosts;     /* hosts over all ranks */
    int host_index; /* this rank's host, numbered in the order of the hosts' first ranks */
} kiln_host_layout;
/* This host's identity (a 64-bit hash of the boot id or host name; of $KILN_HOST_ID when set). */
uint64_t kiln_host_id(void);
/* Every rank's value, in rank order (all[size]), through the control plane: any backend. */
kiln_error *kiln_comm_allgather_u64(kiln_comm *c, uint64_t mine, uint64_t *all);
/* The layout of the ranks of c (collective: every rank calls it). */
kiln_error *kiln_comm_host_layout(kiln_comm *c, kiln_host_layout *out);
/* The same from the ranks' host ids (ids[n]) for rank me: no communication. */
kiln_error *kiln_host_layout_of(const uint64_t *ids, int n, int me, kiln_host_layout *out);
/* The first of the per_rank CUDA devices this rank takes, ndev being those it sees: its local rank's own when
 * the host's ranks see enough for all, device 0 when it sees exactly per_rank (a launcher bound them to it), else
 * an error that says how many are needed. */
kiln_error *kiln_gpu_for_rank(const kiln_host_layout *h, int per_rank, int ndev, int *device);
/* 1 when two ranks of one host (host[r]) are on one GPU (gpu[r], e.g. a hash of its PCI bus id): *a < *b are
 * such a pair. */
int kiln_ranks_share_gpu(const uint64_t *host, const uint64_t *gpu, int n, int *a, int *b);

#ifdef __cplusplus
}
#endif
#endif
