/* The fault-tolerance pieces on their own: step ranges, the KILN_FAULT spec, heartbeats, the
 * spike and straggler detectors, the incident log, the trainer's environment, and kiln run's
 * command line. The supervisor against real faults is in test_ft_faults.c. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../src/ft/ft_internal.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/json.h"
#include "test.h"

TEST(ft_step_ranges) {
    kiln_step_ranges r = {0};
    CHECK_OK(kiln_step_ranges_parse("20-22,9,10-11,3", &r));
    char buf[128];
    CHECK_MSG(!strcmp(kiln_step_ranges_format(&r, buf, sizeof buf), "3,9-11,20-22"), "got %s", buf);
    CHECK(kiln_step_ranges_contains(&r, 3) && kiln_step_ranges_contains(&r, 10) && kiln_step_ranges_contains(&r, 22));
    CHECK(!kiln_step_ranges_contains(&r, 4) && !kiln_step_ranges_contains(&r, 12) && !kiln_step_ranges_contains(&r, 23));
    CHECK_OK(kiln_step_ranges_add(&r, 12, 19)); /* joins 9-11 and 20-22 */
    CHECK_MSG(!strcmp(kiln_step_ranges_format(&r, buf, sizeof buf), "3,9-22"), "got %s", buf);
    CHECK_OK(kiln_step_ranges_parse("", &r));
    CHECK_OK(kiln_step_ranges_parse(NULL, &r));
    CHECK(r.n == 2);
    CHECK_ERR(kiln_step_ranges_parse("4,x", &r), "'x'");
    CHECK_ERR(kiln_step_ranges_parse("9-3", &r), "9-3");
    CHECK_ERR(kiln_step_ranges_parse("0", &r), "need 1 <=");
    CHECK_ERR(kiln_step_ranges_parse("1-", &r), "'1-'");
    CHECK_ERR(kiln_step_ranges_parse("5,,6", &r), "''");
    kiln_step_ranges_free(&r);
}

TEST(ft_fault_spec) {
    kiln_faults f;
    CHECK_OK(kiln_faults_parse("kill:rank=1:step=7,stop:step=5:attempt=2,crash-in-save:step=10:bytes=100,slow:rank=1:step=3:ms=5",
                               &f));
    CHECK(f.n == 4);
    CHECK(kiln_faults_find(&f, KILN_FAULT_KILL, 1, 7, 1) != NULL);
    CHECK(kiln_faults_find(&f, KILN_FAULT_KILL, 0, 7, 1) == NULL);  /* another rank */
    CHECK(kiln_faults_find(&f, KILN_FAULT_KILL, 1, 7, 2) == NULL);  /* the restarted run gets past it */
    CHECK(kiln_faults_find(&f, KILN_FAULT_STOP, 0, 5, 1) == NULL);
    CHECK(kiln_faults_find(&f, KILN_FAULT_STOP, 0, 5, 2) != NULL);
    const kiln_fault *c = kiln_faults_find(&f, KILN_FAULT_CRASH_IN_SAVE, 0, 10, 1);
    CHECK(c && c->bytes == 100);
    CHECK(kiln_faults_find(&f, KILN_FAULT_SLOW, 1, 2, 1) == NULL);
    CHECK(kiln_faults_find(&f, KILN_FAULT_SLOW, 1, 9, 1) != NULL); /* every step from 3 on */
    CHECK_ERR(kiln_faults_parse("explode:step=1", &f), "unknown kind 'explode'");
    CHECK_ERR(kiln_faults_parse("kill:rank=1", &f), "needs step=N");
    CHECK_ERR(kiln_faults_parse("kill:step=x", &f), "step='x'");
    CHECK_ERR(kiln_faults_parse("kill:step=3:when=4", &f), "unknown key 'when'");
    CHECK_ERR(kiln_faults_parse("kill:step", &f), "not key=value");
    /* an int field must not wrap onto a real rank or attempt (4294967296 -> 0) */
    CHECK_ERR(kiln_faults_parse("kill:rank=4294967296:step=3", &f), "rank=4294967296 is out of range");
    CHECK_ERR(kiln_faults_parse("kill:step=3:attempt=2147483648", &f), "attempt=2147483648 is out of range");
    CHECK_OK(kiln_faults_parse("", &f));
    CHECK(f.n == 0);
}

TEST(ft_heartbeat_roundtrip) {
    const char *dir = test_tmpdir();
    kiln_heartbeat h = {0};
    h.rank = 3, h.world = 4, h.attempt = 2, h.pid = 12345, h.step = 41, h.steps = 100;
    snprintf(h.phase, sizeof h.phase, "train");
    h.loss = NAN, h.grad_norm = INFINITY, h.local_grad_norm = 0.25, h.step_s = 0.5, h.compute_s = 0.375, h.time = 1.7e9;
    for (int s = 1; s <= 41; s++) kiln_heartbeat_record(&h, s, s == 40 ? -INFINITY : 1.0 / s, 2.0 * s);
    CHECK(h.nrecent == KILN_HB_RECENT && h.recent[0].step == 41 - KILN_HB_RECENT + 1 && h.recent[KILN_HB_RECENT - 1].step == 41);
    CHECK_OK(kiln_heartbeat_write(dir, &h));
    kiln_heartbeat g;
    CHECK_OK(kiln_heartbeat_read(dir, 3, &g));
    CHECK(g.rank == 3 && g.world == 4 && g.attempt == 2 && g.pid == 12345 && g.step == 41 && g.steps == 100);
    CHECK(!strcmp(g.phase, "train") && isnan(g.loss) && isinf(g.grad_norm) && g.grad_norm > 0);
    CHECK(g.local_grad_norm == 0.25 && g.step_s == 0.5 && g.compute_s == 0.375 && g.time == 1.7e9);
    CHECK(g.nrecent == KILN_HB_RECENT);
    for (int i = 0; i < g.nrecent; i++) {
        int64_t s = 41 - KILN_HB_RECENT + 1 + i;
        CHECK(g.recent[i].step == s && g.recent[i].grad_norm == 2.0 * (double)s);
        if (s == 40) CHECK(isinf(g.recent[i].loss) && g.recent[i].loss < 0);
        else CHECK(g.recent[i].loss == 1.0 / (double)s);
    }
    /* no temp file is left beside it */
    CHECK(access(test_join(dir, "rank_00003.json.tmp"), F_OK) != 0);
    /* malformed beats are errors naming the file */
    CHECK_ERR(kiln_heartbeat_read(dir, 2, &g), "rank_00002.json");
    const char *bad = "{\"rank\":1,\"world\":2,\"attempt\":1,\"pid\":1,\"step\":1,\"steps\":2,\"phase\":\"train\","
                      "\"loss\":\"lots\",\"grad_norm\":1,\"local_grad_norm\":1,\"step_s\":1,\"compute_s\":1,\"time\":1,\"recent\":[]}";
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "rank_00001.json"), bad, strlen(bad)));
    CHECK_ERR(kiln_heartbeat_read(dir, 1, &g), "'loss'");
    /* a step beyond int64 is refused before any conversion */
    const char *big = "{\"rank\":1,\"world\":2,\"attempt\":1,\"pid\":1,\"step\":1,\"steps\":2,\"phase\":\"train\","
                      "\"loss\":1,\"grad_norm\":1,\"local_grad_norm\":1,\"step_s\":1,\"compute_s\":1,\"time\":1,"
                      "\"recent\":[[1,2,3],[1e300,2,3]]}";
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "rank_00001.json"), big, strlen(big)));
    CHECK_ERR(kiln_heartbeat_read(dir, 1, &g), "'recent' entry 1 is not [step, loss, grad_norm]");
}

/* Rank 0's step log as the supervisor reads it: complete lines only. A last line without its newline (a write cut
 * short by a crash or a full disk, or one still being written) is not read, and the offset stays before it, so a
 * truncated record is never judged (nor a prefix of a number taken for the loss); once the line is complete it is
 * read from there. */
TEST(ft_step_log_truncated_last_line) {
    const char *dir = test_tmpdir();
    kiln_heartbeat h = {0};
    h.rank = 0, h.world = 1, h.attempt = 2, h.steps = 10;
    snprintf(h.phase, sizeof h.phase, "train");
    for (int s = 1; s <= 2; s++) {
        h.step = s, h.loss = 2.5 / s, h.grad_norm = 1;
        kiln_heartbeat_record(&h, s, h.loss, h.grad_norm);
        CHECK_OK(kiln_heartbeat_write(dir, &h)); /* appends [2,s,loss,1] to the log */
    }
    ft_step_rec rec[8];
    int n = ft_step_log_read(dir, 0, rec, 8);
    CHECK_MSG(n == 2 && rec[0].attempt == 2 && rec[0].step == 1 && rec[0].loss == 2.5 && rec[1].step == 2 &&
                  rec[1].loss == 1.25, "%d records", n);
    const long end2 = n == 2 ? rec[1].end : 0;
    /* step 3's line cut short: "[2,3,12" could pass for a loss of 12 (or, cut after "1", of 1) */
    FILE *f = fopen(test_join(dir, "steps_00000.jsonl"), "a");
    CHECK(f != NULL);
    if (!f) return;
    fputs("[2,3,12", f);
    fflush(f);
    n = ft_step_log_read(dir, 0, rec, 8);
    CHECK_MSG(n == 2 && rec[1].end == end2, "%d records, the last ends at %ld (want %ld)", n, n ? rec[n - 1].end : -1L,
              end2);
    CHECK_MSG(ft_step_log_read(dir, end2, rec, 8) == 0, "the truncated line was read");
    /* a whole record but no newline yet: still not read */
    fputs(".5,1]", f);
    fflush(f);
    CHECK(ft_step_log_read(dir, end2, rec, 8) == 0);
    fputs("\n", f);
    fclose(f);
    n = ft_step_log_read(dir, end2, rec, 8);
    CHECK_MSG(n == 1 && rec[0].step == 3 && rec[0].loss == 12.5, "%d records, step %lld", n,
              n ? (long long)rec[0].step : -1LL);
    CHECK(ft_step_log_read(test_join(dir, "none"), 0, rec, 8) == -1); /* no log */
}

/* The trainer's checkpoint lines [attempt,step,"ckpt"] among the step lines: read in order, as checkpoint records
 * (loss and norm NaN), each ending where its line does; anything else of three elements, or a "ckpt" where a step
 * line's loss is, is malformed and skipped. An older reader (four elements wanted) skips them: three elements. */
TEST(ft_step_log_ckpt_lines) {
    const char *dir = test_tmpdir();
    const char *text = "[1,6,2.5,1]\n"
                       "[1,6,\"ckpt\"]\n"
                       "[1,7,\"ckpt\",1]\n"   /* four elements: a step line with a string for its loss */
                       "[1,0,\"ckpt\"]\n"     /* step 0: no checkpoint */
                       "[1,7,\"CKPT\"]\n"
                       "[1,7,\"nan\"]\n"
                       "[1.5,7,\"ckpt\"]\n"
                       "[1,7,\"ckpt\",\"ckpt\"]\n"
                       "{\"ckpt\":7}\n"
                       "[2,7,2.25,\"nan\"]\n"
                       "[2,1234,\"ckpt\"]\n";
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "steps_00000.jsonl"), text, strlen(text)));
    ft_step_rec rec[16];
    const int n = ft_step_log_read(dir, 0, rec, 16);
    CHECK_MSG(n == 4, "%d records", n);
    if (n != 4) return;
    CHECK(!rec[0].ckpt && rec[0].attempt == 1 && rec[0].step == 6 && rec[0].loss == 2.5 && rec[0].grad_norm == 1);
    CHECK(rec[1].ckpt && rec[1].attempt == 1 && rec[1].step == 6 && isnan(rec[1].loss) && isnan(rec[1].grad_norm));
    CHECK(!rec[2].ckpt && rec[2].attempt == 2 && rec[2].step == 7 && rec[2].loss == 2.25 && isnan(rec[2].grad_norm));
    CHECK(rec[3].ckpt && rec[3].attempt == 2 && rec[3].step == 1234);
    CHECK(rec[0].end == 12 && rec[1].end == 12 + 13 && rec[3].end == (long)strlen(text));
    /* from the offset of a checkpoint record on: what follows it */
    CHECK(ft_step_log_read(dir, rec[1].end, rec, 16) == 2 && !rec[0].ckpt && rec[0].step == 7 && rec[1].ckpt);
    cJSON *a = cJSON_Parse("[1,6,\"ckpt\"]");
    CHECK(cJSON_GetArraySize(a) == 3); /* what an older reader's four-element rule skips */
    cJSON_Delete(a);
}

/* The errors kiln run retries before any step however often they repeat: transient errnos, by symbol or message */
static int transient_is(const char *text, const char *want) {
    const char *got = ft_transient_errno(text);
    return got && !strcmp(got, want);
}

TEST(ft_transient_errors) {
    CHECK(transient_is("kiln train: error: /shared/x: cannot open: Resource temporarily unavailable", "EAGAIN"));
    CHECK(transient_is("open failed: resource TEMPORARILY unavailable", "EAGAIN"));
    CHECK(transient_is("kiln train: error: /dev/nvidia0: Device or resource busy", "EBUSY"));
    CHECK(transient_is("NCCL WARN connect to 10.0.0.2<4242> failed: Connection refused", "ECONNREFUSED"));
    CHECK(transient_is("bind 29500: Address already in use", "EADDRINUSE"));
    CHECK(transient_is("socket: Connection timed out", "ETIMEDOUT"));
    CHECK(transient_is("read: Interrupted system call", "EINTR"));
    CHECK(transient_is("nfs: Stale file handle", "ESTALE"));
    CHECK(transient_is("error: lock failed (errno EBUSY)", "EBUSY"));
    CHECK(transient_is("error: EWOULDBLOCK", "EAGAIN"));
    /* not transient: a missing file, a full disk, permissions, memory; a symbol inside another word */
    CHECK(ft_transient_errno("kiln train: error: cfg.json: cannot open: No such file or directory") == NULL);
    CHECK(ft_transient_errno("kiln train: error: out/ckpt: cannot write: No space left on device") == NULL);
    CHECK(ft_transient_errno("kiln train: error: out: Permission denied") == NULL);
    CHECK(ft_transient_errno("kiln train: error: Cannot allocate memory") == NULL);
    CHECK(ft_transient_errno("kiln train: error: unknown flag --frob") == NULL);
    CHECK(ft_transient_errno("XEBUSY2 and EAGAINED") == NULL);
    CHECK(ft_transient_errno("") == NULL && ft_transient_errno(NULL) == NULL);
}

/* z-scores against a direct computation: mean and sample standard deviation of the window */
TEST(ft_spike_detector) {
    kiln_spike_detector d;
    CHECK_OK(kiln_spike_init(&d, 5, 3));
    const double xs[] = {2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 1.98};
    for (int i = 0; i < 7; i++) {
        double z = kiln_spike_push(&d, xs[i], 6);
        if (i < 3) {
            CHECK(z == 0);
            continue;
        }
        int lo = i - 5 < 0 ? 0 : i - 5, n = i - lo;
        double mean = 0, var = 0;
        for (int j = lo; j < i; j++) mean += xs[j];
        mean /= n;
        for (int j = lo; j < i; j++) var += (xs[j] - mean) * (xs[j] - mean);
        CHECK_NEAR(z, (xs[i] - mean) / sqrt(var / (n - 1)), 1e-12);
    }
    /* a spike is reported and kept out of the window: the same value is a spike again */
    double z1 = kiln_spike_push(&d, 5.0, 6), z2 = kiln_spike_push(&d, 5.0, 6);
    CHECK_MSG(z1 > 6 && z2 > 6 && fabs(z1 - z2) < 1e-9, "z %g then %g", z1, z2);
    CHECK(isinf(kiln_spike_push(&d, NAN, 6)));
    kiln_spike_reset(&d);
    CHECK(kiln_spike_push(&d, 100, 6) == 0);
    kiln_spike_free(&d);
    /* a constant window: anything else is infinitely far */
    CHECK_OK(kiln_spike_init(&d, 4, 2));
    kiln_spike_push(&d, 1, 6);
    kiln_spike_push(&d, 1, 6);
    CHECK(kiln_spike_push(&d, 1, 6) == 0);
    CHECK(isinf(kiln_spike_push(&d, 1.5, 6)));
    kiln_spike_free(&d);
    CHECK_ERR(kiln_spike_init(&d, 4, 5), "minimum");
}

/* ---- the loss-spike detector's history: the dense part and the anchors (src/ft/history.c) ---- */

static double fh_loss(int64_t s) { return 5 + 0.001 * (double)(s % 997); }

/* h: window w, dense part cap, the losses of steps 1..to */
static void fh_fill(ft_hist *h, int w, int cap, int64_t to) {
    CHECK_OK(ft_hist_init(h, w, cap));
    for (int64_t s = 1; s <= to; s++) CHECK_OK(ft_hist_add(h, s, fh_loss(s)));
}

/* Seeds h at `first` and returns how many losses the detector's window gets (the dense part's last `window`); each
 * must be the loss of the step it should be: first - 1, first - 2, ... but the skipped ones, none left out. */
static int fh_seed(ft_hist *h, int64_t first, const kiln_step_ranges *skip) {
    int changed = 0;
    CHECK_OK(ft_hist_seed(h, first, skip, &changed));
    const int k = h->n < h->window ? h->n : h->window;
    int64_t want = first - 1;
    for (int i = h->n - 1; i >= 0; i--, want--) { /* the whole dense part: the window's older neighbours too */
        while (kiln_step_ranges_contains(skip, want)) want--;
        if (h->step[i] != want || h->loss[i] != fh_loss(want)) {
            test_fail(__FILE__, __LINE__, "seeded at step %lld: entry %d of %d is step %lld (loss %.17g), want step %lld",
                      (long long)first, i, h->n, (long long)h->step[i], h->loss[i], (long long)want);
            return -1;
        }
    }
    return k;
}

/* Which windows are kept and that a seed takes exactly the losses right before the resume step, from the dense part,
 * an anchor or both, or none (a step no part holds the window of): every resume step of a 60-step run with a dense
 * part of 5 and a window of 4; skipped steps left out; a 50,000-step run with the defaults' sizes (windows of 50,
 * dense part 1024) keeps the windows before its last 4 multiples of 2000 and stays small. */
TEST(ft_spike_history_anchors) {
    ft_hist h;
    int full = 0, none = 0;
    for (int64_t first = 2; first <= 61; first++) {
        fh_fill(&h, 4, 5, 60);
        for (int i = 0; i < h.nanchor; i++)
            CHECK_MSG(ft_hist_keeps(h.anchor[i].end, 60), "an anchor at step %lld", (long long)h.anchor[i].end);
        const int k = fh_seed(&h, first, &(kiln_step_ranges){0});
        const int64_t p = first - 1;
        if (p == 20 || p == 25 || p == 30 || p == 40 || p == 45 || p >= 50)
            CHECK_MSG(k == 4, "seeded at step %lld: %d losses (want the whole window: an anchor or the dense part)",
                      (long long)first, k);
        if (p == 41 || p == 46) CHECK_MSG(k == 0, "seeded at step %lld: %d losses (no window is held whole)",
                                          (long long)first, k);
        full += k == 4, none += k == 0;
        ft_hist_free(&h);
    }
    CHECK_MSG(full >= 16 && none >= 2, "%d resume steps with a whole window, %d with none", full, none);
    /* a skipped step inside the anchor's window is left out, and nothing from before the anchor fills its place */
    kiln_step_ranges skip = {0};
    CHECK_OK(kiln_step_ranges_parse("48", &skip));
    fh_fill(&h, 4, 5, 60);
    CHECK(fh_seed(&h, 51, &skip) == 3);
    /* the attempt from step 51 goes on: its losses join the dense part after the window; a restart from step 51
     * again (a crash before any checkpoint) finds the same window */
    for (int64_t s = 51; s <= 58; s++) CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
    CHECK(fh_seed(&h, 51, &skip) == 3);
    CHECK_ERR(ft_hist_add(&h, 50, 1), "step 50 after step 50");
    ft_hist_free(&h);
    kiln_step_ranges_free(&skip);

    /* the defaults' sizes */
    fh_fill(&h, 50, 1024, 50000);
    CHECK_MSG(h.n == 1024 && h.step[0] == 48977 && h.from == 48977, "the dense part: %d losses from step %lld", h.n,
              h.n ? (long long)h.step[0] : -1LL);
    CHECK_MSG(h.nanchor >= 4 && h.nanchor <= 30 && h.anchored == 50LL * h.nanchor, "%d anchors, %lld losses",
              h.nanchor, (long long)h.anchored);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ft_state_format(&(kiln_step_ranges){0}, 0, &h, &text, &len));
    CHECK_MSG(len < 64 * 1024, "ft_state.json of %zu bytes", len);
    ft_hist_free(&h);
    /* the last 4 multiples of 2000 before the newest step (50000) and its last 4 of 500; not 42000 (8000 back) nor
     * 43000 (7000 back, 4 x 1000 its reach); step 48976, next to the dense part, has the anchor of step 49000's losses
     * up to it (48951-48976): all held, and fewer than the window */
    const int64_t firsts[] = {44001, 46001, 48001, 48501, 42001, 43001, 48977};
    const int want[] = {50, 50, 50, 50, 0, 0, 26};
    for (int i = 0; i < 7; i++) {
        kiln_step_ranges sk = {0};
        int64_t reject = 0;
        CHECK_OK(ft_hist_init(&h, 50, 1024));
        CHECK_OK(ft_state_parse(text, len, "ft_state.json", &sk, &reject, &h));
        const int k = fh_seed(&h, firsts[i], &sk);
        CHECK_MSG(k == want[i], "seeded at step %lld: %d losses, want %d", (long long)firsts[i], k, want[i]);
        ft_hist_free(&h);
        kiln_step_ranges_free(&sk);
    }
    free(text);
}

/* ft_state.json's history fields: the anchors written and read back the same; an older kiln's file (no
 * "spike_anchors") whose history is longer than the dense part leaves the anchors ft_hist_add would have; one with
 * neither field has no history; a malformed anchor is an error naming the file, the field and the anchor. */
TEST(ft_state_spike_anchors) {
    ft_hist a, b;
    fh_fill(&a, 4, 5, 60);
    char *text = NULL;
    size_t len = 0;
    kiln_step_ranges skip = {0};
    int64_t reject = -1;
    CHECK_OK(ft_state_format(&skip, 0, &a, &text, &len));
    CHECK_OK(ft_hist_init(&b, 4, 5));
    CHECK_OK(ft_state_parse(text, len, "ft_state.json", &skip, &reject, &b));
    int same = b.n == a.n && b.nanchor == a.nanchor && b.anchored == a.anchored && b.from == a.from;
    for (int i = 0; same && i < a.n; i++) same = b.step[i] == a.step[i] && b.loss[i] == a.loss[i];
    for (int i = 0; same && i < a.nanchor; i++) {
        same = b.anchor[i].end == a.anchor[i].end && b.anchor[i].n == a.anchor[i].n;
        for (int j = 0; same && j < a.anchor[i].n; j++)
            same = b.anchor[i].step[j] == a.anchor[i].step[j] && b.anchor[i].loss[j] == a.anchor[i].loss[j];
    }
    CHECK_MSG(same, "read back: %d dense losses, %d anchors (wrote %d, %d)\n%s", b.n, b.nanchor, a.n, a.nanchor, text);
    free(text);
    ft_hist_free(&b);
    /* an older kiln's file: the 60 losses in "spike_history" */
    char old[8192];
    size_t k = (size_t)snprintf(old, sizeof old, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[");
    for (int s = 1; s <= 60; s++) k += (size_t)snprintf(old + k, sizeof old - k, "%s[%d,%.17g]", s > 1 ? "," : "", s,
                                                       fh_loss(s));
    snprintf(old + k, sizeof old - k, "]}\n");
    CHECK_OK(ft_hist_init(&b, 4, 5));
    CHECK_OK(ft_state_parse(old, strlen(old), "ft_state.json", &skip, &reject, &b));
    same = b.n == a.n && b.nanchor == a.nanchor && b.from == a.from;
    for (int i = 0; same && i < a.nanchor; i++) same = b.anchor[i].end == a.anchor[i].end && b.anchor[i].n == a.anchor[i].n;
    CHECK_MSG(same, "from an older kiln's history: %d dense losses from step %lld, %d anchors (live: %d, %lld, %d)", b.n,
              (long long)b.from, b.nanchor, a.n, (long long)a.from, a.nanchor);
    CHECK(fh_seed(&b, 51, &skip) == 4);
    ft_hist_free(&b);
    ft_hist_free(&a);
    const char *none = "{\"skip_steps\":\"\",\"reject_from\":0}";
    CHECK_OK(ft_hist_init(&b, 4, 5));
    CHECK_OK(ft_state_parse(none, strlen(none), "ft_state.json", &skip, &reject, &b));
    CHECK(b.n == 0 && b.nanchor == 0 && fh_seed(&b, 7, &skip) == 0);
    ft_hist_free(&b);
    static const struct {
        const char *anchors, *err;
    } bad[] = {
        {"[[5,[[6,1]]]]", "ft_state.json: field 'spike_anchors': anchor 0: entry 0: step 6 after the window's end, step 5"},
        {"[[5,[]]]", "ft_state.json: field 'spike_anchors': anchor 0 is not [end step >= 1, [[step, loss], ...]]"},
        {"[[5,[[4,1]]],[5,[[5,1]]]]", "field 'spike_anchors': anchor 1: end step 5 after end step 5 (must increase)"},
        {"[[9,[[4,1],[3,1]]]]", "field 'spike_anchors': anchor 0: entry 1: step 3 after step 4 (steps must increase)"},
        {"[[9,[[4,\"inf\"]]]]", "field 'spike_anchors': anchor 0: entry 0 is not [step >= 1, finite loss]"},
        {"[[0,[[1,1]]]]", "field 'spike_anchors': anchor 0 is not"},
        {"{}", "spike_anchors"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char t[256];
        snprintf(t, sizeof t, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_anchors\":%s}", bad[i].anchors);
        CHECK_OK(ft_hist_init(&b, 4, 5));
        CHECK_ERR(ft_state_parse(t, strlen(t), "ft_state.json", &skip, &reject, &b), bad[i].err);
        ft_hist_free(&b);
    }
    kiln_step_ranges_free(&skip);
}

/* The number of anchors marked ckpt, and whether they are exactly the newest `want` of ends[0..n) (increasing) */
static int fh_ckpts_are(const ft_hist *h, const int64_t *ends, int n, int want) {
    int k = 0, ok = 1;
    for (int i = 0; i < h->nanchor; i++)
        if (h->anchor[i].ckpt) ok &= k < want && h->anchor[i].end == ends[n - want + k], k++;
    return ok && k == want;
}

/* The checkpoints the trainer reports (ft_hist_ckpt): the window before each, from the dense part, at any step, round
 * or not; the newest FT_ANCHOR_CKPT_KEEP of them kept whatever their depth (older ones only where the round-step rule
 * keeps them); a report again of the same step, or of one the dense part holds nothing up to, adds nothing; a rollback
 * past one drops it; a budget too small for them all keeps the newest, after dropping every other anchor. */
TEST(ft_spike_history_ckpt_anchors) {
    ft_hist h;
    /* a checkpoint of step 11 (not round), then 29 more steps: the resume from it, 29 steps behind the newest with a
     * dense part of 5, finds exactly the window 8-11; without the report nothing holds step 11 (blind) */
    for (int report = 0; report <= 1; report++) {
        fh_fill(&h, 4, 5, 11);
        int added = -1;
        if (report) CHECK_OK(ft_hist_ckpt(&h, 11, &added));
        CHECK(added == (report ? 1 : -1));
        for (int64_t s = 12; s <= 40; s++) CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
        const int k = fh_seed(&h, 12, &(kiln_step_ranges){0});
        CHECK_MSG(k == (report ? 4 : 0), "%s: seeded at step 12: %d losses", report ? "reported" : "not reported", k);
        ft_hist_free(&h);
    }
    /* the same, reported twice, and a report of a skipped step (its window: the losses up to the step before it) */
    kiln_step_ranges skip = {0};
    CHECK_OK(kiln_step_ranges_parse("23", &skip));
    CHECK_OK(ft_hist_init(&h, 4, 5));
    for (int64_t s = 1; s <= 40; s++) {
        if (s != 23) CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
        if (s == 11 || s == 23) CHECK_OK(ft_hist_ckpt(&h, s, NULL));
        if (s == 11) CHECK_OK(ft_hist_ckpt(&h, s, NULL));
    }
    int n11 = 0, n23 = 0;
    for (int i = 0; i < h.nanchor; i++) {
        n11 += h.anchor[i].end == 11 && h.anchor[i].ckpt && h.anchor[i].n == 4 && h.anchor[i].step[0] == 8;
        n23 += h.anchor[i].end == 23 && h.anchor[i].ckpt && h.anchor[i].n == 4 && h.anchor[i].step[3] == 22;
    }
    CHECK_MSG(n11 == 1 && n23 == 1, "the checkpoints' anchors at 11 and 23: %d, %d", n11, n23);
    CHECK(fh_seed(&h, 24, &skip) == 4);
    /* the attempt from 24 goes on, then a rollback to step 11 (the checkpoint of 23 set aside): 23's anchor goes with
     * the stretch, 11's stays and serves */
    for (int64_t s = 24; s <= 60; s++) CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
    CHECK(fh_seed(&h, 12, &skip) == 4);
    int left = 0;
    for (int i = 0; i < h.nanchor; i++) left += h.anchor[i].ckpt;
    CHECK_MSG(left == 1 && h.anchor[h.nanchor - 1].end == 11, "%d checkpoints' anchors after the rollback", left);
    ft_hist_free(&h);
    kiln_step_ranges_free(&skip);
    /* nothing held up to the step: no anchor */
    CHECK_OK(ft_hist_init(&h, 4, 5));
    int added = -1;
    CHECK_OK(ft_hist_ckpt(&h, 9, &added));
    CHECK(added == 0 && h.nanchor == 0);
    CHECK_OK(ft_hist_add(&h, 10, 1));
    CHECK_OK(ft_hist_ckpt(&h, 9, &added));
    CHECK(added == 0 && h.nanchor == 0);
    ft_hist_free(&h);

    /* 45 checkpoints, every 7 steps (7, 14, ..., 315), a dense part of 16, windows of 4 (a budget of 64 windows): the
     * newest 32 stay, the older ones only where the round-step rule keeps them (none that far back: 35, 70 and 84 are
     * round, out of their reach); a resume from each kept one, read back from ft_state.json, finds its window */
    int64_t ends[45];
    for (int i = 0; i < 45; i++) ends[i] = 7 * (i + 1);
    CHECK_OK(ft_hist_init(&h, 4, 16));
    for (int64_t s = 1, c = 0; s <= 320; s++) {
        CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
        if (c < 45 && s == ends[c]) CHECK_OK(ft_hist_ckpt(&h, ends[c++], NULL));
    }
    CHECK_MSG(fh_ckpts_are(&h, ends, 45, FT_ANCHOR_CKPT_KEEP), "the checkpoints' anchors are not the newest 32");
    CHECK(h.anchored <= ft_hist_budget(h.cap) && h.nanchor <= FT_ANCHOR_MAX);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ft_state_format(&(kiln_step_ranges){0}, 0, &h, &text, &len));
    ft_hist_free(&h);
    for (int i = 0; i < 45; i++) {
        kiln_step_ranges sk = {0};
        int64_t reject = 0;
        CHECK_OK(ft_hist_init(&h, 4, 16));
        CHECK_OK(ft_state_parse(text, len, "ft_state.json", &sk, &reject, &h));
        const int k = fh_seed(&h, ends[i] + 1, &sk);
        const int want = i >= 45 - FT_ANCHOR_CKPT_KEEP ? 4 : 0;
        CHECK_MSG(k == want, "resumed from the checkpoint of step %lld: %d losses, want %d", (long long)ends[i], k, want);
        ft_hist_free(&h);
        kiln_step_ranges_free(&sk);
    }
    free(text);
    /* a budget for 20 windows (window 8, dense part 10: 160 losses): the 45 checkpoints' anchors leave no room for
     * others, and the newest 20 of them stay */
    CHECK_OK(ft_hist_init(&h, 8, 10));
    for (int64_t s = 1, c = 0; s <= 320; s++) {
        CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
        if (c < 45 && s == ends[c]) CHECK_OK(ft_hist_ckpt(&h, ends[c++], NULL));
    }
    CHECK_MSG(h.anchored <= ft_hist_budget(h.cap) && fh_ckpts_are(&h, ends, 45, 20) && h.nanchor == 20,
              "%d anchors holding %lld losses (a budget of %lld)", h.nanchor, (long long)h.anchored,
              (long long)ft_hist_budget(h.cap));
    ft_hist_free(&h);
    /* a checkpoint's anchor past the newest 32 stays while the round-step rule keeps it: step 1000, not 999 */
    CHECK_OK(ft_hist_init(&h, 4, 16));
    for (int64_t s = 1; s <= 1100; s++) {
        CHECK_OK(ft_hist_add(&h, s, fh_loss(s)));
        if (s == 999 || s == 1000 || (s > 1000 && s % 3 == 0)) CHECK_OK(ft_hist_ckpt(&h, s, NULL));
    }
    int a999 = 0, a1000 = 0, nck = 0;
    for (int i = 0; i < h.nanchor; i++) {
        a999 += h.anchor[i].end == 999, a1000 += h.anchor[i].end == 1000 && h.anchor[i].ckpt;
        nck += h.anchor[i].ckpt;
    }
    CHECK_MSG(a999 == 0 && a1000 == 1 && nck == FT_ANCHOR_CKPT_KEEP + 1, "999: %d, 1000: %d, %d checkpoints' anchors",
              a999, a1000, nck);
    ft_hist_free(&h);
}

/* ft_state.json's "spike_checkpoints": which anchors are checkpoints', written and read back (a checkpoint whose window
 * is all skipped is written in neither field); a file of the previous format (anchors, no "spike_checkpoints") loads,
 * its anchors kept by the round-step rule alone; a malformed list, or a checkpoint that is no anchor's end, is an error
 * naming the file, the field and the entry. */
TEST(ft_state_spike_checkpoints) {
    ft_hist a, b;
    CHECK_OK(ft_hist_init(&a, 4, 5));
    for (int64_t s = 1; s <= 40; s++) {
        CHECK_OK(ft_hist_add(&a, s, fh_loss(s)));
        if (s == 11 || s == 23 || s == 30) CHECK_OK(ft_hist_ckpt(&a, s, NULL));
    }
    for (int with_skip = 0; with_skip <= 1; with_skip++) {
        kiln_step_ranges skip = {0};
        if (with_skip) CHECK_OK(kiln_step_ranges_parse("8-11", &skip)); /* the window of 11, all of it */
        char *text = NULL;
        size_t len = 0;
        int64_t reject = -1;
        CHECK_OK(ft_state_format(&skip, 0, &a, &text, &len));
        const char *want = with_skip ? "\"spike_checkpoints\":[23,30]}" : "\"spike_checkpoints\":[11,23,30]}";
        CHECK_MSG(text && strstr(text, want), "%s", text ? text : "");
        kiln_step_ranges sk = {0};
        CHECK_OK(ft_hist_init(&b, 4, 5));
        CHECK_OK(ft_state_parse(text, len, "ft_state.json", &sk, &reject, &b));
        int same = 1, k = 0;
        for (int i = 0; i < a.nanchor && same; i++) {
            if (with_skip && a.anchor[i].end == 11) continue;
            same = k < b.nanchor && b.anchor[k].end == a.anchor[i].end && b.anchor[k].ckpt == a.anchor[i].ckpt;
            k++;
        }
        CHECK_MSG(same && k == b.nanchor, "read back: %d anchors (wrote %d)\n%s", b.nanchor, a.nanchor, text);
        CHECK(fh_seed(&b, 24, &sk) == 4);
        free(text);
        ft_hist_free(&b);
        kiln_step_ranges_free(&skip);
        kiln_step_ranges_free(&sk);
    }
    ft_hist_free(&a);
    /* the previous format: the anchor of step 11 is not a checkpoint's, and step 11 not round, so at step 40 it goes */
    const char *prev = "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[[36,5],[37,5],[38,5],[39,5],[40,5]],"
                       "\"spike_anchors\":[[11,[[8,5],[9,5],[10,5],[11,5]]],[40,[[37,5],[38,5],[39,5],[40,5]]]]}";
    kiln_step_ranges skip = {0};
    int64_t reject = -1;
    CHECK_OK(ft_hist_init(&b, 4, 5));
    CHECK_OK(ft_state_parse(prev, strlen(prev), "ft_state.json", &skip, &reject, &b));
    CHECK_MSG(b.nanchor == 1 && b.anchor[0].end == 40 && !b.anchor[0].ckpt && b.n == 5, "%d anchors", b.nanchor);
    ft_hist_free(&b);
    static const struct {
        const char *ckpts, *err;
    } bad[] = {
        {"[7]", "ft_state.json: field 'spike_checkpoints': entry 0: step 7 is not the end of an anchor in 'spike_anchors'"},
        {"[5,9,12]", "ft_state.json: field 'spike_checkpoints': entry 2: step 12 is not the end of an anchor"},
        {"[9,5]", "ft_state.json: field 'spike_checkpoints': entry 1: step 5 after step 9 (steps must increase)"},
        {"[5,5]", "field 'spike_checkpoints': entry 1: step 5 after step 5"},
        {"[0]", "ft_state.json: field 'spike_checkpoints': entry 0 is not a step >= 1"},
        {"[5,\"9\"]", "field 'spike_checkpoints': entry 1 is not a step >= 1"},
        {"[5,9.5]", "field 'spike_checkpoints': entry 1 is not a step >= 1"},
        {"{}", "spike_checkpoints"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char t[512];
        snprintf(t, sizeof t, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_anchors\":[[5,[[4,1],[5,1]]],"
                 "[9,[[8,1],[9,1]]]],\"spike_checkpoints\":%s}", bad[i].ckpts);
        CHECK_OK(ft_hist_init(&b, 4, 5));
        CHECK_ERR(ft_state_parse(t, strlen(t), "ft_state.json", &skip, &reject, &b), bad[i].err);
        ft_hist_free(&b);
    }
    const char *none = "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_checkpoints\":[3]}";
    CHECK_OK(ft_hist_init(&b, 4, 5));
    CHECK_ERR(ft_state_parse(none, strlen(none), "ft_state.json", &skip, &reject, &b),
              "field 'spike_checkpoints': entry 0: step 3 is not the end of an anchor in 'spike_anchors'");
    ft_hist_free(&b);
    kiln_step_ranges_free(&skip);
}

TEST(ft_straggler_detector) {
    const double a[] = {3, 1, 2};
    CHECK(kiln_median(a, 3) == 2);
    const double b[] = {4, 1, 2, 3};
    CHECK(kiln_median(b, 4) == 2.5);
    double ratio;
    const double even[] = {1.0, 1.1, 0.9, 1.05};
    CHECK(kiln_straggler(even, 4, 2, &ratio) == -1);
    const double slow[] = {1.0, 1.1, 3.5, 1.05};
    CHECK(kiln_straggler(slow, 4, 2, &ratio) == 2);
    CHECK_NEAR(ratio, 3.5 / 1.05, 1e-12);
    const double two[] = {0.1, 0.45};
    CHECK(kiln_straggler(two, 2, 3, &ratio) == 1 && fabs(ratio - 4.5) < 1e-12);
    CHECK(kiln_straggler(two, 2, 5, &ratio) == -1);
    CHECK(kiln_straggler(two, 1, 3, &ratio) == -1);
}

TEST(ft_incident_log) {
    const char *path = test_join(test_tmpdir(), "incidents.jsonl");
    kiln_incident a = {1.7e9, 1, "killed", 1, 7, "killed by signal 9 (Killed)", "restart from the newest valid checkpoint"};
    kiln_incident b = {1.7e9 + 5, 2, "hang", -1, -1, "no heartbeat \"progress\"", "give up"};
    CHECK_OK(kiln_incident_append(path, &a));
    CHECK_OK(kiln_incident_append(path, &b));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(path, &text, &len));
    char *nl = text ? strchr(text, '\n') : NULL;
    CHECK(nl && nl[1] && text[len - 1] == '\n');
    if (nl) {
        cJSON *x = cJSON_ParseWithLength(text, (size_t)(nl - text)), *y = cJSON_Parse(nl + 1);
        CHECK(x && y);
        if (x && y) {
            CHECK(!strcmp(cJSON_GetObjectItem(x, "kind")->valuestring, "killed"));
            CHECK(cJSON_GetObjectItem(x, "rank")->valuedouble == 1 && cJSON_GetObjectItem(x, "step")->valuedouble == 7);
            CHECK(!strcmp(cJSON_GetObjectItem(x, "time")->valuestring, "2023-11-14T22:13:20Z"));
            CHECK(!strcmp(cJSON_GetObjectItem(x, "action")->valuestring, "restart from the newest valid checkpoint"));
            CHECK(cJSON_IsNull(cJSON_GetObjectItem(y, "rank")) && cJSON_IsNull(cJSON_GetObjectItem(y, "step")));
            CHECK(!strcmp(cJSON_GetObjectItem(y, "detail")->valuestring, "no heartbeat \"progress\""));
        }
        cJSON_Delete(x);
        cJSON_Delete(y);
    }
    free(text);
    char line[512];
    kiln_incident_summary(&a, line, sizeof line);
    CHECK_MSG(!strcmp(line, "kiln run: attempt 1: killed rank 1 at step 7: killed by signal 9 (Killed) -> restart from "
                            "the newest valid checkpoint"), "%s", line);
    CHECK_ERR(kiln_incident_append("/nonexistent/dir/incidents.jsonl", &a), "/nonexistent/dir/incidents.jsonl");
}

TEST(ft_trainer_env) {
    setenv("KILN_HEARTBEAT_DIR", "/tmp/hb", 1);
    setenv("KILN_RUN_ATTEMPT", "3", 1);
    setenv("KILN_RESUME", "1", 1);
    setenv("KILN_REJECT_FROM", "9", 1);
    setenv("KILN_SKIP_STEPS", "9,20-21", 1);
    setenv("KILN_FAULT", "nan:rank=1:step=9", 1);
    kiln_ft_env env;
    CHECK_OK(kiln_ft_env_read(&env));
    CHECK(!strcmp(env.heartbeat_dir, "/tmp/hb") && env.attempt == 3 && env.resume && env.reject_from == 9);
    CHECK(kiln_step_ranges_contains(&env.skip, 21) && !kiln_step_ranges_contains(&env.skip, 10) && env.faults.n == 1);
    kiln_ft_env_free(&env);
    setenv("KILN_RUN_ATTEMPT", "0", 1);
    CHECK_ERR(kiln_ft_env_read(&env), "KILN_RUN_ATTEMPT='0'");
    kiln_ft_env_free(&env);
    setenv("KILN_RUN_ATTEMPT", "1", 1);
    setenv("KILN_SKIP_STEPS", "x", 1);
    CHECK_ERR(kiln_ft_env_read(&env), "KILN_SKIP_STEPS");
    kiln_ft_env_free(&env);
    setenv("KILN_SKIP_STEPS", "", 1);
    setenv("KILN_FAULT", "kill", 1);
    CHECK_ERR(kiln_ft_env_read(&env), "KILN_FAULT");
    kiln_ft_env_free(&env);
    const char *vars[] = {"KILN_HEARTBEAT_DIR", "KILN_RUN_ATTEMPT", "KILN_RESUME", "KILN_REJECT_FROM", "KILN_SKIP_STEPS",
                          "KILN_FAULT"};
    for (int i = 0; i < 6; i++) unsetenv(vars[i]);
    CHECK_OK(kiln_ft_env_read(&env));
    CHECK(!env.heartbeat_dir[0] && env.attempt == 1 && !env.resume && !env.reject_from && !env.skip.n && !env.faults.n);
    kiln_ft_env_free(&env);
}

TEST(ft_reject_checkpoints) {
    const char *out = test_tmpdir();
    char p[1200];
    snprintf(p, sizeof p, "%s/ckpt", out);
    mkdir(p, 0755);
    const int steps[] = {4, 8, 12, 16};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/ckpt/step_%08d", out, steps[i]);
        mkdir(p, 0755);
    }
    snprintf(p, sizeof p, "%s/ckpt/step_00000012.rejected", out); /* set aside before: kept */
    mkdir(p, 0755);
    int n = -1;
    CHECK_OK(kiln_ft_reject_checkpoints(out, 9, &n));
    CHECK(n == 2);
    snprintf(p, sizeof p, "%s/ckpt/step_00000008", out);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/ckpt/step_00000012", out);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/ckpt/step_00000012.rejected.2", out);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/ckpt/step_00000016.rejected", out);
    CHECK(access(p, F_OK) == 0);
    CHECK_OK(kiln_ft_reject_checkpoints(test_join(out, "none"), 1, &n)); /* no checkpoints: nothing to do */
    CHECK(n == 0);
}

TEST(ft_run_cli_errors) {
    char text[4096];
    CHECK(test_run_kiln("run", text, sizeof text) == 2 && strstr(text, "no training command"));
    CHECK(test_run_kiln("run --np 0 -- kiln train", text, sizeof text) == 2 && strstr(text, "--np"));
    CHECK(test_run_kiln("run --frob 1 -- kiln train", text, sizeof text) == 2 && strstr(text, "unknown option '--frob'"));
    CHECK(test_run_kiln("run --straggler-action nap -- kiln train", text, sizeof text) == 2 && strstr(text, "warn or restart"));
    CHECK(test_run_kiln("run --help", text, sizeof text) == 0 && strstr(text, "usage: kiln run"));
    /* --help after "--" belongs to the training command */
    char args[2048];
    const char *dir = test_tmpdir();
    snprintf(args, sizeof args, "run --run-dir '%s' --launcher direct --np 2 -- kiln train --help", dir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 2 && strstr(text, "--launcher direct starts one rank"), "%s", text);
    snprintf(args, sizeof args, "run --run-dir '%s' --quiet -- kiln train --help", dir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "finished after 1 attempt"), "%s", text);
    /* a command that cannot run is not retried */
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 -- /nonexistent/trainer", dir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "give up: the command itself is wrong"), "%s", text);
    /* a failing command is retried up to the budget, then given up (its error changes from one attempt to the
     * next: the same one twice before any step would end it at once, test_ft_supervisor.c) */
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0 --max-restarts 2 -- sh -c 'echo boom $KILN_RUN_ATTEMPT: error >&2; exit 3'", dir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "give up: 2 restarts used") &&
                  strstr(text, "exited with status 3: boom 3: error"), "%s", text);
    char *log = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_join(dir, "incidents.jsonl"), &log, &len));
    int lines = 0;
    for (size_t i = 0; log && i < len; i++) lines += log[i] == '\n';
    CHECK_MSG(lines == 4, "%d incidents:\n%s", lines, log ? log : ""); /* not found; exit, exit, exit + give up */
    free(log);
}

/* Usage errors exit 2 and name the flags and the range; the run directory is created with its parents, and a
 * non-directory in its place is refused before any attempt. */
TEST(ft_run_cli_usage_and_run_dir) {
    char text[4096], args[4096];
    CHECK_MSG(test_run_kiln("run kiln train", text, sizeof text) == 2 && strstr(text, "must follow '--'"), "%s", text);
    CHECK_MSG(test_run_kiln("run --spike-window 3 --spike-min 5 -- true", text, sizeof text) == 2 &&
                  strstr(text, "--spike-min") && strstr(text, "--spike-window"), "%s", text);
    CHECK_MSG(test_run_kiln("run --np 1000000000 -- true", text, sizeof text) == 2 && strstr(text, "--np must be 1..99999"),
              "%s", text);
    CHECK_MSG(test_run_kiln("run --np 99999999999 -- true", text, sizeof text) == 2 && strstr(text, "--np must be 1..99999"),
              "%s", text);
    CHECK_MSG(test_run_kiln("run --max-restarts 99999999999 -- true", text, sizeof text) == 2 &&
                  strstr(text, "--max-restarts must be 0..1000000000"), "%s", text);
    /* a --run-dir too long for the protocol's buffers: refused with the limit, not cut short */
    char longdir[1300];
    memset(longdir, 'd', 1200);
    longdir[1200] = 0;
    snprintf(args, sizeof args, "run --run-dir '%s' -- true", longdir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 2 && strstr(text, "1200 bytes long: at most 1000"), "%s", text);
    /* parents created (the default runs/default in a fresh directory is the same case) */
    const char *dir = test_tmpdir();
    snprintf(args, sizeof args, "run --run-dir '%s/a/b/c' -- true", dir);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "finished after 1 attempt"), "%s", text);
    /* RUN_DIR/heartbeat a regular file: an error naming it, no attempt */
    const char *d2 = test_tmpdir();
    CHECK_OK(kiln_write_file_atomic(test_join(d2, "heartbeat"), "x", 1));
    snprintf(args, sizeof args, "run --run-dir '%s' -- true", d2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "heartbeat: exists and is not a directory") &&
                  !strstr(text, "attempt 1"), "%s", text);
    CHECK(test_run_kiln("run --help", text, sizeof text) == 0 && strstr(text, "slow-save"));
}

/* ---- the background heartbeat writer (kiln_heartbeat_writer) ---- */

static double ft_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* rank's beat h for `step` of phase (a trained step is recorded in its recent list; loss 1000 + step) */
static void hb_fill(kiln_heartbeat *h, int rank, int64_t step, const char *phase) {
    h->rank = rank, h->world = 2, h->attempt = 3, h->pid = 77, h->step = step, h->steps = 100000;
    snprintf(h->phase, sizeof h->phase, "%s", phase);
    h->loss = 1000.0 + (double)step, h->grad_norm = 0.5, h->local_grad_norm = 0.25, h->time = 1.7e9 + (double)step;
    if (!strcmp(phase, "train")) kiln_heartbeat_record(h, step, h->loss, h->grad_norm);
}

/* The whole step log is steps 1..n of attempt 3, in order, each once, with its loss; returns how many records. */
static int hb_log_check(const char *dir, int64_t n) {
    ft_step_rec *rec = malloc((size_t)(n + 1) * sizeof *rec);
    if (!rec) return -1;
    int got = ft_step_log_read(dir, 0, rec, (int)n + 1), bad = 0;
    for (int i = 0; i < got && !bad; i++)
        if (rec[i].step != i + 1 || rec[i].attempt != 3 || rec[i].loss != 1000.0 + (double)(i + 1)) {
            test_fail(__FILE__, __LINE__, "step log record %d: attempt %d, step %lld, loss %g", i, rec[i].attempt,
                      (long long)rec[i].step, rec[i].loss);
            bad = 1;
        }
    CHECK_MSG(got == n, "the step log holds %d records, want %lld", got, (long long)n);
    free(rec);
    return got;
}

/* A slow file system (every write of the writer's thread delayed 3 ms; posts in bursts and pauses): every step in the
 * log, in order, exactly once; a beat on disk never reports a step whose line is not in the log yet (read the beat,
 * then the log: the log only grows); far fewer beats written than posted (coalesced); the last one on disk at close. */
TEST(ft_hb_writer_slow_fs_order) {
    const char *dir = test_tmpdir();
    kiln_heartbeat_writer *w = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w));
    if (!w) return;
    ft_heartbeat_writer_set_delay(w, 3);
    kiln_heartbeat h = {0};
    hb_fill(&h, 0, 0, "start");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    const int64_t N = 3000;
    int checks = 0, ahead = 0;
    for (int64_t s = 1; s <= N; s++) {
        hb_fill(&h, 0, s, s % 500 == 250 ? "skip" : "train"); /* a skipped step has no line */
        CHECK_OK(kiln_heartbeat_writer_post(w, &h));
        if (s % 97 == 0) usleep(2000); /* a pause: the thread catches up mid-run */
        if (s % 31 == 0) {
            kiln_heartbeat g;
            kiln_error *e = kiln_heartbeat_read(dir, 0, &g);
            if (e) kiln_error_free(e); /* not written yet */
            else {
                static ft_step_rec rec[4096];
                int n = ft_step_log_read(dir, 0, rec, 4096);
                int64_t last = n > 0 ? rec[n - 1].step : 0;
                if (!strcmp(g.phase, "train") && last < g.step) ahead++;
                checks++;
            }
        }
    }
    hb_fill(&h, 0, N, "done");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    CHECK_OK(kiln_heartbeat_writer_flush(w));
    int64_t beats = 0, lines = 0, batches = 0;
    ft_heartbeat_writer_counts(w, &beats, &lines, &batches);
    CHECK_OK(kiln_heartbeat_writer_close(w));
    CHECK_MSG(ahead == 0 && checks > 10, "%d of %d beats read reported a step not in the log yet", ahead, checks);
    /* steps 250, 750, ... were skipped: the log holds the others */
    static ft_step_rec rec[4096];
    int n = ft_step_log_read(dir, 0, rec, 4096), bad = 0;
    int64_t want = 1;
    for (int i = 0; i < n && !bad; i++, want++) {
        if (want % 500 == 250) want++;
        bad = rec[i].step != want || rec[i].attempt != 3 || rec[i].loss != 1000.0 + (double)want;
        CHECK_MSG(!bad, "record %d: step %lld (want %lld), attempt %d, loss %g", i, (long long)rec[i].step,
                  (long long)want, rec[i].attempt, rec[i].loss);
    }
    CHECK_MSG(n == N - N / 500 && lines == n, "%d records, %lld lines written, want %lld", n, (long long)lines,
              (long long)(N - N / 500));
    kiln_heartbeat g;
    CHECK_OK(kiln_heartbeat_read(dir, 0, &g));
    CHECK(g.step == N && !strcmp(g.phase, "done") && g.attempt == 3 && g.nrecent == KILN_HB_RECENT &&
          g.recent[KILN_HB_RECENT - 1].step == N);
    CHECK_MSG(beats < N / 4 && batches == beats, "%lld beats written in %lld batches for %lld posts", (long long)beats,
              (long long)batches, (long long)N + 2);
    CHECK(access(test_join(dir, "rank_00000.json.tmp"), F_OK) != 0);
    printf("    %lld posts, %lld beats written (3 ms a write)\n", (long long)N + 2, (long long)beats);
}

/* Coalescing and lag: a burst posted while one beat is being written (100 ms) is one more write, of the newest beat,
 * not one per post; and the newest beat reaches the disk once the write in flight ends, without a flush. */
TEST(ft_hb_writer_coalesces_and_lags_one_write) {
    const char *dir = test_tmpdir();
    kiln_heartbeat_writer *w = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w));
    if (!w) return;
    ft_heartbeat_writer_set_delay(w, 100);
    kiln_heartbeat h = {0};
    hb_fill(&h, 0, 1, "train");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    usleep(20000); /* the thread has taken step 1 and is writing it */
    const double t0 = ft_now();
    for (int64_t s = 2; s <= 50; s++) {
        hb_fill(&h, 0, s, "train");
        CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    }
    const double post_s = ft_now() - t0;
    kiln_heartbeat g = {0};
    double seen = -1;
    while (ft_now() - t0 < 30) { /* a liveness bound, not a speed check: two writes of 100 ms are due */
        kiln_error *e = kiln_heartbeat_read(dir, 0, &g);
        if (!e && g.step == 50) {
            seen = ft_now() - t0;
            break;
        }
        kiln_error_free(e);
        usleep(2000);
    }
    /* step 1's write ends ~80 ms after the burst, step 50's ~100 ms later; one write per post would take 4.9 s.
     * Times are printed, not judged (tests never assert on time): what is judged is how many writes were made */
    CHECK_MSG(seen > 0, "step 50's beat never reached the disk");
    CHECK_OK(kiln_heartbeat_writer_flush(w));
    int64_t beats = 0, lines = 0, batches = 0;
    ft_heartbeat_writer_counts(w, &beats, &lines, &batches);
    /* 2 when the thread took step 1 before the burst (the usual case), 1 when it woke only after it (a loaded
     * machine): never one write per post */
    CHECK_MSG(beats >= 1 && beats <= 2 && batches == beats && lines == 50,
              "%lld beats, %lld lines, %lld batches (want 1 or 2 beats and batches, 50 lines)", (long long)beats,
              (long long)lines, (long long)batches);
    CHECK_OK(kiln_heartbeat_writer_close(w));
    hb_log_check(dir, 50);
    printf("    49 posts in %.1f us; the newest beat on disk after %.0f ms (100 ms a write)\n", post_s * 1e6, seen * 1e3);
}

/* close() writes everything posted before it returns (the "done" beat of a trainer about to exit), for each of two
 * ranks' writers in one directory (several ranks per node: rank 1 writes no step log); closing NULL is nothing. */
TEST(ft_hb_writer_close_flushes) {
    const char *dir = test_tmpdir();
    kiln_heartbeat_writer *w0 = NULL, *w1 = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w0));
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w1));
    if (!w0 || !w1) return;
    ft_heartbeat_writer_set_delay(w0, 150);
    ft_heartbeat_writer_set_delay(w1, 150);
    kiln_heartbeat h0 = {0}, h1 = {0};
    hb_fill(&h0, 0, 0, "start");
    hb_fill(&h1, 1, 0, "start");
    CHECK_OK(kiln_heartbeat_writer_post(w0, &h0));
    CHECK_OK(kiln_heartbeat_writer_post(w1, &h1));
    for (int64_t s = 1; s <= 7; s++) {
        hb_fill(&h0, 0, s, "train");
        hb_fill(&h1, 1, s, "train");
        CHECK_OK(kiln_heartbeat_writer_post(w0, &h0));
        CHECK_OK(kiln_heartbeat_writer_post(w1, &h1));
    }
    hb_fill(&h0, 0, 7, "done");
    hb_fill(&h1, 1, 7, "done");
    CHECK_OK(kiln_heartbeat_writer_post(w0, &h0));
    CHECK_OK(kiln_heartbeat_writer_post(w1, &h1));
    const double t0 = ft_now();
    CHECK_OK(kiln_heartbeat_writer_close(w0));
    CHECK_OK(kiln_heartbeat_writer_close(w1));
    const double close_s = ft_now() - t0;
    for (int r = 0; r < 2; r++) {
        kiln_heartbeat g;
        CHECK_OK(kiln_heartbeat_read(dir, r, &g));
        CHECK_MSG(g.step == 7 && !strcmp(g.phase, "done") && g.nrecent == 7, "rank %d: step %lld, phase %s", r,
                  (long long)g.step, g.phase);
    }
    hb_log_check(dir, 7);
    CHECK_MSG(close_s > 0.1, "close returned after %.3f s: it did not wait for the write", close_s);
    CHECK_OK(kiln_heartbeat_writer_close(NULL));
}

/* Checkpoint lines through the writer (a slow file system: 2 ms a write): each right after the line of its step, in
 * post order with the step lines, none lost or doubled, also for a checkpoint of a skipped step (after the line of
 * the step before it); counted as lines; the caller never waits for a write (flush does). */
TEST(ft_hb_writer_ckpt_lines) {
    const char *dir = test_tmpdir();
    kiln_heartbeat_writer *w = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w));
    if (!w) return;
    ft_heartbeat_writer_set_delay(w, 2);
    kiln_heartbeat h = {0};
    const int64_t N = 400;
    int64_t nck = 0, nsteps = 0;
    for (int64_t s = 1; s <= N; s++) {
        const int skipped = s % 100 == 50;
        hb_fill(&h, 0, s, skipped ? "skip" : "train");
        CHECK_OK(kiln_heartbeat_writer_post(w, &h));
        nsteps += !skipped;
        if (s % 7 == 0 || skipped) {
            CHECK_OK(kiln_heartbeat_writer_checkpoint(w, 3, s));
            nck++;
        }
        if (s % 53 == 0) usleep(3000);
    }
    CHECK_OK(kiln_heartbeat_writer_flush(w));
    int64_t lines = 0;
    ft_heartbeat_writer_counts(w, NULL, &lines, NULL);
    CHECK_OK(kiln_heartbeat_writer_close(w));
    static ft_step_rec rec[1024];
    const int n = ft_step_log_read(dir, 0, rec, 1024);
    CHECK_MSG(n == nsteps + nck && lines == n, "%d records, %lld lines written, want %lld", n, (long long)lines,
              (long long)(nsteps + nck));
    int64_t want = 1, last = 0, bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        if (rec[i].ckpt) { /* right after its step's line, or after the line before a skipped step */
            bad = rec[i].attempt != 3 || (rec[i].step != last && !(rec[i].step == last + 1 && last % 100 == 49)) ||
                  (rec[i].step % 7 && rec[i].step % 100 != 50);
            CHECK_MSG(!bad, "record %d: the checkpoint of step %lld after step %lld", i, (long long)rec[i].step,
                      (long long)last);
            continue;
        }
        if (want % 100 == 50) want++;
        bad = rec[i].step != want || rec[i].attempt != 3 || rec[i].loss != 1000.0 + (double)want;
        CHECK_MSG(!bad, "record %d: step %lld, want %lld", i, (long long)rec[i].step, (long long)want);
        last = want++;
    }
    /* every checkpoint posted is there: one record a multiple of 7 or skipped step */
    int64_t seen = 0;
    for (int i = 0; i < n; i++) seen += rec[i].ckpt;
    CHECK(seen == nck);
}

/* An error of a background write is not lost: it comes back, naming the file and the step, from the next post (or
 * flush, or close), once; the writer writes nothing after it and later posts fail too. The heartbeat directory
 * cannot be a path too long to open (a component over NAME_MAX), nor a directory replaced by a file mid-run (chmod
 * would not stop root). */
TEST(ft_hb_writer_background_error) {
    char longdir[1400];
    char name[301];
    memset(name, 'x', 300);
    name[300] = 0;
    snprintf(longdir, sizeof longdir, "%s/%s", test_tmpdir(), name);
    kiln_heartbeat_writer *w = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(longdir, &w));
    if (!w) return;
    kiln_heartbeat h = {0};
    hb_fill(&h, 1, 0, "start");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h)); /* accepted: written in the background, where it fails */
    kiln_error *e = NULL;
    for (int i = 0; i < 500 && !e; i++) { /* the next post reports it (5 s at most) */
        usleep(10000);
        hb_fill(&h, 1, i + 1, "train");
        e = kiln_heartbeat_writer_post(w, &h);
    }
    CHECK_MSG(e && strstr(kiln_error_msg(e), "rank_00001.json") && strstr(kiln_error_msg(e), "heartbeat of step 0") &&
                  strstr(kiln_error_msg(e), "File name too long"), "%s", e ? kiln_error_msg(e) : "no error");
    kiln_error_free(e);
    CHECK_ERR(kiln_heartbeat_writer_post(w, &h), "stopped at an earlier error");
    CHECK_ERR(kiln_heartbeat_writer_flush(w), "stopped at an earlier error");
    CHECK_OK(kiln_heartbeat_writer_close(w)); /* reported already */

    /* reported by close when no post came after it */
    CHECK_OK(kiln_heartbeat_writer_open(longdir, &w));
    if (!w) return;
    hb_fill(&h, 0, 5, "train");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    CHECK_ERR(kiln_heartbeat_writer_close(w), "step log line of step 5, written in the background");

    /* the directory replaced by a file under a running writer: the step log's append fails first, and no beat is
     * written after it (it would report a step whose line is missing) */
    const char *root = test_tmpdir();
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/hb", root);
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_OK(kiln_heartbeat_writer_open(dir, &w));
    if (!w) return;
    for (int64_t s = 1; s <= 3; s++) {
        hb_fill(&h, 0, s, "train");
        CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    }
    CHECK_OK(kiln_heartbeat_writer_flush(w));
    char cmd[2600], out[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && echo x > '%s'", dir, dir);
    CHECK(test_run_shell(cmd, out, sizeof out) == 0);
    hb_fill(&h, 0, 4, "train");
    CHECK_OK(kiln_heartbeat_writer_post(w, &h));
    e = kiln_heartbeat_writer_close(w);
    CHECK_MSG(e && strstr(kiln_error_msg(e), "hb/steps_00000.jsonl: cannot open: Not a directory") &&
                  strstr(kiln_error_msg(e), "step 4"), "%s", e ? kiln_error_msg(e) : "no error");
    kiln_error_free(e);
    /* a bad testing hook is an error naming the variable */
    setenv("KILN_HEARTBEAT_DELAY_MS", "soon", 1);
    CHECK_ERR(kiln_heartbeat_writer_open(root, &w), "KILN_HEARTBEAT_DELAY_MS='soon'");
    unsetenv("KILN_HEARTBEAT_DELAY_MS");
}

/* The cost the training thread sees: post() against the synchronous kiln_heartbeat_write, 4,000 beats of rank 0
 * (with the step log) into the test's directory, back to back. Printed only (tests never assert on time); what is
 * checked is that every step reached the log. Back to back, the queue fills (1024 lines) and post waits for the
 * thread now and then: the worst post is a write's time, the mean stays far below one. */
TEST(ft_hb_writer_cost) {
    const char *d1 = test_tmpdir(), *d2 = test_tmpdir();
    const int N = 4000;
    kiln_heartbeat h = {0};
    double t0 = ft_now();
    for (int s = 1; s <= N; s++) {
        hb_fill(&h, 0, s, "train");
        CHECK_OK(kiln_heartbeat_write(d1, &h));
    }
    const double sync_s = ft_now() - t0;
    memset(&h, 0, sizeof h);
    kiln_heartbeat_writer *w = NULL;
    CHECK_OK(kiln_heartbeat_writer_open(d2, &w));
    if (!w) return;
    double worst = 0;
    t0 = ft_now();
    for (int s = 1; s <= N; s++) {
        hb_fill(&h, 0, s, "train");
        const double a = ft_now();
        CHECK_OK(kiln_heartbeat_writer_post(w, &h));
        const double b = ft_now() - a;
        worst = b > worst ? b : worst;
    }
    const double post_s = ft_now() - t0;
    CHECK_OK(kiln_heartbeat_writer_close(w));
    const double all_s = ft_now() - t0;
    hb_log_check(d2, N);
    printf("    %d beats: kiln_heartbeat_write %.2f us a beat; post %.2f us a beat (worst %.0f us), all written by close "
           "after %.2f s\n", N, sync_s / N * 1e6, post_s / N * 1e6, worst * 1e6, all_s);
}
