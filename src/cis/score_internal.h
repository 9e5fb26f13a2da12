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
} cis_run_keep;
kiln_error *cis_run_keep_read(const cJSON *run, const char *ctx, cis_run_keep *k);

#endif
