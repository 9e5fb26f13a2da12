/* The experts on the device against kiln_experts_forward / _backward (src/nn/experts.c) on the same
 * bf16-rounded inputs, and the router dispatch against the CPU's grouping exactly. Shapes: odd sizes,
 * top_k 1..3, skip-routed slots, an expert with no tokens, several dispatch chunks.
 * Tolerances (max |gpu - ref| / max |ref|): the GPU keeps xe, gu, act, ye and the backward's dye, dact,
 * dgu, dxe in bf16 where the CPU keeps f32, so each output has passed 2 to 4 roundings of at most 2^-9
 * relative each (products and sums in f32 on both sides):
 *   out, dx, dwgu, dwdn: 2e-2 (the chain gate_up -> SwiGLU -> down, and back);
 *   dgate: 2e-2 (dout . ye over H, ye rounded to bf16 once on the GPU, the sum in f32). */
#include <math.h>
#include <string.h>

#include "cuda/experts_dw_wg.h"
#include "gpu_testutil.h"
#include "kiln/nn.h"

typedef struct {
    int64_t N, E, top, H, I;
    double skip;   /* probability a slot goes to the skip class */
    int64_t empty; /* an expert that gets no slot (-1: none) */
} ex_case;

static int32_t *up_i32(const int32_t *x, int64_t n) {
    int32_t *d = gt_dev((size_t)(n ? n : 1) * 4);
    if (n) CHECK_OK(kiln_cuda_copy(d, x, (size_t)n * 4, KILN_CUDA_H2D));
    return d;
}
static int32_t *down_i32(const int32_t *d, int64_t n) {
    int32_t *h = malloc((size_t)(n ? n : 1) * 4);
    CHECK_OK(kiln_cuda_sync());
    if (n) CHECK_OK(kiln_cuda_copy(h, d, (size_t)n * 4, KILN_CUDA_D2H));
    return h;
}

static void route(int32_t *choice, const ex_case *c, kiln_rng *rng) {
    for (int64_t s = 0; s < c->N * c->top; s++) {
        int32_t e;
        if (kiln_rng_uniform(rng) < c->skip) e = (int32_t)c->E;
        else
            do e = (int32_t)(kiln_rng_u64(rng) % (uint64_t)c->E);
            while (e == c->empty);
        choice[s] = e;
    }
}

/* Device arrays of one kiln_experts_cuda (choice and gate uploaded). */
static kiln_experts_cuda dev_experts(const ex_case *c, const int32_t *choice, const float *gate) {
    const int64_t S = c->N * c->top;
    kiln_experts_cuda x = {c->N, c->H, c->I, c->E, c->top, up_i32(choice, S), gate ? gt_up_f32(gate, S) : NULL,
                           gt_dev((size_t)(c->E + 2) * 4), malloc((size_t)(c->E + 2) * 4),
                           gt_dev((size_t)(S ? S : 1) * 4), gt_dev((size_t)(S ? S : 1) * 4),
                           gt_dev((size_t)(S ? S : 1) * 4), 0, NULL, NULL, NULL, NULL};
    return x;
}
static void free_dev_experts(kiln_experts_cuda *x) {
    kiln_cuda_free((void *)x->choice), kiln_cuda_free((void *)x->gate), kiln_cuda_free(x->exp_off);
    free(x->exp_off_host);
    kiln_cuda_free(x->slot_tok), kiln_cuda_free(x->slot_k), kiln_cuda_free(x->tok_slot);
    kiln_cuda_free(x->xe), kiln_cuda_free(x->gu), kiln_cuda_free(x->act), kiln_cuda_free(x->ye);
}

/* dispatch vs the CPU grouping of kiln_experts_forward: offsets, slot order, and tok_slot its inverse */
static void dispatch_case(const ex_case *c, uint64_t seed) {
    printf("  dispatch N=%lld E=%lld top_k=%lld skip=%.2f\n", (long long)c->N, (long long)c->E, (long long)c->top,
           c->skip);
    const int64_t N = c->N, E = c->E, top = c->top, S = N * top;
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    int32_t *choice = malloc((size_t)S * 4);
    route(choice, c, &rng);
    /* the CPU grouping, as kiln_experts_forward does it (H = inter = 1: the MLP is irrelevant here) */
    int32_t *off = malloc((size_t)(E + 1) * 4), *fill = malloc((size_t)E * 4), *st = malloc((size_t)S * 4);
    int32_t *sk = malloc((size_t)S * 4);
    float *in = calloc((size_t)N, sizeof(float)), *gate = calloc((size_t)S, sizeof(float));
    float *xe = calloc((size_t)S, sizeof(float)), *gu = calloc(2 * (size_t)S, sizeof(float));
    float *act = calloc((size_t)S, sizeof(float)), *ye = calloc((size_t)S, sizeof(float));
    float *wgu = calloc(2 * (size_t)E, sizeof(float)), *wdn = calloc((size_t)E, sizeof(float));
    float *out = malloc((size_t)N * sizeof(float));
    kiln_experts cx = {N, 1, 1, E, top, choice, gate, off, fill, st, sk, 0, xe, gu, act, ye};
    kiln_experts_forward(&cx, out, in, wgu, wdn);

    kiln_experts_cuda x = dev_experts(c, choice, NULL);
    CHECK_OK(kiln_experts_dispatch_cuda(&x, NULL));
    int32_t *goff = down_i32(x.exp_off, E + 2), *gst = down_i32(x.slot_tok, S), *gsk = down_i32(x.slot_k, S);
    int32_t *gts = down_i32(x.tok_slot, S);
    CHECK_MSG(!memcmp(goff, off, (size_t)(E + 1) * 4), "expert offsets differ from the CPU's");
    CHECK_MSG(goff[E + 1] == 0, "%d bad choices reported", goff[E + 1]);
    int64_t bad = 0, badinv = 0;
    for (int64_t s = 0; s < cx.nslots; s++) bad += gst[s] != st[s] || gsk[s] != sk[s];
    for (int64_t s = 0; s < S; s++) {
        int32_t p = gts[s];
        if (choice[s] == E) badinv += p != -1;
        else badinv += p < 0 || p >= cx.nslots || gst[p] != s / top || gsk[p] != s % top;
    }
    CHECK_MSG(bad == 0, "%lld of %lld slots differ from the CPU's order", (long long)bad, (long long)cx.nslots);
    CHECK_MSG(badinv == 0, "tok_slot is not the inverse permutation at %lld slots", (long long)badinv);
    free_dev_experts(&x);
    free(choice), free(off), free(fill), free(st), free(sk), free(in), free(gate), free(xe), free(gu), free(act);
    free(ye), free(wgu), free(wdn), free(out);
    free(goff), free(gst), free(gsk), free(gts);
}

TEST(gpu_experts_dispatch) {
    const ex_case cs[] = {
        {1, 1, 1, 1, 1, 0.0, -1},       {5, 3, 2, 1, 1, 0.3, 1},       {1000, 16, 1, 1, 1, 0.1, 7},
        {3001, 7, 3, 1, 1, 0.2, -1},    {20000, 16, 2, 1, 1, 0.05, 0}, /* 157 chunks of 256 slots */
        {40000, 16, 2, 1, 1, 0.05, 0},  /* 80000 slots: past 64K, 79 chunks of 1024 */
        {700, 64, 4, 1, 1, 0.0, 63},    {100, 4, 1, 1, 1, 1.0, -1},   /* everything skipped */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) dispatch_case(&cs[i], 100 + i);
}

/* 1: the backward writes the weight gradients (kiln_experts_cuda_scratch.dw_write): the device's start from
 * random values that must vanish, the CPU's from zero */
static int g_dw_write;
/* 1: the weight gradients left running on the side streams (kiln_experts_cuda_scratch.dw_defer), joined after */
static int g_dw_defer;
/* 1: the backward writes dx (kiln_experts_cuda_scratch.dx_write): the device's dx starts from random values that
 * must vanish, the CPU's from zero */
static int g_dx_write;
/* 1 (with g_dw_write): the weight gradients in bf16 (kiln_experts_cuda_scratch.dw_bf16) */
static int g_dw_bf16;
/* 1 (with g_dw_write): an expert without rows keeps its weight gradients as they were (dw_keep_empty) */
static int g_dw_keep;
/* 1 (with g_dw_bf16 and g_dw_defer): the backward is asked for the weight gradients' sums of squares (dw_sq); where
 * it gives them, they are checked against the downloaded gradients; g_dw_sq_seen counts the cases that gave them */
static int g_dw_sq, g_dw_sq_seen;

/* forward and backward against the CPU op; returns nothing, checks inside */
static void experts_case(const ex_case *c, uint64_t seed) {
    printf("  experts N=%lld E=%lld top_k=%lld H=%lld I=%lld skip=%.2f empty=%lld\n", (long long)c->N,
           (long long)c->E, (long long)c->top, (long long)c->H, (long long)c->I, c->skip, (long long)c->empty);
    const int64_t N = c->N, E = c->E, top = c->top, H = c->H, I = c->I, S = N * top;
    const int64_t nw = E * 2 * I * H, nd = E * H * I;
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    int32_t *choice = malloc((size_t)S * 4);
    route(choice, c, &rng);
    float *gate = malloc((size_t)S * sizeof(float));
    for (int64_t s = 0; s < S; s++) gate[s] = (float)(0.1 + 0.9 * kiln_rng_uniform(&rng));
    float *in = gt_rand(&rng, N * H, 1.0f), *wgu = gt_rand(&rng, nw, 1.0f / sqrtf((float)H));
    float *wdn = gt_rand(&rng, nd, 1.0f / sqrtf((float)I)), *dout = gt_rand(&rng, N * H, 1.0f);
    float *dx = gt_rand(&rng, N * H, 0.1f), *dwgu = gt_rand(&rng, nw, 0.01f), *dwdn = gt_rand(&rng, nd, 0.01f);
    gt_round_bf16(in, N * H), gt_round_bf16(wgu, nw), gt_round_bf16(wdn, nd);

    /* device side first (the CPU call below overwrites dx, dwgu, dwdn in place) */
    kiln_experts_cuda x = dev_experts(c, choice, gate);
    x.xe = gt_dev((size_t)(S * H) * 2), x.gu = gt_dev((size_t)(S * 2 * I) * 2);
    x.act = gt_dev((size_t)(S * I) * 2), x.ye = gt_dev((size_t)(S * H) * 2);
    kiln_experts_cuda_scratch w = {gt_dev((size_t)(S * H) * 2), gt_dev((size_t)(S * I) * 2),
                                   gt_dev((size_t)(S * 2 * I) * 2), gt_dev((size_t)(S * H) * 2), g_dw_write,
                                   g_dw_defer, g_dx_write, g_dw_bf16, g_dw_keep, NULL, 0};
    if (g_dw_sq) w.dw_sq = gt_dev((size_t)(2 * E) * sizeof(double));
    kiln_bf16 *d_in = gt_up_bf16(in, N * H), *d_wgu = gt_up_bf16(wgu, nw), *d_wdn = gt_up_bf16(wdn, nd);
    float *d_out = gt_dev((size_t)(N * H) * 4), *d_dout = gt_up_f32(dout, N * H), *d_dx = gt_up_f32(dx, N * H);
    float *d_dgate = gt_dev((size_t)S * 4);
    /* bf16 weight gradients start as random bf16 values that must vanish too */
    void *d_dwgu = g_dw_bf16 ? (void *)gt_up_bf16(dwgu, nw) : (void *)gt_up_f32(dwgu, nw);
    void *d_dwdn = g_dw_bf16 ? (void *)gt_up_bf16(dwdn, nd) : (void *)gt_up_f32(dwdn, nd);
    /* dw_keep_empty: what the device held, as it held it */
    float *kgu = g_dw_keep ? malloc((size_t)nw * sizeof *kgu) : NULL, *kdn = g_dw_keep ? malloc((size_t)nd * sizeof *kdn) : NULL;
    if (kgu && kdn) {
        memcpy(kgu, dwgu, (size_t)nw * sizeof *kgu), memcpy(kdn, dwdn, (size_t)nd * sizeof *kdn);
        if (g_dw_bf16) gt_round_bf16(kgu, nw), gt_round_bf16(kdn, nd);
    }
    if (g_dw_write) memset(dwgu, 0, (size_t)nw * sizeof *dwgu), memset(dwdn, 0, (size_t)nd * sizeof *dwdn);
    if (g_dx_write) memset(dx, 0, (size_t)(N * H) * sizeof *dx);
    CHECK_OK(kiln_experts_forward_cuda(&x, d_out, d_in, d_wgu, d_wdn, NULL));
    CHECK_OK(kiln_experts_backward_cuda(&x, d_dx, d_dgate, d_dwgu, d_dwdn, d_dout, d_wgu, d_wdn, &w, NULL));
    CHECK_OK(kiln_experts_backward_join_cuda(NULL));
    float *g_out = gt_down_f32(d_out, N * H), *g_dx = gt_down_f32(d_dx, N * H), *g_dgate = gt_down_f32(d_dgate, S);
    float *g_dwgu = g_dw_bf16 ? gt_down_bf16(d_dwgu, nw) : gt_down_f32(d_dwgu, nw);
    float *g_dwdn = g_dw_bf16 ? gt_down_bf16(d_dwdn, nd) : gt_down_f32(d_dwdn, nd);

    /* the CPU reference */
    int32_t *off = malloc((size_t)(E + 1) * 4), *fill = malloc((size_t)E * 4), *st = malloc((size_t)S * 4);
    int32_t *sk = malloc((size_t)S * 4);
    float *xe = malloc((size_t)(S * H) * 4), *gu = malloc((size_t)(S * 2 * I) * 4), *act = malloc((size_t)(S * I) * 4);
    float *ye = malloc((size_t)(S * H) * 4), *dye = malloc((size_t)(S * H) * 4), *dact = malloc((size_t)(S * I) * 4);
    float *dgu = malloc((size_t)(S * 2 * I) * 4), *dxe = malloc((size_t)(S * H) * 4);
    float *out = malloc((size_t)(N * H) * 4), *dgate = malloc((size_t)S * 4);
    kiln_experts cx = {N, H, I, E, top, choice, gate, off, fill, st, sk, 0, xe, gu, act, ye};
    kiln_experts_scratch cw = {dye, dact, dgu, dxe};
    kiln_experts_forward(&cx, out, in, wgu, wdn);
    kiln_experts_backward(&cx, dx, dgate, dwgu, dwdn, dout, wgu, wdn, &cw);
    for (int64_t e = 0; e < E && kgu && kdn; e++) { /* dw_keep_empty: the experts without rows as they were */
        int64_t rows = 0;
        for (int64_t q = 0; q < S; q++) rows += choice[q] == e;
        if (rows) continue;
        memcpy(dwgu + e * 2 * I * H, kgu + e * 2 * I * H, (size_t)(2 * I * H) * sizeof *dwgu);
        memcpy(dwdn + e * H * I, kdn + e * H * I, (size_t)(H * I) * sizeof *dwdn);
    }
    free(kgu), free(kdn);

    CHECK_MSG(x.nslots == cx.nslots, "nslots %lld, CPU %lld", (long long)x.nslots, (long long)cx.nslots);
    GT_CLOSE("experts out", g_out, out, N * H, 2e-2);
    GT_CLOSE(g_dx_write ? "experts dx (=)" : "experts dx (+=)", g_dx, dx, N * H, 2e-2);
    GT_CLOSE("experts dgate", g_dgate, dgate, S, 2e-2);
    GT_CLOSE(g_dw_bf16 ? "experts dwgu (=, bf16)" : g_dw_write ? "experts dwgu (=, f32)" : "experts dwgu (+=, f32)", g_dwgu,
             dwgu, nw, 2e-2);
    GT_CLOSE(g_dw_bf16 ? "experts dwdn (=, bf16)" : g_dw_write ? "experts dwdn (=, f32)" : "experts dwdn (+=, f32)", g_dwdn,
             dwdn, nd, 2e-2);
    int64_t nonzero = 0;
    for (int64_t s = 0; s < S; s++) nonzero += choice[s] == E && g_dgate[s] != 0.0f;
    CHECK_MSG(nonzero == 0, "%lld skipped slots got a gate gradient", (long long)nonzero);
    if (c->empty >= 0) { /* an expert without tokens keeps its gradient exactly (written: exactly zero; kept: as it was) */
        int64_t moved = 0;
        for (int64_t i = 0; i < 2 * I * H; i++) moved += g_dwgu[c->empty * 2 * I * H + i] != dwgu[c->empty * 2 * I * H + i];
        for (int64_t i = 0; i < H * I; i++) moved += g_dwdn[c->empty * H * I + i] != dwdn[c->empty * H * I + i];
        CHECK_MSG(moved == 0, "expert %lld has no tokens but %lld of its gradient entries changed", (long long)c->empty,
                  (long long)moved);
    }
    if (w.dw_sq && w.dw_sq_done) { /* each expert's sums of squares against its downloaded gradients (0 without rows) */
        double *sq = malloc((size_t)(2 * E) * sizeof *sq), worst = 0;
        CHECK_OK(kiln_cuda_copy(sq, w.dw_sq, (size_t)(2 * E) * sizeof *sq, KILN_CUDA_D2H));
        for (int64_t e = 0; e < 2 * E; e++) {
            const int64_t x0 = e % E, ne = e < E ? 2 * I * H : H * I;
            const float *gr = e < E ? g_dwgu + x0 * ne : g_dwdn + x0 * ne;
            int64_t rows = 0;
            for (int64_t q = 0; q < S; q++) rows += choice[q] == x0;
            double want = 0;
            for (int64_t q = 0; rows && q < ne; q++) want += (double)gr[q] * gr[q];
            const double d = fabs(sq[e] - want) / (want > 0 ? want : 1.0);
            worst = d > worst ? d : worst;
        }
        CHECK_MSG(worst <= 2e-6, "the weight gradients' sums of squares off by %.3g (relative)", worst);
        printf("    experts dW sums of squares    rel err %.3g (tol 2e-06)\n", worst);
        g_dw_sq_seen++;
        free(sq);
    }

    free_dev_experts(&x);
    kiln_cuda_free(w.dye), kiln_cuda_free(w.dact), kiln_cuda_free(w.dgu), kiln_cuda_free(w.dxe), kiln_cuda_free(w.dw_sq);
    kiln_cuda_free(d_in), kiln_cuda_free(d_wgu), kiln_cuda_free(d_wdn), kiln_cuda_free(d_out), kiln_cuda_free(d_dout);
    kiln_cuda_free(d_dx), kiln_cuda_free(d_dgate), kiln_cuda_free(d_dwgu), kiln_cuda_free(d_dwdn);
    free(g_out), free(g_dx), free(g_dgate), free(g_dwgu), free(g_dwdn);
    free(choice), free(gate), free(in), free(wgu), free(wdn), free(dout), free(dx), free(dwgu), free(dwdn);
    free(off), free(fill), free(st), free(sk), free(xe), free(gu), free(act), free(ye), free(dye), free(dact);
    free(dgu), free(dxe), free(out), free(dgate);
}

TEST(gpu_experts_fwd_bwd) {
    const ex_case cs[] = {
        {64, 4, 1, 32, 48, 0.25, 2},    /* an expert with no tokens, a quarter skipped */
        {257, 8, 2, 96, 80, 0.1, 7},    /* top-2, the last expert empty */
        {33, 3, 3, 40, 24, 0.2, -1},    /* top_k = experts */
        {50, 5, 2, 36, 20, 0.0, 0},     /* hidden not a multiple of 8 (scalar gather), first expert empty */
        {40, 4, 2, 30, 18, 0.1, -1},    /* hidden not a multiple of 4 (one column per thread in the sums) */
        {1000, 16, 1, 128, 256, 0.05, -1},
        {2048, 16, 1, 512, 384, 0.0, -1}, /* long reductions: K = 2*inter = 768 for dx */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 200 + i);
}

/* everything skipped: out is zero, dx unchanged, dgate zero, weight gradients unchanged */
TEST(gpu_experts_all_skipped) {
    const ex_case c = {40, 4, 2, 16, 8, 1.0, -1};
    experts_case(&c, 300);
}

/* dw_write: the weight gradients written, not accumulated, on every path (an empty expert's become zero;
 * everything skipped: all zero) */
TEST(gpu_experts_dw_write) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {3000, 4, 1, 64, 96, 0.05, 1}, {40, 4, 2, 16, 8, 1.0, -1}};
    const char *const *paths = kiln_grouped_gemm_paths();
    g_dw_write = 1;
    for (int p = 0; paths[p]; p++) {
        printf("  path %s\n", paths[p]);
        CHECK_OK(kiln_grouped_gemm_set_path(paths[p]));
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 900 + i);
    }
    g_dw_write = 0;
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* dw_bf16: the weight gradients written in bf16 (the trainer's default on one rank), on every path and deferred
 * (an empty expert's become zero; everything skipped: all zero); adding to bf16 gradients is refused */
/* bf16 weight gradients written (keep: an empty expert's kept), the cases on every path, deferred and not */
static void dw_bf16_cases(const ex_case *cs, size_t n, int keep, uint64_t seed) {
    const char *const *paths = kiln_grouped_gemm_paths();
    g_dw_write = 1, g_dw_bf16 = 1, g_dw_keep = keep;
    for (int p = 0; paths[p]; p++) {
        printf("  path %s\n", paths[p]);
        CHECK_OK(kiln_grouped_gemm_set_path(paths[p]));
        for (int d = 0; d < 2; d++) {
            g_dw_defer = d;
            for (size_t i = 0; i < n; i++) experts_case(&cs[i], seed + i);
        }
    }
    g_dw_write = 0, g_dw_bf16 = 0, g_dw_keep = 0, g_dw_defer = 0;
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

TEST(gpu_experts_dw_bf16) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {3000, 4, 1, 64, 96, 0.05, 1}, {40, 4, 2, 16, 8, 1.0, -1}};
    dw_bf16_cases(cs, sizeof cs / sizeof cs[0], 0, 1700);
    kiln_experts_cuda x = {0};
    kiln_experts_cuda_scratch w = {NULL, NULL, NULL, NULL, 0, 0, 0, 1, 0, NULL, 0};
    CHECK_ERR(kiln_experts_backward_cuda(&x, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &w, NULL), "dw_write");
}

/* dw_keep_empty (the trainer's with its zero mask): bf16 weight gradients written, an empty expert's left exactly as
 * they were (random bf16 values), on every path and deferred; everything skipped: all left as they were */
TEST(gpu_experts_dw_keep_empty) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {3000, 4, 1, 64, 96, 0.05, 1}, {64, 4, 1, 32, 48, 0.25, 2},
                          {40, 4, 2, 16, 8, 1.0, -1}};
    dw_bf16_cases(cs, sizeof cs / sizeof cs[0], 1, 2300);
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 0, NULL, NULL, NULL, 1, 1, 1, 1, "TN", 3, NULL, NULL), "accumulate 3");
}

/* dx_write: dx written, not accumulated (the trainer's call), on the default path and the per-expert loop; every
 * slot skipped: dx becomes zero */
TEST(gpu_experts_dx_write) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {1000, 16, 1, 128, 256, 0.05, -1}, {50, 5, 2, 36, 20, 0.0, 0},
                          {40, 4, 2, 30, 18, 0.1, -1}, {40, 4, 2, 16, 8, 1.0, -1}};
    static const char *const paths[2] = {"lt_mixed", "lt_loop"};
    g_dx_write = 1;
    for (int p = 0; p < 2; p++) {
        printf("  path %s\n", paths[p]);
        CHECK_OK(kiln_grouped_gemm_set_path(paths[p]));
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 1300 + i);
    }
    g_dx_write = 0;
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* kiln_experts_profile_cuda: nothing recorded before a call (-1), every pass timed after one forward + backward
 * (>= 0), the results unchanged by the events (the CPU comparison runs with profiling on) */
TEST(gpu_experts_profile) {
    double us[KILN_EXPERTS_NPASS];
    CHECK_OK(kiln_experts_profile_cuda(1));
    CHECK_OK(kiln_experts_profile_read_cuda(us));
    for (int p = 0; p < KILN_EXPERTS_NPASS; p++) CHECK_MSG(us[p] == -1, "pass %d: %g us before any call", p, us[p]);
    const ex_case c = {1000, 16, 1, 128, 256, 0.05, -1};
    experts_case(&c, 1500);
    CHECK_OK(kiln_experts_profile_read_cuda(us));
    for (int p = 0; p < KILN_EXPERTS_NPASS; p++) CHECK_MSG(us[p] >= 0, "pass %d: %g us after a call", p, us[p]);
    CHECK_OK(kiln_experts_profile_cuda(0));
}

/* two identical runs give identical bits (the deterministic mode's requirement), on the path in effect; the
 * second leaves its weight gradients running on the side streams (dw_defer) until joined: the same GEMMs */
static void experts_deterministic(void) {
    const int64_t N = 3000, E = 8, top = 2, H = 256, I = 192, S = N * top, nw = E * 2 * I * H, nd = E * H * I;
    const ex_case c = {N, E, top, H, I, 0.1, -1};
    kiln_rng rng;
    kiln_rng_seed(&rng, 400);
    int32_t *choice = malloc((size_t)S * 4);
    route(choice, &c, &rng);
    float *gate = gt_rand(&rng, S, 1.0f), *in = gt_rand(&rng, N * H, 1.0f), *wgu = gt_rand(&rng, nw, 0.06f);
    float *wdn = gt_rand(&rng, nd, 0.07f), *dout = gt_rand(&rng, N * H, 1.0f);
    float *zero = calloc((size_t)nw, sizeof(float));
    kiln_bf16 *d_in = gt_up_bf16(in, N * H), *d_wgu = gt_up_bf16(wgu, nw), *d_wdn = gt_up_bf16(wdn, nd);
    float *d_dout = gt_up_f32(dout, N * H);
    float *res[2][5];
    for (int r = 0; r < 2; r++) {
        kiln_experts_cuda x = dev_experts(&c, choice, gate);
        x.xe = gt_dev((size_t)(S * H) * 2), x.gu = gt_dev((size_t)(S * 2 * I) * 2);
        x.act = gt_dev((size_t)(S * I) * 2), x.ye = gt_dev((size_t)(S * H) * 2);
        /* the second run also writes dx over random values (dx_write): the same bits as adding onto zeros */
        kiln_experts_cuda_scratch w = {gt_dev((size_t)(S * H) * 2), gt_dev((size_t)(S * I) * 2),
                                       gt_dev((size_t)(S * 2 * I) * 2), gt_dev((size_t)(S * H) * 2), 0, r, r, 0, 0,
                                       NULL, 0};
        float *d_out = gt_dev((size_t)(N * H) * 4), *d_dx = gt_up_f32(r ? dout : zero, N * H), *d_dgate = gt_dev((size_t)S * 4);
        float *d_dwgu = gt_up_f32(zero, nw), *d_dwdn = gt_up_f32(zero, nd);
        CHECK_OK(kiln_experts_forward_cuda(&x, d_out, d_in, d_wgu, d_wdn, NULL));
        CHECK_OK(kiln_experts_backward_cuda(&x, d_dx, d_dgate, d_dwgu, d_dwdn, d_dout, d_wgu, d_wdn, &w, NULL));
        CHECK_OK(kiln_experts_backward_join_cuda(NULL)); /* the second run's weight gradients were deferred */
        res[r][0] = gt_down_f32(d_out, N * H), res[r][1] = gt_down_f32(d_dx, N * H);
        res[r][2] = gt_down_f32(d_dgate, S), res[r][3] = gt_down_f32(d_dwgu, nw), res[r][4] = gt_down_f32(d_dwdn, nd);
        free_dev_experts(&x);
        kiln_cuda_free(w.dye), kiln_cuda_free(w.dact), kiln_cuda_free(w.dgu), kiln_cuda_free(w.dxe);
        kiln_cuda_free(d_out), kiln_cuda_free(d_dx), kiln_cuda_free(d_dgate), kiln_cuda_free(d_dwgu);
        kiln_cuda_free(d_dwdn);
    }
    const int64_t len[5] = {N * H, N * H, S, nw, nd};
    static const char *const names[5] = {"out", "dx", "dgate", "dwgu", "dwdn"};
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(!memcmp(res[0][i], res[1][i], (size_t)len[i] * 4), "%s differs between two identical runs", names[i]);
        free(res[0][i]), free(res[1][i]);
    }
    kiln_cuda_free(d_in), kiln_cuda_free(d_wgu), kiln_cuda_free(d_wdn), kiln_cuda_free(d_dout);
    free(choice), free(gate), free(in), free(wgu), free(wdn), free(dout), free(zero);
}

TEST(gpu_experts_deterministic) { experts_deterministic(); }

/* a choice outside 0..E is an error naming the count, not a wild write */
TEST(gpu_experts_bad_choice) {
    const ex_case c = {10, 4, 1, 8, 8, 0.0, -1};
    int32_t choice[10] = {0, 1, 2, 3, 7, 0, 1, -1, 2, 3};
    float gate[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    kiln_experts_cuda x = dev_experts(&c, choice, gate);
    x.xe = gt_dev(10 * 8 * 2), x.gu = gt_dev(10 * 16 * 2), x.act = gt_dev(10 * 8 * 2), x.ye = gt_dev(10 * 8 * 2);
    float *d_out = gt_dev(10 * 8 * 4);
    kiln_bf16 *d_w = gt_dev(4 * 16 * 8 * 2), *d_in = gt_dev(10 * 8 * 2);
    CHECK_ERR(kiln_experts_forward_cuda(&x, d_out, d_in, d_w, d_w, NULL), "2 of 10 expert choices are outside 0..4");
    free_dev_experts(&x);
    kiln_cuda_free(d_out), kiln_cuda_free(d_w), kiln_cuda_free(d_in);
}

/* the routing decision: choices and gates equal to kiln_route_topk bit for bit (ties included), and the
 * gate gradient's scatter equal to kiln_route_gate_backward */
TEST(gpu_route_topk) {
    const int64_t cases[][4] = {{1000, 17, 1, 0}, {777, 17, 2, 1}, {300, 65, 4, 0}, {50, 3, 3, 1}, {64, 100, 8, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c][0], e1 = cases[c][1], top = cases[c][2], ties = cases[c][3];
        printf("  route top-k n=%lld classes=%lld top_k=%lld ties=%lld\n", (long long)n, (long long)e1, (long long)top,
               (long long)ties);
        kiln_rng rng;
        kiln_rng_seed(&rng, 500 + c);
        float *logit = gt_rand(&rng, n * e1, 3.0f), *probs = malloc((size_t)(n * e1) * 4);
        float *bias = gt_rand(&rng, e1, ties ? 0.0f : 0.05f);
        kiln_softmax_forward(probs, logit, n, e1);
        if (ties) /* coarse probabilities: many exact ties, the lower index must win */
            for (int64_t i = 0; i < n * e1; i++) probs[i] = floorf(probs[i] * 8.0f) / 8.0f;
        int32_t *ch = malloc((size_t)(n * top) * 4);
        float *gate = malloc((size_t)(n * top) * 4), *dgate = gt_rand(&rng, n * top, 1.0f);
        float *dp = gt_rand(&rng, n * e1, 1.0f);
        float *d_probs = gt_up_f32(probs, n * e1), *d_bias = gt_up_f32(bias, e1), *d_gate = gt_dev((size_t)(n * top) * 4);
        float *d_dgate = gt_up_f32(dgate, n * top), *d_dp = gt_up_f32(dp, n * e1);
        int32_t *d_ch = gt_dev((size_t)(n * top) * 4);
        kiln_route_topk(ch, gate, probs, bias, n, e1, top);
        CHECK_OK(kiln_route_topk_cuda(d_ch, d_gate, d_probs, d_bias, n, e1, top, NULL));
        int32_t *gch = down_i32(d_ch, n * top);
        float *ggate = gt_down_f32(d_gate, n * top);
        CHECK_MSG(!memcmp(gch, ch, (size_t)(n * top) * 4), "choices differ from kiln_route_topk");
        CHECK_MSG(!memcmp(ggate, gate, (size_t)(n * top) * 4), "gates differ from kiln_route_topk");
        kiln_route_gate_backward(dp, dgate, ch, n, e1, top);
        CHECK_OK(kiln_route_gate_backward_cuda(d_dp, d_dgate, d_ch, n, e1, top, NULL));
        float *gdp = gt_down_f32(d_dp, n * e1);
        CHECK_MSG(!memcmp(gdp, dp, (size_t)(n * e1) * 4), "dprobs differ from kiln_route_gate_backward");
        kiln_cuda_free(d_probs), kiln_cuda_free(d_bias), kiln_cuda_free(d_gate), kiln_cuda_free(d_dgate);
        kiln_cuda_free(d_dp), kiln_cuda_free(d_ch);
        free(logit), free(probs), free(bias), free(ch), free(gate), free(dgate), free(dp), free(gch), free(ggate), free(gdp);
    }
    CHECK_ERR(kiln_route_topk_cuda(NULL, NULL, NULL, NULL, 4, 3, 4, NULL), "top_k=4");
}

/* kiln_grouped_gemm_cuda alone on one path, every layout, bf16 and f32 C, with and without accumulation, an
 * expert without rows (TN without accumulation must zero its C_e). Reference in double on the same bf16
 * numbers; 1e-4 for f32 C (f32 sums of exact products over k <= 333), 1e-2 for bf16 C (one rounding, 2^-9).
 * Shapes: small experts (5, 12, 13 rows: one cuBLASLt plan bucket, the layouts reset to each true size);
 * the weights (B) 2 bytes into their buffer with 16-byte leading dimensions, as views of a flat bf16 weight
 * buffer are (cuBLAS's grouped call would fault on them: the per-expert path must run); and experts of 70,
 * 130 and 133 rows with KILN_GROUPED_CHUNK=64 (chunked paths: overlapping last chunks, batched). */
static void grouped_gemm_path(const char *path) {
    const int32_t offs_small[5] = {0, 5, 5, 17, 30}, offs_big[5] = {0, 70, 70, 200, 333};
    const int64_t shapes[3][5] = {{12, 9, 7, 0, 0}, {16, 24, 32, 1, 0}, {24, 40, 48, 0, 1}}; /* m (TN), n, k, B offset, big */
    const int64_t E = 4;
    static const char *const lays[3] = {"NT", "NN", "TN"};
    kiln_rng rng;
    kiln_rng_seed(&rng, 600);
    CHECK_OK(kiln_grouped_gemm_set_path(path));
    for (int sh = 0; sh < 3; sh++) {
        const int32_t *offs = shapes[sh][4] ? offs_big : offs_small;
        const int64_t R = offs[E];
        if (shapes[sh][4]) CHECK(setenv("KILN_GROUPED_CHUNK", "64", 1) == 0);
        for (int l = 0; l < 3; l++)
            for (int f32 = 0; f32 < 2; f32++)
                for (int acc = 0; acc < 2; acc++) {
                    const int tn = l == 2;
                    const int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2], boff = shapes[sh][3];
                    /* A: rows R x (tn ? m : k); B: tn ? rows R x n : E stacked [n,k] (NT) or [k,n] (NN); C: tn ? E x [m,n] : R x n */
                    const int64_t na = R * (tn ? m : k), nb = tn ? R * n : E * n * k, nc = tn ? E * m * n : R * n;
                    float *a = gt_rand(&rng, na, 1.0f), *b = gt_rand(&rng, nb, 1.0f), *c0 = gt_rand(&rng, nc, 1.0f);
                    gt_round_bf16(a, na), gt_round_bf16(b, nb), gt_round_bf16(c0, nc);
                    float *ref = malloc((size_t)nc * 4);
                    for (int64_t i = 0; i < nc; i++) ref[i] = acc ? c0[i] : 0.0f;
                    for (int64_t e = 0; e < E; e++)
                        for (int64_t r = offs[e]; r < offs[e + 1]; r++) {
                            if (tn) { /* C_e[i,j] += A[r,i] B[r,j] */
                                for (int64_t i = 0; i < m; i++)
                                    for (int64_t j = 0; j < n; j++)
                                        ref[e * m * n + i * n + j] += a[r * m + i] * b[r * n + j];
                            } else {
                                for (int64_t j = 0; j < n; j++) {
                                    double s = 0;
                                    for (int64_t p = 0; p < k; p++)
                                        s += (double)a[r * k + p] *
                                             (l == 0 ? b[e * n * k + j * k + p] : b[e * k * n + p * n + j]);
                                    ref[r * n + j] += (float)s;
                                }
                            }
                        }
                    float *bpad = calloc((size_t)(nb + boff), sizeof *bpad);
                    memcpy(bpad + boff, b, (size_t)nb * sizeof *b);
                    kiln_bf16 *d_a = gt_up_bf16(a, na), *d_bbase = gt_up_bf16(bpad, nb + boff), *d_b = d_bbase + boff;
                    void *d_c = f32 ? (void *)gt_up_f32(c0, nc) : (void *)gt_up_bf16(c0, nc);
                    int looped = -1;
                    CHECK_OK(kiln_grouped_gemm_cuda(d_c, f32, d_a, d_b, offs, E, tn ? m : 0, n, tn ? 0 : k, lays[l], acc,
                                                    &looped, NULL));
                    float *got = f32 ? gt_down_f32(d_c, nc) : gt_down_bf16(d_c, nc);
                    char name[96];
                    snprintf(name, sizeof name, "%s %s C %s%s%s%s%s", path, lays[l], f32 ? "f32" : "bf16",
                             acc ? " +=" : "", boff ? " B+2 bytes" : "", shapes[sh][4] ? " 70/130/133 rows" : "",
                             looped ? " (per expert)" : "");
                    GT_CLOSE(name, got, ref, nc, f32 ? 1e-4 : 1e-2);
                    if (tn && !acc) {
                        int64_t nz = 0;
                        for (int64_t i = 0; i < m * n; i++) nz += got[1 * m * n + i] != 0.0f;
                        CHECK_MSG(nz == 0, "the empty expert's C_e has %lld nonzeros", (long long)nz);
                    }
                    kiln_cuda_free(d_a), kiln_cuda_free(d_bbase), kiln_cuda_free(d_c);
                    free(a), free(b), free(bpad), free(c0), free(ref), free(got);
                }
        unsetenv("KILN_GROUPED_CHUNK");
    }
    const int32_t bad[3] = {0, 4, 2};
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 1, NULL, NULL, bad, 2, 0, 4, 4, "NT", 0, NULL, NULL), "decrease");
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 1, NULL, NULL, offs_small, 4, 0, 4, 4, "TT", 0, NULL, NULL), "layout 'TT'");
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

TEST(gpu_experts_gemm) {
    const char *const *paths = kiln_grouped_gemm_paths();
    for (int i = 0; paths[i]; i++) grouped_gemm_path(paths[i]);
}

/* The side-stream paths with 1, 3 and 8 streams (more streams than experts) give the same results; so do the
 * cuBLASLt paths with their algorithms chosen by timing. */
TEST(gpu_experts_gemm_streams) {
    static const char *const ns[3] = {"1", "3", "8"};
    for (int i = 0; i < 3; i++) {
        CHECK(setenv("KILN_GROUPED_STREAMS", ns[i], 1) == 0);
        printf("  KILN_GROUPED_STREAMS=%s\n", ns[i]);
        grouped_gemm_path("lt_streams");
        grouped_gemm_path("lt_mixed");
    }
    unsetenv("KILN_GROUPED_STREAMS");
    /* KILN_GROUPED_TUNE=2 times every plan's candidates (1: only large ones): overwritten C in place,
     * accumulated C on a scratch, the chunks' batched GEMM; the results must not change */
    CHECK(setenv("KILN_GROUPED_TUNE", "2", 1) == 0);
    printf("  KILN_GROUPED_TUNE=2\n");
    grouped_gemm_path("lt_streams");
    grouped_gemm_path("lt_mixed");
    grouped_gemm_path("lt_chunks");
    unsetenv("KILN_GROUPED_TUNE");
}

/* lt_mixed's solo experts (KILN_GROUPED_SOLO rows or more: one GEMM, not chunks): with chunks of 64 rows and solo
 * at 100, the 70-row expert is a chunk and a remainder, the 130- and 133-row ones solo GEMMs; at 64 every expert
 * is; 0 turns it off. The whole op too, with every expert solo (the trainer's concentrated routing in small),
 * and two identical runs the same bits. */
TEST(gpu_experts_gemm_solo) {
    static const char *const solo[3] = {"100", "64", "0"};
    for (int i = 0; i < 3; i++) {
        CHECK(setenv("KILN_GROUPED_SOLO", solo[i], 1) == 0);
        printf("  KILN_GROUPED_SOLO=%s\n", solo[i]);
        grouped_gemm_path("lt_mixed");
    }
    CHECK(setenv("KILN_GROUPED_SOLO", "256", 1) == 0);
    CHECK_OK(kiln_grouped_gemm_set_path("lt_mixed"));
    const ex_case cs[] = {{3000, 4, 1, 64, 96, 0.05, 1}, {5000, 3, 2, 128, 64, 0.1, -1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 1400 + i);
    experts_deterministic();
    CHECK(setenv("KILN_GROUPED_SOLO", "-1", 1) == 0);
    const int32_t offs[3] = {0, 2, 4};
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 0, NULL, NULL, offs, 2, 0, 4, 4, "NT", 0, NULL, NULL), "KILN_GROUPED_SOLO");
    unsetenv("KILN_GROUPED_SOLO");
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* The path's choice: kiln_grouped_gemm_set_path over KILN_GROUPED_GEMM over the default; bad names and
 * bad tuning variables are errors naming them. */
TEST(gpu_experts_gemm_path_choice) {
    const char *name = NULL;
    const int32_t offs[3] = {0, 2, 4};
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
    CHECK(setenv("KILN_GROUPED_GEMM", "lt_streams", 1) == 0);
    CHECK_OK(kiln_grouped_gemm_path(&name));
    CHECK(name && !strcmp(name, "lt_streams"));
    CHECK_OK(kiln_grouped_gemm_set_path("lt_loop"));
    CHECK_OK(kiln_grouped_gemm_path(&name));
    CHECK(name && !strcmp(name, "lt_loop"));
    CHECK_ERR(kiln_grouped_gemm_set_path("fast"), "'fast': expected one of grouped");
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
    CHECK(setenv("KILN_GROUPED_GEMM", "bogus", 1) == 0);
    CHECK_ERR(kiln_grouped_gemm_path(&name), "KILN_GROUPED_GEMM");
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 0, NULL, NULL, offs, 2, 0, 4, 4, "NT", 0, NULL, NULL), "'bogus'");
    unsetenv("KILN_GROUPED_GEMM");
    CHECK(setenv("KILN_GROUPED_STREAMS", "0", 1) == 0);
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 0, NULL, NULL, offs, 2, 0, 4, 4, "NT", 0, NULL, NULL), "KILN_GROUPED_STREAMS");
    unsetenv("KILN_GROUPED_STREAMS");
    CHECK(setenv("KILN_GROUPED_CHUNK", "100", 1) == 0);
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 0, NULL, NULL, offs, 2, 0, 4, 4, "NT", 0, NULL, NULL), "multiple of 64");
    unsetenv("KILN_GROUPED_CHUNK");
    CHECK_OK(kiln_grouped_gemm_path(&name));
}

/* Every path through the whole op against the CPU: small experts (per-expert GEMMs on every path), ~710
 * and ~3000 rows per expert (chunked paths: full chunks and an overlapping last one; side streams: uneven
 * experts) and an empty expert; then two identical runs give identical bits on every path. */
TEST(gpu_experts_paths) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {3000, 4, 1, 64, 96, 0.05, 1}, {5000, 3, 2, 128, 64, 0.1, -1}};
    const char *const *paths = kiln_grouped_gemm_paths();
    for (int p = 0; paths[p]; p++) {
        printf("  path %s\n", paths[p]);
        CHECK_OK(kiln_grouped_gemm_set_path(paths[p]));
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 700 + i);
        experts_deterministic();
    }
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* lt_mixed's weight gradients when every expert has the same row count (balanced routing): one strided-batched
 * GEMM over the experts (src/cuda/experts_gemm.cu) against a double reference, written and accumulated, f32 C
 * (1e-4: f32 sums of exact bf16 products over 96 or 1024 rows) and bf16 C (1e-2), operands 16-byte aligned and
 * 2 bytes into their buffers; then KILN_GROUPED_DW_BATCH=0 (the per-expert GEMMs) on the same numbers. */
TEST(gpu_experts_dw_batched) {
    const int64_t E = 4, shapes[2][4] = {{96, 24, 40, 0}, {1024, 64, 48, 1}}; /* rows per expert, m, n, element offset */
    kiln_rng rng;
    kiln_rng_seed(&rng, 1100);
    CHECK_OK(kiln_grouped_gemm_set_path("lt_mixed"));
    for (int batched = 1; batched >= 0; batched--) {
        if (!batched) CHECK(setenv("KILN_GROUPED_DW_BATCH", "0", 1) == 0);
        for (int sh = 0; sh < 2; sh++)
            for (int f32 = 0; f32 < 2; f32++)
                for (int acc = 0; acc < 2; acc++) {
                    const int64_t me = shapes[sh][0], m = shapes[sh][1], n = shapes[sh][2], off = shapes[sh][3];
                    const int64_t R = E * me, na = R * m, nb = R * n, nc = E * m * n;
                    int32_t offs[5];
                    for (int64_t e = 0; e <= E; e++) offs[e] = (int32_t)(e * me);
                    float *a = gt_rand(&rng, na + off, 1.0f), *b = gt_rand(&rng, nb + off, 1.0f), *c0 = gt_rand(&rng, nc, 1.0f);
                    gt_round_bf16(a, na + off), gt_round_bf16(b, nb + off), gt_round_bf16(c0, nc);
                    float *ref = malloc((size_t)nc * 4);
                    for (int64_t e = 0; e < E; e++)
                        for (int64_t i = 0; i < m; i++)
                            for (int64_t j = 0; j < n; j++) {
                                double s = acc ? c0[e * m * n + i * n + j] : 0.0;
                                for (int64_t r = e * me; r < (e + 1) * me; r++)
                                    s += (double)a[off + r * m + i] * b[off + r * n + j];
                                ref[e * m * n + i * n + j] = (float)s;
                            }
                    kiln_bf16 *d_a = gt_up_bf16(a, na + off), *d_b = gt_up_bf16(b, nb + off);
                    void *d_c = f32 ? (void *)gt_up_f32(c0, nc) : (void *)gt_up_bf16(c0, nc);
                    CHECK_OK(kiln_grouped_gemm_cuda(d_c, f32, d_a + off, d_b + off, offs, E, m, n, 0, "TN", acc, NULL, NULL));
                    float *got = f32 ? gt_down_f32(d_c, nc) : gt_down_bf16(d_c, nc);
                    char name[96];
                    snprintf(name, sizeof name, "TN %lld rows x %lld experts C %s%s%s%s", (long long)me, (long long)E,
                             f32 ? "f32" : "bf16", acc ? " +=" : "", off ? " +2 bytes" : "",
                             batched ? " (strided batch)" : " (KILN_GROUPED_DW_BATCH=0)");
                    GT_CLOSE(name, got, ref, nc, f32 ? 1e-4 : 1e-2);
                    kiln_cuda_free(d_a), kiln_cuda_free(d_b), kiln_cuda_free(d_c);
                    free(a), free(b), free(c0), free(ref), free(got);
                }
    }
    unsetenv("KILN_GROUPED_DW_BATCH");
    CHECK(setenv("KILN_GROUPED_DW_BATCH", "2", 1) == 0);
    const int32_t offs[3] = {0, 2, 4};
    CHECK_ERR(kiln_grouped_gemm_cuda(NULL, 1, NULL, NULL, offs, 2, 4, 4, 0, "TN", 0, NULL, NULL), "KILN_GROUPED_DW_BATCH");
    unsetenv("KILN_GROUPED_DW_BATCH");
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* dw_defer: the weight gradients left running on the side streams and joined after, against the CPU, on the
 * side-stream paths, accumulated and written; KILN_EXPERTS_DW_DEFER=0 (joined inside) the same; a join with
 * nothing pending is a no-op */
TEST(gpu_experts_dw_defer) {
    const ex_case cs[] = {{257, 8, 2, 96, 80, 0.1, 7}, {3000, 4, 1, 64, 96, 0.05, 1}};
    static const char *const paths[2] = {"lt_streams", "lt_mixed"};
    CHECK_OK(kiln_experts_backward_join_cuda(NULL));
    g_dw_defer = 1;
    for (int env = 0; env < 2; env++) {
        if (env) CHECK(setenv("KILN_EXPERTS_DW_DEFER", "0", 1) == 0);
        for (int p = 0; p < 2; p++) {
            printf("  path %s%s\n", paths[p], env ? ", KILN_EXPERTS_DW_DEFER=0" : "");
            CHECK_OK(kiln_grouped_gemm_set_path(paths[p]));
            for (g_dw_write = 0; g_dw_write < 2; g_dw_write++)
                for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) experts_case(&cs[i], 1200 + i);
        }
        unsetenv("KILN_EXPERTS_DW_DEFER");
    }
    g_dw_write = 0, g_dw_defer = 0;
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
}

/* ---- the weight gradients on wgmma (src/cuda/experts_dw_wg.cu, KILN_GROUPED_DW=wg) ---- */

/* C (bf16, E x [m, n]) against sums in double over the same bf16 numbers: C_e = (acc ? c0_e : 0) + A_eᵀ B_e for an
 * expert with rows, c0_e for one without (keep: left as it was) or zero (!keep) */
static float *dw_ref(const float *a, const float *b, const float *c0, const int32_t *offs, int64_t E, int64_t m,
                     int64_t n, int acc, int keep) {
    float *ref = malloc((size_t)(E * m * n) * sizeof *ref);
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                const int64_t o = (e * m + i) * n + j;
                if (offs[e + 1] == offs[e]) {
                    ref[o] = keep || acc ? c0[o] : 0.0f;
                    continue;
                }
                double s = acc ? c0[o] : 0.0;
                for (int64_t r = offs[e]; r < offs[e + 1]; r++) s += (double)a[r * m + i] * b[r * n + j];
                ref[o] = (float)s;
            }
    return ref;
}

/* the experts without rows: C_e exactly c0_e (keep) or exactly zero */
static void dw_check_empty(const char *name, const float *got, const float *c0, const int32_t *offs, int64_t E,
                           int64_t mn, int keep) {
    int64_t moved = 0;
    for (int64_t e = 0; e < E; e++)
        if (offs[e + 1] == offs[e])
            for (int64_t i = 0; i < mn; i++) moved += got[e * mn + i] != (keep ? c0[e * mn + i] : 0.0f);
    CHECK_MSG(moved == 0, "%s: %lld entries of the experts without rows changed", name, (long long)moved);
}

/* kiln_experts_dw_wg itself, written and added to, bf16 C within 1e-2 (one rounding, as the TN cases above). Row
 * counts that end inside a K block of 64 (1, 2, 5, 6, 17, 63 rows past the last whole one: the next expert's rows in
 * that block must not count, an Inf there included), one that ends on a block, an expert without rows (its C_e left
 * exactly as it was), the last expert ending at S (rows past S read as zeros); fewer CTAs than tiles (grids of 3 and 5:
 * the ring and the held stores carried across tiles of different experts) and more CTAs than SMs (a grid of 200 over
 * 192 tiles: waves); the written result twice, bit for bit. */
TEST(gpu_experts_dw_wg) {
    static const int32_t offs_a[5] = {0, 70, 70, 200, 333}, offs_b[4] = {0, 1, 129, 257},
                         offs_c[7] = {0, 63, 127, 127, 400, 401, 700};
    static const struct {
        const int32_t *offs;
        int64_t E, m, n;
        int ctas;
    } cs[4] = {{offs_a, 4, 128, 256, 0}, {offs_b, 3, 256, 512, 3}, {offs_c, 6, 384, 256, 5}, {offs_a, 4, 2048, 1024, 200}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 2900);
    if (!kiln_experts_dw_wg_ok(4, 333, 128, 256, (void *)16, (void *)16, (void *)16)) {
        printf("  (no sm_90 device: the kernel does not run here)\n");
        return;
    }
    for (int i = 0; i < 4; i++)
        for (int acc = 0; acc < 2; acc++) {
            const int32_t *offs = cs[i].offs;
            const int64_t E = cs[i].E, m = cs[i].m, n = cs[i].n, S = offs[E], nc = E * m * n;
            float *a = gt_rand(&rng, S * m, 1.0f), *b = gt_rand(&rng, S * n, 1.0f), *c0 = gt_rand(&rng, nc, 4.0f);
            gt_round_bf16(a, S * m), gt_round_bf16(b, S * n), gt_round_bf16(c0, nc);
            float *ref = dw_ref(a, b, c0, offs, E, m, n, acc, 1);
            kiln_bf16 *d_a = gt_up_bf16(a, S * m), *d_b = gt_up_bf16(b, S * n), *d_c = gt_up_bf16(c0, nc);
            double *d_sq = acc ? NULL : (double *)gt_dev((size_t)E * sizeof(double));
            CHECK_OK(kiln_experts_dw_wg(d_c, d_a, d_b, offs, E, m, n, acc, cs[i].ctas, d_sq, NULL));
            float *got = gt_down_bf16(d_c, nc);
            char name[96];
            snprintf(name, sizeof name, "dw wg %lld x [%lld x %lld] %s grid %d", (long long)E, (long long)m, (long long)n,
                     acc ? "+=" : "=", cs[i].ctas);
            GT_CLOSE(name, got, ref, nc, 1e-2);
            dw_check_empty(name, got, c0, offs, E, m * n, 1);
            if (!acc) { /* the sums of squares against the stored C_e's in double (2e-6: a thread's squares go in f32
                         * chains of 32, each at most 32 roundings of 2^-24 off); again: the same bits */
                double sq[8], sq2[8], worst = 0;
                CHECK_OK(kiln_cuda_sync());
                CHECK_OK(kiln_cuda_copy(sq, d_sq, (size_t)E * sizeof(double), KILN_CUDA_D2H));
                for (int64_t e = 0; e < E; e++) {
                    double want = 0;
                    if (offs[e + 1] > offs[e])
                        for (int64_t q = 0; q < m * n; q++) want += (double)got[e * m * n + q] * got[e * m * n + q];
                    CHECK_MSG(offs[e + 1] > offs[e] || sq[e] == 0.0, "%s: expert %lld without rows: sum of squares %g",
                              name, (long long)e, sq[e]);
                    const double d = fabs(sq[e] - want) / (want > 0 ? want : 1.0);
                    worst = d > worst ? d : worst;
                }
                CHECK_MSG(worst <= 2e-6, "%s: sums of squares off by %.3g (relative)", name, worst);
                printf("    %-28s sums of squares rel err %.3g (tol 2e-06)\n", name, worst);
                kiln_cuda_free(d_c);
                d_c = gt_up_bf16(c0, nc);
                CHECK_OK(kiln_experts_dw_wg(d_c, d_a, d_b, offs, E, m, n, 0, cs[i].ctas, d_sq, NULL));
                float *again = gt_down_bf16(d_c, nc);
                CHECK_OK(kiln_cuda_copy(sq2, d_sq, (size_t)E * sizeof(double), KILN_CUDA_D2H));
                CHECK_MSG(!memcmp(again, got, (size_t)nc * sizeof *got), "%s: a second run gave other bits", name);
                CHECK_MSG(!memcmp(sq, sq2, (size_t)E * sizeof(double)), "%s: a second run gave other sums of squares", name);
                free(again);
            }
            kiln_cuda_free(d_a), kiln_cuda_free(d_b), kiln_cuda_free(d_c), kiln_cuda_free(d_sq);
            free(a), free(b), free(c0), free(ref), free(got);
        }
    { /* an Inf in the next expert's rows of expert 0's last K block (row 100 of A and of B) does not reach C_0 */
        static const int32_t offs[3] = {0, 70, 140};
        const int64_t m = 128, n = 256, S = 140;
        float *a = gt_rand(&rng, S * m, 1.0f), *b = gt_rand(&rng, S * n, 1.0f), *c0 = gt_rand(&rng, 2 * m * n, 1.0f);
        gt_round_bf16(a, S * m), gt_round_bf16(b, S * n), gt_round_bf16(c0, 2 * m * n);
        a[100 * m + 5] = INFINITY, b[100 * n + 7] = INFINITY;
        float *ref = dw_ref(a, b, c0, offs, 1, m, n, 0, 1); /* expert 0 alone */
        kiln_bf16 *d_a = gt_up_bf16(a, S * m), *d_b = gt_up_bf16(b, S * n), *d_c = gt_up_bf16(c0, 2 * m * n);
        CHECK_OK(kiln_experts_dw_wg(d_c, d_a, d_b, offs, 2, m, n, 0, 0, NULL, NULL));
        float *got = gt_down_bf16(d_c, 2 * m * n);
        GT_CLOSE("dw wg, Inf in the next expert's rows", got, ref, m * n, 1e-2);
        kiln_cuda_free(d_a), kiln_cuda_free(d_b), kiln_cuda_free(d_c);
        free(a), free(b), free(c0), free(ref), free(got);
    }
    const int32_t bad[3] = {0, 9, 4};
    CHECK_ERR(kiln_experts_dw_wg(NULL, NULL, NULL, bad, 2, 128, 256, 0, 0, NULL, NULL), "decrease");
    double one;
    CHECK_ERR(kiln_experts_dw_wg(NULL, NULL, NULL, offs_a, 4, 128, 256, 1, 0, &one, NULL), "added-to");
    CHECK(!kiln_experts_dw_wg_ok(2, 64, 128, 128, (void *)16, (void *)16, (void *)16)); /* n % 256 */
    CHECK(!kiln_experts_dw_wg_ok(2, 64, 64, 256, (void *)16, (void *)16, (void *)16));  /* m % 128 */
    CHECK(!kiln_experts_dw_wg_ok(2, 64, 128, 256, (void *)16, (void *)18, (void *)16)); /* B's alignment */
    CHECK(!kiln_experts_dw_wg_ok(2, 64, 128, 256, (void *)16, (void *)16, (void *)18)); /* C's */
    CHECK(kiln_experts_dw_wg_ok(2, 64, 128, 256, (void *)16, (void *)16, (void *)20));
}

/* KILN_GROUPED_DW=wg through kiln_grouped_gemm_cuda (TN, bf16 C): written (the empty expert zeroed), added to, and
 * written with the empty expert kept; in place and deferred to a side stream (_async + join); then the experts' op
 * in the trainer's mode (bf16 weight gradients written, the empty experts kept, deferred, their sums of squares
 * asked for) against the CPU's, the sums of squares given in each deferred case */
TEST(gpu_experts_dw_wg_paths) {
    static const int32_t offs[5] = {0, 70, 70, 200, 333};
    const int64_t E = 4, m = 256, n = 256, S = offs[E], nc = E * m * n;
    kiln_rng rng;
    kiln_rng_seed(&rng, 3000);
    if (!kiln_experts_dw_wg_ok(E, S, m, n, (void *)16, (void *)16, (void *)16)) {
        printf("  (no sm_90 device: the kernel does not run here)\n");
        return;
    }
    CHECK(setenv("KILN_GROUPED_DW", "wg", 1) == 0);
    CHECK_OK(kiln_grouped_gemm_set_path("lt_mixed"));
    for (int mode = 0; mode < 3; mode++)
        for (int async = 0; async < 2; async++) {
            float *a = gt_rand(&rng, S * m, 1.0f), *b = gt_rand(&rng, S * n, 1.0f), *c0 = gt_rand(&rng, nc, 4.0f);
            gt_round_bf16(a, S * m), gt_round_bf16(b, S * n), gt_round_bf16(c0, nc);
            const int acc = mode == KILN_GG_ADD, keep = mode == KILN_GG_WRITE_KEEP_EMPTY;
            float *ref = dw_ref(a, b, c0, offs, E, m, n, acc, keep);
            kiln_bf16 *d_a = gt_up_bf16(a, S * m), *d_b = gt_up_bf16(b, S * n), *d_c = gt_up_bf16(c0, nc);
            if (async) {
                CHECK_OK(kiln_grouped_gemm_cuda_async(d_c, 0, d_a, d_b, offs, E, m, n, 0, "TN", mode, NULL));
                CHECK_OK(kiln_grouped_gemm_join(NULL));
            } else CHECK_OK(kiln_grouped_gemm_cuda(d_c, 0, d_a, d_b, offs, E, m, n, 0, "TN", mode, NULL, NULL));
            float *got = gt_down_bf16(d_c, nc);
            char name[96];
            snprintf(name, sizeof name, "TN wg mode %d%s", mode, async ? " async" : "");
            GT_CLOSE(name, got, ref, nc, 1e-2);
            dw_check_empty(name, got, c0, offs, E, m * n, acc || keep);
            kiln_cuda_free(d_a), kiln_cuda_free(d_b), kiln_cuda_free(d_c);
            free(a), free(b), free(c0), free(ref), free(got);
        }
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
    /* the experts' op: dwdn is [H, I] over rows of dye [S, H] and act [S, I], dwgu [2I, H] over dgu and xe */
    const ex_case ec[] = {{700, 4, 2, 256, 256, 0.1, 2}, {1500, 8, 1, 256, 512, 0.05, 5}};
    g_dw_write = 1, g_dw_bf16 = 1, g_dw_keep = 1, g_dw_sq = 1, g_dw_sq_seen = 0;
    for (int d = 0; d < 2; d++) {
        g_dw_defer = d;
        for (size_t i = 0; i < sizeof ec / sizeof ec[0]; i++) experts_case(&ec[i], 3100 + i);
    }
    CHECK_MSG(g_dw_sq_seen == 2, "%d of the 2 deferred cases gave the weight gradients' sums of squares", g_dw_sq_seen);
    g_dw_write = 0, g_dw_bf16 = 0, g_dw_keep = 0, g_dw_defer = 0, g_dw_sq = 0;
    unsetenv("KILN_GROUPED_DW");
}

/* Timing (printed, never asserted): a layer's two weight-gradient GEMMs at issue [cuda]'s size (16 experts, 16384
 * rows routed unevenly, one expert empty; gate_up [4096 x 2048], down [2048 x 2048] an expert, bf16 C written with
 * the empty expert kept), as the experts' backward runs them (both deferred, then joined): cuBLASLt an expert on the
 * side streams (lt) against the one wgmma kernel (wg), one CTA an SM and in waves of 4 an SM; the results compared
 * (wg against lt within 1e-2, the two grids bit for bit: each element is the same sum either way). */
TEST(gpu_experts_dw_wg_timing) {
    const int64_t E = 16, S = 16384, H = 2048, I = 2048;
    int32_t offs[17];
    double wsum = 0, w[16];
    for (int64_t e = 0; e < E; e++) w[e] = e == 11 ? 0.0 : 1.0 / sqrt((double)e + 1.0), wsum += w[e];
    offs[0] = 0;
    for (int64_t e = 0; e < E; e++) offs[e + 1] = e == E - 1 ? (int32_t)S : offs[e] + (int32_t)(S * w[e] / wsum);
    if (!kiln_experts_dw_wg_ok(E, S, 2 * I, H, (void *)16, (void *)16, (void *)16)) {
        printf("  (no sm_90 device: the kernel does not run here)\n");
        return;
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, 3200);
    float *h = gt_rand(&rng, S * 2 * I, 1.0f);
    kiln_bf16 *dgu = gt_up_bf16(h, S * 2 * I), *xe = gt_up_bf16(h, S * H), *dye = gt_up_bf16(h + 7, S * H);
    kiln_bf16 *act = gt_up_bf16(h + 3, S * I);
    kiln_bf16 *cgu[3] = {gt_dev((size_t)(E * 2 * I * H) * 2), gt_dev((size_t)(E * 2 * I * H) * 2),
                         gt_dev((size_t)(E * 2 * I * H) * 2)};
    kiln_bf16 *cdn[3] = {gt_dev((size_t)(E * H * I) * 2), gt_dev((size_t)(E * H * I) * 2), gt_dev((size_t)(E * H * I) * 2)};
    static const char *const how[3] = {"lt", "wg", "wg, KILN_GROUPED_DW_CTAS=528 (4 an SM, waves)"};
    const double flops = 2.0 * S * (2.0 * I * H + (double)H * I);
    CHECK_OK(kiln_grouped_gemm_set_path("lt_mixed"));
    for (int rep = 0; rep < 2; rep++)
        for (int v = 0; v < 3; v++) {
            if (v) CHECK(setenv("KILN_GROUPED_DW", "wg", 1) == 0);
            else unsetenv("KILN_GROUPED_DW");
            if (v == 2) CHECK(setenv("KILN_GROUPED_DW_CTAS", "528", 1) == 0);
            else unsetenv("KILN_GROUPED_DW_CTAS");
            double best = 1e30;
            for (int it = 0; it < 13; it++) {
                CHECK_OK(kiln_cuda_sync());
                const double t0 = gt_now_s();
                CHECK_OK(kiln_grouped_gemm_cuda_async(cdn[v], 0, dye, act, offs, E, H, I, 0, "TN", KILN_GG_WRITE_KEEP_EMPTY,
                                                      NULL));
                CHECK_OK(kiln_grouped_gemm_cuda_async(cgu[v], 0, dgu, xe, offs, E, 2 * I, H, 0, "TN",
                                                      KILN_GG_WRITE_KEEP_EMPTY, NULL));
                CHECK_OK(kiln_grouped_gemm_join(NULL));
                CHECK_OK(kiln_cuda_sync());
                const double dt = gt_now_s() - t0;
                if (it >= 3 && dt < best) best = dt;
            }
            printf("    dW of a layer, %s: %.3f ms, %.0f TFLOP/s (best of 10)\n", how[v], best * 1e3, flops / best * 1e-12);
        }
    unsetenv("KILN_GROUPED_DW"), unsetenv("KILN_GROUPED_DW_CTAS");
    CHECK_OK(kiln_grouped_gemm_set_path(NULL));
    float *g[3], *d[3];
    for (int v = 0; v < 3; v++) {
        g[v] = gt_down_bf16(cgu[v], E * 2 * I * H), d[v] = gt_down_bf16(cdn[v], E * H * I);
        for (int64_t i = 11 * 2 * I * H; i < 12 * 2 * I * H; i++) g[v][i] = 0.0f; /* expert 11: never written */
        for (int64_t i = 11 * H * I; i < 12 * H * I; i++) d[v][i] = 0.0f;
    }
    GT_CLOSE("dW gate_up, wg vs lt", g[1], g[0], E * 2 * I * H, 1e-2);
    GT_CLOSE("dW down, wg vs lt", d[1], d[0], E * H * I, 1e-2);
    CHECK_MSG(!memcmp(g[2], g[1], (size_t)(E * 2 * I * H) * sizeof(float)) &&
                  !memcmp(d[2], d[1], (size_t)(E * H * I) * sizeof(float)),
              "wg in waves gave other bits than wg one CTA an SM");
    for (int v = 0; v < 3; v++) free(g[v]), free(d[v]), kiln_cuda_free(cgu[v]), kiln_cuda_free(cdn[v]);
    free(h);
    kiln_cuda_free(dgu), kiln_cuda_free(xe), kiln_cuda_free(dye), kiln_cuda_free(act);
}
