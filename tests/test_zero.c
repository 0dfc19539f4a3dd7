/* test_zero.c — ZeRO-3 sharding over virtual devices and the three tiers
 * (test_zero_faults.c: faults, folders and re-plans while training).
 *
 *  - the same run with state on the device, in host memory and on NVMe
 *    gives bit-identical losses, norms and parameters (1 and 2 devices),
 *    each kind on one tier or the kinds on tiers of their own;
 *  - 1, 2 and 4 devices with the same global batch agree within 1e-5
 *    (the sums run in a different order); so do 1 and 2 devices on masked,
 *    packed data, and a step with no counted target is refused;
 *  - budgets fail before training, naming the tier and the shortfall;
 *  - a model whose training state is several times the device cap and
 *    larger than the host arena trains from NVMe within the cap;
 *  - bf16 working parameters (bf16.enabled): bit-identical across tiers and
 *    schedules, close to the fp32 run, always bf16 of the master, and half
 *    the parameter bytes on NVMe;
 *  - bf16 working gradients (train.gradient_dtype): close to fp32 ones
 *    within a bound from bf16's roundoff, deterministic, the CPU's bits on
 *    a GPU's rules, their send buffers in the footprint;
 *  - the planner's memory per tier is what the engine allocates;
 *  - per-block placements (resident parameter blocks streamed from the
 *    host or NVMe, some blocks' optimizer state on the devices and updated
 *    there, the rest on the CPU) give the bits of everything on the device
 *    on 1, 2 and 4 devices and under a GPU's rules, also when a re-plan
 *    changes the counts between steps; the footprint of each is what the
 *    engine allocates, and impossible counts are refused by name;
 *  - a step's NVMe bytes per kind are the derivation in docs/offload.md;
 *  - whole-block copies (train.whole_block_copies) give the gathers' bits
 *    on 2 and 4 devices under a GPU's rules, and gather nothing streamed.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "cpu_async.h"
#include "cuda/cuda_backend.h"
#include "data.h"
#include "plan.h"
#include "report.h"
#include "test_util.h"
#include "train.h"
#include "util.h"
#include "zero/zero.h"

#define STEPS FSO_TEST_STEPS

static char nvme_dir[512];

static void tiers_for_world(int world, bool bf16)
{
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_DEVICE, FSO_TIER_HOST},
        {FSO_TIER_HOST, FSO_TIER_HOST},     {FSO_TIER_NVME, FSO_TIER_HOST},
        {FSO_TIER_DEVICE, FSO_TIER_NVME},   {FSO_TIER_NVME, FSO_TIER_NVME},
    };
    run_result base, r;
    fso_config cfg;
    fso_test_small_model(&cfg, world, 4);
    cfg.bf16 = bf16;
    fso_test_set_tiers(&cfg, tiers[0][0], tiers[0][1], nvme_dir);
    run(&cfg, NULL, &base);
    if (base.rc)
        fail_msg("all on device: %s", base.err);
    for (size_t t = 1; t < sizeof tiers / sizeof tiers[0]; t++) {
        char what[96];
        fso_test_set_tiers(&cfg, tiers[t][0], tiers[t][1], nvme_dir);
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("tiers %d/%d: %s", tiers[t][0], tiers[t][1], r.err);
        snprintf(what, sizeof what, "%d devices, %s parameters on tier %d, optimizer on tier %d",
                 world, bf16 ? "bf16" : "fp32", tiers[t][0], tiers[t][1]);
        assert_bit_identical(&base, &r, 1, what);
        if (tiers[t][0] == FSO_TIER_NVME || tiers[t][1] == FSO_TIER_NVME)
            assert_true(r.nvme_read > 0);
        result_free(&r);
    }
    result_free(&base);
}

static void test_tiers_are_bit_identical_one_device(void **s) { (void)s; tiers_for_world(1, false); }
static void test_tiers_are_bit_identical_two_devices(void **s) { (void)s; tiers_for_world(2, false); }
static void test_bf16_tiers_are_bit_identical_one_device(void **s)
{
    (void)s;
    tiers_for_world(1, true);
}
static void test_bf16_tiers_are_bit_identical_two_devices(void **s)
{
    (void)s;
    tiers_for_world(2, true);
}

/* Each kind of state on a tier of its own (the planner's per-kind
 * placements: gradients in host memory with m and v on NVMe, the master
 * on the device with the rest elsewhere, ...) gives the bits of everything
 * on the device, on the CPU backend and under a discrete GPU's rules
 * (cpu-async, where the CPU updates state that lives on the device through
 * copies unless all of it is there), with 1 and 2 devices. */
static void test_per_kind_tiers_are_bit_identical(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
    static const fso_tier split[][FSO_N_KINDS] = {
        /* parameters, master, m, v, gradients */
        {N, H, N, N, H}, {H, N, N, N, H}, {D, D, H, N, D}, {D, N, H, H, N}, {N, D, D, D, H},
    };
    const char *const backends[] = {"cpu", fso_test_gpu_rules()};
    for (int world = 1; world <= 2; world++)
        for (int be = 0; be < 2; be++) {
            run_result base, r;
            fso_config cfg;
            fso_test_small_model(&cfg, world, 4);
            cfg.backend = fso_backend_find(backends[be])->kind;
            fso_test_set_tiers(&cfg, D, D, nvme_dir);
            run(&cfg, NULL, &base);
            if (base.rc)
                fail_msg("all on device: %s", base.err);
            for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) {
                char what[160];
                fso_test_set_kind_tiers(&cfg, split[i], nvme_dir);
                snprintf(what, sizeof what, "%d devices, %s, kinds on tiers %d %d %d %d %d", world,
                         backends[be], split[i][0], split[i][1], split[i][2], split[i][3],
                         split[i][4]);
                run(&cfg, NULL, &r);
                if (r.rc)
                    fail_msg("%s: %s", what, r.err);
                assert_bit_identical(&base, &r, 1, what);
                assert_true(r.nvme_read > 0);
                result_free(&r);
            }
            result_free(&base);
        }
#undef D
#undef H
#undef N
}

/* The first blocks' optimizer state on the host while the rest of it is
 * on NVMe (the planner's use of the host memory left): the bits of
 * everything on the device, on 1 and 2 devices, on the CPU backend and
 * under a discrete GPU's rules (cpu-async), with the state on NVMe
 * whole and in part, and the serialized and forward schedules; a count
 * that leaves no block on NVMe is refused by name. */
static void test_first_blocks_state_on_the_host_is_bit_identical(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
    static const struct {
        fso_tier t[FSO_N_KINDS];
        int host_blocks;
        fso_overlap overlap;
    } cases[] = {
        {{N, N, N, N, H}, 1, FSO_OVERLAP_FORWARD},
        {{D, N, N, N, N}, 2, FSO_OVERLAP_FORWARD},
        {{D, H, N, N, H}, 3, FSO_OVERLAP_NONE},
        {{N, D, N, H, H}, 1, FSO_OVERLAP_FORWARD},
    };
    const char *const backends[] = {"cpu", fso_test_gpu_rules()};
    for (int world = 1; world <= 2; world++)
        for (int be = 0; be < 2; be++) {
            run_result base, r;
            fso_config cfg;
            fso_test_small_model(&cfg, world, 4);
            cfg.backend = fso_backend_find(backends[be])->kind;
            fso_test_set_tiers(&cfg, D, D, nvme_dir);
            run(&cfg, NULL, &base);
            if (base.rc)
                fail_msg("all on device: %s", base.err);
            const int nb = fso_model_n_blocks(&cfg.model);
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                char what[160];
                fso_test_set_kind_tiers(&cfg, cases[i].t, nvme_dir);
                cfg.offload.state_host_blocks = cases[i].host_blocks;
                cfg.optimizer_overlap = cases[i].overlap;
                assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_M, 0, nb), H);
                assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_M, nb - 1, nb), N);
                snprintf(what, sizeof what, "%d devices, %s, case %zu, %d blocks' state on host",
                         world, backends[be], i, cases[i].host_blocks);
                run(&cfg, NULL, &r);
                if (r.rc)
                    fail_msg("%s: %s", what, r.err);
                assert_bit_identical(&base, &r, 1, what);
                result_free(&r);
            }
            cfg.offload.state_host_blocks = nb;
            run(&cfg, NULL, &r);
            if (r.rc != -EINVAL || !strstr(r.err, "state_host_blocks"))
                fail_msg("%d blocks of %d on the host: rc %d, %s", nb, nb, r.rc, r.err);
            result_free(&r);
            result_free(&base);
        }
#undef D
#undef H
#undef N
}

/* What a step moves on NVMe is the derivation in docs/offload.md for its placement,
 * kind by kind, exactly: parameters read at each visit that lends them in
 * every micro-batch and written once, gradients written by every
 * micro-batch and read by all but the first and by AdamW, master, m and v
 * read and written once, each shard in whole 4 KiB pages, all devices.
 * Every step after the first (whose line has no update with the forward
 * schedule) on several placements, schedules, device counts and
 * accumulations; fso_zero_step_traffic says the same. */
static void expected_bytes(const fso_config *cfg, uint64_t *rd, uint64_t *wr)
{
    const int W = cfg->world, G = cfg->grad_accum, nb = fso_model_n_blocks(&cfg->model);
    fso_block_layout bl[8];
    fso_block_visit v[32];
    int lent[8] = {0};
    assert_true(nb <= 8 && fso_model_max_visits(&cfg->model) <= 32);
    fso_model_layout(bl, &cfg->model, W);
    for (int i = 0, n = fso_model_visits(&cfg->model, v); i < n; i++)
        lent[v[i].block] += v[i].params;
    memset(rd, 0, sizeof(uint64_t) * FSO_N_KINDS);
    memset(wr, 0, sizeof(uint64_t) * FSO_N_KINDS);
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < FSO_N_KINDS; k++) {
            if (fso_offload_block_tier(&cfg->offload, (fso_kind)k, b, nb) != FSO_TIER_NVME)
                continue;
            uint64_t bytes = (k == FSO_KIND_PARAM && cfg->bf16 ? 2u : 4u) * bl[b].padded_elems / W;
            uint64_t pages = (bytes + 4095) / 4096 * 4096 * (uint64_t)W;
            int reads = k == FSO_KIND_PARAM ? lent[b] * G : k == FSO_KIND_GRAD ? G : 1;
            int writes = k == FSO_KIND_GRAD ? G : 1;
            rd[k] += pages * (uint64_t)reads;
            wr[k] += pages * (uint64_t)writes;
        }
}

static void test_step_nvme_bytes_are_the_derivation(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
    static const struct {
        fso_tier t[FSO_N_KINDS];
        int world, accum;
        bool bf16;
        fso_overlap overlap;
        int host_blocks;
    } cases[] = {
        {{N, N, N, N, N}, 1, 2, false, FSO_OVERLAP_FORWARD, 0},
        {{N, N, N, N, N}, 2, 1, true, FSO_OVERLAP_NONE, 0},
        {{N, H, N, N, H}, 2, 1, true, FSO_OVERLAP_FORWARD, 0},
        {{H, N, N, N, H}, 2, 2, false, FSO_OVERLAP_BACKWARD, 0},
        {{D, D, D, D, N}, 1, 2, false, FSO_OVERLAP_FORWARD, 0},
        {{N, D, D, D, D}, 1, 1, true, FSO_OVERLAP_FORWARD, 0},
        {{N, H, N, N, H}, 2, 1, true, FSO_OVERLAP_FORWARD, 1}, /* block 0's m, v on the host */
        {{H, N, N, N, N}, 1, 2, false, FSO_OVERLAP_NONE, 2},
    };
#undef D
#undef H
#undef N
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fso_config cfg;
        fso_data data = {0};
        fso_trainer tr;
        fso_test_small_model(&cfg, cases[c].world, 4);
        fso_test_set_kind_tiers(&cfg, cases[c].t, nvme_dir);
        cfg.offload.state_host_blocks = cases[c].host_blocks;
        cfg.grad_accum = cases[c].accum;
        cfg.bf16 = cases[c].bf16;
        cfg.optimizer_overlap = cases[c].overlap;
        cfg.grad_clip = cases[c].overlap == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
        uint64_t rd[FSO_N_KINDS], wr[FSO_N_KINDS];
        expected_bytes(&cfg, rd, wr);
        fso_fp_traffic lib;
        assert_int_equal(fso_zero_step_traffic(&cfg, &lib), 0);
        assert_memory_equal(rd, lib.nvme_read, sizeof rd);
        assert_memory_equal(wr, lib.nvme_write, sizeof wr);
        assert_int_equal(fso_data_init(&data, &cfg), 0);
        if (fso_trainer_init(&tr, &cfg) < 0)
            fail_msg("case %zu: %s", c, tr.err);
        size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len, n = fso_trainer_step_tokens(&cfg);
        int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
        for (int s = 1; s <= 4; s++) {
            fso_zero_step st;
            for (size_t a = 0; a < n / bt; a++)
                fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
            if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
                fail_msg("case %zu step %d: %s", c, s, tr.err);
            uint64_t sum_r = 0, sum_w = 0;
            for (int k = 0; k < FSO_N_KINDS; k++) {
                sum_r += st.nvme_kind_read[k];
                sum_w += st.nvme_kind_write[k];
                if (s > 1 && (st.nvme_kind_read[k] != rd[k] || st.nvme_kind_write[k] != wr[k]))
                    fail_msg("case %zu step %d: %s moved %llu/%llu bytes read/written, the "
                             "derivation says %llu/%llu", c, s, fso_kind_name(k),
                             (unsigned long long)st.nvme_kind_read[k],
                             (unsigned long long)st.nvme_kind_write[k],
                             (unsigned long long)rd[k], (unsigned long long)wr[k]);
            }
            assert_int_equal(sum_r, st.nvme_read_bytes);
            assert_int_equal(sum_w, st.nvme_write_bytes);
        }
        free(in);
        free(tg);
        fso_trainer_free(&tr);
        fso_data_free(&data);
    }
}

/* The overlapped optimizer schedules give the serialized schedule's bits. */
static void schedules_for(int world, fso_tier param, fso_tier optim, double clip, bool bf16)
{
    run_result base, r;
    fso_config cfg;
    fso_test_small_model(&cfg, world, 4);
    cfg.bf16 = bf16;
    fso_test_set_tiers(&cfg, param, optim, nvme_dir);
    cfg.grad_clip = clip;
    cfg.optimizer_overlap = FSO_OVERLAP_NONE;
    run(&cfg, NULL, &base);
    if (base.rc)
        fail_msg("serialized: %s", base.err);
    for (int mode = FSO_OVERLAP_FORWARD; mode <= FSO_OVERLAP_BACKWARD; mode++) {
        if (mode == FSO_OVERLAP_BACKWARD && clip != 0)
            continue;
        char what[128];
        cfg.optimizer_overlap = (fso_overlap)mode;
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("schedule %d: %s", mode, r.err);
        snprintf(what, sizeof what,
                 "%d devices, tiers %d/%d, clip %g, %s: schedule %d vs serialized", world, param,
                 optim, clip, bf16 ? "bf16" : "fp32", mode);
        assert_bit_identical(&base, &r, 1, what);
        result_free(&r);
    }
    result_free(&base);
}

static void test_overlapped_schedules_match_serialized(void **state)
{
    (void)state;
    schedules_for(1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 1.0, false);
    schedules_for(1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 0.0, false);
    schedules_for(2, FSO_TIER_HOST, FSO_TIER_HOST, 0.0, false);
    /* CPU devices lend a block from the buffer their shards share: each
     * waits for the others' updates of it, on every schedule */
    schedules_for(2, FSO_TIER_DEVICE, FSO_TIER_HOST, 0.0, false);
    schedules_for(2, FSO_TIER_DEVICE, FSO_TIER_NVME, 1.0, true);
    schedules_for(2, FSO_TIER_NVME, FSO_TIER_NVME, 1.0, false);
    schedules_for(2, FSO_TIER_NVME, FSO_TIER_NVME, 0.0, false);
    schedules_for(1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 0.0, true);
    schedules_for(2, FSO_TIER_NVME, FSO_TIER_NVME, 1.0, true);
    schedules_for(2, FSO_TIER_NVME, FSO_TIER_NVME, 0.0, true);
}

/* The engine's GPU paths (staging copies, marks, AdamW on the device,
 * norms and losses that arrive late) on "cpu-async", a CPU device with a
 * discrete GPU's rules (kernels/cpu_async.h), give the "cpu" backend's
 * bits at every placement and schedule: the host never touches device
 * memory, never reads a copy's destination or refills its source before
 * waiting for it, and never reads a norm or loss before it is delivered. */
static void gpu_rules_for(int world, bool bf16, bool every_schedule)
{
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_DEVICE, FSO_TIER_HOST},
        {FSO_TIER_HOST, FSO_TIER_HOST},     {FSO_TIER_NVME, FSO_TIER_HOST},
        {FSO_TIER_DEVICE, FSO_TIER_NVME},   {FSO_TIER_NVME, FSO_TIER_NVME},
        {FSO_TIER_HOST, FSO_TIER_DEVICE},   {FSO_TIER_NVME, FSO_TIER_DEVICE},
    };
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++)
        for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_BACKWARD; mode++) {
            if (!every_schedule && mode != (int)(t % 3)) /* each schedule on some tiers */
                continue;
            run_result base, r;
            fso_config cfg;
            fso_test_small_model(&cfg, world, 4);
            cfg.bf16 = bf16;
            cfg.grad_clip = mode == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
            cfg.optimizer_overlap = (fso_overlap)mode;
            fso_test_set_tiers(&cfg, tiers[t][0], tiers[t][1], nvme_dir);
            char what[160];
            snprintf(what, sizeof what,
                     "%d devices, %s, parameters on tier %d, optimizer on tier %d, schedule %d",
                     world, bf16 ? "bf16" : "fp32", tiers[t][0], tiers[t][1], mode);
            run(&cfg, NULL, &base);
            if (base.rc)
                fail_msg("%s, cpu: %s", what, base.err);
            cfg.backend = fso_backend_find(fso_test_gpu_rules())->kind;
            run(&cfg, NULL, &r);
            if (r.rc)
                fail_msg("%s, %s: %s", what, fso_test_gpu_rules(), r.err);
            assert_gpu_rules_match(&base, &r, 1, bf16, what);
            result_free(&r);
            result_free(&base);
        }
}

static void test_gpu_paths_give_cpu_bits_one_device(void **s)
{
    (void)s;
    gpu_rules_for(1, false, true);
}
static void test_gpu_paths_give_cpu_bits_two_devices(void **s)
{
    (void)s;
    gpu_rules_for(2, false, false);
}
static void test_gpu_paths_give_cpu_bits_bf16(void **s)
{
    (void)s;
    gpu_rules_for(1, true, false);
    gpu_rules_for(2, true, false);
}

/* Compute is not ordered after the copies down and the reduce-scatters
 * queued before it (backend.h order_after), and cpu-async runs it ahead of
 * them. A block's gradients copied down (host tier) or added to the
 * device's shard at the second micro-batch (device tier), with one and two
 * devices, still give the CPU's bits: the engine orders compute that
 * writes a gradient buffer a copy or reduce-scatter reads, or reads what
 * a reduce-scatter wrote, after a mark. Without one of those order_after
 * calls (zero_source.c src_grads, src_grads_done) the bits differ. */
static void test_compute_ahead_of_copies_down_keeps_cpu_bits(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
    static const fso_tier split[][FSO_N_KINDS] = {
        /* parameters, master, m, v, gradients */
        {D, D, D, D, H}, {D, D, D, D, D}, {H, H, H, H, H},
    };
    for (int world = 1; world <= 2; world++)
        for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) {
            run_result base, r;
            fso_config cfg;
            char what[96];
            fso_test_small_model(&cfg, world, 4);
            fso_test_set_kind_tiers(&cfg, split[i], nvme_dir);
            snprintf(what, sizeof what, "%d devices, gradients on tier %d, parameters on %d",
                     world, split[i][FSO_KIND_GRAD], split[i][FSO_KIND_PARAM]);
            run(&cfg, NULL, &base);
            if (base.rc)
                fail_msg("%s, cpu: %s", what, base.err);
            cfg.backend = FSO_BACKEND_CPU_ASYNC;
            run(&cfg, NULL, &r);
            if (r.rc)
                fail_msg("%s, cpu-async: %s", what, r.err);
            assert_bit_identical(&base, &r, 1, what);
            /* copied down: the next block's compute runs ahead of the copy
             * (on the device tier the copy up of the reduced shard orders
             * what follows) */
            if (split[i][FSO_KIND_GRAD] == H && r.dev.ahead == 0)
                fail_msg("%s: no compute ran ahead of a copy down", what);
            result_free(&r);
            result_free(&base);
        }
#undef D
#undef H
}

/* A step synchronises with its device once, at its end (gradient norms,
 * losses, failures): not per micro-batch, not per block on the backward
 * schedule, not per chunk when the CPU updates parameters that live on the
 * device; and it allocates no device memory. Counted on cpu-async, over
 * every placement and schedule. */
static void test_a_step_syncs_once_and_allocates_nothing(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_DEVICE, FSO_TIER_HOST},
        {FSO_TIER_HOST, FSO_TIER_HOST},     {FSO_TIER_NVME, FSO_TIER_NVME},
        {FSO_TIER_HOST, FSO_TIER_DEVICE},   {FSO_TIER_NVME, FSO_TIER_HOST},
    };
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++)
        for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_BACKWARD; mode++) {
            fso_config cfg;
            run_result r;
            fso_test_small_model(&cfg, 1, 4);
            cfg.grad_accum = 4;
            cfg.backend = FSO_BACKEND_CPU_ASYNC;
            fso_test_set_tiers(&cfg, tiers[t][0], tiers[t][1], nvme_dir);
            cfg.optimizer_overlap = (fso_overlap)mode;
            cfg.grad_clip = mode == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
            run(&cfg, NULL, &r);
            if (r.rc)
                fail_msg("%s", r.err);
            print_message("# tiers %d/%d, schedule %d: %llu syncs, %llu drains, %llu device "
                          "allocations in %d steps\n",
                          tiers[t][0], tiers[t][1], mode, (unsigned long long)r.dev.syncs,
                          (unsigned long long)r.dev.drains, (unsigned long long)r.dev.allocs,
                          STEPS);
            if (r.dev.syncs != STEPS || r.dev.allocs != 0)
                fail_msg("tiers %d/%d, schedule %d: %llu syncs and %llu device allocations in %d "
                         "steps",
                         tiers[t][0], tiers[t][1], mode, (unsigned long long)r.dev.syncs,
                         (unsigned long long)r.dev.allocs, STEPS);
            result_free(&r);
        }
}

/* The optimizer's chunk copies to and from device-tier state share marks
 * (zr_marks_defer): with every kind but v on the device the CPU updates,
 * copying four kinds up and four down per chunk, each of which took a
 * copies-only mark before (24 a step on the serialized schedule here); now
 * one wait takes one mark for every copy queued before it (3 to 8 a step
 * here, fewer than 8 a block), and none goes stale. Counted on cpu-async,
 * copies-only marks alone (the engine's full marks order compute and
 * gathers, backend.h order_after). */
static void test_optimizer_chunk_copies_share_marks(void **state)
{
    (void)state;
    static const fso_tier tiers[FSO_N_KINDS] = {
        [FSO_KIND_PARAM] = FSO_TIER_DEVICE, [FSO_KIND_MASTER] = FSO_TIER_DEVICE,
        [FSO_KIND_M] = FSO_TIER_DEVICE,     [FSO_KIND_V] = FSO_TIER_HOST,
        [FSO_KIND_GRAD] = FSO_TIER_DEVICE,
    };
    for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_BACKWARD; mode++) {
        fso_config cfg;
        run_result r;
        fso_test_small_model(&cfg, 1, 4);
        cfg.backend = FSO_BACKEND_CPU_ASYNC;
        fso_test_set_kind_tiers(&cfg, tiers, nvme_dir);
        cfg.optimizer_overlap = (fso_overlap)mode;
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("%s", r.err);
        const uint64_t per_step = r.dev.copy_marks / STEPS,
                       most = 8 * (uint64_t)cfg.model.num_hidden_layers;
        print_message("# schedule %d: %llu copies-only marks a step (at most %llu), %llu "
                      "stale\n",
                      mode, (unsigned long long)per_step, (unsigned long long)most,
                      (unsigned long long)r.dev.stale_marks);
        if (per_step > most || r.dev.stale_marks != 0)
            fail_msg("schedule %d: %llu copies-only marks a step (at most %llu), %llu stale",
                     mode, (unsigned long long)per_step, (unsigned long long)most,
                     (unsigned long long)r.dev.stale_marks);
        result_free(&r);
    }
}

/* Gradients that are not finite stop the run with a clear error on every
 * schedule, whether the norm is taken on the host or arrives late from the
 * device (the backward schedule checks each block before updating it). */
static void test_non_finite_gradients_stop_every_schedule(void **state)
{
    (void)state;
    const char *const backends[] = {"cpu", fso_test_gpu_rules()};
    for (int be = 0; be < 2; be++)
        for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_BACKWARD; mode++)
            for (int grads_on_device = 0; grads_on_device < 2; grads_on_device++) {
                fso_config cfg;
                run_result r;
                fso_test_small_model(&cfg, 1, 4);
                cfg.backend = fso_backend_find(backends[be])->kind;
                fso_test_set_tiers(&cfg, FSO_TIER_DEVICE,
                          grads_on_device ? FSO_TIER_DEVICE : FSO_TIER_HOST, nvme_dir);
                cfg.optimizer_overlap = (fso_overlap)mode;
                cfg.grad_clip = 0;
                cfg.sched.type = FSO_SCHED_CONSTANT;
                cfg.optim.lr = 1e30; /* the first update throws the weights to ~1e30 */
                run(&cfg, NULL, &r);
                const char *says = mode == FSO_OVERLAP_BACKWARD ? "gradients are not finite"
                                                                : "update was not applied";
                if (r.rc != -ERANGE || !strstr(r.err, "diverged") || !strstr(r.err, says))
                    fail_msg("%s, schedule %d, optimizer state on tier %d: rc %d, \"%s\"",
                             backends[be], mode, cfg.offload.optim_tier, r.rc, r.err);
                result_free(&r);
            }
}

/* Optimizer state streamed from NVMe in chunks smaller than a shard gives
 * the in-memory bits. */
static void test_nvme_streaming_in_chunks_matches_memory(void **state)
{
    (void)state;
    run_result mem, nv;
    fso_config cfg;
    fso_test_small_model(&cfg, 1, 4);
    fso_test_set_tiers(&cfg, FSO_TIER_DEVICE, FSO_TIER_HOST, nvme_dir);
    run(&cfg, NULL, &mem);
    fso_test_set_tiers(&cfg, FSO_TIER_DEVICE, FSO_TIER_NVME, nvme_dir);
    cfg.offload.aio_block_bytes = 8192; /* shards of this model span many chunks */
    run(&cfg, NULL, &nv);
    if (nv.rc)
        fail_msg("%s", nv.err);
    assert_bit_identical(&mem, &nv, 1, "NVMe in 8 KiB chunks vs host memory");
    result_free(&mem);
    result_free(&nv);
}

static void test_device_counts_agree(void **state)
{
    (void)state;
    run_result r[3];
    int worlds[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        fso_config cfg;
        fso_test_small_model(&cfg, worlds[i], 4);
        run(&cfg, NULL, &r[i]);
        if (r[i].rc)
            fail_msg("%d devices: %s", worlds[i], r[i].err);
    }
    for (int i = 1; i < 3; i++) {
        for (int s = 0; s < STEPS; s++)
            if (fabs(r[i].loss[s] - r[0].loss[s]) > 1e-5 * fabs(r[0].loss[s]) ||
                fabs(r[i].norm[s] - r[0].norm[s]) > 1e-5 * fabs(r[0].norm[s]))
                fail_msg("%d devices, step %d: loss %.9g norm %.9g; 1 device: %.9g %.9g",
                         worlds[i], s + 1, r[i].loss[s], r[i].norm[s], r[0].loss[s],
                         r[0].norm[s]);
        for (size_t p = 0; p < r[0].np; p++)
            if (fabs(r[i].params[p] - r[0].params[p]) > 1e-5 + 1e-4 * fabs(r[0].params[p]))
                fail_msg("%d devices: parameter %zu: %.9g vs %.9g", worlds[i], p,
                         r[i].params[p], r[0].params[p]);
        /* each device holds a smaller share */
        assert_true(r[i].peak_device < r[0].peak_device);
    }
    for (int i = 0; i < 3; i++)
        result_free(&r[i]);
}

/* The validation pass (fso_zero_eval) is the step's forward: before step 1
 * on the step's own micro-batches it gives step 1's loss; it changes no
 * state (a run validated after every step trains the bits of one that is
 * not), a second pass repeats the first's bits, and the device count only
 * reorders the sum. On plain data and on masked, packed data (its loss the
 * mean over the counted targets, its documents kept apart), on every tier
 * of the parameters and both schedules. */
static struct {
    int32_t *in, *tg, *pos;
    int n_micro;
    size_t counted;
    double before, after[FSO_TEST_MAX_STEPS + 1];
} eval_hook;

static double eval_loss(fso_trainer *tr)
{
    double sum = 0, again = 0;
    char err[512];
    if (fso_zero_eval(tr->zero, eval_hook.in, eval_hook.tg, eval_hook.pos, eval_hook.n_micro,
                      &sum, err, sizeof err) < 0 ||
        fso_zero_eval(tr->zero, eval_hook.in, eval_hook.tg, eval_hook.pos, eval_hook.n_micro,
                      &again, err, sizeof err) < 0)
        fail_msg("eval: %s", err);
    if (memcmp(&sum, &again, sizeof sum) != 0)
        fail_msg("a second validation pass gave %.17g, the first %.17g", again, sum);
    return sum / (double)eval_hook.counted;
}

static void eval_started(fso_trainer *tr)
{
    eval_hook.before = eval_loss(tr);
}

static void eval_stepped(fso_trainer *tr, int step)
{
    eval_hook.after[step] = eval_loss(tr);
}

static void write_masked_packed(const char *path);

static void validate_on(const fso_config *cfg, const char *what, double *after_one)
{
    run_result base, r;
    run(cfg, NULL, &base);
    if (base.rc)
        fail_msg("%s: %s", what, base.err);
    /* step 1's micro-batches (an odd count, where a device has a repeat
     * to drop, is cli_test's) */
    fso_data data = {0};
    if (fso_data_init(&data, cfg) < 0)
        fail_msg("data: %s", data.err);
    size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    size_t n = fso_trainer_step_tokens(cfg);
    eval_hook.n_micro = (int)(n / bt);
    eval_hook.in = malloc(sizeof(int32_t) * n);
    eval_hook.tg = malloc(sizeof(int32_t) * n);
    eval_hook.pos = fso_data_documents(&data) ? malloc(sizeof(int32_t) * n) : NULL;
    assert_true(eval_hook.in && eval_hook.tg && (eval_hook.pos || !fso_data_documents(&data)));
    eval_hook.counted = 0;
    for (size_t a = 0; a < n; a += bt)
        eval_hook.counted += fso_data_next(&data, eval_hook.in + a, eval_hook.tg + a,
                                           eval_hook.pos ? eval_hook.pos + a : NULL);
    run_hooks hooks = {.started = eval_started, .stepped = eval_stepped};
    run(cfg, &hooks, &r);
    if (r.rc)
        fail_msg("%s: %s", what, r.err);
    assert_bit_identical(&base, &r, 1, what);
    if (fabs(eval_hook.before - base.loss[0]) > 1e-12 * fabs(base.loss[0]))
        fail_msg("%s: validation before step 1 %.17g, step 1's loss %.17g", what,
                 eval_hook.before, base.loss[0]);
    for (int s = 1; s <= r.steps; s++) {
        if (after_one[s] == 0)
            after_one[s] = eval_hook.after[s];
        else if (fabs(eval_hook.after[s] - after_one[s]) > 1e-5 * after_one[s])
            fail_msg("%s: validation after step %d %.9g, the first configuration's %.9g", what,
                     s, eval_hook.after[s], after_one[s]);
    }
    free(eval_hook.in);
    free(eval_hook.tg);
    free(eval_hook.pos);
    fso_data_free(&data);
    result_free(&base);
    result_free(&r);
}

static void test_validation_pass_is_the_forward_and_changes_nothing(void **state)
{
    (void)state;
    static const fso_tier tiers[] = {FSO_TIER_DEVICE, FSO_TIER_HOST, FSO_TIER_NVME};
    char masked[600];
    snprintf(masked, sizeof masked, "%s/val_masked_packed.bin", nvme_dir);
    write_masked_packed(masked);
    for (int m = 0; m < 2; m++) {
        double after_one[FSO_TEST_MAX_STEPS + 1] = {0};
        for (int world = 1; world <= 2; world++)
            for (size_t t = 0; t < sizeof tiers / sizeof *tiers; t++)
                for (int mode = FSO_OVERLAP_NONE; mode <= FSO_OVERLAP_FORWARD; mode++) {
                    fso_config cfg;
                    fso_test_small_model(&cfg, world, 4);
                    fso_test_set_tiers(&cfg, tiers[t], FSO_TIER_HOST, nvme_dir);
                    cfg.optimizer_overlap = (fso_overlap)mode;
                    if (m)
                        snprintf(cfg.data.path, sizeof cfg.data.path, "%s", masked);
                    char what[128];
                    snprintf(what, sizeof what, "%s data, %d devices, parameters on tier %d, "
                             "schedule %d", m ? "masked, packed" : "plain", world, tiers[t], mode);
                    validate_on(&cfg, what, after_one);
                }
    }
    unlink(masked);
}

/* A flagged token file of the built-in corpus's bytes at path: a third of
 * the targets masked, in runs of 9, and documents of 5 to 40 tokens packed
 * across the windows. */
static void write_masked_packed(const char *path)
{
    enum { N = 6000 };
    char *text = malloc(N);
    int32_t *tok = malloc(sizeof(int32_t) * N);
    uint8_t *f = malloc(N);
    assert_true(text && tok && f);
    fso_corpus_generate(text, N, FSO_CORPUS_SEED);
    for (size_t i = 0, next_doc = 0; i < N; i++) {
        tok[i] = (unsigned char)text[i];
        f[i] = (i / 9) % 3 == 1 ? 0 : FSO_TOKEN_TARGET;
        if (i == next_doc) {
            f[i] |= FSO_TOKEN_DOC_START;
            next_doc += 5 + (i * 7) % 36;
        }
    }
    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    free(text);
    free(tok);
    free(f);
}

/* Masked, packed data trains alike on 1 and 2 devices (within 1e-5: the
 * sums run in another order), with a discrete GPU's rules as on the CPU
 * and with the state in host memory as on the device (the same bits:
 * positions reach the device as the tokens do), and differently from the
 * same file as one stream (the documents count). */
static void test_masked_packed_data_trains_alike_on_one_and_two_devices(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/masked_packed.bin", nvme_dir);
    write_masked_packed(path);
    run_result r[5];
    for (int i = 0; i < 5; i++) {
        fso_config cfg;
        fso_test_small_model(&cfg, i == 0 ? 1 : 2, 4);
        snprintf(cfg.data.path, sizeof cfg.data.path, "%s", path);
        if (i == 2)
            cfg.backend = fso_backend_find(fso_test_gpu_rules())->kind;
        if (i == 3)
            cfg.data.documents = FSO_DATA_DOCS_STREAM;
        if (i == 4)
            fso_test_set_tiers(&cfg, FSO_TIER_HOST, FSO_TIER_HOST, nvme_dir);
        run_ok(&cfg, NULL, &r[i]);
    }
    unlink(path);
    for (int s = 0; s < STEPS; s++) {
        assert_true(isfinite(r[0].loss[s]) && r[0].loss[s] > 0);
        if (fabs(r[1].loss[s] - r[0].loss[s]) > 1e-5 * fabs(r[0].loss[s]) ||
            fabs(r[1].norm[s] - r[0].norm[s]) > 1e-5 * fabs(r[0].norm[s]))
            fail_msg("2 devices, step %d: loss %.9g norm %.9g; 1 device: %.9g %.9g", s + 1,
                     r[1].loss[s], r[1].norm[s], r[0].loss[s], r[0].norm[s]);
        if (fso_test_gpu_is_cuda() /* within tolerance: assert_gpu_rules_match */
                ? !(fabs(r[2].loss[s] - r[1].loss[s]) <= 1e-4 * fabs(r[1].loss[s])) ||
                      !(fabs(r[2].norm[s] - r[1].norm[s]) <= 1e-4 * fabs(r[1].norm[s]))
                : r[2].loss[s] != r[1].loss[s] || r[2].norm[s] != r[1].norm[s])
            fail_msg("step %d: a GPU's rules give loss %.9g norm %.9g, the CPU %.9g %.9g", s + 1,
                     r[2].loss[s], r[2].norm[s], r[1].loss[s], r[1].norm[s]);
        assert_true(r[3].loss[s] != r[1].loss[s]);
        if (r[4].loss[s] != r[1].loss[s] || r[4].norm[s] != r[1].norm[s])
            fail_msg("step %d: state in host memory gives loss %.9g norm %.9g, on the device "
                     "%.9g %.9g", s + 1, r[4].loss[s], r[4].norm[s], r[1].loss[s], r[1].norm[s]);
    }
    if (fso_test_gpu_is_cuda())
        assert_gpu_rules_match(&r[1], &r[2], 1, false, "masked, packed, with a GPU's rules");
    for (size_t p = 0; p < r[0].np; p++) {
        if (fabs(r[1].params[p] - r[0].params[p]) > 1e-5 + 1e-4 * fabs(r[0].params[p]))
            fail_msg("2 devices: parameter %zu: %.9g vs %.9g", p, r[1].params[p], r[0].params[p]);
        if ((r[2].params[p] != r[1].params[p] && !fso_test_gpu_is_cuda()) ||
            r[4].params[p] != r[1].params[p])
            fail_msg("parameter %zu: %.9g with a GPU's rules, %.9g from host memory, %.9g on "
                     "the device", p, r[2].params[p], r[4].params[p], r[1].params[p]);
    }
    for (int i = 0; i < 5; i++)
        result_free(&r[i]);
}

/* A step none of whose targets counts is refused before anything runs
 * (-ENODATA, no update, not counted); the next step runs. */
static void test_a_step_without_counted_targets_is_refused(void **state)
{
    (void)state;
    fso_config cfg;
    fso_test_small_model(&cfg, 2, 4);
    fso_trainer tr;
    assert_int_equal(fso_trainer_init(&tr, &cfg), 0);
    const size_t n = fso_trainer_step_tokens(&cfg);
    int32_t *in = calloc(n, sizeof *in), *tg = malloc(n * sizeof *tg);
    assert_true(in && tg);
    for (size_t i = 0; i < n; i++)
        tg[i] = -1;
    const size_t np = fso_zero_model(tr.zero)->n_params;
    float *before = malloc(np * sizeof(float)), *after = malloc(np * sizeof(float));
    assert_true(before && after);
    char err[512];
    assert_int_equal(fso_zero_store_hf(tr.zero, before, err, sizeof err), 0);
    fso_zero_step st;
    assert_int_equal(fso_trainer_step(&tr, in, tg, NULL, &st), -ENODATA);
    if (!strstr(tr.err, "step 1: none of its") || !strstr(tr.err, "at least one target"))
        fail_msg("the refusal says: %s", tr.err);
    assert_int_equal(fso_zero_steps(tr.zero), 0);
    assert_int_equal(fso_zero_store_hf(tr.zero, after, err, sizeof err), 0);
    assert_memory_equal(before, after, np * sizeof(float));
    tg[n / 2] = 7; /* one target counts: the step runs, its loss that target's */
    assert_int_equal(fso_trainer_step(&tr, in, tg, NULL, &st), 0);
    assert_int_equal(fso_zero_steps(tr.zero), 1);
    assert_true(isfinite(st.loss) && st.loss > 0);
    free(in);
    free(tg);
    free(before);
    free(after);
    fso_trainer_free(&tr);
}

static void test_device_cap_too_small_fails_before_training(void **state)
{
    (void)state;
    fso_config cfg;
    run_result r;
    fso_test_small_model(&cfg, 2, 4);
    cfg.model.hidden_size = 128;
    cfg.model.intermediate_size = 384;
    cfg.model.head_dim = 32;
    cfg.device_mem_bytes = 4u << 20; /* activations fit, the state does not */
    run(&cfg, NULL, &r);
    assert_int_equal(r.rc, -ENOMEM);
    assert_non_null(strstr(r.err, "device memory"));
    assert_non_null(strstr(r.err, "short by"));
    assert_non_null(strstr(r.err, "--nvme"));
    result_free(&r);
}

/* Budgets are arithmetic: a model of a million layers of width 8192, or
 * one whose byte counts overflow 64 bits, is refused before anything is
 * allocated for it (a layout of a million blocks alone would be a GiB),
 * naming what each tier would need. */
static void test_absurd_models_are_refused_before_allocating(void **state)
{
    (void)state;
    static const struct {
        int layers, hidden, ffn, heads, vocab;
        fso_tier param, optim;
        const char *want;
    } cases[] = {
        {1000000, 8192, 28672, 64, 32000, FSO_TIER_DEVICE, FSO_TIER_DEVICE, "TiB"},
        {1000000, 8192, 28672, 64, 32000, FSO_TIER_HOST, FSO_TIER_HOST, "TiB"},
        /* 2^30 wide: every weight matrix alone is 2^62 bytes */
        {4, 1 << 30, 1 << 30, 1 << 20, 1 << 30, FSO_TIER_DEVICE, FSO_TIER_DEVICE,
         "more than 16777216 TiB"},
        {4, 1 << 30, 1 << 30, 1 << 20, 1 << 30, FSO_TIER_HOST, FSO_TIER_NVME,
         "more than 16777216 TiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fso_config cfg;
        fso_zero *z = NULL;
        char err[512] = "";
        fso_test_small_model(&cfg, 1, 1);
        cfg.model.num_hidden_layers = cases[i].layers;
        cfg.model.hidden_size = cases[i].hidden;
        cfg.model.intermediate_size = cases[i].ffn;
        cfg.model.num_attention_heads = cfg.model.num_key_value_heads = cases[i].heads;
        cfg.model.head_dim = cases[i].hidden / cases[i].heads;
        cfg.model.vocab_size = cases[i].vocab;
        fso_test_set_tiers(&cfg, cases[i].param, cases[i].optim, nvme_dir);
        cfg.device_mem_bytes = (uint64_t)1 << 30;
        fso_zero_need need;
        fso_zero_need_for(&cfg, &need);
        const uint64_t rss = fso_peak_rss_bytes();
        assert_int_equal(fso_zero_create(&z, &cfg, err, sizeof err), -ENOMEM);
        assert_null(z);
        if (!strstr(err, cases[i].want) || !strstr(err, "short by"))
            fail_msg("case %zu: %s", i, err);
        if (fso_peak_rss_bytes() > rss + (64u << 20))
            fail_msg("case %zu: peak RSS grew by %llu bytes before the refusal", i,
                     (unsigned long long)(fso_peak_rss_bytes() - rss));
        if (cases[i].hidden == 1 << 30)
            assert_true(need.kind_bytes[FSO_KIND_MASTER] == FSO_BYTES_OVERFLOW &&
                        need.tier[cases[i].optim] == FSO_BYTES_OVERFLOW);
    }
}

/* Training state 20 bytes/param several times the device cap and larger
 * than the host arena: parameters and optimizer state stream from NVMe. */
static void test_large_model_trains_from_nvme_within_cap(void **state)
{
    (void)state;
    fso_config cfg;
    run_result r;
    fso_test_small_model(&cfg, 2, 2);
    cfg.model.hidden_size = 256;
    cfg.model.intermediate_size = 768;
    cfg.model.num_hidden_layers = 6;
    cfg.model.num_attention_heads = 4;
    cfg.model.num_key_value_heads = 2;
    cfg.model.head_dim = 64;
    cfg.data.seq_len = 16;
    cfg.grad_accum = 1;
    cfg.device_mem_bytes = 16u << 20;
    cfg.offload.aio_queue_depth = 8; /* the optimizer's ring: 2 sets of 1 MiB chunks */
    fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_NVME, nvme_dir);
    run(&cfg, NULL, &r);
    if (r.rc)
        fail_msg("%s", r.err);
    uint64_t state_bytes = (uint64_t)r.np * 20;
    fprintf(stderr, "# %zu params, state %.1f MiB, device cap %.1f MiB, peak device %.1f MiB, "
                    "host arena %.1f MiB\n",
            r.np, state_bytes / 1048576.0, cfg.device_mem_bytes / 1048576.0,
            r.peak_device / 1048576.0, r.arena / 1048576.0);
    assert_true(state_bytes > 4 * cfg.device_mem_bytes);
    assert_true(r.peak_device <= cfg.device_mem_bytes);
    assert_true(r.arena < state_bytes);
    for (int s = 0; s < STEPS; s++)
        assert_true(isfinite(r.loss[s]));
    result_free(&r);
}

/* ---- bf16 working parameters */

/* bf16 of the master, widened: what every working parameter must hold. */
static float bf16_of(float master)
{
    uint32_t u;
    memcpy(&u, &master, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u | 0x00400000u) & 0xffff0000u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void assert_working_is_bf16_of_master(const run_result *r, const char *what)
{
    for (size_t i = 0; i < r->np; i++) {
        float want = bf16_of(r->params[i]);
        if (memcmp(&r->working[i], &want, sizeof want))
            fail_msg("%s: working parameter %zu is %a, bf16 of its master %a is %a", what, i,
                     r->working[i], r->params[i], want);
    }
}

/* Streamed from NVMe in chunks smaller than a shard (8 KiB, and 4 KiB, which
 * bf16 parameters round up to 8 KiB so their 2-byte chunks stay 4 KiB
 * aligned in the file): the in-memory bits, and every working parameter is
 * bf16 of its master after each tier's run. */
static void test_bf16_working_parameters_are_bf16_of_master(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE},
        {FSO_TIER_HOST, FSO_TIER_HOST},
        {FSO_TIER_NVME, FSO_TIER_NVME},
    };
    fso_config cfg;
    run_result mem, r;
    fso_test_small_model(&cfg, 2, 4);
    cfg.bf16 = true;
    fso_test_set_tiers(&cfg, FSO_TIER_HOST, FSO_TIER_HOST, nvme_dir);
    run(&cfg, NULL, &mem);
    if (mem.rc)
        fail_msg("%s", mem.err);
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
        fso_test_set_tiers(&cfg, tiers[t][0], tiers[t][1], nvme_dir);
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("tiers %d/%d: %s", tiers[t][0], tiers[t][1], r.err);
        assert_working_is_bf16_of_master(&r, "bf16, 2 devices");
        result_free(&r);
    }
    static const int64_t chunks[] = {8192, 4096};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        char what[96];
        fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_NVME, nvme_dir);
        cfg.offload.aio_block_bytes = chunks[c];
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("%lld-byte chunks: %s", (long long)chunks[c], r.err);
        snprintf(what, sizeof what, "bf16 on NVMe in %lld-byte chunks vs host memory",
                 (long long)chunks[c]);
        assert_bit_identical(&mem, &r, 1, what);
        assert_working_is_bf16_of_master(&r, what);
        result_free(&r);
    }
    result_free(&mem);
}

/* Parameters loaded in HF order (--init-from): the master holds them as
 * given and the working parameters bf16 of them, on every tier. */
static void test_bf16_load_hf_keeps_the_master_exact(void **state)
{
    (void)state;
    static const fso_tier tiers[] = {FSO_TIER_DEVICE, FSO_TIER_HOST, FSO_TIER_NVME};
    for (size_t t = 0; t < sizeof tiers / sizeof *tiers; t++) {
        fso_config cfg;
        fso_trainer tr;
        char err[512];
        fso_test_small_model(&cfg, 2, 4);
        cfg.bf16 = true;
        fso_test_set_tiers(&cfg, tiers[t], tiers[t], nvme_dir);
        if (fso_trainer_init(&tr, &cfg) < 0)
            fail_msg("%s", tr.err);
        run_result r = {.np = fso_zero_model(tr.zero)->n_params};
        float *hf = malloc(sizeof(float) * r.np);
        r.params = malloc(sizeof(float) * r.np);
        r.working = malloc(sizeof(float) * r.np);
        assert_non_null(hf);
        for (size_t i = 0; i < r.np; i++) /* values that bf16 cannot hold exactly */
            hf[i] = (float)(0.02 * sin((double)i) + 1e-7 * (double)(i % 7));
        if (fso_zero_load_hf(tr.zero, hf, err, sizeof err) < 0 ||
            fso_zero_store_hf(tr.zero, r.params, err, sizeof err) < 0 ||
            fso_zero_store_working_hf(tr.zero, r.working, err, sizeof err) < 0)
            fail_msg("tier %d: %s", tiers[t], err);
        assert_memory_equal(r.params, hf, sizeof(float) * r.np);
        assert_working_is_bf16_of_master(&r, "after load_hf");
        free(hf);
        result_free(&r);
        fso_trainer_free(&tr);
    }
}

/* Losses of a bf16 run stay within BF16_LOSS_TOL (relative) of the fp32
 * run's over the first steps and fall; 1 and 2 devices agree within
 * BF16_DEVICES_TOL: the masters differ in the last bits (sums in another
 * order), and a last-bit difference can move a parameter by one bf16 step
 * (2^-8 relative). */
#define BF16_LOSS_TOL 2e-2
#define BF16_DEVICES_TOL 1e-3
static void test_bf16_run_is_close_to_fp32_and_device_counts_agree(void **state)
{
    (void)state;
    fso_config cfg;
    run_result f32, one, two;
    fso_test_small_model(&cfg, 1, 4);
    run(&cfg, NULL, &f32);
    cfg.bf16 = true;
    run(&cfg, NULL, &one);
    fso_test_small_model(&cfg, 2, 4);
    cfg.bf16 = true;
    run(&cfg, NULL, &two);
    if (f32.rc || one.rc || two.rc)
        fail_msg("%s%s%s", f32.err, one.err, two.err);
    for (int s = 0; s < STEPS; s++) {
        fprintf(stderr, "# step %d: loss fp32 %.6f bf16 %.6f (2 devices %.6f)\n", s + 1,
                f32.loss[s], one.loss[s], two.loss[s]);
        if (fabs(one.loss[s] - f32.loss[s]) > BF16_LOSS_TOL * fabs(f32.loss[s]))
            fail_msg("step %d: bf16 loss %.6f, fp32 %.6f", s + 1, one.loss[s], f32.loss[s]);
        if (fabs(two.loss[s] - one.loss[s]) > BF16_DEVICES_TOL * fabs(one.loss[s]) ||
            fabs(two.norm[s] - one.norm[s]) > BF16_DEVICES_TOL * fabs(one.norm[s]))
            fail_msg("bf16, step %d: 2 devices loss %.9g norm %.9g; 1 device %.9g %.9g", s + 1,
                     two.loss[s], two.norm[s], one.loss[s], one.norm[s]);
    }
    assert_true(one.loss[STEPS - 1] < one.loss[0]);
    for (size_t p = 0; p < one.np; p++)
        if (fabs(two.params[p] - one.params[p]) > 1e-4 + BF16_DEVICES_TOL * fabs(one.params[p]))
            fail_msg("bf16: parameter %zu: 2 devices %.9g, 1 device %.9g", p, two.params[p],
                     one.params[p]);
    result_free(&f32);
    result_free(&one);
    result_free(&two);
}

/* The per-block compute times the re-plan uses: every block has some, and
 * together they are the step's compute (less the little spent lending). */
static void test_per_block_compute_times_add_up(void **state)
{
    (void)state;
    fso_config cfg;
    fso_data data = {0};
    fso_trainer tr;
    fso_test_small_model(&cfg, 2, 4);
    assert_int_equal(fso_data_init(&data, &cfg), 0);
    assert_int_equal(fso_trainer_init(&tr, &cfg), 0);
    size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len, n = fso_trainer_step_tokens(&cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    for (size_t a = 0; a < n / bt; a++)
        fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
    fso_zero_step st;
    assert_int_equal(fso_trainer_step(&tr, in, tg, NULL, &st), 0);
    const double *ms = fso_zero_block_compute_ms(tr.zero);
    double sum = 0;
    for (int b = 0; b < cfg.model.num_hidden_layers + 2; b++) {
        assert_true(ms[b] > 0);
        sum += ms[b];
    }
    fprintf(stderr, "# blocks %.3f ms, compute %.3f ms\n", sum, st.compute_ms);
    assert_true(sum <= st.compute_ms * 1.001 + 0.01);
    assert_true(sum >= 0.5 * st.compute_ms);
    free(in);
    free(tg);
    fso_trainer_free(&tr);
    fso_data_free(&data);
}

/* With activation checkpointing, bf16 keeps each layer's input for
 * backward as bf16: half the bytes of what is kept, results within the bf16
 * tolerance of keeping fp32 (checkpointing off keeps every activation in
 * fp32), and not the same bits (the rounding is really there). */
static void test_bf16_keeps_layer_inputs_in_bf16(void **state)
{
    (void)state;
    fso_config cfg;
    run_result kept16, kept32;
    fso_test_small_model(&cfg, 1, 4);
    cfg.bf16 = true;
    fso_trainer tr;
    assert_int_equal(fso_trainer_init(&tr, &cfg), 0);
    const fso_model *m = fso_zero_model(tr.zero);
    assert_true(m->bf16_acts);
    assert_non_null(m->kept16);
    fso_trainer_free(&tr);
    const fso_model_config *mc = &cfg.model;
    const size_t N = (size_t)cfg.micro_batch * cfg.data.seq_len, C = (size_t)mc->hidden_size;
    const size_t L = (size_t)mc->num_hidden_layers;
    size_t b16 = fso_model_activation_bytes_for(mc, cfg.micro_batch, cfg.data.seq_len, true, true);
    size_t b32 = fso_model_activation_bytes_for(mc, cfg.micro_batch, cfg.data.seq_len, true, false);
    /* (L+1) kept inputs at 2 bytes instead of 4, plus two fp32 work buffers;
     * and 2 bytes saved on each element of the [wt] activations: one layer's
     * set (checkpointing), the final norm's output and the backward scratch */
    const size_t F = (size_t)mc->intermediate_size, P = (size_t)cfg.micro_batch *
                                                          mc->num_attention_heads *
                                                          cfg.data.seq_len * cfg.data.seq_len;
    const size_t qd = (size_t)mc->num_attention_heads * mc->head_dim;
    const size_t kvd = (size_t)mc->num_key_value_heads * mc->head_dim;
    const size_t wt_elems = (2 * N * C + 2 * N * qd + 2 * N * kvd + P + 3 * N * F) + N * C +
                            (2 * N * qd + 2 * N * kvd + 3 * N * F);
    assert_int_equal(b32 - b16 + 2 * 4 * N * C, (L + 1) * 2 * N * C + 2 * wt_elems);

    run(&cfg, NULL, &kept16);
    cfg.activation_checkpointing = false;
    run(&cfg, NULL, &kept32);
    if (kept16.rc || kept32.rc)
        fail_msg("%s%s", kept16.err, kept32.err);
    bool differ = false;
    for (int s = 0; s < STEPS; s++) {
        if (fabs(kept16.loss[s] - kept32.loss[s]) > BF16_LOSS_TOL * fabs(kept32.loss[s]))
            fail_msg("step %d: bf16-kept inputs loss %.6f, fp32-kept %.6f", s + 1, kept16.loss[s],
                     kept32.loss[s]);
        differ |= kept16.norm[s] != kept32.norm[s];
    }
    assert_true(differ);
    result_free(&kept16);
    result_free(&kept32);
}

/* Parameters on NVMe, the optimizer state in memory: every NVMe read is a
 * parameter shard, and bf16 reads half the bytes, plus the page rounding of
 * shards that are odd multiples of 2 KiB in bf16 (O_DIRECT reads whole
 * pages): for this model 5.4% over half (the layer shards, 76 KiB in fp32,
 * read 40 KiB; the head's, 4 KiB in fp32, reads 4 KiB). */
static void test_bf16_halves_parameter_nvme_reads(void **state)
{
    (void)state;
    fso_config cfg;
    run_result f32, b16;
    fso_test_small_model(&cfg, 2, 4);
    fso_test_set_tiers(&cfg, FSO_TIER_NVME, FSO_TIER_HOST, nvme_dir);
    run(&cfg, NULL, &f32);
    cfg.bf16 = true;
    run(&cfg, NULL, &b16);
    if (f32.rc || b16.rc)
        fail_msg("%s%s", f32.err, b16.err);
    double ratio = (double)b16.nvme_read / (double)f32.nvme_read;
    fprintf(stderr, "# parameter bytes read from NVMe over %d steps: fp32 %llu, bf16 %llu (%.3f)\n",
            STEPS, (unsigned long long)f32.nvme_read, (unsigned long long)b16.nvme_read, ratio);
    assert_true(f32.nvme_read > 0);
    assert_true(ratio >= 0.5 && ratio <= 0.55);
    result_free(&f32);
    result_free(&b16);
}

/* The planner's memory for a placement is what the engine allocates for
 * it: on each device the activations, the resident shards, the gather
 * window and the gradient buffers; in the host arena every device's
 * host-tier shards and staging buffers (the parameter ring, the gradient
 * slots, the optimizer's chunks). */
static void test_planner_predicts_what_the_engine_allocates(void **state)
{
    (void)state;
    static const struct {
        int world;
        fso_tier param, optim;
        bool bf16;
        int prefetch;
        int64_t aio;
        int host_blocks; /* the first blocks' optimizer state on the host */
    } cases[] = {
        {1, FSO_TIER_DEVICE, FSO_TIER_DEVICE, false, 2, 1 << 20, 0}, /* the shard lent as is */
        {1, FSO_TIER_DEVICE, FSO_TIER_HOST, true, 2, 1 << 20, 0},
        {2, FSO_TIER_HOST, FSO_TIER_HOST, true, 2, 1 << 20, 0},
        {2, FSO_TIER_NVME, FSO_TIER_NVME, true, 3, 4096, 0}, /* bf16 chunks of 8 KiB */
        {2, FSO_TIER_DEVICE, FSO_TIER_NVME, false, 2, 8192, 0},
        {1, FSO_TIER_NVME, FSO_TIER_HOST, false, 5, 1 << 20, 0},
        {1, FSO_TIER_HOST, FSO_TIER_DEVICE, true, 2, 1 << 20, 0}, /* bf16 blocks, 2 KiB multiples */
        {2, FSO_TIER_NVME, FSO_TIER_NVME, true, 2, 1 << 20, 1},
        {1, FSO_TIER_DEVICE, FSO_TIER_NVME, false, 2, 1 << 20, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fso_config cfg;
        fso_trainer tr;
        fso_plan_ctx ctx;
        static fso_plan p;
        static fso_placement pl;
        char err[512];
        fso_test_small_model(&cfg, cases[i].world, 4);
        fso_test_set_tiers(&cfg, cases[i].param, cases[i].optim, nvme_dir);
        cfg.bf16 = cases[i].bf16;
        cfg.offload.prefetch_blocks = cases[i].prefetch;
        cfg.offload.aio_block_bytes = cases[i].aio;
        cfg.offload.state_host_blocks = cases[i].host_blocks;
        if (fso_trainer_init(&tr, &cfg) < 0)
            fail_msg("case %zu: %s", i, tr.err);
        fso_plan_machine m = {.devices = cases[i].world, .cpu_devices = true,
                              .device_mem_bytes = (uint64_t)1 << 40,
                              .host_mem_bytes = (uint64_t)1 << 40,
                              .nvme_free_bytes = (uint64_t)1 << 40, .nvme_read_gbps = 1,
                              .nvme_write_gbps = 1, .h2d_gbps = 1, .d2h_gbps = 1,
                              .coll_gbps = 1, .device_gflops = 1, .adam_gelems = 1,
                              .host_copy_gbps = 1};
        assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
        fso_placement_uniform(&pl, ctx.in.model.n_blocks, cases[i].param, cases[i].optim,
                              cases[i].optim, cases[i].prefetch);
        for (int b = 0; b < cases[i].host_blocks; b++)
            for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++)
                pl.tier[k][b] = FSO_TIER_HOST;
        assert_int_equal(fso_plan_evaluate(&ctx.in, &pl, &p), 0);
        const fso_backend *be = fso_zero_model(tr.zero)->be;
        /* the CPU backend's working space for bf16 tensors grows during a step */
        uint64_t device = p.need_bytes[FSO_TIER_DEVICE] - ctx.in.engine.device_reserve_bytes;
        if (be->mem_used_bytes != device || fso_zero_host_arena_bytes(tr.zero) !=
                                                p.need_bytes[FSO_TIER_HOST])
            fail_msg("case %zu: device %zu allocated, %llu predicted; host %llu allocated, "
                     "%llu predicted", i, be->mem_used_bytes, (unsigned long long)device,
                     (unsigned long long)fso_zero_host_arena_bytes(tr.zero),
                     (unsigned long long)p.need_bytes[FSO_TIER_HOST]);
        /* the engine's own budget, by arithmetic before it allocates, is the
         * planner's to the byte on every tier */
        fso_zero_need need;
        fso_zero_need_for(&cfg, &need);
        for (int t = 0; t < FSO_N_TIERS; t++)
            if (need.tier[t] != p.need_bytes[t])
                fail_msg("case %zu: %s: the engine's budget %llu, the planner's %llu", i,
                         fso_tier_name(t), (unsigned long long)need.tier[t],
                         (unsigned long long)p.need_bytes[t]);
        fso_plan_ctx_free(&ctx);
        fso_trainer_free(&tr);
    }
}

/* ------------------------------------------------ per-block placement */

/* One per-block placement (state.h fso_block_rule): the first `resident`
 * blocks of the residency order keep their parameters on the devices, the
 * others are streamed from `param`; `device_state` blocks (from the last
 * down, or from block 0 up) keep master, m, v and gradients on the devices
 * and are updated there, the others' state is on `optim` and the CPU
 * updates it. A count of -1: every block. */
typedef struct mix {
    int resident;
    fso_tier param;
    int device_state;
    bool state_first;
    fso_tier optim;
    fso_overlap overlap;
} mix;

static void set_mix(fso_config *cfg, const mix *m)
{
    const int nb = fso_model_n_blocks(&cfg->model);
    fso_test_set_tiers(cfg, m->param, m->optim, nvme_dir);
    cfg->offload.per_kind = false;
    cfg->offload.resident_blocks = m->resident < 0 ? nb : m->resident;
    cfg->offload.device_state_blocks = m->device_state < 0 ? nb : m->device_state;
    cfg->offload.device_state_first = m->state_first;
    cfg->optimizer_overlap = m->overlap;
}

/* cfg's mix (set_mix), for messages. */
static void describe_mix(char *what, size_t len, const fso_config *cfg, const char *backend)
{
    const fso_offload_config *o = &cfg->offload;
    snprintf(what, len, "%d device%s, %s, %d resident blocks streamed from %s, %d blocks' state "
                        "on the devices (from the %s) the rest on %s, overlap %d",
             cfg->world, cfg->world == 1 ? "" : "s", backend, o->resident_blocks,
             fso_tier_name(o->param_tier), o->device_state_blocks,
             o->device_state_first ? "first" : "last", fso_tier_name(o->optim_tier),
             cfg->optimizer_overlap);
}

#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
#define FWD FSO_OVERLAP_FORWARD
#define SER FSO_OVERLAP_NONE
/* resident 0 / some / all x parameters streamed from the host / NVMe x
 * state on the devices for 0 / some / all blocks */
static const mix g_mixes[] = {
    {1, N, 0, false, H, SER},  {2, H, 0, false, N, FWD},  {-1, N, 0, false, N, SER},
    {0, N, 2, false, N, FWD},  {2, N, 2, false, H, SER},  {1, H, -1, false, H, FWD},
    {-1, H, 2, true, N, SER},  {2, N, -1, false, N, SER}, {0, H, 1, true, N, FWD},
    {3, N, 3, true, H, FWD},
};
#undef FWD
#undef SER

/* Every mix gives the bits of everything on the device (fp32 gradients:
 * one global norm over the blocks updated on the devices and those updated
 * on the CPU) on `world` devices and the backend: the CPU backend (devices
 * the CPU addresses: resident blocks lent in place like host ones) or a
 * discrete GPU's rules (cpu-async: resident blocks gathered on the device,
 * the device-state blocks updated by the backend's AdamW, the others by the
 * CPU's through copies). */
static void mixes_for(int world, const char *backend, size_t n_mixes)
{
    run_result base, r;
    fso_config cfg;
    fso_test_small_model(&cfg, world, 4);
    cfg.backend = fso_backend_find(backend)->kind;
    fso_test_set_tiers(&cfg, D, D, nvme_dir);
    run(&cfg, NULL, &base);
    if (base.rc)
        fail_msg("all on device: %s", base.err);
    for (size_t i = 0; i < n_mixes; i++) {
        char what[256];
        set_mix(&cfg, &g_mixes[i]);
        describe_mix(what, sizeof what, &cfg, backend);
        run(&cfg, NULL, &r);
        if (r.rc)
            fail_msg("%s: %s", what, r.err);
        assert_bit_identical(&base, &r, 1, what);
        result_free(&r);
    }
    result_free(&base);
}

/* The mixes on `world` devices under a GPU's rules, where it has that many:
 * cpu-async opens any number; CUDA (a GPU, or the stand-in's two) the
 * devices there are, else the case is skipped, saying so. */
static void gpu_mixes_for(int world, size_t n_mixes)
{
    char err[256] = "";
    const int have = fso_test_gpu_is_cuda() ? fso_cuda_device_count(err, sizeof err) : world;
    if (have >= world)
        mixes_for(world, fso_test_gpu_rules(), n_mixes);
    else
        print_message("block mixes on %d devices under %s's rules skipped: %d device%s there%s%s\n",
                      world, fso_test_gpu_rules(), have, have == 1 ? "" : "s", err[0] ? ": " : "",
                      err);
}

static void test_block_mixes_are_bit_identical_one_device(void **s)
{
    (void)s;
    mixes_for(1, "cpu", sizeof g_mixes / sizeof g_mixes[0]);
    gpu_mixes_for(1, sizeof g_mixes / sizeof g_mixes[0]);
}

static void test_block_mixes_are_bit_identical_two_devices(void **s)
{
    (void)s;
    mixes_for(2, "cpu", sizeof g_mixes / sizeof g_mixes[0]);
    gpu_mixes_for(2, sizeof g_mixes / sizeof g_mixes[0]);
}

static void test_block_mixes_are_bit_identical_four_devices(void **s)
{
    (void)s;
    mixes_for(4, "cpu", 5);
    gpu_mixes_for(4, 5);
}

/* A re-plan between steps that changes which blocks are resident and whose
 * state is on the devices moves those shards and keeps the bits. */
static const mix g_replan[] = {
    {0, N, 0, false, N, FSO_OVERLAP_FORWARD},
    {2, N, 2, false, N, FSO_OVERLAP_FORWARD},
    {-1, H, 1, true, H, FSO_OVERLAP_FORWARD},
};

static void replan_mixes(fso_trainer *tr, int step)
{
    if (step >= (int)(sizeof g_replan / sizeof g_replan[0]))
        return;
    fso_config cfg = *tr->cfg;
    set_mix(&cfg, &g_replan[step]);
    double waited;
    char err[512] = "";
    uint64_t moved = 0;
    assert_int_equal(fso_trainer_finish(tr, &waited), 0);
    if (fso_zero_retier(tr->zero, &cfg.offload, &moved, err, sizeof err) < 0)
        fail_msg("re-plan after step %d: %s", step, err);
    assert_true(moved > 0);
    const fso_block_rule *ru = fso_zero_block_rule(tr->zero);
    assert_int_equal(ru->resident_blocks, cfg.offload.resident_blocks);
    assert_int_equal(ru->device_state_blocks, cfg.offload.device_state_blocks);
}

static void test_replan_changes_resident_and_device_state_blocks(void **state)
{
    (void)state;
    const char *const backends[] = {"cpu", fso_test_gpu_rules()};
    for (int world = 1; world <= 2; world++)
        for (int be = 0; be < 2; be++) {
            run_result base, r;
            fso_config cfg;
            char what[96];
            fso_test_small_model(&cfg, world, 4);
            cfg.backend = fso_backend_find(backends[be])->kind;
            fso_test_set_tiers(&cfg, D, D, nvme_dir);
            run(&cfg, NULL, &base);
            set_mix(&cfg, &g_replan[0]);
            run(&cfg, &(run_hooks){.stepped = replan_mixes}, &r);
            snprintf(what, sizeof what, "%d devices, %s, re-planned between steps", world,
                     backends[be]);
            if (r.rc)
                fail_msg("%s: %s", what, r.err);
            assert_bit_identical(&base, &r, 1, what);
            result_free(&r);
            result_free(&base);
        }
}

/* Counts that cannot place the blocks are refused at creation, naming the
 * key and the fix: more blocks than the model has, resident blocks when
 * every block's parameters are on the devices already, device-state blocks
 * when all of the optimizer's state is there already. */
static void test_impossible_block_counts_are_refused(void **state)
{
    (void)state;
    fso_config cfg;
    fso_trainer tr;
    fso_test_small_model(&cfg, 1, 4);
    const int nb = fso_model_n_blocks(&cfg.model);
    static const struct {
        fso_tier param, optim;
        int resident, device_state;
        const char *want;
    } bad[] = {
        {H, H, 99, 0, "train.resident_blocks: 99 blocks, but the model has"},
        {H, N, 0, 99, "train.device_state_blocks: 99 blocks, but the model has"},
        {D, H, 2, 0, "parameters are on the devices already"},
        {N, D, 0, 2, "gradients are on the devices already"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fso_test_set_tiers(&cfg, bad[i].param, bad[i].optim, nvme_dir);
        cfg.offload.resident_blocks = bad[i].resident;
        cfg.offload.device_state_blocks = bad[i].device_state;
        int rc = fso_trainer_init(&tr, &cfg);
        if (rc != -EINVAL || !strstr(tr.err, bad[i].want))
            fail_msg("case %zu: rc %d, \"%s\" lacks \"%s\"", i, rc, tr.err, bad[i].want);
        if (rc == 0)
            fso_trainer_free(&tr);
    }
    /* every block is a count the model has */
    fso_test_set_tiers(&cfg, H, H, nvme_dir);
    cfg.offload.resident_blocks = nb;
    cfg.offload.device_state_blocks = nb;
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("%d of %d blocks: %s", nb, nb, tr.err);
    fso_trainer_free(&tr);
}

/* What the engine allocates for a mix is the footprint's (fso_zero_need_for)
 * byte for byte: on every device, and in the host arena. */
static void test_mix_footprint_is_what_the_engine_allocates(void **state)
{
    (void)state;
    const char *const backends[] = {"cpu", "cpu-async"};
    for (int world = 1; world <= 2; world++)
        for (int be = 0; be < 2; be++)
            for (size_t i = 0; i < sizeof g_mixes / sizeof g_mixes[0]; i++) {
                fso_config cfg;
                fso_trainer tr;
                char what[256];
                fso_test_small_model(&cfg, world, 4);
                cfg.backend = fso_backend_find(backends[be])->kind;
                set_mix(&cfg, &g_mixes[i]);
                describe_mix(what, sizeof what, &cfg, backends[be]);
                if (fso_trainer_init(&tr, &cfg) < 0)
                    fail_msg("%s: %s", what, tr.err);
                fso_zero_need need;
                fso_zero_need_for(&cfg, &need);
                const fso_backend *b0 = fso_zero_model(tr.zero)->be;
                if (b0->mem_used_bytes != need.tier[FSO_TIER_DEVICE] ||
                    fso_zero_host_arena_bytes(tr.zero) != need.tier[FSO_TIER_HOST])
                    fail_msg("%s: device %zu allocated, %llu predicted; host %llu allocated, "
                             "%llu predicted", what, b0->mem_used_bytes,
                             (unsigned long long)need.tier[FSO_TIER_DEVICE],
                             (unsigned long long)fso_zero_host_arena_bytes(tr.zero),
                             (unsigned long long)need.tier[FSO_TIER_HOST]);
                fso_trainer_free(&tr);
            }
}
#undef D
#undef H
#undef N

/* train.whole_block_copies under a discrete GPU's rules (cpu-async): a
 * streamed block's shards all copied to every device instead of each
 * device's own copied and then all-gathered, with parameters in host memory
 * and on NVMe, 2 and 4 devices, fp32 and bf16, each schedule: the gather
 * run's losses, norms and parameters to the bit. The trainer's gather count
 * says no block was gathered (the device tier, last case, still gathers),
 * every device read every device's shards from NVMe, and both are what
 * fso_zero_step_traffic derives; the engine allocates the same and what its
 * budget says. */
static void test_whole_block_copies_give_the_gather_bits(void **state)
{
    (void)state;
#define D FSO_TIER_DEVICE
#define H FSO_TIER_HOST
#define N FSO_TIER_NVME
    static const struct {
        int world;
        fso_tier param, optim;
        bool bf16;
        fso_overlap overlap;
    } cases[] = {
        {2, H, H, false, FSO_OVERLAP_FORWARD},  {2, N, H, false, FSO_OVERLAP_NONE},
        {2, N, N, true, FSO_OVERLAP_BACKWARD},  {4, H, N, true, FSO_OVERLAP_FORWARD},
        {4, N, N, false, FSO_OVERLAP_FORWARD},  {4, N, D, false, FSO_OVERLAP_BACKWARD},
        {2, D, H, false, FSO_OVERLAP_FORWARD},
    };
#undef D
#undef H
#undef N
    /* cpu-async makes any number of devices; the CUDA backend (and its
     * stand-in) has the machine's */
    char cerr[256] = "";
    const int most = fso_test_gpu_is_cuda() ? fso_cuda_device_count(cerr, sizeof cerr)
                                            : FSO_MAX_DEVICES;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fso_config cfg;
        run_result base, r;
        char what[160];
        if (cases[c].world > most) {
            printf("# case %zu: %d devices, this machine has %d GPUs: not run here\n", c,
                   cases[c].world, most);
            continue;
        }
        fso_test_small_model(&cfg, cases[c].world, 4);
        cfg.backend = fso_backend_find(fso_test_gpu_rules())->kind;
        fso_test_set_tiers(&cfg, cases[c].param, cases[c].optim, nvme_dir);
        cfg.bf16 = cases[c].bf16;
        cfg.optimizer_overlap = cases[c].overlap;
        cfg.grad_clip = cases[c].overlap == FSO_OVERLAP_BACKWARD ? 0.0 : 1.0;
        snprintf(what, sizeof what, "case %zu: %d devices, %s, parameters on tier %d, "
                 "optimizer on tier %d, schedule %d", c, cases[c].world,
                 cases[c].bf16 ? "bf16" : "fp32", cases[c].param, cases[c].optim,
                 cases[c].overlap);
        run(&cfg, NULL, &base);
        cfg.offload.whole_copy = true;
        run(&cfg, NULL, &r);
        assert_bit_identical(&base, &r, 1, what);
        result_free(&base);
        result_free(&r);

        const bool streamed = cases[c].param != FSO_TIER_DEVICE;
        fso_fp_traffic gathered, whole;
        cfg.offload.whole_copy = false;
        assert_int_equal(fso_zero_step_traffic(&cfg, &gathered), 0);
        fso_zero_need need_gathered, need;
        fso_zero_need_for(&cfg, &need_gathered);
        cfg.offload.whole_copy = true;
        assert_int_equal(fso_zero_step_traffic(&cfg, &whole), 0);
        fso_zero_need_for(&cfg, &need);
        assert_true(gathered.gather_bytes > 0);
        assert_int_equal(whole.gather_bytes, streamed ? 0 : gathered.gather_bytes);
        assert_int_equal(whole.nvme_read[FSO_KIND_PARAM],
                         cases[c].param == FSO_TIER_NVME
                             ? gathered.nvme_read[FSO_KIND_PARAM] * (uint64_t)cases[c].world
                             : gathered.nvme_read[FSO_KIND_PARAM]);
        assert_memory_equal(need.tier, need_gathered.tier, sizeof need.tier);

        fso_data data = {0};
        fso_trainer tr;
        assert_int_equal(fso_data_init(&data, &cfg), 0);
        if (fso_trainer_init(&tr, &cfg) < 0)
            fail_msg("%s: %s", what, tr.err);
        if (fso_zero_host_arena_bytes(tr.zero) != need.tier[FSO_TIER_HOST])
            fail_msg("%s: host arena %llu, the budget says %llu", what,
                     (unsigned long long)fso_zero_host_arena_bytes(tr.zero),
                     (unsigned long long)need.tier[FSO_TIER_HOST]);
        size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len, n = fso_trainer_step_tokens(&cfg);
        int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
        assert_non_null(in);
        assert_non_null(tg);
        for (int s = 1; s <= 3; s++) {
            fso_zero_step st;
            for (size_t a = 0; a < n / bt; a++)
                fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
            if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
                fail_msg("%s, step %d: %s", what, s, tr.err);
            if (st.gather_bytes != whole.gather_bytes)
                fail_msg("%s, step %d: %llu bytes gathered, the derivation says %llu", what, s,
                         (unsigned long long)st.gather_bytes,
                         (unsigned long long)whole.gather_bytes);
            if (s > 1 && st.nvme_kind_read[FSO_KIND_PARAM] != whole.nvme_read[FSO_KIND_PARAM])
                fail_msg("%s, step %d: %llu parameter bytes read, the derivation says %llu",
                         what, s, (unsigned long long)st.nvme_kind_read[FSO_KIND_PARAM],
                         (unsigned long long)whole.nvme_read[FSO_KIND_PARAM]);
        }
        free(in);
        free(tg);
        fso_trainer_free(&tr);
        fso_data_free(&data);
    }
}

/* bf16 working gradients (train.gradient_dtype "bf16") against fp32 ones.
 *
 * Where the bound comes from: each device's fp32 gradient of a block is
 * rounded once to bf16 (zero_source.c round_grads), a relative change of
 * at most u = 2^-8 per element (2^-9 for round to nearest; the looser
 * 2^-8 is taken), and the sum over devices is fp32 as before. So:
 *   - step 1's loss is the forward of the same parameters: the same bits;
 *   - a step's update moves each parameter by lr * m/(sqrt(v) + eps), whose
 *     m and sqrt(v) each change by at most u relative: the update by at
 *     most 2u relative, and the loss it lowers, L(t) - L(t+1), by at most
 *     2u of that decrease, to first order; the next loss is off by at most
 *     2u times the sum of the decreases so far. Gradient clipping and
 *     cancellation between devices' contributions (a sum smaller than its
 *     parts) can add a few u more, so the test allows K = 8 times that:
 *       |L_bf16(s) - L_fp32(s)| <= 8 u sum_{t<s} |L_fp32(t) - L_fp32(t+1)|
 *     plus the fp32 run's own order noise (1e-6 relative);
 *   - the parameters: the same reasoning per step gives
 *       ||p_bf16 - p_fp32|| <= 8 u ||p_fp32 - p_0||
 *     (the distance moved, u of it per step's update, K as above).
 * A bf16 run is deterministic: two runs give the same bits. */
#define BF16_GRAD_U 0x1p-8
#define BF16_GRAD_K 8.0

static double param_dist(const run_result *a, const float *b)
{
    double d2 = 0;
    for (size_t i = 0; i < a->np; i++) {
        const double d = (double)a->params[i] - b[i];
        d2 += d * d;
    }
    return sqrt(d2);
}

static void bf16_grads_for(int world, const char *backend)
{
    fso_config cfg;
    run_result init, f32, g16, again;
    fso_test_small_model(&cfg, world, 4);
    cfg.bf16 = true;
    if (backend)
        cfg.backend = fso_backend_find(backend)->kind;
    const int64_t steps = cfg.steps;
    cfg.steps = 0;
    run_ok(&cfg, NULL, &init);
    cfg.steps = steps;
    run_ok(&cfg, NULL, &f32);
    cfg.bf16_grads = true;
    run_ok(&cfg, NULL, &g16);
    run_ok(&cfg, NULL, &again);
    char what[96];
    snprintf(what, sizeof what, "bf16 gradients, %d devices, %s", world,
             backend ? backend : "cpu");
    assert_bit_identical(&g16, &again, 1, what);
    if (memcmp(&g16.loss[0], &f32.loss[0], sizeof(double)) != 0)
        fail_msg("%s: step 1 loss %.17g, fp32 gradients %.17g", what, g16.loss[0], f32.loss[0]);
    double fell = 0;
    for (int s = 1; s < STEPS; s++) {
        fell += fabs(f32.loss[s - 1] - f32.loss[s]);
        const double tol = BF16_GRAD_K * BF16_GRAD_U * fell + 1e-6 * fabs(f32.loss[s]);
        fprintf(stderr, "# %s: step %d loss %.9g, fp32 gradients %.9g: off %.3g (%.3g of the "
                        "bound)\n", what, s + 1, g16.loss[s], f32.loss[s],
                fabs(g16.loss[s] - f32.loss[s]), fabs(g16.loss[s] - f32.loss[s]) / tol);
        if (!(fabs(g16.loss[s] - f32.loss[s]) <= tol))
            fail_msg("%s: step %d: loss %.9g, fp32 gradients %.9g (bound %.3g)", what, s + 1,
                     g16.loss[s], f32.loss[s], tol);
    }
    const double moved = param_dist(&f32, init.params), off = param_dist(&g16, f32.params);
    fprintf(stderr, "# %s: parameters off %.3g after moving %.3g: %.3g relative (%.3g of the "
                    "bound)\n", what, off, moved, off / moved,
            off / (BF16_GRAD_K * BF16_GRAD_U * moved));
    if (!(off <= BF16_GRAD_K * BF16_GRAD_U * moved))
        fail_msg("%s: parameters %.3g from the fp32 gradients' after moving %.3g (bound %.3g)",
                 what, off, moved, BF16_GRAD_K * BF16_GRAD_U * moved);
    if (off == 0)
        fail_msg("%s: the same parameters as with fp32 gradients: nothing was rounded", what);
    result_free(&init);
    result_free(&f32);
    result_free(&g16);
    result_free(&again);
}

static void test_bf16_gradients_are_close_to_fp32_and_deterministic(void **state)
{
    (void)state;
    bf16_grads_for(1, NULL);
    bf16_grads_for(2, NULL);
    bf16_grads_for(4, NULL);
    bf16_grads_for(2, fso_test_gpu_rules());
}

/* On a GPU's rules the gradients are cast into bf16 send buffers and
 * reduce-scattered by reduce_scatter_bf16 (coll.h); on CPU devices they are
 * rounded in place and summed in fp32 in rank order: the same values in
 * the same order, so the CPU's bits (on the CUDA stand-in: within its
 * tolerance, assert_gpu_rules_match), on every tier the gradients land on
 * and with two micro-batches accumulated. */
static void test_bf16_gradients_on_gpu_rules_give_cpu_bits(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_HOST, FSO_TIER_HOST},
        {FSO_TIER_NVME, FSO_TIER_NVME},
    };
    for (int world = 1; world <= 2; world++)
        for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
            fso_config cfg;
            run_result cpu, gpu;
            fso_test_small_model(&cfg, world, 4);
            cfg.bf16 = cfg.bf16_grads = true;
            cfg.grad_accum = 2;
            fso_test_set_tiers(&cfg, tiers[t][0], tiers[t][1], nvme_dir);
            char what[128];
            snprintf(what, sizeof what, "bf16 gradients, %d devices, tiers %d/%d, %s", world,
                     tiers[t][0], tiers[t][1], fso_test_gpu_rules());
            run_ok(&cfg, NULL, &cpu);
            cfg.backend = fso_backend_find(fso_test_gpu_rules())->kind;
            run_ok(&cfg, NULL, &gpu);
            assert_gpu_rules_match(&cpu, &gpu, 1, true, what);
            result_free(&cpu);
            result_free(&gpu);
        }
}

/* The bf16 send buffers are counted: what the engine allocates with bf16
 * gradients on a GPU's rules is the footprint's budget to the byte, and
 * that is the fp32 gradients' plus two buffers of the largest block in
 * bf16; on CPU devices (rounded in place) nothing more. The reduce-scatter
 * reads bf16 where it is sent. */
static void test_bf16_gradient_buffers_are_in_the_footprint(void **state)
{
    (void)state;
    for (int gpu = 0; gpu < 2; gpu++)
        for (int world = 1; world <= 2; world++) {
            uint64_t dev[2][FSO_MAX_DEVICES], tier[2][FSO_N_TIERS];
            fso_zero_need need[2];
            uint64_t reduced[2];
            for (int g16 = 0; g16 < 2; g16++) {
                fso_config cfg;
                fso_trainer tr;
                fso_test_small_model(&cfg, world, 4);
                cfg.bf16 = true;
                cfg.bf16_grads = g16;
                if (gpu)
                    cfg.backend = fso_backend_find(fso_test_gpu_rules())->kind;
                if (fso_trainer_init(&tr, &cfg) < 0)
                    fail_msg("%d devices, gpu rules %d: %s", world, gpu, tr.err);
                fso_zero_allocated(tr.zero, dev[g16], tier[g16]);
                fso_zero_need_for(&cfg, &need[g16]);
                fso_fp_rules r;
                fso_zero_fp_rules(&cfg, &r);
                size_t each;
                const int n = fso_fp_grad_send_buffers(&r, 1, &each);
                assert_int_equal(n, g16 && gpu ? 2 : 0);
                /* what the collective reads: bf16 where it is sent */
                assert_int_equal(fso_fp_reduce_elem_bytes(&r), g16 && gpu ? 2 : 4);
                /* and a step reduces what the footprint says */
                fso_data data = {0};
                fso_fp_traffic want;
                fso_zero_step st;
                assert_int_equal(fso_zero_step_traffic(&cfg, &want), 0);
                assert_int_equal(fso_data_init(&data, &cfg), 0);
                const size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len;
                const size_t tokens = fso_trainer_step_tokens(&cfg);
                int32_t *in = malloc(sizeof(int32_t) * tokens),
                        *tg = malloc(sizeof(int32_t) * tokens);
                assert_true(in && tg);
                for (size_t a = 0; a < tokens / bt; a++)
                    fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
                if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
                    fail_msg("%d devices, gpu rules %d: %s", world, gpu, tr.err);
                assert_true(st.reduce_bytes == want.reduce_bytes);
                reduced[g16] = st.reduce_bytes;
                free(in);
                free(tg);
                fso_data_free(&data);
                fso_trainer_free(&tr);
            }
            assert_true(reduced[1] * (gpu ? 2 : 1) == reduced[0] && reduced[0] > 0);
            if (fso_test_gpu_is_cuda() && gpu)
                continue; /* the CUDA backend's workspaces are its own */
            const uint64_t more = tier[1][FSO_TIER_DEVICE] - tier[0][FSO_TIER_DEVICE];
            const uint64_t predicted = need[1].device_buffers - need[0].device_buffers;
            fprintf(stderr, "# %d devices, %s: bf16 gradients add %llu device bytes, %llu "
                            "predicted\n", world, gpu ? fso_test_gpu_rules() : "cpu",
                    (unsigned long long)more, (unsigned long long)predicted);
            assert_true(more == predicted);
            assert_true(gpu ? more > 0 : more == 0);
            assert_true(tier[1][FSO_TIER_HOST] == tier[0][FSO_TIER_HOST]);
        }
}

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(nvme_dir, sizeof nvme_dir, "fsoff-zero");
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(nvme_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planner_predicts_what_the_engine_allocates),
        cmocka_unit_test(test_absurd_models_are_refused_before_allocating),
        cmocka_unit_test(test_tiers_are_bit_identical_one_device),
        cmocka_unit_test(test_tiers_are_bit_identical_two_devices),
        cmocka_unit_test(test_bf16_tiers_are_bit_identical_one_device),
        cmocka_unit_test(test_bf16_tiers_are_bit_identical_two_devices),
        cmocka_unit_test(test_per_kind_tiers_are_bit_identical),
        cmocka_unit_test(test_first_blocks_state_on_the_host_is_bit_identical),
        cmocka_unit_test(test_step_nvme_bytes_are_the_derivation),
        cmocka_unit_test(test_bf16_working_parameters_are_bf16_of_master),
        cmocka_unit_test(test_bf16_load_hf_keeps_the_master_exact),
        cmocka_unit_test(test_bf16_run_is_close_to_fp32_and_device_counts_agree),
        cmocka_unit_test(test_bf16_keeps_layer_inputs_in_bf16),
        cmocka_unit_test(test_per_block_compute_times_add_up),
        cmocka_unit_test(test_bf16_halves_parameter_nvme_reads),
        cmocka_unit_test(test_overlapped_schedules_match_serialized),
        cmocka_unit_test(test_gpu_paths_give_cpu_bits_one_device),
        cmocka_unit_test(test_gpu_paths_give_cpu_bits_two_devices),
        cmocka_unit_test(test_gpu_paths_give_cpu_bits_bf16),
        cmocka_unit_test(test_compute_ahead_of_copies_down_keeps_cpu_bits),
        cmocka_unit_test(test_non_finite_gradients_stop_every_schedule),
        cmocka_unit_test(test_a_step_syncs_once_and_allocates_nothing),
        cmocka_unit_test(test_optimizer_chunk_copies_share_marks),
        cmocka_unit_test(test_nvme_streaming_in_chunks_matches_memory),
        cmocka_unit_test(test_device_counts_agree),
        cmocka_unit_test(test_validation_pass_is_the_forward_and_changes_nothing),
        cmocka_unit_test(test_masked_packed_data_trains_alike_on_one_and_two_devices),
        cmocka_unit_test(test_a_step_without_counted_targets_is_refused),
        cmocka_unit_test(test_device_cap_too_small_fails_before_training),
        cmocka_unit_test(test_large_model_trains_from_nvme_within_cap),
        cmocka_unit_test(test_impossible_block_counts_are_refused),
        cmocka_unit_test(test_mix_footprint_is_what_the_engine_allocates),
        cmocka_unit_test(test_block_mixes_are_bit_identical_one_device),
        cmocka_unit_test(test_block_mixes_are_bit_identical_two_devices),
        cmocka_unit_test(test_block_mixes_are_bit_identical_four_devices),
        cmocka_unit_test(test_replan_changes_resident_and_device_state_blocks),
        cmocka_unit_test(test_whole_block_copies_give_the_gather_bits),
        cmocka_unit_test(test_bf16_gradients_are_close_to_fp32_and_deterministic),
        cmocka_unit_test(test_bf16_gradients_on_gpu_rules_give_cpu_bits),
        cmocka_unit_test(test_bf16_gradient_buffers_are_in_the_footprint),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
