/* CLIP's quick_gelu, x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x)), with the preceding layer's bias added
 * in the same pass (the fc1 GEMM runs without it). Rows on OpenMP threads, each row on vector lanes with
 * kiln_vexpf (vexp.h): libm's expf per element was most of this pass. Large negative x gives
 * exp(...) = +inf and x / inf = -0, the limit; NaN stays NaN. */
#include "nn/vexp.h"

#include "kiln/nn.h"

KILN_SIMD_INLINE void qgelu_body(float *y, const float *x, const float *b, int64_t m) {
    if (b) {
#pragma omp simd
        for (int64_t j = 0; j < m; j++) {
            float v = x[j] + b[j];
            y[j] = v / (1.0f + kiln_vexpf(-1.702f * v));
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < m; j++) y[j] = x[j] / (1.0f + kiln_vexpf(-1.702f * x[j]));
    }
}

KILN_SIMD_VARIANTS(qgelu_row, (float *y, const float *x, const float *b, int64_t m), (y, x, b, m), qgelu_body)

void kiln_quick_gelu_forward(float *y, const float *x, const float *b, int64_t n, int64_t m) {
#pragma omp parallel for schedule(static) if (n > 1 && n * m > 65536)
    for (int64_t r = 0; r < n; r++) qgelu_row(y + r * m, x + r * m, b, m);
}
