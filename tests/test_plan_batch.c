/* test_plan_batch.c — the split of the global batch and where compute hides
 * the optimizer (plan.h fso_plan_batch_*), on machines described by numbers
 * (no probe, no timing):
 *
 *  - the chosen split divides the global batch, fits, and is never slower
 *    than the configured one; the global batch never changes;
 *  - memory decides: a device too small for a large micro-batch's
 *    activations takes a smaller one;
 *  - the configuration's pins hold at every split;
 *  - an optimizer-bound step gets a larger global batch at which the same
 *    placement hides the optimizer, the smallest such, and its tok/s;
 *  - where the exposed part is per micro-batch work (a GPU's gradients
 *    accumulated on the host), only a larger micro-batch hides it: the
 *    smallest, and when none fits, words that say why;
 *  - which keys free the split (--auto-batch, "auto") and which keep it.
 * The measured side (the optimizer's exposed time at the advised batch) is
 * tests/plan_batch_test.sh.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "plan.h"
#include "planner.h"

#define GIB ((uint64_t)1 << 30)

/* A configuration of the defaults' model with the given --set lines. */
static void config_with(fso_config *cfg, const char *const *sets, int n)
{
    fso_config_defaults(cfg);
    for (int i = 0; i < n; i++)
        assert_int_equal(fso_config_set(cfg, sets[i]), 0);
    assert_int_equal(fso_config_finish(cfg), 0);
}

/* CPU devices of ample memory; adam: the host's AdamW rate (Gelem/s). */
static fso_plan_machine machine(int devices, double adam)
{
    return (fso_plan_machine){.devices = devices, .cpu_devices = true,
                              .device_mem_bytes = 16 * GIB, .host_mem_bytes = 64 * GIB,
                              .h2d_gbps = 10, .d2h_gbps = 10, .coll_gbps = 10,
                              .device_gflops = 20, .adam_gelems = adam, .host_copy_gbps = 10};
}

/* The plan of cfg split as micro x accum on ctx's machine: fso_plan_choose's
 * return. */
static int plan_of(const fso_plan_ctx *ctx, const fso_config *cfg, int micro, int accum,
                   fso_plan *out)
{
    fso_plan_ctx c;
    char err[256];
    assert_int_equal(fso_plan_ctx_for_split(ctx, cfg, micro, accum, &c, err, sizeof err), 0);
    int rc = fso_plan_choose(&c.in, out);
    fso_plan_ctx_free(&c);
    return rc;
}

/* Give `key`, which cfg's file or --set gave, the origin "auto" (as the
 * configuration records a key written "auto"). */
static void make_auto(fso_config *cfg, const char *key)
{
    const fso_config_origin was = fso_config_origin_of(cfg, key);
    assert_int_not_equal(was, FSO_ORIGIN_DEFAULT);
    for (int i = 0; i < cfg->given.n; i++) {
        const uint8_t o = cfg->given.origin[i];
        cfg->given.origin[i] = FSO_ORIGIN_AUTO;
        if (fso_config_origin_of(cfg, key) == FSO_ORIGIN_AUTO)
            return; /* entry i is key's */
        cfg->given.origin[i] = o;
    }
    fail_msg("%s: no given entry", key);
}

static void test_split_divides_fits_and_is_never_slower(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"train_micro_batch_size_per_gpu=1", "gradient_accumulation_steps=8"},
        {"train_micro_batch_size_per_gpu=8", "gradient_accumulation_steps=1"},
        {"train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=6"},
    };
    for (int devices = 1; devices <= 2; devices++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            fso_config cfg;
            fso_plan_ctx ctx;
            fso_plan_batch b;
            fso_plan *p = malloc(sizeof *p);
            char err[256];
            assert_non_null(p);
            config_with(&cfg, cases[i], 2);
            const fso_plan_machine m = machine(devices, 0.5);
            assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
            assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
            const int64_t per = (int64_t)cfg.micro_batch * cfg.grad_accum;
            assert_int_equal(b.global_batch, per * devices);
            assert_int_equal((int64_t)b.micro * b.accum * devices, b.global_batch);
            assert_int_equal(per % b.micro, 0);
            assert_true(b.splits >= 2 && b.splits_fit == b.splits);
            assert_true(b.user_step_ms > 0 && b.step_ms > 0);
            assert_true(b.step_ms <= b.user_step_ms);
            /* the chosen split, planned alone, fits and predicts that step */
            assert_int_equal(plan_of(&ctx, &cfg, b.micro, b.accum, p), 0);
            assert_float_equal(p->step_ms, b.step_ms, 1e-9);
            /* and no split of the batch is faster by more than the tie band */
            for (int mb = 1; mb <= per; mb++)
                if (per % mb == 0 && plan_of(&ctx, &cfg, mb, (int)(per / mb), p) == 0)
                    assert_true(p->step_ms >= b.step_ms * (1 - 2 * FSO_PLAN_BATCH_TIE));
            /* taking it keeps the global batch */
            fso_config split = cfg;
            fso_plan_batch_apply(&b, &split);
            assert_int_equal((int64_t)split.micro_batch * split.grad_accum * devices,
                             b.global_batch);
            fso_plan_ctx_free(&ctx);
            fso_config_free(&cfg);
            free(p);
        }
}

/* A device whose memory holds the activations of a micro-batch of 2 but not
 * of 4, everything pinned to it: the split takes at most 2, and says the
 * others did not fit. */
static void test_memory_decides_the_micro_batch(void **state)
{
    (void)state;
    static const char *const sets[] = {"train_micro_batch_size_per_gpu=1",
                                       "gradient_accumulation_steps=8"};
    fso_config cfg;
    fso_plan_ctx ctx;
    fso_plan_batch b;
    fso_plan *p = malloc(sizeof *p);
    char err[256];
    assert_non_null(p);
    config_with(&cfg, sets, 2);
    fso_plan_machine m = machine(1, 0.5);
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    for (int k = 0; k < FSO_N_KINDS; k++)
        ctx.in.pins.tier[k] = FSO_TIER_DEVICE;
    assert_int_equal(plan_of(&ctx, &cfg, 2, 4, p), 0);
    const uint64_t need2 = p->need_bytes[FSO_TIER_DEVICE];
    assert_int_equal(plan_of(&ctx, &cfg, 4, 2, p), 0);
    const uint64_t need4 = p->need_bytes[FSO_TIER_DEVICE];
    assert_true(need4 > need2);
    fso_plan_ctx_free(&ctx);
    m.device_mem_bytes = need2 + (need4 - need2) / 2;
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    for (int k = 0; k < FSO_N_KINDS; k++)
        ctx.in.pins.tier[k] = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    assert_true(b.micro <= 2);
    assert_int_equal(b.micro * b.accum, 8);
    assert_int_equal(b.splits, 4);      /* 1, 2, 4, 8 */
    assert_int_equal(b.splits_fit, 2);  /* 1 and 2 */
    assert_int_equal(plan_of(&ctx, &cfg, b.micro, b.accum, p), 0);
    assert_int_equal(plan_of(&ctx, &cfg, 4, 2, p), -ENOSPC);
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    free(p);
}

/* Parameters pinned to the host stay there at every split. */
static void test_pins_hold_at_every_split(void **state)
{
    (void)state;
    static const char *const sets[] = {"train_micro_batch_size_per_gpu=1",
                                       "gradient_accumulation_steps=4",
                                       "zero_optimization.offload_param.device=cpu"};
    fso_config cfg;
    fso_plan_ctx ctx;
    fso_plan_batch b;
    fso_plan_pins pins;
    fso_plan *p = malloc(sizeof *p);
    char err[256];
    assert_non_null(p);
    config_with(&cfg, sets, 3);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.tier[FSO_KIND_PARAM], FSO_TIER_HOST);
    const fso_plan_machine m = machine(1, 0.5);
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    ctx.in.pins = pins;
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    for (int mb = 1; mb <= 4; mb *= 2) {
        assert_int_equal(plan_of(&ctx, &cfg, mb, 4 / mb, p), 0);
        for (int blk = 0; blk < p->pl.n_blocks; blk++)
            assert_int_equal(p->pl.tier[FSO_KIND_PARAM][blk], FSO_TIER_HOST);
    }
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    free(p);
}

/* A slow AdamW: the step is optimizer-bound; the advice is a larger global
 * batch of the same micro-batch and placement at which the optimizer's part
 * of the critical path is within FSO_PLAN_HIDDEN_SHARE of the step, and one
 * accumulation step less does not hide it. A fast AdamW: hidden already. */
static void test_hide_batch_is_the_smallest_that_hides(void **state)
{
    (void)state;
    static const char *const sets[] = {"train_micro_batch_size_per_gpu=1",
                                       "gradient_accumulation_steps=1", "data.seq_len=16"};
    fso_config cfg;
    fso_plan_ctx ctx, c;
    fso_plan_batch b;
    fso_plan *best = malloc(sizeof *best), *p = malloc(sizeof *p);
    char err[256], line[512];
    assert_non_null(best);
    assert_non_null(p);
    config_with(&cfg, sets, 3);
    fso_plan_machine m = machine(1, 0.002);
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    assert_true(b.optimizer_bound);
    assert_true(b.hide_batch > b.global_batch);
    assert_int_equal(b.hide_batch, (int64_t)b.hide_micro * b.hide_accum * m.devices);
    assert_int_equal(b.hide_micro, b.micro);
    assert_int_equal(plan_of(&ctx, &cfg, b.micro, b.accum, best), 0);
    /* the same placement at the advised accumulation hides it, one less not */
    assert_int_equal(fso_plan_ctx_for_split(&ctx, &cfg, b.hide_micro, b.hide_accum, &c, err,
                                            sizeof err), 0);
    assert_int_equal(fso_plan_evaluate(&c.in, &best->pl, p), 0);
    assert_true(fso_plan_optimizer_hidden(p));
    assert_float_equal(p->step_ms, b.hide_step_ms, 1e-9);
    assert_float_equal(b.hide_tokens_per_s,
                       (double)b.hide_batch * cfg.data.seq_len * 1e3 / b.hide_step_ms, 1e-6);
    fso_plan_ctx_free(&c);
    assert_int_equal(fso_plan_ctx_for_split(&ctx, &cfg, b.hide_micro, b.hide_accum - 1, &c, err,
                                            sizeof err), 0);
    assert_int_equal(fso_plan_evaluate(&c.in, &best->pl, p), 0);
    assert_false(fso_plan_optimizer_hidden(p));
    fso_plan_ctx_free(&c);
    /* one line, naming the batch */
    fso_plan_batch_hide_words(&b, line, sizeof line);
    char want[64];
    snprintf(want, sizeof want, "global batch of %lld sequences/step", (long long)b.hide_batch);
    assert_non_null(strstr(line, want));
    assert_non_null(strstr(line, "optimizer-bound"));
    assert_null(strchr(line, '\n'));
    fso_plan_ctx_free(&ctx);

    m = machine(1, 1000);
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    assert_false(b.optimizer_bound);
    assert_int_equal(b.hide_batch, b.global_batch);
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    free(best);
    free(p);
}

/* A GPU whose gradients live on the host: they are copied down and
 * accumulated there (the CPU's stream, as AdamW) every micro-batch, so
 * more accumulation adds as much of that as of compute and never hides it;
 * a larger micro-batch computes more per copy. The advice is that larger
 * micro-batch (planned whole: it fits), and it does hide the optimizer. */
static void test_only_a_larger_micro_batch_hides_per_micro_batch_work(void **state)
{
    (void)state;
    static const char *const sets[] = {"train_micro_batch_size_per_gpu=1",
                                       "gradient_accumulation_steps=1", "data.seq_len=16"};
    fso_config cfg;
    fso_plan_ctx ctx, c;
    fso_plan_batch b;
    fso_plan *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    char err[256], line[768];
    assert_non_null(p);
    assert_non_null(q);
    config_with(&cfg, sets, 3);
    fso_plan_machine m = machine(1, 0.1); /* hidden first at a micro-batch of 9 */
    m.cpu_devices = false;
    m.host_copy_gbps = 0.05;
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, true, err, sizeof err), 0);
    ctx.in.pins.tier[FSO_KIND_GRAD] = FSO_TIER_HOST;
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    assert_true(b.step_ms > 0);
    assert_true(b.hide_batch > b.global_batch);
    assert_true(b.hide_micro > b.micro);
    assert_int_equal(b.hide_batch, (int64_t)b.hide_micro * b.hide_accum * m.devices);
    /* the advised split, planned on its own, hides the optimizer */
    assert_int_equal(plan_of(&ctx, &cfg, b.hide_micro, b.hide_accum, p), 0);
    assert_true(fso_plan_optimizer_hidden(p));
    assert_float_equal(p->step_ms, b.hide_step_ms, 1e-9);
    assert_int_equal(b.hide_acts_host, p->pl.acts == FSO_TIER_HOST);
    /* the smallest: one sequence fewer, as a micro-batch of its own, does not
     * (none of the micro-batches doubled from the chosen one) */
    assert_int_equal(b.hide_accum, 1);
    assert_true(b.hide_micro & (b.hide_micro - 1));
    const int rc = plan_of(&ctx, &cfg, b.hide_micro - 1, 1, q);
    assert_true(rc == -ENOSPC || (rc == 0 && !fso_plan_optimizer_hidden(q)));
    /* the chosen micro-batch at the most accumulation searched does not */
    assert_int_equal(plan_of(&ctx, &cfg, b.micro, b.accum, p), 0);
    assert_int_equal(fso_plan_ctx_for_split(&ctx, &cfg, b.micro, b.hide_max_accum, &c, err,
                                            sizeof err), 0);
    assert_int_equal(fso_plan_evaluate(&c.in, &p->pl, q), 0);
    assert_false(fso_plan_optimizer_hidden(q));
    fso_plan_ctx_free(&c);
    fso_plan_batch_hide_words(&b, line, sizeof line);
    char want[96];
    snprintf(want, sizeof want, "(micro-batch %d x accumulation %d x 1 device)", b.hide_micro,
             b.hide_accum);
    assert_non_null(strstr(line, want));
    fso_plan_ctx_free(&ctx);

    /* a device too small for any larger micro-batch: nothing hides it, and
     * the words say why (the per-micro-batch gradients) and what stopped */
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, true, err, sizeof err), 0);
    for (int k = 0; k < FSO_N_KINDS; k++)
        ctx.in.pins.tier[k] = k == FSO_KIND_GRAD ? FSO_TIER_HOST : FSO_TIER_DEVICE;
    ctx.in.pins.acts = FSO_TIER_DEVICE;
    assert_int_equal(plan_of(&ctx, &cfg, 1, 1, p), 0);
    const uint64_t need1 = p->need_bytes[FSO_TIER_DEVICE];
    assert_int_equal(plan_of(&ctx, &cfg, 2, 1, p), 0);
    const uint64_t need2 = p->need_bytes[FSO_TIER_DEVICE];
    const double margin = ctx.in.machine.device_margin; /* a GPU's, kept free */
    fso_plan_ctx_free(&ctx);
    assert_true(need2 > need1);
    m.device_mem_bytes = (uint64_t)((double)(need1 + (need2 - need1) / 2) / (1 - margin));
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, true, err, sizeof err), 0);
    for (int k = 0; k < FSO_N_KINDS; k++)
        ctx.in.pins.tier[k] = k == FSO_KIND_GRAD ? FSO_TIER_HOST : FSO_TIER_DEVICE;
    ctx.in.pins.acts = FSO_TIER_DEVICE;
    assert_int_equal(fso_plan_batch_choose(&ctx, &cfg, &b, err, sizeof err), 0);
    assert_int_equal(b.hide_batch, 0);
    assert_int_equal(b.hide_no_fit_micro, 2);
    assert_int_equal(b.hide_stop, FSO_PLAN_HIDE_STOP_GRAD_HOST);
    fso_plan_batch_hide_words(&b, line, sizeof line);
    assert_non_null(strstr(line, "micro-batch 2 does not fit"));
    assert_non_null(strstr(line, "accumulated on the host each micro-batch"));
    fso_plan_ctx_free(&ctx);
    fso_config_free(&cfg);
    free(p);
    free(q);
}

/* The split is the planner's with --auto-batch, or when the config leaves
 * it "auto" and pins neither key; a pinned key keeps it otherwise. */
static void test_which_keys_free_the_split(void **state)
{
    (void)state;
    const char *why;
    fso_config cfg;
    config_with(&cfg, NULL, 0); /* defaults: nothing given */
    assert_false(fso_plan_batch_is_free(&cfg, false, &why));
    assert_true(fso_plan_batch_is_free(&cfg, true, &why));
    assert_string_equal(why, "--auto-batch");
    fso_config_free(&cfg);

    static const char *const micro_only[] = {"train_micro_batch_size_per_gpu=2"};
    config_with(&cfg, micro_only, 1);
    assert_false(fso_plan_batch_is_free(&cfg, false, &why));
    make_auto(&cfg, "train_micro_batch_size_per_gpu");
    assert_int_equal(fso_config_origin_of(&cfg, "gradient_accumulation_steps"),
                     FSO_ORIGIN_DEFAULT);
    assert_false(fso_config_pinned(&cfg, "train_micro_batch_size_per_gpu"));
    assert_true(fso_plan_batch_is_free(&cfg, false, &why));
    assert_string_equal(why, "\"auto\"");
    fso_config_free(&cfg);

    static const char *const both[] = {"train_micro_batch_size_per_gpu=2",
                                       "gradient_accumulation_steps=4"};
    config_with(&cfg, both, 2);
    make_auto(&cfg, "train_micro_batch_size_per_gpu");
    assert_true(fso_config_pinned(&cfg, "gradient_accumulation_steps"));
    assert_false(fso_plan_batch_is_free(&cfg, false, &why)); /* accumulation pinned */
    assert_true(fso_plan_batch_is_free(&cfg, true, &why));
    fso_config_free(&cfg);
}

/* train.prefetch_blocks given "auto" leaves the depth to the planner. */
static void test_prefetch_auto_is_not_a_pin(void **state)
{
    (void)state;
    static const char *const sets[] = {"train.prefetch_blocks=3"};
    fso_config cfg;
    fso_plan_pins pins;
    config_with(&cfg, sets, 1);
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.prefetch, 3);
    assert_false(fso_plan_prefetch_auto(&cfg));
    make_auto(&cfg, "train.prefetch_blocks");
    assert_true(fso_plan_prefetch_auto(&cfg));
    fso_plan_pins_from_config(&cfg, &pins);
    assert_int_equal(pins.prefetch, -1);
    fso_config_free(&cfg);
}

/* NVMe as the bound is the optimizer's when it carries the optimizer state
 * alone; with the parameters there too, every micro-batch reads it. */
static void test_nvme_bound_is_the_optimizers_when_only_its_state_is_there(void **state)
{
    (void)state;
    fso_plan *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->pl.n_blocks = 3;
    for (int k = 0; k < FSO_N_KINDS; k++)
        for (int b = 0; b < 3; b++)
            p->pl.tier[k][b] = k == FSO_KIND_MASTER || k == FSO_KIND_M || k == FSO_KIND_V
                                   ? FSO_TIER_NVME
                                   : FSO_TIER_HOST;
    p->bottleneck = FSO_STREAM_NVME_WRITE;
    assert_true(fso_plan_optimizer_bound(p));
    p->bottleneck = FSO_STREAM_COMPUTE;
    assert_false(fso_plan_optimizer_bound(p));
    p->bottleneck = FSO_STREAM_OPTIM;
    assert_true(fso_plan_optimizer_bound(p));
    p->bottleneck = FSO_STREAM_NVME_READ;
    for (int b = 0; b < 3; b++)
        p->pl.tier[FSO_KIND_PARAM][b] = FSO_TIER_NVME;
    assert_false(fso_plan_optimizer_bound(p));
    free(p);
}

/* The split's words: what chose it, the split taken and the one it
 * replaced, the same global batch, both steps. */
static void test_split_words(void **state)
{
    (void)state;
    fso_plan_batch b = {.global_batch = 8, .devices = 1, .user_micro = 1, .user_accum = 8,
                        .user_step_ms = 1390, .micro = 4, .accum = 2, .step_ms = 812};
    char line[512];
    fso_plan_batch_split_words(&b, "--auto-batch", true, line, sizeof line);
    assert_string_equal(line, "--auto-batch: micro-batch 4 x accumulation 2 (was 1 x 8), same "
                              "global batch 8: predicted 812 ms/step, was 1390");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_divides_fits_and_is_never_slower),
        cmocka_unit_test(test_memory_decides_the_micro_batch),
        cmocka_unit_test(test_pins_hold_at_every_split),
        cmocka_unit_test(test_hide_batch_is_the_smallest_that_hides),
        cmocka_unit_test(test_only_a_larger_micro_batch_hides_per_micro_batch_work),
        cmocka_unit_test(test_which_keys_free_the_split),
        cmocka_unit_test(test_prefetch_auto_is_not_a_pin),
        cmocka_unit_test(test_nvme_bound_is_the_optimizers_when_only_its_state_is_there),
        cmocka_unit_test(test_split_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
