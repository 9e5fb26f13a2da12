/* Pointwise activations: exact GELU (the router MLP) and SwiGLU (the experts). */
#include <math.h>

#include "kiln/nn.h"

void kiln_gelu_forward(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] * M_SQRT1_2)));
}

void kiln_gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        double cdf = 0.5 * (1.0 + erf(v * M_SQRT1_2));
        double pdf = exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
        dx[i] += (float)(dy[i] * (cdf + v * pdf));
    }
}

static double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

void kiln_swiglu_forward(float *y, const float *gu, int64_t n, int64_t inter) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        for (int64_t j = 0; j < inter; j++) y[r * inter + j] = (float)(g[j] * sigmoid(g[j]) * u[j]);
    }
}

void kiln_swiglu_backward(float *dgu, const float *dy, const float *gu, int64_t n, int64_t inter) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *dg = dgu + r * 2 * inter, *du = dg + inter;
        for (int64_t j = 0; j < inter; j++) {
            double sg = sigmoid(g[j]), d = dy[r * inter + j];
            du[j] += (float)(d * g[j] * sg);
            dg[j] += (float)(d * u[j] * sg * (1.0 + g[j] * (1.0 - sg)));
        }
    }
}
