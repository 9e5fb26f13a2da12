/* bench/kernel_trace_report.py (the kernel trace's report) on a small trace whose answer is worked out by hand:
 * one window between two runs of the marker kernel, with a 20 us and a 7 us idle gap, two kernels overlapping
 * by 10 us on two streams, a memset, a copy, and a host call inside the first gap. The JSON's numbers and the
 * HTML page's timeline (in headless Chromium) are checked. The GPU side (bench/kernel_trace.c, CUPTI) runs
 * on the GPU machine only. Needs python3, as the report does. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "bench_testutil.h"
#include "kiln/fsutil.h"
#include "test.h"

/* times in ns; the window is (1000, 100000]: wall 99 us */
static const char trace_csv[] =
    "kind,start_ns,end_ns,stream,correlation,...\n"
    "kernel,0,1000,7,1,1,1,1,256,1,1,32,0,adamw_step_kernel\n"
    "kernel,1000,11000,7,2,8,1,1,256,1,1,32,0,gemm_tile_kernel\n"
    "api,12000,30000,1,3,cudaLaunchKernel\n"
    "kernel,31000,61000,7,3,8,1,1,256,1,1,32,0,rmsnorm_bwd_kernel\n"
    "kernel,51000,81000,9,4,8,1,1,256,1,1,32,0,nvjet_sm90_tile\n"
    "memset,81000,83000,7,5,4096\n"
    "memcpy2,83000,83000,7,6,8\n"
    "kernel,90000,100000,7,7,1,1,1,256,1,1,32,0,adamw_step_kernel\n";

static double jnum(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static cJSON *by_name(cJSON *arr, const char *name) {
    cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        cJSON *n = cJSON_GetObjectItem(x, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return x;
    }
    return NULL;
}

TEST(kernel_trace_report_windows_gaps_overlap) {
    if (system("python3 -c 'import json' >/dev/null 2>&1") != 0) {
        test_fail(__FILE__, __LINE__, "python3 is not installed; bench/kernel_trace_report.py needs it");
        return;
    }
    const char *d = test_tmpdir();
    char csv[600], js[600], html[600], cmd[4096];
    snprintf(csv, sizeof csv, "%s", test_join(d, "trace.csv"));
    snprintf(js, sizeof js, "%s", test_join(d, "report.json"));
    snprintf(html, sizeof html, "%s", test_join(d, "report.html"));
    FILE *f = fopen(csv, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(trace_csv, f);
    fclose(f);
    /* the two markers are 89 us apart: runs of markers split at 50 us */
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' --merge-ms 0.05 --steps 1 --json '%s' --html '%s' 2>&1",
             test_src_path("bench/kernel_trace_report.py"), csv, js, html);
    static char out[1 << 14];
    CHECK_MSG(test_run_shell(cmd, out, sizeof out) == 0, "the report failed:\n%s", out);
    CHECK(strstr(out, "window 1 of 1") != NULL);
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(js, &text, &len);
    CHECK_OK(e);
    cJSON *j = text ? cJSON_Parse(text) : NULL, *w = cJSON_GetArrayItem(j, 0);
    CHECK(w != NULL);
    if (w) {
        CHECK(fabs(jnum(w, "wall_ms") - 0.099) < 1e-9);
        CHECK(fabs(jnum(w, "busy_ms") - 0.072) < 1e-9);  /* 10 + (31..83) 52 + 10 */
        CHECK(fabs(jnum(w, "idle_ms") - 0.027) < 1e-9);  /* the 20 us and 7 us gaps */
        CHECK(jnum(w, "gaps_over_5us") == 2);
        CHECK(fabs(jnum(w, "summed_ms") - 0.082) < 1e-9); /* 10 + 30 + 30 + 2 + 0 + 10 */
        CHECK(fabs(jnum(w, "overlap_ms") - 0.010) < 1e-9);
        cJSON *g = cJSON_GetArrayItem(cJSON_GetObjectItem(w, "longest_gaps"), 0);
        CHECK(g && fabs(jnum(g, "us") - 20.0) < 1e-9 && fabs(jnum(g, "at_ms") - 0.010) < 1e-9);
        cJSON *host = g ? cJSON_GetObjectItem(g, "host") : NULL;
        CHECK(cJSON_GetArraySize(host) == 1 && strstr(cJSON_GetArrayItem(host, 0)->valuestring, "cudaLaunchKernel 18.0"));
        cJSON *cats = cJSON_GetObjectItem(w, "categories"), *gemm = by_name(cats, "GEMM"), *norms = by_name(cats, "norms");
        CHECK(gemm && fabs(jnum(gemm, "ms") - 0.040) < 1e-9 && jnum(gemm, "calls") == 2);
        CHECK(norms && fabs(jnum(norms, "ms") - 0.030) < 1e-9);
        cJSON *opt = by_name(cats, "optimizer");
        CHECK(opt && fabs(jnum(opt, "ms") - 0.010) < 1e-9); /* the window's own marker, not the one before it */
        cJSON *ks = cJSON_GetObjectItem(w, "kernels");
        CHECK(cJSON_GetArraySize(ks) == 6); /* 4 kernels, the memset, the copy */
        cJSON *ms = by_name(ks, "memset 4096 B"), *cp = by_name(ks, "memcpy kind 2"); /* by size, by kind */
        CHECK(ms && jnum(ms, "calls") == 1 && fabs(jnum(ms, "ms") - 0.002) < 1e-9);
        CHECK(cp && jnum(cp, "calls") == 1);
    }
    cJSON_Delete(j);
    free(text);
    /* the page: one timeline, a bar per record (6), idle gaps marked (2), no console errors */
    char *t = NULL, *l = NULL;
    int rc = test_chromium_dom(html, &t, &l);
    CHECK_MSG(rc == 0, "chromium --dump-dom exited with %d", rc);
    if (t) {
        CHECK(count_sub(t, "<svg") == 1);
        CHECK_MSG(count_sub(t, "class=\"rec\"") == 6, "%zu bars, want 6", count_sub(t, "class=\"rec\""));
        CHECK_MSG(count_sub(t, "class=\"gap\"") == 2, "%zu gaps, want 2", count_sub(t, "class=\"gap\""));
        CHECK(strstr(t, "wall 0.10 ms, GPU busy 0.07 ms, idle 0.03 ms (2 gaps over 5 us: 0.03 ms)") != NULL);
        CHECK(strstr(t, "rmsnorm_bwd_kernel: 30.0 us at 0.030 ms") != NULL);
    }
    if (l) CHECK_MSG(!strstr(l, "Uncaught") && !strstr(l, "net::ERR_"), "console errors in the page:\n%s", l);
    free(t);
    free(l);
}
