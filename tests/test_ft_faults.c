/* kiln run against injected faults, 2 MPI ranks on the CPU: each run must end with final weights
 * bit-identical to a fault-free run (or, where a data window is skipped, to a run told to skip it):
 * SIGKILL of a rank at random steps (twice), SIGSTOP of a rank (a hang), a NaN (rollback and
 * skip), the newest checkpoint corrupted by a bit flip, a full disk during a save, a crash in the
 * middle of a save; and a loss spike, a straggler, Ctrl-C. Set KILN_TEST_SEED to replay the
 * random kill steps of a failed run. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/rng.h"
#include "kiln/zaya.h"
#include "ckpt_testutil.h"
#include "test.h"

#define VOCAB 64
_Static_assert(VOCAB == CK_VOCAB, "the synthetic shards (ckpt_testutil.h) have CK_VOCAB tokens");
#define STEPS 16

/* One data directory for every test of this file. */
static const char *data_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "%s", test_tmpdir());
    kiln_data_index ix = {0};
    ix.version = KILN_DATA_INDEX_VERSION;
    ix.tokenizer_path = "none";
    ix.vocab_size = VOCAB;
    ix.eos_id = -1;
    ix.token_bytes = 2;
    ix.nsplits = 1;
    kiln_data_split_info sp;
    memset(&sp, 0, sizeof sp);
    ck_split(dir, "train", 40000, 1, &sp);
    ix.splits = &sp;
    CHECK_OK(kiln_data_index_write(dir, &ix));
    free(sp.name);
    free(sp.shards[0].file);
    free(sp.shards);
    return dir;
}

/* A tiny model, STEPS steps, a checkpoint every 4 (kept: 3). extra: more "run" fields. */
static const char *config(const char *out, const char *extra) {
    static char path[8][1100];
    static int k;
    char *p = path[k++ & 7];
    snprintf(p, sizeof path[0], "%s/cfg.json", out);
    char text[4096];
    snprintf(text, sizeof text,
             "{\"model\": {\"vocab_size\": %d, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 4, \"moe_intermediate_size\": 32,"
             " \"router_hidden_size\": 16, \"eos_token_id\": null},"
             " \"data\": {\"dir\": \"%s\", \"seq_len\": 32, \"micro_batch\": 2},"
             " \"optim\": {\"lr\": 0.01, \"min_lr\": 0.001, \"warmup\": 3},"
             " \"run\": {\"steps\": %d, \"out_dir\": \"%s\", \"log_every\": 1000, \"eval_every\": 0, \"threads\": 1,"
             " \"ckpt_every\": 4, \"keep_last\": 3%s%s}}",
             VOCAB, data_dir(), STEPS, out, extra ? ", " : "", extra ? extra : "");
    CHECK_OK(kiln_write_file_atomic(p, text, strlen(text)));
    return p;
}

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* kiln run --np 2 on out's config; returns the exit status, output in text. */
static int supervised(const char *out, const char *cfg, const char *fault, const char *run_opts, const char *train_opts,
                      char *text, size_t cap) {
    char cmd[8192];
    /* no leak check in the MPI ranks (OpenMPI's unloaded components; see test_train.c) */
    snprintf(cmd, sizeof cmd,
             "KILN_FAULT='%s' ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader '%s' run --np 2 "
             "--mpirun-args '--allow-run-as-root --oversubscribe' --run-dir '%s' --backoff 0.05 --grace 2 "
             "--hang-timeout 6 %s -- kiln train --config '%s' --quiet %s 2>&1",
             fault ? fault : "", KILN_BINARY, out, run_opts ? run_opts : "", cfg, train_opts ? train_opts : "");
    return test_run_shell(cmd, text, cap);
}

/* The fault-free run (and the one told to skip step 9), computed once. */
static const char *reference(const char *skip) {
    static char dirs[2][1024];
    char *d = dirs[skip != NULL];
    if (d[0]) return d;
    snprintf(d, sizeof dirs[0], "%s", test_tmpdir());
    char extra[64], text[16384];
    snprintf(extra, sizeof extra, "\"skip_steps\": \"%s\"", skip ? skip : "");
    int rc = supervised(d, config(d, skip ? extra : NULL), NULL, NULL, NULL, text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt"), "reference run: %d\n%s", rc, text);
    return d;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

static uint64_t test_seed(void) {
    const char *s = getenv("KILN_TEST_SEED");
    return s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
}

/* A rank SIGKILLed at a random step, twice (the second time in the restarted run, on the other rank). */
TEST(ft_fault_kill_rank_twice) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    uint64_t seed = test_seed();
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    /* the second at or after the first: the restarted run resumes before s1 and must reach s2 */
    int s1 = 2 + (int)(kiln_rng_u64(&r) % (STEPS - 2)), s2 = s1 + (int)(kiln_rng_u64(&r) % (STEPS - s1 + 1));
    printf("    KILN_TEST_SEED=%llu: kill rank 1 at step %d, then rank 0 at step %d\n", (unsigned long long)seed, s1, s2);
    const char *ref = reference(NULL), *out = test_tmpdir();
    char fault[128], text[32768];
    snprintf(fault, sizeof fault, "kill:rank=1:step=%d,kill:rank=0:step=%d:attempt=2", s1, s2);
    int rc = supervised(out, config(out, NULL), fault, NULL, NULL, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 3 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(count(log, "\"kind\":\"killed\"") == 2 && strstr(log, "\"kind\":\"killed\",\"rank\":1") &&
                  strstr(log, "\"kind\":\"killed\",\"rank\":0") && strstr(log, "signal 9"), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* A rank stopped (SIGSTOP) as a step begins: the other waits in a collective; no progress is a hang. */
TEST(ft_fault_sigstop_hang) {
    if (!have_mpirun()) return;
    const char *ref = reference(NULL), *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, NULL), "stop:rank=0:step=6", "--hang-timeout 3 --grace 1", NULL, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(count(log, "\"kind\":\"hang\"") == 1 && strstr(log, "\"kind\":\"hang\",\"rank\":0,\"step\":5") &&
                  strstr(log, "the rank is stopped"), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* A NaN gradient on rank 1 at step 9: detected, rolled back, step 9's data skipped; the result is
 * the run told to skip step 9. */
TEST(ft_fault_nan_rollback_and_skip) {
    if (!have_mpirun()) return;
    const char *ref = reference("9"), *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, NULL), "nan:rank=1:step=9", NULL, NULL, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") && strstr(text, "skipping steps 9"), "rc %d\n%s", rc,
              text);
    CHECK_MSG(count(log, "\"kind\":\"nan\"") == 1 && strstr(log, "\"kind\":\"nan\",\"rank\":1,\"step\":9") &&
                  strstr(log, "skipping steps 9-9"), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 9");
    CHECK_MSG(!ck_same_model(reference(NULL), out), "skipping step 9 changed nothing: the test cannot fail");
    free(log);
}

/* A loss spike (the loss rank 0 reports at step 12 x1000): rolled back before it, step 12 skipped;
 * the checkpoints saved after it are set aside, not deleted. */
TEST(ft_fault_loss_spike) {
    if (!have_mpirun()) return;
    const char *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, NULL), "spike:rank=0:step=12", "--spike-min 4 --spike-window 8 --spike-z 8", NULL,
                        text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(count(log, "\"kind\":\"loss-spike\"") == 1 && strstr(log, "\"step\":12") && strstr(log, "skipping steps 12-12"),
              "%s", log);
    /* the reference: a run told to skip step 12 */
    const char *ref = test_tmpdir();
    rc = supervised(ref, config(ref, "\"skip_steps\": \"12\""), NULL, NULL, NULL, text, sizeof text);
    CHECK(rc == 0);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the run told to skip step 12");
    free(log);
}

/* Bit flip in the newest checkpoint of a stopped run: the supervised resume detects it and uses
 * the previous one. */
TEST(ft_fault_corrupt_newest_checkpoint) {
    if (!have_mpirun()) return;
    const char *ref = reference(NULL), *out = test_tmpdir();
    const char *cfg = config(out, NULL);
    char text[32768];
    int rc = supervised(out, cfg, NULL, NULL, "--stop-after 9", text, sizeof text); /* checkpoints 4, 8, 9 */
    CHECK_MSG(rc == 0, "rc %d\n%s", rc, text);
    char shard[1300];
    snprintf(shard, sizeof shard, "%s/ckpt/step_00000009/rank_00001.safetensors", out);
    FILE *f = fopen(shard, "r+b");
    CHECK_MSG(f != NULL, "no %s", shard);
    if (f) {
        fseek(f, -9, SEEK_END);
        int c = fgetc(f);
        fseek(f, -9, SEEK_END);
        fputc(c ^ 0x04, f);
        fclose(f);
    }
    rc = supervised(out, cfg, NULL, NULL, "--resume", text, sizeof text);
    CHECK_MSG(rc == 0 && strstr(text, "skipping checkpoint") && strstr(text, "step_00000009/rank_00001.safetensors: checksum"),
              "rc %d\n%s", rc, text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
}

/* The disk fills up while rank 1 writes the checkpoint of step 8 (RLIMIT_FSIZE, writes fail with
 * EFBIG): the save fails, the run stops, the restart resumes from step 4. run.ckpt_busy "wait": the save
 * of step 8 is taken at step 8 even if the one of step 4 is still being written (not deferred). */
TEST(ft_fault_disk_full_during_save) {
    if (!have_mpirun()) return;
    const char *ref = reference(NULL), *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, "\"ckpt_busy\": \"wait\""), "disk-full:rank=1:step=8", NULL, NULL, text,
                        sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts") && strstr(text, "checkpoint at step 8"), "rc %d\n%s", rc,
              text);
    CHECK_MSG(count(log, "\"kind\":\"exit\",\"rank\":1") == 1 && strstr(log, "File too large"), "%s\n%s", log, text);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* Rank 0 dies in the middle of writing the checkpoint of step 8 (SIGXFSZ at the file size limit; taken
 * at step 8: run.ckpt_busy "wait"). */
TEST(ft_fault_crash_in_save) {
    if (!have_mpirun()) return;
    const char *ref = reference(NULL), *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, "\"ckpt_busy\": \"wait\""), "crash-in-save:rank=0:step=8", NULL, NULL, text,
                        sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(count(log, "\"kind\":\"killed\",\"rank\":0") == 1 && strstr(log, "signal 25"), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* A straggler is reported (warn) and the run goes on undisturbed. */
TEST(ft_fault_straggler_warns) {
    if (!have_mpirun()) return;
    const char *ref = reference(NULL), *out = test_tmpdir();
    char text[32768];
    int rc = supervised(out, config(out, NULL), "slow:rank=1:step=2:ms=250", "--straggler-factor 3 --straggler-steps 2",
                        NULL, text, sizeof text);
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 1 attempt"), "rc %d\n%s", rc, text);
    CHECK_MSG(count(log, "\"kind\":\"straggler\",\"rank\":1") == 1 && strstr(log, "\"action\":\"warn\""), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* One rank, launched directly: a SIGKILL is seen in the child's status. */
TEST(ft_fault_kill_direct_launch) {
    const char *ref = test_tmpdir(), *out = test_tmpdir();
    char args[4096], text[16384];
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 -- kiln train --config '%s' --quiet", ref, config(ref, NULL));
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    snprintf(args, sizeof args, "run --run-dir '%s' --backoff 0 -- kiln train --config '%s' --quiet", out, config(out, NULL));
    setenv("KILN_FAULT", "kill:step=7", 1);
    int rc = test_run_kiln(args, text, sizeof text);
    unsetenv("KILN_FAULT");
    char *log = ck_incidents(out);
    CHECK_MSG(rc == 0 && strstr(text, "finished after 2 attempts"), "rc %d\n%s", rc, text);
    CHECK_MSG(strstr(log, "\"kind\":\"killed\",\"rank\":0,\"step\":6") && strstr(log, "signal 9"), "%s", log);
    CHECK_MSG(ck_same_model(ref, out), "final weights differ from the fault-free run");
    free(log);
}

/* Ctrl-C to kiln run: the ranks save a checkpoint and stop; exit status 130. */
TEST(ft_run_ctrl_c_stops_cleanly) {
    const char *out = test_tmpdir();
    const char *cfg = config(out, NULL);
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(cfg, &t, &len));
    char *s = t ? strstr(t, "\"steps\": 16") : NULL;
    CHECK(s != NULL);
    if (s) { /* a run far too long to finish */
        char longer[8192];
        snprintf(longer, sizeof longer, "%.*s\"steps\": 1000000000%s", (int)(s - t), t, s + 11);
        CHECK_OK(kiln_write_file_atomic(cfg, longer, strlen(longer)));
    }
    free(t);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(KILN_BINARY, KILN_BINARY, "run", "--run-dir", out, "--", "kiln", "train", "--config", cfg, "--quiet",
              (char *)NULL);
        _exit(127);
    }
    char hb[1200];
    snprintf(hb, sizeof hb, "%s/heartbeat/rank_00000.json", out);
    struct stat sb;
    for (int i = 0; i < 600 && stat(hb, &sb); i++) usleep(20000);
    usleep(200000);
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 130, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    char *log = ck_incidents(out);
    CHECK_MSG(strstr(log, "\"kind\":\"interrupted\""), "%s", log);
    free(log);
    kiln_heartbeat h;
    CHECK_OK(kiln_heartbeat_read(test_join(out, "heartbeat"), 0, &h));
    char ck[1300];
    snprintf(ck, sizeof ck, "%s/ckpt/step_%08lld/COMMITTED", out, (long long)h.step);
    CHECK_MSG(access(ck, F_OK) == 0, "no checkpoint at step %lld after Ctrl-C", (long long)h.step);
}
