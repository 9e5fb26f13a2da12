/* kiln bench membw's options, shared by its CPU (membw.c) and GPU (membw_gpu.c) halves: one flag parser, one set of
 * outputs (the JSON profile's "membw" section and the CSV, written atomically). */
#ifndef KILN_BENCH_MEMBW_H
#define KILN_BENCH_MEMBW_H

#include <stddef.h>

typedef struct {
    size_t min_b, max_b; /* bytes per array */
    double factor;       /* size step */
    long iters, threads; /* threads: the CPU's (0: all cores) */
    const char *json_path, *csv_path;
    int cuda; /* --device cuda */
} membw_opts;

/* GPU 0's STREAM kernels and host<->device copies over the sizes of o; the exit status */
int kiln_bench_membw_gpu(const membw_opts *o);

#endif
