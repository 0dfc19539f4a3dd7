/* plan.h — the planner (offload/planner.h) applied to a training
 * configuration: the plan `fsoff train` takes and prints at start, and what
 * `fsoff plan` (plan_cli.h) prints.
 *
 * The model description the planner needs (bytes per block, the visits of a
 * micro-batch with their FLOPs, activation bytes) comes from model.h; the
 * machine from explicit numbers, this machine's cached probes (probe.h), or,
 * for GPUs, a small table of conservative achieved figures. Offload choices
 * written in the configuration are pins: the planner keeps them and chooses
 * the rest.
 *
 * For the trainer:
 *
 *   fso_plan plan;
 *   fso_plan_pins pins;
 *   fso_plan_pins_from_config(cfg, &pins);   (or fso_plan_pins_none)
 *   if (fso_plan_for_config(cfg, &pins, &plan, err, sizeof err) == 0) {
 *       fso_plan_print(stdout, &plan);
 *       fso_plan_apply(&plan, cfg, err, sizeof err);       (optional: take its choices)
 *   }
 *
 * and after a few steps fso_plan_check() with the measured step.
 */
#ifndef FSO_PLAN_H
#define FSO_PLAN_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "config/config.h"
#include "gpu_info.h"
#include "model.h"
#include "planner.h"
#include "probe.h"

/* The planner's inputs for cfg (its model, batch, world and offload
 * settings) on machine m. gpu: bf16 working parameters and gradients and the
 * GPU engine's schedule; else the CPU backend's (fp32 compute and gradients,
 * working parameters bf16 with bf16.enabled, copies on the device thread).
 * Arrays are owned by ctx. 0 or negative errno with err. */
typedef struct fso_plan_ctx {
    fso_plan_input in;
    uint64_t *block_elems;
    fso_plan_visit *visits;
    double *true_flops;        /* (visits) as counted, before any calibration */
    fso_visit_part *visit_part; /* (visits) what each computes (model.h) */
    double probe_gflops;       /* the machine's compute rate before calibration */
    uint64_t n_params;         /* real parameters (padding excluded) */
    bool calibrated;           /* fso_plan_calibrate_cpu set the compute (else a rate) */
} fso_plan_ctx;
int fso_plan_ctx_init(fso_plan_ctx *ctx, const fso_config *cfg, const fso_plan_machine *m,
                      bool gpu, char *err, size_t errlen);
void fso_plan_ctx_free(fso_plan_ctx *ctx);

/* CPU devices: time one micro-batch of a one-layer model of cfg's shapes
 * on the backend, on every device at once as training runs them (as many
 * as half the free memory holds), taking the slowest device (after an
 * untimed run, the best of up to three timed runs, another while they stay
 * within 12 s; skipped, returning -E2BIG, when a run would take over 10 s)
 * and set ctx's compute from it: device_gflops to the rate a layer
 * achieves, the embedding's and the head's visits to their measured share.
 * The figures are kept in the probe cache per machine and what was timed
 * (probe.h, "layers"). They are taken from there unless refresh, or the
 * timing takes under a second, or fso_plan_time_afresh was called, and
 * this process did not take them: then the layer is timed again. 0 or
 * negative errno. */
int fso_plan_calibrate_cpu(fso_plan_ctx *ctx, const fso_config *cfg, bool refresh, char *err,
                           size_t errlen);
/* From now on this process times each layer once itself, however long
 * that takes, rather than take another process's timing from the probe
 * cache: a shared machine's speed drifts from minute to minute, and a run
 * about to train plans with the speed of its own minute (fsoff train
 * calls it; fsoff plan reads the cache). */
void fso_plan_time_afresh(void);

/* What the config pins: a kind whose offload "device" the config file or
 * a --set gave (fso_config_origin_of; offload_optimizer.device pins master,
 * m, v and the gradients), train.prefetch_blocks, train.resident_blocks,
 * train.device_state_blocks and train.device_state_from when given. --nvme
 * names folders only, a place the planner may use, and pins nothing. */
void fso_plan_pins_from_config(const fso_config *cfg, fso_plan_pins *pins);

/* This machine's numbers for the CPU backend with cfg->world devices: the
 * cached probes (probing first when there are none, or refresh), NVMe
 * folders from cfg's offload sections (folders that do not exist are left
 * out), host memory from cfg->host_mem_bytes or what is available, device
 * memory from cfg->device_mem_bytes or zero.c's default.
 * 0 or negative errno with err. */
int fso_plan_machine_here(const fso_config *cfg, bool refresh, fso_plan_machine *m, char *err,
                          size_t errlen);

/* What this machine holds for cfg, without probing: cfg->world devices
 * of cfg->device_mem_bytes, or on CPU devices (gpu false) zero.c's default
 * share, or on GPUs gpu_free_bytes (0: unknown); the host memory
 * available; the free space of the configured NVMe folders that exist. */
void fso_plan_capacities_here(const fso_config *cfg, bool gpu, uint64_t gpu_free_bytes,
                              fso_plan_machine *m);

/* Before the planner, by arithmetic alone: a model the planner cannot lay
 * out (more layers than FSO_PLAN_MAX_BLOCKS takes, or byte counts that
 * overflow 64 bits) against the capacities of m (0: unknown, except NVMe)
 * and the pins: what each tier must hold whatever the placement, and
 * whether the whole training state fits in what is left. 0 when it may
 * fit (or the planner decides); -ENOSPC with one line in err naming each
 * tier's need, the shortfall and the fix in the options of fsoff train
 * (train) or fsoff plan. gpu: the devices are GPUs. Allocates nothing of
 * the model's size and takes microseconds whatever the model. */
int fso_plan_check_size(const fso_config *cfg, const fso_plan_pins *pins,
                        const fso_plan_machine *m, bool gpu, bool train, char *err,
                        size_t errlen);

/* The parts of it, for machines described in part (`fsoff plan`):
 * the configured NVMe folders (both offload sections, each once) that exist
 * here, comma-separated into dirs, the missing ones into missing; */
void fso_plan_nvme_folders(const fso_config *cfg, char *dirs, size_t len, char *missing,
                           size_t mlen);
/* the free bytes over comma-separated folders (statvfs); */
uint64_t fso_plan_folders_free(const char *dirs);
/* this machine's probes with cfg->threads threads and the NVMe folders
 * dirs, cached (refresh: measured again); 0 or negative errno with err; */
int fso_plan_probe(const fso_config *cfg, const char *dirs, bool refresh, fso_probe *p,
                   char *err, size_t errlen);
/* cfg->world CPU devices sharing host_mem_bytes, rates from probe p (NVMe
 * rates, not free space); */
void fso_plan_machine_cpu(const fso_config *cfg, const fso_probe *p, uint64_t host_mem_bytes,
                          fso_plan_machine *m);
/* a GPU's achieved figures from the table (gpu_info.h) into m. */
void fso_plan_machine_gpu(fso_plan_machine *m, const fso_gpu_spec *spec);

/* ctx for cfg on this machine's CPU backend (fso_plan_machine_here, one
 * layer timed): what fso_plan_for_config plans with. 0 or negative errno
 * with err; the caller frees ctx. */
int fso_plan_ctx_here(fso_plan_ctx *ctx, const fso_config *cfg, char *err, size_t errlen);
/* The compute ctx's timeline takes for each part of a visit (model.h
 * fso_visit_part), per device and visit, ms: part_ms (FSO_N_PARTS). */
void fso_plan_part_ms(const fso_plan_ctx *ctx, double *part_ms);

/* The plan for cfg on this machine's CPU backend, keeping pins (NULL:
 * none). 0; -ENOSPC when nothing fits (out holds the closest placement and
 * err says which tier is short, by how much, and what to do); other
 * negative errno with err. */
int fso_plan_for_config(const fso_config *cfg, const fso_plan_pins *pins, fso_plan *out,
                        char *err, size_t errlen);

/* The same on this machine's CUDA GPUs (the same engine: per-block tiers,
 * gathers, fp32 gradients): GPU 0's figures from the table (fso_gpu_spec_for_device;
 * *spec_used says which), each GPU's memory gpu_free_bytes (or
 * --device-mem), host memory, NVMe and the CPU AdamW rate from this
 * machine's probes. Returns as fso_plan_for_config. */
int fso_plan_for_config_gpus(const fso_config *cfg, const fso_plan_pins *pins,
                             const char *gpu_name, uint64_t gpu_free_bytes, fso_plan *out,
                             const fso_gpu_spec **spec_used, char *err, size_t errlen);

/* The plan table: memory per tier, the placement, the predicted step and
 * its bottleneck. */
void fso_plan_print(FILE *f, const fso_plan *p);
/* The same as one JSON object (one line); fso_plan_json builds it (the
 * caller owns the reference). */
void fso_plan_print_json(FILE *f, const fso_plan *p);
json_t *fso_plan_json(const fso_plan *p);

/* Where the capacities a plan was made with came from, for its words
 * (plan_words.c). */
typedef struct fso_plan_origin {
    bool train;                /* fsoff train's options, else fsoff plan's */
    bool other_machine;        /* fsoff plan --gpus: a machine described, not this one */
    bool host_given;           /* --host-mem */
    bool device_given;         /* --device-mem (or --gpu-mem) */
    bool nvme_given;           /* --nvme-free: drives described, not measured */
    const char *nvme_dirs;     /* the NVMe folders here, comma-separated; NULL or "": none */
} fso_plan_origin;

/* One line for an impossible plan p (what fso_plan_choose on in left):
 * every short tier with its need, capacity and shortfall, then fixes the
 * command did not already take, each sized by planning `in` again with that
 * tier unbounded (NVMe space, and where given or taken from this machine
 * when another is planned, host or device memory), in the options of the
 * command o names; what the configuration pins. in NULL: no sizing. */
void fso_plan_nofit_message(const fso_plan_input *in, const fso_plan *p,
                            const fso_plan_origin *o, char *buf, size_t len);
/* The same for the tier the planner named alone, with its generic fix, in
 * the options of fsoff train (train) or of fsoff plan. */
void fso_plan_shortfall_message(const fso_plan *p, const fso_plan_pins *pins, bool train,
                                char *buf, size_t len);
/* What fso_plan_choose searched for p (p->search) as one phrase: how many
 * placements of what, how many fit, or, when none does, how many were
 * short on each tier and by how little at least. */
void fso_plan_search_words(const fso_plan_input *in, const fso_plan *p, char *buf, size_t len);
/* NVMe folders dirs (comma-separated, here) that plan p, which fits, puts
 * nothing on: one line to f saying so. Nothing otherwise. */
void fso_plan_unused_nvme(FILE *f, const fso_plan *p, const char *dirs);

/* Take the plan's choices into cfg: the tier of each kind of state
 * (cfg->offload.per_kind), the per-block counts of state.h's rule
 * (resident_blocks, device_state_blocks, device_state_first,
 * state_host_blocks) and the prefetch depth. The rule is checked block by
 * block (fso_block_tier) to reproduce the plan: -ENOTSUP with an "internal
 * error" in err when it does not, or when the plan copies blocks whole
 * (the engine gathers); -EINVAL when it puts state on NVMe and cfg names
 * no NVMe folder. */
int fso_plan_apply(const fso_plan *p, fso_config *cfg, char *err, size_t errlen);

/* After a few steps: the measured mean step (and what else was measured;
 * fields < 0 unknown) against the plan. Returns 1 with a one-line message
 * and the corrected plan in *out when the prediction was off by more than
 * 20%, 0 when it held (out = the plan), negative errno on failure. */
int fso_plan_check(const fso_config *cfg, const fso_plan_pins *pins, const fso_plan *plan,
                   const fso_plan_measured *meas, fso_plan *out, char *msg, size_t msglen);

/* Whether a running job should move to a corrected plan: the bytes of
 * state that change tier, the predicted time to move them (read at the old
 * tier's rate, written at the new one's, with next's corrected machine),
 * and the predicted saving per step against the measured step. It pays
 * when the placement changes, the saving is at least 5% of the step and
 * the steps left repay the move. Returns mv->pays. */
typedef struct fso_plan_move {
    bool changes;              /* tiers or prefetch depth differ */
    uint64_t bytes;            /* state that changes tier, all devices */
    double move_ms;            /* predicted time to move it */
    double saving_ms;          /* per step */
    bool pays;
} fso_plan_move;
int fso_plan_revision(const fso_plan *cur, const fso_plan *next, double measured_ms,
                      int64_t steps_left, fso_plan_move *mv);

/* ------------------------------------------------------------------ batch
 * The global batch (train_batch_size: sequences per optimizer step, all
 * devices) is the user's; its split into micro-batch x accumulation is
 * chosen here (plan_batch.c). Each split is planned by fso_plan_choose from
 * the inputs it gives (compute per visit and activation bytes scale with the
 * micro-batch); the fastest that fits wins, ties (within FSO_PLAN_BATCH_TIE)
 * going to the configured split, then to the smaller micro-batch. Then the
 * smallest global batch at which compute would hide the optimizer (its part
 * of the critical path, AdamW and NVMe when only the optimizer state is
 * there, at most FSO_PLAN_HIDDEN_SHARE of the step), over two axes: larger
 * accumulation of a placement, and larger micro-batches (doubling, each
 * planned by fso_plan_choose, activations' tier included, until one does
 * not fit; a micro-batch alone hiding it: the smallest between the last two
 * doublings). Work that comes with every micro-batch (gradients copied down
 * and accumulated on the host) grows with accumulation as compute does:
 * only a larger micro-batch covers it. Ties: the smaller micro-batch. */
#define FSO_PLAN_BATCH_TIE 0.01
#define FSO_PLAN_HIDDEN_SHARE 0.05
#define FSO_PLAN_BATCH_MAX_SPLITS 64   /* micro-batches planned, smallest first */
#define FSO_PLAN_HIDE_MAX_ACCUM 4096
#define FSO_PLAN_HIDE_MAX_VISITS 32768 /* accumulation x visits of a micro-batch searched */
#define FSO_PLAN_HIDE_MAX_MICRO 1024   /* the largest micro-batch searched */

/* What keeps the optimizer exposed when no batch searched hides it. */
typedef enum {
    FSO_PLAN_HIDE_STOP_ADAM = 0,  /* the CPU AdamW outlasts the compute of every batch searched */
    FSO_PLAN_HIDE_STOP_NVME,      /* the optimizer state's NVMe traffic does */
    FSO_PLAN_HIDE_STOP_GRAD_HOST, /* per micro-batch: gradients copied down, accumulated */
    FSO_PLAN_HIDE_STOP_GRAD_NVME, /* per micro-batch: gradients' NVMe reads and writes */
} fso_plan_hide_stop;

typedef struct fso_plan_batch {
    int64_t global_batch;      /* sequences per optimizer step, all devices: unchanged */
    int devices;               /* the ranks the batch spreads over: every box's devices */
    int user_micro, user_accum; /* the configured split */
    double user_step_ms;       /* its predicted step; < 0: it does not fit */
    bool user_bound;           /* its plan is optimizer-bound (fso_plan_optimizer_bound) */
    double user_optimizer_ms;  /* the optimizer's part of its critical path */
    int micro, accum;          /* the chosen split */
    double step_ms;            /* its predicted step; < 0: no split fits */
    int splits, splits_fit;    /* splits planned, those that fit */
    bool optimizer_bound;      /* the chosen split's plan is (fso_plan_optimizer_bound) */
    fso_stream bottleneck;     /* the chosen split's */
    double optimizer_ms;       /* the optimizer's part of the chosen plan's critical path */
    int64_t hide_batch;        /* the smallest global batch at which compute hides the
                                  optimizer (more accumulation, larger micro-batches); 0: none
                                  searched */
    int hide_micro, hide_accum;
    bool hide_acts_host;       /* that split's plan keeps the activations on the host */
    int hide_max_accum;        /* the most accumulation searched at the chosen micro-batch
                                  (FSO_PLAN_HIDE_MAX_ACCUM, or fewer for a model of many
                                  visits) */
    int hide_max_micro;        /* the largest micro-batch searched that fits */
    int hide_no_fit_micro;     /* the micro-batch that stopped the search by not fitting; 0:
                                  none did */
    fso_plan_hide_stop hide_stop; /* hide_batch 0: what keeps the optimizer exposed */
    double hide_step_ms, hide_tokens_per_s, hide_optimizer_ms;
} fso_plan_batch;

/* Whether plan p's bound is the optimizer: the CPU AdamW, or NVMe when it
 * carries the optimizer state alone (parameters and gradients elsewhere). */
bool fso_plan_optimizer_bound(const fso_plan *p);
/* Whether compute hides plan p's optimizer: its part of the critical path
 * is at most FSO_PLAN_HIDDEN_SHARE of the step. */
bool fso_plan_optimizer_hidden(const fso_plan *p);
/* base's inputs (machine, pins) for cfg split as micro x accum: out is
 * initialised (the caller frees it). A calibrated base: the split's
 * micro-batch is timed too (fso_plan_calibrate_cpu, from the probe cache
 * when it has it: a larger micro-batch computes at a better rate); else,
 * or when that fails, every visit's compute scales with the micro-batch at
 * base's rate. 0 or negative errno. */
int fso_plan_ctx_for_split(const fso_plan_ctx *base, const fso_config *cfg, int micro,
                           int accum, fso_plan_ctx *out, char *err, size_t errlen);
/* The split of cfg's global batch on ctx's machine (ctx made for cfg, pins
 * set) and where compute hides the optimizer, into *b. 0 (b->step_ms < 0
 * when no split fits) or negative errno with err. */
int fso_plan_batch_choose(const fso_plan_ctx *ctx, const fso_config *cfg, fso_plan_batch *b,
                          char *err, size_t errlen);
/* Whether the split is the planner's to choose: auto_batch (--auto-batch:
 * the command line's request, which the config's split gives way to), or
 * neither train_micro_batch_size_per_gpu nor gradient_accumulation_steps
 * pinned and one of them "auto". *why: the words for it, or NULL. */
bool fso_plan_batch_is_free(const fso_config *cfg, bool auto_batch, const char **why);
/* Take b's split into cfg (the global batch stays). */
void fso_plan_batch_apply(const fso_plan_batch *b, fso_config *cfg);
/* The split as one phrase: "--auto-batch: micro-batch 4 x accumulation 2
 * (was 1 x 8), same global batch 8: predicted 812 ms/step, was 1390". */
void fso_plan_batch_split_words(const fso_plan_batch *b, const char *why, bool applied,
                                char *buf, size_t len);
/* Where compute hides the optimizer, as one phrase. */
void fso_plan_batch_hide_words(const fso_plan_batch *b, char *buf, size_t len);
/* The plan's batch lines: the split (why: what chose it, NULL: advice
 * only, printed when it differs) and where compute hides the optimizer. */
void fso_plan_batch_print(FILE *f, const fso_plan_batch *b, const char *why, bool applied);
json_t *fso_plan_batch_json(const fso_plan_batch *b, bool applied);
/* The same from a few measured steps of plan (fso_plan_check's inputs): the
 * AdamW and compute rates corrected so that plan's placement predicts the
 * measured optimizer and compute time (fields < 0: kept), then
 * fso_plan_batch_choose. 0 or negative errno with err. */
int fso_plan_batch_measured(const fso_config *cfg, const fso_plan_pins *pins,
                            const fso_plan *plan, const fso_plan_measured *meas,
                            fso_plan_batch *b, char *err, size_t errlen);
/* Whether a DeepSpeed key of the prefetch depth (stage3_prefetch_bucket_size,
 * stage3_max_live_parameters) or train.prefetch_blocks is "auto": the
 * planner chooses the depth (fso_plan_pins_from_config pins none). */
bool fso_plan_prefetch_auto(const fso_config *cfg);
/* One line per prefetch key given "auto": what it became in plan p. */
void fso_plan_auto_print(FILE *f, const fso_config *cfg, const fso_plan *p);
/* aio.block_size and aio.queue_depth given "auto": what `fsoff bench tune`
 * recorded for cfg's NVMe folders (probe.h fso_probe_tuned), else the
 * defaults the config holds, into cfg; line says which ("" when neither is
 * "auto"). 1 when tuned figures were taken, else 0. */
int fso_plan_auto_aio(fso_config *cfg, char *line, size_t len);
/* fso_plan_batch_choose for cfg on this machine keeping pins (NULL: none):
 * its CPU devices (gpu_name NULL, as fso_plan_for_config plans them) or
 * its GPUs (as fso_plan_for_config_gpus). */
int fso_plan_batch_for_config(const fso_config *cfg, const fso_plan_pins *pins,
                              const char *gpu_name, uint64_t gpu_free_bytes, fso_plan_batch *b,
                              char *err, size_t errlen);

#endif
