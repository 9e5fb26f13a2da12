/* The lane-wise exp (src/nn/vexp.h) and quick_gelu (src/nn/quick_gelu.c) in every vector ISA this CPU
 * has: exp within 2 ulp of the correctly rounded result (double exp rounded to float) and of libm's expf
 * over the whole float range that does not round to 0 or overflow, subnormal results included (ulps
 * counted as steps between neighbouring floats); the edges (overflow to +inf, underflow to 0), inf and
 * nan; the same bits from every ISA variant (elementwise, no FMA contraction in kiln's build); lengths
 * and offsets that leave partial vectors. quick_gelu against a double reference with and without bias,
 * in place, large |x| and nan. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/nn.h"
#include "kiln/rng.h"
#include "test.h"

static const char *const isas[] = {"generic", "avx2", "avx512"};

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* distance in representable floats between two finite non-negative floats */
static int64_t ulps(float a, float b) { return llabs((int64_t)bits(a) - (int64_t)bits(b)); }

/* x: every 97th float of [-104, 89] by bit pattern (~23 million values), in chunks */
TEST(vexp_within_2ulp_of_exp_over_the_range) {
    const int64_t chunk = 1 << 16;
    float *x = malloc(sizeof(float) * chunk), *y = malloc(sizeof(float) * chunk);
    for (int ii = 0; ii < 3; ii++) {
        if (kiln_simd_set_isa(isas[ii])) continue; /* not on this CPU */
        int64_t worst = 0, worst_libm = 0, count = 0;
        float worst_x = 0;
        for (int side = 0; side < 2; side++) {
            uint32_t hi = bits(side ? 104.0f : 89.0f), sign = side ? 0x80000000u : 0;
            for (uint32_t u = 0; u <= hi;) {
                int64_t n = 0;
                for (; n < chunk && u <= hi; n++, u += 97) x[n] = from_bits(u | sign);
                kiln_exp_forward(y, x, n);
                for (int64_t i = 0; i < n; i++) {
                    float want = (float)exp((double)x[i]);
                    int64_t d = ulps(y[i], want), dl = ulps(y[i], expf(x[i]));
                    if (d > worst) worst = d, worst_x = x[i];
                    if (dl > worst_libm) worst_libm = dl;
                }
                count += n;
            }
        }
        CHECK_MSG(worst <= 2, "%s: exp(%.9g) off by %lld ulp (of %lld values)", isas[ii], worst_x, (long long)worst,
                  (long long)count);
        CHECK_MSG(worst_libm <= 2, "%s: %lld ulp from libm's expf", isas[ii], (long long)worst_libm);
        printf("    %s: %lld values, max %lld ulp vs exp, %lld vs expf\n", isas[ii], (long long)count, (long long)worst,
               (long long)worst_libm);
    }
    kiln_simd_set_isa(NULL);
    free(x), free(y);
}

TEST(vexp_edges_inf_nan) {
    float x[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.72f, 88.7228394f, 88.73f, 89.0f, 100.0f, 1e30f, FLT_MAX, INFINITY,
                 -87.3f, -100.0f, -103.9f, -103.98f, -104.0f, -200.0f, -1e30f, -FLT_MAX, -INFINITY, NAN, -NAN,
                 1e-30f, -1e-30f, 0.34657359f, -0.34657359f};
    int n = (int)(sizeof x / sizeof x[0]);
    float y[32];
    for (int ii = 0; ii < 3; ii++) {
        if (kiln_simd_set_isa(isas[ii])) continue;
        kiln_exp_forward(y, x, n);
        for (int i = 0; i < n; i++) {
            float want = (float)exp((double)x[i]);
            if (isnan(x[i])) CHECK_MSG(isnan(y[i]), "%s: exp(nan) = %g", isas[ii], y[i]);
            else if (isinf(want)) CHECK_MSG(isinf(y[i]) && y[i] > 0, "%s: exp(%g) = %g, want +inf", isas[ii], x[i], y[i]);
            else CHECK_MSG(ulps(y[i], want) <= 2, "%s: exp(%.9g) = %.9g, want %.9g", isas[ii], x[i], y[i], want);
        }
        CHECK(y[0] == 1.0f && y[1] == 1.0f);
    }
    kiln_simd_set_isa(NULL);
}

/* every ISA variant gives the same bits, for lengths and offsets that leave partial vectors */
TEST(vexp_same_bits_in_every_isa) {
    int64_t cap = 200;
    float *x = malloc(sizeof(float) * cap), *ref = malloc(sizeof(float) * cap), *y = malloc(sizeof(float) * cap);
    kiln_rng r;
    kiln_rng_seed(&r, 5);
    for (int64_t i = 0; i < cap; i++) x[i] = (float)(40 * kiln_rng_normal(&r));
    for (int64_t n = 1; n < 70; n += 3)
        for (int64_t off = 0; off < 5; off++) {
            for (int64_t i = 0; i < n; i++) ref[i] = expf(x[off + i]);
            for (int ii = 0; ii < 3; ii++) {
                if (kiln_simd_set_isa(isas[ii])) continue;
                for (int64_t i = 0; i < cap; i++) y[i] = -1.0f;
                kiln_exp_forward(y + off, x + off, n);
                for (int64_t i = 0; i < n; i++) {
                    if (ii == 0) ref[i] = y[off + i];
                    CHECK_MSG(bits(y[off + i]) == bits(ref[i]), "%s: n %lld off %lld: element %lld differs from generic",
                              isas[ii], (long long)n, (long long)off, (long long)i);
                }
                CHECK_MSG(y[off + n] == -1.0f && (off == 0 || y[off - 1] == -1.0f), "%s: wrote outside [off, off+n)",
                          isas[ii]);
            }
        }
    kiln_simd_set_isa(NULL);
    free(x), free(ref), free(y);
}

/* torch's x * sigmoid(1.702 x) on a float tensor: 1.702 x is rounded to float (the scalar too), the rest
 * here in double. The float product alone moves the result by up to |1.702 x| * 2^-24, relative, for
 * negative x, so the reference takes it as the op does. */
static double qgelu_ref(float v) { return v / (1.0 + exp((double)(-1.702f * v))); }

TEST(quick_gelu_matches_float64) {
    int64_t n = 9, m = 301; /* rows on threads, partial vectors at the end of each row */
    float *x = malloc(sizeof(float) * n * m), *b = malloc(sizeof(float) * m), *y = malloc(sizeof(float) * n * m);
    kiln_rng r;
    kiln_rng_seed(&r, 7);
    for (int64_t i = 0; i < n * m; i++) x[i] = (float)(4 * kiln_rng_normal(&r));
    x[3] = 100.0f, x[4] = -100.0f, x[5] = -1e30f, x[6] = 60.0f, x[7] = -60.0f, x[8] = 0.0f;
    for (int64_t j = 0; j < m; j++) b[j] = (float)(0.5 * kiln_rng_normal(&r));
    b[3] = b[4] = b[5] = b[6] = b[7] = b[8] = 0.0f;
    for (int ii = 0; ii < 3; ii++) {
        if (kiln_simd_set_isa(isas[ii])) continue;
        for (int withb = 0; withb < 2; withb++) {
            kiln_quick_gelu_forward(y, x, withb ? b : NULL, n, m);
            double worst = 0;
            for (int64_t i = 0; i < n * m; i++) {
                float v = x[i] + (withb ? b[i % m] : 0.0f); /* the input as rounded to float */
                double want = qgelu_ref(v), err = fabs(y[i] - want) / fmax(fabs(want), 1e-30);
                if (want == 0) err = fabs(y[i]); /* -1e30 and -100: the limit, -0 */
                if (!(err <= worst)) worst = err;
            }
            /* exp within 2 ulp, 1 + e and the division rounded */
            CHECK_MSG(worst < 5e-7, "%s, bias %d: relative error %g", isas[ii], withb, worst);
        }
        /* in place gives the same as out of place */
        float *z = malloc(sizeof(float) * n * m);
        memcpy(z, x, sizeof(float) * n * m);
        kiln_quick_gelu_forward(y, x, b, n, m);
        kiln_quick_gelu_forward(z, z, b, n, m);
        CHECK(memcmp(y, z, sizeof(float) * n * m) == 0);
        free(z);
    }
    float nx[3] = {NAN, INFINITY, -INFINITY}, ny[3];
    kiln_quick_gelu_forward(ny, nx, NULL, 1, 3);
    CHECK(isnan(ny[0]));
    CHECK(isinf(ny[1]) && ny[1] > 0);
    CHECK(isnan(ny[2]) || ny[2] == 0.0f); /* -inf / inf: nan, as x * sigmoid(1.702 x) = -inf * 0 in torch */
    kiln_simd_set_isa(NULL);
    free(x), free(b), free(y);
}

TEST(simd_isa_choice) {
    const char *best = kiln_simd_isa();
    CHECK(!strcmp(best, "generic") || !strcmp(best, "avx2") || !strcmp(best, "avx512"));
    CHECK(kiln_simd_set_isa("generic") == 0);
    CHECK(!strcmp(kiln_simd_isa(), "generic"));
    CHECK(kiln_simd_set_isa("sse9") == -1);
    CHECK(kiln_simd_set_isa(NULL) == 0);
}
