/* Pieces of the supervisor, one file each. */
#ifndef KILN_FT_INTERNAL_H
#define KILN_FT_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "kiln/ft.h"

/* Rank 0's step log in the heartbeat directory: one line per trained step, so that the supervisor judges
 * every step however many pass between two polls (a beat carries only the last KILN_HB_RECENT). */
#define KILN_FT_STEP_LOG "steps_00000.jsonl"
typedef struct {
    int attempt;
    int64_t step;
    double loss, grad_norm;
    long end; /* the file offset just past this record's line */
} ft_step_rec;
/* Up to cap complete records of dir's step log from byte offset `off` on (a line still being written is left for
 * the next call; a malformed one is skipped). Returns how many, or -1 when there is no step log. */
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

/* RUN_DIR/ft_state.json (src/ft/state.c). The text (malloc'd, *len bytes): the skip ranges, reject_from and the
 * history entries not inside a skipped window. The parse: appends the skip ranges to *skip (initialised by the caller;
 * freed by it on error too), sets *reject_from, and keeps the newest `cap` history entries in hist_step/hist_loss
 * (*nhist of them); errors name `path` and the field. A file without "spike_history" (an older kiln's) has none. */
kiln_error *ft_state_format(const kiln_step_ranges *skip, int64_t reject_from, const int64_t *hist_step,
                            const double *hist_loss, int nhist, char **text, size_t *len);
kiln_error *ft_state_parse(const char *text, size_t len, const char *path, kiln_step_ranges *skip,
                           int64_t *reject_from, int64_t *hist_step, double *hist_loss, int cap, int *nhist);

/* The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie...), 0 when gone. */
char ft_proc_state(pid_t pid);
/* Every live descendant of root (children, their children...), at most cap; returns the count. */
int ft_proc_descendants(pid_t root, pid_t *out, int cap);

#endif
