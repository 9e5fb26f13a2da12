/* The CPU side of kiln bench moe --device cuda: the skewed routing and the flag checks that run before
 * any device is touched (the timing itself runs on the GPU machine: bench/moe_gpu.sh). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kernel_formulas.h"
#include "test.h"

TEST(bench_moe_route_skewed) {
    const int64_t N = 200000, E = 16;
    int32_t *ch = malloc((size_t)N * 2 * sizeof *ch), *ch2 = malloc((size_t)N * 2 * sizeof *ch2);
    int64_t cnt[16] = {0};
    CHECK(ch && ch2);
    if (!ch || !ch2) {
        free(ch), free(ch2);
        return;
    }
    CHECK(kiln_moe_route_skewed(ch, N, E, 1, 7) == 0);
    for (int64_t n = 0; n < N; n++) {
        CHECK_MSG(ch[n] >= 0 && ch[n] < E, "slot %lld: expert %d", (long long)n, ch[n]);
        if (ch[n] >= 0 && ch[n] < E) cnt[ch[n]]++;
    }
    /* sorted shares follow 1/rank / H_16 (H_16 = 3.3807); 200000 draws: +-0.005 is > 4 standard errors */
    for (int i = 0; i < 16; i++)
        for (int j = i + 1; j < 16; j++)
            if (cnt[j] > cnt[i]) {
                int64_t t = cnt[i];
                cnt[i] = cnt[j], cnt[j] = t;
            }
    for (int r = 0; r < 16; r++)
        CHECK_MSG(fabs((double)cnt[r] / N - 1.0 / (r + 1) / 3.380728993) < 0.005, "rank %d: share %.4f, Zipf %.4f", r + 1,
                  (double)cnt[r] / N, 1.0 / (r + 1) / 3.380728993);
    /* the same seed again: the same routing; top-2: distinct experts per token */
    CHECK(kiln_moe_route_skewed(ch2, N, E, 1, 7) == 0);
    CHECK(!memcmp(ch, ch2, (size_t)N * sizeof *ch));
    CHECK(kiln_moe_route_skewed(ch, 1000, 4, 4, 9) == 0);
    for (int64_t n = 0; n < 1000; n++)
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < j; i++) CHECK_MSG(ch[n * 4 + i] != ch[n * 4 + j], "token %lld repeats an expert", (long long)n);
    CHECK(kiln_moe_route_skewed(ch, 10, 2, 3, 1) == -1); /* top_k > experts */
    CHECK(kiln_moe_route_skewed(ch, 0, 2, 1, 1) == -1);
    free(ch), free(ch2);
}

/* concentrated: one expert gets `share` of the slots (binomial: 200000 draws, +-0.003 is > 4 standard errors),
 * the others the rest evenly; the same seed gives the same routing; top-k distinct; bad arguments refused */
TEST(bench_moe_route_concentrated) {
    const int64_t N = 200000, E = 16;
    int32_t *ch = malloc((size_t)N * sizeof *ch), *ch2 = malloc((size_t)N * sizeof *ch2);
    int64_t cnt[16] = {0};
    CHECK(ch && ch2);
    if (!ch || !ch2) {
        free(ch), free(ch2);
        return;
    }
    CHECK(kiln_moe_route_concentrated(ch, N, E, 1, 0.98, 11) == 0);
    for (int64_t n = 0; n < N; n++) {
        CHECK_MSG(ch[n] >= 0 && ch[n] < E, "slot %lld: expert %d", (long long)n, ch[n]);
        if (ch[n] >= 0 && ch[n] < E) cnt[ch[n]]++;
    }
    int hot = 0;
    for (int e = 1; e < E; e++)
        if (cnt[e] > cnt[hot]) hot = e;
    CHECK_MSG(fabs((double)cnt[hot] / N - 0.98) < 0.003, "the hot expert's share %.4f", (double)cnt[hot] / N);
    for (int e = 0; e < E; e++)
        if (e != hot)
            CHECK_MSG(fabs((double)cnt[e] / N - 0.02 / 15) < 0.0012, "expert %d: share %.5f, expected %.5f", e,
                      (double)cnt[e] / N, 0.02 / 15);
    CHECK(kiln_moe_route_concentrated(ch2, N, E, 1, 0.98, 11) == 0);
    CHECK(!memcmp(ch, ch2, (size_t)N * sizeof *ch));
    CHECK(kiln_moe_route_concentrated(ch, 1000, 4, 3, 0.98, 9) == 0);
    for (int64_t n = 0; n < 1000; n++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < j; i++) CHECK_MSG(ch[n * 3 + i] != ch[n * 3 + j], "token %lld repeats an expert", (long long)n);
    CHECK(kiln_moe_route_concentrated(ch, 10, 2, 3, 0.5, 1) == -1); /* top_k > experts */
    CHECK(kiln_moe_route_concentrated(ch, 10, 2, 1, 1.5, 1) == -1); /* share > 1 */
    free(ch), free(ch2);
}

TEST(bench_moe_device_flag) {
    char out[8192];
    CHECK(test_run_kiln("bench moe --device gpu", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "--device 'gpu': expected cpu or cuda"), "%s", out);
    /* usage errors come before the device (or its absence) is looked at; without CUDA: exit 2 as well */
    CHECK(test_run_kiln("bench moe --device cuda --routing uniform", out, sizeof out) == 2);
    CHECK(test_run_kiln("bench moe --device cuda --routing concentrated,skewed,concentrated", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "each at most once") || strstr(out, "without CUDA"), "%s", out);
    CHECK(test_run_kiln("bench moe --device cuda --experts 2 --top-k 3", out, sizeof out) == 2);
    CHECK(test_run_kiln("bench moe --device cuda --tokens 0", out, sizeof out) == 2);
    CHECK(test_run_kiln("bench moe --device cuda --help", out, sizeof out) == 0 || strstr(out, "without CUDA"));
}
