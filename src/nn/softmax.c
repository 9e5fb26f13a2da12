/* Row softmax (the router's class probabilities). */
#include <math.h>

#include "kiln/nn.h"

void kiln_softmax_forward(float *y, const float *x, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float m = xi[0];
        for (int64_t j = 1; j < d; j++) m = xi[j] > m ? xi[j] : m;
        double sum = 0;
        for (int64_t j = 0; j < d; j++) sum += exp((double)xi[j] - m);
        for (int64_t j = 0; j < d; j++) y[i * d + j] = (float)(exp((double)xi[j] - m) / sum);
    }
}

void kiln_softmax_backward(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) {
        double dot = 0;
        for (int64_t j = 0; j < d; j++) dot += (double)dy[i * d + j] * y[i * d + j];
        for (int64_t j = 0; j < d; j++) dx[i * d + j] += (float)(y[i * d + j] * (dy[i * d + j] - dot));
    }
}
