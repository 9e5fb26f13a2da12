/* kiln cis end to end on CPU: a tiny random CLIP written by the test (tests/clip_testutil.h: HF
 * CLIPModel layout, CLIP's tokenizer pipeline), generated PNGs,
 * a subset of the shipped suite; prompts -> score (with bad items) -> resume -> calibrate ->
 * report, outputs byte-identical across runs, the report checked in headless Chromium. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/cis.h"
#include "kiln/clip.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/image.h"
#include "kiln/json.h"
#include "kiln/rng.h"
#include "cis/cis_internal.h"
#include "test.h"
#include "clip_testutil.h"

/* A smooth random picture, different per seed. */
static void write_png(const char *path, uint64_t seed, int w, int h) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    double c[3][3];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) c[k][j] = kiln_rng_uniform(&r);
    kiln_image img = {w, h, malloc((size_t)w * h * 3)};
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < 3; k++) {
                double v = c[k][0] + 0.5 * c[k][1] * sin(x * 0.3 * (1 + c[k][2])) * cos(y * 0.2 + c[k][2] * 6);
                v = v < 0 ? 0 : v > 1 ? 1 : v;
                img.rgb[((size_t)y * w + x) * 3 + k] = (uint8_t)(v * 255);
            }
    CHECK_OK(kiln_image_save_png(path, &img));
    free(img.rgb);
}

static char *slurp(const char *path) {
    char *t = NULL;
    size_t n;
    kiln_error *e = kiln_read_file(path, &t, &n);
    if (e) {
        kiln_error_free(e);
        return NULL;
    }
    return t;
}

static int same_file(const char *a, const char *b) {
    char *x = slurp(a), *y = slurp(b);
    int same = x && y && !strcmp(x, y);
    free(x), free(y);
    return same;
}

static size_t count_sub(const char *s, const char *sub) {
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

/* a detector's output: the highest score per (image, class); bad lines named */
TEST(cis_detections_format) {
    const char *d = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s", test_join(d, "det.jsonl"));
    const char *good = "{\"image\": \"a.png\", \"class\": \"cup\", \"score\": 0.3}\n"
                       "\n"
                       "{\"image\": \"a.png\", \"class\": \"cup\", \"score\": 0.8, \"box\": [1, 2, 30, 40]}\n"
                       "{\"image\": \"b.png\", \"class\": \"cup\", \"score\": 0.1}\n"
                       "{\"image\": \"a.png\", \"class\": \"person\", \"score\": 1}\n";
    CHECK_OK(kiln_write_file_atomic(path, good, strlen(good)));
    cis_detections t;
    CHECK_OK(cis_detections_load(path, &t));
    CHECK(t.lines == 4 && t.n == 3);
    CHECK(cis_detections_score(&t, "a.png", "cup") == 0.8);
    CHECK(cis_detections_score(&t, "b.png", "cup") == 0.1);
    CHECK(cis_detections_score(&t, "a.png", "person") == 1);
    CHECK(cis_detections_score(&t, "b.png", "person") == 0);
    CHECK(cis_detections_score(&t, "c.png", "cup") == 0);
    cis_detections_free(&t);
    const char *bad[][2] = {
        {"{\"image\": \"a.png\", \"class\": \"cup\", \"score\": 1.5}\n", "det.jsonl:1: score 1.5 is not in [0, 1]"},
        {"\n{\"image\": \"a.png\", \"class\": \"cup\", \"score\": 0.5, \"label\": 3}\n", "det.jsonl:2: unknown field 'label'"},
        {"{\"image\": \"a.png\", \"class\": \"\", \"score\": 0.5}\n", "det.jsonl:1: image and class must not be empty"},
        {"{\"image\": \"a.png\", \"class\": \"cup\", \"score\": 0.5, \"box\": [1, 2, 3]}\n",
         "det.jsonl:1: box must be four finite numbers"},
        {"{\"image\": \"a.png\", \"class\": \"cup\"}\n", "det.jsonl:1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_OK(kiln_write_file_atomic(path, bad[i][0], strlen(bad[i][0])));
        CHECK_ERR(cis_detections_load(path, &t), bad[i][1]);
    }
}

/* the report's thumbnail paths (a bug read past dir's end when dir was a whole prefix of the path: "../" in
 * debug builds) */
TEST(cis_report_relpath) {
    static const char *const cases[][3] = {
        {"/r/t1", "/r/t1/img/a.png", "img/a.png"},   {"/r/t1", "/r/t10/a.png", "../t10/a.png"},
        {"/r/t1/x", "/r/t1/img/a.png", "../img/a.png"}, {"/r/t1", "/q/a.png", "../../q/a.png"},
        {"/", "/a.png", "a.png"},                   {"/r", "/r/a.png", "a.png"},
        {"/r/t1/x/y", "/r/t2/a.png", "../../../t2/a.png"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char buf[4096];
        memset(buf, 'z', sizeof buf); /* what lies past the strings must not matter */
        char dir[256];
        memset(dir, 'q', sizeof dir);
        memcpy(dir, cases[c][0], strlen(cases[c][0]) + 1);
        cis_relpath(dir, cases[c][1], buf, sizeof buf);
        CHECK_MSG(!strcmp(buf, cases[c][2]), "%s + %s: \"%s\", expected \"%s\"", cases[c][0], cases[c][1], buf, cases[c][2]);
    }
    char small[6];
    cis_relpath("/r/t1", "/r/t1/img/a.png", small, sizeof small);
    CHECK(!strcmp(small, "img/a"));
    /* as <img src>: a space, '#', '?', '"', '%' and a UTF-8 byte percent-encoded; '/', '.', '-', '_', '~' kept */
    cis_buf u = {0};
    cis_buf_url_path(&u, "../img dir/0_w1 #0 ?\"q\"%-~.\xc3\xa9.png");
    CIS_PUT(&u, "\0");
    CHECK_MSG(!u.oom && !strcmp(u.p, "../img%20dir/0_w1%20%230%20%3F%22q%22%25-~.%C3%A9.png"), "%s", u.p ? u.p : "(null)");
    cis_buf_free(&u);
}

TEST(cis_end_to_end) {
    const char *d = test_tmpdir();
    char suite[512], clip[512], work[512], labels[512], out[16384], cmd[4096];
    /* the shipped suite, every 8th prompt (both groups, all complexities) */
    snprintf(suite, sizeof suite, "%s", test_join(d, "suite.jsonl"));
    char *full = slurp(test_src_path("data/cis/suite.jsonl"));
    CHECK(full != NULL);
    if (!full) return;
    FILE *f = fopen(suite, "w");
    int line = 0;
    for (char *p = full, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) break;
        if (line++ % 8 == 0) fwrite(p, 1, (size_t)(nl - p + 1), f);
    }
    fclose(f);
    free(full);
    snprintf(clip, sizeof clip, "%s", test_join(d, "clip"));
    mkdir(clip, 0755);
    if (clip_test_make_dir(clip, &clip_test_default, 2026)) {
        CHECK_MSG(0, "could not write the tiny CLIP");
        return;
    }

    /* the worklist, then the images a generator would have made */
    snprintf(work, sizeof work, "%s", test_join(d, "work.jsonl"));
    snprintf(cmd, sizeof cmd, "cis prompts --suite '%s' --images-per-prompt 1 --models alpha,beta --out '%s'", suite, work);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    kiln_cis_manifest m;
    CHECK_OK(kiln_cis_manifest_load(work, &m));
    if (m.n != 72) {
        CHECK_MSG(m.n == 72, "worklist has %d lines", m.n);
        kiln_cis_manifest_free(&m);
        return;
    }
    mkdir(test_join(d, "images"), 0755);
    mkdir(test_join(d, "images/alpha"), 0755);
    mkdir(test_join(d, "images/beta"), 0755);
    for (int i = 0; i < m.n; i++)
        if (i != 5) write_png(m.items[i].path, (uint64_t)m.items[i].seed + (uint64_t)i, 40 + i % 9, 36 + i % 5);
    /* bad items: image 5 is missing, image 6 is corrupt, and one line names an unknown prompt */
    CHECK_OK(kiln_write_file_atomic(m.items[6].path, "\x89PNG not really", 15));
    kiln_cis_manifest_free(&m);
    f = fopen(work, "a");
    fputs("{\"image\": \"images/alpha/0.png\", \"prompt_id\": \"xx-none-h1\", \"model\": \"alpha\", \"seed\": 1}\n", f);
    fclose(f);
    write_png(test_join(d, "images/alpha/0.png"), 99, 32, 32);

    /* human labels for some components (deliberately both classes) */
    snprintf(labels, sizeof labels, "%s", test_join(d, "labels.jsonl"));
    f = fopen(labels, "w");
    fputs("{\"image\": \"images/alpha/eth-meal-h1_0.png\", \"component\": \"injera\", \"present\": true}\n", f);
    fputs("{\"image\": \"images/beta/eth-meal-h1_0.png\", \"component\": \"injera\", \"present\": false}\n", f);
    fputs("{\"image\": \"images/alpha/nope.png\", \"component\": \"injera\", \"present\": false}\n", f);
    fclose(f);

    char run1[512], run2[512], run3[512];
    snprintf(run1, sizeof run1, "%s", test_join(d, "run1"));
    snprintf(run2, sizeof run2, "%s", test_join(d, "run2"));
    snprintf(run3, sizeof run3, "%s", test_join(d, "run3"));
    const char *common = "--crops 1,2 --bootstrap 200 --permutations 500 --chunk 7 --threads 1";
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s", suite, work, clip, run1,
             common);
    int rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 1, "score exit %d (want 1: three bad items):\n%s", rc, out);
    CHECK_MSG(strstr(out, "70 images scored, 3 could not be scored"), "%s", out);
    char *sj = slurp(test_join(run1, "scores.json"));
    CHECK(sj != NULL);
    if (sj) {
        CHECK(strstr(sj, "prompt id 'xx-none-h1' is not in the suite"));
        CHECK(strstr(sj, "eth-meal-h1_0.png") != NULL);
        CHECK(strstr(sj, "\"superposition\"") && strstr(sj, "\"pca\"") && strstr(sj, "\"fragility\""));
        CHECK(count_sub(sj, "\"error\":") == 3);
    }
    free(sj);
    /* an existing run is not overwritten without --resume */
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "already holds a run"));

    /* the same inputs give the same bytes */
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s", suite, work, clip, run2,
             common);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
    const char *files[] = {"scores.json", "summary.csv", "images.csv", "components.csv", "superposition.csv",
                           "embeddings.json", "results/part-000000.jsonl", "results/part-000010.jsonl"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[600];
        snprintf(a, sizeof a, "%s", test_join(run1, files[i]));
        CHECK_MSG(same_file(a, test_join(run2, files[i])), "%s differs between two runs", files[i]);
    }

    /* the resampling unit: prompts by default (here each prompt's two images, one per model) */
    cJSON *sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run1, "scores.json"), &sc));
    if (sc) {
        const cJSON *g0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sc, "gap"), 0);
        CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(sc, "cluster")->valuestring, "prompt"));
        const cJSON *runj = cJSON_GetObjectItemCaseSensitive(sc, "run");
        CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(runj, "cluster")->valuestring, "prompt"));
        /* 36 prompts, each with a scored image (the two bad images are another model's of their prompts) */
        CHECK_MSG(cJSON_GetObjectItemCaseSensitive(g0, "clusters")->valuedouble == 36, "%g prompts",
                  cJSON_GetObjectItemCaseSensitive(g0, "clusters")->valuedouble);
        /* the two models against each other, paired by prompt: 34 prompts have both models' images
         * (the missing and the corrupt image are alpha's); the estimate is the mean of the prompts'
         * differences, recomputed here from the per-image records */
        const cJSON *md = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sc, "model_diff"), 0);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(sc, "model_diff")) == 1);
        CHECK(md && !strcmp(cJSON_GetObjectItemCaseSensitive(md, "a")->valuestring, "alpha"));
        CHECK(md && cJSON_GetObjectItemCaseSensitive(md, "pairs")->valuedouble == 34);
        double sum = 0;
        int np = 0;
        const cJSON *ia, *ib;
        cJSON_ArrayForEach(ia, cJSON_GetObjectItemCaseSensitive(sc, "images")) {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(ia, "model")->valuestring, "alpha")) continue;
            cJSON_ArrayForEach(ib, cJSON_GetObjectItemCaseSensitive(sc, "images"))
                if (!strcmp(cJSON_GetObjectItemCaseSensitive(ib, "model")->valuestring, "beta") &&
                    !strcmp(cJSON_GetObjectItemCaseSensitive(ib, "prompt_id")->valuestring,
                            cJSON_GetObjectItemCaseSensitive(ia, "prompt_id")->valuestring))
                    sum += cJSON_GetObjectItemCaseSensitive(ia, "cis")->valuedouble -
                           cJSON_GetObjectItemCaseSensitive(ib, "cis")->valuedouble, np++;
        }
        CHECK(np == 34);
        if (md) CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(md, "diff")->valuedouble, sum / 34, 1e-12);
    }
    cJSON_Delete(sc);
    char *sum = slurp(test_join(run1, "summary.csv"));
    const char *head = "section,by,level,n,estimate,ci_lo,ci_hi,p_value,clusters,p_holm\n";
    CHECK(sum && !strncmp(sum, head, strlen(head)));
    CHECK_MSG(sum && strstr(sum, "\ncis,all,all,70,") && strstr(sum, ",36,\n"), "%.400s", sum ? sum : "(none)");
    free(sum);
    /* by culture (12 of them; rescoring nothing new): C(12, 6) = 924 relabellings, all counted */
    snprintf(cmd, sizeof cmd,
             "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' --crops 1,2 --bootstrap 200 --chunk 7 "
             "--threads 1 --resume --cluster culture --permutations 1000", suite, work, clip, run2);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "resampling cultures") && strstr(out, "(exact)") && strstr(out, "(one culture: no CI)"), "%s",
              out);
    sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run2, "scores.json"), &sc));
    if (sc) {
        const cJSON *g0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sc, "gap"), 0);
        CHECK(cJSON_GetObjectItemCaseSensitive(g0, "clusters")->valuedouble == 12);
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g0, "exact")));
        /* Holm within a family: the overall gap is a family of one; a category's p-value can only grow */
        CHECK(cJSON_GetObjectItemCaseSensitive(g0, "p_holm")->valuedouble == cJSON_GetObjectItemCaseSensitive(g0, "p")->valuedouble);
        const cJSON *gx;
        cJSON_ArrayForEach(gx, cJSON_GetObjectItemCaseSensitive(sc, "gap"))
            CHECK(cJSON_GetObjectItemCaseSensitive(gx, "p_holm")->valuedouble >= cJSON_GetObjectItemCaseSensitive(gx, "p")->valuedouble);
        /* a culture's own mean has one cluster: no interval */
        const cJSON *x;
        int seen = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(sc, "cis")) {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(x, "by")->valuestring, "culture")) continue;
            seen++;
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(x, "lo")));
        }
        CHECK(seen == 12);
    }
    cJSON_Delete(sc);
    /* a run written before the field resampled images, and keeps doing so */
    sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run2, "run.json"), &sc));
    if (sc) {
        cJSON_DeleteItemFromObjectCaseSensitive(sc, "cluster");
        char *t = kiln_json_print(sc, 1);
        CHECK_OK(kiln_write_file_atomic(test_join(run2, "run.json"), t, strlen(t)));
        free(t);
    }
    cJSON_Delete(sc);
    /* and labels over many images: the judge's agreement out of sample, 5 folds of images */
    char labels2[512];
    snprintf(labels2, sizeof labels2, "%s", test_join(d, "labels2.jsonl"));
    {
        kiln_cis_manifest m2;
        kiln_cis_suite s2;
        CHECK_OK(kiln_cis_manifest_load(work, &m2));
        CHECK_OK(kiln_cis_suite_load(suite, &s2));
        FILE *lf = fopen(labels2, "w");
        for (int i = 10; lf && i < 50; i++) {
            int pi = kiln_cis_suite_find(&s2, m2.items[i].prompt_id);
            if (pi >= 0)
                fprintf(lf, "{\"image\": \"%s\", \"component\": \"%s\", \"present\": %s}\n", m2.items[i].image,
                        s2.p[pi].comp[0].phrase, i % 3 ? "false" : "true");
        }
        if (lf) fclose(lf);
        kiln_cis_manifest_free(&m2);
        kiln_cis_suite_free(&s2);
    }
    snprintf(cmd, sizeof cmd, "cis calibrate '%s' --labels '%s'", run2, labels2);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "out of sample (5 folds of images)"), "%s", out);
    sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run2, "scores.json"), &sc));
    if (sc) {
        CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(sc, "cluster")->valuestring, "image"));
        /* per image, the models pair on prompt and seed (the worklist gave both the same seeds) */
        const cJSON *md = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sc, "model_diff"), 0);
        CHECK(md && cJSON_GetObjectItemCaseSensitive(md, "pairs")->valuedouble == 34);
        const cJSON *cal = cJSON_GetObjectItemCaseSensitive(sc, "calibration");
        const cJSON *cv = cJSON_GetObjectItemCaseSensitive(cal, "agreement_cross_validated");
        CHECK(cJSON_IsObject(cv));
        if (cJSON_IsObject(cv)) {
            double tot = 0;
            const char *f4[] = {"tp", "fp", "tn", "fn"};
            for (int i = 0; i < 4; i++) tot += cJSON_GetObjectItemCaseSensitive(cv, f4[i])->valuedouble;
            CHECK(tot == 40 && cJSON_GetObjectItemCaseSensitive(cal, "pairs")->valuedouble == 40);
            CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(cv, "thresholds")) == 5);
        }
    }
    cJSON_Delete(sc);
    /* resumed without --cluster, such a run keeps resampling images (and a new run's prompts stay prompts) */
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s --resume", suite, work, clip,
             run2, common);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "resampling images"), "%s", out);
    char *rj2 = slurp(test_join(run2, "run.json"));
    CHECK(rj2 && strstr(rj2, "\"cluster\":\t\"image\""));
    free(rj2);
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' --cluster seeds", suite, work,
             clip, test_join(d, "run6"));
    CHECK(test_run_kiln(cmd, out, sizeof out) == 2 && strstr(out, "--cluster 'seeds'"));

    /* an object detector's output beside the judge: every COCO-classed component of the scored images,
     * some found (twice: the higher score counts), plus an image outside the run and a class no
     * component names; a bad file stops the run before its directory exists */
    {
        char dets[512], run7[512];
        snprintf(dets, sizeof dets, "%s", test_join(d, "dets.jsonl"));
        snprintf(run7, sizeof run7, "%s", test_join(d, "run7"));
        kiln_cis_manifest m3;
        kiln_cis_suite s3;
        CHECK_OK(kiln_cis_manifest_load(work, &m3));
        CHECK_OK(kiln_cis_suite_load(suite, &s3));
        FILE *df = fopen(dets, "w");
        int pairs = 0, found = 0;
        char probe_img[256] = "", probe_cls[64] = "";
        for (int i = 0; df && i < m3.n; i++) {
            int pi = kiln_cis_suite_find(&s3, m3.items[i].prompt_id);
            if (pi < 0 || i == 5 || i == 6) continue; /* the unknown prompt, the missing and the corrupt image */
            for (int c = 0; c < s3.p[pi].ncomp; c++) {
                const char *cls = s3.p[pi].comp[c].coco;
                if (!cls) continue;
                pairs++;
                if (i % 2) continue;
                found++;
                fprintf(df, "{\"image\": \"%s\", \"class\": \"%s\", \"score\": 0.2}\n", m3.items[i].image, cls);
                fprintf(df, "{\"image\": \"%s\", \"class\": \"%s\", \"score\": 0.75}\n", m3.items[i].image, cls);
                if (!*probe_img) snprintf(probe_img, sizeof probe_img, "%s", m3.items[i].image), snprintf(probe_cls, sizeof probe_cls, "%s", cls);
            }
        }
        if (df) {
            fputs("{\"image\": \"elsewhere.png\", \"class\": \"cup\", \"score\": 0.9}\n", df);
            fprintf(df, "{\"image\": \"%s\", \"class\": \"giraffe\", \"score\": 0.9}\n", m3.items[0].image);
            fclose(df);
        }
        kiln_cis_manifest_free(&m3);
        kiln_cis_suite_free(&s3);
        CHECK_MSG(pairs > 10 && found > 4, "%d pairs, %d found", pairs, found);
        snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s --detections '%s' "
                                  "--detector-threshold 0.5", suite, work, clip, run7, common, dets);
        CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
        CHECK_MSG(strstr(out, "detector: ") && strstr(out, "(1 detection images not in the run)"), "%s", out);
        cJSON *s7 = NULL;
        CHECK_OK(kiln_json_parse_file(test_join(run7, "scores.json"), &s7));
        const cJSON *dj = cJSON_GetObjectItemCaseSensitive(s7, "detector");
        CHECK(cJSON_IsObject(dj));
        if (cJSON_IsObject(dj)) {
            CHECK_MSG(cJSON_GetObjectItemCaseSensitive(dj, "pairs")->valuedouble == pairs, "pairs %g, want %d",
                      cJSON_GetObjectItemCaseSensitive(dj, "pairs")->valuedouble, pairs);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(dj, "clip_vs_detector");
            /* the detector's "present" count is what it found */
            CHECK(cJSON_GetObjectItemCaseSensitive(a, "tp")->valuedouble + cJSON_GetObjectItemCaseSensitive(a, "fn")->valuedouble == found);
            /* the detector found the components of the even items only: both groups reported, the
             * overall inclusion strictly between 0 and 1 */
            int groups = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(s7, "detector_inclusion")) {
                double mean = cJSON_GetObjectItemCaseSensitive(x, "mean")->valuedouble;
                groups += !strcmp(cJSON_GetObjectItemCaseSensitive(x, "by")->valuestring, "group");
                if (!strcmp(cJSON_GetObjectItemCaseSensitive(x, "by")->valuestring, "all")) CHECK(mean > 0.2 && mean < 0.8);
            }
            CHECK(groups == 2);
        }
        cJSON_Delete(s7);
        /* the probe's component line ends with its class and the higher of its two scores */
        char *cj7 = slurp(test_join(run7, "components.csv")), want[128];
        const char *head7 = "image,prompt_id,model,component,p,p_whole,view,present,label,entropy,coco,p_det\n";
        CHECK(cj7 && !strncmp(cj7, head7, strlen(head7)));
        snprintf(want, sizeof want, ",%s,0.75", probe_cls);
        int hit = 0;
        for (char *l = cj7, *nl; l && *l; l = nl ? nl + 1 : NULL) {
            nl = strchr(l, '\n');
            size_t len = nl ? (size_t)(nl - l) : strlen(l);
            hit |= !strncmp(l, probe_img, strlen(probe_img)) && l[strlen(probe_img)] == ',' && len >= strlen(want) &&
                   !strncmp(l + len - strlen(want), want, strlen(want));
        }
        CHECK_MSG(hit, "no line of %s ending %s", probe_img, want);
        free(cj7);
        char html7[600];
        snprintf(html7, sizeof html7, "%s", test_join(run7, "report.html"));
        snprintf(cmd, sizeof cmd, "cis report '%s' --out '%s'", run7, html7);
        CHECK(test_run_kiln(cmd, out, sizeof out) == 0);
        char *page7 = slurp(html7);
        CHECK(page7 && strstr(page7, "<h2>Object detector</h2>") && strstr(page7, "share detected (detector)"));
        free(page7);
        /* resumed without --detections: kept */
        snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s --resume", suite, work,
                 clip, run7, common);
        CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
        CHECK_MSG(strstr(out, "detector: "), "%s", out);
        /* a bad detections file: named, and nothing written */
        FILE *bf = fopen(dets, "a");
        if (bf) fputs("{\"image\": \"x.png\", \"class\": \"cup\", \"score\": 7}\n", bf), fclose(bf);
        snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' --detections '%s'", suite,
                 work, clip, test_join(d, "run8"), dets);
        CHECK(test_run_kiln(cmd, out, sizeof out) == 1 && strstr(out, "dets.jsonl:") && strstr(out, "score 7 is not in [0, 1]"));
        struct stat st8;
        CHECK(stat(test_join(d, "run8"), &st8) != 0);
        /* run7 kept its own copy: aggregating it again does not read the (now broken) original */
        snprintf(cmd, sizeof cmd, "cis calibrate '%s' --labels '%s'", run7, labels);
        CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0 && strstr(out, "detector: "), "%s", out);
    }

    /* a crash after two parts: --resume scores only the rest and ends with the same numbers */
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s", suite, work, clip, run3,
             common);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
    for (int k = 2; k <= 10; k++) {
        char part[64];
        snprintf(part, sizeof part, "results/part-%06d.jsonl", k);
        remove(test_join(run3, part));
    }
    remove(test_join(run3, "scores.json"));
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' %s --resume", suite, work,
             clip, run3, common);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 1);
    CHECK_MSG(same_file(test_join(run1, "scores.json"), test_join(run3, "scores.json")),
              "resumed run differs from the uninterrupted one");
    CHECK_MSG(same_file(test_join(run1, "results/part-000001.jsonl"), test_join(run3, "results/part-000001.jsonl")),
              "resume rewrote a finished part");
    /* numbering continues after the last part left; the two failed images of part 0 were retried first */
    char *p2 = slurp(test_join(run3, "results/part-000002.jsonl"));
    CHECK(p2 && count_sub(p2, "\"error\": \"") >= 2);
    free(p2);

    /* Ctrl-C (the stop flag a SIGINT sets) ends the run with finished results kept; --resume finishes it */
    {
        kiln_cis_score_opts o;
        kiln_cis_score_opts_default(&o);
        o.suite = suite, o.manifest = work, o.clip_dir = clip, o.grids = "1", o.boot = 20, o.perm = 20;
        char run5[512];
        snprintf(run5, sizeof run5, "%s", test_join(d, "run5"));
        o.out_dir = run5;
        FILE *nul = fopen("/dev/null", "w");
        o.progress = nul;
        static volatile int one = 1;
        o.stop = &one;
        int ns, ne;
        CHECK_ERR(kiln_cis_score(&o, &ns, &ne), "interrupted after 0 of 73 images");
        o.stop = NULL;
        o.resume = 1;
        CHECK_OK(kiln_cis_score(&o, &ns, &ne));
        CHECK(ns == 70 && ne == 3);
        fclose(nul);
    }

    /* labels: calibrate the threshold and measure the judge */
    snprintf(cmd, sizeof cmd, "cis calibrate '%s' --labels '%s'", run1, labels);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK(strstr(out, "labels: 2 pairs") != NULL);
    sj = slurp(test_join(run1, "scores.json"));
    if (sj) {
        CHECK(strstr(sj, "\"threshold_source\":\t\"calibrated\"") != NULL);
        CHECK(strstr(sj, "\"unmatched_labels\":\t1") != NULL);
        CHECK(strstr(sj, "\"kappa\"") != NULL);
        CHECK(strstr(sj, "\"agreement_cross_validated\":\tnull") != NULL); /* both labels of one prompt */
    }
    free(sj);

    /* labels as the judge: the labelled verdicts are the labels, whatever CLIP said */
    snprintf(cmd, sizeof cmd, "cis calibrate '%s' --labels '%s' --labels-as-judge", run3, labels);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 0);
    char *cj = slurp(test_join(run3, "components.csv"));
    if (cj) {
        CHECK(strstr(cj, "images/alpha/eth-meal-h1_0.png,eth-meal-h1,alpha,injera,") != NULL);
        for (char *l = strstr(cj, "images/beta/eth-meal-h1_0.png,eth-meal-h1,beta,injera,"); l; l = NULL) {
            char *nl = strchr(l, '\n');
            if (nl) *nl = 0;
            CHECK_MSG(strstr(l, ",0,0,") != NULL, "labelled absent but judged present: %s", l); /* present 0, label 0 */
        }
        char *l = strstr(cj, "images/alpha/eth-meal-h1_0.png,eth-meal-h1,alpha,injera,");
        if (l) {
            char *nl = strchr(l, '\n');
            if (nl) *nl = 0;
            CHECK_MSG(strstr(l, ",1,1,") != NULL, "labelled present but judged absent: %s", l);
        }
    }
    free(cj);

    /* the report */
    char html[600];
    snprintf(html, sizeof html, "%s", test_join(d, "report.html"));
    snprintf(cmd, sizeof cmd, "cis report '%s' --out '%s'", run1, html);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    char *page = slurp(html);
    CHECK(page != NULL);
    if (page) {
        CHECK_MSG(count_sub(page, "<svg") == 5, "%zu svg", count_sub(page, "<svg")); /* with the models' forest plot */
        CHECK(strstr(page, "src=\"images/alpha/") != NULL); /* thumbnails relative to the page */
        CHECK(strstr(page, "Could not") == NULL && strstr(page, "could not be scored") != NULL);
        CHECK(strstr(page, "Cohen") != NULL);
        CHECK(strstr(page, "Models against each other") != NULL);
        /* numbers that do not exist (a one-cluster level's CI, a p without two groups) read "n/a", not "nan" */
        const char *nans[] = {"[nan", "nan]", "= nan", ": nan", ">nan<"};
        for (int k = 0; k < 5; k++) CHECK_MSG(!strstr(page, nans[k]), "the report prints %s", nans[k]);
    }
    free(page);
    /* the page over the run's own scores.json: refused (it replaced the results it shows) */
    snprintf(cmd, sizeof cmd, "cis report '%s' --out '%s'", run1, test_join(run1, "scores.json"));
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 2 && strstr(out, "is the run's scores.json"), "%s", out);
    char *kept = slurp(test_join(run1, "scores.json"));
    CHECK(kept && kept[0] == '{');
    free(kept);

    /* bad input that stops the run: another architecture, a broken suite */
    const char *bad = "{\"model_type\": \"siglip\"}";
    char clip2[512];
    snprintf(clip2, sizeof clip2, "%s", test_join(d, "clip2"));
    mkdir(clip2, 0755);
    CHECK_OK(kiln_write_file_atomic(test_join(clip2, "config.json"), bad, strlen(bad)));
    snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s'", suite, work, clip2,
             test_join(d, "run4"));
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "siglip"), "%s", out);
    struct stat st;
    CHECK_MSG(stat(test_join(d, "run4"), &st) != 0, "a failed start left a run directory behind");
}

/* The paired model comparison against a hand computation: three models, two seeds a prompt, one
 * image missing, and the verdicts set by labels (--labels-as-judge) so that every CIS is known. */
static int mdl_present(int mi, int pi, int k, int c) { return (mi * 7 + pi * 3 + k * 5 + c) % 3 == 0; }

TEST(cis_model_diff_paired) {
    const char *d = test_tmpdir();
    char suite[512], clip[512], work[512], labels[512], out[16384], cmd[4096];
    snprintf(suite, sizeof suite, "%s", test_join(d, "suite3.jsonl"));
    char *full = slurp(test_src_path("data/cis/suite.jsonl"));
    CHECK(full != NULL);
    if (!full) return;
    char *third = full;
    for (int l = 0; l < 3 && third; l++) third = strchr(third, '\n') ? strchr(third, '\n') + 1 : NULL;
    CHECK_OK(kiln_write_file_atomic(suite, full, third ? (size_t)(third - full) : strlen(full))); /* 3 prompts */
    free(full);
    snprintf(clip, sizeof clip, "%s", test_join(d, "clip"));
    mkdir(clip, 0755);
    if (clip_test_make_dir(clip, &clip_test_default, 7)) {
        CHECK_MSG(0, "could not write the tiny CLIP");
        return;
    }
    snprintf(work, sizeof work, "%s", test_join(d, "work.jsonl"));
    snprintf(cmd, sizeof cmd, "cis prompts --suite '%s' --images-per-prompt 2 --models a,b,c --out '%s'", suite, work);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    kiln_cis_manifest m;
    kiln_cis_suite s;
    CHECK_OK(kiln_cis_manifest_load(work, &m));
    CHECK_OK(kiln_cis_suite_load(suite, &s));
    if (m.n != 18 || s.n != 3) {
        CHECK_MSG(0, "%d items, %d prompts", m.n, s.n);
        kiln_cis_manifest_free(&m), kiln_cis_suite_free(&s);
        return;
    }
    mkdir(test_join(d, "images"), 0755);
    const char *models[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) mkdir(test_join(d, i == 0 ? "images/a" : i == 1 ? "images/b" : "images/c"), 0755);
    /* cis[model][prompt][seed] from the labels; c's image of prompt 1, seed 1 is missing */
    double cis[3][3][2];
    snprintf(labels, sizeof labels, "%s", test_join(d, "labels.jsonl"));
    FILE *lf = fopen(labels, "w");
    for (int i = 0; lf && i < m.n; i++) {
        int mi = m.items[i].model[0] - 'a', pi = kiln_cis_suite_find(&s, m.items[i].prompt_id);
        int k = m.items[i].image[strlen(m.items[i].image) - 5] - '0'; /* images/<model>/<id>_<k>.png */
        CHECK(mi >= 0 && mi < 3 && pi >= 0 && (k == 0 || k == 1) && !strcmp(m.items[i].model, models[mi]));
        if (mi < 0 || mi > 2 || pi < 0 || k < 0 || k > 1) continue;
        if (!(mi == 2 && pi == 1 && k == 1)) write_png(m.items[i].path, (uint64_t)i + 5, 40, 36);
        int present = 0;
        for (int c = 0; c < s.p[pi].ncomp; c++) {
            present += mdl_present(mi, pi, k, c);
            fprintf(lf, "{\"image\": \"%s\", \"component\": \"%s\", \"present\": %s}\n", m.items[i].image,
                    s.p[pi].comp[c].phrase, mdl_present(mi, pi, k, c) ? "true" : "false");
        }
        cis[mi][pi][k] = (double)present / s.p[pi].ncomp;
    }
    if (lf) fclose(lf);
    kiln_cis_manifest_free(&m);
    kiln_cis_suite_free(&s);
    /* the expected differences: by prompt (a cell only both models scored counts), and by prompt and seed */
    double want_p[3], want_i[3];
    int pairs_i[3], q = 0;
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++, q++) {
            double sum_p = 0, sum_i = 0;
            int ni = 0;
            for (int pi = 0; pi < 3; pi++) {
                double sp = 0;
                int np = 0;
                for (int k = 0; k < 2; k++) {
                    if ((a == 2 || b == 2) && pi == 1 && k == 1) continue;
                    double dd = cis[a][pi][k] - cis[b][pi][k];
                    sp += dd, np++, sum_i += dd, ni++;
                }
                sum_p += sp / np;
            }
            want_p[q] = sum_p / 3, want_i[q] = sum_i / ni, pairs_i[q] = ni;
        }
    /* the pattern must make the comparisons differ per prompt and per cell, or the checks below prove little */
    CHECK(want_p[0] != 0 && want_p[1] != want_i[1] && want_p[2] != want_i[2]);
    char run[512];
    snprintf(run, sizeof run, "%s", test_join(d, "run"));
    for (int pass = 0; pass < 2; pass++) {
        snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --clip '%s' --out '%s' --crops 1 --threads 1 "
                                  "--labels '%s' --labels-as-judge --cluster %s%s", suite, work, clip, run, labels,
                 pass ? "image" : "prompt", pass ? " --resume" : "");
        CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 1, "%s", out); /* the missing image */
        cJSON *sc = NULL;
        CHECK_OK(kiln_json_parse_file(test_join(run, "scores.json"), &sc));
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(sc, "model_diff");
        CHECK(cJSON_GetArraySize(md) == 3);
        double p[3], adj[3];
        q = 0;
        for (const cJSON *x = md ? md->child : NULL; x && q < 3; x = x->next, q++) {
            double diff = cJSON_GetObjectItemCaseSensitive(x, "diff")->valuedouble;
            int pairs = (int)cJSON_GetObjectItemCaseSensitive(x, "pairs")->valuedouble;
            CHECK_MSG(fabs(diff - (pass ? want_i[q] : want_p[q])) < 1e-12, "pass %d pair %d: diff %g, want %g", pass, q,
                      diff, pass ? want_i[q] : want_p[q]);
            CHECK_MSG(pairs == (pass ? pairs_i[q] : 3), "pass %d pair %d: %d pairs", pass, q, pairs);
            p[q] = cJSON_GetObjectItemCaseSensitive(x, "p")->valuedouble;
        }
        kiln_cis_holm(p, 3, adj);
        CHECK(adj[0] != p[0] || adj[1] != p[1] || adj[2] != p[2]); /* the adjustment did something */
        q = 0;
        for (const cJSON *x = md ? md->child : NULL; x && q < 3; x = x->next, q++)
            CHECK(cJSON_GetObjectItemCaseSensitive(x, "p_holm")->valuedouble == adj[q]);
        cJSON_Delete(sc);
    }
}

TEST(cis_report_chromium) {
    /* a small scored run straight from the library: a hand-written results part */
    const char *d = test_tmpdir();
    char run[512], html[600];
    snprintf(run, sizeof run, "%s", test_join(d, "run"));
    mkdir(run, 0755);
    mkdir(test_join(run, "results"), 0755);
    const char *suite =
        "{\"id\":\"w1\",\"prompt\":\"p\",\"culture\":\"Scottish\",\"group\":\"western\",\"category\":\"attire\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"a kilt\",\"generic\":\"a skirt\"},{\"phrase\":\"a sporran\"}],"
        "\"complexity\":2}\n"
        "{\"id\":\"n1\",\"prompt\":\"p\",\"culture\":\"Japanese\",\"group\":\"non_western\",\"category\":\"attire\","
        "\"setting\":\"historical\",\"components\":[{\"phrase\":\"a kimono\",\"generic\":\"a robe\"}],\"complexity\":1}\n";
    CHECK_OK(kiln_write_file_atomic(test_join(run, "suite.jsonl"), suite, strlen(suite)));
    const char *runj = "{\"suite\":\"s\",\"manifest\":\"m\",\"clip\":\"c\",\"crops\":\"1\",\"bootstrap\":100,"
                       "\"permutations\":100,\"seed\":3,\"threshold\":0.5}";
    CHECK_OK(kiln_write_file_atomic(test_join(run, "run.json"), runj, strlen(runj)));
    const char *emb = "{\"superposition\":[{\"phrase\":\"a kimono\",\"culture\":\"Japanese\",\"group\":\"non_western\","
                      "\"category\":\"attire\",\"cos_generic\":0.8,\"cos_western_mean\":0.7,\"cos_western_max\":0.7}],"
                      "\"pca\":{\"points\":[{\"phrase\":\"a kimono\",\"culture\":\"Japanese\",\"group\":\"non_western\","
                      "\"x\":1,\"y\":0},{\"phrase\":\"a kilt\",\"culture\":\"Scottish\",\"group\":\"western\",\"x\":-1,"
                      "\"y\":0.5}],\"explained_1\":0.6,\"explained_2\":0.3}}";
    CHECK_OK(kiln_write_file_atomic(test_join(run, "embeddings.json"), emb, strlen(emb)));
    write_png(test_join(d, "a.png"), 1, 40, 30);
    char part[2048];
    snprintf(part, sizeof part,
             "{\"image\":\"a.png\",\"prompt_id\":\"w1\",\"model\":\"m\",\"seed\":1,\"path\":\"%s\",\"error\":null,"
             "\"components\":[{\"phrase\":\"a kilt\",\"p\":0.9,\"p_whole\":0.9,\"view\":0,\"entropy\":0.5},"
             "{\"phrase\":\"a sporran\",\"p\":0.2,\"p_whole\":0.2,\"view\":0,\"entropy\":0.9}],\"context_sim\":0.3,"
             "\"generic_sim\":0.35}\n"
             "{\"image\":\"b.png\",\"prompt_id\":\"n1\",\"model\":\"m\",\"seed\":1,\"path\":\"%s\",\"error\":null,"
             "\"components\":[{\"phrase\":\"a kimono\",\"p\":0.4,\"p_whole\":0.4,\"view\":0,\"entropy\":0.7}],"
             "\"context_sim\":0.2,\"generic_sim\":0.3}\n"
             "{\"image\":\"c.png\",\"prompt_id\":\"n1\",\"model\":\"m\",\"seed\":2,\"error\":\"c.png: <missing>\"}\n",
             test_join(d, "a.png"), test_join(d, "a.png"));
    CHECK_OK(kiln_write_file_atomic(test_join(run, "results/part-000000.jsonl"), part, strlen(part)));
    kiln_cis_score_opts o;
    kiln_cis_score_opts_default(&o);
    o.out_dir = run;
    CHECK_OK(kiln_cis_aggregate(&o));
    char *sj = slurp(test_join(run, "scores.json"));
    if (sj) {
        /* CIS: w1 = 1/2 (0.9 >= 0.5, 0.2 < 0.5), n1 = 0/1; gap = 0.5 */
        CHECK(strstr(sj, "\"gap\":\t0.5") != NULL);
        CHECK(strstr(sj, "\"misalignment\":\t0.05") != NULL || strstr(sj, "\"misalignment\":\t0.04999") != NULL);
    }
    free(sj);
    snprintf(html, sizeof html, "%s", test_join(d, "report.html"));
    CHECK_OK(kiln_cis_report(run, html));
    char *t = NULL, *l = NULL;
    int rc = test_chromium_dom(html, &t, &l);
    CHECK_MSG(rc == 0, "chromium --dump-dom exited with %d", rc);
    if (t) {
        CHECK_MSG(count_sub(t, "<svg") == 4, "DOM has %zu <svg> elements, want 4", count_sub(t, "<svg"));
        CHECK(count_sub(t, "class=\"bar\"") >= 2 + 6); /* 2 cultures, 3 x 2 gap bars */
        CHECK(count_sub(t, "<polyline") == 2);        /* fragility: one curve per group */
        CHECK(count_sub(t, "class=\"pt\"") == 2);     /* PCA points */
        CHECK(count_sub(t, "<figure") == 2);          /* examples: one per culture here */
        CHECK(strstr(t, "&lt;missing&gt;") != NULL);  /* the error, escaped */
        CHECK(strstr(t, "a sporran") != NULL);
    }
    if (l) {
        CHECK_MSG(!strstr(l, "Uncaught") && !strstr(l, ":CONSOLE("), "console errors in the page:\n%s", l);
        CHECK_MSG(!strstr(l, "net::ERR_"), "the page tried to load something missing:\n%s", l);
    }
    free(t), free(l);
}

/* A test-side RFC 4180 reader: the rows of text, each as its fields (quoted fields unquoted, ""
 * inside them one quote). Returns the number of rows; fields[r][f] and nf[r] filled up to cap rows. */
#define CSV_MAXF 32
static int csv_rows(const char *t, char fields[][CSV_MAXF][128], int *nf, int cap) {
    int r = 0;
    const char *p = t;
    while (*p && r < cap) {
        int f = 0;
        for (;;) {
            char buf[128];
            size_t n = 0;
            if (*p == '"') {
                for (p++; *p && !(*p == '"' && p[1] != '"'); p++) {
                    if (*p == '"') p++; /* "" */
                    if (n < sizeof buf - 1) buf[n++] = *p;
                }
                if (*p == '"') p++;
            } else {
                while (*p && *p != ',' && *p != '\n')
                    if (n < sizeof buf - 1) buf[n++] = *p++;
                    else p++;
            }
            buf[n] = 0;
            if (f < CSV_MAXF) snprintf(fields[r][f], 128, "%s", buf);
            f++;
            if (*p == ',') {
                p++;
                continue;
            }
            if (*p == '\n') p++;
            break;
        }
        nf[r++] = f;
    }
    return r;
}

static double jnum(const cJSON *o, const char *path1, const char *path2) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, path1);
    if (path2) x = cJSON_GetObjectItemCaseSensitive(x, path2);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}
static const char *jstr(const cJSON *o, const char *path1, const char *path2) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, path1);
    if (path2) x = cJSON_GetObjectItemCaseSensitive(x, path2);
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* What a resume keeps and refuses (the run's settings, suite, CLIP model and calibration; the
 * current manifest), options checked before scoring, CSV that CSV readers read, Ctrl-C while
 * aggregating. */
TEST(cis_resume_guards) {
    const char *d = test_tmpdir();
    char suite[512], suite2[512], clip[512], clip2[512], man[512], man2[512], labels[512], run[512], cmd[6144];
    static char out[16384];
    const char *lines[4] = {
        "{\"id\":\"w1\",\"prompt\":\"p w1\",\"culture\":\"Sc\\\"ot, tish\",\"group\":\"western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"haggis\"},{\"phrase\":\"a kilt\"}],\"complexity\":2}\n",
        "{\"id\":\"w2\",\"prompt\":\"p w2\",\"culture\":\"Italian\",\"group\":\"western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"pizza\"}],\"complexity\":1}\n",
        "{\"id\":\"n1\",\"prompt\":\"p n1\",\"culture\":\"Ethiopian\",\"group\":\"non_western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"injera\"},{\"phrase\":\"a mesob\"}],\"complexity\":2}\n",
        "{\"id\":\"n2\",\"prompt\":\"p n2\",\"culture\":\"Japanese\",\"group\":\"non_western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"sushi\"}],\"complexity\":1}\n"};
    snprintf(suite, sizeof suite, "%s", test_join(d, "suite.jsonl"));
    snprintf(suite2, sizeof suite2, "%s", test_join(d, "suite2.jsonl"));
    FILE *f = fopen(suite, "w");
    for (int i = 0; i < 4; i++) fputs(lines[i], f);
    fclose(f);
    snprintf(clip, sizeof clip, "%s", test_join(d, "clip"));
    snprintf(clip2, sizeof clip2, "%s", test_join(d, "clip2"));
    mkdir(clip, 0755), mkdir(clip2, 0755);
    if (clip_test_make_dir(clip, &clip_test_default, 2026) || clip_test_make_dir(clip2, &clip_test_default, 2027)) {
        CHECK_MSG(0, "could not write the tiny CLIPs");
        return;
    }
    mkdir(test_join(d, "img"), 0755);
    snprintf(man, sizeof man, "%s", test_join(d, "man.jsonl"));
    f = fopen(man, "w");
    const char *ids[4] = {"w1", "w2", "n1", "n2"};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            char rel[64];
            snprintf(rel, sizeof rel, "img/%s_%d.png", ids[i], k);
            write_png(test_join(d, rel), (uint64_t)(i * 2 + k), 36, 32);
            fprintf(f, "{\"image\": \"%s\", \"prompt_id\": \"%s\", \"model\": \"m\", \"seed\": %d}\n", rel, ids[i], k + 1);
        }
    fclose(f);
    snprintf(labels, sizeof labels, "%s", test_join(d, "labels.jsonl"));
    f = fopen(labels, "w");
    fputs("{\"image\": \"img/w1_0.png\", \"component\": \"haggis\", \"present\": true}\n", f);
    fputs("{\"image\": \"img/n1_0.png\", \"component\": \"injera\", \"present\": false}\n", f);
    fclose(f);
    snprintf(run, sizeof run, "%s", test_join(d, "run"));
    char base[2048];
    snprintf(base, sizeof base, "cis score --suite '%s' --manifest '%s' --out '%s' --threads 1 --chunk 3", suite, man, run);

    /* options are checked before anything is scored: a missing labels file, bad seeds */
    const char *early[][2] = {{"--labels /nonexistent/labels.jsonl", "/nonexistent/labels.jsonl"},
                              {"--seed -1", "--seed"},
                              {"--seed 9223372036854775807", "--seed"},
                              {"--seed 9007199254740993", "--seed"}};
    for (size_t i = 0; i < sizeof early / sizeof *early; i++) {
        snprintf(cmd, sizeof cmd, "%s --clip '%s' %s", base, clip, early[i][0]);
        int rc = test_run_kiln(cmd, out, sizeof out);
        struct stat st;
        CHECK_MSG(rc != 0 && strstr(out, early[i][1]) && stat(run, &st) != 0, "%s: rc %d, %s", early[i][0], rc, out);
    }
    /* a manifest seed beyond 2^53 would silently be another seed */
    snprintf(man2, sizeof man2, "%s", test_join(d, "man2.jsonl"));
    f = fopen(man2, "w");
    fputs("{\"image\": \"img/w1_0.png\", \"prompt_id\": \"w1\", \"model\": \"m\", \"seed\": 9007199254740993}\n", f);
    fclose(f);
    kiln_cis_manifest mm;
    CHECK_ERR(kiln_cis_manifest_load(man2, &mm), "man2.jsonl:1: seed");

    /* the run, then a resume without the options: the run's settings are kept */
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --crops 1,2 --threshold 0.1 --bootstrap 30 --permutations 40 --seed 7", base,
             clip);
    int rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    cJSON *rj = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run, "run.json"), &rj));
    CHECK_MSG(!strcmp(jstr(rj, "crops", NULL), "1,2") && jnum(rj, "threshold", NULL) == 0.1 &&
                  jnum(rj, "bootstrap", NULL) == 30 && jnum(rj, "permutations", NULL) == 40 && jnum(rj, "seed", NULL) == 7,
              "resume replaced the run's settings: crops %s threshold %g", jstr(rj, "crops", NULL),
              jnum(rj, "threshold", NULL));
    {
        kiln_clip *cm = NULL;
        CHECK_OK(kiln_clip_load(clip, &cm));
        CHECK_MSG(cm && !strcmp(jstr(rj, "clip_id", NULL), kiln_clip_id(cm)) && !strncmp(kiln_clip_id(cm), "xxh64:", 6),
                  "run.json clip_id %s", jstr(rj, "clip_id", NULL));
        kiln_clip_free(cm);
    }
    cJSON_Delete(rj);
    /* given with another value: refused, naming the option, both values and run.json */
    char *rj_before = slurp(test_join(run, "run.json"));
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume --crops 1,2,3", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "--crops 1,2,3") && strstr(out, "crops 1,2 (") && strstr(out, "run.json"), "%s", out);
    /* another CLIP model (same shapes, other weights) */
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip2);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "another CLIP model"), "%s", out);
    /* a changed suite: a renamed phrase, an added component; refused before anything is written */
    const char *variants[][2] = {{"\"haggis\"", "\"neeps\""}, {"{\"phrase\":\"pizza\"}],\"complexity\":1",
                                                               "{\"phrase\":\"pizza\"},{\"phrase\":\"wine\"}],\"complexity\":2"}};
    const char *want[] = {"components[0] phrase \"neeps\"", "prompt 'w2' has 2 components"};
    for (int v = 0; v < 2; v++) {
        f = fopen(suite2, "w");
        for (int i = 0; i < 4; i++) {
            const char *at = strstr(lines[i], variants[v][0]);
            if (!at) {
                fputs(lines[i], f);
                continue;
            }
            fwrite(lines[i], 1, (size_t)(at - lines[i]), f);
            fputs(variants[v][1], f);
            fputs(at + strlen(variants[v][0]), f);
        }
        fclose(f);
        snprintf(cmd, sizeof cmd, "cis score --suite '%s' --manifest '%s' --out '%s' --clip '%s' --resume", suite2, man,
                 run, clip);
        rc = test_run_kiln(cmd, out, sizeof out);
        CHECK_MSG(rc == 1 && strstr(out, want[v]) && strstr(out, "suite2.jsonl:"), "%s", out);
    }
    CHECK_MSG(rj_before && same_file(test_join(run, "suite.jsonl"), suite), "a refused resume rewrote the suite copy");
    char *rj_after = slurp(test_join(run, "run.json"));
    CHECK_MSG(rj_before && rj_after && !strcmp(rj_before, rj_after), "a refused resume rewrote run.json");
    free(rj_before), free(rj_after);

    /* a calibration survives a resume (here one that changes the resampling unit) */
    snprintf(cmd, sizeof cmd, "cis calibrate '%s' --labels '%s'", run, labels);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume --cluster scene", base, clip);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 0, "%s", out);
    cJSON *sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run, "scores.json"), &sc));
    CHECK_MSG(!strcmp(jstr(sc, "threshold_source", NULL), "calibrated") && jnum(sc, "calibration", "pairs") == 2,
              "threshold_source %s", jstr(sc, "threshold_source", NULL));
    CHECK(!strcmp(jstr(sc, "cluster", NULL), "scene"));
    cJSON_Delete(sc);

    /* CSV: every row as many fields as the header, the quoted culture back intact (components.csv has no
     * culture column), no null */
    const char *csvs[] = {"summary.csv", "images.csv", "components.csv", "superposition.csv"};
    static char fields[512][CSV_MAXF][128];
    static int nf[512];
    for (size_t c = 0; c < sizeof csvs / sizeof *csvs; c++) {
        char *t = slurp(test_join(run, csvs[c]));
        CHECK(t != NULL);
        if (!t) continue;
        int nr = csv_rows(t, fields, nf, 512), bad = 0, quoted = 0;
        for (int r = 1; r < nr; r++) {
            bad += nf[r] != nf[0];
            for (int k = 0; k < nf[r] && k < CSV_MAXF; k++) {
                quoted += !strcmp(fields[r][k], "Sc\"ot, tish");
                bad += !strcmp(fields[r][k], "null");
            }
        }
        CHECK_MSG(nr > 1 && !bad && (quoted || c == 2), "%s: %d rows, %d bad, %d with the culture", csvs[c], nr, bad, quoted);
        free(t);
    }

    /* a changed manifest: two images gone, one with another model: the gone ones are not counted, the
     * changed one is scored again */
    f = fopen(man, "w");
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            if (k == 1 && (i == 0 || i == 2)) continue;
            fprintf(f, "{\"image\": \"img/%s_%d.png\", \"prompt_id\": \"%s\", \"model\": \"%s\", \"seed\": %d}\n", ids[i],
                    k, ids[i], i == 1 && k == 0 ? "m2" : "m", k + 1);
        }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "1 image(s) of the run had another prompt_id, model or seed") &&
                  strstr(out, "img/w2_0.png"), "%s", out);
    sc = NULL;
    CHECK_OK(kiln_json_parse_file(test_join(run, "scores.json"), &sc));
    CHECK_MSG(jnum(sc, "counts", "images") == 6 && jnum(sc, "counts", "not_in_manifest") == 2, "%g images, %g dropped",
              jnum(sc, "counts", "images"), jnum(sc, "counts", "not_in_manifest"));
    int m2 = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(sc, "images")) m2 += !strcmp(jstr(x, "model", NULL), "m2");
    CHECK(m2 == 1);
    cJSON_Delete(sc);

    /* Ctrl-C while aggregating: stopped with the scored results kept, scores.json not half-written */
    {
        kiln_cis_score_opts o;
        kiln_cis_score_opts_default(&o);
        o.suite = suite, o.manifest = man, o.clip_dir = clip, o.out_dir = run, o.resume = 1;
        FILE *nul = fopen("/dev/null", "w");
        o.progress = nul;
        static volatile int one = 1;
        o.stop = &one;
        remove(test_join(run, "scores.json"));
        int ns, ne;
        CHECK_ERR(kiln_cis_score(&o, &ns, &ne), "interrupted while aggregating");
        struct stat st;
        CHECK(stat(test_join(run, "scores.json"), &st) != 0);
        CHECK(stat(test_join(run, "results/part-000000.jsonl"), &st) == 0);
        if (nul) fclose(nul);
        /* and the loops themselves give up */
        double xs[600], lo, hi;
        int cl[600];
        for (int i = 0; i < 600; i++) xs[i] = i % 7, cl[i] = i;
        cis_stop = &one;
        kiln_cis_bootstrap_mean(xs, cl, 600, 100000, 0.95, 1, &lo, &hi);
        cis_stop = NULL;
        CHECK(isnan(lo) && isnan(hi));
    }
}

/* The CLIP identity as kiln wrote it before kiln_clip_id (run.json's clip_id "fnv1a64:..."): FNV-1a 64
 * over the name (with its NUL), then size and FNV-1a of the contents (8 bytes each, little-endian), of
 * each .json, .txt and .safetensors file, in name order. */
static void legacy_clip_id(const char *dir, char *out, size_t cap) {
    char names[32][256];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && n < 32) {
        const char *ext = strrchr(de->d_name, '.');
        if (de->d_name[0] != '.' && ext && (!strcmp(ext, ".json") || !strcmp(ext, ".txt") || !strcmp(ext, ".safetensors")))
            snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char t[256];
                memcpy(t, names[i], sizeof t), memcpy(names[i], names[j], sizeof t), memcpy(names[j], t, sizeof t);
            }
    uint64_t h = KILN_FNV1A64_INIT;
    for (int i = 0; i < n; i++) {
        uint64_t fh = 0, size = 0;
        CHECK_OK(kiln_fnv1a64_file(test_join(dir, names[i]), &fh, &size));
        unsigned char b[16];
        for (int t = 0; t < 8; t++) b[t] = (unsigned char)(size >> (8 * t)), b[8 + t] = (unsigned char)(fh >> (8 * t));
        h = kiln_fnv1a64(h, names[i], strlen(names[i]) + 1);
        h = kiln_fnv1a64(h, b, sizeof b);
    }
    snprintf(out, cap, "fnv1a64:%016llx", (unsigned long long)h);
}

/* run.json's clip_id replaced by id (the rest kept) */
static void set_clip_id(const char *runjson, const char *id) {
    cJSON *rj = NULL;
    CHECK_OK(kiln_json_parse_file(runjson, &rj));
    if (!rj) return;
    cJSON_ReplaceItemInObjectCaseSensitive(rj, "clip_id", cJSON_CreateString(id));
    char *t = kiln_json_print(rj, 1);
    CHECK_OK(kiln_write_file_atomic(runjson, t, strlen(t)));
    free(t);
    cJSON_Delete(rj);
}

/* A resume checks the CLIP model against run.json's clip_id in the form the run has it: kiln_clip_id's
 * (xxh64:, hashed as the loader reads the weights), or the fnv1a64: of runs written before it (the files
 * read once more, then run.json records the new form); another form is refused with what to do. The
 * same model in another directory resumes. */
TEST(cis_resume_clip_identity_forms) {
    const char *d = test_tmpdir();
    char suite[512], clip[512], clip2[512], moved[512], man[512], run[512], cmd[4096], base[2048], legacy[40];
    static char out[16384];
    snprintf(suite, sizeof suite, "%s", test_join(d, "suite.jsonl"));
    FILE *f = fopen(suite, "w");
    fputs("{\"id\":\"w1\",\"prompt\":\"p w1\",\"culture\":\"Scottish\",\"group\":\"western\",\"category\":\"food\","
          "\"setting\":\"modern\",\"components\":[{\"phrase\":\"haggis\"}],\"complexity\":1}\n"
          "{\"id\":\"n1\",\"prompt\":\"p n1\",\"culture\":\"Ethiopian\",\"group\":\"non_western\",\"category\":"
          "\"food\",\"setting\":\"modern\",\"components\":[{\"phrase\":\"injera\"}],\"complexity\":1}\n",
          f);
    fclose(f);
    snprintf(clip, sizeof clip, "%s", test_join(d, "clip"));
    snprintf(clip2, sizeof clip2, "%s", test_join(d, "clip2"));
    snprintf(moved, sizeof moved, "%s", test_join(d, "moved"));
    mkdir(clip, 0755), mkdir(clip2, 0755), mkdir(moved, 0755);
    if (clip_test_make_dir(clip, &clip_test_default, 31) || clip_test_make_dir(clip2, &clip_test_default, 32)) {
        CHECK_MSG(0, "could not write the tiny CLIPs");
        return;
    }
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", clip, moved);
    CHECK(system(cmd) == 0);
    mkdir(test_join(d, "img"), 0755);
    snprintf(man, sizeof man, "%s", test_join(d, "man.jsonl"));
    f = fopen(man, "w");
    for (int i = 0; i < 2; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "img/%d.png", i);
        write_png(test_join(d, rel), (uint64_t)i, 36, 32);
        fprintf(f, "{\"image\": \"%s\", \"prompt_id\": \"%s\", \"model\": \"m\", \"seed\": 1}\n", rel, i ? "n1" : "w1");
    }
    fclose(f);
    snprintf(run, sizeof run, "%s", test_join(d, "run"));
    const char *rjp = test_join(run, "run.json");
    snprintf(base, sizeof base, "cis score --suite '%s' --manifest '%s' --out '%s' --threads 1 --bootstrap 20 "
             "--permutations 20", suite, man, run);
    snprintf(cmd, sizeof cmd, "%s --clip '%s'", base, clip);
    int rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    char *now_id = NULL;
    cJSON *rj = NULL;
    CHECK_OK(kiln_json_parse_file(rjp, &rj));
    if (!rj) return;
    now_id = strdup(jstr(rj, "clip_id", NULL));
    cJSON_Delete(rj);
    CHECK_MSG(!strncmp(now_id, "xxh64:", 6), "%s", now_id);

    /* the same model moved: resumes */
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, moved);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && !strstr(out, "older fnv1a64 form"), "rc %d: %s", rc, out);

    /* a run of the older form: the same model resumes (once checked by the old hash), run.json then holds
     * the new form */
    legacy_clip_id(clip, legacy, sizeof legacy);
    set_clip_id(rjp, legacy);
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "older fnv1a64 form"), "rc %d: %s", rc, out);
    rj = NULL;
    CHECK_OK(kiln_json_parse_file(rjp, &rj));
    CHECK_MSG(rj && !strcmp(jstr(rj, "clip_id", NULL), now_id), "run.json clip_id %s, want %s", rj ? jstr(rj, "clip_id", NULL) : "?",
              now_id);
    cJSON_Delete(rj);
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && !strstr(out, "older fnv1a64 form"), "rc %d: %s", rc, out);

    /* ... and another model is refused in either form, naming both ids, run.json untouched */
    char *before = NULL;
    for (int form = 0; form < 2; form++) {
        set_clip_id(rjp, form ? legacy : now_id);
        free(before);
        before = slurp(rjp);
        snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip2);
        rc = test_run_kiln(cmd, out, sizeof out);
        CHECK_MSG(rc == 1 && strstr(out, "another CLIP model") && strstr(out, form ? legacy : now_id) &&
                      strstr(out, form ? "(fnv1a64:" : "(xxh64:"),
                  "form %d: rc %d: %s", form, rc, out);
        char *after = slurp(rjp);
        CHECK_MSG(before && after && !strcmp(before, after), "a refused resume rewrote run.json");
        free(after);
    }
    /* a form this kiln does not know: refused, saying what to do */
    set_clip_id(rjp, "sha256:0123456789abcdef");
    snprintf(cmd, sizeof cmd, "%s --clip '%s' --resume", base, clip);
    rc = test_run_kiln(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "clip_id 'sha256:0123456789abcdef' is in a form this kiln does not know") &&
                  strstr(out, "score into a new --out"),
              "rc %d: %s", rc, out);
    free(before);
    free(now_id);
}
