/* exp(x) for float lanes: branch-free, so that `#pragma omp simd` loops calling it vectorise (see simd.h).
 *
 * x = n ln2 + r with n = round(x / ln2) and |r| <= ~ln2/2; e^r from its Taylor series to r^7 (the first
 * dropped term, r^8/8!, is < 5.2e-9 relative at |r| = ln2/2: a tenth of a float ulp), evaluated as four
 * pairs of terms and Horner in r² (a short dependency chain: softmax rows are only 50-257 long); 2^n put
 * into the exponent bits. ln2 is split in two (C1 has 9 significant bits, so n*C1 is exact for
 * |n| <= 2^15) so that r keeps its low bits. 2^n is applied as two factors 2^(n/2) 2^(n - n/2), each a
 * normal float, so the one rounding that matters happens in the last product: results in the subnormal
 * range come out rounded like any other, and overflow gives +inf there.
 *
 * Error against double exp rounded to float, checked once over every float in [-104, 89] (2.24e9
 * values): at most 1 ulp (counted as steps between neighbouring floats, subnormals included), 96.5%
 * exactly rounded; tests/test_vexp.c checks <= 2 ulp on every 97th float in each ISA variant.
 * x > ~88.72 gives +inf, x < ~-103.97 gives 0, exp(+inf) = +inf, exp(-inf) = 0, exp(nan) = nan. */
#ifndef KILN_NN_VEXP_H
#define KILN_NN_VEXP_H

#include <stdint.h>
#include <string.h>

#include "nn/simd.h"

KILN_SIMD_INLINE float kiln_vexpf(float x) {
    /* clamp so that n stays in [-150, 128]; written so that a NaN passes through both */
    x = x > 89.0f ? 89.0f : x;
    x = x < -104.0f ? -104.0f : x;
    /* adding 1.5 * 2^23 rounds x/ln2 to an integer, which lands in the low mantissa bits */
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    int32_t k = ti - 0x4B400000;
    float r = x - n * 0.693359375f;       /* C1: exact product, the subtraction nearly so */
    r = r - n * -2.12194440054690583e-4f; /* C2 = ln2 - C1 */
    /* pairs of terms in r, then Horner in r²: half the dependent steps of plain Horner, for short rows */
    float r2 = r * r;
    float p01 = 1.0f + r, p23 = 0.5f + r * (1.0f / 6), p45 = 1.0f / 24 + r * (1.0f / 120),
          p67 = 1.0f / 720 + r * (1.0f / 5040);
    float p = p01 + r2 * (p23 + r2 * (p45 + r2 * p67));
    int32_t k1 = k / 2, k2 = k - k1;
    /* unsigned shifts: for a nan, k is garbage (the product with p is nan anyway) */
    uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}

#endif
