/* Test runner: runs every registered test (or those whose name contains argv[1]). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "test.h"

#define MAX_TESTS 1024
struct test_entry { const char *name, *file; test_fn fn; };
static struct test_entry tests[MAX_TESTS];
static int ntests, cur_failed;
static char tmp_root[256];
static int tmp_seq;

void test_register(const char *name, const char *file, test_fn fn) {
    if (ntests < MAX_TESTS) tests[ntests++] = (struct test_entry){name, file, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "    %s:%d: ", file, line);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    va_end(ap);
    cur_failed++;
}

const char *test_join(const char *dir, const char *name) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

const char *test_src_path(const char *rel) { return test_join(KILN_SOURCE_DIR, rel); }

const char *test_tmpdir(void) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/t%d", tmp_root, tmp_seq++);
    mkdir(b, 0700);
    return b;
}

int test_run_kiln(const char *args, char *out, size_t outcap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KILN_BINARY, args);
    return test_run_shell(cmd, out, outcap);
}

int test_spawn_logged(const char *cmd, const char *log) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid > 0 ? (int)pid : -1;
}

int test_run_shell(const char *cmd, char *out, size_t outcap) {
    if (out && outcap) out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0;
    if (out && outcap) {
        n = fread(out, 1, outcap - 1, p);
        out[n] = 0;
    }
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Chromium as the tests run it: headless, no network, console messages on stderr. */
static const char chromium_flags[] = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                                     "--disable-background-networking --disable-component-update --disable-sync "
                                     "--enable-logging=stderr --v=0";

static int have_chromium(void) {
    if (system("command -v chromium >/dev/null 2>&1") == 0) return 1;
    test_fail(__FILE__, __LINE__, "chromium is not installed (apt-get install -y chromium); this test needs it");
    return 0;
}

int test_chromium_dom(const char *html, char **dom, char **log) {
    *dom = *log = NULL;
    if (!have_chromium()) return -1;
    const char *d = test_tmpdir();
    char domf[600], logf[600], cmd[4096];
    snprintf(domf, sizeof domf, "%s/dom.html", d);
    snprintf(logf, sizeof logf, "%s/chromium.log", d);
    snprintf(cmd, sizeof cmd, "timeout 120 chromium %s --user-data-dir='%s/profile' --dump-dom 'file://%s' >'%s' 2>'%s'",
             chromium_flags, d, html, domf, logf);
    int rc = system(cmd);
    size_t len;
    kiln_error *e = kiln_read_file(domf, dom, &len);
    if (!e) e = kiln_read_file(logf, log, &len);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s", kiln_error_msg(e));
        kiln_error_free(e);
    }
    return rc;
}

int test_chromium_screenshot(const char *html, const char *png, int width, int height) {
    if (!have_chromium()) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 120 chromium %s --user-data-dir='%s/profile' --hide-scrollbars --window-size=%d,%d "
             "--screenshot='%s' 'file://%s' >/dev/null 2>&1",
             chromium_flags, test_tmpdir(), width, height, png, html);
    return system(cmd);
}

static int cmp_tests(const void *a, const void *b) {
    const struct test_entry *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/kiln-tests.XXXXXX");
    if (!mkdtemp(tmp_root)) { perror("mkdtemp"); return 2; }
    qsort(tests, (size_t)ntests, sizeof tests[0], cmp_tests);
    int passed = 0, failed = 0;
    for (int i = 0; i < ntests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        cur_failed = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        printf("%s %-48s (%.0f ms)\n", cur_failed ? "FAIL" : "ok  ", tests[i].name, ms);
        fflush(stdout);
        if (cur_failed) failed++; else passed++;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmp_root);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
