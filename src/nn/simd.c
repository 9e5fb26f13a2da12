/* Which vector ISA the lane-wise ops run (see simd.h): the CPU's best, capped by KILN_SIMD or by
 * kiln_simd_set_isa. */
#include "nn/simd.h"

#include <stdlib.h>
#include <string.h>

#include "kiln/nn.h"

static const char *const names[] = {"generic", "avx2", "avx512"};

static int cpu_level(void) {
#ifdef KILN_SIMD_X86
    /* __builtin_cpu_supports also checks that the OS saves the wide registers */
    if (__builtin_cpu_supports("avx512f")) return KILN_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2")) return KILN_SIMD_AVX2;
#endif
    return KILN_SIMD_GENERIC;
}

static int level_of(const char *name) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

/* -1: not chosen yet. Written once by the first caller (every thread computes the same value), or by
 * kiln_simd_set_isa outside parallel work. */
static int level = -1;

int kiln_simd_level(void) {
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = cpu_level();
        const char *env = getenv("KILN_SIMD");
        int cap = env && *env ? level_of(env) : -1;
        if (cap >= 0 && cap < l) l = cap;
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
}

const char *kiln_simd_isa(void) { return names[kiln_simd_level()]; }

int kiln_simd_set_isa(const char *isa) {
    int l = isa ? level_of(isa) : cpu_level();
    if (l < 0 || l > cpu_level()) return -1;
    __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    return 0;
}
