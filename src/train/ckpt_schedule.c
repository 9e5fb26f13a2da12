/* When the trainer saves a checkpoint: every run.ckpt_every steps, at the last step, on a stop request;
 * and what happens to a save that comes due while the previous asynchronous one is still being written.
 *
 * run.ckpt_busy = "defer" (default): training goes on and the save is taken at the first step after the
 * previous one has committed; the schedule then continues at the next multiple of ckpt_every. The
 * alternative, "wait", blocks the training thread until the previous save commits: on a disk slower than
 * (bytes per save) / (ckpt_every x step time) every save then costs the run the difference, seconds each
 * time (the [cuda] config on the GPU machine's 1.2 GB/s disk: a 21 GB save takes ~17 s, 100 steps ~9 s).
 * A deferred checkpoint is as good as any: it records its own step, loader positions and controller
 * state, and taking it later changes nothing in training (the snapshot only reads). Saves that must not
 * be skipped still wait: the last step's (it takes a deferred save with it; with run.save_final off, a
 * benchmark's setting, a deferral still outstanding at the last step is dropped), the one on a stop
 * request (Ctrl-C, SIGTERM, --stop-after). Synchronous writers never have a save in flight, so they
 * never defer.
 *
 * Every rank decides alike: `busy` comes from the writer's collective poll. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln/log.h"
#include "train_internal.h"

void ckpt_schedule_init(ckpt_schedule *s, const kiln_train_config *c) {
    memset(s, 0, sizeof *s);
    s->every = c->ckpt_every;
    s->save_final = c->save_final;
    s->defer = c->async_ckpt && strcmp(c->ckpt_busy, "wait") != 0;
}

ckpt_due ckpt_schedule_step(ckpt_schedule *s, int64_t step, int last, int stop, int busy) {
    ckpt_due d = {0, 0, 0};
    const int due = s->every > 0 && step % s->every == 0;
    s->requested += due;
    if (stop || (last && (s->save_final || due))) { /* must not be skipped: waits */
        d = (ckpt_due){1, 1, s->deferred_from};
    } else if (last || (!due && !s->deferred_from)) { /* last: a deferral outstanding without save_final is dropped */
        return d;
    } else if (s->defer && busy) {
        if (due) { /* a newer request replaces an older one still waiting */
            s->superseded += s->deferred_from != 0;
            s->deferred++;
            s->deferred_from = step;
        }
        return d;
    } else { /* on schedule, or the deferred one now that the writer is free */
        s->superseded += due && s->deferred_from;
        d = (ckpt_due){1, 0, due ? 0 : s->deferred_from};
    }
    if (d.deferred_from) {
        s->taken_late++;
        s->late_steps += step - d.deferred_from;
    }
    s->deferred_from = 0;
    s->taken++;
    return d;
}

/* The first deferral: what is slow and what would help. */
void ckpt_schedule_warn(ckpt_schedule *s, int64_t step, const ckpt_progress *p) {
    if (s->warned) return;
    s->warned = 1;
    const double steps = (double)(step - p->step), step_s = steps > 0 ? p->elapsed_s / steps : 0;
    const double speed = p->elapsed_s > 0 ? (double)p->bytes_done / p->elapsed_s : 0;
    const double need = step_s > 0 && s->every > 0 ? (double)p->bytes_total / ((double)s->every * step_s) : 0;
    char hint[160] = "";
    if (speed > 0 && step_s > 0)
        snprintf(hint, sizeof hint, " (at this speed run.ckpt_every >= %.0f)",
                 ceil((double)p->bytes_total / speed / step_s * 1.1));
    kiln_log(KILN_LOG_WARN,
             "checkpoint of step %lld deferred: the save of step %lld is still being written after %.1f s (%.0f steps "
             "of %.1f ms); rank 0 has written %.3g of %.3g GB, %.3g GB/s so far, and a save every %lld steps needs "
             "%.3g GB/s. Training goes on; the checkpoint is taken at the first step after the previous one commits "
             "(run.ckpt_busy = \"wait\" would block instead). Raise run.ckpt_every%s or use faster storage.",
             (long long)step, (long long)p->step, p->elapsed_s, steps, step_s * 1e3, (double)p->bytes_done / 1e9,
             (double)p->bytes_total / 1e9, speed / 1e9, (long long)s->every, need / 1e9, hint);
}

void ckpt_schedule_report(const ckpt_schedule *s) {
    kiln_log(s->deferred || s->waited_other ? KILN_LOG_WARN : KILN_LOG_DEBUG,
             "checkpoints: %lld scheduled, %lld taken; %lld deferred while the previous save was being written "
             "(%lld taken late, %.1f steps late on average; %lld superseded by a later one; %d outstanding at the "
             "end); %lld saves waited for the previous one (%lld of them final or stop saves)",
             (long long)s->requested, (long long)s->taken, (long long)s->deferred, (long long)s->taken_late,
             s->taken_late ? (double)s->late_steps / (double)s->taken_late : 0.0, (long long)s->superseded,
             s->deferred_from != 0, (long long)(s->waited_must + s->waited_other), (long long)s->waited_must);
}
