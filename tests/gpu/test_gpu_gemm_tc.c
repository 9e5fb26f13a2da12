/* kiln's own Hopper GEMM (src/cuda/gemm_tc.cu: TMA + wgmma, fused bias / quick_gelu epilogues) against the
 * CPU reference (OpenBLAS's f32 GEMM of the same bf16 inputs through kiln_linear_forward, then
 * kiln_quick_gelu_forward) and against cuBLASLt (kiln_clip_linear_cuda, + kiln_quick_gelu_forward_cuda as
 * CLIP runs it today), on fresh random inputs: both tiles, M tails (257 * 3 rows, fewer rows than a tile),
 * padded strides, more tiles than SMs (the persistent loop), and the argument checks.
 *
 * Tolerance, per element: |got - ref| <= 1e-2 * (|ref| + mean |ref|). The device multiplies the same bf16
 * numbers with f32 accumulation, only in another order (differences ~1e-6 of the sum of |products|), then
 * rounds once to bf16 (<= 2^-9 |ref| ~ 2e-3 |ref|); quick_gelu's __expf adds a few f32 ulps; cuBLASLt + the
 * separate quick_gelu pass and the deferred tiles (quick_gelu of the bf16-rounded pre-activation) round twice
 * (quick_gelu' <= 1.1: <= ~4.5e-3 |ref| + 2^-9 |v| in all). So the bound has a >= 2x margin, while a misplaced or missing
 * 64-wide K block, column or row costs O(mean |ref|) (a K block of 64 of 1024 is ~25% of a typical value).
 * Outside the rows < M, columns < N window C must keep its sentinel (no stray stores).
 * gpu_gemm_tc_timing prints times only (CUDA events, 10 calls after warm-up); it asserts nothing on time. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "clip_testutil.h"
#include "cuda/clip_ops.h"
#include "cuda/gemm_tc.h"
#include "gpu_testutil.h"
#include "kiln/clip.h"
#include "kiln/nn.h"

enum { SENTINEL = 0xFFFF }; /* a bf16 NaN: C's cells the kernel must not write */

static const char *epi_name(kiln_gemm_tc_epilogue e) {
    return e == KILN_GEMM_TC_NONE ? "none" : e == KILN_GEMM_TC_BIAS ? "bias" : "bias+quick_gelu";
}
static const char *tile_name(kiln_gemm_tc_tile t) {
    return t == KILN_GEMM_TC_TILE_128x128      ? "128x128"
           : t == KILN_GEMM_TC_TILE_128x256    ? "128x256"
           : t == KILN_GEMM_TC_TILE_PP_128x128 ? "ping-pong 128x128"
           : t == KILN_GEMM_TC_TILE_PP_64x256  ? "ping-pong 64x256"
           : t == KILN_GEMM_TC_TILE_128x256_C2 ? "128x256 cluster 2"
           : t == KILN_GEMM_TC_TILE_PP_128x128_C2 ? "ping-pong 128x128 cluster 2"
           : t == KILN_GEMM_TC_TILE_PP_128x128_C2x2 ? "ping-pong 128x128 cluster 2x2"
           : t == KILN_GEMM_TC_TILE_128x256_D      ? "128x256 deferred"
           : t == KILN_GEMM_TC_TILE_128x256_C2_D   ? "128x256 deferred cluster 2"
           : t == KILN_GEMM_TC_TILE_128x256_C2x2_D ? "128x256 deferred cluster 2x2"
                                                   : "auto";
}

/* got: bf16 bits [rows_alloc, ldc]; ref: f32 [M, N]. Returns the number of bad cells (printing the first few). */
static int64_t gemm_check(const char *what, const uint16_t *got, int64_t ldc, int64_t rows_alloc, const float *ref,
                          int64_t M, int64_t N) {
    double mean = 0, worst = 0;
    int64_t bad = 0, stray = 0;
    for (int64_t i = 0; i < M * N; i++) mean += fabs(ref[i]);
    mean /= (double)(M * N > 0 ? M * N : 1);
    for (int64_t r = 0; r < rows_alloc; r++)
        for (int64_t c = 0; c < ldc; c++) {
            const uint16_t g = got[r * ldc + c];
            if (r >= M || c >= N) {
                if (g != SENTINEL && stray++ < 3) printf("      stray store at row %lld col %lld\n", (long long)r, (long long)c);
                continue;
            }
            const double v = kiln_bf16_to_f32(g), f = ref[r * N + c], tol = 1e-2 * (fabs(f) + mean);
            const double ratio = fabs(v - f) / tol;
            if (!(ratio <= 1.0)) {
                if (bad < 5)
                    printf("      bad (row %lld, col %lld): got %.6g, ref %.6g (row %% 128 = %lld, col %% 256 = %lld)\n",
                           (long long)r, (long long)c, v, f, (long long)(r % 128), (long long)(c % 256));
                bad++;
                if (ratio != ratio) worst = INFINITY;
            }
            if (ratio > worst) worst = ratio;
        }
    printf("    %-62s max |d|/tol %.3g, %lld bad of %lld, %lld stray\n", what, worst, (long long)bad, (long long)(M * N),
           (long long)stray);
    return bad + stray;
}

static uint16_t *down_bits(const kiln_bf16 *d, int64_t n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(h, d, (size_t)n * 2, KILN_CUDA_D2H));
    return h;
}
static kiln_bf16 *dev_sentinel(int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = SENTINEL;
    kiln_bf16 *d = gt_dev((size_t)n * 2);
    CHECK_OK(kiln_cuda_copy(d, h, (size_t)n * 2, KILN_CUDA_H2D));
    free(h);
    return d;
}
/* [rows, ld] with the first `cols` of each row from x [rows, cols] and the padding at a large value (a kernel
 * reading past K would show) */
static kiln_bf16 *up_padded(const float *x, int64_t rows, int64_t cols, int64_t ld) {
    float *p = malloc(sizeof(float) * (size_t)(rows * ld));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) p[r * ld + c] = c < cols ? x[r * cols + c] : 1000.0f;
    kiln_bf16 *d = gt_up_bf16(p, rows * ld);
    free(p);
    return d;
}

typedef struct {
    int64_t M, N, K, lda_pad, ldc_pad;
    kiln_gemm_tc_epilogue epi;
    int bias_f32;
    kiln_gemm_tc_tile tile;
} gemm_case;

/* each case against the CPU reference on fresh inputs */
static void run_cases(const gemm_case *cs, size_t ncases, uint64_t seed) {
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    for (size_t i = 0; i < ncases; i++) {
        const gemm_case *g = &cs[i];
        const int64_t M = g->M, N = g->N, K = g->K, lda = K + g->lda_pad, ldc = N + g->ldc_pad, rows = M + 16;
        float *a = gt_rand(&rng, M * K, 1.0f), *b = gt_rand(&rng, N * K, 2.0f / sqrtf((float)K));
        float *bias = gt_rand(&rng, N, 1.0f), *ref = malloc(sizeof(float) * (size_t)(M * N));
        gt_round_bf16(a, M * K), gt_round_bf16(b, N * K), gt_round_bf16(bias, N);
        kiln_bf16 *da = up_padded(a, M, K, lda), *db = up_padded(b, N, K, lda), *dc = dev_sentinel(rows * ldc);
        void *dbias = g->bias_f32 ? (void *)gt_up_f32(bias, N) : (void *)gt_up_bf16(bias, N);
        kiln_linear_forward(ref, a, b, g->epi == KILN_GEMM_TC_NONE ? NULL : bias, M, K, N);
        if (g->epi == KILN_GEMM_TC_BIAS_QUICK_GELU) kiln_quick_gelu_forward(ref, ref, NULL, M, N);
        char what[160];
        snprintf(what, sizeof what, "M %lld N %lld K %lld lda %lld ldc %lld %s %s bias %s", (long long)M, (long long)N,
                 (long long)K, (long long)lda, (long long)ldc, tile_name(g->tile), epi_name(g->epi),
                 g->bias_f32 ? "f32" : "bf16");
        printf("    running %s\n", what); /* before the launch: a hang shows where */
        fflush(stdout);
        CHECK_OK(kiln_gemm_tc_tile_cuda(g->tile, M, N, K, da, lda, db, lda, dc, ldc, g->epi,
                                        g->epi == KILN_GEMM_TC_NONE ? NULL : dbias, g->bias_f32, NULL));
        uint16_t *got = down_bits(dc, rows * ldc);
        CHECK_MSG(gemm_check(what, got, ldc, rows, ref, M, N) == 0, "%s: mismatches (above)", what);
        kiln_cuda_free(da), kiln_cuda_free(db), kiln_cuda_free(dc), kiln_cuda_free(dbias);
        free(a), free(b), free(bias), free(ref), free(got);
    }
}

TEST(gpu_gemm_tc_matches_cpu) {
    static const gemm_case cs[] = {
        {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_AUTO},    /* CLIP L/14 fc1, 3 images */
        {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x128},
        {771, 4096, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_AUTO},
        {771, 4096, 1024, 0, 0, KILN_GEMM_TC_BIAS, 0, KILN_GEMM_TC_TILE_128x128},
        {1000, 3072, 1024, 0, 0, KILN_GEMM_TC_BIAS, 0, KILN_GEMM_TC_TILE_AUTO},
        {300, 384, 192, 64, 8, KILN_GEMM_TC_BIAS, 1, KILN_GEMM_TC_TILE_AUTO}, /* N % 256 != 0; padded strides */
        {300, 512, 192, 8, 24, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_128x256},
        {64, 256, 64, 0, 0, KILN_GEMM_TC_NONE, 0, KILN_GEMM_TC_TILE_128x256}, /* fewer rows than a tile, one K block */
        {5, 128, 128, 0, 0, KILN_GEMM_TC_NONE, 0, KILN_GEMM_TC_TILE_128x128},
        {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256}, /* 256 tiles: > 1 per SM */
        {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x128}, /* 512 tiles */
    };
    run_cases(cs, sizeof cs / sizeof cs[0], 90);
}

/* the same inputs through cuBLASLt (CLIP's linear with the bias epilogue; + quick_gelu as a pass, CLIP's fc1
 * today) and through the own kernel with each tile */
TEST(gpu_gemm_tc_matches_cublaslt) {
    const int64_t M = 771, N = 4096, K = 1024;
    kiln_rng rng;
    kiln_rng_seed(&rng, 91);
    float *a = gt_rand(&rng, M * K, 1.0f), *b = gt_rand(&rng, N * K, 2.0f / 32.0f), *bias = gt_rand(&rng, N, 1.0f);
    gt_round_bf16(a, M * K), gt_round_bf16(b, N * K), gt_round_bf16(bias, N);
    kiln_bf16 *da = gt_up_bf16(a, M * K), *db = gt_up_bf16(b, N * K), *dbias = gt_up_bf16(bias, N);
    kiln_bf16 *dl = gt_dev((size_t)(M * N) * 2), *dc = dev_sentinel(M * N);
    float *lt = malloc(sizeof(float) * (size_t)(M * N));
    for (int act = 0; act < 2; act++) {
        CHECK_OK(kiln_clip_linear_cuda(dl, 0, da, db, dbias, M, K, N, 0, NULL));
        if (act) CHECK_OK(kiln_quick_gelu_forward_cuda(dl, dl, M * N, NULL));
        uint16_t *lb = down_bits(dl, M * N);
        for (int64_t i = 0; i < M * N; i++) lt[i] = kiln_bf16_to_f32(lb[i]);
        free(lb);
        for (int t = 0; t < 3; t++) {
            const kiln_gemm_tc_tile tile =
                t == 2 ? KILN_GEMM_TC_TILE_128x256_C2_D : t ? KILN_GEMM_TC_TILE_128x128 : KILN_GEMM_TC_TILE_128x256;
            const kiln_gemm_tc_epilogue epi = act ? KILN_GEMM_TC_BIAS_QUICK_GELU : KILN_GEMM_TC_BIAS;
            CHECK_OK(kiln_gemm_tc_tile_cuda(tile, M, N, K, da, K, db, K, dc, N, epi, dbias, 0, NULL));
            uint16_t *got = down_bits(dc, M * N);
            char what[96];
            snprintf(what, sizeof what, "vs cuBLASLt%s: %s %s", act ? " + quick_gelu pass" : "", tile_name(tile),
                     epi_name(epi));
            CHECK_MSG(gemm_check(what, got, N, M, lt, M, N) == 0, "%s: mismatches (above)", what);
            free(got);
        }
    }
    kiln_cuda_free(da), kiln_cuda_free(db), kiln_cuda_free(dbias), kiln_cuda_free(dl), kiln_cuda_free(dc);
    free(a), free(b), free(bias), free(lt);
}

TEST(gpu_gemm_tc_rejects_bad_arguments) {
    kiln_bf16 *a = gt_dev(256 * 256 * 2), *b = gt_dev(256 * 256 * 2), *c = gt_dev(256 * 256 * 2);
    float *bias = gt_dev(256 * 4);
    const kiln_gemm_tc_epilogue none = KILN_GEMM_TC_NONE, bi = KILN_GEMM_TC_BIAS;
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 100, a, 128, b, 128, c, 128, none, NULL, 0, NULL), "not a multiple of 64");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 200, 64, a, 64, b, 64, c, 200, none, NULL, 0, NULL), "multiple of the tile");
    CHECK_ERR(kiln_gemm_tc_tile_cuda(KILN_GEMM_TC_TILE_128x256, 64, 384, 64, a, 64, b, 64, c, 384, none, NULL, 0, NULL),
              "tile's 256 columns");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a, 32, b, 64, c, 128, none, NULL, 0, NULL), "strides");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a, 68, b, 64, c, 128, none, NULL, 0, NULL), "multiples of 8");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a + 1, 64, b, 64, c, 128, none, NULL, 0, NULL), "16-byte aligned");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a, 64, b, 64, c, 128, bi, NULL, 0, NULL), "needs a bias");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a, 64, b, 64, c, 128, none, bias, 1, NULL), "takes no bias");
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, a, 64, b, 64, c, 128, bi, bias + 1, 1, NULL), "aligned to two");
    CHECK_OK(kiln_gemm_tc_cuda(0, 128, 64, a, 64, b, 64, c, 128, bi, bias, 1, NULL)); /* no rows: nothing to do */
    kiln_cuda_free(a), kiln_cuda_free(b), kiln_cuda_free(c), kiln_cuda_free(bias);
}

/* CLIP L/14's MLP at 128 images (M = 128 * 257, K = 1024): fc1's N = 4096 and the widths 1024, 3072. Each
 * variant: 2 warm-up calls, then 10 between CUDA events; printed, never asserted. v >= 0: the own kernel with
 * tile v, bias (+ quick_gelu when act); v < 0: cuBLASLt's GEMM with the bias epilogue (+ kiln's quick_gelu
 * pass when act). With check set, each own result at N = 4096 is compared with cuBLASLt's (thousands of
 * tiles: several per CTA). */
typedef struct {
    int tile;          /* a kiln_gemm_tc_tile, or -1 for cuBLASLt */
    int act;
    const char *qgelu; /* KILN_GEMM_TC_QGELU for this variant (NULL: unset, the default tanh formula) */
} timing_variant;

/* M rows (32896: 128 images; CLIP runs 128 images as two chunks of 64, 16448 rows), the first nn of the widths */
static void time_variants_m(const timing_variant *vs, size_t nv, int check, int64_t M, size_t nn) {
    const int64_t K = 1024, Ns[] = {4096, 1024, 3072};
    kiln_rng rng;
    kiln_rng_seed(&rng, 92);
    float *a = gt_rand(&rng, M * K, 1.0f), *b = gt_rand(&rng, 4096 * K, 2.0f / 32.0f), *bias = gt_rand(&rng, 4096, 1.0f);
    kiln_bf16 *da = gt_up_bf16(a, M * K), *db = gt_up_bf16(b, 4096 * K), *dbias = gt_up_bf16(bias, 4096);
    kiln_bf16 *dc = gt_dev((size_t)(M * 4096) * 2), *dl = gt_dev((size_t)(M * 4096) * 2);
    float *lt[2] = {NULL, NULL}; /* cuBLASLt's results at N = 4096 without / with quick_gelu */
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
    if (check)
        for (int act = 0; act < 2; act++) {
            CHECK_OK(kiln_clip_linear_cuda(dl, 0, da, db, dbias, M, K, 4096, 0, NULL));
            if (act) CHECK_OK(kiln_quick_gelu_forward_cuda(dl, dl, M * 4096, NULL));
            uint16_t *lb = down_bits(dl, M * 4096);
            lt[act] = malloc(sizeof(float) * (size_t)(M * 4096));
            for (int64_t i = 0; i < M * 4096; i++) lt[act][i] = kiln_bf16_to_f32(lb[i]);
            free(lb);
        }
    for (size_t n = 0; n < nn && n < sizeof Ns / sizeof Ns[0]; n++) {
        const int64_t N = Ns[n];
        const double flop = 2.0 * (double)M * (double)N * (double)K;
        for (size_t v = 0; v < nv; v++) {
            const timing_variant *tv = &vs[v];
            const kiln_gemm_tc_epilogue epi = tv->act ? KILN_GEMM_TC_BIAS_QUICK_GELU : KILN_GEMM_TC_BIAS;
            char name[80];
            snprintf(name, sizeof name, "%s %s%s%s%s", tv->tile < 0 ? "cuBLASLt" : tile_name((kiln_gemm_tc_tile)tv->tile),
                     tv->tile < 0 ? "bias" : epi_name(epi), tv->tile < 0 && tv->act ? " + quick_gelu pass" : "",
                     tv->qgelu ? " " : "", tv->qgelu ? tv->qgelu : "");
            if (tv->qgelu) setenv("KILN_GEMM_TC_QGELU", tv->qgelu, 1);
            else unsetenv("KILN_GEMM_TC_QGELU");
            printf("    M %lld N %lld K %lld  %-36s ", (long long)M, (long long)N, (long long)K, name);
            fflush(stdout);
            float ms = 0;
            for (int r = -2; r < 10; r++) {
                if (r == 0) CHECK(cudaEventRecord(e0, NULL) == cudaSuccess);
                if (tv->tile >= 0)
                    CHECK_OK(kiln_gemm_tc_tile_cuda((kiln_gemm_tc_tile)tv->tile, M, N, K, da, K, db, K, dc, N, epi, dbias,
                                                    0, NULL));
                else {
                    CHECK_OK(kiln_clip_linear_cuda(dl, 0, da, db, dbias, M, K, N, 0, NULL));
                    if (tv->act) CHECK_OK(kiln_quick_gelu_forward_cuda(dl, dl, M * N, NULL));
                }
            }
            CHECK(cudaEventRecord(e1, NULL) == cudaSuccess);
            CHECK(cudaEventSynchronize(e1) == cudaSuccess);
            CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
            ms /= 10;
            printf("%.3f ms  %.0f TFLOP/s\n", ms, flop / ms * 1e-9);
            unsetenv("KILN_GEMM_TC_QGELU");
            if (check && N == 4096 && tv->tile >= 0) {
                uint16_t *got = down_bits(dc, M * N);
                char what[128];
                snprintf(what, sizeof what, "  %s vs cuBLASLt%s", name, tv->act ? " + quick_gelu pass" : "");
                CHECK_MSG(gemm_check(what, got, N, M, lt[tv->act], M, N) == 0, "%s: mismatches at the timing size", name);
                free(got);
            }
        }
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    kiln_cuda_free(da), kiln_cuda_free(db), kiln_cuda_free(dbias), kiln_cuda_free(dc), kiln_cuda_free(dl);
    free(a), free(b), free(bias), free(lt[0]), free(lt[1]);
}

static void time_variants(const timing_variant *vs, size_t nv, int check) { time_variants_m(vs, nv, check, 32896, 3); }

/* fc1 (N 4096, K 1024) with the bias and with quick_gelu at the rows CLIP's tower runs per GEMM (128 images in
 * two chunks of 64: M = 16448) and at 128 images (M = 32896): cuBLASLt (+ the quick_gelu pass) beside AUTO, the
 * ping-pong tiles r29 ran in the tower, the cooperative 128x256 (one m64n256 wgmma a k step) and the deferred
 * cooperative tiles; each own result compared with cuBLASLt's */
TEST(gpu_gemm_tc_timing_chunk) {
    static const timing_variant vs[] = {
        {-1, 0, NULL},
        {-1, 1, NULL},
        {KILN_GEMM_TC_TILE_AUTO, 0, NULL},
        {KILN_GEMM_TC_TILE_AUTO, 1, NULL},
        {KILN_GEMM_TC_TILE_PP_128x128, 1, NULL},
        {KILN_GEMM_TC_TILE_PP_128x128_C2, 0, NULL},
        {KILN_GEMM_TC_TILE_PP_128x128_C2, 1, "tanh"},
        {KILN_GEMM_TC_TILE_128x256, 0, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2, 0, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2, 1, NULL},
        {KILN_GEMM_TC_TILE_128x256_D, 0, NULL},
        {KILN_GEMM_TC_TILE_128x256_D, 1, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2_D, 0, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2_D, 1, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2x2_D, 0, NULL},
        {KILN_GEMM_TC_TILE_128x256_C2x2_D, 1, NULL},
    };
    time_variants_m(vs, sizeof vs / sizeof vs[0], 1, 16448, 1);
    time_variants_m(vs, sizeof vs / sizeof vs[0], 1, 32896, 1);
}

TEST(gpu_gemm_tc_timing) {
    static const timing_variant vs[] = {
        {-1, 0, NULL}, {-1, 1, NULL}, {KILN_GEMM_TC_TILE_AUTO, 0, NULL}, {KILN_GEMM_TC_TILE_AUTO, 1, NULL},
        {KILN_GEMM_TC_TILE_128x256, 0, NULL}, {KILN_GEMM_TC_TILE_128x256, 1, NULL},
        {KILN_GEMM_TC_TILE_128x128, 0, NULL}, {KILN_GEMM_TC_TILE_128x128, 1, NULL},
    };
    time_variants(vs, sizeof vs / sizeof vs[0], 1);
}

/* a test of schedules: its cases against the CPU, then its variants timed at CLIP's sizes (checked against
 * cuBLASLt at N = 4096) */
typedef struct {
    const gemm_case *cs;
    size_t ncases;
    uint64_t seed;
    const timing_variant *vs;
    size_t nv;
} gemm_suite;
#define GEMM_SUITE(cases, seed, variants) {cases, sizeof cases / sizeof cases[0], seed, variants, sizeof variants / sizeof variants[0]}
static void run_suite(const gemm_suite *su) {
    run_cases(su->cs, su->ncases, su->seed);
    time_variants(su->vs, su->nv, 1);
}

/* the ping-pong schedules (consumer warpgroups on alternate tiles): tails, padded strides, more tiles than SMs */
static const gemm_case pingpong_cases[] = {
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_64x256},
    {300, 512, 192, 8, 24, KILN_GEMM_TC_BIAS, 1, KILN_GEMM_TC_TILE_PP_128x128},
    {300, 512, 192, 8, 24, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_PP_64x256},
    {5, 256, 64, 0, 0, KILN_GEMM_TC_NONE, 0, KILN_GEMM_TC_TILE_PP_64x256},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_64x256},
};
static const timing_variant pingpong_variants[] = {
    {KILN_GEMM_TC_TILE_PP_128x128, 0, NULL}, {KILN_GEMM_TC_TILE_PP_128x128, 1, NULL},
    {KILN_GEMM_TC_TILE_PP_64x256, 0, NULL},  {KILN_GEMM_TC_TILE_PP_64x256, 1, NULL},
};
TEST(gpu_gemm_tc_pingpong) {
    const gemm_suite su = GEMM_SUITE(pingpong_cases, 93, pingpong_variants);
    run_suite(&su);
}

/* clusters sharing operands through TMA multicast (2 CTAs along M sharing B; 2 x 2 sharing A and B): units
 * whose second row of tiles lies past M (100 rows), odd unit counts, more units than clusters */
static const gemm_case cluster_cases[] = {
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_C2},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128_C2},
    {100, 512, 192, 8, 24, KILN_GEMM_TC_BIAS, 1, KILN_GEMM_TC_TILE_128x256_C2},
    {100, 384, 192, 8, 24, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_PP_128x128_C2},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_C2},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128_C2},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128_C2x2},
    {100, 512, 192, 8, 24, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_PP_128x128_C2x2},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS, 0, KILN_GEMM_TC_TILE_PP_128x128_C2x2},
    {300, 768, 128, 0, 0, KILN_GEMM_TC_NONE, 0, KILN_GEMM_TC_TILE_PP_128x128_C2x2}, /* 3 column units */
};
static const timing_variant cluster_variants[] = {
    {KILN_GEMM_TC_TILE_128x256_C2, 0, NULL},      {KILN_GEMM_TC_TILE_128x256_C2, 1, NULL},
    {KILN_GEMM_TC_TILE_PP_128x128_C2, 0, NULL},   {KILN_GEMM_TC_TILE_PP_128x128_C2, 1, NULL},
    {KILN_GEMM_TC_TILE_PP_128x128_C2x2, 0, NULL}, {KILN_GEMM_TC_TILE_PP_128x128_C2x2, 1, NULL},
};
TEST(gpu_gemm_tc_cluster) {
    const gemm_suite su = GEMM_SUITE(cluster_cases, 94, cluster_variants);
    run_suite(&su);
}

/* the deferred cooperative tiles (a tile's quick_gelu and stores under the next tile's MMAs, spread over its k
 * blocks): K of one k block (all 16 chunks after the first block), three (uneven chunks), 64 (blocks without a
 * chunk); the held tile's rows past M; several tiles a CTA; 2-CTA and 2 x 2 clusters; every epilogue (f32
 * accumulation stays immediate) */
static const gemm_case deferred_cases[] = {
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_D},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_C2_D},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_128x256_C2x2_D},
    {300, 512, 192, 8, 24, KILN_GEMM_TC_BIAS, 1, KILN_GEMM_TC_TILE_128x256_D},
    {100, 512, 192, 8, 24, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_128x256_C2_D},
    {5, 256, 64, 0, 0, KILN_GEMM_TC_NONE, 0, KILN_GEMM_TC_TILE_128x256_C2_D},
    {4000, 2048, 64, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_D},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_C2_D},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS, 0, KILN_GEMM_TC_TILE_128x256_C2x2_D},
    {1000, 1536, 4096, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_C2_D},
};
static const timing_variant deferred_variants[] = {
    {KILN_GEMM_TC_TILE_128x256_D, 0, NULL},      {KILN_GEMM_TC_TILE_128x256_D, 1, NULL},
    {KILN_GEMM_TC_TILE_128x256_C2_D, 0, NULL},   {KILN_GEMM_TC_TILE_128x256_C2_D, 1, NULL},
    {KILN_GEMM_TC_TILE_128x256_C2x2_D, 0, NULL}, {KILN_GEMM_TC_TILE_128x256_C2x2_D, 1, NULL},
};
TEST(gpu_gemm_tc_deferred) {
    const gemm_suite su = GEMM_SUITE(deferred_cases, 99, deferred_variants);
    run_suite(&su);
}

/* quick_gelu's two formulas (tanh, the default since session 17, and KILN_GEMM_TC_QGELU=exact; r27: in 2-CTA
 * clusters the exact formula's epilogue was no longer hidden under the other warpgroup's MMAs): each under the same
 * tolerance against the CPU's exact quick_gelu, and their timings side by side */
static const gemm_case qgelu_cases[] = {
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_PP_128x128},
    {4000, 2048, 256, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_PP_128x128_C2},
    {771, 1024, 1024, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 0, KILN_GEMM_TC_TILE_128x256_D}, /* the held tiles' drain */
    {1000, 1536, 4096, 0, 0, KILN_GEMM_TC_BIAS_QUICK_GELU, 1, KILN_GEMM_TC_TILE_128x256_C2_D},
};
static const timing_variant qgelu_variants[] = {
    {KILN_GEMM_TC_TILE_PP_128x128, 1, "exact"},    {KILN_GEMM_TC_TILE_PP_128x128, 1, "tanh"},
    {KILN_GEMM_TC_TILE_PP_128x128_C2, 1, "exact"}, {KILN_GEMM_TC_TILE_PP_128x128_C2, 1, "tanh"},
    {KILN_GEMM_TC_TILE_128x256_C2_D, 1, "exact"},  {KILN_GEMM_TC_TILE_128x256_C2_D, 1, "tanh"},
};
TEST(gpu_gemm_tc_qgelu_formulas) {
    static const char *const formulas[] = {"tanh", "exact"};
    for (int f = 0; f < 2; f++) {
        printf("    KILN_GEMM_TC_QGELU=%s\n", formulas[f]);
        setenv("KILN_GEMM_TC_QGELU", formulas[f], 1);
        run_cases(qgelu_cases, sizeof qgelu_cases / sizeof qgelu_cases[0], 98 + f);
    }
    unsetenv("KILN_GEMM_TC_QGELU");
    time_variants(qgelu_variants, sizeof qgelu_variants / sizeof qgelu_variants[0], 1);
}

/* cosine per row and max |a - b| (the thresholds of test_gpu_clip.c's tower checks) */
static void tower_rows(const char *what, const float *a, const float *b, int64_t rows, int64_t d) {
    double worst = 1, maxd = 0;
    for (int64_t r = 0; r < rows; r++) {
        double dot = 0, na = 0, nb = 0;
        for (int64_t j = 0; j < d; j++) {
            const double x = a[r * d + j], y = b[r * d + j];
            dot += x * y, na += x * x, nb += y * y;
            maxd = fmax(maxd, fabs(x - y));
        }
        const double cs = dot / sqrt(na * nb + 1e-30);
        if (!(cs >= worst)) worst = cs;
    }
    printf("    %-44s worst cosine %.6f, max |diff| %.3g\n", what, worst, maxd);
    CHECK_MSG(worst >= 0.998 && maxd <= 4e-2, "%s: worst cosine %.6f, max |diff| %.3g", what, worst, maxd);
}

/* CLIP's vision tower (L/14-shaped: 257 tokens, widths the own GEMM takes) with KILN_CLIP_GEMM=own (the
 * default here), fc1 + quick_gelu as one own GEMM, against the CPU and against cuBLASLt + the pass; then
 * KILN_CLIP_GEMM=own-all (every projection it takes through the own GEMM) against the CPU */
TEST(gpu_gemm_tc_clip_tower) {
    clip_test_cfg c = clip_test_default;
    c.vis_hidden = 256, c.vis_heads = 4, c.vis_inter = 1024, c.vis_layers = 3, c.image_size = 224, c.patch_size = 14;
    c.proj_dim = 128, c.shortest_edge = 224;
    const char *dir = test_tmpdir();
    CHECK(clip_test_make_dir(dir, &c, 95) == 0);
    kiln_clip *m = NULL;
    CHECK_OK(kiln_clip_load(dir, &m));
    if (!m) return;
    const int64_t n = 9, S = kiln_clip_image_size(m), D = kiln_clip_dim(m);
    kiln_rng rng;
    kiln_rng_seed(&rng, 96);
    float *px = gt_rand(&rng, n * 3 * S * S, 2.0f), *ce = malloc(sizeof(float) * n * D);
    float *gd = malloc(sizeof(float) * n * D), *go = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, px, n, ce, NULL));
    CHECK_OK(kiln_clip_set_device(m, "cuda"));
    setenv("KILN_CLIP_GEMM", "cublaslt", 1);
    CHECK_OK(kiln_clip_embed_images(m, px, n, gd, NULL));
    setenv("KILN_CLIP_GEMM", "own", 1);
    CHECK_OK(kiln_clip_embed_images(m, px, n, go, NULL));
    tower_rows("cuBLASLt + the pass vs CPU", gd, ce, n, D);
    tower_rows("KILN_CLIP_GEMM=own vs CPU", go, ce, n, D);
    tower_rows("KILN_CLIP_GEMM=own vs cuBLASLt + the pass", go, gd, n, D);
    /* the tower takes the own GEMM's tile: the default (deferred) tile rounds the pre-activation to bf16 before
     * quick_gelu as cuBLASLt + the pass does; the ping-pong tile applies it to the f32 accumulators (one rounding
     * fewer), so its bits differ from cuBLASLt's path */
    setenv("KILN_GEMM_TC_TILE", "pp128x128", 1);
    float *gpp = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, px, n, gpp, NULL));
    unsetenv("KILN_CLIP_GEMM"), unsetenv("KILN_GEMM_TC_TILE");
    tower_rows("own, ping-pong 128x128 vs CPU", gpp, ce, n, D);
    CHECK(memcmp(gpp, gd, sizeof(float) * n * D) != 0);
    free(gpp);
    /* the default on this (Hopper) machine is the own GEMM: the same bits as KILN_CLIP_GEMM=own */
    float *gdef = malloc(sizeof(float) * n * D);
    CHECK_OK(kiln_clip_embed_images(m, px, n, gdef, NULL));
    CHECK_MSG(!memcmp(gdef, go, sizeof(float) * n * D), "the default is not KILN_CLIP_GEMM=own's bits");
    free(gdef);
    /* every projection the own GEMM takes (qkv, out, fc1 + quick_gelu, fc2, the final projection), with the
     * default tile and with 2 x 2 clusters; patches too */
    const int64_t G2 = (int64_t)kiln_clip_grid(m) * kiln_clip_grid(m);
    float *cp = malloc(sizeof(float) * n * G2 * D), *gp = malloc(sizeof(float) * n * G2 * D);
    kiln_clip_free(m);
    m = NULL;
    CHECK_OK(kiln_clip_load(dir, &m));
    if (!m) return;
    CHECK_OK(kiln_clip_embed_images(m, px, n, ce, cp));
    CHECK_OK(kiln_clip_set_device(m, "cuda"));
    for (int t = 0; t < 2; t++) {
        setenv("KILN_CLIP_GEMM", "own-all", 1);
        if (t) setenv("KILN_GEMM_TC_TILE", "pp128x128c2x2", 1);
        CHECK_OK(kiln_clip_embed_images(m, px, n, go, gp));
        unsetenv("KILN_CLIP_GEMM"), unsetenv("KILN_GEMM_TC_TILE");
        tower_rows(t ? "own-all, 2x2 clusters vs CPU" : "KILN_CLIP_GEMM=own-all vs CPU", go, ce, n, D);
        tower_rows(t ? "own-all, 2x2 clusters, patches vs CPU" : "own-all, patches vs CPU", gp, cp, n * G2, D);
    }
    kiln_clip_free(m);
    free(px), free(ce), free(gd), free(go), free(cp), free(gp);
}

/* f32 results (the accumulating epilogue): |got - ref| <= 1e-3 (|ref| + mean |ref|) in the window (f32
 * sums in another order, K up to 4096: ~1e-4 at worst), the sentinel outside it */
static int64_t gemm_check_f32(const char *what, const float *got, int64_t ldc, int64_t rows_alloc, const float *ref,
                              int64_t M, int64_t N, float sentinel) {
    double mean = 0, worst = 0;
    int64_t bad = 0, stray = 0;
    for (int64_t i = 0; i < M * N; i++) mean += fabs(ref[i]);
    mean /= (double)(M * N > 0 ? M * N : 1);
    for (int64_t r = 0; r < rows_alloc; r++)
        for (int64_t c = 0; c < ldc; c++) {
            const float g = got[r * ldc + c];
            if (r >= M || c >= N) {
                stray += g != sentinel;
                continue;
            }
            const double ratio = fabs(g - (double)ref[r * N + c]) / (1e-3 * (fabs(ref[r * N + c]) + mean));
            if (!(ratio <= 1.0)) {
                if (bad < 5)
                    printf("      bad (row %lld, col %lld): got %.8g, ref %.8g\n", (long long)r, (long long)c, g, ref[r * N + c]);
                bad++;
                if (ratio != ratio) worst = INFINITY;
            }
            if (ratio > worst) worst = ratio;
        }
    printf("    %-62s max |d|/tol %.3g, %lld bad of %lld, %lld stray\n", what, worst, (long long)bad, (long long)(M * N),
           (long long)stray);
    return bad + stray;
}

/* C (f32) += A Bᵀ + bias: the residual projections' form (CLIP's out and fc2), against the CPU on fresh inputs
 * (tails, padded strides, every schedule), against cuBLASLt's accumulating GEMM, and timed beside it at the out
 * (K 1024) and fc2 (K 4096) shapes of L/14 at 128 images */
TEST(gpu_gemm_tc_f32_add) {
    static const struct {
        int64_t M, N, K, pad;
        kiln_gemm_tc_tile tile;
    } cs[] = {
        {771, 1024, 1024, 0, KILN_GEMM_TC_TILE_AUTO},           {771, 1024, 4096, 0, KILN_GEMM_TC_TILE_128x256},
        {300, 384, 192, 8, KILN_GEMM_TC_TILE_128x128},          {300, 512, 192, 8, KILN_GEMM_TC_TILE_PP_128x128_C2x2},
        {4000, 1024, 256, 0, KILN_GEMM_TC_TILE_PP_128x128_C2},  {4000, 1024, 256, 0, KILN_GEMM_TC_TILE_PP_64x256},
        {300, 512, 192, 8, KILN_GEMM_TC_TILE_128x256_C2_D}, /* the deferred tiles accumulate f32 immediately */
    };
    const float sentinel = -7777.0f;
    kiln_rng rng;
    kiln_rng_seed(&rng, 97);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int64_t M = cs[i].M, N = cs[i].N, K = cs[i].K, ld = K + cs[i].pad, ldc = N + cs[i].pad, rows = M + 16;
        float *a = gt_rand(&rng, M * K, 1.0f), *b = gt_rand(&rng, N * K, 2.0f / sqrtf((float)K));
        float *bias = gt_rand(&rng, N, 1.0f), *r0 = gt_rand(&rng, M * N, 1.0f), *ref = malloc(sizeof(float) * (size_t)(M * N));
        float *c0 = malloc(sizeof(float) * (size_t)(rows * ldc));
        gt_round_bf16(a, M * K), gt_round_bf16(b, N * K);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < ldc; c++) c0[r * ldc + c] = r < M && c < N ? r0[r * N + c] : sentinel;
        kiln_bf16 *da = up_padded(a, M, K, ld), *db = up_padded(b, N, K, ld);
        float *dc = gt_up_f32(c0, rows * ldc), *dbias = gt_up_f32(bias, N);
        kiln_linear_forward(ref, a, b, bias, M, K, N);
        for (int64_t j = 0; j < M * N; j++) ref[j] += r0[j];
        char what[160];
        snprintf(what, sizeof what, "f32 += : M %lld N %lld K %lld ld %lld ldc %lld %s", (long long)M, (long long)N,
                 (long long)K, (long long)ld, (long long)ldc, tile_name(cs[i].tile));
        printf("    running %s\n", what);
        fflush(stdout);
        CHECK_OK(kiln_gemm_tc_tile_cuda(cs[i].tile, M, N, K, da, ld, db, ld, dc, ldc, KILN_GEMM_TC_BIAS_ADD_F32, dbias, 1,
                                        NULL));
        float *got = gt_down_f32(dc, rows * ldc);
        CHECK_MSG(gemm_check_f32(what, got, ldc, rows, ref, M, N, sentinel) == 0, "%s: mismatches (above)", what);
        kiln_cuda_free(da), kiln_cuda_free(db), kiln_cuda_free(dc), kiln_cuda_free(dbias);
        free(a), free(b), free(bias), free(r0), free(ref), free(c0), free(got);
    }
    CHECK_ERR(kiln_gemm_tc_cuda(64, 128, 64, NULL, 64, NULL, 64, NULL, 128, KILN_GEMM_TC_BIAS_ADD_F32,
                                (void *)16, 0, NULL),
              "takes an f32 bias");

    /* against cuBLASLt's accumulating GEMM and timed: out (K 1024) and fc2 (K 4096), M = 128 * 257, N = 1024 */
    const int64_t M = 32896, N = 1024, Ks[] = {1024, 4096};
    float *a = gt_rand(&rng, M * 4096, 1.0f), *b = gt_rand(&rng, N * 4096, 2.0f / 64.0f), *bias = gt_rand(&rng, N, 1.0f);
    float *r0 = gt_rand(&rng, M * N, 1.0f);
    kiln_bf16 *da = gt_up_bf16(a, M * 4096), *db = gt_up_bf16(b, N * 4096);
    float *dbias = gt_up_f32(bias, N), *dl = gt_up_f32(r0, M * N), *dc = gt_up_f32(r0, M * N);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
    for (int k = 0; k < 2; k++) {
        const int64_t K = Ks[k];
        /* one accumulation each from the same start, compared (r27 compared after the previous timing's
         * accumulations, a different number on each side) */
        CHECK_OK(kiln_cuda_copy(dl, r0, sizeof(float) * (size_t)(M * N), KILN_CUDA_H2D));
        CHECK_OK(kiln_cuda_copy(dc, r0, sizeof(float) * (size_t)(M * N), KILN_CUDA_H2D));
        CHECK_OK(kiln_clip_linear_cuda(dl, 1, da, db, dbias, M, K, N, 1, NULL));
        CHECK_OK(kiln_gemm_tc_cuda(M, N, K, da, K, db, K, dc, N, KILN_GEMM_TC_BIAS_ADD_F32, dbias, 1, NULL));
        float *lt = gt_down_f32(dl, M * N), *got = gt_down_f32(dc, M * N);
        char what[96];
        snprintf(what, sizeof what, "f32 += vs cuBLASLt at M %lld N %lld K %lld", (long long)M, (long long)N, (long long)K);
        CHECK_MSG(gemm_check_f32(what, got, N, M, lt, M, N, sentinel) == 0, "%s", what);
        free(lt), free(got);
        const double flop = 2.0 * (double)M * (double)N * (double)K;
        for (int v = 0; v < 4; v++) {
            static const int tiles[] = {-1, KILN_GEMM_TC_TILE_AUTO, KILN_GEMM_TC_TILE_PP_128x128_C2x2,
                                        KILN_GEMM_TC_TILE_128x256};
            float ms = 0;
            for (int r = -2; r < 10; r++) {
                if (r == 0) CHECK(cudaEventRecord(e0, NULL) == cudaSuccess);
                if (tiles[v] < 0) CHECK_OK(kiln_clip_linear_cuda(dl, 1, da, db, dbias, M, K, N, 1, NULL));
                else
                    CHECK_OK(kiln_gemm_tc_tile_cuda((kiln_gemm_tc_tile)tiles[v], M, N, K, da, K, db, K, dc, N,
                                                    KILN_GEMM_TC_BIAS_ADD_F32, dbias, 1, NULL));
            }
            CHECK(cudaEventRecord(e1, NULL) == cudaSuccess);
            CHECK(cudaEventSynchronize(e1) == cudaSuccess);
            CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
            ms /= 10;
            printf("    M %lld N %lld K %lld  f32 += bias  %-32s %.3f ms  %.0f TFLOP/s\n", (long long)M, (long long)N,
                   (long long)K, tiles[v] < 0 ? "cuBLASLt" : tile_name((kiln_gemm_tc_tile)tiles[v]), ms, flop / ms * 1e-9);
        }
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    kiln_cuda_free(da), kiln_cuda_free(db), kiln_cuda_free(dbias), kiln_cuda_free(dl), kiln_cuda_free(dc);
    free(a), free(b), free(bias), free(r0);
}
