/* CLIP against transformers 5.x itself: tiny random CLIPModels (quick_gelu / gelu, patch 8 / 7 / 6,
 * f32 and bf16 weights, three processor configs) made by tests/fixtures/clip/make_clip_fixtures.py
 * with float64 references. Checked: input ids identical to HF's tokenizer on the committed text set,
 * pixel values from the image files bit-exact with CLIPImageProcessor's PIL backend and within 2e-2 of
 * its torchvision backend (transformers 5's default), and text,
 * image and patch embeddings within 1e-4 relative error (fp32 vs float64), the image ones both from
 * HF's pixel values (the model alone) and from our own preprocessing (end to end). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip/clip_internal.h"
#include "kiln/clip.h"
#include "kiln/image.h"
#include "kiln/json.h"
#include "kiln/safetensors.h"
#include "test.h"

static double rel_err_t(const float *a, const kiln_st_tensor *t, size_t off, size_t n) {
    double *b = malloc(sizeof(double) * n);
    float *f = malloc(sizeof(float) * (size_t)t->numel);
    kiln_error *e = kiln_st_read_f32(t, f, (size_t)t->numel);
    if (e) kiln_error_free(e);
    /* the references are float64; read them exactly when they are */
    if (t->dtype == KILN_DT_F64) {
        const unsigned char *p = t->data;
        for (size_t i = 0; i < n; i++) memcpy(&b[i], p + (off + i) * 8, 8);
    } else {
        for (size_t i = 0; i < n; i++) b[i] = f[off + i];
    }
    double md = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    free(b);
    free(f);
    return mx > 0 ? md / mx : md;
}

static void check_fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/clip/%s", name);
    const char *dir = test_src_path(rel);
    kiln_clip *m = NULL;
    kiln_st *st = NULL;
    cJSON *meta = NULL;
    kiln_error *e = kiln_clip_load(dir, &m);
    if (!e) e = kiln_st_open(test_join(dir, "expected.safetensors"), &st);
    if (!e) e = kiln_json_parse_file(test_join(dir, "expected.json"), &meta);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s (fixtures are made by tests/fixtures/clip/make_clip_fixtures.py)",
                  kiln_error_msg(e));
        kiln_error_free(e);
        kiln_clip_free(m);
        kiln_st_close(st);
        cJSON_Delete(meta);
        return;
    }
    int D = kiln_clip_dim(m), S = kiln_clip_image_size(m), G = kiln_clip_grid(m);
    const cJSON *texts = cJSON_GetObjectItemCaseSensitive(meta, "texts"),
                *ids = cJSON_GetObjectItemCaseSensitive(meta, "input_ids"),
                *images = cJSON_GetObjectItemCaseSensitive(meta, "images"),
                *ls = cJSON_GetObjectItemCaseSensitive(meta, "logit_scale_exp");
    int nt = cJSON_GetArraySize(texts), ni = cJSON_GetArraySize(images);
    CHECK(nt >= 10 && ni >= 12 && cJSON_GetArraySize(ids) == nt);
    if (cJSON_IsNumber(ls)) CHECK_NEAR(kiln_clip_logit_scale(m), ls->valuedouble, 1e-5 * ls->valuedouble);

    /* token ids: identical to HF, text by text */
    const char **tv = calloc((size_t)nt, sizeof *tv);
    for (int i = 0; i < nt; i++) {
        const cJSON *t = cJSON_GetArrayItem(texts, i), *want = cJSON_GetArrayItem(ids, i);
        tv[i] = t->valuestring;
        int64_t *got = NULL;
        int n = 0;
        CHECK_OK(kiln_clip_text_ids(m, t->valuestring, &got, &n));
        int same = got && n == cJSON_GetArraySize(want);
        for (int k = 0; same && k < n; k++) same = got[k] == (int64_t)cJSON_GetArrayItem(want, k)->valuedouble;
        CHECK_MSG(same, "%s: text %d (\"%.40s\"): %d ids, HF has %d, or they differ", name, i, t->valuestring, n,
                  cJSON_GetArraySize(want));
        free(got);
    }
    /* text embeddings */
    float *te = malloc(sizeof(float) * (size_t)nt * D);
    CHECK_OK(kiln_clip_embed_texts(m, tv, nt, te));
    const kiln_st_tensor *tt = kiln_st_find(st, "text_embeds");
    CHECK(tt && tt->numel == (int64_t)nt * D);
    if (tt && tt->numel == (int64_t)nt * D) {
        double r = rel_err_t(te, tt, 0, (size_t)nt * D);
        CHECK_MSG(r <= 1e-4, "%s: text_embeds relative error %g > 1e-4", name, r);
    }

    /* image embeddings from HF's pixel values, then from our preprocessing of the files */
    const kiln_st_tensor *pv = kiln_st_find(st, "pixel_values"), *ie = kiln_st_find(st, "image_embeds"),
                         *pe = kiln_st_find(st, "patch_embeds");
    CHECK(pv && ie && pe && pv->numel == (int64_t)ni * 3 * S * S && ie->numel == (int64_t)ni * D &&
          pe->numel == (int64_t)ni * G * G * D);
    if (pv && ie && pe && pv->numel == (int64_t)ni * 3 * S * S && ie->numel == (int64_t)ni * D &&
        pe->numel == (int64_t)ni * G * G * D) {
        size_t np = (size_t)ni * 3 * S * S;
        float *hf = malloc(sizeof(float) * np), *ours = malloc(sizeof(float) * np);
        float *emb = malloc(sizeof(float) * (size_t)ni * D), *pat = malloc(sizeof(float) * (size_t)ni * G * G * D);
        CHECK_OK(kiln_st_read_f32(pv, hf, np));
        CHECK_OK(kiln_clip_embed_images(m, hf, ni, emb, pat));
        double ri = rel_err_t(emb, ie, 0, (size_t)ni * D), rp = rel_err_t(pat, pe, 0, (size_t)ni * G * G * D);
        CHECK_MSG(ri <= 1e-4 && rp <= 1e-4, "%s: from HF pixels: image_embeds rel err %g, patch_embeds %g (> 1e-4)",
                  name, ri, rp);
        for (int i = 0; i < ni; i++) {
            const cJSON *im = cJSON_GetArrayItem(images, i);
            char p[300];
            snprintf(p, sizeof p, "tests/fixtures/clip/images/%s", im->valuestring);
            kiln_image img;
            kiln_error *le = kiln_image_load(test_src_path(p), &img);
            if (!le) le = kiln_clip_preprocess(m, &img, ours + (size_t)i * 3 * S * S);
            if (le) {
                test_fail(__FILE__, __LINE__, "%s: %s", name, kiln_error_msg(le));
                kiln_error_free(le);
                continue;
            }
            kiln_image_free(&img);
            double md = 0;
            for (size_t k = 0; k < (size_t)3 * S * S; k++) {
                double d = fabs(ours[(size_t)i * 3 * S * S + k] - hf[(size_t)i * 3 * S * S + k]);
                if (!(d <= md)) md = d;
            }
            CHECK_MSG(md <= 2e-2, "%s: %s: pixel values differ from HF by %g (> 2e-2)", name, im->valuestring, md);
            /* PIL's resampling is integer arithmetic we reproduce: expect far better than the bound */
            CHECK_MSG(md <= 1e-5, "%s: %s: pixel values differ from HF by %g (expected bit-exact resampling)", name,
                      im->valuestring, md);
        }
        /* transformers 5.x defaults to the torchvision backend, which resamples differently: still within 2e-2 */
        const kiln_st_tensor *tv = kiln_st_find(st, "pixel_values_tv");
        if (tv && tv->numel == (int64_t)np) {
            CHECK_OK(kiln_st_read_f32(tv, hf, np));
            double md = 0;
            for (size_t k = 0; k < np; k++) md = fmax(md, fabs(ours[k] - hf[k]));
            CHECK_MSG(md <= 2e-2, "%s: pixel values differ from HF's torchvision backend by %g (> 2e-2)", name, md);
        }
        CHECK_OK(kiln_clip_embed_images(m, ours, ni, emb, pat));
        ri = rel_err_t(emb, ie, 0, (size_t)ni * D);
        rp = rel_err_t(pat, pe, 0, (size_t)ni * G * G * D);
        CHECK_MSG(ri <= 1e-4 && rp <= 1e-4, "%s: end to end: image_embeds rel err %g, patch_embeds %g (> 1e-4)", name,
                  ri, rp);
        free(hf), free(ours), free(emb), free(pat);
    }
    free(te);
    free(tv);
    cJSON_Delete(meta);
    kiln_st_close(st);
    kiln_clip_free(m);
}

TEST(clip_fixture_tiny_quickgelu) { check_fixture("tiny_quickgelu"); }
TEST(clip_fixture_tiny_gelu) { check_fixture("tiny_gelu"); }
TEST(clip_fixture_tiny_bf16) { check_fixture("tiny_bf16"); }
