/* AdamW and Muon's pointwise pieces on the device against src/train/optim.c, three steps from the same
 * state. Tolerance 1e-6 relative (the device repeats the CPU's roundings, f64 where it uses f64; only the
 * order of Muon's f64 sum of squares differs); the count of bitwise differences is printed. Muon is
 * checked through kiln_muon_step with zero Newton-Schulz steps, where the orthogonalisation reduces to
 * the normalisation the device does (the GEMMs belong to cuBLASLt). The bf16 copy of the weights must
 * equal the host's rounding of the f32 weights exactly. */
#include <math.h>
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
        tab[i] = (kiln_adamw_tensor){nw, ns, sizes[i], i % 3 != 1, 0, 0, 0, 0};
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
    kiln_adamw_tensor badt = {0, 0, -1, 0, 0, 0, 0, 0};
    kiln_adamw_multi *q = NULL;
    CHECK_ERR(kiln_adamw_multi_create(&badt, 1, &q), "tensor 0");
    kiln_adamw_multi_free(p);
    kiln_cuda_free(w1), kiln_cuda_free(st1), kiln_cuda_free(w2), kiln_cuda_free(st2), kiln_cuda_free(dg);
    kiln_cuda_free(dgs), kiln_cuda_free(wb);
    free(w), free(st), free(wpad), free(gw1), free(gs1), free(gw2), free(gs2), free(gwb);
}

/* Every AdamW kernel and launch geometry (KILN_ADAMW_GRID: the staged kernel, persistent, the default; the direct
 * kernel persistent; the direct kernel a block a chunk) with and without streaming hints (KILN_ADAMW_HINTS), each
 * also zeroing the gradient as it reads it (the trainer's one-rank step) whole and in launches of 5 chunks: three
 * steps from the same state must give the bits of the direct kernel a block a chunk without hints (session 4's
 * launch), the CPU within TOL_OPT; the zeroing runs leave exactly the tensors' gradient elements zero, but those of
 * the tensors marked keep_g, which stay as they were, and the padding between them untouched. A tensor of 9M
 * elements gives ~2,200 chunks, twice the blocks a persistent grid keeps on an H200 (132 SMs x 4-8), so each
 * block walks several chunks; the second case shifts every base pointer by one float, so that no access can be a
 * vector (the scalar paths, the staged kernel's 4-byte copies). */
static void adamw_variants_case(int shift) {
    kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static const int64_t sizes[] = {9000007, 3, 4096, 1, 8193, 2, 100003, 517};
    enum { NT = sizeof sizes / sizeof *sizes };
    kiln_adamw_tensor tab[NT];
    int64_t nw = 0, ns = 0;
    for (int i = 0; i < NT; i++) {
        tab[i] = (kiln_adamw_tensor){nw, ns, sizes[i], i % 3 != 1, i % 4 == 2, 0, 0, 0}; /* keep_g: its gradient never zeroed */
        nw += (sizes[i] + 63) / 64 * 64;
        ns += 2 * sizes[i];
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, 44 + shift);
    float *w0 = gt_rand(&rng, nw, 1.0f), *gs[3];
    for (int t = 0; t < 3; t++) gs[t] = gt_rand(&rng, nw, t == 1 ? 1e-3f : 1.0f);
    int64_t npad = 0;
    for (int i = 0; i < NT; i++) /* a sentinel in the gradient's padding: nothing may write it */
        for (int64_t j = tab[i].off + sizes[i]; j < (i + 1 < NT ? tab[i + 1].off : nw); j++, npad++)
            for (int t = 0; t < 3; t++) gs[t][j] = 7.0f;
    /* the CPU: the gradient scaled first (in f32, as the device does), per tensor */
    float *wc = malloc((size_t)nw * sizeof *wc), *sc = calloc((size_t)ns, sizeof *sc), *tmp = malloc((size_t)nw * 4);
    memcpy(wc, w0, (size_t)nw * sizeof *wc);
    for (int t = 0; t < 3; t++) {
        const float scale = t == 2 ? 1.0f : 0.37f;
        for (int64_t i = 0; i < nw; i++) tmp[i] = gs[t][i] * scale;
        for (int i = 0; i < NT; i++)
            kiln_adamw_step(wc + tab[i].off, tmp + tab[i].off, sc + tab[i].soff, sizes[i], &hp, 1e-3 * (t + 1), t + 1,
                            tab[i].decay);
    }
    kiln_adamw_multi *p = NULL;
    CHECK_OK(kiln_adamw_multi_create(tab, NT, &p));
    float *dw = gt_dev((size_t)(nw + 1) * 4), *dst = gt_dev((size_t)(ns + 1) * 4), *dg = gt_dev((size_t)(nw + 1) * 4);
    kiln_bf16 *dwb = gt_dev((size_t)(nw + 4) * 2);
    float *zst = calloc((size_t)ns, sizeof *zst);
    static const char *grids[] = {"chunks", "persistent", "staged"};
    float *ref_w = NULL, *ref_s = NULL, *ref_b = NULL;
    for (int zero = 0; zero < 3 && p; zero++) /* 0: read only; 1: zeroing, one launch; 2: zeroing, 5 chunks a launch */
        for (int gi = 0; gi < 3; gi++)
            for (int hints = 0; hints < 2; hints++) {
                setenv("KILN_ADAMW_GRID", grids[gi], 1);
                setenv("KILN_ADAMW_HINTS", hints ? "1" : "0", 1);
                CHECK_OK(kiln_cuda_copy(dw + shift, w0, (size_t)nw * 4, KILN_CUDA_H2D));
                CHECK_OK(kiln_cuda_copy(dst + shift, zst, (size_t)ns * 4, KILN_CUDA_H2D));
                for (int t = 0; t < 3; t++) {
                    const float scale = t == 2 ? 1.0f : 0.37f;
                    CHECK_OK(kiln_cuda_copy(dg + shift, gs[t], (size_t)nw * 4, KILN_CUDA_H2D));
                    if (!zero)
                        CHECK_OK(kiln_adamw_multi_step_cuda(p, dw + shift, dg + shift, dst + shift, scale, &hp,
                                                            1e-3 * (t + 1), t + 1, dwb + shift, NULL));
                    else
                        CHECK_OK(kiln_adamw_multi_step_range_cuda(p, 0, NT, dw + shift, dg + shift, dst + shift, scale,
                                                                  &hp, 1e-3 * (t + 1), t + 1, dwb + shift, 1,
                                                                  zero == 2 ? 5 : 0, NULL));
                }
                float *hw = gt_down_f32(dw + shift, nw), *hs = gt_down_f32(dst + shift, ns);
                float *hb = gt_down_bf16(dwb + shift, nw), *hg = gt_down_f32(dg + shift, nw);
                char what[96];
                snprintf(what, sizeof what, "%s, hints %d, %s", grids[gi], hints,
                         zero == 0 ? "gradient read only" : zero == 1 ? "zeroing" : "zeroing, 5 chunks a launch");
                if (!ref_w) { /* the first: chunks, no hints, read only */
                    ref_w = hw, ref_s = hs, ref_b = hb;
                    GT_CLOSE("adamw w (chunks)", hw, wc, nw, TOL_OPT);
                    GT_CLOSE("adamw m, v (chunks)", hs, sc, ns, TOL_OPT);
                    printf("    shift %d: bitwise differences from the CPU: w %lld of %lld, m/v %lld of %lld\n", shift,
                           (long long)diff_bits(hw, wc, nw), (long long)nw, (long long)diff_bits(hs, sc, ns), (long long)ns);
                } else {
                    const int64_t dw_ = diff_bits(hw, ref_w, nw), ds_ = diff_bits(hs, ref_s, ns), db_ = diff_bits(hb, ref_b, nw);
                    CHECK_MSG(dw_ == 0 && ds_ == 0 && db_ == 0, "%s (shift %d): w %lld, m/v %lld, bf16 w %lld bits differ "
                              "from the direct kernel's", what, shift, (long long)dw_, (long long)ds_, (long long)db_);
                }
                int64_t gbad = 0, padbad = 0;
                for (int i = 0; i < NT; i++) {
                    for (int64_t j = tab[i].off; j < tab[i].off + sizes[i]; j++)
                        gbad += zero && !tab[i].keep_g ? hg[j] != 0.0f : hg[j] != gs[2][j];
                    for (int64_t j = tab[i].off + sizes[i]; j < (i + 1 < NT ? tab[i + 1].off : nw); j++)
                        padbad += hg[j] != 7.0f;
                }
                CHECK_MSG(gbad == 0 && padbad == 0, "%s (shift %d): %lld gradient elements %s, %lld of %lld padding "
                          "elements written", what, shift, (long long)gbad, zero ? "not zero (or kept ones changed)" :
                          "changed", (long long)padbad, (long long)npad);
                int64_t bad = 0;
                for (int i = 0; i < NT; i++)
                    for (int64_t j = tab[i].off; j < tab[i].off + sizes[i]; j++)
                        bad += hb[j] != kiln_bf16_to_f32(kiln_f32_to_bf16(hw[j]));
                CHECK_MSG(bad == 0, "%s: %lld bf16 weights differ from the rounding of the f32 weights", what, (long long)bad);
                if (hw != ref_w) free(hw), free(hs), free(hb);
                free(hg);
            }
    setenv("KILN_ADAMW_GRID", "sideways", 1);
    CHECK_ERR(kiln_adamw_multi_step_cuda(p, dw, dg, dst, 1.0f, &hp, 1e-3, 1, NULL, NULL), "KILN_ADAMW_GRID");
    unsetenv("KILN_ADAMW_GRID");
    unsetenv("KILN_ADAMW_HINTS");
    kiln_adamw_multi_free(p);
    kiln_cuda_free(dw), kiln_cuda_free(dst), kiln_cuda_free(dg), kiln_cuda_free(dwb);
    free(ref_w), free(ref_s), free(ref_b), free(w0), free(wc), free(sc), free(tmp), free(zst);
    for (int t = 0; t < 3; t++) free(gs[t]);
}

TEST(gpu_ops_adamw_variants) {
    adamw_variants_case(0);
    adamw_variants_case(1);
}

/* The gradient buffer the step reads for table t of nt tensors: tensor i's values from gs at its offset, as f32, or
 * (g_bf16) rounded to bf16 in the first half of its f32 slots */
static float *mixed_grads(const float *gs, const kiln_adamw_tensor *t, int nt, int64_t nw) {
    float *gm = calloc((size_t)nw, sizeof(float));
    for (int i = 0; i < nt && gm; i++) {
        if (!t[i].g_bf16) {
            memcpy(gm + t[i].off, gs + t[i].off, (size_t)t[i].n * sizeof(float));
            continue;
        }
        uint16_t *h = (uint16_t *)(gm + t[i].off);
        for (int64_t j = 0; j < t[i].n; j++) h[j] = kiln_f32_to_bf16(gs[t[i].off + j]);
    }
    return gm;
}

/* Gradients in bf16 (kiln_adamw_tensor.g_bf16: the experts' weight gradients, written rounded by their GEMMs):
 * bf16 values in the first half of the tensors' f32 slots give the same bits as f32 gradients holding the same
 * values, in every kernel, with and without the zeroing (which keeps them: they are keep_g), with the bases
 * 16-byte aligned (vectors) and shifted by two floats (w and the state scalar, the bf16 gradient's 8-byte copies
 * still aligned). A bf16 gradient without keep_g, or at an offset that is not a multiple of 4, is refused. */
static void adamw_bf16_case(int shift) {
    kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static const int64_t sizes[] = {3000001, 5, 4096, 8190, 1, 70001};
    enum { NT = sizeof sizes / sizeof *sizes };
    kiln_adamw_tensor tf[NT], tb[NT];
    int64_t nw = 0, ns = 0;
    for (int i = 0; i < NT; i++) {
        tf[i] = (kiln_adamw_tensor){nw, ns, sizes[i], i % 2, 1, 0, 0, 0};
        tb[i] = tf[i], tb[i].g_bf16 = i != 1; /* one f32 gradient among them */
        tb[i].keep_g = tb[i].g_bf16;
        nw += (sizes[i] + 63) / 64 * 64;
        ns += 2 * sizes[i];
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, 71 + shift);
    float *w0 = gt_rand(&rng, nw, 1.0f), *gs[2], *gm[2];
    for (int t = 0; t < 2; t++) {
        gs[t] = gt_rand(&rng, nw, t ? 1e-3f : 1.0f);
        gt_round_bf16(gs[t], nw);
        gm[t] = mixed_grads(gs[t], tb, NT, nw);
    }
    kiln_adamw_multi *pf = NULL, *pb = NULL;
    CHECK_OK(kiln_adamw_multi_create(tf, NT, &pf));
    CHECK_OK(kiln_adamw_multi_create(tb, NT, &pb));
    float *dw = gt_dev((size_t)(nw + 4) * 4), *dst = gt_dev((size_t)(ns + 4) * 4), *dg = gt_dev((size_t)(nw + 4) * 4);
    kiln_bf16 *dwb = gt_dev((size_t)(nw + 8) * 2);
    float *zst = calloc((size_t)ns, sizeof *zst), *ref_w = NULL, *ref_s = NULL;
    static const char *grids[] = {"chunks", "persistent", "staged"};
    for (int run = 0; run < 1 + 3 * 2 * 2 && pf && pb; run++) { /* run 0: f32 gradients; then grid x hints x zeroing */
        const int gi = run ? (run - 1) / 4 : 0, hints = run ? (run - 1) / 2 % 2 : 0, zero = run ? (run - 1) % 2 : 0;
        setenv("KILN_ADAMW_GRID", grids[gi], 1);
        setenv("KILN_ADAMW_HINTS", hints ? "1" : "0", 1);
        CHECK_OK(kiln_cuda_copy(dw + shift, w0, (size_t)nw * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(dst + shift, zst, (size_t)ns * 4, KILN_CUDA_H2D));
        for (int t = 0; t < 2; t++) {
            CHECK_OK(kiln_cuda_copy(dg + shift, run ? gm[t] : gs[t], (size_t)nw * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_adamw_multi_step_range_cuda(run ? pb : pf, 0, NT, dw + shift, dg + shift, dst + shift, 0.37f,
                                                      &hp, 1e-3 * (t + 1), t + 1, dwb + shift, zero, 0, NULL));
        }
        float *hw = gt_down_f32(dw + shift, nw), *hs = gt_down_f32(dst + shift, ns), *hg = gt_down_f32(dg + shift, nw);
        if (!run) {
            ref_w = hw, ref_s = hs;
        } else {
            const int64_t a = diff_bits(hw, ref_w, nw), b = diff_bits(hs, ref_s, ns);
            int64_t moved = 0; /* the bf16 gradients are kept even by a zeroing step */
            for (int i = 0; i < NT; i++)
                for (int64_t j = tb[i].off; j < tb[i].off + (tb[i].g_bf16 ? (sizes[i] + 1) / 2 : sizes[i]); j++)
                    moved += tb[i].g_bf16 ? hg[j] != gm[1][j] : hg[j] != (zero ? 0.0f : gm[1][j]);
            CHECK_MSG(a == 0 && b == 0 && moved == 0, "bf16 gradients, %s, hints %d, zeroing %d (shift %d): w %lld, m/v %lld "
                      "bits differ from f32 gradients of the same values; %lld gradient words wrong after the step",
                      grids[gi], hints, zero, shift, (long long)a, (long long)b, (long long)moved);
            free(hw), free(hs);
        }
        free(hg);
    }
    unsetenv("KILN_ADAMW_GRID");
    unsetenv("KILN_ADAMW_HINTS");
    kiln_adamw_tensor bad = {4, 0, 10, 0, 1, 1, 0, 0}, bad2 = {0, 0, 10, 0, 0, 1, 0, 0};
    kiln_adamw_multi *q = NULL;
    bad.off = 6;
    CHECK_ERR(kiln_adamw_multi_create(&bad, 1, &q), "multiple of 4");
    CHECK_ERR(kiln_adamw_multi_create(&bad2, 1, &q), "keep_g");
    kiln_adamw_multi_free(pf), kiln_adamw_multi_free(pb);
    kiln_cuda_free(dw), kiln_cuda_free(dst), kiln_cuda_free(dg), kiln_cuda_free(dwb);
    free(ref_w), free(ref_s), free(w0), free(zst);
    for (int t = 0; t < 2; t++) free(gs[t]), free(gm[t]);
}

TEST(gpu_ops_adamw_bf16_gradients) {
    adamw_bf16_case(0);
    adamw_bf16_case(2);
}

/* Split masters (kiln_f32_split_cuda, kiln_adamw_multi_set_split): the device's split and join give the CPU's
 * kiln_f32_split / kiln_f32_join bits for every bf16 top half with a spread of low halves (ties, carries, the specials);
 * then AdamW over split weights, in every kernel that takes them, gives after a join the same f32 weights and state,
 * bit for bit, as over f32 weights, and the bf16 copy is the split's rounding of those weights (an f32 tensor beside
 * them keeps its own rounding). The staged kernel and a split step without the bf16 copy are refused. */
static const uint16_t split_lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff, 0x1234, 0xc3a5};

static void down_split(const float *dw, const kiln_bf16 *dwb, int64_t n, uint16_t *hi, uint16_t *lo) {
    uint16_t *h = malloc((size_t)n * 2), *l = malloc((size_t)(n + 1) * 4);
    CHECK_OK(kiln_cuda_copy(h, dwb, (size_t)n * 2, KILN_CUDA_D2H));
    CHECK_OK(kiln_cuda_copy(l, dw, (size_t)n * 4, KILN_CUDA_D2H));
    for (int64_t j = 0; j < n; j++) { /* chunk c's low halves: the first half of its own f32 slots */
        const int64_t c = j / 4096;
        hi[j] = h[j], lo[j] = l[2 * c * 4096 + (j - c * 4096)];
    }
    free(h), free(l);
}

TEST(gpu_ops_f32_split_join) {
    enum { NL = sizeof split_lows / sizeof *split_lows };
    const int64_t n = 65536 * NL;
    uint32_t *u = malloc((size_t)n * 4);
    for (int64_t top = 0; top < 65536; top++)
        for (int j = 0; j < NL; j++) u[top * NL + j] = (uint32_t)top << 16 | split_lows[j];
    float *dw = gt_dev((size_t)n * 4);
    kiln_bf16 *dwb = gt_dev((size_t)n * 2);
    uint16_t *hi = malloc((size_t)n * 2), *lo = malloc((size_t)n * 2);
    CHECK_OK(kiln_cuda_copy(dw, u, (size_t)n * 4, KILN_CUDA_H2D));
    CHECK_OK(kiln_f32_split_cuda(dw, dwb, n, NULL));
    down_split(dw, dwb, n, hi, lo);
    int64_t bad = 0, back = 0;
    for (int64_t i = 0; i < n; i++) {
        float f;
        uint16_t h, l;
        memcpy(&f, u + i, 4);
        kiln_f32_split(f, &h, &l);
        bad += h != hi[i] || l != lo[i];
    }
    CHECK_OK(kiln_f32_join_cuda(dw, dwb, n, NULL));
    uint32_t *v = malloc((size_t)n * 4);
    CHECK_OK(kiln_cuda_copy(v, dw, (size_t)n * 4, KILN_CUDA_D2H));
    for (int64_t i = 0; i < n; i++) {
        float a, b;
        memcpy(&a, u + i, 4), memcpy(&b, v + i, 4);
        back += isnan(a) ? !isnan(b) : u[i] != v[i];
    }
    CHECK_MSG(bad == 0, "%lld of %lld split halves differ from kiln_f32_split's", (long long)bad, (long long)n);
    CHECK_MSG(back == 0, "%lld of %lld values not joined back", (long long)back, (long long)n);
    CHECK_ERR(kiln_f32_split_cuda(dw + 2, dwb, 100, NULL), "16-byte");
    kiln_cuda_free(dw), kiln_cuda_free(dwb);
    free(u), free(v), free(hi), free(lo);
}

/* vec: sizes that keep every tensor's state 16-byte aligned (the kernel with vector accesses; the experts'), else
 * some that do not (the scalar one) */
static void adamw_split_case(int vec) {
    kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    static const int64_t odd[] = {3000001, 5, 4096, 8190, 1, 70001}, even[] = {3000000, 5, 4096, 8192, 4, 70004};
    enum { NT = sizeof odd / sizeof *odd };
    const int64_t *sizes = vec ? even : odd;
    kiln_adamw_tensor tb[NT];
    int64_t nw = 0, ns = 0;
    for (int i = 0; i < NT; i++) {
        tb[i] = (kiln_adamw_tensor){nw, ns, sizes[i], i % 2, i != 1, i != 1, 0, 0}; /* one f32 tensor among them */
        nw += (sizes[i] + 63) / 64 * 64;
        ns += (2 * sizes[i] + 3) / 4 * 4;
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, 83 + vec);
    float *w0 = gt_rand(&rng, nw, 1.0f), *gm[2];
    for (int t = 0; t < 2; t++) { /* bf16 gradients in the first half of their slots; f32 for tensor 1 */
        float *gs = gt_rand(&rng, nw, t ? 1e-3f : 1.0f);
        gm[t] = mixed_grads(gs, tb, NT, nw);
        free(gs);
    }
    kiln_adamw_multi *pb = NULL;
    CHECK_OK(kiln_adamw_multi_create(tb, NT, &pb));
    float *dw = gt_dev((size_t)nw * 4), *dst = gt_dev((size_t)ns * 4), *dg = gt_dev((size_t)nw * 4);
    kiln_bf16 *dwb = gt_dev((size_t)nw * 2);
    float *zst = calloc((size_t)ns, sizeof *zst), *ref_w = NULL, *ref_s = NULL;
    static const struct { const char *grid; int hints, zero; } runs[] = {
        {"chunks", 0, 0}, /* f32 weights: the reference */
        {"chunks", 0, 0}, {"chunks", 1, 0}, {"chunks", 0, 1}, {"persistent", 0, 0}, {"persistent", 1, 1},
    };
    for (size_t run = 0; run < sizeof runs / sizeof *runs && pb; run++) {
        setenv("KILN_ADAMW_GRID", runs[run].grid, 1);
        setenv("KILN_ADAMW_HINTS", runs[run].hints ? "1" : "0", 1);
        CHECK_OK(kiln_cuda_copy(dw, w0, (size_t)nw * 4, KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(dst, zst, (size_t)ns * 4, KILN_CUDA_H2D));
        kiln_adamw_multi_set_split(pb, run > 0);
        for (int i = 0; i < NT && run; i++)
            if (tb[i].g_bf16) CHECK_OK(kiln_f32_split_cuda(dw + tb[i].off, dwb + tb[i].off, sizes[i], NULL));
        for (int t = 0; t < 2; t++) {
            CHECK_OK(kiln_cuda_copy(dg, gm[t], (size_t)nw * 4, KILN_CUDA_H2D));
            CHECK_OK(kiln_adamw_multi_step_range_cuda(pb, 0, NT, dw, dg, dst, 0.37f, &hp, 1e-3 * (t + 1), t + 1, dwb,
                                                      runs[run].zero, 0, NULL));
        }
        uint16_t *hi = NULL, *lo = NULL;
        if (run) { /* the split halves as the step left them, then f32 again */
            hi = malloc((size_t)nw * 2), lo = malloc((size_t)nw * 2);
            for (int i = 0; i < NT; i++)
                if (tb[i].g_bf16) down_split(dw + tb[i].off, dwb + tb[i].off, sizes[i], hi + tb[i].off, lo + tb[i].off);
            for (int i = 0; i < NT; i++)
                if (tb[i].g_bf16) CHECK_OK(kiln_f32_join_cuda(dw + tb[i].off, dwb + tb[i].off, sizes[i], NULL));
        }
        float *hw = gt_down_f32(dw, nw), *hs = gt_down_f32(dst, ns);
        if (!run) {
            ref_w = hw, ref_s = hs;
            continue;
        }
        const int64_t a = diff_bits(hw, ref_w, nw), b = diff_bits(hs, ref_s, ns);
        int64_t split_bad = 0, copy_bad = 0, ties = 0;
        float *wbf = gt_down_bf16(dwb, nw);
        for (int i = 0; i < NT; i++)
            for (int64_t j = tb[i].off; j < tb[i].off + sizes[i]; j++) {
                uint16_t h, l;
                kiln_f32_split(ref_w[j], &h, &l);
                if (tb[i].g_bf16) {
                    split_bad += h != hi[j] || l != lo[j];
                    ties += kiln_f32_to_bf16(ref_w[j]) != h;
                }
                copy_bad += wbf[j] != kiln_bf16_to_f32(tb[i].g_bf16 ? h : kiln_f32_to_bf16(ref_w[j]));
            }
        CHECK_MSG(a == 0 && b == 0 && split_bad == 0 && copy_bad == 0, "split weights (%s), %s, hints %d, zeroing %d: w "
                  "%lld, m/v %lld bits differ from f32 weights; %lld split halves, %lld bf16 copies wrong",
                  vec ? "vector" : "scalar", runs[run].grid, runs[run].hints, runs[run].zero, (long long)a, (long long)b,
                  (long long)split_bad, (long long)copy_bad);
        if (run == 1) printf("    %lld bf16 weights at an exact tie (toward zero, not to even)\n", (long long)ties);
        free(hw), free(hs), free(wbf), free(hi), free(lo);
    }
    setenv("KILN_ADAMW_GRID", "staged", 1);
    kiln_adamw_multi_set_split(pb, 1);
    if (pb) CHECK_ERR(kiln_adamw_multi_step_range_cuda(pb, 0, NT, dw, dg, dst, 1.0f, &hp, 1e-3, 3, dwb, 0, 0, NULL), "staged");
    unsetenv("KILN_ADAMW_GRID");
    unsetenv("KILN_ADAMW_HINTS");
    if (pb) CHECK_ERR(kiln_adamw_multi_step_range_cuda(pb, 0, NT, dw, dg, dst, 1.0f, &hp, 1e-3, 3, NULL, 0, 0, NULL), "bf16 copy");
    kiln_adamw_multi_free(pb);
    kiln_cuda_free(dw), kiln_cuda_free(dst), kiln_cuda_free(dg), kiln_cuda_free(dwb);
    free(ref_w), free(ref_s), free(w0), free(zst);
    for (int t = 0; t < 2; t++) free(gm[t]);
}

TEST(gpu_ops_adamw_split_master) {
    adamw_split_case(1);
    adamw_split_case(0);
}
