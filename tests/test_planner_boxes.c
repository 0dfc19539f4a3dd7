/* test_planner_boxes.c — the planner on several boxes (planner.h
 * machine.boxes, net_gbps):
 *
 *  - each box holds 1/boxes of the master weights, m and v on every tier,
 *    and the whole working parameters and gradients;
 *  - what a box sends per step is (4 + p) bytes x the padded parameters x
 *    (boxes - 1)/boxes, p the working parameters' bytes (2 or 4);
 *  - on a slow network the step is bound by it, and the plan says so and
 *    what moves it; on a fast one each box's CPU AdamW takes half the time
 *    on two boxes;
 *  - one box, given as 1 or left 0, is the same plan to the last bit;
 *  - several boxes without a network rate are refused, by the planner and
 *    by `fsoff plan`;
 *  - engine/plan.c: the global batch and the block padding count every
 *    box's devices.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "config/config.h"
#include "model.h"
#include "plan.h"
#include "planner.h"
#include "test_util.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* a block's elements: a multiple of 2048 x devices x boxes for 1 or 2
 * devices and 2, 3 or 4 boxes (model.h pads blocks so) */
#define SYNTH_ELEMS ((uint64_t)2048 * 24 * 85)

static char tmpdir[1024];

/* nb blocks of `elems` elements (a multiple of devices x boxes x 2048, as
 * model.h pads them), a forward and a backward visit each, fp32 state,
 * working parameters of param_bytes (2: bf16), GPUs the CPU does not
 * address; optimizer state on the host, parameters and gradients on the
 * devices (the CPU AdamW runs, the optimizer's tier is the host). */
typedef struct synth {
    fso_plan_input in;
    uint64_t elems[8];
    fso_plan_visit visits[16];
    fso_placement pl;
} synth;

static void synth_boxes(synth *s, int devices, int boxes, double net_gbps, int param_bytes)
{
    const int nb = 4;
    const uint64_t elems = SYNTH_ELEMS;
    memset(s, 0, sizeof *s);
    int n = 0;
    for (int b = 0; b < nb; b++) {
        s->elems[b] = elems;
        s->visits[n++] = (fso_plan_visit){.block = b, .flops = 1e9, .params = true};
    }
    for (int b = nb - 1; b >= 0; b--)
        s->visits[n++] =
            (fso_plan_visit){.block = b, .flops = 2e9, .params = true, .grads = true};
    fso_plan_model *m = &s->in.model;
    m->n_blocks = nb;
    m->block_elems = s->elems;
    m->n_visits = n;
    m->visits = s->visits;
    m->grad_accum = 1;
    m->tokens_per_step = 1000.0 * boxes;
    m->activation_bytes = 1 << 20;
    fso_plan_engine *en = &s->in.engine;
    en->overlap = FSO_OVERLAP_NONE;
    for (int k = 0; k < FSO_N_KINDS; k++)
        en->rules.dtype[k] = FSO_DT_F32;
    if (param_bytes == 2)
        en->rules.dtype[FSO_KIND_PARAM] = FSO_DT_BF16;
    en->rules.host_addressable = false;
    en->opt_write_lag = 1;
    fso_plan_pins_none(&s->in.pins);
    fso_plan_machine *mc = &s->in.machine;
    mc->devices = devices;
    mc->boxes = boxes;
    mc->net_gbps = net_gbps;
    mc->device_mem_bytes = (uint64_t)(64 * GIB);
    mc->host_mem_bytes = (uint64_t)(256 * GIB);
    mc->nvme_free_bytes = (uint64_t)(1024 * GIB);
    mc->nvme_read_gbps = 3;
    mc->nvme_write_gbps = 2;
    mc->h2d_gbps = mc->d2h_gbps = 20;
    mc->coll_gbps = 100;
    mc->device_gflops = 100e3;
    mc->adam_gelems = 2;
    mc->host_copy_gbps = 10;
    fso_placement_uniform(&s->pl, nb, FSO_TIER_DEVICE, FSO_TIER_HOST, FSO_TIER_DEVICE, 2);
}

static void evaluate(synth *s, fso_plan *p)
{
    assert_int_equal(fso_plan_evaluate(&s->in, &s->pl, p), 0);
    assert_true(p->fits);
}

/* ------------------------------------------------------------------ memory and bytes */

static void test_each_box_holds_its_slice_of_the_optimizer_state(void **state)
{
    (void)state;
    synth s;
    fso_plan one, many;
    for (int state_tier = FSO_TIER_DEVICE; state_tier <= FSO_TIER_NVME; state_tier++)
        for (int B = 2; B <= 4; B += 2) {
            synth_boxes(&s, 2, 1, 0, 4);
            fso_placement_uniform(&s.pl, 4, FSO_TIER_DEVICE, state_tier, FSO_TIER_DEVICE, 2);
            evaluate(&s, &one);
            s.in.machine.boxes = B;
            s.in.machine.net_gbps = 100;
            evaluate(&s, &many);
            for (int k = FSO_KIND_MASTER; k <= FSO_KIND_V; k++) {
                assert_true(one.kind_bytes[state_tier][k] > 0);
                assert_int_equal(many.kind_bytes[state_tier][k] * (uint64_t)B,
                                 one.kind_bytes[state_tier][k]);
            }
            /* the working parameters and the gradients are whole on every box */
            assert_int_equal(many.kind_bytes[FSO_TIER_DEVICE][FSO_KIND_PARAM],
                             one.kind_bytes[FSO_TIER_DEVICE][FSO_KIND_PARAM]);
            assert_int_equal(many.kind_bytes[FSO_TIER_DEVICE][FSO_KIND_GRAD],
                             one.kind_bytes[FSO_TIER_DEVICE][FSO_KIND_GRAD]);
            assert_int_equal(one.net_bytes, 0);
        }
}

static void test_a_box_sends_grads_and_params_once_per_step(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    for (int pb = 2; pb <= 4; pb += 2)
        for (int B = 2; B <= 4; B++)
            for (int W = 1; W <= 2; W++) {
                synth_boxes(&s, W, B, 100, pb);
                evaluate(&s, &p);
                uint64_t psi = 0;
                for (int b = 0; b < s.in.model.n_blocks; b++)
                    psi += s.elems[b];
                const uint64_t want = (uint64_t)(4 + pb) * psi / (uint64_t)B * (uint64_t)(B - 1);
                assert_int_equal(p.net_bytes, want);
                /* the network's time: a device's share of those bytes over its
                 * rail, the box's rate shared by its devices at the
                 * collectives' share of the line rate */
                const double ms = (double)want / W / (100 * FSO_PLAN_NET_EFFICIENCY / W * 1e6);
                assert_true(p.net_ms > ms * (1 - 1e-9) && p.net_ms < ms * (1 + 1e-9));
                assert_true(p.busy_ms[FSO_STREAM_NET] == p.net_ms);
            }
}

/* ------------------------------------------------------------------ time */

static void test_a_slow_network_bounds_the_step_and_says_so(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    synth_boxes(&s, 1, 2, 0.05, 2); /* 50 MB/s: the network dwarfs the rest */
    evaluate(&s, &p);
    assert_int_equal(p.bottleneck, FSO_STREAM_NET);
    assert_string_equal(fso_stream_name(p.bottleneck), "network");
    /* the gradients' reduce-scatter is in the open: at least its time is in
     * the step */
    uint64_t psi = 4 * SYNTH_ELEMS;
    const double rs_ms = (double)psi / 2 * 4 / (0.05 * FSO_PLAN_NET_EFFICIENCY * 1e6);
    assert_true(p.step_ms >= rs_ms);
    assert_true(p.critical_ms[FSO_STREAM_NET] >= rs_ms);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fso_plan_print(f, &p);
    fclose(f);
    assert_non_null(strstr(buf, "plan: bound: the network between boxes, not the optimizer"));
    assert_non_null(strstr(buf, "a faster network (--net-gbps), fewer boxes (--boxes), or a "
                                "larger global batch"));
    assert_non_null(strstr(buf, "plan: between boxes: "));
    assert_non_null(strstr(buf, "host (box)"));
    free(buf);

    /* a network 1000 times faster: no longer the bound */
    synth_boxes(&s, 1, 2, 50, 2);
    evaluate(&s, &p);
    assert_int_not_equal(p.bottleneck, FSO_STREAM_NET);
}

static void test_a_fast_network_halves_each_boxs_optimizer(void **state)
{
    (void)state;
    synth s;
    fso_plan one, two;
    synth_boxes(&s, 2, 1, 0, 4);
    evaluate(&s, &one);
    synth_boxes(&s, 2, 2, 1e6, 4);
    evaluate(&s, &two);
    assert_true(one.busy_ms[FSO_STREAM_OPTIM] > 0);
    const double half = one.busy_ms[FSO_STREAM_OPTIM] / 2;
    assert_true(two.busy_ms[FSO_STREAM_OPTIM] > half * (1 - 1e-9) &&
                two.busy_ms[FSO_STREAM_OPTIM] < half * (1 + 1e-9));
    /* the optimizer was the bound: each box's step is shorter, and twice the
     * tokens go through it */
    assert_int_equal(one.bottleneck, FSO_STREAM_OPTIM);
    assert_true(two.step_ms < one.step_ms);
    assert_true(two.tokens_per_s > 2 * one.tokens_per_s);
}

static void test_one_box_is_the_plan_it_was(void **state)
{
    (void)state;
    synth s;
    fso_plan zero, one;
    for (int overlap = 0; overlap < 3; overlap++) {
        synth_boxes(&s, 2, 0, 0, 2);
        s.in.engine.overlap = (fso_overlap)overlap;
        assert_int_equal(fso_plan_choose(&s.in, &zero), 0);
        s.in.machine.boxes = 1;
        s.in.machine.net_gbps = 7; /* unused on one box */
        assert_int_equal(fso_plan_choose(&s.in, &one), 0);
        assert_memory_equal(&zero.pl, &one.pl, sizeof zero.pl);
        assert_true(zero.step_ms == one.step_ms);
        assert_memory_equal(zero.busy_ms, one.busy_ms, sizeof zero.busy_ms);
        assert_memory_equal(zero.critical_ms, one.critical_ms, sizeof zero.critical_ms);
        assert_memory_equal(zero.need_bytes, one.need_bytes, sizeof zero.need_bytes);
        assert_int_equal(one.net_bytes, 0);
        assert_true(one.busy_ms[FSO_STREAM_NET] == 0);
    }
}

static void test_boxes_without_a_network_are_refused(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    synth_boxes(&s, 1, 2, 0, 4);
    assert_int_equal(fso_plan_evaluate(&s.in, &s.pl, &p), -EINVAL);
    assert_int_equal(fso_plan_choose(&s.in, &p), -EINVAL);
    s.in.machine.boxes = -1;
    s.in.machine.net_gbps = 10;
    assert_int_equal(fso_plan_evaluate(&s.in, &s.pl, &p), -EINVAL);
}

/* Every overlap schedule lays the cross-box traffic out, and the step on
 * several boxes is never shorter than its exposed reduce-scatter. */
static void test_every_schedule_waits_for_the_reduce_scatter(void **state)
{
    (void)state;
    synth s;
    fso_plan p;
    for (int overlap = 0; overlap < 3; overlap++) {
        synth_boxes(&s, 2, 4, 1, 2);
        s.in.engine.overlap = (fso_overlap)overlap;
        evaluate(&s, &p);
        const double rs_ms = (double)SYNTH_ELEMS * 4 / 2 * 4 * 3 / 4 /
                             (1 * FSO_PLAN_NET_EFFICIENCY / 2 * 1e6);
        assert_true(p.busy_ms[FSO_STREAM_NET] > rs_ms);
        assert_true(p.step_ms >= rs_ms);
    }
}

/* ------------------------------------------------------------------ engine/plan.c, fsoff plan */

static void test_inputs_count_every_boxs_devices(void **state)
{
    (void)state;
    fso_config cfg;
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_set_world(&cfg, 2), 0);
    assert_int_equal(fso_config_set_boxes(&cfg, 3, 0), 0);
    fso_plan_machine m = {.devices = 2, .boxes = 3, .net_gbps = 10, .device_gflops = 1e3,
                          .adam_gelems = 1, .device_mem_bytes = (uint64_t)(8 * GIB),
                          .host_mem_bytes = (uint64_t)(32 * GIB)};
    fso_plan_ctx ctx, one;
    char err[512];
    assert_int_equal(fso_plan_ctx_init(&ctx, &cfg, &m, false, err, sizeof err), 0);
    m.boxes = 0;
    assert_int_equal(fso_plan_ctx_init(&one, &cfg, &m, false, err, sizeof err), 0);
    assert_int_equal(ctx.in.machine.boxes, 3);
    assert_int_equal(ctx.in.engine.rules.boxes, 3);
    assert_true(ctx.in.model.tokens_per_step == 3 * one.in.model.tokens_per_step);
    for (int b = 0; b < ctx.in.model.n_blocks; b++) {
        assert_int_equal(ctx.in.model.block_elems[b] % (2 * 3 * 2048), 0);
        assert_true(ctx.in.model.block_elems[b] >= one.in.model.block_elems[b]);
    }
    fso_plan_ctx_free(&ctx);
    fso_plan_ctx_free(&one);
    fso_config_free(&cfg);
}

/* Run the fsoff binary's plan; its exit status, stdout in out, stderr in err. */
static int run_plan(char *out, size_t len, char *err, size_t errlen, const char *args)
{
    const char *bd = getenv("FSO_BUILDDIR");
    char cmd[8192], path[1100];
    snprintf(path, sizeof path, "%s/stderr", tmpdir);
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s %s/fsoff plan %s 2>%s", tmpdir,
             bd ? bd : "..", args, path);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = 0;
    int st = pclose(f);
    f = fopen(path, "r");
    assert_non_null(f);
    n = fread(err, 1, errlen - 1, f);
    err[n] = 0;
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_fsoff_plan_boxes(void **state)
{
    (void)state;
    static char out[1 << 16], out1[1 << 16], err[4096];
    const char *src = getenv("FSO_SRCDIR");
    char base[1024], args[2048];
    snprintf(base, sizeof base,
             "--config %s/configs/llama-70b.json --auto --gpus 8 --gpu h200 --host-mem 2T "
             "--nvme-free 12T --nvme-read 24 --nvme-write 16 --adam-gelems 8",
             src ? src : "..");
    /* --boxes 1 is the plan without it */
    snprintf(args, sizeof args, "%s --json", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 0);
    snprintf(args, sizeof args, "%s --boxes 1 --json", base);
    assert_int_equal(run_plan(out1, sizeof out1, err, sizeof err, args), 0);
    assert_string_equal(out, out1);
    assert_non_null(strstr(out, "\"boxes\":1"));
    assert_non_null(strstr(out, "\"net_bytes\":0"));
    /* four boxes: the global batch four times larger, bytes between them */
    snprintf(args, sizeof args, "%s --boxes 4 --net-gbps 400", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 0);
    assert_non_null(strstr(out, "x 8 devices x 4 boxes = 131072 tokens/step"));
    assert_non_null(strstr(out, "plan: boxes: 4 x 8 devices"));
    assert_non_null(strstr(out, "plan: between boxes: "));
    snprintf(args, sizeof args, "%s --boxes 4 --net-gbps 400 --json", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 0);
    assert_non_null(strstr(out, "\"boxes\":4"));
    assert_non_null(strstr(out, "\"net_gbps\":400"));
    assert_null(strstr(out, "\"net_bytes\":0"));
    assert_non_null(strstr(out, "\"net_ms\":"));

    /* refused: exit 2, the flag and the fix named */
    snprintf(args, sizeof args, "%s --boxes 2", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 2);
    assert_non_null(strstr(err, "--boxes 2"));
    assert_non_null(strstr(err, "give --net-gbps GBPS"));
    snprintf(args, sizeof args, "%s --net-gbps 50", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 2);
    assert_non_null(strstr(err, "give --boxes B"));
    /* one box given with a rate: the one-box plan */
    snprintf(args, sizeof args, "%s --boxes 1 --net-gbps 50 --json", base);
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, args), 0);
    assert_non_null(strstr(out, "\"boxes\":1"));
    assert_non_null(strstr(out, "\"net_bytes\":0"));
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, "--boxes 0"), 2);
    assert_non_null(strstr(err, "--boxes 0: expected a box count"));
    assert_int_equal(run_plan(out, sizeof out, err, sizeof err, "--boxes 2 --net-gbps 0"), 2);
    assert_non_null(strstr(err, "--net-gbps 0: expected a positive number"));
}

/* ------------------------------------------------------------------ main */

static int setup(void **state)
{
    (void)state;
    return fso_test_group_dir(tmpdir, sizeof tmpdir, "fsoff-planner-boxes");
}

static int teardown(void **state)
{
    (void)state;
    return remove_tree(tmpdir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_box_holds_its_slice_of_the_optimizer_state),
        cmocka_unit_test(test_a_box_sends_grads_and_params_once_per_step),
        cmocka_unit_test(test_a_slow_network_bounds_the_step_and_says_so),
        cmocka_unit_test(test_a_fast_network_halves_each_boxs_optimizer),
        cmocka_unit_test(test_one_box_is_the_plan_it_was),
        cmocka_unit_test(test_boxes_without_a_network_are_refused),
        cmocka_unit_test(test_every_schedule_waits_for_the_reduce_scatter),
        cmocka_unit_test(test_inputs_count_every_boxs_devices),
        cmocka_unit_test(test_fsoff_plan_boxes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
