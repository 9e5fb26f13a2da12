/* kiln bench comm: nccl-tests' bandwidth formulas, one rank without mpirun, two ranks under mpirun (float
 * and bf16, every result checked, busbw/algbw = the formula's factor), and usage errors. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
    /* every collective at 1, 2, 3 and 4 ranks (nccl-tests' PERFORMANCE.md), out of place and in place alike:
     * all-reduce 2(n-1)/n, reduce-scatter / all-gather / all-to-all (n-1)/n, broadcast 1; and at one rank 0
     * for every collective: nothing crosses between ranks, a broadcast included (nccl-tests' factor 1 there
     * made a one-rank broadcast's copy, in place nothing at all, read as GB/s of bus bandwidth) */
    static const double want[4][KILN_COLL_COUNT] = {
        {0, 0, 0, 0, 0},
        {1.0, 0.5, 0.5, 1.0, 0.5},
        {4.0 / 3, 2.0 / 3, 2.0 / 3, 1.0, 2.0 / 3},
        {1.5, 0.75, 0.75, 1.0, 0.75}};
    for (int n = 1; n <= 4; n++)
        for (int c = 0; c < KILN_COLL_COUNT; c++)
            CHECK_MSG(fabs(kiln_coll_busbw_factor((kiln_coll)c, n) - want[n - 1][c]) <= 1e-15, "%s at %d rank(s): %g, want %g",
                      kiln_coll_name((kiln_coll)c), n, kiln_coll_busbw_factor((kiln_coll)c, n), want[n - 1][c]);
    /* what a call moves, and algbw: one rank in place moves nothing (0 GB/s however fast the no-op is) */
    CHECK(kiln_coll_moved(1, 1) == KILN_COLL_MOVES_NONE && kiln_coll_moved(1, 0) == KILN_COLL_MOVES_LOCAL_COPY);
    CHECK(kiln_coll_moved(2, 1) == KILN_COLL_MOVES_BETWEEN_RANKS && kiln_coll_moved(3, 0) == KILN_COLL_MOVES_BETWEEN_RANKS);
    CHECK(!strcmp(kiln_coll_moved_name(KILN_COLL_MOVES_NONE), "none"));
    CHECK(kiln_coll_call_algbw_gbs(1, 1, 1 << 20, 0.05) == 0.0);
    CHECK_NEAR(kiln_coll_call_algbw_gbs(1, 0, 1000, 1.0), 1.0, 1e-12);
    CHECK_NEAR(kiln_coll_call_algbw_gbs(2, 1, 1000, 1.0), 1.0, 1e-12);
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

/* The check's fill patterns must catch a result of zeros and a block delivered to the wrong rank at every rank
 * count and block size. The old pattern, ((j + 3r) mod 5) - 2, summed to 0 at every element over 5, 10, ...
 * ranks (an all-reduce returning zeros passed) and repeated every 5 elements (a reduce-scatter handing rank r
 * the block of rank r+1 passed at blocks of 5k elements, e.g. 1024 floats over 6 ranks). */
TEST(bench_comm_fill_patterns) {
    /* up to 130 ranks every one, then rank counts past bf16's exact 256 (the values took part at every element, so
     * 257+ ranks summed to integers above 256 that bf16 rounds, and the check reported correct sums wrong) */
    static const int big[] = {255, 256, 257, 300, 320, 512, 513, 1000, 1024, 4096, 5000};
    for (int t = 0; t < 130 + (int)(sizeof big / sizeof big[0]); t++) {
        const int n = t < 130 ? t + 1 : big[t - 130];
        int nonzero = 0, exact = 1, most = 0;
        int *seen = calloc((size_t)n, sizeof *seen); /* elements where each rank's value is 1 */
        for (size_t j = 0; j < 256; j++) {
            double sum = 0;
            for (int r = 0; r < n; r++) {
                const float v = kiln_coll_red_val(n, r, j);
                CHECK(v == 0 || v == 1);
                sum += v;
                if (seen) seen[r] += v == 1;
            }
            exact &= sum == kiln_coll_red_sum(n, j);
            nonzero += sum != 0;
            most = sum > most ? (int)sum : most;
        }
        CHECK_MSG(exact, "%d ranks: kiln_coll_red_sum differs from the sum of the ranks' values", n);
        /* every partial sum is an integer <= the whole: exact in bf16 while the whole is <= 256 */
        CHECK_MSG(most <= 256, "%d ranks: a sum of %d is not exact in bf16", n, most);
        CHECK_MSG(nonzero >= 64, "%d ranks: the expected all-reduce is 0 at %d of 256 elements", n, 256 - nonzero);
        int absent = 0; /* a rank whose value is 0 everywhere: losing its contribution would pass */
        for (int r = 0; seen && r < n; r++) absent += seen[r] == 0;
        CHECK_MSG(absent == 0, "%d ranks: %d rank(s) contribute nothing in 256 elements", n, absent);
        free(seen);
        if (n < 2) continue;
        /* every block size of a small sweep: rank 0's reduce-scatter block differs from rank 1's somewhere */
        for (size_t blk = 1; blk <= 300; blk++) {
            int differ = 0;
            for (size_t k = 0; k < blk && !differ; k++)
                differ = kiln_coll_red_sum(n, k) != kiln_coll_red_sum(n, blk + k);
            if (blk >= 8) CHECK_MSG(differ, "%d ranks, blocks of %zu: blocks 0 and 1 expect the same sums", n, blk);
        }
    }
    /* data movement: every rank's value differs at every element (all-gather, all-to-all, broadcast) */
    for (size_t j = 0; j < 300; j++)
        for (int r = 1; r < 128; r++) CHECK(kiln_coll_mov_val(r, j) != kiln_coll_mov_val(r - 1, j));
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
    /* every rank runs on this host here: one host, in the machine's list and in every record */
    const cJSON *hl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "machine"), "hosts");
    CHECK_MSG(cJSON_GetArraySize(hl) == 1 && cJSON_IsString(cJSON_GetArrayItem(hl, 0)), "%s: machine.hosts", path);
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
        CHECK_MSG(num(r, "hosts") == 1, "hosts %g", num(r, "hosts"));
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
        if (tavg > 0 && !(ranks == 1 && cJSON_IsTrue(ip))) CHECK_NEAR(alg, bytes / 1e3 / tavg, 1e-9 * (alg + 1));
        double want = kiln_coll_busbw_factor((kiln_coll)c, ranks);
        if (alg > 0)
            CHECK_MSG(fabs(bus / alg - want) <= 1e-12, "%s: busbw/algbw %.15g, want %.15g", str(r, "collective"),
                      bus / alg, want);
        /* one rank: no bus traffic for any collective; in place no traffic at all, and the record says so */
        const char *moved = ranks > 1 ? "between_ranks" : cJSON_IsTrue(ip) ? "none" : "local_copy";
        CHECK_MSG(!strcmp(str(r, "moved"), moved), "%s inplace %d, %d rank(s): moved '%s', want '%s'",
                  str(r, "collective"), cJSON_IsTrue(ip), ranks, str(r, "moved"), moved);
        if (ranks == 1) {
            CHECK_MSG(bus == 0, "%s inplace %d on one rank: busbw %g GB/s, want 0", str(r, "collective"),
                      cJSON_IsTrue(ip), bus);
            if (cJSON_IsTrue(ip))
                CHECK_MSG(alg == 0, "%s in place on one rank moves nothing: algbw %g GB/s, want 0",
                          str(r, "collective"), alg);
            else if (bytes > 0)
                CHECK_MSG(alg > 0, "%s out of place on one rank: algbw %g (the local copy's)", str(r, "collective"), alg);
        } else if (bytes > 0 && tavg > 0) {
            CHECK_MSG(alg > 0, "%s: algbw %g", str(r, "collective"), alg);
        }
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

/* The table's rows against the JSON records: the same sizes, counts, times, bandwidths and #wrong, in order
 * (out of place, then in place, per row). */
static void check_table_matches_profile(const char *out, const char *json) {
    cJSON *p = load_json(json);
    const cJSON *sec = p ? cJSON_GetObjectItemCaseSensitive(p, "comm") : NULL;
    const cJSON *rec = sec ? sec->child : NULL;
    int rows = 0;
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        unsigned long long size, count;
        char type[16], redop[8];
        int root, used = 0;
        if (line[0] == '#' || sscanf(line, "%llu %llu %15s %7s %d%n", &size, &count, type, redop, &root, &used) != 5)
            continue;
        const char *q = line + used;
        for (int v = 0; v < 2 && rec; v++, rec = rec->next) {
            double t, alg, bus;
            char w[16];
            int k = 0;
            if (sscanf(q, "%lf %lf %lf %15s%n", &t, &alg, &bus, w, &k) != 4) break;
            q += k;
            CHECK_MSG(num(rec, "bytes") == (double)size && num(rec, "count") == (double)count,
                      "row %d: %llu bytes %llu elements, record %g / %g", rows, size, count, num(rec, "bytes"),
                      num(rec, "count"));
            CHECK_MSG(fabs(num(rec, "time_us_avg") - t) <= 0.5 * (t < 1e4 ? 0.01 : t < 1e6 ? 0.1 : 1) + 1e-9 &&
                          fabs(num(rec, "algbw_gbs") - alg) <= 0.005 + 1e-9 && fabs(num(rec, "busbw_gbs") - bus) <= 0.005 + 1e-9,
                      "row %d: table %g us %g %g GB/s, record %g us %g %g", rows, t, alg, bus, num(rec, "time_us_avg"),
                      num(rec, "algbw_gbs"), num(rec, "busbw_gbs"));
            CHECK_MSG(atof(w) == num(rec, "wrong"), "row %d: #wrong %s, record %g", rows, w, num(rec, "wrong"));
        }
        rows++;
    }
    CHECK_MSG(rows > 0 && !rec, "%d table rows; records left over: %s", rows, rec ? "yes" : "no");
    cJSON_Delete(p);
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
    CHECK_MSG(strstr(out, "# One rank: no data moves between ranks, so busbw is 0 for every collective") &&
                  strstr(out, "# Avg bus bandwidth    : 0 (one rank: no data moves between ranks)") &&
                  !strstr(out, "# Avg bus bandwidth    : 0\n"),
              "the table does not say that one rank moves no data:\n%s", out);
    int n = check_profile(json, "local", 1, "float", 65536);
    CHECK_MSG(n == 5 * 14 * 2, "%d records, want 5 collectives x 14 sizes x 2", n);
    CHECK_MSG(count_lines(csv) == n + 1, "CSV has %d lines for %d records", count_lines(csv), n);
    check_table_matches_profile(out, json);
    /* only in-place, two collectives, bf16 */
    snprintf(args, sizeof args, "bench comm -b 1K -e 4K -n 2 -w 0 -d bfloat16 --inplace "
                                "--collectives alltoall,all_reduce --csv '%s'", csv);
    rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 0 && !strstr(out, "out-of-place") && !strstr(out, "all_gather"), "rc %d: %s", rc, out);
    CHECK_MSG(count_lines(csv) == 1 + 2 * 3, "CSV has %d lines", count_lines(csv));
}

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* Odd rank counts and sizes that are not whole rank blocks: 3 and 4 ranks, sizes 6, 42, 294, ... bytes in float
 * and bf16 (count rounded down to whole blocks; 0 elements per block at 6 bytes); every result checked, the
 * factors as nccl-tests', the table the same as the JSON, and kiln bench report takes the profile (it refused
 * the 0-byte records that kiln bench comm writes for sizes below one element per block, the default -b 8 over
 * 3+ ranks included). */
TEST(bench_comm_three_and_four_ranks_mpi) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    const char *dir = test_tmpdir();
    for (int n = 3; n <= 4; n++) {
        const char *dt = n == 3 ? "float" : "bfloat16";
        char json[512], html[512], cmd[4096];
        static char out[131072];
        snprintf(json, sizeof json, "%s", test_join(dir, n == 3 ? "c3.json" : "c4.json"));
        snprintf(html, sizeof html, "%s", test_join(dir, n == 3 ? "c3.html" : "c4.html"));
        snprintf(cmd, sizeof cmd,
                 "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np %d "
                 "'%s' bench comm -b 6 -e 20K -f 7 -n 2 -w 1 -d %s --json '%s' 2>&1", n, KILN_BINARY, dt, json);
        int rc = test_run_shell(cmd, out, sizeof out);
        CHECK_MSG(rc == 0, "mpirun -np %d bench comm failed (%d): %s", n, rc, out);
        CHECK_MSG(strstr(out, n == 3 ? "backend mpi, 3 ranks" : "backend mpi, 4 ranks") && !strstr(out, "FAILED") &&
                      !strstr(out, "One rank"), "%s", out);
        int recs = check_profile(json, "mpi", n, dt, 20480);
        CHECK_MSG(recs == 5 * 5 * 2, "%d ranks: %d records, want 5 collectives x 5 sizes x 2", n, recs);
        check_table_matches_profile(out, json);
        snprintf(cmd, sizeof cmd, "bench report '%s' --out '%s'", json, html);
        rc = test_run_kiln(cmd, out, sizeof out);
        CHECK_MSG(rc == 0 && strstr(out, "50 comm"), "kiln %s: exit %d\n%s", cmd, rc, out);
    }
}

/* --json / --csv that cannot be written fail before anything is measured (they used to fail after the whole
 * sweep, whose numbers were then lost), under mpirun too, every rank stopping. */
TEST(bench_comm_unwritable_output_fails_first) {
    const char *dir = test_tmpdir();
    char args[2048], out[8192];
    snprintf(args, sizeof args, "bench comm -e 1K -n 1 -w 0 --json '%s'", test_join(dir, "nodir/comm.json"));
    int rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "--json") && strstr(out, "nodir/comm.json") && strstr(out, "nothing was run") &&
                  !strstr(out, "# Collective"), "rc %d: %s", rc, out);
    snprintf(args, sizeof args, "bench comm -e 1K -n 1 -w 0 --csv '%s'", dir);
    rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "is a directory") && !strstr(out, "# Collective"), "rc %d: %s", rc, out);
    if (!have_mpirun()) return;
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader timeout 60 mpirun --allow-run-as-root --oversubscribe "
             "-np 2 '%s' bench comm -e 1K -n 1 -w 0 --json '%s' 2>&1", KILN_BINARY, test_join(dir, "nodir/c.json"));
    static char mout[65536];
    rc = test_run_shell(cmd, mout, sizeof mout);
    CHECK_MSG(rc != 0 && rc != 124 && strstr(mout, "nothing was run") && !strstr(mout, "# Collective"), "rc %d: %s", rc,
              mout);
}

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

/* ---- stopped sweeps keep their records ---- */

/* Waits up to 60 s for `needle` in the file `path`; whether it came. */
static int wait_for_text(const char *path, const char *needle) {
    for (int i = 0; i < 6000; i++) {
        char *text = NULL;
        size_t len = 0;
        kiln_error_free(kiln_read_file(path, &text, &len));
        const int seen = text && strstr(text, needle);
        free(text);
        if (seen) return 1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* `sh -c cmd` in the background (output to log) until its sweep's first row is printed and, when `file` is not
 * NULL, that file exists; then signal `sig` to it and reap it. Returns the wait status; *came: whether they came
 * (the signal is sent either way). */
static int sweep_stopped(const char *cmd, const char *log, const char *file, int sig, int *came) {
    *came = 0;
    pid_t pid = test_spawn_logged(cmd, log);
    CHECK(pid > 0);
    if (pid <= 0) return -1;
    *came = wait_for_text(log, "float     sum");
    CHECK_MSG(*came, "no row of the sweep appeared in %s", log);
    for (int i = 0; *came && file && i < 6000 && access(file, F_OK) != 0; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (file && access(file, F_OK) != 0) *came = 0;
    CHECK_MSG(!file || *came, "no partial profile appeared at %s", file);
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* The records of a stopped sweep's profile: it parses, says why it is incomplete (`why` in its "incomplete"), has
 * at least `min` records of `ranks` ranks, and the CSV (when csv is not NULL) has a row for each. Returns the number
 * of records (-1 when the profile is unreadable). */
static int stopped_profile(const char *json, const char *csv, const char *why, int min, int ranks) {
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(json, &text, &len);
    CHECK_MSG(!e, "no profile after the stop: %s", e ? kiln_error_msg(e) : "");
    kiln_error_free(e);
    cJSON *p = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(p, "%s does not parse", json);
    if (!p) return -1;
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(p, "incomplete"), *recs = cJSON_GetObjectItemCaseSensitive(p, "comm");
    CHECK_MSG(cJSON_IsString(inc) && strstr(inc->valuestring, why), "\"incomplete\": %s (want it to say '%s')",
              cJSON_IsString(inc) ? inc->valuestring : "(absent)", why);
    const int n = cJSON_GetArraySize(recs);
    CHECK_MSG(n >= min, "%d records kept, want at least %d", n, min);
    for (int i = 0; i < n; i++) {
        const cJSON *r = cJSON_GetArrayItem(recs, i);
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(r, "ranks"), *t = cJSON_GetObjectItemCaseSensitive(r, "time_us_avg");
        CHECK_MSG(cJSON_IsNumber(rk) && rk->valueint == ranks, "record %d: ranks %g", i, cJSON_IsNumber(rk) ? rk->valuedouble : -1);
        CHECK_MSG(cJSON_IsNumber(t) && t->valuedouble > 0, "record %d: no time", i);
    }
    cJSON_Delete(p);
    if (csv) {
        char *t = NULL;
        size_t l = 0;
        kiln_error_free(kiln_read_file(csv, &t, &l));
        int lines = 0;
        for (size_t i = 0; t && i < l; i++) lines += t[i] == '\n';
        CHECK_MSG(lines == n + 1, "%s: %d lines for %d records", csv, lines, n);
        free(t);
    }
    return n;
}

/* Ctrl-C in a sweep lost every record measured: the JSON and CSV were written at the end only. Now the sweep stops
 * after the record running (every rank agreeing, in the timing's own all-reduce), the records measured so far are
 * written with "incomplete" saying why, and the process dies of the signal. One rank here; under mpirun below. */
TEST(bench_comm_ctrl_c_keeps_records) {
    const char *d = test_tmpdir();
    char json[512], csv[512], log[512], cmd[2048];
    snprintf(json, sizeof json, "%s", test_join(d, "c.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "c.csv"));
    snprintf(log, sizeof log, "%s", test_join(d, "c.log"));
    snprintf(cmd, sizeof cmd, "exec '%s' bench comm -b 1K -e 512M -f 2 -n 400 -d float --json '%s' --csv '%s'",
             KILN_BINARY, json, csv);
    int rows = 0;
    const int status = sweep_stopped(cmd, log, NULL, SIGINT, &rows);
    char *text = NULL;
    size_t len = 0;
    kiln_error_free(kiln_read_file(log, &text, &len));
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status %#x (want: killed by SIGINT)\n%s", status,
              text ? text : "");
    CHECK_MSG(text && strstr(text, "interrupted by signal 2") && strstr(text, "they are in"), "%s", text ? text : "");
    free(text);
    if (rows) stopped_profile(json, csv, "interrupted by signal 2", 2, 1);
    /* the report reads it and says it is incomplete */
    char html[512], args[1400];
    static char out[8192];
    snprintf(html, sizeof html, "%s", test_join(d, "c.html"));
    snprintf(args, sizeof args, "bench report '%s' --out '%s'", json, html);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 0, "%s", out);
    text = NULL;
    kiln_error_free(kiln_read_file(html, &text, &len));
    CHECK_MSG(text && strstr(text, "<th>incomplete</th>") && strstr(text, "interrupted by signal 2"),
              "the report does not say the profile is incomplete");
    free(text);
}

/* The same under mpirun: Ctrl-C reaches mpirun, which sends its ranks SIGTERM; all of them stop at the same record
 * and rank 0 writes what was measured. */
TEST(bench_comm_ctrl_c_under_mpirun_keeps_records) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    const char *d = test_tmpdir();
    char json[512], csv[512], log[512], cmd[2048];
    snprintf(json, sizeof json, "%s", test_join(d, "m.json"));
    snprintf(csv, sizeof csv, "%s", test_join(d, "m.csv"));
    snprintf(log, sizeof log, "%s", test_join(d, "m.log"));
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader exec mpirun --allow-run-as-root --oversubscribe -np 2 "
             "'%s' bench comm -b 1K -e 512M -f 2 -n 400 -d float --json '%s' --csv '%s'", KILN_BINARY, json, csv);
    int rows = 0;
    const int status = sweep_stopped(cmd, log, NULL, SIGINT, &rows);
    CHECK_MSG(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "mpirun exited 0 after Ctrl-C");
    if (rows) stopped_profile(json, csv, "interrupted by signal", 2, 2);
}

/* A sweep killed outright (SIGKILL: what mpirun sends ranks that outlast its SIGTERM) keeps the records up to its
 * last periodic save; KILN_BENCH_SAVE_EVERY=0 saves after every row. */
TEST(bench_comm_killed_keeps_saved_records) {
    const char *d = test_tmpdir();
    char json[512], log[512], cmd[2048];
    snprintf(json, sizeof json, "%s", test_join(d, "k.json"));
    snprintf(log, sizeof log, "%s", test_join(d, "k.log"));
    snprintf(cmd, sizeof cmd, "KILN_BENCH_SAVE_EVERY=0 exec '%s' bench comm -b 1K -e 512M -f 2 -n 400 -d float --json '%s'",
             KILN_BINARY, json);
    int saved = 0;
    const int status = sweep_stopped(cmd, log, json, SIGKILL, &saved);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (saved) stopped_profile(json, NULL, "still running", 1, 1);
}
