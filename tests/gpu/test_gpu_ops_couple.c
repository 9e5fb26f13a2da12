/* CCA's q/k residual coupling and value shift on the device. Their CPU reference is inline in the model
 * (src/models/zaya_forward.c and zaya_backward.c, not separate ops); ref_* below repeat those loops line
 * for line in f32. Tolerances: bf16 outputs 5e-3 (one bf16 rounding, at most 2^-8 relative, plus f32
 * math in the same order); pure moves of bf16 values exact; the bias gradient (f32, a sum over the B
 * sequences in the CPU's order) exact. Shapes: the model's heads (8 query / 2 KV of 128), G = 1, odd. */
#include <string.h>

#include "gpu_testutil.h"

#define TOL_BF16 5e-3

/* zaya_forward.c: qpre/kpre from conv, q, k */
static void ref_couple_fwd(float *qpre, float *kpre, const float *conv, const float *qk, int64_t N, int64_t NH,
                           int64_t KV, int64_t D) {
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++) {
                float qres = (qk[n * C + h * D + d] + qk[n * C + Q + (h / G) * D + d]) * 0.5f;
                qpre[n * Q + h * D + d] = conv[n * C + h * D + d] + qres;
            }
        for (int64_t j = 0; j < KV; j++)
            for (int64_t d = 0; d < D; d++) {
                float s = 0;
                for (int64_t g = 0; g < G; g++) s += (qk[n * C + (j * G + g) * D + d] + qk[n * C + Q + j * D + d]) * 0.5f;
                kpre[n * K + j * D + d] = conv[n * C + Q + j * D + d] + s / (float)G;
            }
    }
}
/* zaya_backward.c: dconv = [dq | dk]; dqp, dkp = coupling adjoint + dqk */
static void ref_couple_bwd(float *dqp, float *dkp, float *dconv, const float *dq, const float *dk, const float *dqk,
                           int64_t N, int64_t NH, int64_t KV, int64_t D) {
    const int64_t Q = NH * D, K = KV * D, C = Q + K, G = NH / KV;
    memset(dqp, 0, (size_t)(N * Q) * sizeof *dqp);
    memset(dkp, 0, (size_t)(N * K) * sizeof *dkp);
    for (int64_t n = 0; n < N; n++) {
        memcpy(dconv + n * C, dq + n * Q, (size_t)Q * sizeof(float));
        memcpy(dconv + n * C + Q, dk + n * K, (size_t)K * sizeof(float));
        for (int64_t h = 0; h < NH; h++)
            for (int64_t d = 0; d < D; d++) {
                float dqres = dq[n * Q + h * D + d] + dk[n * K + (h / G) * D + d] / (float)G;
                dqp[n * Q + h * D + d] += 0.5f * dqres;
                dkp[n * K + (h / G) * D + d] += 0.5f * dqres;
            }
    }
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < Q; j++) dqp[n * Q + j] += dqk[n * C + j];
        for (int64_t j = 0; j < K; j++) dkp[n * K + j] += dqk[n * C + Q + j];
    }
}

TEST(gpu_ops_cca_couple) {
    static const struct {
        int64_t N, NH, KV, D;
    } shapes[] = {{1000, 8, 2, 128}, {37, 3, 3, 5}, {64, 6, 1, 33}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 71);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t N = shapes[si].N, NH = shapes[si].NH, KV = shapes[si].KV, D = shapes[si].D;
        const int64_t Q = NH * D, K = KV * D, C = Q + K;
        printf("  N=%lld heads=%lld kv=%lld dim=%lld\n", (long long)N, (long long)NH, (long long)KV, (long long)D);
        float *conv = gt_rand(&rng, N * C, 1.0f), *qk = gt_rand(&rng, N * C, 1.0f), *dq = gt_rand(&rng, N * Q, 1.0f);
        float *dk = gt_rand(&rng, N * K, 1.0f), *dqk = gt_rand(&rng, N * C, 1.0f);
        gt_round_bf16(conv, N * C), gt_round_bf16(qk, N * C), gt_round_bf16(dq, N * Q), gt_round_bf16(dk, N * K);
        gt_round_bf16(dqk, N * C);
        float *qpre = malloc((size_t)(N * Q) * 4), *kpre = malloc((size_t)(N * K) * 4), *dqp = malloc((size_t)(N * Q) * 4);
        float *dkp = malloc((size_t)(N * K) * 4), *dconv = malloc((size_t)(N * C) * 4);
        ref_couple_fwd(qpre, kpre, conv, qk, N, NH, KV, D);
        ref_couple_bwd(dqp, dkp, dconv, dq, dk, dqk, N, NH, KV, D);
        kiln_bf16 *gconv = gt_up_bf16(conv, N * C), *gqk = gt_up_bf16(qk, N * C), *gdq = gt_up_bf16(dq, N * Q);
        kiln_bf16 *gdk = gt_up_bf16(dk, N * K), *gdqk = gt_up_bf16(dqk, N * C);
        kiln_bf16 *gqpre = gt_dev((size_t)(N * Q) * 2), *gkpre = gt_dev((size_t)(N * K) * 2);
        kiln_bf16 *gdqp = gt_dev((size_t)(N * Q) * 2), *gdkp = gt_dev((size_t)(N * K) * 2), *gdconv = gt_dev((size_t)(N * C) * 2);
        CHECK_OK(kiln_cca_couple_forward_cuda(gqpre, gkpre, gconv, gqk, N, NH, KV, D, NULL));
        CHECK_OK(kiln_cca_couple_backward_cuda(NULL, NULL, gdconv, gdq, gdk, NULL, N, NH, KV, D, NULL));
        CHECK_OK(kiln_cca_couple_backward_cuda(gdqp, gdkp, NULL, gdq, gdk, gdqk, N, NH, KV, D, NULL));
        float *hqpre = gt_down_bf16(gqpre, N * Q), *hkpre = gt_down_bf16(gkpre, N * K), *hdqp = gt_down_bf16(gdqp, N * Q);
        float *hdkp = gt_down_bf16(gdkp, N * K), *hdconv = gt_down_bf16(gdconv, N * C);
        GT_CLOSE("cca_couple qpre", hqpre, qpre, N * Q, TOL_BF16);
        GT_CLOSE("cca_couple kpre", hkpre, kpre, N * K, TOL_BF16);
        GT_CLOSE("cca_couple dconv", hdconv, dconv, N * C, 0.0);
        GT_CLOSE("cca_couple dqp", hdqp, dqp, N * Q, TOL_BF16);
        GT_CLOSE("cca_couple dkp", hdkp, dkp, N * K, TOL_BF16);
        kiln_cuda_free(gconv), kiln_cuda_free(gqk), kiln_cuda_free(gdq), kiln_cuda_free(gdk), kiln_cuda_free(gdqk);
        kiln_cuda_free(gqpre), kiln_cuda_free(gkpre), kiln_cuda_free(gdqp), kiln_cuda_free(gdkp), kiln_cuda_free(gdconv);
        free(conv), free(qk), free(dq), free(dk), free(dqk), free(qpre), free(kpre), free(dqp), free(dkp), free(dconv);
        free(hqpre), free(hkpre), free(hdqp), free(hdkp), free(hdconv);
    }
    CHECK_ERR(kiln_cca_couple_forward_cuda(NULL, NULL, NULL, NULL, 4, 3, 2, 8, NULL), "cca_couple forward");
}

TEST(gpu_ops_value_shift) {
    static const struct {
        int64_t B, T, Kh;
        int bias;
    } shapes[] = {{4, 300, 128, 1}, {3, 1, 5, 1}, {2, 77, 33, 0}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 72);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t B = shapes[si].B, T = shapes[si].T, Kh = shapes[si].Kh, N = B * T;
        printf("  B=%lld T=%lld Kh=%lld%s\n", (long long)B, (long long)T, (long long)Kh, shapes[si].bias ? " bias" : "");
        float *vc = gt_rand(&rng, N * Kh, 1.0f), *vd = gt_rand(&rng, N * Kh, 1.0f), *dv = gt_rand(&rng, N * 2 * Kh, 1.0f);
        float *bvd = shapes[si].bias ? gt_rand(&rng, Kh, 1.0f) : NULL, *db0 = gt_rand(&rng, Kh, 1.0f);
        gt_round_bf16(vc, N * Kh), gt_round_bf16(vd, N * Kh), gt_round_bf16(dv, N * 2 * Kh);
        if (bvd) gt_round_bf16(bvd, Kh); /* so that the bf16 v holds it exactly */
        /* zaya_forward.c / zaya_backward.c */
        float *v = malloc((size_t)(N * 2 * Kh) * 4), *dvc = malloc((size_t)(N * Kh) * 4), *dvd = calloc((size_t)(N * Kh), 4);
        float *db = malloc((size_t)Kh * 4);
        memcpy(db, db0, (size_t)Kh * 4);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                float *vr = v + (b * T + t) * 2 * Kh;
                memcpy(vr, vc + (b * T + t) * Kh, (size_t)Kh * 4);
                if (t > 0) memcpy(vr + Kh, vd + (b * T + t - 1) * Kh, (size_t)Kh * 4);
                else if (bvd) memcpy(vr + Kh, bvd, (size_t)Kh * 4);
                else memset(vr + Kh, 0, (size_t)Kh * 4);
                const float *g = dv + (b * T + t) * 2 * Kh + Kh;
                if (t > 0)
                    for (int64_t j = 0; j < Kh; j++) dvd[(b * T + t - 1) * Kh + j] += g[j];
                else if (bvd)
                    for (int64_t j = 0; j < Kh; j++) db[j] += g[j];
                memcpy(dvc + (b * T + t) * Kh, dv + (b * T + t) * 2 * Kh, (size_t)Kh * 4);
            }
        kiln_bf16 *gvc = gt_up_bf16(vc, N * Kh), *gvd = gt_up_bf16(vd, N * Kh), *gdv = gt_up_bf16(dv, N * 2 * Kh);
        kiln_bf16 *gv = gt_dev((size_t)(N * 2 * Kh) * 2), *gdvc = gt_dev((size_t)(N * Kh) * 2), *gdvd = gt_dev((size_t)(N * Kh) * 2);
        float *gb = bvd ? gt_up_f32(bvd, Kh) : NULL, *gdb = gt_up_f32(db0, Kh);
        CHECK_OK(kiln_value_shift_forward_cuda(gv, gvc, gvd, gb, B, T, Kh, 0, NULL));
        CHECK_OK(kiln_value_shift_backward_cuda(gdvc, gdvd, bvd ? gdb : NULL, gdv, B, T, Kh, 0, NULL));
        float *hv = gt_down_bf16(gv, N * 2 * Kh), *hdvc = gt_down_bf16(gdvc, N * Kh), *hdvd = gt_down_bf16(gdvd, N * Kh);
        float *hdb = gt_down_f32(gdb, Kh);
        GT_CLOSE("value_shift v", hv, v, N * 2 * Kh, 0.0);
        GT_CLOSE("value_shift dvc", hdvc, dvc, N * Kh, 0.0);
        GT_CLOSE("value_shift dvd", hdvd, dvd, N * Kh, 0.0);
        GT_CLOSE("value_shift dbvd (+=)", hdb, db, Kh, 0.0);
        { /* vc and vd as two column blocks of one buffer (as the model's packed projections), rows 2 Kh + 16 apart
           * from column 8 (16-byte vectors where Kh allows) or 2 Kh + 3 apart from column 1 (element by element):
           * the same values, the columns around them untouched */
            const int64_t c0 = Kh % 8 ? 1 : 8, ld = 2 * Kh + (Kh % 8 ? 3 : 16);
            float *p = gt_rand(&rng, N * ld, 1.0f);
            gt_round_bf16(p, N * ld);
            for (int64_t n = 0; n < N; n++) {
                memcpy(p + n * ld + c0, vc + n * Kh, (size_t)Kh * 4);
                memcpy(p + n * ld + c0 + Kh, vd + n * Kh, (size_t)Kh * 4);
            }
            kiln_bf16 *gp = gt_up_bf16(p, N * ld), *gdp = gt_up_bf16(p, N * ld);
            CHECK_OK(kiln_value_shift_forward_cuda(gv, gp + c0, gp + c0 + Kh, gb, B, T, Kh, ld, NULL));
            CHECK_OK(kiln_value_shift_backward_cuda(gdp + c0, gdp + c0 + Kh, NULL, gdv, B, T, Kh, ld, NULL));
            float *sv = gt_down_bf16(gv, N * 2 * Kh), *sd = gt_down_bf16(gdp, N * ld);
            int ok = 1;
            for (int64_t n = 0; n < N; n++) {
                ok &= !memcmp(sd + n * ld + c0, dvc + n * Kh, (size_t)Kh * 4);
                ok &= !memcmp(sd + n * ld + c0 + Kh, dvd + n * Kh, (size_t)Kh * 4);
                for (int64_t j = 0; j < ld; j++)
                    if (j < c0 || j >= c0 + 2 * Kh) ok &= sd[n * ld + j] == p[n * ld + j];
            }
            GT_CLOSE("value_shift v (rows ld apart)", sv, v, N * 2 * Kh, 0.0);
            CHECK_MSG(ok, "value_shift backward, rows %lld apart: dvc / dvd differ or other columns were written",
                      (long long)ld);
            CHECK_ERR(kiln_value_shift_forward_cuda(gv, gp, gp, gb, B, T, Kh, Kh - 1, NULL), "row stride");
            kiln_cuda_free(gp), kiln_cuda_free(gdp), free(p), free(sv), free(sd);
        }
        kiln_cuda_free(gvc), kiln_cuda_free(gvd), kiln_cuda_free(gdv), kiln_cuda_free(gv), kiln_cuda_free(gdvc);
        kiln_cuda_free(gdvd), kiln_cuda_free(gb), kiln_cuda_free(gdb);
        free(vc), free(vd), free(dv), free(bvd), free(db0), free(v), free(dvc), free(dvd), free(db), free(hv), free(hdvc);
        free(hdvd), free(hdb);
    }
}
