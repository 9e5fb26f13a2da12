/* Causal grouped-query attention with an optional sliding window, the CPU reference.
 * Plain O(T^2) per head: readable, exact softmax, probabilities kept for backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/nn.h"

/* First visible key for a query at position p. */
static int64_t first_key(int64_t p, int64_t window) {
    int64_t lo = window > 0 ? p - window + 1 : 0;
    return lo > 0 ? lo : 0;
}

void kiln_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                            const kiln_attn_shape *s) {
    const int64_t B = s->B, Tq = s->Tq, tk = s->tk, NH = s->NH, KV = s->KV, D = s->D;
    const int64_t G = NH / KV, q_pos0 = tk - Tq;
#pragma omp parallel
    {
        float *row = malloc((size_t)tk * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < NH; h++) {
                const int64_t kh = h / G;
                for (int64_t i = 0; i < Tq; i++) {
                    const int64_t p = q_pos0 + i, lo = first_key(p, s->window);
                    const float *qi = q + ((b * Tq + i) * NH + h) * D;
                    float m = -INFINITY;
                    for (int64_t j = lo; j <= p; j++) {
                        const float *kj = k + ((b * s->tk_cap + j) * KV + kh) * D;
                        float dot = 0;
                        for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                        row[j] = dot * s->scale;
                        m = row[j] > m ? row[j] : m;
                    }
                    double sum = 0;
                    for (int64_t j = lo; j <= p; j++) sum += exp((double)row[j] - m);
                    float *oi = out + ((b * Tq + i) * NH + h) * D;
                    memset(oi, 0, (size_t)D * sizeof(float));
                    float *pr = probs ? probs + ((b * NH + h) * Tq + i) * tk : NULL;
                    if (pr) memset(pr, 0, (size_t)tk * sizeof(float));
                    for (int64_t j = lo; j <= p; j++) {
                        float pj = (float)(exp((double)row[j] - m) / sum);
                        if (pr) pr[j] = pj;
                        const float *vj = v + ((b * s->tk_cap + j) * KV + kh) * D;
                        for (int64_t d = 0; d < D; d++) oi[d] += pj * vj[d];
                    }
                }
            }
        free(row);
    }
}

/* Parallel over (batch, kv head) so that the heads sharing a K/V head write dk/dv from one thread. */
void kiln_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                             const float *q, const float *k, const float *v, const kiln_attn_shape *s) {
    const int64_t B = s->B, Tq = s->Tq, tk = s->tk, NH = s->NH, KV = s->KV, D = s->D;
    const int64_t G = NH / KV, q_pos0 = tk - Tq;
#pragma omp parallel
    {
        float *dp = malloc((size_t)tk * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < KV; kh++)
                for (int64_t h = kh * G; h < (kh + 1) * G; h++)
                    for (int64_t i = 0; i < Tq; i++) {
                        const int64_t p = q_pos0 + i, lo = first_key(p, s->window);
                        const float *pr = probs + ((b * NH + h) * Tq + i) * tk;
                        const float *go = dout + ((b * Tq + i) * NH + h) * D;
                        const float *qi = q + ((b * Tq + i) * NH + h) * D;
                        double dot = 0;
                        for (int64_t j = lo; j <= p; j++) {
                            const float *vj = v + ((b * s->tk_cap + j) * KV + kh) * D;
                            float a = 0;
                            for (int64_t d = 0; d < D; d++) a += go[d] * vj[d];
                            dp[j] = a;
                            dot += (double)a * pr[j];
                            if (dv) {
                                float *dvj = dv + ((b * s->tk_cap + j) * KV + kh) * D;
                                for (int64_t d = 0; d < D; d++) dvj[d] += pr[j] * go[d];
                            }
                        }
                        for (int64_t j = lo; j <= p; j++) {
                            float ds = (float)(pr[j] * (dp[j] - dot)) * s->scale;
                            const float *kj = k + ((b * s->tk_cap + j) * KV + kh) * D;
                            if (dq) {
                                float *dqi = dq + ((b * Tq + i) * NH + h) * D;
                                for (int64_t d = 0; d < D; d++) dqi[d] += ds * kj[d];
                            }
                            if (dk) {
                                float *dkj = dk + ((b * s->tk_cap + j) * KV + kh) * D;
                                for (int64_t d = 0; d < D; d++) dkj[d] += ds * qi[d];
                            }
                        }
                    }
        free(dp);
    }
}
