/* kiln bench attention and moe: FLOP counts on known inputs, the balanced routing, small runs
 * that write valid profiles and CSV, and usage errors (exit 2). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/kernel_formulas.h"
#include "kiln/bench.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "bench_testutil.h"
#include "test.h"

/* ---- attention ---- */

TEST(bench_attention_flops) {
    /* causal: T(T+1)/2 pairs */
    CHECK(kiln_attn_pairs(1, 0) == 1);
    CHECK(kiln_attn_pairs(4, 0) == 10);
    CHECK(kiln_attn_pairs(2048, 0) == 2048.0 * 2049 / 2);
    /* a window of W >= T changes nothing; W < T: rows see 1, 2, .., W, W, .. keys */
    CHECK(kiln_attn_pairs(4, 4) == 10);
    CHECK(kiln_attn_pairs(4, 100) == 10);
    CHECK(kiln_attn_pairs(5, 2) == 1 + 2 + 2 + 2 + 2);
    CHECK(kiln_attn_pairs(6, 1) == 6);
    CHECK(kiln_attn_pairs(8, 3) == 1 + 2 + 3 * 6);
    /* brute force against the kernel's visibility rule: s <= p and s > p - W */
    for (int64_t T = 1; T <= 9; T++)
        for (int64_t W = 0; W <= 10; W++) {
            int64_t n = 0;
            for (int64_t p = 0; p < T; p++)
                for (int64_t s = 0; s <= p; s++) n += W == 0 || s > p - W;
            CHECK_MSG(kiln_attn_pairs(T, W) == (double)n, "T=%lld W=%lld: %g, want %lld", (long long)T,
                      (long long)W, kiln_attn_pairs(T, W), (long long)n);
        }
    /* 4*B*H*D*T(T+1)/2 forward, 3.5x that forward + backward */
    CHECK(kiln_attn_flops_fwd(1, 1, 1, 1, 0) == 4);
    CHECK(kiln_attn_flops_fwd(2, 8, 128, 1024, 0) == 4.0 * 2 * 8 * 128 * 1024 * 1025 / 2);
    CHECK(kiln_attn_flops_fwd(1, 2, 4, 5, 2) == 4.0 * 2 * 4 * 9);
    CHECK(kiln_attn_flops_fwd_bwd(2, 8, 128, 1024, 0) == 3.5 * 4.0 * 2 * 8 * 128 * 1024 * 1025 / 2);
    CHECK(kiln_attn_flops_fwd(64, 128, 256, 1 << 20, 0) > 1e18); /* no integer overflow */
    /* memory: 4 [B,T,H,D] + 4 [B,T,KV,D] + [B,H,T,T] floats */
    CHECK(kiln_attn_bytes(1, 2, 4, 2, 8) == 4.0 * (4 * 2 * 4 * 8 + 4 * 2 * 2 * 8 + 4 * 2 * 2));
}

TEST(bench_attention_profile) {
    const char *d = test_tmpdir();
    char json[512], csv[512];
    snprintf(json, sizeof json, "%s", test_join(d, "attention.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "attention.csv"));
    const char *args[] = {"attention", "--head-dim", "16,32", "--heads", "4", "--kv-heads", "1,2", "--seq", "8:32:x4",
                          "--batch", "2", "--window", "6", "--iters", "2", "--warmup", "1", "--threads", "2",
                          "--json", json, "--csv", csv, NULL};
    CHECK(run_main(kiln_bench_attention_main, args) == 0);
    cJSON *p = load_json(json);
    if (!p) return;
    CHECK(num(p, "kiln_profile") == KILN_PROFILE_VERSION);
    CHECK(!strcmp(str(p, "bench"), "attention"));
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(p, "machine")));
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "attention");
    CHECK(cJSON_IsArray(sec));
    /* 2 head dims x 1 heads x 2 kv heads x 2 seqs, two passes each */
    CHECK_MSG(cJSON_GetArraySize(sec) == 16, "records: %d, want 16", cJSON_GetArraySize(sec));
    int nfwd = 0, nfb = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, sec) {
        int fwd = !strcmp(str(r, "pass"), "fwd"), fb = !strcmp(str(r, "pass"), "fwd_bwd");
        CHECK_MSG(fwd || fb, "pass '%s'", str(r, "pass"));
        nfwd += fwd;
        nfb += fb;
        CHECK(!strcmp(str(r, "backend"), "cpu"));
        CHECK(!strcmp(str(r, "dtype"), "fp32"));
        int64_t B = (int64_t)num(r, "batch"), T = (int64_t)num(r, "seq"), H = (int64_t)num(r, "heads");
        int64_t D = (int64_t)num(r, "head_dim"), W = (int64_t)num(r, "window");
        CHECK(B == 2 && H == 4 && W == 6 && num(r, "threads") == 2);
        CHECK(T == 8 || T == 32);
        CHECK(D == 16 || D == 32);
        CHECK(num(r, "kv_heads") == 1 || num(r, "kv_heads") == 2);
        double fl = fb ? kiln_attn_flops_fwd_bwd(B, H, D, T, W) : kiln_attn_flops_fwd(B, H, D, T, W);
        CHECK_MSG(num(r, "flops") == fl, "flops %g, want %g", num(r, "flops"), fl);
        double us = num(r, "time_us");
        CHECK_MSG(us > 0 && num(r, "gflops") > 0 && num(r, "tokens_per_s") > 0, "time %g gflops %g tok/s %g", us,
                  num(r, "gflops"), num(r, "tokens_per_s"));
        CHECK_NEAR(num(r, "gflops"), fl / (us * 1e-6) / 1e9, 1e-9 * num(r, "gflops"));
        CHECK_NEAR(num(r, "tokens_per_s"), (double)(B * T) / (us * 1e-6), 1e-9 * num(r, "tokens_per_s"));
    }
    CHECK(nfwd == 8 && nfb == 8);
    cJSON_Delete(p);
    CHECK_CSV(csv, "backend,dtype,pass,batch,seq,heads,kv_heads,head_dim,window,threads,flops,time_us,gflops,tokens_per_s\n",
              17, "cpu,fp32,fwd_bwd,2,32,4,2,32,6,2,");
}

TEST(bench_attention_usage_errors) {
    const char *bad[][8] = {
        {"attention", "--bogus", NULL},
        {"attention", "--heads", NULL},                               /* missing value */
        {"attention", "--heads", "", NULL},                           /* empty list */
        {"attention", "--seq", "1,,2", NULL},                         /* empty item */
        {"attention", "--head-dim", "abc", NULL},
        {"attention", "--heads", "6", "--kv-heads", "4", NULL},       /* not a multiple */
        {"attention", "--heads", "8", "--kv-heads", "2,16", NULL},    /* kv > heads */
        {"attention", "--batch", "0", NULL},
        {"attention", "--window", "-1", NULL},
        {"attention", "--iters", "0", NULL},
        {"attention", "--seq", "1048576", "--heads", "64", "--kv-heads", "8", NULL}, /* 256 TiB of probabilities */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_main(kiln_bench_attention_main, bad[i]);
        CHECK_MSG(rc == 2, "case %zu (%s %s): exit %d, want 2", i, bad[i][1], bad[i][2] ? bad[i][2] : "", rc);
    }
    const char *help[] = {"attention", "--help", NULL};
    CHECK(run_main(kiln_bench_attention_main, help) == 0);
}

/* ---- moe ---- */

TEST(bench_moe_flops) {
    CHECK(kiln_moe_flops_fwd(1, 1, 1, 1) == 6);
    /* per slot: gate_up 2*H*2I + down 2*I*H */
    CHECK(kiln_moe_flops_fwd(4096, 2, 2048, 1024) == 4096.0 * 2 * (2.0 * 2048 * 2 * 1024 + 2.0 * 1024 * 2048));
    CHECK(kiln_moe_flops_fwd_bwd(4096, 2, 2048, 1024) == 18.0 * 4096 * 2 * 2048 * 1024);
    CHECK(kiln_moe_flops_fwd(1 << 20, 64, 1 << 20, 1 << 20) > 1e18); /* no integer overflow */
    /* weights + gradients, token and slot activations */
    double b = kiln_moe_bytes(10, 8, 4, 2, 1);
    CHECK(b >= 4.0 * (2 * 2 * 3 * 8 * 4 + 4 * 10 * 8 + 10 * (4 * 8 + 6 * 4)));
}

TEST(bench_moe_routing) {
    const int64_t cases[][3] = {{100, 16, 1}, {100, 16, 2}, {37, 5, 5}, {1, 8, 3}, {64, 1, 1}, {1000, 7, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t N = cases[c][0], E = cases[c][1], k = cases[c][2];
        int32_t *ch = malloc((size_t)(N * k) * sizeof *ch);
        int64_t *cnt = calloc((size_t)E, sizeof *cnt);
        if (!ch || !cnt) {
            free(ch);
            free(cnt);
            CHECK(0);
            return;
        }
        CHECK(kiln_moe_route(ch, N, E, k, 42) == 0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < k; j++) {
                int32_t e = ch[n * k + j];
                CHECK_MSG(e >= 0 && e < E, "expert %d of %lld", e, (long long)E);
                if (e < 0 || e >= E) continue;
                cnt[e]++;
                for (int64_t i = 0; i < j; i++) CHECK_MSG(ch[n * k + i] != e, "token %lld picks %d twice", (long long)n, e);
            }
        int64_t lo = N * k / E, hi = (N * k + E - 1) / E;
        for (int64_t e = 0; e < E; e++)
            CHECK_MSG(cnt[e] >= lo && cnt[e] <= hi, "N=%lld E=%lld k=%lld: expert %lld has %lld slots, want %lld..%lld",
                      (long long)N, (long long)E, (long long)k, (long long)e, (long long)cnt[e], (long long)lo,
                      (long long)hi);
        /* fixed seed: the same routing again; another seed: a different one (for N large enough) */
        int32_t *ch2 = malloc((size_t)(N * k) * sizeof *ch2);
        if (ch2) {
            CHECK(kiln_moe_route(ch2, N, E, k, 42) == 0);
            CHECK(!memcmp(ch, ch2, (size_t)(N * k) * sizeof *ch));
            if (N >= 100 && E > 1) {
                CHECK(kiln_moe_route(ch2, N, E, k, 43) == 0);
                CHECK(memcmp(ch, ch2, (size_t)(N * k) * sizeof *ch) != 0);
            }
        }
        free(ch2);
        free(ch);
        free(cnt);
    }
    int32_t one[4];
    CHECK(kiln_moe_route(one, 1, 2, 3, 1) == -1); /* top_k > experts */
    CHECK(kiln_moe_route(one, 0, 2, 1, 1) == -1);
}

TEST(bench_moe_profile) {
    const char *d = test_tmpdir();
    char json[512], csv[512];
    snprintf(json, sizeof json, "%s", test_join(d, "moe.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "moe.csv"));
    const char *args[] = {"moe", "--hidden", "64", "--inter", "32,48", "--experts", "4", "--top-k", "1:2:+1",
                          "--tokens", "16,40", "--iters", "2", "--warmup", "1", "--threads", "2", "--json", json,
                          "--csv", csv, NULL};
    CHECK(run_main(kiln_bench_moe_main, args) == 0);
    cJSON *p = load_json(json);
    if (!p) return;
    CHECK(num(p, "kiln_profile") == KILN_PROFILE_VERSION);
    CHECK(!strcmp(str(p, "bench"), "moe"));
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "moe");
    CHECK(cJSON_IsArray(sec));
    /* 2 inter x 1 experts x 2 top_k x 2 tokens, two passes */
    CHECK_MSG(cJSON_GetArraySize(sec) == 16, "records: %d, want 16", cJSON_GetArraySize(sec));
    const cJSON *r;
    int nfb = 0;
    cJSON_ArrayForEach(r, sec) {
        int fb = !strcmp(str(r, "pass"), "fwd_bwd");
        CHECK(fb || !strcmp(str(r, "pass"), "fwd"));
        nfb += fb;
        CHECK(!strcmp(str(r, "backend"), "openblas"));
        CHECK(!strcmp(str(r, "dtype"), "fp32"));
        int64_t N = (int64_t)num(r, "tokens"), H = (int64_t)num(r, "hidden"), I = (int64_t)num(r, "inter");
        int64_t k = (int64_t)num(r, "top_k");
        CHECK(H == 64 && num(r, "experts") == 4 && num(r, "threads") == 2);
        CHECK((N == 16 || N == 40) && (I == 32 || I == 48) && (k == 1 || k == 2));
        CHECK(num(r, "slots") == (double)(N * k));
        double fl = fb ? kiln_moe_flops_fwd_bwd(N, k, H, I) : kiln_moe_flops_fwd(N, k, H, I);
        CHECK_MSG(num(r, "flops") == fl, "flops %g, want %g", num(r, "flops"), fl);
        double us = num(r, "time_us");
        CHECK_MSG(us > 0 && num(r, "tflops") > 0 && num(r, "tokens_per_s") > 0, "time %g tflops %g tok/s %g", us,
                  num(r, "tflops"), num(r, "tokens_per_s"));
        CHECK_NEAR(num(r, "tflops"), fl / (us * 1e-6) / 1e12, 1e-9 * num(r, "tflops"));
        CHECK_NEAR(num(r, "tokens_per_s"), (double)N / (us * 1e-6), 1e-9 * num(r, "tokens_per_s"));
    }
    CHECK(nfb == 8);
    cJSON_Delete(p);
    CHECK_CSV(csv, "backend,dtype,pass,tokens,hidden,inter,experts,top_k,slots,threads,flops,time_us,tflops,tokens_per_s\n",
              17, "openblas,fp32,fwd_bwd,40,64,48,4,2,80,2,");
}

TEST(bench_moe_usage_errors) {
    const char *bad[][8] = {
        {"moe", "--bogus", NULL},
        {"moe", "--inter", NULL},
        {"moe", "--experts", "", NULL},
        {"moe", "--tokens", "0", NULL},
        {"moe", "--hidden", "x", NULL},
        {"moe", "--experts", "4", "--top-k", "5", NULL},  /* top_k > experts */
        {"moe", "--top-k", "1:8:x1", NULL},
        {"moe", "--warmup", "-1", NULL},
        {"moe", "--hidden", "1048576", "--inter", "1048576", "--experts", "64", NULL}, /* petabytes of weights */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_main(kiln_bench_moe_main, bad[i]);
        CHECK_MSG(rc == 2, "case %zu (%s %s): exit %d, want 2", i, bad[i][1], bad[i][2] ? bad[i][2] : "", rc);
    }
    const char *help[] = {"moe", "-h", NULL};
    CHECK(run_main(kiln_bench_moe_main, help) == 0);
}
