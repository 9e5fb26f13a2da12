/* A progress indicator on stderr for long loops (training steps, tokens,
 * bytes loaded):
 *
 *   kiln_progress p;
 *   kiln_progress_start(&p, "train", nsteps, "step");
 *   for (...) { ...; kiln_progress_update(&p, step + 1); }
 *   kiln_progress_finish(&p);
 *
 * On a terminal it redraws one line in place, at most ~10 times a second:
 *   train [#########...............]  45/120 step  3.2 step/s  0:14 eta 0:23
 * When stderr is not a terminal (logs, CI) it prints a plain line at most
 * every 5 seconds and a final line, with the same numbers:
 *   train: 45/120 step (37.5%), 3.2 step/s, elapsed 0:14, eta 0:23
 * total 0 means unknown: no bar, percentage or ETA.
 * KILN_PROGRESS=0 in the environment turns it off.
 * Time is CLOCK_MONOTONIC, so clock changes do not disturb rates.
 * Not thread-safe: update from one thread.
 */
#ifndef KILN_PROGRESS_H
#define KILN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char label[48];
    char unit[16];
    uint64_t total, done;
    double t_start, t_last; /* seconds, monotonic; t_last: last output */
    FILE *out;
    int enabled, tty, finished;
    int drawn; /* a line has been printed (on a tty: the line is live) */
} kiln_progress;

void kiln_progress_start(kiln_progress *p, const char *label, uint64_t total, const char *unit);
/* Like start, but to `out`, with `tty` choosing the redraw style instead of
 * isatty(2) (for tests, or to report on another stream). */
void kiln_progress_start_to(kiln_progress *p, const char *label, uint64_t total, const char *unit, FILE *out,
                            int tty);
/* Report that `done` units are complete (absolute, not a delta). Cheap when
 * nothing needs redrawing: call it every iteration. */
void kiln_progress_update(kiln_progress *p, uint64_t done);
/* Print the final state and end the line. Safe to call twice. */
void kiln_progress_finish(kiln_progress *p);

#ifdef __cplusplus
}
#endif
#endif
