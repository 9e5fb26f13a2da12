/* Base helpers: JSON getters, file utilities, logging, progress output. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/log.h"
#include "kiln/progress.h"
#include "kiln/tune_cache.h"
#include "test.h"


static void put(const char *path, const char *text) { CHECK_OK(kiln_write_file_atomic(path, text, strlen(text))); }

/* ---- JSON ---- */

TEST(json_parse_error_has_line_and_column) {
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "config.json");
    put(path, "{\n  \"a\": 1,\n  \"b\": ]\n}\n");
    cJSON *root = (cJSON *)1;
    char want[1200];
    snprintf(want, sizeof want, "%s: invalid JSON at line 3, column 8 (near ']')", path);
    CHECK_ERR(kiln_json_parse_file(path, &root), want);
    CHECK(root == NULL);

    put(path, "{\"a\": 1,\n \"b\": 2");
    CHECK_ERR(kiln_json_parse_file(path, &root), "invalid JSON: unexpected end at line 2");
    put(path, "{\"a\": 1}\n  x");
    CHECK_ERR(kiln_json_parse_file(path, &root), "unexpected data after the value at line 2, column 3 (near 'x')");
    put(path, "");
    CHECK_ERR(kiln_json_parse_file(path, &root), "unexpected end at line 1, column 1");
    CHECK_ERR(kiln_json_parse_file(test_join(dir, "missing.json"), &root), "missing.json: cannot open: No such file");

    /* Without a context the message has no prefix. */
    CHECK_ERR(kiln_json_parse("[1,,2]", 6, NULL, &root), "invalid JSON at line 1, column 4");
    kiln_error *e = kiln_json_parse("[1,,2]", 6, NULL, &root);
    CHECK(e && strncmp(kiln_error_msg(e), "invalid JSON", 12) == 0);
    kiln_error_free(e);

    /* A number beyond the double range would be read as inf (and written back as null): refused, by its path.
     * Found by the zaya_config fuzz target ("rope_theta": 04e596). */
    CHECK_ERR(kiln_json_parse("{\"model\": {\"rope_theta\": 04e596}}", 33, "cfg", &root),
              "cfg: invalid JSON: the number at model.rope_theta is beyond the range of a double");
    CHECK_ERR(kiln_json_parse("[1, {\"x\": [2, -1e999]}]", 23, NULL, &root), "the number at [1].x[1] is beyond");
    CHECK_ERR(kiln_json_parse("1e400", 5, NULL, &root), "the number at the top level is beyond");
    CHECK(root == NULL);
    CHECK_OK(kiln_json_parse("[1.7e308, -1.7e308, 4.9e-324, 1e-400]", 37, NULL, &root));
    cJSON_Delete(root);

    /* Length-bounded: bytes past len are not read. */
    CHECK_OK(kiln_json_parse("{\"a\":1}garbage", 7, "t", &root));
    CHECK(cJSON_IsObject(root));
    cJSON_Delete(root);
}

/* kiln_json_print writes every number so that it reads back as the same double (cJSON alone does not) */
TEST(json_print_exact_numbers) {
    const double v[] = {0.1 + 0.2, 6434445538011819.0, 9007199254740991.0, 1e-300, 5e-324, -0.0, 1.7976931348623157e308,
                        100, -2.5, 3e-3 * 1.0000000000000002, 123456789012345678.0};
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(INFINITY));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "nested", a);
    for (int formatted = 0; formatted < 2; formatted++) {
        char *t = kiln_json_print(o, formatted);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK_MSG(strstr(t, "0.30000000000000004") && strstr(t, "9007199254740991") && strstr(t, "100,"), "%s", t);
        cJSON *back = NULL;
        CHECK_OK(kiln_json_parse(t, strlen(t), "printed", &back));
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(back, "nested");
        for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
            const double x = cJSON_GetArrayItem(b, (int)i)->valuedouble;
            CHECK_MSG(x == v[i] && signbit(x) == signbit(v[i]), "%.17g printed, read back as %.17g", v[i], x);
        }
        CHECK(cJSON_IsNull(cJSON_GetArrayItem(b, (int)(sizeof v / sizeof *v)))); /* inf: null, as cJSON prints it */
        cJSON_Delete(back);
        free(t);
    }
    /* the tree printed is left as it was: numbers still numbers */
    CHECK(cJSON_IsNumber(cJSON_GetArrayItem(a, 0)) && cJSON_GetArrayItem(a, 0)->valuedouble == 0.1 + 0.2);
    cJSON_Delete(o);
}

TEST(json_typed_getters) {
    cJSON *root = NULL;
    const char *text = "{\"hidden_size\": 4096, \"big\": 1e3, \"frac\": 1.5, \"name\": \"zaya\", \"eps\": 1e-6,"
                       " \"tie\": true, \"off\": false, \"str_int\": \"32\", \"nothing\": null, \"neg\": -2,"
                       " \"list\": [1, 2], \"sub\": {\"x\": 1}, \"huge\": 1e300}";
    CHECK_OK(kiln_json_parse(text, strlen(text), "config.json", &root));
    int64_t i = 0;
    double d = 0;
    int b = -1;
    const char *s = NULL;
    const cJSON *node = NULL;

    CHECK_OK(kiln_json_get_int(root, "hidden_size", &i, 0, 1, "config.json"));
    CHECK(i == 4096);
    CHECK_OK(kiln_json_get_int(root, "big", &i, 0, 1, "config.json"));
    CHECK(i == 1000);
    CHECK_OK(kiln_json_get_int(root, "neg", &i, 0, 1, "config.json"));
    CHECK(i == -2);
    CHECK_OK(kiln_json_get_int(root, "absent", &i, 77, 0, "config.json"));
    CHECK(i == 77);
    CHECK_OK(kiln_json_get_int(root, "nothing", &i, 78, 0, "config.json")); /* null = missing */
    CHECK(i == 78);
    CHECK_OK(kiln_json_get_double(root, "eps", &d, 0, 1, "config.json"));
    CHECK(d == 1e-6);
    CHECK_OK(kiln_json_get_double(root, "hidden_size", &d, 0, 1, "config.json")); /* ints are numbers */
    CHECK(d == 4096);
    CHECK_OK(kiln_json_get_bool(root, "tie", &b, 0, 1, "config.json"));
    CHECK(b == 1);
    CHECK_OK(kiln_json_get_bool(root, "off", &b, 1, 1, "config.json"));
    CHECK(b == 0);
    CHECK_OK(kiln_json_get_bool(root, "absent", &b, 1, 0, "config.json"));
    CHECK(b == 1);
    CHECK_OK(kiln_json_get_string(root, "name", &s, NULL, 1, "config.json"));
    CHECK(s && strcmp(s, "zaya") == 0);
    CHECK_OK(kiln_json_get_string(root, "absent", &s, "dflt", 0, "config.json"));
    CHECK(s && strcmp(s, "dflt") == 0);
    CHECK_OK(kiln_json_get_array(root, "list", &node, 1, "config.json"));
    CHECK(node && cJSON_GetArraySize(node) == 2);
    CHECK_OK(kiln_json_get_array(root, "absent", &node, 0, "config.json"));
    CHECK(node == NULL);
    CHECK_OK(kiln_json_get_object(root, "sub", &node, 1, "config.json"));
    CHECK(node && cJSON_IsObject(node));

    /* wrong types, each naming the field and what was found */
    CHECK_ERR(kiln_json_get_int(root, "str_int", &i, 0, 1, "config.json"),
              "config.json: field 'str_int' must be an integer, got string \"32\"");
    CHECK_ERR(kiln_json_get_int(root, "frac", &i, 0, 1, "config.json"),
              "config.json: field 'frac' must be an integer, got 1.5");
    CHECK_ERR(kiln_json_get_int(root, "huge", &i, 0, 1, "config.json"), "field 'huge' must be an integer, got 1e+300");
    CHECK_ERR(kiln_json_get_int(root, "tie", &i, 0, 1, "config.json"), "field 'tie' must be an integer, got boolean");
    CHECK_ERR(kiln_json_get_double(root, "name", &d, 0, 1, "config.json"), "field 'name' must be a number, got string");
    CHECK_ERR(kiln_json_get_bool(root, "hidden_size", &b, 0, 1, "config.json"),
              "field 'hidden_size' must be true or false, got number");
    CHECK_ERR(kiln_json_get_string(root, "list", &s, NULL, 1, "config.json"),
              "field 'list' must be a string, got array");
    CHECK_ERR(kiln_json_get_array(root, "sub", &node, 1, "config.json"), "field 'sub' must be an array, got object");
    CHECK_ERR(kiln_json_get_object(root, "list", &node, 0, "config.json"), "field 'list' must be an object, got array");
    /* on error the output is left alone */
    i = 5;
    kiln_error_free(kiln_json_get_int(root, "frac", &i, 0, 1, "config.json"));
    CHECK(i == 5);

    /* missing required fields */
    CHECK_ERR(kiln_json_get_int(root, "vocab_size", &i, 0, 1, "config.json"),
              "config.json: missing required field 'vocab_size'");
    CHECK_ERR(kiln_json_get_string(root, "nothing", &s, NULL, 1, "config.json"), "missing required field 'nothing'");
    CHECK_ERR(kiln_json_get_bool(NULL, "x", &b, 0, 1, NULL), "missing required field 'x'");
    cJSON_Delete(root);
}

TEST(json_repeated_key_last_wins) {
    cJSON *root = NULL;
    CHECK_OK(kiln_json_parse("{\"a\": 1, \"a\": 2}", 16, "t", &root));
    int64_t i = 0;
    CHECK_OK(kiln_json_get_int(root, "a", &i, 0, 1, "t"));
    CHECK(i == 2); /* as Python's json module, which writes most configs */
    cJSON_Delete(root);
}

/* ---- fsutil ---- */

TEST(fs_path_join) {
    char *p = kiln_path_join("a/b", "c.json");
    CHECK(p && strcmp(p, "a/b/c.json") == 0);
    free(p);
    p = kiln_path_join("a/b/", "c.json");
    CHECK(p && strcmp(p, "a/b/c.json") == 0);
    free(p);
    p = kiln_path_join("", "c.json");
    CHECK(p && strcmp(p, "c.json") == 0);
    free(p);
    p = kiln_path_join(NULL, "c.json");
    CHECK(p && strcmp(p, "c.json") == 0);
    free(p);
    p = kiln_path_join("/", "etc");
    CHECK(p && strcmp(p, "/etc") == 0);
    free(p);
}

TEST(fs_read_and_atomic_write) {
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "f.bin");
    char data[10000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)(i * 7);
    CHECK_OK(kiln_write_file_atomic(path, data, sizeof data));
    char *got = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &got, &n));
    CHECK(n == sizeof data && got && memcmp(got, data, n) == 0 && got[n] == 0);
    free(got);

    CHECK_OK(kiln_write_file_atomic(path, "short", 5)); /* overwrite, shrinking */
    CHECK_OK(kiln_read_file(path, &got, &n));
    CHECK(n == 5 && strcmp(got, "short") == 0);
    free(got);

    CHECK_OK(kiln_write_file_atomic(path, NULL, 0)); /* empty file */
    CHECK_OK(kiln_read_file(path, &got, &n));
    CHECK(n == 0 && got && got[0] == 0);
    free(got);

    /* only f.bin: no temp files left behind */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *de; d && (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) entries++;
    if (d) closedir(d);
    CHECK(entries == 1);
}

TEST(fs_errors_name_the_path) {
    const char *dir = test_tmpdir();
    char *got = (char *)1;
    size_t n = 1;
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", test_join(dir, "nope"));
    CHECK_ERR(kiln_read_file(test_join(dir, "nope"), &got, &n), want);
    CHECK(got == NULL && n == 0);
    CHECK_ERR(kiln_read_file(dir, &got, &n), "Is a directory");

    const char *target = test_join(dir, "missing/f.txt");
    CHECK_ERR(kiln_write_file_atomic(target, "x", 1), "missing/f.txt: cannot create temp file");
    struct stat sb;
    CHECK(stat(test_join(dir, "missing"), &sb) != 0);

    /* Renaming onto a directory fails after the temp was written: the temp
     * must be removed and the directory left alone. */
    mkdir(test_join(dir, "adir"), 0700);
    CHECK_ERR(kiln_write_file_atomic(test_join(dir, "adir"), "x", 1), "cannot rename");
    CHECK(stat(test_join(dir, "adir"), &sb) == 0 && S_ISDIR(sb.st_mode));
    char tmpname[64];
    snprintf(tmpname, sizeof tmpname, "adir.tmp.%ld", (long)getpid());
    CHECK(stat(test_join(dir, tmpname), &sb) != 0);
}

TEST(fs_stale_temp_file_is_replaced) {
    /* A temp file left by a crashed process with our pid must not block us. */
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "f.txt");
    char stale[1200];
    snprintf(stale, sizeof stale, "%s.tmp.%ld", path, (long)getpid());
    put(stale, "junk");
    CHECK_OK(kiln_write_file_atomic(path, "fresh", 5));
    char *got;
    size_t n;
    CHECK_OK(kiln_read_file(path, &got, &n));
    CHECK(n == 5 && memcmp(got, "fresh", 5) == 0);
    free(got);
    struct stat sb;
    CHECK(stat(stale, &sb) != 0);
}

/* ---- stderr capture for log and progress ---- */

static int saved_fd = -1;
static char capture_path[1024];

static void capture_begin(void) {
    snprintf(capture_path, sizeof capture_path, "%s", test_join(test_tmpdir(), "stderr.txt"));
    fflush(stderr);
    saved_fd = dup(2);
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
}

/* Stop capturing; returns the captured text (malloc'd). */
static char *capture_end(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    char *text = NULL;
    size_t n;
    kiln_error *e = kiln_read_file(capture_path, &text, &n);
    if (e) {
        kiln_error_free(e);
        return calloc(1, 1);
    }
    return text;
}

static int count_str(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

TEST(fs_mkdirs_makes_parents) {
    const char *dir = test_tmpdir();
    struct stat sb;
    CHECK_OK(kiln_mkdirs(test_join(dir, "a/b//c/")));
    CHECK(stat(test_join(dir, "a/b/c"), &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK_OK(kiln_mkdirs(test_join(dir, "a/b/c"))); /* existing: fine */
    put(test_join(dir, "file"), "x");
    CHECK_ERR(kiln_mkdirs(test_join(dir, "file/d")), "file/d: cannot create");
    CHECK_ERR(kiln_mkdirs(""), "empty directory name");
    char *got = NULL;
    size_t n = 0;
    kiln_error *e = kiln_read_file(test_join(dir, "nope"), &got, &n);
    CHECK(e && kiln_error_code(e) == KILN_ENOTFOUND);
    kiln_error_free(e);
}

/* ---- the tuning cache ---- */

static long cache_get(const char *path, const char *key, int *found) {
    long v = -12345;
    CHECK_OK(kiln_tune_cache_get(path, key, &v, found));
    return v;
}

TEST(tune_cache_stores_replaces_and_keeps_order) {
    const char *path = test_join(test_tmpdir(), "t.txt");
    int found = 1;
    cache_get(path, "a", &found);
    CHECK(!found); /* no file yet: not an error */
    CHECK_OK(kiln_tune_cache_put(path, "a|1 2 3", 1));
    CHECK_OK(kiln_tune_cache_put(path, "b|H200 lt 130000", 2));
    CHECK_OK(kiln_tune_cache_put(path, "a|1 2 3", -3)); /* replaced, moved last */
    CHECK(cache_get(path, "a|1 2 3", &found) == -3 && found);
    CHECK(cache_get(path, "b|H200 lt 130000", &found) == 2 && found);
    cache_get(path, "a|1 2", &found); /* a prefix of a key is another key */
    CHECK(!found);
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &text, &n));
    CHECK_MSG(text && !strcmp(text, "b|H200 lt 130000\t2\na|1 2 3\t-3\n"), "file: [%s]", text ? text : "");
    free(text);
}

TEST(tune_cache_skips_damaged_lines) {
    const char *path = test_join(test_tmpdir(), "t.txt");
    put(path, "garbage without a tab\nk\tnot a number\nk\t7\n\tno key 3\nz\t12x\nother\t5");
    int found = 0;
    CHECK(cache_get(path, "k", &found) == 7 && found);
    CHECK(cache_get(path, "other", &found) == 5 && found); /* the last line without its newline */
    cache_get(path, "z", &found);
    CHECK(!found);
    CHECK_OK(kiln_tune_cache_put(path, "new", 9)); /* the store drops what does not parse */
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &text, &n));
    CHECK_MSG(text && !strcmp(text, "k\t7\nother\t5\nnew\t9\n"), "file: [%s]", text ? text : "");
    free(text);
    CHECK_ERR(kiln_tune_cache_put(path, "a\tb", 1), "tab or a line break");
    CHECK_ERR(kiln_tune_cache_put(path, "", 1), "empty key");
    long v = 0;
    CHECK_ERR(kiln_tune_cache_get(test_tmpdir(), "k", &v, &found), "Is a directory");
}

TEST(tune_cache_path_from_the_environment) {
    const char *dir = test_tmpdir();
    char *saved[3] = {NULL, NULL, NULL};
    const char *names[3] = {"KILN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    for (int i = 0; i < 3; i++)
        if (getenv(names[i])) saved[i] = strdup(getenv(names[i]));
    char *p = NULL;
    struct stat sb;
    setenv("KILN_CACHE_DIR", test_join(dir, "k/c"), 1);
    CHECK_OK(kiln_tune_cache_path("f.txt", &p));
    CHECK(p && !strcmp(p, test_join(dir, "k/c/f.txt")) && stat(test_join(dir, "k/c"), &sb) == 0);
    free(p);
    unsetenv("KILN_CACHE_DIR");
    setenv("XDG_CACHE_HOME", test_join(dir, "x"), 1);
    CHECK_OK(kiln_tune_cache_path("f.txt", &p));
    CHECK(p && !strcmp(p, test_join(dir, "x/kiln/f.txt")));
    free(p);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", test_join(dir, "h"), 1);
    CHECK_OK(kiln_tune_cache_path("f.txt", &p));
    CHECK(p && !strcmp(p, test_join(dir, "h/.cache/kiln/f.txt")));
    free(p);
    unsetenv("HOME");
    CHECK_ERR(kiln_tune_cache_path("f.txt", &p), "none of KILN_CACHE_DIR");
    CHECK(p == NULL);
    for (int i = 0; i < 3; i++)
        if (saved[i]) setenv(names[i], saved[i], 1), free(saved[i]);
}

TEST(log_levels_and_tags) {
    kiln_log_level saved = kiln_log_get_level();
    kiln_log_set_level(KILN_LOG_INFO);
    capture_begin();
    kiln_log(KILN_LOG_ERROR, "bad %d", 1);
    kiln_log(KILN_LOG_WARN, "careful\n");
    kiln_log(KILN_LOG_INFO, "loaded %s", "model");
    kiln_log(KILN_LOG_DEBUG, "hidden");
    kiln_log_set_level(KILN_LOG_DEBUG);
    kiln_log(KILN_LOG_DEBUG, "shown");
    kiln_log_set_level(KILN_LOG_ERROR);
    kiln_log(KILN_LOG_WARN, "suppressed");
    char longmsg[2000];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = 0;
    kiln_log(KILN_LOG_ERROR, "%s", longmsg);
    char *out = capture_end();
    kiln_log_set_level(saved);
    const char *want = "kiln: error: bad 1\nkiln: warning: careful\nkiln: loaded model\nkiln: debug: shown\n";
    CHECK_MSG(strncmp(out, want, strlen(want)) == 0, "got '%s'", out);
    CHECK(!strstr(out, "hidden") && !strstr(out, "suppressed"));
    CHECK(strstr(out, longmsg) != NULL);
    free(out);
    CHECK(kiln_log_enabled(KILN_LOG_ERROR));
}

TEST(log_level_names) {
    kiln_log_level l = KILN_LOG_INFO;
    CHECK(kiln_log_level_parse("debug", &l) == 0 && l == KILN_LOG_DEBUG);
    CHECK(kiln_log_level_parse("WARN", &l) == 0 && l == KILN_LOG_WARN);
    CHECK(kiln_log_level_parse("warning", &l) == 0 && l == KILN_LOG_WARN);
    CHECK(kiln_log_level_parse("error", &l) == 0 && l == KILN_LOG_ERROR);
    CHECK(kiln_log_level_parse("info", &l) == 0 && l == KILN_LOG_INFO);
    CHECK(kiln_log_level_parse("loud", &l) == -1 && l == KILN_LOG_INFO);
    CHECK(kiln_log_level_parse(NULL, &l) == -1);
}

/* What was written to the temporary file f, as a string in buf (closes f); returns its length. */
static size_t read_back(FILE *f, char *buf, size_t cap) {
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return n;
}

/* A progress line for `what` (total, unit; drawn as on a terminal when tty) written to a temporary
 * file, updated to each of 1..total and finished twice (the second finish must be a no-op); its
 * output in buf. Returns the output's length. */
static size_t progress_run(const char *what, uint64_t total, const char *unit, int tty, char *buf, size_t cap) {
    FILE *f = tmpfile();
    kiln_progress p;
    unsetenv("KILN_PROGRESS");
    kiln_progress_start_to(&p, what, total, unit, f, tty);
    for (uint64_t i = 1; i <= total; i++) kiln_progress_update(&p, i);
    kiln_progress_finish(&p);
    kiln_progress_finish(&p);
    return read_back(f, buf, cap);
}

TEST(progress_plain_lines) {
    char buf[4096];
    progress_run("train", 1000, "step", 0, buf, sizeof buf);
    /* A fast loop in a log gets just the final line. */
    CHECK_MSG(count_str(buf, "\n") == 1, "got '%s'", buf);
    CHECK_MSG(strncmp(buf, "train: 1000/1000 step (100.0%), ", 32) == 0, "got '%s'", buf);
    CHECK(strstr(buf, "step/s, elapsed 0:00, eta 0:00\n") != NULL);
    CHECK(!strchr(buf, '\r'));

    /* unknown total */
    FILE *f = tmpfile();
    kiln_progress p;
    kiln_progress_start_to(&p, "tokens", 0, "tok", f, 0);
    kiln_progress_update(&p, 12345);
    kiln_progress_finish(&p);
    read_back(f, buf, sizeof buf);
    CHECK_MSG(strncmp(buf, "tokens: 12345 tok, ", 19) == 0 && !strstr(buf, "eta"), "got '%s'", buf);
}

TEST(progress_tty_redraws_in_place) {
    char buf[4096];
    size_t n = progress_run("load", 4, "file", 1, buf, sizeof buf);
    /* first update drawn at once, the rest throttled, then the final line */
    CHECK_MSG(count_str(buf, "\r") >= 2 && count_str(buf, "\r") <= 5, "got '%s'", buf);
    CHECK(strstr(buf, "\rload [######..................] 1/4 file") != NULL);
    CHECK(strstr(buf, "\rload [########################] 4/4 file") != NULL);
    CHECK(count_str(buf, "\n") == 1 && buf[n - 1] == '\n');
    CHECK(strstr(buf, "\033[K") != NULL);
}

TEST(progress_disabled_by_env) {
    FILE *f = tmpfile();
    kiln_progress p;
    setenv("KILN_PROGRESS", "0", 1);
    kiln_progress_start_to(&p, "x", 10, "it", f, 1);
    kiln_progress_update(&p, 5);
    kiln_progress_finish(&p);
    unsetenv("KILN_PROGRESS");
    CHECK(ftell(f) == 0);
    fclose(f);

    /* the stderr entry point works too (and stays quiet when disabled) */
    setenv("KILN_PROGRESS", "0", 1);
    capture_begin();
    kiln_progress_start(&p, "y", 3, "it");
    kiln_progress_update(&p, 3);
    kiln_progress_finish(&p);
    char *out = capture_end();
    unsetenv("KILN_PROGRESS");
    CHECK_MSG(out[0] == 0, "got '%s'", out);
    free(out);
}
