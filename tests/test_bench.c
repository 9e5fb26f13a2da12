/* kiln bench membw, gemm and report: profiles, FLOP counts, the range parser, the model's GEMM
 * shapes, and the HTML report (also rendered in headless Chromium). */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench/gemm_shapes.h"
#include "kiln/bench.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/zaya.h"
#include "bench_testutil.h"
#include "test.h"

/* ---- membw ---- */

TEST(bench_membw_profile) {
    const char *d = test_tmpdir();
    char json[512], csv[512];
    snprintf(json, sizeof json, "%s", test_join(d, "membw.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "membw.csv"));
    const char *args[] = {"membw", "--min", "4K", "--max", "64K", "--iters", "2", "--threads", "2",
                          "--json", json, "--csv", csv, NULL};
    CHECK(run_main(kiln_bench_membw_main, args) == 0);
    cJSON *p = load_json(json);
    if (!p) return;
    CHECK(num(p, "kiln_profile") == KILN_PROFILE_VERSION);
    CHECK(!strcmp(str(p, "bench"), "membw"));
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(p, "machine")));
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "membw");
    CHECK(cJSON_IsArray(sec));
    CHECK_MSG(cJSON_GetArraySize(sec) == 5 * 4, "records: %d, want 20 (5 sizes x 4 kernels)", cJSON_GetArraySize(sec));
    const char *kernels[4] = {"copy", "scale", "add", "triad"};
    int seen[4][5] = {{0}};
    const cJSON *r;
    cJSON_ArrayForEach(r, sec) {
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(str(r, "kernel"), kernels[i])) k = i;
        CHECK_MSG(k >= 0, "kernel '%s'", str(r, "kernel"));
        double b = num(r, "bytes_per_array");
        int si = b == 4096 ? 0 : b == 8192 ? 1 : b == 16384 ? 2 : b == 32768 ? 3 : b == 65536 ? 4 : -1;
        CHECK_MSG(si >= 0, "bytes_per_array %g", b);
        if (k >= 0 && si >= 0) seen[k][si]++;
        CHECK(!strcmp(str(r, "device"), "cpu"));
        CHECK(num(r, "threads") == 2);
        CHECK_MSG(num(r, "gbs_best") > 0 && num(r, "gbs_avg") > 0, "%s: best %g avg %g", str(r, "kernel"),
                  num(r, "gbs_best"), num(r, "gbs_avg"));
        CHECK(num(r, "gbs_best") >= num(r, "gbs_avg") * 0.999);
    }
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < 5; s++) CHECK_MSG(seen[k][s] == 1, "%s size %d seen %d times", kernels[k], s, seen[k][s]);
    cJSON_Delete(p);
    CHECK_CSV(csv, "device,kernel,bytes_per_array,threads,gbs_best,gbs_avg\n", 21, "cpu,triad,65536,2,");
    /* usage errors */
    const char *bad1[] = {"membw", "--min", "4X", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad1) == 2);
    const char *bad2[] = {"membw", "--factor", "1", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad2) == 2);
    const char *bad3[] = {"membw", "--min", "1M", "--max", "64K", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad3) == 2);
    const char *bad4[] = {"membw", "--bogus", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad4) == 2);
    /* --device cuda parses the same flags the same way (before it looks for a GPU) */
    const char *bad5[] = {"membw", "--device", "cuda", "--factor", "nan", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad5) == 2);
    const char *bad6[] = {"membw", "--device", "cuda", "--iters", "1000", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad6) == 2);
    const char *bad7[] = {"membw", "--device", "cuda", "--threads", "2", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad7) == 2);
    const char *bad8[] = {"membw", "--device", "tpu", NULL};
    CHECK(run_main(kiln_bench_membw_main, bad8) == 2);
}

/* ---- gemm ---- */

TEST(bench_gemm_flops) {
    CHECK(kiln_gemm_flops(2, 3, 4) == 48.0);
    CHECK(kiln_gemm_flops(1, 1, 1) == 2.0);
    CHECK(kiln_gemm_flops(65536, 65536, 65536) == 2.0 * 65536.0 * 65536.0 * 65536.0); /* no int overflow */
    CHECK(kiln_gemm_flops(4096, 1024, 512) == 2.0 * 4096 * 1024 * 512);
}

static void expect_dims(const char *spec, const int64_t *want, size_t nwant) {
    int64_t *v = NULL;
    size_t n = 0;
    kiln_error *e = kiln_gemm_parse_dims(spec, "-m", &v, &n);
    if (e) {
        test_fail(__FILE__, __LINE__, "'%s': %s", spec, kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    CHECK_MSG(n == nwant, "'%s': %zu values, want %zu", spec, n, nwant);
    for (size_t i = 0; i < n && i < nwant; i++)
        CHECK_MSG(v[i] == want[i], "'%s'[%zu] = %lld, want %lld", spec, i, (long long)v[i], (long long)want[i]);
    free(v);
}

TEST(bench_gemm_parse_dims) {
    expect_dims("512", (int64_t[]){512}, 1);
    expect_dims("512,1024", (int64_t[]){512, 1024}, 2);
    expect_dims("256:4096:x2", (int64_t[]){256, 512, 1024, 2048, 4096}, 5);
    expect_dims("100:1000:x3", (int64_t[]){100, 300, 900}, 3);
    expect_dims("1,8:32:x2,7", (int64_t[]){1, 8, 16, 32, 7}, 5);
    int64_t plus8[33];
    for (int i = 0; i < 33; i++) plus8[i] = 2048 + 8 * i;
    expect_dims("2048:2304:+8", plus8, 33);
    expect_dims("10:12:+5", (int64_t[]){10}, 1);
    int64_t *v = NULL;
    size_t n = 0;
    const char *bad[] = {"", "abc", "1,,2", "0", "-5", "12a", "4:2:x2", "1:8:x1", "1:8:+0", "1:8", "1:8:y2",
                         "1:8:x", "1:8:+", ":8:x2", "2097152", "1:9999999999:+1", "1,", "1:1048576:+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_error *e = kiln_gemm_parse_dims(bad[i], "-m", &v, &n);
        CHECK_MSG(e != NULL, "'%s' accepted", bad[i]);
        if (e) {
            CHECK_MSG(strstr(kiln_error_msg(e), "-m") != NULL, "'%s': error '%s' does not name the flag", bad[i],
                      kiln_error_msg(e));
            kiln_error_free(e);
        }
        CHECK(v == NULL && n == 0);
    }
    CHECK_ERR(kiln_gemm_parse_dims("4:2:x2", "-k", &v, &n), "START exceeds END");
    CHECK_ERR(kiln_gemm_parse_dims("1:8:x1", "-n", &v, &n), "factor must be >= 2");
}

TEST(bench_gemm_small_shapes) {
    const char *d = test_tmpdir();
    char json[512], csv[512];
    snprintf(json, sizeof json, "%s", test_join(d, "gemm.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "gemm.csv"));
    const char *args[] = {"gemm", "-m", "32,64", "-n", "48", "-k", "16:32:x2", "--iters", "2", "--warmup", "1",
                          "--threads", "1", "--json", json, "--csv", csv, NULL};
    CHECK(run_main(kiln_bench_gemm_main, args) == 0);
    cJSON *p = load_json(json);
    if (!p) return;
    CHECK(num(p, "kiln_profile") == KILN_PROFILE_VERSION);
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "gemm");
    CHECK(cJSON_GetArraySize(sec) == 4);
    int64_t want[4][3] = {{32, 48, 16}, {32, 48, 32}, {64, 48, 16}, {64, 48, 32}};
    int i = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, sec) {
        if (i < 4) {
            CHECK(num(r, "m") == want[i][0] && num(r, "n") == want[i][1] && num(r, "k") == want[i][2]);
            double flops = kiln_gemm_flops(want[i][0], want[i][1], want[i][2]);
            CHECK_NEAR(num(r, "tflops"), flops / (num(r, "time_us") * 1e-6) / 1e12, 1e-9 * num(r, "tflops") + 1e-15);
        }
        CHECK(!strcmp(str(r, "backend"), "openblas"));
        CHECK(!strcmp(str(r, "dtype"), "fp32"));
        CHECK(num(r, "count") == 1);
        CHECK(num(r, "time_us") > 0 && num(r, "tflops") > 0);
        i++;
    }
    cJSON_Delete(p);
    CHECK_CSV(csv, "backend,dtype,m,n,k,layout,label,count,time_us,tflops\n", 5, NULL);

    /* -n and -k left out: square shapes; a sweep of k with m, n fixed */
    const char *sq[] = {"gemm", "-m", "8,16", "--iters", "1", "--json", json, NULL};
    CHECK(run_main(kiln_bench_gemm_main, sq) == 0);
    if ((p = load_json(json))) {
        sec = cJSON_GetObjectItemCaseSensitive(p, "gemm");
        CHECK(cJSON_GetArraySize(sec) == 2);
        const cJSON *r1 = cJSON_GetArrayItem(sec, 1);
        CHECK(num(r1, "m") == 16 && num(r1, "n") == 16 && num(r1, "k") == 16);
        cJSON_Delete(p);
    }
    const char *sw[] = {"gemm", "--sweep", "k=16:32:+8", "-m", "8", "-n", "24", "--iters", "1", "--json", json, NULL};
    CHECK(run_main(kiln_bench_gemm_main, sw) == 0);
    if ((p = load_json(json))) {
        sec = cJSON_GetObjectItemCaseSensitive(p, "gemm");
        CHECK(cJSON_GetArraySize(sec) == 3);
        for (int j = 0; j < 3; j++) {
            const cJSON *rj = cJSON_GetArrayItem(sec, j);
            CHECK(num(rj, "m") == 8 && num(rj, "n") == 24 && num(rj, "k") == 16 + 8 * j);
        }
        cJSON_Delete(p);
    }
    const char *bad1[] = {"gemm", "--dtype", "bf16", NULL};
    CHECK(run_main(kiln_bench_gemm_main, bad1) == 2);
    const char *bad2[] = {"gemm", "-m", "1:8:x1", NULL};
    CHECK(run_main(kiln_bench_gemm_main, bad2) == 2);
    const char *bad3[] = {"gemm", "--sweep", "q=1:8:x2", NULL};
    CHECK(run_main(kiln_bench_gemm_main, bad3) == 2);
}

/* The small model below, worked out by hand: H=64, Q=4x16=64, KV=2x16=32 (v halves 16), router 16,
 * 4 experts (+ skip = 5 router outputs), top-2, I=32, V=100, 2 layers, tokens 2x16=32, experts see
 * 32*2/4=16 tokens each. Linear (tokens, in, out): fwd [T,in]x[in,out] NT, dX [T,out]x[out,in] NN,
 * dW [out,T]x[T,in] TN. Collisions: q/o (64->64), v_current/v_delayed/router.down (64->16),
 * fc1/fc2. */
static const struct {
    int64_t m, n, k;
    const char *layout;
    int64_t count;
    const char *label_has[3];
} model_expected[] = {
    {32, 64, 64, "NT", 4, {"L*.q_proj fwd", "L*.o_proj fwd", NULL}},
    {32, 64, 64, "NN", 4, {"L*.q_proj dX", "L*.o_proj dX", NULL}},
    {64, 64, 32, "TN", 4, {"L*.q_proj dW", "L*.o_proj dW", NULL}},
    {32, 32, 64, "NT", 2, {"L*.k_proj fwd", NULL, NULL}},
    {32, 64, 32, "NN", 2, {"L*.k_proj dX", NULL, NULL}},
    {32, 64, 32, "TN", 2, {"L*.k_proj dW", NULL, NULL}},
    {32, 16, 64, "NT", 6, {"L*.v_current fwd", "L*.v_delayed fwd", "L*.router.down fwd"}},
    {32, 64, 16, "NN", 6, {"L*.v_current dX", "L*.v_delayed dX", "L*.router.down dX"}},
    {16, 64, 32, "TN", 6, {"L*.v_current dW", "L*.v_delayed dW", "L*.router.down dW"}},
    {32, 16, 16, "NT", 4, {"L*.router.fc1 fwd", "L*.router.fc2 fwd", NULL}},
    {32, 16, 16, "NN", 4, {"L*.router.fc1 dX", "L*.router.fc2 dX", NULL}},
    {16, 16, 32, "TN", 4, {"L*.router.fc1 dW", "L*.router.fc2 dW", NULL}},
    {32, 5, 16, "NT", 2, {"L*.router.out fwd", NULL, NULL}},
    {32, 16, 5, "NN", 2, {"L*.router.out dX", NULL, NULL}},
    {5, 16, 32, "TN", 2, {"L*.router.out dW", NULL, NULL}},
    {16, 64, 64, "NT", 8, {"gate_up fwd", NULL, NULL}},
    {16, 64, 64, "NN", 8, {"gate_up dX", NULL, NULL}},
    {64, 64, 16, "TN", 8, {"gate_up dW", NULL, NULL}},
    {16, 64, 32, "NT", 8, {"down fwd", NULL, NULL}},
    {16, 32, 64, "NN", 8, {"down dX", NULL, NULL}},
    {64, 32, 16, "TN", 8, {"down dW", NULL, NULL}},
    {32, 100, 64, "NT", 1, {"lm_head fwd", NULL, NULL}},
    {32, 64, 100, "NN", 1, {"lm_head dX", NULL, NULL}},
    {100, 64, 32, "TN", 1, {"lm_head dW", NULL, NULL}},
};
#define NMODEL (sizeof model_expected / sizeof model_expected[0])

static const char small_model[] =
    "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 32, \"router_hidden_size\": 16";

static void check_model_shapes(const kiln_gemm_shape *s, size_t n) {
    CHECK_MSG(n == NMODEL, "%zu shapes, want %zu", n, NMODEL);
    double flops = 0, want_flops = 0;
    for (size_t i = 0; i < NMODEL; i++) {
        want_flops += kiln_gemm_flops(model_expected[i].m, model_expected[i].n, model_expected[i].k) *
                      (double)model_expected[i].count;
        int found = 0;
        for (size_t j = 0; j < n; j++) {
            if (s[j].m != model_expected[i].m || s[j].n != model_expected[i].n || s[j].k != model_expected[i].k ||
                strcmp(s[j].layout, model_expected[i].layout))
                continue;
            found++;
            CHECK_MSG(s[j].count == model_expected[i].count, "%lldx%lldx%lld %s: count %lld, want %lld",
                      (long long)s[j].m, (long long)s[j].n, (long long)s[j].k, s[j].layout, (long long)s[j].count,
                      (long long)model_expected[i].count);
            for (int l = 0; l < 3 && model_expected[i].label_has[l]; l++)
                CHECK_MSG(strstr(s[j].label, model_expected[i].label_has[l]) != NULL, "label '%s' lacks '%s'",
                          s[j].label, model_expected[i].label_has[l]);
        }
        CHECK_MSG(found == 1, "shape %lldx%lldx%lld %s found %d times", (long long)model_expected[i].m,
                  (long long)model_expected[i].n, (long long)model_expected[i].k, model_expected[i].layout, found);
    }
    for (size_t j = 0; j < n; j++) flops += kiln_gemm_flops(s[j].m, s[j].n, s[j].k) * (double)s[j].count;
    CHECK(flops == want_flops);
}

TEST(bench_gemm_model_expansion) {
    const char *d = test_tmpdir();
    char train_cfg[512], hf_cfg[512], json[512];
    snprintf(train_cfg, sizeof train_cfg, "%s", test_join(d, "train.json"));
    snprintf(hf_cfg, sizeof hf_cfg, "%s", test_join(d, "config.json"));
    snprintf(json, sizeof json, "%s", test_join(d, "gemm.json"));
    char text[2048];
    int n = snprintf(text, sizeof text, "{\"model\": {%s}, \"data\": {\"seq_len\": 16, \"micro_batch\": 2}}\n",
                     small_model);
    CHECK_OK(kiln_write_file_atomic(train_cfg, text, (size_t)n));
    n = snprintf(text, sizeof text, "{\"model_type\": \"zaya\", %s}\n", small_model);
    CHECK_OK(kiln_write_file_atomic(hf_cfg, text, (size_t)n));

    kiln_gemm_model gm;
    memset(&gm, 0, sizeof gm);
    CHECK_OK(kiln_gemm_model_load(train_cfg, &gm));
    CHECK(gm.is_train_config == 1 && gm.micro_batch == 2 && gm.seq_len == 16);
    kiln_gemm_shape *s = NULL;
    size_t ns = 0;
    CHECK_OK(kiln_gemm_model_shapes(&gm.model, gm.micro_batch * gm.seq_len, &s, &ns));
    if (s) check_model_shapes(s, ns);
    free(s);

    memset(&gm, 0, sizeof gm);
    CHECK_OK(kiln_gemm_model_load(hf_cfg, &gm));
    CHECK(gm.is_train_config == 0 && gm.model.hidden_size == 64 && gm.model.num_experts == 4);
    s = NULL;
    CHECK_OK(kiln_gemm_model_shapes(&gm.model, 32, &s, &ns));
    if (s) check_model_shapes(s, ns);
    free(s);

    /* through the CLI: an HF config with --micro-batch/--seq-len gives the same 24 records */
    const char *args[] = {"gemm", "--model", hf_cfg, "--micro-batch", "2", "--seq-len", "16", "--iters", "1",
                          "--warmup", "0", "--json", json, NULL};
    CHECK(run_main(kiln_bench_gemm_main, args) == 0);
    cJSON *p = load_json(json);
    if (p) {
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "gemm");
        CHECK(cJSON_GetArraySize(sec) == (int)NMODEL);
        double cnt = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, sec) cnt += num(r, "count");
        double want = 0;
        for (size_t i = 0; i < NMODEL; i++) want += (double)model_expected[i].count;
        CHECK(cnt == want);
        CHECK(num(cJSON_GetObjectItemCaseSensitive(p, "gemm_model"), "tokens") == 32);
        cJSON_Delete(p);
    }
    /* a bad config names the file and field */
    char bad[512];
    snprintf(bad, sizeof bad, "%s", test_join(d, "bad.json"));
    CHECK_OK(kiln_write_file_atomic(bad, "{\"model\": {\"hidden_size\": \"x\"}}", 31));
    CHECK_ERR(kiln_gemm_model_load(bad, &gm), "hidden_size");
}

/* ---- report ---- */

static const char synthetic_profile[] =
    "{\"kiln_profile\": 1, \"bench\": \"synthetic\", \"date\": \"2025-01-01T00:00:00Z\",\n"
    " \"machine\": {\"hostname\": \"testhost-42\", \"cpu\": \"Test CPU <9000>\", \"cores\": 2, \"memory_gib\": 7.5},\n"
    " \"libraries\": {\"openblas\": \"OpenBLAS test-config\", \"cjson\": \"1.7.15\"},\n"
    " \"comm\": [\n"
    "  {\"backend\":\"mpi\",\"collective\":\"all_reduce\",\"dtype\":\"float\",\"ranks\":2,\"inplace\":false,\"bytes\":1024,"
    "\"count\":256,\"time_us_min\":10,\"time_us_avg\":11,\"time_us_max\":12,\"algbw_gbs\":0.093,\"busbw_gbs\":0.093,\"wrong\":0},\n"
    "  {\"backend\":\"mpi\",\"collective\":\"all_reduce\",\"dtype\":\"float\",\"ranks\":2,\"inplace\":false,\"bytes\":1048576,"
    "\"count\":262144,\"time_us_min\":200,\"time_us_avg\":210,\"time_us_max\":220,\"algbw_gbs\":4.99,\"busbw_gbs\":4.99,\"wrong\":0},\n"
    "  {\"backend\":\"mpi\",\"collective\":\"all_reduce\",\"dtype\":\"float\",\"ranks\":2,\"inplace\":false,\"bytes\":67108864,"
    "\"count\":16777216,\"time_us_min\":5000,\"time_us_avg\":5400,\"time_us_max\":6000,\"algbw_gbs\":12.4275,\"busbw_gbs\":12.4275,\"wrong\":0},\n"
    "  {\"backend\":\"mpi\",\"collective\":\"all_gather\",\"dtype\":\"float\",\"ranks\":4,\"inplace\":false,\"bytes\":4096,"
    "\"count\":1024,\"time_us_min\":20,\"time_us_avg\":21,\"time_us_max\":23,\"algbw_gbs\":0.195,\"busbw_gbs\":0.14625,\"wrong\":0},\n"
    "  {\"backend\":\"mpi\",\"collective\":\"all_gather\",\"dtype\":\"float\",\"ranks\":4,\"inplace\":false,\"bytes\":16777216,"
    "\"count\":4194304,\"time_us_min\":2000,\"time_us_avg\":2100,\"time_us_max\":2300,\"algbw_gbs\":7.989,\"busbw_gbs\":5.99175,\"wrong\":3}],\n"
    " \"gemm\": [\n"
    "  {\"backend\":\"openblas\",\"dtype\":\"fp32\",\"m\":512,\"n\":512,\"k\":512,\"label\":\"512x512x512\",\"count\":1,\"time_us\":2000,\"tflops\":0.134218},\n"
    "  {\"backend\":\"openblas\",\"dtype\":\"fp32\",\"m\":1024,\"n\":4096,\"k\":256,\"label\":\"L*.q_proj fwd\",\"count\":8,\"time_us\":9000,\"tflops\":0.238609},\n"
    "  {\"backend\":\"openblas\",\"dtype\":\"fp32\",\"m\":2048,\"n\":2048,\"k\":2048,\"label\":\"2048x2048x2048\",\"count\":1,\"time_us\":90000,\"tflops\":0.190887}],\n"
    " \"membw\": [\n"
    "  {\"device\":\"cpu\",\"kernel\":\"copy\",\"bytes_per_array\":4096,\"threads\":2,\"gbs_best\":101.5,\"gbs_avg\":90.25},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"copy\",\"bytes_per_array\":1048576,\"threads\":2,\"gbs_best\":55.5,\"gbs_avg\":50.125},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"copy\",\"bytes_per_array\":268435456,\"threads\":2,\"gbs_best\":11.75,\"gbs_avg\":10.5},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"scale\",\"bytes_per_array\":4096,\"threads\":2,\"gbs_best\":98.5,\"gbs_avg\":88},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"scale\",\"bytes_per_array\":1048576,\"threads\":2,\"gbs_best\":54.25,\"gbs_avg\":49},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"scale\",\"bytes_per_array\":268435456,\"threads\":2,\"gbs_best\":11.5,\"gbs_avg\":10.25},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"add\",\"bytes_per_array\":4096,\"threads\":2,\"gbs_best\":120.75,\"gbs_avg\":110},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"add\",\"bytes_per_array\":1048576,\"threads\":2,\"gbs_best\":60.5,\"gbs_avg\":57},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"add\",\"bytes_per_array\":268435456,\"threads\":2,\"gbs_best\":12.875,\"gbs_avg\":12},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"triad\",\"bytes_per_array\":4096,\"threads\":2,\"gbs_best\":119.25,\"gbs_avg\":109},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"triad\",\"bytes_per_array\":1048576,\"threads\":2,\"gbs_best\":61.625,\"gbs_avg\":58},\n"
    "  {\"device\":\"cpu\",\"kernel\":\"triad\",\"bytes_per_array\":268435456,\"threads\":2,\"gbs_best\":13.125,\"gbs_avg\":12.5}]\n"
    "}\n";

/* Writes the synthetic profile and renders it; returns the HTML path (static) or NULL. */
static const char *render_synthetic(const char *d) {
    static char prof[512], html[512];
    snprintf(prof, sizeof prof, "%s", test_join(d, "profile.json"));
    snprintf(html, sizeof html, "%s", test_join(d, "report.html"));
    CHECK_OK(kiln_write_file_atomic(prof, synthetic_profile, strlen(synthetic_profile)));
    const char *args[] = {"report", prof, "--out", html, NULL};
    int rc = run_main(kiln_bench_report_main, args);
    CHECK(rc == 0);
    return rc == 0 ? html : NULL;
}

TEST(bench_report_html) {
    const char *d = test_tmpdir();
    const char *html = render_synthetic(d);
    if (!html) return;
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(html, &t, &len));
    if (!t) return;
    CHECK(!strncmp(t, "<!DOCTYPE html>", 15));
    CHECK_MSG(count_sub(t, "<svg") == 3, "%zu <svg> elements, want 3 (comm, gemm, membw)", count_sub(t, "<svg"));
    CHECK(count_sub(t, "</svg>") == 3);
    /* an <svg> inside each section */
    const char *sc = strstr(t, "<section id=\"comm\">"), *sg = strstr(t, "<section id=\"gemm\">"),
               *sm = strstr(t, "<section id=\"membw\">");
    CHECK(sc && sg && sm);
    if (sc && sg && sm) {
        const char *s1 = strstr(sc, "<svg"), *s2 = strstr(sg, "<svg"), *s3 = strstr(sm, "<svg");
        CHECK(s1 && s1 < sg && s2 && s2 < sm && s3);
    }
    /* self-contained: no scripts, no external references */
    CHECK(!strstr(t, "<script"));
    CHECK(!strstr(t, "src="));
    CHECK(!strstr(t, "href="));
    CHECK(!strstr(t, "url("));
    /* the numbers, the series, the machine, the warning */
    const char *want[] = {"12.4275", "5.99175", "0.14625", "67108864", "0.238609", "0.134218", "L*.q_proj fwd",
                          "101.5", "61.625", "13.125", "268435456", "all_reduce, 2 ranks", "all_gather, 4 ranks",
                          ">copy<", ">scale<", ">add<", ">triad<", "testhost-42", "Test CPU &lt;9000&gt;",
                          "OpenBLAS test-config", "class=\"warn\"", "3 wrong elements", "64 MiB", "1 KiB",
                          "bus bandwidth (GB/s)", "TFLOP/s", "<polyline"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(strstr(t, want[i]) != NULL, "report lacks '%s'", want[i]);
    CHECK(!strstr(t, "Test CPU <9000>"));
    free(t);
    /* no temp files left behind by the atomic write */
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "ls -a '%s'", d);
    FILE *p = popen(cmd, "r");
    if (p) {
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        pclose(p);
        CHECK_MSG(!strstr(out, ".tmp"), "leftover temp file: %s", out);
    }
}

/* Run a benchmark's main with its stderr captured into out. */
static int run_main_stderr(int (*fn)(int, char **), const char *const *args, const char *d, char *out, size_t cap) {
    const char *path = test_join(d, "stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    if (saved < 0 || !f) {
        if (f) fclose(f);
        if (saved >= 0) close(saved);
        test_fail(__FILE__, __LINE__, "cannot capture stderr");
        return -1;
    }
    dup2(fileno(f), 2);
    int rc = run_main(fn, args);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
    return rc;
}

static void expect_report_error(const char *d, const char *name, const char *json, const char *needle) {
    char prof[512], html[512], out[8192];
    snprintf(prof, sizeof prof, "%s", test_join(d, name));
    snprintf(html, sizeof html, "%s", test_join(d, "bad.html"));
    CHECK_OK(kiln_write_file_atomic(prof, json, strlen(json)));
    const char *args[] = {"report", prof, "--out", html, NULL};
    int rc = run_main_stderr(kiln_bench_report_main, args, d, out, sizeof out);
    CHECK_MSG(rc == 1, "%s: exit %d, want 1: %s", name, rc, out);
    CHECK_MSG(strstr(out, prof) != NULL, "%s: error does not name the file: %s", name, out);
    CHECK_MSG(strstr(out, needle) != NULL, "%s: error lacks '%s': %s", name, needle, out);
    CHECK_MSG(access(html, F_OK) != 0, "%s: a page was written despite the error", name);
}

/* What kiln bench comm writes must render: 0-byte records (sizes below one element per rank block, -b 8 over 3
 * ranks: the report refused them, "field 'bytes' must be > 0") stay in the table and off the log2 plot; one-rank
 * records carry a note that they move no data between ranks, and the "moved" column (derived for profiles
 * written before the field). */
TEST(bench_report_comm_zero_bytes_and_one_rank) {
    const char *d = test_tmpdir();
    static const char prof_text[] =
        "{\"kiln_profile\": 1, \"bench\": \"comm\", \"comm\": [\n"
        " {\"backend\":\"mpi\",\"collective\":\"all_gather\",\"dtype\":\"float\",\"ranks\":3,\"inplace\":false,"
        "\"bytes\":0,\"count\":0,\"time_us_avg\":0.1,\"algbw_gbs\":0,\"busbw_gbs\":0,\"wrong\":0,\"moved\":\"between_ranks\"},\n"
        " {\"backend\":\"mpi\",\"collective\":\"all_gather\",\"dtype\":\"float\",\"ranks\":3,\"inplace\":false,"
        "\"bytes\":4092,\"count\":1023,\"time_us_avg\":20,\"algbw_gbs\":0.2046,\"busbw_gbs\":0.1364,\"wrong\":0},\n"
        " {\"backend\":\"local\",\"collective\":\"broadcast\",\"dtype\":\"float\",\"ranks\":1,\"inplace\":true,"
        "\"bytes\":4096,\"count\":1024,\"time_us_avg\":0.04,\"algbw_gbs\":0,\"busbw_gbs\":0,\"wrong\":0,\"moved\":\"none\"},\n"
        " {\"backend\":\"local\",\"collective\":\"broadcast\",\"dtype\":\"float\",\"ranks\":1,\"inplace\":false,"
        "\"bytes\":4096,\"count\":1024,\"time_us_avg\":0.2,\"algbw_gbs\":20.48,\"busbw_gbs\":0,\"wrong\":0}]}\n";
    char prof[512], html[512];
    snprintf(prof, sizeof prof, "%s", test_join(d, "comm.json"));
    snprintf(html, sizeof html, "%s", test_join(d, "comm.html"));
    CHECK_OK(kiln_write_file_atomic(prof, prof_text, strlen(prof_text)));
    const char *args[] = {"report", prof, "--out", html, NULL};
    char out[8192];
    int rc = run_main_stderr(kiln_bench_report_main, args, d, out, sizeof out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(html, &t, &len));
    if (t) {
        CHECK_MSG(strstr(t, "id=\"one-rank\"") && strstr(t, "move no data between ranks"), "no one-rank note");
        CHECK(strstr(t, "Records of 0 bytes") != NULL);
        CHECK(count_sub(t, "<td class=\"l\">between_ranks</td>") == 2); /* given, and derived from ranks 3 */
        CHECK(count_sub(t, "<td class=\"l\">none</td>") == 1);
        CHECK(count_sub(t, "<td class=\"l\">local_copy</td>") == 1); /* derived: one rank, out of place */
        CHECK_MSG(!strstr(t, "nan") && !strstr(t, "inf\"") && !strstr(t, "-inf"), "a 0-byte point reached the plot");
        CHECK(count_sub(t, "<circle") == 3); /* the 0-byte record is not on the log2 axis */
    }
    free(t);
}

TEST(bench_report_errors) {
    const char *d = test_tmpdir();
    expect_report_error(d, "noversion.json", "{\"membw\": []}", "'kiln_profile'");
    expect_report_error(d, "v2.json", "{\"kiln_profile\": 2, \"membw\": []}", "version 2");
    expect_report_error(d, "strver.json", "{\"kiln_profile\": \"1\"}", "'kiln_profile' must be a number");
    expect_report_error(d, "busbw.json",
                        "{\"kiln_profile\": 1, \"comm\": [{\"collective\":\"all_reduce\",\"ranks\":2,\"bytes\":8,"
                        "\"busbw_gbs\":\"fast\"}]}",
                        "comm[0]: field 'busbw_gbs'");
    expect_report_error(d, "gemm_m.json", "{\"kiln_profile\": 1, \"gemm\": [{\"n\":1,\"k\":1,\"tflops\":1}]}",
                        "gemm[0]: missing required field 'm'");
    expect_report_error(d, "membw_sec.json", "{\"kiln_profile\": 1, \"membw\": {}}", "'membw'");
    expect_report_error(d, "syntax.json", "{\"kiln_profile\": 1,", "invalid JSON");
    /* a field written as null (an unmeasured time is inf, which JSON writes as null) is not "missing" */
    expect_report_error(d, "io_null.json",
                        "{\"kiln_profile\": 1, \"io\": [{\"test\":\"par_write\",\"bytes\":65536,\"threads\":1,"
                        "\"seconds\":null,\"gbs\":null}]}",
                        "io[0]: field 'seconds' is null, not a number");
    expect_report_error(d, "comm_bytes.json",
                        "{\"kiln_profile\": 1, \"comm\": [{\"collective\":\"all_reduce\",\"ranks\":2,\"bytes\":-8,"
                        "\"busbw_gbs\":1}]}",
                        "comm[0]: field 'bytes' must be >= 0");
    expect_report_error(d, "comm_null.json",
                        "{\"kiln_profile\": 1, \"comm\": [{\"collective\":\"all_reduce\",\"ranks\":null,\"bytes\":8,"
                        "\"busbw_gbs\":1}]}",
                        "comm[0]: field 'ranks' is null, not an integer");
    char out[8192];
    const char *none[] = {"report", NULL};
    CHECK(run_main_stderr(kiln_bench_report_main, none, d, out, sizeof out) == 2);
    CHECK(strstr(out, "no profiles given") != NULL);
    const char *noout[] = {"report", "a.json", NULL};
    CHECK(run_main_stderr(kiln_bench_report_main, noout, d, out, sizeof out) == 2);
    CHECK(strstr(out, "--out") != NULL);
    char missing[512], html[512];
    snprintf(missing, sizeof missing, "%s", test_join(d, "missing.json"));
    snprintf(html, sizeof html, "%s", test_join(d, "x.html"));
    const char *miss[] = {"report", missing, "--out", html, NULL};
    CHECK(run_main_stderr(kiln_bench_report_main, miss, d, out, sizeof out) == 1);
    CHECK(strstr(out, "missing.json") != NULL);
}

/* ---- io ---- */

/* With one thread in the parallel tests (--threads 1; also the default with --files 1 or on one core) the
 * parallel rows were stored into the sequential rows' slots: par_write/par_read printed inf and their JSON
 * had "seconds": null, which kiln bench report refused. Every row must be measured and the report must read
 * the profile. */
TEST(bench_io_one_thread_fills_every_row) {
    const char *d = test_tmpdir();
    char scratch[512], prof[512], html[512], args[2048];
    static char out[16384];
    snprintf(scratch, sizeof scratch, "%s", test_join(d, "scratch"));
    snprintf(html, sizeof html, "%s", test_join(d, "io.html"));
    CHECK(mkdir(scratch, 0755) == 0);
    const char *extra[2] = {"--threads 1 --files 2", "--files 1"}; /* explicit, and the default min(files, cores) */
    for (int k = 0; k < 2; k++) {
        snprintf(prof, sizeof prof, "%s", test_join(d, k ? "io1.json" : "io0.json"));
        snprintf(args, sizeof args, "bench io --dir '%s' --size 64K --iters 1 %s --json '%s'", scratch, extra[k], prof);
        int rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 0, "kiln %s: exit %d\n%s", args, rc, out);
        CHECK_MSG(!strstr(out, " inf"), "a row printed inf:\n%s", out);
        /* in a log (stdout not a terminal: fully buffered) the header comes before the progress lines on stderr */
        const char *hdr = strstr(out, "kiln bench io: "), *prog = strstr(out, " pass (");
        CHECK_MSG(hdr && prog && hdr < prog, "the header is not before the progress lines in a log:\n%s", out);
        char *text = NULL;
        size_t len = 0;
        CHECK_OK(kiln_read_file(prof, &text, &len));
        CHECK_MSG(text && !strstr(text, "null"), "the profile holds null:\n%s", text ? text : "");
        free(text);
        cJSON *p = load_json(prof);
        const cJSON *io = p ? cJSON_GetObjectItemCaseSensitive(p, "io") : NULL, *r;
        CHECK(cJSON_GetArraySize(io) == 4);
        const char *tests[4] = {"seq_write", "par_write", "seq_read", "par_read"};
        int i = 0;
        cJSON_ArrayForEach(r, io) {
            CHECK_MSG(i < 4 && !strcmp(str(r, "test"), tests[i]), "record %d is '%s'", i, str(r, "test"));
            CHECK_MSG(num(r, "seconds") > 0 && isfinite(num(r, "seconds")) && num(r, "gbs") > 0 && num(r, "threads") == 1,
                      "%s: seconds %g, gbs %g, threads %g", str(r, "test"), num(r, "seconds"), num(r, "gbs"),
                      num(r, "threads"));
            i++;
        }
        cJSON_Delete(p);
        snprintf(args, sizeof args, "bench report '%s' --out '%s'", prof, html);
        rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 0 && strstr(out, "4 io records"), "kiln %s: exit %d\n%s", args, rc, out);
    }
}

/* Files in dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* Ctrl-C in the middle of kiln bench io used to leave its scratch files behind: files x size bytes (1 GiB with
 * the defaults) of kiln-io-PID-NNN.bin in the measured directory. Now the passes stop, the files are removed and
 * the process dies of the signal, as the shell expects; nothing is written. */
TEST(bench_io_ctrl_c_removes_scratch_files) {
    const char *d = test_tmpdir();
    char scratch[512], prof[512], log[512];
    snprintf(scratch, sizeof scratch, "%s", test_join(d, "scratch"));
    snprintf(prof, sizeof prof, "%s", test_join(d, "io.json"));
    snprintf(log, sizeof log, "%s", test_join(d, "io.log"));
    CHECK(mkdir(scratch, 0755) == 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec '%s' bench io --dir '%s' --size 32M --files 4 --iters 100 --ckpt --json '%s'",
             KILN_BINARY, scratch, prof);
    pid_t pid = test_spawn_logged(cmd, log);
    CHECK(pid > 0);
    if (pid <= 0) return;
    /* wait for the first scratch file (the signal handlers are in place before any is created) */
    int seen = 0;
    for (int i = 0; i < 2000 && !seen; i++) {
        seen = count_prefixed(scratch, "kiln-io-") > 0;
        if (!seen) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
    CHECK_MSG(seen, "no scratch file appeared in %s", scratch);
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    char *text = NULL;
    size_t len = 0;
    kiln_error_free(kiln_read_file(log, &text, &len));
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status %#x (want: killed by SIGINT)\n%s", status,
              text ? text : "");
    CHECK_MSG(count_prefixed(scratch, "kiln-io-") == 0, "scratch files left in %s after Ctrl-C\n%s", scratch,
              text ? text : "");
    CHECK_MSG(text && strstr(text, "interrupted by signal 2") && strstr(text, "scratch files removed"), "%s",
              text ? text : "");
    CHECK_MSG(access(prof, F_OK) != 0, "a profile was written after Ctrl-C");
    free(text);
}

/* The messages of bad io and gemm flags say what is wrong. */
TEST(bench_flag_messages) {
    const char *d = test_tmpdir();
    char args[1024], file[512];
    static char out[8192];
    snprintf(args, sizeof args, "bench io --dir '%s'", test_join(d, "nodir"));
    CHECK(test_run_kiln(args, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "nodir: no such directory (it does not exist)") && !strstr(out, "not a directory"), "%s", out);
    snprintf(file, sizeof file, "%s", test_join(d, "plain"));
    CHECK_OK(kiln_write_file_atomic(file, "x", 1));
    snprintf(args, sizeof args, "bench io --dir '%s'", file);
    CHECK(test_run_kiln(args, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "plain: not a directory"), "%s", out);
    /* a directory that does not exist: were a size accepted, nothing would be written (exit 1, not 2) */
    snprintf(args, sizeof args, "bench io --dir '%s' --size 99999G", test_join(d, "nodir"));
    CHECK(test_run_kiln(args, out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "from 4K to 65536G") && !strstr(out, "expected a size >="), "%s", out);
    snprintf(args, sizeof args, "bench io --dir '%s' --size 65537G", test_join(d, "nodir"));
    CHECK(test_run_kiln(args, out, sizeof out) == 2);
    /* 0 is non-negative: the message must not say that is what it expected */
    const char *zero[2] = {"bench gemm --iters 0", "bench gemm --threads 0"};
    for (int k = 0; k < 2; k++) {
        CHECK(test_run_kiln(zero[k], out, sizeof out) == 2);
        CHECK_MSG(strstr(out, "'0': expected a positive integer in 1..") && !strstr(out, "non-negative"), "%s: %s",
                  zero[k], out);
    }
    CHECK(test_run_kiln("bench gemm --warmup -1", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "'-1': expected a non-negative integer in 0.."), "%s", out);
    /* a shape whose A, B and C do not fit in memory is refused before anything runs: malloc's overcommit let
     * such a sweep run its small shapes, then the OOM killer took the process (their numbers unwritten) */
    CHECK(test_run_kiln("bench gemm -m 64,1048576 -n 1048576 -k 1", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "1048576x1048576x1 needs") && strstr(out, "MemAvailable") && !strstr(out, "TFLOP/s"), "%s",
              out);
    /* an output that cannot be written fails before the benchmark runs, not after it (the numbers lost) */
    static const char *const benches[5] = {"gemm -m 64", "membw --min 4K --max 8K", "attention --seq 16 --head-dim 8",
                                           "moe --tokens 16 --hidden 16 --inter 16 --experts 2", "io --size 4K --files 1"};
    for (int k = 0; k < 5; k++) {
        for (int f = 0; f < 2; f++) {
            snprintf(args, sizeof args, "bench %s%s%s %s '%s'", benches[k], k == 4 ? " --dir " : "", k == 4 ? d : "",
                     f ? "--csv" : "--json", f ? d : test_join(d, "nodir/out.json"));
            int rc = test_run_kiln(args, out, sizeof out);
            CHECK_MSG(rc == 1 && strstr(out, f ? "is a directory" : "nothing was run") && count_sub(out, "\n") == 1,
                      "kiln %s: exit %d (want 1 and the error alone)\n%s", args, rc, out);
        }
    }
}

/* The page in a real browser: headless Chromium must parse it into 3 <svg> elements without
 * console errors and take a screenshot. Chromium is a test dependency (.ci/run installs it):
 * missing, the test fails. KILN_BENCH_SCREENSHOT=FILE keeps the screenshot. */
TEST(bench_report_chromium) {
    const char *d = test_tmpdir();
    const char *html = render_synthetic(d);
    if (!html) return;
    char png[512];
    snprintf(png, sizeof png, "%s", test_join(d, "shot.png"));
    char *t = NULL, *l = NULL;
    size_t len = 0;
    int rc = test_chromium_dom(html, &t, &l);
    CHECK_MSG(rc == 0, "chromium --dump-dom exited with %d", rc);
    if (t) {
        CHECK_MSG(count_sub(t, "<svg") == 3, "DOM has %zu <svg> elements, want 3", count_sub(t, "<svg"));
        CHECK(count_sub(t, "<polyline") >= 2 + 4); /* comm: 2 series, membw: 4 kernels */
        CHECK(strstr(t, "12.4275") != NULL);
        CHECK(strstr(t, "class=\"warn\"") != NULL);
    }
    if (l) {
        CHECK_MSG(!strstr(l, "Uncaught") && !strstr(l, ":CONSOLE("), "console errors in the page:\n%s", l);
        CHECK_MSG(!strstr(l, "net::ERR_"), "the page tried to load something:\n%s", l);
    }
    free(t);
    free(l);
    const char *keep = getenv("KILN_BENCH_SCREENSHOT");
    rc = test_chromium_screenshot(html, png, 1000, 2600);
    CHECK_MSG(rc == 0, "chromium --screenshot exited with %d", rc);
    char *img = NULL;
    CHECK_OK(kiln_read_file(png, &img, &len));
    if (img) {
        CHECK(len > 10000 && !memcmp(img, "\x89PNG", 4));
        if (keep) CHECK_OK(kiln_write_file_atomic(keep, img, len));
    }
    free(img);
}
