/* kiln bench membw --device cuda: STREAM copy/scale/add/triad on GPU 0 and host<->device copies
 * from pinned memory, over a size sweep like the CPU benchmark's (src/bench/membw.c parses the flags
 * for both); the same outputs: a table, the JSON profile's "membw" section, the CSV. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"
#include "membw.h"

static const char *const kernels[] = {"copy", "copy_sm", "scale", "add", "triad", "h2d", "d2h"};
enum { NK = 7, NDEV = 5 }; /* the first NDEV run on the device, the rest are host<->device */

typedef struct {
    int kernel;
    size_t bytes;
    double best, avg; /* GB/s */
} row;

typedef struct {
    const row *rows;
    const kiln_cuda_info *gpu;
} gpu_out;

/* "cuda" for the device's kernels; a copy between host and device is named by its direction */
static const char *row_device(const row *R) { return R->kernel < NDEV ? "cuda" : kernels[R->kernel]; }
static const char *row_kernel(const row *R) { return R->kernel < NDEV ? kernels[R->kernel] : "copy"; }

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const row *R = &((const gpu_out *)ctx)->rows[i];
    cJSON_AddStringToObject(r, "device", row_device(R));
    cJSON_AddStringToObject(r, "kernel", row_kernel(R));
    cJSON_AddNumberToObject(r, "bytes_per_array", (double)R->bytes);
    cJSON_AddNumberToObject(r, "threads", 0);
    cJSON_AddNumberToObject(r, "gbs_best", R->best);
    cJSON_AddNumberToObject(r, "gbs_avg", R->avg);
}

static void json_machine(cJSON *profile, const void *ctx) {
    const kiln_cuda_info *gi = ((const gpu_out *)ctx)->gpu;
    cJSON *m = cJSON_GetObjectItemCaseSensitive(profile, "machine");
    cJSON_AddStringToObject(m, "gpu", gi->name);
    cJSON_AddNumberToObject(m, "gpu_sms", gi->sms);
    cJSON_AddNumberToObject(m, "gpu_memory_gib", gi->memory_gib);
    cJSON_AddNumberToObject(m, "cuda_driver", gi->driver_version);
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const row *R = &((const gpu_out *)ctx)->rows[i];
    fprintf(f, "%s,%s,%zu,0,%.6g,%.6g\n", row_device(R), row_kernel(R), R->bytes, R->best, R->avg);
}

int kiln_bench_membw_gpu(const membw_opts *o) {
    kiln_cuda_info gi;
    kiln_error *e = kiln_cuda_device_info(&gi);
    if (e) {
        kiln_bench_fail("membw", NULL, e);
        return 1;
    }
    size_t nsizes = 0;
    for (double s = (double)o->min_b; s <= (double)o->max_b * (1 + 1e-9); s *= o->factor) nsizes++;
    row *rows = calloc(nsizes * NK + 1, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "kiln bench membw: error: out of memory\n");
        return 1;
    }
    printf("kiln bench membw: %s (%d SMs, %.0f GiB), %ld iterations (GB/s = 1e9 bytes/s, read + written)\n", gi.name,
           gi.sms, gi.memory_gib, o->iters);
    printf("%14s %8s %12s %12s\n", "bytes/array", "kernel", "best GB/s", "avg GB/s");
    size_t n = 0;
    int rc = 0;
    for (double s = (double)o->min_b; !rc && n < nsizes * NK && s <= (double)o->max_b * (1 + 1e-9); s *= o->factor) {
        const size_t b = (size_t)s & ~(size_t)15;
        for (int k = 0; k < NK; k++) {
            row *R = &rows[n];
            e = k < NDEV ? kiln_cuda_membw(kernels[k], b, (int)o->iters, &R->best, &R->avg)
                         : kiln_cuda_hostbw(k - NDEV, b, (int)o->iters, &R->best, &R->avg);
            if (e) {
                kiln_bench_fail("membw", NULL, e);
                rc = 1;
                break;
            }
            R->kernel = k, R->bytes = b, n++;
            printf("%14zu %8s %12.1f %12.1f\n", b, kernels[k], R->best, R->avg);
        }
        fflush(stdout);
    }
    if (!rc) {
        const gpu_out out = {rows, &gi};
        const kiln_bench_output w = {"membw", n, &out, json_record, json_machine,
                                     "device,kernel,bytes_per_array,threads,gbs_best,gbs_avg\n", csv_row};
        rc = kiln_bench_write_outputs(&w, o->json_path, o->csv_path);
    }
    free(rows);
    return rc;
}
