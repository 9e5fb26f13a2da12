/* CPU code on float lanes, compiled once per x86 vector ISA and picked at run time.
 *
 * The build targets baseline x86-64 (SSE2), so the compiler cannot use AVX2 or AVX-512 in ordinary
 * functions. An op writes its row loop once, as an always-inline body whose loops carry
 * `#pragma omp simd` (vectorised at -O2 too, whatever the cost model), and KILN_SIMD_VARIANTS stamps it
 * into three functions compiled for AVX-512F, AVX2 and the baseline; kiln_simd_level() (simd.c) says
 * which one this CPU runs. Since kiln builds in ISO C (no FMA contraction), an elementwise body gives the
 * same bits on every variant; only reductions (sums over lanes) round differently. Other architectures
 * get the baseline body alone.
 *
 * A file using this is compiled with -fno-trapping-math (CMakeLists.txt lists it): with FP exceptions as
 * side effects, GCC keeps data-dependent selects (a clamp, a mask) as branches whose arms it may not
 * speculate, and vectorises such a loop for AVX-512 (masked lanes) only. */
#ifndef KILN_NN_SIMD_H
#define KILN_NN_SIMD_H

enum { KILN_SIMD_GENERIC = 0, KILN_SIMD_AVX2 = 1, KILN_SIMD_AVX512 = 2 };

/* The variant the ops run: the best the CPU supports, capped by KILN_SIMD (generic|avx2|avx512) in the
 * environment and by kiln_simd_set_isa (include/kiln/nn.h). */
int kiln_simd_level(void);

#define KILN_SIMD_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_SIMD_X86 1
/* name(params) calls body(args) in the variant this CPU runs */
#define KILN_SIMD_VARIANTS(name, params, args, body)                                                   \
    __attribute__((target("avx512f"))) static void name##_avx512 params { body args; }                 \
    __attribute__((target("avx2"))) static void name##_avx2 params { body args; }                      \
    static void name##_generic params { body args; }                                                   \
    static void name params {                                                                          \
        switch (kiln_simd_level()) {                                                                   \
        case KILN_SIMD_AVX512: name##_avx512 args; break;                                              \
        case KILN_SIMD_AVX2: name##_avx2 args; break;                                                  \
        default: name##_generic args;                                                                  \
        }                                                                                              \
    }
#else
#define KILN_SIMD_VARIANTS(name, params, args, body) \
    static void name params { body args; }
#endif

#endif
