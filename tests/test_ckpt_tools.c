/* kiln ckpt's converters and the flags and config values around them: DIR/config.json's run.out_dir is absolute (the
 * printed resume command works from any directory); --to directories holding a user's files are refused, naming the
 * file, unless --force; out-of-range flag values and config integers are errors naming the flag or field; a reshaped
 * checkpoint without a data fingerprint warns at resume; messages name the field that differs. */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_testutil.h"
#include "kiln/train.h"
#include "kiln/zaya.h"

static void keep(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

static int exists(const char *path) { return access(path, F_OK) == 0; }

static void put(const char *path, const char *text) { CHECK_OK(kiln_write_file_atomic(path, text, strlen(text))); }

/* The file holds exactly text. */
static int holds(const char *path, const char *text) {
    char *t = NULL;
    size_t n = 0;
    kiln_error *e = kiln_read_file(path, &t, &n);
    const int same = !e && n == strlen(text) && !memcmp(t, text, n);
    kiln_error_free(e);
    free(t);
    return same;
}

/* kiln ARGS run in directory cwd; stdout and stderr in out. */
static int kiln_in(const char *cwd, const char *args, char *out, size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", cwd, KILN_BINARY, args);
    return test_run_shell(cmd, out, cap);
}

/* dir/config.json's run.out_dir is dir's absolute path. */
static void check_out_dir_absolute(const char *dir) {
    char cfg[1200], abs[PATH_MAX];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_load(cfg, &c));
    CHECK(realpath(dir, abs) != NULL);
    CHECK_MSG(c.out_dir[0] == '/' && !strcmp(c.out_dir, abs), "%s: run.out_dir is '%s', not '%s'", cfg, c.out_dir, abs);
}

/* A 4-step run with checkpoints at 2 and 4 and its final model/ (the converters' input); its config in cfg. */
static void small_run(char *data, char *run, char *cfg, size_t n) {
    keep(data, n, ck_data());
    keep(run, n, test_tmpdir());
    keep(cfg, n, ck_config(data, run, 4, 1, 32, "\"ckpt_every\": 2"));
    char args[4096];
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK(ck_kiln(args) == 0);
}

/* reshape and import-hf given a relative --to: config.json says where the checkpoint is absolutely, so the printed
 * `kiln train --config DIR/config.json --resume` resumes it from another working directory (it used to train from
 * scratch in DIR relative to there). */
TEST(ckpt_tools_relative_to_gives_absolute_out_dir) {
    char data[1024], run[1024], cfg[1024], here[1024], other[1024], args[4096], text[16384], p[1200];
    small_run(data, run, cfg, sizeof data);
    keep(here, sizeof here, test_tmpdir());
    keep(other, sizeof other, test_tmpdir());
    snprintf(args, sizeof args, "ckpt reshape --from '%s/ckpt/step_00000002' --to rs --world-size 1", run);
    CHECK_MSG(kiln_in(here, args, text, sizeof text) == 0, "%s", text);
    snprintf(p, sizeof p, "%s/rs", here);
    check_out_dir_absolute(p);
    snprintf(args, sizeof args, "train --config '%s/rs/config.json' --resume", here);
    CHECK_MSG(kiln_in(other, args, text, sizeof text) == 0 && strstr(text, "resumed from step 2"), "%s", text);
    snprintf(p, sizeof p, "%s/rs", other);
    CHECK_MSG(!exists(p), "the resume from another directory wrote %s", p);
    double loss[4] = {0};
    snprintf(p, sizeof p, "%s/rs", here);
    CHECK(ck_losses(p, loss, 4) == 4); /* steps 3 and 4, in the reshaped run's own directory */

    snprintf(args, sizeof args, "ckpt import-hf --from '%s/model' --to im --config '%s'", run, cfg);
    CHECK_MSG(kiln_in(here, args, text, sizeof text) == 0, "%s", text);
    snprintf(p, sizeof p, "%s/im", here);
    check_out_dir_absolute(p);
    char abs[PATH_MAX];
    CHECK(realpath(p, abs) && strstr(text, abs)); /* the printed command names it absolutely too */
    snprintf(args, sizeof args, "train --config '%s/im/config.json' --resume --steps 1 --quiet", here);
    CHECK_MSG(kiln_in(other, args, text, sizeof text) == 0, "%s", text);
    snprintf(p, sizeof p, "%s/im/metrics.jsonl", here);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/im", other);
    CHECK(!exists(p));
}

/* A --to that holds what the converter writes, a model or checkpoints is refused before anything is written, naming
 * the file; --force writes there. */
TEST(ckpt_tools_refuse_existing_target) {
    char data[1024], run[1024], cfg[1024], hf[1024], args[4096], text[16384], p[1200];
    small_run(data, run, cfg, sizeof data);
    /* a user's sharded HF directory */
    keep(hf, sizeof hf, test_tmpdir());
    const char *files[][2] = {{"model-00001-of-00002.safetensors", "shard one"},
                              {"model-00002-of-00002.safetensors", "shard two"},
                              {"model.safetensors.index.json", "{\"weight_map\": {}}"},
                              {"config.json", "{\"model_type\": \"zaya\", \"mine\": 1}"},
                              {"tokenizer.json", "{\"mine\": 2}"}};
    for (int i = 0; i < 5; i++) put(test_join(hf, files[i][0]), files[i][1]);
    snprintf(args, sizeof args, "ckpt export-hf --from '%s' --to '%s'", run, hf);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "config.json already exists") &&
                  strstr(text, "--force"), "%s", text);
    for (int i = 0; i < 5; i++) CHECK_MSG(holds(test_join(hf, files[i][0]), files[i][1]), "%s was changed", files[i][0]);
    CHECK(!exists(test_join(hf, "model.safetensors")));
    /* only shards: still a model */
    char shards[1024];
    keep(shards, sizeof shards, test_tmpdir());
    put(test_join(shards, "model-00001-of-00002.safetensors"), "shard one");
    snprintf(args, sizeof args, "ckpt export-hf --from '%s' --to '%s'", run, shards);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "model-00001-of-00002.safetensors"), "%s", text);
    CHECK(!exists(test_join(shards, "model.safetensors")) && !exists(test_join(shards, "config.json")));
    /* --force: one model, loadable; the files export-hf does not write (no tokenizer here) stay */
    snprintf(args, sizeof args, "ckpt export-hf --from '%s' --to '%s' --force", run, hf);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    for (int i = 0; i < 3; i++) CHECK_MSG(!exists(test_join(hf, files[i][0])), "%s is still there", files[i][0]);
    CHECK(holds(test_join(hf, "tokenizer.json"), files[4][1]));
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_load_dir(hf, &m));
    kiln_zaya_free(m);
    snprintf(p, sizeof p, "%s/model/model.safetensors", run);
    CHECK(ck_same_file(p, test_join(hf, "model.safetensors")));

    /* reshape over a user's config.json */
    char to[1024];
    keep(to, sizeof to, test_tmpdir());
    const char *mine = "{\"run\": {\"steps\": 7}}";
    put(test_join(to, "config.json"), mine);
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s' --world-size 1", run, to);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "config.json already exists"), "%s", text);
    CHECK(holds(test_join(to, "config.json"), mine) && !exists(test_join(to, "ckpt")));
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s' --world-size 1 --force", run, to);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    check_out_dir_absolute(to);
    /* a checkpoint of the same step is never replaced, --force or not; config.json is not touched then either */
    char *before = NULL;
    size_t nb = 0;
    CHECK_OK(kiln_read_file(test_join(to, "config.json"), &before, &nb));
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "step_00000004 already exists"), "%s", text);
    if (before) CHECK(holds(test_join(to, "config.json"), before));
    free(before);
    /* another step's checkpoint there: a resume would take the newest, keep_last would delete the other */
    char to2[1024];
    keep(to2, sizeof to2, test_tmpdir());
    snprintf(p, sizeof p, "%s/ckpt", to2);
    CHECK_OK(kiln_mkdir(p));
    snprintf(p, sizeof p, "%s/ckpt/step_00000009", to2);
    CHECK_OK(kiln_mkdir(p));
    snprintf(args, sizeof args, "ckpt reshape --from '%s/ckpt/step_00000002' --to '%s' --world-size 1", run, to2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "step_00000009 already exists"), "%s", text);
    CHECK(!exists(test_join(to2, "config.json")));

    /* import-hf into the HF directory it reads: its config.json would be replaced by the training config */
    snprintf(args, sizeof args, "ckpt import-hf --from '%s' --to '%s'", hf, hf);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "config.json already exists"), "%s", text);
    CHECK(!exists(test_join(hf, "ckpt")));
    /* --to a file */
    put(test_join(to2, "file"), "x");
    snprintf(args, sizeof args, "ckpt import-hf --from '%s' --to '%s/file'", hf, to2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "not a directory"), "%s", text);
    CHECK(holds(test_join(to2, "file"), "x"));
}

/* Flag values out of range are errors naming the flag and the range, before anything runs. */
TEST(ckpt_tools_flag_ranges) {
    char data[1024], run[1024], args[4096], text[16384];
    keep(data, sizeof data, ck_data());
    keep(run, sizeof run, test_tmpdir());
    const char *cfg = ck_config(data, run, 3, 1, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet --steps -5", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "--steps must be 0..9007199254740992, got -5"),
              "%s", text);
    for (int v = 0; v >= -1; v--) {
        snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after %d", cfg, v);
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "--stop-after must be >= 1"), "%s", text);
    }
    CHECK_MSG(!exists(test_join(run, "metrics.jsonl")), "a run trained");
    snprintf(args, sizeof args, "ckpt import-hf --from '%s/none' --to '%s/x' --world-size -1", run, run);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "--world-size must be 1..65536, got -1"), "%s",
              text);
    snprintf(args, sizeof args, "ckpt reshape --from '%s/none' --to '%s/x' --world-size 4294967297", run, run);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "--world-size must be 1..65536"), "%s", text);
    CHECK(!exists(test_join(run, "x")));
}

static void config_err(const char *json, const char *want) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK_ERR(kiln_train_config_parse(json, "t.json", &c), want);
}

/* Integers beyond their field's C type (or natural bound) are errors naming the field, not wrapped values. */
TEST(ckpt_tools_config_int_ranges) {
    config_err("{\"optim\": {\"ns_steps\": 4294967297}}",
               "t.json: optim: field 'optim.ns_steps' = 4294967297 is outside 1..2147483647");
    config_err("{\"run\": {\"threads\": 4294967296}}", "field 'run.threads' = 4294967296 is outside 0..4096");
    config_err("{\"run\": {\"threads\": 5000}}", "field 'run.threads' = 5000 is outside 0..4096");
    config_err("{\"run\": {\"threads\": -1}}", "field 'run.threads' = -1");
    config_err("{\"optim\": {\"ns_steps\": -4294967295}}", "field 'optim.ns_steps' = -4294967295");
    config_err("{\"run\": {\"steps\": -1}}", "field 'run.steps' = -1 is outside 0..9007199254740992");
    config_err("{\"data\": {\"seq_len\": 4294967296, \"micro_batch\": 4194304}}", "more than 2^53");
    /* the largest of each range is accepted, and written back as it was read */
    kiln_train_config c, d;
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse("{\"optim\": {\"ns_steps\": 2147483647}, \"run\": {\"threads\": 4096, \"steps\": "
                                     "9007199254740992}}", "t.json", &c));
    CHECK(c.optim.muon_ns_steps == INT_MAX && c.threads == 4096 && c.steps == ((int64_t)1 << 53));
    char *text = kiln_train_config_to_json(&c);
    kiln_train_config_default(&d);
    CHECK_OK(kiln_train_config_parse(text, "written", &d));
    CHECK(d.optim.muon_ns_steps == INT_MAX && d.threads == 4096 && d.steps == ((int64_t)1 << 53));
    free(text);
    /* a config built in code is held to the same ranges */
    kiln_train_config_default(&c);
    c.threads = 5000;
    CHECK_ERR(kiln_train_config_validate(&c), "field 'run.threads' = 5000 is outside 0..4096");
    kiln_train_config_default(&c);
    c.steps = -1;
    CHECK_ERR(kiln_train_config_validate(&c), "field 'run.steps' = -1");
}

/* A reshape that cannot read the data writes fingerprint 0; the resume says the data cannot be checked (the docs
 * promised a check; there was none and no word of it). A checkpoint with a fingerprint resumes without the warning. */
TEST(ckpt_tools_reshape_without_data_warns_at_resume) {
    char data[1024], away[1100], run[1024], to[1024], args[4096], text[16384], man[1400];
    keep(data, sizeof data, ck_data());
    keep(run, sizeof run, test_tmpdir());
    keep(to, sizeof to, test_tmpdir());
    const char *cfg = ck_config(data, run, 4, 1, 32, "\"ckpt_every\": 2");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 2", cfg);
    CHECK(ck_kiln(args) == 0);
    snprintf(away, sizeof away, "%s.away", data);
    CHECK(rename(data, away) == 0);
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/r' --world-size 1", run, to);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "data not checked"), "%s", text);
    CHECK(rename(away, data) == 0);
    snprintf(man, sizeof man, "%s/r/ckpt/step_00000002/manifest.json", to);
    char *m = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(man, &m, &n));
    CHECK(m && strstr(m, "\"fingerprint\":\t\"0000000000000000\""));
    free(m);
    snprintf(args, sizeof args, "train --config '%s/r/config.json' --quiet --resume", to);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "no data fingerprint") &&
                  strstr(text, "cannot be checked") && strstr(text, "reshape the original checkpoint again"), "%s", text);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && !strstr(text, "fingerprint"), "%s", text);
}

/* kiln ckpt's help names the checksum the checkpoints have; a resume with another data.micro_batch names it. */
TEST(ckpt_tools_messages_name_the_field) {
    char data[1024], run[1024], args[4096], text[16384];
    CHECK(test_run_kiln("ckpt --help", text, sizeof text) == 0 && strstr(text, "CRC-32C"));
    keep(data, sizeof data, ck_data());
    keep(run, sizeof run, test_tmpdir());
    const char *cfg = ck_config(data, run, 4, 1, 32, "\"ckpt_every\": 2");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 2", cfg);
    CHECK(ck_kiln(args) == 0);
    char *t = NULL, *at = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(cfg, &t, &n));
    if (t && (at = strstr(t, "\"micro_batch\": 4"))) {
        at[strlen("\"micro_batch\": ")] = '2';
        put(cfg, t);
    }
    CHECK(at != NULL);
    free(t);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 &&
                  strstr(text, "trained with data.micro_batch = 4, this config has 2"), "%s", text);
    /* optim.muon flipped: named, not blamed on the model's shape */
    CHECK_OK(kiln_read_file(cfg, &t, &n));
    at = t ? strstr(t, "\"micro_batch\": 2") : NULL;
    if (at) at[strlen("\"micro_batch\": ")] = '4';
    char *o = t ? strstr(t, "\"optim\": {") : NULL;
    CHECK(at != NULL && o != NULL);
    if (at && o) {
        char edited[8192];
        snprintf(edited, sizeof edited, "%.*s\"optim\": {\"muon\": false, %s", (int)(o - t), t, o + strlen("\"optim\": {"));
        put(cfg, edited);
    }
    free(t);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "optim.muon differs") &&
                  !strstr(text, "another model shape"), "%s", text);
}
