/* Asynchronous checkpoints on a slow disk: a save due while the previous one is still being written is
 * deferred (run.ckpt_busy "defer", the default) and training does not wait; or it waits ("wait").
 * The disk is made slow by KILN_FAULT slow-save with steps=3: each shard counts as written only at the
 * third step after its save, so the saves overlap at the same steps on any machine (no timing). */
#include <unistd.h>

#include "ckpt_testutil.h"
#include "../src/train/train_internal.h"

/* saves due every 2 steps, each written in 3: 2 (on time), 4 deferred and taken at 5, 6 deferred and
 * superseded by 8 (on time), 10 deferred and taken at 11, 12 the final save (waits for 11's) */
#define DEFER_STEPS 12
#define DEFER_FAULT "slow-save:step=1:ms=0:steps=3"

/* ---- the policy alone (ckpt_schedule.c) ---- */

TEST(ckpt_schedule_defers_then_catches_up) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.ckpt_every = 2;
    c.save_final = 1;
    ckpt_schedule s;
    ckpt_schedule_init(&s, &c);
    CHECK(s.defer);
    /* steps 1..12 of 12; the writer is busy at steps 3..6 (the save of 2), 8..9 (of 7) and 11..12 (of 10) */
    const int busy[13] = {0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1};
    int saved[13] = {0}, wait[13] = {0};
    int64_t from[13] = {0};
    for (int st = 1; st <= 12; st++) {
        ckpt_due d = ckpt_schedule_step(&s, st, st == 12, 0, busy[st]);
        saved[st] = d.save, wait[st] = d.wait, from[st] = d.deferred_from;
    }
    /* 2 on time; 4 deferred, superseded by 6 (still busy), taken at 7; 8 deferred, superseded by 10
     * (on time); 12 the final save (waits) */
    const int want[13] = {0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1};
    for (int st = 1; st <= 12; st++) CHECK_MSG(saved[st] == want[st], "step %d: save %d, expected %d", st, saved[st], want[st]);
    CHECK(from[7] == 6 && from[2] == 0 && from[10] == 0 && from[12] == 0);
    CHECK(wait[12] == 1 && !wait[2] && !wait[7] && !wait[10]);
    CHECK_MSG(s.requested == 6 && s.taken == 4 && s.deferred == 3 && s.superseded == 2 && s.taken_late == 1 &&
                  s.late_steps == 1, "requested %lld taken %lld deferred %lld superseded %lld late %lld (%lld steps)",
              (long long)s.requested, (long long)s.taken, (long long)s.deferred, (long long)s.superseded,
              (long long)s.taken_late, (long long)s.late_steps);

    /* a deferral still outstanding at the last step: taken by the final save (which waits), dropped
     * without save_final (benchmarks); a stop request takes it, and waits */
    ckpt_schedule_init(&s, &c);
    CHECK(ckpt_schedule_step(&s, 2, 0, 0, 0).save);
    CHECK(!ckpt_schedule_step(&s, 4, 0, 0, 1).save);
    ckpt_due d = ckpt_schedule_step(&s, 5, 1, 0, 1);
    CHECK(d.save && d.wait && d.deferred_from == 4);
    c.save_final = 0;
    ckpt_schedule_init(&s, &c);
    CHECK(!ckpt_schedule_step(&s, 4, 0, 0, 1).save);
    CHECK(!ckpt_schedule_step(&s, 5, 1, 0, 1).save && s.deferred_from == 4);
    CHECK(!ckpt_schedule_step(&s, 5, 1, 0, 0).save && s.deferred_from == 4); /* even with the writer free */
    CHECK(ckpt_schedule_step(&s, 6, 1, 0, 1).save); /* due at the last step: waits as before */
    ckpt_schedule_init(&s, &c);
    CHECK(!ckpt_schedule_step(&s, 4, 0, 0, 1).save);
    d = ckpt_schedule_step(&s, 5, 0, 1, 1);
    CHECK(d.save && d.wait && d.deferred_from == 4);
    CHECK(!ckpt_schedule_step(&s, 7, 1, 0, 0).save); /* not due, nothing deferred, no save_final */

    /* "wait", and synchronous writers: never deferred, the writer waits */
    snprintf(c.ckpt_busy, sizeof c.ckpt_busy, "wait");
    ckpt_schedule_init(&s, &c);
    d = ckpt_schedule_step(&s, 4, 0, 0, 1);
    CHECK(d.save && !d.wait && !d.deferred_from && !s.deferred);
    snprintf(c.ckpt_busy, sizeof c.ckpt_busy, "defer");
    c.async_ckpt = 0;
    ckpt_schedule_init(&s, &c);
    CHECK(ckpt_schedule_step(&s, 4, 0, 0, 1).save);
}

TEST(ckpt_busy_config_field) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK(!strcmp(c.ckpt_busy, "defer"));
    CHECK_OK(kiln_train_config_parse("{\"data\": {\"dir\": \"d\"}, \"run\": {\"ckpt_busy\": \"wait\"}}", "cfg", &c));
    CHECK(!strcmp(c.ckpt_busy, "wait"));
    kiln_train_config_default(&c);
    CHECK_ERR(kiln_train_config_parse("{\"data\": {\"dir\": \"d\"}, \"run\": {\"ckpt_busy\": \"later\"}}", "cfg", &c),
              "run.ckpt_busy 'later'");
    char text[65536];
    CHECK(test_run_kiln("train --help-config", text, sizeof text) == 0 && strstr(text, "ckpt_busy") && strstr(text, "defer"));
}

/* ---- training runs ---- */

static int committed(const char *out, int step) {
    char p[1300];
    snprintf(p, sizeof p, "%s/ckpt/step_%08d/COMMITTED", out, step);
    return access(p, F_OK) == 0;
}

/* kiln ARGS with KILN_FAULT=fault and KILN_LOG=debug; output in text. */
static int train_faulted(const char *cfg, const char *fault, const char *more, char *text, size_t cap) {
    char args[4096];
    snprintf(args, sizeof args, "train --config '%s' --quiet %s", cfg, more ? more : "");
    setenv("KILN_FAULT", fault, 1);
    setenv("KILN_LOG", "debug", 1);
    int rc = test_run_kiln(args, text, cap);
    unsetenv("KILN_FAULT");
    unsetenv("KILN_LOG");
    return rc;
}

/* "N saves waited for the previous one (M of them final or stop saves)" of the run's summary. */
static int waits(const char *text, long *all, long *must) {
    const char *p = strstr(text, "saves waited for the previous one (");
    if (!p) return 0;
    for (p--; p > text && p[-1] != ' '; p--) {} /* back to N */
    return sscanf(p, "%ld saves waited for the previous one (%ld of them", all, must) == 2;
}

/* Saves every 2 steps that each take >= 400 ms: the ones that come due while the previous is still being
 * written are deferred, training never waits for them, every committed checkpoint verifies, the final
 * weights are those of a run without checkpoints, and a resume from a deferred-step checkpoint goes on
 * bit-identically. */
TEST(ckpt_defer_slow_disk) {
    char data[1024], ref[1024], out[1024], res[1024], args[4096], cmd[4096];
    static char text[1 << 18];
    snprintf(data, sizeof data, "%s", ck_data());
    snprintf(ref, sizeof ref, "%s", test_tmpdir());
    snprintf(out, sizeof out, "%s", test_tmpdir());
    snprintf(res, sizeof res, "%s", test_tmpdir());
    /* the reference: no checkpoints but the final one */
    const char *cr = ck_config(data, ref, DEFER_STEPS, 1, 32, "\"ckpt_every\": 0");
    CHECK_MSG(train_faulted(cr, "", NULL, text, sizeof text) == 0, "%s", text);
    const char *cd = ck_config(data, out, DEFER_STEPS, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 100");
    CHECK_MSG(train_faulted(cd, DEFER_FAULT, NULL, text, sizeof text) == 0, "%s", text);
    /* deferred, said once with the numbers, and counted at the end */
    CHECK_MSG(strstr(text, "checkpoint of step 4 deferred: the save of step 2 is still being written after") &&
                  strstr(text, "needs") && strstr(text, "Raise run.ckpt_every"), "%s", text);
    const char *warn = strstr(text, "kiln: warning: checkpoint of step");
    CHECK(warn && !strstr(warn + 10, "kiln: warning: checkpoint of step"));
    CHECK_MSG(strstr(text, "deferred while the previous save was being written"), "%s", text);
    CHECK_MSG(strstr(text, "checkpoints: 6 scheduled, 5 taken; 3 deferred while the previous save was being written "
                         "(2 taken late, 1.0 steps late on average; 1 superseded by a later one; 0 outstanding at the end)"), "%s", text);
    /* no save waited but the final one: training did not wait for the deferred ones */
    long all = -1, must = -1;
    CHECK_MSG(waits(text, &all, &must) && all == 1 && must == 1, "%s", text);
    /* the checkpoints, at the steps they were taken, all valid */
    const int newest_odd = 11;
    for (int s = 1; s <= DEFER_STEPS; s++)
        CHECK_MSG(committed(out, s) == (s == 2 || s == 5 || s == 8 || s == 11 || s == 12), "step %d\n%s", s, text);
    char want[64];
    snprintf(want, sizeof want, "%d checkpoints, 0 invalid", 5);
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    char vt[16384];
    CHECK_MSG(test_run_kiln(args, vt, sizeof vt) == 0 && strstr(vt, want), "%s", vt);
    /* the metrics record the deferral at the step that took it */
    char path[1300], *m = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    CHECK_OK(kiln_read_file(path, &m, &len));
    snprintf(want, sizeof want, "{\"step\":%d,", newest_odd);
    const char *line = m ? strstr(m, want) : NULL;
    const char *field = line ? strstr(line, "\"ckpt_deferred_from\":") : NULL;
    CHECK_MSG(field && field < strchr(line, '\n') && atoi(field + 21) == 10, "step %d's metrics: %.200s", newest_odd,
              line ? line : "(none)");
    CHECK(m && strstr(m, "\"ckpt_deferred_from\":4,") && !strstr(m, "\"ckpt_deferred_from\":6,"));
    free(m);
    /* the same weights as without checkpoints */
    CHECK_MSG(ck_same_model(ref, out), "deferred checkpoints changed the trained weights");
    /* resume from the newest deferred-step checkpoint alone */
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/ckpt' && cp -r '%s/ckpt/step_%08d' '%s/ckpt/'", res, out, newest_odd, res);
    CHECK(system(cmd) == 0);
    const char *cres = ck_config(data, res, DEFER_STEPS, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 100");
    snprintf(args, sizeof args, "train --config '%s' --resume", cres);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    snprintf(want, sizeof want, "resumed from step %d", newest_odd);
    CHECK_MSG(strstr(text, want), "%s", text);
    CHECK_MSG(ck_same_model(ref, res), "resumed from the deferred checkpoint of step %d: the weights differ", newest_odd);
    double la[DEFER_STEPS] = {0}, lb[DEFER_STEPS] = {0};
    CHECK(ck_losses(ref, la, DEFER_STEPS) == DEFER_STEPS && ck_losses(res, lb, DEFER_STEPS) == DEFER_STEPS);
    for (int i = newest_odd; i < DEFER_STEPS; i++)
        CHECK_MSG(la[i] == lb[i], "step %d: loss %.9g resumed, %.9g uninterrupted", i + 1, lb[i], la[i]);
}

/* run.ckpt_busy "wait": every save is taken at its step and waits for the previous one. */
TEST(ckpt_busy_wait_still_waits) {
    char data[1024], out[1024];
    static char text[1 << 18];
    snprintf(data, sizeof data, "%s", ck_data());
    snprintf(out, sizeof out, "%s", test_tmpdir());
    const char *cfg = ck_config(data, out, 8, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 100, \"ckpt_busy\": \"wait\"");
    /* the writer also sleeps 50 ms before each shard (the ms part of the hook) */
    CHECK_MSG(train_faulted(cfg, "slow-save:step=1:ms=50:steps=3", NULL, text, sizeof text) == 0, "%s", text);
    for (int s = 1; s <= 8; s++) CHECK_MSG(committed(out, s) == (s % 2 == 0), "step %d\n%s", s, text);
    CHECK_MSG(!strstr(text, "deferred:") && !strstr(text, "deferred from") && strstr(text, "; 0 deferred"), "%s", text);
    long all = -1, must = -1;
    CHECK_MSG(waits(text, &all, &must) && all == 3 && must == 1, "%s", text); /* 4, 6 and the final 8 waited */
    char args[2048], vt[16384];
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    CHECK_MSG(test_run_kiln(args, vt, sizeof vt) == 0 && strstr(vt, "4 checkpoints, 0 invalid"), "%s", vt);
}
