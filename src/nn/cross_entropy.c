/* Mean next-token cross-entropy over positions 0..T-2 (HF's ForCausalLMLoss with labels =
 * input_ids: shift by one, mean over B*(T-1) targets). */
#include <math.h>
#include <string.h>

#include "kiln/nn.h"

double kiln_cross_entropy(float *dlogits, const float *logits, const int64_t *ids, int64_t B, int64_t T,
                          int64_t V) {
    const int64_t count = B * (T - 1);
    double total = 0;
    if (dlogits) memset(dlogits, 0, (size_t)(B * T * V) * sizeof(float));
    if (count <= 0) return 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t r = 0; r < B * T; r++) {
        int64_t t = r % T;
        if (t == T - 1) continue;
        const float *l = logits + r * V;
        int64_t y = ids[r + 1];
        float m = l[0];
        for (int64_t v = 1; v < V; v++) m = l[v] > m ? l[v] : m;
        double sum = 0;
        for (int64_t v = 0; v < V; v++) sum += exp((double)l[v] - m);
        double lse = m + log(sum);
        total += lse - l[y];
        if (dlogits) {
            float *d = dlogits + r * V;
            for (int64_t v = 0; v < V; v++) d[v] = (float)(exp((double)l[v] - lse) / (double)count);
            d[y] -= (float)(1.0 / (double)count);
        }
    }
    return total / (double)count;
}
