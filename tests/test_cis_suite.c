/* The CIS prompt suite, run manifests and generation worklists. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/cis.h"
#include "kiln/fsutil.h"
#include "test.h"

TEST(cis_shipped_suite) {
    kiln_cis_suite s;
    CHECK_OK(kiln_cis_suite_load(test_src_path("data/cis/suite.jsonl"), &s));
    if (!s.n) return;
    CHECK(s.n >= 240);
    const char *cultures[64];
    int nc = 0, west = 0, cx[6] = {0}, hist = 0;
    for (int i = 0; i < s.n; i++) {
        const kiln_cis_prompt *p = &s.p[i];
        int seen = 0;
        for (int j = 0; j < nc; j++) seen |= !strcmp(cultures[j], p->culture);
        if (!seen && nc < 64) cultures[nc++] = p->culture;
        west += p->western;
        CHECK(p->ncomp >= 1 && p->ncomp <= 5);
        cx[p->ncomp]++;
        hist += !strcmp(p->setting, "historical");
        CHECK(p->generic_context != NULL);
        /* every scene has a variant in the other setting with the same components */
        int twin = 0;
        for (int j = 0; j < s.n; j++)
            if (!strcmp(s.p[j].scene, p->scene) && strcmp(s.p[j].setting, p->setting) && s.p[j].ncomp == p->ncomp &&
                !strcmp(s.p[j].comp[p->ncomp - 1].phrase, p->comp[p->ncomp - 1].phrase))
                twin = 1;
        CHECK_MSG(twin, "prompt %s has no variant in the other setting", p->id);
    }
    CHECK(nc >= 12);
    CHECK(west * 2 == s.n);
    CHECK(hist * 2 == s.n);
    for (int k = 1; k <= 5; k++) CHECK(cx[k] > 0);
    CHECK(kiln_cis_suite_find(&s, "eth-meal-h1") >= 0 && kiln_cis_suite_find(&s, "nope") == -1);
    kiln_cis_suite_free(&s);
}

static kiln_error *parse(const char *text) {
    kiln_cis_suite s;
    kiln_error *e = kiln_cis_suite_parse(text, strlen(text), "s.jsonl", &s);
    if (!e) kiln_cis_suite_free(&s);
    return e;
}

#define P_HEAD "{\"id\":\"a\",\"prompt\":\"p\",\"culture\":\"c\",\"group\":\"western\",\"category\":\"food\",\"setting\":\"modern\","
TEST(cis_suite_errors) {
    CHECK_OK(parse(P_HEAD "\"components\":[{\"phrase\":\"x\",\"generic\":\"y\",\"coco\":\"bowl\"}],\"complexity\":1}\n\n"));
    CHECK_ERR(parse("\n" P_HEAD "\"components\":[],\"complexity\":0}"), "s.jsonl:2: prompt 'a' has zero components");
    CHECK_ERR(parse(P_HEAD "\"components\":[{\"phrase\":\"x\"}],\"complexity\":2}"),
              "s.jsonl:1: prompt 'a': complexity 2 does not match its 1 components");
    CHECK_ERR(parse(P_HEAD "\"components\":[{\"phrase\":\"x\"}],\"complexity\":1,\"colour\":1}"),
              "s.jsonl:1: unknown field 'colour'");
    CHECK_ERR(parse(P_HEAD "\"components\":[{\"phrase\":\"x\",\"size\":2}],\"complexity\":1}"),
              "components[0]: unknown field 'size'");
    CHECK_ERR(parse(P_HEAD "\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}\n" P_HEAD
                           "\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}"),
              "s.jsonl:2: duplicate prompt id 'a' (first on line 1)");
    CHECK_ERR(parse("{\"id\":\"a\",\"prompt\":\"p\",\"culture\":\"c\",\"group\":\"west\",\"category\":\"f\",\"setting\":"
                    "\"modern\",\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}"),
              "group must be");
    CHECK_ERR(parse(P_HEAD "\"components\":[{\"phrase\":\"x\"}]}"), "complexity");
    CHECK_ERR(parse("[1]"), "s.jsonl:1: expected a JSON object");
    CHECK_ERR(parse("{\"id\": "), "s.jsonl:1");
    CHECK_ERR(parse(""), "no prompts");
    /* ids name the worklist's files: none may lead out of images/<model>/ */
    CHECK_ERR(parse("\n{\"id\":\"../../x\",\"prompt\":\"p\",\"culture\":\"c\",\"group\":\"western\",\"category\":\"f\","
                    "\"setting\":\"modern\",\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}"),
              "s.jsonl:2: prompt id '../../x' must not contain '/'");
}

/* kiln cis prompts refuses model names it would drop or that score would reject, before writing */
TEST(cis_prompts_model_names) {
    const char *d = test_tmpdir();
    char suite[512], wl[512], cmd[8192], out[4096];
    snprintf(suite, sizeof suite, "%s", test_join(d, "s.jsonl"));
    snprintf(wl, sizeof wl, "%s", test_join(d, "w.jsonl"));
    const char *one = P_HEAD "\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}\n";
    CHECK_OK(kiln_write_file_atomic(suite, one, strlen(one)));
    char many[4096] = "";
    for (int i = 0; i < 257; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%sm%d", i ? "," : "", i);
    const char *bad[][2] = {{"sd21,sd21", "is given twice"}, {"a,,b", "is empty"}, {"a,", "is empty"},
                            {many, "one more than the 256"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "cis prompts --suite '%s' --images-per-prompt 1 --models '%s' --out '%s'", suite,
                 bad[i][0], wl);
        int rc = test_run_kiln(cmd, out, sizeof out);
        struct stat st;
        CHECK_MSG(rc == 2 && strstr(out, bad[i][1]) && stat(wl, &st) != 0, "%.40s: rc %d %s", bad[i][0], rc, out);
    }
    snprintf(cmd, sizeof cmd, "cis prompts --suite '%s' --images-per-prompt 1 --models a,b --out '%s'", suite, wl);
    CHECK(test_run_kiln(cmd, out, sizeof out) == 0);
    /* --out naming the suite itself: refused, the suite kept (the worklist replaced it) */
    snprintf(cmd, sizeof cmd, "cis prompts --suite '%s' --images-per-prompt 1 --out '%s/./s.jsonl'", suite, d);
    CHECK_MSG(test_run_kiln(cmd, out, sizeof out) == 2 && strstr(out, "is the suite itself"), "%s", out);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(suite, &text, &len));
    CHECK(text && len == strlen(one) && !memcmp(text, one, len));
    free(text);
}

TEST(cis_worklist_and_manifest) {
    kiln_cis_suite s;
    const char *one = P_HEAD "\"components\":[{\"phrase\":\"x\"}],\"complexity\":1}\n";
    CHECK_OK(kiln_cis_suite_parse(one, strlen(one), "s", &s));
    const char *d = test_tmpdir();
    char wl[512];
    snprintf(wl, sizeof wl, "%s", test_join(d, "work.jsonl"));
    const char *models[] = {"sd21", "rv14"};
    CHECK_OK(kiln_cis_worklist_write(&s, 3, models, 2, wl));
    CHECK_ERR(kiln_cis_worklist_write(&s, 0, models, 2, wl), "images per prompt");
    const char *badm[] = {"a/b"};
    CHECK_ERR(kiln_cis_worklist_write(&s, 1, badm, 1, wl), "a/b");
    kiln_cis_manifest m;
    CHECK_OK(kiln_cis_manifest_load(wl, &m)); /* a worklist is a manifest */
    CHECK(m.n == 6);
    if (m.n == 6) {
        CHECK(!strcmp(m.items[4].image, "images/rv14/a_1.png"));
        CHECK(!strcmp(m.items[4].path, test_join(d, "images/rv14/a_1.png")));
        CHECK(!strcmp(m.items[4].model, "rv14"));
        CHECK(m.items[4].seed == kiln_cis_seed("a", 1) && m.items[1].seed == m.items[4].seed);
        CHECK(m.items[0].seed != m.items[1].seed);
    }
    kiln_cis_manifest_free(&m);
    kiln_cis_suite_free(&s);
    CHECK(kiln_cis_seed("eth-meal-h1", 0) == kiln_cis_seed("eth-meal-h1", 0));
    CHECK(kiln_cis_seed("eth-meal-h1", 0) >= 0 && kiln_cis_seed("eth-meal-h1", 0) <= 0x7fffffff);

    char mp[512];
    snprintf(mp, sizeof mp, "%s", test_join(d, "m.jsonl"));
    const char *dup = "{\"image\":\"x.png\",\"prompt_id\":\"a\",\"model\":\"m\",\"seed\":1}\n"
                      "{\"image\":\"x.png\",\"prompt_id\":\"a\",\"model\":\"m\",\"seed\":2}\n";
    CHECK_OK(kiln_write_file_atomic(mp, dup, strlen(dup)));
    CHECK_ERR(kiln_cis_manifest_load(mp, &m), "m.jsonl:2: image 'x.png' is listed twice (first on line 1)");
    const char *bad = "{\"image\":\"x.png\",\"prompt_id\":\"a\",\"model\":\"m\",\"seed\":1,\"steps\":30}\n";
    CHECK_OK(kiln_write_file_atomic(mp, bad, strlen(bad)));
    CHECK_ERR(kiln_cis_manifest_load(mp, &m), "m.jsonl:1: unknown field 'steps'");
    const char *noseed = "{\"image\":\"x.png\",\"prompt_id\":\"a\",\"model\":\"m\"}\n";
    CHECK_OK(kiln_write_file_atomic(mp, noseed, strlen(noseed)));
    CHECK_ERR(kiln_cis_manifest_load(mp, &m), "seed");
}

#include "cis/textset.h"

/* The judge's texts: component, generic counterpart, absence phrase, and the component in the same
 * position of other cultures' scenes of the same category (not the same culture's, not other
 * categories'). */
TEST(cis_contrast_sets) {
    const char *text =
        "{\"id\":\"e1\",\"prompt\":\"p\",\"culture\":\"Ethiopian\",\"group\":\"non_western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"context\":\"a photo of an Ethiopian meal\",\"generic_context\":\"a photo of a meal\","
        "\"components\":[{\"phrase\":\"injera\",\"generic\":\"flatbread\"},{\"phrase\":\"doro wat\"}],\"complexity\":2}\n"
        "{\"id\":\"e2\",\"prompt\":\"p\",\"culture\":\"Ethiopian\",\"group\":\"non_western\",\"category\":\"food\","
        "\"setting\":\"historical\",\"components\":[{\"phrase\":\"shiro\"}],\"complexity\":1}\n"
        "{\"id\":\"s1\",\"prompt\":\"p\",\"culture\":\"Scottish\",\"group\":\"western\",\"category\":\"food\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"haggis\",\"generic\":\"flatbread\"}],\"complexity\":1}\n"
        "{\"id\":\"s2\",\"prompt\":\"p\",\"culture\":\"Scottish\",\"group\":\"western\",\"category\":\"attire\","
        "\"setting\":\"modern\",\"components\":[{\"phrase\":\"a kilt\"},{\"phrase\":\"a sporran\"}],\"complexity\":2}\n";
    kiln_cis_suite s;
    CHECK_OK(kiln_cis_suite_parse(text, strlen(text), "s", &s));
    if (s.n != 4) return;
    cis_textset ts;
    CHECK_OK(cis_textset_build(&s, &ts));
    const cis_comp_texts *inj = &ts.pc[0][0];
    CHECK(!strcmp(ts.text[inj->text], "a photo of injera"));
    CHECK(inj->generic >= 0 && !strcmp(ts.text[inj->generic], "a photo of flatbread"));
    CHECK(inj->ncontrast == 3); /* flatbread, "a photo", haggis (not shiro: same culture; not a kilt: attire) */
    if (inj->ncontrast == 3) {
        CHECK(!strcmp(ts.text[inj->contrast[0]], "a photo of flatbread"));
        CHECK(!strcmp(ts.text[inj->contrast[1]], CIS_ABSENCE_TEXT));
        CHECK(!strcmp(ts.text[inj->contrast[2]], "a photo of haggis"));
    }
    const cis_comp_texts *wat = &ts.pc[0][1]; /* position 1: no other culture has one in food */
    CHECK(wat->generic == -1 && wat->ncontrast == 1 && !strcmp(ts.text[wat->contrast[0]], CIS_ABSENCE_TEXT));
    const cis_comp_texts *hag = &ts.pc[2][0]; /* haggis: both Ethiopian first components */
    CHECK(hag->ncontrast == 4); /* flatbread, "a photo", injera, shiro */
    CHECK(!strcmp(ts.text[ts.context[0]], "a photo of an Ethiopian meal"));
    CHECK(!strcmp(ts.text[ts.generic_context[0]], "a photo of a meal"));
    CHECK(!strcmp(ts.text[ts.context[1]], "a photo of p") && ts.generic_context[1] == -1);
    /* every text once */
    for (int i = 0; i < ts.ntext; i++)
        for (int j = 0; j < i; j++) CHECK(strcmp(ts.text[i], ts.text[j]));
    cis_textset_free(&ts, &s);
    kiln_cis_suite_free(&s);
}
