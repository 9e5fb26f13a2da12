/* The Component Inclusion Score (CIS) audit of text-to-image models (arXiv 2505.01430).
 *
 * A prompt suite (JSON Lines, docs/cis-format.md) names culturally specific scenes and the
 * components each generated image should contain. A run manifest lists the generated images
 * (image path, prompt id, generator model, seed). `kiln cis score` judges every component of
 * every image with zero-shot CLIP, writes per-image results as it goes (resumable), and
 * aggregates them with bootstrap confidence intervals and permutation tests; `kiln cis report`
 * draws the HTML report. The statistics are plain functions over arrays (stats.c) so they are
 * testable against hand-computed values; the judge works on embeddings (judge.c) so it is
 * testable without a model.
 */
#ifndef KILN_CIS_H
#define KILN_CIS_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- prompt suite (suite.c) ---- */

typedef struct {
    char *phrase;  /* short concrete visual phrase, e.g. "injera" */
    char *generic; /* generic counterpart ("flatbread") or NULL */
    char *coco;    /* COCO class name or NULL */
} kiln_cis_component;

typedef struct {
    char *id, *prompt, *culture, *region, *group, *category, *setting;
    char *scene;           /* id shared by the variants of one scene (defaults to id) */
    char *context;         /* cultural context phrase (defaults to "a photo of <prompt>") */
    char *generic_context; /* generic scene phrase or NULL */
    int western;           /* group == "western" */
    int ncomp;             /* == complexity */
    kiln_cis_component *comp;
    int line;              /* 1-based line in the suite file */
} kiln_cis_prompt;

typedef struct {
    int n;
    kiln_cis_prompt *p;
} kiln_cis_suite;

/* Parse a suite; every error names ctx and the line: unknown fields, missing or mistyped
 * fields, zero components, complexity != number of components, duplicate ids, a group other
 * than western/non_western, a setting other than historical/modern. */
kiln_error *kiln_cis_suite_parse(const char *text, size_t len, const char *ctx, kiln_cis_suite *out);
kiln_error *kiln_cis_suite_load(const char *path, kiln_cis_suite *out);
void kiln_cis_suite_free(kiln_cis_suite *s);
/* Index of the prompt with this id, or -1. */
int kiln_cis_suite_find(const kiln_cis_suite *s, const char *id);

/* ---- run manifest and generation worklist (manifest.c) ---- */

typedef struct {
    char *image;     /* as written in the manifest (relative to the manifest's directory) */
    char *path;      /* resolved path to open */
    char *prompt_id;
    char *model;
    int64_t seed;
    int line;
} kiln_cis_item;

typedef struct {
    int n;
    kiln_cis_item *items;
} kiln_cis_manifest;

/* Lines {"image", "prompt_id", "model", "seed"} (plus an optional "prompt", so a worklist is a
 * manifest). Errors name the line; prompt ids are checked against a suite later, per item. */
kiln_error *kiln_cis_manifest_load(const char *path, kiln_cis_manifest *out);
void kiln_cis_manifest_free(kiln_cis_manifest *m);

/* The seed of image k of a prompt: FNV-1a 64 of "<prompt id>#<k>" folded to 31 bits, so every
 * model gets the same seeds (paired comparisons) and adding prompts changes no other seed. */
int64_t kiln_cis_seed(const char *prompt_id, int k);
/* One line per image to generate: {"image": "images/<model>/<prompt id>_<k>.png", "prompt_id",
 * "prompt", "model", "seed"}; models NULL/0 means one model named "model". Written atomically. */
kiln_error *kiln_cis_worklist_write(const kiln_cis_suite *s, int images_per_prompt, const char *const *models,
                                    int nmodels, const char *path);

/* ---- statistics (stats.c) ---- */

double kiln_cis_mean(const double *x, int n);
/* Clusters: the functions below take cl, where cl[i] >= 0 names observation i's cluster (any ids;
 * NULL: every observation its own cluster). They resample and relabel whole clusters, so the
 * observations of one cluster (the images of one prompt) count as one unit. With one cluster an
 * observation (cl NULL, or ids increasing in input order) they are the per-observation statistics
 * draw for draw, but for two changes that came with clusters: a single observation has no CI, and
 * the permutation test counts every relabelling when there are at most nperm of them. */
int kiln_cis_nclusters(const int *cl, int n);
/* Percentile bootstrap CI of the mean: B resamples of the clusters with replacement from a seeded
 * RNG, each the mean over its observations; lo/hi are the (1-level)/2 and (1+level)/2 quantiles
 * (linear interpolation). Fewer than two clusters give NaN. */
void kiln_cis_bootstrap_mean(const double *x, const int *cl, int n, int B, double level, uint64_t seed, double *lo,
                             double *hi);
/* Least-squares line y = a + b x. Returns 0, or -1 when x has no spread. */
int kiln_cis_ols(const double *x, const double *y, int n, double *slope, double *intercept);
/* Bootstrap CI of the OLS slope, resampling clusters of (x, y) pairs; resamples without spread in x
 * are drawn again. Fewer than two clusters give NaN. */
void kiln_cis_bootstrap_slope(const double *x, const double *y, const int *cl, int n, int B, double level,
                              uint64_t seed, double *lo, double *hi);
/* Two-sided permutation test of mean(x[g==1]) - mean(x[g==0]) (over observations) relabelling
 * whole clusters, the number of g==1 clusters kept: every relabelling when there are at most
 * nperm of them, p = #{|d*| >= |d|} / C(clusters, g==1 clusters) (returns 1); else nperm random
 * ones (seeded), p = (1 + #{|d*| >= |d|}) / (1 + nperm) (returns 0). *diff gets the observed
 * difference. No p-value (NaN, returns -1) with one group only, or a cluster holding both. */
int kiln_cis_perm_test(const double *x, const int *g, const int *cl, int n, int nperm, uint64_t seed, double *diff,
                       double *p);
/* Paired two-sided test of mean(d) = 0 (d: the paired differences) by flipping their signs: every
 * one of the 2^n sign patterns when there are at most nperm of them, p = #{|sum*| >= |sum|} / 2^n
 * (returns 1); else nperm random ones (seeded), p = (1 + #{|sum*| >= |sum|}) / (1 + nperm) (returns
 * 0). *mean gets mean(d). No p-value (NaN, returns -1) for n == 0, nperm <= 0 or a NaN difference. */
int kiln_cis_signflip_test(const double *d, int n, int nperm, uint64_t seed, double *mean, double *p);
/* Holm's step-down adjustment of a family of p-values (NaN entries are not in the family and
 * stay NaN): the i-th smallest of m becomes max over j <= i of min(1, (m - j + 1) p_(j)). */
void kiln_cis_holm(const double *p, int n, double *adj);
/* The same test over every relabelling (at most 2^24 of them, else NaN). */
void kiln_cis_perm_test_exact(const double *x, const int *g, const int *cl, int n, double *diff, double *p);

typedef struct {
    int tp, fp, tn, fn;
    double accuracy, precision, recall, balanced_accuracy, kappa;
} kiln_cis_agreement;
/* Agreement of predictions with reference labels (0/1): Cohen's kappa = (po - pe) / (1 - pe). */
void kiln_cis_agree(const int *pred, const int *truth, int n, kiln_cis_agreement *out);
/* The threshold t maximising Youden's J = TPR + TNR - 1 (= 2 * balanced accuracy - 1) of score >= t
 * against labels: candidates are midpoints between sorted distinct scores (and below/above all);
 * ties go to the midpoint nearest 0.5. Returns -1 when labels are all one class. */
int kiln_cis_calibrate(const double *score, const int *label, int n, double *threshold, double *youden_j);
/* Out-of-sample agreement of that calibration: pair i is in fold[i] (0..K-1); each fold's pairs are
 * judged (score >= t) at the threshold calibrated on the other folds' pairs (fallback where those
 * hold one class only), and the folds' judgements pooled give *out. thr (optional, K entries) gets
 * each fold's threshold (NaN for a fold without pairs). Returns the folds that held pairs, 0 (and
 * *out zeroed) when fewer than two did or a fold lies outside 0..K-1. */
int kiln_cis_cv_agreement(const double *score, const int *label, const int *fold, int n, int K, double fallback,
                          double *thr, kiln_cis_agreement *out);
/* Shannon entropy of p (sums to 1) divided by log(n): 0 = one point, 1 = uniform. */
double kiln_cis_entropy_norm(const double *p, int n);
/* First two principal components of the rows of X [n, d] (centred), by power iteration with
 * deflation (deterministic start, sign fixed so the largest |loading| is positive).
 * coords [n, 2]; explained[2] the fraction of total variance of each. Returns -1 if n < 2. */
int kiln_cis_pca2(const float *X, int n, int d, double *coords, double *explained);

/* ---- the judge (judge.c) ---- */

/* The views of an image: the whole image, then for each grid size g > 1 in `grids` a g x g grid
 * of overlapping crops (side 2W/(g+1), stride W/(g+1): neighbours overlap by half). */
typedef struct {
    int x, y, w, h;
} kiln_cis_view;
/* Parse "1,2,3" (grid sizes 1..8, 1 = the whole image, always included). */
kiln_error *kiln_cis_parse_grids(const char *s, int *grids, int *ngrids, int cap);
int kiln_cis_views(int width, int height, const int *grids, int ngrids, kiln_cis_view *views, int cap);

/* Probability that a component is in one view: softmax over logit_scale * cos of the view's
 * embedding with [component, contrasts...] texts, taking the component's entry. Embeddings are
 * L2-normalised rows of length d. The judge's score of a component is the max over views. */
double kiln_cis_judge_view(const float *view, const float *comp, const float *contrasts, int ncontrast, int d,
                           float logit_scale);
/* Grounding entropy: the softmax over patches of logit_scale * cos(text, patch) and its
 * normalised entropy (kiln_cis_entropy_norm). patches [np, d]. */
double kiln_cis_grounding_entropy(const float *text, const float *patches, int np, int d, float logit_scale);
float kiln_cis_dot(const float *a, const float *b, int d);

/* ---- scoring and the report (score.c, aggregate.c, report.c) ---- */

typedef struct {
    const char *suite, *manifest, *clip_dir, *out_dir;
    const char *labels;   /* NULL or a labels file (JSONL: image, component, present) */
    int labels_as_judge;  /* labels replace the CLIP verdicts */
    const char *grids;    /* "1,2,3" by default */
    int resume;
    int chunk;            /* images per results part file (default 16) */
    int boot;             /* bootstrap resamples (default 2000) */
    int perm;             /* permutations (default 10000) */
    uint64_t seed;        /* statistics seed (default 0) */
    double threshold;     /* used when no labels calibrate one (default 0.5) */
    const char *cluster;  /* the unit the bootstrap and permutations move: "prompt" (an image's seeds and
                             models together), "scene", "culture" or "image" (docs/cis.md); NULL: prompt
                             for a new run, a resumed run's own */
    const char *detections; /* NULL or an object detector's output (JSONL image, class, score; docs/cis-format.md),
                               checked against the components' COCO classes; NULL on resume: the run's own */
    double det_threshold;   /* a class is detected at score >= this (NaN: 0.5, or a resumed run's own) */
    FILE *progress;       /* NULL: stderr */
    const volatile int *stop; /* set (e.g. by a SIGINT handler) to stop after the current image */
} kiln_cis_score_opts;

void kiln_cis_score_opts_default(kiln_cis_score_opts *o);
/* Score every manifest item into out_dir (see docs/cis.md for the files), then aggregate.
 * Per-item problems are recorded in the results and counted in *nerrors; the call itself fails
 * only when nothing can be scored (bad suite, manifest, CLIP directory, output directory). */
kiln_error *kiln_cis_score(const kiln_cis_score_opts *o, int *nscored, int *nerrors);
/* 1 when unit names a cluster unit (image, prompt, scene, culture). */
int kiln_cis_cluster_unit_known(const char *unit);
/* Recompute every aggregate from out_dir's results (after scoring, or with new labels). */
kiln_error *kiln_cis_aggregate(const kiln_cis_score_opts *o);
/* The HTML report of a scored run directory. */
kiln_error *kiln_cis_report(const char *run_dir, const char *out_html);

#ifdef __cplusplus
}
#endif
#endif
