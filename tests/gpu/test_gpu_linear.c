/* kiln_linear_forward_cuda / kiln_linear_backward_cuda against kiln_linear_forward / _backward on the same
 * bf16-rounded inputs, over shapes that are not multiples of any tile (and K up to 4096 for dW).
 * Tolerances (max |gpu - ref| / max |ref|):
 *   y, dx (bf16 outputs): 1e-2. Both sides sum the same exact bf16 products in f32; the GPU then rounds
 *       to bf16 (half an ulp = 2^-9 = 2e-3 of the value), and dx also reads its starting value as bf16.
 *   dw (f32 master gradient): 2e-3. Only the summation order differs (f32 over K <= 4096 exact bf16
 *       products: ~1e-6); the margin covers the tensor cores' f32 accumulation, no bf16 rounding exists.
 *   db (f32): 1e-4. Column sums of the same bf16 values in f32, in another order. */
#include <math.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

/* Every device tensor starts `off` elements into its allocation: the trainer's weights and biases are views
 * of one flat bf16 buffer, so they may be only 2-byte aligned. *base gets the allocation to free. */
static kiln_bf16 *up_b(const float *x, int64_t n, int off, void **base) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(x[i]);
    *base = gt_dev((size_t)(n + off) * 2);
    kiln_bf16 *d = (kiln_bf16 *)*base + off;
    CHECK_OK(kiln_cuda_copy(d, h, (size_t)n * 2, KILN_CUDA_H2D));
    free(h);
    return d;
}
static float *up_f(const float *x, int64_t n, int off, void **base) {
    *base = gt_dev((size_t)(n + off) * 4);
    float *d = (float *)*base + off;
    CHECK_OK(kiln_cuda_copy(d, x, (size_t)n * 4, KILN_CUDA_H2D));
    return d;
}

/* wr: KILN_LINEAR_DX_WRITE and/or KILN_LINEAR_DW_WRITE (dx / dw written, their starting values ignored) */
static void linear_case_full(int64_t n, int64_t in, int64_t out, int bias, uint64_t seed, int off, int wr) {
    const int dx_write = (wr & KILN_LINEAR_DX_WRITE) != 0, dw_write = (wr & KILN_LINEAR_DW_WRITE) != 0;
    printf("  n=%lld in=%lld out=%lld bias=%d offset=%d dx_write=%d dw_write=%d KILN_LINEAR_BWD=%s\n", (long long)n,
           (long long)in, (long long)out, bias, off, dx_write, dw_write,
           getenv("KILN_LINEAR_BWD") ? getenv("KILN_LINEAR_BWD") : "(unset)");
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    float *x = gt_rand(&rng, n * in, 1.0f), *w = gt_rand(&rng, out * in, 1.0f / sqrtf((float)in));
    float *b = gt_rand(&rng, out, 0.5f), *dy = gt_rand(&rng, n * out, 1.0f);
    float *dx0 = gt_rand(&rng, n * in, 0.1f), *dw0 = gt_rand(&rng, out * in, 0.1f), *db0 = gt_rand(&rng, out, 0.1f);
    gt_round_bf16(x, n * in), gt_round_bf16(w, out * in), gt_round_bf16(b, out), gt_round_bf16(dy, n * out);
    gt_round_bf16(dx0, n * in);
    void *bs[9];
    float *zero = calloc((size_t)(n * out), sizeof *zero);
    kiln_bf16 *d_x = up_b(x, n * in, off, &bs[0]), *d_w = up_b(w, out * in, off, &bs[1]), *d_b = up_b(b, out, off, &bs[2]);
    kiln_bf16 *d_dy = up_b(dy, n * out, off, &bs[3]), *d_dx = up_b(dx0, n * in, off, &bs[4]);
    kiln_bf16 *d_y = up_b(zero, n * out, off, &bs[5]);
    float *d_dw = up_f(dw0, out * in, off, &bs[6]), *d_db = up_f(db0, out, off, &bs[7]);

    float *y = malloc((size_t)(n * out) * sizeof *y);
    kiln_linear_forward(y, x, w, bias ? b : NULL, n, in, out);
    CHECK_OK(kiln_linear_forward_cuda(d_y, d_x, d_w, bias ? d_b : NULL, n, in, out, NULL));
    float *gy = gt_down_bf16(d_y, n * out);
    GT_CLOSE("linear y", gy, y, n * out, 1e-2);

    /* the device's dx and dw keep their nonzero starts */
    if (dx_write) memset(dx0, 0, (size_t)(n * in) * sizeof *dx0);
    if (dw_write) memset(dw0, 0, (size_t)(out * in) * sizeof *dw0);
    kiln_linear_backward(dx0, dw0, bias ? db0 : NULL, dy, x, w, n, in, out);
    CHECK_OK(kiln_linear_backward_ex_cuda(d_dx, d_dw, bias ? d_db : NULL, d_dy, d_x, d_w, n, in, out, (unsigned)wr, NULL));
    float *gdx = gt_down_bf16(d_dx, n * in), *gdw = gt_down_f32(d_dw, out * in), *gdb = gt_down_f32(d_db, out);
    GT_CLOSE(dx_write ? "linear dx (=)" : "linear dx (+=)", gdx, dx0, n * in, 1e-2);
    GT_CLOSE(dw_write ? "linear dw (=, f32)" : "linear dw (+=, f32)", gdw, dw0, out * in, 2e-3);
    if (bias) GT_CLOSE("linear db (+=, f32)", gdb, db0, out, 1e-4);

    for (int i = 0; i < 8; i++) kiln_cuda_free(bs[i]);
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(y), free(gy), free(gdx), free(gdw);
    free(gdb), free(zero);
}
static void linear_case_off(int64_t n, int64_t in, int64_t out, int bias, uint64_t seed, int off) {
    linear_case_full(n, in, out, bias, seed, off, 0);
}
static void linear_case(int64_t n, int64_t in, int64_t out, int bias, uint64_t seed) {
    linear_case_off(n, in, out, bias, seed, 0);
}

TEST(gpu_linear_fwd_bwd) {
    linear_case(1, 8, 8, 1, 1);
    linear_case(37, 19, 23, 1, 2);
    linear_case(300, 129, 65, 0, 3);
    linear_case(1000, 512, 768, 1, 4);
    linear_case(4096, 256, 130, 1, 5); /* dW reduces over K = 4096 tokens */
    linear_case(333, 2048, 96, 1, 6);  /* y and dx reduce over 2048 */
}

/* The backward's other paths against the CPU: dx and/or dw written (KILN_LINEAR_DX_WRITE, _DW_WRITE); dW of few output tiles over
 * many rows (the trainer's k / v / router shapes, scaled down; f32 outputs not a multiple of 4); db over more
 * rows than 256 blocks of 64 (taller blocks), 8 columns a load and 1; the same at 2-byte aligned offsets; and
 * all of it again through KILN_LINEAR_BWD=old. */
TEST(gpu_linear_bwd_paths) {
    for (int old = 0; old < 2; old++) {
        if (old) setenv("KILN_LINEAR_BWD", "old", 1);
        linear_case_full(300, 129, 65, 1, 21, 0, 1);
        linear_case_full(4096, 2048, 256, 1, 22, 0, 1); /* 32 output tiles over 4096 rows */
        linear_case_full(8192, 72, 20, 1, 23, 0, 0);    /* one tile, out * in = 1440 */
        linear_case_full(3000, 64, 64, 1, 24, 0, 0);
        linear_case_full(70000, 8, 24, 1, 25, 0, 0);    /* db: 280 rows a block */
        linear_case_full(4096, 256, 128, 1, 26, 1, 1);  /* 2-byte aligned: db's 1-column loads */
        linear_case_full(2048, 96, 2048, 1, 27, 8, 0);  /* db 2048 wide, 16-byte aligned */
        linear_case_full(1000, 256, 700, 0, 28, 0, KILN_LINEAR_DX_WRITE | KILN_LINEAR_DW_WRITE); /* the LM head's */
        linear_case_full(300, 129, 65, 1, 29, 1, KILN_LINEAR_DW_WRITE);
        unsetenv("KILN_LINEAR_BWD");
    }
    setenv("KILN_LINEAR_BWD", "fast", 1);
    CHECK_ERR(kiln_linear_backward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, NULL), "KILN_LINEAR_BWD='fast'");
    unsetenv("KILN_LINEAR_BWD");
    CHECK_ERR(kiln_linear_backward_ex_cuda(NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 4, NULL), "unknown flags");
}

/* tensors at odd element offsets (2-byte aligned bf16, 4-byte aligned f32), as views of a flat buffer are */
TEST(gpu_linear_unaligned) {
    linear_case_off(32, 32, 24, 1, 7, 1); /* the shape that failed inside the model (GEMM 32x24x32 NT + bias) */
    linear_case_off(37, 19, 23, 1, 8, 3);
    linear_case_off(1000, 512, 768, 1, 9, 1);
    linear_case_off(256, 64, 64, 1, 10, 8); /* 16-byte aligned bf16: the epilogue path */
}

/* the same call twice: every output bit-identical (deterministic db, cached plans) */
TEST(gpu_linear_deterministic) {
    const int64_t n = 8192, in = 320, out = 192; /* db over 128 blocks of 64 rows */
    kiln_rng rng;
    kiln_rng_seed(&rng, 9);
    float *x = gt_rand(&rng, n * in, 1.0f), *w = gt_rand(&rng, out * in, 0.05f), *dy = gt_rand(&rng, n * out, 1.0f);
    kiln_bf16 *d_x = gt_up_bf16(x, n * in), *d_w = gt_up_bf16(w, out * in), *d_dy = gt_up_bf16(dy, n * out);
    float *res[2][2];
    for (int r = 0; r < 2; r++) {
        float *d_dw = gt_dev((size_t)(out * in) * 4), *d_db = gt_dev((size_t)out * 4);
        float *zero = calloc((size_t)(out * in), sizeof *zero);
        CHECK_OK(kiln_cuda_copy(d_dw, zero, (size_t)(out * in) * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(d_db, zero, (size_t)out * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_linear_backward_cuda(NULL, d_dw, d_db, d_dy, d_x, d_w, n, in, out, NULL));
        res[r][0] = gt_down_f32(d_dw, out * in);
        res[r][1] = gt_down_f32(d_db, out);
        kiln_cuda_free(d_dw), kiln_cuda_free(d_db);
        free(zero);
    }
    CHECK(!memcmp(res[0][0], res[1][0], (size_t)(out * in) * 4));
    CHECK(!memcmp(res[0][1], res[1][1], (size_t)out * 4));
    for (int r = 0; r < 2; r++) free(res[r][0]), free(res[r][1]);
    kiln_cuda_free(d_x), kiln_cuda_free(d_w), kiln_cuda_free(d_dy);
    free(x), free(w), free(dy);
}

/* kiln_gemm_bf16_cuda's TN with f32 output equals the CPU sgemm on the same numbers */
TEST(gpu_gemm_bf16_layouts) {
    const int64_t m = 77, n = 45, k = 131;
    static const char *const lays[] = {"NN", "NT", "TN"};
    kiln_rng rng;
    kiln_rng_seed(&rng, 11);
    for (int l = 0; l < 3; l++) {
        const int ta = lays[l][0] == 'T', tb = lays[l][1] == 'T';
        float *a = gt_rand(&rng, m * k, 1.0f), *b = gt_rand(&rng, k * n, 1.0f);
        gt_round_bf16(a, m * k), gt_round_bf16(b, k * n);
        float *ref = calloc((size_t)(m * n), sizeof *ref);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += (double)a[ta ? p * m + i : i * k + p] * b[tb ? j * k + p : p * n + j];
                ref[i * n + j] = (float)s;
            }
        kiln_bf16 *d_a = gt_up_bf16(a, m * k), *d_b = gt_up_bf16(b, k * n);
        float *d_c = gt_dev((size_t)(m * n) * 4);
        CHECK_OK(kiln_gemm_bf16_cuda(d_c, 1, d_a, d_b, m, n, k, lays[l], 0, NULL));
        float *c = gt_down_f32(d_c, m * n);
        GT_CLOSE(lays[l], c, ref, m * n, 1e-4);
        kiln_cuda_free(d_a), kiln_cuda_free(d_b), kiln_cuda_free(d_c);
        free(a), free(b), free(ref), free(c);
    }
    CHECK_ERR(kiln_gemm_bf16_cuda(NULL, 1, NULL, NULL, 4, 4, 4, "XY", 0, NULL), "layout 'XY'");
}
