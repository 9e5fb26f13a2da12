/* Per-rank heartbeat files: dir/rank_NNNNN.json, one small JSON object replaced after every step.
 * Replaced by rename, so a reader sees the previous or the new beat, never half of one; not
 * fsynced, since a heartbeat says "alive now" and is worthless after a crash. NaN and Inf are
 * what the supervisor looks for, and JSON has no numbers for them: they are written as strings.
 * The trainer writes them through kiln_heartbeat_writer, on a thread of its own (below): the
 * rename costs 0.3-1.5 ms on ext4, more on NFS, and must not sit on the training thread. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/json.h"
#include "ft_internal.h"

char *kiln_heartbeat_path(const char *dir, int rank) {
    char name[32];
    snprintf(name, sizeof name, "rank_%05d.json", rank);
    return kiln_path_join(dir, name);
}

static void num(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "\"nan\"");
    else if (isinf(v)) snprintf(buf, cap, v > 0 ? "\"inf\"" : "\"-inf\"");
    else snprintf(buf, cap, "%.17g", v);
}

void kiln_heartbeat_record(kiln_heartbeat *h, int64_t step, double loss, double grad_norm) {
    if (h->nrecent == KILN_HB_RECENT) {
        memmove(h->recent, h->recent + 1, (KILN_HB_RECENT - 1) * sizeof h->recent[0]);
        h->nrecent--;
    }
    h->recent[h->nrecent].step = step;
    h->recent[h->nrecent].loss = loss;
    h->recent[h->nrecent].grad_norm = grad_norm;
    h->nrecent++;
}

/* n bytes into path opened with flags (O_WRONLY | O_CREAT | ...), in one write() (no fsync: heartbeats and the step
 * log are only for the live supervisor) */
static kiln_error *write_once(const char *path, int flags, const char *buf, int n) {
    int fd = open(path, flags, 0644);
    if (fd < 0) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    ssize_t w = write(fd, buf, (size_t)n);
    kiln_error *e = w == n ? NULL : kiln_errorf(KILN_EIO, "%s: write: %s", path, w < 0 ? strerror(errno) : "short write");
    close(fd);
    return e;
}

/* One line "[attempt,step,loss,grad_norm]\n" of the step log into buf; returns its length. */
static int step_line(char *buf, size_t cap, int attempt, int64_t step, double loss, double grad_norm) {
    char l[40], g[40];
    num(l, sizeof l, loss);
    num(g, sizeof g, grad_norm);
    return snprintf(buf, cap, "[%d,%lld,%s,%s]\n", attempt, (long long)step, l, g);
}

/* The checkpoint line "[attempt,step,\"ckpt\"]\n": three elements, so that a reader from before it (which wants four)
 * skips it as malformed; the string where a loss is cannot be taken for one. */
static int ckpt_line(char *buf, size_t cap, int attempt, int64_t step) {
    return snprintf(buf, cap, "[%d,%lld,\"ckpt\"]\n", attempt, (long long)step);
}

/* n bytes of complete lines appended to dir/steps_00000.jsonl with one write() (O_APPEND). The supervisor reads the
 * complete lines only (ft_step_log_read: a last line without its newline is left for the next read, so a write cut
 * short by a crash or a full disk is never judged).
 *
 * The file is opened and closed at every append on purpose: nothing is buffered in a FILE between appends (a crash
 * loses no line a beat has reported; no buffer can flush half a line later), a heartbeat directory removed or
 * replaced under a running trainer is an error at the next append rather than lines going to an unlinked file, and
 * there is no descriptor to own. Measured on the CPU machine (ext4, 2 cores; 20,000 lines, 6 runs, quiet and loaded),
 * open + write + close costs 7-11 us a line against 2.4-3.9 us for a write() on a descriptor kept open; under kiln
 * run that is the background writer's time (kiln_heartbeat_writer), not the training thread's, and it appends all the
 * lines pending since its last append in one write(). */
static kiln_error *step_log_append(const char *dir, const char *lines, int n) {
    char *path = kiln_path_join(dir, KILN_FT_STEP_LOG);
    if (!path) return kiln_errorf(KILN_ENOMEM, "step log");
    kiln_error *e = write_once(path, O_WRONLY | O_CREAT | O_APPEND, lines, n);
    free(path);
    return e;
}

/* The beat as JSON into text[cap]; *n its length. */
static kiln_error *beat_text(const kiln_heartbeat *h, char *text, size_t cap, int *n_out) {
    char loss[40], gn[40], lgn[40];
    num(loss, sizeof loss, h->loss);
    num(gn, sizeof gn, h->grad_norm);
    num(lgn, sizeof lgn, h->local_grad_norm);
    int n = snprintf(text, cap,
                     "{\"rank\":%d,\"world\":%d,\"attempt\":%d,\"pid\":%ld,\"step\":%lld,\"steps\":%lld,\"phase\":\"%s\","
                     "\"loss\":%s,\"grad_norm\":%s,\"local_grad_norm\":%s,\"step_s\":%.6f,\"compute_s\":%.6f,"
                     "\"time\":%.3f,\"recent\":[",
                     h->rank, h->world, h->attempt, h->pid, (long long)h->step, (long long)h->steps, h->phase, loss, gn,
                     lgn, h->step_s, h->compute_s, h->time);
    for (int i = 0; i < h->nrecent && i < KILN_HB_RECENT && n < (int)cap; i++) {
        num(loss, sizeof loss, h->recent[i].loss);
        num(gn, sizeof gn, h->recent[i].grad_norm);
        n += snprintf(text + n, cap - (size_t)n, "%s[%lld,%s,%s]", i ? "," : "", (long long)h->recent[i].step, loss, gn);
    }
    if (n < (int)cap) n += snprintf(text + n, cap - (size_t)n, "]}\n");
    if (n >= (int)cap) return kiln_errorf(KILN_EINVAL, "heartbeat of rank %d: longer than %zu bytes", h->rank, cap);
    *n_out = n;
    return NULL;
}

/* dir/rank_NNNNN.json replaced by text: temp file, one write(), rename (no fsync) */
static kiln_error *beat_replace(const char *dir, int rank, const char *text, int n) {
    char *path = kiln_heartbeat_path(dir, rank), tmp[4200];
    if (!path) return kiln_errorf(KILN_ENOMEM, "heartbeat");
    kiln_error *e = NULL;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        e = kiln_errorf(KILN_EINVAL, "%s: the heartbeat's path is too long", path);
    else {
        e = write_once(tmp, O_WRONLY | O_CREAT | O_TRUNC, text, n);
        if (!e && rename(tmp, path)) e = kiln_errorf(KILN_EIO, "%s: rename: %s", path, strerror(errno));
        if (e) unlink(tmp);
    }
    free(path);
    return e;
}

/* The beat reports a trained step that goes into rank 0's step log: the last entry of its recent list. */
static int wants_line(const kiln_heartbeat *h) {
    return h->rank == 0 && !strcmp(h->phase, "train") && h->nrecent > 0 && h->recent[h->nrecent - 1].step == h->step;
}

#define BEAT_CAP (1024 + KILN_HB_RECENT * 128)
#define LINE_CAP 128 /* "[attempt,step,loss,grad_norm]\n": at most 11 + 20 + 2 x 24 + 6 bytes */

kiln_error *kiln_heartbeat_write(const char *dir, const kiln_heartbeat *h) {
    char text[BEAT_CAP];
    int n = 0;
    KILN_TRY(beat_text(h, text, sizeof text, &n));
    /* rank 0 also appends each trained step to the step log, before the beat that reports it: a beat
     * keeps only the last KILN_HB_RECENT steps, and fast steps can outrun the supervisor's polls */
    if (wants_line(h)) {
        char line[LINE_CAP];
        const int l = step_line(line, sizeof line, h->attempt, h->step, h->recent[h->nrecent - 1].loss,
                                h->recent[h->nrecent - 1].grad_norm);
        KILN_TRY(step_log_append(dir, line, l));
    }
    return beat_replace(dir, h->rank, text, n);
}

/* ---- the background writer (kiln run's trainer) ----
 *
 * One thread per writer. post() only copies: the step's record joins a queue of step-log lines (FIFO, bounded: a
 * poster waits while HB_QUEUE lines are pending, a writer that far behind is a file system that stalls; checkpoint()
 * queues a checkpoint's line the same way, so it is written after its step's) and the beat
 * replaces the one in the "newest beat" slot (beats not yet taken are coalesced: only the newest matters). The thread
 * takes everything pending under the lock, in one go, then appends the lines (one write()) and then replaces the beat
 * file: a beat's own line was posted with it or before it, so it is in the log before the beat is on disk. A post
 * while the thread writes is taken as soon as that write ends: the beat on disk lags by at most one write in flight.
 * The first error of a background write is kept, later work dropped (it would put a beat ahead of a missing line),
 * and the error returned by the next post, flush or close. */
#define HB_QUEUE 1024

typedef struct {
    int attempt, ckpt; /* ckpt: the checkpoint line of step (kiln_heartbeat_writer_checkpoint) */
    int64_t step;
    double loss, grad_norm;
} hb_line;

struct kiln_heartbeat_writer {
    char *dir;
    pthread_mutex_t mu;
    pthread_cond_t work; /* the thread: something posted, or close */
    pthread_cond_t done; /* posters: room in the queue; flush: a batch written */
    pthread_t tid;
    int threaded, stop, failed;
    hb_line q[HB_QUEUE]; /* pending lines, a ring: q[(qhead + i) % HB_QUEUE], i < qn */
    int qhead, qn;
    kiln_heartbeat beat; /* the newest beat not yet taken */
    int have_beat;
    uint64_t posted, finished; /* posts so far; posts whose work is written (or dropped after an error) */
    kiln_error *err;           /* the first background error, not yet returned */
    long delay_ms;             /* a testing hook: sleep before each batch (a slow file system) */
    int64_t nbeats, nlines, nbatches;
    /* the thread's own: what it took */
    hb_line lines[HB_QUEUE];
    kiln_heartbeat taken;
    char *linebuf; /* HB_QUEUE * LINE_CAP */
};

static void sleep_ms(long ms) {
    struct timespec ts = {(time_t)(ms / 1000), (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* Write what was taken: lines first, then the beat. */
static kiln_error *write_batch(kiln_heartbeat_writer *w, int nl, int have_beat) {
    if (nl) {
        int n = 0;
        for (int i = 0; i < nl; i++)
            n += w->lines[i].ckpt ? ckpt_line(w->linebuf + n, LINE_CAP, w->lines[i].attempt, w->lines[i].step)
                                  : step_line(w->linebuf + n, LINE_CAP, w->lines[i].attempt, w->lines[i].step,
                                              w->lines[i].loss, w->lines[i].grad_norm);
        kiln_error *e = step_log_append(w->dir, w->linebuf, n);
        if (e) {
            if (nl == 1) return kiln_error_wrap(e, "step log line of step %lld, written in the background",
                                                (long long)w->lines[0].step);
            return kiln_error_wrap(e, "step log lines of steps %lld-%lld, written in the background",
                                   (long long)w->lines[0].step, (long long)w->lines[nl - 1].step);
        }
    }
    if (have_beat) {
        char text[BEAT_CAP];
        int n = 0;
        kiln_error *e = beat_text(&w->taken, text, sizeof text, &n);
        if (!e) e = beat_replace(w->dir, w->taken.rank, text, n);
        if (e) return kiln_error_wrap(e, "heartbeat of step %lld, written in the background", (long long)w->taken.step);
    }
    return NULL;
}

static void *writer_main(void *p) {
    kiln_heartbeat_writer *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !w->qn && !w->have_beat) pthread_cond_wait(&w->work, &w->mu);
        if (!w->qn && !w->have_beat) break; /* closed, and everything written */
        const int nl = w->qn, hb = w->have_beat, skip = w->failed;
        for (int i = 0; i < nl; i++) w->lines[i] = w->q[(w->qhead + i) % HB_QUEUE];
        w->qhead = (w->qhead + nl) % HB_QUEUE, w->qn = 0;
        if (hb) w->taken = w->beat, w->have_beat = 0;
        const uint64_t upto = w->posted;
        const long delay = w->delay_ms;
        pthread_cond_broadcast(&w->done); /* room in the queue */
        pthread_mutex_unlock(&w->mu);
        if (delay > 0 && !skip) sleep_ms(delay);
        kiln_error *e = skip ? NULL : write_batch(w, nl, hb);
        pthread_mutex_lock(&w->mu);
        if (!skip && !e) w->nlines += nl, w->nbeats += hb, w->nbatches++;
        if (e && !w->failed) w->err = e, w->failed = 1;
        else kiln_error_free(e);
        w->finished = upto;
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

kiln_error *kiln_heartbeat_writer_open(const char *dir, kiln_heartbeat_writer **out) {
    *out = NULL;
    long delay = 0;
    const char *d = getenv("KILN_HEARTBEAT_DELAY_MS");
    if (d && *d) {
        char *end = NULL;
        errno = 0;
        delay = strtol(d, &end, 10);
        if (errno || *end || delay < 0 || delay > 3600000)
            return kiln_errorf(KILN_EINVAL, "KILN_HEARTBEAT_DELAY_MS='%s': want milliseconds, 0..3600000", d);
    }
    kiln_heartbeat_writer *w = calloc(1, sizeof *w);
    if (!w) return kiln_errorf(KILN_ENOMEM, "%s: heartbeat writer", dir);
    w->dir = strdup(dir);
    w->linebuf = malloc((size_t)HB_QUEUE * LINE_CAP);
    if (!w->dir || !w->linebuf) {
        free(w->dir);
        free(w->linebuf);
        free(w);
        return kiln_errorf(KILN_ENOMEM, "%s: heartbeat writer", dir);
    }
    w->delay_ms = delay;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    /* the thread inherits this mask: Ctrl-C and the supervisor's SIGTERM keep landing on the training thread */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    w->threaded = pthread_create(&w->tid, NULL, writer_main, w) == 0; /* else: written synchronously by post */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    *out = w;
    return NULL;
}

/* The error to return now (taken out of the writer), or NULL. Called with the lock held. */
static kiln_error *take_error(kiln_heartbeat_writer *w) {
    kiln_error *e = w->err;
    w->err = NULL;
    if (!e && w->failed)
        e = kiln_errorf(KILN_EIO, "%s: the heartbeat writer stopped at an earlier error", w->dir);
    return e;
}

/* Queue the step-log line *line (NULL: none) behind every line queued before it and make *beat (NULL: none) the
 * newest beat, for the thread to write; waits while HB_QUEUE lines are pending (a writer that far behind is a file
 * system that stalls). The threaded path of post() and checkpoint(). */
static kiln_error *enqueue(kiln_heartbeat_writer *w, const hb_line *line, const kiln_heartbeat *beat) {
    pthread_mutex_lock(&w->mu);
    while (line && w->qn == HB_QUEUE && !w->failed) pthread_cond_wait(&w->done, &w->mu); /* far behind: wait */
    if (w->failed) {
        kiln_error *e = take_error(w);
        pthread_mutex_unlock(&w->mu);
        return e;
    }
    if (line) w->q[(w->qhead + w->qn++) % HB_QUEUE] = *line;
    if (beat) w->beat = *beat, w->have_beat = 1;
    w->posted++;
    pthread_mutex_unlock(&w->mu);
    pthread_cond_signal(&w->work); /* after the unlock: the thread does not wake into a held mutex */
    return NULL;
}

kiln_error *kiln_heartbeat_writer_post(kiln_heartbeat_writer *w, const kiln_heartbeat *h) {
    if (!w->threaded) { /* no thread could be started: as kiln_heartbeat_write, with the delay hook */
        if (w->delay_ms > 0) sleep_ms(w->delay_ms);
        kiln_error *e = kiln_heartbeat_write(w->dir, h);
        w->posted++, w->finished++, w->nbatches++, w->nbeats += !e, w->nlines += !e && wants_line(h);
        return e;
    }
    if (!wants_line(h)) return enqueue(w, NULL, h);
    const hb_line l = {.attempt = h->attempt, .step = h->step, .loss = h->recent[h->nrecent - 1].loss,
                       .grad_norm = h->recent[h->nrecent - 1].grad_norm};
    return enqueue(w, &l, h);
}

kiln_error *kiln_heartbeat_writer_checkpoint(kiln_heartbeat_writer *w, int attempt, int64_t step) {
    if (!w->threaded) { /* as post without a thread: written here */
        if (w->delay_ms > 0) sleep_ms(w->delay_ms);
        char line[LINE_CAP];
        kiln_error *e = step_log_append(w->dir, line, ckpt_line(line, sizeof line, attempt, step));
        w->posted++, w->finished++, w->nbatches++, w->nlines += !e;
        return e ? kiln_error_wrap(e, "step log line of the checkpoint of step %lld", (long long)step) : NULL;
    }
    /* after every line posted before it: its step's too */
    const hb_line l = {.attempt = attempt, .ckpt = 1, .step = step, .loss = NAN, .grad_norm = NAN};
    return enqueue(w, &l, NULL);
}

kiln_error *kiln_heartbeat_writer_flush(kiln_heartbeat_writer *w) {
    if (!w->threaded) return NULL;
    pthread_mutex_lock(&w->mu);
    const uint64_t target = w->posted;
    while (w->finished < target) pthread_cond_wait(&w->done, &w->mu);
    kiln_error *e = w->failed ? take_error(w) : NULL;
    pthread_mutex_unlock(&w->mu);
    return e;
}

kiln_error *kiln_heartbeat_writer_close(kiln_heartbeat_writer *w) {
    if (!w) return NULL;
    if (w->threaded) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->tid, NULL); /* the thread writes everything posted before it ends */
    }
    kiln_error *e = w->err; /* an error already returned by a post or a flush is not returned again */
    pthread_cond_destroy(&w->work);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->mu);
    free(w->linebuf);
    free(w->dir);
    free(w);
    return e;
}

void ft_heartbeat_writer_set_delay(kiln_heartbeat_writer *w, long ms) {
    pthread_mutex_lock(&w->mu);
    w->delay_ms = ms;
    pthread_mutex_unlock(&w->mu);
}

void ft_heartbeat_writer_counts(kiln_heartbeat_writer *w, int64_t *beats, int64_t *lines, int64_t *batches) {
    pthread_mutex_lock(&w->mu);
    if (beats) *beats = w->nbeats;
    if (lines) *lines = w->nlines;
    if (batches) *batches = w->nbatches;
    pthread_mutex_unlock(&w->mu);
}

static int num_of(const cJSON *x, double *out) {
    if (cJSON_IsNumber(x)) *out = x->valuedouble;
    else if (cJSON_IsString(x) && !strcmp(x->valuestring, "nan")) *out = NAN;
    else if (cJSON_IsString(x) && !strcmp(x->valuestring, "inf")) *out = INFINITY;
    else if (cJSON_IsString(x) && !strcmp(x->valuestring, "-inf")) *out = -INFINITY;
    else return 0;
    return 1;
}

static kiln_error *get_num(const cJSON *o, const char *key, double *out, const char *ctx) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (num_of(x, out)) return NULL;
    return kiln_errorf(KILN_EFORMAT, "%s: field '%s' must be a number, \"nan\" or \"inf\"", ctx, key);
}

kiln_error *kiln_heartbeat_read(const char *dir, int rank, kiln_heartbeat *h) {
    char *path = kiln_heartbeat_path(dir, rank);
    if (!path) return kiln_errorf(KILN_ENOMEM, "heartbeat");
    cJSON *o = NULL;
    kiln_error *e = kiln_json_parse_file(path, &o);
    memset(h, 0, sizeof *h);
    int64_t v = 0;
    const char *phase = NULL;
    if (!e) e = kiln_json_get_int(o, "rank", &v, 0, 1, path), h->rank = (int)v;
    if (!e) e = kiln_json_get_int(o, "world", &v, 0, 1, path), h->world = (int)v;
    if (!e) e = kiln_json_get_int(o, "attempt", &v, 0, 1, path), h->attempt = (int)v;
    if (!e) e = kiln_json_get_int(o, "pid", &v, 0, 1, path), h->pid = (long)v;
    if (!e) e = kiln_json_get_int(o, "step", &h->step, 0, 1, path);
    if (!e) e = kiln_json_get_int(o, "steps", &h->steps, 0, 1, path);
    if (!e) e = kiln_json_get_string(o, "phase", &phase, NULL, 1, path);
    if (!e) snprintf(h->phase, sizeof h->phase, "%s", phase);
    if (!e) e = get_num(o, "loss", &h->loss, path);
    if (!e) e = get_num(o, "grad_norm", &h->grad_norm, path);
    if (!e) e = get_num(o, "local_grad_norm", &h->local_grad_norm, path);
    if (!e) e = get_num(o, "step_s", &h->step_s, path);
    if (!e) e = get_num(o, "compute_s", &h->compute_s, path);
    if (!e) e = get_num(o, "time", &h->time, path);
    const cJSON *rec = e ? NULL : cJSON_GetObjectItemCaseSensitive(o, "recent"), *it;
    if (!e && !cJSON_IsArray(rec)) e = kiln_errorf(KILN_EFORMAT, "%s: 'recent' must be a list", path);
    if (e) rec = NULL;
    cJSON_ArrayForEach(it, rec) {
        if (h->nrecent == KILN_HB_RECENT || cJSON_GetArraySize(it) != 3 ||
            !kiln_json_int_value(cJSON_GetArrayItem(it, 0), &h->recent[h->nrecent].step) ||
            !num_of(cJSON_GetArrayItem(it, 1), &h->recent[h->nrecent].loss) ||
            !num_of(cJSON_GetArrayItem(it, 2), &h->recent[h->nrecent].grad_norm)) {
            e = kiln_errorf(KILN_EFORMAT, "%s: 'recent' entry %d is not [step, loss, grad_norm]", path, h->nrecent);
            break;
        }
        h->nrecent++;
    }
    if (!e && h->rank != rank) e = kiln_errorf(KILN_EFORMAT, "%s: rank %d in the file of rank %d", path, h->rank, rank);
    cJSON_Delete(o);
    free(path);
    return e;
}

int ft_step_log_read(const char *dir, long off, ft_step_rec *out, int cap) {
    char *path = kiln_path_join(dir, KILN_FT_STEP_LOG);
    FILE *f = path ? fopen(path, "r") : NULL;
    free(path);
    if (!f) return -1;
    int n = 0;
    char line[256];
    if (fseek(f, off, SEEK_SET)) {
        fclose(f);
        return 0;
    }
    while (n < cap && fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        if (!l || line[l - 1] != '\n') break; /* being written: read at the next call */
        off += (long)l;
        cJSON *a = cJSON_Parse(line);
        int64_t att = 0;
        ft_step_rec *r = &out[n];
        const int size = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
        const cJSON *third = size == 3 ? cJSON_GetArrayItem(a, 2) : NULL;
        r->ckpt = third && cJSON_IsString(third) && !strcmp(third->valuestring, "ckpt");
        if ((size == 4 || r->ckpt) && kiln_json_int_value(cJSON_GetArrayItem(a, 0), &att) &&
            kiln_json_int_value(cJSON_GetArrayItem(a, 1), &r->step) &&
            (r->ckpt ? r->step >= 1 : num_of(cJSON_GetArrayItem(a, 2), &r->loss) &&
                                          num_of(cJSON_GetArrayItem(a, 3), &r->grad_norm))) {
            if (r->ckpt) r->loss = r->grad_norm = NAN;
            r->attempt = (int)att;
            r->end = off;
            n++;
        }
        cJSON_Delete(a);
    }
    fclose(f);
    return n;
}
