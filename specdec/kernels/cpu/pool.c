/* A few helper threads that share a kernel call's items with the calling thread.
 *
 * A call publishes its items under a new generation; the caller and every helper that is awake
 * claim items one at a time (a compare-and-swap on the generation and the next item, so a late
 * helper can never run an item of a call that has moved on) and the caller returns once the
 * claimed items are done. Nobody waits for a helper that has not started: where the other cores
 * are busy (a server's other processes) the caller simply does more of the items itself. Which
 * thread runs an item never changes its result: items are whole output tiles or whole queries.
 *
 * Between calls a helper spins for SPIN_NS, so that the next call of a forward (tens of
 * microseconds later) finds it awake, then sleeps on a condition variable until the next call.
 * set_threads(n) sets the threads a call uses, the caller included; helpers start at first use
 * and are forgotten in a forked child (which starts its own).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "pool.h"

#define MAX_THREADS 64
#define SPIN_NS 200000L

struct job {
    void (*fn)(void *, long);
    void *arg;
    long items;
};

static struct job jobs[2];                 /* generation g's job is jobs[g & 1] */
static _Atomic uint64_t next;              /* generation << 32 | next item to claim */
static _Atomic long pending;               /* items of the current call not yet done */
static _Atomic int sleepers;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int threads = 1, started = 0, fork_handler = 0;
static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;   /* one call at a time uses helpers */

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claim and run items of generation gen until none is left. */
static void work(uint32_t gen) {
    uint64_t v = atomic_load(&next);
    for (;;) {
        if ((uint32_t)(v >> 32) != gen)
            return;
        const struct job *j = &jobs[gen & 1];
        long item = (long)(v & 0xffffffffu);
        if (item >= j->items)
            return;
        if (!atomic_compare_exchange_weak(&next, &v, v + 1))
            continue;                        /* v now holds what is there: look again */
        j->fn(j->arg, item);                 /* the claim keeps this call's job in place */
        atomic_fetch_sub(&pending, 1);
        v = atomic_load(&next);
    }
}

static void *helper(void *unused) {
    (void)unused;
    uint32_t seen = (uint32_t)(atomic_load(&next) >> 32);
    for (;;) {
        uint32_t gen = (uint32_t)(atomic_load(&next) >> 32);
        if (gen == seen) {
            long until = now_ns() + SPIN_NS;
            for (int i = 1; gen == seen; i++) {
                relax();
                gen = (uint32_t)(atomic_load(&next) >> 32);
                if (gen == seen && i % 64 == 0 && now_ns() > until) {
                    pthread_mutex_lock(&lock);
                    atomic_fetch_add(&sleepers, 1);
                    while ((gen = (uint32_t)(atomic_load(&next) >> 32)) == seen)
                        pthread_cond_wait(&wake, &lock);
                    atomic_fetch_sub(&sleepers, 1);
                    pthread_mutex_unlock(&lock);
                }
            }
        }
        seen = gen;
        work(gen);
    }
    return 0;
}

static void forget_helpers(void) {   /* in a forked child: the parent's helpers are not here */
    started = 0;
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&lock, 0);
    pthread_cond_init(&wake, 0);
    pthread_mutex_init(&busy, 0);
}

static void start_helpers(void) {
    if (!fork_handler) {
        pthread_atfork(0, 0, forget_helpers);
        fork_handler = 1;
    }
    while (started < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, helper, 0);
        pthread_attr_destroy(&attr);
        if (failed)
            break;                           /* fewer helpers: the caller does more */
        started++;
    }
}

/* Threads a call uses, the caller included (1: the caller alone). Returns the number set. */
int set_threads(int n) {
    threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    return threads;
}

int get_threads(void) {
    return threads;
}

void parallel_for(void (*fn)(void *, long), void *arg, long items) {
    /* Alone: one thread asked for, one item, or another thread's call holds the helpers (two
     * engines of one process called from two threads). */
    if (threads == 1 || items < 2 || pthread_mutex_trylock(&busy)) {
        for (long i = 0; i < items; i++)
            fn(arg, i);
        return;
    }
    if (started < threads - 1)
        start_helpers();
    uint32_t gen = (uint32_t)(atomic_load(&next) >> 32) + 1;
    jobs[gen & 1] = (struct job){fn, arg, items};
    atomic_store(&pending, items);
    atomic_store(&next, (uint64_t)gen << 32);
    if (atomic_load(&sleepers)) {
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&lock);
    }
    work(gen);
    while (atomic_load(&pending) > 0)        /* items that helpers claimed and still run */
        relax();
    pthread_mutex_unlock(&busy);
}
