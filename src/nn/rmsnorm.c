/* RMSNorm: y = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps). Sums in double so that
 * the CPU reference is as close to the f64 ground truth as f32 storage allows. */
#include <math.h>

#include "kiln/nn.h"

void kiln_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                          float eps) {
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
        if (rstd) rstd[i] = r;
        for (int64_t j = 0; j < d; j++) y[i * d + j] = w[j] * (xi[j] * r);
    }
}

void kiln_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d, *gi = dy + i * d;
        double r = rstd[i];
        if (dw)
            for (int64_t j = 0; j < d; j++) dw[j] += (float)(gi[j] * (xi[j] * r));
        if (dx) {
            double dot = 0; /* sum_j (dy*w)_j x_j */
            for (int64_t j = 0; j < d; j++) dot += (double)gi[j] * w[j] * xi[j];
            double c = dot * r * r * r / (double)d;
            for (int64_t j = 0; j < d; j++) dx[i * d + j] += (float)(r * gi[j] * w[j] - c * xi[j]);
        }
    }
}
