/* Which ranks share a host, learned from the ranks themselves, and the GPU each one takes.
 *
 * Why not the launcher's environment: OpenMPI's mpirun sets OMPI_COMM_WORLD_LOCAL_RANK and MPICH's Hydra
 * MPI_LOCALRANKID, but srun, PMIx direct launch and most cluster schedulers set neither, and a rank that
 * believed itself alone on its host took GPU 0 beside every other rank there. So each rank contributes an
 * identity of its host and every rank derives the same layout from all of them: its place among its host's
 * ranks, their number, and the number of hosts (node boundaries, for `kiln bench comm`'s records).
 *
 * The identity is the running kernel's boot id (/proc/sys/kernel/random/boot_id), else the host name. Two
 * containers on one machine share the kernel, and so its GPUs, though their host names differ. KILN_HOST_ID=NAME
 * overrides it (a setup where that is wrong; the tests' way to put ranks of one machine on several "hosts"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/comm.h"
#include "kiln/hash.h"

uint64_t kiln_host_id(void) {
    const char *over = getenv("KILN_HOST_ID");
    if (over && *over) return kiln_fnv1a64(kiln_fnv1a64(KILN_FNV1A64_INIT, "user:", 5), over, strlen(over));
    char buf[256] = {0};
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    const char *tag = "boot:";
    if (n < 16) { /* no /proc (or a truncated read): the host name */
        tag = "name:";
        memset(buf, 0, sizeof buf);
        if (gethostname(buf, sizeof buf - 1)) snprintf(buf, sizeof buf, "unknown");
        n = strlen(buf);
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
    uint64_t h = kiln_fnv1a64(KILN_FNV1A64_INIT, tag, 5);
    return kiln_fnv1a64(h, buf, n);
}

/* ranks' (id, rank) pairs in id order, ranks ascending within an id */
typedef struct {
    uint64_t id;
    int rank;
} id_rank;

static int cmp_id_rank(const void *a, const void *b) {
    const id_rank *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

kiln_error *kiln_host_layout_of(const uint64_t *ids, int n, int me, kiln_host_layout *out) {
    memset(out, 0, sizeof *out);
    if (n < 1 || me < 0 || me >= n) return kiln_errorf(KILN_EINVAL, "host layout: rank %d of %d", me, n);
    id_rank *p = malloc((size_t)n * sizeof *p);
    if (!p) return kiln_errorf(KILN_ENOMEM, "host layout of %d ranks", n);
    for (int r = 0; r < n; r++) p[r] = (id_rank){ids[r], r};
    qsort(p, (size_t)n, sizeof *p, cmp_id_rank);
    /* each host's first rank is the first of its run; hosts are numbered in the order of their first ranks */
    int first_mine = -1;
    for (int i = 0; i < n; i++)
        if (p[i].id == ids[me] && first_mine < 0) first_mine = p[i].rank;
    for (int i = 0; i < n; i++) {
        const int starts = i == 0 || p[i].id != p[i - 1].id;
        out->nhosts += starts;
        if (starts && p[i].rank < first_mine) out->host_index++;
        if (p[i].id == ids[me]) {
            out->local_size++;
            if (p[i].rank < me) out->local_rank++;
        }
    }
    free(p);
    return NULL;
}

kiln_error *kiln_comm_allgather_u64(kiln_comm *c, uint64_t mine, uint64_t *all) {
    /* through the control plane's f64 sum, which every backend has: rank r fills its two slots with the value's
     * 32-bit halves and leaves the others zero, so each sum is one exact term */
    const size_t n = (size_t)c->size;
    double *v = calloc(2 * n, sizeof *v);
    if (!v) return kiln_errorf(KILN_ENOMEM, "all-gather of %zu ranks' values", n);
    v[2 * c->rank] = (double)(uint32_t)mine;
    v[2 * c->rank + 1] = (double)(uint32_t)(mine >> 32);
    kiln_error *e = c->allreduce_sum_f64(c, v, 2 * n);
    for (size_t r = 0; !e && r < n; r++) all[r] = (uint64_t)v[2 * r] | (uint64_t)v[2 * r + 1] << 32;
    free(v);
    return e;
}

kiln_error *kiln_comm_host_layout(kiln_comm *c, kiln_host_layout *out) {
    memset(out, 0, sizeof *out);
    uint64_t *ids = malloc((size_t)c->size * sizeof *ids);
    if (!ids) return kiln_errorf(KILN_ENOMEM, "host layout of %d ranks", c->size);
    kiln_error *e = kiln_comm_allgather_u64(c, kiln_host_id(), ids);
    if (!e) e = kiln_host_layout_of(ids, c->size, c->rank, out);
    free(ids);
    return e;
}

kiln_error *kiln_gpu_for_rank(const kiln_host_layout *h, int per_rank, int ndev, int *device) {
    *device = -1;
    if (per_rank < 1) return kiln_errorf(KILN_EINVAL, "%d GPUs a rank", per_rank);
    if (ndev < 1) return kiln_errorf(KILN_EIO, "no CUDA device is visible to this process");
    const long need = (long)h->local_size * per_rank;
    if (ndev >= need) {
        *device = h->local_rank * per_rank;
        return NULL;
    }
    /* A launcher that binds GPUs to ranks (srun --gpus-per-task, or CUDA_VISIBLE_DEVICES set per rank) shows
     * each rank only its own: take them all. Whether they really differ is for kiln_ranks_share_gpu to say. */
    if (ndev == per_rank) {
        *device = 0;
        return NULL;
    }
    return kiln_errorf(KILN_EINVAL, "%d rank%s on this host need %ld GPU%s (%d each), and %d %s visible to this rank",
                       h->local_size, h->local_size == 1 ? "" : "s", need, need == 1 ? "" : "s", per_rank, ndev,
                       ndev == 1 ? "is" : "are");
}

typedef struct {
    uint64_t host, gpu;
    int rank;
} host_gpu_rank;

static int cmp_host_gpu_rank(const void *a, const void *b) {
    const host_gpu_rank *x = a, *y = b;
    if (x->host != y->host) return x->host < y->host ? -1 : 1;
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

int kiln_ranks_share_gpu(const uint64_t *host, const uint64_t *gpu, int n, int *a, int *b) {
    host_gpu_rank *p = n > 0 ? malloc((size_t)n * sizeof *p) : NULL;
    if (!p) return 0;
    for (int r = 0; r < n; r++) p[r] = (host_gpu_rank){host[r], gpu[r], r};
    qsort(p, (size_t)n, sizeof *p, cmp_host_gpu_rank);
    int found = 0;
    for (int i = 1; i < n && !found; i++)
        if (p[i].host == p[i - 1].host && p[i].gpu == p[i - 1].gpu) *a = p[i - 1].rank, *b = p[i].rank, found = 1;
    free(p);
    return found;
}
