/* Timings of the row-wise/pointwise ops at the benchmark model's shapes (hidden 2048, 16384 tokens per
 * micro-batch, vocabulary 50304, 8 query / 2 KV heads of 128, experts' width 2048): microseconds per call
 * and the bandwidth of the bytes each op must move, printed for docs/perf.md. Nothing here asserts on
 * time (the correctness tests are the other test_gpu_ops files); it checks only that every call succeeds. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

/* a device buffer of n floats (or bf16) holding a repeated block of random values in [-scale, scale) */
#define BLOCK 65536
static void *fill_dev(kiln_rng *rng, int64_t n, int bf16, float scale) {
    float *h = gt_rand(rng, BLOCK, scale);
    uint16_t hb[BLOCK];
    for (int i = 0; i < BLOCK; i++) hb[i] = kiln_f32_to_bf16(h[i]);
    const size_t es = bf16 ? 2 : 4;
    char *d = gt_dev((size_t)n * es);
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t k = n - i < BLOCK ? n - i : BLOCK;
        CHECK_OK(kiln_cuda_copy(d + (size_t)i * es, bf16 ? (void *)hb : (void *)h, (size_t)k * es, KILN_CUDA_H2D));
    }
    free(h);
    return d;
}

#define TIME(name, bytes, call)                                                                            \
    do {                                                                                                   \
        CHECK_OK(call);                                                                                    \
        CHECK_OK(kiln_cuda_sync());                                                                        \
        const int it_ = 5;                                                                                 \
        double t0_ = gt_now_s();                                                                              \
        for (int i_ = 0; i_ < it_; i_++) CHECK_OK(call);                                                   \
        CHECK_OK(kiln_cuda_sync());                                                                        \
        double us_ = (gt_now_s() - t0_) / it_ * 1e6;                                                          \
        printf("    %-34s %9.1f us  %7.0f GB/s\n", (name), us_, (double)(bytes) / (us_ * 1e3));             \
    } while (0)

/* the router's head as its two unfused ops (cuBLASLt, softmax.cu), beside kiln_router_head_forward_cuda */
static kiln_error *rh_unfused(float *lg, float *pr, const kiln_bf16 *a, const kiln_bf16 *w, int64_t n) {
    KILN_TRY(kiln_gemm_bf16_cuda(lg, 1, a, w, n, 17, 256, "NT", 0, NULL));
    return kiln_softmax_forward_cuda(pr, lg, n, 17, NULL);
}

/* linears over the same input x [n,in] whose weights are the row blocks of w (outs[i] rows each), outputs and
 * biases side by side (each output block contiguous, as separate tensors would be) */
static kiln_error *cca_proj_forward(kiln_bf16 *y, const kiln_bf16 *x, const kiln_bf16 *w, const kiln_bf16 *b,
                                    int64_t n, int64_t in, const int64_t *outs, int k) {
    for (int64_t i = 0, o = 0; i < k; o += outs[i++])
        KILN_TRY(kiln_linear_forward_cuda(y + n * o, x, w + o * in, b + o, n, in, outs[i], NULL));
    return NULL;
}
/* their backward as the model's: the first writes dx, the others add to it */
static kiln_error *cca_proj_backward(kiln_bf16 *dx, float *dw, float *db, const kiln_bf16 *dy, const kiln_bf16 *x,
                                     const kiln_bf16 *w, int64_t n, int64_t in, const int64_t *outs, int k) {
    for (int64_t i = 0, o = 0; i < k; o += outs[i++])
        KILN_TRY(kiln_linear_backward_ex_cuda(dx, dw + o * in, db + o, dy + n * o, x, w + o * in, n, in, outs[i],
                                              i ? 0 : KILN_LINEAR_DX_WRITE, NULL));
    return NULL;
}

/* the router backward's logit gradient as the model ran it before kiln_router_head_dlogits_cuda (tmp: 2 n*17 f32 of
 * scratch) */
static kiln_error *rh_dlogits_ops(kiln_bf16 *dl, float *tmp, const float *dgate, const int32_t *ch, const float *pr,
                                  int64_t n) {
    if (cudaMemsetAsync(tmp, 0, (size_t)(n * 17) * 4, 0) != cudaSuccess)
        return kiln_errorf(KILN_EIO, "memset");
    KILN_TRY(kiln_route_gate_backward_cuda(tmp, dgate, ch, n, 17, 1, NULL));
    if (cudaMemsetAsync(tmp + n * 17, 0, (size_t)(n * 17) * 4, 0) != cudaSuccess)
        return kiln_errorf(KILN_EIO, "memset");
    KILN_TRY(kiln_softmax_backward_cuda(tmp + n * 17, tmp, pr, n, 17, NULL));
    return kiln_f32_to_bf16_cuda(dl, tmp + n * 17, n * 17, NULL);
}

TEST(gpu_ops_timing_model_shapes) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 61);
    const int64_t N = 16384, H = 2048, V = 50304, NH = 8, KV = 2, D = 128, I = 2048, B = 4, T = 4096;
    const int64_t C = (NH + KV) * D;
    /* residual-stream ops */
    float *x = fill_dev(&rng, N * H, 0, 1.0f), *dxf = fill_dev(&rng, N * H, 0, 0.1f), *w = fill_dev(&rng, H, 0, 1.0f);
    float *bb = fill_dev(&rng, H, 0, 0.1f), *dwv = fill_dev(&rng, H, 0, 0.1f), *dbv = fill_dev(&rng, H, 0, 0.1f);
    float *yf = fill_dev(&rng, N * H, 0, 1.0f), *rstd = gt_dev((size_t)N * 4);
    kiln_bf16 *yb = fill_dev(&rng, N * H, 1, 1.0f), *dyb = fill_dev(&rng, N * H, 1, 1.0f);
    int64_t *ids_h = malloc((size_t)N * sizeof *ids_h);
    for (int64_t i = 0; i < N; i++) ids_h[i] = (int64_t)(kiln_rng_u64(&rng) % (uint64_t)V);
    int64_t *ids = gt_dev((size_t)N * sizeof *ids);
    CHECK_OK(kiln_cuda_copy(ids, ids_h, (size_t)N * sizeof *ids, KILN_CUDA_H2D));
    float *table = fill_dev(&rng, V * H, 0, 1.0f), *dtable = fill_dev(&rng, V * H, 0, 0.0f);
    TIME("embedding forward", N * H * 8.0, kiln_embedding_forward_cuda(yf, table, ids, N, H, NULL));
    /* bytes: dy read, each distinct id's row read and written */
    TIME("embedding backward (uniform ids)", N * H * 12.0, kiln_embedding_backward_cuda(dtable, yf, ids, N, H, -1, NULL));
    {
        /* ids as a text's (the [cuda] benchmark's corpus: its most frequent tokens take hundreds of the 16384
         * positions; one long chain of adds each): Zipf over 2048 ids, id k with weight 1/(k+1) */
        double hk = 0, cum = 0;
        for (int k = 0; k < 2048; k++) hk += 1.0 / (k + 1);
        int64_t *zid = malloc((size_t)N * sizeof *zid), distinct = 0, longest = 0;
        char seen[2048] = {0};
        int64_t cnt[2048] = {0};
        for (int64_t i = 0; i < N; i++) {
            double u = kiln_rng_uniform(&rng) * hk;
            int k = 0;
            for (cum = 1.0; cum < u && k < 2047; k++) cum += 1.0 / (k + 2);
            zid[i] = k, cnt[k]++;
            if (!seen[k]) seen[k] = 1, distinct++;
        }
        for (int k = 0; k < 2048; k++) longest = cnt[k] > longest ? cnt[k] : longest;
        printf("    (Zipf ids: %lld distinct, the most frequent at %lld positions)\n", (long long)distinct,
               (long long)longest);
        CHECK_OK(kiln_cuda_copy(ids, zid, (size_t)N * sizeof *zid, KILN_CUDA_H2D));
        TIME("embedding backward (Zipf ids)", N * H * 4.0 + distinct * H * 8.0,
             kiln_embedding_backward_cuda(dtable, yf, ids, N, H, -1, NULL));
        CHECK_OK(kiln_cuda_copy(ids, ids_h, (size_t)N * sizeof *ids, KILN_CUDA_H2D));
        free(zid);
    }
    TIME("rmsnorm forward", N * H * 6.0, kiln_rmsnorm_forward_cuda(yb, rstd, x, w, N, H, 1e-5f, NULL));
    TIME("rmsnorm backward (dx, dw)", N * H * 14.0,
         kiln_rmsnorm_backward_cuda(dxf, dwv, dyb, x, w, rstd, N, H, NULL));
    /* the router's norm: bf16 rows of 256 (x 2 read, y 2 written; backward x, dy read, dx written) */
    TIME("rmsnorm bf16 forward [N,256]", N * 256 * 4.0,
         kiln_rmsnorm_forward_bf16_cuda(yb, rstd, dyb, w, N, 256, 1e-5f, NULL));
    TIME("rmsnorm bf16 backward [N,256] (dx, dw)", N * 256 * 6.0,
         kiln_rmsnorm_backward_bf16_cuda(yb, dwv, dyb, dyb, w, rstd, N, 256, NULL));
    TIME("scale_shift forward (+=)", N * H * 12.0, kiln_scale_shift_forward_cuda(yf, x, bb, w, N, H, 1, NULL));
    TIME("scale_shift backward (dx, db, ds)", N * H * 16.0,
         kiln_scale_shift_backward_cuda(dxf, dbv, dwv, yf, x, bb, w, N, H, NULL));
    kiln_cuda_free(table), kiln_cuda_free(dtable);
    /* the model's fused residual joins (residual_norm.cu): forward join + norm with a bf16 first input (the
     * attention side) and an f32 one (the MLP side); backward of the attention join + norm + the MLP join's
     * res1 side; the MLP side's written dx */
    {
        float *res = fill_dev(&rng, N * H, 0, 1.0f), *dout = fill_dev(&rng, N * H, 0, 0.1f), *dn = gt_dev((size_t)(N * H) * 4);
        float *gv[7];
        for (int i = 0; i < 7; i++) gv[i] = fill_dev(&rng, H, 0, 0.0f);
        kiln_bf16 *ob = fill_dev(&rng, N * H, 1, 1.0f), *lnb = gt_dev((size_t)(N * H) * 2), *dob = gt_dev((size_t)(N * H) * 2);
        /* bytes each must move: a (2 or 4) + x 4 read, y 4 + ln 2 written */
        TIME("join + rmsnorm fwd (a bf16)", N * H * 12.0,
             kiln_residual_norm_forward_cuda(res, lnb, rstd, NULL, ob, bb, w, x, bb, w, w, N, H, 1e-5f, NULL));
        TIME("join + rmsnorm fwd (a f32)", N * H * 14.0,
             kiln_residual_norm_forward_cuda(yf, lnb, rstd, x, NULL, bb, w, res, bb, w, w, N, H, 1e-5f, NULL));
        kiln_residual_norm_bwd rp = {.y = res, .dln = dyb, .w = w, .rstd = rstd, .dw = gv[0], .dup = dout, .upb = bb,
                                     .ups = w, .dupb = gv[1], .dups = gv[2], .a = ob, .ab = bb, .as = w, .dab = gv[3],
                                     .das = gv[4], .da = dob, .x = x, .xb = bb, .xs = w, .dxb = gv[5], .dxs = gv[6],
                                     .dx = dn};
        /* bytes: dup 4, x 4, dln 2 (bf16) or 4 (f32, the model's), a 2 read; da 2, dx 4 written (y is recomputed
         * from a and x, not read) */
        TIME("join + rmsnorm bwd (both joins)", N * H * 18.0, kiln_residual_norm_backward_cuda(&rp, N, H, NULL));
        {
            kiln_residual_norm_bwd rf = rp;
            rf.dln = NULL, rf.dln_f32 = dxf; /* the model's: the f32 gradient the experts and r_down add into */
            TIME("join + rmsnorm bwd (dln f32)", N * H * 20.0, kiln_residual_norm_backward_cuda(&rf, N, H, NULL));
        }
        {
            /* the norm's backward with the join that made its input, in place (the model's ln1 + MLP join):
             * gin 4, dln 2, y 4, a 4 read; gout 4, da 4 written */
            float *da = gt_dev((size_t)(N * H) * 4);
            kiln_norm_join_bwd nj = {.gin = dn, .gout = dn, .dln = dyb, .y = res, .w = w, .rstd = rstd, .dw = gv[0],
                                     .a = yf, .ab = bb, .as = w, .dab = gv[1], .das = gv[2], .da = da};
            TIME("norm + join bwd (ln1 + MLP join)", N * H * 22.0, kiln_norm_join_backward_cuda(&nj, N, H, NULL));
            kiln_cuda_free(da);
        }
        TIME("scale_shift backward (dx written)", N * H * 12.0,
             kiln_scale_shift_backward_write_cuda(dn, dbv, dwv, dout, x, bb, w, N, H, NULL));
        kiln_cuda_free(res), kiln_cuda_free(dout), kiln_cuda_free(dn), kiln_cuda_free(ob), kiln_cuda_free(lnb);
        kiln_cuda_free(dob);
        for (int i = 0; i < 7; i++) kiln_cuda_free(gv[i]);
    }
    /* experts' activation: N slots (top-1), gu [N, 2I] */
    kiln_bf16 *gu = fill_dev(&rng, N * 2 * I, 1, 2.0f), *dgu = gt_dev((size_t)(N * 2 * I) * 2);
    TIME("swiglu forward", N * I * 6.0, kiln_swiglu_forward_cuda(yb, gu, N, I, NULL));
    TIME("swiglu backward", N * I * 10.0, kiln_swiglu_backward_cuda(dgu, dyb, gu, N, I, NULL));
    kiln_cuda_free(gu), kiln_cuda_free(dgu);
    /* router: GELU over [N, 256], softmax over [N, 17] */
    TIME("gelu forward [N,256]", N * 256 * 4.0, kiln_gelu_forward_cuda(yb, dyb, N * 256, NULL));
    TIME("softmax forward [N,17]", N * 17 * 8.0, kiln_softmax_forward_cuda(yf, x, N, 17, NULL));
    { /* the router's head, a2 [N,256] -> 17 classes, against its two unfused ops (bytes: a2 read, probs written;
       * the unfused pair also writes and reads the logits) */
        kiln_bf16 *w17 = fill_dev(&rng, 17 * 256, 1, 0.1f);
        float *lg = gt_dev((size_t)(N * 17) * 4), *pr = gt_dev((size_t)(N * 17) * 4);
        TIME("router head fwd (one pass)", N * 256 * 2.0 + N * 17 * 4.0,
             kiln_router_head_forward_cuda(NULL, pr, yb, w17, N, 256, 17, NULL));
        TIME("router head fwd (GEMM + softmax)", N * 256 * 2.0 + N * 17 * 12.0, rh_unfused(lg, pr, yb, w17, N));
        /* its backward's logit gradient: one pass, and the ops it replaced (two zeroings, the gate's gradient,
         * softmax.cu's backward, the bf16 cast); top-1 choices spread over the classes */
        int32_t *ch_h = malloc((size_t)N * sizeof *ch_h), *ch = gt_dev((size_t)N * sizeof *ch);
        for (int64_t i = 0; i < N; i++) ch_h[i] = (int32_t)(i % 17);
        CHECK_OK(kiln_cuda_copy(ch, ch_h, (size_t)N * sizeof *ch, KILN_CUDA_H2D));
        kiln_bf16 *dlb = gt_dev((size_t)(N * 17) * 2);
        TIME("router dlogits (one pass)", N * 17 * 6.0 + N * 8.0,
             kiln_router_head_dlogits_cuda(dlb, dxf, ch, pr, N, 17, 1, NULL));
        TIME("router dlogits (5 ops)", N * 17 * 30.0 + N * 8.0, rh_dlogits_ops(dlb, yf, dxf, ch, pr, N));
        kiln_cuda_free(dlb), kiln_cuda_free(ch), free(ch_h);
        kiln_cuda_free(w17), kiln_cuda_free(lg), kiln_cuda_free(pr);
    }
    /* CCA's four projections of ln1 (q 1024, k 256, the two value halves 128 each) as the model runs them, and
     * as one GEMM of 1536 outputs (what packing their weights would give; bytes: x, w, y once) */
    {
        const int64_t P = NH * D + KV * D + KV * D, outs[4] = {NH * D, KV * D, KV * D / 2, KV * D / 2};
        kiln_bf16 *pw = fill_dev(&rng, P * H, 1, 0.02f), *pb = fill_dev(&rng, P, 1, 0.02f), *py = fill_dev(&rng, N * P, 1, 1.0f);
        kiln_bf16 *pdy = fill_dev(&rng, N * P, 1, 0.1f), *pdx = fill_dev(&rng, N * H, 1, 0.0f);
        float *pdw = fill_dev(&rng, P * H, 0, 0.0f), *pdb = fill_dev(&rng, P, 0, 0.0f);
        const double fb = N * H * 2.0 + P * H * 2.0 + N * P * 2.0;
        TIME("q,k,vd,vc linears fwd (4 GEMMs)", fb, cca_proj_forward(py, yb, pw, pb, N, H, outs, 4));
        const int64_t one[1] = {P};
        TIME("q,k,vd,vc linears fwd (1 GEMM)", fb, cca_proj_forward(py, yb, pw, pb, N, H, one, 1));
        TIME("q,k,vd,vc linears bwd (4 GEMMs)", fb * 2, cca_proj_backward(pdx, pdw, pdb, pdy, yb, pw, N, H, outs, 4));
        TIME("q,k,vd,vc linears bwd (1 GEMM)", fb * 2, cca_proj_backward(pdx, pdw, pdb, pdy, yb, pw, N, H, one, 1));
        /* the value shift reading / writing the value halves where the packed GEMM puts them */
        kiln_bf16 *pv = fill_dev(&rng, N * KV * D, 1, 1.0f);
        const int64_t Kh = KV * D / 2, o = NH * D + KV * D;
        TIME("value shift fwd (packed layout)", N * Kh * 8.0,
             kiln_value_shift_forward_cuda(pv, py + o, py + o + Kh, NULL, B, T, Kh, P, NULL));
        TIME("value shift bwd (packed layout)", N * Kh * 8.0,
             kiln_value_shift_backward_cuda(pdy + o, pdy + o + Kh, NULL, pv, B, T, Kh, P, NULL));
        kiln_cuda_free(pv);
        kiln_cuda_free(pw), kiln_cuda_free(pb), kiln_cuda_free(py), kiln_cuda_free(pdy), kiln_cuda_free(pdx);
        kiln_cuda_free(pdw), kiln_cuda_free(pdb);
    }
    /* QK norm + RoPE on the query heads */
    {
        float invf[64];
        int64_t rot = kiln_rope_inv_freq(invf, D, 0.5, 10000.0);
        float *dinvf = gt_up_f32(invf, rot / 2), *inv = gt_dev((size_t)(N * NH) * 4), *temp = fill_dev(&rng, NH, 0, 1.0f);
        float *dtemp = fill_dev(&rng, NH, 0, 0.0f);
        TIME("qk_norm_rope forward (q)", N * NH * D * 4.0,
             kiln_qk_norm_rope_forward_cuda(yb, inv, dyb, temp, dinvf, B, T, NH, D, rot, 0, sqrtf((float)D),
                                            1.1920929e-07f, NULL));
        TIME("qk_norm_rope backward (q)", N * NH * D * 6.0,
             kiln_qk_norm_rope_backward_cuda(yb, dtemp, dyb, dyb, temp, inv, dinvf, B, T, NH, D, rot, 0,
                                             sqrtf((float)D), 1.1920929e-07f, NULL));
        kiln_cuda_free(dinvf), kiln_cuda_free(inv), kiln_cuda_free(temp), kiln_cuda_free(dtemp);
    }
    /* CCA convolutions over the packed q/k channels */
    {
        kiln_conv_shape cs = {B, T, C, NH + KV, 2, 2};
        const int64_t M = T + 1;
        kiln_bf16 *qk = yb, *conv = dyb, *dqk = gt_dev((size_t)(N * C) * 2);
        float *mid = gt_dev((size_t)(B * M * C) * 4), *dmid = gt_dev((size_t)(B * M * C) * 4);
        float *w0 = fill_dev(&rng, C * 2, 0, 0.5f), *b0 = fill_dev(&rng, C, 0, 0.1f), *w1 = fill_dev(&rng, C * D * 2, 0, 0.1f);
        float *b1 = fill_dev(&rng, C, 0, 0.1f), *g0 = fill_dev(&rng, C * 2, 0, 0.0f), *gb0 = fill_dev(&rng, C, 0, 0.0f);
        float *g1 = fill_dev(&rng, C * D * 2, 0, 0.0f), *gb1 = fill_dev(&rng, C, 0, 0.0f);
        /* the training path: convolutions + q/k coupling fused, bf16 tensor cores, bf16 mid */
        {
            kiln_bf16 *midb = gt_dev((size_t)(B * M * C) * 2), *qkp = gt_dev((size_t)(N * C) * 2);
            const int64_t nq = N * NH * D;
            TIME("cca_conv + couple fwd (fused)", N * C * 10.0,
                 kiln_cca_conv_couple_forward_cuda(qkp, qkp + nq, midb, qk, qk + nq, w0, b0, w1, b1, &cs, NH, KV, 0, 0, NULL));
            TIME("cca_conv + couple bwd (fused)", N * C * 20.0,
                 kiln_cca_conv_couple_backward_cuda(dqk, dqk + nq, g0, gb0, g1, gb1, dmid, NULL, conv, conv + nq, qk, qk + nq,
                                                    midb, w0, w1, &cs, NH, KV, 0, 0, NULL));
            TIME("  fused bwd without weight grads", N * C * 14.0,
                 kiln_cca_conv_couple_backward_cuda(dqk, dqk + nq, NULL, NULL, NULL, NULL, dmid, NULL, conv, conv + nq, qk,
                                                    qk + nq, midb, w0, w1, &cs, NH, KV, 0, 0, NULL));
            setenv("KILN_CCA_TILE", "64", 1); /* the 64 x 64 tiles, for comparison */
            TIME("cca_conv + couple fwd (64x64 tiles)", N * C * 10.0,
                 kiln_cca_conv_couple_forward_cuda(qkp, qkp + nq, midb, qk, qk + nq, w0, b0, w1, b1, &cs, NH, KV, 0, 0, NULL));
            TIME("cca_conv + couple bwd (64x64 tiles)", N * C * 20.0,
                 kiln_cca_conv_couple_backward_cuda(dqk, dqk + nq, g0, gb0, g1, gb1, dmid, NULL, conv, conv + nq, qk, qk + nq,
                                                    midb, w0, w1, &cs, NH, KV, 0, 0, NULL));
            unsetenv("KILN_CCA_TILE");
            kiln_cuda_free(midb), kiln_cuda_free(qkp);
        }
        setenv("KILN_CCA_CONV", "tensor", 1);
        TIME("cca_conv forward (tensor cores)", N * C * 12.0,
             kiln_cca_conv_forward_cuda(conv, mid, qk, NULL, w0, b0, w1, b1, &cs, NULL));
        TIME("cca_conv backward (tensor cores)", N * C * 20.0,
             kiln_cca_conv_backward_cuda(dqk, g0, gb0, g1, gb1, dmid, conv, qk, NULL, mid, w0, w1, &cs, NULL));
        setenv("KILN_CCA_CONV", "simt", 1);
        TIME("cca_conv forward", N * C * 12.0, kiln_cca_conv_forward_cuda(conv, mid, qk, NULL, w0, b0, w1, b1, &cs, NULL));
        TIME("cca_conv backward", N * C * 20.0,
             kiln_cca_conv_backward_cuda(dqk, g0, gb0, g1, gb1, dmid, conv, qk, NULL, mid, w0, w1, &cs, NULL));
        /* its parts: every call computes dmid (the grouped stage's input gradient) */
        TIME("  cca_conv backward: dmid + dx", N * C * 14.0,
             kiln_cca_conv_backward_cuda(dqk, NULL, NULL, NULL, NULL, dmid, conv, qk, NULL, mid, w0, w1, &cs, NULL));
        TIME("  cca_conv backward: dmid + dw1, db1", N * C * 14.0,
             kiln_cca_conv_backward_cuda(NULL, NULL, NULL, g1, gb1, dmid, conv, qk, NULL, mid, w0, w1, &cs, NULL));
        TIME("  cca_conv backward: dmid + dw0, db0", N * C * 14.0,
             kiln_cca_conv_backward_cuda(NULL, g0, gb0, NULL, NULL, dmid, conv, qk, NULL, mid, w0, w1, &cs, NULL));
        unsetenv("KILN_CCA_CONV");
        kiln_cuda_free(dqk), kiln_cuda_free(mid), kiln_cuda_free(dmid), kiln_cuda_free(w0), kiln_cuda_free(b0);
        kiln_cuda_free(w1), kiln_cuda_free(b1), kiln_cuda_free(g0), kiln_cuda_free(gb0), kiln_cuda_free(g1);
        kiln_cuda_free(gb1);
    }
    kiln_cuda_free(x), kiln_cuda_free(dxf), kiln_cuda_free(w), kiln_cuda_free(bb), kiln_cuda_free(dwv);
    kiln_cuda_free(dbv), kiln_cuda_free(yf), kiln_cuda_free(rstd), kiln_cuda_free(yb), kiln_cuda_free(dyb);
    /* the loss over [B*T, V] logits, in place */
    {
        kiln_bf16 *logits = fill_dev(&rng, N * V, 1, 4.0f);
        float *ltok = gt_dev((size_t)N * 4), *loss = gt_dev(4);
        /* bytes: the logits read once (2), the gradient written (2); the two-pass kernel reads them twice */
        TIME("cross_entropy loss only", N * V * 2.0, kiln_cross_entropy_cuda(NULL, ltok, loss, logits, ids, B, T, V, NULL));
        TIME("cross_entropy + dlogits in place", N * V * 4.0,
             kiln_cross_entropy_cuda(logits, ltok, loss, logits, ids, B, T, V, NULL));
        kiln_cuda_free(logits), kiln_cuda_free(ltok), kiln_cuda_free(loss);
    }
    /* the optimizers over 128M parameters */
    {
        const int64_t n = 16 * 2048 * 4096;
        kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .muon_momentum = 0.95};
        float *pw = fill_dev(&rng, n, 0, 0.1f), *pg = fill_dev(&rng, n, 0, 0.1f), *st = fill_dev(&rng, 2 * n, 0, 0.0f);
        kiln_bf16 *pwb = gt_dev((size_t)n * 2);
        kiln_opt_param p = {.numel = n, .kind = KILN_OPT_MUON, .mats = 16, .rows = 4096, .cols = 2048, .decay = 1};
        TIME("adamw step (+bf16 copy)", n * 30.0, kiln_adamw_step_cuda(pw, pg, st, n, &hp, 1e-3, 3, 1, pwb, NULL));
        TIME("muon momentum", n * 16.0, kiln_muon_momentum_cuda(st, st + n, pg, n, &hp, NULL));
        TIME("muon normalize (16 x 4096x2048)", n * 12.0, kiln_muon_normalize_cuda(st + n, &p, NULL));
        TIME("muon update (+bf16 copy)", n * 14.0, kiln_muon_update_cuda(pw, st + n, &p, &hp, 0.02, pwb, NULL));
        kiln_cuda_free(pw), kiln_cuda_free(pg), kiln_cuda_free(st), kiln_cuda_free(pwb);
    }
    kiln_cuda_free(ids);
    free(ids_h);
}
