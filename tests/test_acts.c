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
 *    their agreement, and the host tier refused without checkpointing.
 */
#include <errno.h>
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
 * host buffer it needs, naming the fix. */
static void test_model_refuses_host_without_checkpointing(void **s)
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_keys),
        cmocka_unit_test(test_model_refuses_host_without_checkpointing),
        cmocka_unit_test(test_step_act_bytes_are_the_arithmetic),
        cmocka_unit_test(test_host_tier_gives_the_device_bits_on_cpu),
        cmocka_unit_test(test_host_tier_gives_the_device_bits_under_gpu_rules),
        cmocka_unit_test(test_a_cap_that_fits_only_host_activations),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
