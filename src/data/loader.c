/* The training-data loader: windows of T tokens from one split of a prepared directory, in a
 * per-epoch permutation drawn from (seed, epoch), dealt round-robin to `world` ranks.
 * The rule is spelled out in docs/data-format.md ("The loader"). */
#include "kiln/data.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/rng.h"

struct kiln_loader {
    char *dir, *split;
    kiln_data_index *ix;
    kiln_shard *shards;
    size_t nshards;
    uint64_t *starts; /* starts[k]: position of shard k's first token in the split's stream; starts[n] = total */
    uint64_t total, T, nwin, per_rank, block;
    int rank, world;
    uint64_t fingerprint;
    kiln_loader_state st;
    uint64_t *mine; /* this rank's per_rank window indices for (mine_seed, mine_epoch) */
    int mine_valid;
    uint64_t mine_seed, mine_epoch;
};

/* The splitmix64 finaliser: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n >= 1, without modulo bias: reject the lowest 2^64 mod n values. */
static uint64_t bounded(kiln_rng *r, uint64_t n) {
    uint64_t threshold = (0 - n) % n, x;
    do x = kiln_rng_u64(r);
    while (x < threshold);
    return x % n;
}

/* The RNG seed of one epoch's permutation ("kilndata" tags the stream). */
static uint64_t epoch_seed(uint64_t seed, uint64_t epoch) { return mix64(seed ^ mix64(epoch ^ 0x6b696c6e64617461ULL)); }

/* Fill l->mine for (seed, epoch): a Fisher-Yates shuffle of 0..W-1 dealt to ranks round-robin in blocks
 * of l->block windows: rank r takes blocks r, r+world, ... (block = 1: entries r, r+world, ...). */
static kiln_error *deal(kiln_loader *l, uint64_t seed, uint64_t epoch) {
    if (l->mine_valid && l->mine_seed == seed && l->mine_epoch == epoch) return NULL;
    uint64_t *perm = malloc(l->nwin * sizeof *perm);
    if (!perm)
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory for a permutation of %" PRIu64 " windows", l->dir, l->nwin);
    for (uint64_t i = 0; i < l->nwin; i++) perm[i] = i;
    kiln_rng r;
    kiln_rng_seed(&r, epoch_seed(seed, epoch));
    for (uint64_t i = l->nwin - 1; i > 0; i--) {
        uint64_t j = bounded(&r, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const uint64_t B = l->block, W = (uint64_t)l->world;
    for (uint64_t k = 0; k < l->per_rank; k++) l->mine[k] = perm[((k / B) * W + (uint64_t)l->rank) * B + k % B];
    free(perm);
    l->mine_valid = 1;
    l->mine_seed = seed;
    l->mine_epoch = epoch;
    return NULL;
}

/* ---- opening: shards are checked (checksums) on a few threads ---- */

typedef struct {
    kiln_loader *l;
    kiln_error **errs;
    size_t first, step;
} open_job;

static void *open_worker(void *arg) {
    open_job *j = arg;
    for (size_t k = j->first; k < j->l->nshards; k += j->step) {
        const kiln_data_split_info *sp = kiln_data_index_split(j->l->ix, j->l->split);
        j->errs[k] = kiln_data_open_shard(j->l->dir, j->l->ix, &sp->shards[k], &j->l->shards[k]);
    }
    return NULL;
}

static kiln_error *open_shards(kiln_loader *l) {
    kiln_error **errs = calloc(l->nshards + 1, sizeof *errs);
    if (!errs) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", l->dir);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (size_t)ncpu;
    if (nt > l->nshards) nt = l->nshards;
    open_job jobs[8];
    pthread_t tid[8];
    int started[8] = {0};
    for (size_t t = 0; t < nt; t++) {
        jobs[t] = (open_job){l, errs, t, nt};
        started[t] = t > 0 && pthread_create(&tid[t], NULL, open_worker, &jobs[t]) == 0;
    }
    /* Thread 0's share, and any share whose thread could not start, run here. */
    for (size_t t = 0; t < nt; t++)
        if (!started[t]) open_worker(&jobs[t]);
    for (size_t t = 0; t < nt; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    kiln_error *e = NULL;
    for (size_t k = 0; k < l->nshards; k++) {
        if (!e) e = errs[k];
        else kiln_error_free(errs[k]);
    }
    free(errs);
    return e;
}

static uint64_t fingerprint(const kiln_loader *l) {
    uint64_t v[6] = {l->T, (uint64_t)l->world, l->nwin, l->nshards, (uint64_t)l->ix->vocab_size, l->block};
    uint64_t h = kiln_fnv1a64(KILN_FNV1A64_INIT, v, sizeof v);
    for (size_t k = 0; k < l->nshards; k++) {
        uint64_t s[2] = {l->shards[k].h.ntokens, l->shards[k].h.checksum};
        h = kiln_fnv1a64(h, s, sizeof s);
    }
    return h ? h : 1;
}

static kiln_error *loader_init(kiln_loader *l, const char *dir, const char *split, int64_t T, uint64_t seed) {
    l->dir = strdup(dir);
    l->split = strdup(split);
    if (!l->dir || !l->split) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    KILN_TRY(kiln_data_index_read(dir, &l->ix));
    const kiln_data_split_info *sp = kiln_data_index_split(l->ix, split);
    if (!sp) {
        char have[256] = "";
        for (size_t i = 0; i < l->ix->nsplits; i++) {
            size_t n = strlen(have);
            snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "", l->ix->splits[i].name);
        }
        return kiln_errorf(KILN_ENOTFOUND, "%s/index.json: no split '%s' (it has: %s)", dir, split,
                           l->ix->nsplits ? have : "none");
    }
    l->shards = calloc(sp->nshards + 1, sizeof *l->shards);
    l->starts = calloc(sp->nshards + 1, sizeof *l->starts);
    if (!l->shards || !l->starts) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    l->nshards = sp->nshards;
    KILN_TRY(open_shards(l));
    for (size_t k = 0; k < l->nshards; k++) l->starts[k + 1] = l->starts[k] + l->shards[k].h.ntokens;
    l->total = l->starts[l->nshards];
    l->T = (uint64_t)T;
    l->nwin = l->total / l->T;
    l->block = 1;
    l->per_rank = l->nwin / (uint64_t)l->world;
    if (l->per_rank == 0)
        return kiln_errorf(KILN_EINVAL, "%s: split '%s' has too little data: %" PRIu64 " tokens make %" PRIu64
                           " windows of T=%" PRId64 ", fewer than world=%d ranks (need at least %" PRIu64
                           " tokens)", dir, split, l->total, l->nwin, T, l->world, l->T * (uint64_t)l->world);
    l->mine = malloc(l->per_rank * sizeof *l->mine);
    if (!l->mine) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    l->fingerprint = fingerprint(l);
    l->st = (kiln_loader_state){seed, 0, 0, l->fingerprint};
    return NULL;
}

kiln_error *kiln_loader_open(const char *dir, const char *split, int64_t T, uint64_t seed, int rank, int world,
                             kiln_loader **out) {
    *out = NULL;
    if (T < 1) return kiln_errorf(KILN_EINVAL, "%s: window length T must be >= 1, got %" PRId64, dir, T);
    if (world < 1 || rank < 0 || rank >= world)
        return kiln_errorf(KILN_EINVAL, "%s: rank %d is not in 0..world-1 (world %d)", dir, rank, world);
    kiln_loader *l = calloc(1, sizeof *l);
    if (!l) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", dir);
    l->rank = rank;
    l->world = world;
    kiln_error *e = loader_init(l, dir, split, T, seed);
    if (e) {
        kiln_loader_close(l);
        return e;
    }
    *out = l;
    return NULL;
}

void kiln_loader_close(kiln_loader *l) {
    if (!l) return;
    for (size_t k = 0; k < l->nshards; k++) kiln_shard_close(&l->shards[k]);
    free(l->shards);
    free(l->starts);
    free(l->mine);
    kiln_data_index_free(l->ix);
    free(l->dir);
    free(l->split);
    free(l);
}

int64_t kiln_loader_vocab_size(const kiln_loader *l) {
    return l->nshards ? (int64_t)l->shards[0].h.vocab_size : l->ix->vocab_size;
}
uint64_t kiln_loader_tokens(const kiln_loader *l) { return l->total; }
uint64_t kiln_loader_windows(const kiln_loader *l) { return l->per_rank; }

/* Tokens [pos, pos + n) of the split's stream, across shard boundaries. */
static void read_stream(const kiln_loader *l, uint64_t pos, uint64_t n, int64_t *dst) {
    /* the last shard k with starts[k] <= pos (it is non-empty: pos < total) */
    size_t lo = 0, hi = l->nshards - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (l->starts[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    for (size_t k = lo; n > 0; k++) {
        uint64_t off = pos - l->starts[k], avail = l->shards[k].h.ntokens - off, take = n < avail ? n : avail;
        kiln_shard_read(&l->shards[k], off, take, dst);
        dst += take;
        pos += take;
        n -= take;
    }
}

kiln_error *kiln_loader_next(kiln_loader *l, int64_t B, int64_t *ids) {
    if (B < 1) return kiln_errorf(KILN_EINVAL, "%s: batch size must be >= 1, got %" PRId64, l->dir, B);
    const kiln_loader_state saved = l->st;
    for (int64_t b = 0; b < B; b++) {
        kiln_error *e = deal(l, l->st.seed, l->st.epoch);
        if (e) {
            l->st = saved;
            return e;
        }
        read_stream(l, l->mine[l->st.cursor] * l->T, l->T, ids + (uint64_t)b * l->T);
        if (++l->st.cursor == l->per_rank) {
            l->st.epoch++;
            l->st.cursor = 0;
        }
    }
    return NULL;
}

kiln_loader_state kiln_loader_get_state(const kiln_loader *l) { return l->st; }

kiln_error *kiln_loader_set_state(kiln_loader *l, const kiln_loader_state *s) {
    /* the fingerprint is a hash: which of its inputs differs is not known here, so every one is named, with the
     * values this loader has */
    if (s->fingerprint && s->fingerprint != l->fingerprint)
        return kiln_errorf(KILN_EINVAL, "%s: loader state was saved for another data layout (fingerprint %016" PRIx64
                           ", this loader %016" PRIx64 "): the shards, the window length T (data.seq_len, %" PRIu64
                           " here), the world size (%d here) or the block of windows dealt to a rank (data.micro_batch, %"
                           PRIu64 " here) differ", l->dir, s->fingerprint, l->fingerprint, l->T, l->world, l->block);
    /* No fingerprint: a checkpoint that `kiln ckpt reshape` wrote where the data was not reachable. Its position is
     * exact for the data it was trained on, but nothing can tell whether this is that data (or the same seq_len and
     * micro_batch): it is accepted, since refusing would strand the checkpoint, and said loudly, since a mismatch
     * trains on other windows than the run would have without any error. A position at the very start (import-hf's
     * step 0) is right for any data: nothing to warn about. */
    if (!s->fingerprint && (s->epoch || s->cursor))
        kiln_log(KILN_LOG_WARN, "%s: the saved data position (epoch %" PRIu64 ", window %" PRIu64 ") has no data "
                 "fingerprint (a checkpoint `kiln ckpt reshape` wrote where the data was not reachable): whether this is "
                 "the data it was trained on, with the same data.seq_len and data.micro_batch, cannot be checked; to have "
                 "it checked, reshape the original checkpoint again on a machine where its data.dir is reachable",
                 l->dir, s->epoch, s->cursor);
    if (s->cursor >= l->per_rank)
        return kiln_errorf(KILN_EINVAL, "%s: loader state cursor %" PRIu64 " is past the %" PRIu64
                           " windows each rank takes per epoch", l->dir, s->cursor, l->per_rank);
    l->st = (kiln_loader_state){s->seed, s->epoch, s->cursor, l->fingerprint};
    return NULL;
}

kiln_error *kiln_loader_set_block(kiln_loader *l, int64_t block) {
    if (block < 1) return kiln_errorf(KILN_EINVAL, "%s: block must be >= 1, got %" PRId64, l->dir, block);
    uint64_t per = l->nwin / ((uint64_t)l->world * (uint64_t)block) * (uint64_t)block;
    if (per == 0)
        return kiln_errorf(KILN_EINVAL, "%s: split '%s' has too little data: %" PRIu64 " windows of T=%" PRIu64
                           " cannot give %d ranks a block of %" PRId64 " windows each", l->dir, l->split, l->nwin, l->T,
                           l->world, block);
    uint64_t *mine = realloc(l->mine, per * sizeof *mine);
    if (!mine) return kiln_errorf(KILN_ENOMEM, "%s: out of memory", l->dir);
    l->mine = mine;
    l->per_rank = per;
    l->block = (uint64_t)block;
    l->mine_valid = 0;
    l->fingerprint = fingerprint(l);
    l->st = (kiln_loader_state){l->st.seed, 0, 0, l->fingerprint};
    return NULL;
}
