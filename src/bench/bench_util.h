/* Pieces every `kiln bench` CLI shares (internal to src/bench): the flag loop, usage and error
 * messages ("kiln bench NAME: error: ..."), integer flags, timing and memory helpers, the deterministic
 * fill of the kernel benchmarks, and writing the JSON profile and the CSV file. */
#ifndef KILN_BENCH_UTIL_H
#define KILN_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "kiln/error.h"

/* ---- flags and messages ---- */

/* One step of the flag loop: argv[*i] is -h/--help (usage to stdout, returns 0), else it must be one
 * of the NULL-terminated `valued` (else "unknown option" and the usage on stderr, returns 2) and have
 * a value (else returns 2). On success sets *flag and *val, moves *i to the value, returns -1. */
int kiln_bench_flag(int argc, char **argv, int *i, const char *bench, const char *usage, const char *const *valued,
                    const char **flag, const char **val);
/* "kiln bench BENCH: error: unknown option 'OPT'", a blank line and the usage on stderr; returns 2. */
int kiln_bench_unknown_option(const char *bench, const char *opt, const char *usage);
/* "kiln bench BENCH: error: MESSAGE\n" on stderr; returns 2 (the usage error exit code). */
int kiln_bench_usage_err(const char *bench, const char *fmt, ...) KILN_PRINTF(2, 3);
/* "kiln bench BENCH: error: [WHAT: ]MESSAGE\n" on stderr for e, which is freed. */
void kiln_bench_fail(const char *bench, const char *what, kiln_error *e);
/* A decimal integer in lo..hi for flag; else "FLAG 'V': expected an integer in LO..HI" and returns 2.
 * Returns -1 on success. */
int kiln_bench_parse_int(const char *bench, const char *flag, const char *v, long long lo, long long hi,
                         long long *out);
/* "4K", "64M", "1.5G", "4096", "64MiB" (binary suffixes) -> bytes in lo..hi; 0 on success, -1 otherwise. */
int kiln_bench_parse_bytes(const char *s, double lo, double hi, size_t *out);
/* OpenBLAS and OpenMP threads, when n > 0. */
void kiln_bench_set_threads(long long n);

/* ---- measuring ---- */

double kiln_bench_now_s(void); /* CLOCK_MONOTONIC seconds */
/* MemAvailable in bytes (else available physical pages; 0 if unknown). */
double kiln_bench_avail_bytes(void);
/* Deterministic values in [-scale, scale). */
void kiln_bench_fill(float *x, int64_t n, uint32_t salt, float scale);
/* Whether a sample of x (every 1 + n/211-th value and the last) is finite. */
int kiln_bench_all_finite(const float *x, int64_t n);

/* ---- the kernel benchmarks' two passes ---- */

extern const char *const kiln_bench_pass_names[2]; /* "fwd", "fwd_bwd" */
/* The table's columns per pass: " | fwd ms <unit> tok/s | f+b ms <unit> tok/s\n" and a row's
 * matching numbers (the rate in units of `scale` FLOP/s with `prec` decimals). */
void kiln_bench_pass_header(const char *unit);
void kiln_bench_pass_row(const double us[2], const double flops[2], double tokens, double scale, int prec);

/* ---- stopping on a signal ---- */

/* SIGINT (Ctrl-C), SIGTERM (what mpirun sends its ranks on Ctrl-C) and SIGHUP set a flag instead of killing the
 * process, so that a benchmark stops at its next safe point, cleans up and keeps what it measured; a second
 * signal kills at once (SA_RESETHAND). */
void kiln_bench_catch_stops(void);
/* The signal caught since kiln_bench_catch_stops, 0 if none. */
int kiln_bench_stop_signal(void);
/* "interrupted by signal N (NAME) WHERE" */
kiln_error *kiln_bench_interrupted(const char *where);
/* When a signal was caught: its default action restored and the signal raised again, so that the process dies of
 * it, as the shell (and mpirun) expect of an interrupted program. Returns when none was caught. */
void kiln_bench_die_of_stop(void);

/* ---- outputs ---- */

typedef struct {
    const char *bench; /* the profile's "bench", its section and the error messages' name */
    size_t n;          /* records */
    const void *ctx;
    void (*json_record)(cJSON *r, size_t i, const void *ctx); /* fill record i */
    void (*json_extra)(cJSON *profile, const void *ctx);      /* after the records; may be NULL */
    const char *csv_header;                                   /* the first line, with its newline */
    void (*csv_row)(FILE *f, size_t i, const void *ctx);      /* print row i, with its newline */
} kiln_bench_output;

/* Whether `path` (the value of `flag`) can be written by the atomic writer: not a directory, and its directory
 * exists and takes a new file (a probe file is created there and removed). Run before a benchmark, so that an
 * unwritable --json or --csv fails at once, not after the whole run has been measured and lost. */
kiln_error *kiln_bench_check_output(const char *flag, const char *path);
/* Both outputs (each when not NULL): on an error prints "kiln bench BENCH: error: ..." and returns 1; else 0. */
int kiln_bench_check_outputs(const char *bench, const char *json_path, const char *csv_path);

/* The JSON profile to json_path, then the CSV to csv_path (each when not NULL; both atomic). On an
 * error prints "kiln bench BENCH: error: writing profile: ..." (or "writing CSV: ") and returns 1;
 * the CSV is not written after a failed profile. Returns 0 on success. */
int kiln_bench_write_outputs(const kiln_bench_output *o, const char *json_path, const char *csv_path);

#endif
