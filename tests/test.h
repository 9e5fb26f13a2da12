/* A tiny test harness: TEST(name) { ... } registers a test; CHECK* record
 * failures with file:line and keep going within the test. The runner prints one
 * line per test and closes with "N passed, N failed". */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln/error.h"

typedef void (*test_fn)(void);
void test_register(const char *name, const char *file, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...);
/* Path of a file in the source tree (tests/fixtures/...), in a static buffer rotated 8 ways. */
const char *test_src_path(const char *rel);
/* dir + "/" + name, in a static buffer rotated 8 ways. */
const char *test_join(const char *dir, const char *name);
/* A fresh empty temp directory for this test (removed at exit). */
const char *test_tmpdir(void);
/* Run the kiln binary with args (shell-quoted by the caller); returns exit status, captures stderr+stdout. */
int test_run_kiln(const char *args, char *out, size_t outcap);
/* Run a shell command line (redirect stderr yourself: "... 2>&1"); the same status and capture. */
int test_run_shell(const char *cmd, char *out, size_t outcap);
/* `sh -c cmd` in the background, stdout and stderr to the file `log`; its pid (start cmd with exec for the
 * command's own), -1 when it could not start. The caller signals and reaps it (waitpid). */
int test_spawn_logged(const char *cmd, const char *log);
/* Load a local HTML file in headless Chromium (a test dependency: .ci/run and scripts/setup.sh install
 * it; missing, the test fails). *dom: the DOM after scripts ran; *log: Chromium's stderr, where console
 * messages and failed loads appear; both malloc'd (NULL on failure). Returns Chromium's exit status. */
int test_chromium_dom(const char *html, char **dom, char **log);
/* A PNG screenshot of the page at width x height; returns Chromium's exit status. */
int test_chromium_screenshot(const char *html, const char *png, int width, int height);

#define TEST(name)                                                        \
    static void name(void);                                               \
    __attribute__((constructor)) static void name##_register(void) {      \
        test_register(#name, __FILE__, name);                             \
    }                                                                     \
    static void name(void)

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);   \
    } while (0)
#define CHECK_MSG(cond, ...)                                              \
    do {                                                                  \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);          \
    } while (0)
/* The call must succeed; prints the error message otherwise. */
#define CHECK_OK(expr)                                                    \
    do {                                                                  \
        kiln_error *chk_e_ = (expr);                                      \
        if (chk_e_) {                                                     \
            test_fail(__FILE__, __LINE__, "%s failed: %s", #expr, kiln_error_msg(chk_e_)); \
            kiln_error_free(chk_e_);                                      \
        }                                                                 \
    } while (0)
/* The call must fail and its message must contain `needle`. */
#define CHECK_ERR(expr, needle)                                           \
    do {                                                                  \
        kiln_error *chk_e_ = (expr);                                      \
        if (!chk_e_) test_fail(__FILE__, __LINE__, "%s succeeded, expected error containing '%s'", #expr, needle); \
        else {                                                            \
            if (!strstr(kiln_error_msg(chk_e_), needle))                  \
                test_fail(__FILE__, __LINE__, "%s: error '%s' lacks '%s'", #expr, kiln_error_msg(chk_e_), needle); \
            kiln_error_free(chk_e_);                                      \
        }                                                                 \
    } while (0)
#define CHECK_NEAR(a, b, tol)                                             \
    do {                                                                  \
        double chk_a_ = (a), chk_b_ = (b);                                \
        if (!(fabs(chk_a_ - chk_b_) <= (tol)))                            \
            test_fail(__FILE__, __LINE__, "%s = %g, %s = %g, |diff| > %g", #a, chk_a_, #b, chk_b_, (double)(tol)); \
    } while (0)

#endif
