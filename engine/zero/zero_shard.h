/* zero_shard.h — private to engine/zero*.c (through zero_impl.h): where
 * each shard lives, and moving its data (zero_shard.c). Every read or write
 * of a shard where it lives goes through these functions. Places are setup:
 * made at creation and changed only by a re-plan (between steps, every
 * update finished, no save streaming), so the device's threads and the
 * saver read them without a lock. Ownership words are zero_impl.h's. */
#ifndef FSO_ZERO_SHARD_H
#define FSO_ZERO_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zero.h"
#include "zero_io.h"

/* Where one shard lives (setup). */
typedef struct loc {
    fso_tier tier;
    void *ptr;           /* DEVICE: the rank's device buffer; HOST: in the arena */
    uint64_t off;        /* NVME: byte offset in the rank's store */
} loc;

/* CPU devices' parameters in memory (device tier or host arena): one
 * buffer per block and tier, the devices' shards its parts in rank order
 * (the gathered layout), lent to every device as it is (zr_block_shared).
 * A re-plan between the two tiers holds both. Setup; the compute threads
 * read base. */
typedef struct lent_block {
    void *base;                  /* NULL: none */
    size_t bytes;
    int refs;                    /* devices whose shard is placed there */
} lent_block;

size_t zr_shard_elems(const fso_zero *z, int b);
/* Whether block b's parameters are lent to the model where they live, with
 * no gather (footprint.h fso_fp_lends_in_place, for the block's tier). */
bool zr_lends_in_place(const fso_zero *z, int b);
/* Each device's buffers for the blocks placed by rule r with `prefetch`
 * blocks read ahead: the footprint's (fso_fp_buffers_for), so that what is
 * allocated is what the footprint counts. */
void zr_buffers_for(const fso_zero *z, const fso_block_rule *r, int prefetch,
                    fso_fp_buffers *zb);
/* Whether rule r can place this trainer's blocks: counts no larger than
 * the model's blocks, and none that moves nothing (resident_blocks with
 * every block's parameters on the devices already, device_state_blocks with
 * all the optimizer's state there already). 0, or -EINVAL with a message
 * naming the key and the fix. */
int zr_check_rule(const fso_zero *z, const fso_block_rule *r, char *err, size_t errlen);
/* Bytes a shard of kind k of block b takes on its tier: whole pages. */
size_t zr_shard_bytes(const fso_zero *z, int b, fso_kind k);
loc *zr_locate(rank_state *rk, int b, fso_kind k);
/* A place for shard (b, k) of device rk on `tier`: device memory, host
 * memory from the arena, or the extent at *nvme_off of its store (*nvme_off
 * advances). 0, or negative errno with err (device memory short). */
int zr_place_shard(rank_state *rk, int b, fso_kind k, fso_tier tier, uint64_t *nvme_off,
                   loc *out, char *err, size_t errlen);
/* Whether shards of kind k on `tier` are parts of a block's shared buffer
 * (lent_block): parameters lent in place on more than one device. */
bool zr_block_shared(const fso_zero *z, fso_kind k, fso_tier tier);
/* Block b's shared buffer on `tier`. */
lent_block *zr_lent(fso_zero *z, int b, fso_tier tier);
/* Let go of the place l of shard (b, k); an NVMe extent stays the store's. */
void zr_release_shard(rank_state *rk, int b, fso_kind k, loc *l);
/* Move elements [c0, c0+n) of shard (b, k) between its tier and host
 * memory (c0 counts from the device shard's first element; a sliced kind
 * holds only [zr_kind_lo, + zr_kind_elems) of them, zero_rail.h), in the kind's element type (elem_bytes[k] each). Reading, *ptr is
 * set to the data: in the shard itself when in_place and the CPU can
 * address it, else s->buf (filled; NVMe: once s's I/O is waited for).
 * Writing, *ptr's data goes into the shard (NVMe: asynchronously on s).
 * The bytes the drive moves are added to bytes_done[k] (atomically: the
 * optimizer's counts are shared with the prefetch kick). */
int zr_xfer(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
            size_t c0, size_t n, slot *s, bool write, bool in_place, void **ptr);
/* zr_xfer through `buf` (4 KiB aligned) instead of s->buf; s tracks
 * the I/O and the copies either way. */
int zr_xfer_via(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                size_t c0, size_t n, slot *s, void *buf, bool write, bool in_place,
                void **ptr);
/* Where a writer of elements [c0, ...) of shard (b, k) should put them so
 * that zr_xfer(write) moves them once: the shard itself when in_place
 * and the CPU can address it, else s->buf. */
void *zr_xfer_dest(rank_state *rk, int b, fso_kind k, size_t c0, slot *s, bool in_place);
/* What this box holds of shard (b, k) (zr_kind_lo, zr_kind_elems: the
 * whole shard but for a sliced kind across boxes) read into dst instead of s->buf (4 KiB aligned, the
 * shard's whole pages: zr_shard_bytes); s tracks the I/O. */
int zr_shard_read_to(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                     slot *s, void *dst);
/* What this box holds of shard (b, k) into s->buf, and back (the compute
 * thread). */
int zr_shard_fetch(rank_state *rk, int b, fso_kind k, slot *s);
int zr_shard_store(rank_state *rk, int b, fso_kind k, slot *s);
/* Kind k of block b on every device from (dir 0) or to (dir 1) the flat
 * fp32 host buffer (padded_elems), converting to and from the kind's
 * element type; on the caller's thread, synchronously. */
int zr_block_xfer(fso_zero *z, int b, float *flat, fso_kind k, int dir);

#endif
