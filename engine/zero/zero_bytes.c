/* zero_bytes.c — a configuration's footprint (zero.h): the footprint
 * module's inputs (footprint.h) from a configuration — its rules, its
 * model's blocks and visits, its placement — and what it gives back: the
 * bytes each tier needs, and what one step moves. fso_zero_create
 * allocates by the same rules, and the planner counts by them. */
#include "zero.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"

void fso_zero_fp_rules(const fso_config *cfg, fso_fp_rules *r)
{
    fso_zero_fp_rules_on(cfg, fso_backend_row_of(cfg->backend), r);
}

void fso_zero_fp_rules_on(const fso_config *cfg, const fso_backend_row *on, fso_fp_rules *r)
{
    memset(r, 0, sizeof *r);
    r->world = fso_config_world(cfg);
    r->boxes = fso_config_boxes(cfg);
    r->host_addressable = on->host_addressable;
    for (int k = 0; k < FSO_N_KINDS; k++)
        r->dtype[k] = FSO_DT_F32;
    if (cfg->bf16)
        r->dtype[FSO_KIND_PARAM] = FSO_DT_BF16;
    r->aio_block_bytes = (size_t)cfg->offload.aio_block_bytes;
    r->aio_queue_depth = cfg->offload.aio_queue_depth;
    r->whole_copy = cfg->offload.whole_copy;
    r->bf16_grads = cfg->bf16_grads;
}

/* A layout's placement: cfg's rule, and the padded block sizes. */
typedef struct config_place {
    fso_block_rule rule;
    uint64_t padded[];
} config_place;

static fso_tier config_tier(const void *ctx, int b, fso_kind k)
{
    return fso_block_tier(&((const config_place *)ctx)->rule, k, b);
}

/* The model's blocks, padded for the rules' device count, placed by cfg.
 * l->ctx is malloc'ed (free it). 0 or -ENOMEM. */
static int config_layout(const fso_config *cfg, const fso_fp_rules *r, fso_fp_layout *l)
{
    const int nb = fso_model_n_blocks(&cfg->model);
    fso_block_layout *bl = calloc((size_t)nb, sizeof *bl);
    config_place *cp = calloc(1, sizeof *cp + (size_t)nb * sizeof(uint64_t));
    if (!bl || !cp) {
        free(bl);
        free(cp);
        return -ENOMEM;
    }
    fso_model_layout(bl, &cfg->model, r->world * fso_fp_boxes(r));
    for (int b = 0; b < nb; b++)
        cp->padded[b] = bl[b].padded_elems;
    free(bl);
    fso_offload_block_rule(&cfg->offload, nb, &cp->rule);
    *l = (fso_fp_layout){.n_blocks = nb, .padded_elems = cp->padded, .tier = config_tier,
                         .ctx = cp, .prefetch = cfg->offload.prefetch_blocks};
    return 0;
}

void fso_zero_need_for(const fso_config *cfg, fso_zero_need *n)
{
    fso_zero_need_on(cfg, fso_backend_row_of(cfg->backend), n);
}

void fso_zero_need_on(const fso_config *cfg, const fso_backend_row *on, fso_zero_need *n)
{
    fso_fp_rules r;
    fso_fp_layout l;
    fso_fp_need fp;
    memset(n, 0, sizeof *n);
    fso_zero_fp_rules_on(cfg, on, &r);
    if (config_layout(cfg, &r, &l) < 0) { /* no room to count in: nothing fits */
        for (int t = 0; t < FSO_N_TIERS; t++)
            n->tier[t] = FSO_BYTES_OVERFLOW;
        return;
    }
    fso_fp_need_for(&r, &l, &fp);
    free((void *)l.ctx);
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int t = 0; t < FSO_N_TIERS; t++)
            n->kind_bytes[k] = fso_sat_add(n->kind_bytes[k],
                                           t == FSO_TIER_DEVICE
                                               ? fso_sat_mul(fp.kind_bytes[t][k], (uint64_t)r.world)
                                               : fp.kind_bytes[t][k]);
    const fso_tier acts = fso_config_acts_tier(cfg);
    n->activations = fso_sat_add(
        fso_model_activation_bytes_tier(&cfg->model, cfg->micro_batch, cfg->data.seq_len,
                                        cfg->activation_checkpointing, cfg->bf16, acts),
        fso_zero_widen_bytes(cfg, on));
    n->saver = fso_zero_saver_bytes(cfg);
    n->act_host = fso_model_host_act_bytes_for(&cfg->model, cfg->micro_batch, cfg->data.seq_len,
                                               cfg->activation_checkpointing, cfg->bf16, acts);
    n->device_buffers = fp.device_buffers;
    n->staging = fp.staging;
    for (int t = 0; t < FSO_N_TIERS; t++)
        n->tier[t] = fp.tier[t];
    n->tier[FSO_TIER_DEVICE] = fso_sat_add(n->tier[FSO_TIER_DEVICE], n->activations);
    n->tier[FSO_TIER_HOST] = fso_sat_add(n->tier[FSO_TIER_HOST], n->saver);
    n->tier[FSO_TIER_HOST] = fso_sat_add(n->tier[FSO_TIER_HOST],
                                         fso_sat_mul(n->act_host, (uint64_t)fso_config_world(cfg)));
}

uint64_t fso_zero_widen_bytes(const fso_config *cfg, const fso_backend_row *on)
{
    return cfg->bf16 && !on->gpu ? fso_model_cpu_widen_bytes_for(&cfg->model, cfg->micro_batch,
                                                                 cfg->data.seq_len)
                                 : 0;
}

uint64_t fso_zero_saver_bytes(const fso_config *cfg)
{
    return cfg->checkpoint.dir[0] ? (uint64_t)FSO_ZERO_SAVE_STAGES *
                                        fso_sat_round_up(FSO_ZERO_SAVE_PIECE_BYTES, FSO_IO_ALIGN)
                                  : 0;
}

int fso_zero_step_traffic(const fso_config *cfg, fso_fp_traffic *t)
{
    const fso_model_config *mc = &cfg->model;
    const int nb = fso_model_n_blocks(mc), nv = fso_model_max_visits(mc);
    fso_fp_rules r;
    fso_fp_layout l;
    memset(t, 0, sizeof *t);
    fso_zero_fp_rules(cfg, &r);
    fso_block_visit *visits = calloc((size_t)nv, sizeof *visits);
    int *pv = calloc((size_t)nb, sizeof *pv), *gv = calloc((size_t)nb, sizeof *gv);
    int rc = -ENOMEM;
    if (visits && pv && gv && (rc = config_layout(cfg, &r, &l)) == 0) {
        for (int i = 0, n = fso_model_visits(mc, visits); i < n; i++) {
            pv[visits[i].block] += visits[i].params;
            gv[visits[i].block] += visits[i].grads;
        }
        const fso_fp_uses u = {.param_visits = pv, .grad_visits = gv,
                               .grad_accum = cfg->grad_accum};
        fso_fp_step_traffic(&r, &l, &u, t);
        free((void *)l.ctx);
    }
    free(visits);
    free(pv);
    free(gv);
    return rc;
}
