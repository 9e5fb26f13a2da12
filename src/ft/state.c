/* RUN_DIR/ft_state.json, what kiln run keeps for a rerun (src/ft/supervisor.c says when it is written and why):
 *   {"skip_steps":"12","reject_from":0,"spike_history":[[5,2.31],[6,2.29]],
 *    "spike_anchors":[[1234,[[1233,2.41],[1234,2.40]]],[2000,[[1999,2.38],[2000,2.37]]]],"spike_checkpoints":[1234]}
 * the data windows to skip, a set-aside of checkpoints from step reject_from not applied yet (0: none), and the
 * loss-spike detector's history (src/ft/history.c): its dense part as [step, loss] pairs, oldest first (what
 * "spike_history" always held), and the anchors as [end, [[step, loss], ...]], by end: the window of the losses of the
 * steps up to end, for a resume further back than the dense part; "spike_checkpoints", the ends (increasing) of the
 * anchors that are windows before checkpoints the trainer reported (kept by the checkpoint rule; each must be an
 * anchor's end). Fields of their own, so that an older kiln reads the dense part as before and ignores the rest (it
 * keeps the checkpoints' anchors by the round-step rule alone), and a file without them (an older kiln's) loads with
 * no anchors, or with anchors none of which is a checkpoint's. Its text and its parse, one place each, so that the two
 * agree (tests/fuzz: ft_state, the written text parses back to the same values). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_internal.h"
#include "kiln/json.h"

/* "[step,loss]" pairs of step/loss[0..n) outside the skipped windows, comma-separated, at text + *n; returns how many */
static int pairs_format(const kiln_step_ranges *skip, const int64_t *step, const double *loss, int n, char *text,
                        size_t cap, size_t *len) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (kiln_step_ranges_contains(skip, step[i])) continue; /* a skipped window's loss judges nothing */
        *len += (size_t)snprintf(text + *len, cap - *len, "%s[%lld,%.17g]", k++ ? "," : "", (long long)step[i],
                                 loss[i]);
    }
    return k;
}

kiln_error *ft_state_format(const kiln_step_ranges *skip, int64_t reject_from, const ft_hist *h, char **text_out,
                            size_t *len_out) {
    *text_out = NULL, *len_out = 0;
    /* an entry "[step,loss]," is at most 1 + 20 + 1 + 24 (%.17g) + 2 bytes; an anchor's "[end,[" and "]]," 30, its
     * end in "spike_checkpoints" 21 */
    char *steps = kiln_step_ranges_text(skip);
    const int64_t entries = h ? (int64_t)h->n + h->anchored : 0, anchors = h ? h->nanchor : 0;
    const size_t cap = (steps ? strlen(steps) : 0) + (size_t)entries * 64 + (size_t)anchors * 56 + 200;
    char *text = malloc(cap);
    if (!steps || !text) {
        free(steps), free(text);
        return kiln_errorf(KILN_ENOMEM, "ft_state.json");
    }
    size_t n = (size_t)snprintf(text, cap, "{\"skip_steps\":\"%s\",\"reject_from\":%lld,\"spike_history\":[",
                                steps, (long long)reject_from);
    if (h) pairs_format(skip, h->step, h->loss, h->n, text, cap, &n);
    n += (size_t)snprintf(text + n, cap - n, "],\"spike_anchors\":[");
    int k = 0;
    for (int i = 0; i < anchors; i++) {
        const ft_anchor *a = &h->anchor[i];
        const size_t at = n;
        n += (size_t)snprintf(text + n, cap - n, "%s[%lld,[", k ? "," : "", (long long)a->end);
        if (!pairs_format(skip, a->step, a->loss, a->n, text, cap, &n)) { /* all skipped: no window left */
            n = at;
            text[n] = 0;
            continue;
        }
        n += (size_t)snprintf(text + n, cap - n, "]]");
        k++;
    }
    n += (size_t)snprintf(text + n, cap - n, "],\"spike_checkpoints\":[");
    k = 0;
    for (int i = 0; i < anchors; i++) { /* the checkpoints' among the anchors written */
        const ft_anchor *a = &h->anchor[i];
        int left = 0;
        for (int j = 0; j < a->n && !left; j++) left = !kiln_step_ranges_contains(skip, a->step[j]);
        if (a->ckpt && left) n += (size_t)snprintf(text + n, cap - n, "%s%lld", k++ ? "," : "", (long long)a->end);
    }
    n += (size_t)snprintf(text + n, cap - n, "]}\n");
    free(steps);
    *text_out = text, *len_out = n;
    return NULL;
}

/* [[step, loss], ...] of field `field` (its anchor `anchor`, or -1: the dense part), steps increasing (and <= end when
 * end > 0), losses finite: into step/loss[0..*n) (malloc'd; the caller frees step, loss). */
static kiln_error *pairs_parse(const cJSON *arr, const char *path, const char *field, int anchor, int64_t end,
                               int64_t **step_out, double **loss_out, int *n_out) {
    char where[64] = "";
    if (anchor >= 0) snprintf(where, sizeof where, " anchor %d:", anchor);
    const int n = cJSON_GetArraySize(arr);
    int64_t *step = malloc((size_t)(n > 0 ? n : 1) * sizeof *step);
    double *loss = malloc((size_t)(n > 0 ? n : 1) * sizeof *loss);
    *step_out = step, *loss_out = loss, *n_out = 0;
    if (!step || !loss) return kiln_errorf(KILN_ENOMEM, "%s: field '%s':%s %d entries", path, field, where, n);
    int i = 0;
    int64_t prev = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        int64_t s = 0;
        const cJSON *l = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !kiln_json_int_value(cJSON_GetArrayItem(it, 0), &s)
            || s < 1 || !cJSON_IsNumber(l) || !isfinite(l->valuedouble))
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s':%s entry %d is not [step >= 1, finite loss]", path, field,
                               where, i);
        if (s <= prev)
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s':%s entry %d: step %lld after step %lld (steps must "
                               "increase)", path, field, where, i, (long long)s, (long long)prev);
        if (end > 0 && s > end)
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s':%s entry %d: step %lld after the window's end, step %lld",
                               path, field, where, i, (long long)s, (long long)end);
        prev = s;
        step[i] = s, loss[i++] = l->valuedouble;
    }
    *n_out = i;
    return NULL;
}

/* "spike_checkpoints": [end >= 1, ...], increasing, into ends[0..*n) (malloc'd; the caller frees it) */
static kiln_error *ckpts_parse(const cJSON *arr, const char *path, int64_t **ends_out, int *n_out) {
    const int n = cJSON_GetArraySize(arr);
    int64_t *ends = malloc((size_t)(n > 0 ? n : 1) * sizeof *ends), prev = 0;
    *ends_out = ends, *n_out = 0;
    if (!ends) return kiln_errorf(KILN_ENOMEM, "%s: field 'spike_checkpoints': %d entries", path, n);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        int64_t s = 0;
        if (!kiln_json_int_value(it, &s) || s < 1)
            return kiln_errorf(KILN_EFORMAT, "%s: field 'spike_checkpoints': entry %d is not a step >= 1", path, i);
        if (s <= prev)
            return kiln_errorf(KILN_EFORMAT, "%s: field 'spike_checkpoints': entry %d: step %lld after step %lld (steps "
                               "must increase)", path, i, (long long)s, (long long)prev);
        prev = s;
        ends[i++] = s;
    }
    *n_out = i;
    return NULL;
}

/* The history fields: the checkpoints' ends, then the anchors, [[end >= 1, [[step, loss], ...]], ...] (ends
 * increasing, each window non-empty; a checkpoint's marked as it is put, so that the rules keep it), every checkpoint
 * an anchor's end; then the dense part, [[step, loss], ...] (past the history's size, the older losses leave anchors as
 * they would have live: ft_hist_load). */
static kiln_error *history_parse(const cJSON *dense, const cJSON *anchors, const cJSON *ckpts, const char *path,
                                 ft_hist *h) {
    int64_t *step = NULL, prev = 0, *ck = NULL;
    double *loss = NULL;
    int n = 0, i = 0, nck = 0, c = 0;
    kiln_error *e = ckpts ? ckpts_parse(ckpts, path, &ck, &nck) : NULL;
    const cJSON *it;
    if (e) anchors = NULL;
    cJSON_ArrayForEach(it, anchors) {
        int64_t end = 0;
        const cJSON *w = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !kiln_json_int_value(cJSON_GetArrayItem(it, 0), &end)
            || end < 1 || !cJSON_IsArray(w) || cJSON_GetArraySize(w) < 1) {
            e = kiln_errorf(KILN_EFORMAT, "%s: field 'spike_anchors': anchor %d is not [end step >= 1, [[step, loss], "
                            "...]] with at least one loss", path, i);
            break;
        }
        if (end <= prev) {
            e = kiln_errorf(KILN_EFORMAT, "%s: field 'spike_anchors': anchor %d: end step %lld after end step %lld "
                            "(must increase)", path, i, (long long)end, (long long)prev);
            break;
        }
        prev = end;
        if (c < nck && ck[c] < end) break; /* a checkpoint between two anchors' ends: told below */
        const int is_ckpt = c < nck && ck[c] == end;
        c += is_ckpt;
        e = pairs_parse(w, path, "spike_anchors", i, end, &step, &loss, &n);
        if (!e && (e = ft_hist_put_anchor(h, end, step, loss, n, is_ckpt)))
            e = kiln_error_wrap(e, "%s: field 'spike_anchors'", path);
        free(step), free(loss);
        step = NULL, loss = NULL;
        if (e) break;
        i++;
    }
    if (!e && c < nck)
        e = kiln_errorf(KILN_EFORMAT, "%s: field 'spike_checkpoints': entry %d: step %lld is not the end of an anchor "
                        "in 'spike_anchors'", path, c, (long long)ck[c]);
    free(ck);
    if (!e && dense) {
        e = pairs_parse(dense, path, "spike_history", -1, 0, &step, &loss, &n);
        if (!e && (e = ft_hist_load(h, step, loss, n))) e = kiln_error_wrap(e, "%s: field 'spike_history'", path);
        free(step), free(loss);
    }
    return e;
}

kiln_error *ft_state_parse(const char *text, size_t len, const char *path, kiln_step_ranges *skip,
                           int64_t *reject_from, ft_hist *h) {
    cJSON *o = NULL;
    const cJSON *dense = NULL, *anchors = NULL, *ckpts = NULL;
    const char *steps = NULL;
    kiln_error *e = kiln_json_parse(text, len, path, &o);
    if (!e && !cJSON_IsObject(o)) e = kiln_errorf(KILN_EFORMAT, "%s: not a JSON object", path);
    if (!e) e = kiln_json_get_string(o, "skip_steps", &steps, "", 0, path);
    if (!e) e = kiln_json_get_int(o, "reject_from", reject_from, 0, 0, path);
    if (!e && *reject_from < 0) e = kiln_errorf(KILN_EFORMAT, "%s: field 'reject_from' must be >= 0", path);
    if (!e && (e = kiln_step_ranges_parse(steps, skip))) e = kiln_error_wrap(e, "%s: field 'skip_steps'", path);
    /* all absent in an older kiln's file; "spike_anchors" in one written before anchors were kept, "spike_checkpoints"
     * in one written before the trainer's checkpoint lines were read */
    if (!e) e = kiln_json_get_array(o, "spike_history", &dense, 0, path);
    if (!e) e = kiln_json_get_array(o, "spike_anchors", &anchors, 0, path);
    if (!e) e = kiln_json_get_array(o, "spike_checkpoints", &ckpts, 0, path);
    if (!e && h && h->cap > 0) e = history_parse(dense, anchors, ckpts, path, h);
    cJSON_Delete(o);
    return e;
}
