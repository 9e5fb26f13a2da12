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

#endif
