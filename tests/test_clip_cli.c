/* kiln cis embed: the CLI contract (image_embeds / text_embeds [N,D] F32, rows in input order,
 * equal to the library's embeddings), and bad items: every unreadable image is named with its line,
 * nothing is written, an existing output stays as it was; bad CLIP directories through `cis embed` and
 * `cis score` alike: the file and tensor named, exit 1, nothing written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clip_testutil.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/image.h"
#include "kiln/safetensors.h"
#include "test.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void make_png(const char *path, int w, int h, int seed) {
    kiln_image img = {.width = w, .height = h, .rgb = malloc((size_t)w * h * 3)};
    for (int i = 0; i < w * h * 3; i++) img.rgb[i] = (uint8_t)((i * 31 + seed * 97) % 256);
    CHECK_OK(kiln_image_save_png(path, &img));
    free(img.rgb);
}

TEST(clip_cli_embed_images_and_texts) {
    const char *dir = test_tmpdir();
    char model[1024], cmd[4096], out[8192];
    snprintf(model, sizeof model, "%s/clip", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", model);
    CHECK(system(cmd) == 0);
    CHECK(clip_test_make_dir(model, &clip_test_default, 5) == 0);
    char list[8192] = "";
    const char *names[3] = {"a.png", "b.png", "c.png"};
    int sizes[3][2] = {{40, 30}, {33, 60}, {32, 32}};
    for (int i = 0; i < 3; i++) {
        make_png(test_join(dir, names[i]), sizes[i][0], sizes[i][1], i);
        strcat(list, test_join(dir, names[i]));
        strcat(list, "\n");
    }
    write_file(test_join(dir, "images.txt"), list);
    write_file(test_join(dir, "texts.txt"), "a photo of a cat\r\nthe cat\n\nlast line without newline");
    const char *o = test_join(dir, "out.safetensors");
    snprintf(cmd, sizeof cmd, "cis embed --clip '%s' --images '%s' --texts '%s' --out '%s' --batch 2", model,
             test_join(dir, "images.txt"), test_join(dir, "texts.txt"), o);
    int rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "kiln %s -> %d: %s", cmd, rc, out);
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(o, &st));
    kiln_clip *m = NULL;
    CHECK_OK(kiln_clip_load(model, &m));
    if (!st || !m) {
        kiln_st_close(st);
        kiln_clip_free(m);
        return;
    }
    int D = kiln_clip_dim(m), S = kiln_clip_image_size(m);
    const kiln_st_tensor *ie = kiln_st_find(st, "image_embeds"), *te = kiln_st_find(st, "text_embeds");
    CHECK(ie && ie->dtype == KILN_DT_F32 && ie->ndim == 2 && ie->shape[0] == 3 && ie->shape[1] == D);
    CHECK(te && te->dtype == KILN_DT_F32 && te->ndim == 2 && te->shape[0] == 4 && te->shape[1] == D);
    float got[4 * 64], want[4 * 64], *px = malloc(sizeof(float) * 3 * S * S);
    if (ie && ie->numel == 3 * D) {
        CHECK_OK(kiln_st_read_f32(ie, got, (size_t)(3 * D)));
        for (int i = 0; i < 3; i++) { /* row i is image i, alone through the library */
            kiln_image img;
            CHECK_OK(kiln_image_load(test_join(dir, names[i]), &img));
            CHECK_OK(kiln_clip_preprocess(m, &img, px));
            CHECK_OK(kiln_clip_embed_images(m, px, 1, want + i * D, NULL));
            kiln_image_free(&img);
            double dmax = 0, nrm = 0;
            for (int k = 0; k < D; k++) {
                double d = fabs(got[i * D + k] - want[i * D + k]);
                dmax = d > dmax ? d : dmax;
                nrm += (double)got[i * D + k] * got[i * D + k];
            }
            CHECK_MSG(dmax < 1e-5, "image row %d differs by %g", i, dmax);
            CHECK_NEAR(nrm, 1.0, 1e-5);
        }
    }
    if (te && te->numel == 4 * D) {
        const char *texts[] = {"a photo of a cat", "the cat", "", "last line without newline"};
        CHECK_OK(kiln_st_read_f32(te, got, (size_t)(4 * D)));
        CHECK_OK(kiln_clip_embed_texts(m, texts, 4, want));
        int bad = 0;
        for (int k = 0; k < 4 * D; k++) bad += fabs(got[k] - want[k]) > 1e-6;
        CHECK_MSG(bad == 0, "%d text values differ", bad);
    }
    free(px);
    kiln_st_close(st);
    kiln_clip_free(m);
}

TEST(clip_cli_bad_items_are_named_and_nothing_is_written) {
    const char *dir = test_tmpdir();
    char model[1024], cmd[4096], out[8192], list[4096];
    snprintf(model, sizeof model, "%s/clip", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", model);
    CHECK(system(cmd) == 0);
    CHECK(clip_test_make_dir(model, &clip_test_default, 6) == 0);
    make_png(test_join(dir, "ok.png"), 20, 20, 1);
    write_file(test_join(dir, "broken.png"), "\x89PNG\r\n\x1a\n not really");
    snprintf(list, sizeof list, "%s\n%s\n%s\n", test_join(dir, "ok.png"), test_join(dir, "missing.jpg"),
             test_join(dir, "broken.png"));
    write_file(test_join(dir, "images.txt"), list);
    const char *o = test_join(dir, "out.safetensors");
    write_file(o, "previous results");
    snprintf(cmd, sizeof cmd, "cis embed --clip '%s' --images '%s' --out '%s'", model, test_join(dir, "images.txt"), o);
    int rc = test_run_kiln(cmd, out, sizeof out);
    CHECK(rc != 0);
    CHECK_MSG(strstr(out, "line 2") && strstr(out, "missing.jpg"), "output: %s", out);
    CHECK_MSG(strstr(out, "line 3") && strstr(out, "broken.png: corrupt PNG"), "output: %s", out);
    CHECK_MSG(strstr(out, "2 of 3 images could not be read"), "output: %s", out);
    char *d = NULL;
    size_t n;
    CHECK_OK(kiln_read_file(o, &d, &n));
    CHECK(d && !strcmp(d, "previous results"));
    free(d);
    /* usage errors */
    snprintf(cmd, sizeof cmd, "cis embed --clip '%s' --out '%s'", model, o);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 2 && strstr(out, "--images / --texts are required"));
    snprintf(cmd, sizeof cmd, "cis embed --clip '%s/nope' --texts '%s' --out '%s'", dir, test_join(dir, "images.txt"), o);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1 && strstr(out, "nope"));
}

/* the bytes of path with the first `from` (searched over the whole file, NULs included) replaced by `to`
 * of the same length, or the file cut to `keep` bytes (keep >= 0) */
static void edit_file(const char *path, const char *from, const char *to, long keep) {
    char *d = NULL;
    size_t n = 0;
    CHECK_OK(kiln_read_file(path, &d, &n));
    if (!d) return;
    if (from) {
        size_t k = strlen(from);
        char *at = NULL;
        for (size_t i = 0; i + k <= n && !at; i++)
            if (!memcmp(d + i, from, k)) at = d + i;
        CHECK_MSG(at != NULL, "%s: no '%s'", path, from);
        if (at) memcpy(at, to, k);
    }
    if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(d, 1, n, f) == n);
    if (f) fclose(f);
    free(d);
}

/* Bad CLIP directories, through both commands that load one (kiln cis embed and kiln cis score): each
 * is an error that names the file (and the tensor where one is at fault), exit 1, no crash, nothing
 * written. */
TEST(clip_cli_bad_clip_directories_are_named) {
    const char *dir = test_tmpdir();
    char good[1024], cmd[8192], out[8192];
    snprintf(good, sizeof good, "%s/good", dir);
    mkdir(good, 0755);
    if (clip_test_make_dir(good, &clip_test_default, 8)) {
        CHECK_MSG(0, "could not write the tiny CLIP");
        return;
    }
    write_file(test_join(dir, "texts.txt"), "a photo of a cat\n");
    make_png(test_join(dir, "a.png"), 40, 36, 2);
    write_file(test_join(dir, "suite.jsonl"),
               "{\"id\":\"w1\",\"prompt\":\"p\",\"culture\":\"Scottish\",\"group\":\"western\",\"category\":\"food\","
               "\"setting\":\"modern\",\"components\":[{\"phrase\":\"haggis\"}],\"complexity\":1}\n");
    write_file(test_join(dir, "man.jsonl"), "{\"image\": \"a.png\", \"prompt_id\": \"w1\", \"model\": \"m\", \"seed\": 1}\n");
    /* name, the file changed: `from` -> `to`, or keep: -2 removed, < -2 that many bytes cut off its end, >= 0
     * cut to that length (-1: none); what the message must hold */
    const struct {
        const char *name, *file, *from, *to;
        long keep;
        const char *want[3];
    } bad[] = {
        {"no_config", "config.json", NULL, NULL, -2, {"no_config/config.json", "cannot open", NULL}},
        {"siglip", "config.json", "\"model_type\":\"clip\"", "\"model_type\":\"sigl\"", -1,
         {"siglip/config.json", "model_type is \"sigl\", not \"clip\"", NULL}},
        {"three_layers", "config.json", "\"num_hidden_layers\":2", "\"num_hidden_layers\":3", -1,
         {"three_layers", "tensor 'text_model.encoder.layers.2.layer_norm1.weight' is missing", NULL}},
        {"cut_data", "model.safetensors", NULL, NULL, -100,
         {"cut_data/model.safetensors", "tensor 'visual_projection.weight'", "past the end"}},
        {"cut_header", "model.safetensors", NULL, NULL, 50, {"cut_header/model.safetensors", "header length", NULL}},
        {"transposed", "model.safetensors", "\"text_projection.weight\":{\"dtype\":\"F32\",\"shape\":[16,32]",
         "\"text_projection.weight\":{\"dtype\":\"F32\",\"shape\":[32,16]", -1,
         {"transposed/model.safetensors", "tensor 'text_projection.weight' has shape [32,16], config.json says [16,32]",
          NULL}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char model[1024], path[1100];
        snprintf(model, sizeof model, "%s/%s", dir, bad[i].name);
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", good, model);
        CHECK(system(cmd) == 0);
        snprintf(path, sizeof path, "%s/%s", model, bad[i].file);
        if (bad[i].keep == -2) CHECK(remove(path) == 0);
        else if (bad[i].keep < -1) {
            struct stat st;
            CHECK(stat(path, &st) == 0);
            edit_file(path, NULL, NULL, (long)st.st_size + bad[i].keep);
        } else edit_file(path, bad[i].from, bad[i].to, bad[i].keep);
        for (int c = 0; c < 2; c++) {
            const char *o = test_join(dir, c ? "run" : "out.safetensors");
            if (!c)
                snprintf(cmd, sizeof cmd, "cis embed --clip '%s' --texts '%s' --out '%s'", model, test_join(dir, "texts.txt"), o);
            else
                snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' --threads 1",
                         test_join(dir, "suite.jsonl"), test_join(dir, "man.jsonl"), model, o);
            int rc = test_run_kiln(cmd, out, sizeof out);
            int named = 1;
            for (int k = 0; k < 3 && bad[i].want[k]; k++) named &= strstr(out, bad[i].want[k]) != NULL;
            struct stat st;
            CHECK_MSG(rc == 1 && named && stat(o, &st) != 0, "%s, %s: rc %d, %s", bad[i].name, c ? "score" : "embed",
                      rc, out);
        }
    }
}
