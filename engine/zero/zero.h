/* zero.h — ZeRO-3 training state across the devices of one process, on three
 * tiers (ARCHITECTURE.md: the sharded trainer, One step).
 *
 * Every block's flat buffer is split into `world` equal shards (each a
 * multiple of 4 KiB); rank r owns shard r. Per shard there are five kinds of
 * state — working parameters, fp32 master, AdamW m and v, and the gradient
 * accumulator — and each kind lives on one tier: the device, the process's
 * host arena (one for all devices, locked in memory where allowed), or the
 * NVMe store: where fso_offload_tier() says, so the parameters follow
 * zero_optimization.offload_param and the rest offload_optimizer, unless a
 * plan (plan.h) gave each kind a tier of its own.
 *
 * Working parameters are fp32, or bf16 (2 bytes) with bf16.enabled: then
 * they are stored, read from NVMe, all-gathered and lent to the model at
 * half the bytes (the model's ops take bf16 weights; backend.h, "Types").
 * AdamW writes them as bf16 of the new fp32 master (round to nearest even)
 * in the same pass as the update, so they always equal bf16(master). Master,
 * m, v and gradients stay fp32. Every shard is whole 4 KiB pages in either
 * type (a block is padded to world * 2048 elements), so every NVMe offset and
 * I/O is aligned, and a device's part of a gathered block starts on a page.
 *
 * A step on rank r: for each micro-batch, the model asks for each block in a
 * fixed order (model.h); the rank reads its parameter shard (prefetched from
 * NVMe train.prefetch_blocks blocks ahead), all-gathers the full block,
 * lends it, and drops it afterwards; gradients of each block are
 * reduce-scattered as soon as the block's backward ends and added into the
 * rank's gradient shard. Then the exact global gradient norm (one
 * all-reduce), and AdamW over the rank's shards block by block, reading
 * ahead and writing behind when the optimizer state is on NVMe.
 *
 * The sums do not depend on the tier, so a run is bit-identical on every
 * tier for the same device count.
 */
#ifndef FSO_ZERO_H
#define FSO_ZERO_H

#include <stdint.h>

#include "coll.h"
#include "config/config.h"
#include "footprint.h"
#include "model.h"
#include "store.h"

/* One optimizer step's statistics, as fso_zero_step_run fills them: what
 * the step line, the metrics and the re-plan read. After a failed step only
 * step, loss and grad_norm are set; every other field is 0. */
typedef struct fso_zero_step {
    int64_t step;         /* from 1 */
    double loss;          /* mean over the counted targets of all micro-batches of all ranks */
    double grad_norm;     /* global, before clipping */
    double clip_coef;     /* the factor applied, 1 when not clipped */
    double lr;
    double step_ms;       /* the whole step, as the caller waited for it */
    double stall_ms;      /* compute waited on NVMe reads (rank 0) */
    double compute_ms;    /* rank 0: forward and backward less the waits for parameters
                             (reads, copies, gathers) and for gradients to be stored */
    double optimizer_ms;  /* rank 0: updating, in this step's time (overlapped: the previous
                             step's update, which ran during this one) */
    double optimizer_exposed_ms; /* rank 0: compute waited on the optimizer */
    /* NVMe bytes, all ranks: the compute's reads and writes in this step,
     * and the optimizer's of the update that ran during it (the previous
     * step's with train.optimizer_overlap "forward"); in total and by kind */
    uint64_t nvme_read_bytes, nvme_write_bytes;
    uint64_t nvme_kind_read[FSO_N_KINDS], nvme_kind_write[FSO_N_KINDS];
    /* collective bytes, all ranks: every block each rank gathered and every
     * block of gradients it reduced, whole, in this step */
    uint64_t gather_bytes, reduce_bytes;
    /* activation bytes, all ranks: the layer inputs kept on the host
     * (train.activations "host") copied down in the forwards and up in the
     * backwards of this step (model.h fso_model_act_bytes_per_step each
     * micro-batch) */
    uint64_t act_bytes;
    /* across boxes (boxes.h), what this box sent over its rails: the
     * gradient shards reduce-scattered in this step and the parameters
     * all-gathered by the update that ran during it (footprint.h
     * net_bytes: a steady step's), and device 0's time in its rails'
     * calls, ms */
    uint64_t net_bytes;
    double net_ms;
    int64_t tokens;       /* tokens in this step, all devices of all boxes: world * boxes *
                             grad_accum micro-batches */
    uint64_t stale_marks; /* since creation, all devices (fso_zero_stale_marks) */
} fso_zero_step;

typedef struct fso_zero fso_zero;

/* Plan memory for cfg on cfg->world virtual CPU devices, check every tier's
 * budget (device cap, host memory, NVMe space) and fail before allocating
 * with a message naming the short tier and by how much; then allocate,
 * initialise the parameters from cfg->seed, or from the Hugging Face folder
 * cfg->init_from (hf.h; checked before anything large is allocated, then
 * read block by block into each block's tier), and zero the optimizer state.
 * Returns 0 or negative errno with the message in err. */
int fso_zero_create(fso_zero **out, const fso_config *cfg, char *err, size_t errlen);
/* The same on box cfg->box of fso_config_boxes(cfg) boxes (boxes.h): this
 * box holds its slice of the optimizer's state, and device g meets the
 * other boxes on rails->grad[g] and rails->param[g] (world = the boxes,
 * rank = this box). rails may be NULL on one box. */
struct fso_rails;
int fso_zero_create_on(fso_zero **out, const fso_config *cfg, const struct fso_rails *rails,
                       char *err, size_t errlen);
void fso_zero_destroy(fso_zero *z);

/* One optimizer step, number fso_zero_steps(z) + 1: world * grad_accum
 * micro-batches, inputs/targets (and pos) hold them in order (micro-batch a
 * of rank r is number a * world + r); its statistics into *st. A target < 0
 * does not count; the loss is the mean over the step's targets that do
 * (all micro-batches, all devices), its gradient that mean's
 * (fso_model_loss_scale). pos: each token's position in its document
 * (data.h), or NULL for data without documents (fso_model_step). Returns 0,
 * or negative errno with a message in err (I/O failure; -ERANGE for a
 * non-finite loss or norm: the update is then not applied and the step not
 * counted; -ENODATA when no target of the step counts: nothing runs, the
 * step is not counted). */
int fso_zero_step_run(fso_zero *z, const int32_t *inputs, const int32_t *targets,
                      const int32_t *pos, fso_zero_step *st, char *err, size_t errlen);
/* Optimizer steps taken (AdamW's t of the last update). */
int64_t fso_zero_steps(const fso_zero *z);

/* Wait for every update still running (overlapped schedules) and return
 * the time waited (exposed optimizer time), or negative errno with err. */
int fso_zero_finish(fso_zero *z, double *waited_ms, char *err, size_t errlen);

/* A new placement while training (the re-plan, train.c): each kind on
 * fso_offload_tier(o, kind), o->prefetch_blocks read ahead; NVMe folders from o when
 * state moves to NVMe and none was open. Call between steps, after
 * fso_zero_finish. Every moved shard is copied to its new place before any
 * old one is let go, so on failure (a tier too small, an I/O error) the
 * placement is as it was and training can go on; err says why. Training
 * continues with the same bits as on the old placement (same device
 * count). *bytes_moved: the bytes of state that changed tier (all devices).
 * 0 or negative errno with err. */
int fso_zero_retier(fso_zero *z, const fso_offload_config *o, uint64_t *bytes_moved, char *err,
                    size_t errlen);

/* Parameters in HF order (n_params floats), moved one block at a time.
 * load_hf sets the master to hf and the working parameters to hf (bf16:
 * rounded to nearest even); store_hf returns the fp32 master. */
int fso_zero_load_hf(fso_zero *z, const float *hf, char *err, size_t errlen);
int fso_zero_store_hf(fso_zero *z, float *hf, char *err, size_t errlen);
/* The working parameters in HF order, as the model computes from them:
 * fp32, or bf16 widened exactly. */
int fso_zero_store_working_hf(fso_zero *z, float *hf, char *err, size_t errlen);
/* The gradient accumulators in HF order, as left by the last step. */
int fso_zero_store_grads_hf(fso_zero *z, float *hf, char *err, size_t errlen);
/* Write the fp32 master as a Hugging Face folder (hf.h: fso_hf_export),
 * one block at a time from wherever its shards live. Call between steps. */
struct fso_hf_export_opts;
int fso_zero_export_hf(fso_zero *z, const char *outdir, const struct fso_hf_export_opts *o,
                       char *err, size_t errlen);
/* A validation loss: the forward of n_micro micro-batches (B*T tokens each
 * in inputs, targets and pos, which may be NULL: fso_model_step's),
 * micro-batch i on device i mod world (a device
 * with none left in the last round repeats one and its loss is dropped),
 * after the pending update is applied. *loss_sum = the losses summed over
 * every position; no state changes. 0 or negative errno with err. */
int fso_zero_eval(fso_zero *z, const int32_t *inputs, const int32_t *targets,
                  const int32_t *pos, int n_micro, double *loss_sum, char *err, size_t errlen);

/* Forward of rank 0 on one micro-batch (B*T tokens), logits (B*T, V) to host. */
int fso_zero_forward_logits(fso_zero *z, const int32_t *inputs, float *logits, char *err,
                            size_t errlen);

/* ---- checkpoints (checkpoint.h builds on these) ----
 *
 * A checkpoint holds master, m and v of every block, each block's first
 * `block_elems` elements (its tensors and the padding between them, rounded
 * up to whole 4 KiB pages: the same at any device count). A device's shard
 * of a block is one contiguous range of that, so the saver writes each
 * shard's part with large aligned writes straight from where it lives. */
#define FSO_ZERO_SAVED_KINDS 3 /* master, m, v: FSO_KIND_MASTER + i */

/* One checksummed piece of what a save wrote. */
typedef struct fso_zero_save_piece {
    uint64_t off;         /* byte offset in the data file */
    uint64_t bytes;
    uint32_t crc32c;
} fso_zero_save_piece;

typedef struct fso_zero_save_spec {
    fso_store *out;                /* the checkpoint's data file (one file: store offset = file
                                      offset); only the saver uses it */
    const uint64_t *block_off;     /* [i * n_blocks + b]: where saved kind i of block b begins
                                      in out, a multiple of 4 KiB */
    const size_t *block_elems;     /* [b]: elements saved of block b, a multiple of 1024 */
    size_t piece_bytes;            /* the largest checksummed piece, a multiple of 4 KiB;
                                      pieces never cross a multiple of it in out */
    bool reflink;                  /* clone NVMe-resident shards into out where the filesystem
                                      shares blocks (XFS, btrfs); copy where it cannot */
    /* called after each block is out (tests pause a save here) */
    void (*after_block)(void *ctx, int blocks_done, int n_blocks);
    void *ctx;
    /* results: the pieces in the order written (malloc'ed; the caller frees) */
    fso_zero_save_piece *pieces;
    size_t n_pieces;
    uint64_t bytes;                /* state saved, cloned bytes included */
    uint64_t cloned_bytes;         /* of which shared with the NVMe store by reflink */
    char err[512];
} fso_zero_save_spec;

/* Between steps, on the thread that runs them: start a save of the state of
 * step fso_zero_steps(z). Until fso_zero_save_stream has streamed a block
 * out, later updates of that block wait for it (the optimizer waits for the
 * saver block by block, never for the whole save); everything else goes
 * on. 0, or -EBUSY while another save streams. */
int fso_zero_save_arm(fso_zero *z);
/* On the saver's own thread, after arm: every device's master, m and v,
 * block by block in the order the next update visits them, each block once
 * its update of the saved step has landed, from wherever each shard lives
 * (device, host arena, NVMe), into spec->out at spec's offsets with a CRC-32C
 * per piece. Never holds more than a few pieces in memory. Lets every
 * waiting update go when it returns, failed or not. 0 or negative errno
 * with spec->err. */
int fso_zero_save_stream(fso_zero *z, fso_zero_save_spec *spec);
/* Let every update waiting for a save go (a save abandoned before it
 * streamed); no-op when none is armed. */
void fso_zero_save_disarm(fso_zero *z);
/* What training waited for the last save inside the trainer, ms: the
 * longest any device's updates waited for the saver, and a re-plan's wait
 * for the save to stream out. */
double fso_zero_save_waited_ms(fso_zero *z);

/* Loading, after fso_zero_create and before the first step: kind k (master,
 * m or v) of block b from flat, the whole block in fp32 (padded_elems of
 * this device count, the padding zero); loading the master sets the working
 * parameters to it (bf16: rounded to nearest even, as the optimizer writes
 * them). 0 or negative errno with err. */
int fso_zero_load_block(fso_zero *z, int b, fso_kind k, float *flat, char *err, size_t errlen);
/* After loading every block: the state is that of step `steps`. */
void fso_zero_set_steps(fso_zero *z, int64_t steps);

/* The footprint's rules for cfg (footprint.h): its device count, whether
 * its backend's memory is the host's, each kind's element type (bf16
 * working parameters with bf16.enabled, else fp32), the aio settings. What
 * fso_zero_create allocates and what the planner counts follow from them. */
void fso_zero_fp_rules(const fso_config *cfg, fso_fp_rules *r);
/* The same for cfg on backend `on` instead of cfg's own (the planner asks
 * what GPUs would need). */
void fso_zero_fp_rules_on(const fso_config *cfg, const fso_backend_row *on, fso_fp_rules *r);

/* What a configuration needs on each tier for its placement
 * (cfg->offload's tiers and prefetch depth), by arithmetic alone
 * (footprint.h fso_fp_need_for) and the model's activations: nothing is
 * allocated. The counts are checked: one that overflows 64 bits is
 * FSO_BYTES_OVERFLOW (util.h). This is what fso_zero_create allocates and
 * the planner counts. */
/* A checkpoint's state streams out in checksummed pieces of at most this
 * many bytes (fso_zero_save_spec piece_bytes), through FSO_ZERO_SAVE_STAGES
 * host buffers of a piece each, allocated while a save runs. */
#define FSO_ZERO_SAVE_PIECE_BYTES ((size_t)8 << 20)
#define FSO_ZERO_SAVE_STAGES 8

typedef struct fso_zero_need {
    uint64_t kind_bytes[FSO_N_KINDS]; /* each kind's shards, all devices together */
    uint64_t activations;        /* per device: activations and scratch (fso_model_init), and
                                    on CPU devices with bf16 their fp32 working space */
    uint64_t device_buffers;     /* per device: the gather window and gradient buffers */
    uint64_t staging;            /* per device, in the host arena */
    uint64_t saver;              /* with checkpoint.dir: the checkpoint saver's buffers, host
                                    memory outside the arena (fso_zero_saver_bytes) */
    uint64_t act_host;           /* per device: the kept activations on the host tier (model.h
                                    fso_model_host_act_bytes_for), host memory outside the
                                    arena */
    uint64_t tier[FSO_N_TIERS];  /* device: each device's total; host: the arena's, the
                                    saver's and every device's act_host; NVMe: all devices' */
} fso_zero_need;
/* The CPU backends' fp32 working space for bf16 tensors on backend `on`, per
 * device (0 for fp32, and on GPUs, which compute in bf16). */
uint64_t fso_zero_widen_bytes(const fso_config *cfg, const fso_backend_row *on);
/* The checkpoint saver's host buffers when cfg saves (checkpoint.dir), else 0. */
uint64_t fso_zero_saver_bytes(const fso_config *cfg);
void fso_zero_need_for(const fso_config *cfg, fso_zero_need *n);
/* The same for cfg on backend `on` instead of cfg's own. */
void fso_zero_need_on(const fso_config *cfg, const fso_backend_row *on, fso_zero_need *n);
/* The need against each device's cap and the host memory fsoff may use
 * (cfg->host_mem_bytes, else what is available; 0: unknown, not checked): 0, or -ENOMEM with one line in err naming the
 * tier, the need and its parts, the capacity, the shortfall and the fix. */
int fso_zero_check_device(const fso_config *cfg, const fso_zero_need *n, uint64_t cap,
                          char *err, size_t errlen);
int fso_zero_check_host(const fso_config *cfg, const fso_zero_need *n, uint64_t avail, char *err,
                        size_t errlen);

/* What one step of cfg's placement (fso_offload_block_tier of each kind
 * and block) moves, all devices together: footprint.h fso_fp_step_traffic
 * over the model's blocks and visits. What a steady-state step's counts
 * (fso_zero_step) meet, and the least that placement allows: with exact
 * clipping every gradient waits for the global norm on its tier. 0 or
 * -ENOMEM. */
int fso_zero_step_traffic(const fso_config *cfg, fso_fp_traffic *t);

/* Each device's share of cfg->threads (else of the cores), at least one:
 * the threads its backend computes with. */
int fso_zero_device_threads(const fso_config *cfg);

/* The threads of each device's optimizer pool (offload/optpool.h): the
 * device's share (fso_zero_device_threads), but one on CPU
 * devices whose update overlaps compute (train.optimizer_overlap "forward"
 * or "backward"). There the update runs on the cores the device computes
 * on, and a pool of several threads beside a pool of several compute
 * threads holds both up: on two cores, one device, the wider model of
 * bench/plan_vs_measured.py with its state in the host arena lost 7-13 ms
 * of compute a step to an update of 3-5 ms of work with two optimizer
 * threads, and 3-5% of its step against one. The planner rates the
 * update at these threads (engine/plan.c). */
int fso_zero_optimizer_threads(const fso_config *cfg);

/* What each CPU virtual device may hold: cfg->device_mem_bytes (--device-mem)
 * when given, else an equal share of half of cfg->host_mem_bytes (--host-mem)
 * or of host_bytes (the host memory available), or 8 GiB when that is
 * unknown (0). GPUs hold what they have
 * free unless --device-mem says less. */
uint64_t fso_zero_cpu_device_mem(const fso_config *cfg, uint64_t host_bytes);

/* Compute replaced by timed waits (model.h standin_ms: FSO_N_PARTS ms per
 * part, owned by the caller; NULL computes again) on every device, the
 * rest of the step as it is: `fsoff bench pipeline`. */
void fso_zero_standin(fso_zero *z, const double *part_ms);

/* Wrap device `rank`'s NVMe store in a fault injector (tests). 0 or -errno;
 * -ENOENT when that device has no store. */
int fso_zero_inject_faults(fso_zero *z, int rank, const fso_fault_spec *spec);
/* Bytes of the host arena in use: host-tier shards and staging buffers of
 * every device. */
uint64_t fso_zero_host_arena_bytes(const fso_zero *z);
/* What is allocated now: dev[r] each device's memory in use (world
 * entries), and on each tier what the planner counts (zero_need.tier): the
 * largest device's, the host arena's, and every device's NVMe extent. */
void fso_zero_allocated(const fso_zero *z, uint64_t *dev, uint64_t tier[FSO_N_TIERS]);

/* What a report needs. */
const fso_model *fso_zero_model(const fso_zero *z);
/* Where each block's shards live now (state.h): the configuration's rule,
 * or the last re-plan's (fso_zero_retier). */
const fso_block_rule *fso_zero_block_rule(const fso_zero *z);
/* Device 0's time computing on each block in the last step (n_blocks
 * entries, ms; waits for parameters and gradients excluded): the per-block
 * timings the re-plan corrects the planner's compute with. */
const double *fso_zero_block_compute_ms(const fso_zero *z);
uint64_t fso_zero_peak_device_bytes(const fso_zero *z);  /* largest across devices */
/* Why pinning (CUDA registration, or mlock with pin_memory) of the host
 * arena was refused, with the fix, when it was at creation (the caller
 * reports it; a later refusal is a warning at once); NULL when not. */
const char *fso_zero_pin_refused(const fso_zero *z);
/* Marks used after they left a device's window ("stale", each a lost
 * overlap: the backend's stale_marks op, backend.h), all devices, since
 * creation; 0 on devices that keep no window (the plain CPU backends). */
uint64_t fso_zero_stale_marks(const fso_zero *z);
void fso_zero_describe(const fso_zero *z, char *buf, size_t len); /* placement, one line each */

#endif
