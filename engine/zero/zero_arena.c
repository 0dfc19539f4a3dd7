/* zero_arena.c — the host arena: one block of host memory for every device's
 * host-tier shards and staging buffers, reserved once as address space and
 * committed (locked, or registered with CUDA) as it grows (zero_arena.h,
 * host_arena). */
#include "zero_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "cuda/cuda_backend.h"
#include "topology.h"
#include "util.h"

/* The arena starts on, and grows by, whole huge pages: its staging slots
 * are the NVMe stores' buffers (util.h, fso_io_alloc says why). */
#define ARENA_ROUND FSO_IO_ALIGN

int zr_arena_init(fso_zero *z, size_t reserve, size_t bytes, char *err, size_t errlen)
{
    z->arena.reserve = (reserve + 2 * ARENA_ROUND - 1) / ARENA_ROUND * ARENA_ROUND;
    z->arena.base = fso_map_aligned(z->arena.reserve, PROT_NONE, MAP_NORESERVE);
    if (!z->arena.base) {
        char h[32];
        fso_human_bytes(h, sizeof h, (double)z->arena.reserve);
        snprintf(err, errlen, "host memory: cannot reserve %s of address space for the host "
                              "arena: %s; check ulimit -v", h, strerror(errno));
        return -ENOMEM;
    }
    z->arena.bytes = 0;
    return zr_arena_grow(z, bytes, err, errlen);
}

void zr_arena_free(fso_zero *z)
{
#if FSO_HAVE_CUDA
    for (int i = 0; i < z->arena.n_pinned; i++)
        fso_cuda_host_unregister((char *)z->arena.base + z->arena.pinned_at[i],
                                 z->arena.pinned_at[i + 1] - z->arena.pinned_at[i]);
#endif
    if (z->arena.base)
        munmap(z->arena.base, z->arena.reserve);
    z->arena.base = NULL;
}

static void *arena_take(fso_zero *z, size_t bytes)
{
    size_t off = fso_fp_round_page(z->arena.used);
    FSO_BUG_ON(off + bytes > z->arena.bytes, "host arena overrun (%zu + %zu > %zu)", off, bytes,
               z->arena.bytes);
    z->arena.used = off + bytes;
    return (char *)z->arena.base + off;
}

/* Pinning the arena was refused: keep the first reason (with its fix) for
 * the run's banner (fso_zero_pin_refused); a refusal while training, once
 * the banner is out, is a warning at once. */
static void pin_refused(fso_zero *z, bool first, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pin_refused(fso_zero *z, bool first, const char *fmt, ...)
{
    char msg[sizeof z->arena.pin_refused];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!z->arena.pin_refused[0])
        memcpy(z->arena.pin_refused, msg, sizeof msg);
    if (!first)
        fprintf(stderr, "fsoff: warning: %s\n", msg);
}

/* Make [0, bytes) of the arena usable: commit the new part, lock or
 * register it with CUDA as the configuration asks (a refusal is one warning
 * and pageable memory), and tell the NVMe stores, whose registered buffers
 * cover the arena. */
int zr_arena_grow(fso_zero *z, size_t bytes, char *err, size_t errlen)
{
    char h1[32], h2[32];
    bytes = (bytes + ARENA_ROUND - 1) / ARENA_ROUND * ARENA_ROUND;
    if (bytes <= z->arena.bytes)
        return 0;
    if (bytes > z->arena.reserve) {
        fso_human_bytes(h1, sizeof h1, (double)bytes);
        fso_human_bytes(h2, sizeof h2, (double)z->arena.reserve);
        snprintf(err, errlen, "host memory: the host arena would need %s, more than the %s "
                              "reserved at start; restart with the new placement set in the "
                              "configuration", h1, h2);
        return -ENOMEM;
    }
    char *from = (char *)z->arena.base + z->arena.bytes;
    size_t len = bytes - z->arena.bytes;
    if (mprotect(from, len, PROT_READ | PROT_WRITE) != 0) {
        fso_human_bytes(h1, sizeof h1, (double)len);
        snprintf(err, errlen, "host memory: cannot commit %s more of the host arena: %s", h1,
                 strerror(errno));
        return -ENOMEM;
    }
    fso_io_advise(from, len); /* before locking or registering faults the pages in */
    const bool first = z->arena.bytes == 0;
#if FSO_HAVE_CUDA
    if (z->cuda) {
        char cerr[256] = "";
        const int max_pinned = (int)(sizeof z->arena.pinned_at / sizeof z->arena.pinned_at[0]);
        if (z->arena.n_pinned + 1 < max_pinned &&
            (first || z->arena.pinned_at[z->arena.n_pinned] == z->arena.bytes) &&
            fso_cuda_host_register(from, len, cerr, sizeof cerr) == 0) {
            z->arena.pinned_at[z->arena.n_pinned] = z->arena.bytes;
            z->arena.pinned_at[++z->arena.n_pinned] = bytes;
        } else if (first || z->arena.pinned_at[z->arena.n_pinned] == z->arena.bytes) {
            pin_refused(z, first, "host memory is pageable, not pinned: %s; copies between it "
                                  "and the GPUs wait for the host and do not overlap compute",
                        cerr[0] ? cerr : "too many registrations");
        }
    } else
#endif
    if (z->cfg->offload.pin_memory && (first || z->arena.locked)) {
        z->arena.locked = mlock(from, len) == 0;
        if (!z->arena.locked) {
            struct rlimit rl = {0};
            getrlimit(RLIMIT_MEMLOCK, &rl);
            fso_human_bytes(h1, sizeof h1, (double)rl.rlim_cur);
            fso_human_bytes(h2, sizeof h2, (double)bytes);
            pin_refused(z, first, "pin_memory: host memory is pageable, not locked: "
                                  "RLIMIT_MEMLOCK is %s; locking %s needs `ulimit -l unlimited` "
                                  "(in a container: docker run --ulimit memlock=-1)",
                        rl.rlim_cur == RLIM_INFINITY ? "unlimited" : h1, h2);
            if (!first)
                munlock(z->arena.base, z->arena.bytes);
        }
    }
    z->arena.bytes = bytes;
    for (int r = 0; r < z->world && z->ranks; r++) {
        fso_store *st = z->ranks[r].io.store;
        if (st && st->ops->register_buffers &&
            st->ops->register_buffers(st, z->arena.base, z->arena.bytes) < 0 && r == 0)
            fprintf(stderr, "fsoff: warning: NVMe: %s; continuing with unregistered buffers "
                            "(slower)\n", st->err);
    }
    return 0;
}

/* Give back the pages of [p, p+bytes) of the arena (state that moved
 * elsewhere); CUDA-registered memory stays as it is. */
void zr_arena_release(fso_zero *z, void *p, size_t bytes)
{
    if (z->arena.n_pinned)
        return;
    if (z->arena.locked)
        munlock(p, bytes);
    madvise(p, bytes, MADV_DONTNEED);
}

/* Host memory for device rk's state, on its NUMA node when the machine has
 * several (best effort). */
void *zr_rank_take(rank_state *rk, size_t bytes)
{
    void *p = arena_take(rk->z, bytes);
    if (rk->z->topo && rk->numa >= 0)
        fso_topo_bind_memory(rk->z->topo, p, bytes, rk->numa);
    return p;
}
