/* kiln run's supervisor, one rank launched directly (no mpirun needed): the rejection of checkpoints
 * trained on a bad window outlives an attempt that fails before applying it, the skip windows outlive
 * the supervisor process, the spike detector is not blind after a restart, after a rerun (its history in
 * ft_state.json), after a rollback further back than its dense history (to a checkpoint of any step: the trainer's
 * checkpoint lines) nor between two polls of fast steps, Ctrl-C's grace, and the rule that stops retrying a failure
 * that repeats before any step unless its error is a transient one; the trainer's heartbeats written by a background
 * thread: every step (and checkpoint) in the log and the last beat on disk at exit, with a slow writer too, and a
 * failed write stopping the trainer. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../src/ft/ft_internal.h"
#include "ckpt_testutil.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/json.h"

/* 16 steps, a checkpoint every 4 (kept: 3) on the tiny model; extra: more "run" fields. */
static const char *sup_config(const char *out, const char *extra) {
    char run[512];
    snprintf(run, sizeof run, "\"ckpt_every\": 4, \"keep_last\": 3%s%s", extra ? ", " : "", extra ? extra : "");
    return ck_config(ck_data(), out, 16, 1, 32, run);
}

static int sup_exists(const char *out, const char *rel) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", out, rel);
    return access(p, F_OK) == 0;
}

static double sup_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The reference: the same config told to skip `skip`, run plainly. */
static void sup_reference(const char *ref, const char *skip) {
    char extra[64], args[2048];
    snprintf(extra, sizeof extra, "\"skip_steps\": \"%s\"", skip);
    snprintf(args, sizeof args, "train --config '%s' --quiet", sup_config(ref, extra));
    CHECK(ck_kiln(args) == 0);
}

#define SPIKE_OPTS "--spike-min 4 --spike-window 8 --spike-z 8"

/* A spike at step 12; the restart after it fails before the trainer starts (exit 1 from the wrapper): the
 * attempt after that must still set aside the checkpoints of step >= 12 and skip step 12. The checkpoints are taken
 * when due ("ckpt_busy": "wait"): with ~2 ms steps the save of step 8 may still be being written at step 12, and a
 * save deferred past step 12 leaves no step_00000012 to set aside (1 run in 10 once beats left the training thread
 * and the steps got shorter). */
TEST(ft_sup_reject_outlives_a_failed_attempt) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "12");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT=spike:step=12 '%s' run --run-dir '%s' --backoff 0.05 " SPIKE_OPTS " -- sh -c "
             "'[ \"$KILN_RUN_ATTEMPT\" = 2 ] && exit 1; exec \"$0\" train --config \"$1\" --quiet' '%s' '%s' 2>&1",
             KILN_BINARY, out, KILN_BINARY, sup_config(out, "\"ckpt_busy\": \"wait\""));
    int rc = test_run_shell(cmd, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 3 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(strstr(log, "\"kind\":\"loss-spike\"") && strstr(log, "\"step\":12"), "%s", log);
    CHECK_MSG(sup_exists(out, "ckpt/step_00000012.rejected"), "the checkpoint of step 12 was not set aside\n%s", text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 12\n%s", text);
    /* once applied, the set-aside is over: the state file says so */
    char *st = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_join(out, "ft_state.json"), &st, &len));
    CHECK_MSG(st && strstr(st, "\"skip_steps\":\"12\"") && strstr(st, "\"reject_from\":0"), "%s", st ? st : "");
    free(st);
    free(log);
}

/* Ctrl-C during the back-off after a spike; the same command run again must still skip the window (and set
 * aside the checkpoints trained on it), not train the spiked step again. The checkpoints are taken when due
 * ("ckpt_busy": "wait"): a save deferred past step 12 (the default, while the previous one is still being written)
 * would leave no checkpoint of step 12 to set aside on a busy machine, whatever the supervisor does. */
TEST(ft_sup_skip_windows_outlive_ctrl_c) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "12");
    const char *cfg = sup_config(out, "\"ckpt_busy\": \"wait\"");
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        setenv("KILN_FAULT", "spike:step=12", 1);
        execl(KILN_BINARY, KILN_BINARY, "run", "--run-dir", out, "--backoff", "60", "--spike-min", "4", "--spike-window",
              "8", "--spike-z", "8", "--", "kiln", "train", "--config", cfg, "--quiet", (char *)NULL);
        _exit(127);
    }
    char *log = NULL;
    for (int i = 0; i < 1200; i++) { /* 60 s at most */
        free(log);
        log = ck_incidents(out);
        if (strstr(log, "loss-spike")) break;
        usleep(50000);
    }
    usleep(100000);
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 130, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK_MSG(strstr(log, "loss-spike"), "%s", log);
    free(log);
    char args[2048], text[32768];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0.05 " SPIKE_OPTS " -- kiln train --config '%s' --quiet", out,
             cfg);
    int rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt") && strstr(text, "(skipping steps 12)\n"), "rc %d\n%s",
              rc, text);
    CHECK_MSG(sup_exists(out, "ckpt/step_00000012.rejected"), "the checkpoint of step 12 was not set aside\n%s", text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 12\n%s", text);
}

/* A spike in the first steps after a restart: the detector goes on from the losses before the resume point,
 * so it is not blind for --spike-min steps (here: killed at step 9, resumed from step 8 or 4, spike at 10). */
TEST(ft_sup_spike_right_after_restart) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "10");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT=kill:step=9,spike:step=10:attempt=2 '%s' run --run-dir '%s' --backoff 0.05 --spike-min 6 "
             "--spike-window 8 --spike-z 8 -- kiln train --config '%s' --quiet 2>&1",
             KILN_BINARY, out, sup_config(out, "\"ckpt_busy\": \"wait\""));
    int rc = test_run_shell(cmd, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 3 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(strstr(log, "\"kind\":\"loss-spike\"") && strstr(log, "\"step\":10"), "%s", log);
    free(log);
    /* the reference skips step 10; the config's ckpt_busy does not change the weights */
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 10\n%s", text);
}

/* A config of ~0.1 ms steps (a one-layer model of width 8, one 4-token window a step) for the tests that need
 * steps far faster than the supervisor's polls; its path (malloc'd). run: the "run" fields after out_dir. */
static char *sup_fast_config(const char *out, const char *run) {
    char *p = kiln_path_join(test_tmpdir(), "fast.json");
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "{\"model\": {\"vocab_size\": %d, \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 1,"
             " \"num_key_value_heads\": 1, \"head_dim\": 8, \"num_experts\": 2, \"moe_intermediate_size\": 8,"
             " \"router_hidden_size\": 8, \"eos_token_id\": null},"
             " \"data\": {\"dir\": \"%s\", \"seq_len\": 4, \"micro_batch\": 1, \"grad_accum\": 1},"
             " \"optim\": {\"lr\": 0.001, \"min_lr\": 0.001, \"warmup\": 0},"
             " \"run\": {\"out_dir\": \"%s\", \"log_every\": 1000, \"eval_every\": 0, \"threads\": 1, %s}}",
             CK_VOCAB, ck_data(), out, run);
    if (p) CHECK_OK(kiln_write_file_atomic(p, cfg, strlen(cfg)));
    return p;
}

/* Steps far faster than the 0.1 s poll: many more than a beat's recent list (32) pass between two polls; every
 * one-step spike must still be seen. Four of them, one per attempt: judging only the beats' recent lists catches
 * each with a chance of about 32 / (steps per poll), all four rarely. */
TEST(ft_sup_spike_between_polls_of_fast_steps) {
    const char *out = test_tmpdir();
    char *p = sup_fast_config(out, "\"steps\": 3000, \"ckpt_every\": 500");
    char args[4096], text[65536];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0.05 --spike-z 300 -- kiln train --config '%s' --quiet",
             out, p);
    free(p);
    setenv("KILN_FAULT", "spike:step=700,spike:step=1300:attempt=2,spike:step=1900:attempt=3,spike:step=2500:attempt=4", 1);
    double t0 = sup_now();
    int rc = test_run_kiln(args, text, sizeof text);
    double dt = sup_now() - t0;
    unsetenv("KILN_FAULT");
    char *log = ck_incidents(out);
    int found = 0;
    const int at[] = {700, 1300, 1900, 2500};
    for (int i = 0; i < 4; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":%d,", at[i]);
        found += strstr(log, needle) != NULL;
    }
    CHECK_MSG(rc == 0 && found == 4 && strstr(text, "finished after 5 attempts"), "rc %d, %d of 4 spikes seen (%.1f s)\n%s",
              rc, found, dt, log);
    printf("    3000 fast steps (and the retrained ones) supervised in %.1f s\n", dt);
    free(log);
}

/* Ctrl-C to a command that ignores SIGINT and SIGTERM: SIGKILL after --grace counted from the Ctrl-C (not twice
 * the grace), and at once on a second Ctrl-C. */
static double ctrl_c_time(const char *run_dir, int twice) {
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(KILN_BINARY, KILN_BINARY, "run", "--run-dir", run_dir, "--grace", "3", "--", "sh", "-c",
              "trap '' INT TERM; touch \"$0/started\"; while :; do sleep 0.05; done", run_dir, (char *)NULL);
        _exit(127);
    }
    char started[1200];
    snprintf(started, sizeof started, "%s/started", run_dir);
    for (int i = 0; i < 400 && access(started, F_OK); i++) usleep(25000);
    usleep(200000);
    kill(pid, SIGINT);
    double t0 = sup_now();
    if (twice) {
        usleep(300000);
        kill(pid, SIGINT);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 130, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return sup_now() - t0;
}

TEST(ft_sup_ctrl_c_grace) {
    double once = ctrl_c_time(test_tmpdir(), 0);
    CHECK_MSG(once >= 2.8 && once < 4.5, "one Ctrl-C with --grace 3: stopped after %.2f s", once);
    double twice = ctrl_c_time(test_tmpdir(), 1);
    CHECK_MSG(twice < 1.5, "a second Ctrl-C 0.3 s after the first: stopped after %.2f s", twice);
}

/* The same error before any step, three times in a row: not retried further (a missing config file, a full disk);
 * a failure whose error changes is (test_ft.c). */
TEST(ft_sup_same_early_error_gives_up) {
    const char *dir = test_tmpdir();
    char args[2048], text[16384];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 -- kiln train --config '%s/missing.json'", dir, dir);
    int rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "give up: the same error before any step in 3 attempts in a row: not a transient "
                                      "failure") && strstr(text, "attempt 3") && !strstr(text, "attempt 4"),
              "rc %d\n%s", rc, text);
    char *log = ck_incidents(dir);
    int lines = 0;
    for (const char *s = log; *s; s++) lines += *s == '\n';
    CHECK_MSG(lines == 3, "%d incidents:\n%s", lines, log);
    free(log);
    /* a full disk is not transient: it does not spend the whole budget either */
    const char *d3 = test_tmpdir();
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0 --max-restarts 10 -- sh -c 'echo \"kiln train: error: out/ckpt: cannot "
             "write: No space left on device\" >&2; exit 1'", d3);
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "in 3 attempts in a row") && !strstr(text, "attempt 4") &&
                  !strstr(text, "transient error"), "rc %d\n%s", rc, text);
    /* the error line that explains the failure: kiln's own, not any line that mentions "error" */
    const char *d2 = test_tmpdir();
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0 --max-restarts 0 -- sh -c 'echo \"sample: no error here\" >&2; "
             "echo \"kiln train: error: the real cause\" >&2; exit 3'", d2);
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "exited with status 3: kiln train: error: the real cause"), "rc %d\n%s", rc, text);
}

/* An early error that names a transient errno (a file system briefly unavailable, a busy device) is retried with the
 * back-off, however often it repeats, within --max-restarts; and the run goes on once it clears. */
TEST(ft_sup_transient_early_error_is_retried) {
    const char *dir = test_tmpdir();
    char args[2048], text[16384];
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0.01 --max-restarts 5 -- sh -c 'if [ \"$KILN_RUN_ATTEMPT\" -lt 5 ]; then "
             "echo \"kiln train: error: /shared/data/index.json: cannot open: Resource temporarily unavailable\" >&2; "
             "exit 1; fi; exit 0'", dir);
    int rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 5 attempts (4 restarts)") &&
                  strstr(text, "in 0.01 s (failed before any step, with a transient error, EAGAIN: retried within "
                               "--max-restarts)") && strstr(text, "in 0.08 s (failed"), "rc %d\n%s", rc, text);
    /* one that never clears spends the budget, and no more */
    const char *d2 = test_tmpdir();
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0 --max-restarts 3 -- sh -c 'echo \"kiln train: error: /dev/nvidia0: Device "
             "or resource busy\" >&2; exit 1'", d2);
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "give up: 3 restarts used (--max-restarts)") && strstr(text, "attempt 4") &&
                  !strstr(text, "attempt 5") && strstr(text, "transient error, EBUSY"), "rc %d\n%s", rc, text);
    char *log = ck_incidents(d2);
    int lines = 0;
    for (const char *s = log; *s; s++) lines += *s == '\n';
    CHECK_MSG(lines == 4, "%d incidents:\n%s", lines, log);
    free(log);
}

/* ---- the loss-spike detector's history in RUN_DIR/ft_state.json ---- */

/* A stand-in trainer: each argument ATTEMPT@STEP:LOSS appends that step to rank 0's step log in attempt ATTEMPT;
 * ATTEMPT@beat writes rank 0's first beat (phase start: the trainer has applied KILN_REJECT_FROM); ATTEMPT@sleep
 * writes its pid to RUN_DIR/trainer.pid and sleeps (a job still running when the supervisor is lost); ATTEMPT@fail
 * exits with status 3 (a crash: the next attempt resumes). */
static const char *hist_trainer(void) {
    static char path[1200];
    snprintf(path, sizeof path, "%s", test_join(test_tmpdir(), "trainer.sh"));
    const char *sh = "log=\"$KILN_HEARTBEAT_DIR/steps_00000.jsonl\"\n"
                     "for x in \"$@\"; do\n"
                     "  case $x in\n"
                     "    \"$KILN_RUN_ATTEMPT\"@sleep) echo $$ > \"$KILN_HEARTBEAT_DIR/../trainer.pid\"\n"
                     "      exec sleep 60;;\n"
                     "    \"$KILN_RUN_ATTEMPT\"@beat) printf '{\"rank\":0,\"world\":1,\"attempt\":%s,\"pid\":%s,\"step\":0,"
                     "\"steps\":9,\"phase\":\"start\",\"loss\":0,\"grad_norm\":0,\"local_grad_norm\":0,\"step_s\":0,"
                     "\"compute_s\":0,\"time\":0,\"recent\":[]}' \"$KILN_RUN_ATTEMPT\" $$ > \"$KILN_HEARTBEAT_DIR/b\"\n"
                     "      mv \"$KILN_HEARTBEAT_DIR/b\" \"$KILN_HEARTBEAT_DIR/rank_00000.json\";;\n"
                     "    \"$KILN_RUN_ATTEMPT\"@fail) exit 3;;\n"
                     "    \"$KILN_RUN_ATTEMPT\"@*) y=${x#*@}\n"
                     "      printf '[%s,%s,%s,1]\\n' \"$KILN_RUN_ATTEMPT\" \"${y%%:*}\" \"${y#*:}\" >> \"$log\";;\n"
                     "  esac\n"
                     "done\n";
    CHECK_OK(kiln_write_file_atomic(path, sh, strlen(sh)));
    return path;
}

/* The [step, loss] pairs of RUN_DIR/ft_state.json's history; returns how many (-1: no such field). *reject: the
 * file's reject_from (NULL: not wanted). */
static int hist_read_state(const char *run_dir, int64_t *step, double *loss, int cap, int64_t *reject) {
    cJSON *o = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run_dir, "ft_state.json"), &o));
    if (reject) *reject = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "reject_from"));
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "spike_history"), *it;
    int n = h ? 0 : -1;
    cJSON_ArrayForEach(it, h) {
        if (n < cap)
            step[n] = (int64_t)cJSON_GetArrayItem(it, 0)->valuedouble, loss[n] = cJSON_GetArrayItem(it, 1)->valuedouble;
        n++;
    }
    cJSON_Delete(o);
    return n;
}

static int hist_read(const char *run_dir, int64_t *step, double *loss, int cap) {
    return hist_read_state(run_dir, step, loss, cap, NULL);
}

/* A rerun in a fresh run directory whose ft_state.json is `state`, its stand-in trainer (tr) reporting a spike as the
 * first step of attempt 1 (`steps`: "1@S:8 2@..."), after which attempt 2 finishes: the spike at step `spike` is
 * seen (a loss-spike incident of that step). Returns the run directory. */
static const char *rerun_sees_spike(const char *tr, const char *state, int window, const char *steps, int spike) {
    const char *d = test_tmpdir();
    char args[4096], text[16384], want[96];
    CHECK_OK(kiln_write_file_atomic(test_join(d, "ft_state.json"), state, strlen(state)));
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 --spike-window %d --spike-min 3 --spike-z 8 -- sh '%s' %s",
             d, window, tr, steps);
    const int rc = test_run_kiln(args, text, sizeof text);
    char *log = ck_incidents(d);
    snprintf(want, sizeof want, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":%d,", spike);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") && strstr(log, want), "rc %d\n%s\n%s", rc, text, log);
    free(log);
    return d;
}

/* The history outlives the supervisor: a state file of an older kiln (no history) loads and gets one; a rerun judges
 * its first step against the losses of the steps before it (a spike right away is seen, not missed for --spike-min
 * steps), and not against those of steps after its resume point (the rolled-back stretch: here losses of 100 that
 * would hide the spike); what it writes back is bounded (by 1024 losses, or --spike-window when larger; here
 * KILN_FT_HISTORY_KEEP) and leaves the skipped step out. */
TEST(ft_sup_spike_history_in_state_file) {
    const char *dir = test_tmpdir(), *tr = hist_trainer();
    char args[4096], text[16384];
    int64_t st[16];
    double ls[16];
    /* an older kiln's state file: loads; the history is written at the end (bounded: the last 4) */
    const char *old = "{\"skip_steps\":\"\",\"reject_from\":0}\n";
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "ft_state.json"), old, strlen(old)));
    snprintf(args, sizeof args, "run --run-dir '%s' --spike-window 4 --spike-min 3 -- sh '%s' 1@1:5 1@2:5.2 1@3:4.9 "
             "1@4:5.1 1@5:5", dir, tr);
    CHECK(setenv("KILN_FT_HISTORY_KEEP", "4", 1) == 0);
    int rc = test_run_kiln(args, text, sizeof text);
    unsetenv("KILN_FT_HISTORY_KEEP");
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt"), "rc %d\n%s", rc, text);
    int n = hist_read(dir, st, ls, 16);
    CHECK_MSG(n == 4 && st[0] == 2 && st[3] == 5 && ls[0] == 5.2 && ls[1] == 4.9 && ls[3] == 5, "%d entries", n);
    /* a history that runs past the rerun's resume point (step 5 comes first: it resumed from step 4) */
    const char *d2 = rerun_sees_spike(tr, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[[1,5],[2,5.2],[3,4.9],"
                                      "[4,5.1],[5,100],[6,100],[7,100],[8,100]]}\n", 8, "1@5:8 2@6:5.05 2@7:4.95", 5);
    n = hist_read(d2, st, ls, 16);
    const int64_t want[] = {1, 2, 3, 4, 6, 7};
    int same = n == 6;
    for (int i = 0; same && i < 6; i++) same = st[i] == want[i];
    CHECK_MSG(same && ls[4] == 5.05 && ls[5] == 4.95, "%d entries, the 5th step %lld", n,
              n > 4 ? (long long)st[4] : -1LL);
    /* a rerun resuming further back than the window (step 7 first; 12 steps judged before, the window 4): the history
     * keeps more than the window, so the 4 losses before step 7 judge it. Kept to the window alone, the history was
     * steps 9-12, all cut, and the spike went unseen for --spike-min steps. */
    rerun_sees_spike(tr, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[[1,5],[2,5.2],[3,4.9],[4,5.1],[5,5],"
                         "[6,5.05],[7,4.95],[8,5],[9,5.1],[10,4.9],[11,5],[12,5.05]]}\n", 4, "1@7:8 2@8:5.05 2@9:4.95", 7);
    /* a damaged history is an error naming the file and the field, before any launch */
    const char *d3 = test_tmpdir();
    const char *bad = "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[[2,5],[1,5]]}\n";
    CHECK_OK(kiln_write_file_atomic(test_join(d3, "ft_state.json"), bad, strlen(bad)));
    snprintf(args, sizeof args, "run --run-dir '%s' -- true", d3);
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "ft_state.json: field 'spike_history': entry 1: step 1 after step 2") &&
                  !strstr(text, "attempt 1"), "rc %d\n%s", rc, text);
    const char *bad2 = "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[[1,\"nan\"]]}\n";
    CHECK_OK(kiln_write_file_atomic(test_join(d3, "ft_state.json"), bad2, strlen(bad2)));
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "field 'spike_history': entry 0 is not [step >= 1, finite loss]"), "rc %d\n%s",
              rc, text);
}

/* A lost supervisor (SIGKILL, its node gone) while the job runs: the history it had judged is in ft_state.json
 * already (written at most every 2 s), so the rerun sees a spike at its first step; and so is the set-aside the
 * attempt applied (it beat), so that the rerun does not set aside the checkpoints that attempt saved. */
TEST(ft_sup_spike_history_outlives_a_lost_supervisor) {
    const char *dir = test_tmpdir(), *tr = hist_trainer();
    const char *pending = "{\"skip_steps\":\"\",\"reject_from\":7}\n";
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "ft_state.json"), pending, strlen(pending)));
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(KILN_BINARY, KILN_BINARY, "run", "--run-dir", dir, "--spike-min", "3", "--spike-window", "8", "--", "sh",
              tr, "1@beat", "1@1:5", "1@2:5.2", "1@3:4.9", "1@4:5.1", "1@sleep", (char *)NULL);
        _exit(127);
    }
    int n = -1;
    int64_t st[16], reject = -1;
    double ls[16];
    for (int i = 0; i < 200 && (n < 4 || access(test_join(dir, "trainer.pid"), F_OK)); i++) { /* 10 s at most */
        usleep(50000);
        n = hist_read_state(dir, st, ls, 16, &reject);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    char *pidtext = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_join(dir, "trainer.pid"), &pidtext, &len));
    pid_t job = pidtext ? (pid_t)atoi(pidtext) : 0;
    if (job > 1) kill(-job, SIGKILL); /* the job's own process group (kiln run gives it one) */
    free(pidtext);
    CHECK_MSG(n == 4 && reject == 0, "the history in ft_state.json: %d entries; reject_from %lld", n, (long long)reject);
    char args[4096], text[16384];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 --spike-min 3 --spike-window 8 --spike-z 8 -- sh '%s' "
             "1@5:8 2@6:5", dir, tr);
    int rc = test_run_kiln(args, text, sizeof text);
    char *log = ck_incidents(dir);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") &&
                  strstr(log, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":5,"), "rc %d\n%s\n%s", rc, text, log);
    free(log);
}

/* The real trainer: a first kiln run ends (killed at step 9, no restart allowed: --max-restarts 0) after judging
 * steps 1-8; the same command run again resumes from step 8 (or 4) and must see the spike at step 10, when a fresh
 * detector would still be blind (--spike-min 6: 1 or 5 steps judged by then). */
TEST(ft_sup_spike_history_outlives_the_supervisor) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "10");
    const char *cfg = sup_config(out, "\"ckpt_busy\": \"wait\"");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT=kill:step=9 '%s' run --run-dir '%s' --max-restarts 0 --spike-min 6 --spike-window 6 "
             "--spike-z 8 -- kiln train --config '%s' --quiet 2>&1", KILN_BINARY, out, cfg);
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "give up: 0 restarts used"), "rc %d\n%s", rc, text);
    int64_t st[16];
    double ls[16];
    int n = hist_read(out, st, ls, 16);
    CHECK_MSG(n == 8 && st[0] == 1 && st[7] == 8, "%d entries in the history, from step %lld", n,
              n > 0 ? (long long)st[0] : -1LL);
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT=spike:step=10 '%s' run --run-dir '%s' --backoff 0.05 --spike-min 6 --spike-window 6 "
             "--spike-z 8 -- kiln train --config '%s' --quiet 2>&1", KILN_BINARY, out, cfg);
    rc = test_run_shell(cmd, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") && strstr(log, "\"kind\":\"loss-spike\"") &&
                  strstr(log, "\"step\":10,"), "rc %d\n%s\n%s", rc, text, log);
    free(log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 10\n%s", text);
}

/* ---- a resume further back than the dense history (run.ckpt_every above history_keep): the anchors ---- */

/* The loss the stand-in reports for step s: 4.9-5.1 (%g's text, and the double the supervisor reads from it). */
static double hist_loss_of(int s, char *text, size_t cap) {
    snprintf(text, cap, "%g", 5 + 0.05 * ((s * 7) % 5 - 2));
    return strtod(text, NULL);
}

/* " ATTEMPT@S:LOSS" for the steps lo..hi appended to buf */
static void hist_steps(char *buf, size_t cap, int attempt, int lo, int hi) {
    size_t n = strlen(buf);
    for (int s = lo; s <= hi && n < cap; s++) {
        char l[32];
        hist_loss_of(s, l, sizeof l);
        n += (size_t)snprintf(buf + n, cap - n, " %d@%d:%s", attempt, s, l);
    }
}

/* One supervisor, a dense history of 5 losses (KILN_FT_HISTORY_KEEP) and a window of 4: attempt 1 judges steps 1-60
 * and crashes; attempt 2 resumes from the checkpoint of step 50, 10 steps behind the newest judged, and its first step
 * spikes. Every dense loss (56-60) is after step 50 and cut; the window before step 51 (47-50) is the anchor of step
 * 50, so the spike is seen at once. Without it the detector was blind for --spike-min steps and attempt 2 finished. */
TEST(ft_sup_spike_after_a_rollback_past_the_history) {
    const char *dir = test_tmpdir(), *tr = hist_trainer();
    char steps[4096] = "", args[8192], text[16384];
    hist_steps(steps, sizeof steps, 1, 1, 60);
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 --spike-window 4 --spike-min 3 --spike-z 8 -- sh '%s'%s "
             "1@fail 2@51:8 3@52:5.05 3@53:4.95", dir, tr, steps);
    CHECK(setenv("KILN_FT_HISTORY_KEEP", "5", 1) == 0);
    const int rc = test_run_kiln(args, text, sizeof text);
    unsetenv("KILN_FT_HISTORY_KEEP");
    char *log = ck_incidents(dir);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 3 attempts") &&
                  strstr(log, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":51,"), "rc %d\n%s\n%s", rc, text, log);
    free(log);
}

/* The anchor of [end, ...] in RUN_DIR/ft_state.json's "spike_anchors": its steps and losses (at most cap); returns how
 * many (-1: no such anchor; -2: no such field). *nanchors: how many anchors the file holds. */
static int hist_read_anchor(const char *run_dir, int64_t end, int64_t *step, double *loss, int cap, int *nanchors) {
    cJSON *o = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run_dir, "ft_state.json"), &o));
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "spike_anchors"), *it;
    int n = a ? -1 : -2;
    *nanchors = cJSON_GetArraySize(a);
    cJSON_ArrayForEach(it, a) {
        if ((int64_t)cJSON_GetArrayItem(it, 0)->valuedouble != end) continue;
        const cJSON *e;
        n = 0;
        cJSON_ArrayForEach(e, cJSON_GetArrayItem(it, 1)) {
            if (n < cap)
                step[n] = (int64_t)cJSON_GetArrayItem(e, 0)->valuedouble, loss[n] = cJSON_GetArrayItem(e, 1)->valuedouble;
            n++;
        }
    }
    cJSON_Delete(o);
    return n;
}

/* The anchors outlive the supervisor: a first kiln run judges steps 1-60 (dense history 5, window 4) and writes the
 * dense part (56-60, "spike_history" as before) and the anchors ("spike_anchors": the window 47-50 before step 51
 * among them, bounded); a rerun resuming from step 50 sees a spike at its first step. An older kiln's file whose
 * history is longer than the dense part leaves the same anchors (a rerun from step 40 sees its spike). And no window
 * is made up: a rerun from step 46, whose window no part holds whole (the anchor of step 50 starts at 47), starts with
 * an empty detector rather than one judged against the losses before a gap. */
TEST(ft_sup_spike_history_anchors_in_state_file) {
    const char *dir = test_tmpdir(), *tr = hist_trainer();
    char steps[4096] = "", args[8192], text[16384], l[32];
    hist_steps(steps, sizeof steps, 1, 1, 60);
    snprintf(args, sizeof args, "run --run-dir '%s' --spike-window 4 --spike-min 3 -- sh '%s'%s", dir, tr, steps);
    CHECK(setenv("KILN_FT_HISTORY_KEEP", "5", 1) == 0);
    int rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt"), "rc %d\n%s", rc, text);
    int64_t st[64];
    double ls[64];
    int n = hist_read(dir, st, ls, 64), nanchors = 0;
    CHECK_MSG(n == 5 && st[0] == 56 && st[4] == 60, "spike_history: %d entries, from step %lld", n,
              n > 0 ? (long long)st[0] : -1LL);
    n = hist_read_anchor(dir, 50, st, ls, 64, &nanchors);
    int same = n == 4;
    for (int i = 0; same && i < 4; i++) same = st[i] == 47 + i && ls[i] == hist_loss_of(47 + i, l, sizeof l);
    CHECK_MSG(same, "the anchor of step 50: %d entries, from step %lld", n, n > 0 ? (long long)st[0] : -1LL);
    CHECK_MSG(nanchors >= 2 && nanchors <= 20, "%d anchors (a budget of 16 x 5 losses: 20 windows of 4)", nanchors);
    /* a copy of the state file for the last rerun (the next one changes its own) */
    char *state = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_join(dir, "ft_state.json"), &state, &len));
    const char *d2 = test_tmpdir();
    CHECK_OK(kiln_write_file_atomic(test_join(d2, "ft_state.json"), state, len));
    free(state);
    /* the rerun from step 50 */
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 --spike-window 4 --spike-min 3 --spike-z 8 -- sh '%s' "
             "1@51:8 2@52:5.05 2@53:4.95", dir, tr);
    rc = test_run_kiln(args, text, sizeof text);
    char *log = ck_incidents(dir);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") &&
                  strstr(log, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":51,"), "rc %d\n%s\n%s", rc, text, log);
    free(log);
    /* an older kiln's file: the 60 losses in "spike_history" alone; the rerun from step 40 */
    size_t k = (size_t)snprintf(text, sizeof text, "{\"skip_steps\":\"\",\"reject_from\":0,\"spike_history\":[");
    for (int s = 1; s <= 60; s++) {
        hist_loss_of(s, l, sizeof l);
        k += (size_t)snprintf(text + k, sizeof text - k, "%s[%d,%s]", s > 1 ? "," : "", s, l);
    }
    snprintf(text + k, sizeof text - k, "]}\n");
    rerun_sees_spike(tr, text, 4, "1@41:8 2@42:5.05 2@43:4.95", 41);
    /* the rerun from step 46: no window; the spike at 47 goes unseen (the limit: a resume step no part covers) */
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 --spike-window 4 --spike-min 3 --spike-z 8 -- sh '%s' "
             "1@47:8", d2, tr);
    rc = test_run_kiln(args, text, sizeof text);
    log = ck_incidents(d2);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt") && !strstr(log, "loss-spike"), "rc %d\n%s\n%s", rc,
              text, log);
    free(log);
    unsetenv("KILN_FT_HISTORY_KEEP");
}

/* Runs cmd (a kiln run command line), which must finish after 3 attempts having reported a loss spike at each of
 * steps[0..n); text[cap] gets its output. */
static void sup_sees_spikes(const char *cmd, const char *out, const int64_t *steps, int n, char *text, size_t cap) {
    const int rc = test_run_shell(cmd, text, cap);
    char *log = ck_incidents(out);
    int seen = rc == 0 && strstr(text, "finished after 3 attempts") != NULL;
    for (int i = 0; i < n && seen; i++) {
        char want[96];
        snprintf(want, sizeof want, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":%lld,", (long long)steps[i]);
        seen = log && strstr(log, want);
    }
    CHECK_MSG(seen, "rc %d\n%s\n%s", rc, text, log ? log : "");
    free(log);
}

/* The real trainer: a checkpoint every 10 steps, the dense history 5 losses, the window 4. Killed at step 16, kiln run
 * resumes from step 10, 5 steps behind the newest judged (15): the dense losses (11-15) are all after it, and the spike
 * at step 11 is judged against the anchor of step 10 (steps 7-10). The run then skips step 11, as the reference does. */
TEST(ft_sup_spike_after_a_checkpoint_past_the_history) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "11");
    const char *cfg = ck_config(ck_data(), out, 16, 1, 32, "\"ckpt_every\": 10, \"keep_last\": 3, \"ckpt_busy\": \"wait\"");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd,
             "KILN_FT_HISTORY_KEEP=5 KILN_FAULT=kill:step=16,spike:step=11:attempt=2 '%s' run --run-dir '%s' "
             "--backoff 0.05 --spike-min 3 --spike-window 4 --spike-z 8 -- kiln train --config '%s' --quiet 2>&1",
             KILN_BINARY, out, cfg);
    const int64_t spikes[] = {11};
    sup_sees_spikes(cmd, out, spikes, 1, text, sizeof text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 11\n%s", text);
}

/* ---- a resume further back than the dense history from a checkpoint of a step that is not round: the trainer's
 * checkpoint lines ---- */

/* The reference for these: `steps` steps of the tiny model told to skip `skip`, run plainly. */
static void sup_reference_steps(const char *ref, int64_t steps, const char *skip) {
    char extra[128], args[2048];
    snprintf(extra, sizeof extra, "\"ckpt_every\": 1000, \"skip_steps\": \"%s\"", skip);
    snprintf(args, sizeof args, "train --config '%s' --quiet", ck_config(ck_data(), ref, steps, 1, 32, extra));
    CHECK(ck_kiln(args) == 0);
}

/* RUN_DIR/ft_state.json's "spike_checkpoints" holds `step` */
static int sup_state_has_ckpt(const char *run_dir, int64_t step) {
    cJSON *o = NULL;
    kiln_error *e = kiln_json_parse_file(test_join(run_dir, "ft_state.json"), &o);
    kiln_error_free(e);
    const cJSON *it;
    int found = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "spike_checkpoints")) found |= it->valuedouble == (double)step;
    cJSON_Delete(o);
    return found;
}

/* kiln run's options for these: the dense history 5 losses (KILN_FT_HISTORY_KEEP in the command's environment), the
 * window 3: the round-step rule holds no window before step 11 once the newest judged step is 20 (12's, the only round
 * one of 11-13, reaches 8 steps) */
#define SUP_CKPT_OPTS "--backoff 0.05 --spike-min 3 --spike-window 3 --spike-z 8"

/* The real trainer, 24 steps with the config's extra fields `extra` under KILN_FAULT=`faults` (a rank killed after the
 * checkpoint of step 11 and a spike at step 12 in attempt 2): kiln run, its dense history 5 losses, must resume from
 * step 11, see the spike at 12 in attempt 2, keep step 11 among ft_state.json's spike_checkpoints and end with the
 * weights of the run told to skip step 12. The run's directory is out; its output in text[cap]. */
static void sup_spike_after_ckpt_11(const char *extra, const char *faults, const char *out, char *text, size_t cap) {
    const char *ref = test_tmpdir();
    sup_reference_steps(ref, 24, "12");
    const char *cfg = ck_config(ck_data(), out, 24, 1, 32, extra);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "KILN_FT_HISTORY_KEEP=5 KILN_FAULT=%s '%s' run --run-dir '%s' " SUP_CKPT_OPTS
             " -- kiln train --config '%s' --quiet 2>&1", faults, KILN_BINARY, out, cfg);
    const int64_t spikes[] = {12};
    sup_sees_spikes(cmd, out, spikes, 1, text, cap);
    CHECK_MSG(sup_state_has_ckpt(out, 11), "ft_state.json's spike_checkpoints lacks step 11");
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 12\n%s", text);
}

/* The real trainer, a checkpoint every 11 steps: killed at step 22 (as it begins, before that step's checkpoint), kiln
 * run resumes from step 11, 10 steps behind the newest judged (21). The dense losses (17-21) are all after it, and no
 * round step's window holds step 11; the trainer's step log told of the checkpoint of step 11, and the window before
 * it (9-11) was kept, so the spike at step 12, the first step of attempt 2, is seen. Without it the detector started
 * empty there, blind for --spike-min steps, and attempt 2 finished with the spike trained in. */
TEST(ft_sup_spike_after_an_unround_checkpoint_past_the_history) {
    char text[32768];
    sup_spike_after_ckpt_11("\"ckpt_every\": 11, \"keep_last\": 100, \"ckpt_busy\": \"wait\"",
                            "kill:step=22,spike:step=12:attempt=2", test_tmpdir(), text, sizeof text);
}

/* A deferred save: checkpoints due every 2 steps on a slow disk (KILN_FAULT slow-save, each written in 9 steps: no
 * timing), so the save of step 2 commits at step 11 and the one due at step 10 is taken there, at step 11; it commits at
 * step 20, whose own save is still being written when the rank is killed at step 21. kiln run resumes from step 11, 9
 * behind the newest judged (20), and the spike at step 12 is seen: the checkpoint line told of step 11. Every
 * checkpoint is kept (run.keep_last 100): attempt 2 saves every 2 steps until the supervisor stops it, and with a
 * few kept, step 11's went before the set-aside of those after step 12 left nothing to resume from. */
TEST(ft_sup_spike_after_a_deferred_checkpoint_past_the_history) {
    const char *out = test_tmpdir();
    char text[32768];
    sup_spike_after_ckpt_11("\"ckpt_every\": 2, \"keep_last\": 100",
                            "slow-save:step=1:ms=0:steps=9,kill:step=21,spike:step=12:attempt=2", out, text, sizeof text);
    /* the checkpoint of step 11 was the deferred one (metrics.jsonl keeps the records up to the resume step) */
    char *metrics = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_join(out, "metrics.jsonl"), &metrics, &len));
    CHECK_MSG(metrics && strstr(metrics, "{\"step\":11,") && strstr(metrics, "\"ckpt_deferred_from\":10,"), "%s\n%s",
              metrics ? metrics : "", text);
    free(metrics);
}

/* A stop save (--stop-after 11: Ctrl-C's path, at a set step) ends a first kiln run; its ft_state.json keeps the
 * window before the checkpoint of step 11 as a checkpoint's. The same command run again resumes from it, trains to a
 * spike at step 22 and rolls back to step 11 (no checkpoint in between: run.ckpt_every 1000), 10 steps behind the
 * newest judged: the spike at step 12 is seen, from the window kept across the two supervisors. */
TEST(ft_sup_spike_after_a_stop_checkpoint_in_the_state_file) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference_steps(ref, 24, "12,22");
    const char *cfg = ck_config(ck_data(), out, 24, 1, 32, "\"ckpt_every\": 1000, \"keep_last\": 100, \"ckpt_busy\": \"wait\"");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd, "KILN_FT_HISTORY_KEEP=5 '%s' run --run-dir '%s' " SUP_CKPT_OPTS " -- kiln train --config "
             "'%s' --quiet --stop-after 11 2>&1", KILN_BINARY, out, cfg);
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt") && sup_exists(out, "ckpt/step_00000011/COMMITTED"),
              "rc %d\n%s", rc, text);
    CHECK_MSG(sup_state_has_ckpt(out, 11), "ft_state.json's spike_checkpoints lacks step 11");
    snprintf(cmd, sizeof cmd,
             "KILN_FT_HISTORY_KEEP=5 KILN_FAULT=spike:step=22,spike:step=12:attempt=2 '%s' run --run-dir '%s' "
             SUP_CKPT_OPTS " -- kiln train --config '%s' --quiet 2>&1", KILN_BINARY, out, cfg);
    const int64_t spikes[] = {22, 12};
    sup_sees_spikes(cmd, out, spikes, 2, text, sizeof text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip steps 12 and 22\n%s", text);
}

/* ---- the trainer's heartbeats, written by a background thread (kiln_heartbeat_writer) ---- */

/* hb's step log is steps from..to of `attempt` (from = 0: whatever the first), each once and in order, but for the
 * steps in skip[0..nskip), with the checkpoints' records each right after its step's (or, for a skipped step, after
 * the step before it); *first: the first step; *nckpt, *last_ckpt (may be NULL): how many checkpoint records, the step
 * of the last one (0: none). Failures are reported; returns 1 when it is so. */
static int sup_log_is(const char *hb, int attempt, int64_t from, int64_t to, const int64_t *skip, int nskip,
                      int64_t *first, int *nckpt, int64_t *last_ckpt) {
    const int cap = 100000;
    ft_step_rec *rec = malloc((size_t)cap * sizeof *rec);
    if (!rec) return 0;
    int n = ft_step_log_read(hb, 0, rec, cap), ok = n > 0, nck = 0;
    int64_t want = 0, last = 0, ck = 0;
    for (int i = 0; i < n && !want; i++)
        if (!rec[i].ckpt) want = from ? from : rec[i].step;
    if (first) *first = want;
    for (int i = 0; i < n && ok; i++) {
        if (rec[i].ckpt) {
            int skipped = rec[i].step > last; /* every step after the last one logged up to it was skipped */
            for (int64_t st = last + 1; st <= rec[i].step && skipped; st++) {
                int sk = 0;
                for (int k = 0; k < nskip; k++) sk |= st == skip[k];
                skipped = sk;
            }
            ok = rec[i].attempt == attempt && (rec[i].step == last || skipped);
            CHECK_MSG(ok, "%s: record %d is the checkpoint of step %lld of attempt %d, after step %lld", hb, i,
                      (long long)rec[i].step, rec[i].attempt, (long long)last);
            nck++, ck = rec[i].step;
            continue;
        }
        for (int k = 0; k < nskip; k++)
            if (want == skip[k]) want++;
        ok = rec[i].step == want && rec[i].attempt == attempt;
        CHECK_MSG(ok, "%s: record %d is step %lld of attempt %d, want step %lld of attempt %d", hb, i,
                  (long long)rec[i].step, rec[i].attempt, (long long)want, attempt);
        last = want++;
    }
    CHECK_MSG(n > 0 && last == to, "%s: %d records, the last step %lld, want %lld", hb, n, (long long)last, (long long)to);
    if (nckpt) *nckpt = nck;
    if (last_ckpt) *last_ckpt = ck;
    free(rec);
    return ok && last == to;
}

/* A plain `kiln train` with kiln run's KILN_HEARTBEAT_DIR and a slow heartbeat file system (every background write
 * 40 ms, steps far faster): at exit every step is in the log, once, in order, with the loss metrics.jsonl has, and the
 * beat on disk is the last one ("done"); beats were coalesced, yet nothing was lost. */
TEST(ft_sup_trainer_beats_slow_writer) {
    const char *out = test_tmpdir(), *hb = test_join(test_tmpdir(), "hb");
    CHECK(mkdir(hb, 0755) == 0);
    char cmd[4096], text[16384];
    snprintf(cmd, sizeof cmd, "KILN_HEARTBEAT_DIR='%s' KILN_HEARTBEAT_DELAY_MS=40 '%s' train --config '%s' --quiet 2>&1",
             hb, KILN_BINARY, sup_config(out, NULL));
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc == 0, "rc %d\n%s", rc, text);
    int nck = 0;
    int64_t last_ck = 0;
    CHECK(sup_log_is(hb, 1, 1, 16, NULL, 0, NULL, &nck, &last_ck));
    /* the checkpoints every 4 steps (one may be deferred past its step while the previous is written), the last one
     * the final save's */
    CHECK_MSG(nck >= 2 && nck <= 4 && last_ck == 16, "%d checkpoint records, the last of step %lld", nck,
              (long long)last_ck);
    kiln_heartbeat g;
    CHECK_OK(kiln_heartbeat_read(hb, 0, &g));
    CHECK_MSG(g.step == 16 && !strcmp(g.phase, "done") && g.nrecent == 16, "the beat on disk: step %lld, phase %s",
              (long long)g.step, g.phase);
    double loss[16];
    ft_step_rec rec[32];
    const int n = ft_step_log_read(hb, 0, rec, 32);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!rec[i].ckpt) rec[k++] = rec[i];
    if (ck_losses(out, loss, 16) == 16 && k == 16)
        for (int i = 0; i < 16; i++)
            CHECK_MSG(fabs(rec[i].loss - loss[i]) <= 1e-5 * fabs(loss[i]), "step %d: loss %.9g in the log, %.9g in "
                      "metrics.jsonl", i + 1, rec[i].loss, loss[i]);
}

/* Ctrl-C with a slow heartbeat writer (300 ms a write): the trainer saves, and the beat and the step log on disk at
 * its exit reach the step it stopped at, the step of the checkpoint it saved. */
TEST(ft_sup_trainer_beats_on_ctrl_c) {
    const char *out = test_tmpdir(), *hb = test_join(test_tmpdir(), "hb");
    CHECK(mkdir(hb, 0755) == 0);
    const char *cfg = ck_config(ck_data(), out, 100000, 1, 32, "\"ckpt_every\": 1000000");
    setenv("KILN_HEARTBEAT_DIR", hb, 1);
    setenv("KILN_HEARTBEAT_DELAY_MS", "300", 1);
    int rc = ck_train_until_sigint(cfg, out, 3000);
    unsetenv("KILN_HEARTBEAT_DIR");
    unsetenv("KILN_HEARTBEAT_DELAY_MS");
    CHECK_MSG(rc == 130, "exit status %d", rc);
    kiln_heartbeat g;
    CHECK_OK(kiln_heartbeat_read(hb, 0, &g));
    CHECK_MSG(g.step > 1 && !strcmp(g.phase, "train"), "the beat on disk: step %lld, phase %s", (long long)g.step, g.phase);
    int nck = 0;
    int64_t last_ck = 0;
    CHECK(sup_log_is(hb, 1, 1, g.step, NULL, 0, NULL, &nck, &last_ck));
    CHECK_MSG(nck == 1 && last_ck == g.step, "%d checkpoint records, the last of step %lld (the Ctrl-C save's: %lld)",
              nck, (long long)last_ck, (long long)g.step);
    char ck[64];
    snprintf(ck, sizeof ck, "ckpt/step_%08lld/COMMITTED", (long long)g.step);
    CHECK_MSG(sup_exists(out, ck), "no committed checkpoint of step %lld, the last beat's", (long long)g.step);
}

/* A heartbeat write that fails in the background stops the trainer (exit 1, the error naming the file), as a failed
 * synchronous beat did: a heartbeat directory under a regular file, and one replaced by a file mid-run. */
TEST(ft_sup_trainer_beat_error_stops_it) {
    const char *out = test_tmpdir(), *root = test_tmpdir();
    CHECK_OK(kiln_write_file_atomic(test_join(root, "file"), "x", 1));
    char cmd[8192], text[16384];
    snprintf(cmd, sizeof cmd, "KILN_HEARTBEAT_DIR='%s/file/hb' '%s' train --config '%s' --quiet 2>&1", root,
             KILN_BINARY, sup_config(out, NULL));
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "kiln train (rank 0): error: ") &&
                  strstr(text, "/file/hb/rank_00000.json.tmp: cannot open: Not a directory"), "rc %d\n%s", rc, text);
    /* replaced mid-run (steps of 20 ms or more: 300 of them take 6 s and more; replaced once the first beat is there).
     * Moved aside in one rename: an rm -rf raced the writer, which created a file in it between rm's unlinks and its
     * rmdir ("Directory not empty"), so the directory stayed and the run trained on (a flake under load, session 36). */
    const char *out2 = test_tmpdir(), *hb = test_join(root, "hb");
    CHECK(mkdir(hb, 0755) == 0);
    snprintf(cmd, sizeof cmd,
             "KILN_HEARTBEAT_DIR='%s' KILN_FAULT=slow:step=1:ms=20 '%s' train --config '%s' --quiet > '%s/log' 2>&1 & p=$!; "
             "i=0; while [ ! -e '%s/rank_00000.json' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; sleep 0.3; "
             "mv '%s' '%s.gone' && echo x > '%s'; wait $p; echo \"rc=$?\"; cat '%s/log'",
             hb, KILN_BINARY, ck_config(ck_data(), out2, 300, 1, 32, "\"ckpt_every\": 1000000"), root, hb, hb, hb, hb, root);
    rc = test_run_shell(cmd, text, sizeof text);
    /* which write fails first (the step log's line, the beat's temp file, or the rename of a temp file written just
     * before the move) and how (the directory gone, or a file in its place) depends on where the writer is when the
     * directory goes: any of them, named (the rename's seen in CI, session 45) */
    CHECK_MSG(rc == 0 && strstr(text, "rc=1\n") && strstr(text, "kiln train (rank 0): error: ") &&
                  (strstr(text, "/hb/steps_00000.jsonl: cannot open: ") || strstr(text, "/hb/rank_00000.json.tmp: cannot open: ") ||
                   strstr(text, "/hb/rank_00000.json: rename: ")),
              "rc %d\n%s", rc, text);
    double loss[300];
    const int steps = ck_losses(out2, loss, 300);
    CHECK_MSG(steps > 0 && steps < 300, "trained %d steps of 300 (it should stop at the failed beat)", steps);
}

/* kiln run with a slow heartbeat file system (20 ms a background write; steps far faster, so beats are coalesced and
 * lag): two spikes, one per attempt, are both seen (every step is judged from the log), no hang is declared
 * (--hang-timeout 5: beats keep coming), and the last attempt's log holds each of its steps once, in order, without
 * the skipped ones; its last beat is "done". The steps (~0.1 ms) run hundreds ahead of what the supervisor has judged
 * (its 0.1 s poll, and here the writer's lag): every checkpoint is kept, so that one before step 900 is left to roll
 * back to. */
TEST(ft_sup_slow_heartbeat_writer) {
    const char *out = test_tmpdir();
    char *p = sup_fast_config(out, "\"steps\": 1200, \"ckpt_every\": 200, \"keep_last\": 100");
    char args[4096], text[65536];
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0.05 --spike-z 300 --hang-timeout 5 -- kiln train --config '%s' --quiet", out, p);
    free(p);
    setenv("KILN_FAULT", "spike:step=500,spike:step=900:attempt=2", 1);
    setenv("KILN_HEARTBEAT_DELAY_MS", "20", 1);
    int rc = test_run_kiln(args, text, sizeof text);
    unsetenv("KILN_FAULT");
    unsetenv("KILN_HEARTBEAT_DELAY_MS");
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 3 attempts") &&
                  strstr(log, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":500,") &&
                  strstr(log, "\"kind\":\"loss-spike\",\"rank\":null,\"step\":900,") && !strstr(log, "\"hang\""),
              "rc %d\n%s\n%s", rc, text, log);
    free(log);
    const int64_t skip[] = {500, 900};
    int64_t first = 0;
    const char *hb = test_join(out, "heartbeat");
    CHECK(sup_log_is(hb, 3, 0, 1200, skip, 2, &first, NULL, NULL));
    CHECK_MSG(first > 500 && first <= 900, "the last attempt's first step %lld (want one after 500, before 900)\n%s",
              (long long)first, text);
    kiln_heartbeat g;
    CHECK_OK(kiln_heartbeat_read(hb, 0, &g));
    CHECK_MSG(g.step == 1200 && g.attempt == 3 && !strcmp(g.phase, "done"), "the last beat: step %lld of attempt %d, %s",
              (long long)g.step, g.attempt, g.phase);
}
