/* bf16 <-> f32 on the device equals the host's conversion bit for bit (round to nearest even). */
#include "gpu_testutil.h"

TEST(gpu_convert_bf16_roundtrip) {
    kiln_rng rng;
    kiln_rng_seed(&rng, 1);
    const int64_t n = 100003;
    float *x = gt_rand(&rng, n, 1000.0f);
    float *dx = gt_up_f32(x, n);
    kiln_bf16 *db = gt_dev((size_t)n * 2);
    float *dy = gt_dev((size_t)n * 4);
    CHECK_OK(kiln_f32_to_bf16_cuda(db, dx, n, NULL));
    CHECK_OK(kiln_bf16_to_f32_cuda(dy, db, n, NULL));
    float *y = gt_down_f32(dy, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += y[i] != kiln_bf16_to_f32(kiln_f32_to_bf16(x[i]));
    CHECK_MSG(bad == 0, "%lld of %lld values differ from the host's rounding", (long long)bad, (long long)n);
    kiln_cuda_free(dx), kiln_cuda_free(db), kiln_cuda_free(dy);
    free(x), free(y);
}
