/* test_planner.c — the planner (test_probe.c: the machine it plans for).
 *
 *  - placement on synthetic machines: generous memory keeps everything on the
 *    device; tight device memory streams parameters; a small host sends the
 *    optimizer state to NVMe; with a tier per kind, a host that holds some
 *    kinds keeps those, and the plan says why each kind sits where it does;
 *    pins are kept; when nothing fits, the result names the short tier and
 *    the exact shortfall;
 *  - the timeline against hand-computed steps (prefetch depth 1 against 2;
 *    a CPU device where everything shares one thread);
 *  - re-planning when a measurement is off by more than 20%;
 *  - engine/plan.c: the model's visits and sizes, applying a plan to a
 *    configuration, pins from a configuration, the plan for this machine as
 *    the trainer gets it, `fsoff plan` exit statuses;
 * Predicted against measured step time is a benchmark
 * (bench/plan_vs_measured.py), not a test.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "model.h"
#include "plan.h"
#include "planner.h"
#include "probe.h"
#include "test_util.h"
#include "topology.h"
#include "zero/zero.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * MIB)

static char tmpdir[1024];

/* ------------------------------------------------------------------ synthetic inputs */

/* nb blocks of `elems` elements each, a forward visit and a backward visit
 * per block (flops each), fp32 everywhere (param/grad/state 4 bytes). */
typedef struct synth {
    fso_plan_input in;
    uint64_t elems[16];
    fso_plan_visit visits[40];
} synth;

static void synth_model(synth *s, int nb, uint64_t elems, double fwd_flops, bool with_backward)
{
    memset(s, 0, sizeof *s);
    int n = 0;
    for (int b = 0; b < nb; b++) {
        s->elems[b] = elems;
        s->visits[n++] = (fso_plan_visit){.block = b, .flops = fwd_flops, .params = true};
    }
    if (with_backward)
        for (int b = nb - 1; b >= 0; b--)
            s->visits[n++] = (fso_plan_visit){.block = b, .flops = 2 * fwd_flops, .params = true,
                                              .grads = true};
    fso_plan_model *m = &s->in.model;
    m->n_blocks = nb;
    m->block_elems = s->elems;
    m->n_visits = n;
    m->visits = s->visits;
    m->grad_accum = 1;
    m->tokens_per_step = 1000;
    m->activation_bytes = (uint64_t)(1 * MIB);
    fso_plan_engine *en = &s->in.engine;
    en->overlap = FSO_OVERLAP_NONE;
    /* fp32 everywhere, devices the CPU cannot address (GPUs), no chunks */
    for (int k = 0; k < FSO_N_KINDS; k++)
        en->rules.dtype[k] = FSO_DT_F32;
    en->rules.host_addressable = false;
    en->opt_write_lag = 1;
    fso_plan_pins_none(&s->in.pins);
    fso_plan_machine *mc = &s->in.machine;
    mc->devices = 1;
    mc->device_mem_bytes = (uint64_t)(64 * GIB);
    mc->host_mem_bytes = (uint64_t)(256 * GIB);
    mc->nvme_free_bytes = (uint64_t)(1024 * GIB);
    mc->nvme_read_gbps = 3;
    mc->nvme_write_gbps = 2;
    mc->h2d_gbps = mc->d2h_gbps = 20;
    mc->coll_gbps = 100;
    mc->device_gflops = 100e3;
    mc->adam_gelems = 2;
    mc->device_adam_gelems = 50;
    mc->host_copy_gbps = 10;
}

/* The GPU engine's freedoms: per-block and per-kind tiers, whole copies. */
static void gpu_engine(synth *s)
{
    s->in.engine.per_block_tiers = true;
    s->in.engine.whole_copy = true;
    s->in.engine.opt_write_lag = 2;
}

static int count_tier(const fso_plan *p, int kind, int tier)
{
    int n = 0;
    for (int b = 0; b < p->pl.n_blocks; b++)
        n += p->pl.tier[kind][b] == tier;
    return n;
}

/* ------------------------------------------------------------------ placement */

static void test_generous_memory_keeps_everything_on_the_device(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    for (int gpu = 0; gpu < 2; gpu++) {
        synth_model(&s, 6, 1 << 20, 1e9, true);
        if (gpu)
            gpu_engine(&s);
        assert_int_equal(fso_plan_choose(&s.in, &p), 0);
        assert_true(p.fits);
        for (int k = 0; k < FSO_N_KINDS; k++)
            assert_int_equal(count_tier(&p, k, FSO_TIER_DEVICE), 6);
        assert_int_equal(p.kind_bytes[FSO_TIER_HOST][FSO_KIND_PARAM], 0);
        assert_true(p.step_ms > 0);
        assert_int_equal(p.bottleneck, FSO_STREAM_COMPUTE);
    }
}

static void test_tight_device_memory_streams_parameters(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    /* 8 blocks of 4 MiB per kind: all of it is 160 MiB; the device holds 30 MiB:
     * activations 1 MiB, gather window 8 MiB, gradient buffers 8 MiB, so about
     * three parameter blocks and nothing else */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    gpu_engine(&s);
    s.in.machine.device_mem_bytes = (uint64_t)(30 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_true(p.fits);
    int on_dev = count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE);
    assert_true(on_dev > 0 && on_dev < 8); /* some resident, the rest streamed */
    assert_int_equal(on_dev + count_tier(&p, FSO_KIND_PARAM, FSO_TIER_HOST), 8);
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        assert_int_equal(count_tier(&p, k, FSO_TIER_DEVICE), 0);
    assert_true(p.need_bytes[FSO_TIER_DEVICE] <= p.have_bytes[FSO_TIER_DEVICE]);

    /* the CPU engine takes one tier per kind: parameters move off whole */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(30 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_HOST), 8);
}

static void test_small_host_sends_optimizer_state_to_nvme(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    /* 160 MiB of state; the device takes 20 MiB, the host 60 MiB */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    gpu_engine(&s);
    s.in.machine.device_mem_bytes = (uint64_t)(20 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(60 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_true(p.fits);
    assert_true(p.kind_bytes[FSO_TIER_NVME][FSO_KIND_V] > 0);
    assert_true(p.need_bytes[FSO_TIER_HOST] <= (uint64_t)(60 * MIB));

    /* the CPU engine: everything of the optimizer on NVMe */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(20 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(60 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        assert_int_equal(count_tier(&p, k, FSO_TIER_NVME), 8);
}

/* The host memory a placement leaves takes the first blocks' optimizer
 * state that is on NVMe (the next forward needs block 0's update first):
 * as many blocks as fit, from block 0 up, never the last; the plan says so
 * and a configuration applied from it carries the count. */
static void test_host_room_takes_the_first_blocks_state(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    for (int on = 0; on < 2; on++) {
        synth_model(&s, 8, 1 << 20, 1e9, true);
        s.in.engine.state_host_blocks = on;
        s.in.machine.device_mem_bytes = (uint64_t)(20 * MIB);
        s.in.machine.host_mem_bytes = (uint64_t)(100 * MIB);
        assert_int_equal(fso_plan_choose(&s.in, &p), 0);
        const int h = count_tier(&p, FSO_KIND_M, FSO_TIER_HOST);
        fprintf(stderr, "# engine.state_host_blocks %d: m on the host in %d of 8 blocks, host "
                        "need %llu of %llu\n", on, h,
                (unsigned long long)p.need_bytes[FSO_TIER_HOST],
                (unsigned long long)p.have_bytes[FSO_TIER_HOST]);
        assert_true(p.fits);
        assert_int_equal(p.pl.tier[FSO_KIND_M][7], FSO_TIER_NVME);
        if (!on) {
            assert_int_equal(h, 0);
            continue;
        }
        assert_true(h >= 1 && h < 8);
        /* each kind of optimizer state the placement put on NVMe is on the host
         * for the same first h blocks; a kind all on the host stays there */
        for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++) {
            const bool all_host = count_tier(&p, k, FSO_TIER_HOST) == 8;
            for (int b = 0; b < 8; b++)
                assert_int_equal(p.pl.tier[k][b],
                                 all_host || b < h ? FSO_TIER_HOST : FSO_TIER_NVME);
        }
        /* one more block would not fit */
        assert_true(p.have_bytes[FSO_TIER_HOST] - p.need_bytes[FSO_TIER_HOST] <
                    3 * (uint64_t)(4 * MIB));
        char desc[512], why[1024], want[64];
        fso_plan_describe(&p, desc, sizeof desc);
        if (!strstr(desc, "host (") || !strstr(desc, "of 8 blocks"))
            fail_msg("the plan does not say where the blocks went: %s", desc);
        fso_plan_why(&p, why, sizeof why);
        snprintf(want, sizeof want, "blocks 0-%d in the host memory left", h - 1);
        if (!strstr(why, want) || !strstr(why, "nvme ("))
            fail_msg("the plan does not say why: %s", why);
        fso_config cfg;
        memset(&cfg, 0, sizeof cfg);
        char err[256];
        snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "/tmp");
        assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
        assert_int_equal(cfg.offload.state_host_blocks, h);
        assert_int_equal(fso_offload_tier(&cfg.offload, FSO_KIND_M), FSO_TIER_NVME);
        const int nb = p.pl.n_blocks;
        assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_M, h - 1, nb), FSO_TIER_HOST);
        assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_M, h, nb), FSO_TIER_NVME);
        /* a pin of the optimizer's tier keeps all of it there */
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            s.in.pins.tier[k] = FSO_TIER_NVME;
        assert_int_equal(fso_plan_choose(&s.in, &p), 0);
        assert_int_equal(count_tier(&p, FSO_KIND_M, FSO_TIER_NVME), 8);
    }
}

/* Host staging counts the gradients' landing slots only where gradient
 * shards land on their way from the device: on NVMe, or in host memory
 * the devices cannot address; CPU devices reduce straight into a host
 * tier, and a device tier is added to where it is. */
static void test_landing_slots_only_where_gradients_land(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    fso_placement pl;
    static const struct {
        bool cpu;
        int grad_tier;
        bool lands;
    } cases[] = {
        {true, FSO_TIER_HOST, false},  {true, FSO_TIER_NVME, true},
        {true, FSO_TIER_DEVICE, false}, {false, FSO_TIER_HOST, true},
        {false, FSO_TIER_NVME, true},   {false, FSO_TIER_DEVICE, false},
    };
    /* two devices, blocks of 2^20 elements: a shard is 2 MiB of fp32 */
    const uint64_t slot = (uint64_t)(2 * MIB);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        synth_model(&s, 4, 1 << 20, 1e9, true);
        s.in.machine.devices = 2;
        s.in.machine.cpu_devices = cases[i].cpu;
        s.in.engine.rules.host_addressable = cases[i].cpu;
        fso_placement_uniform(&pl, 4, FSO_TIER_HOST, FSO_TIER_HOST, cases[i].grad_tier, 2);
        assert_int_equal(fso_plan_evaluate(&s.in, &pl, &p), 0);
        const uint64_t want = (cases[i].lands ? 3 : 1) * slot * 2;
        if (p.buffer_bytes[FSO_TIER_HOST] != want)
            fail_msg("case %zu: host staging %llu, want %llu", i,
                     (unsigned long long)p.buffer_bytes[FSO_TIER_HOST], (unsigned long long)want);
    }
}

/* The engine as it runs (one tier per kind for every block): a host that
 * holds some kinds but not all keeps those and sends the rest to NVMe, and
 * the plan says why each kind sits where it does. */
static void test_kinds_get_tiers_of_their_own_and_reasons(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    char why[1024];
    /* 8 blocks of 4 MiB per kind (32 MiB each, 160 MiB in all); the device
     * holds no state (20 MiB: activations and buffers take 17), the host 90
     * MiB: two kinds and staging, not three */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(20 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(90 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    int on_host = 0, on_nvme = 0;
    for (int k = 0; k < FSO_N_KINDS; k++) {
        int t = fso_plan_main_tier(&p, k);
        assert_int_equal(count_tier(&p, k, t), 8); /* one tier per kind */
        on_host += t == FSO_TIER_HOST;
        on_nvme += t == FSO_TIER_NVME;
        assert_true(p.explained);
        assert_int_equal(p.why[k].tier, t);
        assert_false(p.why[k].pinned);
        assert_int_equal(p.why[k].alt_tier, t - 1);
        /* the next faster tier does not fit: which one, by how much */
        assert_false(p.why[k].alt_fits);
        assert_int_equal(p.why[k].short_tier, t - 1);
        assert_true(p.why[k].short_bytes > 0);
    }
    assert_int_equal(on_host, 2);
    assert_int_equal(on_nvme, 3);
    fso_plan_why(&p, why, sizeof why);
    assert_non_null(strstr(why, "on the host, host memory would be short by"));
    assert_non_null(strstr(why, "on the devices, device memory would be short by"));

    /* a pin is kept and said to be one */
    s.in.pins.tier[FSO_KIND_GRAD] = FSO_TIER_NVME;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_GRAD, FSO_TIER_NVME), 8);
    assert_true(p.why[FSO_KIND_GRAD].pinned);
    fso_plan_why(&p, why, sizeof why);
    assert_non_null(strstr(why, "gradients nvme (pinned by the configuration)"));
}

static void test_pins_are_kept(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    synth_model(&s, 6, 1 << 20, 1e9, true);
    s.in.pins.tier[FSO_KIND_PARAM] = FSO_TIER_NVME;
    s.in.pins.prefetch = 3;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_NVME), 6);
    assert_int_equal(count_tier(&p, FSO_KIND_MASTER, FSO_TIER_DEVICE), 6);
    assert_int_equal(p.pl.prefetch, 3);
}

/* The placements the search makes with per-block tiers are all state.h's
 * rule: over device and host memories from nothing to plenty, the resident
 * parameter blocks are the first of fso_residency_order, the blocks whose
 * state is on the device a run at one end, and fso_plan_apply takes each
 * into a configuration that gives the same tier block by block. */
static void test_per_block_plans_are_the_rule(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    fso_config cfg;
    char err[512];
    int order[8], resident_split = 0, state_split = 0;
    fso_residency_order(8, order);
    for (int dev = 18; dev <= 170; dev += 4)
        for (int host = 40; host <= 200; host += 80) {
            synth_model(&s, 8, 1 << 20, 1e9, true);
            s.in.engine.per_block_tiers = true;
            s.in.machine.device_mem_bytes = (uint64_t)(dev * MIB);
            s.in.machine.host_mem_bytes = (uint64_t)(host * MIB);
            if (fso_plan_choose(&s.in, &p) != 0)
                continue;
            const int r = count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE);
            if (r > 0 && r < 8) {
                resident_split++;
                for (int i = 0; i < 8; i++)
                    assert_int_equal(p.pl.tier[FSO_KIND_PARAM][order[i]] == FSO_TIER_DEVICE,
                                     i < r);
            }
            const int d = count_tier(&p, FSO_KIND_MASTER, FSO_TIER_DEVICE);
            state_split += d > 0 && d < 8;
            memset(&cfg, 0, sizeof cfg);
            snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "/tmp");
            if (fso_plan_apply(&p, &cfg, err, sizeof err) != 0)
                fail_msg("device %d MiB, host %d MiB: %s", dev, host, err);
            for (int b = 0; b < 8; b++)
                for (int k = 0; k < FSO_N_KINDS; k++)
                    assert_int_equal(fso_offload_block_tier(&cfg.offload, (fso_kind)k, b, 8),
                                     p.pl.tier[k][b]);
        }
    fprintf(stderr, "# %d plans with some parameter blocks resident, %d with some blocks' state "
                    "on the device\n", resident_split, state_split);
    assert_true(resident_split > 0);
    assert_true(state_split > 0);
}

/* The per-block counts a user wrote (train.resident_blocks,
 * device_state_blocks, device_state_from) are kept: the search fills only
 * what they leave. */
static void test_pinned_counts_are_kept(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    int order[8];
    fso_residency_order(8, order);
    /* generous memory would keep everything on the device */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.engine.per_block_tiers = true;
    s.in.pins.resident_blocks = 3;
    s.in.pins.device_state_blocks = 2;
    s.in.pins.device_state_first = 1;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(p.pl.tier[FSO_KIND_PARAM][order[i]], FSO_TIER_DEVICE);
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        if (count_tier(&p, k, FSO_TIER_DEVICE) < 8) /* a kind off the device: the run */
            for (int b = 0; b < 8; b++)
                assert_int_equal(p.pl.tier[k][b] == FSO_TIER_DEVICE, b < 2);
    assert_true(count_tier(&p, FSO_KIND_MASTER, FSO_TIER_DEVICE) < 8 ||
                count_tier(&p, FSO_KIND_GRAD, FSO_TIER_DEVICE) < 8);
    /* unpinned, the same machine keeps everything on the device */
    fso_plan_pins_none(&s.in.pins);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE), 8);
    /* tight memory: the pinned count stays, even where more would fit */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.engine.per_block_tiers = true;
    s.in.machine.device_mem_bytes = (uint64_t)(40 * MIB);
    s.in.pins.resident_blocks = 1;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE), 1);
    assert_int_equal(p.pl.tier[FSO_KIND_PARAM][0], FSO_TIER_DEVICE);
}

/* The device margin (train.device_margin; config.h's default on GPUs, none
 * on CPU devices) is left free: never planned into, and said in the table
 * and the JSON. */
static void test_device_margin_is_kept_free(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    /* 8 blocks of 4 MiB per kind: 160 MiB of state, 17 MiB of activations
     * and buffers; 180 MiB holds it all, less 10% does not */
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.engine.per_block_tiers = true;
    s.in.machine.device_mem_bytes = (uint64_t)(180 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.margin_bytes, 0);
    for (int k = 0; k < FSO_N_KINDS; k++)
        assert_int_equal(count_tier(&p, k, FSO_TIER_DEVICE), 8);
    s.in.machine.device_margin = 0.1;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.margin_bytes, (uint64_t)(18 * MIB));
    assert_int_equal(p.have_bytes[FSO_TIER_DEVICE], (uint64_t)(162 * MIB));
    assert_true(p.need_bytes[FSO_TIER_DEVICE] <= (uint64_t)(162 * MIB));
    int off = 0;
    for (int k = 0; k < FSO_N_KINDS; k++)
        off += 8 - count_tier(&p, k, FSO_TIER_DEVICE);
    assert_true(off > 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fso_plan_print(f, &p);
    fclose(f);
    if (!strstr(buf, "plan: device margin: 18.0 MiB of each device's 180.0 MiB kept free"))
        fail_msg("the table does not state the margin:\n%s", buf);
    free(buf);
    json_t *j = fso_plan_json(&p);
    json_t *dev = json_object_get(json_object_get(j, "tiers"), "device");
    assert_int_equal(json_integer_value(json_object_get(dev, "margin_bytes")), 18 * MIB);
    assert_int_equal(json_integer_value(json_object_get(dev, "capacity_bytes")), 162 * MIB);
    json_decref(j);

    /* from a configuration: GPUs default to FSO_DEVICE_MARGIN_GPU, CPU
     * devices to none; train.device_margin overrides both */
    fso_config cfg;
    fso_plan_ctx ctx;
    char err[256];
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_finish(&cfg), 0);
    fso_plan_machine m = {.devices = 1, .device_gflops = 10, .adam_gelems = 1};
    for (int gpu = 0; gpu < 2; gpu++) {
        assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, gpu, err, sizeof err), 0);
        assert_float_equal(ctx.in.machine.device_margin, gpu ? FSO_DEVICE_MARGIN_GPU : 0, 0);
        /* one engine on both: per-block tiers, fp32 gradients; whole-block
         * copies only on devices the CPU cannot address */
        assert_true(ctx.in.engine.per_block_tiers);
        assert_int_equal(ctx.in.engine.whole_copy, gpu);
        assert_int_equal(ctx.in.engine.rules.dtype[FSO_KIND_GRAD], FSO_DT_F32);
        fso_plan_ctx_free(&ctx);
    }
    fso_config_free(&cfg);
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_set(&cfg, "train.device_margin=0.2"), 0);
    assert_int_equal(fso_config_set(&cfg, "bf16.enabled=true"), 0);
    assert_int_equal(fso_config_set(&cfg, "train.gradient_dtype=\"bf16\""), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    for (int gpu = 0; gpu < 2; gpu++) {
        assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, gpu, err, sizeof err), 0);
        assert_float_equal(ctx.in.machine.device_margin, 0.2, 0);
        /* bf16 working parameters; the gradients the engine keeps in fp32,
         * reduced in bf16 on devices the CPU cannot address */
        assert_int_equal(ctx.in.engine.rules.dtype[FSO_KIND_PARAM], FSO_DT_BF16);
        assert_int_equal(ctx.in.engine.rules.dtype[FSO_KIND_GRAD], FSO_DT_F32);
        assert_true(ctx.in.engine.rules.bf16_grads);
        assert_int_equal(fso_fp_reduce_elem_bytes(&ctx.in.engine.rules), gpu ? 2 : 4);
        fso_plan_ctx_free(&ctx);
    }
    fso_config_free(&cfg);
}

static void test_shortfall_names_the_tier_and_the_bytes(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    char msg[512];
    /* 4 blocks of 1 Mi fp32 elements: 4 MiB per block and kind, 16 MiB per kind,
     * 80 MiB for all five kinds; no NVMe. The device (18 MiB) holds the
     * activations (1 MiB), the gather window (2 x 4 MiB) and the gradient
     * buffers (2 x 4 MiB) and no kind of state (+16 MiB); parameters resident
     * need no gather window but still 1 + 8 + 16 = 25 MiB: 7 MiB short. On the
     * host everything takes 80 MiB plus the staging of one shard each (4 MiB):
     * the stage slot and the two slots gradients land in on their way from
     * the devices = 92 MiB, against 88 MiB: 4 MiB short, the closest to
     * fitting. */
    synth_model(&s, 4, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(18 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(88 * MIB);
    s.in.machine.nvme_free_bytes = 0;
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    assert_false(p.fits);
    assert_int_equal(p.short_tier, FSO_TIER_HOST);
    assert_int_equal(p.need_bytes[FSO_TIER_HOST], (uint64_t)(92 * MIB));
    assert_int_equal(p.short_bytes, (uint64_t)(4 * MIB));
    fso_plan_shortfall_message(&p, NULL, false, msg, sizeof msg);
    assert_non_null(strstr(msg, "host memory"));
    assert_non_null(strstr(msg, "short by 4.0 MiB"));
    assert_non_null(strstr(msg, "--nvme"));

    /* activations alone over the device: the message says what to shrink */
    synth_model(&s, 4, 1 << 20, 1e9, true);
    s.in.model.activation_bytes = (uint64_t)(40 * MIB);
    s.in.machine.device_mem_bytes = (uint64_t)(20 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    assert_int_equal(p.short_tier, FSO_TIER_DEVICE);
    fso_plan_shortfall_message(&p, NULL, false, msg, sizeof msg);
    assert_non_null(strstr(msg, "device memory"));
    assert_non_null(strstr(msg, "train_micro_batch_size_per_gpu"));

    /* NVMe pinned with too little space */
    synth_model(&s, 4, 1 << 20, 1e9, true);
    s.in.machine.nvme_free_bytes = (uint64_t)(10 * MIB);
    for (int k = 0; k < FSO_N_KINDS; k++)
        s.in.pins.tier[k] = FSO_TIER_NVME;
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    assert_int_equal(p.short_tier, FSO_TIER_NVME);
    assert_int_equal(p.short_bytes, (uint64_t)(70 * MIB));
    fso_plan_shortfall_message(&p, &s.in.pins, false, msg, sizeof msg);
    assert_non_null(strstr(msg, "NVMe"));
    assert_non_null(strstr(msg, "--auto"));
    /* fsoff train's words: its own options, and the keys that pin */
    fso_plan_shortfall_message(&p, &s.in.pins, true, msg, sizeof msg);
    assert_null(strstr(msg, "--auto"));
    assert_null(strstr(msg, "--nvme-free"));
    assert_non_null(strstr(msg, "leave zero_optimization's offload devices out"));
    synth_model(&s, 4, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(18 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(88 * MIB);
    s.in.machine.nvme_free_bytes = 0;
    s.in.pins.tier[FSO_KIND_MASTER] = FSO_TIER_HOST;
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    fso_plan_shortfall_message(&p, &s.in.pins, true, msg, sizeof msg);
    assert_non_null(strstr(msg, "host memory"));
    assert_null(strstr(msg, "--host-mem"));
    assert_non_null(strstr(msg, "leave zero_optimization.offload_optimizer.device out"));
}

/* A kind split over tiers is explained as one account with its placement:
 * how many blocks sit on the faster tier and why not all; the search says
 * what it counted; a plan that fits nowhere names every short tier and a
 * fix sized by planning again (here: the NVMe space that makes it fit). */
static void test_split_reasons_search_words_and_sized_fixes(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    char why[1024], msg[2048], desc[512];
    synth_model(&s, 8, 1 << 20, 1e9, true);
    gpu_engine(&s);
    s.in.machine.device_mem_bytes = (uint64_t)(30 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    const int on_dev = count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE);
    assert_true(on_dev > 0 && on_dev < 8);
    fso_plan_describe(&p, desc, sizeof desc);
    fso_plan_why(&p, why, sizeof why);
    char want[128];
    snprintf(want, sizeof want, "parameters device + host (%d of 8 blocks on the devices; all 8 "
             "there, device memory would be short by ", on_dev);
    if (!strstr(why, want) || strstr(why, "parameters device (fits)"))
        fail_msg("placement %s, but why: %s", desc, why);
    assert_true(p.search.fit > 0 && p.search.considered >= p.search.fit);
    fso_plan_search_words(&s.in, &p, msg, sizeof msg);
    if (!strstr(msg, "blocks kept on the devices") || !strstr(msg, "fit, the fastest taken"))
        fail_msg("search words: %s", msg);

    /* nothing fits: host and NVMe both short; the fix names the NVMe space
     * that makes it fit, which a plan with that much then finds */
    synth_model(&s, 4, 1 << 20, 1e9, true);
    s.in.machine.device_mem_bytes = (uint64_t)(18 * MIB);
    s.in.machine.host_mem_bytes = (uint64_t)(40 * MIB);
    s.in.machine.nvme_free_bytes = (uint64_t)(20 * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    assert_int_equal(p.search.fit, 0);
    assert_true(p.search.short_on[FSO_TIER_HOST] > 0 && p.search.short_on[FSO_TIER_NVME] > 0);
    fso_plan_search_words(&s.in, &p, msg, sizeof msg);
    if (!strstr(msg, "none fits:") || !strstr(msg, "short of host memory (by "))
        fail_msg("search words: %s", msg);
    const fso_plan_origin o = {.train = true, .nvme_dirs = "/x"};
    fso_plan_nofit_message(&s.in, &p, &o, msg, sizeof msg);
    unsigned long mib = 0;
    const char *free_at = strstr(msg, ": free ");
    if (!free_at || sscanf(free_at, ": free %lu", &mib) != 1 || !strstr(msg, "on /x, or add a "
        "folder (--nvme /x,DIR)") || strstr(msg, "add NVMe folders"))
        fail_msg("no sized NVMe fix: %s", msg);
    s.in.machine.nvme_free_bytes += (uint64_t)((mib + 1) * MIB);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
}

/* Models the planner cannot lay out (more blocks than it takes, byte
 * counts past 64 bits) are sized by arithmetic before it runs: each tier's
 * need against what it holds, in the options of the command asking. */
static void expect_size_error(const fso_config *cfg, const fso_plan_pins *pins,
                              const fso_plan_machine *m, bool train, const char *const *want)
{
    char err[1024];
    assert_int_equal(fso_plan_check_size(cfg, pins, m, false, train, err, sizeof err), -ENOSPC);
    for (int i = 0; want[i]; i++)
        if (!strstr(err, want[i]))
            fail_msg("lacks \"%s\": %s", want[i], err);
    if (train && strstr(err, "--nvme-free"))
        fail_msg("fsoff train has no --nvme-free: %s", err);
}

static void test_sizes_beyond_the_planner_are_checked_by_arithmetic(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan_pins pins;
    char err[1024];
    const fso_plan_machine m = {.devices = 1, .device_mem_bytes = (uint64_t)16 << 30,
                                .host_mem_bytes = (uint64_t)64 << 30};
    fso_config_defaults(&cfg);
    fso_plan_pins_none(&pins);
    /* what the planner takes: the planner decides */
    assert_int_equal(fso_plan_check_size(&cfg, &pins, &m, false, true, err, sizeof err), 0);
    /* 2000 small layers: more than the planner takes, and they fit */
    cfg.model.num_hidden_layers = 2000;
    assert_int_equal(fso_plan_check_size(&cfg, &pins, &m, false, true, err, sizeof err), 0);
    /* a million layers of width 8192: every tier and the state, in TiB */
    cfg.model.num_hidden_layers = 1000000;
    cfg.model.hidden_size = 8192;
    cfg.model.intermediate_size = 28672;
    cfg.model.num_attention_heads = 64;
    cfg.model.num_key_value_heads = 8;
    cfg.model.head_dim = 128;
    static const char *const big[] = {"each device needs 30.52 TiB (activations and buffers) "
                                      "and holds 16.00 GiB", "the host needs ",
                                      "and 64.00 GiB is available", "NVMe needs 0 KiB",
                                      "the training state, ", " TiB (parameters ",
                                      "short by ", "--nvme DIR", NULL};
    expect_size_error(&cfg, &pins, &m, true, big);
    expect_size_error(&cfg, &pins, &m, false, big);
    /* a pinned tier's share is named */
    pins.tier[FSO_KIND_MASTER] = pins.tier[FSO_KIND_M] = pins.tier[FSO_KIND_V] = FSO_TIER_HOST;
    pins.tier[FSO_KIND_GRAD] = FSO_TIER_HOST;
    static const char *const pinned[] = {"state pinned there", "is not pinned to a tier", NULL};
    expect_size_error(&cfg, &pins, &m, true, pinned);
    /* 2^30 wide: byte counts past 64 bits are not wrapped around */
    fso_plan_pins_none(&pins);
    cfg.model.num_hidden_layers = 4;
    cfg.model.hidden_size = cfg.model.intermediate_size = cfg.model.vocab_size = 1 << 30;
    cfg.model.num_attention_heads = cfg.model.num_key_value_heads = 1 << 20;
    cfg.model.head_dim = 1 << 10;
    static const char *const overflow[] = {"each device needs more than 16777216 TiB",
                                           "short by more than 16777216 TiB", NULL};
    expect_size_error(&cfg, &pins, &m, true, overflow);
}

/* ------------------------------------------------------------------ timeline */

/* Five blocks visited once each (forward only), parameters on NVMe, W = 1,
 * separate streams (a GPU). Per block: NVMe read 2 ms, copy to the device
 * 1 ms; compute 30 ms for block 0 and 1 ms for the others. Two gather
 * buffers: the copy of block k waits for block k-2's compute. The update
 * runs on the device and writes back in no time (rates set huge).
 *
 * The read of visit k may start once the copy of visit k - depth - 1 is done
 * (the first depth + 1 reads at the start). One NVMe queue.
 *
 * depth 1:
 *   read0 [0,2]  read1 [2,4]  (both at the start)
 *   copy0 [2,3]  compute0 [3,33]
 *   read2 after copy0 (3), queue free at 4: [4,6]
 *   copy1 [4,5]  read3 after copy1 (5), queue free at 6: [6,8]
 *   copy2 waits compute0 (buffer): [33,34]; read4 after copy2: [34,36]
 *   compute1 [33,34]  copy3 waits compute1: [34,35]  compute2 [34,35]
 *   compute3 [35,36]  copy4 waits read4 (36): [36,37]  compute4 [37,38]
 *   step = 38 ms
 * depth 2: read4 may start after copy1 (5): [8,10]; copy4 waits compute2 (35):
 *   [35,36]  compute4 [36,37]  step = 37 ms
 * depth 0: each read waits for the previous copy:
 *   read0 [0,2] copy0 [2,3] compute0 [3,33]; read1 [3,5] copy1 [5,6]; read2 [6,8];
 *   copy2 waits compute0: [33,34]; read3 after copy2: [34,36]; compute1 [33,34];
 *   compute2 [34,35]; copy3 [36,37]; read4 after copy3: [37,39]; compute3 [37,38];
 *   copy4 [39,40]; compute4 [40,41]   step = 41 ms */
static void test_timeline_prefetch_depth_hand_computed(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    fso_placement pl;
    const uint64_t E = 1 << 20; /* 1 Mi elements, bf16: 2 MiB per shard */
    synth_model(&s, 5, E, 1e9, false);
    gpu_engine(&s);
    s.in.engine.rules.dtype[FSO_KIND_PARAM] = s.in.engine.rules.dtype[FSO_KIND_GRAD] = FSO_DT_BF16;
    s.visits[0].flops = 30e9;
    fso_plan_machine *m = &s.in.machine;
    m->device_gflops = 1000;                       /* 1e9 FLOPs per ms */
    m->nvme_read_gbps = 2.0 * E / 2e6;             /* 2 MiB in 2 ms */
    m->h2d_gbps = 2.0 * E / 1e6;                   /* 2 MiB in 1 ms */
    m->d2h_gbps = m->nvme_write_gbps = 1e12;
    m->device_adam_gelems = 1e12;
    const double want[3] = {41, 38, 37};
    for (int depth = 0; depth <= 2; depth++) {
        fso_placement_uniform(&pl, 5, FSO_TIER_NVME, FSO_TIER_DEVICE, FSO_TIER_DEVICE, depth);
        assert_int_equal(fso_plan_evaluate(&s.in, &pl, &p), 0);
        assert_true(fabs(p.step_ms - want[depth]) < 1e-3);
        assert_true(fabs(p.busy_ms[FSO_STREAM_NVME_READ] - 10) < 1e-3);
        assert_true(fabs(p.busy_ms[FSO_STREAM_H2D] - 5) < 1e-3);
        assert_true(fabs(p.busy_ms[FSO_STREAM_COMPUTE] - 34) < 1e-3);
    }
    /* depth 0: compute waits 41 - 34 = 7 ms; the path runs through reads too */
    fso_placement_uniform(&pl, 5, FSO_TIER_NVME, FSO_TIER_DEVICE, FSO_TIER_DEVICE, 0);
    fso_plan_evaluate(&s.in, &pl, &p);
    assert_true(fabs(p.stall_ms - 7) < 1e-3);
    assert_true(p.critical_ms[FSO_STREAM_NVME_READ] > 0);
}

/* A CPU device: copies, compute and the (serialized) optimizer share one
 * thread, so the step is their sum: three blocks on the host tier, copy 1 ms,
 * compute 5 ms, AdamW 2 ms each: 3 x (1 + 5 + 2) = 24 ms. */
static void test_timeline_cpu_device_is_a_sum(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    fso_placement pl;
    const uint64_t E = 1 << 20;
    synth_model(&s, 3, E, 5e9, false);
    fso_plan_machine *m = &s.in.machine;
    m->cpu_devices = true;
    m->device_gflops = 1000;
    m->h2d_gbps = 4.0 * E / 1e6;        /* 4 MiB in 1 ms */
    m->adam_gelems = (double)E / 2e6;   /* 1 Mi elements in 2 ms */
    m->host_copy_gbps = 1e12;
    fso_placement_uniform(&pl, 3, FSO_TIER_HOST, FSO_TIER_HOST, FSO_TIER_HOST, 2);
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &p), 0);
    assert_true(fabs(p.step_ms - 24) < 1e-3);
    assert_true(fabs(p.stall_ms) < 1e-3);
}

/* One drive does one thing at a time: the optimizer's reads and writes of
 * state on NVMe, at equal rates, take their sum, not the longer of the two
 * (compute, copies and AdamW made negligible). */
static void test_timeline_nvme_reads_and_writes_share_the_drive(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    fso_placement pl;
    const uint64_t E = 1 << 20;
    synth_model(&s, 4, E, 1, true);
    fso_plan_machine *m = &s.in.machine;
    m->device_gflops = 1e12;
    m->h2d_gbps = m->d2h_gbps = m->host_copy_gbps = m->coll_gbps = 1e12;
    m->adam_gelems = m->device_adam_gelems = 1e12;
    m->nvme_read_gbps = m->nvme_write_gbps = 4.0 * E / 1e6; /* a block of one kind in 1 ms */
    fso_placement_uniform(&pl, 4, FSO_TIER_DEVICE, FSO_TIER_NVME, FSO_TIER_DEVICE, 0);
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &p), 0);
    const double rd = p.busy_ms[FSO_STREAM_NVME_READ], wr = p.busy_ms[FSO_STREAM_NVME_WRITE];
    assert_true(rd > 4 && wr > 4); /* master, m, v of 4 blocks, each way */
    assert_true(p.step_ms >= rd + wr - 1e-6);
}

/* Writes complete at the rate a cache in front of the drive takes them;
 * the drive drains them at its own (planner.h nvme_drain_gbps): a step that
 * writes more than the drain rate moves in its time lasts its writes at
 * that rate, one that writes less is as fast as with no drain bound. */
static void test_timeline_nvme_writes_drain_at_the_flushed_rate(void **state)
{
    (void)state;
    synth s;
    fso_plan fast, drained, slow;
    fso_placement pl;
    const uint64_t E = 1 << 20;
    synth_model(&s, 4, E, 1, true);
    fso_plan_machine *m = &s.in.machine;
    m->device_gflops = 1e12;
    m->h2d_gbps = m->d2h_gbps = m->host_copy_gbps = m->coll_gbps = 1e12;
    m->adam_gelems = m->device_adam_gelems = 1e12;
    m->nvme_read_gbps = m->nvme_write_gbps = 4.0 * E / 1e6; /* a block of one kind in 1 ms */
    fso_placement_uniform(&pl, 4, FSO_TIER_DEVICE, FSO_TIER_NVME, FSO_TIER_DEVICE, 0);
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &fast), 0);
    const double written = 3 * 4 * 4.0 * E; /* master, m, v of 4 blocks, fp32 */
    /* a drain 4x slower than the burst: the step lasts the writes at it */
    m->nvme_drain_gbps = m->nvme_write_gbps / 4;
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &drained), 0);
    assert_true(fabs(drained.step_ms - written / (m->nvme_drain_gbps * 1e6)) < 1e-6);
    assert_true(drained.step_ms > fast.step_ms * 1.5);
    assert_int_equal(drained.bottleneck, FSO_STREAM_NVME_WRITE);
    assert_true(fabs(drained.busy_ms[FSO_STREAM_NVME_WRITE] -
                     fast.busy_ms[FSO_STREAM_NVME_WRITE]) < 1e-9);
    /* writing at the drain rate throughout is slower still than the bound */
    m->nvme_write_gbps = m->nvme_drain_gbps;
    m->nvme_drain_gbps = 0;
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &slow), 0);
    assert_true(slow.step_ms > drained.step_ms);
    /* a drain faster than the step's writes need: no change */
    m->nvme_write_gbps = m->nvme_read_gbps;
    m->nvme_drain_gbps = m->nvme_write_gbps / 1.1;
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &drained), 0);
    assert_true(fabs(drained.step_ms - fast.step_ms) < 1e-9);
}

/* An NVMe transfer costs the host's cores time (planner.h
 * nvme_*_cpu_s_per_gb): on CPU devices, whose one lane is already a sum,
 * the step grows by that work, bytes moved x cost, less the waits for reads
 * it fills, and the work is the devices' (compute); on GPUs it is the CPU optimizer's, and the
 * devices' compute is unchanged. */
static void test_timeline_nvme_costs_the_cores(void **state)
{
    (void)state;
    synth s;
    fso_plan free_io, taxed;
    fso_placement pl;
    const uint64_t E = 1 << 20;
    for (int cpu = 1; cpu >= 0; cpu--) {
        synth_model(&s, 3, E, 5e9, true);
        fso_plan_machine *m = &s.in.machine;
        m->cpu_devices = cpu;
        m->device_gflops = 1000;
        m->h2d_gbps = m->d2h_gbps = m->host_copy_gbps = m->coll_gbps = 1e3;
        m->adam_gelems = m->device_adam_gelems = 1e3;
        m->nvme_read_gbps = m->nvme_write_gbps = 40; /* quick: the devices' lane bounds */
        fso_placement_uniform(&pl, 3, FSO_TIER_HOST, FSO_TIER_NVME, FSO_TIER_HOST, 2);
        assert_int_equal(fso_plan_evaluate(&s.in, &pl, &free_io), 0);
        m->nvme_read_cpu_s_per_gb = 0.1;
        m->nvme_write_cpu_s_per_gb = 0.25;
        assert_int_equal(fso_plan_evaluate(&s.in, &pl, &taxed), 0);
        /* master, m, v of 3 blocks read and written per step: 36 MiB each way */
        const double rd = free_io.busy_ms[FSO_STREAM_NVME_READ];
        const double wr = free_io.busy_ms[FSO_STREAM_NVME_WRITE];
        assert_true(fabs(rd - 3 * 3 * 4.0 * E / 40e6) < 1e-6);
        const double work = rd * 40 * 0.1 + wr * 40 * 0.25; /* ms x GB/s x s/GB = ms */
        const int lane = cpu ? FSO_STREAM_COMPUTE : FSO_STREAM_OPTIM;
        assert_true(fabs(taxed.busy_ms[lane] - free_io.busy_ms[lane] - work) < 1e-6);
        if (cpu) /* less what it did while the device waited for a read anyway */
            assert_true(fabs(taxed.step_ms - free_io.step_ms -
                             (work - (free_io.stall_ms - taxed.stall_ms))) < 1e-6 &&
                        free_io.stall_ms > taxed.stall_ms && taxed.step_ms > free_io.step_ms);
        else
            assert_true(fabs(taxed.busy_ms[FSO_STREAM_COMPUTE] -
                             free_io.busy_ms[FSO_STREAM_COMPUTE]) < 1e-9);
        assert_true(fabs(taxed.busy_ms[FSO_STREAM_NVME_READ] - rd) < 1e-9);
    }
}

static void test_replan_when_off_by_more_than_20_percent(void **state)
{
    (void)state;
    synth s;
    fso_plan p, q;
    fso_plan_machine corrected;
    char msg[512];
    synth_model(&s, 6, 1 << 20, 1e9, true);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    fso_plan_measured close = {.step_ms = p.step_ms * 1.1, .stall_ms = -1, .optimizer_ms = -1,
                               .compute_ms = -1};
    assert_int_equal(fso_plan_replan(&s.in, &p, &close, &q, &corrected, msg, sizeof msg), 0);
    assert_int_equal(msg[0], 0);
    assert_true(fabs(q.step_ms - p.step_ms) < 1e-9);

    fso_plan_measured slow = close;
    slow.step_ms = p.step_ms * 2;
    assert_int_equal(fso_plan_replan(&s.in, &p, &slow, &q, &corrected, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "predicted"));
    assert_true(corrected.device_gflops < s.in.machine.device_gflops);
    assert_true(fabs(q.step_ms / slow.step_ms - 1) < 0.2); /* the corrected plan agrees */

    fso_plan_measured bad = {.step_ms = 0};
    assert_int_equal(fso_plan_replan(&s.in, &p, &bad, &q, NULL, msg, sizeof msg), -EINVAL);
}

/* NVMe assumed fast: no prefetch needed. Measured slow: the re-plan reads
 * ahead, and the revision says the change costs nothing to make. */
static void test_replan_reads_ahead_when_nvme_is_slower(void **state)
{
    (void)state;
    synth s;
    fso_plan p, q, truth;
    fso_plan_machine corrected;
    char msg[512];
    synth_model(&s, 6, 1 << 20, 20e9, true);
    s.in.pins.tier[FSO_KIND_PARAM] = FSO_TIER_NVME;
    s.in.machine.nvme_read_gbps = 1000;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.pl.prefetch, 0);

    synth real = s;
    real.in.model.block_elems = real.elems;
    real.in.model.visits = real.visits;
    real.in.machine.nvme_read_gbps = 2;
    assert_int_equal(fso_plan_evaluate(&real.in, &p.pl, &truth), 0);
    fso_plan_measured meas = {.step_ms = truth.step_ms, .stall_ms = truth.stall_ms,
                              .optimizer_ms = -1, .compute_ms = -1,
                              .nvme_read_gbps = 2, .nvme_write_gbps = -1};
    assert_true(meas.step_ms > 1.2 * p.step_ms);
    assert_int_equal(fso_plan_replan(&s.in, &p, &meas, &q, &corrected, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "NVMe reads ran at 2.00 GB/s"));
    assert_true(q.pl.prefetch > 0);
    assert_true(q.step_ms < 0.95 * meas.step_ms);

    fso_plan_move mv;
    assert_true(fso_plan_revision(&p, &q, meas.step_ms, 10, &mv));
    assert_true(mv.changes);
    assert_int_equal(mv.bytes, 0); /* only the depth changes */
    assert_true(mv.saving_ms > 0);
    assert_false(fso_plan_revision(&p, &p, meas.step_ms, 10, &mv)); /* nothing to change */
    assert_false(mv.changes);
}

/* Measured per-block compute corrects each block's visits: one block that
 * computes four times slower than its FLOPs say moves the prediction to the
 * measured step, with the compute stream's time as it really is. */
static void test_replan_from_per_block_timings(void **state)
{
    (void)state;
    synth s;
    fso_plan p, q, truth;
    char msg[512];
    synth_model(&s, 6, 1 << 20, 20e9, true);
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    /* the truth: block 2's visits cost 4x */
    synth real = s;
    real.in.model.block_elems = real.elems;
    real.in.model.visits = real.visits;
    double blocks[6] = {0};
    for (int k = 0; k < real.in.model.n_visits; k++) {
        if (real.visits[k].block == 2)
            real.visits[k].flops *= 4;
        blocks[real.visits[k].block] +=
            real.visits[k].flops / (real.in.machine.device_gflops * 1e6);
    }
    assert_int_equal(fso_plan_evaluate(&real.in, &p.pl, &truth), 0);
    fso_plan_measured meas = {.step_ms = truth.step_ms, .stall_ms = -1, .optimizer_ms = -1,
                              .compute_ms = -1, .nvme_read_gbps = -1, .nvme_write_gbps = -1,
                              .block_compute_ms = blocks, .n_blocks = 6};
    assert_true(meas.step_ms > 1.2 * p.step_ms);
    assert_int_equal(fso_plan_replan(&s.in, &p, &meas, &q, NULL, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "compute took"));
    assert_true(fabs(q.step_ms / truth.step_ms - 1) < 0.02);
    /* the compute stream (the visits, and the update on the device) as in truth */
    assert_true(fabs(q.busy_ms[FSO_STREAM_COMPUTE] / truth.busy_ms[FSO_STREAM_COMPUTE] - 1) < 1e-6);
    /* the input's visits are left as they were */
    for (int k = 0; k < s.in.model.n_visits; k++)
        assert_true(s.visits[k].flops == (k < 6 ? 20e9 : 40e9));
}

/* Moving state costs its bytes at the slower tier's rate, and pays only
 * when enough steps are left. */
static void test_revision_weighs_the_move_against_the_steps_left(void **state)
{
    (void)state;
    synth s;
    fso_plan a, b;
    synth_model(&s, 8, 1 << 20, 1e9, true);
    s.in.machine.nvme_read_gbps = 1;
    s.in.machine.nvme_write_gbps = 1;
    fso_placement pl;
    fso_placement_uniform(&pl, 8, FSO_TIER_DEVICE, FSO_TIER_NVME, FSO_TIER_NVME, 0);
    fso_plan_evaluate(&s.in, &pl, &a);
    fso_placement_uniform(&pl, 8, FSO_TIER_DEVICE, FSO_TIER_HOST, FSO_TIER_HOST, 0);
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &b), 0);
    assert_true(b.step_ms < a.step_ms);
    fso_plan_move mv;
    /* master, m, v and gradients: 4 kinds x 8 blocks x 4 MiB leave NVMe at 1 GB/s */
    fso_plan_revision(&a, &b, a.step_ms, 1, &mv);
    assert_true(mv.changes);
    assert_int_equal(mv.bytes, (uint64_t)(4 * 8 * 4 * MIB));
    assert_true(mv.move_ms >= mv.bytes / 1e6);
    bool pays_now = mv.saving_ms * 1 > mv.move_ms;
    assert_int_equal(mv.pays, pays_now);
    int64_t enough = (int64_t)(mv.move_ms / mv.saving_ms) + 1;
    assert_true(fso_plan_revision(&a, &b, a.step_ms, enough, &mv));
    assert_false(fso_plan_revision(&a, &b, a.step_ms, 0, &mv));
}

/* ------------------------------------------------------------------ engine/plan.c */

static void tiny_config(fso_config *cfg)
{
    fso_config_defaults(cfg);
    assert_int_equal(fso_config_finish(cfg), 0);
}

static void test_plan_inputs_follow_the_model(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan_ctx ctx;
    char err[256];
    tiny_config(&cfg);
    fso_plan_machine m = {.devices = 2, .cpu_devices = true, .device_gflops = 10,
                          .adam_gelems = 1};
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    const int L = cfg.model.num_hidden_layers;
    assert_int_equal(ctx.in.model.n_blocks, L + 2);
    /* tied head: embedding, layers, head (lent with the embedding, then its
     * gradients), layers backward, embedding */
    assert_int_equal(ctx.in.model.n_visits, 2 * L + 5);
    fso_block_layout bl[16];
    fso_model_layout(bl, &cfg.model, 2);
    uint64_t n = 0;
    for (int b = 0; b < L + 2; b++) {
        assert_int_equal(ctx.block_elems[b], bl[b].padded_elems);
        for (int t = 0; t < bl[b].n_tensors; t++)
            n += bl[b].tensors[t].numel;
    }
    assert_int_equal(ctx.n_params, n);
    /* the visits' FLOPs add up to fso_model_flops_per_token x 4 (forward,
     * recomputation, backward) x tokens */
    double f = 0, want = 4 * fso_model_flops_per_token(&cfg.model, cfg.data.seq_len) *
                             cfg.micro_batch * cfg.data.seq_len;
    for (int k = 0; k < ctx.in.model.n_visits; k++)
        f += ctx.visits[k].flops;
    /* the head is run forward and backward once (3x), not recomputed */
    double head = 2.0 * cfg.micro_batch * cfg.data.seq_len * cfg.model.hidden_size *
                  cfg.model.vocab_size;
    assert_true(fabs(f - (want - head)) / want < 1e-9);
    assert_int_equal(ctx.in.model.activation_bytes,
                     fso_model_activation_bytes_for(&cfg.model, cfg.micro_batch,
                                                    cfg.data.seq_len, true, cfg.bf16));
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
}

/* CPU devices whose update overlaps compute run one optimizer thread each
 * (the update shares their cores), and the plan rates the update at those
 * threads; serialized, or on GPUs, the device's share of the threads. */
static void test_update_rated_at_the_optimizers_threads(void **state)
{
    (void)state;
    fso_config cfg;
    tiny_config(&cfg);
    cfg.threads = 8;
    cfg.world = 2;
    const fso_probe p = {.threads = 8, .adam_gelems = 8, .gflops = 100, .h2d_gbps = 10,
                         .d2h_gbps = 10, .host_copy_gbps = 10, .coll_gbps = 10};
    const struct {
        fso_backend_kind backend;
        fso_overlap overlap;
        int threads;
        double gelems; /* the plan's, all devices' */
    } cases[] = {
        {FSO_BACKEND_CPU, FSO_OVERLAP_FORWARD, 1, 2},
        {FSO_BACKEND_CPU, FSO_OVERLAP_BACKWARD, 1, 2},
        {FSO_BACKEND_CPU_ASYNC, FSO_OVERLAP_FORWARD, 1, 2},
        {FSO_BACKEND_CPU, FSO_OVERLAP_NONE, 4, 8},
        {FSO_BACKEND_CUDA, FSO_OVERLAP_FORWARD, 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cfg.backend = cases[i].backend;
        cfg.optimizer_overlap = cases[i].overlap;
        assert_int_equal(fso_zero_optimizer_threads(&cfg), cases[i].threads);
        if (cases[i].gelems == 0)
            continue; /* GPUs are planned from their own table */
        fso_plan_machine m;
        fso_plan_machine_cpu(&cfg, &p, (uint64_t)8 << 30, &m);
        assert_true(fabs(m.adam_gelems - cases[i].gelems) < 1e-9);
    }
    /* fewer threads than devices: one each */
    cfg.threads = 1;
    cfg.backend = FSO_BACKEND_CPU;
    cfg.optimizer_overlap = FSO_OVERLAP_NONE;
    assert_int_equal(fso_zero_optimizer_threads(&cfg), 1);
    fso_config_free(&cfg);
}

static void test_plan_apply_and_pins_from_config(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan p;
    fso_plan_pins pins;
    char err[256];
    tiny_config(&cfg);
    memset(&p, 0, sizeof p);
    p.machine.devices = 1;
    fso_placement_uniform(&p.pl, 6, FSO_TIER_HOST, FSO_TIER_NVME, FSO_TIER_NVME, 4);
    /* NVMe without a folder */
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "--nvme"));
    snprintf(cfg.offload.optim_nvme_path, sizeof cfg.offload.optim_nvme_path, "/mnt/x");
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.offload.param_tier, FSO_TIER_HOST);
    assert_int_equal(cfg.offload.optim_tier, FSO_TIER_NVME);
    assert_int_equal(cfg.offload.prefetch_blocks, 4);
    assert_int_equal(cfg.offload.resident_blocks, -1);
    assert_int_equal(cfg.offload.device_state_blocks, -1);
    /* per-block placements go into the rule's counts (state.h): block 0,
     * the first of the residency order, resident; the last two blocks'
     * state and gradients on the device */
    p.pl.tier[FSO_KIND_PARAM][0] = FSO_TIER_DEVICE;
    for (int b = 4; b < 6; b++)
        for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
            p.pl.tier[k][b] = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.offload.resident_blocks, 1);
    assert_int_equal(cfg.offload.device_state_blocks, 2);
    assert_false(cfg.offload.device_state_first);
    assert_int_equal(cfg.offload.param_tier, FSO_TIER_HOST);
    assert_int_equal(cfg.offload.optim_tier, FSO_TIER_NVME);
    for (int b = 0; b < 6; b++)
        for (int k = 0; k < FSO_N_KINDS; k++)
            assert_int_equal(fso_offload_block_tier(&cfg.offload, (fso_kind)k, b, 6),
                             p.pl.tier[k][b]);
    /* the same from block 0 up */
    fso_placement_uniform(&p.pl, 6, FSO_TIER_HOST, FSO_TIER_NVME, FSO_TIER_NVME, 4);
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        p.pl.tier[k][0] = p.pl.tier[k][1] = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.offload.resident_blocks, -1);
    assert_int_equal(cfg.offload.device_state_blocks, 2);
    assert_true(cfg.offload.device_state_first);
    assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_V, 1, 6), FSO_TIER_DEVICE);
    assert_int_equal(fso_offload_block_tier(&cfg.offload, FSO_KIND_V, 2, 6), FSO_TIER_NVME);
    /* resident blocks outside the residency order's prefix (block 2 comes
     * fifth of six): no configuration gives them, and the planner makes none:
     * an internal error */
    fso_placement_uniform(&p.pl, 6, FSO_TIER_HOST, FSO_TIER_NVME, FSO_TIER_NVME, 4);
    p.pl.tier[FSO_KIND_PARAM][2] = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), -ENOTSUP);
    if (!strstr(err, "internal error") || !strstr(err, "block 0's parameters on host"))
        fail_msg("not named: %s", err);
    fso_placement_uniform(&p.pl, 6, FSO_TIER_HOST, FSO_TIER_NVME, FSO_TIER_NVME, 4);
    /* whole-block copies become train.whole_block_copies */
    for (int b = 0; b < 6; b++)
        p.pl.whole_copy[b] = true;
    p.machine.devices = 2;
    assert_false(cfg.offload.whole_copy);
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    assert_true(cfg.offload.whole_copy);
    fso_config_free(&cfg);

    /* pins: what the overrides set */
    fso_config_defaults(&cfg);
    const char *sets[] = {"zero_optimization.offload_param.device=\"cpu\"",
                          "train.prefetch_blocks=5"};
    for (int i = 0; i < 2; i++)
        assert_int_equal(fso_config_set(&cfg, sets[i]), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.tier[FSO_KIND_PARAM], FSO_TIER_HOST);
    assert_int_equal(pins.tier[FSO_KIND_MASTER], -1);
    assert_int_equal(pins.prefetch, 5);
    assert_int_equal(pins.resident_blocks, -1);
    assert_int_equal(pins.device_state_blocks, -1);
    assert_int_equal(pins.device_state_first, -1);
    fso_config_free(&cfg);

    /* pins: the per-block counts the user wrote */
    fso_config_defaults(&cfg);
    const char *counts[] = {"train.resident_blocks=3", "train.device_state_blocks=2",
                            "train.device_state_from=\"first\""};
    for (int i = 0; i < 3; i++)
        assert_int_equal(fso_config_set(&cfg, counts[i]), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.resident_blocks, 3);
    assert_int_equal(pins.device_state_blocks, 2);
    assert_int_equal(pins.device_state_first, 1);
    assert_int_equal(pins.tier[FSO_KIND_PARAM], -1);
    fso_config_free(&cfg);

    /* pins: a section given whole (the key inside it is given, not its default) */
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_set(&cfg, "zero_optimization={\"offload_optimizer\": "
                                          "{\"device\": \"cpu\"}}"), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.tier[FSO_KIND_PARAM], -1);
    for (int k = FSO_KIND_MASTER; k < FSO_N_KINDS; k++)
        assert_int_equal(pins.tier[k], FSO_TIER_HOST);
    assert_int_equal(pins.prefetch, -1);
    fso_config_free(&cfg);

    /* pins: what the file sets (configs/llama-7b.json keeps both on NVMe) */
    char path[1024];
    const char *src = getenv("FSO_SRCDIR");
    snprintf(path, sizeof path, "%s/configs/llama-7b.json", src ? src : "..");
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_load_file(&cfg, path), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    for (int k = 0; k < FSO_N_KINDS; k++)
        assert_int_equal(pins.tier[k], FSO_TIER_NVME);
    assert_int_equal(cfg.model.hidden_size, 4096);
    fso_config_free(&cfg);
}

/* What the trainer calls: the plan for a loaded config on this machine
 * (probed into a private cache), printed, applied, and checked against a
 * measurement 50% slower. */
static void test_plan_for_this_machine_prints_and_applies(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan_pins pins;
    static fso_plan p, q;
    char err[512], msg[512], cache[1100];
    snprintf(cache, sizeof cache, "%s/cache-here", tmpdir);
    setenv("XDG_CACHE_HOME", cache, 1);
    tiny_config(&cfg);
    /* nothing fits: said from the capacities alone, before any probe */
    cfg.device_mem_bytes = 1u << 20;
    cfg.offload.optim_tier = FSO_TIER_DEVICE;
    fso_plan_pins_none(&pins);
    pins.tier[FSO_KIND_MASTER] = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_for_config(&cfg, &pins, &p, err, sizeof err), -ENOSPC);
    assert_non_null(strstr(err, "device memory"));
    char probe_file[1200];
    snprintf(probe_file, sizeof probe_file, "%s/fsoff/probe.json", cache);
    assert_int_equal(access(probe_file, F_OK), -1); /* not probed */
    tiny_config(&cfg);
    cfg.world = 2;
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(fso_plan_for_config(&cfg, &pins, &p, err, sizeof err), 0);
    assert_int_equal(access(probe_file, F_OK), 0);
    assert_true(p.fits && p.step_ms > 0 && p.machine.cpu_devices && p.machine.devices == 2);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fso_plan_print(f, &p);
    fso_plan_print_json(f, &p);
    fclose(f);
    assert_non_null(strstr(buf, "plan: placement:"));
    assert_non_null(strstr(buf, "\"predicted_step_ms\""));
    free(buf);
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    fso_plan_measured m = {.step_ms = p.step_ms * 1.5, .stall_ms = -1, .optimizer_ms = -1,
                           .compute_ms = -1, .nvme_read_gbps = -1, .nvme_write_gbps = -1};
    assert_int_equal(fso_plan_check(&cfg, &pins, &p, &m, &q, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "re-planned"));
    unsetenv("XDG_CACHE_HOME");
    fso_config_free(&cfg);
}

/* The gflops of the cache's only "layers" entry set to v, and its time
 * to when unless that is 0 (a doctored figure, to see whether the next
 * plan takes it from there). */
static void set_cached_layer(const char *path, double v, int64_t when)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *layers = json_object_get(root, "layers");
    assert_int_equal(json_array_size(layers), 1);
    json_object_set_new(json_array_get(layers, 0), "gflops", json_real(v));
    if (when)
        json_object_set_new(json_array_get(layers, 0), "when", json_integer(when));
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
}

/* The one-layer timing on CPU devices is kept in the probe cache per
 * machine and shape, and read from there until --probe (refresh); an entry
 * out of range is timed again, and so is a quick one that another process
 * took (a slow one is read). */
static void test_layer_timing_is_cached(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan_ctx ctx;
    char err[256], cache[1100], path[1200];
    snprintf(cache, sizeof cache, "%s/cache-layers", tmpdir);
    snprintf(path, sizeof path, "%s/fsoff/probe.json", cache);
    setenv("XDG_CACHE_HOME", cache, 1);
    tiny_config(&cfg);
    fso_plan_machine m = {.devices = 2, .cpu_devices = true, .device_gflops = 10,
                          .adam_gelems = 1};
    const double doctored[] = {1234.5, -1.0};
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    assert_true(ctx.in.machine.device_gflops > 0 && ctx.in.machine.device_gflops < 1234.5);
    set_cached_layer(path, doctored[0], 0);
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    assert_float_equal(ctx.in.machine.device_gflops, doctored[0], 1e-9);
    /* the same figure from before this process began: a quick timing, taken again */
    set_cached_layer(path, doctored[0], 1000);
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    assert_true(ctx.in.machine.device_gflops > 0 && ctx.in.machine.device_gflops < 1234.5);
    /* a rate that makes the timing take over a second: kept, whoever took it */
    set_cached_layer(path, 1e-3, 1000);
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    assert_float_equal(ctx.in.machine.device_gflops, 1e-3, 1e-12);
    /* the head's visit at that rate takes the time measured for it */
    for (int k = 0; k < ctx.in.model.n_visits; k++)
        if (ctx.visit_part[k] == FSO_PART_LAYER_FWD)
            assert_float_equal(ctx.visits[k].flops, ctx.true_flops[k], 0);
    /* refresh: timed again, and the cache rewritten */
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, true, err, sizeof err), 0);
    assert_true(ctx.in.machine.device_gflops < doctored[0]);
    set_cached_layer(path, doctored[1], 0); /* out of range: not taken */
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    assert_true(ctx.in.machine.device_gflops > 0 && ctx.in.machine.device_gflops < 1234.5);
    /* another shape is timed on its own: a second entry */
    fso_plan_ctx_free(&ctx);
    cfg.model.intermediate_size += 64;
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(fso_plan_calibrate_cpu(&ctx, &cfg, false, err, sizeof err), 0);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_int_equal(json_array_size(json_object_get(root, "layers")), 2);
    /* both devices were timed side by side, and the entry says so */
    const char *key =
        json_string_value(json_object_get(json_array_get(json_object_get(root, "layers"), 0), "key"));
    assert_non_null(key);
    assert_non_null(strstr(key, ": 2 devices of "));
    json_decref(root);
    unsetenv("XDG_CACHE_HOME");
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
}

/* fsoff train's plan on CUDA GPUs, without them: the table entry found by
 * the driver's device name (else the nearest memory), each GPU's free
 * memory less the default margin, and the engine as it runs (per-block
 * tiers by state.h's rule, gathers, fp32 gradients), so whatever it
 * chooses can be applied. */
static void test_plan_for_gpus_here_runs_on_the_engine(void **state)
{
    (void)state;
    fso_config cfg;
    fso_plan_pins pins;
    static fso_plan p, q;
    const fso_gpu_spec *spec = NULL;
    char err[512], msg[512], cache[1100], path[1024];
    snprintf(cache, sizeof cache, "%s/cache-here", tmpdir);
    setenv("XDG_CACHE_HOME", cache, 1);

    assert_string_equal(fso_gpu_spec_for_device("NVIDIA H200", 0)->name, "h200");
    assert_string_equal(fso_gpu_spec_for_device("NVIDIA GeForce RTX 4090", 0)->name, "4090");
    assert_string_equal(fso_gpu_spec_for_device("Some GPU", (uint64_t)(46 * GIB))->name, "l40s");

    tiny_config(&cfg);
    cfg.world = 2;
    /* the GPUs' memory, whatever cfg's backend says and the host holds */
    fso_plan_machine caps;
    fso_plan_capacities_here(&cfg, true, (uint64_t)(139 * GIB), &caps);
    assert_int_equal(caps.device_mem_bytes, (uint64_t)(139 * GIB));
    assert_int_equal(caps.devices, 2);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(fso_plan_for_config_gpus(&cfg, &pins, "NVIDIA H200", (uint64_t)(139 * GIB),
                                              &p, &spec, err, sizeof err), 0);
    assert_string_equal(spec->name, "h200");
    assert_true(p.fits && !p.machine.cpu_devices && p.machine.devices == 2);
    assert_int_equal(count_tier(&p, FSO_KIND_PARAM, FSO_TIER_DEVICE), p.pl.n_blocks);
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    fso_plan_measured m = {.step_ms = p.step_ms * 3, .stall_ms = -1, .optimizer_ms = -1,
                           .compute_ms = -1, .nvme_read_gbps = -1, .nvme_write_gbps = -1};
    assert_int_equal(fso_plan_check(&cfg, &pins, &p, &m, &q, msg, sizeof msg), 1);
    assert_int_equal(fso_plan_apply(&q, &cfg, err, sizeof err), 0);
    fso_config_free(&cfg);

    /* small.json on GPUs too small for all of its state: whatever is chosen
     * is the rule's (resident parameters a prefix of the residency order,
     * device state a run at one end), copies no block whole and keeps fp32
     * gradients, so it applies and the configuration reproduces it */
    const char *src = getenv("FSO_SRCDIR");
    snprintf(path, sizeof path, "%s/configs/small.json", src ? src : "..");
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_load_file(&cfg, path), 0);
    assert_int_equal(fso_config_finish(&cfg), 0);
    cfg.world = 1;
    fso_plan_pins_none(&pins);
    bool offloaded = false, split = false;
    /* 2 GiB of each GPU are the runtime's; then activations, buffers, state */
    for (uint64_t mib = 2176; mib <= 4096; mib += 64) {
        if (fso_plan_for_config_gpus(&cfg, &pins, "NVIDIA GeForce RTX 4090", mib << 20, &p, &spec,
                                     err, sizeof err) != 0) {
            assert_non_null(strstr(err, "short by"));
            continue;
        }
        assert_int_equal(p.margin_bytes, (uint64_t)((double)(mib << 20) * FSO_DEVICE_MARGIN_GPU));
        assert_true(p.need_bytes[FSO_TIER_DEVICE] <= (mib << 20) - p.margin_bytes);
        assert_int_equal(p.rules.dtype[FSO_KIND_GRAD], FSO_DT_F32);
        assert_int_equal(p.rules.dtype[FSO_KIND_PARAM], cfg.bf16 ? FSO_DT_BF16 : FSO_DT_F32);
        for (int k = 0; k < FSO_N_KINDS; k++) {
            const int on_dev = count_tier(&p, k, FSO_TIER_DEVICE);
            offloaded |= on_dev < p.pl.n_blocks;
            split |= on_dev > 0 && on_dev < p.pl.n_blocks;
        }
        for (int b = 0; b < p.pl.n_blocks; b++)
            assert_false(p.pl.whole_copy[b]);
        fso_config applied = cfg;
        if (fso_plan_apply(&p, &applied, err, sizeof err) != 0)
            fail_msg("%llu MiB: %s", (unsigned long long)mib, err);
        for (int b = 0; b < p.pl.n_blocks; b++)
            for (int k = 0; k < FSO_N_KINDS; k++)
                assert_int_equal(fso_offload_block_tier(&applied.offload, (fso_kind)k, b,
                                                        p.pl.n_blocks),
                                 p.pl.tier[k][b]);
    }
    assert_true(offloaded);
    assert_true(split);

    /* two GPUs on PCIe: whole-block copies of the streamed blocks as
     * train.whole_block_copies pins them, on or off; the search's own
     * choice copies whole from host memory only (from NVMe every GPU would
     * read every shard), and every plan applies */
    cfg.world = 2;
    bool whole_seen = false;
    for (int pin = -1; pin <= 1; pin++) {
        fso_plan_pins_none(&pins);
        pins.whole_copy = pin;
        for (uint64_t mib = 2304; mib <= 2560; mib += 16) { /* short, split, all there */
            if (fso_plan_for_config_gpus(&cfg, &pins, "NVIDIA GeForce RTX 4090", mib << 20, &p,
                                         &spec, err, sizeof err) != 0)
                continue;
            for (int b = 0; b < p.pl.n_blocks; b++) {
                const int pt = p.pl.tier[FSO_KIND_PARAM][b];
                if (pt == FSO_TIER_DEVICE)
                    continue;
                if (pin >= 0)
                    assert_int_equal(p.pl.whole_copy[b], pin);
                else if (p.pl.whole_copy[b])
                    assert_int_equal(pt, FSO_TIER_HOST);
                whole_seen |= p.pl.whole_copy[b];
            }
            fso_config applied = cfg;
            if (fso_plan_apply(&p, &applied, err, sizeof err) != 0)
                fail_msg("%llu MiB, pin %d: %s", (unsigned long long)mib, pin, err);
        }
    }
    assert_true(whole_seen);
    unsetenv("XDG_CACHE_HOME");
    fso_config_free(&cfg);
}

/* Run the fsoff binary; returns its exit status, stdout in out. */
static int run_fsoff(char *out, size_t len, const char *args)
{
    const char *bd = getenv("FSO_BUILDDIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s %s/fsoff plan %s 2>%s/stderr", tmpdir,
             bd ? bd : "..", args, tmpdir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_fsoff_plan_without_the_hardware(void **state)
{
    (void)state;
    static char out[1 << 16];
    char path[1024];
    const char *src = getenv("FSO_SRCDIR");
    snprintf(path, sizeof path, "%s/configs", src ? src : "..");
    char args[2048];
    /* 70B on 8 x H200, 2 TiB of host memory, four NVMe drives: every number given */
    snprintf(args, sizeof args,
             "--config %s/llama-70b.json --auto --gpus 8 --gpu h200 --host-mem 2T "
             "--nvme-free 12T --nvme-read 24 --nvme-write 16 --adam-gelems 4 --json", path);
    assert_int_equal(run_fsoff(out, sizeof out, args), 0);
    assert_non_null(strstr(out, "\"predicted_step_ms\""));
    assert_non_null(strstr(out, "\"bottleneck\""));
    assert_non_null(strstr(out, "\"bytes\""));
    /* the same with too little of everything: exit 1, the short tier named */
    snprintf(args, sizeof args,
             "--config %s/llama-70b.json --auto --gpus 2 --gpu 4090 --host-mem 64G "
             "--adam-gelems 4", path);
    assert_int_equal(run_fsoff(out, sizeof out, args), 1);
    /* bad usage: exit 2 */
    assert_int_equal(run_fsoff(out, sizeof out, "--gpus zero"), 2);
    assert_int_equal(run_fsoff(out, sizeof out, "--gpu v100 --gpus 1"), 2);
    assert_int_equal(run_fsoff(out, sizeof out, "--nvme-read"), 2);
}

/* ------------------------------------------------------------------ main */

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(tmpdir, sizeof tmpdir, "fsoff-planner");
}

static int teardown(void **state)
{
    (void)state;
    return remove_tree(tmpdir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generous_memory_keeps_everything_on_the_device),
        cmocka_unit_test(test_tight_device_memory_streams_parameters),
        cmocka_unit_test(test_small_host_sends_optimizer_state_to_nvme),
        cmocka_unit_test(test_landing_slots_only_where_gradients_land),
        cmocka_unit_test(test_host_room_takes_the_first_blocks_state),
        cmocka_unit_test(test_kinds_get_tiers_of_their_own_and_reasons),
        cmocka_unit_test(test_pins_are_kept),
        cmocka_unit_test(test_per_block_plans_are_the_rule),
        cmocka_unit_test(test_pinned_counts_are_kept),
        cmocka_unit_test(test_device_margin_is_kept_free),
        cmocka_unit_test(test_shortfall_names_the_tier_and_the_bytes),
        cmocka_unit_test(test_split_reasons_search_words_and_sized_fixes),
        cmocka_unit_test(test_sizes_beyond_the_planner_are_checked_by_arithmetic),
        cmocka_unit_test(test_timeline_prefetch_depth_hand_computed),
        cmocka_unit_test(test_timeline_cpu_device_is_a_sum),
        cmocka_unit_test(test_timeline_nvme_reads_and_writes_share_the_drive),
        cmocka_unit_test(test_timeline_nvme_writes_drain_at_the_flushed_rate),
        cmocka_unit_test(test_timeline_nvme_costs_the_cores),
        cmocka_unit_test(test_replan_when_off_by_more_than_20_percent),
        cmocka_unit_test(test_replan_reads_ahead_when_nvme_is_slower),
        cmocka_unit_test(test_replan_from_per_block_timings),
        cmocka_unit_test(test_revision_weighs_the_move_against_the_steps_left),
        cmocka_unit_test(test_plan_inputs_follow_the_model),
        cmocka_unit_test(test_update_rated_at_the_optimizers_threads),
        cmocka_unit_test(test_plan_apply_and_pins_from_config),
        cmocka_unit_test(test_plan_for_this_machine_prints_and_applies),
        cmocka_unit_test(test_layer_timing_is_cached),
        cmocka_unit_test(test_plan_for_gpus_here_runs_on_the_engine),
        cmocka_unit_test(test_fsoff_plan_without_the_hardware),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
