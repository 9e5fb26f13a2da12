/* Fault tolerance: the supervisor behind `kiln run`, and the trainer's side of its protocol.
 *
 * The supervisor launches the ranks, follows one heartbeat file per rank, detects failures
 * (a rank exits or is killed, a hang, NaN/Inf, a loss spike, a straggler), stops the job, rolls
 * back to the newest valid checkpoint (optionally skipping the data window that produced the
 * NaN or spike), restarts with exponential back-off up to a retry budget, and logs every
 * incident to run_dir/incidents.jsonl. See docs/fault-tolerance.md.
 *
 * Supervisor -> trainer protocol (environment variables, read by kiln_train):
 *   KILN_HEARTBEAT_DIR  write DIR/rank_NNNNN.json (atomically) at start and after every step
 *                       (by a background thread: kiln_heartbeat_writer)
 *   KILN_RUN_ATTEMPT    1 for the first launch, 2 for the first restart, ...
 *   KILN_RESUME=1       resume from the newest valid checkpoint (as --resume; every attempt)
 *   KILN_REJECT_FROM=S  before resuming, set committed checkpoints of step >= S aside (renamed
 *                       step_N.rejected: nothing is deleted) because they hold weights trained
 *                       on a bad window
 *   KILN_SKIP_STEPS     step ranges "a-b,c,d-e" whose data is consumed without training (added
 *                       to the config's run.skip_steps)
 *   KILN_FAULT          fault injection, a testing hook (below)
 */
#ifndef KILN_FT_H
#define KILN_FT_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/error.h"

/* ---- step ranges (data windows to skip) ---- */

typedef struct {
    int64_t lo, hi; /* inclusive, 1-based optimizer steps */
} kiln_step_range;
typedef struct {
    int n, cap;
    kiln_step_range *r;
} kiln_step_ranges;

/* "9", "9-12", "3,9-12" (empty: none). Appends to *out; errors name the bad piece. */
kiln_error *kiln_step_ranges_parse(const char *s, kiln_step_ranges *out);
kiln_error *kiln_step_ranges_add(kiln_step_ranges *r, int64_t lo, int64_t hi);
int kiln_step_ranges_contains(const kiln_step_ranges *r, int64_t step);
/* "3,9-12" into buf (sorted, merged); returns buf. */
const char *kiln_step_ranges_format(const kiln_step_ranges *r, char *buf, size_t cap);
/* The same, malloc'd and never cut short; NULL when out of memory. */
char *kiln_step_ranges_text(const kiln_step_ranges *r);
void kiln_step_ranges_free(kiln_step_ranges *r);

/* ---- fault injection (a testing hook; KILN_FAULT) ----
 *
 * KILN_FAULT="kind:key=value:...[,kind:...]", e.g. "kill:rank=1:step=7,stop:rank=0:step=5:attempt=2".
 * Keys: rank (default 0), step (required), attempt (default 1: the fault fires only in that launch
 * of the supervisor, so a restarted run gets past it), bytes (disk-full, crash-in-save), ms (slow,
 * slow-save), steps (slow-save).
 * Kinds, at optimizer step `step` (1-based) on rank `rank`:
 *   kill           SIGKILL itself as the step begins
 *   stop           SIGSTOP itself as the step begins (a rank hung in the next collective)
 *   nan            its gradient gets a NaN before the reduce-scatter
 *   spike          the loss it reports for the step is multiplied by 1000 (weights untouched)
 *   slow           sleeps `ms` milliseconds (default 200) in every step from `step` on (a straggler)
 *   disk-full      the checkpoint saved after the step fails: file size limit `bytes` (default 4096,
 *                  RLIMIT_FSIZE) with SIGXFSZ ignored, so writes fail with EFBIG
 *   crash-in-save  the process dies in the middle of writing that checkpoint: the same limit
 *                  with SIGXFSZ's default action (terminate)
 *   slow-save      every checkpoint saved from `step` on is slow to write (a slow disk): the writer
 *                  sleeps `ms` milliseconds (default 200) before writing this rank's shard (on the
 *                  background thread when async, so that saves overlap while training goes on); with
 *                  `steps`=K (async) the shard also counts as written only at the K-th step after the
 *                  save (then waited for): saves overlap at the same steps on any machine */
typedef enum { KILN_FAULT_KILL, KILN_FAULT_STOP, KILN_FAULT_NAN, KILN_FAULT_SPIKE, KILN_FAULT_SLOW,
               KILN_FAULT_DISK_FULL, KILN_FAULT_CRASH_IN_SAVE, KILN_FAULT_SLOW_SAVE } kiln_fault_kind;
typedef struct {
    kiln_fault_kind kind;
    int rank, attempt;
    int64_t step, bytes, ms, steps;
} kiln_fault;
typedef struct {
    int n;
    kiln_fault f[16];
} kiln_faults;
kiln_error *kiln_faults_parse(const char *spec, kiln_faults *out);
/* The fault of this kind for (rank, step, attempt), or NULL. slow and slow-save match every step >= their step. */
const kiln_fault *kiln_faults_find(const kiln_faults *f, kiln_fault_kind kind, int rank, int64_t step, int attempt);

/* ---- heartbeats ---- */

#define KILN_HB_RECENT 32
typedef struct {
    int rank, world, attempt;
    long pid;
    int64_t step, steps;  /* steps completed; the run's total */
    char phase[16];       /* "start", "train", "skip", "done" */
    double loss;          /* the global mean loss of the step (NaN allowed) */
    double grad_norm;     /* the global gradient norm */
    double local_grad_norm; /* this rank's own gradient before the reduction: who produced a NaN */
    double step_s, compute_s; /* wall time of the step; this rank's forward/backward part of it */
    double time;          /* unix time of the write */
    /* the last trained steps, oldest first: the supervisor polls, and must not miss a one-step
     * spike or NaN between two polls */
    int nrecent;
    struct { int64_t step; double loss, grad_norm; } recent[KILN_HB_RECENT];
} kiln_heartbeat;

/* Add a trained step to h->recent (the oldest falls out). */
void kiln_heartbeat_record(kiln_heartbeat *h, int64_t step, double loss, double grad_norm);
/* dir/rank_NNNNN.json, replaced atomically (temp + rename; no fsync: a heartbeat is liveness, not data). */
kiln_error *kiln_heartbeat_write(const char *dir, const kiln_heartbeat *h);
kiln_error *kiln_heartbeat_read(const char *dir, int rank, kiln_heartbeat *h);
char *kiln_heartbeat_path(const char *dir, int rank);

/* The trainer's heartbeats written off the training thread: what kiln_heartbeat_write does, by a thread of the
 * writer's own (one per writer, so one per rank). post() copies the beat, wakes the thread and returns (microseconds:
 * docs/fault-tolerance.md); nothing is written on the caller's thread.
 *   - every trained step that post() would log (rank 0, phase "train": kiln_heartbeat_write's step-log line) is
 *     appended to dir/steps_00000.jsonl, in post order, exactly once, and before (or in the same batch as, ahead of)
 *     the beat that reports it; a poster waits while 1024 lines are pending (a file system that far behind);
 *   - the beat file is replaced atomically (temp + rename). Beats posted while one is being written are coalesced:
 *     only the newest is written next, so the file lags the newest post by at most the one write in flight;
 *   - an error of a background write (naming the file and the step) is returned by the next post, flush or close,
 *     once; the writer then writes nothing more (a later beat must not get ahead of a missing line) and every later
 *     post or flush fails too;
 *   - checkpoint() (rank 0, as the save of step `step` starts) appends the line [attempt,step,"ckpt"] to the step
 *     log the same way: queued after every line posted before it (the step's own), written by the thread, the caller
 *     only waiting where post() would (1024 lines pending); the supervisor keeps the window of losses before it
 *     (src/ft/history.c). A reader from before these lines skips them (not four elements);
 *   - flush() waits until everything posted so far is written; close() writes everything posted, ends the thread and
 *     frees the writer (NULL: nothing), returning an error not returned yet. Call it before the process exits.
 * If no thread can be started, post() writes synchronously. The environment variable KILN_HEARTBEAT_DELAY_MS (a
 * testing hook, read by open) makes the thread sleep that long before each write: a slow file system. */
typedef struct kiln_heartbeat_writer kiln_heartbeat_writer;
kiln_error *kiln_heartbeat_writer_open(const char *dir, kiln_heartbeat_writer **out);
kiln_error *kiln_heartbeat_writer_post(kiln_heartbeat_writer *w, const kiln_heartbeat *h);
kiln_error *kiln_heartbeat_writer_checkpoint(kiln_heartbeat_writer *w, int attempt, int64_t step);
kiln_error *kiln_heartbeat_writer_flush(kiln_heartbeat_writer *w);
kiln_error *kiln_heartbeat_writer_close(kiln_heartbeat_writer *w);

/* ---- detectors (pure functions; the supervisor feeds them heartbeats) ---- */

/* Loss spikes: z-score of a new loss against the previous `window` losses. */
typedef struct {
    int window, min_samples, n, head;
    double *x;
} kiln_spike_detector;
kiln_error *kiln_spike_init(kiln_spike_detector *d, int window, int min_samples);
/* The z-score of loss against the window so far (0 while fewer than min_samples, or when the
 * window is constant and loss equals it; +inf when constant and it differs), then adds loss to
 * the window unless it is a spike (z > z_max): a spike must not raise the bar for the next one. */
double kiln_spike_push(kiln_spike_detector *d, double loss, double z_max);
void kiln_spike_reset(kiln_spike_detector *d);
void kiln_spike_free(kiln_spike_detector *d);

/* Median of n values (n >= 1; the array is not modified). */
double kiln_median(const double *x, int n);
/* Stragglers: rank r is slow when its compute time exceeds factor x the median of the other
 * ranks'. Returns the slowest such rank (or -1) and its ratio. */
int kiln_straggler(const double *compute_s, int n, double factor, double *ratio);

/* ---- the incident log ---- */

typedef struct {
    double time;       /* unix time */
    int attempt;
    const char *kind;  /* "exit", "killed", "hang", "nan", "loss-spike", "straggler", "interrupted", "gave-up" */
    int rank;          /* -1: not one rank */
    int64_t step;      /* -1: unknown */
    const char *detail;
    const char *action; /* "restart", "restart, skip steps 9-9", "warn", "stop", "give up" */
} kiln_incident;
/* One JSON line appended to path (one write(), fsync'd). */
kiln_error *kiln_incident_append(const char *path, const kiln_incident *in);
/* The one-line summary printed on screen. */
void kiln_incident_summary(const kiln_incident *in, char *buf, size_t cap);

/* ---- the trainer's side ---- */

typedef struct {
    char heartbeat_dir[1024]; /* empty: no heartbeats */
    int attempt;              /* KILN_RUN_ATTEMPT, default 1 */
    int resume;               /* KILN_RESUME=1 */
    int64_t reject_from;      /* KILN_REJECT_FROM, 0: none */
    kiln_step_ranges skip;    /* KILN_SKIP_STEPS */
    kiln_faults faults;       /* KILN_FAULT */
} kiln_ft_env;
/* Read the environment; malformed values are errors naming the variable. */
kiln_error *kiln_ft_env_read(kiln_ft_env *env);
void kiln_ft_env_free(kiln_ft_env *env);
/* Rename committed checkpoints out_dir/ckpt/step_N with N >= from to step_N.rejected (or
 * .rejected.K). *n gets how many. */
kiln_error *kiln_ft_reject_checkpoints(const char *out_dir, int64_t from, int *n);
/* The faults that act inside one process at a point of the step loop. */
void kiln_ft_fault_step_begin(const kiln_ft_env *env, int rank, int64_t step); /* kill, stop */
void kiln_ft_fault_slow(const kiln_ft_env *env, int rank, int64_t step);       /* inside the timed compute */
/* disk-full / crash-in-save before the checkpoint of `step` */
kiln_error *kiln_ft_fault_before_save(const kiln_ft_env *env, int rank, int64_t step);
/* slow-save for the checkpoint of `step`: the fault (its ms and steps), or NULL */
const kiln_fault *kiln_ft_fault_slow_save(const kiln_ft_env *env, int rank, int64_t step);

/* ---- the supervisor ---- */

typedef enum { KILN_LAUNCH_AUTO, KILN_LAUNCH_DIRECT, KILN_LAUNCH_MPIRUN } kiln_launcher;

typedef struct {
    char **cmd;           /* the training command, NULL-terminated; "kiln" means this binary */
    int np;               /* ranks */
    kiln_launcher launcher;
    const char *mpirun;   /* the mpirun program (default "mpirun") */
    const char *mpirun_args; /* extra mpirun arguments, split at spaces */
    const char *run_dir;  /* heartbeat/, incidents.jsonl */
    int max_restarts;
    double backoff_s, backoff_max_s;
    double hang_timeout_s, start_timeout_s, grace_s;
    double spike_z;       /* 0: off */
    int spike_window, spike_min;
    double straggler_factor; /* 0: off */
    int straggler_steps;     /* consecutive slow steps before it counts */
    int straggler_restart;   /* 0: warn only */
    int skip_window;         /* steps skipped ending at a NaN/spike step; 0: no skip */
    int quiet;               /* do not forward the ranks' output */
    volatile int *interrupted; /* set by the CLI's signal handler: stop the ranks cleanly */
    FILE *out;               /* summary lines (stdout) */
} kiln_supervisor_opts;

void kiln_supervisor_opts_default(kiln_supervisor_opts *o);
/* Run to completion or until the retry budget is spent. The calling process becomes a child
 * subreaper and stops the job by signalling every one of its descendants: call it from a process
 * whose only children are the job's (the kiln run CLI). *exit_status: 0 finished, 1 gave up,
 * 130 interrupted. Errors are for the supervisor's own failures (cannot launch, bad options). */
/* kiln run's limits: ranks (heartbeat files rank_NNNNN.json), the length of --run-dir (the trainer takes
 * KILN_HEARTBEAT_DIR up to 1023 bytes), the loss-spike window (allocated whole). */
#define KILN_FT_MAX_NP 99999
#define KILN_FT_MAX_RUN_DIR 1000
#define KILN_FT_MAX_SPIKE_WINDOW 1000000
/* The same error line before any rank's first heartbeat in this many attempts in a row ends the retries (a missing
 * config file, an unknown flag: not transient), unless the line names a transient errno (EAGAIN, EBUSY, ETIMEDOUT,
 * ECONNREFUSED, EINTR, ...: retried within --max-restarts). */
#define KILN_FT_EARLY_REPEATS 3
/* The supervisor's options are consistent (kiln_supervise checks them too; the CLI calls this first, so that a usage
 * error exits 2 before anything starts). */
kiln_error *kiln_supervisor_check(const kiln_supervisor_opts *o);
kiln_error *kiln_supervise(const kiln_supervisor_opts *o, int *exit_status);

#endif
