/* The trainer's side of the supervisor protocol: the environment `kiln run` sets, setting aside
 * checkpoints trained on a bad window, and the faults that act inside a rank. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kiln/ft.h"

static kiln_error *env_int(const char *name, int64_t lo, int64_t *out) {
    const char *s = getenv(name);
    if (!s || !*s) return NULL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo) return kiln_errorf(KILN_EINVAL, "%s='%s': need an integer >= %lld", name, s, (long long)lo);
    *out = v;
    return NULL;
}

kiln_error *kiln_ft_env_read(kiln_ft_env *env) {
    memset(env, 0, sizeof *env);
    env->attempt = 1;
    const char *hb = getenv("KILN_HEARTBEAT_DIR");
    if (hb && strlen(hb) >= sizeof env->heartbeat_dir) return kiln_errorf(KILN_EINVAL, "KILN_HEARTBEAT_DIR is too long");
    if (hb) snprintf(env->heartbeat_dir, sizeof env->heartbeat_dir, "%s", hb);
    int64_t v = 1;
    KILN_TRY(env_int("KILN_RUN_ATTEMPT", 1, &v));
    env->attempt = (int)v;
    v = 0;
    KILN_TRY(env_int("KILN_RESUME", 0, &v));
    env->resume = v != 0;
    KILN_TRY(env_int("KILN_REJECT_FROM", 0, &env->reject_from));
    kiln_error *e = kiln_step_ranges_parse(getenv("KILN_SKIP_STEPS"), &env->skip);
    if (e) return kiln_error_wrap(e, "KILN_SKIP_STEPS");
    return kiln_faults_parse(getenv("KILN_FAULT"), &env->faults);
}

void kiln_ft_env_free(kiln_ft_env *env) { kiln_step_ranges_free(&env->skip); }

kiln_error *kiln_ft_reject_checkpoints(const char *out_dir, int64_t from, int *n) {
    *n = 0;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/ckpt", out_dir);
    DIR *d = opendir(dir);
    if (!d) return NULL; /* no checkpoints */
    int64_t steps[4096];
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)) && k < 4096) {
        long long s;
        char tail[8];
        /* step_N only: a step_N.tmp was never committed and is replaced by its next save anyway */
        if (sscanf(de->d_name, "step_%lld%7s", &s, tail) == 1 && s >= from) steps[k++] = s;
    }
    closedir(d);
    for (int i = 0; i < k; i++) {
        char src[1300], dst[1400];
        snprintf(src, sizeof src, "%s/step_%08lld", dir, (long long)steps[i]);
        snprintf(dst, sizeof dst, "%s.rejected", src);
        for (int j = 2; access(dst, F_OK) == 0 && j < 1000; j++) snprintf(dst, sizeof dst, "%s.rejected.%d", src, j);
        if (rename(src, dst)) return kiln_errorf(KILN_EIO, "%s: cannot set aside as %s: %s", src, dst, strerror(errno));
        (*n)++;
    }
    return NULL;
}

void kiln_ft_fault_slow(const kiln_ft_env *env, int rank, int64_t step) {
    const kiln_fault *f = kiln_faults_find(&env->faults, KILN_FAULT_SLOW, rank, step, env->attempt);
    if (f) {
        struct timespec ts = {(time_t)(f->ms / 1000), (long)(f->ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR) {}
    }
}

void kiln_ft_fault_step_begin(const kiln_ft_env *env, int rank, int64_t step) {
    if (!env->faults.n) return;
    if (kiln_faults_find(&env->faults, KILN_FAULT_STOP, rank, step, env->attempt)) raise(SIGSTOP);
    if (kiln_faults_find(&env->faults, KILN_FAULT_KILL, rank, step, env->attempt)) raise(SIGKILL);
}

kiln_error *kiln_ft_fault_before_save(const kiln_ft_env *env, int rank, int64_t step) {
    const kiln_fault *full = kiln_faults_find(&env->faults, KILN_FAULT_DISK_FULL, rank, step, env->attempt);
    const kiln_fault *crash = kiln_faults_find(&env->faults, KILN_FAULT_CRASH_IN_SAVE, rank, step, env->attempt);
    const kiln_fault *f = full ? full : crash;
    if (!f) return NULL;
    /* a crash must not leave a core file beside the checkpoint */
    struct rlimit core = {0, 0}, fs = {(rlim_t)f->bytes, (rlim_t)f->bytes};
    setrlimit(RLIMIT_CORE, &core);
    signal(SIGXFSZ, full ? SIG_IGN : SIG_DFL);
    if (setrlimit(RLIMIT_FSIZE, &fs))
        return kiln_errorf(KILN_EIO, "KILN_FAULT: setrlimit(RLIMIT_FSIZE, %lld): %s", (long long)f->bytes, strerror(errno));
    return NULL;
}

const kiln_fault *kiln_ft_fault_slow_save(const kiln_ft_env *env, int rank, int64_t step) {
    return kiln_faults_find(&env->faults, KILN_FAULT_SLOW_SAVE, rank, step, env->attempt);
}
