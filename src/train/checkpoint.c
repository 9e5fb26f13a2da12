/* Sharded, atomic, reshapeable checkpoints.
 *
 *   out_dir/ckpt/step_00000100/
 *     manifest.json          rank 0: step, world size, config, every tensor's global shape and
 *                            owner rank, optimizer kind and state size, the partition, every
 *                            rank's data-loader position, checksums and sizes of all files
 *     rank_00000.safetensors each rank: param.<name> and opt.<name> of the tensors it owns;
 *                            rank 0 also the balancing biases and the controller's state
 *     COMMITTED              written last
 *
 * Commit protocol: everything is written into step_N.tmp/ (each file fsynced), then rank 0 writes
 * the manifest and COMMITTED, fsyncs, and renames the directory to step_N: a crash at any point
 * leaves the previous checkpoint untouched and at worst a .tmp directory, which is ignored and
 * replaced. Older checkpoints are deleted only after a newer one is committed. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/ckpt.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/json.h"
#include "kiln/log.h"
#include "kiln/safetensors.h"
#include "kiln/zaya_cuda_snapshot.h"
#include "ckpt/async_writer.h"
#include "ckpt/crc32c.h"
#include "train_internal.h"

#define CKPT_FORMAT 1

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void step_dir(char *buf, size_t n, const char *out_dir, int64_t step, int tmp) {
    snprintf(buf, n, "%s/ckpt/step_%08lld%s", out_dir, (long long)step, tmp ? ".tmp" : "");
}

/* Every rank learns whether any rank failed; the first local error is kept. */
static kiln_error *agree(kiln_comm *comm, kiln_error *e, const char *what) {
    double bad = e ? 1 : 0;
    kiln_error *ce = comm->allreduce_sum_f64(comm, &bad, 1);
    if (ce) {
        kiln_error_free(e);
        return ce;
    }
    if (!e && bad > 0) return kiln_errorf(KILN_EIO, "%s failed on another rank", what);
    return e;
}

/* What one rank writes: its owned parameters and optimizer state, on rank 0 also the balance
 * state, and what the manifest records. The pointers lead either into the live training buffers
 * (a synchronous save) or into the writer's staging copy (an asynchronous one). */
typedef struct {
    int64_t step;
    double tokens_seen;
    int have_prev;
    const kiln_train_config *cfg;
    const kiln_zaya *model; /* the parameter table and config; its buffers are not read */
    const zero1_partition *part;
    const kiln_opt_param *oparams;
    const float *w_owned; /* part->counts[rank] floats: the flat buffer from part->displs[rank] */
    const float *opt_state;
    const float *biases;  /* rank 0: [layers, E+1] */
    const double *integral, *prev_err;
    const kiln_loader_state *loaders; /* [world] */
} ckpt_snap;

/* The file's CRC without reading its data back: the header's CRC from the file, combined with the
 * data section's CRC taken from memory while it was written (kiln_st_write_stream lays the tensors out
 * in order without gaps: checked against the file's size; anything else falls back to reading the file). */
static kiln_error *file_crc(const char *path, uint32_t data_crc, uint64_t data_bytes, uint32_t *crc, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char len[8];
    uint64_t hlen = 0;
    char *head = NULL;
    int ok = fread(len, 1, 8, f) == 8;
    for (int i = 0; ok && i < 8; i++) hlen |= (uint64_t)len[i] << (8 * i);
    ok = ok && hlen < KILN_ST_MAX_HEADER && (head = malloc(hlen + 1)) && fread(head, 1, hlen, f) == hlen;
    struct stat sb;
    ok = ok && fstat(fileno(f), &sb) == 0 && (uint64_t)sb.st_size == 8 + hlen + data_bytes;
    fclose(f);
    if (ok) {
        *crc = kiln_crc32c_combine(kiln_crc32c(kiln_crc32c(0, len, 8), head, hlen), data_crc, data_bytes);
        *size = 8 + hlen + data_bytes;
    }
    free(head);
    return ok ? NULL : kiln_crc32c_file(path, crc, size);
}

/* ---- a shard as a stream of pieces: the GPU trainer's device snapshot first (if any), then the host
 * tensors, each piece checksummed while the next is written; the pieces written so far are counted (the
 * training thread reads the count to say how fast a slow save goes) ---- */

typedef struct {
    kiln_zaya_cuda_snap *dev;
    uint64_t dev_left;         /* bytes still to come from the device stream */
    const kiln_st_entry *tail; /* host tensors after it (rank 0's balance state) */
    size_t ntail, ti;
    uint32_t crc; /* of the data handed out and checksummed so far */
    uint64_t bytes;
    _Atomic uint64_t *written; /* = bytes, for the training thread */
    /* the last piece's CRC, on a helper thread while the piece is written */
    const void *piece;
    size_t piece_len;
    uint32_t piece_crc;
    pthread_t tid;
    int threaded;
} stream_src;

static void *piece_crc_run(void *p) {
    stream_src *s = p;
    s->piece_crc = kiln_crc32c(0, s->piece, s->piece_len);
    return NULL;
}

static void piece_crc_finish(stream_src *s) {
    if (!s->piece_len) return;
    if (s->threaded) pthread_join(s->tid, NULL);
    s->threaded = 0;
    s->crc = kiln_crc32c_combine(s->crc, s->piece_crc, s->piece_len);
    s->bytes += s->piece_len;
    s->piece_len = 0;
    if (s->written) atomic_store(s->written, s->bytes);
}

/* A kiln_st_source. The previous piece has been written when this is called: its CRC is folded in
 * and its buffer may be reused (the device stream's double buffering relies on that). */
static kiln_error *stream_next(void *ctx, const void **data, size_t *len) {
    stream_src *s = ctx;
    piece_crc_finish(s);
    *data = NULL, *len = 0;
    if (s->dev_left) {
        KILN_TRY(kiln_zaya_cuda_snap_read(s->dev, data, len));
        if (*len > s->dev_left || !*len)
            return kiln_errorf(KILN_EIO, "checkpoint snapshot: the device stream gave %zu bytes with %llu to come", *len,
                               (unsigned long long)s->dev_left);
        s->dev_left -= *len;
    } else {
        for (; s->ti < s->ntail && !*len; s->ti++) {
            size_t b = kiln_dtype_size(s->tail[s->ti].dtype);
            for (int k = 0; k < s->tail[s->ti].ndim; k++) b *= (size_t)s->tail[s->ti].shape[k];
            *data = s->tail[s->ti].data, *len = b;
        }
    }
    s->piece = *data, s->piece_len = *len;
    /* big pieces are checksummed beside the write, small ones right here */
    s->threaded = *len >= ((size_t)1 << 20) && pthread_create(&s->tid, NULL, piece_crc_run, s) == 0;
    if (!s->threaded && *len) piece_crc_run(s);
    return NULL;
}

/* A shard and its CRC. The GPU trainer (dev): entries' first ndev tensors (param/opt pairs) come from
 * the device snapshot, the rest from host memory; otherwise (dev NULL, ndev 0) all from host memory. */
static kiln_error *write_stream_with_crc(const char *path, const kiln_st_entry *ent, size_t n, size_t ndev,
                                         kiln_zaya_cuda_snap *dev, _Atomic uint64_t *written, uint32_t *crc,
                                         uint64_t *size) {
    stream_src s = {.dev = dev, .dev_left = dev ? kiln_zaya_cuda_snap_bytes(dev) : 0, .tail = ent + ndev,
                    .ntail = n - ndev, .written = written};
    kiln_error *e = dev ? kiln_zaya_cuda_snap_read_begin(dev) : NULL;
    if (!e) e = kiln_st_write_stream(path, ent, n, NULL, stream_next, &s);
    piece_crc_finish(&s);
    if (dev) kiln_zaya_cuda_snap_read_end(dev);
    return e ? e : file_crc(path, s.crc, s.bytes, crc, size);
}

static kiln_error *write_rank_file(const ckpt_snap *v, int rank, kiln_zaya_cuda_snap *dev, _Atomic uint64_t *written,
                                   const char *path, uint32_t *crc, uint64_t *size) {
    const kiln_zaya *m = v->model;
    const int first = v->part->first[rank], last = v->part->first[rank + 1];
    const int nt = last - first;
    const int64_t L = m->cfg.num_layers, E1 = m->cfg.num_experts + 1;
    size_t n = 0, cap = (size_t)(2 * nt + 3);
    kiln_st_entry *ent = calloc(cap, sizeof *ent);
    char(*names)[112] = calloc(cap, sizeof *names);
    int64_t(*shapes)[2] = calloc(cap, sizeof *shapes);
    kiln_error *e = NULL;
    if (!ent || !names || !shapes) e = kiln_errorf(KILN_ENOMEM, "%s", path);
    const float *state = v->opt_state;
    for (int t = first; !e && t < last; t++) {
        const kiln_param_info *p = &m->params[t];
        snprintf(names[n], sizeof names[n], "param.%s", p->name);
        /* from the device snapshot's stream (dev): no host pointers */
        ent[n] = (kiln_st_entry){names[n], KILN_DT_F32, p->ndim, p->shape,
                                 dev ? NULL : v->w_owned + (p->offset - v->part->displs[rank])};
        n++;
        snprintf(names[n], sizeof names[n], "opt.%s", p->name);
        shapes[n][0] = kiln_optim_state_numel(&v->oparams[t]);
        ent[n] = (kiln_st_entry){names[n], KILN_DT_F32, 1, shapes[n], dev ? NULL : state};
        if (!dev) state += shapes[n][0];
        n++;
    }
    if (!e && rank == 0) {
        shapes[n][0] = L;
        shapes[n][1] = E1;
        ent[n] = (kiln_st_entry){"balancing_biases", KILN_DT_F32, 2, shapes[n], v->biases};
        n++;
        ent[n] = (kiln_st_entry){"balance.integral", KILN_DT_F64, 2, shapes[n - 1], v->integral};
        n++;
        ent[n] = (kiln_st_entry){"balance.prev_err", KILN_DT_F64, 2, shapes[n - 2], v->prev_err};
        n++;
    }
    if (!e) e = write_stream_with_crc(path, ent, n, dev ? (size_t)(2 * nt) : 0, dev, written, crc, size);
    free(ent);
    free(names);
    free(shapes);
    return e;
}

static cJSON *manifest_json(const ckpt_snap *v, int world, const uint64_t *sums, const uint64_t *sizes) {
    const kiln_zaya *m = v->model;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(o, "step", (double)v->step);
    cJSON_AddNumberToObject(o, "world_size", world);
    cJSON_AddNumberToObject(o, "tokens_seen", v->tokens_seen);
    cJSON_AddBoolToObject(o, "balance_have_prev", v->have_prev);
    char *cfg = kiln_train_config_to_json(v->cfg);
    cJSON_AddItemToObject(o, "config", cfg ? cJSON_Parse(cfg) : cJSON_CreateNull());
    free(cfg);
    cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
    for (int r = 0; r < world; r++)
        for (int t = v->part->first[r]; t < v->part->first[r + 1]; t++) {
            const kiln_param_info *p = &m->params[t];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", p->name);
            cJSON *sh = cJSON_AddArrayToObject(x, "shape");
            for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p->shape[d]));
            cJSON_AddNumberToObject(x, "offset", (double)p->offset);
            cJSON_AddNumberToObject(x, "owner", r);
            cJSON_AddStringToObject(x, "optimizer", v->oparams[t].kind == KILN_OPT_MUON ? "muon" : "adamw");
            cJSON_AddNumberToObject(x, "state_numel", (double)kiln_optim_state_numel(&v->oparams[t]));
            cJSON_AddItemToArray(ts, x);
        }
    cJSON *ld = cJSON_AddArrayToObject(o, "loaders");
    cJSON *fs = cJSON_AddArrayToObject(o, "files");
    for (int r = 0; r < world; r++) {
        cJSON *x = cJSON_CreateObject();
        char hex[32];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v->loaders[r].seed);
        cJSON_AddStringToObject(x, "seed", hex);
        cJSON_AddNumberToObject(x, "epoch", (double)v->loaders[r].epoch);
        cJSON_AddNumberToObject(x, "cursor", (double)v->loaders[r].cursor);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v->loaders[r].fingerprint);
        cJSON_AddStringToObject(x, "fingerprint", hex);
        cJSON_AddItemToArray(ld, x);
        cJSON *f = cJSON_CreateObject();
        char name[64];
        cJSON_AddStringToObject(f, "name", kiln_ckpt_shard_path(name, sizeof name, NULL, r));
        cJSON_AddNumberToObject(f, "bytes", (double)sizes[r]);
        snprintf(hex, sizeof hex, "%08x", (unsigned)sums[r]);
        cJSON_AddStringToObject(f, "crc32c", hex);
        cJSON_AddItemToArray(fs, f);
    }
    return o;
}

/* The step a checkpoint directory's name stands for: ".../step_00000012" (trailing slashes allowed) is 12; -1 when
 * the last component is not exactly step_N (step_N.tmp, step_N.rejected, a copy under another name). */
static int64_t dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    if (n - b < 6 || strncmp(dir + b, "step_", 5)) return -1;
    int64_t s = 0;
    for (size_t i = b + 5; i < n; i++) {
        if (dir[i] < '0' || dir[i] > '9' || s > (INT64_MAX - 9) / 10) return -1;
        s = 10 * s + (dir[i] - '0');
    }
    return s;
}

static int by_int64_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The steps of the step_N directories under out_dir/ckpt (exact names: not .tmp, not .rejected), newest first;
 * *steps is malloc'd (NULL and 0 when there is no ckpt/ yet). */
static kiln_error *list_steps(const char *out_dir, int64_t **steps, int *n) {
    *steps = NULL;
    *n = 0;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/ckpt", out_dir);
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? NULL : kiln_errorf(KILN_EIO, "%s: cannot list: %s", dir, strerror(errno));
    int cap = 0;
    kiln_error *e = NULL;
    struct dirent *de;
    while (!e && (de = readdir(d))) {
        const int64_t s = dir_step(de->d_name);
        if (s < 0) continue;
        if (*n == cap) {
            int64_t *v = realloc(*steps, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!v) e = kiln_errorf(KILN_ENOMEM, "%s: listing checkpoints", dir);
            else *steps = v;
        }
        if (!e) (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (e) {
        free(*steps);
        *steps = NULL, *n = 0;
        return e;
    }
    if (*n) qsort(*steps, (size_t)*n, sizeof **steps, by_int64_desc);
    return NULL;
}

static kiln_error *check_dir(const char *sd, int64_t step);

/* The writer's record of checkpoints known to be valid (committed by it, or verified: check_dir) so that each is
 * verified at most once per process. Only rank 0's commit and its prune thread (one at a time) touch it. */
typedef struct {
    int64_t *steps;
    int n, cap;
} step_set;

static int step_set_has(const step_set *s, int64_t step) {
    for (int i = 0; i < s->n; i++)
        if (s->steps[i] == step) return 1;
    return 0;
}

static void step_set_add(step_set *s, int64_t step) {
    if (step_set_has(s, step)) return;
    if (s->n == s->cap) {
        int64_t *v = realloc(s->steps, (size_t)(s->cap ? 2 * s->cap : 16) * sizeof *v);
        if (!v) return; /* then it is verified again next time: slower, not wrong */
        s->steps = v, s->cap = s->cap ? 2 * s->cap : 16;
    }
    s->steps[s->n++] = step;
}

static void step_set_del(step_set *s, int64_t step) {
    for (int i = 0; i < s->n; i++)
        if (s->steps[i] == step) s->steps[i--] = s->steps[--s->n];
}

/* Deletes old checkpoints after the commit of step `committed` (rank 0, on the writer's prune thread). The rule
 * (docs/checkpoint-format.md, "Which checkpoints are kept"):
 *  - the checkpoint just committed is never deleted;
 *  - step_N directories newer than it are not this run's: a timeline it abandoned (it resumed from an older
 *    checkpoint because the newer ones were invalid) or another run that used the same out_dir. They are neither
 *    counted nor deleted: counting them let them push out the run's own saves (with keep_last 1 the only valid
 *    checkpoint went and a corrupt one stayed), and deleting them would destroy what is not this run's to delete.
 *    Once the run passes their step they are pruned like the rest (a save of the same step replaces one);
 *  - of the others, newest first, the first keep_last valid ones are kept (an invalid one does not count: nothing
 *    can resume from it) and everything older than the oldest of them is deleted, valid or not; an invalid one
 *    between kept ones stays until it falls behind them.
 * Validity is what resume checks (check_dir: checksums too), once per directory per process (known). */
static void prune(const char *out_dir, int64_t keep, int64_t committed, step_set *known) {
    int64_t *steps = NULL;
    int n = 0;
    kiln_error *e = list_steps(out_dir, &steps, &n);
    if (e) {
        kiln_log(KILN_LOG_WARN, "not deleting old checkpoints: %s", kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    if (keep < 1) keep = 1; /* the one just committed stays whatever the config says */
    int64_t kept = 0;
    for (int i = 0; i < n; i++) { /* newest first */
        char sd[1300];
        step_dir(sd, sizeof sd, out_dir, steps[i], 0);
        if (steps[i] > committed) continue;
        if (kept >= keep) {
            kiln_rm_tree(sd);
            step_set_del(known, steps[i]);
            continue;
        }
        if (steps[i] == committed || step_set_has(known, steps[i])) {
            kept++;
            continue;
        }
        kiln_error *bad = check_dir(sd, steps[i]);
        if (!bad) {
            step_set_add(known, steps[i]);
            kept++;
        } else {
            kiln_log(KILN_LOG_DEBUG, "checkpoint %s is invalid, not counted toward run.keep_last: %s", sd,
                     kiln_error_msg(bad));
            kiln_error_free(bad);
        }
    }
    free(steps);
}

int ckpt_count_newer(const char *out_dir, int64_t step, int64_t *newest) {
    int64_t *steps = NULL;
    int n = 0, k = 0;
    *newest = -1;
    kiln_error *e = list_steps(out_dir, &steps, &n);
    kiln_error_free(e); /* a ckpt/ that cannot be listed: the resume or the first save says why */
    while (k < n && steps[k] > step) k++;
    if (k) *newest = steps[0];
    free(steps);
    return k;
}

/* ---------- the writer: snapshot, then write (here or on the background thread), then commit ---------- */

struct ckpt_writer {
    int async, rank, world;
    int pending; /* a save begun and not yet committed or failed */
    kiln_bg_job job;
    /* deleting checkpoints beyond keep_last after a commit, on its own thread: unlinking a 21 GB shard
     * can take a good part of a second, which the training thread should not wait for */
    kiln_bg_job prune_job;
    char prune_dir[1200];
    int64_t prune_keep, prune_step; /* keep_last, and the step just committed (never deleted) */
    step_set known;                 /* checkpoints known to be valid (prune) */
    ckpt_snap snap;
    /* the staging copy: owned parameters, optimizer state, balance state, loader positions. Allocated
     * once on the first async save. */
    float *stage_f;
    double *stage_d;
    kiln_loader_state *stage_l;
    size_t n_owned, n_state, n_bias;
    /* the GPU trainer: parameters and optimizer state come from the device (snapshot on the device,
     * streamed to the file by the background thread); stage_f then holds the balancing biases only */
    kiln_zaya_cuda_snap *dev;
    kiln_snap_place place;
    char logged_at[16];
    /* this save: began (after waiting t_waited for the previous one), training blocked for (the snapshot
     * t_snap of it), shard written after */
    double t_begin, t_waited, t_snap, t_blocked, t_written;
    int waited;                /* this save found the previous one still in flight and waited for it */
    int64_t delay_ms;          /* KILN_FAULT slow-save: the writer sleeps this long before writing, */
    int64_t hold_polls, polls; /* and the shard counts as written at the hold_polls-th poll (polls so far) */
    _Atomic uint64_t written;  /* this rank's shard: data bytes written so far ... */
    uint64_t shard_bytes;      /* ... of this many */
    char tmp[1300], fin[1300], root[1200], path[1400];
    uint64_t mine[2]; /* this rank's shard: checksum, size */
};

static void *staging_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

kiln_error *ckpt_writer_create(int async, ckpt_writer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return kiln_errorf(KILN_ENOMEM, "checkpoint writer");
    (*out)->async = async;
    return NULL;
}

int ckpt_writer_pending(const ckpt_writer *w) { return w && w->pending; }

int ckpt_writer_progress(ckpt_writer *w, ckpt_progress *p) {
    memset(p, 0, sizeof *p);
    if (!w || !w->pending) return 0;
    p->step = w->snap.step;
    p->elapsed_s = now_s() - w->t_begin;
    p->bytes_done = atomic_load(&w->written);
    p->bytes_total = w->shard_bytes;
    return 1;
}

int ckpt_writer_waited(const ckpt_writer *w, double *seconds) {
    if (seconds) *seconds = w ? w->t_waited : 0;
    return w && w->waited;
}

void ckpt_writer_set_slow(ckpt_writer *w, int64_t ms, int64_t steps) {
    w->delay_ms = ms > 0 ? ms : 0;
    w->hold_polls = steps > 0 ? steps : 0;
}

kiln_error *ckpt_writer_use_cuda(ckpt_writer *w, kiln_zaya_cuda_snap *dev) {
    const char *env = getenv("KILN_CKPT_SNAPSHOT");
    kiln_snap_place place = KILN_SNAP_AUTO;
    if (env && *env && strcmp(env, "auto")) {
        if (!strcmp(env, "device")) place = KILN_SNAP_DEVICE;
        else if (!strcmp(env, "pinned")) place = KILN_SNAP_PINNED;
        else if (!strcmp(env, "pageable")) place = KILN_SNAP_PAGEABLE;
        else {
            kiln_zaya_cuda_snap_free(dev);
            return kiln_errorf(KILN_EINVAL, "KILN_CKPT_SNAPSHOT='%s': expected auto, device, pinned or pageable", env);
        }
    }
    kiln_zaya_cuda_snap_free(w->dev);
    w->dev = dev;
    w->place = place;
    return NULL;
}

void ckpt_writer_known_valid(ckpt_writer *w, int64_t step) {
    kiln_error_free(kiln_bg_join(&w->prune_job)); /* the set is the prune thread's while it runs */
    step_set_add(&w->known, step);
}

const char *ckpt_writer_snapshot_where(const ckpt_writer *w) {
    return w->dev ? kiln_zaya_cuda_snap_where(w->dev) : w->async ? "host" : "live";
}

void ckpt_writer_free(ckpt_writer *w) {
    if (!w) return;
    /* an uncommitted save is abandoned: its step_N.tmp/ is ignored and replaced by the next run */
    kiln_error_free(kiln_bg_join(&w->job));
    kiln_error_free(kiln_bg_join(&w->prune_job));
    free(w->known.steps);
    kiln_zaya_cuda_snap_free(w->dev);
    free(w->stage_f);
    free(w->stage_d);
    free(w->stage_l);
    free(w);
}

/* The training thread waits for this copy: all threads, 1 MiB pieces (one core does not saturate
 * memory bandwidth). */
static void par_copy(float *dst, const float *src, size_t n) {
    const int64_t piece = 1 << 18, pieces = (int64_t)((n + (size_t)piece - 1) / (size_t)piece);
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t i = 0; i < pieces; i++) {
        size_t at = (size_t)(i * piece), len = n - at < (size_t)piece ? n - at : (size_t)piece;
        memcpy(dst + at, src + at, len * sizeof(float));
    }
}

/* The snapshot step: a consistent picture of this rank's state at this step. */
static kiln_error *snapshot(ckpt_writer *w, const ckpt_view *v, int rank, int world) {
    const zero1_partition *p = v->part;
    size_t owned = p->counts[rank], state = 0;
    for (int t = p->first[rank]; t < p->first[rank + 1]; t++) state += (size_t)kiln_optim_state_numel(&v->oparams[t]);
    const size_t bias = (size_t)(v->model->cfg.num_layers * (v->model->cfg.num_experts + 1));
    /* the shard's data section: parameters and optimizer state, rank 0 also the balance state */
    const uint64_t balance_bytes = rank == 0 ? bias * (sizeof(float) + 2 * sizeof(double)) : 0;
    w->shard_bytes = (owned + state) * sizeof(float) + balance_bytes;
    atomic_store(&w->written, 0);
    w->snap = (ckpt_snap){v->step, v->tokens_seen, v->bal->have_prev, v->cfg, v->model, p, v->oparams,
                          v->model->w + p->displs[rank], v->opt_state, v->model->balancing, v->bal->integral,
                          v->bal->prev_err, v->loaders};
    if (w->dev) { /* the GPU's tensors: a device copy (async) or the live buffers (sync: training waits) */
        w->snap.w_owned = NULL, w->snap.opt_state = NULL;
        owned = 0, state = 0;
        KILN_TRY(kiln_zaya_cuda_snap_take(w->dev, w->async, w->place));
        w->shard_bytes = kiln_zaya_cuda_snap_bytes(w->dev) + balance_bytes;
        const char *at = kiln_zaya_cuda_snap_where(w->dev);
        if (strcmp(at, w->logged_at)) { /* once, and again if it changes: a fallback is worth knowing of */
            kiln_log(!strcmp(at, "device") || !strcmp(at, "live") ? KILN_LOG_DEBUG : KILN_LOG_INFO,
                     "rank %d: checkpoint snapshot of %.2f GB of GPU state in %s memory", rank,
                     (double)kiln_zaya_cuda_snap_bytes(w->dev) / 1e9, at);
            snprintf(w->logged_at, sizeof w->logged_at, "%s", at);
        }
    }
    if (!w->async) return NULL;
    if (!w->stage_f || w->n_owned != owned || w->n_state != state || w->n_bias != bias) {
        free(w->stage_f);
        free(w->stage_d);
        free(w->stage_l);
        w->stage_f = staging_alloc((owned + state + bias) * sizeof(float));
        w->stage_d = staging_alloc(2 * bias * sizeof(double));
        w->stage_l = staging_alloc((size_t)world * sizeof(kiln_loader_state));
        w->n_owned = owned, w->n_state = state, w->n_bias = bias;
        if (!w->stage_f || !w->stage_d || !w->stage_l) {
            free(w->stage_f), free(w->stage_d), free(w->stage_l);
            w->stage_f = NULL, w->stage_d = NULL, w->stage_l = NULL;
            return kiln_errorf(KILN_ENOMEM, "checkpoint staging buffer (%.1f MB)",
                               (double)(owned + state + bias) * 4 / 1e6);
        }
    }
    float *f = w->stage_f;
    par_copy(f, w->snap.w_owned, owned);
    par_copy(f + owned, v->opt_state, state);
    memcpy(f + owned + state, v->model->balancing, bias * sizeof(float));
    memcpy(w->stage_d, v->bal->integral, bias * sizeof(double));
    memcpy(w->stage_d + bias, v->bal->prev_err, bias * sizeof(double));
    memcpy(w->stage_l, v->loaders, (size_t)world * sizeof(kiln_loader_state));
    w->snap.w_owned = f;
    w->snap.opt_state = f + owned;
    w->snap.biases = f + owned + state;
    w->snap.integral = w->stage_d;
    w->snap.prev_err = w->stage_d + bias;
    w->snap.loaders = w->stage_l;
    return NULL;
}

/* The write step: this rank's shard into step_N.tmp/, fsynced, and its checksum. */
static kiln_error *write_job(void *arg) {
    ckpt_writer *w = arg;
    uint32_t crc = 0;
    if (w->delay_ms > 0) { /* KILN_FAULT slow-save, a testing hook: a disk that takes this much longer */
        struct timespec ts = {(time_t)(w->delay_ms / 1000), (long)(w->delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR) {}
    }
    KILN_TRY(write_rank_file(&w->snap, w->rank, w->dev, &w->written, w->path, &crc, &w->mine[1]));
    w->mine[0] = crc;
    w->t_written = now_s() - w->t_begin;
    return NULL;
}

static kiln_error *prune_job(void *arg) {
    ckpt_writer *w = arg;
    prune(w->prune_dir, w->prune_keep, w->prune_step, &w->known);
    return NULL;
}

/* The commit step (collective): checksums to rank 0, manifest, COMMITTED, rename, prune (in the
 * background: joined at the next save and when the writer is freed). */
static kiln_error *commit(ckpt_writer *w, kiln_comm *comm, kiln_error *e) {
    const int64_t step = w->snap.step;
    w->pending = 0;
    e = agree(comm, e, "writing the checkpoint shard");
    if (e) {
        if (comm->rank == 0) kiln_rm_tree(w->tmp);
        return kiln_error_wrap(e, "checkpoint at step %lld (the previous checkpoint is intact)", (long long)step);
    }
    uint64_t *sums = calloc((size_t)comm->size * 2, sizeof *sums);
    if (!sums) return kiln_errorf(KILN_ENOMEM, "checkpoint");
    for (int r = 0; r < comm->size && !e; r++) {
        uint64_t buf[2] = {w->mine[0], w->mine[1]};
        e = comm->broadcast(comm, buf, sizeof buf, r);
        sums[r] = buf[0];
        sums[comm->size + r] = buf[1];
    }
    if (!e && comm->rank == 0) {
        char path[1400];
        cJSON *man = manifest_json(&w->snap, comm->size, sums, sums + comm->size);
        char *text = man ? kiln_json_print(man, 1) : NULL;
        cJSON_Delete(man);
        snprintf(path, sizeof path, "%s/manifest.json", w->tmp);
        e = text ? kiln_write_file_atomic(path, text, strlen(text)) : kiln_errorf(KILN_ENOMEM, "manifest");
        free(text);
        snprintf(path, sizeof path, "%s/COMMITTED", w->tmp);
        if (!e) e = kiln_write_file_atomic(path, "ok\n", 3);
        if (!e) e = kiln_fsync_path(w->tmp);
        if (!e && rename(w->tmp, w->fin)) {
            /* the same step committed before (a resumed run saving again): replace it */
            kiln_rm_tree(w->fin);
            if (rename(w->tmp, w->fin)) e = kiln_errorf(KILN_EIO, "%s: rename to %s: %s", w->tmp, w->fin, strerror(errno));
        }
        if (!e) e = kiln_fsync_path(w->root);
        /* the committed shards are all there, at their sizes, before anything older goes (their
         * checksums were taken from the bytes written; resume verifies them again) */
        for (int r = 0; !e && r < comm->size; r++) {
            struct stat sb;
            kiln_ckpt_shard_path(path, sizeof path, w->fin, r);
            if (stat(path, &sb) || (uint64_t)sb.st_size != sums[comm->size + r])
                e = kiln_errorf(KILN_EIO, "%s: missing or not %llu bytes after the commit", path,
                                (unsigned long long)sums[comm->size + r]);
        }
        if (e) kiln_rm_tree(w->tmp);
        else {
            kiln_error_free(kiln_bg_join(&w->prune_job)); /* before its fields change */
            snprintf(w->prune_dir, sizeof w->prune_dir, "%s", w->snap.cfg->out_dir);
            w->prune_keep = w->snap.cfg->keep_last;
            w->prune_step = step;
            step_set_add(&w->known, step);
            kiln_error_free(kiln_bg_start(&w->prune_job, prune_job, w));
        }
        /* KILN_LOG=debug: what bench/ckpt_gpu.sh reads */
        if (!e)
            kiln_log(KILN_LOG_DEBUG, "checkpoint step %lld committed: rank 0's shard %.3f GB written in %.3f s "
                     "(%.2f GB/s), training blocked %.4f s (snapshot %.4f s) after waiting %.4f s for the previous "
                     "save, committed %.3f s after the save began",
                     (long long)step, (double)sums[comm->size] / 1e9, w->t_written,
                     (double)sums[comm->size] / 1e9 / (w->t_written > 0 ? w->t_written : 1e-9), w->t_blocked,
                     w->t_snap, w->t_waited, now_s() - w->t_begin);
    }
    free(sums);
    return kiln_error_wrap(agree(comm, e, "committing the checkpoint"), "checkpoint at step %lld", (long long)step);
}

kiln_error *ckpt_writer_poll(ckpt_writer *w, kiln_comm *comm, int wait) {
    if (!w->pending) return NULL;
    if (!wait) {
        double done[1] = {kiln_bg_done(&w->job) ? 1 : 0};
        /* KILN_FAULT slow-save steps=K: written at the K-th poll, not before (the commit below joins) */
        if (w->hold_polls > 0) done[0] = ++w->polls >= w->hold_polls;
        KILN_TRY(comm->allreduce_sum_f64(comm, done, 1));
        if (done[0] < comm->size) return NULL; /* some rank is still writing: keep training */
    }
    return commit(w, comm, kiln_bg_join(&w->job));
}

kiln_error *ckpt_writer_save(ckpt_writer *w, kiln_comm *comm, const ckpt_view *v, int wait) {
    const double t0 = now_s();
    w->waited = w->pending;
    KILN_TRY(ckpt_writer_poll(w, comm, 1)); /* one save in flight at a time */
    /* The deletion of the checkpoints beyond keep_last that the last commit started may still be going on
     * (rank 0's thread): it is not waited for here (a deferred save comes right after a commit, and unlinking
     * a 21 GB shard can take a good part of a second), but at the next commit, before the next deletion. It
     * never touches a step_N.tmp/ being written. */
    w->t_begin = now_s();
    w->t_waited = w->t_begin - t0;
    w->polls = 0;
    const char *out = v->cfg->out_dir;
    w->rank = comm->rank;
    w->world = comm->size;
    step_dir(w->tmp, sizeof w->tmp, out, v->step, 1);
    step_dir(w->fin, sizeof w->fin, out, v->step, 0);
    snprintf(w->root, sizeof w->root, "%s/ckpt", out);
    kiln_ckpt_shard_path(w->path, sizeof w->path, w->tmp, comm->rank);
    kiln_error *e = NULL;
    if (comm->rank == 0) {
        e = kiln_mkdirs(out); /* an out_dir under directories that do not exist yet */
        if (!e) e = kiln_mkdir(w->root);
        kiln_rm_tree(w->tmp); /* a stale attempt from a crash */
        if (!e) e = kiln_mkdir(w->tmp);
    }
    e = kiln_error_wrap(agree(comm, e, "checkpoint directory"), "checkpoint at step %lld (the previous checkpoint is intact)",
                        (long long)v->step);
    if (e) return e;
    const double ts = now_s();
    e = agree(comm, snapshot(w, v, comm->rank, comm->size), "checkpoint snapshot");
    w->t_snap = now_s() - ts;
    if (e) {
        if (comm->rank == 0) kiln_rm_tree(w->tmp);
        return kiln_error_wrap(e, "checkpoint at step %lld (the previous checkpoint is intact)", (long long)v->step);
    }
    w->pending = 1;
    if (w->async) e = kiln_bg_start(&w->job, write_job, w);
    else e = write_job(w);
    if (e) w->job.err = e; /* reported by the commit below, as a finished job's error */
    w->t_blocked = now_s() - w->t_begin;
    return (wait || !w->async) ? ckpt_writer_poll(w, comm, 1) : NULL;
}

kiln_error *ckpt_save(kiln_comm *comm, const ckpt_view *v) {
    ckpt_writer *w = NULL;
    KILN_TRY(ckpt_writer_create(0, &w));
    kiln_error *e = ckpt_writer_save(w, comm, v, 1);
    ckpt_writer_free(w);
    return e;
}

/* ---------- loading ---------- */

static kiln_error *read_manifest(const char *dir, cJSON **out) {
    char path[1400];
    snprintf(path, sizeof path, "%s/COMMITTED", dir);
    if (access(path, F_OK)) return kiln_errorf(KILN_EFORMAT, "%s: not committed (no COMMITTED marker)", dir);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    return kiln_json_parse_file(path, out);
}

kiln_error *kiln_ckpt_manifest_world(const cJSON *man, const char *ctx, int64_t *world) {
    KILN_TRY(kiln_json_get_int(man, "world_size", world, 0, 1, ctx));
    if (*world < 1 || *world > KILN_CKPT_MAX_WORLD)
        return kiln_errorf(KILN_EFORMAT, "%s: world_size %lld", ctx, (long long)*world);
    return NULL;
}

/* Five digits hold every rank below KILN_CKPT_MAX_WORLD, so the names of a checkpoint have one length and list in
 * rank order. */
const char *kiln_ckpt_shard_path(char *buf, size_t n, const char *dir, int rank) {
    if (dir) snprintf(buf, n, "%s/rank_%05d.safetensors", dir, rank);
    else snprintf(buf, n, "rank_%05d.safetensors", rank);
    return buf;
}

int kiln_ckpt_shard_rank(const char *name) {
    int rank = 0, ok = strlen(name) == 22 && !strncmp(name, "rank_", 5) && !strcmp(name + 10, ".safetensors");
    for (int k = 5; ok && k < 10; k++) ok = name[k] >= '0' && name[k] <= '9', rank = 10 * rank + (name[k] - '0');
    return ok ? rank : -1;
}

/* Sizes and checksums of every file listed in the manifest. */
static kiln_error *verify_files(const char *dir, const cJSON *man) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files"), *f;
    if (!cJSON_IsArray(files)) return kiln_errorf(KILN_EFORMAT, "%s/manifest.json: no 'files' list", dir);
    cJSON_ArrayForEach(f, files) {
        const char *name = NULL, *hex = NULL;
        double bytes = -1;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(x)) name = x->valuestring;
        /* crc32c since the asynchronous writer; fnv1a64 in older checkpoints */
        int crc = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "crc32c"));
        x = cJSON_GetObjectItemCaseSensitive(f, crc ? "crc32c" : "fnv1a64");
        if (cJSON_IsString(x)) hex = x->valuestring;
        x = cJSON_GetObjectItemCaseSensitive(f, "bytes");
        if (cJSON_IsNumber(x)) bytes = x->valuedouble;
        if (!name || !hex || bytes < 0 || strchr(name, '/'))
            return kiln_errorf(KILN_EFORMAT, "%s/manifest.json: malformed 'files' entry", dir);
        char path[1500];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        uint64_t h = 0, n = 0;
        uint32_t h32 = 0;
        KILN_TRY(crc ? kiln_crc32c_file(path, &h32, &n) : kiln_fnv1a64_file(path, &h, &n));
        char got[32];
        if (crc) snprintf(got, sizeof got, "%08x", (unsigned)h32);
        else snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
        if ((double)n != bytes) return kiln_errorf(KILN_EFORMAT, "%s: %llu bytes, manifest says %.0f", path, (unsigned long long)n, bytes);
        if (strcmp(got, hex)) return kiln_errorf(KILN_EFORMAT, "%s: checksum %s, manifest says %s", path, got, hex);
    }
    /* every rank's shard is among them: a file the list leaves out would be read unchecked */
    char ctx[1400];
    snprintf(ctx, sizeof ctx, "%s/manifest.json", dir);
    int64_t world = 0;
    KILN_TRY(kiln_ckpt_manifest_world(man, ctx, &world));
    unsigned char *listed = calloc((size_t)world, 1); /* one pass over the list: the largest world stays linear */
    if (!listed) return kiln_errorf(KILN_ENOMEM, "%s", ctx);
    cJSON_ArrayForEach(f, files) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(f, "name");
        const char *nm = cJSON_IsString(x) ? x->valuestring : "";
        const int rank = kiln_ckpt_shard_rank(nm);
        if (rank >= 0 && rank < world) listed[rank] = 1;
    }
    int64_t r = 0;
    while (r < world && listed[r]) r++;
    free(listed);
    char nm[64];
    if (r < world)
        return kiln_errorf(KILN_EFORMAT, "%s: 'files' has no checksum for %s (world size %lld)", ctx,
                           kiln_ckpt_shard_path(nm, sizeof nm, NULL, (int)r), (long long)world);
    return NULL;
}

/* A hexadecimal number, nothing else (the writer prints 16 digits): strtoull read "zz" or "" as 0, another data order
 * or an unchecked layout, silently. wide: more than 16 digits are allowed and saturate at UINT64_MAX, as strtoull
 * does (for fingerprints: such a value matches no data layout, and the layout check says that more usefully). */
static int parse_hex64(const char *s, int wide, uint64_t *out) {
    uint64_t v = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        const char c = s[n];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || (n >= 16 && !wide)) return 0;
        v = v >> 60 ? UINT64_MAX : v << 4 | (uint64_t)d;
    }
    if (!n) return 0;
    *out = v;
    return 1;
}

/* Rank r's loader position, manifest "loaders"[r]: seed and fingerprint hex numbers, epoch and cursor whole numbers
 * >= 0 (a negative one would become a huge unsigned position), and with block > 0 the cursor a whole number of
 * blocks: the trainer's loader moves one micro-batch (= block) at a time and an epoch holds whole blocks, so any
 * other cursor was not written by it and would shift every later micro-batch's windows. */
static kiln_error *parse_loader(const cJSON *x, int r, int64_t block, const char *ctx, kiln_loader_state *out) {
    char lctx[1500];
    snprintf(lctx, sizeof lctx, "%s: loaders[%d]", ctx, r);
    if (!cJSON_IsObject(x)) return kiln_errorf(KILN_EFORMAT, "%s: not an object", lctx);
    const char *seed = NULL, *fp = NULL;
    int64_t ep = 0, cur = 0;
    uint64_t seed_v = 0, fp_v = 0;
    KILN_TRY(kiln_json_get_string(x, "seed", &seed, NULL, 1, lctx));
    KILN_TRY(kiln_json_get_string(x, "fingerprint", &fp, "0", 0, lctx));
    KILN_TRY(kiln_json_get_int(x, "epoch", &ep, 0, 1, lctx));
    KILN_TRY(kiln_json_get_int(x, "cursor", &cur, 0, 1, lctx));
    if (!parse_hex64(seed, 0, &seed_v))
        return kiln_errorf(KILN_EFORMAT, "%s: seed '%s' is not a hexadecimal number (1 to 16 digits)", lctx, seed);
    if (!parse_hex64(fp, 1, &fp_v))
        return kiln_errorf(KILN_EFORMAT, "%s: fingerprint '%s' is not a hexadecimal number", lctx, fp);
    if (ep < 0) return kiln_errorf(KILN_EFORMAT, "%s: epoch %lld is negative", lctx, (long long)ep);
    if (cur < 0) return kiln_errorf(KILN_EFORMAT, "%s: cursor %lld is negative", lctx, (long long)cur);
    if (block > 0 && cur % block)
        return kiln_errorf(KILN_EFORMAT, "%s: cursor %lld is not a whole number of micro-batches of %lld windows "
                           "(not a position the trainer writes)", lctx, (long long)cur, (long long)block);
    *out = (kiln_loader_state){seed_v, (uint64_t)ep, (uint64_t)cur, fp_v};
    return NULL;
}

/* What the checksums cannot vouch for: manifest.json itself is not checksummed, so its fields are checked against
 * what they must be. The step must be the directory's (dir_step < 0: a directory not named step_N, unchecked): a
 * manifest saying 100 in step_12 resumed "from step 100" with step 12's weights and trained nothing. Loader positions:
 * parse_loader, cursors against the micro-batch of the manifest's own config (the one they were written under). */
static kiln_error *check_manifest(const cJSON *man, const char *ctx, int64_t dir_step) {
    int64_t step = 0, block = 0;
    double tokens = 0;
    KILN_TRY(kiln_json_get_int(man, "step", &step, 0, 1, ctx));
    if (step < 0) return kiln_errorf(KILN_EFORMAT, "%s: step %lld is negative", ctx, (long long)step);
    if (dir_step >= 0 && step != dir_step)
        return kiln_errorf(KILN_EFORMAT, "%s: step %lld, but the directory is step_%08lld's (an edited or misplaced "
                           "manifest)", ctx, (long long)step, (long long)dir_step);
    KILN_TRY(kiln_json_get_double(man, "tokens_seen", &tokens, 0, 1, ctx));
    if (!(tokens >= 0)) return kiln_errorf(KILN_EFORMAT, "%s: tokens_seen %g is negative", ctx, tokens);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(man, "config"), "data");
    if (cJSON_IsObject(data)) { /* import-hf and reshape write it too; without one the cursors go unchecked here */
        char dctx[1500];
        snprintf(dctx, sizeof dctx, "%s: config.data", ctx);
        KILN_TRY(kiln_json_get_int(data, "micro_batch", &block, 0, 0, dctx));
        if (block < 0) return kiln_errorf(KILN_EFORMAT, "%s: micro_batch %lld is negative", dctx, (long long)block);
    }
    /* whether there is one per rank is the reader's check (resume, reshape), after verify_files has matched the
     * world size against the shards: the mismatch is reported there, as the shards' */
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(man, "loaders");
    if (!cJSON_IsArray(ld)) return kiln_errorf(KILN_EFORMAT, "%s: no 'loaders' list", ctx);
    for (int r = 0; r < cJSON_GetArraySize(ld); r++) {
        kiln_loader_state st;
        KILN_TRY(parse_loader(cJSON_GetArrayItem(ld, r), r, block, ctx, &st));
    }
    return NULL;
}

/* A checkpoint resume may use: committed, its manifest consistent (check_manifest; step: the directory's step, or
 * -1 for a directory not named step_N), every file at its recorded size and checksum. */
static kiln_error *check_dir(const char *sd, int64_t step) {
    cJSON *man = NULL;
    KILN_TRY(read_manifest(sd, &man));
    char ctx[1400];
    snprintf(ctx, sizeof ctx, "%s/manifest.json", sd);
    kiln_error *e = check_manifest(man, ctx, step);
    if (!e) e = verify_files(sd, man);
    cJSON_Delete(man);
    return e;
}

kiln_error *ckpt_find_latest(const char *out_dir, int64_t *step) {
    *step = -1;
    int64_t *steps = NULL;
    int n = 0;
    KILN_TRY(list_steps(out_dir, &steps, &n));
    /* newest first; an invalid one is reported and skipped, and remembered for the error below */
    char *why = NULL;
    size_t len = 0;
    FILE *f = n ? open_memstream(&why, &len) : NULL;
    for (int i = 0; i < n && *step < 0; i++) {
        char sd[1300];
        step_dir(sd, sizeof sd, out_dir, steps[i], 0);
        kiln_error *e = check_dir(sd, steps[i]);
        if (!e) {
            *step = steps[i];
            break;
        }
        kiln_log(KILN_LOG_WARN, "skipping checkpoint %s: %s", sd, kiln_error_msg(e));
        if (f && i < 8) fprintf(f, "; step_%08lld: %s", (long long)steps[i], kiln_error_msg(e));
        else if (f && i == 8) fprintf(f, "; and %d more", n - 8);
        kiln_error_free(e);
    }
    if (f) fclose(f);
    kiln_error *e = NULL;
    /* Directories there but none usable: an error, not a silent start from step 0 (which threw the run's progress
     * away, truncated metrics.jsonl and went on to overwrite the directories a person might still repair). */
    if (n && *step < 0) {
        char what[64];
        if (n == 1) snprintf(what, sizeof what, "its only checkpoint is invalid");
        else snprintf(what, sizeof what, "all %d of its checkpoints are invalid", n);
        e = kiln_errorf(KILN_EFORMAT, "%s/ckpt: no valid checkpoint to resume from: %s%s (move %s aside to start over)",
                        out_dir, what, why ? why : "", n == 1 ? "it" : "them");
    }
    free(why);
    free(steps);
    return e;
}

static kiln_error *load_tensor_f32(const kiln_st *st, const char *name, float *dst, int64_t n, const char *file) {
    const kiln_st_tensor *t = kiln_st_find(st, name);
    if (!t) return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is missing", file, name);
    if (t->numel != n)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' has %lld elements, this model needs %lld (another model shape?)",
                           file, name, (long long)t->numel, (long long)n);
    return kiln_st_read_f32(t, dst, (size_t)n);
}

static kiln_error *load_f64(const kiln_st *st, const char *name, double *dst, int64_t n, const char *file) {
    const kiln_st_tensor *t = kiln_st_find(st, name);
    if (!t || t->dtype != KILN_DT_F64 || t->numel != n)
        return kiln_errorf(KILN_EFORMAT, "%s: tensor '%s' is missing or has the wrong size", file, name);
    memcpy(dst, t->data, (size_t)n * sizeof(double));
    return NULL;
}

static kiln_error *ckpt_load_impl(kiln_comm *comm, const char *sd, int64_t sd_step, ckpt_view *v) {
    kiln_zaya *m = v->model;
    cJSON *man = NULL;
    KILN_TRY(read_manifest(sd, &man));
    char ctx[1400];
    snprintf(ctx, sizeof ctx, "%s/manifest.json", sd);
    /* every rank reads the manifest and checks it again (rank 0 checked it when it chose the checkpoint, but that
     * is not this rank's read of it) */
    kiln_error *e = check_manifest(man, ctx, sd_step);
    int64_t world = 0, fmt = 0, step = 0;
    double tokens = 0;
    int have_prev = 0;
    if (!e) e = kiln_json_get_int(man, "format", &fmt, 0, 1, ctx);
    if (!e && fmt != CKPT_FORMAT) e = kiln_errorf(KILN_EUNSUPPORTED, "%s: format %lld is not %d", ctx, (long long)fmt, CKPT_FORMAT);
    if (!e) e = kiln_json_get_int(man, "world_size", &world, 0, 1, ctx);
    if (!e) e = kiln_json_get_int(man, "step", &step, 0, 1, ctx);
    if (!e) e = kiln_json_get_double(man, "tokens_seen", &tokens, 0, 1, ctx);
    if (!e) e = kiln_json_get_bool(man, "balance_have_prev", &have_prev, 0, 1, ctx);
    if (!e && world != comm->size)
        e = kiln_errorf(KILN_EINVAL, "%s: written by %lld ranks, this run has %d (reshape it with `kiln ckpt reshape`)",
                        ctx, (long long)world, comm->size);
    /* the tensor list must be this model's, name for name and shape for shape */
    const cJSON *ts = e ? NULL : cJSON_GetObjectItemCaseSensitive(man, "tensors");
    if (!e && (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) != m->nparams))
        e = kiln_errorf(KILN_EFORMAT, "%s: lists %d tensors, this model has %d (another model shape?)", ctx,
                        cJSON_IsArray(ts) ? cJSON_GetArraySize(ts) : -1, m->nparams);
    for (int i = 0; !e && i < m->nparams; i++) {
        const cJSON *x = cJSON_GetArrayItem(ts, i), *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, m->params[i].name))
            e = kiln_errorf(KILN_EFORMAT, "%s: tensor %d is '%s', this model's is '%s' (another model shape?)", ctx, i,
                            cJSON_IsString(nm) ? nm->valuestring : "?", m->params[i].name);
        /* the optimizer's state is laid out per kind: a flipped optim.muon would otherwise surface as a state
         * tensor of another size, blamed on the model's shape */
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(x, "optimizer");
        const char *here = v->oparams[i].kind == KILN_OPT_MUON ? "muon" : "adamw";
        if (!e && cJSON_IsString(op) && strcmp(op->valuestring, here))
            e = kiln_errorf(KILN_EINVAL, "%s: tensor '%s' was trained with %s, this run would update it with %s: "
                            "optim.muon differs from the checkpoint's", ctx, m->params[i].name, op->valuestring, here);
    }
    /* the data layout the loaders' positions belong to: named here, since the loader sees only a hash of it */
    const cJSON *mdata = e ? NULL : cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(man, "config"), "data");
    const struct {
        const char *key;
        int64_t here;
    } lay[] = {{"seq_len", v->cfg->seq_len}, {"micro_batch", v->cfg->micro_batch}};
    for (size_t k = 0; !e && mdata && k < sizeof lay / sizeof lay[0]; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(mdata, lay[k].key);
        if (cJSON_IsNumber(x) && x->valuedouble != (double)lay[k].here)
            e = kiln_errorf(KILN_EINVAL, "%s: trained with data.%s = %.0f, this config has %lld: the saved data "
                            "positions belong to that layout", ctx, lay[k].key, x->valuedouble, (long long)lay[k].here);
    }
    /* parameters: every rank reads every shard's params (all ranks hold the full model) */
    for (int r = 0; !e && r < comm->size; r++) {
        char path[1500];
        kiln_ckpt_shard_path(path, sizeof path, sd, r);
        kiln_st *st = NULL;
        e = kiln_st_open(path, &st);
        for (int t = v->part->first[r]; !e && t < v->part->first[r + 1]; t++) {
            char name[128];
            snprintf(name, sizeof name, "param.%s", m->params[t].name);
            e = load_tensor_f32(st, name, m->w + m->params[t].offset, m->params[t].numel, path);
            if (!e && r == comm->rank) {
                float *state = v->opt_state;
                for (int u = v->part->first[r]; u < t; u++) state += kiln_optim_state_numel(&v->oparams[u]);
                snprintf(name, sizeof name, "opt.%s", m->params[t].name);
                e = load_tensor_f32(st, name, state, kiln_optim_state_numel(&v->oparams[t]), path);
            }
        }
        if (!e && r == 0) {
            const int64_t n = m->cfg.num_layers * (m->cfg.num_experts + 1);
            e = load_tensor_f32(st, "balancing_biases", m->balancing, n, path);
            if (!e) e = load_f64(st, "balance.integral", v->bal->integral, n, path);
            if (!e) e = load_f64(st, "balance.prev_err", v->bal->prev_err, n, path);
        }
        kiln_st_close(st);
    }
    const cJSON *ld = e ? NULL : cJSON_GetObjectItemCaseSensitive(man, "loaders");
    if (!e && (!cJSON_IsArray(ld) || cJSON_GetArraySize(ld) != comm->size))
        e = kiln_errorf(KILN_EFORMAT, "%s: 'loaders' must list one position per rank", ctx);
    /* the cursors against this run's micro-batch as well: the loader is restored with it as its block (a cursor
     * of another block size would be caught by the fingerprint, unless that is 0: unchecked) */
    for (int r = 0; !e && r < comm->size; r++)
        e = parse_loader(cJSON_GetArrayItem(ld, r), r, v->cfg->micro_batch, ctx, &v->loaders[r]);
    if (!e) {
        v->step = step;
        v->tokens_seen = tokens;
        v->bal->have_prev = have_prev;
    }
    cJSON_Delete(man);
    return e;
}

kiln_error *ckpt_load(kiln_comm *comm, int64_t step, ckpt_view *v) {
    char sd[1300];
    step_dir(sd, sizeof sd, v->cfg->out_dir, step, 0);
    kiln_error *e = ckpt_load_impl(comm, sd, step, v);
    return kiln_error_wrap(agree(comm, e, "loading the checkpoint"), "resuming from %s", sd);
}

/* ---------- for `kiln ckpt` ---------- */

kiln_error *kiln_ckpt_verify(const char *step_dir) { return check_dir(step_dir, dir_step(step_dir)); }

kiln_error *kiln_ckpt_describe(const char *step_dir, FILE *out) {
    cJSON *man = NULL;
    KILN_TRY(read_manifest(step_dir, &man));
    char ctx[1400];
    snprintf(ctx, sizeof ctx, "%s/manifest.json", step_dir);
    int64_t step = 0, world = 0;
    double tokens = 0;
    kiln_error *e = kiln_json_get_int(man, "step", &step, 0, 1, ctx);
    if (!e) e = kiln_json_get_int(man, "world_size", &world, 0, 1, ctx);
    if (!e) e = kiln_json_get_double(man, "tokens_seen", &tokens, 0, 1, ctx);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(man, "tensors"), *t;
    if (!e && !cJSON_IsArray(ts)) e = kiln_errorf(KILN_EFORMAT, "%s: no 'tensors' list", ctx);
    if (!e) {
        double params = 0, state = 0, muon = 0;
        cJSON_ArrayForEach(t, ts) {
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
            double n = 1;
            cJSON_ArrayForEach(d, sh) n *= d->valuedouble;
            params += n;
            const cJSON *sn = cJSON_GetObjectItemCaseSensitive(t, "state_numel");
            state += cJSON_IsNumber(sn) ? sn->valuedouble : 0;
            const cJSON *op = cJSON_GetObjectItemCaseSensitive(t, "optimizer");
            if (cJSON_IsString(op) && !strcmp(op->valuestring, "muon")) muon += n;
        }
        fprintf(out, "%s\n  step %lld, world size %lld, %.0f tokens seen\n", step_dir, (long long)step,
                (long long)world, tokens);
        fprintf(out, "  %d tensors, %.0f parameters (%.0f under Muon), %.0f optimizer-state floats\n",
                cJSON_GetArraySize(ts), params, muon, state);
        const cJSON *fs = cJSON_GetObjectItemCaseSensitive(man, "files"), *f;
        cJSON_ArrayForEach(f, fs) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *by = cJSON_GetObjectItemCaseSensitive(f, "bytes"),
                        *h = cJSON_GetObjectItemCaseSensitive(f, "crc32c");
            const char *kind = "crc32c";
            if (!cJSON_IsString(h)) h = cJSON_GetObjectItemCaseSensitive(f, "fnv1a64"), kind = "fnv1a64";
            fprintf(out, "  file %-26s %12.0f bytes  %s %s\n", cJSON_IsString(nm) ? nm->valuestring : "?",
                    cJSON_IsNumber(by) ? by->valuedouble : -1, kind, cJSON_IsString(h) ? h->valuestring : "?");
        }
        const cJSON *ld = cJSON_GetObjectItemCaseSensitive(man, "loaders"), *l;
        int r = 0;
        cJSON_ArrayForEach(l, ld) {
            const cJSON *ep = cJSON_GetObjectItemCaseSensitive(l, "epoch"), *cu = cJSON_GetObjectItemCaseSensitive(l, "cursor");
            fprintf(out, "  rank %d data position: epoch %.0f, window %.0f\n", r++, cJSON_IsNumber(ep) ? ep->valuedouble : -1,
                    cJSON_IsNumber(cu) ? cu->valuedouble : -1);
        }
    }
    cJSON_Delete(man);
    return e;
}

static int by_step_desc(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    return strcmp(y, x); /* step_%08lld sorts like the numbers */
}

kiln_error *kiln_ckpt_list(const char *path, char ***dirs, int *n) {
    *dirs = NULL;
    *n = 0;
    char probe[1400];
    snprintf(probe, sizeof probe, "%s/manifest.json", path);
    int is_step = access(probe, F_OK) == 0;
    char root[1400];
    snprintf(root, sizeof root, "%s/ckpt", path);
    const char *scan = is_step ? NULL : access(root, F_OK) == 0 ? root : path;
    int cap = 16;
    char **v = calloc((size_t)cap, sizeof *v);
    if (!v) return kiln_errorf(KILN_ENOMEM, "%s", path);
    if (is_step) {
        v[(*n)++] = strdup(path);
    } else {
        DIR *d = opendir(scan);
        if (!d) {
            free(v);
            return kiln_errorf(KILN_ENOTFOUND, "%s: not a checkpoint, a ckpt/ directory or a run directory: %s", path,
                               strerror(errno));
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            long long s;
            char tail[8];
            if (sscanf(de->d_name, "step_%lld%7s", &s, tail) != 1) continue;
            if (*n == cap) {
                char **nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!nv) break;
                v = nv;
            }
            v[(*n)++] = kiln_path_join(scan, de->d_name);
        }
        closedir(d);
        qsort(v, (size_t)*n, sizeof *v, by_step_desc);
    }
    *dirs = v;
    return NULL;
}

void kiln_ckpt_list_free(char **dirs, int n) {
    for (int i = 0; i < n; i++) free(dirs[i]);
    free(dirs);
}
