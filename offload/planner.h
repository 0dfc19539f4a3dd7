/* planner.h — where each kind of training state lives and how it moves,
 * chosen by predicting the step on a pipelined timeline (ARCHITECTURE.md, The planner).
 *
 * Inputs: the machine (devices, memory per tier, measured rates), the model
 * as the planner sees it (bytes per block, one micro-batch as an ordered list
 * of block visits with their FLOPs, activation bytes), the engine's schedule
 * (which copies share a thread, how far the optimizer overlaps) and the
 * user's pins. The planner knows nothing of transformers: engine/plan.c
 * turns a model configuration into these numbers.
 *
 * The timeline: every visit of a block becomes events on streams — NVMe
 * read, host-to-device copy, collective, compute, device-to-host copy, NVMe
 * write, CPU optimizer. Each event starts when the previous event on its
 * stream has finished (streams are FIFO queues, as CUDA streams and the
 * engine's threads are) and when its inputs are ready: compute of a visit
 * needs its gather, the gather its copy to the device, the copy its NVMe
 * read; a read may start `prefetch` visits early, once the staging buffer of
 * an older visit is free; the next step's use of a block waits for that
 * block's update. Three steps are laid out and the third one's length is
 * the prediction (steady state, first-step effects excluded). The critical
 * path through the third step, attributed to the streams of its events, names
 * the bottleneck.
 *
 * Capacities: per device the activations, the gather window, the gradient
 * buffers and every device-tier shard; the host arena (host-tier shards of
 * all devices and the staging buffers, prefetch ring included), in the host
 * memory that CPU devices leave (their memory is the host's); NVMe free
 * space. A placement that does not fit is never chosen; when none fits the
 * result names the short tier and by how much.
 *
 * Units: bytes, milliseconds, GB/s = 1e9 bytes/s, GFLOP/s = 1e9 FLOP/s.
 */
#ifndef FSO_PLANNER_H
#define FSO_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "footprint.h"
#include "state.h"
#include "util.h"

#define FSO_PLAN_MAX_BLOCKS 1024
#define FSO_PLAN_MAX_PREFETCH 16
#define FSO_PLAN_MAX_BOXES 1024

typedef enum fso_stream {
    FSO_STREAM_NVME_READ = 0,
    FSO_STREAM_H2D,
    FSO_STREAM_COLL,
    FSO_STREAM_COMPUTE,
    FSO_STREAM_D2H,
    FSO_STREAM_NVME_WRITE,
    FSO_STREAM_OPTIM,       /* AdamW and host-side gradient accumulation (CPU) */
    FSO_STREAM_NET,         /* between boxes, over each device's rail (machine.boxes > 1) */
    FSO_N_STREAMS,
} fso_stream;

typedef struct fso_plan_machine {
    int devices;               /* data-parallel devices (ZeRO world) */
    bool cpu_devices;          /* CPU virtual devices: copies, collectives, compute and the
                                  optimizer share the host's cores (one FIFO per device) */
    uint64_t device_mem_bytes; /* usable per device */
    uint64_t host_mem_bytes;   /* usable for the host arena (all devices together) */
    uint64_t nvme_free_bytes;  /* free space over the NVMe folders; 0: no NVMe tier */
    double nvme_read_gbps;     /* all folders together */
    double nvme_write_gbps;    /* as a step's writes see it (a cache in front of the drive
                                  takes them at its rate: probe.h's burst) */
    double nvme_drain_gbps;    /* the rate the drive drains writes at (flushed); a step
                                  lasts at least its writes at this rate; 0: nvme_write_gbps */
    double nvme_read_cpu_s_per_gb;  /* the compute the host's cores lose per GB read, and */
    double nvme_write_cpu_s_per_gb; /* per GB written (probe.h); the timeline puts it on
                                       the cores' lane: with CPU devices the devices',
                                       else the optimizer's; 0: none */
    double nvme_read_lat_ms;   /* one request's latency beyond its transfer time */
    double nvme_write_lat_ms;
    double h2d_gbps;           /* per device */
    double d2h_gbps;
    double coll_gbps;          /* collective bus bandwidth (nccl-tests busbw) */
    double device_gflops;      /* achieved compute per device */
    double peak_gflops;        /* dense bf16 peak per device, for MFU; 0: unknown (CPU devices) */
    double adam_gelems;        /* CPU AdamW, 1e9 elements/s: all host cores; on CPU
                                  devices, all devices' optimizer threads
                                  (engine/zero/zero.h fso_zero_optimizer_threads) */
    double device_adam_gelems; /* AdamW on a device; 0: the optimizer never runs there */
    double host_copy_gbps;     /* one host thread's memcpy: staging copies, accumulation */
    double device_margin;      /* the fraction of device_mem_bytes a plan leaves free
                                  (fragmentation, NCCL, cuBLAS workspaces: train.device_margin,
                                  config.h); 0: none */
    /* Several boxes (engine/boxes.h): every field above is one box's (its
     * devices, its host memory and NVMe, its CPU AdamW); each box holds a
     * whole replica of the working parameters over its devices, and 1/boxes
     * of the optimizer's state (footprint.h fso_fp_rules.boxes). */
    int boxes;                 /* 0 or 1: one box */
    double net_gbps;           /* per box, one direction, GB/s: what leaves a box over all
                                  its devices' rails together (the rails share it); needed
                                  when boxes > 1 */
} fso_plan_machine;

/* The share of a box's line rate the cross-box collectives reach on large
 * messages: NCCL's measured bus bandwidth for all-gather and
 * reduce-scatter between boxes runs at about 80-90% of the network's line
 * rate; the lower end, as a plan should not promise more. */
#define FSO_PLAN_NET_EFFICIENCY 0.8

/* One use of a block's parameters and/or gradients within a micro-batch. */
typedef struct fso_plan_visit {
    int block;
    double flops;              /* compute of this visit (recomputation included) */
    bool params;               /* needs the block's gathered parameters */
    bool grads;                /* ends with the block's gradients (reduce-scatter, to tier) */
    /* The kept layer inputs (activations on the host tier, placement.acts):
     * 1 + the input this visit's compute writes (a forward), and 1 + the
     * input its compute reads first (a layer's backward); 0 none. */
    int act_write, act_read;
} fso_plan_visit;

typedef struct fso_plan_model {
    int n_blocks;
    const uint64_t *block_elems; /* (n_blocks) padded elements, all shards */
    int n_visits;
    const fso_plan_visit *visits; /* one micro-batch, in order */
    int grad_accum;              /* micro-batches per step */
    double tokens_per_step;      /* all devices */
    double flops_per_token;      /* model FLOPs per token trained (forward and backward,
                                    recomputation not counted): MFU's numerator; 0: unknown */
    uint64_t activation_bytes;   /* per device, the kept layer inputs on the device */
    /* The kept layer inputs on the host (placement.acts FSO_TIER_HOST);
     * act_kept_bytes 0: not offered (no checkpointing). Inputs 0 ..
     * act_host_inputs - 1 go to the host, each written down after the visit
     * that writes it and up before the visit that reads it; the device keeps
     * act_ring slots, so a forward's write waits for the copy down of the
     * input act_ring before it, and a copy up for the compute act_ring
     * visits before its reader. */
    uint64_t act_kept_bytes;     /* one kept input */
    int act_host_inputs;
    int act_ring;
    uint64_t act_host_device_bytes; /* per device: activation_bytes with the inputs on the host */
} fso_plan_model;

/* How the engine schedules, which the timeline must follow. */
typedef struct fso_plan_engine {
    fso_overlap overlap;
    bool per_block_tiers;      /* parameters of some blocks may stay on the device */
    bool whole_copy;           /* a block may be copied whole to every device (no gather) */
    bool state_host_blocks;    /* the optimizer state a placement puts on NVMe stays on the
                                  host for the first blocks, as many as host memory takes
                                  (but the last), unless pinned: the next forward needs
                                  block 0 first */
    bool sync_grad_writes;     /* a gradient shard reaches its tier before the next block */
    bool norm_pass;            /* the global norm re-reads NVMe gradient shards after
                                  backward (else: each block's norm as its gradients land) */
    int opt_write_lag;         /* 1: a block's parameters on NVMe are written before the
                                  next block is updated; 2: writes trail by two blocks (the
                                  two buffer sets) only */
    /* The engine's footprint rules (footprint.h): each kind's element type,
     * whether the CPU addresses the devices' memory, the aio settings; its
     * world is the machine's devices. Shard sizes, where parameters are lent
     * in place, the buffers and the staging follow from them as the engine
     * allocates them. */
    fso_fp_rules rules;
    uint64_t device_reserve_bytes; /* per device: runtime, allocator slack */
    uint64_t host_reserve_bytes;   /* host memory outside the arena, all devices together: the
                                      checkpoint saver's buffers */
} fso_plan_engine;

/* A user's choices the planner must keep: -1 free, else the tier (every
 * block, unless a count below is pinned too: then the blocks it leaves),
 * the depth, or the per-block counts
 * of state.h's fso_block_rule (resident parameter blocks, blocks whose
 * state is on the devices, and whether those count from block 0 up: 1, or
 * from the last block down: 0), and whole-block copies (1 on, 0 off). */
typedef struct fso_plan_pins {
    int tier[FSO_N_KINDS];
    int prefetch;
    int resident_blocks;
    int device_state_blocks;
    int device_state_first;
    int whole_copy;
    int acts;                  /* the kept activations' tier: -1 free, FSO_TIER_DEVICE or
                                  FSO_TIER_HOST */
} fso_plan_pins;

typedef struct fso_plan_input {
    fso_plan_machine machine;
    fso_plan_model model;
    fso_plan_engine engine;
    fso_plan_pins pins;
} fso_plan_input;

/* Per block, kind by kind. The search only makes placements that state.h's
 * fso_block_rule expresses (resident parameters a prefix of
 * fso_residency_order, device state a run from the last block down or from
 * block 0 up, NVMe state of the first blocks on the host), so that a
 * configuration reproduces them (plan.h fso_plan_apply). */
typedef struct fso_placement {
    int n_blocks;
    uint8_t tier[FSO_N_KINDS][FSO_PLAN_MAX_BLOCKS]; /* fso_tier per kind and block */
    bool whole_copy[FSO_PLAN_MAX_BLOCKS];        /* copy the block whole instead of gathering */
    int prefetch;                                /* visits read ahead of compute */
    int acts;                                    /* the kept layer inputs' tier: FSO_TIER_DEVICE,
                                                    or FSO_TIER_HOST (model.act_kept_bytes) */
} fso_placement;

/* Why a kind of state sits on its tier (fso_plan_choose fills one per
 * kind): the configuration pins it there, or what the next faster tier
 * would do with it (every block of the kind moved there, the rest kept). */
typedef struct fso_plan_reason {
    int tier;                    /* the tier most of the kind's blocks sit on */
    bool pinned;                 /* the pins put it there */
    int split;                   /* blocks on the fastest of several tiers the kind is split
                                    over (0: one tier, or state whose first blocks took the
                                    host memory left); alt_tier is then that tier */
    int alt_tier;                /* the next faster tier, -1 when on the device already */
    bool alt_fits;
    int short_tier;              /* alt_fits false: the tier that would be short, by */
    uint64_t short_bytes;
    double alt_step_ms;          /* alt_fits: the step predicted there */
} fso_plan_reason;

/* What fso_plan_choose searched: placements sized (each kind's tier, the
 * blocks kept on the devices, prefetch depths, gathers or whole copies, as
 * the engine allows), those that fit every tier, and of the others how many
 * were short on each tier and by how little at least. */
typedef struct fso_plan_search {
    int considered;
    int fit;
    int short_on[FSO_N_TIERS];
    uint64_t least_short[FSO_N_TIERS]; /* of those short on the tier; 0: none */
    uint64_t least_need[FSO_N_TIERS];  /* the least any placement that fits needs there */
} fso_plan_search;

typedef struct fso_plan {
    fso_placement pl;
    bool fits;
    /* memory: [tier][kind] shard bytes (device: per device; host and NVMe: all devices) */
    uint64_t kind_bytes[FSO_N_TIERS][FSO_N_KINDS];
    uint64_t activation_bytes;   /* per device, on the device (a ring of slots with pl.acts
                                    on the host) */
    uint64_t act_host_bytes;     /* all devices: the kept inputs on the host (pl.acts), in
                                    need_bytes[FSO_TIER_HOST] */
    uint64_t act_copy_bytes;     /* per device and micro-batch: the kept inputs copied down,
                                    and as many up (pl.acts on the host) */
    uint64_t buffer_bytes[FSO_N_TIERS]; /* device: gather window + gradient buffers + reserve;
                                        host: staging (all devices) and the
                                        host reserve (the checkpoint saver) */
    uint64_t need_bytes[FSO_N_TIERS];
    uint64_t have_bytes[FSO_N_TIERS]; /* host, with CPU devices: what their memory leaves;
                                        device: its memory less margin_bytes */
    uint64_t margin_bytes;       /* per device: machine.device_margin of its memory, kept free */
    int short_tier;              /* the tier furthest over its capacity, or -1 */
    uint64_t short_bytes;
    /* prediction (per device; all devices run the same schedule) */
    double step_ms;
    double tokens_per_s;
    double mfu;                  /* model FLOPs per second over the devices' dense peak
                                    (machine.peak_gflops); 0: no peak known */
    double busy_ms[FSO_N_STREAMS];     /* work on each stream in one step */
    double critical_ms[FSO_N_STREAMS]; /* the step's critical path, by stream */
    fso_stream bottleneck;
    double stall_ms;             /* step time in which compute waits */
    /* Several boxes (machine.boxes > 1): what one box sends to the others
     * per step over its rails (footprint.h fso_fp_traffic.net_bytes: the
     * gradients reduce-scattered, the updated parameters all-gathered), and
     * the network's time for it, busy_ms[FSO_STREAM_NET] per device (the
     * rails run side by side); both 0 on one box. */
    uint64_t net_bytes;
    double net_ms;
    int evaluated;               /* placements the search predicted */
    fso_plan_search search;      /* fso_plan_choose: what it searched and why it found what */
    bool explained;              /* why holds the reasons (fso_plan_choose, when it fits) */
    fso_plan_reason why[FSO_N_KINDS];
    /* Why the kept activations sit on pl.acts (fso_plan_choose): pinned,
     * or the other tier's outcome: short by acts_short_bytes on tier
     * acts_short_tier, or its predicted step acts_alt_ms; acts_alt -1: no
     * other tier offered. */
    bool acts_pinned;
    int acts_alt;
    bool acts_alt_fits;
    int acts_short_tier;
    uint64_t acts_short_bytes;
    double acts_alt_ms;
    /* copies of the inputs a report needs */
    fso_plan_machine machine;
    fso_overlap overlap;
    fso_fp_rules rules;          /* the engine's (fso_plan_engine), world the devices */
    int grad_accum;
    double tokens_per_step;
    uint64_t model_elems;
} fso_plan;

/* Measured per step (any field < 0: not measured). */
typedef struct fso_plan_measured {
    double step_ms;
    double stall_ms;             /* compute waited on NVMe reads */
    double optimizer_ms;         /* busy updating */
    double compute_ms;           /* busy computing */
    double nvme_read_gbps, nvme_write_gbps;
    const double *block_compute_ms; /* (n_blocks) per step and device, or NULL */
    int n_blocks;
} fso_plan_measured;

const char *fso_stream_name(int stream);         /* "nvme-read", "h2d", ... */

/* Pins that pin nothing. */
void fso_plan_pins_none(fso_plan_pins *p);
/* Every block of every kind on one tier, gathers, prefetch depth d. */
void fso_placement_uniform(fso_placement *pl, int n_blocks, int param_tier, int state_tier,
                           int grad_tier, int prefetch);

/* Sizes and predicts one placement. Returns 0 when it fits, -ENOSPC when
 * not (out->short_tier and short_bytes say where; the timeline is still
 * predicted), -EINVAL for inputs out of range. */
int fso_plan_evaluate(const fso_plan_input *in, const fso_placement *pl, fso_plan *out);

/* Lays out one placement like fso_plan_evaluate and prints the predicted
 * step's events to f, one a line: start and end ms, stream, what, block. */
int fso_plan_trace(const fso_plan_input *in, const fso_placement *pl, FILE *f);

/* Chooses the placement with the least predicted step time that fits and
 * keeps the pins; among times within 5% of the least the shallower prefetch
 * and the higher tiers (a margin the probes' noise does not cross). Returns 0, -ENOSPC when nothing fits (out is then the
 * placement closest to fitting, with short_tier and short_bytes), -EINVAL. */
int fso_plan_choose(const fso_plan_input *in, fso_plan *out);

/* Re-plans from a few measured steps. When the measured step time is off
 * the prediction by more than 20%, corrects the machine's rates from what
 * was measured, chooses again, fills *out (and *corrected) and writes a
 * one-line message to msg; returns 1. Otherwise copies cur to out and
 * returns 0. -EINVAL for a measurement without a step time. */
int fso_plan_replan(const fso_plan_input *in, const fso_plan *cur, const fso_plan_measured *meas,
                    fso_plan *out, fso_plan_machine *corrected, char *msg, size_t msglen);

/* "parameters: device (12 of 34 blocks), host; master, m, v: host; gradients:
 * host; prefetch 2; gather" — one line. */
void fso_plan_describe(const fso_plan *p, char *buf, size_t len);

/* p->why for plan p of input in (the pins are in's). 0 or -ENOMEM. */
int fso_plan_explain(const fso_plan_input *in, fso_plan *p);
/* p->why as one line: "parameters nvme (on the host, host memory would be
 * short by 2.31 GiB); master weights, gradients host (...); ..."; kinds
 * with the same tier and reason together. "" when not explained. */
void fso_plan_why(const fso_plan *p, char *buf, size_t len);

/* Why the kept activations sit on p->pl.acts, as fso_plan_why says it
 * ("pinned by the configuration", "on the devices, device memory would be
 * short by 1.2 GiB", "on the host, 3.1% slower"); "" when no other tier was
 * offered (no checkpointing) and nothing pins them. */
void fso_plan_acts_why(const fso_plan *p, char *buf, size_t len);

/* The tier most blocks of kind k sit on; for optimizer state whose first
 * blocks are on the host and the rest on NVMe (engine.state_host_blocks),
 * NVMe. */
int fso_plan_main_tier(const fso_plan *p, int kind);
/* For master, m or v whose last block is on NVMe: how many blocks from
 * block 0 sit on the host (engine.state_host_blocks); else 0. */
int fso_plan_state_host_blocks(const fso_plan *p, int kind);


#endif
