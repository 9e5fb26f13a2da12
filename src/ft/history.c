/* The loss-spike detector's history across attempts and reruns: a dense part (the last history_keep accepted losses)
 * and anchors (ft_internal.h).
 *
 * Why anchors: an attempt resumes from the newest valid checkpoint, and its first steps must be judged against the
 * window of losses right before its first step. That checkpoint can lie further back than the dense part reaches
 * (run.ckpt_every above history_keep, 2000 is common in pretraining and far above 1024; newer checkpoints set aside
 * after a spike; an invalid newest one): then every dense loss is after the resume step, cut, and without anchors the
 * detector was blind for --spike-min steps. Keeping every loss would make memory and ft_state.json grow with the run.
 *
 * Which steps, first: the checkpoints. The trainer (rank 0, kiln_heartbeat_writer_checkpoint) reports each checkpoint
 * it takes, of step S, as a step-log line after step S's own, whatever made it (run.ckpt_every, a save deferred to S
 * while the previous one was still being written, a Ctrl-C or SIGTERM save, the last step's). On reading it the
 * supervisor keeps the window of the last `window` losses of steps <= S from the dense part (ft_hist_ckpt), marked
 * ckpt: a resume from that checkpoint finds exactly its window, at any depth. The checkpoint rule keeps the newest
 * FT_ANCHOR_CKPT_KEEP = 32 of them, whatever their step: only the newest checkpoints can be resumed from, since the
 * trainer deletes all but its newest run.keep_last valid ones (2 by default; a handful is common) after each commit,
 * and a resume takes the newest valid one left, or one before a set-aside window; the newer ones of a timeline rolled
 * back past go with it (ft_hist_seed). 32 covers any run.keep_last up to 32 (a save that failed after its line
 * counts too: at most one per attempt, since the trainer stops on it) at 32 windows, 1600 losses with the defaults,
 * a tenth of the budget. With a --spike-window above the dense part's half (near 1000) the budget holds fewer: there
 * they go after every other anchor, oldest first (prune).
 *
 * Then the round steps, for the checkpoints no line told of: those of a trainer from before checkpoint lines (or any
 * other training command writing the step log), in an ft_state.json from before them, and the rare save whose line
 * the supervisor did not keep (one before any step of its attempt was judged, all of them skipped; one read less
 * than a poll before the supervisor was lost). There the supervisor does not know the checkpoints' steps ahead of a resume (the
 * training command is opaque to it: the config, its out_dir and its schedule are the trainer's), so it keeps the
 * windows before the steps checkpoint schedules are made of, round numbers, and keeps rounder ones longer: an anchor
 * at step A stays while
 *     newest - A < FT_ANCHOR_REACH x round(A),
 * round(A) the largest of 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, ... (1, 2, 2.5 and 5 times a power of ten) that
 * divides A, newest the newest step judged. With run.ckpt_every one of those numbers, the windows before its last
 * FT_ANCHOR_REACH checkpoints are kept (ckpt_every 2000: those less than 8000 steps back); with a multiple of one
 * (1500 of 500, 3000 of 1000), the checkpoints less than FT_ANCHOR_REACH x that one back; at any depth, since a
 * rounder step is kept proportionally longer. The number kept grows with the log of the step: about 27 windows at
 * step 10^6 and 53 at 10^9 (beyond the dense part of 1024), within the budget (ft_internal.h: ft_hist_budget losses,
 * FT_ANCHOR_MAX windows; prune says which go first when it binds, as with a --spike-window near 1000). A resume step
 * of neither kind further back than the dense part (an unreported checkpoint of a step that is not round) still
 * finds no window, and the detector starts empty there, as before. A checkpoint's anchor at a round step is kept by
 * either rule.
 *
 * Exactness: each part says from which step on it is complete (the dense part: `from`; an anchor: from its first loss
 * to its end). A window is taken only from parts that together hold every accepted loss from some step L up to
 * first - 1, so it is the window right before first (or its newest part when fewer than --spike-window losses are
 * held from L on), never losses from before a gap. */
#include <stdlib.h>
#include <string.h>

#include "ft_internal.h"

#define FT_ANCHOR_REACH 4

kiln_error *ft_hist_init(ft_hist *h, int window, int cap) {
    memset(h, 0, sizeof *h);
    h->from = INT64_MAX;
    if (window < 1 || cap < window) return kiln_errorf(KILN_EINVAL, "loss-spike history: window %d, keep %d", window, cap);
    h->step = malloc((size_t)cap * sizeof *h->step);
    h->loss = malloc((size_t)cap * sizeof *h->loss);
    if (!h->step || !h->loss) {
        ft_hist_free(h);
        return kiln_errorf(KILN_ENOMEM, "loss-spike history of %d steps", cap);
    }
    h->window = window, h->cap = cap;
    return NULL;
}

void ft_hist_free(ft_hist *h) {
    free(h->step);
    free(h->loss);
    for (int i = 0; i < h->nanchor; i++) free(h->anchor[i].step); /* one block: step, then loss */
    free(h->anchor);
    memset(h, 0, sizeof *h);
    h->from = INT64_MAX;
}

/* The largest of 1, 2, 5, 10, 20, 25, 50, 100, ... that divides a (a >= 1). */
static int64_t round_of(int64_t a) {
    int64_t best = 1;
    for (int64_t p = 1;;) {
        const int64_t c[4] = {p, p <= INT64_MAX / 2 ? 2 * p : 0, p <= INT64_MAX / 5 ? 5 * p : 0,
                              p >= 10 ? p / 10 * 25 : 0};
        for (int i = 0; i < 4; i++)
            if (c[i] > best && c[i] <= a && a % c[i] == 0) best = c[i];
        if (p > a / 10) break; /* the next level's smallest, 10p, is past a */
        p *= 10;
    }
    return best;
}

int ft_hist_keeps(int64_t end, int64_t newest) {
    return end >= 1 && (newest <= end || (newest - end) / FT_ANCHOR_REACH < round_of(end));
}

static void anchor_drop(ft_hist *h, int i) {
    h->anchored -= h->anchor[i].n;
    free(h->anchor[i].step);
    memmove(h->anchor + i, h->anchor + i + 1, (size_t)(h->nanchor - i - 1) * sizeof *h->anchor);
    h->nanchor--;
}

/* The end of the oldest anchor the checkpoint rule keeps: that of the FT_ANCHOR_CKPT_KEEP-th newest checkpoint's
 * (INT64_MIN with fewer: every one). An anchor is the rule's when ckpt and end >= this. */
static int64_t ckpt_floor(const ft_hist *h) {
    int k = 0;
    for (int i = h->nanchor - 1; i >= 0; i--)
        if (h->anchor[i].ckpt && ++k == FT_ANCHOR_CKPT_KEEP) return h->anchor[i].end;
    return INT64_MIN;
}

/* The rules at `newest` (an anchor stays when either keeps it), then the budget. Within it the checkpoint rule's
 * anchors go last, the oldest first (known checkpoints over guessed steps). Of the others, as if the reach were
 * shorter, the window furthest into its reach ((newest - end) / round(end), the oldest of equals) goes first. That
 * drops the windows of barely round steps next to the dense part (which still holds most of them: a resume there finds
 * a shorter window, not none) before those of the recent round steps a checkpoint schedule is made of. */
static void prune(ft_hist *h, int64_t newest) {
    const int64_t ckpt_from = ckpt_floor(h);
    for (int i = h->nanchor - 1; i >= 0; i--)
        if (!(h->anchor[i].ckpt && h->anchor[i].end >= ckpt_from) && !ft_hist_keeps(h->anchor[i].end, newest))
            anchor_drop(h, i);
    while (h->nanchor > 0 && (h->nanchor > FT_ANCHOR_MAX || h->anchored > ft_hist_budget(h->cap))) {
        const int64_t kept_from = ckpt_floor(h);
        int worst = -1, oldest_ckpt = -1;
        double worst_r = -1;
        for (int i = 0; i < h->nanchor; i++) {
            const int64_t end = h->anchor[i].end;
            if (h->anchor[i].ckpt && end >= kept_from) {
                if (oldest_ckpt < 0) oldest_ckpt = i;
                continue;
            }
            const double r = newest > end ? (double)(newest - end) / (double)round_of(end) : 0;
            if (r > worst_r) worst = i, worst_r = r;
        }
        anchor_drop(h, worst >= 0 ? worst : oldest_ckpt);
    }
}

static int64_t newest_of(const ft_hist *h) {
    int64_t t = h->n ? h->step[h->n - 1] : 0;
    if (h->nanchor && h->anchor[h->nanchor - 1].end > t) t = h->anchor[h->nanchor - 1].end;
    return t;
}

/* A new anchor at `end` holding step/loss[0..n) (n >= 1), in order of end, not a checkpoint's; one there already
 * stays. */
static kiln_error *anchor_insert(ft_hist *h, int64_t end, const int64_t *step, const double *loss, int n) {
    int at = h->nanchor;
    while (at > 0 && h->anchor[at - 1].end >= end) at--;
    if (at < h->nanchor && h->anchor[at].end == end) return NULL;
    if (h->nanchor == h->anchor_alloc) {
        const int cap = h->anchor_alloc ? 2 * h->anchor_alloc : 16;
        ft_anchor *p = realloc(h->anchor, (size_t)cap * sizeof *p);
        if (!p) return kiln_errorf(KILN_ENOMEM, "loss-spike history: the window before step %lld", (long long)end);
        h->anchor = p, h->anchor_alloc = cap;
    }
    int64_t *block = malloc((size_t)n * (sizeof *step + sizeof *loss));
    if (!block) return kiln_errorf(KILN_ENOMEM, "loss-spike history: the window before step %lld", (long long)end);
    memmove(h->anchor + at + 1, h->anchor + at, (size_t)(h->nanchor - at) * sizeof *h->anchor);
    ft_anchor *a = &h->anchor[at];
    a->end = end, a->n = n, a->ckpt = 0, a->step = block, a->loss = (double *)(block + n);
    memcpy(a->step, step, (size_t)n * sizeof *step);
    memcpy(a->loss, loss, (size_t)n * sizeof *loss);
    h->nanchor++;
    h->anchored += n;
    return NULL;
}

/* How many of the increasing steps st[0..n) are <= m (binary search). */
static int count_upto(const int64_t *st, int n, int64_t m) {
    int l = 0, r = n;
    while (l < r) {
        const int mid = l + (r - l) / 2;
        if (st[mid] <= m) l = mid + 1;
        else r = mid;
    }
    return l;
}

/* The anchors the rule wants at `newest` for the steps A in [lo, hi), their windows taken from st/ls[0..n) (steps
 * increasing, every accepted loss from st[0] on): the last `window` losses of steps <= A. Each level g of the rule
 * has at most FT_ANCHOR_REACH multiples in reach, so this is quick however wide [lo, hi) is (a long skipped window). */
static kiln_error *capture(ft_hist *h, const int64_t *st, const double *ls, int n, int64_t lo, int64_t hi,
                           int64_t newest) {
    kiln_error *first_err = NULL;
    for (int64_t p = 1;;) {
        const int64_t c[4] = {p, p <= INT64_MAX / 2 ? 2 * p : 0, p <= INT64_MAX / 5 ? 5 * p : 0,
                              p >= 10 ? p / 10 * 25 : 0};
        for (int i = 0; i < 4; i++) {
            const int64_t g = c[i];
            if (g <= 0 || g >= hi) continue;
            int64_t start = lo;
            if ((newest - lo) / FT_ANCHOR_REACH >= g) start = newest - FT_ANCHOR_REACH * g + 1; /* the reach of g */
            if (start >= hi) continue;
            for (int64_t m = start % g ? (start / g + 1) * g : start; m < hi; m += g) {
                const int j = count_upto(st, n, m) - 1; /* the last loss of a step <= m */
                if (j >= 0) {
                    const int i0 = j - h->window + 1 > 0 ? j - h->window + 1 : 0;
                    kiln_error *e = anchor_insert(h, m, st + i0, ls + i0, j - i0 + 1);
                    if (e && !first_err) first_err = e;
                    else kiln_error_free(e);
                }
                if (m > INT64_MAX - g) break;
            }
        }
        if (p > hi / 10) break;
        p *= 10;
    }
    return first_err;
}

kiln_error *ft_hist_add(ft_hist *h, int64_t step, double loss) {
    if (h->cap <= 0) return NULL;
    if (step < 1 || (h->n && step <= h->step[h->n - 1]))
        return kiln_errorf(KILN_EINVAL, "loss-spike history: step %lld after step %lld", (long long)step,
                           h->n ? (long long)h->step[h->n - 1] : 0LL);
    kiln_error *e = NULL;
    if (h->from > step) h->from = step; /* complete from the first loss it has */
    if (h->n == h->cap) {
        /* the windows that hold the oldest loss are about to lose it: those of the steps before the window-th loss
         * after it (or before this one) */
        const int64_t hi = h->window < h->n ? h->step[h->window] : step;
        e = capture(h, h->step, h->loss, h->n, h->step[0], hi, step);
        h->from = h->step[0] + 1;
        memmove(h->step, h->step + 1, (size_t)(h->n - 1) * sizeof *h->step);
        memmove(h->loss, h->loss + 1, (size_t)(h->n - 1) * sizeof *h->loss);
        h->n--;
        prune(h, step);
    }
    h->step[h->n] = step;
    h->loss[h->n++] = loss;
    return e;
}

typedef struct {
    int64_t step;
    double loss;
} pair;

static int cmp_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* The anchors at or after first are of a rolled-back stretch as windows, yet their losses before first are of the
 * same run as the resume point (every rollback cut what came after it): they serve as losses, then go. */
static void drop_from(ft_hist *h, int64_t first, int *changed) {
    for (int i = h->nanchor - 1; i >= 0 && h->anchor[i].end >= first; i--) anchor_drop(h, i), *changed = 1;
}

kiln_error *ft_hist_seed(ft_hist *h, int64_t first, const kiln_step_ranges *skip, int *changed) {
    *changed = 0;
    if (h->cap <= 0) return NULL;
    /* a rolled-back stretch (steps >= first) and skipped windows go, from both parts */
    int k = 0;
    for (int i = 0; i < h->n; i++)
        if (h->step[i] < first && !kiln_step_ranges_contains(skip, h->step[i]))
            h->step[k] = h->step[i], h->loss[k] = h->loss[i], k++;
    *changed |= k != h->n;
    h->n = k;
    if (h->from > first) h->from = first; /* held from here: what this attempt judges */
    for (int i = h->nanchor - 1; i >= 0; i--) {
        ft_anchor *a = &h->anchor[i];
        int m = 0;
        for (int j = 0; j < a->n; j++)
            if (a->step[j] < first && !kiln_step_ranges_contains(skip, a->step[j]))
                a->step[m] = a->step[j], a->loss[m] = a->loss[j], m++;
        if (m != a->n) h->anchored -= a->n - m, a->n = m, *changed |= a->end < first;
        if (!m) anchor_drop(h, i), *changed = 1;
    }
    /* the stretch [L, first - 1] the parts hold whole: the parts that cover first - 1, then any that meets or touches
     * the stretch from before it (an anchor holds every loss from its first to its end, or to first - 1) */
    const int64_t p = first - 1;
    int64_t L = h->from <= p ? h->from : INT64_MAX;
    for (int i = 0; i < h->nanchor; i++)
        if (h->anchor[i].step[0] <= p && p <= h->anchor[i].end && h->anchor[i].step[0] < L) L = h->anchor[i].step[0];
    for (int grew = L != INT64_MAX; grew;) {
        grew = 0;
        for (int i = 0; i < h->nanchor; i++)
            if (h->anchor[i].step[0] < L && h->anchor[i].end >= L - 1) L = h->anchor[i].step[0], grew = 1;
    }
    if (L == INT64_MAX) { /* nothing right before first: the dense part is empty, the detector too */
        drop_from(h, first, changed);
        return NULL;
    }
    /* the dense part becomes the losses of [L, first - 1] from both (an anchor duplicates the dense part where they
     * overlap: one each) */
    const int64_t most = (int64_t)h->n + h->anchored;
    pair *m = malloc((size_t)(most > 0 ? most : 1) * sizeof *m);
    if (!m) {
        drop_from(h, first, changed);
        return kiln_errorf(KILN_ENOMEM, "loss-spike history: the window before step %lld", (long long)first);
    }
    int64_t nm = 0;
    for (int i = 0; i < h->n; i++)
        if (h->step[i] >= L) m[nm++] = (pair){h->step[i], h->loss[i]};
    for (int i = 0; i < h->nanchor; i++)
        for (int j = 0; j < h->anchor[i].n; j++)
            if (h->anchor[i].step[j] >= L) m[nm++] = (pair){h->anchor[i].step[j], h->anchor[i].loss[j]};
    qsort(m, (size_t)nm, sizeof *m, cmp_pair);
    int64_t u = 0;
    for (int64_t i = 0; i < nm; i++)
        if (!u || m[i].step != m[u - 1].step) m[u++] = m[i];
    const int64_t keep = u < h->cap ? u : h->cap;
    *changed |= keep != h->n;
    for (int64_t i = 0; i < keep; i++) h->step[i] = m[u - keep + i].step, h->loss[i] = m[u - keep + i].loss;
    h->n = (int)keep;
    h->from = u > keep ? m[u - keep - 1].step + 1 : L;
    free(m);
    drop_from(h, first, changed);
    return NULL;
}

/* The index of the anchor at `end`, or -1 */
static int anchor_at(const ft_hist *h, int64_t end) {
    int l = 0, r = h->nanchor;
    while (l < r) {
        const int mid = l + (r - l) / 2;
        if (h->anchor[mid].end < end) l = mid + 1;
        else r = mid;
    }
    return l < h->nanchor && h->anchor[l].end == end ? l : -1;
}

kiln_error *ft_hist_ckpt(ft_hist *h, int64_t end, int *added) {
    if (added) *added = 0;
    if (h->cap <= 0 || end < 1) return NULL;
    const int j = count_upto(h->step, h->n, end) - 1; /* the last dense loss of a step <= end */
    int i0 = j - h->window + 1 > 0 ? j - h->window + 1 : 0;
    while (i0 <= j && h->step[i0] < h->from) i0++; /* only what the dense part holds whole (all of it, as kept) */
    int at = anchor_at(h, end);
    if (j >= i0 && (at < 0 || h->anchor[at].n <= j - i0 + 1)) {
        if (at >= 0) anchor_drop(h, at); /* the same losses, or fewer of them: the dense part's window */
        KILN_TRY(anchor_insert(h, end, h->step + i0, h->loss + i0, j - i0 + 1));
        at = anchor_at(h, end);
    }
    if (at < 0) return NULL; /* no loss held up to end: no window known whole */
    h->anchor[at].ckpt = 1;
    prune(h, newest_of(h)); /* the 33rd newest checkpoint's anchor now stays only if round; the budget */
    if (added) *added = anchor_at(h, end) >= 0;
    return NULL;
}

kiln_error *ft_hist_put_anchor(ft_hist *h, int64_t end, const int64_t *step, const double *loss, int n, int ckpt) {
    if (h->cap <= 0) return NULL;
    if (n < 1 || end < 1 || (h->nanchor && end <= h->anchor[h->nanchor - 1].end))
        return kiln_errorf(KILN_EINVAL, "loss-spike history: the window before step %lld", (long long)end);
    const int keep = n < h->window ? n : h->window;
    KILN_TRY(anchor_insert(h, end, step + n - keep, loss + n - keep, keep));
    h->anchor[h->nanchor - 1].ckpt = ckpt != 0;
    prune(h, newest_of(h)); /* the budget: a file of many windows is not all held at once */
    return NULL;
}

kiln_error *ft_hist_load(ft_hist *h, const int64_t *st, const double *ls, int n) {
    if (h->cap <= 0) return NULL;
    if (h->n) return kiln_errorf(KILN_EINVAL, "loss-spike history: loaded twice");
    kiln_error *e = NULL;
    if (n > h->cap) {
        /* what ft_hist_add would have kept of the losses that fall out: the windows holding any of st[0..n-cap) */
        const int last = n - h->cap - 1 + h->window < n - 1 ? n - h->cap - 1 + h->window : n - 1;
        e = capture(h, st, ls, n, st[0], st[last], st[n - 1]);
        h->from = st[n - h->cap - 1] + 1;
    } else if (n > 0) {
        h->from = st[0];
    }
    const int keep = n < h->cap ? n : h->cap;
    if (keep > 0) {
        memcpy(h->step, st + n - keep, (size_t)keep * sizeof *st);
        memcpy(h->loss, ls + n - keep, (size_t)keep * sizeof *ls);
    }
    h->n = keep > 0 ? keep : 0;
    prune(h, newest_of(h));
    return e;
}
