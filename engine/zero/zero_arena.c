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

/* Room for one more of an offset list (a handful of pieces; a few
 * thousand ranges handed out at creation). */
static void grow_list(size_t **list, int *cap, int need)
{
    if (need <= *cap)
        return;
    int n = *cap ? *cap * 2 : 64;
    while (n < need)
        n *= 2;
    size_t *l = realloc(*list, sizeof **list * (size_t)n);
    FSO_BUG_ON(!l, "host arena: out of memory for %d offsets", n);
    *list = l;
    *cap = n;
}

int zr_arena_init(fso_zero *z, size_t reserve, size_t bytes, char *err, size_t errlen)
{
    host_arena *a = &z->arena;
    a->reserve = (reserve + 2 * ARENA_ROUND - 1) / ARENA_ROUND * ARENA_ROUND;
    a->base = fso_map_aligned(a->reserve, PROT_NONE, MAP_NORESERVE);
    if (!a->base) {
        char h[32];
        fso_human_bytes(h, sizeof h, (double)a->reserve);
        snprintf(err, errlen, "host memory: cannot reserve %s of address space for the host "
                              "arena: %s; check ulimit -v", h, strerror(errno));
        return -ENOMEM;
    }
    if (!a->pin_chunk_bytes)
        a->pin_chunk_bytes = ZR_ARENA_PIN_CHUNK;
    a->bytes = a->used = a->pinned = 0;
    grow_list(&a->piece, &a->cap_pieces, 1);
    a->piece[0] = 0;
    return zr_arena_grow(z, bytes, err, errlen);
}

void zr_arena_free(fso_zero *z)
{
    host_arena *a = &z->arena;
#if FSO_HAVE_CUDA
    for (int i = 0; i < a->n_registered; i++)
        fso_cuda_host_unregister((char *)a->base + a->piece[i], a->piece[i + 1] - a->piece[i]);
#endif
    if (a->base)
        munmap(a->base, a->reserve);
    a->base = NULL;
    free(a->piece);
    free(a->taken);
    a->piece = a->taken = NULL;
}

static void *arena_take(fso_zero *z, size_t bytes)
{
    host_arena *a = &z->arena;
    size_t off = fso_fp_round_page(a->used);
    FSO_BUG_ON(off + bytes > a->bytes, "host arena overrun (%zu + %zu > %zu)", off, bytes,
               a->bytes);
    grow_list(&a->taken, &a->cap_taken, a->n_taken + 1);
    a->taken[a->n_taken++] = off;
    a->used = off + bytes;
    return (char *)a->base + off;
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

/* Commit [0, bytes) of the arena; nothing is touched (zr_arena_pin is). */
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
    fso_io_advise(from, len); /* before pinning faults the pages in */
    z->arena.bytes = bytes;
    return 0;
}

/* [pinned, end) into pieces cut where a handed-out range starts, each at
 * most pin_chunk_bytes unless one range alone is larger. */
static void cut_pieces(host_arena *a, size_t end)
{
    size_t at = a->pinned;
    for (int i = 0; i < a->n_taken; i++) {
        const size_t s = a->taken[i], e = i + 1 < a->n_taken ? a->taken[i + 1] : end;
        if (s > at && e - at > a->pin_chunk_bytes) {
            grow_list(&a->piece, &a->cap_pieces, a->n_pieces + 2);
            a->piece[++a->n_pieces] = s;
            at = s;
        }
    }
    grow_list(&a->piece, &a->cap_pieces, a->n_pieces + 2);
    a->piece[++a->n_pieces] = end;
    a->n_taken = 0;
}

/* Register or lock piece i as the configuration asks; false once refused. */
static bool pin_piece(fso_zero *z, int i, bool first)
{
    host_arena *a = &z->arena;
    char *from = (char *)a->base + a->piece[i];
    const size_t len = a->piece[i + 1] - a->piece[i];
#if FSO_HAVE_CUDA
    if (z->cuda) {
        char cerr[256] = "";
        if (a->n_registered == i && fso_cuda_host_register(from, len, cerr, sizeof cerr) == 0) {
            a->n_registered++;
            return true;
        }
        pin_refused(z, first, "host memory is pageable, not pinned: %s; copies between it "
                              "and the GPUs wait for the host and do not overlap compute",
                    cerr[0] ? cerr : "an earlier registration was refused");
        return false;
    }
#endif
    if (!z->cfg->offload.pin_memory)
        return true;
    if (mlock(from, len) == 0) {
        a->locked = true;
        return true;
    }
    char h1[32], h2[32];
    struct rlimit rl = {0};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    fso_human_bytes(h1, sizeof h1, (double)rl.rlim_cur);
    fso_human_bytes(h2, sizeof h2, (double)a->piece[i + 1]);
    pin_refused(z, first, "pin_memory: host memory is pageable, not locked: RLIMIT_MEMLOCK is "
                          "%s; locking %s needs `ulimit -l unlimited` (in a container: docker "
                          "run --ulimit memlock=-1)",
                rl.rlim_cur == RLIM_INFINITY ? "unlimited" : h1, h2);
    if (a->locked)
        munlock(a->base, a->piece[i]);
    a->locked = false;
    return false;
}

void zr_arena_pin(fso_zero *z, bool at_creation)
{
    host_arena *a = &z->arena;
    const size_t end = fso_fp_round_page(a->used);
    if (end <= a->pinned)
        return;
    const int from = a->n_pieces;
    cut_pieces(a, end);
    const bool progress = a->n_pieces - from > 1 && !a->refused &&
                          (z->cuda || z->cfg->offload.pin_memory);
    char h1[32], h2[32];
    fso_human_bytes(h2, sizeof h2, (double)(end - a->pinned));
    for (int i = from; i < a->n_pieces && !a->refused; i++) {
        if (progress) { /* a registration takes seconds per 64 GiB */
            fso_human_bytes(h1, sizeof h1, (double)(a->piece[i] - a->pinned));
            fprintf(stderr, "fsoff: pinning host memory: %s of %s done\n", h1, h2);
        }
        a->refused = !pin_piece(z, i, at_creation);
    }
    a->pinned = end;
    for (int r = 0; r < z->world && z->ranks; r++) {
        fso_store *st = z->ranks[r].io.store;
        if (st && st->ops->register_buffers &&
            st->ops->register_buffers(st, a->base, a->pinned) < 0 && r == 0)
            fprintf(stderr, "fsoff: warning: NVMe: %s; continuing with unregistered buffers "
                            "(slower)\n", st->err);
    }
}

/* Give back the pages of [p, p+bytes) of the arena (state that moved
 * elsewhere); CUDA-registered memory stays as it is. */
void zr_arena_release(fso_zero *z, void *p, size_t bytes)
{
    if (z->arena.n_registered)
        return;
    if (z->arena.locked)
        munlock(p, bytes);
    madvise(p, bytes, MADV_DONTNEED);
}

/* Host memory for device rk's state, bound to its NUMA node when the
 * machine has several, before any of its pages is touched. */
void *zr_rank_take(rank_state *rk, size_t bytes)
{
    void *p = arena_take(rk->z, bytes);
    if (rk->z->topo && rk->numa >= 0)
        fso_topo_bind_memory(rk->z->topo, p, bytes, rk->numa);
    return p;
}
