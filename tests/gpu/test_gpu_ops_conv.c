/* CCA's causal convolutions on the device against kiln_cca_conv_forward/backward. Tolerances:
 *   mid (f32, a few products per element): 1e-5; dmid (f32, k1*C/groups products): 1e-5;
 *   y, dx (bf16): 5e-3, one bf16 rounding (at most 2^-8) plus f32 math;
 *   dw0, db0, dw1, db1 (f32 sums over all B*T steps, accumulated onto random values): 3e-5.
 * Shapes: the model's (C/groups = head dim 128, k0 = k1 = 2) over more than one 512-step chunk, with and
 * without a history, one channel per group, kernels of 1 and 3, odd sizes. The weight gradients are
 * also checked bitwise repeatable. Both implementations of the grouped stage's GEMMs run: the SIMT f32
 * tiles and the tensor cores' 3xTF32 (KILN_CCA_CONV=tensor), under the same f32 tolerances.
 *
 * The training path's fused form (kiln_cca_conv_couple_*_cuda: bf16 mid, bf16 tensor cores, the coupling in
 * the epilogues) against the CPU convolution followed by the coupling's loops (zaya_forward.c /
 * zaya_backward.c, repeated below). Tolerances:
 *   mid 5e-3 (one bf16 rounding); dq, dk 5e-3 (one rounding of an f32 result: dy is exact bf16 and w1 enters
 *   as hi + lo bf16, ~16 significant bits); dmid 1e-4 (f32 from those operands); with KILN_CCA_W1=bf16 (w1's
 *   bf16 rounding alone: 2^-9 relative a weight, random over the cg*k1 terms of an output; run s16r6 measured
 *   dmid 2.1e-3, dq/dk 3.5e-3, dw0/db0 2.4e-3) dmid 5e-3, dq, dk 1e-2 and dw0, db0 (sums over dmid) 1e-2;
 *   with dmid stored in bf16 (the wgmma path's default: one more rounding, 2^-9 relative, of dmid and of what is
 *   summed from it; session 26 measured dmid 2.4e-3, dq/dk 4.1e-3, dw0/db0 1.9e-3) dmid 5e-3 (1e-2 with w1 in
 *   bf16), dq, dk, dw0, db0 1e-2;
 *   qpre, kpre and dw1 1e-2: they multiply the bf16-rounded mid (2^-8 relative per term, random over the
 *   cg*k1 terms of an output or the steps of a weight gradient, ~u/sqrt(3) of the result's spread) and
 *   qpre/kpre add their own rounding; db1, dw0, db0 1e-4 (f32 sums of exact or f32 terms).
 * Shapes: the model's heads (8 query / 2 KV of 128, kernels 2 and 2) over more than one dw1 chunk and with two
 * sequences (the pipelined 128 x 128 kernels and the persistent input-gradient one; again on the 128 x 128 tiles
 * alone with KILN_CCA_TILE=128 and on the 64 x 64 tiles with KILN_CCA_TILE=64), head dim 64
 * with kernels 1 and 3 (64 x 64 vector path, K across taps), and odd shapes (element path): G = 1, G = 6 with
 * k1 = 1; depthwise kernels of 3 and 4 taps on 16-byte paths, and of 5 taps (past the 16-byte depthwise kernels'
 * 4: the element kernels). Bitwise repeatable weight gradients. q and k (and dq, dk) also as columns of one
 * packed buffer: rows Q + 2K apart (the model's packed projections; bit for bit the dense layout's results,
 * the other columns untouched) and Q + K + 1 apart (odd: the element kernels, at the tolerances above). */
#include <math.h>
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

/* zaya_forward.c's coupling: qpre/kpre from the convolution output and the packed q|k */
static void ref_couple_fwd(float *qpre, float *kpre, const float *conv, const float *qk, int64_t N, int64_t NH,
                           int64_t KV, int64_t D) {
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++)
                qpre[n * Q + h * D + d] =
                    conv[n * C + h * D + d] + (qk[n * C + h * D + d] + qk[n * C + Q + (h / G) * D + d]) * 0.5f;
        for (int64_t j = 0; j < KV; j++)
            for (int64_t d = 0; d < D; d++) {
                float s = 0;
                for (int64_t g = 0; g < G; g++) s += (qk[n * C + (j * G + g) * D + d] + qk[n * C + Q + j * D + d]) * 0.5f;
                kpre[n * K + j * D + d] = conv[n * C + Q + j * D + d] + s / (float)G;
            }
    }
}
/* zaya_backward.c: the convolution's dy = [dqpre | dkpre]; dq/dk = the coupling's adjoint + the conv's dx */
static void ref_couple_bwd(float *dq, float *dk, const float *dqp, const float *dkp, const float *dx, int64_t N,
                           int64_t NH, int64_t KV, int64_t D) {
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV;
    memset(dq, 0, (size_t)(N * Q) * sizeof *dq);
    memset(dk, 0, (size_t)(N * K) * sizeof *dk);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++) {
                float dqres = dqp[n * Q + h * D + d] + dkp[n * K + (h / G) * D + d] / (float)G;
                dq[n * Q + h * D + d] += 0.5f * dqres;
                dk[n * K + (h / G) * D + d] += 0.5f * dqres;
            }
        for (int64_t j = 0; j < Q; j++) dq[n * Q + j] += dx[n * C + j];
        for (int64_t j = 0; j < K; j++) dk[n * K + j] += dx[n * C + Q + j];
    }
}

static void fused_cases(size_t ncases) {
    static const struct {
        int64_t B, T, NH, KV, D, k0, k1;
    } cases[] = {{1, 1100, 8, 2, 128, 2, 2}, {2, 200, 8, 2, 128, 2, 2}, {2, 50, 2, 1, 64, 1, 3},
                 {2, 37, 3, 3, 5, 2, 2},     {3, 70, 6, 1, 33, 3, 1},   {2, 45, 4, 2, 64, 3, 2},
                 {1, 30, 2, 2, 16, 4, 1},    {2, 40, 2, 1, 16, 5, 2}};
    /* the grouped GEMMs' weight: hi + lo (the default) or its bf16 rounding alone (KILN_CCA_W1=bf16) */
    const char *w1m = getenv("KILN_CCA_W1");
    const int hilo = !(w1m && !strcmp(w1m, "bf16"));
    kiln_rng rng;
    kiln_rng_seed(&rng, 52);
    for (size_t ci = 0; ci < ncases && ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t B = cases[ci].B, T = cases[ci].T, NH = cases[ci].NH, KV = cases[ci].KV, D = cases[ci].D;
        const int64_t Q = NH * D, K = KV * D, C = Q + K, N = B * T, k0 = cases[ci].k0, k1 = cases[ci].k1;
        const kiln_conv_shape s = {B, T, C, NH + KV, k0, k1};
        const int64_t M = T + k1 - 1, nx = N * C, nm = B * M * C, n1 = C * D * k1;
        printf("  B=%lld T=%lld heads=%lld kv=%lld dim=%lld k0=%lld k1=%lld\n", (long long)B, (long long)T,
               (long long)NH, (long long)KV, (long long)D, (long long)k0, (long long)k1);
        float *x = gt_rand(&rng, nx, 1.0f), *w0 = gt_rand(&rng, C * k0, 0.7f), *b0 = gt_rand(&rng, C, 0.3f);
        float *w1 = gt_rand(&rng, n1, 1.0f / sqrtf((float)(D * k1))), *b1 = gt_rand(&rng, C, 0.3f);
        float *dqp = gt_rand(&rng, N * Q, 1.0f), *dkp = gt_rand(&rng, N * K, 1.0f);
        float *dw00 = gt_rand(&rng, C * k0, 0.5f), *db00 = gt_rand(&rng, C, 0.5f);
        float *dw10 = gt_rand(&rng, n1, 0.5f), *db10 = gt_rand(&rng, C, 0.5f);
        gt_round_bf16(x, nx), gt_round_bf16(dqp, N * Q), gt_round_bf16(dkp, N * K);
        /* reference: convolution, coupling; backward through both */
        float *y = malloc((size_t)nx * 4), *mid = malloc((size_t)nm * 4), *qpre = malloc((size_t)(N * Q) * 4);
        float *kpre = malloc((size_t)(N * K) * 4), *dy = malloc((size_t)nx * 4), *dx = calloc((size_t)nx, 4);
        float *dmid = malloc((size_t)nm * 4), *dq = malloc((size_t)(N * Q) * 4), *dk = malloc((size_t)(N * K) * 4);
        float *dw0 = malloc((size_t)(C * k0) * 4), *db0 = malloc((size_t)C * 4), *dw1 = malloc((size_t)n1 * 4);
        float *db1 = malloc((size_t)C * 4);
        memcpy(dw0, dw00, (size_t)(C * k0) * 4), memcpy(db0, db00, (size_t)C * 4);
        memcpy(dw1, dw10, (size_t)n1 * 4), memcpy(db1, db10, (size_t)C * 4);
        kiln_cca_conv_forward(y, mid, x, NULL, w0, b0, w1, b1, &s);
        ref_couple_fwd(qpre, kpre, y, x, N, NH, KV, D);
        for (int64_t n = 0; n < N; n++) {
            memcpy(dy + n * C, dqp + n * Q, (size_t)Q * 4);
            memcpy(dy + n * C + Q, dkp + n * K, (size_t)K * 4);
        }
        kiln_cca_conv_backward(dx, dw0, db0, dw1, db1, dmid, dy, x, NULL, mid, w0, w1, &s);
        ref_couple_bwd(dq, dk, dqp, dkp, dx, N, NH, KV, D);
        /* device */
        float *xq = malloc((size_t)(N * Q) * 4), *xk = malloc((size_t)(N * K) * 4); /* x = [q | k] as the projections write it */
        for (int64_t n = 0; n < N; n++) {
            memcpy(xq + n * Q, x + n * C, (size_t)Q * 4);
            memcpy(xk + n * K, x + n * C + Q, (size_t)K * 4);
        }
        kiln_bf16 *gxq = gt_up_bf16(xq, N * Q), *gxk = gt_up_bf16(xk, N * K);
        kiln_bf16 *gdqp = gt_up_bf16(dqp, N * Q), *gdkp = gt_up_bf16(dkp, N * K);
        kiln_bf16 *gmid = gt_dev((size_t)nm * 2), *gqpre = gt_dev((size_t)(N * Q) * 2), *gkpre = gt_dev((size_t)(N * K) * 2);
        kiln_bf16 *gdq = gt_dev((size_t)(N * Q) * 2), *gdk = gt_dev((size_t)(N * K) * 2);
        float *gw0 = gt_up_f32(w0, C * k0), *gb0 = gt_up_f32(b0, C), *gw1 = gt_up_f32(w1, n1), *gb1 = gt_up_f32(b1, C);
        float *gdmid = gt_dev((size_t)nm * 4), *gdw0 = gt_up_f32(dw00, C * k0), *gdb0 = gt_up_f32(db00, C);
        float *gdw1 = gt_up_f32(dw10, n1), *gdb1 = gt_up_f32(db10, C);
        CHECK_OK(kiln_cca_conv_couple_forward_cuda(gqpre, gkpre, gmid, gxq, gxk, gw0, gb0, gw1, gb1, &s, NH, KV, 0, 0, NULL));
        int dbf = -1;
        CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdq, gdk, gdw0, gdb0, gdw1, gdb1, gdmid, &dbf, gdqp, gdkp, gxq, gxk,
                                                    gmid, gw0, gw1, &s, NH, KV, 0, 0, NULL));
        CHECK_MSG(dbf == 0 || dbf == 1, "dmid's type was not reported");
        CHECK_MSG(!(dbf && getenv("KILN_CCA_DMID") && !strcmp(getenv("KILN_CCA_DMID"), "f32")),
                  "dmid in bf16 under KILN_CCA_DMID=f32");
        /* dmid in bf16 (where the wgmma kernels take the call): one more rounding, 2^-9 relative, of dmid and of
         * what is summed from it (dq, dk through dx; dw0, db0) */
        const double tol_dmid = dbf ? (hilo ? 5e-3 : 1e-2) : (hilo ? 1e-4 : 5e-3);
        const double tol_dx = hilo && !dbf ? 5e-3 : 1e-2, tol_dw0 = hilo && !dbf ? 1e-4 : 1e-2;
        printf("    dmid %s\n", dbf ? "bf16" : "f32");
        float *hmid = gt_down_bf16(gmid, nm), *hqpre = gt_down_bf16(gqpre, N * Q), *hkpre = gt_down_bf16(gkpre, N * K);
        float *hdq = gt_down_bf16(gdq, N * Q), *hdk = gt_down_bf16(gdk, N * K);
        float *hdmid = dbf ? gt_down_bf16((const kiln_bf16 *)gdmid, nm) : gt_down_f32(gdmid, nm);
        float *hdw0 = gt_down_f32(gdw0, C * k0), *hdb0 = gt_down_f32(gdb0, C), *hdw1 = gt_down_f32(gdw1, n1);
        float *hdb1 = gt_down_f32(gdb1, C);
        GT_CLOSE("fused mid (bf16)", hmid, mid, nm, 5e-3);
        GT_CLOSE("fused qpre", hqpre, qpre, N * Q, 1e-2);
        GT_CLOSE("fused kpre", hkpre, kpre, N * K, 1e-2);
        GT_CLOSE("fused dmid", hdmid, dmid, nm, tol_dmid);
        GT_CLOSE("fused dq", hdq, dq, N * Q, tol_dx);
        GT_CLOSE("fused dk", hdk, dk, N * K, tol_dx);
        GT_CLOSE("fused dw0 (+=)", hdw0, dw0, C * k0, tol_dw0); /* sums over dmid */
        GT_CLOSE("fused db0 (+=)", hdb0, db0, C, tol_dw0);
        GT_CLOSE("fused dw1 (+=)", hdw1, dw1, n1, 1e-2);
        GT_CLOSE("fused db1 (+=)", hdb1, db1, C, 1e-4);
        /* again from the same starting gradients: the same bits everywhere */
        CHECK_OK(kiln_cuda_copy(gdw0, dw00, (size_t)(C * k0) * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdb0, db00, (size_t)C * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdw1, dw10, (size_t)n1 * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdb1, db10, (size_t)C * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdq, gdk, gdw0, gdb0, gdw1, gdb1, gdmid, NULL, gdqp, gdkp, gxq, gxk,
                                                    gmid, gw0, gw1, &s, NH, KV, 0, 0, NULL));
        float *r_dq = gt_down_bf16(gdq, N * Q), *r_dk = gt_down_bf16(gdk, N * K), *r_dw0 = gt_down_f32(gdw0, C * k0);
        float *r_db0 = gt_down_f32(gdb0, C), *r_dw1 = gt_down_f32(gdw1, n1), *r_db1 = gt_down_f32(gdb1, C);
        CHECK_MSG(!memcmp(r_dq, hdq, (size_t)(N * Q) * 4) && !memcmp(r_dk, hdk, (size_t)(N * K) * 4) &&
                      !memcmp(r_dw0, hdw0, (size_t)(C * k0) * 4) && !memcmp(r_db0, hdb0, (size_t)C * 4) &&
                      !memcmp(r_dw1, hdw1, (size_t)n1 * 4) && !memcmp(r_db1, hdb1, (size_t)C * 4),
                  "fused cca_conv backward differs between two runs");
        /* q and k as columns of one packed projection output (the model's layout: [q | k | v halves], rows
         * Q + 2K apart, and dq / dk written into the same layout): the same kernels, so the same bits as
         * above, and the other columns untouched; then rows Q + K + 1 apart (odd: the element kernels), against
         * the reference at the tolerances above */
        for (int lt = 0; lt < 2; lt++) {
            const int64_t P = lt == 0 ? Q + 2 * K : Q + K + 1;
            float *xp = gt_rand(&rng, N * P, 1.0f), *fill = gt_rand(&rng, N * P, 1.0f);
            gt_round_bf16(fill, N * P);
            for (int64_t n = 0; n < N; n++) memcpy(xp + n * P, x + n * C, (size_t)C * 4);
            kiln_bf16 *gxp = gt_up_bf16(xp, N * P), *gdp = gt_up_bf16(fill, N * P);
            CHECK_OK(kiln_cuda_copy(gdw0, dw00, (size_t)(C * k0) * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cuda_copy(gdb0, db00, (size_t)C * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cuda_copy(gdw1, dw10, (size_t)n1 * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cuda_copy(gdb1, db10, (size_t)C * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cca_conv_couple_forward_cuda(gqpre, gkpre, gmid, gxp, gxp + Q, gw0, gb0, gw1, gb1, &s, NH, KV,
                                                       P, P, NULL));
            int pbf = -1;
            CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdp, gdp + Q, gdw0, gdb0, gdw1, gdb1, gdmid, &pbf, gdqp, gdkp, gxp,
                                                        gxp + Q, gmid, gw0, gw1, &s, NH, KV, P, P, NULL));
            float *pmid = gt_down_bf16(gmid, nm), *pqpre = gt_down_bf16(gqpre, N * Q), *pkpre = gt_down_bf16(gkpre, N * K);
            float *pd = gt_down_bf16(gdp, N * P), *pdw0 = gt_down_f32(gdw0, C * k0), *pdb0 = gt_down_f32(gdb0, C);
            float *pdw1 = gt_down_f32(gdw1, n1), *pdb1 = gt_down_f32(gdb1, C);
            float *pdq = malloc((size_t)(N * Q) * 4), *pdk = malloc((size_t)(N * K) * 4);
            int others = 1;
            for (int64_t n = 0; n < N; n++) {
                memcpy(pdq + n * Q, pd + n * P, (size_t)Q * 4);
                memcpy(pdk + n * K, pd + n * P + Q, (size_t)K * 4);
                others &= !memcmp(pd + n * P + C, fill + n * P + C, (size_t)(P - C) * 4);
            }
            printf("    q and k in rows %lld apart, dmid %s\n", (long long)P, pbf ? "bf16" : "f32");
            CHECK_MSG(lt == 1 || pbf == dbf, "rows %lld apart: dmid's type differs from the dense layout's", (long long)P);
            CHECK_MSG(others, "rows %lld apart: the columns past q and k were written", (long long)P);
            if (lt == 0) {
                CHECK_MSG(!memcmp(pmid, hmid, (size_t)nm * 4) && !memcmp(pqpre, hqpre, (size_t)(N * Q) * 4) &&
                              !memcmp(pkpre, hkpre, (size_t)(N * K) * 4) && !memcmp(pdq, hdq, (size_t)(N * Q) * 4) &&
                              !memcmp(pdk, hdk, (size_t)(N * K) * 4) && !memcmp(pdw0, hdw0, (size_t)(C * k0) * 4) &&
                              !memcmp(pdb0, hdb0, (size_t)C * 4) && !memcmp(pdw1, hdw1, (size_t)n1 * 4) &&
                              !memcmp(pdb1, hdb1, (size_t)C * 4),
                          "rows %lld apart: results differ from the dense layout's", (long long)P);
            } else { /* the element kernels: dmid f32, at most the tolerances above */
                CHECK_MSG(pbf == 0, "rows %lld apart: dmid in bf16 on the element kernels", (long long)P);
                GT_CLOSE("strided mid (bf16)", pmid, mid, nm, 5e-3);
                GT_CLOSE("strided qpre", pqpre, qpre, N * Q, 1e-2);
                GT_CLOSE("strided kpre", pkpre, kpre, N * K, 1e-2);
                GT_CLOSE("strided dq", pdq, dq, N * Q, tol_dx);
                GT_CLOSE("strided dk", pdk, dk, N * K, tol_dx);
                GT_CLOSE("strided dw0 (+=)", pdw0, dw0, C * k0, tol_dw0);
                GT_CLOSE("strided db0 (+=)", pdb0, db0, C, tol_dw0);
                GT_CLOSE("strided dw1 (+=)", pdw1, dw1, n1, 1e-2);
                GT_CLOSE("strided db1 (+=)", pdb1, db1, C, 1e-4);
            }
            kiln_cuda_free(gxp), kiln_cuda_free(gdp);
            free(xp), free(fill), free(pmid), free(pqpre), free(pkpre), free(pd), free(pdw0), free(pdb0), free(pdw1);
            free(pdb1), free(pdq), free(pdk);
        }
        /* a row stride below the channels it holds: an error */
        CHECK_ERR(kiln_cca_conv_couple_forward_cuda(gqpre, gkpre, gmid, gxq, gxk, gw0, gb0, gw1, gb1, &s, NH, KV, Q - 1,
                                                    0, NULL),
                  "row strides");
        kiln_cuda_free(gxq), kiln_cuda_free(gxk), free(xq), free(xk), kiln_cuda_free(gdqp), kiln_cuda_free(gdkp), kiln_cuda_free(gmid), kiln_cuda_free(gqpre);
        kiln_cuda_free(gkpre), kiln_cuda_free(gdq), kiln_cuda_free(gdk), kiln_cuda_free(gw0), kiln_cuda_free(gb0);
        kiln_cuda_free(gw1), kiln_cuda_free(gb1), kiln_cuda_free(gdmid), kiln_cuda_free(gdw0), kiln_cuda_free(gdb0);
        kiln_cuda_free(gdw1), kiln_cuda_free(gdb1);
        free(x), free(w0), free(b0), free(w1), free(b1), free(dqp), free(dkp), free(dw00), free(db00), free(dw10);
        free(db10), free(y), free(mid), free(qpre), free(kpre), free(dy), free(dx), free(dmid), free(dq), free(dk);
        free(dw0), free(db0), free(dw1), free(db1), free(hmid), free(hqpre), free(hkpre), free(hdq), free(hdk);
        free(hdmid), free(hdw0), free(hdb0), free(hdw1), free(hdb1), free(r_dq), free(r_dk), free(r_dw0), free(r_db0);
        free(r_dw1), free(r_db1);
    }
}

TEST(gpu_ops_cca_conv_couple_fused) {
    fused_cases(99);
    /* groups that are not heads + kv heads: an error naming the op */
    kiln_conv_shape bad = {1, 4, 12, 3, 2, 2};
    CHECK_ERR(kiln_cca_conv_couple_forward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &bad, 1, 1, 0, 0, NULL),
              "cca_conv_couple forward");
}

/* w1's bf16 rounding alone in the grouped GEMMs (KILN_CCA_W1=bf16), at its own tolerances */
TEST(gpu_ops_cca_conv_couple_fused_w1_bf16) {
    setenv("KILN_CCA_W1", "bf16", 1);
    fused_cases(99);
    unsetenv("KILN_CCA_W1");
}

/* dmid kept in f32 on the wgmma path (KILN_CCA_DMID=f32), at the f32 tolerances */
TEST(gpu_ops_cca_conv_couple_fused_dmid_f32) {
    setenv("KILN_CCA_DMID", "f32", 1);
    fused_cases(2);
    unsetenv("KILN_CCA_DMID");
}

/* heads of 128 on the 64 x 64 tiles (KILN_CCA_TILE=64) instead of the wgmma forward and the persistent input
 * gradient */
TEST(gpu_ops_cca_conv_couple_fused_tile64) {
    setenv("KILN_CCA_TILE", "64", 1);
    fused_cases(2);
    unsetenv("KILN_CCA_TILE");
}

/* heads of 128 on the pipelined 128 x 128 wmma tiles (KILN_CCA_TILE=128) instead of the wgmma forward and the
 * persistent input gradient */
TEST(gpu_ops_cca_conv_couple_fused_tile128) {
    setenv("KILN_CCA_TILE", "128", 1);
    fused_cases(2);
    unsetenv("KILN_CCA_TILE");
}

/* bf16 values a and b at most one bf16 rounding step apart, or (outputs that cancel to near zero, where the f32
 * sums' different orders show) 3e-5 apart: ~256 terms of O(1) summed in f32, 2^-24 each */
static int within_ulp(float a, float b) {
    const float m = fabsf(a) > fabsf(b) ? fabsf(a) : fabsf(b);
    int e;
    frexpf(m, &e); /* m = f * 2^e, f in [0.5, 1): the bf16 step at m is 2^(e - 8) */
    return fabsf(a - b) <= ldexpf(1.0f, e - 8) || fabsf(a - b) <= 3e-5f;
}

/* The forward's wgmma kernel (cca_conv_wg.cu: heads of 128 on sm_90, the default there) against grp128_kernel
 * (KILN_CCA_TILE=128) on the same inputs, and the backward's grouped input gradient against grpp_bwd_kernel. Both multiply w1 as hi + lo (or its bf16 rounding alone) with f32
 * accumulation and differ only in the order of the sums, so each bf16 output agrees within one rounding step
 * (or 3e-5 where the sum cancels):
 * 4, 3 and 1 q heads a kv head, sequences ending inside the 128-row tiles, b1 and the coupling, q and k as
 * columns of one packed buffer. Then the depthwise output, which both paths share, bit for bit. */
TEST(gpu_ops_cca_conv_couple_fused_wgmma) {
    static const struct {
        int64_t B, T, NH, KV;
    } cases[] = {{3, 333, 8, 2}, {2, 260, 3, 1}, {1, 129, 4, 4}};
    const int64_t D = 128, k0 = 2, k1 = 2;
    kiln_rng rng;
    kiln_rng_seed(&rng, 57);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int w1m = 0; w1m < 2; w1m++) {
            const int64_t B = cases[ci].B, T = cases[ci].T, NH = cases[ci].NH, KV = cases[ci].KV;
            const int64_t Q = NH * D, K = KV * D, C = Q + K, N = B * T, P = Q + 2 * K, nm = B * (T + k1 - 1) * C;
            const kiln_conv_shape s = {B, T, C, NH + KV, k0, k1};
            if (w1m) setenv("KILN_CCA_W1", "bf16", 1);
            printf("  B=%lld T=%lld heads=%lld kv=%lld, w1 %s\n", (long long)B, (long long)T, (long long)NH,
                   (long long)KV, w1m ? "bf16" : "hi + lo");
            float *xp = gt_rand(&rng, N * P, 1.0f), *w0 = gt_rand(&rng, C * k0, 0.7f), *b0 = gt_rand(&rng, C, 0.3f);
            float *w1 = gt_rand(&rng, C * D * k1, 1.0f / sqrtf((float)(D * k1))), *b1 = gt_rand(&rng, C, 0.3f);
            kiln_bf16 *gxp = gt_up_bf16(xp, N * P), *gmid[2], *gq[2], *gk[2];
            float *gw0 = gt_up_f32(w0, C * k0), *gb0 = gt_up_f32(b0, C), *gw1 = gt_up_f32(w1, C * D * k1);
            float *gb1 = gt_up_f32(b1, C), *hq[2], *hk[2], *hm[2];
            for (int v = 0; v < 2; v++) { /* v = 0: the default (wgmma); 1: grp128_kernel */
                gmid[v] = gt_dev((size_t)nm * 2), gq[v] = gt_dev((size_t)(N * Q) * 2), gk[v] = gt_dev((size_t)(N * K) * 2);
                if (v) setenv("KILN_CCA_TILE", "128", 1);
                CHECK_OK(kiln_cca_conv_couple_forward_cuda(gq[v], gk[v], gmid[v], gxp, gxp + Q, gw0, gb0, gw1, gb1, &s,
                                                           NH, KV, P, P, NULL));
                unsetenv("KILN_CCA_TILE");
                hq[v] = gt_down_bf16(gq[v], N * Q), hk[v] = gt_down_bf16(gk[v], N * K), hm[v] = gt_down_bf16(gmid[v], nm);
            }
            unsetenv("KILN_CCA_W1");
            int64_t far = 0, same = 0;
            for (int64_t i = 0; i < N * Q; i++) far += !within_ulp(hq[0][i], hq[1][i]), same += hq[0][i] == hq[1][i];
            for (int64_t i = 0; i < N * K; i++) far += !within_ulp(hk[0][i], hk[1][i]), same += hk[0][i] == hk[1][i];
            printf("    qpre / kpre: %lld of %lld identical, %lld more than one bf16 step apart\n", (long long)same,
                   (long long)(N * C), (long long)far);
            CHECK_MSG(far == 0, "wgmma against wmma: %lld outputs more than one bf16 step apart", (long long)far);
            CHECK_MSG(same > N * C / 2, "wgmma against wmma: only %lld of %lld outputs identical", (long long)same,
                      (long long)(N * C));
            CHECK_MSG(!memcmp(hm[0], hm[1], (size_t)nm * 4), "the depthwise output differs between the paths");
            { /* the backward's grouped input gradient (dmid, f32): wgmma against the persistent mma.sync kernel
               * (KILN_CCA_BWD=mma); f32 sums of ~256 O(1) products in two orders: within 2e-5 */
                float *dyq = gt_rand(&rng, N * Q, 1.0f), *dyk = gt_rand(&rng, N * K, 1.0f), *hd[2];
                kiln_bf16 *gdyq = gt_up_bf16(dyq, N * Q), *gdyk = gt_up_bf16(dyk, N * K);
                kiln_bf16 *gdp = gt_dev((size_t)(N * P) * 2); /* dq, dk: columns of the packed layout, as q and k */
                float *gdm = gt_dev((size_t)nm * 4);
                if (w1m) setenv("KILN_CCA_W1", "bf16", 1);
                setenv("KILN_CCA_DMID", "f32", 1);
                for (int v = 0; v < 2; v++) {
                    if (v) setenv("KILN_CCA_BWD", "mma", 1);
                    CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdp, gdp + Q, NULL, NULL, NULL, NULL, gdm, NULL, gdyq,
                                                                gdyk, gxp, gxp + Q, gmid[0], gw0, gw1, &s, NH, KV, P, P,
                                                                NULL));
                    unsetenv("KILN_CCA_BWD");
                    hd[v] = gt_down_f32(gdm, nm);
                }
                unsetenv("KILN_CCA_DMID");
                /* the default, dmid in bf16: the same kernel's f32 sums, each rounded once to nearest (bit for bit) */
                int dbf = 0;
                CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdp, gdp + Q, NULL, NULL, NULL, NULL, gdm, &dbf, gdyq, gdyk,
                                                            gxp, gxp + Q, gmid[0], gw0, gw1, &s, NH, KV, P, P, NULL));
                unsetenv("KILN_CCA_W1");
                CHECK_MSG(dbf == 1, "the wgmma input gradient did not store dmid in bf16");
                float *hdb = gt_down_bf16((const kiln_bf16 *)gdm, nm), *hdr = malloc((size_t)nm * 4);
                memcpy(hdr, hd[0], (size_t)nm * 4);
                gt_round_bf16(hdr, nm);
                CHECK_MSG(!memcmp(hdb, hdr, (size_t)nm * 4), "dmid in bf16 is not the f32 dmid rounded to nearest");
                free(hdb), free(hdr);
                double worst = 0;
                for (int64_t i = 0; i < nm; i++) worst = fmax(worst, fabs((double)hd[0][i] - hd[1][i]));
                printf("    dmid: largest difference %.3g; bf16 dmid = the f32 one rounded\n", worst);
                CHECK_MSG(worst <= 2e-5, "wgmma against mma.sync: dmid %.3g apart", worst);
                /* the grouped weights' and bias's gradients (dw1, db1 f32, added to): wgmma (partials of whole
                 * 64-step blocks, one a CTA) against dw1_128_kernel (KILN_CCA_DW1=wmma: chunks of 512 steps); sums of
                 * B*T O(1) products in f32 partials, then f64: within 1e-5 of the sum's scale, relative */
                const int64_t n1 = C * D * k1;
                float *dw1[2], *db1[2];
                float *gdw1 = gt_dev((size_t)n1 * 4), *gdb1 = gt_dev((size_t)C * 4), *z1 = calloc((size_t)n1, 4);
                for (int v = 0; v < 2; v++) {
                    if (v) setenv("KILN_CCA_DW1", "wmma", 1);
                    CHECK_OK(kiln_cuda_copy(gdw1, z1, (size_t)n1 * 4, KILN_CUDA_H2D));
                    CHECK_OK(kiln_cuda_copy(gdb1, z1, (size_t)C * 4, KILN_CUDA_H2D));
                    CHECK_OK(kiln_cca_conv_couple_backward_cuda(gdp, gdp + Q, NULL, NULL, gdw1, gdb1, gdm, NULL, gdyq,
                                                                gdyk, gxp, gxp + Q, gmid[0], gw0, gw1, &s, NH, KV, P, P,
                                                                NULL));
                    unsetenv("KILN_CCA_DW1");
                    dw1[v] = gt_down_f32(gdw1, n1), db1[v] = gt_down_f32(gdb1, C);
                }
                double w_scale = 0, w_worst = 0, b_scale = 0, b_worst = 0;
                for (int64_t i = 0; i < n1; i++)
                    w_scale = fmax(w_scale, fabs(dw1[1][i])), w_worst = fmax(w_worst, fabs((double)dw1[0][i] - dw1[1][i]));
                for (int64_t i = 0; i < C; i++)
                    b_scale = fmax(b_scale, fabs(db1[1][i])), b_worst = fmax(b_worst, fabs((double)db1[0][i] - db1[1][i]));
                printf("    dw1: largest difference %.3g (largest value %.3g); db1: %.3g (%.3g)\n", w_worst, w_scale,
                       b_worst, b_scale);
                CHECK_MSG(w_scale > 0 && w_worst <= 1e-5 * w_scale, "wgmma against wmma: dw1 %.3g apart (scale %.3g)",
                          w_worst, w_scale);
                CHECK_MSG(b_scale > 0 && b_worst <= 1e-5 * b_scale, "wgmma against wmma: db1 %.3g apart (scale %.3g)",
                          b_worst, b_scale);
                kiln_cuda_free(gdw1), kiln_cuda_free(gdb1);
                free(z1);
                for (int v = 0; v < 2; v++) free(dw1[v]), free(db1[v]);
                kiln_cuda_free(gdyq), kiln_cuda_free(gdyk), kiln_cuda_free(gdp), kiln_cuda_free(gdm);
                free(dyq), free(dyk), free(hd[0]), free(hd[1]);
            }
            for (int v = 0; v < 2; v++) {
                kiln_cuda_free(gmid[v]), kiln_cuda_free(gq[v]), kiln_cuda_free(gk[v]);
                free(hq[v]), free(hk[v]), free(hm[v]);
            }
            kiln_cuda_free(gxp), kiln_cuda_free(gw0), kiln_cuda_free(gb0), kiln_cuda_free(gw1), kiln_cuda_free(gb1);
            free(xp), free(w0), free(b0), free(w1), free(b1);
        }
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

/* The fused convolutions at issue [cuda]'s benchmark shape (4 sequences of 4096 tokens, 8 query / 2 KV heads of 128,
 * kernels 2 and 2: N = 16384 rows of C = 1280 channels), beside a device copy of N x C f32 (the memory bound).
 * Bytes a call, per (row, channel): forward 10 (x read twice, by the depthwise pass and by the coupling, 2 each;
 * mid 2 written, 2 read; qpre / kpre 2 written); backward 18 with dmid in bf16, 24 in f32 (dy 2 read by dw1, 2 by
 * dmid's GEMM, 2 by the coupling's adjoint; mid 2 read by dw1; dmid written once and read twice, 2 or 4 bytes each
 * time; x 2 read by dw0; dq / dk 2 written) + the dw1 partials (one f32 copy of w1 per 512 steps of a sequence,
 * written and read, on dw1_128_kernel; ~one per SM on the wgmma kernel); then each pass of one call by CUDA events
 * (kiln_cca_conv_profile_cuda) beside its own bytes. Times printed, never asserted. */
TEST(gpu_ops_cca_conv_couple_timing) {
    const int64_t B = 4, T = 4096, NH = 8, KV = 2, D = 128, k0 = 2, k1 = 2;
    const int64_t Q = NH * D, K = KV * D, C = Q + K, N = B * T, M = T + k1 - 1, nm = B * M * C, n1 = C * D * k1;
    const kiln_conv_shape s = {B, T, C, NH + KV, k0, k1};
    kiln_rng rng;
    kiln_rng_seed(&rng, 53);
    float *h = gt_rand(&rng, N * Q, 1.0f);
    kiln_bf16 *q = gt_up_bf16(h, N * Q), *dqp = gt_up_bf16(h, N * Q);
    kiln_bf16 *k = gt_up_bf16(h + N * (Q - K), N * K), *dkp = gt_up_bf16(h + N * (Q - 2 * K), N * K);
    free(h);
    float *w0h = gt_rand(&rng, C * k0, 0.7f), *b0h = gt_rand(&rng, C, 0.3f), *w1h = gt_rand(&rng, n1, 0.06f);
    float *w0 = gt_up_f32(w0h, C * k0), *b0 = gt_up_f32(b0h, C), *w1 = gt_up_f32(w1h, n1), *b1 = gt_up_f32(b0h, C);
    float *dw0 = gt_up_f32(w0h, C * k0), *db0 = gt_up_f32(b0h, C), *dw1 = gt_up_f32(w1h, n1), *db1 = gt_up_f32(b0h, C);
    kiln_bf16 *mid = gt_dev((size_t)nm * 2), *qpre = gt_dev((size_t)(N * Q) * 2), *kpre = gt_dev((size_t)(N * K) * 2);
    kiln_bf16 *dq = gt_dev((size_t)(N * Q) * 2), *dk = gt_dev((size_t)(N * K) * 2);
    float *dmid = gt_dev((size_t)nm * 4), *cp = gt_dev((size_t)nm * 4);
    const int it = 10;
    /* the copy rate: dmid's size, read + written */
    CHECK_OK(kiln_cuda_copy(cp, dmid, (size_t)nm * 4, KILN_CUDA_D2D));
    CHECK_OK(kiln_cuda_sync());
    double t0 = gt_now_s();
    for (int i = 0; i < it; i++) CHECK_OK(kiln_cuda_copy(cp, dmid, (size_t)nm * 4, KILN_CUDA_D2D));
    CHECK_OK(kiln_cuda_sync());
    const double rate = 8.0 * nm / ((gt_now_s() - t0) / it) / 1e9; /* GB/s */
    int dbf = 0; /* dmid's type in the default call */
    CHECK_OK(kiln_cca_conv_couple_backward_cuda(dq, dk, dw0, db0, dw1, db1, dmid, &dbf, dqp, dkp, q, k, mid, w0, w1, &s,
                                                NH, KV, 0, 0, NULL));
    const double dmb = dbf ? 2.0 : 4.0; /* dmid's bytes an element */
    const double fb = 10.0 * N * C, bb = (12.0 + 3 * dmb) * N * C + 2.0 * 4 * (B * ((T + 511) / 512)) * n1;
    printf("    dmid in %s\n", dbf ? "bf16" : "f32");
    printf("    device copy %.0f GB/s: bounds forward %.1f us (%.0f MB), backward %.1f us (%.0f MB)\n", rate,
           fb / rate / 1e3, fb / 1e6, bb / rate / 1e3, bb / 1e6);
    {
        double us[2];
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i <= it; i++) {
                if (i == 1) {
                    CHECK_OK(kiln_cuda_sync());
                    t0 = gt_now_s();
                }
                if (pass == 0)
                    CHECK_OK(kiln_cca_conv_couple_forward_cuda(qpre, kpre, mid, q, k, w0, b0, w1, b1, &s, NH, KV, 0, 0, NULL));
                else
                    CHECK_OK(kiln_cca_conv_couple_backward_cuda(dq, dk, dw0, db0, dw1, db1, dmid, NULL, dqp, dkp, q, k,
                                                                mid, w0, w1, &s, NH, KV, 0, 0, NULL));
            }
            CHECK_OK(kiln_cuda_sync());
            us[pass] = (gt_now_s() - t0) / it * 1e6;
        }
        printf("    cca_conv + couple forward %7.1f us %5.0f GB/s %.2fx the bound; backward %7.1f us "
               "%5.0f GB/s %.2fx\n", us[0], fb / us[0] / 1e3, us[0] / (fb / rate / 1e3), us[1],
               bb / us[1] / 1e3, us[1] / (bb / rate / 1e3));
        { /* the forward on grp128_kernel (KILN_CCA_TILE=128), the wmma kernel the wgmma one replaced */
            setenv("KILN_CCA_TILE", "128", 1);
            for (int i = 0; i <= it; i++) {
                if (i == 1) {
                    CHECK_OK(kiln_cuda_sync());
                    t0 = gt_now_s();
                }
                CHECK_OK(kiln_cca_conv_couple_forward_cuda(qpre, kpre, mid, q, k, w0, b0, w1, b1, &s, NH, KV, 0, 0, NULL));
            }
            CHECK_OK(kiln_cuda_sync());
            unsetenv("KILN_CCA_TILE");
            const double u = (gt_now_s() - t0) / it * 1e6;
            printf("    cca_conv + couple forward with KILN_CCA_TILE=128 (wmma) %7.1f us\n", u);
        }
        /* the backward with dw1 on dw1_128_kernel (KILN_CCA_DW1=wmma), the kernel the wgmma one replaced; with
         * dmid in f32 (KILN_CCA_DMID=f32) */
        static const char *const alt[2][2] = {{"KILN_CCA_DW1", "wmma"}, {"KILN_CCA_DMID", "f32"}};
        for (int a = 0; a < 2; a++) {
            setenv(alt[a][0], alt[a][1], 1);
            for (int i = 0; i <= it; i++) {
                if (i == 1) {
                    CHECK_OK(kiln_cuda_sync());
                    t0 = gt_now_s();
                }
                CHECK_OK(kiln_cca_conv_couple_backward_cuda(dq, dk, dw0, db0, dw1, db1, dmid, NULL, dqp, dkp, q, k, mid,
                                                            w0, w1, &s, NH, KV, 0, 0, NULL));
            }
            CHECK_OK(kiln_cuda_sync());
            unsetenv(alt[a][0]);
            const double u = (gt_now_s() - t0) / it * 1e6;
            printf("    cca_conv + couple backward with %s=%s %7.1f us\n", alt[a][0], alt[a][1], u);
        }
        { /* each pass of one more call, by CUDA events: time, its bytes (per row and channel, N x C of them), rate */
            static const char *pname[KILN_CCA_NPASS] = {"depthwise fwd (x -> mid)", "grouped fwd + coupling",
                                                         "dw1 / db1 (partials + sums)", "grouped bwd (-> dmid)",
                                                         "dw0 / db0 partials", "dx + coupling adjoint", "dw0 / db0 sums"};
            const double pb[KILN_CCA_NPASS] = {4.0 * N * C, 6.0 * N * C, 4.0 * N * C /* + its partials */,
                                               (2.0 + dmb) * N * C, (2.0 + dmb) * N * C, (4.0 + dmb) * N * C, 0};
            double pu[KILN_CCA_NPASS];
            CHECK_OK(kiln_cca_conv_profile_cuda(1));
            CHECK_OK(kiln_cca_conv_couple_forward_cuda(qpre, kpre, mid, q, k, w0, b0, w1, b1, &s, NH, KV, 0, 0, NULL));
            CHECK_OK(kiln_cca_conv_couple_backward_cuda(dq, dk, dw0, db0, dw1, db1, dmid, NULL, dqp, dkp, q, k, mid, w0,
                                                        w1, &s, NH, KV, 0, 0, NULL));
            CHECK_OK(kiln_cca_conv_profile_read_cuda(pu));
            CHECK_OK(kiln_cca_conv_profile_cuda(0));
            for (int p = 0; p < KILN_CCA_NPASS; p++) CHECK_MSG(pu[p] >= 0, "pass %s was not recorded", pname[p]);
            for (int p = 0; p < KILN_CCA_NPASS; p++)
                if (pb[p] > 0 && pu[p] > 0)
                    printf("      %-30s %7.1f us  %6.1f MB  %5.0f GB/s  %.2fx its bound\n", pname[p], pu[p], pb[p] / 1e6,
                           pb[p] / pu[p] / 1e3, pu[p] / (pb[p] / rate / 1e3));
                else if (pu[p] >= 0)
                    printf("      %-30s %7.1f us\n", pname[p], pu[p]);
        }
    }
    free(w0h), free(b0h), free(w1h);
    kiln_cuda_free(q), kiln_cuda_free(k), kiln_cuda_free(dqp), kiln_cuda_free(dkp), kiln_cuda_free(w0), kiln_cuda_free(b0);
    kiln_cuda_free(w1), kiln_cuda_free(b1), kiln_cuda_free(dw0), kiln_cuda_free(db0), kiln_cuda_free(dw1);
    kiln_cuda_free(db1), kiln_cuda_free(mid), kiln_cuda_free(qpre), kiln_cuda_free(kpre), kiln_cuda_free(dq);
    kiln_cuda_free(dk), kiln_cuda_free(dmid), kiln_cuda_free(cp);
}
