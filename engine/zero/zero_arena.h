/* zero_arena.h — private to engine/zero*.c (through zero_impl.h): the host
 * arena (zero_arena.c), one reservation of host memory for every device's
 * host-tier shards and staging buffers. Only setup touches it: creation, a
 * re-plan (between steps, every update finished, no save streaming) and
 * teardown, on the caller's thread; the other threads use the memory it
 * handed out, never its fields. */
#ifndef FSO_ZERO_ARENA_H
#define FSO_ZERO_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#include "zero.h"

typedef struct rank_state rank_state;

/* `reserve` bytes of address space reserved at start (nothing committed),
 * of which [0, bytes) is usable (committed, locked or registered with CUDA
 * as asked) and [0, used) handed out. A re-plan that moves state to the
 * host grows `bytes` in place, so pointers into it stay valid. */
typedef struct host_arena {
    void *base;
    size_t reserve, bytes, used;
    int n_pinned;                /* CUDA registrations: [pinned_at[i], pinned_at[i+1]) */
    size_t pinned_at[17];
    bool locked;                 /* [0, bytes) mlock'ed */
    char pin_refused[512];       /* why pinning was refused, and the fix; "" when it was not */
} host_arena;

/* Reserve `reserve` bytes of address space and make [0, bytes) usable.
 * 0 or -ENOMEM with err. */
int zr_arena_init(fso_zero *z, size_t reserve, size_t bytes, char *err, size_t errlen);
/* Make [0, bytes) usable: commit the new part, lock or register it with
 * CUDA as the configuration asks (a refusal is one warning and pageable
 * memory), and tell the NVMe stores. 0 or -ENOMEM with err. */
int zr_arena_grow(fso_zero *z, size_t bytes, char *err, size_t errlen);
/* Give back the pages of [p, p+bytes) (state that moved elsewhere). */
void zr_arena_release(fso_zero *z, void *p, size_t bytes);
/* Host memory for device rk's state, on its NUMA node when the machine has
 * several (best effort); aborts past the usable part (a sizing bug). */
void *zr_rank_take(rank_state *rk, size_t bytes);
/* Unregister and unmap the whole arena. */
void zr_arena_free(fso_zero *z);

#endif
