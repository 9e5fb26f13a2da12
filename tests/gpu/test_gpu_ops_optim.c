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

/* AdamW on many tensors in one launch (kiln_adamw_multi, the trainer's path) against the CPU, tensor by
 * tensor: sizes that leave partial vectors and chunks, the state packed as the CPU trainer packs it (so m
 * and v of most tensors sit at offsets the 16-byte loads cannot use), w and g at 64-element offsets with
 * padding between, the gradient scaled on the way in. Tolerance as above; besides, it must give exactly the
 * bits of kiln_adamw_step_cuda run per tensor on the pre-scaled gradient (the same arithmetic), must not
 * write g or the padding, and its bf16 copy is the rounding of the f32 weights. */
TEST(gpu_ops_adamw_multi) {
    kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static const int64_t sizes[] = {3, 4096, 100003, 1, 64, 2, 8193, 5000, 4097, 12};
    enum { NT = sizeof sizes / sizeof *sizes };
    kiln_adamw_tensor tab[NT];
    int64_t nw = 0, ns = 0;
    for (int i = 0; i < NT; i++) {
        tab[i] = (kiln_adamw_tensor){nw, ns, sizes[i], i % 3 != 1};
        nw += (sizes[i] + 63) / 64 * 64;
        ns += 2 * sizes[i];
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, 43);
    float *w = gt_rand(&rng, nw, 1.0f), *st = calloc((size_t)ns, sizeof *st);
    float *w1 = gt_up_f32(w, nw), *st1 = gt_up_f32(st, ns), *w2 = gt_up_f32(w, nw), *st2 = gt_up_f32(st, ns);
    float *dg = gt_dev((size_t)nw * 4), *dgs = gt_dev((size_t)nw * 4);
    kiln_bf16 *wb = gt_dev((size_t)nw * 2);
    kiln_adamw_multi *p = NULL;
    CHECK_OK(kiln_adamw_multi_create(tab, NT, &p));
    if (!p) return;
    float *wpad = malloc((size_t)nw * sizeof *wpad);
    memcpy(wpad, w, (size_t)nw * sizeof *wpad);
    for (int64_t t = 1; t <= 3; t++) {
        float *g = gt_rand(&rng, nw, t == 2 ? 1e-3f : 1.0f), *gs = malloc((size_t)nw * sizeof *gs);
        const float scale = t == 3 ? 1.0f : 0.37f;
        for (int64_t i = 0; i < nw; i++) gs[i] = g[i] * scale;
        CHECK_OK(kiln_cuda_copy(dg, g, (size_t)nw * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(dgs, gs, (size_t)nw * 4, KILN_CUDA_H2D));
        const double lr = 1e-3 * (double)t;
        CHECK_OK(kiln_adamw_multi_step_cuda(p, w1, dg, st1, scale, &hp, lr, t, t == 3 ? wb : NULL, NULL));
        for (int i = 0; i < NT; i++) {
            kiln_adamw_step(w + tab[i].off, gs + tab[i].off, st + tab[i].soff, sizes[i], &hp, lr, t, tab[i].decay);
            CHECK_OK(kiln_adamw_step_cuda(w2 + tab[i].off, dgs + tab[i].off, st2 + tab[i].soff, sizes[i], &hp, lr, t,
                                          tab[i].decay, NULL, NULL));
        }
        float *gback = gt_down_f32(dg, nw);
        CHECK_MSG(!memcmp(gback, g, (size_t)nw * 4), "step %lld wrote the gradient", (long long)t);
        free(gback), free(g), free(gs);
    }
    float *gw1 = gt_down_f32(w1, nw), *gs1 = gt_down_f32(st1, ns), *gw2 = gt_down_f32(w2, nw), *gs2 = gt_down_f32(st2, ns);
    GT_CLOSE("adamw multi w", gw1, w, nw, TOL_OPT);
    GT_CLOSE("adamw multi m, v", gs1, st, ns, TOL_OPT);
    printf("    bitwise differences from the CPU: w %lld of %lld, m/v %lld of %lld\n", (long long)diff_bits(gw1, w, nw),
           (long long)nw, (long long)diff_bits(gs1, st, ns), (long long)ns);
    CHECK_MSG(diff_bits(gw1, gw2, nw) == 0 && diff_bits(gs1, gs2, ns) == 0,
              "one launch and per-tensor launches differ: w %lld, m/v %lld bits", (long long)diff_bits(gw1, gw2, nw),
              (long long)diff_bits(gs1, gs2, ns));
    int64_t pad_changed = 0;
    for (int i = 0; i < NT; i++)
        for (int64_t j = tab[i].off + sizes[i]; j < (i + 1 < NT ? tab[i + 1].off : nw); j++)
            pad_changed += memcmp(gw1 + j, wpad + j, 4) != 0;
    CHECK_MSG(pad_changed == 0, "%lld padding elements between tensors changed", (long long)pad_changed);
    /* the bf16 copy: each tensor's elements (the padding is not the optimizer's) */
    float *gwb = gt_down_bf16(wb, nw);
    int64_t bad = 0;
    for (int i = 0; i < NT; i++)
        for (int64_t j = tab[i].off; j < tab[i].off + sizes[i]; j++)
            bad += gwb[j] != kiln_bf16_to_f32(kiln_f32_to_bf16(gw1[j]));
    CHECK_MSG(bad == 0, "%lld bf16 weights differ from the rounding of the f32 weights", (long long)bad);
    CHECK_ERR(kiln_adamw_multi_step_cuda(p, w1, dg, st1, 1.0f, &hp, 1e-3, 0, NULL, NULL), "step 0");
    kiln_adamw_tensor badt = {0, 0, -1, 0};
    kiln_adamw_multi *q = NULL;
    CHECK_ERR(kiln_adamw_multi_create(&badt, 1, &q), "tensor 0");
    kiln_adamw_multi_free(p);
    kiln_cuda_free(w1), kiln_cuda_free(st1), kiln_cuda_free(w2), kiln_cuda_free(st2), kiln_cuda_free(dg);
    kiln_cuda_free(dgs), kiln_cuda_free(wb);
    free(w), free(st), free(wpad), free(gw1), free(gs1), free(gw2), free(gs2), free(gwb);
}
