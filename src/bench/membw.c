/* kiln bench membw: STREAM-style memory bandwidth (copy, scale, add, triad) on the CPU with
 * OpenMP threads, over array sizes from cache-resident to many GB.
 *
 * Each timed sample runs a kernel `reps` times back to back inside one parallel region (static
 * schedule, so every thread touches the same slice each time: its cache for small arrays),
 * with reps chosen so a sample moves at least ~64 MiB; GB/s counts the bytes read plus written
 * (copy, scale: 2 arrays; add, triad: 3) in units of 1e9 bytes per second. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_util.h"
#include "kiln/bench.h"
#include "membw.h"

static const char usage[] =
    "usage: kiln bench membw [options]\n\n"
    "STREAM-style memory bandwidth on the CPU (OpenMP threads): copy c=a, scale b=s*c, add c=a+b,\n"
    "triad a=b+s*c over double arrays from cache-resident to many GB. GB/s counts bytes read + written\n"
    "(copy/scale: 2 arrays, add/triad: 3), 1 GB = 1e9 bytes. --device cuda measures the GPU's HBM.\n\n"
    "  --min SIZE       smallest array, bytes per array, K/M/G suffixes (binary) (default 4K)\n"
    "  --max SIZE       largest array (default 2G; capped so three arrays fit in available memory)\n"
    "  --factor F       size step, multiplicative > 1 (default 2)\n"
    "  --iters N        timed samples per kernel and size; best and average are reported (default 10)\n"
    "  --threads N      OpenMP threads (default: all cores)\n"
    "  --device D       cpu (default) or cuda: GPU 0's STREAM kernels plus host<->device copies from\n"
    "                   pinned memory (h2d, d2h); defaults there: 1M..4G per array, x4, 20 iterations\n"
    "  --json FILE      write the JSON profile (section \"membw\")\n"
    "  --csv FILE       write the numbers as CSV\n";

static const char *const kernel_names[4] = {"copy", "scale", "add", "triad"};


static void fmt_bytes(char *buf, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.4g GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(buf, cap, "%.4g MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(buf, cap, "%.4g KiB", b / 1024.0);
    else snprintf(buf, cap, "%.0f B", b);
}

/* One timed sample: `reps` runs of kernel k over n doubles; returns seconds. */
static double run_kernel(int k, double *a, double *b, double *c, int64_t n, int64_t reps, double s) {
    double t0 = kiln_bench_now_s();
#pragma omp parallel
    {
        for (int64_t r = 0; r < reps; r++) {
            switch (k) {
            case 0:
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < n; i++) c[i] = a[i];
                break;
            case 1:
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < n; i++) b[i] = s * c[i];
                break;
            case 2:
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < n; i++) c[i] = a[i] + b[i];
                break;
            default:
#pragma omp for schedule(static) nowait
                for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
                break;
            }
            __asm__ __volatile__("" ::: "memory"); /* keep every repetition */
        }
    }
    return kiln_bench_now_s() - t0;
}

typedef struct {
    int kernel;
    size_t bytes;
    double best_s, avg_s, moved; /* per sample: bytes moved = reps * arrays * bytes */
} result;

/* Records and CSV rows: one per size and kernel. */
typedef struct {
    const result *res;
    int threads;
} membw_out;

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const membw_out *o = ctx;
    const result *R = &o->res[i];
    cJSON_AddStringToObject(r, "device", "cpu");
    cJSON_AddStringToObject(r, "kernel", kernel_names[R->kernel]);
    cJSON_AddNumberToObject(r, "bytes_per_array", (double)R->bytes);
    cJSON_AddNumberToObject(r, "threads", o->threads);
    cJSON_AddNumberToObject(r, "gbs_best", R->moved / R->best_s / 1e9);
    cJSON_AddNumberToObject(r, "gbs_avg", R->moved / R->avg_s / 1e9);
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const membw_out *o = ctx;
    const result *R = &o->res[i];
    fprintf(f, "cpu,%s,%zu,%d,%.6g,%.6g\n", kernel_names[R->kernel], R->bytes, o->threads,
            R->moved / R->best_s / 1e9, R->moved / R->avg_s / 1e9);
}

/* The flags of both devices, over the device's defaults (--device is read first: cuda starts at 1M..4G per array, x4,
 * 20 iterations). Returns -1, or the exit status (help, usage errors). */
static int parse_opts(int argc, char **argv, membw_opts *o) {
    *o = (membw_opts){4096, (size_t)2 << 30, 2, 10, 0, NULL, NULL, 0};
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device")) {
            o->cuda = !strcmp(argv[i + 1], "cuda");
            if (!o->cuda && strcmp(argv[i + 1], "cpu"))
                return kiln_bench_usage_err("membw", "--device '%s': expected cpu or cuda", argv[i + 1]);
        }
    if (o->cuda) o->min_b = 1 << 20, o->max_b = (size_t)4 << 30, o->factor = 4, o->iters = 20;
    static const char *const valued[] = {"--device", "--min",     "--max",  "--factor",
                                         "--iters",  "--threads", "--json", "--csv",    NULL};
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "membw", usage, valued, &a, &v);
        if (r >= 0) return r;
        char *end;
        if (!strcmp(a, "--device")) {
            continue; /* read above */
        } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
            if (kiln_bench_parse_bytes(v, 64, 1e15, !strcmp(a, "--min") ? &o->min_b : &o->max_b))
                return kiln_bench_usage_err("membw", "%s '%s': expected a size >= 64 bytes like 4K, 64M, 2G", a, v);
        } else if (!strcmp(a, "--factor")) {
            o->factor = strtod(v, &end);
            if (*end || end == v || !(o->factor > 1.0) || o->factor > 1e6)
                return kiln_bench_usage_err("membw", "--factor '%s': expected a number > 1", v);
        } else if (!strcmp(a, "--iters") || !strcmp(a, "--threads")) {
            if (o->cuda && !strcmp(a, "--threads"))
                return kiln_bench_usage_err("membw", "--threads sets the CPU's threads; --device cuda has none");
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > 1000000)
                return kiln_bench_usage_err("membw", "%s '%s': expected a positive integer", a, v);
            if (!strcmp(a, "--iters")) o->iters = n;
            else o->threads = n;
        } else if (!strcmp(a, "--json")) o->json_path = v;
        else o->csv_path = v;
    }
    if (o->iters > 200) return kiln_bench_usage_err("membw", "--iters %ld: at most 200", o->iters);
    if (o->min_b > o->max_b)
        return kiln_bench_usage_err("membw", "--min (%zu bytes) exceeds --max (%zu bytes)", o->min_b, o->max_b);
    return -1;
}

int kiln_bench_membw_main(int argc, char **argv) {
    membw_opts opt;
    const int r = parse_opts(argc, argv, &opt);
    if (r >= 0) return r;
    if (kiln_bench_check_outputs("membw", opt.json_path, opt.csv_path)) return 1;
    if (opt.cuda) return kiln_bench_membw_gpu(&opt);
    size_t min_b = opt.min_b, max_b = opt.max_b;
    const double factor = opt.factor;
    const long iters = opt.iters, threads = opt.threads;
    const char *json_path = opt.json_path, *csv_path = opt.csv_path;
    double avail = kiln_bench_avail_bytes();
    if (avail > 0 && 3.0 * (double)max_b > 0.8 * avail) {
        size_t cap = (size_t)(0.8 * avail / 3.0) & ~(size_t)4095;
        char want[32], got[32];
        fmt_bytes(want, sizeof want, (double)max_b);
        fmt_bytes(got, sizeof got, (double)cap);
        fprintf(stderr, "kiln bench membw: warning: --max %s per array does not fit in available memory; capped at %s\n",
                want, got);
        max_b = cap;
        if (max_b < min_b) {
            fprintf(stderr, "kiln bench membw: error: not enough memory for --min\n");
            return 1;
        }
    }
    if (threads > 0) omp_set_num_threads((int)threads);
    int nthreads = omp_get_max_threads();

    /* the list of sizes, multiples of 8 bytes, distinct */
    size_t nsizes = 0, cap_sizes = 16;
    size_t *sizes = malloc(cap_sizes * sizeof *sizes);
    if (!sizes) return 1;
    for (double s = (double)min_b; s <= (double)max_b * (1 + 1e-9); s *= factor) {
        size_t b = ((size_t)s + 7) & ~(size_t)7;
        if (b > max_b) b = max_b & ~(size_t)7;
        if (nsizes && sizes[nsizes - 1] >= b) continue;
        if (nsizes == cap_sizes) {
            size_t *ns = realloc(sizes, 2 * cap_sizes * sizeof *sizes);
            if (!ns) { free(sizes); return 1; }
            sizes = ns;
            cap_sizes *= 2;
        }
        sizes[nsizes++] = b;
    }
    if (!nsizes) { free(sizes); return 1; }
    size_t big = sizes[nsizes - 1];
    size_t alloc_b = (big + 63) & ~(size_t)63;
    double *A = aligned_alloc(64, alloc_b), *B = aligned_alloc(64, alloc_b), *C = aligned_alloc(64, alloc_b);
    result *res = calloc(nsizes * 4, sizeof *res);
    if (!A || !B || !C || !res) {
        fprintf(stderr, "kiln bench membw: error: out of memory allocating 3 x %zu bytes\n", alloc_b);
        free(A); free(B); free(C); free(res); free(sizes);
        return 1;
    }
    printf("kiln bench membw: cpu, %d threads, %zu sizes, %ld iterations (GB/s = 1e9 bytes/s, read + written)\n",
           nthreads, nsizes, iters);
    printf("%12s %8s %12s %12s\n", "bytes/array", "kernel", "best GB/s", "avg GB/s");
    const double s = 3.0;
    int bad = 0;
    for (size_t si = 0; si < nsizes; si++) {
        int64_t n = (int64_t)(sizes[si] / sizeof(double));
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            A[i] = 1.0;
            B[i] = 2.0;
            C[i] = 0.0;
        }
        int64_t reps[4];
        for (int k = 0; k < 4; k++) {
            double per = (double)sizes[si] * (k < 2 ? 2 : 3);
            double r = ceil((64.0 * 1024 * 1024) / per);
            reps[k] = r < 1 ? 1 : (int64_t)r;
            result *R = &res[si * 4 + (size_t)k];
            R->kernel = k;
            R->bytes = sizes[si];
            R->best_s = INFINITY;
            R->moved = per * (double)reps[k];
        }
        for (int k = 0; k < 4; k++) run_kernel(k, A, B, C, n, 1, s); /* warm-up, first touch done */
        for (long it = 0; it < iters; it++)
            for (int k = 0; k < 4; k++) {
                double t = run_kernel(k, A, B, C, n, reps[k], s);
                result *R = &res[si * 4 + (size_t)k];
                if (t < R->best_s) R->best_s = t;
                R->avg_s += t / (double)iters;
            }
        /* check as STREAM: replay the warm-up and `iters` cycles on scalars (each kernel is idempotent
         * over its repetitions; a cycle multiplies the values by 15) */
        double ea = 1, eb = 2, ec = 0;
        for (long it = 0; it <= iters; it++) {
            ec = ea;
            eb = s * ec;
            ec = ea + eb;
            ea = eb + s * ec;
        }
        for (int64_t i = 0; i < n; i += 1 + n / 97)
            if (fabs(A[i] - ea) > 1e-12 * fabs(ea) || fabs(B[i] - eb) > 1e-12 * fabs(eb) ||
                fabs(C[i] - ec) > 1e-12 * fabs(ec))
                bad = 1;
        char sz[32];
        fmt_bytes(sz, sizeof sz, (double)sizes[si]);
        for (int k = 0; k < 4; k++) {
            const result *R = &res[si * 4 + (size_t)k];
            printf("%12s %8s %12.2f %12.2f\n", sz, kernel_names[k], R->moved / R->best_s / 1e9,
                   R->moved / R->avg_s / 1e9);
        }
        fflush(stdout);
    }
    free(A); free(B); free(C);
    if (bad) {
        fprintf(stderr, "kiln bench membw: error: kernel results are wrong (memory or compiler fault)\n");
        free(res); free(sizes);
        return 1;
    }
    membw_out out = {res, nthreads};
    const kiln_bench_output o = {"membw", nsizes * 4, &out, json_record, NULL,
                                 "device,kernel,bytes_per_array,threads,gbs_best,gbs_avg\n", csv_row};
    int rc = kiln_bench_write_outputs(&o, json_path, csv_path);
    free(res);
    free(sizes);
    return rc;
}
