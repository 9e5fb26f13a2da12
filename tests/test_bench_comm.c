/* kiln bench comm: nccl-tests' bandwidth formulas, one rank without mpirun, two ranks under mpirun (float
 * and bf16, every result checked, busbw/algbw = the formula's factor), and usage errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "bench/comm_formulas.h"
#include "kiln/fsutil.h"
#include "kiln/cuda.h"
#include "test.h"

TEST(bench_comm_busbw_formulas) {
    /* 1e9 bytes in 1e6 us is 1 GB/s of algorithm bandwidth */
    CHECK_NEAR(kiln_coll_algbw_gbs(1000000000, 1e6), 1.0, 1e-12);
    CHECK_NEAR(kiln_coll_algbw_gbs(1 << 20, 100.0), 10.48576, 1e-12);
    CHECK(kiln_coll_algbw_gbs(8, 0.0) == 0.0);
    /* nccl-tests' factors: 2(n-1)/n, (n-1)/n, (n-1)/n, 1, (n-1)/n */
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_ALLREDUCE, 2), 1.0, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_ALLREDUCE, 4), 1.5, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_ALLREDUCE, 8), 1.75, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_REDUCE_SCATTER, 8), 0.875, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_ALLGATHER, 2), 0.5, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_ALLTOALL, 4), 0.75, 1e-15);
    CHECK_NEAR(kiln_coll_busbw_factor(KILN_COLL_BROADCAST, 16), 1.0, 1e-15);
    for (int c = 0; c < KILN_COLL_COUNT; c++) /* one rank moves nothing over the bus, but a broadcast "does" */
        CHECK_NEAR(kiln_coll_busbw_factor((kiln_coll)c, 1), c == KILN_COLL_BROADCAST ? 1.0 : 0.0, 1e-15);
    /* all-reduce of 1 GiB per rank on 8 ranks in 0.1 s: algbw 10.737 GB/s, busbw 1.75x that */
    CHECK_NEAR(kiln_coll_busbw_gbs(KILN_COLL_ALLREDUCE, 8, (size_t)1 << 30, 1e5), 10.73741824 * 1.75, 1e-9);
    CHECK_NEAR(kiln_coll_busbw_gbs(KILN_COLL_ALLGATHER, 4, 4000, 1.0), 3.0, 1e-12);
    /* sizes: all-gather's S is the gathered buffer, rounded down to whole rank blocks */
    size_t blk = 0;
    CHECK(kiln_coll_count(KILN_COLL_ALLGATHER, 1000, 4, 3, &blk) == 249 && blk == 83);
    CHECK(kiln_coll_count(KILN_COLL_REDUCE_SCATTER, 1024, 2, 2, &blk) == 512 && blk == 256);
    CHECK(kiln_coll_count(KILN_COLL_ALLTOALL, 8, 4, 4, &blk) == 0 && blk == 0);
    CHECK(kiln_coll_count(KILN_COLL_ALLREDUCE, 1000, 4, 3, &blk) == 250 && blk == 250);
    CHECK(kiln_coll_count(KILN_COLL_BROADCAST, 10, 2, 7, &blk) == 5 && blk == 5);
    CHECK(!strcmp(kiln_coll_name(KILN_COLL_ALLTOALL), "alltoall"));
}

static cJSON *load_json(const char *path) {
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(path, &text, &len);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    CHECK_MSG(j, "%s is not JSON", path);
    return j;
}

static double num(const cJSON *rec, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}

static const char *str(const cJSON *rec, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The profile's "comm" records: every collective present, #wrong 0, sizes and busbw/algbw as nccl-tests.
 * Returns the number of records. */
static int check_profile(const char *path, const char *backend, int ranks, const char *dtype, size_t maxbytes) {
    cJSON *p = load_json(path);
    if (!p) return 0;
    CHECK(num(p, "kiln_profile") == 1 && !strcmp(str(p, "bench"), "comm"));
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(p, "comm");
    CHECK_MSG(cJSON_IsArray(sec), "%s: no \"comm\" array", path);
    int seen[KILN_COLL_COUNT][2] = {{0}}, n = 0;
    size_t ts = !strcmp(dtype, "bfloat16") ? 2 : 4;
    const cJSON *r;
    cJSON_ArrayForEach(r, sec) {
        n++;
        int c = -1;
        for (int k = 0; k < KILN_COLL_COUNT; k++)
            if (!strcmp(str(r, "collective"), kiln_coll_name((kiln_coll)k))) c = k;
        CHECK_MSG(c >= 0, "unknown collective '%s'", str(r, "collective"));
        if (c < 0) continue;
        const cJSON *ip = cJSON_GetObjectItemCaseSensitive(r, "inplace");
        CHECK(cJSON_IsBool(ip));
        seen[c][cJSON_IsTrue(ip)]++;
        CHECK(!strcmp(str(r, "backend"), backend) && !strcmp(str(r, "dtype"), dtype));
        CHECK(num(r, "ranks") == ranks);
        CHECK_MSG(num(r, "wrong") == 0, "%s %s inplace %d bytes %.0f: %g wrong", str(r, "collective"), dtype,
                  cJSON_IsTrue(ip), num(r, "bytes"), num(r, "wrong"));
        double bytes = num(r, "bytes"), count = num(r, "count");
        CHECK(bytes == count * (double)ts && bytes <= (double)maxbytes && bytes >= 0);
        if (c == KILN_COLL_REDUCE_SCATTER || c == KILN_COLL_ALLGATHER || c == KILN_COLL_ALLTOALL)
            CHECK_MSG((size_t)count % (size_t)ranks == 0, "%s: count %.0f is not whole rank blocks", str(r, "collective"),
                      count);
        double tmin = num(r, "time_us_min"), tavg = num(r, "time_us_avg"), tmax = num(r, "time_us_max");
        CHECK_MSG(tmin >= 0 && tmin <= tavg * (1 + 1e-12) && tavg <= tmax * (1 + 1e-12), "times %g %g %g", tmin, tavg,
                  tmax);
        double alg = num(r, "algbw_gbs"), bus = num(r, "busbw_gbs");
        if (tavg > 0) CHECK_NEAR(alg, bytes / 1e3 / tavg, 1e-9 * (alg + 1));
        double want = kiln_coll_busbw_factor((kiln_coll)c, ranks);
        if (alg > 0)
            CHECK_MSG(fabs(bus / alg - want) <= 1e-12, "%s: busbw/algbw %.15g, want %.15g", str(r, "collective"),
                      bus / alg, want);
    }
    for (int c = 0; c < KILN_COLL_COUNT; c++)
        CHECK_MSG(seen[c][0] > 0 && seen[c][0] == seen[c][1], "%s: %d out-of-place and %d in-place records",
                  kiln_coll_name((kiln_coll)c), seen[c][0], seen[c][1]);
    cJSON_Delete(p);
    return n;
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

TEST(bench_comm_one_rank_local) {
    const char *dir = test_tmpdir();
    const char *json = test_join(dir, "comm.json"), *csv = test_join(dir, "comm.csv");
    char args[2048], out[65536];
    snprintf(args, sizeof args, "bench comm -b 8 -e 64K -n 3 -w 1 --json '%s' --csv '%s'", json, csv);
    int rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    CHECK(strstr(out, "backend local, 1 rank") && strstr(out, "# Collective: alltoall"));
    CHECK(strstr(out, "#       size         count      type   redop    root     time   algbw   busbw #wrong"));
    int n = check_profile(json, "local", 1, "float", 65536);
    CHECK_MSG(n == 5 * 14 * 2, "%d records, want 5 collectives x 14 sizes x 2", n);
    CHECK_MSG(count_lines(csv) == n + 1, "CSV has %d lines for %d records", count_lines(csv), n);
    /* only in-place, two collectives, bf16 */
    snprintf(args, sizeof args, "bench comm -b 1K -e 4K -n 2 -w 0 -d bfloat16 --inplace "
                                "--collectives alltoall,all_reduce --csv '%s'", csv);
    rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 0 && !strstr(out, "out-of-place") && !strstr(out, "all_gather"), "rc %d: %s", rc, out);
    CHECK_MSG(count_lines(csv) == 1 + 2 * 3, "CSV has %d lines", count_lines(csv));
}

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

TEST(bench_comm_two_ranks_mpi) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    const char *dir = test_tmpdir();
    const char *dts[2] = {"float", "bfloat16"};
    for (int d = 0; d < 2; d++) {
        const char *json = test_join(dir, d ? "bf16.json" : "f32.json");
        char cmd[4096], out[65536];
        /* no leak check for the MPI ranks: see test_train.c */
        snprintf(cmd, sizeof cmd,
                 "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np 2 "
                 "'%s' bench comm -b 8 -e 1M -n 3 -w 1 -d %s --json '%s' 2>&1", KILN_BINARY, dts[d], json);
        int rc = test_run_shell(cmd, out, sizeof out);
        CHECK_MSG(rc == 0, "mpirun -np 2 bench comm -d %s failed (%d): %s", dts[d], rc, out);
        CHECK_MSG(strstr(out, "backend mpi, 2 ranks") && strstr(out, "Out of bounds values : 0 OK"), "%s", out);
        int recs = check_profile(json, "mpi", 2, dts[d], 1 << 20);
        CHECK_MSG(recs == 5 * 18 * 2, "-d %s: %d records, want 5 collectives x 18 sizes x 2", dts[d], recs);
    }
}

TEST(bench_comm_usage_errors) {
    static const struct {
        const char *args, *msg;
    } cases[] = {
        {"--collectives all_reduce,allscatter", "unknown collective 'allscatter'"},
        {"-d int8", "unknown datatype 'int8'"},
        {"-b 10X", "-b '10X' is not a size"},
        {"-e 1.5G", "-e '1.5G' is not a size"},
        {"-b 1M -e 1K", "--minbytes 1048576 is larger than --maxbytes 1024"},
        {"-f 1", "the step factor must be an integer >= 2"},
        {"-n 0", "iterations must be >= 1"},
        {"-o max", "unsupported reduction op 'max'"},
        {"-c 2", "expected 1 or 0"},
        {"--frobnicate", "unknown option '--frobnicate'"},
        {"-e", "-e needs a value"},
        {"--backend gloo", "unknown backend 'gloo'"},
        {"-g 2", "-g/--ngpus needs --backend nccl"},
        {"--backend nccl -g 0", "the number of GPUs must be an integer in 1..1024"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[256], out[4096];
        snprintf(args, sizeof args, "bench comm %s", cases[i].args);
        int rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 2 && strstr(out, "kiln bench comm: error: ") && strstr(out, cases[i].msg),
                  "kiln %s: rc %d, output '%s' lacks '%s'", args, rc, out, cases[i].msg);
    }
    char out[8192];
    CHECK(test_run_kiln("bench comm --help", out, sizeof out) == 0 && strstr(out, "--stepfactor"));
}

/* On a machine without a GPU (CI) or without libnccl, the NCCL backend fails with a message that says which,
 * never a crash; with more GPUs asked of a host than it has, the message names both counts. */
TEST(bench_comm_nccl_unavailable) {
    char out[8192];
    int n = 0;
    kiln_error *e = kiln_cuda_device_count(&n);
    int have_gpu = !e && n > 0;
    kiln_error_free(e);
    if (have_gpu) {
        char args[128];
        snprintf(args, sizeof args, "bench comm --backend nccl -g %d -e 1K", n + 1);
        CHECK(test_run_kiln(args, out, sizeof out) == 1 && strstr(out, "GPUs; it has"));
        return;
    }
    int rc = test_run_kiln("bench comm --backend nccl -e 1K", out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "kiln bench comm (rank 0): error: ") &&
                  (strstr(out, "CUDA") || strstr(out, "cuda") || strstr(out, "NCCL")),
              "rc %d, output '%s'", rc, out);
}
