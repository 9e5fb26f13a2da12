/* QK norm and partial RoPE on the device against src/nn's l2norm_scale and rope: the separate twins
 * and the fused qk_norm_rope, forward and backward. Tolerances (max |gpu - ref| / max |ref|):
 *   bf16 outputs (y, dx): 5e-3, one rounding to bf16 (at most 2^-8 relative) plus f32 arithmetic (the
 *     fused op rounds once where the reference's two steps stay in f32);
 *   inv (f32): 1e-5; dt, a sum over all tokens of one head: 3e-5 (f32 terms, another order).
 * Shapes include odd head dims, a partial rotary dim, long positions (4096 steps: f32 angles as the
 * reference computes them); a separate case has zero vectors (the norm clamped at eps, where the map is
 * linear with a gain of scale/eps: those vectors would dominate max |ref| of a larger case). Head dims that are
 * multiples of 32 up to 256 run four head vectors a warp side by side (64, 128, 96, 256, 32; vector counts not a
 * multiple of four), other dims up to 256 four a warp one after another (33), wider ones one a warp (320, 301). */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

#define TOL_BF16 5e-3
#define TOL_F32 1e-5
#define TOL_SUM 3e-5

typedef struct {
    int64_t b, t, heads, dim;
    double partial;
    int64_t pos0;
} qk_shape;

static const qk_shape shapes[] = {
    {2, 50, 3, 64, 0.5, 7}, {1, 4096, 2, 128, 0.5, 0}, {3, 17, 5, 33, 1.0, 100}, {2, 300, 8, 128, 0.25, 0},
    {2, 9, 2, 320, 0.5, 5}, {1, 7, 3, 301, 1.0, 0}, {1, 7, 3, 96, 1.0, 3}, {2, 33, 2, 256, 0.25, 0},
    {3, 11, 5, 32, 0.5, 9}};

static float *dev_inv_freq(const qk_shape *s, int64_t *rot_dim) {
    float inv_freq[1024];
    *rot_dim = kiln_rope_inv_freq(inv_freq, s->dim, s->partial, 10000.0);
    if (*rot_dim > s->dim) *rot_dim = s->dim & ~(int64_t)1;
    return gt_up_f32(inv_freq, *rot_dim / 2 > 0 ? *rot_dim / 2 : 1);
}

TEST(gpu_ops_l2norm_scale) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 21);
    const float eps = FLT_EPSILON;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const qk_shape *s = &shapes[si];
        const int64_t rows = s->b * s->t, n = rows * s->heads * s->dim, nv = rows * s->heads;
        const float scale = sqrtf((float)s->dim);
        printf("  rows=%lld heads=%lld dim=%lld\n", (long long)rows, (long long)s->heads, (long long)s->dim);
        float *x = gt_rand(&rng, n, 3.0f), *dy = gt_rand(&rng, n, 1.0f), *t = gt_rand(&rng, s->heads, 0.5f);
        float *dt0 = gt_rand(&rng, s->heads, 0.5f);
        for (int64_t h = 0; h < s->heads; h++) t[h] += 1.0f;
        gt_round_bf16(x, n), gt_round_bf16(dy, n);
        for (int with_t = 0; with_t < 2; with_t++) {
            const float *tt = with_t ? t : NULL;
            float *y = malloc((size_t)n * sizeof *y), *inv = malloc((size_t)nv * sizeof *inv);
            float *dx = calloc((size_t)n, sizeof *dx), *dt = malloc((size_t)s->heads * sizeof *dt);
            memcpy(dt, dt0, (size_t)s->heads * sizeof *dt);
            kiln_l2norm_scale_forward(y, inv, x, tt, rows, s->heads, s->dim, scale, eps);
            kiln_l2norm_scale_backward(dx, with_t ? dt : NULL, dy, x, tt, inv, rows, s->heads, s->dim, scale, eps);
            kiln_bf16 *dxi = gt_up_bf16(x, n), *ddy = gt_up_bf16(dy, n), *dyo = gt_dev((size_t)n * 2),
                      *ddx = gt_dev((size_t)n * 2);
            float *dtv = gt_up_f32(t, s->heads), *ddt = gt_up_f32(dt0, s->heads), *dinv = gt_dev((size_t)nv * 4);
            CHECK_OK(kiln_l2norm_scale_forward_cuda(dyo, dinv, dxi, with_t ? dtv : NULL, rows, s->heads, s->dim, scale,
                                                    eps, NULL));
            CHECK_OK(kiln_l2norm_scale_backward_cuda(ddx, with_t ? ddt : NULL, ddy, dxi, with_t ? dtv : NULL, dinv, rows,
                                                     s->heads, s->dim, scale, eps, NULL));
            float *gy = gt_down_bf16(dyo, n), *ginv = gt_down_f32(dinv, nv), *gdx = gt_down_bf16(ddx, n),
                  *gdt = gt_down_f32(ddt, s->heads);
            GT_CLOSE("l2norm_scale y", gy, y, n, TOL_BF16);
            GT_CLOSE("l2norm_scale inv", ginv, inv, nv, TOL_F32);
            GT_CLOSE("l2norm_scale dx", gdx, dx, n, TOL_BF16);
            if (with_t) GT_CLOSE("l2norm_scale dt (+=)", gdt, dt, s->heads, TOL_SUM);
            kiln_cuda_free(dxi), kiln_cuda_free(ddy), kiln_cuda_free(dyo), kiln_cuda_free(ddx), kiln_cuda_free(dtv);
            kiln_cuda_free(ddt), kiln_cuda_free(dinv);
            free(y), free(inv), free(dx), free(dt), free(gy), free(ginv), free(gdx), free(gdt);
        }
        free(x), free(dy), free(t), free(dt0);
    }
}

TEST(gpu_ops_rope) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 22);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const qk_shape *s = &shapes[si];
        const int64_t n = s->b * s->t * s->heads * s->dim;
        int64_t rot;
        float *dfreq = dev_inv_freq(s, &rot);
        float inv_freq[1024];
        kiln_rope_inv_freq(inv_freq, s->dim, s->partial, 10000.0);
        printf("  b=%lld t=%lld heads=%lld dim=%lld rot=%lld pos0=%lld\n", (long long)s->b, (long long)s->t,
               (long long)s->heads, (long long)s->dim, (long long)rot, (long long)s->pos0);
        float *x = gt_rand(&rng, n, 2.0f), *g = gt_rand(&rng, n, 1.0f);
        gt_round_bf16(x, n), gt_round_bf16(g, n);
        kiln_bf16 *dx = gt_up_bf16(x, n), *dg = gt_up_bf16(g, n);
        CHECK_OK(kiln_rope_forward_cuda(dx, dfreq, s->b, s->t, s->heads, s->dim, rot, s->pos0, NULL));
        CHECK_OK(kiln_rope_backward_cuda(dg, dfreq, s->b, s->t, s->heads, s->dim, rot, s->pos0, NULL));
        kiln_rope_forward(x, inv_freq, s->b, s->t, s->heads, s->dim, rot, s->pos0);
        kiln_rope_backward(g, inv_freq, s->b, s->t, s->heads, s->dim, rot, s->pos0);
        float *gx = gt_down_bf16(dx, n), *gg = gt_down_bf16(dg, n);
        GT_CLOSE("rope forward", gx, x, n, TOL_BF16);
        GT_CLOSE("rope backward", gg, g, n, TOL_BF16);
        kiln_cuda_free(dfreq), kiln_cuda_free(dx), kiln_cuda_free(dg);
        free(x), free(g), free(gx), free(gg);
    }
}

TEST(gpu_ops_qk_norm_rope_fused) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 23);
    const float eps = FLT_EPSILON;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const qk_shape *s = &shapes[si];
        const int64_t rows = s->b * s->t, n = rows * s->heads * s->dim, nv = rows * s->heads;
        const float scale = sqrtf((float)s->dim);
        int64_t rot;
        float *dfreq = dev_inv_freq(s, &rot);
        float inv_freq[1024];
        kiln_rope_inv_freq(inv_freq, s->dim, s->partial, 10000.0);
        printf("  b=%lld t=%lld heads=%lld dim=%lld rot=%lld\n", (long long)s->b, (long long)s->t, (long long)s->heads,
               (long long)s->dim, (long long)rot);
        float *x = gt_rand(&rng, n, 3.0f), *dy = gt_rand(&rng, n, 1.0f), *t = gt_rand(&rng, s->heads, 0.5f);
        float *dt0 = gt_rand(&rng, s->heads, 0.5f);
        for (int64_t h = 0; h < s->heads; h++) t[h] += 1.0f;
        gt_round_bf16(x, n), gt_round_bf16(dy, n);
        /* reference: the model's two CPU steps in f32 */
        float *y = malloc((size_t)n * sizeof *y), *inv = malloc((size_t)nv * sizeof *inv);
        float *g = malloc((size_t)n * sizeof *g), *dx = calloc((size_t)n, sizeof *dx);
        float *dt = malloc((size_t)s->heads * sizeof *dt);
        memcpy(dt, dt0, (size_t)s->heads * sizeof *dt);
        kiln_l2norm_scale_forward(y, inv, x, t, rows, s->heads, s->dim, scale, eps);
        kiln_rope_forward(y, inv_freq, s->b, s->t, s->heads, s->dim, rot, s->pos0);
        memcpy(g, dy, (size_t)n * sizeof *g);
        kiln_rope_backward(g, inv_freq, s->b, s->t, s->heads, s->dim, rot, s->pos0);
        kiln_l2norm_scale_backward(dx, dt, g, x, t, inv, rows, s->heads, s->dim, scale, eps);

        kiln_bf16 *dxi = gt_up_bf16(x, n), *ddy = gt_up_bf16(dy, n), *dyo = gt_dev((size_t)n * 2),
                  *ddx = gt_dev((size_t)n * 2);
        float *dtv = gt_up_f32(t, s->heads), *ddt = gt_up_f32(dt0, s->heads), *dinv = gt_dev((size_t)nv * 4);
        CHECK_OK(kiln_qk_norm_rope_forward_cuda(dyo, dinv, dxi, dtv, dfreq, s->b, s->t, s->heads, s->dim, rot, s->pos0,
                                                scale, eps, NULL));
        CHECK_OK(kiln_qk_norm_rope_backward_cuda(ddx, ddt, ddy, dxi, dtv, dinv, dfreq, s->b, s->t, s->heads, s->dim, rot,
                                                 s->pos0, scale, eps, NULL));
        float *gy = gt_down_bf16(dyo, n), *ginv = gt_down_f32(dinv, nv), *gdx = gt_down_bf16(ddx, n),
              *gdt = gt_down_f32(ddt, s->heads);
        GT_CLOSE("qk_norm_rope y", gy, y, n, TOL_BF16);
        GT_CLOSE("qk_norm_rope inv", ginv, inv, nv, TOL_F32);
        GT_CLOSE("qk_norm_rope dx", gdx, dx, n, TOL_BF16);
        GT_CLOSE("qk_norm_rope dt (+=)", gdt, dt, s->heads, TOL_SUM);
        /* deterministic dt */
        CHECK_OK(kiln_cuda_copy(ddt, dt0, (size_t)s->heads * sizeof(float), KILN_CUDA_H2D));
        CHECK_OK(kiln_qk_norm_rope_backward_cuda(ddx, ddt, ddy, dxi, dtv, dinv, dfreq, s->b, s->t, s->heads, s->dim, rot,
                                                 s->pos0, scale, eps, NULL));
        float *gdt2 = gt_down_f32(ddt, s->heads);
        CHECK_MSG(!memcmp(gdt, gdt2, (size_t)s->heads * sizeof(float)), "qk_norm_rope dt differs between two runs");
        kiln_cuda_free(dfreq), kiln_cuda_free(dxi), kiln_cuda_free(ddy), kiln_cuda_free(dyo), kiln_cuda_free(ddx);
        kiln_cuda_free(dtv), kiln_cuda_free(ddt), kiln_cuda_free(dinv);
        free(x), free(dy), free(t), free(dt0), free(y), free(inv), free(g), free(dx), free(dt), free(gy), free(ginv);
        free(gdx), free(gdt), free(gdt2);
    }
}

TEST(gpu_ops_l2norm_clamp) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 24);
    const int64_t rows = 3, heads = 2, dim = 16, n = rows * heads * dim, nv = rows * heads;
    const float eps = FLT_EPSILON, scale = 4.0f;
    float *x = gt_rand(&rng, n, 1.0f), *dy = gt_rand(&rng, n, 1.0f), t[2] = {0.5f, 1.5f}, dt[2] = {0, 0};
    memset(x + 1 * dim, 0, (size_t)dim * sizeof(float));
    memset(x + 4 * dim, 0, (size_t)dim * sizeof(float));
    gt_round_bf16(x, n), gt_round_bf16(dy, n);
    float *y = malloc((size_t)n * sizeof *y), *inv = malloc((size_t)nv * sizeof *inv), *dx = calloc((size_t)n, sizeof *dx);
    kiln_l2norm_scale_forward(y, inv, x, t, rows, heads, dim, scale, eps);
    kiln_l2norm_scale_backward(dx, dt, dy, x, t, inv, rows, heads, dim, scale, eps);
    kiln_bf16 *dxi = gt_up_bf16(x, n), *ddy = gt_up_bf16(dy, n), *dyo = gt_dev((size_t)n * 2), *ddx = gt_dev((size_t)n * 2);
    float zero[2] = {0, 0};
    float *dtv = gt_up_f32(t, 2), *ddt = gt_up_f32(zero, 2), *dinv = gt_dev((size_t)nv * 4);
    CHECK_OK(kiln_l2norm_scale_forward_cuda(dyo, dinv, dxi, dtv, rows, heads, dim, scale, eps, NULL));
    CHECK_OK(kiln_l2norm_scale_backward_cuda(ddx, ddt, ddy, dxi, dtv, dinv, rows, heads, dim, scale, eps, NULL));
    float *gy = gt_down_bf16(dyo, n), *ginv = gt_down_f32(dinv, nv), *gdx = gt_down_bf16(ddx, n), *gdt = gt_down_f32(ddt, 2);
    GT_CLOSE("clamped y", gy, y, n, TOL_BF16);
    GT_CLOSE("clamped inv", ginv, inv, nv, TOL_F32);
    GT_CLOSE("clamped dx", gdx, dx, n, TOL_BF16);
    GT_CLOSE("clamped dt", gdt, dt, 2, TOL_SUM);
    CHECK(ginv[1] == inv[1] && ginv[4] == inv[4]);
    kiln_cuda_free(dxi), kiln_cuda_free(ddy), kiln_cuda_free(dyo), kiln_cuda_free(ddx), kiln_cuda_free(dtv);
    kiln_cuda_free(ddt), kiln_cuda_free(dinv);
    free(x), free(dy), free(y), free(inv), free(dx), free(gy), free(ginv), free(gdx), free(gdt);
}
