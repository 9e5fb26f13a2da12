/* Helpers of the GPU tests (kiln_gpu_tests, run on the GPU machine by tests/gpu/run.sh): random inputs
 * made on the host, rounded to bf16 where the device reads bf16 (so the CPU reference sees the same
 * numbers), uploaded; results downloaded and compared with the CPU reference (src/nn) under a stated
 * tolerance: max |gpu - ref| / max(max |ref|, tiny) per tensor. */
#ifndef KILN_GPU_TESTUTIL_H
#define KILN_GPU_TESTUTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kiln/cuda.h"
#include "kiln/cuda_ops.h"
#include "kiln/dtype.h"
#include "kiln/rng.h"
#include "test.h"

/* n uniform values in [-scale, scale) from rng */
/* monotonic seconds, for the timings the GPU tests print (never assert) */
static inline double gt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline float *gt_rand(kiln_rng *rng, int64_t n, float scale) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(kiln_rng_uniform(rng) * 2.0 - 1.0) * scale;
    return x;
}
/* round every value to bf16 in place (the device's inputs) */
static inline void gt_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(x[i]));
}
static inline void *gt_dev(size_t bytes) {
    void *p = NULL;
    CHECK_OK(kiln_cuda_alloc(&p, bytes));
    return p;
}
static inline float *gt_up_f32(const float *x, int64_t n) {
    float *d = gt_dev((size_t)n * sizeof *d);
    CHECK_OK(kiln_cuda_copy(d, x, (size_t)n * sizeof *x, KILN_CUDA_H2D));
    return d;
}
static inline kiln_bf16 *gt_up_bf16(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(x[i]);
    kiln_bf16 *d = gt_dev((size_t)n * 2);
    CHECK_OK(kiln_cuda_copy(d, h, (size_t)n * 2, KILN_CUDA_H2D));
    free(h);
    return d;
}
static inline float *gt_down_f32(const float *d, int64_t n) {
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(h, d, (size_t)n * sizeof *h, KILN_CUDA_D2H));
    return h;
}
static inline float *gt_down_bf16(const kiln_bf16 *d, int64_t n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    CHECK_OK(kiln_cuda_sync());
    CHECK_OK(kiln_cuda_copy(h, d, (size_t)n * 2, KILN_CUDA_D2H));
    for (int64_t i = 0; i < n; i++) f[i] = kiln_bf16_to_f32(h[i]);
    free(h);
    return f;
}
/* max |a - b| / max |b| (b the reference) */
static inline double gt_relerr(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = a[i] - (double)b[i];
        if (d != d) return INFINITY;
        num = fabs(d) > num ? fabs(d) : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return num / (den > 1e-30 ? den : 1e-30);
}
#define GT_CLOSE(name, got, ref, n, tol)                                                                   \
    do {                                                                                                   \
        double gt_e_ = gt_relerr((got), (ref), (n));                                                       \
        CHECK_MSG(gt_e_ <= (tol), "%s: relative error %.3g > %.3g", (name), gt_e_, (double)(tol));         \
        printf("    %-28s rel err %.3g (tol %.3g)\n", (name), gt_e_, (double)(tol));                        \
    } while (0)

#endif
