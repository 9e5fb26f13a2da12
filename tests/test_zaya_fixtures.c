/* kiln's ZAYA against HF transformers' ZayaForCausalLM: logits, loss and the gradient of
 * every parameter, on the fixtures made by tests/fixtures/make_zaya_fixtures.py (float64
 * ground truth). Tolerance: relative error <= 1e-4, measured per tensor as
 * max|kiln - ref| / max|ref| (elementwise relative error is meaningless where a gradient
 * entry is near zero). */
#include <math.h>
#include <stdlib.h>

#include "kiln/fsutil.h"
#include "kiln/safetensors.h"
#include "kiln/zaya.h"
#include "test.h"
#include "zaya_testutil.h"

static const char *fixtures[] = ZAYA_FIXTURES;
#define NFIX (sizeof fixtures / sizeof fixtures[0])
#define TOL 1e-4

static double rel_err(const float *got, const kiln_st_tensor *ref, float *buf) {
    if (kiln_st_read_f32(ref, buf, (size_t)ref->numel)) return INFINITY;
    double md = 0, mr = 0;
    for (int64_t i = 0; i < ref->numel; i++) {
        md = fmax(md, fabs((double)got[i] - buf[i]));
        mr = fmax(mr, fabs((double)buf[i]));
    }
    return mr > 0 ? md / mr : md;
}

/* Compare logits, loss and grads held in `got` (name -> pointer) with expected.safetensors. */
static void compare_fixture(const char *name) {
    char dir[1024], exp_path[1100];
    snprintf(dir, sizeof dir, "%s", test_src_path("tests/fixtures/zaya"));
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", name);
    snprintf(exp_path, sizeof exp_path, "%s/expected.safetensors", dir);
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    kiln_st *ex = NULL;
    int64_t *ids = NULL, B = 0, T = 0;
    double loss = 0;
    CHECK_OK(kiln_zaya_load_dir(dir, &m));
    CHECK_OK(zaya_fixture_read_ids(dir, &ids, &B, &T));
    CHECK_OK(kiln_st_open(exp_path, &ex));
    if (!m || !ids || !ex) goto done;
    CHECK_OK(kiln_zaya_acts_create(m, B, T, &a));
    CHECK_OK(kiln_zaya_forward(m, a, ids, NULL, &loss));
    CHECK_OK(kiln_zaya_backward(m, a, ids));
    float *buf = malloc(m->numel * sizeof(float) + (size_t)(B * T * m->cfg.vocab_size) * sizeof(float));
    const kiln_st_tensor *t = kiln_st_find(ex, "logits");
    CHECK(t != NULL);
    if (t) {
        double r = rel_err(kiln_zaya_acts_logits(a), t, buf);
        CHECK_MSG(r <= TOL, "%s: logits rel err %.3g", name, r);
    }
    t = kiln_st_find(ex, "loss");
    float ref_loss = 0;
    CHECK(t && !kiln_st_read_f32(t, &ref_loss, 1));
    CHECK_MSG(fabs(loss - ref_loss) <= TOL * fabs(ref_loss), "%s: loss %.7f vs reference %.7f", name, loss, ref_loss);
    int ngrad = 0;
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->nparams; i++) {
        char gname[128];
        snprintf(gname, sizeof gname, "grad.%s", m->params[i].name);
        t = kiln_st_find(ex, gname);
        CHECK_MSG(t != NULL, "%s: reference has no %s", name, gname);
        if (!t) continue;
        CHECK_MSG(t->numel == m->params[i].numel, "%s: %s size", name, gname);
        if (t->numel != m->params[i].numel) continue;
        double r = rel_err(m->g + m->params[i].offset, t, buf);
        CHECK_MSG(r <= TOL, "%s: %s rel err %.3g", name, gname, r);
        if (r > worst) worst = r, worst_name = m->params[i].name;
        ngrad++;
    }
    /* and the reference has no parameter we lack */
    int nref = 0;
    for (size_t i = 0; i < kiln_st_count(ex); i++) nref += !strncmp(kiln_st_at(ex, i)->name, "grad.", 5);
    CHECK_MSG(nref == ngrad, "%s: reference has %d gradients, kiln %d", name, nref, ngrad);
    printf("    %s: loss %.6f, %d gradients, worst rel err %.2e (%s)\n", name, loss, ngrad, worst, worst_name);
    free(buf);
done:
    free(ids);
    kiln_st_close(ex);
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
}

TEST(fixture_gqa_untied) { compare_fixture("gqa_untied"); }
TEST(fixture_sliding_tied) { compare_fixture("sliding_tied"); }
TEST(fixture_bf16_sharded) { compare_fixture("bf16_sharded"); }
TEST(fixture_many_experts) { compare_fixture("many_experts"); }

/* The CLI contract: kiln logits --grads writes the same numbers, under the contract's names. */
TEST(fixture_cli_logits_grads) {
    for (size_t f = 0; f < NFIX; f++) {
        char dir[1024], args[4096], out[8192], outp[600];
        snprintf(dir, sizeof dir, "%s/%s", test_src_path("tests/fixtures/zaya"), fixtures[f]);
        snprintf(outp, sizeof outp, "%s/out.safetensors", test_tmpdir());
        snprintf(args, sizeof args, "logits --model '%s' --input '%s/input.safetensors' --out '%s' --grads", dir, dir, outp);
        int rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 0, "kiln %s -> %d: %s", args, rc, out);
        kiln_st *got = NULL, *ex = NULL;
        char ep[1100];
        snprintf(ep, sizeof ep, "%s/expected.safetensors", dir);
        CHECK_OK(kiln_st_open(outp, &got));
        CHECK_OK(kiln_st_open(ep, &ex));
        if (!got || !ex) { kiln_st_close(got); kiln_st_close(ex); continue; }
        CHECK_MSG(kiln_st_count(got) == kiln_st_count(ex), "%s: %zu tensors written, reference has %zu", fixtures[f],
                  kiln_st_count(got), kiln_st_count(ex));
        for (size_t i = 0; i < kiln_st_count(ex); i++) {
            const kiln_st_tensor *r = kiln_st_at(ex, i), *g = kiln_st_find(got, r->name);
            CHECK_MSG(g != NULL, "%s: output lacks %s", fixtures[f], r->name);
            if (!g) continue;
            CHECK_MSG(g->dtype == KILN_DT_F32 && g->ndim == r->ndim, "%s: %s dtype/rank", fixtures[f], r->name);
            for (int d = 0; d < r->ndim && d < g->ndim; d++) CHECK(g->shape[d] == r->shape[d]);
            float *gv = malloc((size_t)g->numel * sizeof(float)), *buf = malloc((size_t)r->numel * sizeof(float));
            if (g->numel == r->numel && !kiln_st_read_f32(g, gv, (size_t)g->numel)) {
                double e = rel_err(gv, r, buf);
                CHECK_MSG(e <= TOL, "%s: %s rel err %.3g", fixtures[f], r->name, e);
            }
            free(gv);
            free(buf);
        }
        kiln_st_close(got);
        kiln_st_close(ex);
    }
}
