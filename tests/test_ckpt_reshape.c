/* kiln ckpt reshape: 2 ranks -> 1 and 1 -> 2 mid-run, then --resume, against the run that was never
 * reshaped (losses within 1e-5 relative; the final weights are compared too); bad input gives
 * clear errors and never touches the source. */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_testutil.h"
#include "kiln/zaya.h"

static void dir_copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

/* Worst relative loss difference over steps from..to (1-based). */
static double worst_rel(const double *a, const double *b, int from, int to) {
    double w = 0;
    for (int i = from - 1; i < to; i++) w = fmax(w, fabs(a[i] - b[i]) / fmax(fabs(a[i]), 1e-30));
    return w;
}

/* ranks_a x accum_a for 6 steps, reshape to ranks_b, resume to 12; reference: ranks_a x accum_a for 12. */
static void reshape_run(int ranks_a, int accum_a, int ranks_b) {
    char data[1024], ref[1024], run[1024], to[1024], args[4096];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(ref, sizeof ref, test_tmpdir());
    dir_copy(run, sizeof run, test_tmpdir());
    dir_copy(to, sizeof to, test_tmpdir());
    const char *cr = ck_config(data, ref, 12, accum_a, 32, "\"ckpt_every\": 6");
    snprintf(args, sizeof args, "train --config '%s' --quiet", cr);
    CHECK(ranks_a > 1 ? ck_mpi(ranks_a, args) == 0 : ck_kiln(args) == 0);
    const char *cb = ck_config(data, run, 12, accum_a, 32, "\"ckpt_every\": 6");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 6", cb);
    CHECK(ranks_a > 1 ? ck_mpi(ranks_a, args) == 0 : ck_kiln(args) == 0);
    char text[16384];
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/r' --world-size %d", run, to, ranks_b);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "--resume"), "%s", text);
    snprintf(args, sizeof args, "ckpt inspect '%s/r'", to);
    char want[64];
    snprintf(want, sizeof want, "step 6, world size %d", ranks_b);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, want), "%s", text);
    snprintf(args, sizeof args, "train --config '%s/r/config.json' --quiet --resume", to);
    CHECK(ranks_b > 1 ? ck_mpi(ranks_b, args) == 0 : ck_kiln(args) == 0);
    double lr[12] = {0}, lb[12] = {0};
    char out[1200];
    snprintf(out, sizeof out, "%s/r", to);
    CHECK(ck_losses(ref, lr, 12) == 12);
    CHECK(ck_losses(out, lb, 12) == 12);
    double w = worst_rel(lr, lb, 7, 12);
    CHECK_MSG(w <= 1e-5, "%d -> %d ranks: worst relative loss difference %.3g over steps 7-12", ranks_a, ranks_b, w);
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", ref);
    snprintf(pb, sizeof pb, "%s/r/model/model.safetensors", to);
    /* summation order differs between N ranks and N*A accumulation: weights agree to rounding */
    snprintf(pa, sizeof pa, "%s/model", ref);
    snprintf(pb, sizeof pb, "%s/r/model", to);
    kiln_zaya *ma = NULL, *mb = NULL;
    CHECK_OK(kiln_zaya_load_dir(pa, &ma));
    CHECK_OK(kiln_zaya_load_dir(pb, &mb));
    double dw = 0, scale = 0;
    size_t same = 0;
    if (ma && mb && ma->numel == mb->numel)
        for (size_t i = 0; i < ma->numel; i++) {
            dw = fmax(dw, fabs((double)ma->w[i] - mb->w[i]));
            scale = fmax(scale, fabs((double)ma->w[i]));
            same += ma->w[i] == mb->w[i];
        }
    CHECK_MSG(ma && mb && dw <= 1e-4 * scale, "final weights: max |difference| %.3g (max |w| %.3g)", dw, scale);
    printf("    %d rank(s) x accum %d -> %d rank(s): worst relative loss difference %.2e; final weights: %zu of %zu "
           "bit-identical, max |difference| %.2e (max |w| %.2f)\n", ranks_a, accum_a, ranks_b, w, same,
           ma ? ma->numel : 0, dw, scale);
    kiln_zaya_free(ma);
    kiln_zaya_free(mb);
}

TEST(ckpt_reshape_2_to_1_then_resume) {
    CHECK_MSG(ck_have_mpirun(), "mpirun not found: install openmpi-bin");
    if (ck_have_mpirun()) reshape_run(2, 1, 1);
}

TEST(ckpt_reshape_1_to_2_then_resume) {
    CHECK_MSG(ck_have_mpirun(), "mpirun not found: install openmpi-bin");
    if (ck_have_mpirun()) reshape_run(1, 2, 2);
}

static int contains(const char *args, const char *needle, char *text, size_t cap) {
    int rc = test_run_kiln(args, text, cap);
    if (rc != 1 || !strstr(text, needle)) {
        printf("    kiln %s -> %d, wanted 1 and \"%s\":\n%s\n", args, rc, needle, text);
        return 0;
    }
    return 1;
}

/* Replace the first `from` in a file with `to` (same length or not). */
static void patch_file(const char *path, const char *from, const char *to) {
    char *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &t, &n));
    char *p = t ? strstr(t, from) : NULL;
    CHECK_MSG(p != NULL, "%s: no '%s'", path, from);
    if (p) {
        size_t lf = strlen(from), lt = strlen(to);
        char *u = malloc(n - lf + lt + 1);
        memcpy(u, t, (size_t)(p - t));
        memcpy(u + (p - t), to, lt);
        memcpy(u + (p - t) + lt, p + lf, n - (size_t)(p - t) - lf);
        CHECK_OK(kiln_write_file_atomic(path, u, n - lf + lt));
        free(u);
    }
    free(t);
}

/* Change the hex digit after the first `marker` in a file (another value, the same number of digits). */
static void flip_digit_after(const char *path, const char *marker) {
    char *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &t, &n));
    char *p = t ? strstr(t, marker) : NULL;
    CHECK_MSG(p != NULL, "%s: no '%s'", path, marker);
    if (p) {
        p += strlen(marker);
        *p = *p == '0' ? '1' : '0';
        CHECK_OK(kiln_write_file_atomic(path, t, n));
    }
    free(t);
}

static void copy_tree(const char *from, const char *to) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", from, to);
    CHECK(system(cmd) == 0);
}

/* Reshapes a copy of checkpoint src (at to/name) whose manifest has its first `from` replaced by
 * `into` to to/c for `world` ranks: whether that fails naming `want` (text gets the output). */
static int reshape_patched(const char *src, const char *to, const char *name, const char *from, const char *into,
                           int world, const char *want, char *text, size_t cap) {
    char bad[1300], man[1400], args[4096];
    snprintf(bad, sizeof bad, "%s/%s", to, name);
    copy_tree(src, bad);
    snprintf(man, sizeof man, "%s/manifest.json", bad);
    patch_file(man, from, into);
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/c' --world-size %d", bad, to, world);
    return contains(args, want, text, cap);
}

TEST(ckpt_reshape_bad_input) {
    char data[1024], run[1024], to[1024], args[4096], text[16384], src[1300], bad[1300];
    dir_copy(data, sizeof data, ck_data());
    dir_copy(run, sizeof run, test_tmpdir());
    dir_copy(to, sizeof to, test_tmpdir());
    const char *cfg = ck_config(data, run, 4, 3, 32, "\"ckpt_every\": 2");
    snprintf(args, sizeof args, "train --config '%s' --quiet --stop-after 2", cfg);
    CHECK(ck_kiln(args) == 0);
    snprintf(src, sizeof src, "%s/ckpt/step_00000002", run);
    /* 1 rank x 3 micro-batches cannot be dealt to 2 ranks */
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/a' --world-size 2", run, to);
    CHECK(contains(args, "divides 3", text, sizeof text) && strstr(text, "grad_accum"));
    /* 3 ranks: fine (accum 1 each) */
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/b' --world-size 3", run, to);
    CHECK(ck_kiln(args) == 0);
    /* never over an existing conversion: its config.json is named; with --force, still never over its checkpoint */
    CHECK(contains(args, "b/config.json already exists", text, sizeof text));
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/b' --world-size 3 --force", run, to);
    CHECK(contains(args, "b/ckpt/step_00000002 already exists", text, sizeof text));
    /* a manifest that does not match its shards: the recorded size and checksum */
    CHECK(reshape_patched(src, to, "m1", "\"bytes\":\t", "\"bytes\":\t1", 1, "rank_00000.safetensors", text,
                          sizeof text) && strstr(text, "manifest says"));
    /* ... or its tensor list (another optimizer-state size than the shard holds) */
    CHECK(reshape_patched(src, to, "m2", "\"state_numel\":\t", "\"state_numel\":\t7", 1, "optimizer-state floats",
                          text, sizeof text));
    /* ... or a world size its shards do not have: rank 1 has no shard checksum and no loader position, so nothing
     * would check it (which of the two is named first is the manifest reader's order) */
    CHECK(reshape_patched(src, to, "m3", "\"world_size\":\t1", "\"world_size\":\t2", 1, "(world size 2)", text,
                          sizeof text));
    /* positions saved for other data than the config's data directory holds: another fingerprint of 16 digits */
    char m5[1300], man5[1400];
    snprintf(m5, sizeof m5, "%s/m5", to);
    copy_tree(src, m5);
    snprintf(man5, sizeof man5, "%s/manifest.json", m5);
    flip_digit_after(man5, "\"fingerprint\":\t\"");
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/c' --world-size 3", m5, to);
    CHECK(contains(args, "not the data this checkpoint was trained on", text, sizeof text));
    /* a missing shard */
    snprintf(bad, sizeof bad, "%s/m4", to);
    copy_tree(src, bad);
    char shard[1400];
    snprintf(shard, sizeof shard, "%s/rank_00000.safetensors", bad);
    CHECK(unlink(shard) == 0);
    snprintf(args, sizeof args, "ckpt reshape --from '%s' --to '%s/c' --world-size 1", bad, to);
    CHECK(contains(args, "rank_00000.safetensors", text, sizeof text));
    /* a checkpoint of another model shape: resuming a wider model from it */
    const char *wide = ck_config(data, run, 4, 3, 48, NULL);
    snprintf(args, sizeof args, "train --config '%s' --quiet --resume", wide);
    CHECK(contains(args, "another model shape", text, sizeof text));
    /* the reshaped checkpoint for 3 ranks refuses a 1-rank resume, naming reshape */
    snprintf(args, sizeof args, "train --config '%s/b/config.json' --quiet --resume", to);
    CHECK(contains(args, "kiln ckpt reshape", text, sizeof text));
    /* the source was never touched */
    snprintf(args, sizeof args, "ckpt verify '%s'", run);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "1 checkpoints, 0 invalid"), "%s", text);
}
