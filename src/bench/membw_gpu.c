/* kiln bench membw --device cuda: STREAM copy/scale/add/triad on GPU 0 and host<->device copies
 * from pinned memory, over the same size sweep as the CPU benchmark (src/bench/membw.c), whose
 * flags it shares: --min --max --factor --iters --json --csv. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"

int kiln_bench_membw_gpu(int argc, char **argv) {
    size_t min_b = 1 << 20, max_b = (size_t)4 << 30;
    double factor = 4;
    long iters = 20;
    const char *json_path = NULL, *csv_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "kiln bench membw: error: %s needs a value\n", a);
            return 2;
        }
        i++;
        int bad = 0;
        if (!strcmp(a, "--device")) continue;
        else if (!strcmp(a, "--min")) bad = kiln_bench_parse_bytes(v, 64, 1e15, &min_b);
        else if (!strcmp(a, "--max")) bad = kiln_bench_parse_bytes(v, 64, 1e15, &max_b);
        else if (!strcmp(a, "--factor")) bad = !((factor = atof(v)) > 1);
        else if (!strcmp(a, "--iters")) bad = (iters = atol(v)) < 1;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else bad = 1;
        if (bad) {
            fprintf(stderr, "kiln bench membw: error: bad option or value: %s %s (see --help)\n", a, v);
            return 2;
        }
    }
    kiln_cuda_info gi;
    kiln_error *e = kiln_cuda_device_info(&gi);
    if (e) {
        fprintf(stderr, "kiln bench membw: error: %s\n", kiln_error_msg(e));
        kiln_error_free(e);
        return 1;
    }
    printf("kiln bench membw: %s (%d SMs, %.0f GiB), %ld iterations (GB/s = 1e9 bytes/s, read + written)\n", gi.name,
           gi.sms, gi.memory_gib, iters);
    printf("%14s %8s %12s %12s\n", "bytes/array", "kernel", "best GB/s", "avg GB/s");
    cJSON *p = kiln_profile_new("membw"), *sec = p ? kiln_profile_section(p, "membw") : NULL;
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv) fprintf(csv, "device,kernel,bytes_per_array,threads,gbs_best,gbs_avg\n");
    static const char *const kernels[] = {"copy", "copy_sm", "scale", "add", "triad", "h2d", "d2h"};
    enum { NK = 7, NDEV = 5 }; /* the first NDEV run on the device, the rest are host<->device */
    int rc = 0;
    for (double s = (double)min_b; !rc && s <= (double)max_b * (1 + 1e-9); s *= factor) {
        size_t b = (size_t)s & ~(size_t)15;
        for (int k = 0; k < NK && !rc; k++) {
            double best = 0, avg = 0;
            e = k < NDEV ? kiln_cuda_membw(kernels[k], b, (int)iters, &best, &avg)
                         : kiln_cuda_hostbw(k - NDEV, b, (int)iters, &best, &avg);
            if (e) {
                fprintf(stderr, "kiln bench membw: error: %s\n", kiln_error_msg(e));
                kiln_error_free(e);
                rc = 1;
                break;
            }
            printf("%14zu %8s %12.1f %12.1f\n", b, kernels[k], best, avg);
            const char *dev = k < NDEV ? "cuda" : kernels[k];
            if (sec) {
                cJSON *r = cJSON_CreateObject();
                cJSON_AddStringToObject(r, "device", dev);
                cJSON_AddStringToObject(r, "kernel", k < NDEV ? kernels[k] : "copy");
                cJSON_AddNumberToObject(r, "bytes_per_array", (double)b);
                cJSON_AddNumberToObject(r, "threads", 0);
                cJSON_AddNumberToObject(r, "gbs_best", best);
                cJSON_AddNumberToObject(r, "gbs_avg", avg);
                cJSON_AddItemToArray(sec, r);
            }
            if (csv) fprintf(csv, "%s,%s,%zu,0,%.6g,%.6g\n", dev, k < NDEV ? kernels[k] : "copy", b, best, avg);
        }
    }
    if (csv) fclose(csv);
    if (!rc && json_path && p) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(p, "machine");
        cJSON_AddStringToObject(m, "gpu", gi.name);
        cJSON_AddNumberToObject(m, "gpu_sms", gi.sms);
        cJSON_AddNumberToObject(m, "gpu_memory_gib", gi.memory_gib);
        cJSON_AddNumberToObject(m, "cuda_driver", gi.driver_version);
        e = kiln_profile_write(p, json_path);
        if (e) {
            fprintf(stderr, "kiln bench membw: error: %s\n", kiln_error_msg(e));
            kiln_error_free(e);
            rc = 1;
        }
    }
    cJSON_Delete(p);
    return rc;
}
