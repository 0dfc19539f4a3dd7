/* zero.c — the sharded trainer's setup and teardown (zero.h): the layout
 * and the buffers a configuration needs, budgets checked before anything
 * large is allocated, each device's backend and model, its shards, buffers
 * and NVMe store, the collectives, the initial values; and what reports
 * read. The trainer's other parts, one file each, are listed in
 * zero_impl.h. */
#include "zero.h"
#include "zero_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "boxes.h"
#include "cuda/cuda_backend.h"
#include "hf/hf.h"
#include "optpool.h"
#include "rng.h"
#include "topology.h"
#include "util.h"

/* ------------------------------------------------------------------ layout */

/* Tiers, element types, the blocks and the order params() asks for them. */
static int setup_layout(fso_zero *z, const fso_config *cfg, fso_fp_buffers *zb, char *err,
                        size_t errlen)
{
    z->cfg = cfg;
    fso_zero_fp_rules(cfg, &z->rules);
    z->world = z->rules.world;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        z->tier[k] = fso_offload_tier(&cfg->offload, (fso_kind)k);
        z->elem_bytes[k] = fso_fp_elem_bytes(&z->rules, (fso_kind)k);
    }
    z->prefetch = cfg->offload.prefetch_blocks;
    z->cuda = cfg->backend == FSO_BACKEND_CUDA;
    fso_isa isa; /* FSO_ISA, else the widest the CPU has */
    int rc;
    if ((rc = fso_isa_from_env(&isa, err, errlen)) < 0 ||
        (rc = fso_adamw_select(isa, &z->adamw)) < 0)
        return rc;

    const int max_visits = fso_model_max_visits(&cfg->model);
    z->n_blocks = fso_model_n_blocks(&cfg->model);
    fso_offload_block_rule(&cfg->offload, z->n_blocks, &z->rule); /* checked by create */
    z->blocks = calloc((size_t)z->n_blocks, sizeof *z->blocks);
    z->ranks = calloc((size_t)z->world, sizeof *z->ranks);
    z->order = calloc((size_t)max_visits, sizeof *z->order);
    z->lent = calloc((size_t)z->n_blocks * FSO_N_TIERS, sizeof *z->lent);
    fso_block_visit *visits = calloc((size_t)max_visits, sizeof *visits);
    if (!z->blocks || !z->ranks || !z->order || !z->lent || !visits) {
        free(visits);
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    fso_model_layout(z->blocks, &cfg->model, z->world * fso_fp_boxes(&z->rules));
    for (int b = 0; b < z->n_blocks; b++) {
        if (z->blocks[b].padded_elems > z->max_padded)
            z->max_padded = z->blocks[b].padded_elems;
        if (zr_shard_elems(z, b) > z->max_shard)
            z->max_shard = zr_shard_elems(z, b);
    }
    zr_buffers_for(z, &z->rule, cfg->offload.prefetch_blocks, zb);
    z->lend_in_place = zb->gather == 0;
    if (cfg->offload.prefetch_blocks > zb->max_prefetch) {
        snprintf(err, errlen, "train.prefetch_blocks: at most %d, got %d", zb->max_prefetch,
                 cfg->offload.prefetch_blocks);
        return -EINVAL;
    }
    /* params() order of one micro-step: the model's visits that lend parameters */
    for (int i = 0, n = fso_model_visits(&cfg->model, visits); i < n; i++)
        if (visits[i].params)
            z->order[z->n_order++] = visits[i].block;
    free(visits);
    return 0;
}

/* ------------------------------------------------------------------ budgets */

/* What one device's shards take on each tier, and of every kind together. */
typedef struct budget {
    size_t per_tier[FSO_N_TIERS];
    size_t all_kinds;
} budget;

static void shard_budget(const fso_zero *z, budget *bud)
{
    memset(bud, 0, sizeof *bud);
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++) {
            size_t bytes = zr_shard_bytes(z, b, k);
            bud->per_tier[zr_block_tier(z, b, (fso_kind)k)] += bytes;
            bud->all_kinds += bytes;
        }
}

int fso_zero_check_device(const fso_config *cfg, const fso_zero_need *n, uint64_t cap,
                          char *err, size_t errlen)
{
    const int world = fso_config_world(cfg);
    const uint64_t need = n->tier[FSO_TIER_DEVICE];
    if (need <= cap)
        return 0;
    char h1[48], h2[48], h3[48], h4[48], h5[48], by[48];
    fso_human_bytes(h1, sizeof h1, (double)need);
    fso_human_bytes(h2, sizeof h2, (double)(need - n->activations - n->device_buffers));
    fso_human_bytes(h3, sizeof h3, (double)n->device_buffers);
    fso_human_bytes(h4, sizeof h4, (double)n->activations);
    fso_human_bytes(h5, sizeof h5, (double)cap);
    fso_human_bytes(by, sizeof by, (double)(need - cap));
    snprintf(err, errlen,
             "device memory: each of the %d device%s needs %s (resident shards %s, gather "
             "window and gradient buffers %s, activations %s) but holds %s; short by %s: "
             "offload state (zero_optimization.offload_param / offload_optimizer device "
             "\"cpu\" or \"nvme\", or --nvme DIR)%s, add devices, or raise --device-mem",
             world, world == 1 ? "" : "s", h1, h2, h3, h4, h5, by,
             fso_config_acts_tier(cfg) == FSO_TIER_DEVICE && cfg->activation_checkpointing
                 ? ", put the kept activations on the host (train.activations \"host\")"
                 : "");
    return -ENOMEM;
}

int fso_zero_check_host(const fso_config *cfg, const fso_zero_need *n, uint64_t avail, char *err,
                        size_t errlen)
{
    const uint64_t need = n->tier[FSO_TIER_HOST];
    if (!avail || need <= avail)
        return 0;
    char h1[48], h2[48], by[48], sv[160] = "";
    fso_human_bytes(h1, sizeof h1, (double)need);
    fso_human_bytes(h2, sizeof h2, (double)avail);
    fso_human_bytes(by, sizeof by, (double)(need - avail));
    if (n->saver || n->act_host) {
        char h3[48], h4[48];
        fso_human_bytes(h3, sizeof h3, (double)n->saver);
        fso_human_bytes(h4, sizeof h4, (double)n->act_host * (double)fso_config_world(cfg));
        if (n->saver && n->act_host)
            snprintf(sv, sizeof sv, " (the checkpoint saver's %s and the activations' %s included)",
                     h3, h4);
        else if (n->saver)
            snprintf(sv, sizeof sv, " (the checkpoint saver's %s included)", h3);
        else
            snprintf(sv, sizeof sv, " (the activations' %s included)", h4);
    }
    snprintf(err, errlen,
             "host memory: the host tier and staging buffers need %s%s but %s is %s; "
             "short by %s: put the optimizer state on NVMe (--nvme DIR or "
             "zero_optimization.offload_optimizer.device \"nvme\")%s",
             h1, sv, h2, cfg->host_mem_bytes ? "allowed (--host-mem)"
                                 : "available less the headroom fsoff leaves (--host-mem)", by,
             n->act_host ? ", or keep the activations on the device (train.activations "
                           "\"device\")" : "");
    return -ENOMEM;
}

/* Device rk's backend, of the configuration's kind: a CUDA GPU, or a CPU
 * virtual device capped at cap bytes; *cap becomes a GPU's free memory when
 * --device-mem is not given. */
static int open_backend(fso_zero *z, rank_state *rk, int threads, uint64_t *cap, char *err,
                        size_t errlen)
{
    const fso_config *cfg = z->cfg;
    const fso_backend_row *row = fso_backend_row_of(cfg->backend);
    char why[256] = "";
    int rc = fso_backend_create(&rk->be, cfg->backend, rk->rank, threads, *cap, why, sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "cannot open %s device %d: %s", row->name, rk->rank, why);
        return rc;
    }
#if FSO_HAVE_CUDA /* (else no GPU opens) */
    if (row->gpu && cfg->device_mem_bytes == 0) { /* the budget: what the GPU has free */
        fso_gpu_info gi;
        *cap = fso_gpu_info_query(rk->rank, &gi, why, sizeof why) == 0 ? gi.mem_free_bytes
                                                                       : (uint64_t)1 << 40;
    }
#endif
    return 0;
}

/* The cap of each device: --device-mem, on CPU devices an equal share of
 * half the available memory; 0 for GPUs whose free memory is read when
 * they are opened. */
static uint64_t device_cap(const fso_zero *z)
{
    return z->cuda ? z->cfg->device_mem_bytes
                   : fso_zero_cpu_device_mem(z->cfg, fso_mem_usable_bytes());
}

/* The budgets by arithmetic, before anything is allocated: the host's, and
 * the devices' when their memory is known before they are opened. When
 * both fall short, the one line is the larger shortfall's: the tier to fix
 * first (the other is named once it is fixed), and the same line however
 * much memory the host happens to have free. */
static int check_budgets(const fso_zero *z, const fso_zero_need *need, char *err,
                         size_t errlen)
{
    const uint64_t cap = device_cap(z);
    const uint64_t avail = z->cfg->host_mem_bytes ? z->cfg->host_mem_bytes : fso_mem_usable_bytes();
    char derr[1024];
    int hrc = fso_zero_check_host(z->cfg, need, avail, err, errlen);
    int drc = cap ? fso_zero_check_device(z->cfg, need, cap, derr, sizeof derr) : 0;
    if (drc < 0 && (hrc == 0 || need->tier[FSO_TIER_DEVICE] - cap >
                                    need->tier[FSO_TIER_HOST] - avail))
        snprintf(err, errlen, "%s", derr);
    return hrc < 0 ? hrc : drc;
}

/* Every device's backend and model (its activations), each device's memory
 * checked, before the model allocates, against what it will hold: the
 * activations, the device-tier shards, the gather window and the gradient
 * buffers. */
static int open_devices(fso_zero *z, const fso_zero_need *need, int threads_per_dev, char *err,
                        size_t errlen)
{
    const fso_config *cfg = z->cfg;
    uint64_t cap = device_cap(z);
    char h1[48];
    int rc;
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->rank = r;
        rk->numa = -1;
        rk->z = z;
        zr_mutex_init(&rk->io.mu, ZR_LOCK_IO);
        zr_mutex_init(&rk->io.pf_mu, ZR_LOCK_PREFETCH);
        zr_mutex_init(&rk->opt.mu, ZR_LOCK_OPT);
        pthread_cond_init(&rk->opt.cv, NULL);
        rk->sync_init = true;
        if ((rc = open_backend(z, rk, threads_per_dev, &cap, err, errlen)) < 0 ||
            (rc = fso_zero_check_device(cfg, need, cap, err, errlen)) < 0)
            return rc;
        fso_model_opts mo = {.checkpointing = cfg->activation_checkpointing, .bf16 = cfg->bf16,
                             .acts = fso_config_acts_tier(cfg)};
        if (need->act_host &&
            !(mo.host_acts = zr_pinned_get(&rk->acts_host, need->act_host, z->cuda,
                                           "the activations kept on the host",
                                           "their copies stall the device"))) {
            fso_human_bytes(h1, sizeof h1, (double)need->act_host);
            snprintf(err, errlen, "host memory: cannot allocate %s for device %d's activations "
                                  "(train.activations \"host\"); keep them on the device, or "
                                  "lower --host-mem's other users", h1, r);
            return -ENOMEM;
        }
        if ((rc = fso_model_init_opts(&rk->model, &cfg->model, rk->be, cfg->micro_batch,
                                      cfg->data.seq_len, z->world * fso_fp_boxes(&z->rules), &mo)) < 0) {
            fso_human_bytes(h1, sizeof h1, (double)cap);
            snprintf(err, errlen, "device memory: the activations alone do not fit the %s cap "
                                  "(--device-mem) of device %d (%s); shorten data.seq_len or "
                                  "train_micro_batch_size_per_gpu, or raise --device-mem",
                     h1, r, rk->model.err);
            return rc;
        }
    }
    return 0;
}

/* The host arena: the host-tier shards and staging buffers of every device,
 * checked against the memory available. Twice what every kind on the host
 * would need is reserved (address space only), so that re-plans can grow
 * it in place. */
static int open_arena(fso_zero *z, const fso_fp_buffers *zb, const budget *bud, char *err,
                      size_t errlen)
{
    const size_t world = (size_t)z->world;
    const size_t bytes = (bud->per_tier[FSO_TIER_HOST] + fso_fp_staging_bytes(zb)) * world;
    const size_t most_staging =
        zb->stage_slot_bytes *
            (size_t)(FSO_FP_MAX_PARAM_SLOTS + zb->stage_slots + zb->landing_slots) +
        zb->chunk_bytes * (size_t)zb->chunk_sets * FSO_N_KINDS;
    return zr_arena_init(z, 2 * ((bud->all_kinds + most_staging) * world), bytes, err,
                         errlen);
}

/* ------------------------------------------------------------------ per device */

/* On a machine with several NUMA nodes, the node of each device (a GPU's
 * by its PCI bus id, CPU devices spread over the nodes): its thread, its
 * optimizer threads and its share of the host arena go there. */
static void place_near_devices(fso_zero *z)
{
    fso_topo *t = NULL;
    char terr[256];
    if (fso_topo_node_count() < 2 ||
        fso_topo_create(&t, NULL, terr, sizeof terr) < 0)
        return;
    if (t->n_numa > 1) {
        int nodes[FSO_MAX_DEVICES];
        const char *bus[FSO_MAX_DEVICES] = {NULL};
#if FSO_HAVE_CUDA
        fso_gpu_info gi[FSO_MAX_DEVICES];
        for (int r = 0; z->cuda && r < z->world; r++)
            if (fso_gpu_info_query(r, &gi[r], terr, sizeof terr) == 0)
                bus[r] = gi[r].pci_bus_id;
#endif
        fso_topo_home_nodes(t, z->world, z->cuda ? bus : NULL, nodes);
        for (int r = 0; r < z->world; r++)
            z->ranks[r].numa = nodes[r];
        z->topo = t;
        t = NULL;
    }
    fso_topo_destroy(t);
}


/* Device rk's shards on their tiers, its gather window and gradient
 * buffers on the device, its staging slots in the arena. *nvme_bytes: the
 * extent of its store in use. */
static int allocate_rank(rank_state *rk, const fso_fp_buffers *zb, uint64_t *nvme_bytes,
                         char *err, size_t errlen)
{
    fso_zero *z = rk->z;
    fso_backend *be = rk->be;
    int rc;
    rk->locs = calloc((size_t)z->n_blocks * FSO_N_KINDS, sizeof *rk->locs);
    if (!rk->locs) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    *nvme_bytes = 0;
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            if ((rc = zr_place_shard(rk, b, (fso_kind)k,
                                     zr_block_tier(z, b, (fso_kind)k), nvme_bytes,
                                     zr_locate(rk, b, (fso_kind)k), err, errlen)) < 0)
                return rc;
    for (int g = 0; g < zb->gather; g++)
        if ((rc = be->ops->buf_alloc(be, zb->gather_bytes, &rk->compute.gather[g])) < 0) {
            snprintf(err, errlen, "device memory: %s", be->err);
            return rc;
        }
    for (int g = 0; g < zb->grad_full; g++)
        if ((rc = be->ops->buf_alloc(be, zb->grad_full_bytes,
                                     (void **)&rk->compute.grad_full[g])) < 0) {
            snprintf(err, errlen, "device memory: %s", be->err);
            return rc;
        }
    size_t send_bytes;
    for (int g = 0, n = fso_fp_grad_send_buffers(&z->rules, z->max_padded, &send_bytes); g < n;
         g++)
        if ((rc = be->ops->buf_alloc(be, send_bytes, (void **)&rk->compute.grad_send[g])) < 0) {
            snprintf(err, errlen, "device memory: %s", be->err);
            return rc;
        }
    rk->io.n_prefetch = rk->io.n_prefetch_bufs = zb->prefetch_slots;
    for (int j = 0; j < zb->prefetch_slots; j++) {
        rk->io.prefetch[j].buf = zr_rank_take(rk, zb->prefetch_slot_bytes);
        rk->io.prefetch[j].block = -1;
        rk->io.prefetch[j].lend = -1;
    }
    rk->opt.n_sets = zb->chunk_sets;
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int set = 0; set < zb->chunk_sets && zb->chunked[k]; set++)
            rk->opt.chunk[set][k].buf = zr_rank_take(rk, zb->chunk_bytes);
    rk->opt.chunk_elems = zb->chunk_bytes / sizeof(float);
    rk->io.grad_trip.buf = zr_rank_take(rk, zb->stage_slot_bytes);
    for (int i = 0; i < zb->landing_slots && zb->landings; i++)
        rk->io.grad_down[i].buf = zr_rank_take(rk, zb->stage_slot_bytes);
    rk->io.landing.block = -1;
    return 0;
}

/* Device rk's optimizer: per-block bookkeeping, its thread pool near the
 * memory it updates, and its thread for the overlapped schedules. */
static int start_optimizer(rank_state *rk, int threads, char *err, size_t errlen)
{
    fso_zero *z = rk->z;
    int rc;
    rk->compute.grad_sq = calloc((size_t)z->n_blocks, sizeof *rk->compute.grad_sq);
    rk->opt.ready = calloc((size_t)z->n_blocks, sizeof *rk->opt.ready);
    rk->opt.ready_mark = calloc((size_t)z->n_blocks, sizeof *rk->opt.ready_mark);
    rk->opt.rest = calloc((size_t)z->n_blocks, sizeof *rk->opt.rest);
    rk->clock.block_ms = calloc((size_t)z->n_blocks, sizeof *rk->clock.block_ms);
    if (!rk->compute.grad_sq || !rk->opt.ready || !rk->opt.ready_mark || !rk->opt.rest ||
        !rk->clock.block_ms ||
        (rc = fso_optpool_create(&rk->opt.pool, threads)) < 0) {
        snprintf(err, errlen, "out of host memory for the optimizer");
        return -ENOMEM;
    }
    /* the optimizer's threads near the memory they update (best effort):
     * the device's node, where its host state is */
    if (rk->numa >= 0)
        fso_optpool_bind(rk->opt.pool, rk->numa, false);
    else if (z->arena.bytes)
        fso_optpool_bind(rk->opt.pool,
                         fso_optpool_node_of(rk->opt.pool, z->arena.base, z->arena.bytes), false);
    if (z->cfg->optimizer_overlap != FSO_OVERLAP_NONE && (rc = zr_optim_start(rk)) < 0) {
        snprintf(err, errlen, "cannot start the optimizer thread of device %d: %s", rk->rank,
                 strerror(-rc));
        return rc;
    }
    return 0;
}

static int open_collectives(fso_zero *z, char *err, size_t errlen)
{
    fso_backend *devs[FSO_MAX_DEVICES];
    char cerr[256] = "";
    for (int r = 0; r < z->world; r++)
        devs[r] = z->ranks[r].be;
    int rc = fso_backend_coll_create(&z->coll, z->world, devs, cerr, sizeof cerr);
    if (rc < 0)
        snprintf(err, errlen, "cannot create the collectives: %s", cerr);
    return rc;
}

/* The initial state, one block at a time (host memory stays bounded):
 * parameters from the seed or the Hugging Face folder hf, optimizer state
 * zero. */
static int initial_values(fso_zero *z, fso_hf_folder *hf, char *err, size_t errlen)
{
    float *flat = malloc(sizeof(float) * z->max_padded);
    fso_rng rng;
    int rc = 0;
    if (!flat) {
        snprintf(err, errlen, "out of host memory initialising parameters");
        return -ENOMEM;
    }
    fso_rng_seed(&rng, z->cfg->seed);
    for (int b = 0; b < z->n_blocks && rc == 0; b++) {
        if (hf) {
            memset(flat, 0, sizeof(float) * z->blocks[b].padded_elems);
            if ((rc = fso_hf_read_block(hf, b, flat, err, errlen)) < 0) {
                free(flat);
                return rc;
            }
        } else {
            fso_model_init_block(&z->ranks[0].model, b, flat, &rng);
        }
        for (int k = 0; k < FSO_N_KINDS && rc == 0; k++) {
            if (k == FSO_KIND_M)
                memset(flat, 0, sizeof(float) * z->blocks[b].padded_elems);
            rc = zr_block_xfer(z, b, flat, (fso_kind)k, 0);
        }
    }
    free(flat);
    if (rc < 0)
        zr_first_error(z, err, errlen);
    return rc;
}

/* Across boxes: the rails each device meets the others on, and the buffer
 * where its updater gathers parameters the CPU cannot write in place. */
static int open_rails(fso_zero *z, const fso_rails *rails, char *err, size_t errlen)
{
    if (z->boxes <= 1)
        return 0;
    bool off_cpu = false; /* some block's parameters where the CPU does not write them */
    for (int b = 0; b < z->n_blocks; b++)
        off_cpu = off_cpu ||
                  !fso_fp_cpu_reaches(&z->rules, zr_block_tier(z, b, FSO_KIND_PARAM));
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        rk->rail.grad = rails->grad[r];
        rk->rail.param = rails->param[r];
        rk->rail.grad_dev = rails->grad_dev[r];
        rk->rail.param_dev = rails->param_dev[r];
        if (!off_cpu)
            continue;
        rk->rail.buf_bytes = fso_fp_round_page(z->elem_bytes[FSO_KIND_PARAM] * z->max_shard);
        if (!(rk->rail.io.buf = fso_io_alloc_lean(rk->rail.buf_bytes))) {
            snprintf(err, errlen, "host memory: out of memory for device %d's rail buffer "
                                  "(%zu bytes)", r, rk->rail.buf_bytes);
            return -ENOMEM;
        }
    }
    return 0;
}

int fso_zero_create(fso_zero **out, const fso_config *cfg, char *err, size_t errlen)
{
    return fso_zero_create_on(out, cfg, NULL, err, errlen);
}

int fso_zero_create_on(fso_zero **out, const fso_config *cfg, const fso_rails *rails,
                       char *err, size_t errlen)
{
    fso_zero *z = calloc(1, sizeof *z);
    fso_fp_buffers zb;
    fso_hf_folder *hf = NULL;
    budget bud;
    int rc;
    if (!z) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    if (cfg->world > FSO_MAX_DEVICES) {
        snprintf(err, errlen, "%d devices: fsoff drives at most %d devices in one process",
                 cfg->world, FSO_MAX_DEVICES);
        free(z);
        return -EINVAL;
    }
    z->boxes = fso_config_boxes(cfg);
    z->box = cfg->box;
    if (z->boxes > 1 && (!rails || rails->boxes != z->boxes || rails->box != z->box ||
                         rails->devices != fso_config_world(cfg))) {
        snprintf(err, errlen, "box %d of %d with %d devices: no rails for them (boxes.h "
                              "fso_boxes_rails makes them)", z->box, z->boxes,
                 fso_config_world(cfg));
        free(z);
        return -EINVAL;
    }
    if (z->boxes > 1 && cfg->optimizer_overlap == FSO_OVERLAP_BACKWARD) {
        snprintf(err, errlen, "train.optimizer_overlap \"backward\" updates each block as its "
                              "gradients land, before the boxes have summed them; on %d boxes "
                              "use \"forward\" (the default), which hides the update behind "
                              "the next forward instead", z->boxes);
        free(z);
        return -EINVAL;
    }
    fso_zero_need need;
    fso_zero_need_for(cfg, &need);
    z->cfg = cfg;
    z->cuda = cfg->backend == FSO_BACKEND_CUDA;
    /* counts that cannot place the blocks are named before the budgets
     * they would distort */
    z->n_blocks = fso_model_n_blocks(&cfg->model);
    fso_offload_block_rule(&cfg->offload, z->n_blocks, &z->rule);
    if ((rc = zr_check_rule(z, &z->rule, err, errlen)) < 0 ||
        (rc = check_budgets(z, &need, err, errlen)) < 0 ||
        (rc = setup_layout(z, cfg, &zb, err, errlen)) < 0 ||
        (cfg->init_from[0] && (rc = fso_hf_open(&hf, cfg->init_from, &cfg->model, err, errlen)) < 0))
        goto fail;
    if ((rc = zr_save_init(z)) < 0) {
        snprintf(err, errlen, "out of host memory");
        goto fail;
    }
    shard_budget(z, &bud);
    if ((rc = open_devices(z, &need, fso_zero_device_threads(cfg), err, errlen)) < 0)
        goto fail;
    place_near_devices(z);
    if ((rc = open_arena(z, &zb, &bud, err, errlen)) < 0)
        goto fail;
    /* every device's part of the arena bound to its node before pinning
     * (CUDA registration, mlock, the NVMe stores' registration) touches a
     * page of it */
    for (int r = 0; r < z->world; r++)
        if ((rc = allocate_rank(&z->ranks[r], &zb, &z->ranks[r].io.nvme_end, err, errlen)) < 0)
            goto fail;
    zr_arena_pin(z, true);
    for (int r = 0; r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        if ((rc = start_optimizer(rk, fso_zero_optimizer_threads(cfg), err, errlen)) < 0)
            goto fail;
        if (bud.per_tier[FSO_TIER_NVME] > 0 &&
            (rc = zr_open_store(z, rk, &cfg->offload, rk->io.nvme_end, err, errlen)) < 0)
            goto fail;
    }
    if ((rc = open_collectives(z, err, errlen)) < 0 ||
        (rc = open_rails(z, rails, err, errlen)) < 0)
        goto fail;
    if ((rc = zr_shared_coll_init(z)) < 0) {
        snprintf(err, errlen, "out of host memory");
        goto fail;
    }
    if ((rc = zr_start_workers(z, err, errlen)) < 0 ||
        (rc = initial_values(z, hf, err, errlen)) < 0)
        goto fail;
    fso_hf_close(hf);
    *out = z;
    return 0;

fail:
    fso_hf_close(hf);
    fso_zero_destroy(z);
    return rc < 0 ? rc : -ENOMEM;
}

/* Collectives go before the backends they run on (coll.h): NCCL's use their
 * devices and streams, and cpu-async's read every device at destroy to check
 * that none of their calls is still queued. */
void fso_zero_destroy(fso_zero *z)
{
    if (!z)
        return;
    zr_stop_workers(z);
    for (int r = 0; z->ranks && r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        zr_optim_stop(rk);
        if (rk->sync_init)
            zr_drain_slots(rk, true);
    }
    fso_coll_destroy(z->coll);
    for (int r = 0; z->ranks && r < z->world; r++) {
        rank_state *rk = &z->ranks[r];
        if (rk->sync_init) {
            zr_mutex_destroy(&rk->io.mu);
            zr_mutex_destroy(&rk->io.pf_mu);
            zr_mutex_destroy(&rk->opt.mu);
            pthread_cond_destroy(&rk->opt.cv);
        }
        fso_optpool_destroy(rk->opt.pool);
        free(rk->compute.grad_sq);
        free(rk->opt.ready);
        free(rk->opt.ready_mark);
        free(rk->opt.rest);
        free(rk->clock.block_ms);
        if (!rk->be)
            continue;
        for (int b = 0; rk->locs && b < z->n_blocks; b++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                if (zr_locate(rk, b, (fso_kind)k)->tier == FSO_TIER_DEVICE)
                    zr_release_shard(rk, b, (fso_kind)k, zr_locate(rk, b, (fso_kind)k));
        for (int g = 0; g < 2; g++) {
            rk->be->ops->buf_free(rk->be, rk->compute.gather[g]);
            rk->be->ops->buf_free(rk->be, rk->compute.grad_full[g]);
            rk->be->ops->buf_free(rk->be, rk->compute.grad_send[g]);
        }
        fso_store_destroy(rk->io.store);
        fso_io_free(rk->rail.io.buf, rk->rail.buf_bytes);
        fso_model_free(&rk->model);
        zr_pinned_free(&rk->acts_host);
        free(rk->locs);
        fso_backend_destroy(rk->be);
    }
    zr_arena_free(z);
    zr_save_free(z);
    zr_pinned_free(&z->batch);
    zr_shared_coll_free(z);
    fso_topo_destroy(z->topo);
    free(z->ranks);
    free(z->blocks);
    free(z->order);
    free(z->lent);
    free(z);
}

/* ------------------------------------------------------------------ reports */

int fso_zero_inject_faults(fso_zero *z, int rank, const fso_fault_spec *spec)
{
    rank_state *rk = &z->ranks[rank];
    if (!rk->io.store)
        return -ENOENT;
    fso_store *wrapped = NULL;
    int rc = fso_store_wrap_faults(&wrapped, rk->io.store, spec);
    if (rc == 0)
        rk->io.store = wrapped;
    return rc;
}

void fso_zero_standin(fso_zero *z, const double *part_ms)
{
    for (int r = 0; r < z->world; r++)
        z->ranks[r].model.standin_ms = part_ms;
}

int fso_zero_device_threads(const fso_config *cfg)
{
    const int world = fso_config_world(cfg);
    const int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    return threads / world > 0 ? threads / world : 1;
}

int fso_zero_optimizer_threads(const fso_config *cfg)
{
    const bool beside = !fso_backend_row_of(cfg->backend)->gpu &&
                        cfg->optimizer_overlap != FSO_OVERLAP_NONE;
    return beside ? 1 : fso_zero_device_threads(cfg);
}

uint64_t fso_zero_cpu_device_mem(const fso_config *cfg, uint64_t host_bytes)
{
    const int world = fso_config_world(cfg);
    if (cfg->device_mem_bytes)
        return cfg->device_mem_bytes;
    if (cfg->host_mem_bytes)
        host_bytes = cfg->host_mem_bytes;
    return host_bytes ? host_bytes / 2 / (uint64_t)world : (uint64_t)8 << 30;
}

uint64_t fso_zero_host_arena_bytes(const fso_zero *z)
{
    return z->arena.used;
}

void fso_zero_allocated(const fso_zero *z, uint64_t *dev, uint64_t tier[FSO_N_TIERS])
{
    tier[FSO_TIER_DEVICE] = tier[FSO_TIER_NVME] = 0;
    tier[FSO_TIER_HOST] = z->arena.used;
    for (int r = 0; r < z->world; r++) {
        dev[r] = z->ranks[r].be ? z->ranks[r].be->mem_used_bytes : 0;
        if (dev[r] > tier[FSO_TIER_DEVICE])
            tier[FSO_TIER_DEVICE] = dev[r];
        tier[FSO_TIER_NVME] += z->ranks[r].io.nvme_end;
    }
}

const double *fso_zero_block_compute_ms(const fso_zero *z)
{
    return z->ranks[0].clock.block_ms;
}

const fso_model *fso_zero_model(const fso_zero *z)
{
    return &z->ranks[0].model;
}

const fso_block_rule *fso_zero_block_rule(const fso_zero *z)
{
    return &z->rule;
}

const char *fso_zero_pin_refused(const fso_zero *z)
{
    return z->arena.pin_refused[0] ? z->arena.pin_refused : NULL;
}

uint64_t fso_zero_stale_marks(const fso_zero *z)
{
    uint64_t n = 0;
    for (int r = 0; r < z->world; r++)
        n += fso_backend_stale_marks(z->ranks[r].be);
    return n;
}

uint64_t fso_zero_peak_device_bytes(const fso_zero *z)
{
    uint64_t peak = 0;
    for (int r = 0; r < z->world; r++)
        if (z->ranks[r].be && z->ranks[r].be->mem_peak_bytes > peak)
            peak = z->ranks[r].be->mem_peak_bytes;
    return peak;
}

void fso_zero_describe(const fso_zero *z, char *buf, size_t len)
{
    size_t per_kind[FSO_N_KINDS] = {0};
    for (int b = 0; b < z->n_blocks; b++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            per_kind[k] += z->elem_bytes[k] * z->blocks[b].padded_elems;
    size_t off = 0;
    for (int k = 0; k < FSO_N_KINDS && off < len; k++) {
        char h[32];
        fso_human_bytes(h, sizeof h, (double)per_kind[k]);
        off += (size_t)snprintf(buf + off, len - off, "%s%s %s on %s", k ? ", " : "",
                                fso_kind_name(k), h, fso_tier_name(z->tier[k]));
        const int hb = z->rule.state_host_blocks;
        const bool state = k == FSO_KIND_MASTER || k == FSO_KIND_M || k == FSO_KIND_V;
        if (off < len && hb > 0 && state && z->tier[k] == FSO_TIER_NVME)
            off += (size_t)(hb == 1 ? snprintf(buf + off, len - off, " (block 0 on host)")
                                    : snprintf(buf + off, len - off, " (blocks 0-%d on host)",
                                               hb - 1));
    }
    const fso_block_rule *ru = &z->rule;
    if (ru->resident_blocks > 0 && off < len)
        off += (size_t)snprintf(buf + off, len - off, "; %d of %d blocks' parameters resident "
                                                      "on the devices",
                                ru->resident_blocks, z->n_blocks);
    if (ru->device_state_blocks == 1 && off < len)
        off += (size_t)snprintf(buf + off, len - off, "; the optimizer state and gradients of "
                                                      "the %s block on the devices",
                                ru->device_state_first ? "first" : "last");
    else if (ru->device_state_blocks > 1 && off < len)
        off += (size_t)snprintf(buf + off, len - off, "; the optimizer state and gradients of "
                                                      "the %s %d of %d blocks on the devices",
                                ru->device_state_first ? "first" : "last",
                                ru->device_state_blocks, z->n_blocks);
    if (z->ranks[0].io.n_prefetch > 0 && off < len)
        off += (size_t)snprintf(buf + off, len - off, ", %d block%s read ahead", z->prefetch,
                                z->prefetch == 1 ? "" : "s");
    for (int r = 0; z->topo && r < z->world && off < len; r++)
        off += (size_t)snprintf(buf + off, len - off, "%s%d", r ? "," : "; NUMA node per device ",
                                z->ranks[r].numa);
}

