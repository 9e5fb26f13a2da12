/* Pieces shared by score.c, aggregate.c and report.c. */
#ifndef KILN_CIS_SCORE_INTERNAL_H
#define KILN_CIS_SCORE_INTERNAL_H

#include <cjson/cJSON.h>

#include "kiln/error.h"

/* The per-image records of a run (RUN/results/part-*.jsonl, in part order; a later record of
 * the same image replaces the earlier one). */
typedef struct {
    cJSON **rec;
    int n;
    int next_part;
} cis_results;

kiln_error *cis_read_results(const char *run_dir, cis_results *r);
void cis_results_free(cis_results *r);
kiln_error *cis_mkdir(const char *dir);

/* What run.json says of the run's resampling unit and detector, read and checked the same way by
 * aggregation and by a resumed score: cluster ("image" when absent: runs from before the field,
 * as they were aggregated), detections (the original's path, a copy; NULL: none), detector_threshold
 * (0.5 when absent, in [0, 1]). ctx names run.json in errors. */
typedef struct {
    char unit[16];
    char *detections;
    double det_threshold;
    char *labels;        /* the labels the run was calibrated with (the original's path; RUN/labels.jsonl is the
                            copy aggregation reads), NULL: none. Kept so that a resume does not drop a calibration */
    int labels_as_judge;
} cis_run_keep;
kiln_error *cis_run_keep_read(const cJSON *run, const char *ctx, cis_run_keep *k);
void cis_run_keep_free(cis_run_keep *k);

/* A labels file checked line by line (fields and types, docs/cis-format.md) without a run: so that a
 * bad --labels stops `kiln cis score` before the images are scored, not after. */
kiln_error *cis_labels_check(const char *path);

/* Seeds are JSON numbers (doubles) in run.json, the manifest and the results: integers of magnitude
 * up to 2^53 - 1 are exact there, larger ones would silently become another seed. */
#define CIS_SEED_MAX 9007199254740991LL

/* A record of the results matches a manifest item when its image, prompt id, model and seed are
 * the item's (a record of the same image with other metadata is stale: the manifest changed). */
int cis_record_matches(const cJSON *rec, const char *image, const char *prompt_id, const char *model, long long seed);

#endif
