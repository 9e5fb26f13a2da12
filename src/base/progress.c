/* Progress bar / progress lines on stderr. See include/kiln/progress.h. */
#include "kiln/progress.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TTY_INTERVAL 0.1   /* seconds between redraws on a terminal */
#define PLAIN_INTERVAL 5.0 /* seconds between lines in a log */
#define BAR_WIDTH 24

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

void kiln_progress_start_to(kiln_progress *p, const char *label, uint64_t total, const char *unit, FILE *out,
                            int tty) {
    memset(p, 0, sizeof *p);
    copy_str(p->label, sizeof p->label, label);
    copy_str(p->unit, sizeof p->unit, unit);
    p->total = total;
    p->out = out;
    p->tty = tty;
    const char *env = getenv("KILN_PROGRESS");
    p->enabled = out && !(env && strcmp(env, "0") == 0);
    p->t_start = p->t_last = now();
}

void kiln_progress_start(kiln_progress *p, const char *label, uint64_t total, const char *unit) {
    kiln_progress_start_to(p, label, total, unit, stderr, isatty(2));
}

/* 1234567 -> "1.23M"; small values keep one decimal. */
static void fmt_rate(char *buf, size_t cap, double v) {
    if (v >= 1e9) snprintf(buf, cap, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, cap, "%.1fk", v / 1e3);
    else snprintf(buf, cap, "%.1f", v);
}

/* 75 -> "1:15", 3725 -> "1:02:05". */
static void fmt_time(char *buf, size_t cap, double secs) {
    if (!(secs >= 0) || secs > 359999999.0) { /* NaN, negative, absurd */
        snprintf(buf, cap, "?");
        return;
    }
    unsigned long s = (unsigned long)(secs + 0.5);
    if (s >= 3600) snprintf(buf, cap, "%lu:%02lu:%02lu", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, cap, "%lu:%02lu", s / 60, s % 60);
}

static void draw(kiln_progress *p, double t, int final) {
    double elapsed = t - p->t_start;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0;
    char rs[32], es[32], eta[32] = "?";
    fmt_rate(rs, sizeof rs, rate);
    fmt_time(es, sizeof es, elapsed);
    int known = p->total > 0;
    double frac = known ? (double)p->done / (double)p->total : 0;
    if (frac > 1) frac = 1;
    if (known && p->done >= p->total) snprintf(eta, sizeof eta, "0:00");
    else if (known && rate > 0) fmt_time(eta, sizeof eta, (double)(p->total - p->done) / rate);

    if (p->tty) {
        /* \r + clear-to-end-of-line (\033[K) redraws in place without
         * leaving debris when the line gets shorter. */
        if (known) {
            char bar[BAR_WIDTH + 1];
            int fill = (int)(frac * BAR_WIDTH);
            for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
            bar[BAR_WIDTH] = 0;
            fprintf(p->out, "\r%s [%s] %llu/%llu %s  %s %s/s  %s eta %s\033[K", p->label, bar,
                    (unsigned long long)p->done, (unsigned long long)p->total, p->unit, rs, p->unit, es, eta);
        } else {
            fprintf(p->out, "\r%s %llu %s  %s %s/s  %s\033[K", p->label, (unsigned long long)p->done, p->unit, rs,
                    p->unit, es);
        }
        if (final) fputc('\n', p->out);
    } else if (known) {
        fprintf(p->out, "%s: %llu/%llu %s (%.1f%%), %s %s/s, elapsed %s, eta %s\n", p->label,
                (unsigned long long)p->done, (unsigned long long)p->total, p->unit, 100.0 * frac, rs, p->unit, es,
                eta);
    } else {
        fprintf(p->out, "%s: %llu %s, %s %s/s, elapsed %s\n", p->label, (unsigned long long)p->done, p->unit, rs,
                p->unit, es);
    }
    fflush(p->out);
    p->t_last = t;
    p->drawn = 1;
}

void kiln_progress_update(kiln_progress *p, uint64_t done) {
    p->done = done;
    if (!p->enabled || p->finished) return;
    double t = now();
    /* A terminal shows the first state at once; a log waits a full interval
     * so that short tasks produce just their final line. */
    double interval = p->tty ? TTY_INTERVAL : PLAIN_INTERVAL;
    if ((p->tty && !p->drawn) || t - p->t_last >= interval) draw(p, t, 0);
}

void kiln_progress_finish(kiln_progress *p) {
    if (!p->enabled || p->finished) return;
    p->finished = 1;
    draw(p, now(), 1);
}
