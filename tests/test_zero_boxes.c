/* test_zero_boxes.c — the trainer across several boxes (engine/boxes.h),
 * each box a thread of this process and its rails the shared-memory
 * collectives among them (coll.h "threads": the table the MPI and NCCL
 * rails fill, with the same box-order sums):
 *
 *  - two boxes of one device give the bits of one box of two devices, with
 *    one micro-batch a step: losses, norms, the fp32 master and the working
 *    parameters, with parameters and optimizer on the device, in host
 *    memory and on NVMe, fp32 and bf16, under the CPU's and a GPU's rules;
 *  - two boxes of two devices agree with one box of four within rounding,
 *    with accumulation too (the sums group differently);
 *  - a step's net_bytes is the footprint's derivation, exactly, for each
 *    tier and dtype; each box holds 1/B of the optimizer's state;
 *  - the backward schedule is refused across boxes, naming the fix.
 *
 * tests/boxes_test.sh runs the same comparisons between processes under
 * mpirun, over MPI rails. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
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

#include "boxes.h"
#include "config/config.h"
#include "cpu_async.h"
#include "cuda/cuda_backend.h"
#include "data.h"
#include "test_util.h"
#include "train.h"
#include "util.h"
#include "zero/zero.h"

#define MAX_BOXES 4

static char nvme_dir[512];

/* One box's run: its configuration and rails in, what it gave out. No
 * cmocka assertion runs on a box's thread: failures go to res.rc/err. */
typedef struct box_run {
    fso_config cfg;
    fso_rails rails;
    run_result res;
    uint64_t net_bytes[FSO_TEST_MAX_STEPS];
    uint64_t host_arena;
} box_run;

static void fail_box(box_run *b, int rc, const char *what, const char *why)
{
    if (b->res.rc == 0) {
        b->res.rc = rc < 0 ? rc : -EIO;
        snprintf(b->res.err, sizeof b->res.err, "box %d: %s: %.400s", b->cfg.box, what, why);
    }
}

static void *box_main(void *arg)
{
    box_run *b = arg;
    const fso_config *cfg = &b->cfg;
    run_result *out = &b->res;
    fso_data data = {0};
    fso_trainer tr;
    out->steps = (int)cfg->steps;
    if (fso_data_init(&data, cfg) < 0) {
        fail_box(b, -EINVAL, "data", data.err);
        return NULL;
    }
    if ((out->rc = fso_trainer_init_on(&tr, cfg, &b->rails)) < 0) {
        snprintf(out->err, sizeof out->err, "box %d: %.480s", cfg->box, tr.err);
        fso_data_free(&data);
        return NULL;
    }
    const size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len;
    const size_t n = fso_trainer_step_tokens(cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    for (int s = 0; s < out->steps && out->rc == 0 && in && tg; s++) {
        for (size_t a = 0; a < n / bt; a++)
            fso_data_next(&data, in + a * bt, tg + a * bt, NULL);
        fso_zero_step st;
        if ((out->rc = fso_trainer_step(&tr, in, tg, NULL, &st)) < 0)
            snprintf(out->err, sizeof out->err, "box %d: %.480s", cfg->box, tr.err);
        out->loss[s] = st.loss;
        out->norm[s] = st.grad_norm;
        b->net_bytes[s] = st.net_bytes;
    }
    double waited;
    if (out->rc == 0 && fso_trainer_finish(&tr, &waited) < 0)
        fail_box(b, -EIO, "finish", tr.err);
    /* the exports are collectives: every box takes them, failed or not */
    out->np = fso_zero_model(tr.zero)->n_params;
    out->params = malloc(sizeof(float) * out->np);
    out->working = malloc(sizeof(float) * out->np);
    char err[512];
    if (!out->params || !out->working)
        fail_box(b, -ENOMEM, "results", "out of memory");
    else if (fso_zero_store_hf(tr.zero, out->params, err, sizeof err) < 0 ||
             fso_zero_store_working_hf(tr.zero, out->working, err, sizeof err) < 0)
        fail_box(b, -EIO, "store", err);
    b->host_arena = fso_zero_host_arena_bytes(tr.zero);
    free(in);
    free(tg);
    fso_trainer_free(&tr);
    fso_data_free(&data);
    return NULL;
}

/* A GPU box's NCCL rail stood in for over cpu-async devices (coll.h,
 * cuda_backend.h fso_coll_create_nccl_rail): buffers are device memory,
 * which the shared-memory collectives reach through its host view, and
 * every call is done when it returns. */
static int dr_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                         fso_dtype dt, uint64_t after)
{
    (void)after;
    fso_coll *in = c->ctx;
    int rc = in->ops->all_gather(in, rank, fso_async_host_view(send), fso_async_host_view(recv),
                                 count, dt, 0);
    c->busy_ms[rank] = in->busy_ms[rank];
    return rc;
}

static int dr_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    fso_coll *in = c->ctx;
    int rc = in->ops->reduce_scatter(in, rank, fso_async_host_view(send),
                                     fso_async_host_view(recv), count);
    c->busy_ms[rank] = in->busy_ms[rank];
    return rc;
}

static int dr_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                  size_t count)
{
    fso_coll *in = c->ctx;
    int rc = in->ops->reduce_scatter_bf16(in, rank, fso_async_host_view(send),
                                          fso_async_host_view(recv), count);
    c->busy_ms[rank] = in->busy_ms[rank];
    return rc;
}

static int dr_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    fso_coll *in = c->ctx;
    return in->ops->all_reduce_f64(in, rank, buf, count);
}

static int dr_barrier(fso_coll *c, int rank)
{
    fso_coll *in = c->ctx;
    return in->ops->barrier(in, rank);
}

static void dr_destroy(fso_coll *c)
{
    fso_coll_destroy(c->ctx);
    free(c);
}

static const fso_coll_ops dev_rail_ops = {
    .name = "device rail (test)",
    .all_gather = dr_all_gather,
    .reduce_scatter = dr_reduce_scatter,
    .reduce_scatter_bf16 = dr_reduce_scatter_bf16,
    .all_reduce_f64 = dr_all_reduce_f64,
    .barrier = dr_barrier,
    .destroy = dr_destroy,
};

static fso_coll *dev_rail(int boxes)
{
    fso_coll *c = calloc(1, sizeof *c), *in = NULL;
    assert_non_null(c);
    assert_int_equal(fso_coll_create_threads(&in, boxes), 0);
    *c = (fso_coll){.ops = &dev_rail_ops, .ctx = in, .world = boxes};
    return c;
}

/* cfg on `boxes` boxes of cfg->world devices, each box on its own thread;
 * box k's results into runs[k] (the caller frees each res). dev_ms: NULL,
 * or the rails of the shards on the devices too (the NCCL pair a GPU box
 * has, boxes.h), and the time box 0 spent in them into *dev_ms. */
static void run_boxes_on(const fso_config *cfg, int boxes, box_run *runs, double *dev_ms)
{
    fso_coll *grad[FSO_MAX_DEVICES], *param[FSO_MAX_DEVICES];
    fso_coll *grad_dev[FSO_MAX_DEVICES] = {0}, *param_dev[FSO_MAX_DEVICES] = {0};
    const int world = fso_config_world(cfg);
    for (int g = 0; g < world; g++) {
        assert_int_equal(fso_coll_create_threads(&grad[g], boxes), 0);
        assert_int_equal(fso_coll_create_threads(&param[g], boxes), 0);
        if (dev_ms) {
            grad_dev[g] = dev_rail(boxes);
            param_dev[g] = dev_rail(boxes);
        }
    }
    pthread_t tid[MAX_BOXES];
    for (int k = 0; k < boxes; k++) {
        box_run *b = &runs[k];
        memset(b, 0, sizeof *b);
        b->cfg = *cfg;
        assert_int_equal(fso_config_set_boxes(&b->cfg, boxes, k), 0);
        b->rails = (fso_rails){.box = k, .boxes = boxes, .devices = world};
        for (int g = 0; g < world; g++) {
            b->rails.grad[g] = grad[g];
            b->rails.param[g] = param[g];
            b->rails.grad_dev[g] = grad_dev[g];
            b->rails.param_dev[g] = param_dev[g];
        }
        assert_int_equal(pthread_create(&tid[k], NULL, box_main, b), 0);
    }
    for (int k = 0; k < boxes; k++)
        pthread_join(tid[k], NULL);
    if (dev_ms)
        *dev_ms = 0;
    for (int g = 0; g < world; g++) {
        if (dev_ms)
            *dev_ms += grad_dev[g]->busy_ms[0] + param_dev[g]->busy_ms[0];
        fso_coll_destroy(grad[g]);
        fso_coll_destroy(param[g]);
        fso_coll_destroy(grad_dev[g]);
        fso_coll_destroy(param_dev[g]);
    }
    for (int k = 0; k < boxes; k++)
        if (runs[k].res.rc)
            fail_msg("%s", runs[k].res.err);
}

static void run_boxes(const fso_config *cfg, int boxes, box_run *runs)
{
    run_boxes_on(cfg, boxes, runs, NULL);
}

/* The small job on `world` devices: `seqs` sequences per device and
 * micro-batch, `accum` micro-batches a step. */
static void job(fso_config *cfg, int world, int seqs, int accum)
{
    fso_test_small_model(cfg, world, seqs * world);
    cfg->grad_accum = accum;
}

/* Two boxes of one device against one box of two devices, bit for bit;
 * every box's results the same (each holds a whole replica). dev_rails:
 * with rails over device memory too, which carry the shards on the device
 * (parameters, gradients) where they live. */
static void two_boxes_match_two_devices_on(fso_tier param, fso_tier optim, bool bf16,
                                           const char *backend, bool dev_rails)
{
    fso_config one, two;
    job(&one, 2, 2, 1);
    job(&two, 1, 2, 1);
    for (fso_config *c = &one; c; c = c == &one ? &two : NULL) {
        c->bf16 = bf16;
        fso_test_set_tiers(c, param, optim, nvme_dir);
        c->backend = fso_backend_find(backend)->kind;
    }
    run_result base;
    run_ok(&one, NULL, &base);
    box_run runs[2];
    double dev_ms = 0;
    run_boxes_on(&two, 2, runs, dev_rails ? &dev_ms : NULL);
    /* the shards on a device that the CPU cannot address took those rails */
    if (dev_rails && param == FSO_TIER_DEVICE && strcmp(backend, "cpu") != 0 && !(dev_ms > 0))
        fail_msg("%s: parameters on the device, but the device rails were not used", backend);
    char what[200];
    for (int k = 0; k < 2; k++) {
        snprintf(what, sizeof what, "%s, %s parameters on tier %d, optimizer on tier %d%s: box "
                 "%d of 2 x 1 device vs 1 x 2 devices", backend, bf16 ? "bf16" : "fp32", param,
                 optim, dev_rails ? ", device rails" : "", k);
        assert_bit_identical(&base, &runs[k].res, 1, what);
        result_free(&runs[k].res);
    }
    result_free(&base);
}

static void two_boxes_match_two_devices(fso_tier param, fso_tier optim, bool bf16,
                                        const char *backend)
{
    two_boxes_match_two_devices_on(param, optim, bf16, backend, false);
}

static void test_two_boxes_are_two_devices_bit_for_bit(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_DEVICE, FSO_TIER_HOST},
        {FSO_TIER_HOST, FSO_TIER_HOST},     {FSO_TIER_NVME, FSO_TIER_NVME},
        {FSO_TIER_DEVICE, FSO_TIER_NVME},
    };
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            two_boxes_match_two_devices(tiers[t][0], tiers[t][1], bf16, "cpu");
}

/* A GPU's rules (the CPU updates state on the device through copies;
 * parameters gathered in the rail buffer and copied back whole). */
static void test_two_boxes_under_gpu_rules(void **state)
{
    (void)state;
    two_boxes_match_two_devices(FSO_TIER_DEVICE, FSO_TIER_DEVICE, true, fso_test_gpu_rules());
    two_boxes_match_two_devices(FSO_TIER_DEVICE, FSO_TIER_HOST, false, fso_test_gpu_rules());
    two_boxes_match_two_devices(FSO_TIER_NVME, FSO_TIER_NVME, true, fso_test_gpu_rules());
}

/* A GPU box's NCCL rails, as rails over device memory: the gradient and
 * parameter shards on the device meet the other box there (reduced in
 * place, the norm taken on the device, the updated slice copied up and
 * gathered in place), those elsewhere through host memory; the same bits. */
static void test_two_boxes_on_device_rails(void **state)
{
    (void)state;
    const char *gpu = fso_test_gpu_rules();
    two_boxes_match_two_devices_on(FSO_TIER_DEVICE, FSO_TIER_DEVICE, true, gpu, true);
    two_boxes_match_two_devices_on(FSO_TIER_DEVICE, FSO_TIER_DEVICE, false, gpu, true);
    two_boxes_match_two_devices_on(FSO_TIER_DEVICE, FSO_TIER_HOST, true, gpu, true);
    two_boxes_match_two_devices_on(FSO_TIER_HOST, FSO_TIER_HOST, false, gpu, true);
    two_boxes_match_two_devices_on(FSO_TIER_DEVICE, FSO_TIER_NVME, true, gpu, true);
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(b), 1e-12);
}

/* Two boxes of two devices against one box of four, and with two
 * micro-batches a step: the same sums grouped differently. */
static void test_two_boxes_of_two_agree_with_four_devices(void **state)
{
    (void)state;
    for (int accum = 1; accum <= 2; accum++) {
        fso_config one, two;
        job(&one, 4, 1, accum);
        job(&two, 2, 1, accum);
        fso_test_set_tiers(&one, FSO_TIER_HOST, FSO_TIER_NVME, nvme_dir);
        fso_test_set_tiers(&two, FSO_TIER_HOST, FSO_TIER_NVME, nvme_dir);
        run_result base;
        run_ok(&one, NULL, &base);
        box_run runs[2];
        run_boxes(&two, 2, runs);
        const run_result *r = &runs[0].res;
        for (int s = 0; s < base.steps; s++) {
            if (rel(r->loss[s], base.loss[s]) > 1e-6 || rel(r->norm[s], base.norm[s]) > 1e-5)
                fail_msg("accumulation %d, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g",
                         accum, s + 1, r->loss[s], base.loss[s], r->norm[s], base.norm[s]);
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < base.np; i++) {
            num += (double)(r->params[i] - base.params[i]) * (r->params[i] - base.params[i]);
            den += (double)base.params[i] * base.params[i];
        }
        if (sqrt(num / den) > 1e-5)
            fail_msg("accumulation %d: parameters' normalized error %.3g", accum,
                     sqrt(num / den));
        /* each box a replica: box 1 has box 0's bits */
        assert_bit_identical(&runs[0].res, &runs[1].res, 1, "box 1 vs box 0");
        for (int k = 0; k < 2; k++)
            result_free(&runs[k].res);
        result_free(&base);
    }
}

/* net_bytes of every step is the footprint's: each device's gradient shard
 * and parameters, (B-1)/B of each; and the optimizer's state on each box
 * is 1/B of one box's. */
static void test_net_bytes_are_the_derivation(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_HOST, FSO_TIER_HOST},
        {FSO_TIER_NVME, FSO_TIER_NVME}};
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int boxes = 2; boxes <= 3; boxes++) {
                fso_config c;
                job(&c, 2, 1, 2);
                c.bf16 = bf16;
                fso_test_set_tiers(&c, tiers[t][0], tiers[t][1], nvme_dir);
                box_run runs[MAX_BOXES];
                run_boxes(&c, boxes, runs);
                fso_fp_traffic want;
                assert_int_equal(fso_zero_step_traffic(&runs[0].cfg, &want), 0);
                /* (4 + p) bytes per element of every device shard, (B-1)/B of it */
                fso_zero_need per_box;
                fso_zero_need_for(&runs[0].cfg, &per_box);
                fso_block_layout bl[8];
                assert_true(fso_model_n_blocks(&c.model) <= 8);
                uint64_t padded = 0; /* every block's elements, padded for all devices */
                for (int b = 0, nb = fso_model_layout(bl, &c.model, 2 * boxes); b < nb; b++)
                    padded += bl[b].padded_elems;
                const uint64_t p = bf16 ? 2 : 4;
                assert_int_equal(want.net_bytes,
                                 padded / (uint64_t)boxes * (uint64_t)(boxes - 1) * (4 + p));
                /* the first step sends its gradients; its update's parameters
                 * go during the next (train.optimizer_overlap "forward") */
                const uint64_t grads = padded / (uint64_t)boxes * (uint64_t)(boxes - 1) * 4;
                for (int k = 0; k < boxes; k++) {
                    for (int s = 0; s < runs[k].res.steps; s++)
                        if (runs[k].net_bytes[s] != (s == 0 ? grads : want.net_bytes))
                            fail_msg("tiers %d/%d, %s, %d boxes: box %d step %d sent %llu "
                                     "bytes, the derivation %llu", tiers[t][0], tiers[t][1],
                                     bf16 ? "bf16" : "fp32", boxes, k, s + 1,
                                     (unsigned long long)runs[k].net_bytes[s],
                                     (unsigned long long)want.net_bytes);
                    result_free(&runs[k].res);
                }
                /* fp32 master, m and v, all devices: 1/B of every block */
                const uint64_t whole = sizeof(float) * padded;
                for (int kind = FSO_KIND_MASTER; kind < FSO_N_KINDS; kind++)
                    if (fso_fp_sliced((fso_kind)kind))
                        assert_int_equal(per_box.kind_bytes[kind] * (uint64_t)boxes, whole);
            }
}

static void test_backward_schedule_is_refused_across_boxes(void **state)
{
    (void)state;
    fso_config c;
    job(&c, 1, 2, 1);
    c.optimizer_overlap = FSO_OVERLAP_BACKWARD;
    c.grad_clip = 0;
    assert_int_equal(fso_config_set_boxes(&c, 2, 0), 0);
    fso_coll *g, *p;
    assert_int_equal(fso_coll_create_threads(&g, 2), 0);
    assert_int_equal(fso_coll_create_threads(&p, 2), 0);
    fso_rails rails = {.box = 0, .boxes = 2, .devices = 1, .grad = {g}, .param = {p}};
    fso_trainer tr;
    assert_int_equal(fso_trainer_init_on(&tr, &c, &rails), -EINVAL);
    assert_non_null(strstr(tr.err, "train.optimizer_overlap \"backward\""));
    assert_non_null(strstr(tr.err, "\"forward\""));
    fso_trainer_free(&tr);
    fso_coll_destroy(g);
    fso_coll_destroy(p);
}

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(nvme_dir, sizeof nvme_dir, "%s/fso_zero_boxes_%d", tmp ? tmp : "/tmp", getpid());
    mkdir(nvme_dir, 0700);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rmdir(nvme_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_boxes_are_two_devices_bit_for_bit),
        cmocka_unit_test(test_two_boxes_under_gpu_rules),
        cmocka_unit_test(test_two_boxes_on_device_rails),
        cmocka_unit_test(test_two_boxes_of_two_agree_with_four_devices),
        cmocka_unit_test(test_net_bytes_are_the_derivation),
        cmocka_unit_test(test_backward_schedule_is_refused_across_boxes),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
