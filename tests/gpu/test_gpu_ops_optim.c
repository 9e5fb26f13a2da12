/* AdamW and Muon's pointwise pieces on the device against src/train/optim.c, three steps from the same
 * state. Tolerance 1e-6 relative (the device repeats the CPU's roundings, f64 where it uses f64; only the
 * order of Muon's f64 sum of squares differs); the count of bitwise differences is printed. Muon is
 * checked through kiln_muon_step with zero Newton-Schulz steps, where the orthogonalisation reduces to
 * the normalisation the device does (the GEMMs belong to cuBLASLt). The bf16 copy of the weights must
 * equal the host's rounding of the f32 weights exactly. */
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/optim.h"

#define TOL_OPT 1e-6

static int64_t diff_bits(const float *a, const float *b, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += memcmp(a + i, b + i, sizeof *a) != 0;
    return k;
}
static void check_bf16_copy(const kiln_bf16 *dwb, const float *w, int64_t n) {
    float *gwb = gt_down_bf16(dwb, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += gwb[i] != kiln_bf16_to_f32(kiln_f32_to_bf16(w[i]));
    CHECK_MSG(bad == 0, "%lld of %lld bf16 weights differ from the rounding of the f32 weights", (long long)bad,
              (long long)n);
    free(gwb);
}

TEST(gpu_ops_adamw) {
    kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    kiln_rng rng;
    kiln_rng_seed(&rng, 41);
    static const int64_t sizes[] = {100003, 1, 4096};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        for (int decay = 0; decay < 2; decay++) {
            printf("  n=%lld decay=%d\n", (long long)n, decay);
            float *w = gt_rand(&rng, n, 1.0f), *state = calloc((size_t)(2 * n), sizeof *state);
            float *dw = gt_up_f32(w, n), *dst = gt_up_f32(state, 2 * n), *dg = gt_dev((size_t)n * 4);
            kiln_bf16 *dwb = gt_dev((size_t)n * 2);
            for (int64_t t = 1; t <= 3; t++) {
                float *g = gt_rand(&rng, n, t == 2 ? 1e-3f : 1.0f);
                CHECK_OK(kiln_cuda_copy(dg, g, (size_t)n * 4, KILN_CUDA_H2D));
                const double lr = 1e-3 * (double)t;
                kiln_adamw_step(w, g, state, n, &hp, lr, t, decay);
                CHECK_OK(kiln_adamw_step_cuda(dw, dg, dst, n, &hp, lr, t, decay, t == 3 ? dwb : NULL, NULL));
                free(g);
            }
            float *gw = gt_down_f32(dw, n), *gst = gt_down_f32(dst, 2 * n);
            GT_CLOSE("adamw w", gw, w, n, TOL_OPT);
            GT_CLOSE("adamw m", gst, state, n, TOL_OPT);
            GT_CLOSE("adamw v", gst + n, state + n, n, TOL_OPT);
            printf("    bitwise differences: w %lld, m/v %lld of %lld\n", (long long)diff_bits(gw, w, n),
                   (long long)diff_bits(gst, state, 2 * n), (long long)n);
            check_bf16_copy(dwb, w, n);
            CHECK_ERR(kiln_adamw_step_cuda(dw, dg, dst, n, &hp, 1e-3, 0, decay, NULL, NULL), "step 0");
            kiln_cuda_free(dw), kiln_cuda_free(dst), kiln_cuda_free(dg), kiln_cuda_free(dwb);
            free(w), free(state), free(gw), free(gst);
        }
    }
}

TEST(gpu_ops_muon_pieces) {
    kiln_optim_hparams hp = {.weight_decay = 0.1, .muon_momentum = 0.95, .muon_ns_steps = 0, .use_muon = 1};
    static const struct {
        int64_t mats, rows, cols;
        int decay;
    } shapes[] = {{3, 64, 96, 1}, {1, 130, 33, 0}, {16, 256, 512, 1}, {1, 300, 300, 1}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 42);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        kiln_opt_param p = {.kind = KILN_OPT_MUON, .mats = shapes[si].mats, .rows = shapes[si].rows,
                            .cols = shapes[si].cols, .decay = shapes[si].decay};
        const int64_t n = p.mats * p.rows * p.cols;
        p.numel = n;
        printf("  %lld x [%lld, %lld] decay=%d\n", (long long)p.mats, (long long)p.rows, (long long)p.cols, p.decay);
        float *w = gt_rand(&rng, n, 0.1f), *state = calloc((size_t)n, sizeof *state);
        float *ws = malloc(kiln_muon_workspace(&p) * sizeof *ws);
        float *dw = gt_up_f32(w, n), *dst = gt_up_f32(state, n), *dg = gt_dev((size_t)n * 4), *du = gt_dev((size_t)n * 4);
        kiln_bf16 *dwb = gt_dev((size_t)n * 2);
        for (int t = 1; t <= 3; t++) {
            float *g = gt_rand(&rng, n, 1.0f);
            const double lr = 0.02 / t;
            CHECK_OK(kiln_cuda_copy(dg, g, (size_t)n * 4, KILN_CUDA_H2D));
            kiln_muon_step(w, g, state, &p, &hp, lr, ws);
            CHECK_OK(kiln_muon_momentum_cuda(dst, du, dg, n, &hp, NULL));
            CHECK_OK(kiln_muon_normalize_cuda(du, &p, NULL));
            CHECK_OK(kiln_muon_update_cuda(dw, du, &p, &hp, lr, t == 3 ? dwb : NULL, NULL));
            free(g);
        }
        float *gw = gt_down_f32(dw, n), *gst = gt_down_f32(dst, n);
        GT_CLOSE("muon w", gw, w, n, TOL_OPT);
        GT_CLOSE("muon momentum", gst, state, n, TOL_OPT);
        printf("    bitwise differences: w %lld, momentum %lld of %lld\n", (long long)diff_bits(gw, w, n),
               (long long)diff_bits(gst, state, n), (long long)n);
        check_bf16_copy(dwb, w, n);
        kiln_cuda_free(dw), kiln_cuda_free(dst), kiln_cuda_free(dg), kiln_cuda_free(du), kiln_cuda_free(dwb);
        free(w), free(state), free(ws), free(gw), free(gst);
    }
}
