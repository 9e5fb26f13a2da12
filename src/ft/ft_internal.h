/* Pieces of the supervisor, one file each. */
#ifndef KILN_FT_INTERNAL_H
#define KILN_FT_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "kiln/ft.h"

/* Rank 0's step log in the heartbeat directory: one line per trained step, so that the supervisor judges
 * every step however many pass between two polls (a beat carries only the last KILN_HB_RECENT), and one per
 * checkpoint taken (kiln_heartbeat_writer_checkpoint): [attempt,step,loss,grad_norm] and [attempt,step,"ckpt"]. A
 * reader from before checkpoint lines skips those as malformed (not four elements). */
#define KILN_FT_STEP_LOG "steps_00000.jsonl"
typedef struct {
    int attempt;
    int64_t step;
    double loss, grad_norm; /* a checkpoint record: NaN */
    int ckpt;               /* 1: rank 0 took the checkpoint of `step` (after that step's own record) */
    long end;               /* the file offset just past this record's line */
} ft_step_rec;
/* Up to cap complete records of dir's step log from byte offset `off` on (a line still being written is left for
 * the next call; a malformed one is skipped), steps and checkpoints in the order written. Returns how many, or -1 when
 * there is no step log. */
int ft_step_log_read(const char *dir, long off, ft_step_rec *out, int cap);

/* Testing hooks of kiln_heartbeat_writer: the thread sleeps ms before each write from its next batch on (a slow file
 * system; as KILN_HEARTBEAT_DELAY_MS); what it has written so far: beat files, step-log lines, batches (one batch:
 * the lines and the newest beat pending when the thread woke; a failed batch is not counted). */
void ft_heartbeat_writer_set_delay(kiln_heartbeat_writer *w, long ms);
void ft_heartbeat_writer_counts(kiln_heartbeat_writer *w, int64_t *beats, int64_t *lines, int64_t *batches);

/* The errno symbol (e.g. "EAGAIN") when text (an error line) names one of a transient condition, by its symbol
 * (EAGAIN, EBUSY, ETIMEDOUT, ECONNREFUSED, EINTR, ...) or by its message ("Resource temporarily unavailable",
 * case-insensitive); NULL otherwise (ENOENT, ENOSPC, EACCES, ENOMEM... are not transient). kiln run retries such a
 * failure before any step within --max-restarts instead of giving up when it repeats. */
const char *ft_transient_errno(const char *text);

/* The loss-spike detector's history across attempts and reruns (src/ft/history.c): the losses the detector accepted,
 * [step, loss], steps increasing. Two parts:
 *   - dense: the last `cap` losses (history_keep in supervisor.c), complete from step `from` on: every accepted loss of
 *     a step >= from (and before the newest) is there;
 *   - anchors: for older steps, the window (the last `window` accepted losses of steps <= end) of a bounded set of
 *     steps `end` a rollback may well resume from (history.c says which: the steps of the newest FT_ANCHOR_CKPT_KEEP
 *     checkpoints the trainer reported, and round steps), each complete from its first step to end.
 * An attempt that starts at step `first` is judged against the window of losses right before it: ft_hist_seed finds
 * it, exactly, wherever the parts hold every loss from some step up to first - 1, and nothing otherwise (a resume
 * step no part covers: the detector starts empty, as a new run's). */
typedef struct {
    int64_t end; /* the window of the losses of steps <= end */
    int n;       /* 1..window */
    int ckpt;    /* the trainer reported a checkpoint of step end (ft_hist_ckpt): kept by the checkpoint rule */
    int64_t *step;
    double *loss;
} ft_anchor;

typedef struct {
    int window, cap;             /* --spike-window (an anchor's size); the dense part's size (>= window) */
    int64_t *step;               /* [cap] the dense part, oldest first */
    double *loss;
    int n;
    int64_t from;                /* the dense part is complete from this step on (INT64_MAX: nothing yet) */
    ft_anchor *anchor;           /* [nanchor] by end, increasing */
    int nanchor, anchor_alloc;
    int64_t anchored;            /* losses held by the anchors, at most ft_hist_budget(cap) */
} ft_hist;

/* The anchors hold at most FT_ANCHOR_BUDGET times the dense part's losses, at most FT_ANCHOR_BUDGET_MAX losses (64 MB;
 * still 4 windows of the largest --spike-window) and at most FT_ANCHOR_MAX windows (history.c: which go first). With
 * the defaults (1024 losses, --spike-window 50) the rule of history.c keeps about 15-55 windows, far within all three;
 * up to a window of about 500 too; with a window of 1000, 16 of them. */
#define FT_ANCHOR_BUDGET 16
#define FT_ANCHOR_BUDGET_MAX ((int64_t)1 << 22)
#define FT_ANCHOR_MAX 256
/* The checkpoint rule: the anchors of the newest FT_ANCHOR_CKPT_KEEP checkpoints the trainer reported stay, whatever
 * their step (history.c says why 32); within the budget, where they go after every other anchor, oldest first. */
#define FT_ANCHOR_CKPT_KEEP 32
static inline int64_t ft_hist_budget(int cap) {
    const int64_t b = (int64_t)FT_ANCHOR_BUDGET * cap;
    return b < FT_ANCHOR_BUDGET_MAX ? b : FT_ANCHOR_BUDGET_MAX;
}

kiln_error *ft_hist_init(ft_hist *h, int window, int cap);
void ft_hist_free(ft_hist *h);
/* A judged step's accepted loss; step after every step held. The oldest dense loss falls out past cap, the windows that
 * start with it kept as anchors first where the rule wants them. An error (out of memory for an anchor, a step not
 * after the newest) leaves the history as it was but for that anchor or loss. */
kiln_error *ft_hist_add(ft_hist *h, int64_t step, double loss);
/* An attempt's first step: everything of steps >= first and of skipped windows goes (a rolled-back stretch); the
 * dense part becomes the losses right before first that the parts hold without a gap (up to cap of them), so that its
 * last `window` are the detector's window. *changed: whether anything went or came (the state file is behind). */
kiln_error *ft_hist_seed(ft_hist *h, int64_t first, const kiln_step_ranges *skip, int *changed);
/* The trainer took the checkpoint of step `end` (a step-log record, read after the records of every step <= end: each
 * loss of a step <= end the detector accepts is in the history already). The window of the dense part's last `window`
 * losses of steps <= end becomes an anchor marked ckpt, kept by the checkpoint rule (an anchor at end already is
 * marked; replaced by the dense part's window when that one holds more). Nothing when the dense part holds no loss of
 * a step <= end (the window is then not known whole). *added (may be NULL): whether an anchor at end is marked now. */
kiln_error *ft_hist_ckpt(ft_hist *h, int64_t end, int *added);
/* The parse's entry points: an anchor (its last `window` losses kept; ends increasing; ckpt: a checkpoint's), then the
 * dense losses of a file (steps increasing; past cap the older ones leave anchors as ft_hist_add would have). */
kiln_error *ft_hist_put_anchor(ft_hist *h, int64_t end, const int64_t *step, const double *loss, int n, int ckpt);
kiln_error *ft_hist_load(ft_hist *h, const int64_t *step, const double *loss, int n);
/* Whether an anchor at step `end` is kept while `newest` is the newest step judged (history.c: the rule). */
int ft_hist_keeps(int64_t end, int64_t newest);

/* RUN_DIR/ft_state.json (src/ft/state.c). The text (malloc'd, *len bytes): the skip ranges, reject_from, the dense
 * history ("spike_history"), the anchors ("spike_anchors") and which of them are checkpoints' ("spike_checkpoints":
 * their end steps), without the losses of skipped windows. The parse:
 * appends the skip ranges to *skip (initialised by the caller; freed by it on error too), sets *reject_from, and loads
 * the history into h (ft_hist_init'd and empty; NULL: the history fields are not read); errors name `path` and the
 * field. A file without "spike_history", "spike_anchors" or "spike_checkpoints" (an older kiln's) has none of that
 * part. */
kiln_error *ft_state_format(const kiln_step_ranges *skip, int64_t reject_from, const ft_hist *h, char **text,
                            size_t *len);
kiln_error *ft_state_parse(const char *text, size_t len, const char *path, kiln_step_ranges *skip,
                           int64_t *reject_from, ft_hist *h);

/* The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie...), 0 when gone. */
char ft_proc_state(pid_t pid);
/* Every live descendant of root (children, their children...), at most cap; returns the count. */
int ft_proc_descendants(pid_t root, pid_t *out, int cap);

#endif
