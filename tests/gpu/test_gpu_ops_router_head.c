/* The router's head on the device (kiln_router_head_forward_cuda) against the CPU: kiln_linear_forward +
 * kiln_softmax_forward on the bf16 inputs. Tolerances (max |gpu - ref| / max |ref|): logits and probabilities 1e-5
 * (f32 sums of r exact products, in another order). Also: the probabilities bit for bit softmax.cu's on the
 * device's own logits, and the same bits without the logits. Shapes: the model's (16384 tokens, r 256, 17
 * classes), a token tail, r not a multiple of 256, 32 classes, and the shapes the one-pass kernel leaves to the
 * GEMM and softmax.cu (33 classes, r not a multiple of 8). */
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

TEST(gpu_ops_router_head) {
    static const struct {
        int64_t n, r, e;
    } shapes[] = {{16384, 256, 17}, {999, 256, 17}, {37, 128, 9}, {65, 264, 32}, {10, 256, 33}, {50, 12, 5}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 61);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t n = shapes[si].n, r = shapes[si].r, e = shapes[si].e, ne = n * e, nr = n * r;
        printf("  n=%lld r=%lld classes=%lld\n", (long long)n, (long long)r, (long long)e);
        float *a = gt_rand(&rng, nr, 2.0f), *w = gt_rand(&rng, e * r, 0.1f);
        gt_round_bf16(a, nr), gt_round_bf16(w, e * r);
        float *lg = malloc((size_t)ne * 4), *pr = malloc((size_t)ne * 4);
        kiln_linear_forward(lg, a, w, NULL, n, r, e);
        kiln_softmax_forward(pr, lg, n, e);
        kiln_bf16 *ga = gt_up_bf16(a, nr), *gw = gt_up_bf16(w, e * r);
        float *glg = gt_dev((size_t)ne * 4), *gpr = gt_dev((size_t)ne * 4), *gpr2 = gt_dev((size_t)ne * 4);
        CHECK_OK(kiln_router_head_forward_cuda(glg, gpr, ga, gw, n, r, e, NULL));
        CHECK_OK(kiln_softmax_forward_cuda(gpr2, glg, n, e, NULL));
        float *hlg = gt_down_f32(glg, ne), *hpr = gt_down_f32(gpr, ne), *hpr2 = gt_down_f32(gpr2, ne);
        GT_CLOSE("router head logits", hlg, lg, ne, 1e-5);
        GT_CLOSE("router head probs", hpr, pr, ne, 1e-5);
        CHECK_MSG(!memcmp(hpr, hpr2, (size_t)ne * 4), "router head probs differ from softmax.cu's on the same logits");
        CHECK_OK(kiln_router_head_forward_cuda(NULL, gpr2, ga, gw, n, r, e, NULL)); /* without the logits */
        float *rpr = gt_down_f32(gpr2, ne);
        CHECK_MSG(!memcmp(rpr, hpr, (size_t)ne * 4), "router head probs differ without the logits");
        kiln_cuda_free(ga), kiln_cuda_free(gw), kiln_cuda_free(glg), kiln_cuda_free(gpr), kiln_cuda_free(gpr2);
        free(a), free(w), free(lg), free(pr), free(hlg), free(hpr), free(hpr2), free(rpr);
    }
    /* a missing argument is an error naming the op */
    CHECK_ERR(kiln_router_head_forward_cuda(NULL, NULL, NULL, NULL, 4, 8, 2, NULL), "router head forward");
}

/* The logits' gradient in one pass (kiln_router_head_dlogits_cuda) against the ops it replaces on the device (the
 * gate's gradient onto zeroed dprobs, softmax.cu's backward onto zeros, the bf16 cast): the same bits; and against
 * the CPU's kiln_softmax_backward at bf16's tolerance (5e-3: one rounding). Shapes: the model's (16384 tokens, 17
 * classes, top-1), top-2 with a token tail, 9 classes, and 33 classes (past a warp: the three ops). Choices cover
 * the skip class (no gradient) and distinct classes a token. */
TEST(gpu_ops_router_head_dlogits) {
    static const struct {
        int64_t n, e, top;
    } shapes[] = {{16384, 17, 1}, {999, 17, 2}, {37, 9, 1}, {50, 33, 3}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 62);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t n = shapes[si].n, e = shapes[si].e, top = shapes[si].top, ne = n * e, nk = n * top;
        printf("  n=%lld classes=%lld top_k=%lld\n", (long long)n, (long long)e, (long long)top);
        float *lg = gt_rand(&rng, ne, 3.0f), *pr = malloc((size_t)ne * 4), *dgate = gt_rand(&rng, nk, 1.0f);
        kiln_softmax_forward(pr, lg, n, e);
        int32_t *choice = malloc((size_t)nk * sizeof *choice);
        for (int64_t t = 0; t < n; t++) { /* top distinct classes from a random start: the skip class (e-1) too */
            const int64_t c0 = (int64_t)(kiln_rng_u64(&rng) % (uint64_t)e);
            for (int64_t k = 0; k < top; k++) choice[t * top + k] = (int32_t)((c0 + k) % e);
        }
        float *dprobs = calloc((size_t)ne, 4), *ref = calloc((size_t)ne, 4), *zeros = calloc((size_t)(2 * ne), 4);
        for (int64_t i = 0; i < nk; i++)
            if (choice[i] < e - 1) dprobs[(i / top) * e + choice[i]] += dgate[i];
        kiln_softmax_backward(ref, dprobs, pr, n, e);
        float *gpr = gt_up_f32(pr, ne), *gdg = gt_up_f32(dgate, nk), *gtmp = gt_up_f32(zeros, 2 * ne);
        int32_t *gch = gt_dev((size_t)nk * sizeof *gch);
        CHECK_OK(kiln_cuda_copy(gch, choice, (size_t)nk * sizeof *choice, KILN_CUDA_H2D));
        kiln_bf16 *gd1 = gt_dev((size_t)ne * 2), *gd2 = gt_dev((size_t)ne * 2);
        CHECK_OK(kiln_router_head_dlogits_cuda(gd1, gdg, gch, gpr, n, e, top, NULL));
        CHECK_OK(kiln_route_gate_backward_cuda(gtmp, gdg, gch, n, e, top, NULL));
        CHECK_OK(kiln_softmax_backward_cuda(gtmp + ne, gtmp, gpr, n, e, NULL));
        CHECK_OK(kiln_f32_to_bf16_cuda(gd2, gtmp + ne, ne, NULL));
        float *h1 = gt_down_bf16(gd1, ne), *h2 = gt_down_bf16(gd2, ne);
        GT_CLOSE("router dlogits", h1, ref, ne, 5e-3);
        CHECK_MSG(!memcmp(h1, h2, (size_t)ne * 4), "router dlogits differ from the three ops'");
        kiln_cuda_free(gpr), kiln_cuda_free(gdg), kiln_cuda_free(gtmp), kiln_cuda_free(gch), kiln_cuda_free(gd1);
        kiln_cuda_free(gd2);
        free(lg), free(pr), free(dgate), free(choice), free(dprobs), free(ref), free(zeros), free(h1), free(h2);
    }
    CHECK_ERR(kiln_router_head_dlogits_cuda((kiln_bf16 *)16, (const float *)16, (const int32_t *)16, (const float *)16, 4,
                                            1, 1, NULL),
              "router head dlogits");
}
