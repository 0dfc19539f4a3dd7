/* zero_lock.c — the sharded trainer's lock order checker (zero_lock.h): per
 * thread, the places in the order it holds and where it took each; a lock
 * taken at or before a place held, a lock let go that is not held, or a
 * wait that holds another lock is a bug in fsoff, reported with the lock
 * site and the lock held. */
#include "zero_lock.h"

#include "util.h"

static const char *const names[ZR_N_LOCKS] = {
    [ZR_LOCK_THREADS] = "threads.mu", [ZR_LOCK_SAVE] = "save.mu",
    [ZR_LOCK_PREFETCH] = "io.pf_mu",  [ZR_LOCK_OPT] = "opt.mu",
    [ZR_LOCK_SC] = "sc.mu",           [ZR_LOCK_IO] = "io.mu",
};

#define ORDER "threads.mu < save.mu < io.pf_mu < opt.mu < sc.mu < io.mu"

/* The calling thread's held places (bit `rank` each), and where each was
 * taken. */
static _Thread_local struct {
    unsigned held;
    const char *file[ZR_N_LOCKS];
    int line[ZR_N_LOCKS];
} self;

const char *zr_lock_name(zr_lock_rank rank)
{
    return (unsigned)rank < ZR_N_LOCKS ? names[rank] : "?";
}

unsigned zr_lock_order_held(void)
{
    return self.held;
}

/* The last place held among `mask`'s bits. */
static zr_lock_rank last_of(unsigned mask)
{
    int r = ZR_N_LOCKS - 1;
    while (r > 0 && !(mask & (1u << r)))
        r--;
    return (zr_lock_rank)r;
}

void zr_mutex_init(zr_mutex *m, zr_lock_rank rank)
{
    FSO_BUG_ON((unsigned)rank >= ZR_N_LOCKS, "lock place %d", (int)rank);
    pthread_mutex_init(&m->mu, NULL);
    m->rank = rank;
}

void zr_mutex_destroy(zr_mutex *m)
{
    pthread_mutex_destroy(&m->mu);
}

void zr_lock_order_take(zr_lock_rank rank, const char *file, int line, const char *func)
{
    const unsigned at_or_after = ~((1u << rank) - 1);
    if (self.held & at_or_after) {
        const zr_lock_rank h = last_of(self.held & at_or_after);
        fso_bug_at(file, line, func, "lock order",
                   "%s taken while holding %s (taken at %s:%d); the order is " ORDER,
                   zr_lock_name(rank), zr_lock_name(h), self.file[h], self.line[h]);
    }
    self.held |= 1u << rank;
    self.file[rank] = file;
    self.line[rank] = line;
}

void zr_lock_order_give(zr_lock_rank rank, const char *file, int line, const char *func)
{
    if (!(self.held & (1u << rank)))
        fso_bug_at(file, line, func, "lock order", "%s let go but not held",
                   zr_lock_name(rank));
    self.held &= ~(1u << rank);
}

void zr_lock_order_wait(zr_lock_rank rank, const char *file, int line, const char *func)
{
    if (!(self.held & (1u << rank)))
        fso_bug_at(file, line, func, "lock order", "a wait on %s, which is not held",
                   zr_lock_name(rank));
    const unsigned others = self.held & ~(1u << rank);
    if (others) {
        const zr_lock_rank h = last_of(others);
        fso_bug_at(file, line, func, "lock order",
                   "a wait on %s while holding %s too (taken at %s:%d): a waiting thread "
                   "holds only the lock it waits on",
                   zr_lock_name(rank), zr_lock_name(h), self.file[h], self.line[h]);
    }
}
