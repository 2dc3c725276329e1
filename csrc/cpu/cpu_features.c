/* The default CPU level (cpu_features.h): the best supported one, except that avx512bf16 must earn its
 * place: vdpbf16ps (64 flops an instruction) has to give at least 1.5x the flop rate of a 512-bit fp32
 * FMA (32 flops), or the fp32 avx512 level is used. Measured once per process on the calling thread:
 * 16 independent accumulator chains of each instruction, the best of 5 alternating runs of 4096
 * iterations each (the first smla.build_info(), which runs it, took 0.4-0.5 ms on a 2-vCPU Xeon). */
#include "cpu_features.h"

#include <time.h>

const char *smla_cpu_isa_name(int isa)
{
    static const char *const names[] = {"portable", "avx2", "avx512", "avx512bf16"};
    return isa >= SMLA_ISA_PORTABLE && isa <= SMLA_ISA_AVX512BF16 ? names[isa] : "unknown";
}

#if SMLA_X86
#include <immintrin.h>

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHAINS 16
#define ITERS 4096

__attribute__((target(SMLA_TARGET_AVX512), noinline)) static double time_fma(float *sink)
{
    __m512 a[CHAINS];
    const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    const double t0 = seconds();
    for (int k = 0; k < ITERS; k++) {
#pragma GCC unroll 16
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    const double t = seconds() - t0;
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    *sink += _mm512_reduce_add_ps(s);
    return t;
}

__attribute__((target(SMLA_TARGET_AVX512BF16), noinline)) static double time_dpbf16(float *sink)
{
    __m512 a[CHAINS];
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    const double t0 = seconds();
    for (int k = 0; k < ITERS; k++) {
#pragma GCC unroll 16
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    }
    const double t = seconds() - t0;
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    *sink += _mm512_reduce_add_ps(s);
    return t;
}

/* vdpbf16ps flop rate over the fp32 FMA's (same instruction counts: 2x flops per instruction). */
static double dpbf16_speedup(void)
{
    float sink = 0.f;
    double t_fma = 1e30, t_dp = 1e30;
    for (int r = 0; r < 5; r++) {
        const double a = time_fma(&sink), b = time_dpbf16(&sink);
        if (a < t_fma) t_fma = a;
        if (b < t_dp) t_dp = b;
    }
    __asm__ volatile("" ::"x"(sink));
    return t_dp > 0 ? 2.0 * t_fma / t_dp : 0.0;
}
#endif

int smla_cpu_isa_default(void)
{
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (v >= 0) return v;
    v = smla_cpu_isa_supported();
#if SMLA_X86
    if (v == SMLA_ISA_AVX512BF16 && dpbf16_speedup() < 1.5) v = SMLA_ISA_AVX512;
#endif
    __atomic_store_n(&cached, v, __ATOMIC_RELEASE);
    return v;
}
