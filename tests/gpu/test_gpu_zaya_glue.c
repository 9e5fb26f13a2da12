/* The ZAYA model's own glue kernels (src/cuda/zaya_glue.cu) against the loops of src/models/zaya_forward.c /
 * zaya_backward.c on the same bf16-rounded inputs, at odd sizes.
 * Tolerances (max |gpu - ref| / max |ref|): packing and route counts are exact; the router state's forward
 * and drs are one bf16 rounding of an f32 result (2^-9 = 1.95e-3 relative, tol 4e-3); dprev is f32 from the
 * same f32 inputs (tol 1e-6); dscale is a sum over tokens in a different order (tol 1e-5); the sum of
 * squares is f64 (tol 1e-12). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "gpu_testutil.h"

static float *dn_bf16_f(const kiln_bf16 *d, int64_t n) { return gt_down_bf16(d, n); }

TEST(gpu_zaya_glue_pack_qk) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 1);
    const int64_t N = 37, Q = 24, K = 8, C = Q + K;
    float *q = gt_rand(&rng, N * Q, 1), *k = gt_rand(&rng, N * K, 1);
    gt_round_bf16(q, N * Q), gt_round_bf16(k, N * K);
    kiln_bf16 *dq = gt_up_bf16(q, N * Q), *dk = gt_up_bf16(k, N * K), *dqk = gt_dev((size_t)(N * C) * 2);
    CHECK_OK(kiln_zaya_pack_qk_cuda(dqk, dq, dk, N, Q, K, NULL));
    float *got = dn_bf16_f(dqk, N * C), *ref = malloc((size_t)(N * C) * sizeof *ref);
    for (int64_t n = 0; n < N; n++) {
        memcpy(ref + n * C, q + n * Q, (size_t)Q * sizeof *ref);
        memcpy(ref + n * C + Q, k + n * K, (size_t)K * sizeof *ref);
    }
    CHECK_MSG(!memcmp(got, ref, (size_t)(N * C) * sizeof *ref), "packing differs");
    free(q), free(k), free(got), free(ref);
    kiln_cuda_free(dq), kiln_cuda_free(dk), kiln_cuda_free(dqk);
}

static void router_state_case(int64_t N, int64_t R) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 2);
    printf("  N=%lld R=%lld\n", (long long)N, (long long)R);
    float *rd = gt_rand(&rng, N * R, 1), *prev = gt_rand(&rng, N * R, 1), *scale = gt_rand(&rng, R, 1);
    float *dxn = gt_rand(&rng, N * R, 1), *carry = gt_rand(&rng, N * R, 0.5f);
    gt_round_bf16(rd, N * R), gt_round_bf16(prev, N * R), gt_round_bf16(dxn, N * R);
    kiln_bf16 *d_rd = gt_up_bf16(rd, N * R), *d_prev = gt_up_bf16(prev, N * R), *d_dxn = gt_up_bf16(dxn, N * R);
    float *d_scale = gt_up_f32(scale, R), *d_carry = gt_up_f32(carry, N * R);
    /* forward: rdown += prev * scale */
    CHECK_OK(kiln_zaya_router_state_forward_cuda(d_rd, d_prev, d_scale, N, R, NULL));
    float *got = dn_bf16_f(d_rd, N * R), *ref = malloc((size_t)(N * R) * sizeof *ref);
    for (int64_t i = 0; i < N * R; i++) ref[i] = rd[i] + prev[i] * scale[i % R];
    GT_CLOSE("router state fwd", got, ref, N * R, 4e-3);
    free(got);
    /* backward: g = dxn + carry; drs = g; dprev = g * scale; dscale += sum g * prev */
    kiln_bf16 *d_drs = gt_dev((size_t)(N * R) * 2);
    float *d_dprev = gt_dev((size_t)(N * R) * 4), *d_prod = gt_dev((size_t)(N * R) * 4);
    float *ds0 = gt_rand(&rng, R, 1), *d_dscale = gt_up_f32(ds0, R);
    CHECK_OK(kiln_zaya_router_state_backward_cuda(d_drs, d_dprev, d_dscale, d_prod, d_dxn, d_carry, d_prev, d_scale, N, R,
                                                  NULL));
    float *g_drs = dn_bf16_f(d_drs, N * R), *g_dprev = gt_down_f32(d_dprev, N * R), *g_ds = gt_down_f32(d_dscale, R);
    float *r_drs = malloc((size_t)(N * R) * sizeof *r_drs), *r_dprev = malloc((size_t)(N * R) * sizeof *r_dprev);
    float *r_ds = malloc((size_t)R * sizeof *r_ds);
    double *acc = calloc((size_t)R, sizeof *acc);
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < R; r++) {
            float g = dxn[n * R + r] + carry[n * R + r];
            r_drs[n * R + r] = g;
            r_dprev[n * R + r] = g * scale[r];
            acc[r] += (double)(g * prev[n * R + r]);
        }
    for (int64_t r = 0; r < R; r++) r_ds[r] = (float)(ds0[r] + acc[r]);
    GT_CLOSE("router state drs", g_drs, r_drs, N * R, 4e-3);
    GT_CLOSE("router state dprev", g_dprev, r_dprev, N * R, 1e-6);
    GT_CLOSE("router state dscale", g_ds, r_ds, R, 1e-5);
    /* without a previous state (layer 0): only drs, and no carry */
    CHECK_OK(kiln_zaya_router_state_backward_cuda(d_drs, NULL, NULL, NULL, d_dxn, NULL, NULL, NULL, N, R, NULL));
    free(g_drs);
    g_drs = dn_bf16_f(d_drs, N * R);
    GT_CLOSE("router state drs, layer 0", g_drs, dxn, N * R, 0);
    free(rd), free(prev), free(scale), free(dxn), free(carry), free(ref), free(ds0);
    free(g_drs), free(g_dprev), free(g_ds), free(r_drs), free(r_dprev), free(r_ds);
    free(acc);
    kiln_cuda_free(d_rd), kiln_cuda_free(d_prev), kiln_cuda_free(d_dxn), kiln_cuda_free(d_scale);
    kiln_cuda_free(d_carry), kiln_cuda_free(d_drs), kiln_cuda_free(d_dprev), kiln_cuda_free(d_prod);
    kiln_cuda_free(d_dscale);
}

/* the backward's dscale as per-chunk partials, then their column sum */
TEST(gpu_zaya_glue_router_state) {
    router_state_case(1000, 33); /* more tokens than one column-sum block */
    router_state_case(5000, 256); /* the router's width */
}

TEST(gpu_zaya_glue_counts_scale_sumsq) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 3);
    const int64_t S = 5003, E1 = 9;
    int32_t *ch = malloc((size_t)S * sizeof *ch);
    int64_t ref[9] = {0}, got[9] = {0};
    /* every 97th choice out of range (-1 or E1): not counted */
    for (int64_t i = 0; i < S; i++) {
        ch[i] = (int32_t)(kiln_rng_u64(&rng) % (uint64_t)E1);
        if (i % 97 == 5) ch[i] = i % 2 ? -1 : (int32_t)E1;
        else ref[ch[i]]++;
    }
    int32_t *d_ch = gt_dev((size_t)S * 4);
    int64_t *d_cnt = gt_dev(sizeof got);
    CHECK_OK(kiln_cuda_copy(d_ch, ch, (size_t)S * 4, KILN_CUDA_H2D));
    CHECK_OK(kiln_cuda_copy(d_cnt, got, sizeof got, KILN_CUDA_H2D));
    CHECK_OK(kiln_zaya_route_count_cuda(d_cnt, d_ch, S, E1, NULL));
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(got, d_cnt, sizeof got, KILN_CUDA_D2H));
    CHECK_MSG(!memcmp(got, ref, sizeof ref), "route counts differ");
    const int64_t n = 1000003;
    float *x = gt_rand(&rng, n, 2), *d_x = gt_up_f32(x, n);
    CHECK_OK(kiln_zaya_scale_cuda(d_x, n, 0.25f, NULL));
    float *sx = gt_down_f32(d_x, n);
    int same = 1;
    double want = 0, ss = 0, ss2 = 0;
    for (int64_t i = 0; i < n; i++) same &= sx[i] == x[i] * 0.25f, want += (double)sx[i] * sx[i];
    CHECK_MSG(same, "scale differs");
    double *d_ss = gt_dev(sizeof(double));
    CHECK_OK(kiln_zaya_sumsq_cuda(d_ss, d_x, n, NULL));
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(&ss, d_ss, sizeof ss, KILN_CUDA_D2H));
    CHECK_OK(kiln_zaya_sumsq_cuda(d_ss, d_x, n, NULL));
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(&ss2, d_ss, sizeof ss2, KILN_CUDA_D2H));
    CHECK_MSG(fabs(ss - want) <= 1e-12 * want, "sum of squares %.17g vs %.17g", ss, want);
    CHECK_MSG(ss == ss2, "sum of squares not repeatable");
    free(ch), free(x), free(sx);
    kiln_cuda_free(d_ch), kiln_cuda_free(d_cnt), kiln_cuda_free(d_x), kiln_cuda_free(d_ss);
}

/* The sum of squares over f32 and bf16 segments (kiln_sumsq_plan: the gradient with the experts' bf16 weight
 * gradients) against the host's f64 sum of the same values: segments at 64-float offsets as the model lays them
 * out, sizes that are not multiples of a vector or of a chunk (2^18), one of several chunks, an empty one, and x
 * shifted by one float (every access scalar); the same bits on a second run. */
TEST(gpu_zaya_glue_sumsq_segments) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 77);
    static const int64_t sizes[] = {1000003, 7, 600000, 0, 262144, 65, 3};
    static const int isbf[] = {0, 1, 1, 0, 1, 0, 1};
    enum { NS = sizeof sizes / sizeof *sizes };
    kiln_sumsq_seg seg[NS];
    int64_t nf = 0;
    for (int k = 0; k < NS; k++) {
        seg[k] = (kiln_sumsq_seg){nf, sizes[k], isbf[k], 0};
        nf += (sizes[k] + 63) / 64 * 64;
    }
    float *v = gt_rand(&rng, nf, 3.0f), *buf = calloc((size_t)nf + 1, sizeof(float));
    double want = 0;
    for (int k = 0; k < NS; k++) {
        if (!isbf[k]) {
            memcpy(buf + seg[k].off, v + seg[k].off, (size_t)sizes[k] * sizeof(float));
            for (int64_t j = 0; j < sizes[k]; j++) want += (double)v[seg[k].off + j] * v[seg[k].off + j];
            continue;
        }
        uint16_t *h = (uint16_t *)(buf + seg[k].off);
        for (int64_t j = 0; j < sizes[k]; j++) {
            h[j] = kiln_f32_to_bf16(v[seg[k].off + j]);
            const double f = kiln_bf16_to_f32(h[j]);
            want += f * f;
        }
        for (int64_t j = (sizes[k] + 1) / 2; j < sizes[k]; j++) buf[seg[k].off + j] = 1e30f; /* the slot's unused half */
    }
    kiln_sumsq_plan *p = NULL;
    CHECK_OK(kiln_sumsq_plan_create(seg, NS, &p));
    float *d = gt_dev((size_t)(nf + 1) * sizeof(float));
    double *d_ss = gt_dev(sizeof(double));
    for (int shift = 0; shift < 2 && p; shift++) {
        CHECK_OK(kiln_cuda_copy(d + shift, buf, (size_t)nf * sizeof(float), KILN_CUDA_H2D));
        double ss[2] = {0, 0};
        for (int r = 0; r < 2; r++) {
            CHECK_OK(kiln_sumsq_plan_run(p, d_ss, d + shift, NULL));
            CHECK_OK(kiln_cuda_sync());
            CHECK_OK(kiln_cuda_copy(&ss[r], d_ss, sizeof(double), KILN_CUDA_D2H));
        }
        CHECK_MSG(fabs(ss[0] - want) <= 1e-12 * want, "shift %d: sum of squares %.17g vs %.17g", shift, ss[0], want);
        CHECK_MSG(ss[0] == ss[1], "shift %d: sum of squares not repeatable", shift);
        /* in pieces: segments 2..4 on a stream of their own, the rest on the default stream, then the total */
        cudaStream_t side = NULL;
        CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
        CHECK_OK(kiln_sumsq_plan_partial(p, 2, 5, d + shift, side));
        CHECK_OK(kiln_sumsq_plan_partial(p, 0, 2, d + shift, NULL));
        CHECK_OK(kiln_sumsq_plan_partial(p, 5, NS, d + shift, NULL));
        CHECK_OK(kiln_cuda_sync());
        CHECK_OK(kiln_sumsq_plan_total(p, d_ss, NULL));
        CHECK_OK(kiln_cuda_sync());
        double sp = 0;
        CHECK_OK(kiln_cuda_copy(&sp, d_ss, sizeof sp, KILN_CUDA_D2H));
        CHECK_MSG(sp == ss[0], "shift %d: in pieces %.17g, at once %.17g", shift, sp, ss[0]);
        CHECK_ERR(kiln_sumsq_plan_partial(p, 3, NS + 1, d, NULL), "segments");
        cudaStreamDestroy(side);
    }
    kiln_sumsq_seg bad = {-1, 4, 0, 0};
    kiln_sumsq_plan *q = NULL;
    CHECK_ERR(kiln_sumsq_plan_create(&bad, 1, &q), "segment 0");
    kiln_sumsq_plan_free(p);
    kiln_cuda_free(d), kiln_cuda_free(d_ss);
    free(v), free(buf);
}
