/* The kiln binary on good and bad input: every bad input is a clear message and a non-zero
 * exit, never a crash. Models are made on the fly with kiln_zaya_save_dir. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/safetensors.h"
#include "kiln/zaya.h"
#include "test.h"
#include "zaya_testutil.h"

/* A saved tiny model in a fresh temp dir; returns the dir. */
static const char *make_model(void) {
    const char *dir = test_tmpdir();
    kiln_zaya_config c;
    tiny_config(&c, 1);
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    if (!m) return dir;
    perturb_params(m, 5, 0.0f);
    CHECK_OK(kiln_zaya_save_dir(m, dir));
    kiln_zaya_free(m);
    return dir;
}

static void write_ids(const char *path, kiln_dtype dt, const int64_t *ids, int64_t B, int64_t T) {
    int64_t shape[2] = {B, T};
    int32_t i32[64];
    for (int64_t i = 0; i < B * T && i < 64; i++) i32[i] = (int32_t)ids[i];
    kiln_st_entry e = {"input_ids", dt, 2, shape, dt == KILN_DT_I32 ? (const void *)i32 : (const void *)ids};
    CHECK_OK(kiln_st_write(path, &e, 1, NULL));
}

/* Run kiln; expect failure whose output contains `needle`. */
static void expect_fail(const char *args, const char *needle) {
    char out[8192];
    int rc = test_run_kiln(args, out, sizeof out);
    CHECK_MSG(rc == 1 || rc == 2, "kiln %s exited %d (want 1 or 2): %s", args, rc, out);
    CHECK_MSG(strstr(out, needle) != NULL, "kiln %s: output lacks '%s': %s", args, needle, out);
}

static void logits_args(char *buf, size_t n, const char *model, const char *in) {
    snprintf(buf, n, "logits --model '%s' --input '%s' --out '%s/out.safetensors'", model, in, test_tmpdir());
}

TEST(cli_help_and_unknown) {
    char out[8192];
    CHECK(test_run_kiln("help", out, sizeof out) == 0 && strstr(out, "logits") && strstr(out, "generate"));
    CHECK(test_run_kiln("logits --help", out, sizeof out) == 0 && strstr(out, "--grads"));
    CHECK(test_run_kiln("generate --help", out, sizeof out) == 0 && strstr(out, "--top-p"));
    expect_fail("frobnicate", "unknown command 'frobnicate'");
    expect_fail("logits --model x --bogus", "unknown option '--bogus'");
    expect_fail("logits --model", "--model needs a value");
}

TEST(cli_logits_and_generate_run) {
    const char *model = make_model();
    char in[600], args[2048], out[8192];
    snprintf(in, sizeof in, "%s/in.safetensors", test_tmpdir());
    int64_t ids[6] = {1, 2, 3, 4, 5, 6};
    write_ids(in, KILN_DT_I32, ids, 2, 3);
    logits_args(args, sizeof args, model, in);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids '3, 1,4' --max-new 5 --temperature 0.8 --top-k 10 --top-p 0.9 --seed 7", model);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 0, "%s", out);
    int commas = 0;
    for (char *p = out; *p; p++) commas += *p == ',';
    CHECK_MSG(commas == 7 && !strncmp(out, "3,1,4,", 6), "generate printed: %s", out);
    char out2[8192];
    CHECK(test_run_kiln(args, out2, sizeof out2) == 0 && !strcmp(out, out2)); /* same seed, same text */
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids '3,x'", model);
    expect_fail(args, "expected an integer at character 3");
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids '3,40'", model);
    expect_fail(args, "token id 40 at [0, 1]");
    /* sampling values HF refuses (they used to act as greedy or "off") */
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids 3 --temperature -1", model);
    expect_fail(args, "--temperature -1: expected 0 (greedy) or a positive number");
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids 3 --top-p 0", model);
    expect_fail(args, "--top-p 0: expected a probability mass in (0, 1]");
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids 3 --top-p 1.5", model);
    expect_fail(args, "--top-p 1.5");
    snprintf(args, sizeof args, "generate --model '%s' --prompt-ids 3 --prompt hi", model);
    expect_fail(args, "give --prompt or --prompt-ids, not both");
    /* a tokenizer whose ids run past the model's vocabulary: named as --prompt's, not --prompt-ids' */
    snprintf(args, sizeof args, "generate --model '%s' --prompt 'hello world' --tokenizer '%s'", model,
             test_src_path("tests/fixtures/tokenizer/gpt2.json"));
    expect_fail(args, "--prompt (the tokenizer's ids): token id");
}

TEST(cli_bad_token_ids) {
    const char *model = make_model();
    char in[600], args[2048];
    snprintf(in, sizeof in, "%s/in.safetensors", test_tmpdir());
    int64_t ids[4] = {1, 2, 40, 3};
    write_ids(in, KILN_DT_I64, ids, 2, 2);
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "token id 40 at [1, 0] is outside the vocabulary 0..39");
    ids[2] = -1;
    write_ids(in, KILN_DT_I64, ids, 2, 2);
    expect_fail(args, "token id -1 at [1, 0]");
    /* input without input_ids / of the wrong dtype */
    float f[2] = {1, 2};
    int64_t shape[2] = {1, 2};
    kiln_st_entry e = {"tokens", KILN_DT_F32, 2, shape, f};
    CHECK_OK(kiln_st_write(in, &e, 1, NULL));
    expect_fail(args, "no tensor 'input_ids'");
    e.name = "input_ids";
    CHECK_OK(kiln_st_write(in, &e, 1, NULL));
    expect_fail(args, "dtype F32, expected I64 or I32");
}

/* Rewrite model.safetensors in `dir` leaving out tensor `drop` and/or adding an extra tensor. */
static void rewrite_weights(const char *dir, const char *drop, const char *extra) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    size_t n = kiln_st_count(st), k = 0;
    kiln_st_entry *ent = calloc(n + 1, sizeof *ent);
    void **copies = calloc(n + 1, sizeof *copies);
    for (size_t i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        if (drop && !strcmp(t->name, drop)) continue;
        copies[k] = malloc(t->nbytes ? t->nbytes : 1);
        memcpy(copies[k], t->data, t->nbytes);
        ent[k] = (kiln_st_entry){t->name, t->dtype, t->ndim, t->shape, copies[k]};
        k++;
    }
    float one = 1;
    int64_t sh1[1] = {1};
    if (extra) ent[k++] = (kiln_st_entry){extra, KILN_DT_F32, 1, sh1, &one};
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s/new.safetensors", dir);
    CHECK_OK(kiln_st_write(tmp, ent, k, NULL));
    kiln_st_close(st);
    CHECK(rename(tmp, path) == 0);
    for (size_t i = 0; i < n + 1; i++) free(copies[i]);
    free(copies);
    free(ent);
}

static void in_file(char *in, size_t n) {
    snprintf(in, n, "%s/in.safetensors", test_tmpdir());
    int64_t ids[2] = {1, 2};
    write_ids(in, KILN_DT_I64, ids, 1, 2);
}

TEST(cli_missing_and_extra_tensors) {
    char in[600], args[2048];
    in_file(in, sizeof in);
    const char *model = make_model();
    rewrite_weights(model, "model.layers.1.self_attn.qk_norm.temp", NULL);
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "tensor 'model.layers.1.self_attn.qk_norm.temp' is missing");
    model = make_model();
    rewrite_weights(model, NULL, "model.layers.0.mlp.shared_expert.weight");
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "unexpected tensor 'model.layers.0.mlp.shared_expert.weight'");
}

static void edit_config(const char *dir, const char *from, const char *to) {
    char path[600], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(kiln_read_file(path, &text, &len));
    if (!text) return;
    char *p = strstr(text, from);
    CHECK_MSG(p != NULL, "config lacks %s", from);
    if (p) {
        size_t a = (size_t)(p - text), fl = strlen(from), tl = strlen(to);
        char *nt = malloc(len - fl + tl + 1);
        memcpy(nt, text, a);
        memcpy(nt + a, to, tl);
        memcpy(nt + a + tl, p + fl, len - a - fl + 1);
        CHECK_OK(kiln_write_file_atomic(path, nt, strlen(nt)));
        free(nt);
    }
    free(text);
}

TEST(cli_config_mismatch) {
    char in[600], args[2048];
    in_file(in, sizeof in);
    const char *model = make_model();
    edit_config(model, "\"router_hidden_size\":\t12", "\"router_hidden_size\":\t16");
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "tensor 'model.layers.0.mlp.gate.down_proj.weight' has shape [12,24] but");
    model = make_model();
    edit_config(model, "\"model_type\":\t\"zaya\"", "\"model_type\":\t\"llama\"");
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "model_type 'llama' is not supported");
    model = make_model();
    edit_config(model, "\"hidden_size\":\t24", "\"hidden_size\":\t\"24\"");
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "field 'hidden_size' must be an integer");
    model = make_model();
    edit_config(model, "\"num_key_value_heads\":\t2", "\"num_key_value_heads\":\t3");
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "must be a multiple of num_key_value_heads");
    snprintf(args, sizeof args, "logits --model /nonexistent/model --input '%s' --out /tmp/x.safetensors", in);
    expect_fail(args, "/nonexistent/model/config.json");
}

TEST(cli_corrupt_weights) {
    char in[600], args[2048], path[700];
    in_file(in, sizeof in);
    const char *model = make_model();
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - 100) == 0); /* truncated: the data no longer covers the header's offsets */
    logits_args(args, sizeof args, model, in);
    expect_fail(args, "model.safetensors");
    /* a header that lies: claims F32 [1000] for 4 bytes */
    const char hdr[] = "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[1000],\"data_offsets\":[0,4]}}";
    FILE *f = fopen(path, "wb");
    uint64_t hl = sizeof hdr - 1;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    fwrite("abcd", 1, 4, f);
    fclose(f);
    expect_fail(args, "model.embed_tokens.weight");
    /* an unknown dtype */
    const char hdr2[] = "{\"model.embed_tokens.weight\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    f = fopen(path, "wb");
    hl = sizeof hdr2 - 1;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr2, 1, hl, f);
    fwrite("abcd", 1, 4, f);
    fclose(f);
    expect_fail(args, "Q4");
}

TEST(zaya_save_load_roundtrip) {
    const char *dir = make_model();
    kiln_zaya_config c;
    tiny_config(&c, 1);
    kiln_zaya *a = NULL, *b = NULL;
    CHECK_OK(kiln_zaya_create(&c, &a));
    if (!a) return;
    perturb_params(a, 5, 0.0f);
    CHECK_OK(kiln_zaya_load_dir(dir, &b));
    if (!b) { kiln_zaya_free(a); return; }
    CHECK(a->numel == b->numel && !memcmp(a->w, b->w, a->numel * sizeof(float)));
    CHECK(!memcmp(a->balancing, b->balancing, (size_t)(c.num_layers * (c.num_experts + 1)) * sizeof(float)));
    CHECK(!memcmp(&a->cfg, &b->cfg, sizeof a->cfg));
    kiln_zaya_free(a);
    kiln_zaya_free(b);
}

TEST(cli_diff) {
    const char *d = test_tmpdir();
    char a[600], b[600], c[600], args[2048], out[8192];
    snprintf(a, sizeof a, "%s/a.safetensors", d);
    snprintf(b, sizeof b, "%s/b.safetensors", d);
    snprintf(c, sizeof c, "%s/c.safetensors", d);
    float x[4] = {1, -2, 3, 4}, y[4] = {1, -2, 3, 4.0001f}, z[2] = {1, 2};
    int64_t s4[1] = {4}, s2[1] = {2};
    kiln_st_entry ea[2] = {{"w", KILN_DT_F32, 1, s4, x}, {"v", KILN_DT_F32, 1, s2, z}};
    kiln_st_entry eb[2] = {{"w", KILN_DT_F32, 1, s4, y}, {"v", KILN_DT_F32, 1, s2, z}};
    CHECK_OK(kiln_st_write(a, ea, 2, NULL));
    CHECK_OK(kiln_st_write(b, eb, 2, NULL));
    CHECK_OK(kiln_st_write(c, ea, 1, NULL));
    snprintf(args, sizeof args, "diff '%s' '%s'", a, b); /* 1e-4 / 4 = 2.5e-5: within 1e-4 */
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 0 && strstr(out, "2 tensors compared, 0 problems"), "%s", out);
    snprintf(args, sizeof args, "diff '%s' '%s' --tol 1e-6", a, b);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 1 && strstr(out, "1 problems"), "%s", out);
    snprintf(args, sizeof args, "diff '%s' '%s'", c, b);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 1 && strstr(out, "only in"), "%s", out);
    expect_fail("diff onlyone.safetensors", "two files");
    /* a NaN tolerance would pass any difference: no number flag takes nan or inf */
    snprintf(args, sizeof args, "diff '%s' '%s' --tol nan", a, b);
    expect_fail(args, "--tol: 'nan' is not a number");
    snprintf(args, sizeof args, "diff '%s' '%s' --tol inf", a, b);
    expect_fail(args, "--tol: 'inf' is not a number");
    snprintf(args, sizeof args, "diff '%s' '%s' --tol -1", a, b);
    expect_fail(args, "--tol -1: expected a tolerance >= 0");
    /* non-finite values: a NaN on either side fails (fmax used to drop it: 0 problems), an infinity only in the
     * reference fails (inf/inf was NaN, which passed), the same infinity on both sides agrees */
    char n[600], inf[600];
    snprintf(n, sizeof n, "%s/nan.safetensors", d);
    snprintf(inf, sizeof inf, "%s/inf.safetensors", d);
    float xn[4] = {1, NAN, 3, 4}, xi[4] = {1, -2, INFINITY, 4};
    kiln_st_entry en[1] = {{"w", KILN_DT_F32, 1, s4, xn}}, ei[1] = {{"w", KILN_DT_F32, 1, s4, xi}};
    CHECK_OK(kiln_st_write(n, en, 1, NULL));
    CHECK_OK(kiln_st_write(inf, ei, 1, NULL));
    const char *pairs[4][2] = {{n, c}, {c, n}, {c, inf}, {inf, c}}; /* c: w alone, finite */
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "diff '%s' '%s'", pairs[i][0], pairs[i][1]);
        CHECK_MSG(test_run_kiln(args, out, sizeof out) == 1 && strstr(out, "non-finite") && strstr(out, "1 problems"),
                  "%s -> %s", args, out);
    }
    snprintf(args, sizeof args, "diff '%s' '%s'", inf, inf);
    CHECK_MSG(test_run_kiln(args, out, sizeof out) == 0 && strstr(out, "0 problems"), "%s", out);
}

/* integer flags stored in an int are range-checked, not truncated (4294967297 was taken as 1 bootstrap sample) */
TEST(cli_int_flags_in_range) {
    expect_fail("cis score --bootstrap 4294967297 --suite s --manifest m --clip c --out o",
                "--bootstrap must be 1..2147483647, got 4294967297");
    expect_fail("cis score --chunk 0 --suite s --manifest m --clip c --out o", "--chunk must be 1..2147483647, got 0");
    expect_fail("cis score --threshold nan --suite s --manifest m --clip c --out o", "--threshold: 'nan' is not a number");
    expect_fail("cis embed --clip c --out o --texts t --batch 5000", "--batch must be 1..4096, got 5000");
}
