/* RUN_DIR/ft_state.json, what kiln run keeps for a rerun (src/ft/supervisor.c says when it is written and why):
 *   {"skip_steps":"12","reject_from":0,"spike_history":[[5,2.31],[6,2.29]]}
 * the data windows to skip, a set-aside of checkpoints from step reject_from not applied yet (0: none), and the
 * loss-spike detector's history as [step, loss] pairs, oldest first. Its text and its parse, one place each, so
 * that the two agree (tests/fuzz: ft_state, the written text parses back to the same values). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_internal.h"
#include "kiln/json.h"

kiln_error *ft_state_format(const kiln_step_ranges *skip, int64_t reject_from, const int64_t *hist_step,
                            const double *hist_loss, int nhist, char **text_out, size_t *len_out) {
    *text_out = NULL, *len_out = 0;
    /* an entry "[step,loss]," is at most 1 + 20 + 1 + 24 (%.17g) + 2 bytes */
    char *steps = kiln_step_ranges_text(skip);
    const size_t cap = (steps ? strlen(steps) : 0) + (size_t)(nhist > 0 ? nhist : 0) * 64 + 128;
    char *text = malloc(cap);
    if (!steps || !text) {
        free(steps), free(text);
        return kiln_errorf(KILN_ENOMEM, "ft_state.json");
    }
    size_t n = (size_t)snprintf(text, cap, "{\"skip_steps\":\"%s\",\"reject_from\":%lld,\"spike_history\":[",
                                steps, (long long)reject_from);
    int k = 0;
    for (int i = 0; i < nhist; i++) {
        if (kiln_step_ranges_contains(skip, hist_step[i])) continue; /* a skipped window's loss judges nothing */
        n += (size_t)snprintf(text + n, cap - n, "%s[%lld,%.17g]", k++ ? "," : "", (long long)hist_step[i],
                              hist_loss[i]);
    }
    n += (size_t)snprintf(text + n, cap - n, "]}\n");
    free(steps);
    *text_out = text, *len_out = n;
    return NULL;
}

/* The history field: [[step, loss], ...], steps increasing, losses finite; the newest `cap` entries are kept. */
static kiln_error *history_parse(const cJSON *h, const char *path, int64_t *hist_step, double *hist_loss, int cap,
                                 int *nhist) {
    const int n = cJSON_GetArraySize(h);
    int i = 0;
    int64_t prev = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, h) {
        int64_t step = 0;
        const cJSON *l = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !kiln_json_int_value(cJSON_GetArrayItem(it, 0), &step)
            || step < 1 || !cJSON_IsNumber(l) || !isfinite(l->valuedouble))
            return kiln_errorf(KILN_EFORMAT, "%s: field 'spike_history': entry %d is not [step >= 1, finite loss]",
                               path, i);
        if (step <= prev)
            return kiln_errorf(KILN_EFORMAT, "%s: field 'spike_history': entry %d: step %lld after step %lld (steps "
                               "must increase)", path, i, (long long)step, (long long)prev);
        prev = step;
        if (i++ >= n - cap) hist_step[*nhist] = step, hist_loss[(*nhist)++] = l->valuedouble;
    }
    return NULL;
}

kiln_error *ft_state_parse(const char *text, size_t len, const char *path, kiln_step_ranges *skip,
                           int64_t *reject_from, int64_t *hist_step, double *hist_loss, int cap, int *nhist) {
    *nhist = 0;
    cJSON *o = NULL;
    const cJSON *h = NULL;
    const char *steps = NULL;
    kiln_error *e = kiln_json_parse(text, len, path, &o);
    if (!e && !cJSON_IsObject(o)) e = kiln_errorf(KILN_EFORMAT, "%s: not a JSON object", path);
    if (!e) e = kiln_json_get_string(o, "skip_steps", &steps, "", 0, path);
    if (!e) e = kiln_json_get_int(o, "reject_from", reject_from, 0, 0, path);
    if (!e && *reject_from < 0) e = kiln_errorf(KILN_EFORMAT, "%s: field 'reject_from' must be >= 0", path);
    if (!e && (e = kiln_step_ranges_parse(steps, skip))) e = kiln_error_wrap(e, "%s: field 'skip_steps'", path);
    if (!e) e = kiln_json_get_array(o, "spike_history", &h, 0, path); /* absent in an older kiln's file */
    if (!e && h && cap > 0) e = history_parse(h, path, hist_step, hist_loss, cap, nhist);
    cJSON_Delete(o);
    return e;
}
