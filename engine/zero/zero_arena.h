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

/* The most one pinning registration covers: the CUDA driver refuses much
 * larger (its page tables), and a copy whose host range spans two
 * registrations is refused too (CUDA_ERROR_INVALID_VALUE). The arena is
 * the one place that knows where its registrations start and end, and no
 * range it hands out crosses one. */
#define ZR_ARENA_PIN_CHUNK ((size_t)64 << 30)

/* `reserve` bytes of address space reserved at start (nothing committed),
 * of which [0, bytes) is committed and [0, used) handed out. Pages are
 * touched first by pinning, after the device a range went to has bound it
 * to its NUMA node (zr_rank_take), never before: [0, pinned) is pinned
 * (registered with CUDA, or locked, as asked; or refused: pageable) in
 * pieces, [piece[i], piece[i+1]) one registration each, cut between the
 * ranges handed out, each at most pin_chunk_bytes unless one range alone is
 * larger. A re-plan that moves state to the host grows `bytes` in place, so
 * pointers into it stay valid. */
typedef struct host_arena {
    void *base;
    size_t reserve, bytes, used;
    size_t pin_chunk_bytes;      /* ZR_ARENA_PIN_CHUNK; tests shrink it */
    size_t pinned;
    size_t *piece;               /* n_pieces + 1 offsets: piece[0] = 0, the last = pinned */
    int n_pieces;
    int n_registered;            /* CUDA registrations: the first n_registered pieces */
    size_t *taken;               /* starts of the ranges handed out in [pinned, used) */
    int n_taken, cap_taken, cap_pieces;
    bool refused;                /* pinning was refused: the rest stays pageable */
    bool locked;                 /* [0, pinned) mlock'ed */
    char pin_refused[512];       /* why pinning was refused, and the fix; "" when it was not */
} host_arena;

/* Reserve `reserve` bytes of address space and commit [0, bytes) (no page
 * touched). 0 or -ENOMEM with err. */
int zr_arena_init(fso_zero *z, size_t reserve, size_t bytes, char *err, size_t errlen);
/* Commit [0, bytes) (no page touched). 0 or -ENOMEM with err. */
int zr_arena_grow(fso_zero *z, size_t bytes, char *err, size_t errlen);
/* Pin what was handed out since the last call, once every device has bound
 * its ranges: register it with CUDA or lock it as the configuration asks,
 * in pieces that no handed-out range crosses (a refusal is one warning and
 * pageable memory: kept for the banner at creation, at once otherwise),
 * and register [0, pinned) with the NVMe stores. A progress line for each
 * piece when there are several. */
void zr_arena_pin(fso_zero *z, bool at_creation);
/* Give back the pages of [p, p+bytes) (state that moved elsewhere). */
void zr_arena_release(fso_zero *z, void *p, size_t bytes);
/* Host memory for device rk's state, bound to its NUMA node when the
 * machine has several (before any page is touched: pinning comes after);
 * aborts past the committed part (a sizing bug). */
void *zr_rank_take(rank_state *rk, size_t bytes);
/* Unregister and unmap the whole arena. */
void zr_arena_free(fso_zero *z);

#endif
