/* LayerNorm forward (CLIP's pre-LN blocks): y = (x - mean) / sqrt(var + eps) * w + b per row, with
 * the biased variance as torch.nn.LayerNorm. One read of the row gives the sum and the sum of squares,
 * accumulated in double on vector lanes (simd.h): var = E[x²] - mean² then loses nothing that matters
 * (the squares of floats are exact in double; the cancellation costs ~1e-16 of mean²/var, relative), and
 * the row is read twice instead of three times. Rows on OpenMP threads. Inference only: CLIP is never
 * trained here. */
#include <math.h>

#include "kiln/nn.h"
#include "nn/simd.h"

KILN_SIMD_INLINE void ln_body(float *yi, const float *xi, const float *w, const float *b, int64_t d, float eps) {
    double s = 0, ss = 0;
#pragma omp simd reduction(+ : s, ss)
    for (int64_t j = 0; j < d; j++) {
        double v = xi[j];
        s += v;
        ss += v * v;
    }
    double mean = s / (double)d, var = ss / (double)d - mean * mean;
    float rstd = (float)(1.0 / sqrt((var > 0 ? var : 0) + (double)eps)), m = (float)mean;
    if (w && b) {
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = (xi[j] - m) * rstd * w[j] + b[j];
    } else if (w) {
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = (xi[j] - m) * rstd * w[j];
    } else if (b) {
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = (xi[j] - m) * rstd + b[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = (xi[j] - m) * rstd;
    }
}

KILN_SIMD_VARIANTS(ln_row, (float *yi, const float *xi, const float *w, const float *b, int64_t d, float eps),
                   (yi, xi, w, b, d, eps), ln_body)

void kiln_layernorm_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d,
                            float eps) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
    for (int64_t i = 0; i < n; i++) ln_row(y + i * d, x + i * d, w, b, d, eps);
}
