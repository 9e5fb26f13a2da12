/* dtype names and the 16-bit float conversions.
 *
 * The library converts with bit manipulation; the references here are
 * computed differently, with double arithmetic (frexp/ldexp/nearbyint in the
 * default round-to-nearest-even mode), and, where the compiler has _Float16,
 * with the compiler's own conversions as a third opinion. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kiln/dtype.h"
#include "test.h"

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int h_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int bf_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* ---- references by arithmetic ---- */

static float ref_f16_to_f32(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

/* Nearest half by scaling into the integer range and rounding with
 * nearbyint (ties to even). NaN is not compared bitwise. */
static uint16_t ref_f32_to_f16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(f)) return sign | 0x7c00;
    if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* subnormal; 1024 = smallest normal */
    int k;
    frexp(a, &k);
    int E = k - 1; /* a in [2^E, 2^(E+1)) */
    if (E > 15) return sign | 0x7c00;
    double q = nearbyint(ldexp(a, 10 - E)); /* 11-bit significand, in [1024, 2048] */
    uint32_t h = ((uint32_t)(E + 15) << 10) + (uint32_t)(q - 1024);
    return sign | (uint16_t)(h > 0x7c00 ? 0x7c00 : h);
}

static uint16_t ref_f32_to_bf16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(f)) return sign | 0x7f80;
    if (a < 0x1p-126) return sign | (uint16_t)nearbyint(a * 0x1p133);
    int k;
    frexp(a, &k);
    int E = k - 1;
    double q = nearbyint(ldexp(a, 7 - E)); /* 8-bit significand, in [128, 256] */
    uint32_t h = ((uint32_t)(E + 127) << 7) + (uint32_t)(q - 128);
    return sign | (uint16_t)(h > 0x7f80 ? 0x7f80 : h);
}

/* ---- tests ---- */

TEST(dtype_names_and_sizes) {
    static const struct {
        const char *name;
        kiln_dtype dt;
        size_t size;
    } all[] = {{"F64", KILN_DT_F64, 8},       {"F32", KILN_DT_F32, 4},         {"F16", KILN_DT_F16, 2},
               {"BF16", KILN_DT_BF16, 2},     {"F8_E4M3", KILN_DT_F8_E4M3, 1}, {"F8_E5M2", KILN_DT_F8_E5M2, 1},
               {"I64", KILN_DT_I64, 8},       {"I32", KILN_DT_I32, 4},         {"I16", KILN_DT_I16, 2},
               {"I8", KILN_DT_I8, 1},         {"U64", KILN_DT_U64, 8},         {"U32", KILN_DT_U32, 4},
               {"U16", KILN_DT_U16, 2},       {"U8", KILN_DT_U8, 1},           {"BOOL", KILN_DT_BOOL, 1}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK_MSG(kiln_dtype_from_name(all[i].name) == all[i].dt, "from_name(%s)", all[i].name);
        CHECK_MSG(strcmp(kiln_dtype_name(all[i].dt), all[i].name) == 0, "name(%d)", (int)all[i].dt);
        CHECK_MSG(kiln_dtype_size(all[i].dt) == all[i].size, "size(%s)", all[i].name);
    }
    CHECK(kiln_dtype_from_name("F31") == KILN_DT_INVALID);
    CHECK(kiln_dtype_from_name("f32") == KILN_DT_INVALID); /* names are case-sensitive, like safetensors */
    CHECK(kiln_dtype_from_name("") == KILN_DT_INVALID);
    CHECK(kiln_dtype_from_name(NULL) == KILN_DT_INVALID);
    CHECK(kiln_dtype_size(KILN_DT_INVALID) == 0);
    CHECK(kiln_dtype_size((kiln_dtype)99) == 0);
    CHECK(strcmp(kiln_dtype_name((kiln_dtype)99), "INVALID") == 0);
}

TEST(bf16_round_to_nearest_even) {
    /* 1 + 2^-8 lies exactly between bf16 1.0 (0x3f80) and 1+2^-7 (0x3f81). */
    CHECK(kiln_f32_to_bf16(from_bits(0x3f808000)) == 0x3f80); /* tie, down to even */
    CHECK(kiln_f32_to_bf16(from_bits(0x3f818000)) == 0x3f82); /* tie, up to even */
    CHECK(kiln_f32_to_bf16(from_bits(0x3f808001)) == 0x3f81); /* just above the tie */
    CHECK(kiln_f32_to_bf16(from_bits(0x3f807fff)) == 0x3f80); /* just below */
    CHECK(kiln_f32_to_bf16(from_bits(0xbf818000)) == 0xbf82); /* sign does not matter */
    CHECK(kiln_f32_to_bf16(from_bits(0x3fffffff)) == 0x4000); /* carry into the exponent */
    CHECK(kiln_f32_to_bf16(from_bits(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to inf, as in torch */
    CHECK(kiln_f32_to_bf16(from_bits(0x7f7f7fff)) == 0x7f7f);
    CHECK(kiln_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(kiln_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(kiln_f32_to_bf16(0.0f) == 0x0000);
    CHECK(kiln_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(kiln_f32_to_bf16(from_bits(0x00008000)) == 0x0000); /* f32 subnormal tie -> 0 */
    CHECK(kiln_f32_to_bf16(from_bits(0x00018000)) == 0x0002);
    CHECK(kiln_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(kiln_bf16_to_f32(0xc040) == -3.0f);
}

/* The split master: (hi, lo) gives the f32 back bit for bit, and hi is the nearest bf16 (ties toward zero, so it
 * differs from kiln_f32_to_bf16 only at exact ties). Every hi for a spread of low halves, including the ties, the
 * carries into the exponent, subnormals, the top of the range and the specials. */
TEST(f32_split_join_exact) {
    static const uint16_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff, 0x1234, 0xc3a5};
    long bad_join = 0, bad_round = 0, ties = 0;
    for (uint32_t top = 0; top <= 0xffff; top++)
        for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++) {
            const uint32_t u = top << 16 | lows[j];
            const float f = from_bits(u);
            uint16_t hi = 0, lo = 0;
            kiln_f32_split(f, &hi, &lo);
            const float back = kiln_f32_join(hi, lo);
            if (isnan(f)) {
                bad_join += !isnan(back) || !bf_is_nan(hi);
                continue;
            }
            bad_join += bits(back) != u;
            const uint16_t rne = kiln_f32_to_bf16(f);
            if (lows[j] == 0x8000) { /* a tie: toward zero, the top half */
                ties += rne != hi;
                bad_round += hi != (uint16_t)top;
            } else {
                bad_round += hi != rne;
            }
        }
    CHECK_MSG(bad_join == 0, "%ld values not joined back bit for bit", bad_join);
    CHECK_MSG(bad_round == 0, "%ld values not rounded to the nearest bf16", bad_round);
    CHECK(ties > 0); /* ties to even and ties toward zero do differ (half of the ties) */
    CHECK(kiln_f32_join(0x7f80, 0x9000) == from_bits(0x7f7f9000)); /* the top finite values rounded up to inf */
    uint16_t hi, lo;
    kiln_f32_split(from_bits(0x3f808000), &hi, &lo);
    CHECK(hi == 0x3f80 && lo == 0x8000);
    kiln_f32_split(from_bits(0xbf818000), &hi, &lo); /* a tie whose even neighbour is away from zero */
    CHECK(hi == 0xbf81 && kiln_f32_to_bf16(from_bits(0xbf818000)) == 0xbf82);
}

TEST(bf16_nan_preserved) {
    /* A signalling NaN whose payload sits only in the low 16 bits would
     * become infinity if simply truncated. */
    uint32_t nans[] = {0x7f800001, 0x7fc00000, 0xffc00000, 0x7fffffff, 0xff800001, 0x7f810000};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = kiln_f32_to_bf16(from_bits(nans[i]));
        CHECK_MSG(bf_is_nan(h), "0x%08x -> 0x%04x is not NaN", nans[i], h);
        CHECK_MSG((h & 0x8000) == ((nans[i] >> 16) & 0x8000), "sign of 0x%08x lost", nans[i]);
        CHECK(isnan(kiln_bf16_to_f32(h)));
    }
}

TEST(bf16_all_values_and_random_vs_reference) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kiln_bf16_to_f32((uint16_t)h);
        /* bf16 -> f32 by arithmetic: the bf16 value is exact in f32. */
        int e = (h >> 7) & 0xff, m = h & 0x7f;
        double ref = e == 0xff ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
        if (h & 0x8000) ref = -ref;
        if (isnan(ref)) {
            CHECK_MSG(isnan(f), "bf16 0x%04x", h);
            continue;
        }
        CHECK_MSG(f == (float)ref && !signbit(f) == !signbit(ref), "bf16 0x%04x -> %g, want %g", h, f, ref);
        CHECK_MSG(kiln_f32_to_bf16(f) == h, "bf16 0x%04x does not round trip", h);
    }
    rng_state = 42;
    int bad = 0;
    for (int i = 0; i < 2000000 && bad < 10; i++) {
        float f = from_bits((uint32_t)rnd());
        uint16_t got = kiln_f32_to_bf16(f);
        if (isnan(f)) {
            if (!bf_is_nan(got)) bad++;
            continue;
        }
        uint16_t want = ref_f32_to_bf16(f);
        if (got != want) {
            bad++;
            test_fail(__FILE__, __LINE__, "f32 0x%08x -> bf16 0x%04x, want 0x%04x", bits(f), got, want);
        }
    }
    CHECK(bad == 0);
}

TEST(f16_all_values) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kiln_f16_to_f32((uint16_t)h), ref = ref_f16_to_f32((uint16_t)h);
        if (h_is_nan((uint16_t)h)) {
            CHECK_MSG(isnan(f), "f16 0x%04x", h);
            CHECK_MSG(h_is_nan(kiln_f32_to_f16(f)), "f16 NaN 0x%04x did not stay NaN", h);
            CHECK_MSG(!!signbit(f) == !!(h & 0x8000), "f16 0x%04x sign", h);
            continue;
        }
        CHECK_MSG(f == ref && !signbit(f) == !signbit(ref), "f16 0x%04x -> %g, want %g", h, f, ref);
        CHECK_MSG(kiln_f32_to_f16(f) == h, "f16 0x%04x -> %g -> 0x%04x", h, f, kiln_f32_to_f16(f));
#ifdef __FLT16_MAX__
        _Float16 c;
        uint16_t hh = (uint16_t)h;
        memcpy(&c, &hh, 2);
        CHECK_MSG((float)c == f, "f16 0x%04x: compiler says %g, we say %g", h, (float)c, f);
#endif
    }
}

TEST(f16_special_values) {
    CHECK(kiln_f32_to_f16(65504.0f) == 0x7bff);       /* max half */
    CHECK(kiln_f32_to_f16(65519.0f) == 0x7bff);       /* below the tie */
    CHECK(kiln_f32_to_f16(65520.0f) == 0x7c00);       /* tie rounds to "even" = inf */
    CHECK(kiln_f32_to_f16(1e10f) == 0x7c00);
    CHECK(kiln_f32_to_f16(-1e10f) == 0xfc00);
    CHECK(kiln_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(kiln_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(kiln_f32_to_f16(0x1p-24f) == 0x0001);       /* smallest subnormal */
    CHECK(kiln_f32_to_f16(0x1p-25f) == 0x0000);       /* tie -> even (zero) */
    CHECK(kiln_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(kiln_f32_to_f16(0x3p-25f) == 0x0002);       /* 1.5 units: tie -> 2 */
    CHECK(kiln_f32_to_f16(0x5p-25f) == 0x0002);       /* 2.5 units: tie -> 2 */
    CHECK(kiln_f32_to_f16(-0x1p-24f) == 0x8001);
    CHECK(kiln_f32_to_f16(0x1p-14f) == 0x0400);       /* smallest normal */
    CHECK(kiln_f32_to_f16(0x7ffp-25f) == 0x0400);     /* largest subnormal + half unit: tie -> even 0x400 */
    CHECK(kiln_f32_to_f16(1e-45f) == 0x0000);         /* f32 subnormal */
    CHECK(kiln_f32_to_f16(-1e-45f) == 0x8000);
    CHECK(kiln_f32_to_f16(0.0f) == 0x0000);
    CHECK(kiln_f32_to_f16(-0.0f) == 0x8000);
    CHECK(kiln_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); /* tie -> even */
    CHECK(kiln_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02);
    CHECK(kiln_f32_to_f16(1.0f) == 0x3c00);
    CHECK(kiln_f32_to_f16(-2.0f) == 0xc000);
    CHECK(h_is_nan(kiln_f32_to_f16(NAN)));
    CHECK(h_is_nan(kiln_f32_to_f16(from_bits(0x7f800001)))); /* payload only in dropped bits */
    CHECK(h_is_nan(kiln_f32_to_f16(from_bits(0xffc00000))) && (kiln_f32_to_f16(from_bits(0xffc00000)) & 0x8000));
    CHECK(kiln_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(kiln_f16_to_f32(0x03ff) == 0x3ffp-24f);
    CHECK(kiln_f16_to_f32(0x7c00) == INFINITY);
    CHECK(kiln_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(signbit(kiln_f16_to_f32(0x8000)));
}

TEST(f16_ties_between_every_pair_of_halves) {
    /* The exact midpoint of two neighbouring finite halves must round to the
     * one with an even mantissa; one f32 ulp either side must not tie. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bff && bad < 10; h++) {
        double lo = ref_f16_to_f32((uint16_t)h), hi = ref_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: halves have 11-bit significands */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        uint16_t got = kiln_f32_to_f16(mid), below = kiln_f32_to_f16(nextafterf(mid, 0.0f)),
                 above = kiln_f32_to_f16(nextafterf(mid, INFINITY));
        uint16_t ngot = kiln_f32_to_f16(-mid);
        if (got != even || below != h || above != h + 1 || ngot != (0x8000 | even)) {
            bad++;
            test_fail(__FILE__, __LINE__, "between 0x%04x and 0x%04x: tie->0x%04x below->0x%04x above->0x%04x", h,
                      h + 1, got, below, above);
        }
    }
    CHECK(bad == 0);
}

TEST(f16_random_vs_reference) {
    rng_state = 7;
    int bad = 0;
    for (int i = 0; i < 2000000 && bad < 10; i++) {
        uint32_t u = (uint32_t)rnd();
        /* Half the samples get an exponent near the half range (subnormals,
         * normals, overflow) where all the interesting rounding happens. */
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(127 - 28 + (int)(rnd() % 48)) << 23);
        float f = from_bits(u);
        uint16_t got = kiln_f32_to_f16(f);
        if (isnan(f)) {
            if (!h_is_nan(got)) bad++;
            continue;
        }
        uint16_t want = ref_f32_to_f16(f);
#ifdef __FLT16_MAX__
        _Float16 c = (_Float16)f;
        uint16_t cw;
        memcpy(&cw, &c, 2);
        if (cw != want) {
            bad++;
            test_fail(__FILE__, __LINE__, "references disagree on 0x%08x: 0x%04x vs 0x%04x", u, want, cw);
        }
#endif
        if (got != want) {
            bad++;
            test_fail(__FILE__, __LINE__, "f32 0x%08x (%g) -> f16 0x%04x, want 0x%04x", u, f, got, want);
        }
    }
    CHECK(bad == 0);
}
