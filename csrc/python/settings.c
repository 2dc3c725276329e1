/* The environment switches, read and parsed strictly under the GIL at the start of every op (and by
 * build_info): kernels get the result in params (smla_run) and never call getenv, which races with
 * another thread writing os.environ. A malformed value raises ValueError naming the variable. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"
#include "cpu/cpu_features.h"

#define SMLA_MAX_THREADS 1024

/* Unset or empty: *v = dflt. Else a decimal integer in [lo, hi]. */
static int env_int(const char *name, long lo, long hi, int dflt, int *v)
{
    const char *e = getenv(name);
    if (!e || !*e) {
        *v = dflt;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long x = strtol(e, &end, 10);
    while (end && (*end == ' ' || *end == '\t')) end++;
    if (errno || end == e || *end || x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s: expected an integer from %ld to %ld, got '%s'", name, lo, hi, e);
        return -1;
    }
    *v = (int)x;
    return 0;
}

#if defined(SMLA_ATTN_ABLATION)
/* Unset or empty: *v = 0. Else a decimal or 0x-prefixed unsigned 64-bit integer (what: its meaning, for the error). */
static int env_u64(const char *name, const char *what, uint64_t *v)
{
    const char *e = getenv(name);
    *v = 0;
    if (!e || !*e) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(e, &end, 0);
    while (end && (*end == ' ' || *end == '\t')) end++;
    if (errno || end == e || *end || *e == '-') {
        PyErr_Format(PyExc_ValueError, "%s: expected an unsigned 64-bit integer (%s), got '%s'", name, what, e);
        return -1;
    }
    *v = (uint64_t)x;
    return 0;
}
#endif

/* Unset or empty: index 0 of names (the default). Else one of names. */
static int env_choice(const char *name, const char *const *names, int n, int *v)
{
    const char *e = getenv(name);
    if (!e || !*e) {
        *v = 0;
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(e, names[i])) {
            *v = i;
            return 0;
        }
    char buf[160] = "";
    for (int i = 0; i < n; i++) {
        strncat(buf, i ? ", " : "", sizeof buf - strlen(buf) - 1);
        strncat(buf, names[i], sizeof buf - strlen(buf) - 1);
    }
    PyErr_Format(PyExc_ValueError, "%s: expected one of %s (or unset), got '%s'", name, buf, e);
    return -1;
}

int smla_read_settings(smla_run *r)
{
    /* index 0 = unset: the default level; the rest in smla_cpu_isa_name order, then the test hook */
    static const char *const isa_names[] = {"default", "portable", "avx2", "avx512", "avx512bf16",
                                            "avx2-emulated-bf16"};
    static const char *const kernel_names[] = {"auto", "portable", "sm90", "sm90n", "sm90p", "sm90r", "sm90d", "sm90t"};
    static const char *const combine_names[] = {"auto", "kernel"};
    static const char *const persistent_names[] = {"auto", "off", "on"};  /* SMLA_PERSISTENT_* (params.h) */
#define SMLA_NAMES(a) a, (int)(sizeof a / sizeof a[0])
    memset(r, 0, sizeof *r);
    int isa, combine;
    if (env_int("SMLA_NUM_THREADS", 1, SMLA_MAX_THREADS, 0, &r->num_threads) < 0 ||
        env_choice("SMLA_CPU_ISA", SMLA_NAMES(isa_names), &isa) < 0 ||
        env_choice("SMLA_ATTN_KERNEL", SMLA_NAMES(kernel_names), &r->attn_kernel) < 0 ||
        env_choice("SMLA_ATTN_COMBINE", SMLA_NAMES(combine_names), &combine) < 0 ||
        env_choice("SMLA_ATTN_PERSISTENT", SMLA_NAMES(persistent_names), &r->attn_persistent) < 0 ||
        env_int("SMLA_ATTN_ABLATE", 0, 1 << 20, 0, &r->attn_ablate) < 0)
        return -1;
#undef SMLA_NAMES
#if defined(SMLA_ATTN_ABLATION)
    if (env_u64("SMLA_ATTN_TRACE", "a device address", &r->attn_trace) < 0 ||
        env_u64("SMLA_ATTN_STAGGER_NS", "nanoseconds", &r->attn_stagger_ns) < 0 ||
        env_u64("SMLA_ATTN_JITTER_NS", "nanoseconds", &r->attn_jitter_ns) < 0)
        return -1;  /* profiling builds only */
#endif
    r->fused_combine = combine == 0;
    const int sup = smla_cpu_isa_supported();
    if (isa == 0) {
        r->cpu_isa = smla_cpu_isa_default();
    } else if (isa == 5) {
        r->cpu_isa = SMLA_ISA_AVX2 < sup ? SMLA_ISA_AVX2 : sup;
        r->emulated_bf16 = r->cpu_isa == SMLA_ISA_AVX2;
    } else {
        /* a level the CPU lacks runs the best one below it */
        r->cpu_isa = isa - 1 < sup ? isa - 1 : sup;
    }
    return 0;
}
