/* kiln bench comm: nccl-tests' size and bandwidth conventions (nccl-tests' doc/PERFORMANCE.md), as pure
 * functions so that tests can check them on known inputs.
 *
 * size S (the "size" column) is the full buffer of the operation: per rank for all-reduce and broadcast,
 * count*ranks*typesize for all-gather and reduce-scatter (the gathered / reduced buffer), and each rank's
 * send buffer (ranks blocks) for all-to-all. algbw = S / time; busbw = algbw * factor with the factor
 * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast. GB/s
 * are 1e9 bytes per second. */
#ifndef KILN_BENCH_COMM_FORMULAS_H
#define KILN_BENCH_COMM_FORMULAS_H

#include <stddef.h>

typedef enum {
    KILN_COLL_ALLREDUCE,
    KILN_COLL_REDUCE_SCATTER,
    KILN_COLL_ALLGATHER,
    KILN_COLL_BROADCAST,
    KILN_COLL_ALLTOALL,
    KILN_COLL_COUNT
} kiln_coll;

/* nccl-tests' names: all_reduce, reduce_scatter, all_gather, broadcast, alltoall */
static inline const char *kiln_coll_name(kiln_coll c) {
    static const char *const names[KILN_COLL_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                       "alltoall"};
    return (unsigned)c < KILN_COLL_COUNT ? names[c] : "?";
}

static inline double kiln_coll_busbw_factor(kiln_coll c, int nranks) {
    double n = nranks;
    switch (c) {
    case KILN_COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case KILN_COLL_REDUCE_SCATTER:
    case KILN_COLL_ALLGATHER:
    case KILN_COLL_ALLTOALL: return (n - 1) / n;
    case KILN_COLL_BROADCAST: return 1.0;
    default: return 0.0;
    }
}

/* bytes over time_us microseconds, in GB/s (0 for a zero time) */
static inline double kiln_coll_algbw_gbs(size_t bytes, double time_us) {
    return time_us > 0 ? (double)bytes / 1e3 / time_us : 0.0;
}

static inline double kiln_coll_busbw_gbs(kiln_coll c, int nranks, size_t bytes, double time_us) {
    return kiln_coll_algbw_gbs(bytes, time_us) * kiln_coll_busbw_factor(c, nranks);
}

/* The sweep asks for `bytes`; as nccl-tests, the element count is bytes/typesize, rounded down to a multiple
 * of the ranks where the buffer is split in rank blocks (reduce-scatter, all-gather, all-to-all). Returns
 * the total count (the "count" column; S = count*typesize) and sets *block to the elements per rank block
 * (the count passed to the collective: the whole buffer for all-reduce and broadcast). */
static inline size_t kiln_coll_count(kiln_coll c, size_t bytes, size_t typesize, int nranks, size_t *block) {
    size_t count = bytes / typesize;
    if (c == KILN_COLL_REDUCE_SCATTER || c == KILN_COLL_ALLGATHER || c == KILN_COLL_ALLTOALL) {
        *block = count / (size_t)nranks;
        return *block * (size_t)nranks;
    }
    *block = count;
    return count;
}

#endif
