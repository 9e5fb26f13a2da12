/* kiln bench comm: nccl-tests' size and bandwidth conventions (nccl-tests' doc/PERFORMANCE.md), as pure
 * functions so that tests can check them on known inputs.
 *
 * size S (the "size" column) is the full buffer of the operation: per rank for all-reduce and broadcast,
 * count*ranks*typesize for all-gather and reduce-scatter (the gathered / reduced buffer), and each rank's
 * send buffer (ranks blocks) for all-to-all. algbw = S / time; busbw = algbw * factor with the factor
 * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast. GB/s
 * are 1e9 bytes per second.
 *
 * One rank moves no data between ranks: every factor is 0 there, broadcast's too (nccl-tests keeps 1, which
 * reports a one-rank broadcast's local copy, or in place nothing at all, as bus bandwidth). In place on one
 * rank nothing moves at all, not even a copy: algbw is 0 too (kiln_coll_moved says which). The calls are
 * still timed.
 *
 * The fill patterns of the check are here too, so that tests can check their properties. */
#ifndef KILN_BENCH_COMM_FORMULAS_H
#define KILN_BENCH_COMM_FORMULAS_H

#include <stddef.h>
#include <stdint.h>

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
    if (nranks <= 1) return 0.0; /* no bus: nothing crosses between ranks */
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

/* What one call moves: data between ranks (2+ ranks), a local copy send -> recv (one rank, out of place) or
 * nothing (one rank, in place). The record's "moved" field. */
typedef enum { KILN_COLL_MOVES_NONE, KILN_COLL_MOVES_LOCAL_COPY, KILN_COLL_MOVES_BETWEEN_RANKS } kiln_coll_moves;

static inline kiln_coll_moves kiln_coll_moved(int nranks, int inplace) {
    return nranks > 1 ? KILN_COLL_MOVES_BETWEEN_RANKS : inplace ? KILN_COLL_MOVES_NONE : KILN_COLL_MOVES_LOCAL_COPY;
}

static inline const char *kiln_coll_moved_name(kiln_coll_moves m) {
    return m == KILN_COLL_MOVES_BETWEEN_RANKS ? "between_ranks" : m == KILN_COLL_MOVES_LOCAL_COPY ? "local_copy" : "none";
}

/* algbw of one call: S / time, except where the call moves nothing (one rank in place): 0 */
static inline double kiln_coll_call_algbw_gbs(int nranks, int inplace, size_t bytes, double time_us) {
    return kiln_coll_moved(nranks, inplace) == KILN_COLL_MOVES_NONE ? 0.0 : kiln_coll_algbw_gbs(bytes, time_us);
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

/* ---- the check's fill patterns: small integers, exact in f32 and bf16 ----
 *
 * Reductions: element j of rank r is bit (r mod 64) of a 64-bit mix of j, 0 or 1. Ranks come in groups of 64
 * (group r / 64); at most four groups take part at any element, so that every partial sum, whatever MPI's or
 * NCCL's order of additions, is an integer <= 256, exact in bf16 (8 significant bits): up to 256 ranks all of them
 * do, beyond it group g takes part at the elements j with j mod m == g mod m, m = ceil(groups / 4) (a lost rank
 * still shows at 1/m of the elements). The expected sum S_n(j) over n ranks is a popcount of the mix; it varies
 * from element to element for every n (a pattern periodic in j or summing to 0 over the ranks would let a result
 * of zeros, or rank r's block delivered to another rank, pass the check: ((j + 3r) mod 5) - 2 did both, at 5k
 * ranks and at blocks of 5k elements).
 * Data movement: ((31j + 17r) mod 251) - 125, distinct for every rank below 251 at each j. */
static inline uint64_t kiln_coll_mix(uint64_t j) { /* splitmix64's finaliser */
    uint64_t z = j + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* m above: 1 up to 256 ranks */
static inline size_t kiln_coll_red_period(int nranks) {
    const size_t groups = ((size_t)nranks + 63) / 64;
    return groups <= 4 ? 1 : (groups + 3) / 4;
}

static inline float kiln_coll_red_val(int nranks, int r, size_t j) {
    const size_t m = kiln_coll_red_period(nranks);
    if (j % m != ((size_t)r >> 6) % m) return 0.0f;
    return (float)((kiln_coll_mix((uint64_t)j) >> ((unsigned)r & 63)) & 1);
}

static inline int kiln_coll_popcount64(uint64_t x) { return __builtin_popcountll(x); }

/* the sum over ranks 0..nranks-1 of kiln_coll_red_val(nranks, r, j) */
static inline float kiln_coll_red_sum(int nranks, size_t j) {
    const uint64_t h = kiln_coll_mix((uint64_t)j);
    const size_t m = kiln_coll_red_period(nranks), groups = ((size_t)nranks + 63) / 64;
    const unsigned rem = (unsigned)nranks & 63;
    int sum = 0;
    for (size_t g = j % m; g < groups; g += m) /* the groups taking part at j: full ones, and the last maybe not */
        sum += kiln_coll_popcount64(g == groups - 1 && rem ? h & ((1ull << rem) - 1) : h);
    return (float)sum;
}

static inline float kiln_coll_mov_val(int r, size_t j) {
    return (float)((int)((j * 31 + (size_t)r * 17) % 251) - 125);
}

#endif
