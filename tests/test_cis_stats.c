/* CIS statistics and the judge's arithmetic against hand-computed values. */
#include <math.h>
#include <stdlib.h>

#include "kiln/cis.h"
#include "kiln/rng.h"
#include "test.h"

TEST(cis_perm_exact_hand) {
    /* x = 1,2 | 3,4: d = -2; of the 6 relabellings, {1,2} and {3,4} reach |d| = 2 */
    double x[] = {1, 2, 3, 4}, d, p;
    int g[] = {1, 1, 0, 0};
    kiln_cis_perm_test_exact(x, g, NULL, 4, &d, &p);
    CHECK_NEAR(d, -2, 1e-12);
    CHECK_NEAR(p, 2.0 / 6, 1e-12);
    int g2[] = {1, 0, 1, 0}; /* 1,3 | 2,4: d = -1; |d*| >= 1 for 4 of 6 */
    kiln_cis_perm_test_exact(x, g2, NULL, 4, &d, &p);
    CHECK_NEAR(d, -1, 1e-12);
    CHECK_NEAR(p, 4.0 / 6, 1e-12);
}

TEST(cis_perm_random_matches_exact) {
    /* C(16, 8) = 12870 relabellings: 10000 permutations are drawn, not enumerated */
    double x[16] = {0.2, 0.4, 1, 0.6, 0.8, 0.5, 0.1, 0, 0.3, 0.25, 0.7, 0.9, 0.45, 0.15, 0.35, 0.65}, d, p, de, pe;
    int g[16] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    kiln_cis_perm_test_exact(x, g, NULL, 16, &de, &pe);
    CHECK(kiln_cis_perm_test(x, g, NULL, 16, 10000, 7, &d, &p) == 0);
    CHECK_NEAR(d, de, 1e-12);
    /* binomial sd of the estimate: sqrt(p(1-p)/10000) < 0.005 */
    CHECK_NEAR(p, pe, 0.02);
    double d2, p2;
    kiln_cis_perm_test(x, g, NULL, 16, 10000, 7, &d2, &p2);
    CHECK(p2 == p); /* seeded */
    /* as many permutations as relabellings: every one is counted, the exact p-value */
    CHECK(kiln_cis_perm_test(x, g, NULL, 16, 12870, 7, &d2, &p2) == 1);
    CHECK(p2 == pe);
    int none[16] = {0};
    CHECK(kiln_cis_perm_test(x, none, NULL, 16, 100, 7, &d, &p) == -1);
    CHECK(isnan(p));
}

TEST(cis_signflip_hand) {
    /* d = 1, 2, 3: the 8 sign patterns sum to +-6, +-4, +-2, 0, 0; |sum| >= 6 for 2 of them */
    double d[3] = {1, 2, 3}, mean, p;
    CHECK(kiln_cis_signflip_test(d, 3, 8, 1, &mean, &p) == 1);
    CHECK_NEAR(mean, 2, 1e-15);
    CHECK_NEAR(p, 2.0 / 8, 1e-15);
    double z[2] = {1, -1}; /* sum 0: every pattern is at least as far out */
    CHECK(kiln_cis_signflip_test(z, 2, 100, 1, &mean, &p) == 1 && p == 1);
    /* 2^16 patterns, 20000 drawn: close to the exact p (sd ~0.0018) */
    kiln_rng r;
    kiln_rng_seed(&r, 12);
    double e[16], pe, ps;
    for (int i = 0; i < 16; i++) e[i] = kiln_rng_normal(&r) + 0.15; /* exact p ~0.068 */
    CHECK(kiln_cis_signflip_test(e, 16, 1 << 16, 1, &mean, &pe) == 1);
    CHECK(kiln_cis_signflip_test(e, 16, 20000, 1, &mean, &ps) == 0);
    CHECK_MSG(fabs(ps - pe) < 0.015 && pe > 0.01 && pe < 0.9, "sampled %g, exact %g", ps, pe);
    CHECK(kiln_cis_signflip_test(e, 0, 100, 1, &mean, &p) == -1 && isnan(p));
}

TEST(cis_holm_hand) {
    /* sorted 0.01, 0.03, 0.04, 0.5 of m = 4: 4 x 0.01, 3 x 0.03, max(0.09, 2 x 0.04), 0.5; NaN is out */
    double p[] = {0.01, 0.04, NAN, 0.03, 0.5}, a[5];
    kiln_cis_holm(p, 5, a);
    CHECK_NEAR(a[0], 0.04, 1e-15);
    CHECK_NEAR(a[1], 0.09, 1e-15);
    CHECK(isnan(a[2]));
    CHECK_NEAR(a[3], 0.09, 1e-15);
    CHECK_NEAR(a[4], 0.5, 1e-15);
    double q[] = {0.6, 0.4}, b[2]; /* 2 x 0.4 = 0.8, then max(0.8, 0.6) */
    kiln_cis_holm(q, 2, b);
    CHECK_NEAR(b[0], 0.8, 1e-15);
    CHECK_NEAR(b[1], 0.8, 1e-15);
    double one = 0.3, c;
    kiln_cis_holm(&one, 1, &c);
    CHECK(c == 0.3);
}

TEST(cis_cluster_perm_exact_hand) {
    /* clusters A = {1, 1} and B = {2} western, C = {3, 3, 3} and D = {4} not, interleaved, with
     * arbitrary ids. d = 4/3 - 13/4 = -23/12; of the C(4, 2) = 6 relabellings of the clusters only
     * {A, B} and {C, D} reach |d|. Per image it would be C(7, 3) = 35 relabellings. */
    double x[7] = {1, 3, 2, 1, 3, 4, 3}, d, p, pp;
    int g[7] = {1, 0, 1, 1, 0, 0, 0}, cl[7] = {70, 90, 3, 70, 90, 1, 90};
    CHECK(kiln_cis_nclusters(cl, 7) == 4);
    CHECK(kiln_cis_nclusters(NULL, 7) == 7);
    kiln_cis_perm_test_exact(x, g, cl, 7, &d, &p);
    CHECK_NEAR(d, -23.0 / 12, 1e-12);
    CHECK_NEAR(p, 2.0 / 6, 1e-12);
    CHECK(kiln_cis_perm_test(x, g, cl, 7, 6, 1, &d, &pp) == 1 && pp == p);
    CHECK(kiln_cis_perm_test(x, g, cl, 7, 5, 1, &d, &pp) == 0 && pp >= 1.0 / 6);
    /* per image d(S) = (7 s - 51) / 12 for a 3-subset of sum s: only {1, 1, 2} (s = 4) reaches |d|,
     * 1 of 35; the same data look far more significant when its images count as independent */
    kiln_cis_perm_test_exact(x, g, NULL, 7, &d, &pp);
    CHECK_NEAR(pp, 1.0 / 35, 1e-12);
    CHECK_NEAR(d, -23.0 / 12, 1e-12);
    /* a cluster holding both groups: no p-value, the difference still reported */
    int mixed[7] = {70, 90, 3, 90, 90, 1, 90};
    CHECK(kiln_cis_perm_test(x, g, mixed, 7, 100, 1, &d, &p) == -1);
    CHECK(isnan(p) && fabs(d + 23.0 / 12) < 1e-12);
}

TEST(cis_cluster_singletons_are_plain) {
    /* every observation its own cluster (any ids, in order): the per-observation statistics, bit for bit */
    kiln_rng r;
    kiln_rng_seed(&r, 4);
    double x[80], y[80];
    int g[80], id[80];
    for (int i = 0; i < 80; i++) x[i] = 1 + i % 5, y[i] = kiln_rng_uniform(&r), g[i] = i % 3 == 0, id[i] = 5 * i + 2;
    double a, b, c, d;
    kiln_cis_bootstrap_mean(y, NULL, 80, 500, 0.95, 3, &a, &b);
    kiln_cis_bootstrap_mean(y, id, 80, 500, 0.95, 3, &c, &d);
    CHECK(a == c && b == d && a < b);
    kiln_cis_bootstrap_slope(x, y, NULL, 80, 500, 0.95, 3, &a, &b);
    kiln_cis_bootstrap_slope(x, y, id, 80, 500, 0.95, 3, &c, &d);
    CHECK(a == c && b == d && a < b);
    kiln_cis_perm_test(y, g, NULL, 80, 500, 3, &a, &b);
    kiln_cis_perm_test(y, g, id, 80, 500, 3, &c, &d);
    CHECK(a == c && b == d);
    /* one cluster: nothing to resample */
    int one[80] = {0};
    kiln_cis_bootstrap_mean(y, one, 80, 100, 0.95, 3, &a, &b);
    CHECK(isnan(a) && isnan(b));
    kiln_cis_bootstrap_slope(x, y, one, 80, 100, 0.95, 3, &a, &b);
    CHECK(isnan(a) && isnan(b));
}

TEST(cis_stats_as_before_clusters) {
    /* Per observation, the numbers of the implementation before clusters (bda72e0's stats.c, seed 3),
     * so that the cluster code's NULL path is held to it and not only to itself */
    double x[50], y[50], a, b;
    int g[50];
    for (int i = 0; i < 50; i++) y[i] = ((i * 37) % 101) / 100.0, x[i] = 1 + i % 5, g[i] = i % 3 == 0;
    kiln_cis_bootstrap_mean(y, NULL, 50, 400, 0.95, 3, &a, &b);
    CHECK_NEAR(a, 0.4235000000000001, 1e-12);
    CHECK_NEAR(b, 0.58891499999999986, 1e-12);
    kiln_cis_bootstrap_slope(x, y, NULL, 50, 400, 0.95, 3, &a, &b);
    CHECK_NEAR(a, -0.050123365787053502, 1e-12);
    CHECK_NEAR(b, 0.068085535967534305, 1e-12);
    CHECK(kiln_cis_perm_test(y, g, NULL, 50, 200, 3, &a, &b) == 0);
    CHECK_NEAR(a, -0.085864527629233411, 1e-12);
    CHECK(b == 66.0 / 201); /* 65 of 200 relabellings at least as far apart */
    /* NaN data: no p-value (not 0, which no relabelling could then reach) */
    y[7] = NAN;
    CHECK(kiln_cis_perm_test(y, g, NULL, 50, 200, 3, &a, &b) == -1 && isnan(b));
}

TEST(cis_cluster_unequal_sizes) {
    /* five clusters of nine 1s and five single 0s: the mean over images is 45/50 = 0.9, the mean of
     * the cluster means 0.5. A resample of k big clusters has mean 9k / (8k + 10): the 95% interval
     * runs from k = 2 (0.69) to k = 8 (0.97) and holds 0.9; averaging cluster means instead would
     * centre it on 0.5 and miss 0.9 */
    double x[50], lo, hi;
    int cl[50], n = 0;
    for (int k = 0; k < 5; k++)
        for (int j = 0; j < 9; j++) x[n] = 1, cl[n++] = k;
    for (int k = 5; k < 10; k++) x[n] = 0, cl[n++] = k;
    kiln_cis_bootstrap_mean(x, cl, n, 4000, 0.95, 5, &lo, &hi);
    CHECK_MSG(lo > 0.6 && lo < 0.9 && hi >= 0.9 && hi < 1, "[%g, %g]", lo, hi);
    /* the permutation test weighs images too: unequal clusters, the sampled p against the exact one
     * (C(14, 7) = 3432 relabellings; exact p ~0.033, so 3000 draws have sd ~0.0033) */
    kiln_rng r;
    kiln_rng_seed(&r, 8);
    double v[105], d, p, de, pe;
    int c2[105], g[105], m = 0;
    for (int k = 0; k < 14; k++)
        for (int j = 0; j <= k; j++) v[m] = kiln_rng_uniform(&r) + (k % 2 ? 0.01 * k : 0), c2[m] = k, g[m++] = k % 2;
    kiln_cis_perm_test_exact(v, g, c2, m, &de, &pe);
    CHECK(kiln_cis_perm_test(v, g, c2, m, 200000, 9, &d, &p) == 1); /* 3432 <= 200000: counted */
    CHECK(p == pe && d == de);
    CHECK(kiln_cis_perm_test(v, g, c2, m, 3000, 9, &d, &p) == 0);
    CHECK_MSG(fabs(p - pe) < 0.015, "sampled %g, exact %g", p, pe);
    CHECK_MSG(pe > 0.01 && pe < 0.5, "exact p %g: the data should give a p far from 0 and 1", pe);
}

/* 40 clusters of 5 observations: a cluster effect (sd 1) shared by its five, noise sd 0.3 each */
static void clustered_sample(kiln_rng *r, double *x, int *cl, int ncl, int m, double shift) {
    for (int k = 0; k < ncl; k++) {
        double u = kiln_rng_normal(r) + shift;
        for (int j = 0; j < m; j++) x[k * m + j] = u + 0.3 * kiln_rng_normal(r), cl[k * m + j] = k;
    }
}

TEST(cis_cluster_bootstrap_coverage) {
    /* the true mean is 0. Resampling clusters covers it near the nominal 95%; resampling the 200
     * observations as if independent gives intervals ~0.46 as wide (design effect 1 + 4 * 0.92)
     * and covers it ~65% of the time */
    kiln_rng r;
    kiln_rng_seed(&r, 21);
    double x[200];
    int cl[200], cov_cl = 0, cov_obs = 0, trials = 200;
    for (int t = 0; t < trials; t++) {
        clustered_sample(&r, x, cl, 40, 5, 0);
        double lo, hi;
        kiln_cis_bootstrap_mean(x, cl, 200, 500, 0.95, (uint64_t)t, &lo, &hi);
        cov_cl += lo <= 0 && 0 <= hi;
        kiln_cis_bootstrap_mean(x, NULL, 200, 500, 0.95, (uint64_t)t, &lo, &hi);
        cov_obs += lo <= 0 && 0 <= hi;
    }
    CHECK_MSG(cov_cl >= 174 && cov_cl <= 199, "clusters: covered %d of %d", cov_cl, trials);
    CHECK_MSG(cov_obs <= 160, "observations: covered %d of %d", cov_obs, trials);
}

TEST(cis_cluster_perm_false_positives) {
    /* no group effect: 20 clusters, 10 in each group. Relabelling clusters rejects at 5% about 5%
     * of the time; relabelling observations (as if independent) far more often */
    kiln_rng r;
    kiln_rng_seed(&r, 33);
    double x[100], d, p;
    int cl[100], g[100], rej_cl = 0, rej_obs = 0, trials = 200;
    for (int t = 0; t < trials; t++) {
        clustered_sample(&r, x, cl, 20, 5, 0);
        for (int i = 0; i < 100; i++) g[i] = cl[i] % 2;
        kiln_cis_perm_test(x, g, cl, 100, 400, (uint64_t)t, &d, &p);
        rej_cl += p <= 0.05;
        kiln_cis_perm_test(x, g, NULL, 100, 400, (uint64_t)t, &d, &p);
        rej_obs += p <= 0.05;
    }
    CHECK_MSG(rej_cl <= 20, "clusters: %d of %d rejected", rej_cl, trials);
    CHECK_MSG(rej_obs >= 50, "observations: %d of %d rejected", rej_obs, trials);
}

TEST(cis_bootstrap_mean_coverage) {
    kiln_rng r;
    kiln_rng_seed(&r, 11);
    double x[60];
    int covered = 0, trials = 200;
    for (int t = 0; t < trials; t++) {
        for (int i = 0; i < 60; i++) x[i] = 5 + kiln_rng_normal(&r);
        double lo, hi;
        kiln_cis_bootstrap_mean(x, NULL, 60, 1000, 0.95, (uint64_t)t, &lo, &hi);
        CHECK(lo < kiln_cis_mean(x, 60) && kiln_cis_mean(x, 60) < hi);
        covered += lo <= 5 && 5 <= hi;
    }
    /* nominal 95%; the percentile bootstrap runs a little under at n = 60 */
    CHECK_MSG(covered >= 175 && covered <= 198, "covered %d of %d", covered, trials);
    double c[5] = {0.4, 0.4, 0.4, 0.4, 0.4}, lo, hi;
    kiln_cis_bootstrap_mean(c, NULL, 5, 200, 0.95, 1, &lo, &hi);
    CHECK_NEAR(lo, 0.4, 1e-15);
    CHECK_NEAR(hi, 0.4, 1e-15);
    /* large-sample width ~ 2 * 1.96 * sd / sqrt(n) */
    double big[2000];
    for (int i = 0; i < 2000; i++) big[i] = kiln_rng_normal(&r);
    kiln_cis_bootstrap_mean(big, NULL, 2000, 2000, 0.95, 3, &lo, &hi);
    CHECK_NEAR(hi - lo, 2 * 1.96 / sqrt(2000), 0.015);
}

TEST(cis_ols_exact) {
    double x[] = {1, 2, 3, 4}, y[] = {2, 4, 5, 4}, s, c;
    CHECK(kiln_cis_ols(x, y, 4, &s, &c) == 0);
    CHECK_NEAR(s, 0.7, 1e-12); /* sxy 3.5 / sxx 5 */
    CHECK_NEAR(c, 2.0, 1e-12);
    double flat[] = {3, 3, 3};
    CHECK(kiln_cis_ols(flat, y, 3, &s, &c) == -1);
    /* noisy line: the bootstrap CI covers the true slope and is seeded */
    kiln_rng r;
    kiln_rng_seed(&r, 5);
    double xs[300], ys[300], lo, hi, lo2, hi2;
    for (int i = 0; i < 300; i++) xs[i] = 1 + i % 5, ys[i] = 0.9 - 0.1 * xs[i] + 0.05 * kiln_rng_normal(&r);
    kiln_cis_bootstrap_slope(xs, ys, NULL, 300, 1000, 0.95, 9, &lo, &hi);
    kiln_cis_bootstrap_slope(xs, ys, NULL, 300, 1000, 0.95, 9, &lo2, &hi2);
    CHECK(lo < -0.1 && -0.1 < hi && hi - lo < 0.02);
    CHECK(lo == lo2 && hi == hi2);
}

TEST(cis_agreement_kappa) {
    int pred[] = {1, 1, 0, 0, 1, 0, 1, 0, 0, 0}, truth[] = {1, 0, 0, 0, 1, 0, 1, 1, 0, 0};
    kiln_cis_agreement a;
    kiln_cis_agree(pred, truth, 10, &a);
    CHECK(a.tp == 3 && a.fp == 1 && a.fn == 1 && a.tn == 5);
    CHECK_NEAR(a.accuracy, 0.8, 1e-12);
    CHECK_NEAR(a.precision, 0.75, 1e-12);
    CHECK_NEAR(a.recall, 0.75, 1e-12);
    CHECK_NEAR(a.balanced_accuracy, (0.75 + 5.0 / 6) / 2, 1e-12);
    CHECK_NEAR(a.kappa, (0.8 - 0.52) / 0.48, 1e-12); /* pe = (4*4 + 6*6) / 100 */
}

TEST(cis_calibrate_youden) {
    double s[] = {0.9, 0.1, 0.6, 0.3, 0.7, 0.2};
    int y[] = {1, 0, 0, 1, 1, 0};
    double t, j;
    CHECK(kiln_cis_calibrate(s, y, 6, &t, &j) == 0);
    /* J = 2/3 at 0.25 and at 0.65; the tie goes to the one nearer 0.5 */
    CHECK_NEAR(j, 2.0 / 3, 1e-12);
    CHECK_NEAR(t, 0.65, 1e-12);
    int one[] = {1, 1, 1, 1, 1, 1};
    CHECK(kiln_cis_calibrate(s, one, 6, &t, &j) == -1);
    double sep[] = {0.1, 0.2, 0.8, 0.95};
    int ys[] = {0, 0, 1, 1};
    CHECK(kiln_cis_calibrate(sep, ys, 4, &t, &j) == 0);
    CHECK_NEAR(j, 1, 1e-12);
    CHECK_NEAR(t, 0.5, 1e-12);
}

TEST(cis_calibrate_cross_validated) {
    /* fold 0: 0.2 (absent), 0.6 (present); fold 1: 0.4 (present), 0.5 (absent). Fitted on fold 1
     * alone, J = 0 at 0.2 and at 0.75, the tie to 0.75: fold 0 judged absent, absent (0.6 missed).
     * Fitted on fold 0: 0.4 (J = 1): fold 1 judged present, present (0.5 a false positive). In
     * sample the best threshold (0.55 or so) gets 3 of 4; out of sample 2 of 4, kappa 0. */
    double s[] = {0.2, 0.6, 0.4, 0.5}, thr[3];
    int y[] = {0, 1, 1, 0}, fold[] = {0, 0, 1, 1};
    kiln_cis_agreement a;
    CHECK(kiln_cis_cv_agreement(s, y, fold, 4, 3, 0.5, thr, &a) == 2);
    CHECK_NEAR(thr[0], 0.75, 1e-12); /* fold 0's judge, fitted on fold 1 */
    CHECK_NEAR(thr[1], 0.4, 1e-12);
    CHECK(isnan(thr[2])); /* fold 2 holds nothing */
    CHECK(a.tp == 1 && a.fn == 1 && a.tn == 1 && a.fp == 1);
    CHECK_NEAR(a.accuracy, 0.5, 1e-12);
    CHECK_NEAR(a.kappa, 0, 1e-12);
    /* training folds of one class: the fallback threshold */
    int y1[] = {1, 1, 0, 0};
    CHECK(kiln_cis_cv_agreement(s, y1, fold, 4, 2, 0.45, thr, &a) == 2);
    CHECK(thr[0] == 0.45 && thr[1] == 0.45);
    CHECK(a.tp == 1 && a.fn == 1 && a.fp == 1 && a.tn == 1); /* 0.6 and 0.5 at or above 0.45 */
    /* one fold only: nothing to hold out */
    int same[] = {1, 1, 1, 1};
    CHECK(kiln_cis_cv_agreement(s, y, same, 4, 2, 0.5, NULL, &a) == 0);
    int outside[] = {0, 1, 2, 1}; /* a fold past K - 1 */
    CHECK(kiln_cis_cv_agreement(s, y, outside, 4, 2, 0.5, NULL, &a) == 0);
}

TEST(cis_entropy_and_judge) {
    double u[4] = {0.25, 0.25, 0.25, 0.25}, h[4] = {0.5, 0.5, 0, 0}, o[4] = {1, 0, 0, 0};
    CHECK_NEAR(kiln_cis_entropy_norm(u, 4), 1, 1e-12);
    CHECK_NEAR(kiln_cis_entropy_norm(h, 4), 0.5, 1e-12);
    CHECK_NEAR(kiln_cis_entropy_norm(o, 4), 0, 1e-12);
    float view[2] = {1, 0}, comp[2] = {1, 0}, con[4] = {0, 1, 0.6f, 0.8f};
    /* softmax of 10 * [1, 0, 0.6] at the first entry */
    double want = exp(10.0) / (exp(10.0) + 1 + exp(6.0));
    CHECK_NEAR(kiln_cis_judge_view(view, comp, con, 2, 2, 10), want, 1e-6);
    CHECK_NEAR(kiln_cis_judge_view(view, comp, con, 0, 2, 10), 1, 1e-12);
    float patches[8] = {1, 0, 1, 0, 1, 0, 1, 0};
    CHECK_NEAR(kiln_cis_grounding_entropy(comp, patches, 4, 2, 100), 1, 1e-9);
    float peaked[8] = {1, 0, 0, 1, 0, 1, 0, 1};
    CHECK(kiln_cis_grounding_entropy(comp, peaked, 4, 2, 100) < 1e-30 + 1e-6);
}

TEST(cis_views_and_grids) {
    int g[8], n;
    CHECK_OK(kiln_cis_parse_grids("2,3", g, &n, 8));
    CHECK(n == 3 && g[0] == 1 && g[1] == 2 && g[2] == 3);
    CHECK_ERR(kiln_cis_parse_grids("1,x", g, &n, 8), "--crops");
    CHECK_ERR(kiln_cis_parse_grids("9", g, &n, 8), "1..8");
    CHECK_ERR(kiln_cis_parse_grids("2,2", g, &n, 8), "twice");
    CHECK_OK(kiln_cis_parse_grids("1,2,3", g, &n, 8));
    kiln_cis_view v[32];
    int nv = kiln_cis_views(90, 60, g, 3, v, 32);
    CHECK(nv == 1 + 4 + 9);
    CHECK(v[0].w == 90 && v[0].h == 60);
    CHECK(v[1].w == 60 && v[1].h == 40 && v[2].x == 30 && v[3].y == 20); /* 2x2: side 2/3, stride 1/3 */
    CHECK(v[5].w == 45 && v[5].h == 30 && v[6].x == 22 && v[7].x == 45 && v[13].y == 30);
    for (int i = 0; i < nv; i++) CHECK(v[i].x + v[i].w <= 90 && v[i].y + v[i].h <= 60);
}

TEST(cis_pca_known_axes) {
    /* rows a_i u + b_i v with orthonormal u, v and centred a, b, var(a) > var(b) */
    const int n = 6, d = 3;
    double a[] = {3, -1, 2, -2, 1, -3}, b[] = {0, 1, 0.5, -0.5, -1, 0}; /* a . b = 0 */
    double u[] = {2 / 7.0, 3 / 7.0, 6 / 7.0}, v[] = {-3 / 7.0, 6 / 7.0, -2 / 7.0};
    float X[18];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) X[i * d + j] = (float)(a[i] * u[j] + b[i] * v[j] + 1.5);
    double c[12], ex[2], sa = 0, sb = 0;
    CHECK(kiln_cis_pca2(X, n, d, c, ex) == 0);
    for (int i = 0; i < n; i++) sa += a[i] * a[i], sb += b[i] * b[i];
    CHECK_NEAR(ex[0], sa / (sa + sb), 1e-5);
    CHECK_NEAR(ex[1], sb / (sa + sb), 1e-5);
    /* the sign rule makes the largest loading positive: u's 6/7 and v's 6/7 already are */
    for (int i = 0; i < n; i++) {
        CHECK_NEAR(c[2 * i], a[i], 1e-4);
        CHECK_NEAR(c[2 * i + 1], b[i], 1e-4);
    }
}
