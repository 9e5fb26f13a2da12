/* LayerNorm forward (CLIP's pre-LN blocks): y = (x - mean) / sqrt(var + eps) * w + b per row, with
 * the biased variance as torch.nn.LayerNorm. Mean and variance are accumulated in double, so the
 * result does not depend on the row length's rounding. Inference only: CLIP is never trained here. */
#include <math.h>

#include "kiln/nn.h"

void kiln_layernorm_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d,
                            float eps) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float *yi = y + i * d;
        double s = 0, ss = 0;
        for (int64_t j = 0; j < d; j++) s += xi[j];
        double mean = s / (double)d;
        for (int64_t j = 0; j < d; j++) {
            double c = xi[j] - mean;
            ss += c * c;
        }
        float rstd = (float)(1.0 / sqrt(ss / (double)d + (double)eps)), m = (float)mean;
        for (int64_t j = 0; j < d; j++) {
            float v = (xi[j] - m) * rstd;
            yi[j] = w ? v * w[j] + (b ? b[j] : 0.0f) : v + (b ? b[j] : 0.0f);
        }
    }
}
