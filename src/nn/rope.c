/* Partial rotary position embedding, HF convention: the first rot_dim channels of a head are
 * split in halves (x1, x2) and rotated as (x1 cos - x2 sin, x2 cos + x1 sin); the rest pass.
 * Angles are computed in f32 exactly as the reference does (inv_freq in f32, pos * inv_freq
 * in f32), so long positions round the same way. */
#include <math.h>

#include "kiln/nn.h"

int64_t kiln_rope_inv_freq(float *inv_freq, int64_t head_dim, double partial_factor, double theta) {
    int64_t dim = (int64_t)(head_dim * partial_factor);
    int64_t nf = (dim + 1) / 2; /* len(arange(0, dim, 2)) */
    for (int64_t i = 0; i < nf; i++)
        inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)dim);
    return 2 * nf;
}

static void rope_apply(float *x, const float *inv_freq, int64_t b, int64_t t, int64_t heads, int64_t dim,
                       int64_t rot_dim, int64_t pos0, float sign) {
    int64_t half = rot_dim / 2;
#pragma omp parallel for schedule(static) if (b * t * heads * dim > 65536)
    for (int64_t bt = 0; bt < b * t; bt++) {
        float pos = (float)(pos0 + bt % t);
        for (int64_t i = 0; i < half; i++) {
            float ang = pos * inv_freq[i];
            float c = cosf(ang), sn = sign * sinf(ang);
            for (int64_t h = 0; h < heads; h++) {
                float *xh = x + (bt * heads + h) * dim;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * sn;
                xh[i + half] = x2 * c + x1 * sn;
            }
        }
    }
}

void kiln_rope_forward(float *x, const float *inv_freq, int64_t b, int64_t t, int64_t heads, int64_t dim,
                       int64_t rot_dim, int64_t pos0) {
    rope_apply(x, inv_freq, b, t, heads, dim, rot_dim, pos0, 1.0f);
}

/* The rotation is orthogonal: its adjoint is the rotation by the opposite angle. */
void kiln_rope_backward(float *dx, const float *inv_freq, int64_t b, int64_t t, int64_t heads, int64_t dim,
                        int64_t rot_dim, int64_t pos0) {
    rope_apply(dx, inv_freq, b, t, heads, dim, rot_dim, pos0, -1.0f);
}
