/* Sampling the next token from a row of logits. */
#ifndef KILN_SAMPLE_H
#define KILN_SAMPLE_H

#include <stdint.h>

#include "kiln/rng.h"

typedef struct {
    double temperature; /* <= 0: greedy (argmax) */
    int64_t top_k;      /* 0: off */
    double top_p;       /* >= 1 or <= 0: off */
} kiln_sample_opts;

typedef struct {
    int64_t id;
    double p;
} kiln_sample_cand;

/* work: scratch of V entries. Deterministic for a given rng state. */
int64_t kiln_sample(const float *logits, int64_t V, const kiln_sample_opts *o, kiln_rng *rng,
                    kiln_sample_cand *work);

#endif
