/* kiln train end to end on small synthetic data: loss falls, resume is bit-identical, two MPI
 * ranks match one rank with twice the accumulation, full disks and Ctrl-C leave a good checkpoint. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/rng.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "ckpt_testutil.h"
#include "test.h"

TEST(train_loss_falls) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    const char *cfg = ck_config(data, out, 40, 1, 32, NULL);
    char args[2048];
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK(ck_kiln(args) == 0);
    double loss[40] = {0};
    CHECK(ck_losses(out, loss, 40) == 40);
    double first = (loss[0] + loss[1]) / 2, last = (loss[38] + loss[39]) / 2;
    CHECK_MSG(last < first - 0.5, "loss %.3f -> %.3f", first, last);
    /* the saved model loads as a HF ZAYA directory */
    char model[1200];
    snprintf(model, sizeof model, "%s/model", out);
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_load_dir(model, &m));
    kiln_zaya_free(m);
}


TEST(train_resume_is_bit_identical) {
    const char *data = ck_data_splits(1), *a = test_tmpdir(), *b = test_tmpdir();
    char args[2048];
    const char *ca = ck_config(data, a, 12, 2, 32, "\"ckpt_every\": 4");
    snprintf(args, sizeof args, "train --config '%s' --quiet", ca);
    CHECK(ck_kiln(args) == 0);
    const char *cb = ck_config(data, b, 12, 2, 32, "\"ckpt_every\": 4");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 5", cb); /* stops at 5, saves */
    CHECK(ck_kiln(args) == 0);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume --stop-after 2", cb); /* 5 -> 7 */
    CHECK(ck_kiln(args) == 0);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", cb); /* 7 -> 12 */
    CHECK(ck_kiln(args) == 0);
    CHECK_MSG(ck_same_model(a, b), "resumed weights differ from uninterrupted");
    double la[12] = {0}, lb[12] = {0};
    ck_losses(a, la, 12);
    ck_losses(b, lb, 12);
    for (int i = 0; i < 12; i++) CHECK_MSG(la[i] == lb[i], "step %d: loss %.9g vs %.9g", i + 1, la[i], lb[i]);
    /* keep_last = 2: only the two newest checkpoints remain */
    char p[1300];
    snprintf(p, sizeof p, "%s/ckpt/step_00000004", b);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/ckpt/step_00000012/COMMITTED", b);
    CHECK(access(p, F_OK) == 0);
}

static int have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* Two ranks with ZeRO-1 against one rank accumulating two micro-batches: same data, same steps,
 * losses within 1e-5 relative over 20 steps. */
TEST(train_two_ranks_match_one_rank_with_accumulation) {
    CHECK_MSG(have_mpirun(), "mpirun not found: install openmpi-bin");
    if (!have_mpirun()) return;
    const char *data = ck_data_splits(1), *one = test_tmpdir(), *two = test_tmpdir();
    char args[4096];
    const char *c1 = ck_config(data, one, 20, 2, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet", c1);
    CHECK(ck_kiln(args) == 0);
    const char *c2 = ck_config(data, two, 20, 1, 32, NULL);
    char cmd[8192], out[16384];
    snprintf(cmd, sizeof cmd,
             /* OpenMPI's dlopened components leak by design and unload before LeakSanitizer reports,
              * so their leaks cannot be suppressed by name: no leak check for the MPI ranks (the
              * one-process runs above and elsewhere check ours) */
             "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np 2 '%s' "
             "train --config '%s' --quiet 2>&1", KILN_BINARY, c2);
    int rc = test_run_shell(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "mpirun -np 2 failed (%d): %s", rc, out);
    double l1[20] = {0}, l2[20] = {0};
    CHECK(ck_losses(one, l1, 20) == 20);
    CHECK(ck_losses(two, l2, 20) == 20);
    double worst = 0;
    for (int i = 0; i < 20; i++) worst = fmax(worst, fabs(l1[i] - l2[i]) / fabs(l1[i]));
    CHECK_MSG(worst <= 1e-5, "1 rank x 2 accumulation vs 2 ranks: worst relative loss difference %.3g", worst);
    printf("    1 rank x accum 2 vs 2 ranks: worst relative loss difference over 20 steps %.2e\n", worst);
}

/* A file-size limit makes the checkpoint write fail: the run stops with a message naming the
 * checkpoint, and the previous checkpoint is intact and resumable. */
TEST(train_full_disk_keeps_previous_checkpoint) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    char args[2048];
    const char *cfg = ck_config(data, out, 4, 1, 32, "\"ckpt_every\": 2");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 2", cfg);
    CHECK(ck_kiln(args) == 0);
    char cmd[4096], text[8192];
    /* a checkpoint shard is ~200 KB: 64 KB of file size fails it */
    snprintf(cmd, sizeof cmd, "ulimit -f 64; '%s' train --config '%s' --quiet --resume 2>&1", KILN_BINARY, cfg);
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc != 0 && strstr(text, "checkpoint at step 4") && strstr(text, "previous checkpoint is intact"),
              "rc %d: %s", rc, text);
    char ck[1300];
    snprintf(ck, sizeof ck, "%s/ckpt/step_00000002/COMMITTED", out);
    CHECK(access(ck, F_OK) == 0);
    snprintf(ck, sizeof ck, "%s/ckpt/step_00000004", out);
    CHECK(access(ck, F_OK) != 0);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", cfg);
    CHECK(ck_kiln(args) == 0); /* and the run finishes from step 2 once there is room */
}

/* Ctrl-C: the run saves at the end of the step and exits 130; --resume finishes it. */
TEST(train_sigint_saves_and_resumes) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    const char *cfg = ck_config(data, out, 100000, 1, 32, "\"ckpt_every\": 0");
    int st = ck_train_until_sigint(cfg, out, 200);
    CHECK_MSG(st == 130, "exit status %d", st);
    char latest[1300];
    double loss[4096];
    int steps = ck_losses(out, loss, 4096);
    snprintf(latest, sizeof latest, "%s/ckpt/step_%08d/COMMITTED", out, steps);
    CHECK_MSG(steps > 0 && access(latest, F_OK) == 0, "no checkpoint at step %d after SIGINT", steps);
}

TEST(train_bad_data) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    char args[2048], text[4096];
    /* a model whose vocabulary is smaller than the shards' */
    const char *cfg = ck_config(data, out, 2, 1, 32, NULL);
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(cfg, &t, &len));
    if (t) {
        char *v = strstr(t, "\"vocab_size\": 64");
        if (v) memcpy(v, "\"vocab_size\": 32", 16);
        CHECK_OK(kiln_write_file_atomic(cfg, t, len));
        free(t);
    }
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "tokenizer does not match"));
    /* a corrupted shard */
    cfg = ck_config(data, out, 2, 1, 32, NULL);
    char shard[1200];
    snprintf(shard, sizeof shard, "%s/train_000000.bin", data);
    FILE *f = fopen(shard, "r+b");
    fseek(f, 1000, SEEK_SET);
    fputc(0x3f, f);
    fclose(f);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "train_000000.bin"));
    /* not a data directory */
    snprintf(args, sizeof args, "train --config '%s' --data /nonexistent --quiet", cfg);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "/nonexistent"));
}

/* kiln ckpt verify/inspect, and a bit flip in the newest checkpoint: detected, and --resume falls
 * back to the previous one. */
TEST(train_ckpt_verify_and_corrupt_newest) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    char args[2048], text[16384];
    const char *cfg = ck_config(data, out, 6, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 3");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 4", cfg);
    CHECK(ck_kiln(args) == 0); /* checkpoints at 2 and 4 */
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "2 checkpoints, 0 invalid"), "%s", text);
    snprintf(args, sizeof args, "ckpt inspect '%s/ckpt/step_00000004'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "step 4, world size 1") &&
                  strstr(text, "rank 0 data position"), "%s", text);
    /* flip one byte of the newest shard */
    char shard[1300];
    snprintf(shard, sizeof shard, "%s/ckpt/step_00000004/rank_00000.safetensors", out);
    FILE *f = fopen(shard, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, -17, SEEK_END);
        int c = fgetc(f);
        fseek(f, -17, SEEK_END);
        fputc(c ^ 0x10, f);
        fclose(f);
    }
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "INVALID") &&
                  strstr(text, "rank_00000.safetensors: checksum") && strstr(text, "2 checkpoints, 1 invalid"),
              "%s", text);
    snprintf(args, sizeof args, "train --config '%s' --resume", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "skipping checkpoint") &&
                  strstr(text, "resumed from step 2"), "%s", text);

    CHECK(test_run_kiln("ckpt frobnicate x", text, sizeof text) == 2);
    snprintf(args, sizeof args, "ckpt verify '%s/nothing-here'", out);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "nothing-here"));
}

/* Steps of metrics.jsonl's records in file order (at most cap); returns their number. */
static int metric_steps(const char *out, int *steps, int cap) {
    char path[1300], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    kiln_error *e = kiln_read_file(path, &text, &len);
    kiln_error_free(e);
    int n = 0;
    for (char *p = text; p && (p = strstr(p, "{\"step\":")) && n < cap; p += 8) steps[n++] = atoi(p + 8);
    free(text);
    return n;
}

/* --resume where ckpt/ holds checkpoints but none is valid fails, naming each and why, and leaves metrics.jsonl as
 * it was (it used to print "starting from step 0", train from scratch and truncate metrics.jsonl). --resume with no
 * checkpoint at all starts from step 0 as before, but keeps the old metrics.jsonl as metrics.jsonl.1. */
TEST(train_resume_without_a_valid_checkpoint) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    char args[2048], text[16384], metrics[1300], aside[1400];
    const char *cfg = ck_config(data, out, 6, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 3, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 4", cfg);
    CHECK(ck_kiln(args) == 0); /* checkpoints 2 and 4 */
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    char *before = NULL;
    size_t blen = 0;
    CHECK_OK(kiln_read_file(metrics, &before, &blen));
    ck_flip_shard(out, 2);
    ck_flip_shard(out, 4);
    snprintf(args, sizeof args, "train --config '%s' --resume", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "no valid checkpoint to resume from") &&
                  strstr(text, "step_00000004: ") && strstr(text, "step_00000002: ") &&
                  strstr(text, "rank_00000.safetensors: checksum") && !strstr(text, "starting from step 0"), "%s", text);
    char *after = NULL;
    size_t alen = 0;
    CHECK_OK(kiln_read_file(metrics, &after, &alen));
    CHECK_MSG(before && after && alen == blen && !memcmp(before, after, blen), "metrics.jsonl changed");
    free(after);
    if (have_mpirun()) { /* on two ranks: rank 0 finds nothing usable, and every rank stops (none waits for it) */
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader timeout 120 mpirun "
                 "--allow-run-as-root --oversubscribe -np 2 '%s' train --config '%s' --quiet --resume 2>&1", KILN_BINARY, cfg);
        const int rc = test_run_shell(cmd, text, sizeof text);
        CHECK_MSG(rc != 0 && rc != 124 && strstr(text, "no valid checkpoint to resume from"), "rc %d: %s", rc, text);
    }

    char ckdir[1300];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", out);
    kiln_rm_tree(ckdir);
    snprintf(args, sizeof args, "train --config '%s' --resume --stop-after 1", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "starting from step 0"), "%s", text);
    snprintf(aside, sizeof aside, "%s.1", metrics);
    after = NULL;
    CHECK_OK(kiln_read_file(aside, &after, &alen));
    CHECK_MSG(before && after && alen == blen && !memcmp(before, after, blen),
              "the previous metrics.jsonl is not kept as metrics.jsonl.1");
    free(after);
    free(before);
    int steps[64];
    CHECK(metric_steps(out, steps, 64) == 1 && steps[0] == 1);
}

/* run.out_dir under directories that do not exist is created with its parents; one that cannot be created says why. */
TEST(train_out_dir_parents_are_created) {
    const char *data = ck_data_splits(0), *base = test_tmpdir();
    char out[1200], args[2048], text[8192];
    snprintf(out, sizeof out, "%s/a/b/c", base);
    const char *cfg = ck_config(data, out, 1, 1, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    int steps[8];
    CHECK(metric_steps(out, steps, 8) == 1);
    char file[1200];
    snprintf(file, sizeof file, "%s/plain", base);
    CHECK_OK(kiln_write_file_atomic(file, "x", 1));
    snprintf(out, sizeof out, "%s/plain/run", base);
    cfg = ck_config(data, out, 1, 1, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "plain/run") && strstr(text, "Not a directory"),
              "%s", text);
}

/* Resuming from step S drops metrics.jsonl's records of steps after S (an abandoned timeline's: they appeared twice
 * once the run passed those steps again) and keeps the others byte for byte. */
TEST(train_resume_drops_the_abandoned_timelines_metrics) {
    const char *data = ck_data_splits(1), *out = test_tmpdir();
    char args[2048], text[16384], p[1300];
    const char *cfg = ck_config(data, out, 20, 1, 32, "\"ckpt_every\": 4, \"keep_last\": 10, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK(ck_kiln(args) == 0);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    char *before = NULL;
    size_t blen = 0;
    CHECK_OK(kiln_read_file(p, &before, &blen));
    char *cut = before ? strstr(before, "{\"step\":13,") : NULL; /* the records of steps 1-12 end here */
    CHECK(cut != NULL);
    for (int s = 16; s <= 20; s += 4) { /* the newer checkpoints are gone: the run resumes from 12 */
        snprintf(p, sizeof p, "%s/ckpt/step_%08d", out, s);
        kiln_rm_tree(p);
    }
    /* a crash in the middle of a record: a step after 12 is dropped like the rest, a line too short to say its step
     * is kept, terminated so that the next record is not glued to it */
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    FILE *f = fopen(p, "ab");
    CHECK(f != NULL);
    if (f) fputs("{\"ste", f), fclose(f);
    snprintf(args, sizeof args, "train --config '%s' --resume --stop-after 2", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "resumed from step 12"), "%s", text);
    int steps[64];
    const int n = metric_steps(out, steps, 64);
    CHECK_MSG(n == 14, "%d records, expected steps 1-14 once each", n);
    for (int i = 0; i < n && i < 14; i++) CHECK_MSG(steps[i] == i + 1, "record %d is of step %d", i + 1, steps[i]);
    char *after = NULL;
    size_t alen = 0;
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    CHECK_OK(kiln_read_file(p, &after, &alen));
    CHECK_MSG(cut && after && alen > (size_t)(cut - before) && !memcmp(before, after, (size_t)(cut - before)),
              "the records of steps 1-12 changed");
    CHECK_MSG(cut && after && alen > (size_t)(cut - before) && !strncmp(after + (cut - before), "{\"ste\n{\"step\":13,", 15),
              "the torn line is not kept and terminated");
    free(after);
    free(before);
    /* replaced atomically: no temporary file left beside it */
    snprintf(args, sizeof args, "ls -a '%s'", out);
    CHECK(test_run_shell(args, text, sizeof text) == 0 && !strstr(text, ".tmp"));
}
