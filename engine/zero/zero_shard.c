/* zero_shard.c — where each shard lives: placing a shard of a kind on a
 * tier (device memory, the host arena, an extent of the NVMe store),
 * letting it go, and moving its data to and from host memory, a chunk, a
 * whole shard, or a whole block across every device. Everything that reads
 * or writes a shard where it lives goes through here. */
#include "zero_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "topology.h"
#include "util.h"

size_t zr_shard_elems(const fso_zero *z, int b)
{
    return fso_fp_shard_elems(&z->rules, z->blocks[b].padded_elems);
}

size_t zr_kind_elems(const fso_zero *z, int b, fso_kind k)
{
    return fso_fp_kind_elems(&z->rules, z->blocks[b].padded_elems, k);
}

size_t zr_kind_lo(const fso_zero *z, int b, fso_kind k)
{
    return fso_fp_sliced(k) ? (size_t)z->box * zr_kind_elems(z, b, k) : 0;
}

bool zr_lends_in_place(const fso_zero *z, int b)
{
    return fso_fp_lends_in_place(&z->rules, zr_block_tier(z, b, FSO_KIND_PARAM));
}

void zr_buffers_for(const fso_zero *z, const fso_block_rule *r, int prefetch,
                    fso_fp_buffers *zb)
{
    uint64_t padded[z->n_blocks > 0 ? z->n_blocks : 1];
    for (int b = 0; b < z->n_blocks; b++)
        padded[b] = z->blocks[b].padded_elems;
    const fso_fp_layout l = {.n_blocks = z->n_blocks, .padded_elems = padded,
                             .tier = fso_fp_rule_tier, .ctx = r, .prefetch = prefetch};
    fso_fp_buffers_for(&z->rules, &l, zb);
}

int zr_check_rule(const fso_zero *z, const fso_block_rule *r, char *err, size_t errlen)
{
    const int nb = z->n_blocks;
    const char *const key[2] = {"train.resident_blocks", "train.device_state_blocks"};
    const int count[2] = {r->resident_blocks, r->device_state_blocks};
    for (int i = 0; i < 2; i++)
        if (count[i] > nb) {
            snprintf(err, errlen, "%s: %d blocks, but the model has %d (the embedding, %d "
                                  "layers, the head); give 0 to %d",
                     key[i], count[i], nb, nb - 2, nb);
            return -EINVAL;
        }
    if (r->resident_blocks > 0 && r->tier[FSO_KIND_PARAM] == FSO_TIER_DEVICE) {
        snprintf(err, errlen, "train.resident_blocks: %d blocks, but every block's parameters "
                              "are on the devices already (zero_optimization.offload_param."
                              "device \"none\"); drop train.resident_blocks, or offload the "
                              "parameters (\"cpu\" or \"nvme\") to stream the other blocks",
                 r->resident_blocks);
        return -EINVAL;
    }
    bool all_device = true;
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        all_device = all_device && r->tier[k] == FSO_TIER_DEVICE;
    if (r->device_state_blocks > 0 && all_device) {
        snprintf(err, errlen, "train.device_state_blocks: %d blocks, but every block's "
                              "optimizer state and gradients are on the devices already "
                              "(zero_optimization.offload_optimizer.device \"none\"); drop "
                              "train.device_state_blocks, or offload the optimizer (\"cpu\" "
                              "or \"nvme\") to update the other blocks on the CPU",
                 r->device_state_blocks);
        return -EINVAL;
    }
    if (r->state_host_blocks < 0 || r->state_host_blocks >= nb) {
        snprintf(err, errlen, "offload: state_host_blocks %d: must be 0 to %d (fewer than the "
                              "model's %d blocks)", r->state_host_blocks, nb - 1, nb);
        return -EINVAL;
    }
    return 0;
}

loc *zr_locate(rank_state *rk, int b, fso_kind k)
{
    return &rk->locs[b * FSO_N_KINDS + k];
}

size_t zr_shard_bytes(const fso_zero *z, int b, fso_kind k)
{
    return fso_fp_shard_bytes(&z->rules, z->blocks[b].padded_elems, k);
}

bool zr_block_shared(const fso_zero *z, fso_kind k, fso_tier tier)
{
    return k == FSO_KIND_PARAM && z->world > 1 && fso_fp_lends_in_place(&z->rules, tier);
}

lent_block *zr_lent(fso_zero *z, int b, fso_tier tier)
{
    return &z->lent[(size_t)b * FSO_N_TIERS + tier];
}

/* Device rk's part of block b's shared parameter buffer on `tier`, which
 * the first device to place its part allocates: device memory (each device
 * charged its part), or from the host arena. Each part on its device's
 * NUMA node when the machine has several. */
static int place_shared(rank_state *rk, int b, fso_tier tier, loc *out, char *err, size_t errlen)
{
    fso_zero *z = rk->z;
    lent_block *lb = zr_lent(z, b, tier);
    const size_t part = z->elem_bytes[FSO_KIND_PARAM] * zr_shard_elems(z, b);
    const size_t bytes = zr_shard_bytes(z, b, FSO_KIND_PARAM);
    int rc;
    if (tier == FSO_TIER_DEVICE && (rc = fso_backend_charge(rk->be, bytes)) < 0) {
        snprintf(err, errlen, "device memory: %s", rk->be->err);
        return rc;
    }
    if (!lb->base) {
        lb->bytes = fso_fp_round_page(part * (size_t)z->world);
        if (tier == FSO_TIER_HOST) {
            lb->base = zr_rank_take(rk, lb->bytes);
        } else if (!(lb->base = fso_io_alloc_lean(lb->bytes))) {
            fso_backend_uncharge(rk->be, bytes);
            snprintf(err, errlen, "host memory: out of memory for block %d's parameters (%zu "
                                  "bytes)", b, lb->bytes);
            return -ENOMEM;
        }
    }
    lb->refs++;
    out->ptr = (char *)lb->base + (size_t)rk->rank * part;
    if (z->topo && rk->numa >= 0)
        fso_topo_bind_memory(z->topo, out->ptr, part, rk->numa);
    return 0;
}

static void release_shared(rank_state *rk, int b, loc *l)
{
    fso_zero *z = rk->z;
    lent_block *lb = zr_lent(z, b, l->tier);
    const size_t bytes = zr_shard_bytes(z, b, FSO_KIND_PARAM);
    if (l->tier == FSO_TIER_DEVICE)
        fso_backend_uncharge(rk->be, bytes);
    else /* the arena's pages of this part (whole pages: model.h) */
        zr_arena_release(z, l->ptr, z->elem_bytes[FSO_KIND_PARAM] *
                                              zr_shard_elems(z, b));
    if (--lb->refs == 0) {
        if (l->tier == FSO_TIER_DEVICE)
            fso_io_free(lb->base, lb->bytes);
        lb->base = NULL;
    }
}

int zr_place_shard(rank_state *rk, int b, fso_kind k, fso_tier tier, uint64_t *nvme_off,
                   loc *out, char *err, size_t errlen)
{
    const size_t bytes = zr_shard_bytes(rk->z, b, k);
    memset(out, 0, sizeof *out);
    out->tier = tier;
    if (zr_block_shared(rk->z, k, tier))
        return place_shared(rk, b, tier, out, err, errlen);
    if (tier == FSO_TIER_DEVICE) {
        int rc = rk->be->ops->buf_alloc(rk->be, bytes, &out->ptr);
        if (rc < 0)
            snprintf(err, errlen, "device memory: %s", rk->be->err);
        return rc;
    }
    if (tier == FSO_TIER_HOST) {
        out->ptr = zr_rank_take(rk, bytes);
    } else {
        out->off = *nvme_off;
        *nvme_off += bytes;
    }
    return 0;
}

void zr_release_shard(rank_state *rk, int b, fso_kind k, loc *l)
{
    if (zr_block_shared(rk->z, k, l->tier) && l->ptr)
        release_shared(rk, b, l);
    else if (l->tier == FSO_TIER_DEVICE)
        rk->be->ops->buf_free(rk->be, l->ptr);
    else if (l->tier == FSO_TIER_HOST && l->ptr)
        zr_arena_release(rk->z, l->ptr, zr_shard_bytes(rk->z, b, k));
    l->ptr = NULL;
}

static bool addressable(const rank_state *rk, const loc *l)
{
    return fso_fp_cpu_reaches(&rk->z->rules, l->tier);
}

void *zr_xfer_dest(rank_state *rk, int b, fso_kind k, size_t c0, slot *s, bool in_place)
{
    loc *l = zr_locate(rk, b, k);
    if (in_place && addressable(rk, l))
        return (char *)l->ptr + rk->z->elem_bytes[k] * (c0 - zr_kind_lo(rk->z, b, k));
    return s->buf;
}

int zr_xfer_via(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                    size_t c0, size_t n, slot *s, void *buf, bool write, bool in_place,
                    void **ptr)
{
    loc *l = zr_locate(rk, b, k);
    const size_t eb = rk->z->elem_bytes[k];
    size_t bytes = eb * n;
    c0 -= zr_kind_lo(rk->z, b, k); /* where this box's part of the shard begins */
    void *shard = l->ptr ? (char *)l->ptr + eb * c0 : NULL;
    if (in_place && addressable(rk, l)) {
        if (!write)
            *ptr = shard;
        else if (*ptr != shard)
            memcpy(shard, *ptr, bytes);
        return 0;
    }
    if (!write)
        *ptr = buf;
    else if (*ptr != buf)
        memcpy(buf, *ptr, bytes);
    switch (l->tier) {
    case FSO_TIER_NVME:
        /* O_DIRECT: whole pages at page offsets. Chunks start at a multiple
         * of 4 KiB of the kind's bytes (fso_fp_buffers chunk_bytes) and
         * shards are whole pages (model.h padded_elems); what the drive
         * moves is what is counted */
        __atomic_fetch_add(&bytes_done[k], fso_fp_round_page(bytes), __ATOMIC_RELAXED);
        return zr_queue_io(rk, es, s, write, buf, fso_fp_round_page(bytes), l->off + eb * c0);
    case FSO_TIER_HOST:
        if (write)
            memcpy(shard, buf, bytes);
        else
            memcpy(buf, shard, bytes);
        return 0;
    case FSO_TIER_DEVICE: {
        fso_backend *be = rk->be;
        if (!be->ops->mark) { /* copies are done when they return */
            if (write)
                be->ops->copy_h2d(be, shard, buf, bytes);
            else
                be->ops->copy_d2h(be, buf, shard, bytes);
            return be->ops->sync(be);
        }
        /* ordered after the optimizer job's work only, and waited for by
         * zr_slot_wait before the host touches buf again; the optimizer's
         * copies share one mark per batch (zr_marks_defer) */
        const bool optimizer = es == &rk->opt.err;
        const uint64_t after = optimizer ? rk->opt.after : 0;
        if (write)
            zr_copy_in(be, shard, buf, bytes, after);
        else
            zr_copy_out(be, buf, shard, bytes, after);
        if (optimizer)
            zr_marks_defer(rk, s);
        else
            s->copied = zr_mark_copies(be);
        return 0;
    }
    default:
        return -EINVAL;
    }
}

int zr_xfer(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
            size_t c0, size_t n, slot *s, bool write, bool in_place, void **ptr)
{
    return zr_xfer_via(rk, es, bytes_done, b, k, c0, n, s, s->buf, write, in_place, ptr);
}

int zr_shard_read_to(rank_state *rk, errsink *es, uint64_t *bytes_done, int b, fso_kind k,
                     slot *s, void *dst)
{
    void *p;
    return zr_xfer_via(rk, es, bytes_done, b, k, zr_kind_lo(rk->z, b, k),
                    zr_kind_elems(rk->z, b, k), s, dst, false, false, &p);
}

/* Whole shard (b, k) into s->buf, and back (compute thread). */
int zr_shard_fetch(rank_state *rk, int b, fso_kind k, slot *s)
{
    void *p;
    return zr_xfer(rk, &rk->compute.err, rk->compute.st.nvme_kind_read, b, k,
                   zr_kind_lo(rk->z, b, k), zr_kind_elems(rk->z, b, k), s, false, false, &p);
}

int zr_shard_store(rank_state *rk, int b, fso_kind k, slot *s)
{
    void *p = s->buf;
    return zr_xfer(rk, &rk->compute.err, rk->compute.st.nvme_kind_write, b, k,
                   zr_kind_lo(rk->z, b, k), zr_kind_elems(rk->z, b, k), s, true, false, &p);
}

/* n fp32 values into elements of elem_bytes (4: fp32, 2: bf16 rounded to
 * nearest even, as the optimizer writes them), and back (exact). */
static void narrow(void *dst, size_t elem_bytes, const float *src, size_t n)
{
    if (elem_bytes == sizeof(float)) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = fso_bf16_from_f32(src[i]);
}

static void widen(float *dst, const void *src, size_t elem_bytes, size_t n)
{
    if (elem_bytes == sizeof(float)) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = fso_f32_from_bf16(h[i]);
}

/* Copy kind k of block b's shards on every rank from (dir 0) or to (dir 1)
 * the flat fp32 host buffer, converting to and from the kind's element
 * type. Runs on the caller's thread, synchronously. Across boxes a sliced
 * kind takes this box's slice from the buffer, and gives the whole block
 * gathered from every box (zr_rail_gather_block). */
int zr_block_xfer(fso_zero *z, int b, float *flat, fso_kind k, int dir)
{
    if (dir == 1 && z->boxes > 1 && fso_fp_sliced(k))
        return zr_rail_gather_block(z, b, k, flat);
    const size_t S = zr_shard_elems(z, b), lo = zr_kind_lo(z, b, k), n = zr_kind_elems(z, b, k);
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        slot *s = &rk->io.grad_trip;
        int rc;
        rk->compute.err.rc = 0;
        if (dir == 0) {
            narrow(s->buf, z->elem_bytes[k], flat + (size_t)r * S + lo, n);
            rc = zr_shard_store(rk, b, k, s);
            if (rc == 0)
                rc = zr_slot_wait(rk, &rk->compute.err, s, fso_kind_name(k), b);
        } else {
            rc = zr_shard_fetch(rk, b, k, s);
            if (rc == 0)
                rc = zr_slot_wait(rk, &rk->compute.err, s, fso_kind_name(k), b);
            if (rc == 0)
                widen(flat + (size_t)r * S + lo, s->buf, z->elem_bytes[k], n);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}
