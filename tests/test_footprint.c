/* test_footprint.c — the footprint module (offload/footprint.h) is what the
 * engine does: for a matrix of configurations — 1, 2 and 4 devices, the
 * "cpu" and "cpu-async" backends, fp32 and bf16 working parameters, every
 * optimizer schedule, and placements that put every kind on every tier —
 * the bytes the engine allocates on each tier are the planner's prediction
 * and the engine's own budget, exactly; and the NVMe bytes (by kind) and
 * collective bytes each step reports are fso_zero_step_traffic's, exactly.
 * Per-block placements (resident parameter blocks, blocks whose state is on
 * the devices) the same; whole-block copies, the same on 2 and 4 devices.
 * Also: the limits a library caller meets (more devices than fsoff
 * drives). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "data.h"
#include "footprint.h"
#include "plan.h"
#include "test_util.h"
#include "train.h"
#include "zero/zero.h"

static char nvme_dir[512];

#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
/* Placements, by kind (parameters, master, m, v, gradients): the tiers of
 * parameters, optimizer state and gradients as a Latin square (every pair
 * of the three on every pair of tiers), then m and v apart from master. */
static const fso_tier placements[][FSO_N_KINDS] = {
    {D, D, D, D, D}, {D, H, H, H, N}, {D, N, N, N, H}, {H, D, D, D, N},
    {H, H, H, H, H}, {H, N, N, N, D}, {N, D, D, D, H}, {N, H, H, H, D},
    {N, N, N, N, N}, {D, H, N, D, H}, {H, N, D, H, N}, {N, D, H, N, D},
};
#undef D
#undef H
#undef N
#define N_PLACEMENTS (sizeof placements / sizeof placements[0])

typedef struct job {
    int world;
    const char *backend;
    bool bf16;
    fso_overlap overlap;
    const fso_tier *tier;
    bool qwen2;               /* model.model_type "qwen2": q/k/v biases in each layer block */
    int resident;             /* train.resident_blocks (0: none) */
    int device_state;         /* train.device_state_blocks (0: none) */
    bool state_first;         /* train.device_state_from "first" */
    bool whole_copy;          /* train.whole_block_copies */
} job;

static void describe(const job *j, char *buf, size_t len)
{
    static const char *const sched[] = {"none", "forward", "backward"};
    snprintf(buf, len, "%s%s%d x %s, %s, schedule %s, tiers %s/%s/%s/%s/%s",
             j->qwen2 ? "qwen2, " : "", j->whole_copy ? "whole copies, " : "", j->world,
             j->backend,
             j->bf16 ? "bf16" : "fp32", sched[j->overlap], fso_tier_name(j->tier[0]),
             fso_tier_name(j->tier[1]), fso_tier_name(j->tier[2]), fso_tier_name(j->tier[3]),
             fso_tier_name(j->tier[4]));
    if (j->resident || j->device_state) {
        const size_t n = strlen(buf);
        snprintf(buf + n, len - n, ", %d resident blocks, %d blocks' state on the devices "
                                   "(from the %s)", j->resident, j->device_state,
                 j->state_first ? "first" : "last");
    }
}

static void config_for(fso_config *cfg, const job *j)
{
    fso_test_small_model(cfg, j->world, 4);
    if (j->qwen2)
        cfg->model.model_type = FSO_MODEL_QWEN2;
    cfg->backend = fso_backend_find(j->backend)->kind;
    cfg->bf16 = j->bf16;
    cfg->optimizer_overlap = j->overlap;
    cfg->grad_clip = j->overlap == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
    cfg->offload.param_tier = j->tier[FSO_KIND_PARAM];
    cfg->offload.optim_tier = j->tier[FSO_KIND_MASTER];
    cfg->offload.per_kind = true;
    memcpy(cfg->offload.kind_tier, j->tier, sizeof cfg->offload.kind_tier);
    cfg->offload.prefetch_blocks = 2;
    cfg->offload.aio_block_bytes = 8192; /* chunks smaller than a shard */
    snprintf(cfg->offload.param_nvme_path, sizeof cfg->offload.param_nvme_path, "%s", nvme_dir);
    snprintf(cfg->offload.optim_nvme_path, sizeof cfg->offload.optim_nvme_path, "%s", nvme_dir);
    cfg->threads = j->world;
    cfg->offload.resident_blocks = j->resident;
    cfg->offload.device_state_blocks = j->device_state;
    cfg->offload.device_state_first = j->state_first;
    cfg->offload.whole_copy = j->whole_copy;
}

/* The planner's prediction for the job's placement on CPU devices. */
static void predict(const fso_config *cfg, const job *j, fso_plan *p, uint64_t *reserve)
{
    fso_plan_ctx ctx;
    static fso_placement pl;
    char err[512];
    fso_plan_machine m = {.devices = j->world, .cpu_devices = true,
                          .device_mem_bytes = (uint64_t)1 << 40,
                          .host_mem_bytes = (uint64_t)1 << 40,
                          .nvme_free_bytes = (uint64_t)1 << 40, .nvme_read_gbps = 1,
                          .nvme_write_gbps = 1, .h2d_gbps = 1, .d2h_gbps = 1, .coll_gbps = 1,
                          .device_gflops = 1, .adam_gelems = 1, .host_copy_gbps = 1};
    assert_int_equal(fso_plan_ctx_init(&ctx, cfg, &m, false, err, sizeof err), 0);
    fso_placement_uniform(&pl, ctx.in.model.n_blocks, j->tier[FSO_KIND_PARAM],
                          j->tier[FSO_KIND_MASTER], j->tier[FSO_KIND_GRAD],
                          cfg->offload.prefetch_blocks);
    for (int k = 0; k < FSO_N_KINDS; k++) /* block by block: the configuration's rule */
        for (int b = 0; b < pl.n_blocks; b++)
            pl.tier[k][b] = (uint8_t)fso_offload_block_tier(&cfg->offload, (fso_kind)k, b,
                                                            pl.n_blocks);
    assert_int_equal(fso_plan_evaluate(&ctx.in, &pl, p), 0);
    *reserve = ctx.in.engine.device_reserve_bytes;
    fso_plan_ctx_free(&ctx);
}

/* Allocation: what the engine holds after creation on each tier (each
 * device alike) is the planner's need and the engine's own budget. The
 * CPU backends' working space for bf16 tensors (the planner's reserve)
 * grows during a step and is not allocated yet. */
static void check_allocation(const job *j, const fso_config *cfg, fso_trainer *tr)
{
    static fso_plan p;
    uint64_t reserve, dev[FSO_MAX_DEVICES], have[FSO_N_TIERS];
    char what[256];
    describe(j, what, sizeof what);
    predict(cfg, j, &p, &reserve);
    fso_zero_allocated(tr->zero, dev, have);
    fso_zero_need need;
    fso_zero_need_for(cfg, &need);
    for (int r = 0; r < j->world; r++)
        if (dev[r] != have[FSO_TIER_DEVICE])
            fail_msg("%s: device %d holds %llu bytes, device 0 %llu", what, r,
                     (unsigned long long)dev[r], (unsigned long long)dev[0]);
    for (int t = 0; t < FSO_N_TIERS; t++) {
        const uint64_t predicted = p.need_bytes[t] - (t == FSO_TIER_DEVICE ? reserve : 0);
        const uint64_t budget = need.tier[t] - (t == FSO_TIER_DEVICE ? reserve : 0);
        if (have[t] != predicted || have[t] != budget)
            fail_msg("%s: %s: %llu allocated, the planner predicts %llu, the engine's budget "
                     "%llu", what, fso_tier_name(t), (unsigned long long)have[t],
                     (unsigned long long)predicted, (unsigned long long)budget);
    }
}

/* Traffic: every step's NVMe bytes by kind and collective bytes are the
 * footprint's, but the first step of the forward schedule, whose update
 * runs in the next one. */
static void check_traffic(const job *j, const fso_config *cfg, fso_trainer *tr)
{
    fso_data data = {0};
    fso_fp_traffic want;
    char what[256];
    describe(j, what, sizeof what);
    assert_int_equal(fso_zero_step_traffic(cfg, &want), 0);
    assert_int_equal(fso_data_init(&data, cfg), 0);
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    const size_t n = fso_trainer_step_tokens(cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    assert_non_null(in);
    assert_non_null(tg);
    for (int s = 1; s <= 2; s++) {
        fso_zero_step st;
        for (size_t a = 0; a < n / bt; a++)
            fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
        if (fso_trainer_step(tr, in, tg, NULL, &st) < 0)
            fail_msg("%s: step %d: %s", what, s, tr->err);
        if (st.gather_bytes != want.gather_bytes || st.reduce_bytes != want.reduce_bytes)
            fail_msg("%s: step %d: gathered %llu, reduced %llu; the footprint says %llu, %llu",
                     what, s, (unsigned long long)st.gather_bytes,
                     (unsigned long long)st.reduce_bytes, (unsigned long long)want.gather_bytes,
                     (unsigned long long)want.reduce_bytes);
        if (s == 1 && cfg->optimizer_overlap == FSO_OVERLAP_FORWARD)
            continue;
        for (int k = 0; k < FSO_N_KINDS; k++)
            if (st.nvme_kind_read[k] != want.nvme_read[k] ||
                st.nvme_kind_write[k] != want.nvme_write[k])
                fail_msg("%s: step %d: %s: NVMe read %llu, written %llu; the footprint says "
                         "%llu, %llu", what, s, fso_kind_name(k),
                         (unsigned long long)st.nvme_kind_read[k],
                         (unsigned long long)st.nvme_kind_write[k],
                         (unsigned long long)want.nvme_read[k],
                         (unsigned long long)want.nvme_write[k]);
    }
    free(in);
    free(tg);
    fso_data_free(&data);
}

/* One job's trainer: what it allocates and what a step moves are the
 * footprint's. */
static void check_job(const job *j)
{
    fso_config cfg;
    fso_trainer tr;
    char what[320];
    config_for(&cfg, j);
    describe(j, what, sizeof what);
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("%s: %s", what, tr.err);
    check_allocation(j, &cfg, &tr);
    check_traffic(j, &cfg, &tr);
    fso_trainer_free(&tr);
}

static void run_matrix(int world)
{
    static const char *const backends[] = {"cpu", "cpu-async"};
    for (size_t b = 0; b < 2; b++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int o = FSO_OVERLAP_NONE; o <= FSO_OVERLAP_BACKWARD; o++)
                for (size_t p = 0; p < N_PLACEMENTS; p++) {
                    job j = {.world = world, .backend = backends[b], .bf16 = bf16,
                             .overlap = (fso_overlap)o, .tier = placements[p]};
                    check_job(&j);
                }
}

static void test_one_device_allocates_and_moves_what_the_footprint_says(void **state)
{
    (void)state;
    run_matrix(1);
}

static void test_two_devices_allocate_and_move_what_the_footprint_says(void **state)
{
    (void)state;
    run_matrix(2);
}

static void test_four_devices_allocate_and_move_what_the_footprint_says(void **state)
{
    (void)state;
    run_matrix(4);
}

/* Per-block placements (state.h fso_block_rule): some blocks' parameters
 * resident on the devices and the others streamed, some blocks' optimizer
 * state on the devices and the others' elsewhere. The engine's buffers are
 * the union of what the blocks need (the gather window when any block is
 * gathered, the ring when any block's parameters are on NVMe, landing slots
 * and chunk sets when any block needs them): allocation and traffic are
 * still the footprint's, exactly, on 1, 2 and 4 devices, both backends,
 * fp32 and bf16, every schedule. */
static void test_block_mixes_allocate_and_move_what_the_footprint_says(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
    static const fso_tier tiers[][FSO_N_KINDS] = {
        {N, H, H, H, N}, {H, N, N, N, H}, {N, N, N, N, N}, {H, H, H, H, H}, {N, D, H, N, D},
    };
#undef D
#undef H
#undef N
    static const struct {
        int resident, device_state;
        bool first;
    } counts[] = {{1, 0, false}, {2, 2, false}, {4, 1, true}, {0, 4, false}, {3, 3, true}};
    static const char *const backends[] = {"cpu", "cpu-async"};
    for (int world = 1; world <= 4; world *= 2)
        for (size_t b = 0; b < 2; b++)
            for (int o = FSO_OVERLAP_NONE; o <= FSO_OVERLAP_BACKWARD; o++)
                for (size_t i = 0; i < sizeof tiers / sizeof tiers[0]; i++) {
                    job j = {.world = world, .backend = backends[b], .bf16 = (i + (size_t)o) % 2,
                             .overlap = (fso_overlap)o, .tier = tiers[i],
                             .resident = counts[i].resident,
                             .device_state = counts[i].device_state,
                             .state_first = counts[i].first};
                    check_job(&j);
                }
}

/* Qwen2's q/k/v biases are parameters of the layer blocks like every other
 * tensor: counted, sharded and moved as the footprint says, on every
 * placement (two devices; fp32 on cpu, bf16 on cpu-async). */
static void test_qwen2_biases_allocate_and_move_what_the_footprint_says(void **state)
{
    (void)state;
    for (size_t p = 0; p < N_PLACEMENTS; p++)
        for (int b = 0; b < 2; b++) {
            job j = {.world = 2, .backend = b ? "cpu-async" : "cpu", .bf16 = b == 1,
                     .overlap = p % 2 ? FSO_OVERLAP_BACKWARD : FSO_OVERLAP_FORWARD,
                     .tier = placements[p], .qwen2 = true};
            fso_config cfg;
            fso_trainer tr;
            char what[256];
            config_for(&cfg, &j);
            describe(&j, what, sizeof what);
            if (fso_trainer_init(&tr, &cfg) < 0)
                fail_msg("%s: %s", what, tr.err);
            const fso_model *m = fso_zero_model(tr.zero);
            assert_int_equal(m->blocks[1].n_tensors, 12);
            check_allocation(&j, &cfg, &tr);
            check_traffic(&j, &cfg, &tr);
            fso_trainer_free(&tr);
        }
}

/* Whole-block copies (train.whole_block_copies) allocate what gathers do
 * and move what the footprint says: on cpu-async devices no streamed block
 * gathered and every device reading every device's parameter shards from
 * NVMe; on CPU devices, where they are a no-op, what gathers move (2 and 4
 * devices, every placement, bf16 with the backward schedule). */
static void test_whole_block_copies_allocate_and_move_what_the_footprint_says(void **state)
{
    (void)state;
    for (int world = 2; world <= 4; world += 2)
        for (size_t p = 0; p < N_PLACEMENTS; p++)
            for (int b = 0; b < 2; b++) {
                job j = {.world = world, .backend = b ? "cpu-async" : "cpu", .bf16 = p % 2,
                         .overlap = p % 2 ? FSO_OVERLAP_BACKWARD : FSO_OVERLAP_FORWARD,
                         .tier = placements[p], .whole_copy = true};
                fso_config cfg;
                config_for(&cfg, &j);
                fso_fp_rules r;
                fso_zero_fp_rules(&cfg, &r);
                assert_int_equal(fso_fp_copies_whole(&r, j.tier[FSO_KIND_PARAM]),
                                 b == 1 && j.tier[FSO_KIND_PARAM] != FSO_TIER_DEVICE);
                check_job(&j);
            }
}

/* With checkpoint.dir the saver's buffers (host memory outside the arena,
 * while a save runs) are in the trainer's budget and the planner's host
 * need alike, and the arena holds what it holds without them. */
static void test_the_checkpoint_savers_buffers_are_budgeted(void **state)
{
    (void)state;
    static const fso_tier tiers[FSO_N_KINDS] = {FSO_TIER_HOST, FSO_TIER_HOST, FSO_TIER_HOST,
                                                FSO_TIER_HOST, FSO_TIER_HOST};
    job j = {.world = 2, .backend = "cpu", .overlap = FSO_OVERLAP_FORWARD, .tier = tiers};
    fso_config cfg;
    fso_trainer tr;
    static fso_plan p;
    uint64_t reserve, dev[FSO_MAX_DEVICES], have[FSO_N_TIERS];
    config_for(&cfg, &j);
    fso_zero_need without;
    fso_zero_need_for(&cfg, &without);
    snprintf(cfg.checkpoint.dir, sizeof cfg.checkpoint.dir, "%s/ckpt", nvme_dir);
    fso_zero_need with;
    fso_zero_need_for(&cfg, &with);
    const uint64_t saver = (uint64_t)FSO_ZERO_SAVE_STAGES * FSO_ZERO_SAVE_PIECE_BYTES;
    assert_int_equal(with.saver, saver);
    assert_int_equal(with.tier[FSO_TIER_HOST], without.tier[FSO_TIER_HOST] + saver);
    assert_int_equal(fso_zero_saver_bytes(&cfg), saver);
    predict(&cfg, &j, &p, &reserve);
    assert_int_equal(p.need_bytes[FSO_TIER_HOST], with.tier[FSO_TIER_HOST]);
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("%s", tr.err);
    fso_zero_allocated(tr.zero, dev, have);
    assert_int_equal(have[FSO_TIER_HOST], with.tier[FSO_TIER_HOST] - saver);
    fso_trainer_free(&tr);
    /* a host that holds the arena but not the saver's buffers too: refused, saying why */
    char err[512];
    fso_zero *z = NULL;
    cfg.host_mem_bytes = with.tier[FSO_TIER_HOST] - saver / 2;
    assert_int_equal(fso_zero_create(&z, &cfg, err, sizeof err), -ENOMEM);
    assert_non_null(strstr(err, "the checkpoint saver's 64.0 MiB included"));
}

/* A library caller asking for more devices than fsoff drives is refused
 * with a message, before any per-device table is written. */
static void test_more_devices_than_fsoff_drives_are_refused(void **state)
{
    (void)state;
    fso_config cfg;
    fso_zero *z = NULL;
    char err[512] = "";
    fso_test_small_model(&cfg, 1, 4);
    cfg.world = FSO_MAX_DEVICES + 1;
    cfg.micro_batch = 1;
    assert_int_equal(fso_zero_create(&z, &cfg, err, sizeof err), -EINVAL);
    assert_null(z);
    assert_non_null(strstr(err, "at most 64 devices"));
}

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(nvme_dir, sizeof nvme_dir, "fsoff-footprint");
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(nvme_dir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_more_devices_than_fsoff_drives_are_refused),
        cmocka_unit_test(test_qwen2_biases_allocate_and_move_what_the_footprint_says),
        cmocka_unit_test(test_the_checkpoint_savers_buffers_are_budgeted),
        cmocka_unit_test(test_one_device_allocates_and_moves_what_the_footprint_says),
        cmocka_unit_test(test_two_devices_allocate_and_move_what_the_footprint_says),
        cmocka_unit_test(test_four_devices_allocate_and_move_what_the_footprint_says),
        cmocka_unit_test(test_block_mixes_allocate_and_move_what_the_footprint_says),
        cmocka_unit_test(test_whole_block_copies_allocate_and_move_what_the_footprint_says),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
