/* Next-token sampling from logits: temperature, top-k, top-p (nucleus), as HF's
 * generate applies them (temperature first, then top-k, then top-p over what is left). */
#include <math.h>
#include <stdlib.h>

#include "kiln/nn.h"
#include "kiln/rng.h"
#include "kiln/sample.h"

static int by_prob_desc(const void *a, const void *b) {
    const kiln_sample_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int64_t kiln_sample(const float *logits, int64_t V, const kiln_sample_opts *o, kiln_rng *rng,
                    kiln_sample_cand *work) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (o->temperature <= 0) return best; /* greedy */
    double mx = logits[best], sum = 0;
    for (int64_t v = 0; v < V; v++) {
        work[v].id = v;
        work[v].p = exp(((double)logits[v] - mx) / o->temperature);
        sum += work[v].p;
    }
    for (int64_t v = 0; v < V; v++) work[v].p /= sum;
    qsort(work, (size_t)V, sizeof *work, by_prob_desc);
    int64_t keep = V;
    if (o->top_k > 0 && o->top_k < keep) {
        keep = o->top_k;
        /* HF's top-k removes what scores below the k-th score: tokens tied with it stay */
        while (keep < V && work[keep].p == work[keep - 1].p) keep++;
    }
    double total = 0;
    for (int64_t i = 0; i < keep; i++) total += work[i].p;
    if (o->top_p > 0 && o->top_p < 1) {
        /* the nucleus of what top-k left, renormalised (HF's top-p runs a softmax over the filtered scores):
         * a token stays while the mass ranked above it is below top_p */
        double cum = 0;
        for (int64_t i = 0; i < keep; i++) {
            cum += work[i].p;
            if (cum >= o->top_p * total) {
                keep = i + 1;
                break;
            }
        }
        total = 0;
        for (int64_t i = 0; i < keep; i++) total += work[i].p;
    }
    double u = kiln_rng_uniform(rng) * total, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += work[i].p;
        if (u < acc) return work[i].id;
    }
    return work[keep - 1].id;
}
