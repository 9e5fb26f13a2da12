/* kiln run's supervisor: launch the ranks, watch them, stop, roll back, restart.
 *
 * One attempt = one launch of the training command (directly for one rank, through mpirun for
 * several). While it runs the supervisor forwards the ranks' output, reads their heartbeats and
 * reaps children; the first failure it sees ends the attempt: the job is stopped (SIGTERM to every
 * process under the supervisor, SIGKILL after the grace period), the incident is logged, and after
 * an exponential back-off the next attempt resumes from the newest valid checkpoint. A NaN or a
 * loss spike also adds the offending steps to the windows the trainer skips, and sets aside any
 * checkpoint trained on them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ft_internal.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/json.h"

void kiln_supervisor_opts_default(kiln_supervisor_opts *o) {
    memset(o, 0, sizeof *o);
    o->np = 1;
    o->launcher = KILN_LAUNCH_AUTO;
    o->mpirun = "mpirun";
    o->run_dir = "runs/default";
    o->max_restarts = 5;
    o->backoff_s = 1;
    o->backoff_max_s = 60;
    o->hang_timeout_s = 300;
    o->start_timeout_s = 600;
    o->grace_s = 10;
    o->spike_z = 6;
    o->spike_window = 50;
    o->spike_min = 10;
    o->straggler_factor = 3;
    o->straggler_steps = 5;
    o->skip_window = 1;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- one attempt ---- */

typedef enum { OUT_RUNNING, OUT_DONE, OUT_INCIDENT, OUT_INTERRUPTED } outcome;

typedef struct {
    const kiln_supervisor_opts *o;
    int attempt;
    char hb_dir[1100], incidents[1100];
    pid_t child;
    int out_fd[2];              /* the child's stdout, stderr pipes (-1 once closed) */
    char err_tail[2048];        /* the last line(s) of the ranks' stderr, for incident details */
    int mpi_rank, mpi_signal;   /* what mpirun said about the first failed rank (-1: nothing) */
    int child_status, child_exited;
    double launched;
    kiln_heartbeat *hb;         /* [np] the latest beat of each rank */
    int *have_hb, *slow_count, *straggler_told;
    double *last_change;        /* monotonic time of each rank's last new beat */
    int64_t spike_step;         /* last step fed to the spike detector */
    int64_t straggler_step;
    kiln_spike_detector spike;
    /* the losses the detector has accepted (with --spike-z 0: every finite loss): the last history_keep of them and
     * the windows before the checkpoints rank 0 reported and before older round steps (src/ft/history.c), kept across
     * attempts and in RUN_DIR/ft_state.json across reruns: a restart or a rerun continues from the --spike-window
     * losses right before its first step instead of going blind for --spike-min steps, also when it resumes from
     * further back than history_keep */
    ft_hist hist;                 /* cap 0: none kept */
    int seeded;                   /* this attempt's history was cut to the steps before its first one */
    int hist_warned;              /* a failure to keep a loss or a window was told */
    int state_dirty, state_warned; /* ft_state.json is behind (the history, a set-aside applied); a failed write told */
    int state_now;                /* ... and must not wait for the interval (a set-aside applied) */
    double state_saved;           /* monotonic time ft_state.json was last written */
    const kiln_step_ranges *skip; /* the windows skipped so far (their losses leave the history) */
    int64_t reject_from;          /* checkpoints of step >= this are set aside by the next attempt (0: none) */
    long log_off;                 /* how far rank 0's step log has been read */
    int have_log;                 /* this attempt has a step log (else: the beats' recent lists) */
    double int_at;                /* monotonic time of the Ctrl-C (0: none) */
    int first_dead;             /* a rank seen dead (zombie or gone) while the job ran */
    /* the incident that ends the attempt */
    char kind[32], detail[1024];
    int rank;
    int64_t step, bad_step;     /* bad_step: a NaN/spike step whose window is skipped (-1: none) */
    double nan_seen;            /* monotonic time a not-yet-blamed NaN was first seen (0: none) */
} attempt_state;

/* Read what a pipe has (non-blocking); returns the bytes read. */
static ssize_t forward(attempt_state *a, int which) {
    char buf[4096];
    ssize_t n = read(a->out_fd[which], buf, sizeof buf - 1);
    if (n <= 0) {
        if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            close(a->out_fd[which]);
            a->out_fd[which] = -1;
        }
        return 0;
    }
    if (!a->o->quiet) {
        FILE *f = which ? stderr : stdout;
        fwrite(buf, 1, (size_t)n, f);
        fflush(f);
    }
    if (which == 0) return n;
    buf[n] = 0;
    /* keep the tail of stderr; learn from mpirun's report which rank failed first */
    size_t have = strlen(a->err_tail), add = (size_t)n;
    if (add >= sizeof a->err_tail) {
        memcpy(a->err_tail, buf + add - (sizeof a->err_tail - 1), sizeof a->err_tail);
    } else {
        if (have + add >= sizeof a->err_tail) {
            size_t drop = have + add - (sizeof a->err_tail - 1);
            memmove(a->err_tail, a->err_tail + drop, have - drop + 1);
            have -= drop;
        }
        memcpy(a->err_tail + have, buf, add + 1);
    }
    const char *p;
    if (a->mpi_rank < 0 && (p = strstr(a->err_tail, "process rank "))) {
        a->mpi_rank = atoi(p + 13);
        const char *s = strstr(p, "exited on signal ");
        if (s) a->mpi_signal = atoi(s + 17);
    }
    if (a->mpi_rank < 0 && (p = strstr(a->err_tail, "Process name: [["))) {
        const char *c = strstr(p, "],");
        if (c) a->mpi_rank = atoi(c + 2);
    }
    return n;
}

/* The error line of the ranks' stderr that explains a failure, and the rank that printed it. A
 * trainer prints "kiln train (rank R): error: ..."; a rank that only failed because another did
 * says "... on another rank", so the first line without that is the cause (mpirun names whichever
 * rank exited first). mpirun's banner does not count. *rank is kept when no line names one. */
static void error_line(const attempt_state *a, int *rank, char *buf, size_t cap) {
    buf[0] = 0;
    const char *s = a->err_tail, *best = NULL;
    size_t bl = 0;
    int best_score = -1;
    while (*s) {
        const char *e = strchr(s, '\n');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(l < 511 ? l : 511), s);
        if (strstr(line, "error") && !strstr(line, "mpirun") && line[0] != '-') {
            /* a cause first; then a line in kiln's own form ("kiln ...: error: ...") over any output that merely
             * contains the word (a data sample, a warning about "errors") */
            int score = 4 * !strstr(line, "another rank") + 2 * !!strstr(line, "error:") + !strncmp(line, "kiln", 4);
            if (score > best_score) best = s, bl = l, best_score = score;
        }
        s += l + (e ? 1 : 0);
    }
    if (!best) return;
    snprintf(buf, cap, "%.*s", (int)(bl < 400 ? bl : 400), best);
    const char *r = strstr(buf, "(rank ");
    if (r) *rank = atoi(r + 6);
}

static void set_incident(attempt_state *a, const char *kind, int rank, int64_t step, int64_t bad_step, const char *fmt,
                         ...) KILN_PRINTF(6, 7);
static void set_incident(attempt_state *a, const char *kind, int rank, int64_t step, int64_t bad_step, const char *fmt,
                         ...) {
    snprintf(a->kind, sizeof a->kind, "%s", kind);
    a->rank = rank;
    a->step = step;
    a->bad_step = bad_step;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->detail, sizeof a->detail, fmt, ap);
    va_end(ap);
}

static void log_incident(attempt_state *a, const char *kind, int rank, int64_t step, const char *detail,
                         const char *action) {
    kiln_incident in = {wall(), a->attempt, kind, rank, step, detail, action};
    kiln_error *e = kiln_incident_append(a->incidents, &in);
    if (e) {
        fprintf(stderr, "kiln run: warning: %s\n", kiln_error_msg(e));
        kiln_error_free(e);
    }
    char line[1600];
    kiln_incident_summary(&in, line, sizeof line);
    fprintf(a->o->out, "%s\n", line);
    fflush(a->o->out);
}

/* The rank whose own gradient was not finite at `step` (its latest beat), or -1 */
static int nan_blame(const attempt_state *a, int64_t step) {
    for (int q = 0; q < a->o->np; q++)
        if (a->have_hb[q] && a->hb[q].step == step && !isfinite(a->hb[q].local_grad_norm)) return q;
    return -1;
}

/* 1 while a NaN at `step` that no rank is blamed for yet should wait for the other ranks' beats of that step:
 * the ranks write their beats one after the other, so the first one seen (the global norm is NaN on every
 * rank) may come before the beat of the rank that produced it. Not once the job has exited (its beats are
 * final), and 2 s at most. */
static int nan_wait(attempt_state *a, int64_t step) {
    if (a->child_exited) return 0;
    int behind = 0;
    for (int q = 0; q < a->o->np; q++) behind |= !a->have_hb[q] || a->hb[q].step < step;
    if (!behind) return 0;
    if (a->nan_seen == 0) a->nan_seen = mono();
    return mono() - a->nan_seen < 2.0;
}

/* A non-finite loss or gradient norm in a beat: the NaN incident, blaming the rank whose own
 * gradient was not finite. */
static int check_nan(attempt_state *a) {
    const int np = a->o->np;
    for (int r = 0; r < np; r++) {
        const kiln_heartbeat *h = &a->hb[r];
        if (!a->have_hb[r] || strcmp(h->phase, "train") || (isfinite(h->loss) && isfinite(h->grad_norm))) continue;
        const int who = nan_blame(a, h->step);
        if (who < 0 && nan_wait(a, h->step)) return 0;
        set_incident(a, "nan", who, h->step, h->step, "loss %g, gradient norm %g%s", h->loss, h->grad_norm,
                     who >= 0 ? " (this rank's own gradient was not finite)" : "");
        return 1;
    }
    return 0;
}

/* The history failed to keep a loss or a window (out of memory): the run goes on, the detector perhaps blind for a
 * few steps after a later restart; told once. */
static void hist_warn(attempt_state *a, kiln_error *e) {
    if (e && !a->hist_warned) fprintf(stderr, "kiln run: warning: %s\n", kiln_error_msg(e));
    a->hist_warned |= e != NULL;
    kiln_error_free(e);
}

/* Before the first step an attempt trains is judged: the history is cut to the steps before it, less those of any
 * skipped window (both belong to a rolled-back stretch: the attempt resumed from a checkpoint before `first`), and the
 * detector rebuilt from the window right before `first`: the dense part's, or an anchor's when the checkpoint was
 * further back (ft_hist_seed: only losses held without a gap up to first - 1). A rerun's first attempt does the same
 * with the history from ft_state.json. */
static void spike_seed(attempt_state *a, int64_t first) {
    int changed = 0;
    hist_warn(a, ft_hist_seed(&a->hist, first, a->skip, &changed));
    a->state_dirty |= changed;
    if (a->o->spike_z > 0) {
        const int k = a->hist.n;
        kiln_spike_reset(&a->spike);
        for (int i = k > a->o->spike_window ? k - a->o->spike_window : 0; i < k; i++)
            kiln_spike_push(&a->spike, a->hist.loss[i], 0); /* z_max 0: always kept */
    }
    a->seeded = 1;
}

/* How many losses the history's dense part keeps: more than the detector's window, since a restart resumes from the
 * newest checkpoint, up to run.ckpt_every steps back (200 by default), and its first steps are judged against the
 * window of losses before the checkpoint; a history of --spike-window losses alone was all after it, cut, and the
 * detector went blind for --spike-min steps. Checkpoints further back are served by the anchors (history.c: the
 * windows before the checkpoints the trainer reported, and before round steps). 1024, or
 * the window when larger; KILN_FT_HISTORY_KEEP=N (a testing hook). */
#define HISTORY_KEEP 1024
static int history_keep(int window) {
    const char *v = getenv("KILN_FT_HISTORY_KEEP");
    const long keep = v && *v ? atol(v) : HISTORY_KEEP;
    return keep > window && keep <= KILN_FT_MAX_SPIKE_WINDOW ? (int)keep : window;
}

/* A judged step's loss joins the history (past history_keep the oldest falls out, leaving a window behind where the
 * rule of history.c wants one). */
static void hist_add(attempt_state *a, int64_t s, double loss) {
    if (a->hist.cap <= 0) return;
    hist_warn(a, ft_hist_add(&a->hist, s, loss));
    a->state_dirty = 1;
}

/* Rank 0 took the checkpoint of step s (its step-log line, read after the lines of every step up to s, all judged): the
 * window of the losses before it becomes a checkpoint's anchor (ft_hist_ckpt), so that a resume from that checkpoint,
 * however far back, is judged from its first step; ft_state.json is written at the next poll, so that a rerun after a
 * lost supervisor finds it too. Not before this attempt's first step is judged (every step since its resume skipped):
 * the history may still hold a rolled-back stretch after the resume step, which the supervisor does not know; that
 * checkpoint gets no window of its own (a round step's anchor may still serve). */
static void ckpt_seen(attempt_state *a, int64_t s) {
    if (a->hist.cap <= 0 || !a->seeded) return;
    int added = 0;
    hist_warn(a, ft_hist_ckpt(&a->hist, s, &added));
    if (added) a->state_dirty = a->state_now = 1;
}

/* One trained step's global loss and gradient norm: 1 when it ends the attempt (NaN, spike), -1 when a NaN
 * waits for the beat that tells who produced it (the step is judged again at the next poll), 0 otherwise. */
static int judge_step(attempt_state *a, int64_t s, double loss, double gn) {
    const kiln_supervisor_opts *o = a->o;
    if (s <= a->spike_step) return 0;
    if (!isfinite(loss) || !isfinite(gn)) {
        const int who = nan_blame(a, s);
        if (who < 0 && nan_wait(a, s)) return -1;
        a->spike_step = s;
        set_incident(a, "nan", who, s, s, "loss %g, gradient norm %g%s", loss, gn,
                     who >= 0 ? " (this rank's own gradient was not finite)" : "");
        return 1;
    }
    a->spike_step = s;
    if (!a->seeded) spike_seed(a, s);
    if (o->spike_z > 0) {
        double z = kiln_spike_push(&a->spike, loss, o->spike_z);
        if (z > o->spike_z) {
            set_incident(a, "loss-spike", -1, s, s, "loss %.6g is %.1f standard deviations above the mean of the "
                         "last %d steps", loss, z, a->spike.n);
            return 1;
        }
    }
    hist_add(a, s, loss);
    return 0;
}

/* RUN_DIR/ft_state.json: what must outlive this supervisor process (a rerun after Ctrl-C, a lost supervisor)
 * and is not in the checkpoints: the data windows to skip, a set-aside from step reject_from that no attempt has
 * applied yet, and the loss-spike detector's history: its dense part as [step, loss] pairs, oldest first, its
 * anchors as [end, [[step, loss], ...]] and the ends of the checkpoints' among them (src/ft/state.c):
 *   {"skip_steps":"12","reject_from":0,"spike_history":[[5,2.31],[6,2.29]],"spike_anchors":[],"spike_checkpoints":[]}
 * Replaced atomically (kiln_write_file_atomic: temp file, fsync, rename, fsync of the directory). A new skip window
 * and its set-aside are written at once, before the back-off, and a failure stops the supervisor (a rerun would
 * train the bad window again). The set-aside applied (rank 0 of an attempt beat) and a checkpoint's new anchor are
 * written as soon as they are seen (at the next poll), and the rest of the history at most every STATE_LAZY_EVERY_S
 * seconds while an attempt runs and at its end: a failed write of
 * those is a warning (a rerun would at worst set aside checkpoints trained anew, or judge its first steps against
 * an older window). The history written is bounded (history_keep losses and the anchors' budget, history.c), none of
 * a skipped window; a rerun cuts it to the steps before its first one (spike_seed), since it resumes from the newest
 * valid checkpoint, which may be older than the newest steps judged. A file without "spike_history",
 * "spike_anchors" or "spike_checkpoints" (an older kiln's) loads without that part. */
#define STATE_FILE "ft_state.json"
#define STATE_LAZY_EVERY_S 2.0

static kiln_error *state_save(attempt_state *a) {
    char *path = kiln_path_join(a->o->run_dir, STATE_FILE), *text = NULL;
    size_t n = 0;
    kiln_error *e = path ? ft_state_format(a->skip, a->reject_from, &a->hist, &text, &n)
                         : kiln_errorf(KILN_ENOMEM, "%s", STATE_FILE);
    if (!e) e = kiln_write_file_atomic(path, text, n);
    if (!e) a->state_dirty = a->state_now = 0, a->state_saved = mono();
    free(text);
    free(path);
    return e;
}

/* What is written lazily (the history, a set-aside applied) is not worth stopping the run for: a failed write is a
 * warning (once), and the next try comes at the next interval. force: now, whatever the interval. */
static void state_save_lazy(attempt_state *a, int force) {
    if (!a->state_dirty || (!force && !a->state_now && mono() - a->state_saved < STATE_LAZY_EVERY_S)) return;
    kiln_error *e = state_save(a);
    if (e && !a->state_warned)
        fprintf(stderr, "kiln run: warning: %s (kept for a rerun once a write succeeds)\n", kiln_error_msg(e));
    a->state_warned |= e != NULL;
    if (e) a->state_saved = mono(), a->state_now = 0; /* retried at the next interval, not at every poll */
    kiln_error_free(e);
}

static kiln_error *state_load(attempt_state *a, kiln_step_ranges *skip) {
    char *path = kiln_path_join(a->o->run_dir, STATE_FILE), *text = NULL;
    if (!path) return kiln_errorf(KILN_ENOMEM, "%s", STATE_FILE);
    kiln_error *e = NULL;
    size_t len = 0;
    if (access(path, F_OK) == 0) {
        e = kiln_read_file(path, &text, &len);
        if (!e) e = ft_state_parse(text, len, path, skip, &a->reject_from, &a->hist);
    }
    free(text);
    free(path);
    return e;
}

/* Read every rank's heartbeat; returns 1 when it ends the attempt (NaN, spike, straggler restart). */
static int poll_heartbeats(attempt_state *a) {
    const kiln_supervisor_opts *o = a->o;
    const int np = o->np;
    double t = mono();
    for (int r = 0; r < np; r++) {
        kiln_heartbeat h;
        kiln_error *e = kiln_heartbeat_read(a->hb_dir, r, &h);
        if (e) { /* not written yet */
            kiln_error_free(e);
            continue;
        }
        if (h.attempt != a->attempt) continue; /* a stale beat from a process of the last attempt */
        if (!a->have_hb[r] || h.step != a->hb[r].step || strcmp(h.phase, a->hb[r].phase)) a->last_change[r] = t;
        a->hb[r] = h;
        a->have_hb[r] = 1;
    }
    /* rank 0 applies the set-aside in its setup, before its first beat: from now on a rerun must not set aside the
     * checkpoints this attempt saves (they are trained anew, from before the bad window) */
    if (a->reject_from > 0 && a->have_hb[0]) a->reject_from = 0, a->state_dirty = a->state_now = 1; /* after the poll */
    if (check_nan(a)) return 1;
    /* every step trained since the last poll, from rank 0's step log (the loss and norm are global, the same on
     * every rank): a beat lists only the last KILN_HB_RECENT steps, and more than that can pass between two polls
     * of fast steps. The log is written before the beat, so it holds every step a beat reports; and the checkpoints
     * taken, each after its step */
    ft_step_rec rec[256];
    int n;
    while ((n = ft_step_log_read(a->hb_dir, a->log_off, rec, 256)) > 0) {
        a->have_log = 1;
        for (int i = 0; i < n; i++) {
            int j = 0;
            if (rec[i].attempt == a->attempt && rec[i].ckpt) ckpt_seen(a, rec[i].step);
            else if (rec[i].attempt == a->attempt) j = judge_step(a, rec[i].step, rec[i].loss, rec[i].grad_norm);
            if (j < 0) return 0;
            a->log_off = rec[i].end;
            if (j > 0) return 1;
        }
    }
    if (n == 0) a->have_log = 1;
    /* no step log (a trainer that writes beats but not the log): the recent lists of the lowest rank reporting */
    int r0 = -1;
    for (int r = 0; r < np && r0 < 0 && !a->have_log; r++)
        if (a->have_hb[r]) r0 = r;
    for (int i = 0; r0 >= 0 && i < a->hb[r0].nrecent; i++) {
        int j = judge_step(a, a->hb[r0].recent[i].step, a->hb[r0].recent[i].loss, a->hb[r0].recent[i].grad_norm);
        if (j < 0) return 0;
        if (j > 0) return 1;
    }
    /* stragglers: compare the ranks' compute times once all have reported the same new step (not once the
     * run has ended: there is nothing left to restart) */
    if (o->straggler_factor > 0 && np > 1 && !a->child_exited) {
        int same = 1;
        for (int r = 0; r < np && same; r++)
            same = a->have_hb[r] && !strcmp(a->hb[r].phase, "train") && a->hb[r].step == a->hb[0].step;
        if (same && a->hb[0].step > a->straggler_step) {
            a->straggler_step = a->hb[0].step;
            double *cs = malloc((size_t)np * sizeof *cs), ratio = 0;
            if (cs) {
                for (int r = 0; r < np; r++) cs[r] = a->hb[r].compute_s;
                int s = kiln_straggler(cs, np, o->straggler_factor, &ratio);
                free(cs);
                for (int r = 0; r < np; r++) a->slow_count[r] = r == s ? a->slow_count[r] + 1 : 0;
                if (s >= 0 && a->slow_count[s] >= o->straggler_steps && !a->straggler_told[s]) {
                    char d[256];
                    snprintf(d, sizeof d, "compute time %.3gx the median of the other ranks for %d steps", ratio,
                             a->slow_count[s]);
                    if (o->straggler_restart) {
                        set_incident(a, "straggler", s, a->hb[s].step, -1, "%s", d);
                        return 1;
                    }
                    a->straggler_told[s] = 1;
                    log_incident(a, "straggler", s, a->hb[s].step, d, "warn");
                }
            }
        }
    }
    return 0;
}

/* No progress past the timeouts: blame a stopped rank, else the one furthest behind. */
static int check_hang(attempt_state *a) {
    const kiln_supervisor_opts *o = a->o;
    double t = mono();
    for (int r = 0; r < o->np; r++) {
        int late = a->have_hb[r] ? strcmp(a->hb[r].phase, "done") && t - a->last_change[r] > o->hang_timeout_s
                                 : t - a->launched > o->start_timeout_s;
        if (!late) continue;
        /* blame a stopped rank; else one that never beat; else the only one behind the others */
        int who = -1, stopped = 0;
        for (int q = 0; q < o->np && who < 0; q++)
            if (a->have_hb[q] && ft_proc_state((pid_t)a->hb[q].pid) == 'T') who = q, stopped = 1;
        for (int q = 0; q < o->np && who < 0; q++)
            if (!a->have_hb[q]) who = q;
        if (who < 0) {
            int64_t lo = INT64_MAX, hi = INT64_MIN;
            int nlo = 0;
            for (int q = 0; q < o->np; q++) {
                if (a->hb[q].step < lo) lo = a->hb[q].step, nlo = 0;
                if (a->hb[q].step == lo) nlo++;
                if (a->hb[q].step > hi) hi = a->hb[q].step;
            }
            for (int q = 0; q < o->np && who < 0 && nlo == 1 && lo < hi; q++)
                if (a->hb[q].step == lo) who = q;
        }
        if (a->have_hb[r])
            set_incident(a, "hang", who, a->hb[who >= 0 && a->have_hb[who] ? who : r].step, -1,
                         "no heartbeat progress for %.0f s%s", t - a->last_change[r],
                         stopped ? " (the rank is stopped: SIGSTOP or a debugger)" : "");
        else
            set_incident(a, "hang", r, -1, -1, "no heartbeat within %.0f s of the launch", o->start_timeout_s);
        return 1;
    }
    return 0;
}

/* Reap every child that has exited; note the launched one's status. */
static void reap(attempt_state *a) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0)
        if (p == a->child) {
            a->child_exited = 1;
            a->child_status = st;
        }
}

static int count_descendants(void) {
    pid_t d[4096];
    return ft_proc_descendants(getpid(), d, 4096);
}

static void signal_all(attempt_state *a, int sig) {
    pid_t d[4096];
    int n = ft_proc_descendants(getpid(), d, 4096);
    if (!a->child_exited) kill(-a->child, sig); /* the launched process's group */
    for (int i = 0; i < n; i++) kill(d[i], sig);
}

/* SIGTERM everything under the supervisor, SIGKILL what is left after the grace period (at once on a second
 * Ctrl-C), reap all. */
static void stop_job(attempt_state *a, double grace) {
    if (count_descendants() == 0) {
        reap(a);
        return;
    }
    signal_all(a, SIGTERM);
    double t0 = mono();
    while (mono() - t0 < grace) {
        reap(a);
        for (int i = 0; i < 2; i++)
            if (a->out_fd[i] >= 0) {
                struct pollfd p = {a->out_fd[i], POLLIN, 0};
                if (poll(&p, 1, 0) > 0) forward(a, i);
            }
        if (count_descendants() == 0) return;
        if (a->o->interrupted && *a->o->interrupted > 1) break;
        sleep_s(0.02);
    }
    for (int round = 0; round < 50 && count_descendants() > 0; round++) {
        signal_all(a, SIGKILL);
        sleep_s(0.02);
        reap(a);
    }
    reap(a);
}

static const char *signame(int s) {
    const char *n = strsignal(s);
    return n ? n : "signal";
}

/* The launched command exited: finished, or an incident. */
static outcome classify_exit(attempt_state *a) {
    int st = a->child_status;
    /* The steps trained since the last poll are read first, even after a clean exit: a short run, or the
     * last steps of a long one, can finish between two polls, and a NaN or loss spike in them must not
     * pass as a finished run (whether it was seen would otherwise depend on the poll's timing). */
    if (poll_heartbeats(a)) return OUT_INCIDENT;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return OUT_DONE;
    if (check_nan(a)) return OUT_INCIDENT;
    const int direct = a->o->np == 1 && a->o->launcher != KILN_LAUNCH_MPIRUN;
    int rank = direct ? 0 : a->mpi_rank >= 0 ? a->mpi_rank : a->first_dead;
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    if (!direct && a->mpi_signal > 0) sig = a->mpi_signal;
    if (!direct && !sig && WIFEXITED(st) && WEXITSTATUS(st) > 128) sig = WEXITSTATUS(st) - 128; /* mpirun: 128+sig */
    char line[512];
    int named = rank;
    error_line(a, &named, line, sizeof line);
    if (!sig && named >= 0 && named < a->o->np) rank = named; /* a killed rank prints nothing: mpirun's word stands */
    int64_t step = rank >= 0 && a->have_hb[rank] ? a->hb[rank].step : -1;
    if (sig)
        set_incident(a, "killed", rank, step, -1, "killed by signal %d (%s)%s%s", sig, signame(sig), line[0] ? ": " : "",
                     line);
    else
        set_incident(a, "exit", rank, step, -1, "exited with status %d%s%s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                     line[0] ? ": " : "", line);
    return OUT_INCIDENT;
}

static kiln_error *self_exe(char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return kiln_errorf(KILN_EIO, "/proc/self/exe: %s", strerror(errno));
    buf[n] = 0;
    return NULL;
}

/* argv of this attempt: [mpirun args... -np N -x VAR...] command... */
static kiln_error *build_argv(const kiln_supervisor_opts *o, int use_mpirun, char ***out, char **words) {
    static const char *vars[] = {"KILN_HEARTBEAT_DIR", "KILN_RUN_ATTEMPT", "KILN_RESUME", "KILN_REJECT_FROM",
                                 "KILN_SKIP_STEPS", "KILN_FAULT", "KILN_LOG"};
    int ncmd = 0;
    while (o->cmd[ncmd]) ncmd++;
    *words = o->mpirun_args ? strdup(o->mpirun_args) : NULL;
    int nw = 0;
    for (char *p = *words; p && *p; p++)
        if (*p != ' ' && (p == *words || p[-1] == ' ')) nw++;
    char **v = calloc((size_t)(ncmd + nw + 24), sizeof *v);
    if (!v || (o->mpirun_args && !*words)) {
        free(v);
        return kiln_errorf(KILN_ENOMEM, "command line");
    }
    int k = 0;
    if (use_mpirun) {
        static char np[16];
        snprintf(np, sizeof np, "%d", o->np);
        v[k++] = (char *)o->mpirun;
        char *save = NULL;
        for (char *w = *words ? strtok_r(*words, " ", &save) : NULL; w; w = strtok_r(NULL, " ", &save)) v[k++] = w;
        v[k++] = "-np";
        v[k++] = np;
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) /* OpenMPI: pass the protocol to remote nodes too */
            if (getenv(vars[i])) v[k++] = "-x", v[k++] = (char *)vars[i];
    }
    static char exe[4096];
    for (int i = 0; i < ncmd; i++) {
        v[k] = o->cmd[i];
        if (i == 0 && !strcmp(o->cmd[0], "kiln") && !self_exe(exe, sizeof exe)) v[k] = exe;
        k++;
    }
    *out = v;
    return NULL;
}

static kiln_error *launch(attempt_state *a, int use_mpirun, const char *skip, int64_t reject_from) {
    const kiln_supervisor_opts *o = a->o;
    /* the protocol's variables: set in this process so that the -x list and the child see them */
    char attempt[16], reject[32];
    snprintf(attempt, sizeof attempt, "%d", a->attempt);
    setenv("KILN_HEARTBEAT_DIR", a->hb_dir, 1);
    setenv("KILN_RUN_ATTEMPT", attempt, 1);
    /* every attempt resumes, the first too: the same kiln run command continues a run stopped by
     * Ctrl-C or a lost supervisor (a new out_dir starts from step 0) */
    setenv("KILN_RESUME", "1", 1);
    if (skip && *skip) setenv("KILN_SKIP_STEPS", skip, 1);
    else unsetenv("KILN_SKIP_STEPS");
    if (reject_from > 0) {
        snprintf(reject, sizeof reject, "%lld", (long long)reject_from);
        setenv("KILN_REJECT_FROM", reject, 1);
    } else {
        unsetenv("KILN_REJECT_FROM");
    }
    char **argv = NULL, *words = NULL;
    KILN_TRY(build_argv(o, use_mpirun, &argv, &words));
    int po[2], pe[2];
    if (pipe(po)) {
        free(argv);
        free(words);
        return kiln_errorf(KILN_EIO, "pipe: %s", strerror(errno));
    }
    if (pipe(pe)) {
        close(po[0]), close(po[1]);
        free(argv);
        free(words);
        return kiln_errorf(KILN_EIO, "pipe: %s", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* Ctrl-C at the terminal reaches the supervisor only; it stops the ranks itself */
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "kiln run: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]), close(pe[0]);
        free(argv);
        free(words);
        return kiln_errorf(KILN_EIO, "fork: %s", strerror(errno));
    }
    setpgid(pid, pid);
    a->child = pid;
    a->out_fd[0] = po[0];
    a->out_fd[1] = pe[0];
    /* non-blocking: a rank orphaned with the pipe open must not stall the supervisor */
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    a->launched = mono();
    if (!o->quiet) {
        fprintf(o->out, "kiln run: attempt %d:", a->attempt);
        for (int i = 0; argv[i]; i++) fprintf(o->out, " %s", argv[i]);
        if (skip && *skip) fprintf(o->out, "  (skipping steps %s)", skip);
        fprintf(o->out, "\n");
        fflush(o->out);
    }
    free(argv);
    free(words);
    return NULL;
}

/* Run one attempt until it finishes, fails or is interrupted. */
static outcome watch(attempt_state *a) {
    const kiln_supervisor_opts *o = a->o;
    double last_hb = 0;
    int sent_int = 0;
    for (;;) {
        struct pollfd p[2];
        int n = 0, idx[2];
        for (int i = 0; i < 2; i++)
            if (a->out_fd[i] >= 0) p[n] = (struct pollfd){a->out_fd[i], POLLIN, 0}, idx[n++] = i;
        int rc = n ? poll(p, (nfds_t)n, 50) : (sleep_s(0.05), 0);
        for (int i = 0; rc > 0 && i < n; i++)
            if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) forward(a, idx[i]);
        reap(a);
        if (o->interrupted && *o->interrupted) {
            if (!sent_int) { /* Ctrl-C: the ranks save a checkpoint and exit (the trainer's own SIGINT path) */
                sent_int = 1;
                a->int_at = mono();
                int any = 0;
                for (int r = 0; r < o->np; r++)
                    if (a->have_hb[r] && ft_proc_state((pid_t)a->hb[r].pid)) kill((pid_t)a->hb[r].pid, SIGINT), any = 1;
                if (!any && !a->child_exited) kill(-a->child, SIGINT);
            }
            if (a->child_exited || *o->interrupted > 1 || mono() - a->int_at > o->grace_s) return OUT_INTERRUPTED;
            continue;
        }
        if (a->child_exited) {
            /* drain what is left of the output (the error lines tell what happened) */
            for (int i = 0; i < 2; i++)
                while (a->out_fd[i] >= 0 && forward(a, i) > 0) {}
            return classify_exit(a);
        }
        /* a rank that died while mpirun still runs: remember who went first */
        if (a->first_dead < 0)
            for (int r = 0; r < o->np; r++) {
                char s = a->have_hb[r] ? ft_proc_state((pid_t)a->hb[r].pid) : 'R';
                if (s == 0 || s == 'Z') {
                    a->first_dead = r;
                    break;
                }
            }
        if (mono() - last_hb >= 0.1) {
            last_hb = mono();
            if (poll_heartbeats(a) || check_hang(a)) return OUT_INCIDENT;
            state_save_lazy(a, 0); /* a lost supervisor loses at most the last interval's steps (a set-aside none) */
        }
    }
}

static void clear_heartbeats(const char *dir) {
    char pat[1200];
    snprintf(pat, sizeof pat, "%s/rank_*.json*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
    globfree(&g);
    snprintf(pat, sizeof pat, "%s/%s", dir, KILN_FT_STEP_LOG);
    unlink(pat);
}

/* The directory and its parents (the default runs/default in a fresh directory); an existing non-directory
 * (a file named heartbeat) is an error here, not a failure of every attempt later. */
static kiln_error *make_dir(const char *d) {
    KILN_TRY(kiln_mkdirs(d));
    struct stat sb;
    if (stat(d, &sb)) return kiln_errorf(KILN_EIO, "%s: %s", d, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return kiln_errorf(KILN_EINVAL, "%s: exists and is not a directory", d);
    return NULL;
}

/* Whether rank 0 of this attempt wrote a beat: it applies KILN_REJECT_FROM in its setup, before its first beat. */
static int rank0_beat(attempt_state *a) {
    if (a->have_hb[0]) return 1;
    kiln_heartbeat h;
    kiln_error *e = kiln_heartbeat_read(a->hb_dir, 0, &h);
    int ok = !e && h.attempt == a->attempt;
    kiln_error_free(e);
    return ok;
}

/* The errno that makes a failure transient, by its symbol or glibc's message: a resource busy or briefly unavailable
 * (a file system being remounted, a port still held by the last attempt's rank, a peer not listening yet). Not
 * among them: ENOENT, EACCES, ENOSPC, EDQUOT, ENOMEM, EIO... (a missing file, a full disk or a model that does not
 * fit fails the same way on every attempt). */
static const int transient_errnos[] = {EAGAIN, EBUSY, ETIMEDOUT, ECONNREFUSED, ECONNRESET, ECONNABORTED, EINTR,
                                       EADDRINUSE, ENETUNREACH, ENETDOWN, EHOSTUNREACH, EHOSTDOWN, ESTALE, ETXTBSY};
static const char *const transient_names[] = {"EAGAIN", "EBUSY", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET",
                                              "ECONNABORTED", "EINTR", "EADDRINUSE", "ENETUNREACH", "ENETDOWN",
                                              "EHOSTUNREACH", "EHOSTDOWN", "ESTALE", "ETXTBSY"};

static int word_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* text holds `w` as a whole word (EAGAIN, not XEAGAINX) */
static int has_word(const char *text, const char *w) {
    const size_t n = strlen(w);
    for (const char *p = text; (p = strstr(p, w)); p++)
        if ((p == text || !word_char(p[-1])) && !word_char(p[n])) return 1;
    return 0;
}

const char *ft_transient_errno(const char *text) {
    if (!text) return NULL;
    for (size_t i = 0; i < sizeof transient_errnos / sizeof transient_errnos[0]; i++) {
        const char *msg = strerror(transient_errnos[i]);
        if (has_word(text, transient_names[i]) || (msg && *msg && strcasestr(text, msg))) return transient_names[i];
    }
    if (has_word(text, "EWOULDBLOCK")) return "EAGAIN";
    return NULL;
}

kiln_error *kiln_supervisor_check(const kiln_supervisor_opts *o) {
    if (!o->cmd || !o->cmd[0]) return kiln_errorf(KILN_EINVAL, "no training command (kiln run [options] -- kiln train ...)");
    if (o->np < 1 || o->np > KILN_FT_MAX_NP)
        return kiln_errorf(KILN_EINVAL, "--np %d: need 1..%d ranks (rank files are numbered with five digits)", o->np,
                           KILN_FT_MAX_NP);
    /* the trainer takes KILN_HEARTBEAT_DIR (RUN_DIR/heartbeat) up to 1023 bytes, and paths under it are built in
     * fixed buffers: a longer one is refused here rather than cut short */
    if (!o->run_dir || !*o->run_dir) return kiln_errorf(KILN_EINVAL, "--run-dir: empty");
    if (strlen(o->run_dir) > KILN_FT_MAX_RUN_DIR)
        return kiln_errorf(KILN_EINVAL, "--run-dir '%.40s...' is %zu bytes long: at most %d", o->run_dir,
                           strlen(o->run_dir), KILN_FT_MAX_RUN_DIR);
    if (o->max_restarts < 0) return kiln_errorf(KILN_EINVAL, "--max-restarts must be >= 0");
    if (!(o->hang_timeout_s > 0) || !(o->start_timeout_s > 0) || o->grace_s < 0 || o->backoff_s < 0)
        return kiln_errorf(KILN_EINVAL, "timeouts must be > 0, --grace and --backoff >= 0");
    if (o->spike_z < 0 || o->straggler_factor < 0 || o->skip_window < 0)
        return kiln_errorf(KILN_EINVAL, "--spike-z, --straggler-factor and --skip-window must be >= 0");
    if (o->spike_z > 0 && (o->spike_window < 2 || o->spike_min < 2 || o->spike_min > o->spike_window ||
                           o->spike_window > KILN_FT_MAX_SPIKE_WINDOW))
        return kiln_errorf(KILN_EINVAL, "--spike-window %d, --spike-min %d: need 2 <= --spike-min <= --spike-window <= %d",
                           o->spike_window, o->spike_min, KILN_FT_MAX_SPIKE_WINDOW);
    if (o->launcher == KILN_LAUNCH_DIRECT && o->np > 1)
        return kiln_errorf(KILN_EUNSUPPORTED, "--launcher direct starts one rank: kiln's communication layer is MPI, whose "
                           "ranks are started by mpirun (use --launcher mpirun, the default for --np > 1)");
    return NULL;
}

kiln_error *kiln_supervise(const kiln_supervisor_opts *o, int *exit_status) {
    *exit_status = 1;
    KILN_TRY(kiln_supervisor_check(o));
    const int use_mpirun = o->launcher == KILN_LAUNCH_MPIRUN || (o->launcher == KILN_LAUNCH_AUTO && o->np > 1);
    attempt_state a;
    memset(&a, 0, sizeof a);
    a.o = o;
    snprintf(a.hb_dir, sizeof a.hb_dir, "%s/heartbeat", o->run_dir);
    snprintf(a.incidents, sizeof a.incidents, "%s/incidents.jsonl", o->run_dir);
    KILN_TRY(make_dir(o->run_dir));
    KILN_TRY(make_dir(a.hb_dir));
    const int np = o->np;
    a.hb = calloc((size_t)np, sizeof *a.hb);
    a.have_hb = calloc((size_t)np, sizeof *a.have_hb);
    a.slow_count = calloc((size_t)np, sizeof *a.slow_count);
    a.straggler_told = calloc((size_t)np, sizeof *a.straggler_told);
    a.last_change = calloc((size_t)np, sizeof *a.last_change);
    kiln_error *e = NULL;
    if (!a.hb || !a.have_hb || !a.slow_count || !a.straggler_told || !a.last_change)
        e = kiln_errorf(KILN_ENOMEM, "supervisor");
    if (!e && o->spike_z > 0) e = kiln_spike_init(&a.spike, o->spike_window, o->spike_min);
    /* the history is kept with the detector off too (every finite loss), so that a rerun that turns it on is not
     * blind either; a window out of range then means none */
    a.hist.from = INT64_MAX;
    if (!e && o->spike_window >= 2 && o->spike_window <= KILN_FT_MAX_SPIKE_WINDOW)
        e = ft_hist_init(&a.hist, o->spike_window, history_keep(o->spike_window));
    /* ranks orphaned by a dying mpirun become our children, so they can still be stopped */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    kiln_step_ranges skip = {0};
    a.skip = &skip;
    /* a rerun of the same command (after Ctrl-C, or a lost supervisor) goes on skipping the windows found so far,
     * sets aside what an earlier attempt was told to and never did, and judges its first steps against the losses
     * of the steps before them */
    if (!e) e = state_load(&a, &skip);
    /* the error of the last attempts when they failed before any beat with the same error line, and how many in a
     * row: KILN_FT_EARLY_REPEATS of them end the retries (a command that fails the same way every time before its
     * first step is not failing transiently: retrying cannot help), unless the line names a transient errno */
    char early_fail[sizeof a.detail] = "";
    int early_count = 0;
    for (int attempt = 1, restarts = 0; !e; attempt++) {
        a.attempt = attempt;
        a.child_exited = 0;
        a.err_tail[0] = 0;
        a.mpi_rank = a.mpi_signal = a.first_dead = -1;
        a.spike_step = a.straggler_step = 0;
        a.nan_seen = a.int_at = 0;
        a.log_off = 0;
        a.have_log = a.seeded = 0;
        a.kind[0] = a.detail[0] = 0;
        memset(a.have_hb, 0, (size_t)np * sizeof *a.have_hb);
        memset(a.slow_count, 0, (size_t)np * sizeof *a.slow_count);
        memset(a.straggler_told, 0, (size_t)np * sizeof *a.straggler_told);
        clear_heartbeats(a.hb_dir);
        char *skips = kiln_step_ranges_text(&skip);
        e = skips ? launch(&a, use_mpirun, skips, a.reject_from) : kiln_errorf(KILN_ENOMEM, "skip windows");
        free(skips);
        if (e) break;
        outcome out = watch(&a);
        /* the set-aside stays in force until an attempt has applied it: one that failed before its setup (a launch
         * failure, an out-of-memory) did not, and the next would resume from a checkpoint trained on the bad window */
        if (a.reject_from > 0 && rank0_beat(&a)) a.reject_from = 0, a.state_dirty = 1; /* a beat watch did not read */
        state_save_lazy(&a, 1); /* and the steps judged since the last write, whatever comes next */
        if (out == OUT_INTERRUPTED) {
            /* the grace runs from the Ctrl-C, not again from here; a second Ctrl-C kills at once */
            double left = o->grace_s - (mono() - a.int_at);
            stop_job(&a, *o->interrupted > 1 || left < 0 ? 0 : left);
            kiln_heartbeat h; /* the step the ranks stopped at */
            kiln_error *he = kiln_heartbeat_read(a.hb_dir, 0, &h);
            int64_t at = !he && h.attempt == attempt ? h.step : -1;
            kiln_error_free(he);
            log_incident(&a, "interrupted", -1, at, "Ctrl-C (SIGINT or SIGTERM) to kiln run",
                         "stop: the ranks were asked to save a checkpoint; resume with the same command");
            *exit_status = 130;
            break;
        }
        stop_job(&a, o->grace_s);
        if (e) break;
        for (int i = 0; i < 2; i++)
            if (a.out_fd[i] >= 0) close(a.out_fd[i]), a.out_fd[i] = -1;
        if (out == OUT_DONE) {
            fprintf(o->out, "kiln run: finished after %d attempt%s (%d restart%s); incidents in %s\n", attempt,
                    attempt > 1 ? "s" : "", restarts, restarts == 1 ? "" : "s", a.incidents);
            *exit_status = 0;
            break;
        }
        /* an incident: roll back, perhaps skip the bad window, restart, or give up */
        int st = a.child_status;
        int fatal = a.child_exited && WIFEXITED(st) && (WEXITSTATUS(st) == 2 || WEXITSTATUS(st) == 127);
        /* the same error line, before any rank's first beat, KILN_FT_EARLY_REPEATS times in a row: a missing config
         * file, an unknown flag. Only an exit with an error line counts (a kill, a hang or a silent exit may well be
         * transient), and not a line naming a transient errno (a file system or a port briefly unavailable): that
         * one is retried with the back-off, within --max-restarts, like any other failure. */
        int any_beat = rank0_beat(&a);
        for (int r = 0; r < np; r++) any_beat |= a.have_hb[r];
        const int early = !strcmp(a.kind, "exit") && !any_beat && strchr(a.detail, ':');
        const char *transient = early ? ft_transient_errno(a.detail) : NULL;
        const int counts = early && !transient;
        early_count = counts && !strcmp(early_fail, a.detail) ? early_count + 1 : counts;
        snprintf(early_fail, sizeof early_fail, "%s", counts ? a.detail : "");
        const int repeated = early_count >= KILN_FT_EARLY_REPEATS;
        char action[1200];
        int64_t lo = -1;
        if (a.bad_step > 0 && o->skip_window > 0) {
            lo = a.bad_step - o->skip_window + 1 > 1 ? a.bad_step - o->skip_window + 1 : 1;
            e = kiln_step_ranges_add(&skip, lo, a.bad_step);
            if (e) break;
        }
        if (lo > 0 || a.bad_step > 0) { /* before anything else can stop us: a rerun must know */
            int64_t from = lo > 0 ? lo : a.bad_step;
            a.reject_from = a.reject_from > 0 && a.reject_from < from ? a.reject_from : from;
            e = state_save(&a);
            if (e) break;
        }
        if (fatal || repeated || restarts >= o->max_restarts) {
            if (fatal)
                snprintf(action, sizeof action, "give up: the command itself is wrong (usage error or not found)");
            else if (repeated)
                snprintf(action, sizeof action, "give up: the same error before any step in %d attempts in a row: "
                         "not a transient failure (fix the cause, then run the same command again)", early_count);
            else
                snprintf(action, sizeof action, "give up: %d restarts used (--max-restarts)", restarts);
            log_incident(&a, a.kind, a.rank, a.step, a.detail, action);
            *exit_status = 1;
            break;
        }
        double wait = o->backoff_s * pow(2.0, restarts);
        if (wait > o->backoff_max_s) wait = o->backoff_max_s;
        if (lo > 0) {
            snprintf(action, sizeof action, "restart from the newest valid checkpoint before step %lld in %.3g s, "
                     "skipping steps %lld-%lld", (long long)lo, wait, (long long)lo, (long long)a.bad_step);
        } else if (a.bad_step > 0) {
            snprintf(action, sizeof action, "restart from the newest valid checkpoint before step %lld in %.3g s",
                     (long long)a.bad_step, wait);
        } else {
            snprintf(action, sizeof action, "restart from the newest valid checkpoint in %.3g s%s%s%s", wait,
                     transient ? " (failed before any step, with a transient error, " : "", transient ? transient : "",
                     transient ? ": retried within --max-restarts)" : "");
        }
        log_incident(&a, a.kind, a.rank, a.step, a.detail, action);
        for (double t0 = mono(); mono() - t0 < wait && !(o->interrupted && *o->interrupted);) sleep_s(0.02);
        if (o->interrupted && *o->interrupted) {
            log_incident(&a, "interrupted", -1, -1, "Ctrl-C during the back-off", "stop");
            *exit_status = 130;
            break;
        }
        restarts++;
    }
    for (int i = 0; i < 2; i++)
        if (a.out_fd[i] > 0) close(a.out_fd[i]);
    kiln_step_ranges_free(&skip);
    kiln_spike_free(&a.spike);
    ft_hist_free(&a.hist);
    free(a.hb);
    free(a.have_hb);
    free(a.slow_count);
    free(a.straggler_told);
    free(a.last_change);
    return e;
}
