/* kiln bench io: every test measured on a scratch directory, the profile's io section, the scratch
 * files removed, the report's io section; bad flags. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ckpt_testutil.h"
#include "kiln/json.h"

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (d) closedir(d);
    return n;
}

TEST(ckpt_bench_io_profile_and_report) {
    char d[1024], scratch[1200], prof[1200], html[1200], args[4096], text[16384];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    snprintf(scratch, sizeof scratch, "%s/disk", d);
    snprintf(prof, sizeof prof, "%s/io.json", d);
    snprintf(html, sizeof html, "%s/io.html", d);
    CHECK(mkdir(scratch, 0755) == 0);
    snprintf(args, sizeof args, "bench io --dir '%s' --size 64K --files 3 --threads 2 --iters 1 --ckpt --json '%s'", scratch,
             prof);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "seq_write") && strstr(text, "ckpt_save"), "%s",
              text);
    CHECK_MSG(entries(scratch) == 0, "bench io left %d entries in %s", entries(scratch), scratch);
    cJSON *p = NULL;
    CHECK_OK(kiln_json_parse_file(prof, &p));
    const cJSON *io = cJSON_GetObjectItemCaseSensitive(p, "io"), *r;
    /* on tmpfs, ext4 or XFS a ninth record: the sequential write through the writer's mapped path */
    int fd = open(scratch, O_RDONLY | O_DIRECTORY);
    const int maps = fd >= 0 && kiln_fs_maps_safely(fd);
    if (fd >= 0) close(fd);
    const int nrec = 8 + maps;
    CHECK_MSG(cJSON_GetArraySize(io) == nrec, "%d records, want %d", cJSON_GetArraySize(io), nrec);
    const char *want[] = {"seq_write", "par_write", "seq_read", "par_read", "ckpt_save", "ckpt_async_total",
                          "ckpt_async_block", "ckpt_checksum", "seq_write_mapped"};
    int i = 0;
    cJSON_ArrayForEach(r, io) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "test"), *g = cJSON_GetObjectItemCaseSensitive(r, "gbs"),
                    *b = cJSON_GetObjectItemCaseSensitive(r, "bytes"), *th = cJSON_GetObjectItemCaseSensitive(r, "threads");
        CHECK_MSG(cJSON_IsString(t) && i < nrec && !strcmp(t->valuestring, want[i]), "record %d", i);
        CHECK_MSG(cJSON_IsNumber(g) && g->valuedouble > 0 && isfinite(g->valuedouble), "record %d: gbs", i);
        if (i < 4) CHECK(cJSON_IsNumber(b) && b->valuedouble == 3 * 65536.0);
        if (i < 4) CHECK(cJSON_IsNumber(th) && th->valuedouble == (i & 1 ? 2 : 1));
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "vs_seq_write");
        if (i == 4 || i == 5 || i == 8) CHECK_MSG(cJSON_IsNumber(v) && v->valuedouble > 0, "record %d: vs_seq_write", i);
        if (i == 8) CHECK(cJSON_IsNumber(b) && b->valuedouble == 3 * 65536.0);
        i++;
    }
    cJSON_Delete(p);
    snprintf(args, sizeof args, "bench report '%s' --out '%s'", prof, html);
    char recs[32];
    snprintf(recs, sizeof recs, "%d io records", nrec);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, recs), "%s", text);
    char *page = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(html, &page, &n));
    CHECK(page && strstr(page, "<section id=\"io\">") && strstr(page, "ckpt_async_block") && strstr(page, "<svg"));
    free(page);
}

TEST(ckpt_bench_io_bad_flags) {
    char text[8192], args[2048];
    CHECK(test_run_kiln("bench io", text, sizeof text) == 2 && strstr(text, "--dir"));
    CHECK(test_run_kiln("bench io --dir /tmp --size 10", text, sizeof text) == 2 && strstr(text, "--size"));
    CHECK(test_run_kiln("bench io --dir /tmp --files 0", text, sizeof text) == 2);
    CHECK(test_run_kiln("bench io --dir /tmp --frobnicate 1", text, sizeof text) == 2);
    CHECK(test_run_kiln("bench io --dir /nonexistent-io-dir", text, sizeof text) == 1 && strstr(text, "/nonexistent-io-dir"));
    CHECK(test_run_kiln("bench io --dir /tmp --device cuda", text, sizeof text) == 2 && strstr(text, "--ckpt"));
    CHECK(test_run_kiln("bench io --dir /tmp --ckpt --device tpu", text, sizeof text) == 2 && strstr(text, "tpu"));
    /* a full disk: the write error names the file, and nothing is left behind */
    char d[1024];
    snprintf(d, sizeof d, "%s", test_tmpdir());
    snprintf(args, sizeof args, "sh -c \"ulimit -f 100; '%s' bench io --dir '%s' --size 1M --files 1 --iters 1\" 2>&1",
             KILN_BINARY, d);
    int rc = test_run_shell(args, text, sizeof text);
    CHECK_MSG(rc != 0 && strstr(text, "kiln-io-"), "rc %d: %s", rc, text);
    CHECK_MSG(entries(d) == 0, "left %d files", entries(d));
}
