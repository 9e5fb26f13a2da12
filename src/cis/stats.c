/* The statistics of the CIS audit: bootstrap intervals, permutation tests, OLS, agreement,
 * threshold calibration, entropy and a 2-D PCA. Everything is seeded and single-threaded so
 * a run's numbers are the same on every machine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cis_internal.h"
#include "kiln/cis.h"
#include "kiln/rng.h"

double kiln_cis_mean(const double *x, int n) {
    if (n <= 0) return NAN;
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s / n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantile q of sorted v (type 7, as numpy.quantile's default). */
static double quantile_sorted(const double *v, int n, double q) {
    double h = (n - 1) * q;
    int lo = (int)floor(h);
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (h - lo) * (v[lo + 1] - v[lo]);
}

static uint32_t draw(kiln_rng *r, int n) { return (uint32_t)(kiln_rng_uniform(r) * n); }

static void interval(double *stat, int B, double level, double *lo, double *hi) {
    qsort(stat, (size_t)B, sizeof *stat, cmp_double);
    *lo = quantile_sorted(stat, B, (1 - level) / 2);
    *hi = quantile_sorted(stat, B, (1 + level) / 2);
}

/* Observations in clusters: cl[i] >= 0 names observation i's cluster (cl NULL: each observation
 * is its own). The bootstrap and the permutation test below move whole clusters, so observations
 * that share one (the images of one prompt: its seeds and models) count as one unit. Drawing
 * images one by one treats K images of a prompt as K independent prompts and makes intervals
 * too narrow and p-values too small whenever a prompt's images resemble each other, which is
 * what a generator's seeds do. ord lists the observations cluster by cluster (clusters by
 * ascending id, observations in input order within one); cluster k owns ord[start[k] ..
 * start[k + 1]). With every observation its own cluster, the ids increasing in input order (cl
 * NULL, or the row indices aggregate.c passes for "image"), the draws, sums and roundings are those
 * of the per-observation statistics kiln had before clusters. */
typedef struct {
    int ncl;
    int *ord, *start;
} clusters;

static void clusters_free(clusters *c) {
    free(c->ord), free(c->start);
    c->ord = c->start = NULL;
}

static int cmp_int_pair(const void *a, const void *b) {
    const int *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* 0, or -1 when out of memory */
static int clusters_make(const int *cl, int n, clusters *c) {
    c->ncl = 0;
    c->ord = malloc((size_t)(n + 1) * sizeof *c->ord);
    c->start = malloc((size_t)(n + 2) * sizeof *c->start);
    int *pair = cl ? malloc((2 * (size_t)n + 2) * sizeof *pair) : NULL;
    if (!c->ord || !c->start || (cl && !pair)) {
        free(pair);
        clusters_free(c);
        return -1;
    }
    if (!cl) {
        for (int i = 0; i < n; i++) c->ord[i] = c->start[i] = i;
        c->ncl = n;
    } else {
        for (int i = 0; i < n; i++) pair[2 * i] = cl[i], pair[2 * i + 1] = i;
        qsort(pair, (size_t)n, 2 * sizeof *pair, cmp_int_pair);
        for (int i = 0; i < n; i++) {
            if (i == 0 || pair[2 * i] != pair[2 * i - 2]) c->start[c->ncl++] = i;
            c->ord[i] = pair[2 * i + 1];
        }
    }
    c->start[c->ncl] = n;
    free(pair);
    return 0;
}

/* each cluster's sum of x and size */
static void cluster_sums(const clusters *c, const double *x, double *sum, double *cnt) {
    for (int k = 0; k < c->ncl; k++) {
        double s = 0;
        for (int j = c->start[k]; j < c->start[k + 1]; j++) s += x[c->ord[j]];
        sum[k] = s, cnt[k] = c->start[k + 1] - c->start[k];
    }
}

const volatile int *cis_stop;
/* Every 256 iterations: a read of a volatile int costs little, but not nothing, in loops this tight. */
#define STOPPED(i) (((i) & 255) == 0 && cis_stop && *cis_stop)

int kiln_cis_nclusters(const int *cl, int n) {
    clusters c;
    if (n <= 0 || clusters_make(cl, n, &c)) return 0;
    int k = c.ncl;
    clusters_free(&c);
    return k;
}

void kiln_cis_bootstrap_mean(const double *x, const int *cl, int n, int B, double level, uint64_t seed, double *lo,
                             double *hi) {
    *lo = *hi = NAN;
    clusters c = {0, NULL, NULL};
    if (n <= 0 || B <= 0 || clusters_make(cl, n, &c)) return;
    double *stat = malloc((size_t)B * sizeof *stat), *sum = malloc((size_t)c.ncl * sizeof *sum),
           *cnt = malloc((size_t)c.ncl * sizeof *cnt);
    if (stat && sum && cnt && c.ncl >= 2) {
        cluster_sums(&c, x, sum, cnt);
        kiln_rng r;
        kiln_rng_seed(&r, seed);
        int b;
        for (b = 0; b < B && !STOPPED(b); b++) {
            double s = 0, m = 0;
            for (int i = 0; i < c.ncl; i++) {
                uint32_t k = draw(&r, c.ncl);
                s += sum[k], m += cnt[k];
            }
            stat[b] = s / m;
        }
        if (b == B) interval(stat, B, level, lo, hi);
    }
    free(stat), free(sum), free(cnt);
    clusters_free(&c);
}

int kiln_cis_ols(const double *x, const double *y, int n, double *slope, double *intercept) {
    *slope = *intercept = NAN;
    if (n < 2) return -1;
    double mx = kiln_cis_mean(x, n), my = kiln_cis_mean(y, n), sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
    }
    if (!(sxx > 0)) return -1;
    *slope = sxy / sxx;
    *intercept = my - *slope * mx;
    return 0;
}

/* kiln_cis_ols over the observations of the clusters d[0..nd) (a cluster as often as it is drawn),
 * in that order: the same two passes and roundings as kiln_cis_ols over the gathered pairs. */
static int ols_drawn(const clusters *c, const uint32_t *d, int nd, const double *x, const double *y, double *slope) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < nd; i++)
        for (int j = c->start[d[i]]; j < c->start[d[i] + 1]; j++) sx += x[c->ord[j]], sy += y[c->ord[j]], m++;
    if (m < 2) return -1;
    double mx = sx / m, my = sy / m;
    for (int i = 0; i < nd; i++)
        for (int j = c->start[d[i]]; j < c->start[d[i] + 1]; j++) {
            double dx = x[c->ord[j]] - mx;
            sxx += dx * dx;
            sxy += dx * (y[c->ord[j]] - my);
        }
    if (!(sxx > 0)) return -1;
    *slope = sxy / sxx;
    return 0;
}

void kiln_cis_bootstrap_slope(const double *x, const double *y, const int *cl, int n, int B, double level,
                              uint64_t seed, double *lo, double *hi) {
    *lo = *hi = NAN;
    double s0, i0;
    clusters c = {0, NULL, NULL};
    if (B <= 0 || kiln_cis_ols(x, y, n, &s0, &i0) || clusters_make(cl, n, &c)) return;
    double *stat = malloc((size_t)B * sizeof *stat);
    uint32_t *d = malloc((size_t)c.ncl * sizeof *d);
    if (stat && d && c.ncl >= 2) {
        kiln_rng r;
        kiln_rng_seed(&r, seed);
        for (long long b = 0, tries = 0; b < B && tries < 100LL * B && !STOPPED(tries); tries++) {
            for (int i = 0; i < c.ncl; i++) d[i] = draw(&r, c.ncl);
            double s;
            if (!ols_drawn(&c, d, c.ncl, x, y, &s)) stat[b++] = s;
            if (b == B) interval(stat, B, level, lo, hi);
        }
    }
    free(stat), free(d);
    clusters_free(&c);
}

/* mean(x[g]) - mean(x[!g]) given the sum over g and the group size. */
static double diff_of(double sum1, double n1, double total, double n) { return sum1 / n1 - (total - sum1) / (n - n1); }

/* C(n, k), or cap + 1 when it is larger than cap */
static double binom_capped(int n, int k, double cap) {
    if (k < 0 || k > n) return 0;
    if (k > n - k) k = n - k;
    double c = 1;
    for (int i = 1; i <= k; i++) {
        c = c * (n - k + i) / i;
        if (c > cap) return cap + 1;
    }
    return floor(c + 0.5);
}

/* The permutation test over cluster labels. exact_cap: enumerate every split when there are at
 * most that many, else draw nperm of them (nperm 0: none drawn). Returns 1 exact, 0 sampled, -1
 * no p-value. */
static int perm_test(const double *x, const int *g, const int *cl, int n, int nperm, uint64_t seed, double exact_cap,
                     double *diff, double *p) {
    *diff = *p = NAN;
    int n1 = 0;
    double total = 0, sum1 = 0;
    for (int i = 0; i < n; i++) {
        total += x[i];
        if (g[i]) n1++, sum1 += x[i];
    }
    if (n1 == 0 || n1 == n) return -1;
    double d = diff_of(sum1, n1, total, n);
    *diff = d;
    if (isnan(d)) return -1; /* no relabelling compares with NaN: p would read 0 */
    clusters c = {0, NULL, NULL};
    if (clusters_make(cl, n, &c)) return -1;
    int ret = -1, n1c = 0;
    double *sum = malloc((size_t)c.ncl * sizeof *sum), *cnt = malloc((size_t)c.ncl * sizeof *cnt);
    int *idx = malloc((size_t)c.ncl * sizeof *idx);
    if (!sum || !cnt || !idx) goto out;
    for (int k = 0; k < c.ncl; k++) { /* a cluster's observations must share their group */
        int gk = g[c.ord[c.start[k]]] != 0;
        for (int j = c.start[k] + 1; j < c.start[k + 1]; j++)
            if ((g[c.ord[j]] != 0) != gk) goto out;
        n1c += gk;
    }
    cluster_sums(&c, x, sum, cnt);
    /* a relative tolerance so relabellings equal to the observed split count despite rounding */
    double tol = 1e-12 * (fabs(d) + 1);
    long ge = 0;
    double splits = binom_capped(c.ncl, n1c, exact_cap);
    if (splits <= exact_cap) {
        /* every n1c-subset of the clusters, in lexicographic order */
        long all = 0;
        for (int i = 0; i < n1c; i++) idx[i] = i;
        for (;;) {
            if (STOPPED(all)) goto out; /* no p-value: the caller discards the aggregation */
            double s = 0, m = 0;
            for (int i = 0; i < n1c; i++) s += sum[idx[i]], m += cnt[idx[i]];
            all++;
            if (fabs(diff_of(s, m, total, n)) >= fabs(d) - tol) ge++;
            int i = n1c - 1;
            while (i >= 0 && idx[i] == c.ncl - n1c + i) i--;
            if (i < 0) break;
            idx[i]++;
            for (int j = i + 1; j < n1c; j++) idx[j] = idx[j - 1] + 1;
        }
        *p = (double)ge / all;
        ret = 1;
    } else if (nperm > 0) {
        kiln_rng r;
        kiln_rng_seed(&r, seed);
        for (int k = 0; k < c.ncl; k++) idx[k] = k;
        for (int t = 0; t < nperm; t++) {
            if (STOPPED(t)) goto out;
            /* partial Fisher-Yates: the first n1c slots are a uniform random subset */
            double s = 0, m = 0;
            for (int i = 0; i < n1c; i++) {
                int j = i + (int)draw(&r, c.ncl - i), tmp = idx[i];
                idx[i] = idx[j], idx[j] = tmp;
                s += sum[idx[i]], m += cnt[idx[i]];
            }
            if (fabs(diff_of(s, m, total, n)) >= fabs(d) - tol) ge++;
        }
        *p = (1.0 + ge) / (1.0 + nperm);
        ret = 0;
    }
out:
    free(sum), free(cnt), free(idx);
    clusters_free(&c);
    return ret;
}

int kiln_cis_signflip_test(const double *d, int n, int nperm, uint64_t seed, double *mean, double *p) {
    *mean = *p = NAN;
    if (n <= 0 || nperm <= 0) return -1;
    double s0 = 0, mag = 0;
    for (int i = 0; i < n; i++) s0 += d[i], mag += fabs(d[i]);
    if (isnan(s0)) return -1;
    *mean = s0 / n;
    /* a tolerance so patterns equal to the observed one count despite rounding */
    double tol = 1e-12 * (mag + 1);
    long ge = 0;
    if (n < 31 && (double)(1u << n) <= nperm) {
        for (uint32_t mask = 0; mask < (1u << n); mask++) {
            if (STOPPED(mask)) return -1;
            double s = 0;
            for (int i = 0; i < n; i++) s += mask >> i & 1 ? -d[i] : d[i];
            ge += fabs(s) >= fabs(s0) - tol;
        }
        *p = (double)ge / (double)(1u << n);
        return 1;
    }
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int t = 0; t < nperm; t++) {
        if (STOPPED(t)) return -1;
        double s = 0;
        for (int i = 0; i < n; i++) s += kiln_rng_uniform(&r) < 0.5 ? -d[i] : d[i];
        ge += fabs(s) >= fabs(s0) - tol;
    }
    *p = (1.0 + ge) / (1.0 + nperm);
    return 0;
}

void kiln_cis_holm(const double *p, int n, double *adj) {
    int *o = malloc((size_t)(n + 1) * sizeof *o), m = 0;
    for (int i = 0; i < n; i++) {
        adj[i] = NAN;
        if (o && !isnan(p[i])) o[m++] = i;
    }
    if (!o) return;
    for (int i = 1; i < m; i++) /* insertion sort by p (families are a few levels), ties by index */
        for (int j = i; j > 0 && p[o[j - 1]] > p[o[j]]; j--) {
            int t = o[j];
            o[j] = o[j - 1], o[j - 1] = t;
        }
    double run = 0;
    for (int j = 0; j < m; j++) {
        double a = (m - j) * p[o[j]];
        run = fmax(run, a < 1 ? a : 1);
        adj[o[j]] = run;
    }
    free(o);
}

int kiln_cis_perm_test(const double *x, const int *g, const int *cl, int n, int nperm, uint64_t seed, double *diff,
                       double *p) {
    if (nperm <= 0) {
        *diff = *p = NAN;
        return -1;
    }
    return perm_test(x, g, cl, n, nperm, seed, nperm, diff, p);
}

void kiln_cis_perm_test_exact(const double *x, const int *g, const int *cl, int n, double *diff, double *p) {
    if (perm_test(x, g, cl, n, 0, 0, 1 << 24, diff, p) != 1) *p = NAN;
}

void kiln_cis_agree(const int *pred, const int *truth, int n, kiln_cis_agreement *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < n; i++) {
        if (pred[i] && truth[i]) o->tp++;
        else if (pred[i]) o->fp++;
        else if (truth[i]) o->fn++;
        else o->tn++;
    }
    double N = n;
    o->accuracy = n ? (o->tp + o->tn) / N : NAN;
    o->precision = o->tp + o->fp ? (double)o->tp / (o->tp + o->fp) : NAN;
    o->recall = o->tp + o->fn ? (double)o->tp / (o->tp + o->fn) : NAN;
    double tnr = o->tn + o->fp ? (double)o->tn / (o->tn + o->fp) : NAN;
    o->balanced_accuracy = (o->recall + tnr) / 2;
    double pe = n ? ((double)(o->tp + o->fp) * (o->tp + o->fn) + (double)(o->tn + o->fn) * (o->tn + o->fp)) / (N * N)
                  : NAN;
    o->kappa = pe < 1 ? (o->accuracy - pe) / (1 - pe) : NAN;
}

typedef struct {
    double s;
    int y;
} scored;

static int cmp_scored(const void *a, const void *b) { return cmp_double(&((const scored *)a)->s, &((const scored *)b)->s); }

int kiln_cis_calibrate(const double *score, const int *label, int n, double *threshold, double *youden_j) {
    int pos = 0;
    for (int i = 0; i < n; i++) pos += label[i] != 0;
    int neg = n - pos;
    if (!pos || !neg) return -1;
    scored *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < n; i++) v[i].s = score[i], v[i].y = label[i] != 0;
    qsort(v, (size_t)n, sizeof *v, cmp_scored);
    /* threshold below v[i] (i = 0..n): predicted positive = v[i..n-1] */
    int tp = pos, fp = neg;
    double best = -2, bt = 0;
    for (int i = 0; i <= n; i++) {
        if (i == 0 || i == n || v[i].s != v[i - 1].s) {
            double t = i == 0 ? v[0].s - 0.5 : i == n ? v[n - 1].s + 0.5 : (v[i - 1].s + v[i].s) / 2;
            if (i == 0 && v[0].s > 0) t = v[0].s / 2; /* keep thresholds of probabilities in [0, 1] */
            if (i == n && v[n - 1].s < 1) t = (v[n - 1].s + 1) / 2;
            double j = (double)tp / pos + (double)(neg - fp) / neg - 1;
            if (j > best + 1e-12 || (fabs(j - best) <= 1e-12 && fabs(t - 0.5) < fabs(bt - 0.5))) best = j, bt = t;
        }
        if (i < n) {
            if (v[i].y) tp--;
            else fp--;
        }
    }
    free(v);
    *threshold = bt;
    *youden_j = best;
    return 0;
}

int kiln_cis_cv_agreement(const double *score, const int *label, const int *fold, int n, int K, double fallback,
                          double *thr, kiln_cis_agreement *out) {
    memset(out, 0, sizeof *out);
    int used = 0;
    for (int i = 0; i < n; i++)
        if (fold[i] < 0 || fold[i] >= K) return 0; /* every pair must be in a fold */
    for (int f = 0; f < K; f++) {
        int k = 0;
        for (int i = 0; i < n; i++) k += fold[i] == f;
        used += k > 0;
        if (thr) thr[f] = NAN;
    }
    if (used < 2) return 0;
    double *ts = malloc((size_t)n * sizeof *ts);
    int *tl = malloc((size_t)n * sizeof *tl), *pred = malloc((size_t)n * sizeof *pred);
    if (!ts || !tl || !pred) {
        free(ts), free(tl), free(pred);
        return 0;
    }
    for (int f = 0; f < K; f++) {
        int k = 0, held = 0;
        for (int i = 0; i < n; i++) {
            if (fold[i] != f) ts[k] = score[i], tl[k++] = label[i];
            else held = 1;
        }
        if (!held) continue;
        double t, j;
        if (kiln_cis_calibrate(ts, tl, k, &t, &j)) t = fallback;
        if (thr) thr[f] = t;
        for (int i = 0; i < n; i++)
            if (fold[i] == f) pred[i] = score[i] >= t;
    }
    kiln_cis_agree(pred, label, n, out);
    free(ts), free(tl), free(pred);
    return used;
}

double kiln_cis_entropy_norm(const double *p, int n) {
    if (n < 2) return 0;
    double h = 0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) h -= p[i] * log(p[i]);
    return h / log(n);
}

/* Largest eigenvector of C = Xcᵀ Xc (implicitly, as Xcᵀ (Xc v)) minus the deflated component. */
static double power_iter(const double *Xc, int n, int d, const double *prev, double *v, double *tmp) {
    for (int j = 0; j < d; j++) v[j] = 1.0 / sqrt(d) * (1 + 0.01 * (j % 7)); /* deterministic, not orthogonal to anything in practice */
    double lambda = 0;
    for (int it = 0; it < 1000; it++) {
        if (prev) { /* stay orthogonal to the first component */
            double dp = 0;
            for (int j = 0; j < d; j++) dp += v[j] * prev[j];
            for (int j = 0; j < d; j++) v[j] -= dp * prev[j];
        }
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int j = 0; j < d; j++) s += Xc[(size_t)i * d + j] * v[j];
            tmp[i] = s;
        }
        double nrm = 0;
        double *w = tmp + n;
        for (int j = 0; j < d; j++) w[j] = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < d; j++) w[j] += Xc[(size_t)i * d + j] * tmp[i];
        if (prev) {
            double dp = 0;
            for (int j = 0; j < d; j++) dp += w[j] * prev[j];
            for (int j = 0; j < d; j++) w[j] -= dp * prev[j];
        }
        for (int j = 0; j < d; j++) nrm += w[j] * w[j];
        nrm = sqrt(nrm);
        if (nrm == 0) return 0;
        double change = 0;
        for (int j = 0; j < d; j++) {
            double nv = w[j] / nrm;
            change += fabs(nv - v[j]);
            v[j] = nv;
        }
        lambda = nrm;
        if (change < 1e-12 * d) break;
    }
    int big = 0;
    for (int j = 1; j < d; j++)
        if (fabs(v[j]) > fabs(v[big])) big = j;
    if (v[big] < 0)
        for (int j = 0; j < d; j++) v[j] = -v[j];
    return lambda;
}

int kiln_cis_pca2(const float *X, int n, int d, double *coords, double *explained) {
    if (n < 2 || d < 1) return -1;
    double *Xc = malloc((size_t)n * d * sizeof *Xc), *v = malloc(2 * (size_t)d * sizeof *v),
           *tmp = malloc(((size_t)n + d) * sizeof *tmp);
    if (!Xc || !v || !tmp) {
        free(Xc), free(v), free(tmp);
        return -1;
    }
    double total = 0;
    for (int j = 0; j < d; j++) {
        double m = 0;
        for (int i = 0; i < n; i++) m += X[(size_t)i * d + j];
        m /= n;
        for (int i = 0; i < n; i++) {
            double c = X[(size_t)i * d + j] - m;
            Xc[(size_t)i * d + j] = c;
            total += c * c;
        }
    }
    double l1 = power_iter(Xc, n, d, NULL, v, tmp);
    double l2 = d > 1 ? power_iter(Xc, n, d, v, v + d, tmp) : 0;
    if (d == 1) v[d] = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            double s = 0;
            for (int j = 0; j < d; j++) s += Xc[(size_t)i * d + j] * v[(size_t)k * d + j];
            coords[2 * i + k] = s;
        }
    explained[0] = total > 0 ? l1 / total : 0;
    explained[1] = total > 0 ? l2 / total : 0;
    free(Xc), free(v), free(tmp);
    return 0;
}
