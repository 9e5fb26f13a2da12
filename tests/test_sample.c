/* Next-token sampling (src/nn/sample.c) against HF generate's logits processors, written out here from their
 * definitions: temperature divides the logits; top-k removes every token scoring below the k-th score (ties
 * with it stay); top-p then takes a softmax over what is left and keeps the smallest set of the most likely
 * tokens whose mass reaches top_p (a token stays while the mass ranked above it is below top_p). Each case
 * draws N tokens and checks that only the kept tokens come out, at their renormalised probabilities within
 * 5 standard deviations of a binomial count. */
#include <math.h>
#include <stdlib.h>

#include "kiln/rng.h"
#include "kiln/sample.h"
#include "test.h"

enum { NDRAW = 40000 };

/* probs: the distribution the sampler must draw from (0 where removed) */
static void sample_case(const char *what, const double *p, int V, kiln_sample_opts o, const double *want) {
    float logits[16];
    for (int v = 0; v < V; v++) logits[v] = (float)(log(p[v]) * (o.temperature > 0 ? o.temperature : 1)) + 3.0f;
    kiln_sample_cand work[16];
    kiln_rng rng;
    kiln_rng_seed(&rng, 1234);
    int count[16] = {0};
    for (int i = 0; i < NDRAW; i++) {
        const int64_t id = kiln_sample(logits, V, &o, &rng, work);
        CHECK_MSG(id >= 0 && id < V, "%s: id %lld", what, (long long)id);
        if (id >= 0 && id < V) count[id]++;
    }
    for (int v = 0; v < V; v++) {
        const double f = (double)count[v] / NDRAW, sd = sqrt(want[v] * (1 - want[v]) / NDRAW);
        if (want[v] == 0) CHECK_MSG(count[v] == 0, "%s: token %d removed, drawn %d times", what, v, count[v]);
        else CHECK_MSG(fabs(f - want[v]) <= 5 * sd + 1e-12, "%s: token %d drawn at %.4f, want %.4f", what, v, f, want[v]);
    }
}

TEST(sample_top_k_then_top_p_renormalised) {
    /* top-2 leaves 0.5 and 0.3, renormalised 0.625 and 0.375: the first alone reaches top_p 0.6 (over the
     * whole vocabulary it would not, and the second token would stay) */
    const double p[4] = {0.5, 0.3, 0.15, 0.05}, want[4] = {1, 0, 0, 0};
    sample_case("top-k 2, top-p 0.6", p, 4, (kiln_sample_opts){1.0, 2, 0.6}, want);
    /* top-p 0.7 over the same two: the mass above the second is 0.625 < 0.7, so it stays */
    const double want2[4] = {0.625, 0.375, 0, 0};
    sample_case("top-k 2, top-p 0.7", p, 4, (kiln_sample_opts){1.0, 2, 0.7}, want2);
}

TEST(sample_top_k_keeps_ties) {
    /* the 2nd, 3rd and 4th scores are equal: top-k 2 removes nothing that scores as high as the 2nd */
    const double p[5] = {0.4, 0.15, 0.15, 0.15, 0.15};
    const double want[5] = {0.4, 0.15, 0.15, 0.15, 0.15};
    sample_case("top-k 2 with ties", p, 5, (kiln_sample_opts){1.0, 2, 1.0}, want);
    const double q[4] = {0.4, 0.3, 0.2, 0.1}, wq[4] = {0.4 / 0.7, 0.3 / 0.7, 0, 0};
    sample_case("top-k 2", q, 4, (kiln_sample_opts){1.0, 2, 1.0}, wq);
}

TEST(sample_top_p_temperature_greedy) {
    /* nucleus 0.9 of 0.5, 0.3, 0.15, 0.05: mass above the third is 0.8 < 0.9, above the fourth 0.95 */
    const double p[4] = {0.5, 0.3, 0.15, 0.05}, want[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    sample_case("top-p 0.9", p, 4, (kiln_sample_opts){1.0, 0, 0.9}, want);
    /* temperature 2 on logits built as 2*log(p): the softmax of log(p), that is p itself */
    const double all[4] = {0.5, 0.3, 0.15, 0.05};
    sample_case("temperature 2", p, 4, (kiln_sample_opts){2.0, 0, 1.0}, all);
    /* temperature 0: the argmax, always */
    const double g[4] = {1, 0, 0, 0};
    sample_case("greedy", p, 4, (kiln_sample_opts){0.0, 0, 1.0}, g);
}
