/* y = (x + b) * s per channel: ZAYA's residual scaling blocks and input hidden-state scale. */
#include "kiln/nn.h"

void kiln_scale_shift_forward(float *y, const float *x, const float *b, const float *s, int64_t n, int64_t d,
                              int accumulate) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) {
            float v = (x[i * d + j] + b[j]) * s[j];
            y[i * d + j] = accumulate ? y[i * d + j] + v : v;
        }
}

void kiln_scale_shift_backward(float *dx, float *db, float *ds, const float *dy, const float *x, const float *b,
                               const float *s, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) {
            float g = dy[i * d + j];
            if (dx) dx[i * d + j] += g * s[j];
            if (db) db[j] += g * s[j];
            if (ds) ds[j] += g * (x[i * d + j] + b[j]);
        }
}
