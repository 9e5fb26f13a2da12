/* The fused residual join + RMSNorm (src/cuda/residual_norm.cu), the norm + join backward, and scale_shift's
 * written-dx backward against the CPU ops they replace, composed as zaya_forward.c / zaya_backward.c compose
 * them: kiln_scale_shift_forward twice and kiln_rmsnorm_forward; backward the next join's
 * kiln_scale_shift_backward, kiln_rmsnorm_backward, then the join's two kiln_scale_shift_backward. Tolerances (max |gpu - ref| / max |ref|), as
 * test_gpu_ops_rows.c: bf16 outputs (ln, da) 5e-3, one rounding; f32 element outputs (y, rstd, dx) 1e-5;
 * f32 sums over rows (the seven weight gradients, accumulated onto random values) 3e-5. Shapes: the model's
 * width (one 16-byte unit per thread), two units per thread (d 4096), a narrow row (fewer threads than a
 * block), both through the pipelined kernels (the backward recomputes y from a and x instead of reading it);
 * odd widths (two and four units per thread) and d 8192 (four 16-byte units per thread, past the pipelined
 * kernels' 4096) on the element kernels; bf16 and f32 first inputs, with
 * and without the second input and the shifts. Weight gradients bitwise repeatable; da/dx do not depend on
 * which weight gradients are asked for; kiln_rmsnorm_forward_cuda of the stored y gives the fused norm's bits
 * (the model computes ln1 either way, with and without recomputation, and compares the bits). */
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

#define TOL_BF16 5e-3
#define TOL_F32 1e-5
#define TOL_SUM 3e-5

static float *copy_f(const float *x, int64_t n) {
    float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

TEST(gpu_ops_residual_norm) {
    static const struct {
        int64_t n, d;
        int a_bf16, with_x, shifts;
    } cases[] = {{300, 2048, 1, 1, 1}, {64, 4096, 1, 1, 1}, {77, 40, 1, 1, 0}, {33, 1001, 1, 1, 1},
                 {9, 1999, 1, 1, 1},   {50, 37, 0, 1, 1},   {5, 2048, 0, 0, 0}, {2000, 2048, 1, 1, 1},
                 {130, 2048, 0, 1, 1}, {20, 8192, 1, 1, 1}, {1999, 2048, 1, 1, 1}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 81);
    const float eps = 1e-5f;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t n = cases[ci].n, d = cases[ci].d, nd = n * d;
        const int abf = cases[ci].a_bf16, wx = cases[ci].with_x, sh = cases[ci].shifts;
        printf("  n=%lld d=%lld a %s%s%s\n", (long long)n, (long long)d, abf ? "bf16" : "f32", wx ? ", x" : "",
               sh ? ", shifts" : "");
        float *a = gt_rand(&rng, nd, 2.0f), *x = gt_rand(&rng, nd, 2.0f), *ab = gt_rand(&rng, d, 0.5f);
        float *as = gt_rand(&rng, d, 1.5f), *xb = gt_rand(&rng, d, 0.5f), *xs = gt_rand(&rng, d, 1.5f);
        float *w = gt_rand(&rng, d, 0.5f), *dup = gt_rand(&rng, nd, 1.0f), *upb = gt_rand(&rng, d, 0.5f);
        float *ups = gt_rand(&rng, d, 1.5f), *dln = gt_rand(&rng, nd, 1.0f);
        for (int64_t j = 0; j < d; j++) w[j] += 1.0f;
        if (abf) gt_round_bf16(a, nd);
        gt_round_bf16(dln, nd);
        float *g0[7];
        for (int i = 0; i < 7; i++) g0[i] = gt_rand(&rng, d, 0.3f);
        const float *abp = sh ? ab : NULL, *xbp = sh ? xb : NULL, *upbp = sh ? upb : NULL;
        /* reference forward */
        float *y = malloc((size_t)nd * 4), *ln = malloc((size_t)nd * 4), *rstd = malloc((size_t)n * 4);
        float *zeros = calloc((size_t)d, 4);
        kiln_scale_shift_forward(y, a, abp ? abp : zeros, as, n, d, 0);
        if (wx) kiln_scale_shift_forward(y, x, xbp ? xbp : zeros, xs, n, d, 1);
        kiln_rmsnorm_forward(ln, rstd, y, w, n, d, eps);
        /* device forward */
        float *gy = gt_dev((size_t)nd * 4), *grs = gt_dev((size_t)n * 4), *ga = abf ? NULL : gt_up_f32(a, nd);
        kiln_bf16 *gab16 = abf ? gt_up_bf16(a, nd) : NULL, *gln = gt_dev((size_t)nd * 2);
        float *gx = gt_up_f32(x, nd), *gabv = gt_up_f32(ab, d), *gas = gt_up_f32(as, d), *gxb = gt_up_f32(xb, d);
        float *gxs = gt_up_f32(xs, d), *gw = gt_up_f32(w, d);
        CHECK_OK(kiln_residual_norm_forward_cuda(gy, gln, grs, ga, gab16, sh ? gabv : NULL, gas, wx ? gx : NULL,
                                                 sh ? gxb : NULL, gxs, gw, n, d, eps, NULL));
        float *hy = gt_down_f32(gy, nd), *hln = gt_down_bf16(gln, nd), *hrs = gt_down_f32(grs, n);
        GT_CLOSE("residual_norm y", hy, y, nd, TOL_F32);
        GT_CLOSE("residual_norm rstd", hrs, rstd, n, TOL_F32);
        GT_CLOSE("residual_norm ln (bf16)", hln, ln, nd, TOL_BF16);
        /* the plain norm of the stored y: the same bits as the fused one (the model's ln1 computed either way) */
        {
            kiln_bf16 *gln2 = gt_dev((size_t)nd * 2);
            float *grs2 = gt_dev((size_t)n * 4);
            CHECK_OK(kiln_rmsnorm_forward_cuda(gln2, grs2, gy, gw, n, d, eps, NULL));
            float *hln2 = gt_down_bf16(gln2, nd), *hrs2 = gt_down_f32(grs2, n);
            CHECK_MSG(!memcmp(hln2, hln, (size_t)nd * 4) && !memcmp(hrs2, hrs, (size_t)n * 4),
                      "rmsnorm of the joined rows differs from the fused norm");
            free(hln2), free(hrs2);
            kiln_cuda_free(gln2), kiln_cuda_free(grs2);
        }
        /* without the norm: y only */
        CHECK_OK(kiln_cuda_copy(gy, zeros, 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_residual_norm_forward_cuda(gy, NULL, NULL, ga, gab16, sh ? gabv : NULL, gas, wx ? gx : NULL,
                                                 sh ? gxb : NULL, gxs, NULL, n, d, eps, NULL));
        float *hy2 = gt_down_f32(gy, nd);
        GT_CLOSE("residual_norm y (no norm)", hy2, y, nd, TOL_F32);

        /* backward: needs the bf16 a and the x term; the cases without x run the forward only */
        if (abf && wx) {
            float *g[7];
            for (int i = 0; i < 7; i++) g[i] = copy_f(g0[i], d); /* dupb dups dw dab das dxb dxs */
            float *gy_ref = calloc((size_t)nd, 4), *da = calloc((size_t)nd, 4), *dx = calloc((size_t)nd, 4);
            kiln_scale_shift_backward(gy_ref, g[0], g[1], dup, y, upbp ? upbp : zeros, ups, n, d);
            kiln_rmsnorm_backward(gy_ref, g[2], dln, y, w, rstd, n, d);
            kiln_scale_shift_backward(da, g[3], g[4], gy_ref, a, abp ? abp : zeros, as, n, d);
            kiln_scale_shift_backward(dx, g[5], g[6], gy_ref, x, xbp ? xbp : zeros, xs, n, d);
            float *dg[7];
            for (int i = 0; i < 7; i++) dg[i] = gt_up_f32(g0[i], d);
            float *gdup = gt_up_f32(dup, nd), *gupb = gt_up_f32(upb, d), *gups = gt_up_f32(ups, d);
            float *gyd = gt_up_f32(y, nd), *grsd = gt_up_f32(rstd, n), *gdx = gt_dev((size_t)nd * 4);
            kiln_bf16 *gdln = gt_up_bf16(dln, nd), *gda = gt_dev((size_t)nd * 2);
            kiln_residual_norm_bwd p = {.y = gyd, .dln = gdln, .w = gw, .rstd = grsd, .dw = dg[2], .dup = gdup,
                                        .upb = sh ? gupb : NULL, .ups = gups, .dupb = dg[0], .dups = dg[1],
                                        .a = gab16, .ab = sh ? gabv : NULL, .as = gas, .dab = dg[3], .das = dg[4],
                                        .da = gda, .x = gx, .xb = sh ? gxb : NULL, .xs = gxs, .dxb = dg[5],
                                        .dxs = dg[6], .dx = gdx};
            CHECK_OK(kiln_residual_norm_backward_cuda(&p, n, d, NULL));
            float *hda = gt_down_bf16(gda, nd), *hdx = gt_down_f32(gdx, nd), *hg[7];
            GT_CLOSE("residual_norm da (bf16)", hda, da, nd, TOL_BF16);
            GT_CLOSE("residual_norm dx", hdx, dx, nd, TOL_F32);
            static const char *names[7] = {"dupb (+=)", "dups (+=)", "dw (+=)", "dab (+=)", "das (+=)", "dxb (+=)", "dxs (+=)"};
            for (int i = 0; i < 7; i++) {
                hg[i] = gt_down_f32(dg[i], d);
                GT_CLOSE(names[i], hg[i], g[i], d, TOL_SUM);
            }
            /* again from the same starting values: the same bits */
            for (int i = 0; i < 7; i++) CHECK_OK(kiln_cuda_copy(dg[i], g0[i], (size_t)d * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_residual_norm_backward_cuda(&p, n, d, NULL));
            int same = 1;
            for (int i = 0; i < 7; i++) {
                float *h2 = gt_down_f32(dg[i], d);
                same &= !memcmp(h2, hg[i], (size_t)d * 4);
                free(h2), free(hg[i]), free(g[i]);
                kiln_cuda_free(dg[i]);
            }
            CHECK_MSG(same, "residual_norm weight gradients differ between two runs");
            /* only some of the weight gradients wanted: the others untouched, da/dx the same */
            kiln_residual_norm_bwd q = p;
            q.dw = q.dupb = q.dups = q.dab = q.das = q.dxb = q.dxs = NULL;
            CHECK_OK(kiln_residual_norm_backward_cuda(&q, n, d, NULL));
            float *hda2 = gt_down_bf16(gda, nd), *hdx2 = gt_down_f32(gdx, nd);
            CHECK_MSG(!memcmp(hda2, hda, (size_t)nd * 4) && !memcmp(hdx2, hdx, (size_t)nd * 4),
                      "residual_norm da/dx depend on which weight gradients are asked for");
            /* the norm's gradient given in f32 (the same bf16-exact values): the same bits */
            float *gdlnf = gt_up_f32(dln, nd);
            kiln_residual_norm_bwd pf = q;
            pf.dln = NULL, pf.dln_f32 = gdlnf;
            CHECK_OK(kiln_residual_norm_backward_cuda(&pf, n, d, NULL));
            float *hda3 = gt_down_bf16(gda, nd), *hdx3 = gt_down_f32(gdx, nd);
            CHECK_MSG(!memcmp(hda3, hda, (size_t)nd * 4) && !memcmp(hdx3, hdx, (size_t)nd * 4),
                      "residual_norm with an f32 dln differs");
            free(hda3), free(hdx3);
            kiln_cuda_free(gdlnf);
            free(gy_ref), free(da), free(dx), free(hda), free(hdx), free(hda2), free(hdx2);
            kiln_cuda_free(gdup), kiln_cuda_free(gupb), kiln_cuda_free(gups), kiln_cuda_free(gyd);
            kiln_cuda_free(grsd), kiln_cuda_free(gdx), kiln_cuda_free(gdln), kiln_cuda_free(gda);
        }
        kiln_cuda_free(gy), kiln_cuda_free(grs), kiln_cuda_free(ga), kiln_cuda_free(gab16), kiln_cuda_free(gln);
        kiln_cuda_free(gx), kiln_cuda_free(gabv), kiln_cuda_free(gas), kiln_cuda_free(gxb), kiln_cuda_free(gxs);
        kiln_cuda_free(gw);
        free(a), free(x), free(ab), free(as), free(xb), free(xs), free(w), free(dup), free(upb), free(ups), free(dln);
        for (int i = 0; i < 7; i++) free(g0[i]);
        free(y), free(ln), free(rstd), free(zeros), free(hy), free(hln), free(hrs), free(hy2);
    }
    /* wider rows than a block can hold, and missing inputs: errors naming the op */
    CHECK_ERR(kiln_residual_norm_forward_cuda((float *)16, NULL, NULL, (const float *)16, NULL, NULL, (const float *)16,
                                              NULL, NULL, NULL, NULL, 1, 4 * 512 * 8 + 4, 1e-5f, NULL),
              "residual_norm forward");
    CHECK_ERR(kiln_residual_norm_forward_cuda((float *)16, NULL, NULL, NULL, NULL, NULL, (const float *)16, NULL, NULL,
                                              NULL, NULL, 1, 4, 1e-5f, NULL),
              "residual_norm forward");
}

/* kiln_norm_join_backward_cuda against kiln_rmsnorm_backward (onto gin) then kiln_scale_shift_backward of the
 * join's first input; in place (gin = gout) and without gin; d 8192 on the element kernel */
TEST(gpu_ops_norm_join_backward) {
    static const struct {
        int64_t n, d;
        int with_gin, in_place, shift;
    } cases[] = {{300, 2048, 1, 1, 1}, {64, 4096, 0, 0, 1}, {33, 1001, 1, 0, 0}, {77, 40, 1, 1, 1},
                 {2000, 2048, 1, 1, 1}, {700, 2048, 0, 0, 0}, {20, 8192, 1, 0, 1}, {1999, 2048, 1, 0, 1}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 83);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t n = cases[ci].n, d = cases[ci].d, nd = n * d;
        const int wg = cases[ci].with_gin, ip = cases[ci].in_place, sh = cases[ci].shift;
        printf("  n=%lld d=%lld%s%s%s\n", (long long)n, (long long)d, wg ? ", gin" : "", ip ? " in place" : "",
               sh ? ", shift" : "");
        float *y = gt_rand(&rng, nd, 2.0f), *w = gt_rand(&rng, d, 0.5f), *dln = gt_rand(&rng, nd, 1.0f);
        float *gin = gt_rand(&rng, nd, 1.0f), *a = gt_rand(&rng, nd, 2.0f), *ab = gt_rand(&rng, d, 0.5f);
        float *as = gt_rand(&rng, d, 1.5f), *dw0 = gt_rand(&rng, d, 0.3f), *dab0 = gt_rand(&rng, d, 0.3f);
        float *das0 = gt_rand(&rng, d, 0.3f), *zeros = calloc((size_t)d, 4);
        for (int64_t j = 0; j < d; j++) w[j] += 1.0f;
        gt_round_bf16(dln, nd);
        float *ln = malloc((size_t)nd * 4), *rstd = malloc((size_t)n * 4);
        kiln_rmsnorm_forward(ln, rstd, y, w, n, d, 1e-5f);
        float *g = wg ? copy_f(gin, nd) : calloc((size_t)nd, 4), *dw = copy_f(dw0, d), *dab = copy_f(dab0, d);
        float *das = copy_f(das0, d), *da = calloc((size_t)nd, 4);
        kiln_rmsnorm_backward(g, dw, dln, y, w, rstd, n, d);
        kiln_scale_shift_backward(da, dab, das, g, a, sh ? ab : zeros, as, n, d);
        float *gy = gt_up_f32(y, nd), *gw = gt_up_f32(w, d), *grs = gt_up_f32(rstd, n), *gg = gt_up_f32(gin, nd);
        float *gout = ip ? gg : gt_dev((size_t)nd * 4), *ga = gt_up_f32(a, nd), *gab = gt_up_f32(ab, d);
        float *gas = gt_up_f32(as, d), *gdw = gt_up_f32(dw0, d), *gdab = gt_up_f32(dab0, d), *gdas = gt_up_f32(das0, d);
        float *gda = gt_dev((size_t)nd * 4);
        kiln_bf16 *gdln = gt_up_bf16(dln, nd);
        kiln_norm_join_bwd p = {.gin = wg ? gg : NULL, .gout = gout, .dln = gdln, .y = gy, .w = gw, .rstd = grs,
                                .dw = gdw, .a = ga, .ab = sh ? gab : NULL, .as = gas, .dab = gdab, .das = gdas, .da = gda};
        CHECK_OK(kiln_norm_join_backward_cuda(&p, n, d, NULL));
        float *hg = gt_down_f32(gout, nd), *hda = gt_down_f32(gda, nd), *hdw = gt_down_f32(gdw, d);
        float *hdab = gt_down_f32(gdab, d), *hdas = gt_down_f32(gdas, d);
        GT_CLOSE("norm_join g", hg, g, nd, TOL_F32);
        GT_CLOSE("norm_join da", hda, da, nd, TOL_F32);
        GT_CLOSE("norm_join dw (+=)", hdw, dw, d, TOL_SUM);
        GT_CLOSE("norm_join dab (+=)", hdab, dab, d, TOL_SUM);
        GT_CLOSE("norm_join das (+=)", hdas, das, d, TOL_SUM);
        /* again (gin restored when in place): the same bits */
        CHECK_OK(kiln_cuda_copy(gg, gin, (size_t)nd * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdw, dw0, (size_t)d * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdab, dab0, (size_t)d * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gdas, das0, (size_t)d * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_norm_join_backward_cuda(&p, n, d, NULL));
        float *hg2 = gt_down_f32(gout, nd), *hdw2 = gt_down_f32(gdw, d), *hdab2 = gt_down_f32(gdab, d);
        float *hdas2 = gt_down_f32(gdas, d);
        CHECK_MSG(!memcmp(hg2, hg, (size_t)nd * 4) && !memcmp(hdw2, hdw, (size_t)d * 4) &&
                      !memcmp(hdab2, hdab, (size_t)d * 4) && !memcmp(hdas2, hdas, (size_t)d * 4),
                  "norm_join differs between two runs");
        kiln_cuda_free(gy), kiln_cuda_free(gw), kiln_cuda_free(grs), kiln_cuda_free(gg);
        if (!ip) kiln_cuda_free(gout);
        kiln_cuda_free(ga), kiln_cuda_free(gab), kiln_cuda_free(gas), kiln_cuda_free(gdw), kiln_cuda_free(gdab);
        kiln_cuda_free(gdas), kiln_cuda_free(gda), kiln_cuda_free(gdln);
        free(y), free(w), free(dln), free(gin), free(a), free(ab), free(as), free(dw0), free(dab0), free(das0);
        free(zeros), free(ln), free(rstd), free(g), free(dw), free(dab), free(das), free(da), free(hg), free(hda);
        free(hdw), free(hdab), free(hdas), free(hg2), free(hdw2), free(hdab2), free(hdas2);
    }
}

TEST(gpu_ops_scale_shift_backward_write) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 82);
    const int64_t n = 1000, d = 257, nd = n * d; /* odd width: the element path; 2048 below: the vector path */
    for (int pass = 0; pass < 2; pass++) {
        const int64_t dd = pass ? 2048 : d, ndd = pass ? n * 2048 : nd;
        float *x = gt_rand(&rng, ndd, 2.0f), *b = gt_rand(&rng, dd, 0.5f), *s = gt_rand(&rng, dd, 1.5f);
        float *dy = gt_rand(&rng, ndd, 1.0f), *db0 = gt_rand(&rng, dd, 0.3f), *ds0 = gt_rand(&rng, dd, 0.3f);
        float *junk = gt_rand(&rng, ndd, 9.0f);
        float *dx = calloc((size_t)ndd, 4), *db = copy_f(db0, dd), *ds = copy_f(ds0, dd);
        kiln_scale_shift_backward(dx, db, ds, dy, x, b, s, n, dd);
        float *gx = gt_up_f32(x, ndd), *gb = gt_up_f32(b, dd), *gs = gt_up_f32(s, dd), *gdy = gt_up_f32(dy, ndd);
        float *gdx = gt_up_f32(junk, ndd), *gdb = gt_up_f32(db0, dd), *gds = gt_up_f32(ds0, dd);
        CHECK_OK(kiln_scale_shift_backward_write_cuda(gdx, gdb, gds, gdy, gx, gb, gs, n, dd, NULL));
        float *hdx = gt_down_f32(gdx, ndd), *hdb = gt_down_f32(gdb, dd), *hds = gt_down_f32(gds, dd);
        GT_CLOSE("scale_shift dx (written)", hdx, dx, ndd, TOL_F32);
        GT_CLOSE("scale_shift db (+=)", hdb, db, dd, TOL_SUM);
        GT_CLOSE("scale_shift ds (+=)", hds, ds, dd, TOL_SUM);
        kiln_cuda_free(gx), kiln_cuda_free(gb), kiln_cuda_free(gs), kiln_cuda_free(gdy), kiln_cuda_free(gdx);
        kiln_cuda_free(gdb), kiln_cuda_free(gds);
        free(x), free(b), free(s), free(dy), free(db0), free(ds0), free(junk), free(dx), free(db), free(ds);
        free(hdx), free(hdb), free(hds);
    }
}

/* The MLP join with its first input gathered (kiln_residual_norm_forward_gather_cuda and kiln_norm_join_bwd's
 * a_rows): row r of a = gate[r] * rows[slot[r]] (bf16 rows, slot -1: zeros), the experts' top-1 gated sum, against
 * the same ops given that sum as an f32 [n,d] array (formed here as the combine forms it: gate * row added to a
 * zero sum): the same bits for every output. Rows permuted and some skipped; the model's widths (one and two
 * units a thread); a width past the ring kernels refused. */
/* slots of n tokens: each of S rows once, in a shuffled order; the remaining tokens skipped (-1) */
static int32_t *shuffled_slots(kiln_rng *rng, int64_t n, int64_t S) {
    int32_t *slot = malloc((size_t)n * sizeof *slot);
    for (int64_t r = 0; r < n; r++) slot[r] = r < S ? (int32_t)r : -1;
    for (int64_t r = n - 1; r > 0; r--) {
        const int64_t k = (int64_t)(kiln_rng_u64(rng) % (uint64_t)(r + 1));
        const int32_t t = slot[r];
        slot[r] = slot[k], slot[k] = t;
    }
    return slot;
}

TEST(gpu_ops_residual_norm_gathered) {
    static const struct {
        int64_t n, d;
    } cases[] = {{700, 2048}, {257, 4096}, {1999, 2048}, {64, 512}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 84);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t n = cases[ci].n, d = cases[ci].d, nd = n * d, S = n - n / 5;
        printf("  n=%lld d=%lld, %lld rows\n", (long long)n, (long long)d, (long long)S);
        float *rows = gt_rand(&rng, S * d, 2.0f), *gate = gt_rand(&rng, n, 1.0f), *x = gt_rand(&rng, nd, 2.0f);
        float *ab = gt_rand(&rng, d, 0.5f), *as = gt_rand(&rng, d, 1.5f), *xb = gt_rand(&rng, d, 0.5f);
        float *xs = gt_rand(&rng, d, 1.5f), *w = gt_rand(&rng, d, 0.5f), *dln = gt_rand(&rng, nd, 1.0f);
        float *gin = gt_rand(&rng, nd, 1.0f), *a = malloc((size_t)nd * 4);
        gt_round_bf16(rows, S * d), gt_round_bf16(dln, nd);
        int32_t *slot = shuffled_slots(&rng, n, S);
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < d; j++) {
                float acc = 0.0f;
                if (slot[r] >= 0) acc = fmaf(gate[r], rows[(int64_t)slot[r] * d + j], acc);
                a[r * d + j] = acc;
            }
        kiln_bf16 *grows = gt_up_bf16(rows, S * d), *gln = gt_dev((size_t)nd * 2), *gdln = gt_up_bf16(dln, nd);
        float *ggate = gt_up_f32(gate, n), *gx = gt_up_f32(x, nd), *ga = gt_up_f32(a, nd), *gab = gt_up_f32(ab, d);
        float *gas = gt_up_f32(as, d), *gxb = gt_up_f32(xb, d), *gxs = gt_up_f32(xs, d), *gw = gt_up_f32(w, d);
        float *gy = gt_dev((size_t)nd * 4), *grs = gt_dev((size_t)n * 4);
        int32_t *gslot = gt_dev((size_t)n * sizeof *gslot);
        CHECK_OK(kiln_cuda_copy(gslot, slot, (size_t)n * sizeof *slot, KILN_CUDA_H2D));
        /* forward: the join of a given whole, then gathered */
        CHECK_OK(kiln_residual_norm_forward_cuda(gy, gln, grs, ga, NULL, gab, gas, gx, gxb, gxs, gw, n, d, 1e-5f, NULL));
        float *y1 = gt_down_f32(gy, nd), *l1 = gt_down_bf16(gln, nd), *r1 = gt_down_f32(grs, n);
        CHECK_OK(kiln_cuda_copy(gy, gin, (size_t)nd * 4, KILN_CUDA_H2D)); /* overwritten below */
        CHECK_OK(kiln_residual_norm_forward_gather_cuda(gy, gln, grs, grows, gslot, ggate, gab, gas, gx, gxb, gxs, gw, n,
                                                        d, 1e-5f, NULL));
        float *y2 = gt_down_f32(gy, nd), *l2 = gt_down_bf16(gln, nd), *r2 = gt_down_f32(grs, n);
        CHECK_MSG(!memcmp(y1, y2, (size_t)nd * 4) && !memcmp(l1, l2, (size_t)nd * 4) && !memcmp(r1, r2, (size_t)n * 4),
                  "d=%lld: the gathered join's forward differs from the join of the whole sum", (long long)d);
        /* backward: the norm + join backward (y from the forward above), a given whole, then gathered */
        float *gout = gt_dev((size_t)nd * 4), *gda = gt_dev((size_t)nd * 4), *gg = gt_up_f32(gin, nd);
        float *gdw = gt_dev((size_t)d * 4), *gdab = gt_dev((size_t)d * 4), *gdas = gt_dev((size_t)d * 4);
        float *o[2][5];
        for (int mode = 0; mode < 2; mode++) { /* the weight gradients from the same values (ab's) each time */
            CHECK_OK(kiln_cuda_copy(gdw, ab, (size_t)d * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cuda_copy(gdab, ab, (size_t)d * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_cuda_copy(gdas, ab, (size_t)d * 4, KILN_CUDA_H2D));
            kiln_norm_join_bwd p = {.gin = gg, .gout = gout, .dln = gdln, .y = gy, .w = gw, .rstd = grs, .dw = gdw,
                                    .a = mode ? NULL : ga, .ab = gab, .as = gas, .dab = gdab, .das = gdas, .da = gda,
                                    .a_rows = mode ? grows : NULL, .a_slot = mode ? gslot : NULL,
                                    .a_gate = mode ? ggate : NULL};
            CHECK_OK(kiln_norm_join_backward_cuda(&p, n, d, NULL));
            o[mode][0] = gt_down_f32(gout, nd), o[mode][1] = gt_down_f32(gda, nd), o[mode][2] = gt_down_f32(gdw, d);
            o[mode][3] = gt_down_f32(gdab, d), o[mode][4] = gt_down_f32(gdas, d);
        }
        const int64_t sz[5] = {nd, nd, d, d, d};
        static const char *what[5] = {"g", "da", "dw", "dab", "das"};
        for (int k = 0; k < 5; k++) {
            CHECK_MSG(!memcmp(o[0][k], o[1][k], (size_t)sz[k] * 4), "d=%lld: the gathered norm_join's %s differs",
                      (long long)d, what[k]);
            free(o[0][k]), free(o[1][k]);
        }
        kiln_cuda_free(grows), kiln_cuda_free(gln), kiln_cuda_free(gdln), kiln_cuda_free(ggate), kiln_cuda_free(gx);
        kiln_cuda_free(ga), kiln_cuda_free(gab), kiln_cuda_free(gas), kiln_cuda_free(gxb), kiln_cuda_free(gxs);
        kiln_cuda_free(gw), kiln_cuda_free(gy), kiln_cuda_free(grs), kiln_cuda_free(gslot), kiln_cuda_free(gout);
        kiln_cuda_free(gda), kiln_cuda_free(gg), kiln_cuda_free(gdw), kiln_cuda_free(gdab), kiln_cuda_free(gdas);
        free(rows), free(gate), free(x), free(ab), free(as), free(xb), free(xs), free(w), free(dln), free(gin), free(a);
        free(slot), free(y1), free(l1), free(r1), free(y2), free(l2), free(r2);
    }
    CHECK(!kiln_residual_norm_gather_ok(8192) && !kiln_residual_norm_gather_ok(1001) &&
          !kiln_residual_norm_gather_ok(1004) && kiln_residual_norm_gather_ok(2048));
    CHECK_ERR(kiln_residual_norm_forward_gather_cuda((float *)16, NULL, NULL, (const kiln_bf16 *)16, (const int32_t *)16,
                                                     (const float *)16, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8192, 1e-5f,
                                                     NULL),
              "gathered a");
}

/* The join + norm backward with dln given as two bf16 gradients (the model's ln2 under top-1 routing: the experts'
 * input-gradient rows in slot order, gathered through the token's slot, plus the router's), summed in f32 as the
 * ring reads them, against the same backward fed their f32 sum: every output bit for bit (the same kernel, dln's
 * f32 value the same). Without the added one; rows past the ring's 4096 columns refused. */
TEST(gpu_ops_residual_norm_backward_gathered_dln) {
    static const struct {
        int64_t n, d;
        int add;
    } cases[] = {{700, 2048, 1}, {1999, 2048, 1}, {257, 4096, 1}, {300, 2048, 0}, {64, 512, 1}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 86);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t n = cases[ci].n, d = cases[ci].d, nd = n * d, S = n - n / 6;
        printf("  n=%lld d=%lld, %lld rows%s\n", (long long)n, (long long)d, (long long)S, cases[ci].add ? " + added" : "");
        float *rows = gt_rand(&rng, S * d, 1.0f), *add = gt_rand(&rng, nd, 0.5f), *dsum = malloc((size_t)nd * 4);
        float *a = gt_rand(&rng, nd, 2.0f), *x = gt_rand(&rng, nd, 2.0f), *dup = gt_rand(&rng, nd, 1.0f);
        float *v = gt_rand(&rng, 7 * d, 1.0f), *rs = gt_rand(&rng, n, 0.2f);
        gt_round_bf16(rows, S * d), gt_round_bf16(add, nd), gt_round_bf16(a, nd);
        for (int64_t r = 0; r < n; r++) rs[r] += 1.0f;
        int32_t *slot = shuffled_slots(&rng, n, S);
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < d; j++) {
                const float g = slot[r] >= 0 ? rows[(int64_t)slot[r] * d + j] : 0.0f;
                dsum[r * d + j] = cases[ci].add ? g + add[r * d + j] : g;
            }
        kiln_bf16 *grows = gt_up_bf16(rows, S * d), *gadd = gt_up_bf16(add, nd), *ga = gt_up_bf16(a, nd);
        kiln_bf16 *gda = gt_dev((size_t)nd * 2);
        float *gsum = gt_up_f32(dsum, nd), *gx = gt_up_f32(x, nd), *gdup = gt_up_f32(dup, nd), *gv = gt_up_f32(v, 7 * d);
        float *grs = gt_up_f32(rs, n), *gy = gt_dev((size_t)nd * 4), *gdx = gt_dev((size_t)nd * 4), *gp[7];
        int32_t *gslot = gt_dev((size_t)n * sizeof *gslot);
        CHECK_OK(kiln_cuda_copy(gslot, slot, (size_t)n * sizeof *slot, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(gy, x, (size_t)nd * 4, KILN_CUDA_H2D)); /* y: read by the element kernels only */
        for (int i = 0; i < 7; i++) gp[i] = gt_dev((size_t)d * 4);
        float *o[2][9];
        for (int mode = 0; mode < 2; mode++) {
            for (int i = 0; i < 7; i++) CHECK_OK(kiln_cuda_copy(gp[i], v + (size_t)i * d, (size_t)d * 4, KILN_CUDA_H2D));
            kiln_residual_norm_bwd p = {.y = gy, .w = gv, .rstd = grs, .dw = gp[0], .dup = gdup, .upb = gv + d,
                                        .ups = gv + 2 * d, .dupb = gp[1], .dups = gp[2], .a = ga, .ab = gv + 3 * d,
                                        .as = gv + 4 * d, .dab = gp[3], .das = gp[4], .da = gda, .x = gx,
                                        .xb = gv + 5 * d, .xs = gv + 6 * d, .dxb = gp[5], .dxs = gp[6], .dx = gdx};
            if (mode) p.dln_rows = grows, p.dln_slot = gslot, p.dln_add = cases[ci].add ? gadd : NULL;
            else p.dln_f32 = gsum;
            CHECK_OK(kiln_residual_norm_backward_cuda(&p, n, d, NULL));
            o[mode][0] = gt_down_bf16(gda, nd), o[mode][1] = gt_down_f32(gdx, nd);
            for (int i = 0; i < 7; i++) o[mode][2 + i] = gt_down_f32(gp[i], d);
        }
        for (int k = 0; k < 9; k++) {
            CHECK_MSG(!memcmp(o[0][k], o[1][k], (size_t)(k < 2 ? nd : d) * 4),
                      "n=%lld d=%lld: output %d differs between the gathered dln and its f32 sum", (long long)n,
                      (long long)d, k);
            free(o[0][k]), free(o[1][k]);
        }
        kiln_cuda_free(grows), kiln_cuda_free(gadd), kiln_cuda_free(ga), kiln_cuda_free(gda), kiln_cuda_free(gsum);
        kiln_cuda_free(gx), kiln_cuda_free(gdup), kiln_cuda_free(gv), kiln_cuda_free(grs), kiln_cuda_free(gy);
        kiln_cuda_free(gdx), kiln_cuda_free(gslot);
        for (int i = 0; i < 7; i++) kiln_cuda_free(gp[i]);
        free(rows), free(add), free(dsum), free(a), free(x), free(dup), free(v), free(rs), free(slot);
    }
    { /* rows wider than the ring takes: refused, naming the field */
        kiln_residual_norm_bwd p = {.y = (float *)16, .dln_rows = (kiln_bf16 *)16, .dln_slot = (int32_t *)16,
                                    .w = (float *)16, .rstd = (float *)16, .dup = (float *)16, .ups = (float *)16,
                                    .a = (kiln_bf16 *)16, .as = (float *)16, .x = (float *)16, .xs = (float *)16,
                                    .da = (kiln_bf16 *)16, .dx = (float *)16};
        CHECK_ERR(kiln_residual_norm_backward_cuda(&p, 4, 8192, NULL), "dln_rows");
    }
}
