/* pool.c: a small persistent thread pool for the CPU kernels.
 *
 * A forward makes ~120 kernel calls of 0.05-5 ms each, so creating threads per call (tens
 * of microseconds each) or waking sleeping threads through the kernel every time would be
 * a visible share of a decode step. Workers therefore spin briefly after each job (they
 * usually get the next one within that window) and only then sleep on a condition variable.
 *
 * Parts are claimed, not assigned: the caller and the woken workers take the next part
 * from one atomic counter until none is left. On a busy machine a worker that is not
 * scheduled in time simply gets no parts, and the caller does the work instead of waiting
 * for it. The counter carries the job's generation in its high half, so a worker that
 * wakes after its job is over sees a stale generation and touches nothing. The caller
 * returns once every part is finished. Parts never share a reduction, so who runs a part
 * cannot change any result.
 *
 * One parallel call at a time: a caller that finds the pool busy (another Python thread is
 * in a kernel) runs all its parts itself. After fork() the child starts with no workers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cpu.h"

#define MAX_WORKERS 255
#define WORKER_SPIN_NS 300000L /* ~ the gap between two GEMMs of a decode step */
#define CALLER_SPIN_NS 2000000L

typedef struct { /* what a worker needs to join a job (a seqlock: gen 0 = being written) */
    _Atomic uint32_t gen;
    uint32_t gen0; /* gen when the worker was created: its first "seen" */
    _Atomic(cru_part_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int nparts;
} mailbox;

static mailbox boxes[MAX_WORKERS + 1];
static int n_workers; /* started workers, indices 1 .. n_workers */
static _Atomic uint64_t claim; /* (job generation << 32) | next unclaimed part */
static _Atomic int finished;   /* parts of the current job that are done */
static uint32_t job_gen;
static int caller_sleeping; /* under mu */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Take and run parts of job `gen` until none is left; returns when this thread is done. */
static void run_parts(uint32_t gen, cru_part_fn fn, void *ctx, int nparts) {
    uint64_t c = atomic_load_explicit(&claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(c >> 32) != gen || (int)(uint32_t)c >= nparts) return;
        if (!atomic_compare_exchange_weak_explicit(&claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c now holds the current value */
        fn(ctx, (int)(uint32_t)c, nparts);
        if (atomic_fetch_add_explicit(&finished, 1, memory_order_acq_rel) + 1 == nparts) {
            pthread_mutex_lock(&mu);
            if (caller_sleeping) pthread_cond_signal(&done);
            pthread_mutex_unlock(&mu);
        }
        c = atomic_load_explicit(&claim, memory_order_acquire);
    }
}

static uint32_t wait_for_job(mailbox *box, uint32_t seen) {
    const long t0 = now_ns();
    uint32_t g;
    for (long i = 0;; i++) {
        g = atomic_load_explicit(&box->gen, memory_order_acquire);
        if (g != seen && g != 0) return g;
        if ((i & 255) == 255 && now_ns() - t0 > WORKER_SPIN_NS) break;
        relax();
    }
    pthread_mutex_lock(&mu);
    while ((g = atomic_load_explicit(&box->gen, memory_order_acquire)) == seen || g == 0)
        pthread_cond_wait(&wake, &mu);
    pthread_mutex_unlock(&mu);
    return g;
}

static void *worker(void *arg) {
    mailbox *box = arg;
    uint32_t seen = box->gen0; /* not a fresh load: a job may already be posted */
    for (;;) {
        uint32_t g = wait_for_job(box, seen);
        /* The caller may already be posting the next job into this box: read the fields,
         * then check that gen did not move meanwhile (else start over with the new job). */
        cru_part_fn fn = atomic_load_explicit(&box->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&box->ctx, memory_order_relaxed);
        int nparts = atomic_load_explicit(&box->nparts, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&box->gen, memory_order_relaxed) != g) continue;
        seen = g;
        run_parts(g, fn, ctx, nparts);
    }
    return NULL;
}

static void reset_after_fork(void) {
    /* Only the forking thread exists in the child; forget the parent's workers. */
    pthread_mutex_init(&call_mu, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&done, NULL);
    n_workers = 0;
    caller_sleeping = 0;
}

static void install_fork_handler(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

static void start_workers(int want) {
    sigset_t all, old;
    sigfillset(&all);
    /* Workers inherit a full signal mask: signals (Ctrl-C) go to the Python thread. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (n_workers < want && n_workers < MAX_WORKERS) {
        pthread_t t;
        pthread_attr_t attr;
        mailbox *box = &boxes[n_workers + 1];
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        box->gen0 = atomic_load(&box->gen);
        int rc = pthread_create(&t, &attr, worker, box);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer workers: the caller takes more parts */
        n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void cru_pool_run(cru_part_fn fn, void *ctx, int nparts, int nthreads) {
    if (nparts <= 0) return;
    if (nthreads <= 1 || nparts == 1 || pthread_mutex_trylock(&call_mu) != 0) {
        for (int p = 0; p < nparts; p++) fn(ctx, p, nparts);
        return;
    }
    pthread_once(&once, install_fork_handler);
    start_workers((nthreads < nparts ? nthreads : nparts) - 1);
    const int helpers = nthreads - 1 < n_workers ? nthreads - 1 : n_workers;
    const uint32_t gen = ++job_gen ? job_gen : ++job_gen; /* never 0 */
    atomic_store_explicit(&finished, 0, memory_order_relaxed);
    atomic_store_explicit(&claim, (uint64_t)gen << 32, memory_order_release);
    for (int w = 1; w <= helpers && w < nparts; w++) {
        mailbox *box = &boxes[w];
        /* A late worker may still be reading the previous job from this box. */
        atomic_store_explicit(&box->gen, 0, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
        atomic_store_explicit(&box->fn, fn, memory_order_relaxed);
        atomic_store_explicit(&box->ctx, ctx, memory_order_relaxed);
        atomic_store_explicit(&box->nparts, nparts, memory_order_relaxed);
        atomic_store_explicit(&box->gen, gen, memory_order_release);
    }
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mu);
    run_parts(gen, fn, ctx, nparts);
    const long t0 = now_ns();
    for (long i = 0; atomic_load_explicit(&finished, memory_order_acquire) != nparts; i++) {
        if ((i & 255) == 255 && now_ns() - t0 > CALLER_SPIN_NS) {
            pthread_mutex_lock(&mu);
            caller_sleeping = 1;
            while (atomic_load_explicit(&finished, memory_order_acquire) != nparts)
                pthread_cond_wait(&done, &mu);
            caller_sleeping = 0;
            pthread_mutex_unlock(&mu);
            break;
        }
        relax();
    }
    pthread_mutex_unlock(&call_mu);
}
