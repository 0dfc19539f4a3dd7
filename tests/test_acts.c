/* test_acts.c — the layer inputs kept for backward on the host tier
 * (train.activations "host", model.h fso_model_opts.acts):
 *
 *  - training with them on the host gives the bits of the device tier, fp32
 *    and bf16-kept, on 1 and 2 devices, on the CPU backend and under a
 *    discrete GPU's rules (cpu-async runs copies and compute ahead as far as
 *    the marks allow, so a missing order shows as other bits);
 *  - at a device cap that holds the run only with them on the host, the
 *    device tier is refused before training and the host tier trains to the
 *    uncapped run's bits (CPU devices: cpu and cpu-async);
 *  - a step moves exactly the bytes the arithmetic says: each input that
 *    leaves the ring, down and up, each micro-batch of each device; none on
 *    the device tier;
 *  - the keys: train.activations, DeepSpeed's activation_checkpointing
 *    section (cpu_checkpointing; its other keys understood and ignored),
 *    their agreement, and the host tier refused without checkpointing;
 *  - the planner: the host tier when only it fits, the device when the
 *    copies would cost time, a pin kept, each with its why; the copies'
 *    busy time on the timeline is the bytes over the link; plan.c's inputs
 *    are model.h's sizes, the pins and the applied plan the config's.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "cpu_async.h"
#include "cuda/cuda_backend.h"
#include "data.h"
#include "model.h"
#include "plan.h"
#include "planner.h"
#include "test_util.h"
#include "train.h"
#include "zero/zero.h"

#define LAYERS 6 /* inputs 0..6: 5 leave a ring of 2 */

static void acts_job(fso_config *cfg, int world, bool bf16, fso_tier acts)
{
    fso_test_small_model(cfg, world, 4);
    cfg->model.num_hidden_layers = LAYERS;
    cfg->bf16 = bf16;
    cfg->activation_checkpointing = true;
    cfg->activations = acts;
}

/* Host and device tiers, fp32 and bf16, 1 and 2 devices, on `backend`. */
static void tiers_agree_on(const char *backend)
{
    for (int world = 1; world <= 2; world++)
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            fso_config cfg;
            run_result dev, host;
            char what[128];
            snprintf(what, sizeof what, "%s, %d device%s, %s: activations on the host", backend,
                     world, world == 1 ? "" : "s", bf16 ? "bf16" : "fp32");
            acts_job(&cfg, world, bf16, FSO_TIER_DEVICE);
            cfg.backend = fso_backend_find(backend)->kind;
            run_ok(&cfg, NULL, &dev);
            cfg.activations = FSO_TIER_HOST;
            run_ok(&cfg, NULL, &host);
            assert_bit_identical(&dev, &host, 1, what);
            assert_int_equal(host.dev.stale_marks, 0);
            result_free(&dev);
            result_free(&host);
        }
}

static void test_host_tier_gives_the_device_bits_on_cpu(void **s)
{
    (void)s;
    tiers_agree_on("cpu");
}

static void test_host_tier_gives_the_device_bits_under_gpu_rules(void **s)
{
    (void)s;
    tiers_agree_on(fso_test_gpu_rules());
}

/* The cap between the host tier's device need and the device tier's: the
 * device tier is refused, naming the fix, and the host tier trains to the
 * bits of the uncapped device run. */
static void cap_fits_only_on_host(const char *backend, bool bf16)
{
    fso_config cfg;
    fso_zero_need on_dev, on_host;
    acts_job(&cfg, 1, bf16, FSO_TIER_DEVICE);
    cfg.backend = fso_backend_find(backend)->kind;
    fso_zero_need_for(&cfg, &on_dev);
    cfg.activations = FSO_TIER_HOST;
    fso_zero_need_for(&cfg, &on_host);
    const uint64_t dn = on_dev.tier[FSO_TIER_DEVICE], hn = on_host.tier[FSO_TIER_DEVICE];
    const size_t kb = (size_t)cfg.micro_batch * cfg.data.seq_len * cfg.model.hidden_size *
                      (bf16 ? 2 : 4);
    /* the ring of 2 in place of the L+1 inputs, each rounded to 64 bytes */
    assert_int_equal(dn - hn, (LAYERS + 1 - FSO_ACT_RING) * ((kb + 63) / 64 * 64));
    assert_int_equal(on_host.act_host, (LAYERS + 1 - FSO_ACT_RING) * kb);
    assert_int_equal(on_dev.act_host, 0);

    /* host memory short: the activations named, and the fix */
    char err[1024];
    assert_int_equal(fso_zero_check_host(&cfg, &on_host, on_host.tier[FSO_TIER_HOST] - 1, err,
                                         sizeof err),
                     -ENOMEM);
    assert_non_null(strstr(err, "the activations' "));
    assert_non_null(strstr(err, "train.activations \"device\""));

    run_result base, capped, refused;
    cfg.activations = FSO_TIER_DEVICE;
    run_ok(&cfg, NULL, &base); /* the small job's cap, 256 MiB: everything fits */
    cfg.device_mem_bytes = hn + (dn - hn) / 2;
    run(&cfg, NULL, &refused);
    if (refused.rc != -ENOMEM)
        fail_msg("%s: the device tier at a cap %llu under its need %llu: rc %d (%s)", backend,
                 (unsigned long long)cfg.device_mem_bytes, (unsigned long long)dn, refused.rc,
                 refused.err);
    assert_non_null(strstr(refused.err, "device memory"));
    assert_non_null(strstr(refused.err, "train.activations \"host\""));
    cfg.activations = FSO_TIER_HOST;
    run(&cfg, NULL, &capped);
    char what[96];
    snprintf(what, sizeof what, "%s, %s, activations on the host at a %llu-byte cap", backend,
             bf16 ? "bf16" : "fp32", (unsigned long long)cfg.device_mem_bytes);
    assert_bit_identical(&base, &capped, 1, what);
    assert_true(capped.peak_device <= cfg.device_mem_bytes);
    result_free(&base);
    result_free(&capped);
    result_free(&refused);
}

static void test_a_cap_that_fits_only_host_activations(void **s)
{
    (void)s;
    cap_fits_only_on_host("cpu", false);
    cap_fits_only_on_host("cpu", true);
    /* cpu-async, not the GPU-rules backend: a GPU's runtime holds memory
     * outside what the engine counts, so no cap lies exactly between */
    cap_fits_only_on_host("cpu-async", false);
    cap_fits_only_on_host("cpu-async", true);
}

/* Each step's act_bytes: every device's micro-batches each copy the inputs
 * that leave the ring down and up again, (L+1-2) x N x C x element bytes
 * x 2 each; 0 on the device tier. Checked against the arithmetic written
 * out here, and against fso_model_act_bytes_per_step. */
static void step_bytes(int world, bool bf16, fso_tier acts, const char *backend)
{
    fso_config cfg;
    fso_data data = {0};
    fso_trainer tr;
    acts_job(&cfg, world, bf16, acts);
    cfg.backend = fso_backend_find(backend)->kind;
    assert_int_equal(fso_data_init(&data, &cfg), 0);
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("trainer: %s", tr.err);
    const size_t bt = (size_t)cfg.micro_batch * cfg.data.seq_len, n = fso_trainer_step_tokens(&cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    assert_non_null(in);
    assert_non_null(tg);
    const uint64_t per_input = (uint64_t)bt * cfg.model.hidden_size * (bf16 ? 2 : 4);
    const uint64_t want = acts == FSO_TIER_HOST ? (uint64_t)world * cfg.grad_accum *
                                                      (LAYERS + 1 - FSO_ACT_RING) * per_input * 2
                                                : 0;
    assert_int_equal(want, (uint64_t)world * cfg.grad_accum *
                               fso_model_act_bytes_per_step(&cfg.model, cfg.micro_batch,
                                                            cfg.data.seq_len, true, bf16, acts));
    for (int s = 0; s < 2; s++) {
        for (size_t a = 0; a < n / bt; a++)
            fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
        fso_zero_step st;
        if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
            fail_msg("step %d: %s", s + 1, tr.err);
        if (st.act_bytes != want)
            fail_msg("%s, %d devices, %s, tier %d, step %d: act_bytes %llu, want %llu", backend,
                     world, bf16 ? "bf16" : "fp32", acts, s + 1,
                     (unsigned long long)st.act_bytes, (unsigned long long)want);
    }
    free(in);
    free(tg);
    fso_trainer_free(&tr);
    fso_data_free(&data);
}

static void test_step_act_bytes_are_the_arithmetic(void **s)
{
    (void)s;
    step_bytes(1, false, FSO_TIER_HOST, "cpu");
    step_bytes(2, false, FSO_TIER_HOST, "cpu");
    step_bytes(1, true, FSO_TIER_HOST, "cpu");
    step_bytes(2, true, FSO_TIER_HOST, fso_test_gpu_rules());
    step_bytes(2, false, FSO_TIER_DEVICE, "cpu");
}

/* The model refuses the host tier without checkpointing, and without the
 * host buffer it needs, naming the fix; with it, it allocates on the device
 * what fso_model_activation_bytes_tier says. */
static void test_model_host_tier_init(void **s)
{
    (void)s;
    fso_config cfg;
    acts_job(&cfg, 1, false, FSO_TIER_HOST);
    fso_backend *be = NULL;
    char err[256];
    assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU, 0, 1, 0, err, sizeof err), 0);
    fso_model m;
    fso_model_opts o = {.checkpointing = false, .acts = FSO_TIER_HOST};
    assert_int_equal(fso_model_init_opts(&m, &cfg.model, be, 2, 32, 1, &o), -EINVAL);
    assert_non_null(strstr(m.err, "activation_checkpointing"));
    o.checkpointing = true;
    assert_int_equal(fso_model_init_opts(&m, &cfg.model, be, 2, 32, 1, &o), -EINVAL);
    assert_non_null(strstr(m.err, "host buffer"));
    /* with its host buffer: the device holds what the arithmetic says */
    const size_t hb = fso_model_host_act_bytes_for(&cfg.model, 2, 32, true, false, FSO_TIER_HOST);
    assert_int_equal(hb, (size_t)(LAYERS + 1 - FSO_ACT_RING) * 2 * 32 * cfg.model.hidden_size * 4);
    o.host_acts = malloc(hb);
    assert_non_null(o.host_acts);
    assert_int_equal(fso_model_init_opts(&m, &cfg.model, be, 2, 32, 1, &o), 0);
    assert_int_equal(fso_model_activation_bytes(&m),
                     fso_model_activation_bytes_tier(&cfg.model, 2, 32, true, false,
                                                     FSO_TIER_HOST));
    assert_int_equal(m.n_host, LAYERS + 1 - FSO_ACT_RING);
    fso_model_free(&m);
    free(o.host_acts);
    assert_false(fso_model_acts_tier_ok(FSO_TIER_NVME, true));
    assert_true(fso_model_acts_tier_ok(FSO_TIER_HOST, true));
    assert_false(fso_model_acts_tier_ok(FSO_TIER_HOST, false));
    fso_backend_destroy(be);
}

/* Loads the built-in defaults with `sets` over them: the return code, the
 * message in cfg->err. */
static int load(fso_config *cfg, const char *a, const char *b, const char *c)
{
    char *sets[3];
    int n = 0;
    if (a)
        sets[n++] = (char *)a;
    if (b)
        sets[n++] = (char *)b;
    if (c)
        sets[n++] = (char *)c;
    fso_config_defaults(cfg);
    int rc = fso_config_load_all(cfg, NULL, sets, n);
    fso_config_free(cfg);
    return rc;
}

static void test_activation_keys(void **s)
{
    (void)s;
    fso_config cfg;
    const char *on = "train.activation_checkpointing=true";
    assert_int_equal(load(&cfg, on, NULL, NULL), 0);
    assert_int_equal(cfg.activations, -1);
    assert_int_equal(fso_config_acts_tier(&cfg), FSO_TIER_DEVICE);
    assert_false(fso_config_acts_pinned(&cfg));

    assert_int_equal(load(&cfg, on, "train.activations=host", NULL), 0);
    assert_int_equal(fso_config_acts_tier(&cfg), FSO_TIER_HOST);
    assert_true(fso_config_acts_pinned(&cfg));
    assert_int_equal(load(&cfg, on, "train.activations=device", NULL), 0);
    assert_int_equal(cfg.activations, FSO_TIER_DEVICE);
    assert_true(fso_config_acts_pinned(&cfg));

    /* DeepSpeed's section: cpu_checkpointing true is the host, false the device */
    assert_int_equal(load(&cfg, on, "activation_checkpointing.cpu_checkpointing=true", NULL), 0);
    assert_int_equal(cfg.activations, FSO_TIER_HOST);
    assert_true(fso_config_acts_pinned(&cfg));
    assert_int_equal(load(&cfg, on, "activation_checkpointing.cpu_checkpointing=false", NULL), 0);
    assert_int_equal(cfg.activations, FSO_TIER_DEVICE);
    /* its other keys are understood and ignored */
    assert_int_equal(load(&cfg, on, "activation_checkpointing.partition_activations=true",
                          "activation_checkpointing.number_checkpoints=4"),
                     0);
    assert_int_equal(cfg.activations, -1);
    /* both given must agree */
    assert_int_equal(load(&cfg, on, "train.activations=device",
                          "activation_checkpointing.cpu_checkpointing=true"),
                     -EINVAL);
    assert_non_null(strstr(cfg.err, "cpu_checkpointing"));
    assert_int_equal(load(&cfg, on, "train.activations=host",
                          "activation_checkpointing.cpu_checkpointing=true"),
                     0);
    /* the host takes checkpointed inputs only */
    assert_int_equal(load(&cfg, "train.activation_checkpointing=false", "train.activations=host",
                          NULL),
                     -EINVAL);
    assert_non_null(strstr(cfg.err, "train.activation_checkpointing true"));
    assert_int_equal(load(&cfg, "train.activation_checkpointing=false",
                          "activation_checkpointing.cpu_checkpointing=true", NULL),
                     -EINVAL);
    assert_non_null(strstr(cfg.err, "cpu_checkpointing"));
    /* unknown spellings and keys */
    assert_int_equal(load(&cfg, on, "train.activations=nvme", NULL), -EINVAL);
    assert_non_null(strstr(cfg.err, "\"host\""));
    assert_int_equal(load(&cfg, on, "activation_checkpointing.cpu_offload=true", NULL), -EINVAL);
}

/* ------------------------------------------------------------------ planner */

#define MIB ((uint64_t)1 << 20)
#define PL_LAYERS 6

/* A synthetic model for the planner: an embedding, PL_LAYERS layers and a
 * head of 1 Mi fp32 elements each, visited as model.h's order with the
 * kept inputs marked; activations 16 MiB on the device, 4 MiB with the
 * inputs on the host (a ring of 2 of 2 MiB inputs); a GPU's engine. */
typedef struct synth {
    fso_plan_input in;
    uint64_t elems[PL_LAYERS + 2];
    fso_plan_visit visits[2 * PL_LAYERS + 3];
} synth;

static void synth_model(synth *s)
{
    memset(s, 0, sizeof *s);
    const int L = PL_LAYERS, nb = L + 2;
    int n = 0;
    for (int b = 0; b < nb; b++)
        s->elems[b] = (uint64_t)1 << 20;
    s->visits[n++] = (fso_plan_visit){.block = 0, .flops = 1e9, .params = true, .act_write = 1};
    for (int l = 0; l < L; l++)
        s->visits[n++] =
            (fso_plan_visit){.block = 1 + l, .flops = 4e9, .params = true, .act_write = l + 2};
    s->visits[n++] = (fso_plan_visit){.block = L + 1, .flops = 3e9, .params = true,
                                      .grads = true, .act_read = L + 1};
    for (int l = L - 1; l >= 0; l--)
        s->visits[n++] = (fso_plan_visit){.block = 1 + l, .flops = 12e9, .params = true,
                                          .grads = true, .act_read = l + 1};
    s->visits[n++] = (fso_plan_visit){.block = 0, .flops = 1e9, .grads = true};
    fso_plan_model *m = &s->in.model;
    m->n_blocks = nb;
    m->block_elems = s->elems;
    m->n_visits = n;
    m->visits = s->visits;
    m->grad_accum = 1;
    m->tokens_per_step = 1000;
    m->activation_bytes = 16 * MIB;
    m->act_kept_bytes = 2 * MIB;
    m->act_ring = 2;
    m->act_host_inputs = L + 1 - 2;
    m->act_host_device_bytes = 16 * MIB - (uint64_t)m->act_host_inputs * 2 * MIB;
    fso_plan_engine *en = &s->in.engine;
    for (int k = 0; k < FSO_N_KINDS; k++)
        en->rules.dtype[k] = FSO_DT_F32;
    en->per_block_tiers = true;
    en->opt_write_lag = 1;
    fso_plan_pins_none(&s->in.pins);
    fso_plan_machine *mc = &s->in.machine;
    mc->devices = 1;
    mc->device_mem_bytes = (uint64_t)64 << 30;
    mc->host_mem_bytes = (uint64_t)256 << 30;
    mc->h2d_gbps = mc->d2h_gbps = 20;
    mc->coll_gbps = 100;
    mc->device_gflops = 100e3;
    mc->adam_gelems = 2;
    mc->device_adam_gelems = 50;
    mc->host_copy_gbps = 10;
}

static void test_planner_places_the_activations(void **s_)
{
    (void)s_;
    synth s;
    fso_plan p;
    char why[1024];
    /* plenty of memory, slow links: the device, and the host named slower */
    synth_model(&s);
    s.in.machine.h2d_gbps = s.in.machine.d2h_gbps = 0.01;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.pl.acts, FSO_TIER_DEVICE);
    assert_int_equal(p.activation_bytes, 16 * MIB);
    assert_int_equal(p.act_host_bytes, 0);
    fso_plan_why(&p, why, sizeof why);
    if (!strstr(why, "activations device (on the host, "))
        fail_msg("why: %s", why);
    assert_non_null(strstr(why, "% slower)"));

    /* a device that the 16 MiB of activations overflow beside the gather window and
     * gradient buffers (16 MiB), whatever else moves:
     * the host, and the device named short */
    synth_model(&s);
    s.in.machine.device_mem_bytes = 28 * MIB;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.pl.acts, FSO_TIER_HOST);
    assert_int_equal(p.activation_bytes, 6 * MIB);
    assert_int_equal(p.act_host_bytes, 10 * MIB);
    assert_int_equal(p.act_copy_bytes, 10 * MIB);
    assert_true(p.need_bytes[FSO_TIER_DEVICE] <= 28 * MIB);
    fso_plan_why(&p, why, sizeof why);
    if (!strstr(why, "activations host (on the devices, device memory would be short by"))
        fail_msg("why: %s", why);

    /* pinned: kept, and said */
    synth_model(&s);
    s.in.pins.acts = FSO_TIER_HOST;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.pl.acts, FSO_TIER_HOST);
    fso_plan_why(&p, why, sizeof why);
    assert_non_null(strstr(why, "activations host (pinned by the configuration)"));
    s.in.pins.acts = FSO_TIER_DEVICE;
    s.in.machine.device_mem_bytes = 28 * MIB;
    assert_int_equal(fso_plan_choose(&s.in, &p), -ENOSPC);
    assert_int_equal(p.pl.acts, FSO_TIER_DEVICE);

    /* not offered (no checkpointing): the device, and nothing said */
    synth_model(&s);
    s.in.model.act_kept_bytes = 0;
    assert_int_equal(fso_plan_choose(&s.in, &p), 0);
    assert_int_equal(p.pl.acts, FSO_TIER_DEVICE);
    fso_plan_why(&p, why, sizeof why);
    assert_null(strstr(why, "activations"));
}

/* On the timeline each input that leaves the ring goes down once and up
 * once per micro-batch: the copy streams are busy its bytes over the link;
 * with links fast enough the step is the device tier's, with slow ones
 * longer. */
static void test_planner_times_the_activation_copies(void **s_)
{
    (void)s_;
    synth s;
    fso_plan dev, host;
    fso_placement pl;
    synth_model(&s);
    s.in.machine.h2d_gbps = s.in.machine.d2h_gbps = 1; /* 2 MiB in 2.097 ms */
    const double one = (double)(2 * MIB) / 1e6;
    fso_placement_uniform(&pl, PL_LAYERS + 2, FSO_TIER_DEVICE, FSO_TIER_DEVICE, FSO_TIER_DEVICE,
                          0);
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &dev), 0);
    pl.acts = FSO_TIER_HOST;
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &host), 0);
    assert_true(fabs(host.busy_ms[FSO_STREAM_D2H] - dev.busy_ms[FSO_STREAM_D2H] -
                     (PL_LAYERS - 1) * one) < 1e-6);
    assert_true(fabs(host.busy_ms[FSO_STREAM_H2D] - dev.busy_ms[FSO_STREAM_H2D] -
                     (PL_LAYERS - 1) * one) < 1e-6);
    /* each layer computes 0.04 ms forward and 0.12 backward, far less than a
     * copy: the copies set the pace */
    assert_true(host.step_ms > dev.step_ms + (PL_LAYERS - 1) * one);
    s.in.machine.h2d_gbps = s.in.machine.d2h_gbps = 1e9;
    assert_int_equal(fso_plan_evaluate(&s.in, &pl, &host), 0);
    assert_true(fabs(host.step_ms - dev.step_ms) < 1e-3);
}

/* plan.c: the inputs are model.h's sizes; train.activations pins; an
 * applied plan sets the tier the engine starts with. */
static void test_plan_inputs_pins_and_apply(void **s_)
{
    (void)s_;
    fso_config cfg;
    acts_job(&cfg, 1, true, -1);
    fso_plan_machine m = {.devices = 1, .device_mem_bytes = (uint64_t)1 << 30,
                          .host_mem_bytes = (uint64_t)8 << 30, .h2d_gbps = 10, .d2h_gbps = 10,
                          .coll_gbps = 10, .device_gflops = 100, .adam_gelems = 1,
                          .host_copy_gbps = 10};
    fso_plan_ctx ctx;
    char err[512];
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    const fso_plan_model *pm = &ctx.in.model;
    const int B = cfg.micro_batch, T = cfg.data.seq_len;
    assert_int_equal(pm->act_ring, FSO_ACT_RING);
    assert_int_equal(pm->act_host_inputs, LAYERS + 1 - FSO_ACT_RING);
    assert_int_equal(pm->act_kept_bytes * (uint64_t)pm->act_host_inputs,
                     fso_model_host_act_bytes_for(&cfg.model, B, T, true, true, FSO_TIER_HOST));
    assert_int_equal(pm->act_host_device_bytes,
                     fso_model_activation_bytes_tier(&cfg.model, B, T, true, true, FSO_TIER_HOST));
    int writes = 0, reads = 0;
    for (int k = 0; k < pm->n_visits; k++) {
        writes += pm->visits[k].act_write > 0;
        reads += pm->visits[k].act_read > 0;
    }
    assert_int_equal(writes, LAYERS + 1); /* the embedding and every layer */
    assert_int_equal(reads, LAYERS + 1);  /* the head and every layer's backward */
    fso_plan p;
    assert_int_equal(fso_plan_choose(&ctx.in, &p), 0);
    p.pl.acts = FSO_TIER_HOST;
    assert_int_equal(fso_plan_apply(&p, &cfg, err, sizeof err), 0);
    assert_int_equal(fso_config_acts_tier(&cfg), FSO_TIER_HOST);
    fso_plan_ctx_free(&ctx);
    cfg.activation_checkpointing = false; /* not offered */
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(ctx.in.model.act_kept_bytes, 0);
    fso_plan_ctx_free(&ctx);

    fso_plan_pins pins;
    char *host[] = {"train.activation_checkpointing=true", "train.activations=host"};
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_load_all(&cfg, NULL, host, 2), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.acts, FSO_TIER_HOST);
    fso_config_free(&cfg);
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_load_all(&cfg, NULL, host, 1), 0);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.acts, -1);
    fso_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_keys),
        cmocka_unit_test(test_model_host_tier_init),
        cmocka_unit_test(test_step_act_bytes_are_the_arithmetic),
        cmocka_unit_test(test_host_tier_gives_the_device_bits_on_cpu),
        cmocka_unit_test(test_host_tier_gives_the_device_bits_under_gpu_rules),
        cmocka_unit_test(test_a_cap_that_fits_only_host_activations),
        cmocka_unit_test(test_planner_places_the_activations),
        cmocka_unit_test(test_planner_times_the_activation_copies),
        cmocka_unit_test(test_plan_inputs_pins_and_apply),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
