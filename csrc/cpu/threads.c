/* Fork safety of the CPU kernels' threads (threads.h says why). */
#include <pthread.h>

#include "threads.h"

int smla_threads_started;
int smla_threads_forked;

/* Runs in the child of every fork(): only a process that may have started libgomp's pool (a count
 * > 1 was handed out) passes the hazard on; the flag is inherited by the child's own children. */
static void smla_threads_on_fork_child(void)
{
    if (__atomic_load_n(&smla_threads_started, __ATOMIC_RELAXED))
        __atomic_store_n(&smla_threads_forked, 1, __ATOMIC_RELAXED);
}

/* Registered when the extension is loaded, before any kernel can run. Should the registration fail
 * (out of memory), forks could not be seen, so every count is 1: slower, never hung. */
__attribute__((constructor)) static void smla_threads_register(void)
{
    if (pthread_atfork(NULL, NULL, smla_threads_on_fork_child) != 0)
        __atomic_store_n(&smla_threads_forked, 1, __ATOMIC_RELAXED);
}
