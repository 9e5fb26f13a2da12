/* kiln_attention_forward_cuda / kiln_attention_backward_cuda against the CPU reference (src/nn/attention.c)
 * on random bf16-rounded inputs: causal, sliding window, GQA ratios 1/2/4, head dims 10/33/64/128, T = 1,
 * T not a multiple of any tile, and the KV-cache layout (Tq < tk <= tk_cap). Each case runs four device
 * paths: kiln's own kernels (tensor cores for D = 32, 64 and 128; then the generic ones, KILN_ATTN_GENERIC=1)
 * and cuDNN's fused flash attention (deterministic backward, then the atomic-dQ one) where it takes the
 * shape; with KILN_CUDNN_LIB set (the GPU machine's build script sets it) cuDNN must run every case it can.
 *
 * Tolerances, as max |gpu - cpu| / max |cpu| per tensor:
 *   out, dq, dk, dv: 2e-2 (bf16 outputs carry a relative rounding of 2^-9 = 2e-3 each; the tensor-core path
 *     also rounds the probabilities to bf16 before P.V and dS before dS.K / dS^T.Q, as flash attention does);
 *   lse: 1e-4 (f32 throughout; the reference is computed here in double from the same bf16 q and k).
 * The denominator has a floor of 1e-2 (ATT_FLOOR): with q, k of magnitude 2 and v, dout of magnitude 1 the
 * gradients are of order 0.1..10, and where the exact answer is 0 (T = 1: one visible key, so dS = 0 and
 * dq = dk = 0) the device's rounding residue must stay below 2e-4 in absolute terms.
 * The backward is also run twice and must be bit-identical (no atomics). */
#include <math.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/cuda_attention.h"
#include "kiln/nn.h"

#define TOL_BF16 2e-2
#define TOL_LSE 1e-4
#define ATT_FLOOR 1e-2

/* max |got - ref| / max(max |ref|, ATT_FLOOR) <= tol */
static void att_close(const char *name, const float *got, const float *ref, int64_t n, double tol) {
    double num = 0, den = ATT_FLOOR;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d != d) num = INFINITY;
        num = d > num ? d : num;
        den = fabs((double)ref[i]) > den ? fabs((double)ref[i]) : den;
    }
    double e = num / den;
    CHECK_MSG(e <= tol, "%s: relative error %.3g > %.3g", name, e, tol);
    printf("    %-28s rel err %.3g (tol %.3g)\n", name, e, tol);
}

typedef struct {
    int64_t B, Tq, tk, tk_cap, NH, KV, D, window;
    int backward;
} att_case;

static void set_generic(int on) {
    if (on)
        setenv("KILN_ATTN_GENERIC", "1", 1);
    else
        unsetenv("KILN_ATTN_GENERIC");
}

/* log-sum-exp of each query's scaled visible scores, in double: [B, NH, Tq] */
static float *ref_lse(const float *q, const float *k, const kiln_attn_shape *s) {
    float *lse = malloc((size_t)(s->B * s->NH * s->Tq) * sizeof *lse);
    const int64_t G = s->NH / s->KV, q0 = s->tk - s->Tq;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->NH; h++)
            for (int64_t i = 0; i < s->Tq; i++) {
                const int64_t p = q0 + i, lo = s->window > 0 && p - s->window + 1 > 0 ? p - s->window + 1 : 0;
                const float *qi = q + ((b * s->Tq + i) * s->NH + h) * s->D;
                double m = -INFINITY, sum = 0;
                double *sc = malloc((size_t)(p - lo + 1) * sizeof *sc);
                for (int64_t j = lo; j <= p; j++) {
                    const float *kj = k + ((b * s->tk_cap + j) * s->KV + h / G) * s->D;
                    double dot = 0;
                    for (int64_t d = 0; d < s->D; d++) dot += (double)qi[d] * kj[d];
                    sc[j - lo] = dot * s->scale;
                    m = sc[j - lo] > m ? sc[j - lo] : m;
                }
                for (int64_t j = lo; j <= p; j++) sum += exp(sc[j - lo] - m);
                lse[(b * s->NH + h) * s->Tq + i] = (float)(m + log(sum));
                free(sc);
            }
    return lse;
}

/* the variants every case runs: kiln's kernels (tensor cores where they apply, then the generic ones), cuDNN
 * with its deterministic backward, cuDNN with the atomic-dQ backward (not compared bit for bit) */
static const char *const impls[4] = {"own", "own", "cudnn", "cudnn-nondet"};
static const char *const vnames[4] = {"default", "generic", "cudnn", "cudnn-nondet"};

/* cuDNN must take the shape when the GPU machine says it has cuDNN (KILN_CUDNN_LIB, set by
 * scripts/gpu_machine_build.sh): no KV cache, head dim a multiple of 8 from 32 to 128 */
static int cudnn_expected(const kiln_attn_shape *s) {
    const char *lib = getenv("KILN_CUDNN_LIB");
    return lib && *lib && s->Tq == s->tk && s->D % 8 == 0 && s->D >= 32 && s->D <= 128;
}

static void run_case(const att_case *c, uint64_t seed) {
    printf("  B=%lld Tq=%lld tk=%lld cap=%lld NH=%lld KV=%lld D=%lld window=%lld\n", (long long)c->B,
           (long long)c->Tq, (long long)c->tk, (long long)c->tk_cap, (long long)c->NH, (long long)c->KV,
           (long long)c->D, (long long)c->window);
    kiln_attn_shape s = {c->B, c->Tq, c->tk, c->tk_cap, c->NH, c->KV, c->D, c->window, 1.0f / sqrtf((float)c->D)};
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    const int64_t nq = c->B * c->Tq * c->NH * c->D, nk = c->B * c->tk_cap * c->KV * c->D;
    const int64_t nl = c->B * c->NH * c->Tq;
    /* amplitude 2: scores spread over several units, so the softmax is neither flat nor one-hot */
    float *q = gt_rand(&rng, nq, 2.0f), *k = gt_rand(&rng, nk, 2.0f), *v = gt_rand(&rng, nk, 1.0f);
    float *dout = gt_rand(&rng, nq, 1.0f);
    gt_round_bf16(q, nq), gt_round_bf16(k, nk), gt_round_bf16(v, nk), gt_round_bf16(dout, nq);

    float *out = calloc((size_t)nq, sizeof *out);
    float *probs = calloc((size_t)(nl * c->tk), sizeof *probs);
    kiln_attention_forward(out, probs, q, k, v, &s);
    float *lse = ref_lse(q, k, &s);
    float *dq = NULL, *dk = NULL, *dv = NULL;
    if (c->backward) {
        dq = calloc((size_t)nq, sizeof *dq), dk = calloc((size_t)nk, sizeof *dk), dv = calloc((size_t)nk, sizeof *dv);
        kiln_attention_backward(dq, dk, dv, dout, probs, q, k, v, &s);
    }

    kiln_bf16 *d_q = gt_up_bf16(q, nq), *d_k = gt_up_bf16(k, nk), *d_v = gt_up_bf16(v, nk);
    kiln_bf16 *d_do = gt_up_bf16(dout, nq);
    kiln_bf16 *d_out = gt_dev((size_t)nq * 2), *d_dq = gt_dev((size_t)nq * 2);
    kiln_bf16 *d_dk = gt_dev((size_t)nk * 2), *d_dv = gt_dev((size_t)nk * 2);
    float *d_lse = gt_dev((size_t)nl * sizeof(float));
    void *work = gt_dev(kiln_attention_backward_cuda_work(&s) + 16);

    for (int var = 0; var < 4; var++) {
        const int generic = var == 1;
        set_generic(generic);
        CHECK_OK(kiln_attention_cuda_set_impl(impls[var]));
        CHECK_OK(kiln_attention_forward_cuda(d_out, d_lse, d_q, d_k, d_v, &s, NULL));
        const char *ran = kiln_attention_cuda_last_impl(0);
        printf("   %s path: forward ran %s\n", vnames[var], ran);
        if (var >= 2 && cudnn_expected(&s)) CHECK_MSG(strcmp(ran, "own"), "%s: cuDNN did not run", vnames[var]);
        float *g_out = gt_down_bf16(d_out, nq), *g_lse = gt_down_f32(d_lse, nl);
        att_close("out", g_out, out, nq, TOL_BF16);
        att_close("lse", g_lse, lse, nl, TOL_LSE);
        free(g_out), free(g_lse);
        if (!c->backward) continue;
        CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
        ran = kiln_attention_cuda_last_impl(1);
        printf("   %s path: backward ran %s\n", vnames[var], ran);
        if (var >= 2 && cudnn_expected(&s)) CHECK_MSG(strcmp(ran, "own"), "%s: cuDNN did not run", vnames[var]);
        float *g_dq = gt_down_bf16(d_dq, nq), *g_dk = gt_down_bf16(d_dk, nk), *g_dv = gt_down_bf16(d_dv, nk);
        att_close("dq", g_dq, dq, nq, TOL_BF16);
        att_close("dk", g_dk, dk, nk, TOL_BF16);
        att_close("dv", g_dv, dv, nk, TOL_BF16);
        /* a second run gives the same bits */
        CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
        float *h_dq = gt_down_bf16(d_dq, nq), *h_dk = gt_down_bf16(d_dk, nk), *h_dv = gt_down_bf16(d_dv, nk);
        if (strcmp(ran, "cudnn-nondet"))
            CHECK_MSG(!memcmp(g_dq, h_dq, (size_t)nq * sizeof(float)) &&
                          !memcmp(g_dk, h_dk, (size_t)nk * sizeof(float)) &&
                          !memcmp(g_dv, h_dv, (size_t)nk * sizeof(float)),
                      "%s: two backward runs differ", vnames[var]);
        free(g_dq), free(g_dk), free(g_dv), free(h_dq), free(h_dk), free(h_dv);
    }
    set_generic(0);
    CHECK_OK(kiln_attention_cuda_set_impl(NULL));
    kiln_cuda_free(d_q), kiln_cuda_free(d_k), kiln_cuda_free(d_v), kiln_cuda_free(d_do), kiln_cuda_free(d_out);
    kiln_cuda_free(d_dq), kiln_cuda_free(d_dk), kiln_cuda_free(d_dv), kiln_cuda_free(d_lse), kiln_cuda_free(work);
    free(q), free(k), free(v), free(dout), free(out), free(probs), free(lse), free(dq), free(dk), free(dv);
}

TEST(gpu_attention_small_odd_dims) {
    const att_case cs[] = {
        {2, 1, 1, 1, 2, 1, 10, 0, 1},      /* T = 1 */
        {2, 77, 77, 77, 4, 2, 10, 0, 1},   /* odd head dim, GQA 2, T not a tile multiple */
        {1, 65, 65, 65, 4, 4, 33, 5, 1},   /* odd dim, tiny window */
        {3, 40, 40, 40, 2, 2, 128, 0, 1},  /* one partial tile */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], 100 + i);
}

TEST(gpu_attention_gqa_window) {
    const att_case cs[] = {
        {1, 130, 130, 130, 4, 1, 64, 0, 1},   /* GQA 4 */
        {2, 200, 200, 200, 2, 2, 128, 48, 1}, /* window < T, GQA 1 */
        {1, 100, 100, 100, 4, 2, 64, 17, 1},  /* odd window, GQA 2 */
        {1, 300, 300, 300, 8, 2, 128, 0, 1},  /* the benchmark's heads, GQA 4 */
        {2, 150, 150, 150, 4, 2, 32, 0, 1},   /* D = 32 (the default training config's head dim) */
        {1, 97, 97, 97, 4, 4, 32, 40, 1},     /* D = 32, window */
        {2, 48, 48, 48, 2, 1, 32, 0, 1},      /* D = 32, one 64-row forward block */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], 200 + i);
}

TEST(gpu_attention_long) {
    const att_case cs[] = {
        {1, 1024, 1024, 1024, 8, 2, 128, 0, 1},
        {1, 777, 777, 777, 4, 2, 64, 256, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], 300 + i);
}

/* cuDNN <= 9.15 needs an explicit padding mask in the backward when T is not a multiple of 128; the
 * GPU machine's cuDNN may be newer, so KILN_CUDNN_PAD_MASK=1 builds that graph anyway and it must give
 * the same answers (GQA, a window, odd T). */
TEST(gpu_attention_cudnn_padding_mask) {
    const att_case cs[] = {
        {2, 130, 130, 130, 4, 2, 64, 0, 1},
        {1, 97, 97, 97, 4, 4, 32, 40, 1},
    };
    setenv("KILN_CUDNN_PAD_MASK", "1", 1);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], 600 + i);
    unsetenv("KILN_CUDNN_PAD_MASK");
}

/* Past KILN_CUDNN_WORKSPACE_MB the deterministic cuDNN backward (workspace B·H·T²) hands the call to kiln's
 * kernels: with a 1 MiB cap the backward of B=1 T=260 H=8 must be kiln's, bit for bit. */
TEST(gpu_attention_cudnn_workspace_cap) {
    const int64_t B = 1, T = 260, NH = 8, KV = 2, D = 128, nq = B * T * NH * D, nk = B * T * KV * D;
    kiln_attn_shape s = {B, T, T, T, NH, KV, D, 0, 1.0f / sqrtf((float)D)};
    kiln_rng rng;
    kiln_rng_seed(&rng, 700);
    float *q = gt_rand(&rng, nq, 2.0f), *k = gt_rand(&rng, nk, 2.0f), *v = gt_rand(&rng, nk, 1.0f);
    float *dout = gt_rand(&rng, nq, 1.0f);
    kiln_bf16 *d_q = gt_up_bf16(q, nq), *d_k = gt_up_bf16(k, nk), *d_v = gt_up_bf16(v, nk);
    kiln_bf16 *d_do = gt_up_bf16(dout, nq), *d_out = gt_dev((size_t)nq * 2), *d_dq = gt_dev((size_t)nq * 2);
    kiln_bf16 *d_dk = gt_dev((size_t)nk * 2), *d_dv = gt_dev((size_t)nk * 2);
    float *d_lse = gt_dev((size_t)(B * NH * T) * sizeof(float));
    void *work = gt_dev(kiln_attention_backward_cuda_work(&s));
    setenv("KILN_CUDNN_WORKSPACE_MB", "1", 1);
    CHECK_OK(kiln_attention_cuda_set_impl("cudnn"));
    CHECK_OK(kiln_attention_forward_cuda(d_out, d_lse, d_q, d_k, d_v, &s, NULL));
    CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
    printf("  capped: forward ran %s, backward ran %s\n", kiln_attention_cuda_last_impl(0),
           kiln_attention_cuda_last_impl(1));
    CHECK(!strcmp(kiln_attention_cuda_last_impl(1), "own"));
    float *a_dq = gt_down_bf16(d_dq, nq), *a_dk = gt_down_bf16(d_dk, nk);
    CHECK_OK(kiln_attention_cuda_set_impl("own"));
    CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
    float *b_dq = gt_down_bf16(d_dq, nq), *b_dk = gt_down_bf16(d_dk, nk);
    CHECK(!memcmp(a_dq, b_dq, (size_t)nq * sizeof(float)) && !memcmp(a_dk, b_dk, (size_t)nk * sizeof(float)));
    unsetenv("KILN_CUDNN_WORKSPACE_MB");
    CHECK_OK(kiln_attention_cuda_set_impl(NULL));
    kiln_cuda_free(d_q), kiln_cuda_free(d_k), kiln_cuda_free(d_v), kiln_cuda_free(d_do), kiln_cuda_free(d_out);
    kiln_cuda_free(d_dq), kiln_cuda_free(d_dk), kiln_cuda_free(d_dv), kiln_cuda_free(d_lse), kiln_cuda_free(work);
    free(q), free(k), free(v), free(dout), free(a_dq), free(a_dk), free(b_dq), free(b_dk);
}

TEST(gpu_attention_kv_cache_forward) {
    const att_case cs[] = {
        {2, 5, 70, 96, 4, 2, 64, 0, 0},   /* decode-style: 5 new queries over a 70-key cache of capacity 96 */
        {2, 1, 133, 140, 8, 2, 128, 32, 0},
        {1, 20, 50, 50, 2, 1, 10, 0, 1},  /* chunked prefill, with backward */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], 400 + i);
}

TEST(gpu_attention_bad_shapes) {
    kiln_attn_shape s = {1, 4, 4, 4, 3, 2, 64, 0, 0.125f};
    CHECK_ERR(kiln_attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, &s, NULL), "multiple of KV");
    s.KV = 1, s.D = 129;
    CHECK_ERR(kiln_attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, &s, NULL), "head dim 129");
    s.D = 64, s.tk = 2;
    CHECK_ERR(kiln_attention_backward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &s, NULL, NULL),
              "bad shape");
}

/* The [cuda] benchmark's attention (B=4, T=4096, 8/2 heads of 128, causal; then a 1024 window) is too
 * large for the CPU reference: there kiln's tensor-core kernels and cuDNN must agree with kiln's generic
 * kernels (written independently; same tolerances), and the backward must repeat bit for bit (except
 * cuDNN's atomic-dQ one). Times are printed for information only. */
TEST(gpu_attention_bench_shape) {
    for (int wi = 0; wi < 2; wi++) {
        const int64_t B = 4, T = 4096, NH = 8, KV = 2, D = 128, W = wi ? 1024 : 0;
        kiln_attn_shape s = {B, T, T, T, NH, KV, D, W, 1.0f / sqrtf((float)D)};
        const int64_t nq = B * T * NH * D, nk = B * T * KV * D, nl = B * NH * T;
        kiln_rng rng;
        kiln_rng_seed(&rng, 500 + (uint64_t)wi);
        float *q = gt_rand(&rng, nq, 2.0f), *k = gt_rand(&rng, nk, 2.0f), *v = gt_rand(&rng, nk, 1.0f);
        float *dout = gt_rand(&rng, nq, 1.0f);
        kiln_bf16 *d_q = gt_up_bf16(q, nq), *d_k = gt_up_bf16(k, nk), *d_v = gt_up_bf16(v, nk);
        kiln_bf16 *d_do = gt_up_bf16(dout, nq);
        kiln_bf16 *d_out = gt_dev((size_t)nq * 2), *d_dq = gt_dev((size_t)nq * 2);
        kiln_bf16 *d_dk = gt_dev((size_t)nk * 2), *d_dv = gt_dev((size_t)nk * 2);
        float *d_lse = gt_dev((size_t)nl * sizeof(float));
        void *work = gt_dev(kiln_attention_backward_cuda_work(&s));
        const double pairs = W ? (double)W * (W + 1) / 2 + (double)(T - W) * W : (double)T * (T + 1) / 2;
        const double fl = 4.0 * B * NH * D * pairs;
        /* 0: kiln's default (128-row forward blocks), 1: 64-row forward blocks, 2: generic kernels, 3: cuDNN,
         * 4: cuDNN with the atomic-dQ backward */
        static const char *const names[5] = {"default", "fwd64", "generic", "cudnn", "cudnn-nondet"};
        static const char *const impl[5] = {"own", "own", "own", "cudnn", "cudnn-nondet"};
        float *res[5][6];
        printf("  B=%lld T=%lld NH=%lld KV=%lld D=%lld window=%lld\n", (long long)B, (long long)T, (long long)NH,
               (long long)KV, (long long)D, (long long)W);
        for (int var = 0; var < 5; var++) {
            const int generic = var == 2;
            set_generic(generic);
            CHECK_OK(kiln_attention_cuda_set_impl(impl[var]));
            if (var == 1)
                setenv("KILN_ATTN_FWD_ROWS", "64", 1);
            else
                unsetenv("KILN_ATTN_FWD_ROWS");
            CHECK_OK(kiln_attention_forward_cuda(d_out, d_lse, d_q, d_k, d_v, &s, NULL)); /* warm-up */
            CHECK_OK(kiln_cuda_sync());
            double t0 = gt_now_s();
            CHECK_OK(kiln_attention_forward_cuda(d_out, d_lse, d_q, d_k, d_v, &s, NULL));
            CHECK_OK(kiln_cuda_sync());
            double t1 = gt_now_s();
            CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
            res[var][0] = gt_down_bf16(d_out, nq), res[var][1] = gt_down_f32(d_lse, nl);
            res[var][2] = gt_down_bf16(d_dq, nq), res[var][3] = gt_down_bf16(d_dk, nk);
            res[var][4] = gt_down_bf16(d_dv, nk);
            double t2 = gt_now_s(); /* the second backward call: warm */
            CHECK_OK(kiln_attention_backward_cuda(d_dq, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
            CHECK_OK(kiln_cuda_sync());
            double t3 = gt_now_s();
            printf("   %-12s forward %8.3f ms (%6.1f TFLOP/s)  backward %8.3f ms (%6.1f TFLOP/s)  ran %s / %s  [info]\n",
                   names[var], (t1 - t0) * 1e3, fl / (t1 - t0) / 1e12, (t3 - t2) * 1e3,
                   2.5 * fl / (t3 - t2) / 1e12, kiln_attention_cuda_last_impl(0), kiln_attention_cuda_last_impl(1));
            if (var >= 3 && cudnn_expected(&s))
                CHECK_MSG(!strcmp(kiln_attention_cuda_last_impl(0), "cudnn") &&
                              strcmp(kiln_attention_cuda_last_impl(1), "own"),
                          "%s: cuDNN did not run", names[var]);
            res[var][5] = gt_down_bf16(d_dk, nk);
            if (var == 0) { /* where the backward's time goes: dK/dV only, then dQ only (each with delta) */
                CHECK_OK(kiln_cuda_sync());
                double u0 = gt_now_s();
                CHECK_OK(kiln_attention_backward_cuda(NULL, d_dk, d_dv, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
                CHECK_OK(kiln_cuda_sync());
                double u1 = gt_now_s();
                CHECK_OK(kiln_attention_backward_cuda(d_dq, NULL, NULL, d_do, d_out, d_lse, d_q, d_k, d_v, &s, work, NULL));
                CHECK_OK(kiln_cuda_sync());
                double u2 = gt_now_s();
                printf("   %-8s backward split: dK/dV %8.3f ms (4 GEMMs, %6.1f TFLOP/s)  dQ %8.3f ms (3 GEMMs, %6.1f "
                       "TFLOP/s)  [info]\n",
                       names[var], (u1 - u0) * 1e3, 2.0 * fl / (u1 - u0) / 1e12, (u2 - u1) * 1e3,
                       1.5 * fl / (u2 - u1) / 1e12);
            }
            if (var != 4)
                CHECK_MSG(!memcmp(res[var][5], res[var][3], (size_t)nk * sizeof(float)), "%s: two backward runs differ",
                          names[var]);
        }
        set_generic(0);
        CHECK_OK(kiln_attention_cuda_set_impl(NULL));
        unsetenv("KILN_ATTN_FWD_ROWS");
        for (int var = 0; var < 5; var++) {
            if (var == 2) continue;
            char nm[64];
            static const char *const what[5] = {"out", "lse", "dq", "dk", "dv"};
            for (int j = 0; j < 5; j++) {
                snprintf(nm, sizeof nm, "%s (%s vs generic)", what[j], names[var]);
                att_close(nm, res[var][j], res[2][j], j == 0 || j == 2 ? nq : j == 1 ? nl : nk,
                          j == 1 ? TOL_LSE : TOL_BF16);
            }
        }
        for (int g = 0; g < 5; g++)
            for (int j = 0; j < 6; j++) free(res[g][j]);
        kiln_cuda_free(d_q), kiln_cuda_free(d_k), kiln_cuda_free(d_v), kiln_cuda_free(d_do), kiln_cuda_free(d_out);
        kiln_cuda_free(d_dq), kiln_cuda_free(d_dk), kiln_cuda_free(d_dv), kiln_cuda_free(d_lse), kiln_cuda_free(work);
        free(q), free(k), free(v), free(dout);
    }
}
