/* test_ds_config.c — DeepSpeed configs load as DeepSpeed loads them: the
 * batch triple (any two of train_batch_size, train_micro_batch_size_per_gpu
 * and gradient_accumulation_steps give the third, with the device count),
 * "auto" taken where the planner chooses (origin FSO_ORIGIN_AUTO) and
 * refused elsewhere naming the key, DeepSpeed's sections ignored with one
 * line or refused by name, fp16 refused (engine/config/config_ds.c).
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
#include "test_util.h"
#include "test_config_util.h"

/* text loaded on `world` devices (--devices cpu:N sets it before loading) */
static int load_world(tdir *t, fso_config *c, int world, const char *text)
{
    fso_config_defaults(c);
    c->world = world;
    int rc = fso_config_load_file(c, write_cfg(t, "job.json", text));
    if (rc == 0)
        rc = fso_config_finish(c);
    fso_config_free(c);
    return rc;
}

#define LOADS(t, c, world, text)                                                          \
    do {                                                                                  \
        if (load_world((t), (c), (world), (text)) != 0)                                   \
            fail_msg("%s", (c)->err);                                                     \
    } while (0)

static void expect_batch(const fso_config *c, int mb, int ga, int64_t global)
{
    assert_int_equal(c->micro_batch, mb);
    assert_int_equal(c->grad_accum, ga);
    assert_int_equal(c->global_batch, global);
}

/* ---------------------------------------------------------------- the batch triple */

/* Two of the three give the third; one alone takes DeepSpeed's rule. */
static void test_batch_two_give_the_third(void **state)
{
    tdir *t = *state;
    fso_config c;
    LOADS(t, &c, 2, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4}");
    expect_batch(&c, 4, 8, 64);
    LOADS(t, &c, 2, "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 4}");
    expect_batch(&c, 8, 4, 64);
    LOADS(t, &c, 2, "{\"train_micro_batch_size_per_gpu\": 3, \"gradient_accumulation_steps\": 5}");
    expect_batch(&c, 3, 5, 30);
    LOADS(t, &c, 4, "{\"train_batch_size\": 4096, \"train_micro_batch_size_per_gpu\": 16, "
                    "\"gradient_accumulation_steps\": 64}");
    expect_batch(&c, 16, 64, 4096);
    /* train_batch_size alone: one accumulation step, an equal share per device */
    LOADS(t, &c, 4, "{\"train_batch_size\": 256}");
    expect_batch(&c, 64, 1, 256);
    /* the micro-batch alone: one accumulation step */
    LOADS(t, &c, 2, "{\"train_micro_batch_size_per_gpu\": 6}");
    expect_batch(&c, 6, 1, 12);
    /* the accumulation alone (DeepSpeed refuses): fsoff's default micro-batch, 8 */
    LOADS(t, &c, 1, "{\"gradient_accumulation_steps\": 3}");
    expect_batch(&c, 8, 3, 24);
    /* none: the defaults */
    LOADS(t, &c, 3, "{}");
    expect_batch(&c, 8, 1, 24);
    /* a --set counts as given: train_batch_size with the file's micro-batch */
    const char *sets[] = {"train_batch_size=48"};
    fso_config_defaults(&c);
    c.world = 2;
    int rc = fso_config_load_file(&c, write_cfg(t, "mb.json",
                                                "{\"train_micro_batch_size_per_gpu\": 6}"));
    for (int i = 0; rc == 0 && i < 1; i++)
        rc = fso_config_set(&c, sets[i]);
    if (rc == 0)
        rc = fso_config_finish(&c);
    fso_config_free(&c);
    if (rc != 0)
        fail_msg("%s", c.err);
    expect_batch(&c, 6, 4, 48);
    assert_true(fso_config_pinned(&c, "train_batch_size"));
    assert_false(fso_config_pinned(&c, "gradient_accumulation_steps"));
}

/* A real contradiction is refused naming the keys, the numbers and the fix. */
static void test_batch_contradictions_are_refused(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_world(t, &c, 2, "{\"train_batch_size\": 100, "
                                          "\"train_micro_batch_size_per_gpu\": 4, "
                                          "\"gradient_accumulation_steps\": 8}"),
                     -EINVAL);
    expect_err(&c, "%s:1:2: train_batch_size: must equal train_micro_batch_size_per_gpu (4) x "
                   "gradient_accumulation_steps (8) x devices (2) = 64, got 100; drop one of "
                   "the three and fsoff derives it as DeepSpeed does, or make them agree",
               t->file);
    assert_int_equal(load_world(t, &c, 2, "{\"train_batch_size\": 100, "
                                          "\"train_micro_batch_size_per_gpu\": 3}"),
                     -EINVAL);
    expect_err(&c, "%s:1:2: train_batch_size: 100 is not a multiple of "
                   "train_micro_batch_size_per_gpu (3) x devices (2) = 6, so no whole "
                   "gradient_accumulation_steps gives it; make train_batch_size a multiple of "
                   "6, or change train_micro_batch_size_per_gpu", t->file);
    assert_int_equal(load_world(t, &c, 4, "{\"train_batch_size\": 8, "
                                          "\"gradient_accumulation_steps\": 4}"),
                     -EINVAL);
    expect_err(&c, "%s:1:2: train_batch_size: 8 is not a multiple of "
                   "gradient_accumulation_steps (4) x devices (4) = 16, so no whole "
                   "train_micro_batch_size_per_gpu gives it; make train_batch_size a multiple "
                   "of 16, or change gradient_accumulation_steps", t->file);
    assert_int_equal(load_world(t, &c, 4, "{\"train_batch_size\": 10}"), -EINVAL);
    expect_err(&c, "%s:1:2: train_batch_size: 10 is not a multiple of the devices (4); with "
                   "neither train_micro_batch_size_per_gpu nor gradient_accumulation_steps "
                   "given, each device takes train_batch_size / devices sequences in one step, "
                   "so make it a multiple of 4", t->file);
}

/* The device count set after loading (fsoff plan --gpus N, a plan's
 * world) resolves the triple again from what the user gave. */
static void test_batch_follows_a_new_device_count(void **state)
{
    tdir *t = *state;
    fso_config c;
    LOADS(t, &c, 1, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4}");
    expect_batch(&c, 4, 16, 64);
    assert_int_equal(fso_config_set_world(&c, 4), 0);
    assert_int_equal(c.world, 4);
    expect_batch(&c, 4, 4, 64);
    assert_int_equal(fso_config_set_world(&c, 3), -EINVAL);
    assert_string_equal(c.err, "on 3 devices: train_batch_size: 64 is not a multiple of "
                               "train_micro_batch_size_per_gpu (4) x devices (3) = 12, so no "
                               "whole gradient_accumulation_steps gives it; make "
                               "train_batch_size a multiple of 12, or change "
                               "train_micro_batch_size_per_gpu");
    /* both "auto": the planner's split of the same global batch */
    LOADS(t, &c, 1, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": \"auto\", "
                    "\"gradient_accumulation_steps\": \"auto\"}");
    expect_batch(&c, 64, 1, 64);
    assert_int_equal(fso_config_set_world(&c, 8), 0);
    expect_batch(&c, 8, 1, 64);
    /* no train_batch_size: the global batch follows the devices */
    LOADS(t, &c, 1, "{\"train_micro_batch_size_per_gpu\": 6, \"gradient_accumulation_steps\": 2}");
    assert_int_equal(fso_config_set_world(&c, 2), 0);
    expect_batch(&c, 6, 2, 24);
}

/* ---------------------------------------------------------------- "auto" */

/* transformers' documented ZeRO-3 config, with the global batch written as
 * a number: the Trainer's other placeholders where the planner chooses */
static const char zero3_auto[] =
    "{\n"
    "  \"bf16\": {\"enabled\": true},\n"
    "  \"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0, \"loss_scale_window\": 1000,\n"
    "           \"initial_scale_power\": 16, \"hysteresis\": 2, \"min_loss_scale\": 1},\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-5, \"betas\": [0.9, 0.999],\n"
    "                \"eps\": 1e-8, \"weight_decay\": 0.0}},\n"
    "  \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,\n"
    "                \"warmup_max_lr\": 3e-5, \"warmup_num_steps\": 100}},\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 3,\n"
    "    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
    "    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
    "    \"overlap_comm\": true, \"contiguous_gradients\": true, \"sub_group_size\": 1e9,\n"
    "    \"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": \"auto\",\n"
    "    \"stage3_param_persistence_threshold\": \"auto\",\n"
    "    \"stage3_max_live_parameters\": \"auto\", \"stage3_max_reuse_distance\": 1e9,\n"
    "    \"stage3_gather_16bit_weights_on_model_save\": true\n"
    "  },\n"
    "  \"aio\": {\"block_size\": \"auto\", \"queue_depth\": \"auto\", \"thread_count\": \"auto\"},\n"
    "  \"gradient_accumulation_steps\": \"auto\",\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 2000,\n"
    "  \"train_batch_size\": 64,\n"
    "  \"train_micro_batch_size_per_gpu\": \"auto\",\n"
    "  \"wall_clock_breakdown\": false\n"
    "}\n";

static void test_auto_where_the_planner_chooses(void **state)
{
    tdir *t = *state;
    fso_config c;
    LOADS(t, &c, 4, zero3_auto);
    /* provisional: the global batch held, one accumulation step */
    expect_batch(&c, 16, 1, 64);
    static const char *const auto_keys[] = {
        "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_max_live_parameters", "aio.block_size", "aio.queue_depth",
    };
    for (size_t i = 0; i < sizeof auto_keys / sizeof auto_keys[0]; i++) {
        if (fso_config_origin_of(&c, auto_keys[i]) != FSO_ORIGIN_AUTO)
            fail_msg("%s: origin %d, expected FSO_ORIGIN_AUTO", auto_keys[i],
                     fso_config_origin_of(&c, auto_keys[i]));
        assert_false(fso_config_pinned(&c, auto_keys[i]));
    }
    assert_int_equal(fso_config_origin_of(&c, "train_batch_size"), FSO_ORIGIN_FILE);
    assert_true(fso_config_pinned(&c, "train_batch_size"));
    assert_int_equal(c.offload.aio_block_bytes, 1 << 20);
    assert_int_equal(c.offload.aio_queue_depth, 32);
    assert_int_equal(c.offload.prefetch_blocks, 2);
    assert_false(c.offload.per_kind);
    assert_int_equal(c.offload.param_tier, FSO_TIER_HOST);
    assert_int_equal(c.offload.optim_tier, FSO_TIER_HOST);
    assert_true(c.bf16);

    /* one of the two "auto": the other divides the global batch */
    LOADS(t, &c, 2, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4, "
                    "\"gradient_accumulation_steps\": \"auto\"}");
    expect_batch(&c, 4, 8, 64);
    LOADS(t, &c, 2, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": \"auto\", "
                    "\"gradient_accumulation_steps\": 2}");
    expect_batch(&c, 16, 2, 64);
    /* DeepSpeed's autotuner's shape: the micro-batch "auto" alone */
    LOADS(t, &c, 1, "{\"train_micro_batch_size_per_gpu\": \"auto\", "
                    "\"autotuning\": {\"enabled\": true, \"fast\": true}}");
    expect_batch(&c, 8, 1, 8);
    assert_int_equal(fso_config_origin_of(&c, "train_micro_batch_size_per_gpu"),
                     FSO_ORIGIN_AUTO);
    assert_false(fso_config_pinned(&c, "train_batch_size"));
}

/* Where no choice is sensible "auto" is refused naming the key and what to
 * write: the global batch, the optimizer's and schedule's numbers, ... */
static void test_auto_refused_where_no_choice_is_sensible(void **state)
{
    tdir *t = *state;
    fso_config c;
    /* transformers' documented ZeRO-2 config as it is: "auto" everywhere */
    assert_int_equal(load_world(t, &c, 1,
                                "{\n"
                                "  \"fp16\": {\"enabled\": \"auto\"},\n"
                                "  \"bf16\": {\"enabled\": \"auto\"},\n"
                                "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}},\n"
                                "  \"zero_optimization\": {\"stage\": 2, \"allgather_partitions\": true,\n"
                                "    \"reduce_bucket_size\": \"auto\", \"round_robin_gradients\": true},\n"
                                "  \"gradient_accumulation_steps\": \"auto\",\n"
                                "  \"gradient_clipping\": \"auto\",\n"
                                "  \"train_batch_size\": \"auto\",\n"
                                "  \"train_micro_batch_size_per_gpu\": \"auto\"\n"
                                "}\n"),
                     -EINVAL);
    expect_err(&c, "%s:9:3: train_batch_size: expected an integer >= 1, got \"auto\" (string); "
                   "\"auto\" is a placeholder the Hugging Face Trainer fills in before "
                   "DeepSpeed reads the config, and fsoff reads the file as written: write the "
                   "value itself (the Trainer's per_device_train_batch_size x "
                   "gradient_accumulation_steps x devices)", t->file);
    static const struct {
        const char *set, *key, *arg;
    } refused[] = {
        {"gradient_clipping=\"auto\"", "gradient_clipping", "max_grad_norm"},
        {"optimizer.params.lr=\"auto\"", "optimizer.params.lr", "learning_rate"},
        {"optimizer.params.betas=\"auto\"", "optimizer.params.betas", "[adam_beta1, adam_beta2]"},
        {"optimizer.params.weight_decay=\"auto\"", "optimizer.params.weight_decay",
         "weight_decay"},
        {"scheduler.params.warmup_num_steps=\"auto\"", "scheduler.params.warmup_num_steps",
         "warmup_steps"},
        {"bf16.enabled=\"auto\"", "bf16.enabled", "bf16 or fp16"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char want[300];
        const char *sets[] = {refused[i].set};
        assert_int_equal(load_sets(&c, sets, 1), -EINVAL);
        snprintf(want, sizeof want, "--set %s: %s: expected ", refused[i].set, refused[i].key);
        if (strncmp(c.err, want, strlen(want)) != 0)
            fail_msg("%s: got %s", refused[i].set, c.err);
        snprintf(want, sizeof want, "write the value itself (the Trainer's %s)", refused[i].arg);
        if (!strstr(c.err, want))
            fail_msg("%s: no \"%s\" in %s", refused[i].set, want, c.err);
    }
    /* the accumulation is the planner's only with a global batch to split */
    assert_int_equal(load_world(t, &c, 1, "{\"train_micro_batch_size_per_gpu\": 4, "
                                          "\"gradient_accumulation_steps\": \"auto\"}"),
                     -EINVAL);
    expect_err(&c, "%s:1:39: gradient_accumulation_steps: \"auto\" needs a train_batch_size to "
                   "split: the planner chooses the accumulation steps that give it; give "
                   "train_batch_size, or a number here", t->file);
}

/* ---------------------------------------------------------------- sections */

static void test_fp16_enabled_is_rejected(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"fp16\": {\n    \"enabled\": true\n  }\n}\n"),
                     -EINVAL);
    expect_err(&c, "%s:3:5: fp16.enabled: fp16 loss scaling is not supported; use bf16.enabled",
               t->file);
}

static int load_hf_style(tdir *t, fso_config *c)
{
    return load_text(t, c,
                     "{\n"
                     "  \"wall_clock_breakdown\": false,\n"
                     "  \"fp16\": {\"enabled\": false, \"loss_scale\": 0},\n"
                     "  \"optimizer\": {\"type\": \"adam\", \"params\": {\"fused\": true}},\n"
                     "  \"model\": {\n"
                     "    \"architectures\": [\"LlamaForCausalLM\"],\n"
                     "    \"model_type\": \"llama\", \"hidden_act\": \"silu\",\n"
                     "    \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1,\n"
                     "    \"pad_token_id\": null, \"rope_scaling\": null, \"pretraining_tp\": 1,\n"
                     "    \"attention_bias\": false, \"mlp_bias\": false,\n"
                     "    \"attention_dropout\": 0.0, \"use_cache\": true,\n"
                     "    \"hidden_size\": 64, \"num_attention_heads\": 4,\n"
                     "    \"max_position_embeddings\": 128\n"
                     "  }\n"
                     "}\n");
}

static void test_ignored_keys_warn_and_load(void **state)
{
    tdir *t = *state;
    fso_config c;
    int rc;
    char *err = capture_stderr(t, load_hf_style, &c, &rc);
    if (rc != 0)
        fail_msg("%s", c.err);
    char want[1024];
    const char *lines[] = {
        "%s:2:3: wall_clock_breakdown: understood but ignored: fsoff prints the time of every "
        "step anyway\n",
        "%s:3:30: fp16.loss_scale: understood but ignored: fp16 is disabled (fsoff has no fp16 "
        "loss scaling)\n",
        "%s:4:44: optimizer.params.fused: understood but ignored: fsoff runs its own AdamW\n",
        "%s:6:5: model.architectures: understood but ignored: fsoff builds the model from the "
        "shape keys alone\n",
        "%s:9:5: model.pad_token_id: understood but ignored: fsoff trains on token streams as "
        "they are\n",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        char line[600];
        snprintf(line, sizeof(line), lines[i], t->file);
        snprintf(want, sizeof(want), "fsoff: warning: %s", line);
        if (!strstr(err, want))
            fail_msg("missing warning:\n%sin:\n%s", want, err);
    }
    free(err);
    assert_int_equal(c.model.hidden_size, 64);
    assert_int_equal(c.model.num_key_value_heads, 4);
}


static int load_ds_sections(tdir *t, fso_config *c)
{
    return load_text(t, c,
                     "{\n"
                     "  \"train_batch_size\": 16,\n"
                     "  \"autotuning\": {\"enabled\": true, \"arg_mappings\": {}},\n"
                     "  \"flops_profiler\": {\"enabled\": true, \"profile_step\": 1},\n"
                     "  \"tensorboard\": {\"enabled\": true, \"output_path\": \"tb/\"},\n"
                     "  \"progressive_layer_drop\": {\"enabled\": false, \"theta\": 0.5},\n"
                     "  \"communication_data_type\": \"fp32\",\n"
                     "  \"bfloat16\": {\"enabled\": true},\n"
                     "  \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": false}\n"
                     "}\n");
}

/* DeepSpeed's sections that do not change what is computed load with one
 * line each; so does a refusable one whose enabled is false; bfloat16 is
 * DeepSpeed's older name of bf16. */
static void test_ds_sections_ignored_with_their_line(void **state)
{
    tdir *t = *state;
    fso_config c;
    int rc;
    char *err = capture_stderr(t, load_ds_sections, &c, &rc);
    if (rc != 0)
        fail_msg("%s", c.err);
    const char *lines[] = {
        "%s:3:3: autotuning: understood but ignored: fsoff's planner chooses placement and "
        "prefetch itself (fsoff plan); DeepSpeed's autotuner does not run\n",
        "%s:4:3: flops_profiler: understood but ignored: fsoff prints each step's time and "
        "tokens per second instead\n",
        "%s:5:3: tensorboard: understood but ignored: fsoff writes its metrics as JSON lines "
        "(--metrics)\n",
        "%s:6:3: progressive_layer_drop: understood but ignored: not enabled, as DeepSpeed "
        "reads it (fsoff has no progressive layer drop)\n",
        "%s:7:3: communication_data_type: understood but ignored: fsoff reduces gradients in "
        "fp32 (train.gradient_dtype \"bf16\" sends bf16 and sums in fp32)\n",
        "%s:9:37: zero_optimization.zero_quantized_weights: understood but ignored: false, as "
        "fsoff does\n",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        char line[600], want[700];
        snprintf(line, sizeof(line), lines[i], t->file);
        snprintf(want, sizeof(want), "fsoff: warning: %s", line);
        if (!strstr(err, want))
            fail_msg("missing warning:\n%sin:\n%s", want, err);
    }
    free(err);
    assert_true(c.bf16);
    expect_batch(&c, 16, 1, 16);
}

/* Sections and types that change the arithmetic are refused by name. */
static void test_ds_features_refused_by_name(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\"progressive_layer_drop\": {\"enabled\": true, "
                                      "\"theta\": 0.5, \"gamma\": 0.001}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:29: progressive_layer_drop.enabled: fsoff does not implement "
                   "DeepSpeed's progressive layer drop, which skips layers with a probability "
                   "that grows over training; remove the \"progressive_layer_drop\" section or "
                   "set its enabled to false", t->file);
    assert_int_equal(load_text(t, &c, "{\"sparse_attention\": {\"mode\": \"fixed\"}}"), -EINVAL);
    expect_err(&c, "%s:1:2: sparse_attention: fsoff does not implement DeepSpeed's sparse "
                   "attention (block-sparse layouts); fsoff's attention is dense causal "
                   "attention; remove the \"sparse_attention\" section", t->file);
    assert_int_equal(load_text(t, &c, "{\"compression_training\": {\"weight_quantization\": "
                                      "{\"shared_parameters\": {\"enabled\": true}}}}"),
                     -EINVAL);
    assert_non_null(strstr(c.err, "compression_training.weight_quantization.shared_parameters."
                                  "enabled: fsoff does not implement DeepSpeed's compression "
                                  "training (quantization-aware training"));
    /* its techniques all off: ignored */
    if (load_text(t, &c, "{\"compression_training\": {\"layer_reduction\": {\"enabled\": "
                         "false}, \"sparse_pruning\": {\"shared_parameters\": "
                         "{\"enabled\": false}}}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(load_text(t, &c, "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": "
                                      "{\"lr\": 1e-4, \"freeze_step\": 100}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:16: optimizer.type: fsoff does not implement DeepSpeed's 1-bit Adam, "
                   "which compresses the momentum it communicates after freeze_step; it "
                   "implements \"AdamW\" (\"Adam\" with adam_w_mode true is the same)", t->file);
    assert_int_equal(load_text(t, &c, "{\"scheduler\": {\"type\": \"OneCycle\"}}"), -EINVAL);
    expect_err(&c, "%s:1:16: scheduler.type: fsoff does not implement DeepSpeed's OneCycle "
                   "schedule, which cycles the learning rate and momentum; use "
                   "\"WarmupCosineLR\", \"WarmupLR\" or \"WarmupDecayLR\" (or scheduler null "
                   "for a constant learning rate)", t->file);
    if (load_text(t, &c, "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                         "{\"last_batch_iteration\": -1}}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(load_text(t, &c, "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                                      "{\"last_batch_iteration\": 99}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:47: scheduler.params.last_batch_iteration: fsoff does not implement "
                   "DeepSpeed's schedule started part-way; it starts at the run's step (a "
                   "resumed run's at its checkpoint's), so only -1, DeepSpeed's default, is "
                   "taken, got 99 (number)", t->file);
    assert_int_equal(load_text(t, &c, "{\"zero_optimization\": {\"zero_quantized_gradients\": "
                                      "true}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:24: zero_optimization.zero_quantized_gradients: fsoff does not "
                   "implement ZeRO++'s quantized gradient reduce-scatter (int4 gradients, which "
                   "changes the sums); set it to false or remove it", t->file);
    assert_int_equal(load_text(t, &c, "{\"zero_optimization\": {\"cpu_offload\": true}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:24: zero_optimization.cpu_offload: DeepSpeed's old spelling of "
                   "optimizer offload; write \"offload_optimizer\": {\"device\": \"cpu\"} "
                   "instead", t->file);
    assert_int_equal(load_text(t, &c, "{\"communication_data_type\": \"fp16\"}"), -EINVAL);
    expect_err(&c, "%s:1:2: communication_data_type: fsoff reduces gradients in fp32 only, got "
                   "\"fp16\" (string); write \"fp32\" or drop it", t->file);
    assert_int_equal(load_text(t, &c, "{\"elasticity\": {\"enabled\": true}}"), -EINVAL);
    assert_non_null(strstr(c.err, "elasticity.enabled: fsoff does not implement DeepSpeed's "
                                  "elastic training"));
    /* an unknown top-level key still gets the nearest name */
    assert_int_equal(load_text(t, &c, "{\"flops_profiller\": {}}"), -EINVAL);
    expect_err(&c, "%s:1:2: flops_profiller: unknown key; did you mean \"flops_profiler\"?",
               t->file);
}

/* DeepSpeed's sections hold what DeepSpeed defines, any number of keys:
 * the origins record such a section as one key. */
static void test_a_large_ds_section_loads(void **state)
{
    tdir *t = *state;
    fso_config c;
    char text[16384];
    size_t n = (size_t)snprintf(text, sizeof text, "{\"autotuning\": {\"arg_mappings\": {");
    for (int i = 0; i < 400; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\"k%d\": %d", i ? ", " : "", i, i);
    snprintf(text + n, sizeof text - n, "}}, \"train_batch_size\": 32}");
    if (load_text(t, &c, text) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(fso_config_origin_of(&c, "autotuning"), FSO_ORIGIN_FILE);
    assert_int_equal(fso_config_origin_of(&c, "train_batch_size"), FSO_ORIGIN_FILE);
    expect_batch(&c, 32, 1, 32);
}

/* fp16.enabled "auto" can only be false here: it loads with its line. */
static void test_fp16_auto_is_false(void **state)
{
    tdir *t = *state;
    fso_config c;
    if (load_text(t, &c, "{\"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0}}") != 0)
        fail_msg("%s", c.err);
    assert_false(c.bf16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_dir, teardown_dir)
        T(test_batch_two_give_the_third),
        T(test_batch_contradictions_are_refused),
        T(test_batch_follows_a_new_device_count),
        T(test_auto_where_the_planner_chooses),
        T(test_auto_refused_where_no_choice_is_sensible),
        T(test_fp16_enabled_is_rejected),
        T(test_fp16_auto_is_false),
        T(test_ignored_keys_warn_and_load),
        T(test_ds_sections_ignored_with_their_line),
        T(test_ds_features_refused_by_name),
        T(test_a_large_ds_section_loads),
#undef T
    };
    return cmocka_run_group_tests_name("ds_config", tests, NULL, NULL);
}
