/* footprint.c — the engine's memory and traffic rules (footprint.h). */
#include "footprint.h"

#include <string.h>

#include "util.h"

size_t fso_fp_elem_bytes(const fso_fp_rules *r, fso_kind k)
{
    return fso_dtype_size(r->dtype[k]);
}

uint64_t fso_fp_round_page(uint64_t x)
{
    return fso_sat_round_up(x, FSO_IO_PAGE);
}

uint64_t fso_fp_shard_elems(const fso_fp_rules *r, uint64_t padded_elems)
{
    return fso_sat_div(padded_elems, (uint64_t)(r->world > 0 ? r->world : 1));
}

int fso_fp_boxes(const fso_fp_rules *r)
{
    return r->boxes > 1 ? r->boxes : 1;
}

bool fso_fp_sliced(fso_kind k)
{
    return k == FSO_KIND_MASTER || k == FSO_KIND_M || k == FSO_KIND_V;
}

uint64_t fso_fp_kind_elems(const fso_fp_rules *r, uint64_t padded_elems, fso_kind k)
{
    const uint64_t s = fso_fp_shard_elems(r, padded_elems);
    return fso_fp_sliced(k) ? s / (uint64_t)fso_fp_boxes(r) : s;
}

uint64_t fso_fp_shard_bytes(const fso_fp_rules *r, uint64_t padded_elems, fso_kind k)
{
    return fso_fp_round_page(
        fso_sat_mul(fso_fp_elem_bytes(r, k), fso_fp_kind_elems(r, padded_elems, k)));
}

bool fso_fp_lends_in_place(const fso_fp_rules *r, fso_tier param_tier)
{
    return (param_tier == FSO_TIER_DEVICE && r->world <= 1) ||
           (param_tier != FSO_TIER_NVME && r->host_addressable);
}

bool fso_fp_chunks_needed(const fso_fp_rules *r, fso_tier t)
{
    return t == FSO_TIER_NVME || (t == FSO_TIER_DEVICE && !r->host_addressable);
}

bool fso_fp_copies_whole(const fso_fp_rules *r, fso_tier param_tier)
{
    return r->whole_copy && r->world > 1 && !r->host_addressable &&
           param_tier != FSO_TIER_DEVICE;
}

bool fso_fp_landing_needed(const fso_fp_rules *r, fso_tier t)
{
    return t == FSO_TIER_NVME || (t == FSO_TIER_HOST && !r->host_addressable);
}

bool fso_fp_cpu_reaches(const fso_fp_rules *r, fso_tier t)
{
    return t == FSO_TIER_HOST || (t == FSO_TIER_DEVICE && r->host_addressable);
}

fso_tier fso_fp_rule_tier(const void *rule, int block, fso_kind k)
{
    return fso_block_tier(rule, k, block);
}

int fso_fp_grad_send_buffers(const fso_fp_rules *r, uint64_t max_padded, size_t *bytes)
{
    const bool send = r->bf16_grads && !r->host_addressable;
    *bytes = send ? fso_sat_mul(sizeof(uint16_t), max_padded) : 0;
    return send ? 2 : 0;
}

size_t fso_fp_reduce_elem_bytes(const fso_fp_rules *r)
{
    return r->bf16_grads && !r->host_addressable ? sizeof(uint16_t)
                                                 : fso_fp_elem_bytes(r, FSO_KIND_GRAD);
}

void fso_fp_buffers_for(const fso_fp_rules *r, const fso_fp_layout *l, fso_fp_buffers *b)
{
    const size_t param_bytes = fso_fp_elem_bytes(r, FSO_KIND_PARAM);
    uint64_t max_padded = 0;
    bool gathered = false, param_nvme = false;

    memset(b, 0, sizeof *b);
    for (int i = 0; i < l->n_blocks; i++) {
        if (l->padded_elems[i] > max_padded)
            max_padded = l->padded_elems[i];
        const fso_tier pt = l->tier(l->ctx, i, FSO_KIND_PARAM);
        gathered = gathered || !fso_fp_lends_in_place(r, pt);
        param_nvme = param_nvme || pt == FSO_TIER_NVME;
        b->landings = b->landings ||
                      fso_fp_landing_needed(r, l->tier(l->ctx, i, FSO_KIND_GRAD));
        for (int k = 0; k < FSO_N_KINDS; k++)
            b->chunked[k] = b->chunked[k] ||
                            fso_fp_chunks_needed(r, l->tier(l->ctx, i, (fso_kind)k));
    }
    for (int k = 0; k < FSO_N_KINDS; k++)
        b->chunk_kinds += b->chunked[k];
    const uint64_t max_shard = fso_fp_shard_elems(r, max_padded);
    b->gather = gathered ? FSO_FP_GATHER_BUFFERS : 0;
    b->gather_bytes = fso_sat_mul(param_bytes, max_padded);
    b->grad_full = 2;
    b->grad_full_bytes = fso_sat_mul(fso_fp_elem_bytes(r, FSO_KIND_GRAD), max_padded);
    b->prefetch_spare = FSO_FP_SPARE_SLOTS;
    b->max_prefetch = FSO_FP_MAX_PREFETCH;
    b->prefetch_slots = param_nvme ? l->prefetch + FSO_FP_SPARE_SLOTS : 0;
    b->prefetch_slot_bytes = fso_fp_round_page(fso_sat_mul(param_bytes, max_shard));
    b->stage_slots = 1;
    b->landing_slots = 2;
    b->stage_slot_bytes = fso_fp_round_page(fso_sat_mul(sizeof(float), max_shard));
    /* A chunk of bf16 parameters takes half a chunk's bytes and must start
     * page-aligned in the file (O_DIRECT), so with bf16 a chunk that splits
     * a shard is a multiple of two pages. */
    b->chunk_bytes = r->aio_block_bytes;
    if (param_bytes < sizeof(float))
        b->chunk_bytes = fso_sat_round_up(b->chunk_bytes, 2 * (uint64_t)FSO_IO_PAGE);
    if (b->chunk_bytes > b->stage_slot_bytes)
        b->chunk_bytes = b->stage_slot_bytes;
    const size_t units = b->chunk_bytes ? (b->stage_slot_bytes + b->chunk_bytes - 1) /
                                              b->chunk_bytes : 1;
    b->chunk_sets = r->aio_queue_depth / 4;
    if ((size_t)b->chunk_sets > 2 * units)
        b->chunk_sets = (int)(2 * units);
    if (b->chunk_sets < 2)
        b->chunk_sets = 2;
    if (b->chunk_sets > FSO_FP_MAX_CHUNK_SETS)
        b->chunk_sets = FSO_FP_MAX_CHUNK_SETS;
}

uint64_t fso_fp_staging_bytes(const fso_fp_buffers *b)
{
    const uint64_t slots =
        (uint64_t)b->stage_slots + (b->landings ? (uint64_t)b->landing_slots : 0);
    return fso_sat_add(
        fso_sat_add(fso_sat_mul(b->prefetch_slot_bytes, (uint64_t)b->prefetch_slots),
                    fso_sat_mul(b->stage_slot_bytes, slots)),
        fso_sat_mul(b->chunk_bytes, (uint64_t)b->chunk_sets * (uint64_t)b->chunk_kinds));
}

void fso_fp_need_for(const fso_fp_rules *r, const fso_fp_layout *l, fso_fp_need *n)
{
    const uint64_t W = (uint64_t)(r->world > 0 ? r->world : 1);
    memset(n, 0, sizeof *n);
    for (int b = 0; b < l->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++) {
            const fso_tier t = l->tier(l->ctx, b, (fso_kind)k);
            const uint64_t s = fso_fp_shard_bytes(r, l->padded_elems[b], (fso_kind)k);
            n->kind_bytes[t][k] =
                fso_sat_add(n->kind_bytes[t][k], t == FSO_TIER_DEVICE ? s : fso_sat_mul(s, W));
        }
    fso_fp_buffers *bf = &n->buffers;
    fso_fp_buffers_for(r, l, bf);
    uint64_t max_padded = 0;
    for (int b = 0; b < l->n_blocks; b++)
        if (l->padded_elems[b] > max_padded)
            max_padded = l->padded_elems[b];
    size_t send_bytes;
    const int sends = fso_fp_grad_send_buffers(r, max_padded, &send_bytes);
    n->device_buffers = fso_sat_add(
        fso_sat_add(fso_sat_mul(bf->gather_bytes, (uint64_t)bf->gather),
                    fso_sat_mul(bf->grad_full_bytes, (uint64_t)bf->grad_full)),
        fso_sat_mul(send_bytes, (uint64_t)sends));
    n->staging = fso_fp_staging_bytes(bf);
    for (int t = 0; t < FSO_N_TIERS; t++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            n->tier[t] = fso_sat_add(n->tier[t], n->kind_bytes[t][k]);
    n->tier[FSO_TIER_DEVICE] = fso_sat_add(n->tier[FSO_TIER_DEVICE], n->device_buffers);
    n->tier[FSO_TIER_HOST] = fso_sat_add(n->tier[FSO_TIER_HOST], fso_sat_mul(n->staging, W));
}

void fso_fp_step_traffic(const fso_fp_rules *r, const fso_fp_layout *l, const fso_fp_uses *u,
                         fso_fp_traffic *t)
{
    const uint64_t W = (uint64_t)(r->world > 0 ? r->world : 1), G = (uint64_t)u->grad_accum;
    memset(t, 0, sizeof *t);
    for (int b = 0; b < l->n_blocks; b++) {
        const uint64_t pv = (uint64_t)u->param_visits[b], gv = (uint64_t)u->grad_visits[b];
        const uint64_t all = fso_sat_mul(l->padded_elems[b], W); /* every device's whole block */
        const fso_tier pt = l->tier(l->ctx, b, FSO_KIND_PARAM);
        const bool whole = fso_fp_copies_whole(r, pt);
        const uint64_t B = (uint64_t)fso_fp_boxes(r);
        if (B > 1) { /* every device: its gradient shard and its parameters, each
                        (B-1)/B of it sent (the slice divides by B exactly) */
            const uint64_t shard = fso_fp_shard_elems(r, l->padded_elems[b]);
            const uint64_t per = fso_sat_mul(shard / B * (B - 1),
                                             fso_fp_elem_bytes(r, FSO_KIND_GRAD) +
                                                 fso_fp_elem_bytes(r, FSO_KIND_PARAM));
            t->net_bytes = fso_sat_add(t->net_bytes, fso_sat_mul(per, W));
        }
        if (!fso_fp_lends_in_place(r, pt) && !whole)
            t->gather_bytes = fso_sat_add(
                t->gather_bytes,
                fso_sat_mul(fso_sat_mul(all, pv * G), fso_fp_elem_bytes(r, FSO_KIND_PARAM)));
        t->reduce_bytes = fso_sat_add(
            t->reduce_bytes,
            fso_sat_mul(fso_sat_mul(all, gv * G), fso_fp_reduce_elem_bytes(r)));
        for (int k = 0; k < FSO_N_KINDS; k++) {
            if (l->tier(l->ctx, b, (fso_kind)k) != FSO_TIER_NVME)
                continue;
            const uint64_t s = fso_sat_mul(fso_fp_shard_bytes(r, l->padded_elems[b], (fso_kind)k),
                                           W);
            uint64_t rd = s, wr = s; /* master, m, v: read and written by AdamW */
            if (k == FSO_KIND_PARAM) /* read at every visit (copied whole: by every
                                        device), written by AdamW */
                rd = fso_sat_mul(fso_sat_mul(s, pv * G), whole ? W : 1);
            else if (k == FSO_KIND_GRAD) /* written by every micro-batch, read by every one
                                            but the first and by AdamW */
                rd = wr = fso_sat_mul(s, G);
            t->nvme_read[k] = fso_sat_add(t->nvme_read[k], rd);
            t->nvme_write[k] = fso_sat_add(t->nvme_write[k], wr);
        }
    }
}
