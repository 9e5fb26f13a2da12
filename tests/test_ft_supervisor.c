/* kiln run's supervisor, one rank launched directly (no mpirun needed): the rejection of checkpoints
 * trained on a bad window outlives an attempt that fails before applying it, the skip windows outlive
 * the supervisor process, the spike detector is not blind after a restart nor between two polls of
 * fast steps, Ctrl-C's grace, and the rule that stops retrying a failure that repeats before any step. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_testutil.h"
#include "kiln/fsutil.h"

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
 * attempt after that must still set aside the checkpoints of step >= 12 and skip step 12. */
TEST(ft_sup_reject_outlives_a_failed_attempt) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "12");
    char cmd[4096], text[32768];
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT=spike:step=12 '%s' run --run-dir '%s' --backoff 0.05 " SPIKE_OPTS " -- sh -c "
             "'[ \"$KILN_RUN_ATTEMPT\" = 2 ] && exit 1; exec \"$0\" train --config \"$1\" --quiet' '%s' '%s' 2>&1",
             KILN_BINARY, out, KILN_BINARY, sup_config(out, NULL));
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
 * aside the checkpoints trained on it), not train the spiked step again. */
TEST(ft_sup_skip_windows_outlive_ctrl_c) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    sup_reference(ref, "12");
    const char *cfg = sup_config(out, NULL);
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

/* Steps far faster than the 0.1 s poll: many more than a beat's recent list (32) pass between two polls; every
 * one-step spike must still be seen. Four of them, one per attempt: judging only the beats' recent lists catches
 * each with a chance of about 32 / (steps per poll), all four rarely. */
TEST(ft_sup_spike_between_polls_of_fast_steps) {
    const char *out = test_tmpdir();
    char *p = kiln_path_join(test_tmpdir(), "fast.json");
    char cfg[4096], args[4096], text[65536];
    snprintf(cfg, sizeof cfg,
             "{\"model\": {\"vocab_size\": %d, \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 1,"
             " \"num_key_value_heads\": 1, \"head_dim\": 8, \"num_experts\": 2, \"moe_intermediate_size\": 8,"
             " \"router_hidden_size\": 8, \"eos_token_id\": null},"
             " \"data\": {\"dir\": \"%s\", \"seq_len\": 4, \"micro_batch\": 1, \"grad_accum\": 1},"
             " \"optim\": {\"lr\": 0.001, \"min_lr\": 0.001, \"warmup\": 0},"
             " \"run\": {\"steps\": 3000, \"out_dir\": \"%s\", \"log_every\": 1000, \"eval_every\": 0, \"threads\": 1,"
             " \"ckpt_every\": 500}}",
             CK_VOCAB, ck_data(), out);
    CHECK_OK(kiln_write_file_atomic(p, cfg, strlen(cfg)));
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

/* The same error before any step, twice in a row: not retried further; a failure whose error changes is. */
TEST(ft_sup_same_early_error_twice_gives_up) {
    const char *dir = test_tmpdir();
    char args[2048], text[16384];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 -- kiln train --config '%s/missing.json'", dir, dir);
    int rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "the same error before any step twice") && !strstr(text, "attempt 3"), "rc %d\n%s",
              rc, text);
    char *log = ck_incidents(dir);
    int lines = 0;
    for (const char *s = log; *s; s++) lines += *s == '\n';
    CHECK_MSG(lines == 2, "%d incidents:\n%s", lines, log);
    free(log);
    /* the error line that explains the failure: kiln's own, not any line that mentions "error" */
    const char *d2 = test_tmpdir();
    snprintf(args, sizeof args,
             "run --run-dir '%s' --backoff 0 --max-restarts 0 -- sh -c 'echo \"sample: no error here\" >&2; "
             "echo \"kiln train: error: the real cause\" >&2; exit 3'", d2);
    rc = test_run_kiln(args, text, sizeof text);
    CHECK_MSG(rc == 1 && strstr(text, "exited with status 3: kiln train: error: the real cause"), "rc %d\n%s", rc, text);
}
