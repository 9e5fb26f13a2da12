/* exp over an array through the lane-wise kiln_vexpf (vexp.h), in the vector ISA this CPU runs: the
 * function the tests check kiln_vexpf with, in every variant. */
#include "nn/vexp.h"

#include "kiln/nn.h"

KILN_SIMD_INLINE void exp_body(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = kiln_vexpf(x[i]);
}

KILN_SIMD_VARIANTS(exp_run, (float *y, const float *x, int64_t n), (y, x, n), exp_body)

void kiln_exp_forward(float *y, const float *x, int64_t n) { exp_run(y, x, n); }
