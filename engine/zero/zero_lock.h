/* zero_lock.h — private to engine/zero*.c (through the part headers): the
 * sharded trainer's six mutexes, each with its place in the one lock order
 * (ARCHITECTURE.md, "Threads and locks"):
 *
 *   threads.mu  <  save.mu  <  io.pf_mu  <  opt.mu  <  sc.mu  <  io.mu
 *
 * A thread holding a lock takes only locks later in the order. Today only
 * io.pf_mu is held while another is taken (the prefetch: opt.mu, sc.mu,
 * io.mu, one at a time); every other lock is let go before its thread
 * takes another. A thread waits on a condition variable holding that
 * variable's mutex and no other lock.
 *
 * Every lock site goes through zr_lock, zr_unlock, zr_cond_wait and
 * zr_cond_timedwait. In builds without NDEBUG (meson's debug buildtype;
 * the project's default, release, defines it through b_ndebug=if-release)
 * each keeps a thread-local set of the locks its thread holds and aborts
 * through fso_bug_at (kernels/util.h) with the call's file:line when a lock
 * is taken out of order (or twice: two devices' opt.mu are one place), a
 * lock not held is let go, or a wait holds another lock. Builds with NDEBUG
 * call pthread alone; the checker (zr_lock_order_*) is compiled into every
 * build so that its test runs in every build. */
#ifndef FSO_ZERO_LOCK_H
#define FSO_ZERO_LOCK_H

#include <pthread.h>
#include <time.h>

/* The places in the order, first to last. */
typedef enum zr_lock_rank {
    ZR_LOCK_THREADS,  /* fso_zero.threads.mu (rank_threads, zero_step.h) */
    ZR_LOCK_SAVE,     /* fso_zero.save.mu (save_gate, zero_save.h) */
    ZR_LOCK_PREFETCH, /* rank_io.pf_mu (zero_io.h) */
    ZR_LOCK_OPT,      /* rank_optim.mu (zero_optim.h), of any device */
    ZR_LOCK_SC,       /* fso_zero.sc.mu (shared_coll, zero_source.h) */
    ZR_LOCK_IO,       /* rank_io.mu (zero_io.h) */
    ZR_N_LOCKS
} zr_lock_rank;

/* A mutex and its place in the order. */
typedef struct zr_mutex {
    pthread_mutex_t mu;
    zr_lock_rank rank;
} zr_mutex;

void zr_mutex_init(zr_mutex *m, zr_lock_rank rank);
void zr_mutex_destroy(zr_mutex *m);

/* The checker, on the calling thread's set of held places; file, line and
 * func name the lock site, which a violation's message names. take: before
 * the lock is taken (so an inversion aborts instead of deadlocking); give:
 * as it is let go; wait: before a wait on a condition variable of the lock
 * at `rank`. */
void zr_lock_order_take(zr_lock_rank rank, const char *file, int line, const char *func);
void zr_lock_order_give(zr_lock_rank rank, const char *file, int line, const char *func);
void zr_lock_order_wait(zr_lock_rank rank, const char *file, int line, const char *func);
/* The places the calling thread holds, bit `rank` each. */
unsigned zr_lock_order_held(void);
/* "io.mu", "opt.mu", ... ("?" past the last). */
const char *zr_lock_name(zr_lock_rank rank);

#ifndef NDEBUG
#define zr_lock(m) zr_lock_at((m), __FILE__, __LINE__, __func__)
#define zr_unlock(m) zr_unlock_at((m), __FILE__, __LINE__, __func__)
#define zr_cond_wait(cv, m) zr_cond_wait_at((cv), (m), __FILE__, __LINE__, __func__)
#define zr_cond_timedwait(cv, m, ts) \
    zr_cond_timedwait_at((cv), (m), (ts), __FILE__, __LINE__, __func__)
#else
#define zr_lock(m) pthread_mutex_lock(&(m)->mu)
#define zr_unlock(m) pthread_mutex_unlock(&(m)->mu)
#define zr_cond_wait(cv, m) pthread_cond_wait((cv), &(m)->mu)
#define zr_cond_timedwait(cv, m, ts) pthread_cond_timedwait((cv), &(m)->mu, (ts))
#endif

static inline void zr_lock_at(zr_mutex *m, const char *file, int line, const char *func)
{
    zr_lock_order_take(m->rank, file, line, func);
    pthread_mutex_lock(&m->mu);
}

static inline void zr_unlock_at(zr_mutex *m, const char *file, int line, const char *func)
{
    zr_lock_order_give(m->rank, file, line, func);
    pthread_mutex_unlock(&m->mu);
}

static inline int zr_cond_wait_at(pthread_cond_t *cv, zr_mutex *m, const char *file, int line,
                                  const char *func)
{
    zr_lock_order_wait(m->rank, file, line, func);
    return pthread_cond_wait(cv, &m->mu);
}

static inline int zr_cond_timedwait_at(pthread_cond_t *cv, zr_mutex *m,
                                       const struct timespec *ts, const char *file, int line,
                                       const char *func)
{
    zr_lock_order_wait(m->rank, file, line, func);
    return pthread_cond_timedwait(cv, &m->mu, ts);
}

#endif
