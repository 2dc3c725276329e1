/* Run-time choice of the CPU kernels' instruction set. Each fast kernel is compiled once per level
 * with __attribute__((target(...))) (or a #pragma GCC target region) and the op picks one per call:
 *
 *   SMLA_ISA_PORTABLE     plain C (GCC vector extensions at the baseline ISA), any CPU
 *   SMLA_ISA_AVX2         AVX2 + FMA + F16C (x86-64-v3)
 *   SMLA_ISA_AVX512       AVX-512F (+ the above)
 *   SMLA_ISA_AVX512BF16   AVX-512F + AVX512_BF16 (vdpbf16ps for the attention scores)
 *
 * The default is the best level the CPU supports, except that avx512bf16 is taken only where
 * vdpbf16ps gives at least 1.5x the flop rate of an fp32 FMA (measured once per process, well under a
 * millisecond, cpu_features.c): its only use is the attention scores, and where the instruction is slow
 * (benchmarks/bench_cpu.py measured a quarter of the FMA's instruction rate on one Xeon) the fp32 level
 * is faster there (benchmarks/README.md, CPU section).
 * The environment variable SMLA_CPU_ISA=avx512bf16|avx512|avx2|portable forces a level (the binding
 * reads it on every call, under the GIL, csrc/python/settings.c, and passes the level in params.run, so a test
 * can switch paths inside one process); a level the CPU lacks falls back to the best one below it, and
 * an unknown value raises ValueError. The levels nest: each one's CPU test includes the one below it.
 * Test hook: SMLA_CPU_ISA=avx2-emulated-bf16 runs level avx2, except that the attention takes the
 * avx512bf16 level's code with vdpbf16ps emulated (run.emulated_bf16, tests/test_cpu_paths.py). */
#ifndef SMLA_CPU_FEATURES_H
#define SMLA_CPU_FEATURES_H

enum { SMLA_ISA_PORTABLE = 0, SMLA_ISA_AVX2 = 1, SMLA_ISA_AVX512 = 2, SMLA_ISA_AVX512BF16 = 3 };

#if defined(__x86_64__) && defined(__GNUC__)
#define SMLA_X86 1
/* Target strings of the levels, for __attribute__((target(...))) and #pragma GCC target. */
#define SMLA_TARGET_AVX2 "avx2,fma,f16c"
#define SMLA_TARGET_AVX512 "avx512f,avx2,fma,f16c"
#define SMLA_TARGET_AVX512BF16 "avx512f,avx512bw,avx512bf16,avx2,fma,f16c"
#else
#define SMLA_X86 0
#endif

/* The best level this CPU (and OS: libgcc checks that the vector state is enabled) supports. */
static inline int smla_cpu_isa_supported(void)
{
#if SMLA_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return SMLA_ISA_PORTABLE;
    if (!__builtin_cpu_supports("avx512f")) return SMLA_ISA_AVX2;
    if (!(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16"))) return SMLA_ISA_AVX512;
    return SMLA_ISA_AVX512BF16;
#else
    return SMLA_ISA_PORTABLE;
#endif
}

/* The default level (see above; cpu_features.c) and a level's name. */
int smla_cpu_isa_default(void);
const char *smla_cpu_isa_name(int isa);

#endif /* SMLA_CPU_FEATURES_H */
