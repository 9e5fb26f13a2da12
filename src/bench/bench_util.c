/* Pieces every `kiln bench` CLI shares: see bench_util.h. */
#include "bench/bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <omp.h>

#include "kiln/bench.h"
#include "kiln/fsutil.h"

/* ---- flags and messages ---- */

int kiln_bench_flag(int argc, char **argv, int *i, const char *bench, const char *usage, const char *const *valued,
                    const char **flag, const char **val) {
    const char *a = argv[*i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        fputs(usage, stdout);
        return 0;
    }
    int known = 0;
    for (int j = 0; valued[j]; j++) known |= !strcmp(a, valued[j]);
    if (!known) return kiln_bench_unknown_option(bench, a, usage);
    if (*i + 1 >= argc) return kiln_bench_usage_err(bench, "%s needs a value", a);
    *flag = a;
    *val = argv[++*i];
    return -1;
}

int kiln_bench_unknown_option(const char *bench, const char *opt, const char *usage) {
    fprintf(stderr, "kiln bench %s: error: unknown option '%s'\n\n%s", bench, opt, usage);
    return 2;
}

int kiln_bench_usage_err(const char *bench, const char *fmt, ...) {
    fprintf(stderr, "kiln bench %s: error: ", bench);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return 2;
}

void kiln_bench_fail(const char *bench, const char *what, kiln_error *e) {
    if (what) fprintf(stderr, "kiln bench %s: error: %s: %s\n", bench, what, kiln_error_msg(e));
    else fprintf(stderr, "kiln bench %s: error: %s\n", bench, kiln_error_msg(e));
    kiln_error_free(e);
}

int kiln_bench_parse_int(const char *bench, const char *flag, const char *v, long long lo, long long hi,
                         long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || end == v || errno || x < lo || x > hi)
        return kiln_bench_usage_err(bench, "%s '%s': expected an integer in %lld..%lld", flag, v, lo, hi);
    *out = x;
    return -1;
}

void kiln_bench_set_threads(long long n) {
    if (n > 0) {
        openblas_set_num_threads((int)n);
        omp_set_num_threads((int)n);
    }
}

/* ---- measuring ---- */

double kiln_bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double kiln_bench_avail_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (double)kb * 1024.0;
            }
        }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

void kiln_bench_fill(float *x, int64_t n, uint32_t salt, float scale) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = ((float)((((uint64_t)i + salt) * 2654435761u) % 2000) * 1e-3f - 1.0f) * scale;
}

int kiln_bench_all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 1 + n / 211)
        if (!isfinite(x[i])) return 0;
    return isfinite(x[n - 1]);
}

/* ---- the kernel benchmarks' two passes ---- */

const char *const kiln_bench_pass_names[2] = {"fwd", "fwd_bwd"};

void kiln_bench_pass_header(const char *unit) {
    printf(" | %10s %9s %11s | %10s %9s %11s\n", "fwd ms", unit, "tok/s", "f+b ms", unit, "tok/s");
}

void kiln_bench_pass_row(const double us[2], const double flops[2], double tokens, double scale, int prec) {
    printf(" | %10.3f %9.*f %11.4g | %10.3f %9.*f %11.4g\n", us[0] / 1e3, prec, flops[0] / (us[0] * 1e-6) / scale,
           tokens / (us[0] * 1e-6), us[1] / 1e3, prec, flops[1] / (us[1] * 1e-6) / scale, tokens / (us[1] * 1e-6));
}

/* ---- outputs ---- */

static kiln_error *write_profile(const kiln_bench_output *o, const char *path) {
    cJSON *p = kiln_profile_new(o->bench);
    cJSON *sec = p ? kiln_profile_section(p, o->bench) : NULL;
    kiln_error *e = sec ? NULL : kiln_errorf(KILN_ENOMEM, "%s", path);
    for (size_t i = 0; !e && i < o->n; i++) {
        cJSON *r = cJSON_CreateObject();
        if (!r) {
            e = kiln_errorf(KILN_ENOMEM, "%s", path);
            break;
        }
        o->json_record(r, i, o->ctx);
        cJSON_AddItemToArray(sec, r);
    }
    if (!e && o->json_extra) o->json_extra(p, o->ctx);
    if (!e) e = kiln_profile_write(p, path);
    cJSON_Delete(p);
    return e;
}

static kiln_error *write_csv(const kiln_bench_output *o, const char *path) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return kiln_errorf(KILN_ENOMEM, "%s", path);
    fputs(o->csv_header, f);
    for (size_t i = 0; i < o->n; i++) o->csv_row(f, i, o->ctx);
    fclose(f);
    kiln_error *e = kiln_write_file_atomic(path, buf, len);
    free(buf);
    return e;
}

kiln_error *kiln_bench_check_output(const char *flag, const char *path) {
    if (!path) return NULL;
    if (!*path) return kiln_errorf(KILN_EINVAL, "%s: empty file name", flag);
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode))
        return kiln_errorf(KILN_EINVAL, "%s %s: is a directory, not a file to write", flag, path);
    /* the atomic writer's temp file lives beside the target: probe the same directory the same way */
    char probe[4200];
    if (snprintf(probe, sizeof probe, "%s.probe.%ld", path, (long)getpid()) >= (int)sizeof probe)
        return kiln_errorf(KILN_EINVAL, "%s: the path is too long", flag);
    int fd = open(probe, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
        const int err = errno;
        return kiln_errorf(KILN_EIO, "%s %s: cannot create a file there (%s); nothing was run", flag, path,
                           strerror(err));
    }
    close(fd);
    unlink(probe);
    return NULL;
}

int kiln_bench_check_outputs(const char *bench, const char *json_path, const char *csv_path) {
    kiln_error *e = kiln_bench_check_output("--json", json_path);
    if (!e) e = kiln_bench_check_output("--csv", csv_path);
    if (!e) return 0;
    kiln_bench_fail(bench, NULL, e);
    return 1;
}

int kiln_bench_write_outputs(const kiln_bench_output *o, const char *json_path, const char *csv_path) {
    kiln_error *e;
    if (json_path && (e = write_profile(o, json_path))) {
        kiln_bench_fail(o->bench, "writing profile", e);
        return 1;
    }
    if (csv_path && (e = write_csv(o, csv_path))) {
        kiln_bench_fail(o->bench, "writing CSV", e);
        return 1;
    }
    return 0;
}

int kiln_bench_parse_bytes(const char *s, double lo, double hi, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024.0; break;
        case 'g': case 'G': mul = 1024.0 * 1024.0 * 1024.0; break;
        default: return -1;
        }
        end++;
        if (*end && strcmp(end, "B") && strcmp(end, "iB")) return -1;
    }
    v *= mul;
    if (v < lo || v > hi) return -1;
    *out = (size_t)v;
    return 0;
}

/* ---- stopping on a signal ---- */

static volatile sig_atomic_t bench_stop;

static void on_stop(int sig) { bench_stop = sig; }

void kiln_bench_catch_stops(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int kiln_bench_stop_signal(void) { return (int)bench_stop; }

kiln_error *kiln_bench_interrupted(const char *where) {
    return kiln_errorf(KILN_EIO, "interrupted by signal %d (%s) %s", (int)bench_stop, strsignal((int)bench_stop), where);
}

void kiln_bench_die_of_stop(void) {
    const int sig = (int)bench_stop;
    if (!sig) return;
    signal(sig, SIG_DFL);
    raise(sig);
}
