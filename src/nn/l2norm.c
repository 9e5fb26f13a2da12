/* ZAYA's QK norm: each head vector scaled to L2 norm `scale` (= sqrt(head_dim)), times a
 * per-head factor (the learned key temperature). The norm is clamped below at eps, as the
 * reference does with clamp_min(finfo.eps). */
#include <math.h>

#include "kiln/nn.h"

void kiln_l2norm_scale_forward(float *y, float *inv, const float *x, const float *t, int64_t rows,
                               int64_t heads, int64_t dim, float scale, float eps) {
    for (int64_t r = 0; r < rows * heads; r++) {
        const float *xr = x + r * dim;
        double ss = 0;
        for (int64_t j = 0; j < dim; j++) ss += (double)xr[j] * xr[j];
        double nrm = sqrt(ss);
        double iv = 1.0 / (nrm > eps ? nrm : eps);
        if (inv) inv[r] = (float)iv;
        double f = scale * iv * (t ? t[r % heads] : 1.0f);
        for (int64_t j = 0; j < dim; j++) y[r * dim + j] = (float)(xr[j] * f);
    }
}

void kiln_l2norm_scale_backward(float *dx, float *dt, const float *dy, const float *x, const float *t,
                                const float *inv, int64_t rows, int64_t heads, int64_t dim, float scale,
                                float eps) {
    for (int64_t r = 0; r < rows * heads; r++) {
        const float *xr = x + r * dim, *gr = dy + r * dim;
        double iv = inv[r], tt = t ? t[r % heads] : 1.0;
        double dot = 0;
        for (int64_t j = 0; j < dim; j++) dot += (double)gr[j] * xr[j];
        if (dt) dt[r % heads] += (float)(scale * iv * dot);
        if (!dx) continue;
        double f = scale * iv * tt;
        /* below the clamp the norm is a constant and the map is linear */
        int clamped = (1.0 / iv) <= eps;
        double c = clamped ? 0.0 : dot * iv * iv;
        for (int64_t j = 0; j < dim; j++) dx[r * dim + j] += (float)(f * (gr[j] - c * xr[j]));
    }
}
