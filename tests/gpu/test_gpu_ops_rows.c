/* Row-wise and pointwise CUDA ops against the CPU references of src/nn: embedding, rmsnorm, scale_shift,
 * softmax, GELU, SwiGLU. Tolerances (max |gpu - ref| / max |ref| per tensor):
 *   a bf16 output: 5e-3, one rounding to bf16 (at most 2^-8 relative) plus f32 arithmetic;
 *   an f32 output computed element by element: 1e-5 (f32 instead of the reference's f64 in places);
 *   an f32 sum over many rows (weight gradients): 3e-5, the same f32 terms summed in another order;
 *   the embedding: exact (a copy; the gradient adds the same rows in the same order as the CPU).
 * Weight gradients also run twice: the bits must not change (no atomics). Inputs the device reads in
 * bf16 are rounded to bf16 first, so that both sides see the same numbers. */
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

#define TOL_BF16 5e-3
#define TOL_F32 1e-5
#define TOL_SUM 3e-5

static int64_t *up_ids(const int64_t *ids, int64_t n) {
    int64_t *d = gt_dev((size_t)n * sizeof *d);
    CHECK_OK(kiln_cuda_copy(d, ids, (size_t)n * sizeof *ids, KILN_CUDA_H2D));
    return d;
}
static void set_f32(float *d, const float *h, int64_t n) {
    CHECK_OK(kiln_cuda_copy(d, h, (size_t)n * sizeof *h, KILN_CUDA_H2D));
}
static int same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof *a); }

/* ids as a text's: a few frequent tokens (one id in 2^k with probability ~2^-k-ish), the rest uniform over V:
 * long runs of one id in the backward's sorted order (hundreds of positions, past the kernel's staging of 512) */
static int64_t skewed_id(kiln_rng *rng, int64_t V) {
    const uint64_t u = kiln_rng_u64(rng);
    const int z = __builtin_ctzll(u | (1ull << 40)); /* P(z = k) = 2^-(k+1) */
    return z < 6 && (int64_t)z < V ? (int64_t)((z * 7919) % V) : (int64_t)((u >> 41) % (uint64_t)V);
}

TEST(gpu_ops_embedding) {
    static const struct {
        int64_t n, d, V, pad;
        int skewed;
    } shapes[] = {{777, 130, 50, 3, 0},      {4096, 2048, 1000, -1, 0}, {5, 1, 3, 0, 0},      {1000, 96, 7, 6, 0},
                  {4096, 2048, 50304, 0, 1}, {3000, 260, 2048, 5, 1},   {1500, 2048, 2, -1, 0}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 11);
    for (size_t sj = 0; sj < sizeof shapes / sizeof *shapes; sj++) {
        const int64_t n = shapes[sj].n, d = shapes[sj].d, V = shapes[sj].V, pad = shapes[sj].pad;
        printf("  n=%lld d=%lld V=%lld pad=%lld%s\n", (long long)n, (long long)d, (long long)V, (long long)pad,
               shapes[sj].skewed ? " skewed ids" : "");
        int64_t *ids = malloc((size_t)n * sizeof *ids);
        for (int64_t i = 0; i < n; i++)
            ids[i] = shapes[sj].skewed ? skewed_id(&rng, V) : (int64_t)(kiln_rng_u64(&rng) % (uint64_t)V);
        float *table = gt_rand(&rng, V * d, 1.0f), *dy = gt_rand(&rng, n * d, 1.0f), *dt0 = gt_rand(&rng, V * d, 0.5f);
        float *y = malloc((size_t)(n * d) * sizeof *y), *dt = malloc((size_t)(V * d) * sizeof *dt);
        kiln_embedding_forward(y, table, ids, n, d);
        memcpy(dt, dt0, (size_t)(V * d) * sizeof *dt);
        kiln_embedding_backward(dt, dy, ids, n, d, pad);

        int64_t *dids = up_ids(ids, n);
        float *dtable = gt_up_f32(table, V * d), *ddy = gt_up_f32(dy, n * d), *ddt = gt_up_f32(dt0, V * d);
        float *dyo = gt_dev((size_t)(n * d) * sizeof(float));
        CHECK_OK(kiln_embedding_forward_cuda(dyo, dtable, dids, n, d, NULL));
        CHECK_OK(kiln_embedding_backward_cuda(ddt, ddy, dids, n, d, pad, NULL));
        float *gy = gt_down_f32(dyo, n * d), *gdt = gt_down_f32(ddt, V * d);
        GT_CLOSE("embedding y", gy, y, n * d, 0.0);
        GT_CLOSE("embedding dtable", gdt, dt, V * d, 0.0);
        if (pad >= 0) CHECK(!memcmp(gdt + pad * d, dt0 + pad * d, (size_t)d * sizeof(float)));
        kiln_cuda_free(dids), kiln_cuda_free(dtable), kiln_cuda_free(ddy), kiln_cuda_free(ddt), kiln_cuda_free(dyo);
        free(ids), free(table), free(dy), free(dt0), free(y), free(dt), free(gy), free(gdt);
    }
}

TEST(gpu_ops_rmsnorm) {
    /* the bf16 form's narrow rows (d % 4 == 0, d <= 512: the router's 256) run a warp per row; the others (31, 257,
     * 2048, the f32 form) the block kernels */
    static const struct {
        int64_t n, d;
    } shapes[] = {{33, 2048}, {1000, 257}, {7, 31}, {2048, 2048}, {300, 256}, {5000, 256}, {64, 512}, {100, 8}, {70, 132}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 12);
    const float eps = 1e-5f;
    for (size_t sj = 0; sj < sizeof shapes / sizeof *shapes; sj++) {
        const int64_t n = shapes[sj].n, d = shapes[sj].d, nd = n * d;
        printf("  n=%lld d=%lld\n", (long long)n, (long long)d);
        float *x = gt_rand(&rng, nd, 2.0f), *w = gt_rand(&rng, d, 0.5f), *dy = gt_rand(&rng, nd, 1.0f);
        float *dx0 = gt_rand(&rng, nd, 0.3f), *dw0 = gt_rand(&rng, d, 0.3f);
        for (int64_t j = 0; j < d; j++) w[j] += 1.0f;
        gt_round_bf16(dy, nd);
        float *y = malloc((size_t)nd * sizeof *y), *rstd = malloc((size_t)n * sizeof *rstd);
        float *dx = malloc((size_t)nd * sizeof *dx), *dw = malloc((size_t)d * sizeof *dw);
        kiln_rmsnorm_forward(y, rstd, x, w, n, d, eps);
        memcpy(dx, dx0, (size_t)nd * sizeof *dx);
        memcpy(dw, dw0, (size_t)d * sizeof *dw);
        kiln_rmsnorm_backward(dx, dw, dy, x, w, rstd, n, d);

        float *dxi = gt_up_f32(x, nd), *dwt = gt_up_f32(w, d), *ddx = gt_up_f32(dx0, nd), *ddw = gt_up_f32(dw0, d);
        kiln_bf16 *ddy = gt_up_bf16(dy, nd), *dyo = gt_dev((size_t)nd * 2);
        float *drstd = gt_dev((size_t)n * sizeof(float));
        CHECK_OK(kiln_rmsnorm_forward_cuda(dyo, drstd, dxi, dwt, n, d, eps, NULL));
        CHECK_OK(kiln_rmsnorm_backward_cuda(ddx, ddw, ddy, dxi, dwt, drstd, n, d, NULL));
        float *gy = gt_down_bf16(dyo, nd), *gr = gt_down_f32(drstd, n), *gdx = gt_down_f32(ddx, nd),
              *gdw = gt_down_f32(ddw, d);
        GT_CLOSE("rmsnorm y (bf16)", gy, y, nd, TOL_BF16);
        GT_CLOSE("rmsnorm rstd", gr, rstd, n, TOL_F32);
        GT_CLOSE("rmsnorm dx (+=)", gdx, dx, nd, TOL_F32);
        GT_CLOSE("rmsnorm dw (+=)", gdw, dw, d, TOL_SUM);
        /* deterministic: the same dw again */
        set_f32(ddw, dw0, d);
        CHECK_OK(kiln_rmsnorm_backward_cuda(NULL, ddw, ddy, dxi, dwt, drstd, n, d, NULL));
        float *gdw2 = gt_down_f32(ddw, d);
        CHECK_MSG(same_bits(gdw, gdw2, d), "rmsnorm dw differs between two runs");

        /* the bf16 form: x bf16 in, dx bf16 written */
        float *xb = malloc((size_t)nd * sizeof *xb), *dxb = calloc((size_t)nd, sizeof *dxb);
        memcpy(xb, x, (size_t)nd * sizeof *xb);
        gt_round_bf16(xb, nd);
        kiln_rmsnorm_forward(y, rstd, xb, w, n, d, eps);
        memcpy(dw, dw0, (size_t)d * sizeof *dw);
        kiln_rmsnorm_backward(dxb, dw, dy, xb, w, rstd, n, d);
        kiln_bf16 *dxbi = gt_up_bf16(xb, nd), *ddxb = gt_dev((size_t)nd * 2);
        set_f32(ddw, dw0, d);
        CHECK_OK(kiln_rmsnorm_forward_bf16_cuda(dyo, drstd, dxbi, dwt, n, d, eps, NULL));
        CHECK_OK(kiln_rmsnorm_backward_bf16_cuda(ddxb, ddw, ddy, dxbi, dwt, drstd, n, d, NULL));
        float *gyb = gt_down_bf16(dyo, nd), *grb = gt_down_f32(drstd, n), *gdxb = gt_down_bf16(ddxb, nd),
              *gdwb = gt_down_f32(ddw, d);
        GT_CLOSE("rmsnorm_bf16 y", gyb, y, nd, TOL_BF16);
        GT_CLOSE("rmsnorm_bf16 rstd", grb, rstd, n, TOL_F32);
        GT_CLOSE("rmsnorm_bf16 dx (bf16)", gdxb, dxb, nd, TOL_BF16);
        GT_CLOSE("rmsnorm_bf16 dw (+=)", gdwb, dw, d, TOL_SUM);
        { /* deterministic: the same dw again, and dx does not depend on dw being asked for */
            set_f32(ddw, dw0, d);
            CHECK_OK(kiln_rmsnorm_backward_bf16_cuda(NULL, ddw, ddy, dxbi, dwt, drstd, n, d, NULL));
            float *gdwb2 = gt_down_f32(ddw, d);
            CHECK_MSG(same_bits(gdwb, gdwb2, d), "rmsnorm_bf16 dw differs between two runs");
            CHECK_OK(kiln_rmsnorm_backward_bf16_cuda(ddxb, NULL, ddy, dxbi, dwt, drstd, n, d, NULL));
            float *gdxb2 = gt_down_bf16(ddxb, nd);
            CHECK_MSG(same_bits(gdxb, gdxb2, nd), "rmsnorm_bf16 dx depends on dw");
            free(gdwb2), free(gdxb2);
        }

        kiln_cuda_free(dxi), kiln_cuda_free(dwt), kiln_cuda_free(ddx), kiln_cuda_free(ddw), kiln_cuda_free(ddy);
        kiln_cuda_free(dyo), kiln_cuda_free(drstd), kiln_cuda_free(dxbi), kiln_cuda_free(ddxb);
        free(x), free(w), free(dy), free(dx0), free(dw0), free(y), free(rstd), free(dx), free(dw), free(gy), free(gr);
        free(gdx), free(gdw), free(gdw2), free(xb), free(dxb), free(gyb), free(grb), free(gdxb), free(gdwb);
    }
}

TEST(gpu_ops_scale_shift) {
    static const struct {
        int64_t n, d;
    } shapes[] = {{16, 2048}, {1000, 257}, {3, 5}, {4096, 300}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 13);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t n = shapes[si].n, d = shapes[si].d, nd = n * d;
        printf("  n=%lld d=%lld\n", (long long)n, (long long)d);
        float *x = gt_rand(&rng, nd, 2.0f), *b = gt_rand(&rng, d, 0.5f), *s = gt_rand(&rng, d, 1.5f);
        float *y0 = gt_rand(&rng, nd, 1.0f), *dy = gt_rand(&rng, nd, 1.0f), *dx0 = gt_rand(&rng, nd, 0.3f);
        float *db0 = gt_rand(&rng, d, 0.3f), *ds0 = gt_rand(&rng, d, 0.3f);
        float *y = malloc((size_t)nd * sizeof *y), *ya = malloc((size_t)nd * sizeof *ya);
        float *dx = malloc((size_t)nd * sizeof *dx), *db = malloc((size_t)d * sizeof *db), *ds = malloc((size_t)d * sizeof *ds);
        kiln_scale_shift_forward(y, x, b, s, n, d, 0);
        memcpy(ya, y0, (size_t)nd * sizeof *ya);
        kiln_scale_shift_forward(ya, x, b, s, n, d, 1);
        memcpy(dx, dx0, (size_t)nd * sizeof *dx), memcpy(db, db0, (size_t)d * sizeof *db), memcpy(ds, ds0, (size_t)d * sizeof *ds);
        kiln_scale_shift_backward(dx, db, ds, dy, x, b, s, n, d);

        float *dxi = gt_up_f32(x, nd), *dbv = gt_up_f32(b, d), *dsv = gt_up_f32(s, d), *dyo = gt_dev((size_t)nd * 4);
        float *dya = gt_up_f32(y0, nd), *ddy = gt_up_f32(dy, nd), *ddx = gt_up_f32(dx0, nd), *ddb = gt_up_f32(db0, d),
              *dds = gt_up_f32(ds0, d);
        CHECK_OK(kiln_scale_shift_forward_cuda(dyo, dxi, dbv, dsv, n, d, 0, NULL));
        CHECK_OK(kiln_scale_shift_forward_cuda(dya, dxi, dbv, dsv, n, d, 1, NULL));
        CHECK_OK(kiln_scale_shift_backward_cuda(ddx, ddb, dds, ddy, dxi, dbv, dsv, n, d, NULL));
        float *gy = gt_down_f32(dyo, nd), *gya = gt_down_f32(dya, nd), *gdx = gt_down_f32(ddx, nd),
              *gdb = gt_down_f32(ddb, d), *gds = gt_down_f32(dds, d);
        GT_CLOSE("scale_shift y", gy, y, nd, TOL_F32);
        GT_CLOSE("scale_shift y (+=)", gya, ya, nd, TOL_F32);
        GT_CLOSE("scale_shift dx (+=)", gdx, dx, nd, TOL_F32);
        GT_CLOSE("scale_shift db (+=)", gdb, db, d, TOL_SUM);
        GT_CLOSE("scale_shift ds (+=)", gds, ds, d, TOL_SUM);
        set_f32(ddb, db0, d), set_f32(dds, ds0, d);
        CHECK_OK(kiln_scale_shift_backward_cuda(NULL, ddb, dds, ddy, dxi, dbv, dsv, n, d, NULL));
        float *gdb2 = gt_down_f32(ddb, d), *gds2 = gt_down_f32(dds, d);
        CHECK_MSG(same_bits(gdb, gdb2, d) && same_bits(gds, gds2, d), "scale_shift db/ds differ between two runs");
        kiln_cuda_free(dxi), kiln_cuda_free(dbv), kiln_cuda_free(dsv), kiln_cuda_free(dyo), kiln_cuda_free(dya);
        kiln_cuda_free(ddy), kiln_cuda_free(ddx), kiln_cuda_free(ddb), kiln_cuda_free(dds);
        free(x), free(b), free(s), free(y0), free(dy), free(dx0), free(db0), free(ds0), free(y), free(ya), free(dx);
        free(db), free(ds), free(gy), free(gya), free(gdx), free(gdb), free(gds), free(gdb2), free(gds2);
    }
}

TEST(gpu_ops_softmax) {
    static const struct {
        int64_t n, d;
    } shapes[] = {{1000, 17}, {33, 65}, {5, 1}, {16384, 17}, {7, 300}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 14);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t n = shapes[si].n, d = shapes[si].d, nd = n * d;
        printf("  n=%lld d=%lld\n", (long long)n, (long long)d);
        float *x = gt_rand(&rng, nd, 6.0f), *dy = gt_rand(&rng, nd, 1.0f), *dx0 = gt_rand(&rng, nd, 0.3f);
        float *y = malloc((size_t)nd * sizeof *y), *dx = malloc((size_t)nd * sizeof *dx);
        kiln_softmax_forward(y, x, n, d);
        memcpy(dx, dx0, (size_t)nd * sizeof *dx);
        kiln_softmax_backward(dx, dy, y, n, d);
        float *dxi = gt_up_f32(x, nd), *dyo = gt_dev((size_t)nd * 4), *ddy = gt_up_f32(dy, nd), *ddx = gt_up_f32(dx0, nd);
        CHECK_OK(kiln_softmax_forward_cuda(dyo, dxi, n, d, NULL));
        CHECK_OK(kiln_softmax_backward_cuda(ddx, ddy, dyo, n, d, NULL));
        float *gy = gt_down_f32(dyo, nd), *gdx = gt_down_f32(ddx, nd);
        GT_CLOSE("softmax y", gy, y, nd, TOL_F32);
        GT_CLOSE("softmax dx (+=)", gdx, dx, nd, TOL_F32);
        kiln_cuda_free(dxi), kiln_cuda_free(dyo), kiln_cuda_free(ddy), kiln_cuda_free(ddx);
        free(x), free(dy), free(dx0), free(y), free(dx), free(gy), free(gdx);
    }
}

TEST(gpu_ops_gelu_swiglu) {
    static const struct {
        int64_t n, inter;
    } shapes[] = {{16, 2048}, {1000, 257}, {3, 1}, {4096, 256}, {999, 257}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 15);
    /* GELU's 8-wide kernels take 16-byte aligned buffers of any length (999*257 leaves a tail of 7); one element
     * past the base (below) takes the one-element kernels */
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t n = shapes[si].n, I = shapes[si].inter, m = n * I;
        printf("  n=%lld inter=%lld\n", (long long)n, (long long)I);
        /* GELU over n*inter values */
        float *x = gt_rand(&rng, m, 5.0f), *dy = gt_rand(&rng, m, 1.0f);
        gt_round_bf16(x, m), gt_round_bf16(dy, m);
        float *y = malloc((size_t)m * sizeof *y), *dx = calloc((size_t)m, sizeof *dx);
        kiln_gelu_forward(y, x, m);
        kiln_gelu_backward(dx, dy, x, m);
        kiln_bf16 *dxi = gt_up_bf16(x, m), *dyo = gt_dev((size_t)m * 2), *ddy = gt_up_bf16(dy, m), *ddx = gt_dev((size_t)m * 2);
        CHECK_OK(kiln_gelu_forward_cuda(dyo, dxi, m, NULL));
        CHECK_OK(kiln_gelu_backward_cuda(ddx, ddy, dxi, m, NULL));
        float *gy = gt_down_bf16(dyo, m), *gdx = gt_down_bf16(ddx, m);
        GT_CLOSE("gelu y", gy, y, m, TOL_BF16);
        GT_CLOSE("gelu dx", gdx, dx, m, TOL_BF16);
        if (m > 1) { /* unaligned: the same values from the second element on */
            CHECK_OK(kiln_gelu_forward_cuda(dyo + 1, dxi + 1, m - 1, NULL));
            CHECK_OK(kiln_gelu_backward_cuda(ddx + 1, ddy + 1, dxi + 1, m - 1, NULL));
            float *uy = gt_down_bf16(dyo, m), *udx = gt_down_bf16(ddx, m);
            GT_CLOSE("gelu y (unaligned)", uy + 1, y + 1, m - 1, TOL_BF16);
            GT_CLOSE("gelu dx (unaligned)", udx + 1, dx + 1, m - 1, TOL_BF16);
            free(uy), free(udx);
        }
        /* SwiGLU over [n, 2I] */
        float *gu = gt_rand(&rng, 2 * m, 4.0f);
        gt_round_bf16(gu, 2 * m);
        float *dgu = calloc((size_t)(2 * m), sizeof *dgu);
        kiln_swiglu_forward(y, gu, n, I);
        kiln_swiglu_backward(dgu, dy, gu, n, I);
        kiln_bf16 *dgui = gt_up_bf16(gu, 2 * m), *ddgu = gt_dev((size_t)(2 * m) * 2);
        CHECK_OK(kiln_swiglu_forward_cuda(dyo, dgui, n, I, NULL));
        CHECK_OK(kiln_swiglu_backward_cuda(ddgu, ddy, dgui, n, I, NULL));
        float *sy = gt_down_bf16(dyo, m), *sdgu = gt_down_bf16(ddgu, 2 * m);
        GT_CLOSE("swiglu y", sy, y, m, TOL_BF16);
        GT_CLOSE("swiglu dgu", sdgu, dgu, 2 * m, TOL_BF16);
        kiln_cuda_free(dxi), kiln_cuda_free(dyo), kiln_cuda_free(ddy), kiln_cuda_free(ddx), kiln_cuda_free(dgui);
        kiln_cuda_free(ddgu);
        free(x), free(dy), free(y), free(dx), free(gy), free(gdx), free(gu), free(dgu), free(sy), free(sdgu);
    }
}
