/* The incident log: run_dir/incidents.jsonl, one JSON object per line, appended with a single
 * write() and fsynced, so the log survives the crashes it describes and lines never interleave. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/ft.h"
#include "kiln/json.h"

static void iso_time(double t, char *buf, size_t cap) {
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

kiln_error *kiln_incident_append(const char *path, const kiln_incident *in) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return kiln_errorf(KILN_ENOMEM, "incident");
    char ts[32];
    iso_time(in->time, ts, sizeof ts);
    cJSON_AddStringToObject(o, "time", ts);
    cJSON_AddNumberToObject(o, "unix_time", in->time);
    cJSON_AddNumberToObject(o, "attempt", in->attempt);
    cJSON_AddStringToObject(o, "kind", in->kind);
    if (in->rank >= 0) cJSON_AddNumberToObject(o, "rank", in->rank);
    else cJSON_AddNullToObject(o, "rank");
    if (in->step >= 0) cJSON_AddNumberToObject(o, "step", (double)in->step);
    else cJSON_AddNullToObject(o, "step");
    cJSON_AddStringToObject(o, "detail", in->detail ? in->detail : "");
    cJSON_AddStringToObject(o, "action", in->action ? in->action : "");
    char *line = kiln_json_print(o, 0);
    cJSON_Delete(o);
    if (!line) return kiln_errorf(KILN_ENOMEM, "incident");
    size_t n = strlen(line);
    line[n++] = '\n'; /* replaces the NUL: written with its length */
    kiln_error *e = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) e = kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    else {
        ssize_t w = write(fd, line, n);
        if (w != (ssize_t)n) e = kiln_errorf(KILN_EIO, "%s: write: %s", path, w < 0 ? strerror(errno) : "short write");
        if (!e && fsync(fd)) e = kiln_errorf(KILN_EIO, "%s: fsync: %s", path, strerror(errno));
        close(fd);
    }
    free(line);
    return e;
}

void kiln_incident_summary(const kiln_incident *in, char *buf, size_t cap) {
    char who[32] = "", at[32] = "";
    if (in->rank >= 0) snprintf(who, sizeof who, " rank %d", in->rank);
    if (in->step >= 0) snprintf(at, sizeof at, " at step %lld", (long long)in->step);
    snprintf(buf, cap, "kiln run: attempt %d: %s%s%s: %s -> %s", in->attempt, in->kind, who, at,
             in->detail ? in->detail : "", in->action ? in->action : "");
}
