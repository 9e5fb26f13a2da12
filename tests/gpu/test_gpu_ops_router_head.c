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
