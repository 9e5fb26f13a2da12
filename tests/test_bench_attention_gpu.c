/* kiln bench attention --device cuda: on a machine without a GPU (the CI machine) it fails cleanly,
 * exit status 1 and "kiln bench attention: error: ..." naming the device, and writes no profile; with a
 * GPU a tiny run succeeds and its JSON records say device cuda, bf16, one pair per implementation (kiln's
 * kernels, then cuDNN's). A bad --device or --impl is a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/cuda.h"
#include "kiln/fsutil.h"
#include "test.h"

TEST(bench_attention_device_cuda) {
    int ngpu = 0;
    kiln_error *e = kiln_cuda_device_count(&ngpu);
    if (e) kiln_error_free(e), ngpu = 0;
    char json[1024], args[2048], out[16384];
    snprintf(json, sizeof json, "%s/attention_cuda.json", test_tmpdir());
    snprintf(args, sizeof args,
             "bench attention --device cuda --seq 40 --heads 2 --kv-heads 1 --head-dim 32 --iters 1 --warmup 0 "
             "--json '%s'",
             json);
    int rc = test_run_kiln(args, out, sizeof out);
    if (ngpu == 0) {
        CHECK_MSG(rc == 1, "exit status %d without a GPU (want 1); output:\n%s", rc, out);
        CHECK_MSG(strstr(out, "kiln bench attention: error: --device cuda: ") != NULL, "output:\n%s", out);
        CHECK(access(json, F_OK) != 0);
        return;
    }
    CHECK_MSG(rc == 0, "exit status %d; output:\n%s", rc, out);
    char *txt = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(json, &txt, &len));
    cJSON *p = txt ? cJSON_Parse(txt) : NULL;
    const cJSON *sec = p ? cJSON_GetObjectItemCaseSensitive(p, "attention") : NULL;
    CHECK(cJSON_GetArraySize(sec) == 4); /* own, then cudnn (kiln's kernels again where cuDNN is missing) */
    const cJSON *r;
    cJSON_ArrayForEach(r, sec) {
        const char *dev = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "device"));
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "dtype"));
        const cJSON *us = cJSON_GetObjectItemCaseSensitive(r, "time_us");
        const char *be = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "backend"));
        CHECK(dev && !strcmp(dev, "cuda"));
        CHECK(be && (!strcmp(be, "cuda") || !strcmp(be, "cudnn")));
        CHECK(dt && !strcmp(dt, "bf16"));
        CHECK(cJSON_IsNumber(us) && us->valuedouble > 0);
    }
    cJSON_Delete(p);
    free(txt);
}

TEST(bench_attention_device_usage) {
    char out[4096];
    CHECK(test_run_kiln("bench attention --device tpu", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "--device 'tpu': expected cpu or cuda") != NULL, "output:\n%s", out);
}

TEST(bench_attention_impl_usage) {
    char out[4096];
    CHECK(test_run_kiln("bench attention --device cuda --impl flash", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "--impl 'flash': expected a list of own, cudnn, cudnn-nondet") != NULL, "output:\n%s", out);
    CHECK(test_run_kiln("bench attention --device cuda --impl own,,cudnn", out, sizeof out) == 2);
    CHECK(test_run_kiln("bench attention --impl own", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "--impl needs --device cuda") != NULL, "output:\n%s", out);
}
