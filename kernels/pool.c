/* pool.c — persistent worker threads with spin-then-futex waits (pool.h). */
#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_ITERS 4000 /* about 20-50 us of polling before sleeping */

struct fso_pool {
    int threads;
    pthread_t *tids;
    _Atomic uint32_t gen;      /* bumped once per loop; workers wait on it */
    _Atomic uint32_t pending;  /* workers still busy with this loop */
    _Atomic int stop;
    /* the current loop */
    fso_pool_fn fn;
    void *ctx;
    int64_t n, chunk;
    int nranges;
};

struct worker_arg {
    fso_pool *pool;
    int index;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void run_range(fso_pool *p, int r)
{
    if (r >= p->nranges)
        return;
    int64_t b = r * p->chunk, e = b + p->chunk < p->n ? b + p->chunk : p->n;
    p->fn(p->ctx, b, e, r);
}

static void *worker_main(void *arg_)
{
    struct worker_arg *arg = arg_;
    fso_pool *p = arg->pool;
    int index = arg->index;
    free(arg);
    uint32_t seen = 0; /* gen at creation: a loop posted before we ran still counts */
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS)
                cpu_relax();
            else
                futex_wait(&p->gen, seen);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        run_range(p, index);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
            futex_wake(&p->pending);
    }
}

int fso_pool_create(fso_pool **out, int threads)
{
    fso_pool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->threads = threads < 1 ? 1 : threads;
    p->tids = calloc((size_t)p->threads, sizeof *p->tids);
    if (!p->tids) {
        free(p);
        return -ENOMEM;
    }
    for (int i = 1; i < p->threads; i++) {
        struct worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->pool = p;
            a->index = i;
        }
        int rc = a ? pthread_create(&p->tids[i], NULL, worker_main, a) : ENOMEM;
        if (rc != 0) {
            free(a);
            p->threads = i; /* workers 1..i-1 exist */
            fso_pool_destroy(p);
            return -rc;
        }
    }
    *out = p;
    return 0;
}

void fso_pool_destroy(fso_pool *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    futex_wake(&p->gen);
    for (int i = 1; i < p->threads; i++)
        pthread_join(p->tids[i], NULL);
    free(p->tids);
    free(p);
}

int fso_pool_threads(const fso_pool *p)
{
    return p ? p->threads : 1;
}

void fso_pool_for(fso_pool *p, int64_t n, int64_t grain, fso_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t max_ranges = (n + grain - 1) / grain;
    int nr = p && p->threads < max_ranges ? p->threads : (int)(max_ranges < INT_MAX ? max_ranges : INT_MAX);
    if (!p || nr <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + nr - 1) / nr;
    p->nranges = (int)((n + p->chunk - 1) / p->chunk);
    atomic_store_explicit(&p->pending, (uint32_t)(p->threads - 1), memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    futex_wake(&p->gen);
    run_range(p, 0);
    uint32_t left;
    int spins = 0;
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
        if (++spins < SPIN_ITERS)
            cpu_relax();
        else
            futex_wait(&p->pending, left);
    }
}
