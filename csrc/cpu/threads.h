/* Thread counts for the CPU kernels (OpenMP). The bindings release the GIL, so a kernel may open its
 * own parallel region. Count: the call's request (p->run.num_threads, which the binding reads from
 * SMLA_NUM_THREADS) if > 0, else OpenMP's default (the CPUs this process may run on, or
 * OMP_NUM_THREADS); never more than there are units of work. */
#ifndef SMLA_CPU_THREADS_H
#define SMLA_CPU_THREADS_H

#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static inline int smla_num_threads(int requested, int64_t units)
{
    int n = requested;
#ifdef _OPENMP
    if (n <= 0) n = omp_get_max_threads();
#endif
    if (n <= 0) n = 1;
    if (n > 1024) n = 1024;
    if ((int64_t)n > units) n = units < 1 ? 1 : (int)units;
    return n;
}

static inline int smla_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Threads in the current team: a parallel region may get fewer than it asked for (nested regions,
 * thread limits), so code that splits work by thread id must use this, not its request. */
static inline int smla_team_size(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

#endif /* SMLA_CPU_THREADS_H */
