/* ZAYA1's expert load balancing: the router's balancing biases are not learned; after every
 * step a PID controller nudges them so that each expert gets 1/E of the non-skipped tokens and
 * the skip class its target share. A class that is over-loaded has its bias lowered. */
#include <math.h>
#include <stdlib.h>

#include "train_internal.h"

kiln_error *balance_init(balance_ctl *b, int64_t layers, int64_t classes) {
    b->layers = layers;
    b->classes = classes;
    b->integral = calloc((size_t)(layers * classes + 1), sizeof(double));
    b->prev_err = calloc((size_t)(layers * classes + 1), sizeof(double));
    b->have_prev = 0;
    if (!b->integral || !b->prev_err) {
        balance_free(b);
        return kiln_errorf(KILN_ENOMEM, "balance controller");
    }
    return NULL;
}

void balance_free(balance_ctl *b) {
    free(b->integral);
    free(b->prev_err);
    b->integral = b->prev_err = NULL;
}

void balance_update(balance_ctl *b, const kiln_train_config *c, const int64_t *counts, float *biases,
                    double *imbalance) {
    const int64_t E = b->classes - 1;
    for (int64_t l = 0; l < b->layers; l++) {
        const int64_t *n = counts + l * b->classes;
        int64_t total = 0, maxe = 0;
        for (int64_t e = 0; e < b->classes; e++) total += n[e];
        for (int64_t e = 0; e < E; e++) maxe = n[e] > maxe ? n[e] : maxe;
        if (imbalance) {
            double mean = (double)(total - n[E]) / (double)E;
            imbalance[l] = mean > 0 ? (double)maxe / mean : 0.0;
        }
        if (total == 0) continue;
        for (int64_t e = 0; e < b->classes; e++) {
            double target = e == E ? c->bal_skip_target : (1.0 - c->bal_skip_target) / (double)E;
            double err = target - (double)n[e] / (double)total; /* > 0: under-loaded, raise its bias */
            double *I = &b->integral[l * b->classes + e], *P = &b->prev_err[l * b->classes + e];
            *I += err;
            double d = b->have_prev ? err - *P : 0.0;
            *P = err;
            /* with skip_target 0 the skip class is only ever pushed down, as intended */
            biases[l * b->classes + e] += (float)(c->bal_kp * err + c->bal_ki * *I + c->bal_kd * d);
        }
    }
    b->have_prev = 1;
}
