/* dtype names/sizes and the 16-bit float conversions.
 *
 * The conversions work on bit patterns rather than float arithmetic so that
 * they are exact and independent of the FPU rounding mode and of -ffast-math.
 * They match numpy (float16) and torch (float16, bfloat16) bit for bit,
 * except for the payload of NaNs, which only stay NaN with the same sign.
 */
#include "kiln/dtype.h"

#include <string.h>

/* Indexed by kiln_dtype; names are the safetensors spellings. */
static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [KILN_DT_INVALID] = {"INVALID", 0},
    [KILN_DT_F64] = {"F64", 8},
    [KILN_DT_F32] = {"F32", 4},
    [KILN_DT_F16] = {"F16", 2},
    [KILN_DT_BF16] = {"BF16", 2},
    [KILN_DT_F8_E4M3] = {"F8_E4M3", 1},
    [KILN_DT_F8_E5M2] = {"F8_E5M2", 1},
    [KILN_DT_I64] = {"I64", 8},
    [KILN_DT_I32] = {"I32", 4},
    [KILN_DT_I16] = {"I16", 2},
    [KILN_DT_I8] = {"I8", 1},
    [KILN_DT_U64] = {"U64", 8},
    [KILN_DT_U32] = {"U32", 4},
    [KILN_DT_U16] = {"U16", 2},
    [KILN_DT_U8] = {"U8", 1},
    [KILN_DT_BOOL] = {"BOOL", 1},
};
#define N_DTYPES (sizeof dtype_info / sizeof dtype_info[0])

static int dtype_valid(kiln_dtype dt) { return dt > KILN_DT_INVALID && (size_t)dt < N_DTYPES; }

kiln_dtype kiln_dtype_from_name(const char *name) {
    if (!name) return KILN_DT_INVALID;
    for (size_t i = 1; i < N_DTYPES; i++)
        if (strcmp(name, dtype_info[i].name) == 0) return (kiln_dtype)i;
    return KILN_DT_INVALID;
}

const char *kiln_dtype_name(kiln_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].name : "INVALID"; }

size_t kiln_dtype_size(kiln_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].size : 0; }

/* ---- bit casts (memcpy is the defined way to reinterpret in C) ---- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- bfloat16: the top half of an IEEE f32 ---- */

float kiln_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        /* NaN: truncating could clear every mantissa bit that is set and turn
         * it into infinity, so force the quiet bit. */
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    /* Round to nearest, ties to even: add 0x7fff, plus 1 when the kept part is
     * odd, then truncate. Carries ripple into the exponent correctly, and the
     * largest finite floats round up to infinity, as they should. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- an f32 as bf16 + its low half (the GPU trainer's split master weights) ----
 * hi is f rounded to bf16 to nearest with ties toward zero, lo is f's low 16 bits. The nearest rounding only ever
 * keeps f's top half or adds one to it, and which it did follows from lo alone (lo > 0x8000: it added one) except at
 * an exact tie, where ties-to-even would need the lost bit: ties toward zero keep the top half, so (hi, lo) gives f
 * back exactly. */
void kiln_f32_split(float f, uint16_t *hi, uint16_t *lo) {
    const uint32_t u = f32_bits(f);
    const uint16_t top = (uint16_t)(u >> 16), low = (uint16_t)u;
    if ((u & 0x7fffffffu) > 0x7f800000u) *hi = (uint16_t)(top | 0x0040u); /* NaN: quiet, as kiln_f32_to_bf16 */
    else *hi = (uint16_t)(top + (low > 0x8000u)); /* carries into the exponent as they should; up to inf at the top */
    *lo = low;
}

float kiln_f32_join(uint16_t hi, uint16_t lo) {
    const int nan = (hi & 0x7f80u) == 0x7f80u && (hi & 0x007fu);
    const uint16_t top = (uint16_t)(nan ? hi : hi - (lo > 0x8000u)); /* a NaN comes back a NaN */
    return f32_from_bits((uint32_t)top << 16 | lo);
}

/* ---- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ---- */

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN: keep the payload */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign); /* +-0 */
        /* Subnormal: value = man * 2^-24. Shift the mantissa up until its
         * leading 1 reaches the implicit-bit position, lowering the exponent. */
        int e = -14;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        man &= 0x3ffu;
        return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (man << 13));
    }
    return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;

    if (exp == 0xff) {
        if (man == 0) return sign | 0x7c00u; /* inf */
        /* NaN: keep the top payload bits (as numpy does), but never let the
         * mantissa become zero, which would read as infinity. */
        uint16_t m = (uint16_t)(man >> 13);
        return sign | 0x7c00u | (m ? m : 1u);
    }

    int e = (int)exp - 127; /* unbiased; f32 subnormals give e = -127 */
    if (e > 15) return sign | 0x7c00u; /* too big even before rounding */

    if (e >= -14) {
        /* Normal half. Build exponent and mantissa side by side so a
         * rounding carry out of the mantissa bumps the exponent (and 65520
         * and up become infinity, 0x7c00, naturally). */
        uint32_t h = ((uint32_t)(e + 15) << 10) | (man >> 13);
        uint32_t rest = man & 0x1fffu; /* the 13 dropped bits */
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }

    /* Below 2^-25 everything rounds to zero (2^-25 itself is a tie, and ties
     * go to the even value, zero). f32 subnormals land here too. */
    if (e < -25) return sign;

    /* Subnormal half: value / 2^-24 = (man | implicit 1) * 2^(e+1), so shift
     * the 24-bit significand right by s = -(e+1) in [14, 24], rounding. A carry
     * into bit 10 gives 0x400, the smallest normal, which is correct. */
    uint32_t m = man | 0x800000u;
    int s = -(e + 1);
    uint32_t h = m >> s;
    uint32_t rest = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rest > half || (rest == half && (h & 1u))) h++;
    return sign | (uint16_t)h;
}
