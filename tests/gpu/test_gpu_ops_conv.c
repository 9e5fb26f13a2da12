/* CCA's causal convolutions on the device against kiln_cca_conv_forward/backward. Tolerances:
 *   mid (f32, a few products per element): 1e-5; dmid (f32, k1*C/groups products): 1e-5;
 *   y, dx (bf16): 5e-3, one bf16 rounding (at most 2^-8) plus f32 math;
 *   dw0, db0, dw1, db1 (f32 sums over all B*T steps, accumulated onto random values): 3e-5.
 * Shapes: the model's (C/groups = head dim 128, k0 = k1 = 2) over more than one 512-step chunk, with and
 * without a history, one channel per group, kernels of 1 and 3, odd sizes. The weight gradients are
 * also checked bitwise repeatable. Both implementations of the grouped stage's GEMMs run: the SIMT f32
 * tiles and the tensor cores' 3xTF32 (KILN_CCA_CONV=tensor), under the same f32 tolerances. */
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

#define TOL_BF16 5e-3
#define TOL_F32 1e-5
#define TOL_SUM 3e-5

static void conv_cases(void) {
    static const struct {
        kiln_conv_shape s;
        int hist;
    } cases[] = {{{2, 37, 12, 3, 2, 2}, 0}, {{2, 37, 12, 3, 2, 2}, 1}, {{1, 600, 256, 2, 2, 2}, 0},
                 {{3, 5, 6, 6, 1, 3}, 1},   {{2, 70, 40, 4, 3, 1}, 0},  {{1, 1030, 1280, 10, 2, 2}, 0}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 51);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const kiln_conv_shape *s = &cases[ci].s;
        const int64_t B = s->B, T = s->T, C = s->C, cg = C / s->groups, k0 = s->k0, k1 = s->k1;
        const int64_t P = (k0 - 1) + (k1 - 1), M = T + k1 - 1, nx = B * T * C, nm = B * M * C, nh = B * P * C;
        printf("  B=%lld T=%lld C=%lld groups=%lld k0=%lld k1=%lld%s\n", (long long)B, (long long)T, (long long)C,
               (long long)s->groups, (long long)k0, (long long)k1, cases[ci].hist ? " with history" : "");
        float *x = gt_rand(&rng, nx, 1.0f), *hist = cases[ci].hist ? gt_rand(&rng, nh ? nh : 1, 1.0f) : NULL;
        float *w0 = gt_rand(&rng, C * k0, 0.7f), *b0 = gt_rand(&rng, C, 0.3f);
        float *w1 = gt_rand(&rng, C * cg * k1, 1.0f / sqrtf((float)(cg * k1))), *b1 = gt_rand(&rng, C, 0.3f);
        float *dy = gt_rand(&rng, nx, 1.0f);
        float *dw00 = gt_rand(&rng, C * k0, 0.5f), *db00 = gt_rand(&rng, C, 0.5f);
        float *dw10 = gt_rand(&rng, C * cg * k1, 0.5f), *db10 = gt_rand(&rng, C, 0.5f);
        gt_round_bf16(x, nx), gt_round_bf16(dy, nx);
        if (hist) gt_round_bf16(hist, nh);
        /* reference */
        float *y = malloc((size_t)nx * sizeof *y), *mid = malloc((size_t)nm * sizeof *mid);
        float *dx = calloc((size_t)nx, sizeof *dx), *dmid = malloc((size_t)nm * sizeof *dmid);
        float *dw0 = malloc((size_t)(C * k0) * sizeof *dw0), *db0 = malloc((size_t)C * sizeof *db0);
        float *dw1 = malloc((size_t)(C * cg * k1) * sizeof *dw1), *db1 = malloc((size_t)C * sizeof *db1);
        memcpy(dw0, dw00, (size_t)(C * k0) * sizeof *dw0), memcpy(db0, db00, (size_t)C * sizeof *db0);
        memcpy(dw1, dw10, (size_t)(C * cg * k1) * sizeof *dw1), memcpy(db1, db10, (size_t)C * sizeof *db1);
        kiln_cca_conv_forward(y, mid, x, hist, w0, b0, w1, b1, s);
        kiln_cca_conv_backward(dx, dw0, db0, dw1, db1, dmid, dy, x, hist, mid, w0, w1, s);
        /* device */
        kiln_bf16 *dxi = gt_up_bf16(x, nx), *dhi = hist ? gt_up_bf16(hist, nh) : NULL, *ddy = gt_up_bf16(dy, nx);
        kiln_bf16 *dyo = gt_dev((size_t)nx * 2), *ddx = gt_dev((size_t)nx * 2);
        float *dw0v = gt_up_f32(w0, C * k0), *db0v = gt_up_f32(b0, C), *dw1v = gt_up_f32(w1, C * cg * k1),
              *db1v = gt_up_f32(b1, C);
        float *dmidv = gt_dev((size_t)nm * 4), *ddmid = gt_dev((size_t)nm * 4);
        float *gdw0 = gt_up_f32(dw00, C * k0), *gdb0 = gt_up_f32(db00, C), *gdw1 = gt_up_f32(dw10, C * cg * k1),
              *gdb1 = gt_up_f32(db10, C);
        CHECK_OK(kiln_cca_conv_forward_cuda(dyo, dmidv, dxi, dhi, dw0v, db0v, dw1v, db1v, s, NULL));
        CHECK_OK(kiln_cca_conv_backward_cuda(ddx, gdw0, gdb0, gdw1, gdb1, ddmid, ddy, dxi, dhi, dmidv, dw0v, dw1v, s,
                                             NULL));
        float *hy = gt_down_bf16(dyo, nx), *hmid = gt_down_f32(dmidv, nm), *hdx = gt_down_bf16(ddx, nx);
        float *hdmid = gt_down_f32(ddmid, nm), *hdw0 = gt_down_f32(gdw0, C * k0), *hdb0 = gt_down_f32(gdb0, C);
        float *hdw1 = gt_down_f32(gdw1, C * cg * k1), *hdb1 = gt_down_f32(gdb1, C);
        GT_CLOSE("cca_conv mid", hmid, mid, nm, TOL_F32);
        GT_CLOSE("cca_conv y", hy, y, nx, TOL_BF16);
        GT_CLOSE("cca_conv dmid", hdmid, dmid, nm, TOL_F32);
        GT_CLOSE("cca_conv dx", hdx, dx, nx, TOL_BF16);
        GT_CLOSE("cca_conv dw0 (+=)", hdw0, dw0, C * k0, TOL_SUM);
        GT_CLOSE("cca_conv db0 (+=)", hdb0, db0, C, TOL_SUM);
        GT_CLOSE("cca_conv dw1 (+=)", hdw1, dw1, C * cg * k1, TOL_SUM);
        GT_CLOSE("cca_conv db1 (+=)", hdb1, db1, C, TOL_SUM);
        /* the weight gradients again, from the same starting values: the same bits */
        CHECK_OK(kiln_cuda_copy(gdw0, dw00, (size_t)(C * k0) * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdw1, dw10, (size_t)(C * cg * k1) * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cca_conv_backward_cuda(NULL, gdw0, NULL, gdw1, NULL, ddmid, ddy, dxi, dhi, dmidv, dw0v, dw1v, s,
                                             NULL));
        float *hdw0b = gt_down_f32(gdw0, C * k0), *hdw1b = gt_down_f32(gdw1, C * cg * k1);
        CHECK_MSG(!memcmp(hdw0, hdw0b, (size_t)(C * k0) * 4) && !memcmp(hdw1, hdw1b, (size_t)(C * cg * k1) * 4),
                  "cca_conv weight gradients differ between two runs");
        kiln_cuda_free(dxi), kiln_cuda_free(dhi), kiln_cuda_free(ddy), kiln_cuda_free(dyo), kiln_cuda_free(ddx);
        kiln_cuda_free(dw0v), kiln_cuda_free(db0v), kiln_cuda_free(dw1v), kiln_cuda_free(db1v), kiln_cuda_free(dmidv);
        kiln_cuda_free(ddmid), kiln_cuda_free(gdw0), kiln_cuda_free(gdb0), kiln_cuda_free(gdw1), kiln_cuda_free(gdb1);
        free(x), free(hist), free(w0), free(b0), free(w1), free(b1), free(dy), free(dw00), free(db00), free(dw10);
        free(db10), free(y), free(mid), free(dx), free(dmid), free(dw0), free(db0), free(dw1), free(db1), free(hy);
        free(hmid), free(hdx), free(hdmid), free(hdw0), free(hdb0), free(hdw1), free(hdb1), free(hdw0b), free(hdw1b);
    }
    /* a bad shape is an error naming the op */
    kiln_conv_shape bad = {1, 4, 10, 3, 2, 2};
    CHECK_ERR(kiln_cca_conv_forward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &bad, NULL), "cca_conv forward");
}

TEST(gpu_ops_cca_conv) {
    setenv("KILN_CCA_CONV", "simt", 1);
    conv_cases();
    unsetenv("KILN_CCA_CONV");
}

TEST(gpu_ops_cca_conv_tensor_cores) {
    setenv("KILN_CCA_CONV", "tensor", 1);
    conv_cases();
    unsetenv("KILN_CCA_CONV");
}
