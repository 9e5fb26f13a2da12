/* ZAYA on the CPU: gradients against finite differences, cached decoding against full
 * recomputation, and (test_zaya_fixtures.c) everything against HF transformers' numbers. */
#include <math.h>
#include <stdlib.h>

#include "kiln/rng.h"
#include "kiln/zaya.h"
#include "test.h"
#include "zaya_testutil.h"

static void random_ids(int64_t *ids, int64_t n, int64_t V, uint64_t seed) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) ids[i] = (int64_t)(kiln_rng_u64(&r) % (uint64_t)V);
}

/* Directional derivative of the loss along a random direction in each parameter tensor in turn:
 * central differences in f32 vs g.u. Catches any backward term that is wrong or missing.
 * (Moving all tensors at once flips routing decisions, which are not differentiable.)
 * Tolerance: 2% relative plus 1e-3 absolute, the f32 rounding of the loss over 2h. */
static void grad_check(int sliding, float skip_bias, uint64_t seed) {
    kiln_zaya_config c;
    tiny_config(&c, sliding);
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    if (!m) return;
    perturb_params(m, seed, skip_bias);
    const int64_t B = 2, T = 7;
    int64_t ids[14];
    random_ids(ids, B * T, c.vocab_size, seed + 1);
    CHECK_OK(kiln_zaya_acts_create(m, B, T, &a));
    double loss0;
    CHECK_OK(kiln_zaya_forward(m, a, ids, NULL, &loss0));
    CHECK_OK(kiln_zaya_backward(m, a, ids));
    float *w0 = malloc(m->numel * sizeof(float));
    memcpy(w0, m->w, m->numel * sizeof(float));
    kiln_rng r;
    kiln_rng_seed(&r, seed + 2);
    int bad = 0;
    for (int p = 0; p < m->nparams; p++) {
        const kiln_param_info *pi = &m->params[p];
        float *w = m->w + pi->offset, *u = malloc((size_t)pi->numel * sizeof(float));
        double gu = 0, lp, lm;
        for (int64_t j = 0; j < pi->numel; j++) {
            u[j] = (float)kiln_rng_normal(&r);
            gu += (double)m->g[pi->offset + j] * u[j];
        }
        const double h = 1e-3;
        for (int64_t j = 0; j < pi->numel; j++) w[j] = w0[pi->offset + j] + (float)h * u[j];
        CHECK_OK(kiln_zaya_forward(m, a, ids, NULL, &lp));
        for (int64_t j = 0; j < pi->numel; j++) w[j] = w0[pi->offset + j] - (float)h * u[j];
        CHECK_OK(kiln_zaya_forward(m, a, ids, NULL, &lm));
        memcpy(w, w0 + pi->offset, (size_t)pi->numel * sizeof(float));
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - gu) > 2e-2 * fabs(gu) + 1e-3) {
            bad++;
            test_fail(__FILE__, __LINE__, "%s: finite difference %.6g vs analytic %.6g", pi->name, fd, gu);
        }
        free(u);
    }
    CHECK(bad == 0);
    free(w0);
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
}

TEST(zaya_grad_matches_finite_differences) { grad_check(0, -1.0f, 11); }
TEST(zaya_grad_matches_finite_differences_sliding_skip) { grad_check(1, 0.0f, 12); }

/* Feeding tokens through the decode cache in chunks gives the logits of one full pass. */
static void decode_check(int sliding, const int64_t *chunks, int nchunks) {
    kiln_zaya_config c;
    tiny_config(&c, sliding);
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    kiln_zaya_cache *k = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    if (!m) return;
    perturb_params(m, 21, 0.0f);
    const int64_t B = 2, T = 11, V = c.vocab_size;
    int64_t ids[22];
    random_ids(ids, B * T, V, 22);
    float *full = malloc((size_t)(B * T * V) * sizeof(float)), *part = malloc((size_t)(B * T * V) * sizeof(float));
    CHECK_OK(kiln_zaya_acts_create(m, B, T, &a));
    CHECK_OK(kiln_zaya_forward(m, a, ids, full, NULL));
    CHECK_OK(kiln_zaya_cache_create(m, B, T, &k));
    int64_t pos = 0;
    double maxd = 0, maxv = 0;
    for (int ci = 0; ci < nchunks; ci++) {
        int64_t n = chunks[ci];
        int64_t cid[22];
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++) cid[b * n + t] = ids[b * T + pos + t];
        CHECK_OK(kiln_zaya_decode(m, k, cid, n, part));
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++)
                for (int64_t v = 0; v < V; v++) {
                    double x = full[(b * T + pos + t) * V + v], y = part[(b * n + t) * V + v];
                    maxd = fmax(maxd, fabs(x - y));
                    maxv = fmax(maxv, fabs(x));
                }
        pos += n;
    }
    CHECK(pos == T && kiln_zaya_cache_pos(k) == T);
    CHECK_MSG(maxd <= 1e-5 * maxv, "cached vs full logits differ by %g (max |logit| %g)", maxd, maxv);
    /* one more token than the cache holds is an error, not an overflow */
    CHECK_ERR(kiln_zaya_decode(m, k, ids, 1, part), "capacity");
    free(full);
    free(part);
    kiln_zaya_cache_free(k);
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
}

TEST(zaya_decode_token_by_token_matches_full) {
    int64_t ones[11] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    decode_check(0, ones, 11);
}
TEST(zaya_decode_chunks_sliding_matches_full) {
    int64_t ch[4] = {4, 1, 5, 1};
    decode_check(1, ch, 4);
}

TEST(zaya_rejects_out_of_vocab_ids) {
    kiln_zaya_config c;
    tiny_config(&c, 0);
    kiln_zaya *m = NULL;
    kiln_zaya_acts *a = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    CHECK_OK(kiln_zaya_acts_create(m, 1, 3, &a));
    int64_t ids[3] = {1, 40, 2};
    CHECK_ERR(kiln_zaya_forward(m, a, ids, NULL, NULL), "token id 40 at position 1");
    ids[1] = -3;
    CHECK_ERR(kiln_zaya_forward(m, a, ids, NULL, NULL), "token id -3");
    kiln_zaya_acts_free(a);
    kiln_zaya_free(m);
}

/* Bad numbers in config.json are errors naming the field, before any arithmetic on them (the fuzz targets found a
 * partial_rotary_factor of 3e46 and an eos_token_id list entry of 1e39 converted to integers, and an out-of-range
 * rope_theta read as inf). */
TEST(zaya_config_bad_rope_numbers) {
    kiln_zaya_config c;
    static const char *bad[][2] = {
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": 3e46}}}", "partial_rotary_factor = 3e+46 must be in (0, 1]"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": 0}}}", "partial_rotary_factor = 0 must be in (0, 1]"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": -0.5}}}", "must be in (0, 1]"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": 1.5}}}", "must be in (0, 1]"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": 0.001}}}", "gives 0 rotary channels"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"rope_theta\": 0}}}", "rope_theta must be positive"},
        {"{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"rope_theta\": 04e596}}}", "rope_parameters.hybrid.rope_theta is beyond the range"},
        {"{\"model_type\": \"zaya\", \"eos_token_id\": [1e39, 2]}", "field 'eos_token_id' must hold non-negative integers"},
        {"{\"model_type\": \"zaya\", \"eos_token_id\": [1.5]}", "must hold non-negative integers"},
        {"{\"model_type\": \"zaya\", \"eos_token_id\": [-3]}", "must hold non-negative integers"},
        {"{\"model_type\": \"zaya\", \"bos_token_id\": -5}", "field 'bos_token_id' = -5 must be a token id, -1 or null"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kiln_zaya_config_default(&c);
        CHECK_ERR(kiln_zaya_config_parse(bad[i][0], "cfg", &c), bad[i][1]);
    }
    kiln_zaya_config_default(&c);
    CHECK_OK(kiln_zaya_config_parse("{\"model_type\": \"zaya\", \"rope_parameters\": {\"hybrid\": {\"partial_rotary_factor\": 1}}}", "cfg", &c));
    CHECK(c.partial_rotary[KILN_LAYER_HYBRID] == 1.0);
    CHECK_OK(kiln_zaya_config_parse("{\"model_type\": \"zaya\", \"eos_token_id\": [106, 1]}", "cfg", &c));
    CHECK(c.eos_token_id == 106);
    CHECK_OK(kiln_zaya_config_parse("{\"model_type\": \"zaya\", \"pad_token_id\": -1}", "cfg", &c));
    CHECK(c.pad_token_id == -1);
}
