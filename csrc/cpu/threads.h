/* Thread counts for the CPU kernels (OpenMP). The bindings release the GIL, so a kernel may open its
 * own parallel region. Count: the call's request (p->run.num_threads, which the binding reads from
 * SMLA_NUM_THREADS) if > 0, else OpenMP's default (the CPUs this process may run on, or
 * OMP_NUM_THREADS); never more than there are units of work.
 *
 * Fork: libgomp's thread pool does not survive fork(). A child forked after this process opened a
 * parallel region of more than one thread would wait forever, in its first such region, for pool
 * threads that do not exist in the child, and libgomp cannot be re-initialised. threads.c marks such
 * a child (a pthread_atfork handler), and from then on every count here is 1: libgomp runs a team of
 * one on the calling thread without touching the inherited pool, so the kernels (all of which take
 * their count from here) stay correct, single-threaded. A process forked before any threaded region,
 * or started with spawn / forkserver, keeps its threads. */
#ifndef SMLA_CPU_THREADS_H
#define SMLA_CPU_THREADS_H

#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* threads.c: set once a count > 1 was handed out in this process; set in a child forked after that */
extern int smla_threads_started;
extern int smla_threads_forked;

static inline int smla_num_threads(int requested, int64_t units)
{
    if (__atomic_load_n(&smla_threads_forked, __ATOMIC_RELAXED)) return 1;
    int n = requested;
#ifdef _OPENMP
    if (n <= 0) n = omp_get_max_threads();
#endif
    if (n <= 0) n = 1;
    if (n > 1024) n = 1024;
    if ((int64_t)n > units) n = units < 1 ? 1 : (int)units;
    if (n > 1 && !__atomic_load_n(&smla_threads_started, __ATOMIC_RELAXED))
        __atomic_store_n(&smla_threads_started, 1, __ATOMIC_RELAXED);
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
