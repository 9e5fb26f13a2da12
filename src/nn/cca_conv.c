/* CCA's causal convolution pair over channels-last [B, T, C]:
 *   mid[u] = b0 + sum_j w0[c,j] * xp[u+j]           u = 0 .. T+k1-2   (depthwise, kernel k0)
 *   y[t]   = b1 + sum_j sum_i w1[co,i,j] * mid[t+j] over the input channels of co's group
 * where xp is x left-padded by P = (k0-1)+(k1-1) steps taken from hist (zeros at sequence
 * start), exactly what the reference gets from F.pad followed by two unpadded Conv1d. Note
 * that mid at the first k1-1 steps is not zero: it carries b0 and partial sums. */
#include <string.h>

#include "kiln/nn.h"

/* Row u (0..T+P-1) of the padded input, or NULL for a zero pad row. */
static inline const float *xp_row(const float *x, const float *hist, int64_t b, int64_t u, int64_t T,
                                  int64_t C, int64_t P) {
    if (u >= P) return x + (b * T + (u - P)) * C;
    return hist ? hist + (b * P + u) * C : NULL;
}

void kiln_cca_conv_forward(float *y, float *mid, const float *x, const float *hist, const float *w0,
                           const float *b0, const float *w1, const float *b1, const kiln_conv_shape *s) {
    const int64_t C = s->C, T = s->T, k0 = s->k0, k1 = s->k1, P = (k0 - 1) + (k1 - 1), M = T + k1 - 1;
    const int64_t cg = C / s->groups;
#pragma omp parallel for schedule(static) if (s->B * T * C > 65536)
    for (int64_t b = 0; b < s->B; b++) {
        for (int64_t u = 0; u < M; u++) {
            float *m = mid + (b * M + u) * C;
            memcpy(m, b0, (size_t)C * sizeof(float));
            for (int64_t j = 0; j < k0; j++) {
                const float *xr = xp_row(x, hist, b, u + j, T, C, P);
                if (!xr) continue;
                for (int64_t c = 0; c < C; c++) m[c] += w0[c * k0 + j] * xr[c];
            }
        }
        for (int64_t t = 0; t < T; t++) {
            float *yr = y + (b * T + t) * C;
            for (int64_t co = 0; co < C; co++) {
                const int64_t g0 = (co / cg) * cg;
                float acc = b1[co];
                for (int64_t j = 0; j < k1; j++) {
                    const float *m = mid + (b * M + t + j) * C + g0;
                    const float *w = w1 + co * cg * k1 + j;
                    for (int64_t i = 0; i < cg; i++) acc += w[i * k1] * m[i];
                }
                yr[co] = acc;
            }
        }
    }
}

void kiln_cca_conv_backward(float *dx, float *dw0, float *db0, float *dw1, float *db1, float *dmid,
                            const float *dy, const float *x, const float *hist, const float *mid,
                            const float *w0, const float *w1, const kiln_conv_shape *s) {
    const int64_t B = s->B, C = s->C, T = s->T, k0 = s->k0, k1 = s->k1;
    const int64_t P = (k0 - 1) + (k1 - 1), M = T + k1 - 1, cg = C / s->groups;
    /* grouped stage, weights: each output channel owns its row of dw1 and db1 */
#pragma omp parallel for schedule(static)
    for (int64_t co = 0; co < C; co++) {
        const int64_t g0 = (co / cg) * cg;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                float g = dy[(b * T + t) * C + co];
                if (db1) db1[co] += g;
                if (dw1)
                    for (int64_t j = 0; j < k1; j++) {
                        const float *m = mid + (b * M + t + j) * C + g0;
                        for (int64_t i = 0; i < cg; i++) dw1[(co * cg + i) * k1 + j] += g * m[i];
                    }
            }
    }
    /* grouped stage, input: dmid[u, ci] gathers from the outputs t = u - j of ci's group */
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t u = 0; u < M; u++) {
            float *dm = dmid + (b * M + u) * C;
            memset(dm, 0, (size_t)C * sizeof(float));
            for (int64_t j = 0; j < k1; j++) {
                int64_t t = u - j;
                if (t < 0 || t >= T) continue;
                const float *g = dy + (b * T + t) * C;
                for (int64_t co = 0; co < C; co++) {
                    const int64_t g0 = (co / cg) * cg;
                    const float *w = w1 + co * cg * k1 + j;
                    for (int64_t i = 0; i < cg; i++) dm[g0 + i] += g[co] * w[i * k1];
                }
            }
        }
    /* depthwise stage: each channel is independent */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t u = 0; u < M; u++) {
                float g = dmid[(b * M + u) * C + c];
                if (db0) db0[c] += g;
                for (int64_t j = 0; j < k0; j++) {
                    const float *xr = xp_row(x, hist, b, u + j, T, C, P);
                    if (dw0 && xr) dw0[c * k0 + j] += g * xr[c];
                    if (dx && u + j >= P) dx[(b * T + (u + j - P)) * C + c] += g * w0[c * k0 + j];
                }
            }
}
