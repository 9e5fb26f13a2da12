/* Checkpoints: asynchronous saves give the same bytes as synchronous ones and report a failed
 * background write; export-hf and import-hf round-trip exactly; kiln ckpt's usage errors. */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/crc32c.h"
#include "ckpt_testutil.h"
#include "kiln/ckpt.h"
#include "kiln/json.h"
#include "kiln/safetensors.h"
#include "kiln/zaya.h"

static void dir_copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

/* Every checkpoint shard of an async run is byte-identical to the sync run's, and so is the model.
 * run.ckpt_busy "wait": a checkpoint at every step even when a save takes longer than a step. */
TEST(ckpt_async_matches_sync) {
    char data[1024], a[1024], b[1024], args[4096];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(a, sizeof a, test_tmpdir());
    dir_copy(b, sizeof b, test_tmpdir());
    const char *ca = ck_config(data, a, 8, 2, 32, "\"ckpt_every\": 1, \"keep_last\": 100, \"async_ckpt\": true, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet", ca);
    CHECK(ck_kiln(args) == 0);
    const char *cb = ck_config(data, b, 8, 2, 32, "\"ckpt_every\": 1, \"keep_last\": 100, \"async_ckpt\": false");
    snprintf(args, sizeof args, "train --config '%s' --quiet", cb);
    CHECK(ck_kiln(args) == 0);
    int same = 0;
    for (int s = 1; s <= 8; s++) same += ck_same_shard(a, b, s);
    CHECK_MSG(same == 8, "%d of 8 async checkpoint shards are identical to the sync ones", same);
    CHECK_MSG(ck_same_model_file(a, b), "final weights differ between async and sync checkpointing");
    snprintf(args, sizeof args, "ckpt verify '%s'", a);
    char text[16384];
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "8 checkpoints, 0 invalid"), "%s", text);
}

/* A background write that fails (file-size limit) is reported at the next poll or save, the run
 * stops with the step named, and the previous checkpoint stays committed and resumable. */
TEST(ckpt_async_write_error_is_reported) {
    char data[1024], out[1024], args[4096], cmd[8192], text[16384];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(out, sizeof out, test_tmpdir());
    const char *cfg = ck_config(data, out, 6, 1, 32, "\"ckpt_every\": 2, \"async_ckpt\": true");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 2", cfg);
    CHECK(ck_kiln(args) == 0);
    snprintf(cmd, sizeof cmd, "ulimit -f 64; '%s' train --config '%s' --quiet --resume 2>&1", KILN_BINARY, cfg);
    int rc = test_run_shell(cmd, text, sizeof text);
    CHECK_MSG(rc != 0 && strstr(text, "checkpoint at step 4") && strstr(text, "previous checkpoint is intact") &&
                  strstr(text, "rank_00000.safetensors"), "rc %d: %s", rc, text);
    char ck[1300];
    snprintf(ck, sizeof ck, "%s/ckpt/step_00000002/COMMITTED", out);
    CHECK(access(ck, F_OK) == 0);
    snprintf(ck, sizeof ck, "%s/ckpt/step_00000004", out);
    CHECK(access(ck, F_OK) != 0);
    snprintf(ck, sizeof ck, "%s/ckpt/step_00000004.tmp", out);
    CHECK(access(ck, F_OK) != 0);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", cfg);
    CHECK(ck_kiln(args) == 0);
}

/* import-hf of the initial weights then --resume trains exactly like a fresh run; export-hf of the
 * final checkpoint writes the same bytes as the trainer's own HF save. */
TEST(ckpt_export_import_hf_roundtrip) {
    char data[1024], fresh[1024], init[1024], imp[1024], hf[1024], args[4096], text[16384];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(fresh, sizeof fresh, test_tmpdir());
    dir_copy(init, sizeof init, test_tmpdir());
    dir_copy(imp, sizeof imp, test_tmpdir());
    dir_copy(hf, sizeof hf, test_tmpdir());
    const char *cf = ck_config(data, fresh, 6, 1, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet", cf);
    CHECK(ck_kiln(args) == 0);
    const char *ci = ck_config(data, init, 0, 1, 32, NULL); /* 0 steps: saves the initial model */
    snprintf(args, sizeof args, "train --config '%s' --quiet", ci);
    CHECK(ck_kiln(args) == 0);
    snprintf(args, sizeof args, "ckpt import-hf --from '%s/model' --to '%s' --config '%s'", init, imp, cf);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "kiln train --config"), "%s", text);
    snprintf(args, sizeof args, "train --config '%s/config.json' --quiet --resume", imp);
    CHECK(ck_kiln(args) == 0);
    CHECK_MSG(ck_same_model_file(fresh, imp), "training from import-hf of the initial weights differs from a fresh run");
    double l1[6] = {0}, l2[6] = {0};
    CHECK(ck_losses(fresh, l1, 6) == 6 && ck_losses(imp, l2, 6) == 6);
    for (int i = 0; i < 6; i++) CHECK_MSG(l1[i] == l2[i], "step %d: %.9g vs %.9g", i + 1, l1[i], l2[i]);
    /* export-hf of the last checkpoint == the trainer's model/ */
    snprintf(args, sizeof args, "ckpt export-hf --from '%s' --to '%s/hf'", fresh, hf);
    CHECK(ck_kiln(args) == 0);
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", fresh);
    snprintf(pb, sizeof pb, "%s/hf/model.safetensors", hf);
    CHECK_MSG(ck_same_file(pa, pb), "export-hf differs from the trainer's HF save");
    snprintf(pa, sizeof pa, "%s/model/config.json", fresh);
    snprintf(pb, sizeof pb, "%s/hf/config.json", hf);
    CHECK(ck_same_file(pa, pb));
    kiln_zaya *m = NULL;
    snprintf(pb, sizeof pb, "%s/hf", hf);
    CHECK_OK(kiln_zaya_load_dir(pb, &m));
    kiln_zaya_free(m);
    /* never over an existing export */
    snprintf(args, sizeof args, "ckpt export-hf --from '%s' --to '%s/hf'", fresh, hf);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "already exists"));
    /* import for 2 ranks: shards split by the ZeRO-1 partition, verified */
    snprintf(args, sizeof args, "ckpt import-hf --from '%s/hf' --to '%s/two' --world-size 2", hf, hf);
    CHECK(ck_kiln(args) == 0);
    snprintf(args, sizeof args, "ckpt inspect '%s/two'", hf);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "step 0, world size 2") &&
                  strstr(text, "rank_00001.safetensors"), "%s", text);
    snprintf(args, sizeof args, "ckpt import-hf --from '%s/nothing' --to '%s/x'", hf, hf);
    CHECK(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "nothing"));
}

TEST(ckpt_cli_usage) {
    char text[8192];
    CHECK(test_run_kiln("ckpt reshape --from x --to y", text, sizeof text) == 2 && strstr(text, "--world-size"));
    CHECK(test_run_kiln("ckpt reshape --from x --to y --world-size 0", text, sizeof text) == 1);
    CHECK(test_run_kiln("ckpt export-hf --from x", text, sizeof text) == 2);
    CHECK(test_run_kiln("ckpt export-hf --from x --to y --world-size 2", text, sizeof text) == 2);
    CHECK(test_run_kiln("ckpt import-hf --from x --to y --bogus 1", text, sizeof text) == 2 && strstr(text, "--bogus"));
    CHECK(test_run_kiln("ckpt reshape --from /nonexistent-ckpt --to y --world-size 1", text, sizeof text) == 1 &&
          strstr(text, "/nonexistent-ckpt"));
}

/* CRC-32C: the standard check value, the SSE4.2 path against the table on unaligned pieces, and
 * continuation (the CRC of a||b from the CRC of a). */
TEST(ckpt_crc32c) {
    CHECK(kiln_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(kiln_crc32c_sw(0, "123456789", 9) == 0xE3069283u);
    CHECK(kiln_crc32c(0, "", 0) == 0);
    unsigned char buf[4099];
    kiln_rng r;
    kiln_rng_seed(&r, 5);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)kiln_rng_u64(&r);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += 1 + n / 3)
            CHECK_MSG(kiln_crc32c(0, buf + off, n) == kiln_crc32c_sw(0, buf + off, n), "offset %zu length %zu", off, n);
    CHECK(kiln_crc32c(kiln_crc32c(0, buf, 1000), buf + 1000, 3099) == kiln_crc32c(0, buf, sizeof buf));
    for (size_t cut = 0; cut <= sizeof buf; cut += 1 + cut / 2)
        CHECK_MSG(kiln_crc32c_combine(kiln_crc32c(0, buf, cut), kiln_crc32c(0, buf + cut, sizeof buf - cut),
                                      sizeof buf - cut) == kiln_crc32c(0, buf, sizeof buf), "cut at %zu", cut);
    uint32_t before = kiln_crc32c(0, buf, sizeof buf);
    buf[77] ^= 4; /* one flipped bit changes it */
    CHECK(kiln_crc32c(0, buf, sizeof buf) != before);
}

/* A shard's name, spelled and read back: every rank round-trips, near misses are not shards. */
TEST(ckpt_shard_names) {
    char buf[64];
    CHECK(!strcmp(kiln_ckpt_shard_path(buf, sizeof buf, NULL, 7), "rank_00007.safetensors"));
    CHECK(!strcmp(kiln_ckpt_shard_path(buf, sizeof buf, "a/step_3", 12), "a/step_3/rank_00012.safetensors"));
    for (int r = 0; r < KILN_CKPT_MAX_WORLD; r += 1 + r / 7)
        CHECK_MSG(kiln_ckpt_shard_rank(kiln_ckpt_shard_path(buf, sizeof buf, NULL, r)) == r, "rank %d", r);
    CHECK(kiln_ckpt_shard_rank(kiln_ckpt_shard_path(buf, sizeof buf, NULL, KILN_CKPT_MAX_WORLD - 1)) ==
          KILN_CKPT_MAX_WORLD - 1);
    static const char *const bad[] = {"", "rank_0001.safetensors", "rank_000012.safetensors", "rank_0000a.safetensors",
                                      "rank_00001.safetensor", "rank_00001.json", "Rank_00001.safetensors",
                                      "rank_00001.safetensorsx", "rank_-0001.safetensors"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(kiln_ckpt_shard_rank(bad[i]) == -1, "'%s'", bad[i]);
    CHECK(!strcmp(kiln_ckpt_shard_path(buf, 8, NULL, 3), "rank_00")); /* truncated to fit, terminated */
}

/* Manifests carry crc32c; one that carries fnv1a64 (checkpoints from before) still verifies, and a
 * wrong one of either kind is caught. */
TEST(ckpt_manifest_checksums_old_and_new) {
    char data[1024], out[1024], args[4096], text[16384];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(out, sizeof out, test_tmpdir());
    const char *cfg = ck_config(data, out, 2, 1, 32, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet", cfg);
    CHECK(ck_kiln(args) == 0);
    char man[1300], shard[1300], *t = NULL;
    size_t n = 0;
    snprintf(man, sizeof man, "%s/ckpt/step_00000002/manifest.json", out);
    snprintf(shard, sizeof shard, "%s/ckpt/step_00000002/rank_00000.safetensors", out);
    CHECK_OK(kiln_read_file(man, &t, &n));
    char *p = t ? strstr(t, "\"crc32c\":\t\"") : NULL;
    CHECK(p != NULL);
    uint32_t crc = 0;
    uint64_t size = 0, fnv = 0, fsize = 0;
    CHECK_OK(kiln_crc32c_file(shard, &crc, &size));
    CHECK_OK(kiln_fnv1a64_file(shard, &fnv, &fsize));
    char want[64];
    snprintf(want, sizeof want, "\"crc32c\":\t\"%08x\"", (unsigned)crc);
    CHECK_MSG(p && !strncmp(p, want, strlen(want)), "manifest lacks %s", want);
    if (p) {
        /* the same manifest as an older kiln wrote it */
        size_t cap = n + 64;
        char *old = malloc(cap);
        snprintf(old, cap, "%.*s\"fnv1a64\":\t\"%016llx\"%s", (int)(p - t), t, (unsigned long long)fnv,
                 p + strlen(want));
        CHECK_OK(kiln_write_file_atomic(man, old, strlen(old)));
        snprintf(args, sizeof args, "ckpt verify '%s'", out);
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
        snprintf(args, sizeof args, "ckpt inspect '%s'", out);
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "fnv1a64"), "%s", text);
        snprintf(old, cap, "%.*s\"fnv1a64\":\t\"%016llx\"%s", (int)(p - t), t, (unsigned long long)(fnv ^ 1),
                 p + strlen(want));
        CHECK_OK(kiln_write_file_atomic(man, old, strlen(old)));
        snprintf(args, sizeof args, "ckpt verify '%s'", out);
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "checksum"), "%s", text);
        snprintf(old, cap, "%.*s\"crc32c\":\t\"%08x\"%s", (int)(p - t), t, (unsigned)(crc ^ 1), p + strlen(want));
        CHECK_OK(kiln_write_file_atomic(man, old, strlen(old)));
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "checksum"), "%s", text);
        free(old);
    }
    free(t);
}

/* Ctrl-C while background saves come every step: the run waits for the save in flight, saves the
 * step it stopped at, and leaves only committed, valid checkpoints (no .tmp directory). */
TEST(ckpt_async_sigint_waits_for_the_save) {
    char data[1024], out[1024], args[4096], text[16384];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(out, sizeof out, test_tmpdir());
    const char *cfg = ck_config(data, out, 100000, 1, 32, "\"ckpt_every\": 1, \"keep_last\": 3, \"async_ckpt\": true");
    int st = ck_train_until_sigint(cfg, out, 1500);
    CHECK_MSG(st == 130, "exit status %d", st);
    double loss[4096];
    int steps = ck_losses(out, loss, 4096);
    char p[1300];
    snprintf(p, sizeof p, "%s/ckpt/step_%08d/COMMITTED", out, steps);
    CHECK_MSG(steps > 1 && access(p, F_OK) == 0, "no checkpoint at the last step %d", steps);
    snprintf(p, sizeof p, "%s/ckpt/step_%08d.tmp", out, steps);
    CHECK(access(p, F_OK) != 0);
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, " 0 invalid"), "%s", text);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume --stop-after 1", cfg);
    CHECK(ck_kiln(args) == 0);
}

/* ---- kiln_st_write_stream: the data section from a source, piece by piece (the GPU checkpoint's path) ---- */

typedef struct {
    const unsigned char *data;
    size_t len, at, step, stop_at; /* stop_at: end early there; step: piece size (grows by 3 each call) */
    int overshoot, fail;
} piece_src;

static kiln_error *piece_next(void *ctx, const void **data, size_t *len) {
    piece_src *s = ctx;
    if (s->fail && s->at > 0) return kiln_errorf(KILN_EIO, "source failed at byte %zu", s->at);
    const size_t end = s->stop_at < s->len ? s->stop_at : s->len;
    size_t n = end - s->at < s->step ? end - s->at : s->step;
    if (s->overshoot && s->at + n == s->len) n += 4;
    *data = s->data + s->at, *len = n;
    s->at += n;
    s->step += 3;
    return NULL;
}

TEST(ckpt_st_write_stream_same_bytes) {
    float a[37];
    double b[5];
    uint16_t c[11];
    for (int i = 0; i < 37; i++) a[i] = (float)i * 0.25f - 3;
    for (int i = 0; i < 5; i++) b[i] = 1.0 / (i + 1);
    for (int i = 0; i < 11; i++) c[i] = (uint16_t)(0x3f80 + i);
    const int64_t sa[2] = {37, 1}, sb[1] = {5}, sc[2] = {11, 1}, s0[1] = {0};
    const kiln_st_entry ent[4] = {{"a", KILN_DT_F32, 2, sa, a}, {"empty", KILN_DT_F32, 1, s0, NULL},
                                  {"b", KILN_DT_F64, 1, sb, b}, {"c", KILN_DT_BF16, 2, sc, c}};
    unsigned char all[37 * 4 + 5 * 8 + 11 * 2];
    memcpy(all, a, sizeof a), memcpy(all + sizeof a, b, sizeof b), memcpy(all + sizeof a + sizeof b, c, sizeof c);
    char dir[1024], ref[1200], got[1200];
    dir_copy(dir, sizeof dir, test_tmpdir());
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    snprintf(got, sizeof got, "%s/got.safetensors", dir);
    CHECK_OK(kiln_st_write(ref, ent, 4, NULL));
    kiln_st_entry nodata[4];
    memcpy(nodata, ent, sizeof ent);
    for (int i = 0; i < 4; i++) nodata[i].data = NULL; /* the stream's entries carry no data */
    for (size_t step = 1; step <= sizeof all; step += 13) {
        piece_src s = {all, sizeof all, 0, step, (size_t)-1, 0, 0};
        CHECK_OK(kiln_st_write_stream(got, nodata, 4, NULL, piece_next, &s));
        CHECK_MSG(ck_same_file(ref, got), "pieces from %zu bytes: the file differs from kiln_st_write's", step);
    }
    /* errors: short, long, failing source; the destination keeps its old contents */
    static const char *const want[3] = {"ended at byte 100", "past the end", "source failed"};
    for (int k = 0; k < 3; k++) {
        piece_src s = {all, sizeof all, 0, 10, k == 0 ? 100 : (size_t)-1, k == 1, k == 2};
        kiln_error *e = kiln_st_write_stream(got, nodata, 4, NULL, piece_next, &s);
        CHECK_MSG(e && strstr(kiln_error_msg(e), want[k]) && (k == 2 || strstr(kiln_error_msg(e), got)), "case %d: %s", k,
                  e ? kiln_error_msg(e) : "no error");
        kiln_error_free(e);
        CHECK_MSG(ck_same_file(ref, got), "case %d: a failed write changed the file", k);
    }
    CHECK_ERR(kiln_st_write_stream(got, nodata, 4, NULL, NULL, NULL), "no data source");
    CHECK_ERR(kiln_st_write(got, nodata, 4, NULL), "data is NULL"); /* without a source the data is required */
}

/* ---- which checkpoints pruning keeps, and what a manifest may claim ---- */

static int ck_has_step(const char *out, int step) {
    char p[1300];
    snprintf(p, sizeof p, "%s/ckpt/step_%08d", out, step);
    return access(p, F_OK) == 0;
}

/* keep_last counts valid checkpoints no newer than the one just committed, which is never deleted. The reviewer's
 * repro: checkpoints 4, 8, 12, the shard of 12 corrupted, then keep_last 1 and --resume --stop-after 2: it resumed
 * from 8, saved 10, and deleted 4, 8 and 10 (the corrupt 12 counted as the newest), leaving nothing resumable. */
TEST(ckpt_prune_keeps_the_runs_own_valid_checkpoints) {
    char data[1024], out[1024], args[4096], text[16384];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(out, sizeof out, test_tmpdir());
    const char *c1 = ck_config(data, out, 30, 1, 32, "\"ckpt_every\": 4, \"keep_last\": 3, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 12", c1);
    CHECK(ck_kiln(args) == 0);
    CHECK(ck_has_step(out, 4) && ck_has_step(out, 8) && ck_has_step(out, 12));
    ck_flip_shard(out, 12);
    const char *c2 = ck_config(data, out, 30, 1, 32, "\"ckpt_every\": 4, \"keep_last\": 1, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --resume --stop-after 2", c2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "skipping checkpoint") &&
                  strstr(text, "resumed from step 8"), "%s", text);
    CHECK_MSG(ck_has_step(out, 10), "the checkpoint just committed (step 10) was deleted");
    CHECK_MSG(!ck_has_step(out, 8) && !ck_has_step(out, 4), "keep_last 1 kept older checkpoints than step 10");
    CHECK_MSG(ck_has_step(out, 12), "the newer (corrupt) step 12 is not this run's to delete");
    snprintf(args, sizeof args, "ckpt verify '%s/ckpt/step_00000010'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    snprintf(args, sizeof args, "train --config '%s' --resume --stop-after 1", c2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "resumed from step 10"), "%s", text);
    CHECK(ck_has_step(out, 11) && !ck_has_step(out, 10) && ck_has_step(out, 12));

    /* a fresh run into an out_dir that holds another run's (valid) checkpoints 4, 8, 12, keep_last 2: its own saves
     * 4 and 5 stay (8 and 12 used to count as the two newest and push them out) */
    char out2[1024];
    dir_copy(out2, sizeof out2, test_tmpdir());
    const char *c3 = ck_config(data, out2, 30, 1, 32, "\"ckpt_every\": 4, \"keep_last\": 3, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 12", c3);
    CHECK(ck_kiln(args) == 0);
    const char *c4 = ck_config(data, out2, 30, 1, 32, "\"ckpt_every\": 1, \"keep_last\": 2, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --stop-after 5", c4);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "newer than step 0"), "%s", text);
    CHECK_MSG(ck_has_step(out2, 4) && ck_has_step(out2, 5), "the fresh run's own saves 4 and 5 were deleted");
    CHECK(!ck_has_step(out2, 3) && !ck_has_step(out2, 2) && !ck_has_step(out2, 1));
    CHECK(ck_has_step(out2, 8) && ck_has_step(out2, 12));
    snprintf(args, sizeof args, "ckpt verify '%s'", out2);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "4 checkpoints, 0 invalid"), "%s", text);
}

/* Replaces a field of a manifest (loader >= 0: of loaders[loader]) with val (taken over). */
static void ck_edit_manifest(const char *path, int loader, const char *field, cJSON *val) {
    cJSON *man = NULL;
    CHECK_OK(kiln_json_parse_file(path, &man));
    cJSON *obj = loader < 0 ? man : cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(man, "loaders"), loader);
    CHECK_MSG(obj && cJSON_ReplaceItemInObjectCaseSensitive(obj, field, val), "%s: no field '%s'", path, field);
    char *text = kiln_json_print(man, 1);
    CHECK_OK(kiln_write_file_atomic(path, text, strlen(text)));
    free(text);
    cJSON_Delete(man);
}

/* manifest.json is not checksummed, so its fields are checked against what they must be: a step other than the
 * directory's (the reviewer set 100 in step_12: verify passed and --resume "resumed from step 100" and trained
 * nothing), a negative epoch, a seed that is not a hex number, a cursor that is not whole micro-batches. */
TEST(ckpt_manifest_fields_are_cross_checked) {
    char data[1024], out[1024], args[4096], text[16384], man[1300];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(out, sizeof out, test_tmpdir());
    const char *cfg = ck_config(data, out, 30, 1, 32, "\"ckpt_every\": 4, \"keep_last\": 3, \"ckpt_busy\": \"wait\"");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 12", cfg);
    CHECK(ck_kiln(args) == 0);
    snprintf(man, sizeof man, "%s/ckpt/step_00000012/manifest.json", out);
    char *orig = NULL;
    size_t olen = 0;
    CHECK_OK(kiln_read_file(man, &orig, &olen));
    if (!orig) return;
    int64_t cursor = -1;
    cJSON *m = NULL;
    CHECK_OK(kiln_json_parse_file(man, &m));
    CHECK(kiln_json_int_value(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m,
                                  "loaders"), 0), "cursor"), &cursor) && cursor > 0 && cursor % 4 == 0);
    cJSON_Delete(m);

    ck_edit_manifest(man, -1, "step", cJSON_CreateNumber(100));
    snprintf(args, sizeof args, "ckpt verify '%s'", out);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, "step 100") && strstr(text, "step_00000012") &&
                  strstr(text, "3 checkpoints, 1 invalid"), "%s", text);
    snprintf(args, sizeof args, "train --config '%s' --resume --stop-after 1", cfg);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "resumed from step 8") &&
                  !strstr(text, "resumed from step 100"), "%s", text);

    static const struct {
        const char *field, *want;
    } bad[] = {{"epoch", "loaders[0]: epoch -1 is negative"},
               {"seed", "loaders[0]: seed 'zz' is not a hexadecimal number"},
               {"fingerprint", "loaders[0]: fingerprint '' is not a hexadecimal number"},
               {"cursor", "loaders[0]: cursor"}};
    snprintf(args, sizeof args, "ckpt verify '%s/ckpt/step_00000012'", out);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_OK(kiln_write_file_atomic(man, orig, olen));
        cJSON *v = !strcmp(bad[i].field, "epoch")    ? cJSON_CreateNumber(-1)
                   : !strcmp(bad[i].field, "seed")   ? cJSON_CreateString("zz")
                   : !strcmp(bad[i].field, "cursor") ? cJSON_CreateNumber((double)(cursor + 1))
                                                     : cJSON_CreateString("");
        ck_edit_manifest(man, 0, bad[i].field, v);
        CHECK_MSG(test_run_kiln(args, text, sizeof text) == 1 && strstr(text, bad[i].want) && strstr(text, man), "%s: %s",
                  bad[i].field, text);
    }
    CHECK(strstr(text, "not a whole number of micro-batches of 4 windows"));
    /* the manifest as written verifies */
    CHECK_OK(kiln_write_file_atomic(man, orig, olen));
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0, "%s", text);
    free(orig);
}
