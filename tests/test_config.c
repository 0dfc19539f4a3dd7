/* test_config.c — the configuration loader: defaults, files, --set, validation,
 * error positions and the learning-rate schedules.
 *
 * Each test gets its own mkdtemp folder for the config files it writes.
 * FSO_SRCDIR (set by meson) locates configs/tiny.json.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "config/config_json.h"

#include "config/config.h"
#include "config/json_locate.h"
#include "test_util.h"
#include "boxes.h"
#include "test_config_util.h"

static void tiny_path(char *buf, size_t size)
{
    const char *src = getenv("FSO_SRCDIR");
    snprintf(buf, size, "%s/configs/tiny.json", src ? src : "..");
}

#define assert_close(a, b)                                                                \
    do {                                                                                  \
        double a_ = (a), b_ = (b);                                                        \
        if (!(fabs(a_ - b_) <= 1e-12 * fmax(1.0, fabs(b_))))                              \
            fail_msg("%s = %.17g, expected %s = %.17g", #a, a_, #b, b_);                  \
    } while (0)

/* The whole struct minus bookkeeping (source, err, doc). */
static void assert_same_job(const fso_config *a, const fso_config *b)
{
    assert_memory_equal(&a->model, &b->model, sizeof(a->model));
    assert_memory_equal(&a->optim, &b->optim, sizeof(a->optim));
    assert_memory_equal(&a->sched, &b->sched, sizeof(a->sched));
    assert_string_equal(a->data.path, b->data.path);
    assert_int_equal(a->data.format, b->data.format);
    assert_int_equal(a->data.seq_len, b->data.seq_len);
    assert_int_equal(a->micro_batch, b->micro_batch);
    assert_int_equal(a->grad_accum, b->grad_accum);
    assert_close(a->grad_clip, b->grad_clip);
    assert_int_equal(a->steps, b->steps);
    assert_int_equal(a->steps_per_print, b->steps_per_print);
    assert_int_equal(a->seed, b->seed);
    assert_int_equal(a->bf16, b->bf16);
    assert_int_equal(a->threads, b->threads);
    assert_int_equal(a->activation_checkpointing, b->activation_checkpointing);
}

/* ---------------------------------------------------------------- defaults */

static json_t *jget(json_t *root, const char *a, const char *b, const char *c)
{
    json_t *v = json_object_get(root, a);
    if (b)
        v = json_object_get(v, b);
    if (c)
        v = json_object_get(v, c);
    if (!v)
        fail_msg("configs/tiny.json has no %s%s%s%s%s", a, b ? "." : "", b ? b : "",
                 c ? "." : "", c ? c : "");
    return v;
}

static void test_defaults_are_tiny_json(void **state)
{
    (void)state;
    char path[4096];
    tiny_path(path, sizeof(path));
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j)
        fail_msg("%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);

    fso_config c;
    fso_config_defaults(&c);
    assert_null(c.doc);
    assert_string_equal(c.source, "");
    assert_string_equal(c.err, "");
    assert_int_equal(c.model.vocab_size, json_integer_value(jget(j, "model", "vocab_size", NULL)));
    assert_int_equal(c.model.hidden_size,
                     json_integer_value(jget(j, "model", "hidden_size", NULL)));
    assert_int_equal(c.model.intermediate_size,
                     json_integer_value(jget(j, "model", "intermediate_size", NULL)));
    assert_int_equal(c.model.num_hidden_layers,
                     json_integer_value(jget(j, "model", "num_hidden_layers", NULL)));
    assert_int_equal(c.model.num_attention_heads,
                     json_integer_value(jget(j, "model", "num_attention_heads", NULL)));
    assert_int_equal(c.model.num_key_value_heads,
                     json_integer_value(jget(j, "model", "num_key_value_heads", NULL)));
    assert_int_equal(c.model.head_dim, c.model.hidden_size / c.model.num_attention_heads);
    assert_int_equal(c.model.max_position_embeddings,
                     json_integer_value(jget(j, "model", "max_position_embeddings", NULL)));
    assert_close(c.model.rms_norm_eps, json_number_value(jget(j, "model", "rms_norm_eps", NULL)));
    assert_close(c.model.rope_theta, json_number_value(jget(j, "model", "rope_theta", NULL)));
    assert_close(c.model.initializer_range,
                 json_number_value(jget(j, "model", "initializer_range", NULL)));
    assert_int_equal(c.model.tie_word_embeddings,
                     json_is_true(jget(j, "model", "tie_word_embeddings", NULL)));

    assert_int_equal(c.micro_batch,
                     json_integer_value(jget(j, "train_micro_batch_size_per_gpu", NULL, NULL)));
    assert_int_equal(c.grad_accum,
                     json_integer_value(jget(j, "gradient_accumulation_steps", NULL, NULL)));
    assert_close(c.grad_clip, json_number_value(jget(j, "gradient_clipping", NULL, NULL)));
    assert_int_equal(c.steps_per_print, json_integer_value(jget(j, "steps_per_print", NULL, NULL)));
    assert_int_equal(c.seed, json_integer_value(jget(j, "seed", NULL, NULL)));
    assert_int_equal(c.bf16, json_is_true(jget(j, "bf16", "enabled", NULL)));

    json_t *p = jget(j, "optimizer", "params", NULL);
    assert_close(c.optim.lr, json_number_value(jget(p, "lr", NULL, NULL)));
    assert_close(c.optim.beta1, json_number_value(json_array_get(jget(p, "betas", NULL, NULL), 0)));
    assert_close(c.optim.beta2, json_number_value(json_array_get(jget(p, "betas", NULL, NULL), 1)));
    assert_close(c.optim.eps, json_number_value(jget(p, "eps", NULL, NULL)));
    assert_close(c.optim.weight_decay, json_number_value(jget(p, "weight_decay", NULL, NULL)));

    assert_string_equal(json_string_value(jget(j, "scheduler", "type", NULL)), "WarmupCosineLR");
    assert_int_equal(c.sched.type, FSO_SCHED_WARMUP_COSINE);
    p = jget(j, "scheduler", "params", NULL);
    assert_int_equal(c.sched.warmup_num_steps,
                     json_integer_value(jget(p, "warmup_num_steps", NULL, NULL)));
    assert_close(c.sched.warmup_min_ratio, json_number_value(jget(p, "warmup_min_ratio", NULL, NULL)));
    assert_close(c.sched.cos_min_ratio, json_number_value(jget(p, "cos_min_ratio", NULL, NULL)));
    assert_string_equal(json_string_value(jget(p, "warmup_type", NULL, NULL)), "linear");
    assert_int_equal(c.sched.warmup_type, FSO_WARMUP_LINEAR);
    assert_int_equal(c.sched.total_num_steps, 0);

    assert_string_equal(c.data.path, json_string_value(jget(j, "data", "path", NULL)));
    assert_string_equal(json_string_value(jget(j, "data", "format", NULL)), "auto");
    assert_int_equal(c.data.format, FSO_DATA_AUTO);
    assert_int_equal(c.data.seq_len, json_integer_value(jget(j, "data", "seq_len", NULL)));
    assert_int_equal(c.steps, json_integer_value(jget(j, "train", "steps", NULL)));
    assert_int_equal(c.threads, json_integer_value(jget(j, "train", "threads", NULL)));
    assert_int_equal(c.activation_checkpointing,
                     json_is_true(jget(j, "train", "activation_checkpointing", NULL)));
    assert_int_equal(c.optim.decay_norms, json_is_true(jget(j, "train", "weight_decay_norms", NULL)));
    assert_int_equal(c.optim.decay_embeddings,
                     json_is_true(jget(j, "train", "weight_decay_embeddings", NULL)));
    json_decref(j);

    /* finish() with nothing loaded keeps the defaults. */
    fso_config d = c;
    assert_int_equal(fso_config_finish(&d), 0);
    assert_same_job(&c, &d);
    fso_config_free(&d);
}

static void test_loading_tiny_json_gives_the_defaults(void **state)
{
    (void)state;
    char path[4096];
    tiny_path(path, sizeof(path));
    fso_config def, c;
    fso_config_defaults(&def);
    if (load(&c, path, NULL, 0) != 0)
        fail_msg("%s", c.err);
    assert_same_job(&def, &c);
    assert_string_equal(c.source, path);
}

static void test_empty_object_is_the_default_job(void **state)
{
    fso_config def, c;
    fso_config_defaults(&def);
    if (load_text(*state, &c, "{}\n") != 0)
        fail_msg("%s", c.err);
    assert_same_job(&def, &c);
}

/* ---------------------------------------------------------------- file errors */

static void test_missing_file_is_named(void **state)
{
    tdir *t = *state;
    char path[600];
    snprintf(path, sizeof(path), "%s/nope.json", t->path);
    fso_config c;
    assert_int_equal(load(&c, path, NULL, 0), -ENOENT);
    expect_err(&c, "%s: cannot open config: No such file or directory; check the --config path", path);
}

static void test_empty_file_is_an_error(void **state)
{
    fso_config c;
    assert_int_equal(load_text(*state, &c, " \n\t\n"), -EINVAL);
    expect_err(&c, "%s: config file is empty; write a JSON object ({} runs the built-in defaults)",
               ((tdir *)*state)->file);
}

static void test_malformed_json_reports_line_and_column(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"model\": {\n    \"hidden_size\": 12,,\n  }\n}\n"),
                     -EINVAL);
    /* jansson points at the last character of the bad token: the second comma. */
    expect_err(&c, "%s:3:23: string or '}' expected near ','", t->file);

    assert_int_equal(load_text(t, &c, "{\n  \"seed\": 1\n"), -EINVAL);
    expect_err(&c, "%s:3:0: '}' expected near end of file", t->file);
}

static void test_duplicate_key_reports_position(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"seed\": 1,\n  \"seed\": 2\n}\n"), -EINVAL);
    expect_err(&c, "%s:3:8: duplicate object key near '\"seed\"'; each key may appear once per "
                   "object", t->file);
}

static void test_top_level_must_be_an_object(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "\n  [1, 2]\n"), -EINVAL);
    expect_err(&c, "%s:2:3: expected a JSON object at the top level, got array; put the "
                   "settings in { }", t->file);
}

/* ---------------------------------------------------------------- unknown keys */

static void test_unknown_top_level_key_is_located(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"seed\": 1,\n  \"modle\": {}\n}\n"), -EINVAL);
    expect_err(&c, "%s:3:3: modle: unknown key; did you mean \"model\"?", t->file);

    assert_int_equal(load_text(t, &c, "{\"zero_optimisation_stage_whatever\": 3}"), -EINVAL);
    expect_err(&c, "%s:1:2: zero_optimisation_stage_whatever: unknown key; check its spelling, "
                   "or remove it", t->file);
}

static void test_unknown_nested_key_names_full_path(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c,
                               "{\n"
                               "  \"optimizer\": {\n"
                               "    \"type\": \"AdamW\",\n"
                               "    \"params\": {\n"
                               "      \"lr\": 0.001,\n"
                               "\t\"beta\": [0.9, 0.99]\n"
                               "    }\n"
                               "  }\n"
                               "}\n"),
                     -EINVAL);
    expect_err(&c, "%s:6:2: optimizer.params.beta: unknown key; did you mean \"betas\"?", t->file);

    assert_int_equal(load_text(t, &c, "{\"data\": {\"seq_len\": 64, \"shuffle\": true}}"), -EINVAL);
    expect_err(&c, "%s:1:26: data.shuffle: unknown key; the keys here are: path, format, seq_len, "
               "documents, val_path, val_every, val_batches",
               t->file);

    /* Scheduler params are checked against the chosen type. */
    assert_int_equal(load_text(t, &c,
                               "{\"scheduler\": {\"type\": \"WarmupLR\",\n"
                               " \"params\": {\"cos_min_ratio\": 0.1}}}"),
                     -EINVAL);
    expect_err(&c, "%s:2:13: scheduler.params.cos_min_ratio: unknown key for WarmupLR; the keys "
                   "here are: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, "
                   "last_batch_iteration",
               t->file);
}

/* ---------------------------------------------------------------- types and values */

static void test_wrong_types_are_explained(void **state)
{
    tdir *t = *state;
    fso_config c;

    assert_int_equal(load_text(t, &c, "{\"train\": {\"steps\": 2.5}}"), -EINVAL);
    expect_err(&c, "%s:1:12: train.steps: expected an integer >= 1, got 2.5 (number)", t->file);

    assert_int_equal(load_text(t, &c, "{\"bf16\": {\"enabled\": \"yes\"}}"), -EINVAL);
    expect_err(&c, "%s:1:11: bf16.enabled: expected true or false, got \"yes\" (string)", t->file);

    assert_int_equal(load_text(t, &c, "{\"optimizer\": {\"params\": {\"lr\": \"auto\"}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:27: optimizer.params.lr: expected a number > 0, got \"auto\" (string); "
                   "\"auto\" is a placeholder the Hugging Face Trainer fills in before DeepSpeed "
                   "reads the config, and fsoff reads the file as written: write the value itself "
                   "(the Trainer's learning_rate)", t->file);

    assert_int_equal(load_text(t, &c, "{\"data\": {\"format\": \"bin\"}}"), -EINVAL);
    expect_err(&c, "%s:1:11: data.format: expected \"auto\", \"tokens\", \"text\" or \"bytes\", got "
                   "\"bin\" (string)", t->file);

    assert_int_equal(load_text(t, &c, "{\"model\": 5}"), -EINVAL);
    expect_err(&c, "%s:1:2: model: expected an object, got 5 (number)", t->file);

    assert_int_equal(load_text(t, &c, "{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:27: optimizer.params.betas: expected an array of two numbers "
                   "[beta1, beta2], got [0.9] (array)", t->file);

    assert_int_equal(load_text(t, &c,
                               "{\"optimizer\": {\"params\": {\"betas\": [0.9,\n      1.0]}}}"),
                     -EINVAL);
    expect_err(&c, "%s:2:7: optimizer.params.betas[1]: expected a number in [0, 1), got 1 "
                   "(number)", t->file);

    assert_int_equal(load_text(t, &c, "{\"seed\": -1}"), -EINVAL);
    expect_err(&c, "%s:1:2: seed: expected an integer >= 0, got -1 (number)", t->file);

    assert_int_equal(load_text(t, &c, "{\"train_micro_batch_size_per_gpu\": 3000000000}"),
                     -EINVAL);
    expect_err(&c, "%s:1:2: train_micro_batch_size_per_gpu: expected an integer in "
                   "[1, 2147483647], got 3000000000 (number)", t->file);

    /* 3.0 is an integer. */
    if (load_text(t, &c, "{\"train\": {\"steps\": 40.0}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.steps, 40);
}

/* comm.timeout_s: how long a box waits for another (boxes.h). */
static void test_comm_timeout_default_and_bounds(void **state)
{
    tdir *t = *state;
    fso_config c;
    if (load_text(t, &c, "{}") != 0)
        fail_msg("%s", c.err);
    assert_true(c.comm_timeout_s == FSO_BOXES_TIMEOUT_S);
    if (load_text(t, &c, "{\"comm\": {\"timeout_s\": 30}}") != 0)
        fail_msg("%s", c.err);
    assert_true(c.comm_timeout_s == 30.0);
    assert_int_equal(load_text(t, &c, "{\"comm\": {\"timeout_s\": 0}}"), -EINVAL);
    assert_non_null(strstr(c.err, "comm.timeout_s"));
    assert_int_equal(load_text(t, &c, "{\"comm\": {\"timeout\": 5}}"), -EINVAL);
    assert_non_null(strstr(c.err, "timeout_s"));
}

/* comm.rails: what carries the rails across boxes of GPUs; the resolved
 * configuration carries both comm keys, so that boxes compare them. */
static void test_comm_rails(void **state)
{
    tdir *t = *state;
    fso_config c;
    if (load_text(t, &c, "{}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.comm_rails, FSO_RAILS_AUTO);
    if (load_text(t, &c, "{\"comm\": {\"rails\": \"mpi\", \"timeout_s\": 45}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.comm_rails, FSO_RAILS_MPI);
    json_t *j = fso_config_to_json(&c);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "comm"), "rails")),
                        "mpi");
    assert_true(json_real_value(json_object_get(json_object_get(j, "comm"), "timeout_s")) ==
                45.0);
    json_decref(j);
    if (load_text(t, &c, "{\"comm\": {\"rails\": \"nccl\"}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.comm_rails, FSO_RAILS_NCCL);
    assert_int_equal(load_text(t, &c, "{\"comm\": {\"rails\": \"gloo\"}}"), -EINVAL);
    assert_non_null(strstr(c.err, "comm.rails"));
    assert_non_null(strstr(c.err, "\"mpi\""));
}

static void test_heads_must_divide_hidden(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c,
                               "{\n"
                               "  \"model\": {\n"
                               "    \"hidden_size\": 128,\n"
                               "    \"num_attention_heads\": 5,\n"
                               "    \"num_key_value_heads\": 5\n"
                               "  }\n"
                               "}\n"),
                     -EINVAL);
    expect_err(&c, "%s:4:5: model.num_attention_heads: must divide model.hidden_size (128), got "
                   "5; pick a head count that divides it, or give model.head_dim", t->file);
}

static void test_kv_heads_must_divide_heads(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c,
                               "{\"model\": {\"hidden_size\": 128, \"num_attention_heads\": 4,\n"
                               "  \"num_key_value_heads\": 3}}"),
                     -EINVAL);
    expect_err(&c, "%s:2:3: model.num_key_value_heads: must divide model.num_attention_heads (4), "
                   "got 3; pick a divisor (equal to it for multi-head attention, 1 for "
                   "multi-query)", t->file);
}

static void test_head_dim_rules(void **state)
{
    tdir *t = *state;
    fso_config c;
    /* Library default heads (32) with hidden 96: head_dim 3. The key is not in the file,
     * so the position is the replaced section's. */
    assert_int_equal(load_text(t, &c, "{\n  \"model\": {\"hidden_size\": 96}\n}\n"), -EINVAL);
    expect_err(&c, "%s:2:3: model.num_attention_heads: gives an odd head_dim "
                   "(model.hidden_size / num_attention_heads = 96 / 32 = 3); rotary embeddings "
                   "need an even head_dim, so pick a head count that leaves an even quotient",
               t->file);

    /* A head_dim of its own (q, k, v project to heads x head_dim), as LlamaConfig allows;
     * then hidden_size need not divide by the heads. */
    if (load_text(t, &c,
                  "{\"model\": {\"hidden_size\": 128, \"num_attention_heads\": 3, "
                  "\"num_key_value_heads\": 1, \"head_dim\": 64}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.model.head_dim, 64);
    assert_int_equal(load_text(t, &c,
                               "{\"model\": {\"hidden_size\": 128, \"num_attention_heads\": 4, "
                               "\"head_dim\": 15}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:58: model.head_dim: must be even (rotary embeddings turn pairs of "
                   "elements), got 15", t->file);

    if (load_text(t, &c,
                  "{\"model\": {\"hidden_size\": 128, \"num_attention_heads\": 4, "
                  "\"head_dim\": 32}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.model.head_dim, 32);
}

static void test_seq_len_must_fit_max_positions(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"data\": {\"seq_len\": 512}\n}\n"), -EINVAL);
    expect_err(&c, "%s:2:12: data.seq_len: must be <= model.max_position_embeddings (256), got "
                   "512; shorten data.seq_len or raise model.max_position_embeddings", t->file);

    /* The newer of the two keys is the one to blame: here the --set. */
    const char *sets[] = {"model.max_position_embeddings=64"};
    assert_int_equal(load_sets(&c, sets, 1), -EINVAL);
    expect_err(&c, "--set model.max_position_embeddings=64: data.seq_len: must be <= "
                   "model.max_position_embeddings (64), got 128; shorten data.seq_len or raise "
                   "model.max_position_embeddings");
}

static void test_unsupported_llama_features_fail(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\"model\": {\"hidden_act\": \"gelu\"}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.hidden_act: fsoff's MLP is SwiGLU, so this must be \"silu\", "
                   "got \"gelu\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"rope_scaling\": {\"factor\": 8}}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.rope_scaling: has no \"rope_type\"; fsoff implements "
                   "\"linear\" and \"llama3\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"rope_scaling\": {\"rope_type\": \"yarn\", "
                                      "\"factor\": 4}}}"), -EINVAL);
    expect_err(&c, "%s:1:29: model.rope_scaling.rope_type: RoPE scaling of type \"yarn\" is not "
                   "supported; fsoff implements \"linear\" and \"llama3\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"rope_scaling\": {\"type\": \"dynamic\", "
                                      "\"factor\": 4}}}"), -EINVAL);
    expect_err(&c, "%s:1:29: model.rope_scaling.type: RoPE scaling of type \"dynamic\" is not "
                   "supported; fsoff implements \"linear\" and \"llama3\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"attention_bias\": true}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.attention_bias: biases on all four attention projections, "
                   "the output's (o_proj) included, are not supported; fsoff has Qwen2's biases "
                   "on q_proj, k_proj and v_proj alone, which model.model_type \"qwen2\" gives; "
                   "set it to false", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"mlp_bias\": true}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.mlp_bias: biases on the MLP projections are not supported; "
                   "set it to false", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"model_type\": \"qwen3\"}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.model_type: \"qwen3\" is not supported: fsoff lacks its "
                   "per-head RMSNorms of q and k (q_norm, k_norm); it trains \"llama\", "
                   "\"mistral\" or \"qwen2\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"model_type\": \"gpt2\"}}"), -EINVAL);
    expect_err(&c, "%s:1:12: model.model_type: fsoff trains \"llama\", \"mistral\" or "
                   "\"qwen2\" models, got \"gpt2\"", t->file);
    assert_int_equal(load_text(t, &c, "{\"optimizer\": {\"type\": \"Sophia\"}}"), -EINVAL);
    expect_err(&c, "%s:1:16: optimizer.type: fsoff implements \"AdamW\" (\"Adam\" with "
                   "adam_w_mode true is the same), got \"Sophia\" (string)", t->file);
    assert_int_equal(load_text(t, &c,
                               "{\"optimizer\": {\"type\": \"Adam\", \"params\": "
                               "{\"adam_w_mode\": false}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:43: optimizer.params.adam_w_mode: fsoff does not implement "
                   "DeepSpeed's Adam with L2 regularization; fsoff's AdamW decouples weight "
                   "decay, so set it to true or drop it", t->file);
}

/* model.model_type and the attention window: Mistral's sliding_window (its
 * default 4096 when config.json leaves it out), Qwen2's only with
 * use_sliding_window and a layer at or past max_window_layers; a window at
 * least data.seq_len long is the same model, a shorter one is refused
 * naming both keys; layer_types must be what the other keys make it. */
static void test_model_types_and_the_attention_window(void **state)
{
    tdir *t = *state;
    fso_config c;
    /* what a model section leaves out: its class's defaults */
    assert_int_equal(load_text(t, &c, "{\"model\": {\"model_type\": \"mistral\"}}"), 0);
    assert_int_equal(c.model.num_key_value_heads, 8);
    assert_int_equal(c.model.intermediate_size, 14336);
    assert_int_equal(c.model.max_position_embeddings, 131072);
    assert_int_equal(load_text(t, &c, "{\"model\": {\"model_type\": \"qwen2\"}}"), 0);
    assert_int_equal(c.model.model_type, FSO_MODEL_QWEN2);
    assert_int_equal(c.model.vocab_size, 151936);
    assert_int_equal(c.model.num_key_value_heads, 32);
    assert_int_equal(c.model.intermediate_size, 22016);
    assert_int_equal(c.model.max_position_embeddings, 32768);
    assert_true(fso_model_qkv_bias(&c.model));
    assert_int_equal(c.model.sliding_window, 4096);
    assert_int_equal(c.model.max_window_layers, 28);
    assert_int_equal(fso_model_window(&c.model), 0); /* use_sliding_window false */
    assert_int_equal(load_text(t, &c, "{\"model\": {\"model_type\": \"llama\"}}"), 0);
    assert_false(fso_model_qkv_bias(&c.model));
    assert_int_equal(c.model.sliding_window, 0);

    const char *mistral = "{\"model\": {\"model_type\": \"mistral\", \"sliding_window\": %s},"
                          " \"data\": {\"seq_len\": %d}}";
    char text[300];
    snprintf(text, sizeof text, mistral, "null", 64);
    assert_int_equal(load_text(t, &c, text), 0);
    assert_int_equal(fso_model_window(&c.model), 0);
    snprintf(text, sizeof text, mistral, "64", 64);
    assert_int_equal(load_text(t, &c, text), 0);
    assert_int_equal(fso_model_window(&c.model), 64);
    snprintf(text, sizeof text, mistral, "32", 64);
    assert_int_equal(load_text(t, &c, text), -EINVAL);
    expect_err(&c, "%s:1:69: data.seq_len: 64 is longer than model.sliding_window (32, %s:1:37): "
                   "there each position attends to the last 32 positions only, and fsoff's "
                   "attention sees the whole sequence; set data.seq_len to at most 32 (the same "
                   "model then)", t->file, t->file);

    /* qwen2: the window counts only for layers at or past max_window_layers */
    const char *qwen = "{\"model\": {\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, "
                       "\"use_sliding_window\": true, \"sliding_window\": 8, "
                       "\"max_window_layers\": %d%s}, \"data\": {\"seq_len\": 16}}";
    snprintf(text, sizeof text, qwen, 2, "");
    assert_int_equal(load_text(t, &c, text), 0);
    snprintf(text, sizeof text, qwen, 1, "");
    assert_int_equal(load_text(t, &c, text), -EINVAL);
    assert_non_null(strstr(c.err, "data.seq_len: 16 is longer than model.sliding_window (8"));
    snprintf(text, sizeof text, qwen, 2,
             ", \"layer_types\": [\"full_attention\", \"full_attention\"]");
    assert_int_equal(load_text(t, &c, text), 0);
    snprintf(text, sizeof text, qwen, 2,
             ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]");
    assert_int_equal(load_text(t, &c, text), -EINVAL);
    assert_non_null(strstr(c.err, "model.layer_types: layer 1 is \"sliding_attention\", but "
                                  "model_type, sliding_window, use_sliding_window and "
                                  "max_window_layers make it \"full_attention\""));
}

/* ---------------------------------------------------------------- merging */

static void test_optimizer_section_is_replaced(void **state)
{
    fso_config c;
    if (load_text(*state, &c, "{\"optimizer\": {\"type\": \"AdamW\"}}") != 0)
        fail_msg("%s", c.err);
    /* DeepSpeed's Adam's defaults, not the tiny job's 3e-3 / 0.95 / 0.1:
     * torch.optim.AdamW's but no weight decay, which torch_adam brings */
    assert_close(c.optim.lr, 1e-3);
    assert_close(c.optim.beta1, 0.9);
    assert_close(c.optim.beta2, 0.999);
    assert_close(c.optim.eps, 1e-8);
    assert_close(c.optim.weight_decay, 0.0);
    if (load_text(*state, &c, "{\"optimizer\": {\"type\": \"Adam\", \"params\": "
                              "{\"torch_adam\": true}}}") != 0)
        fail_msg("%s", c.err);
    assert_close(c.optim.weight_decay, 0.01);
    /* DeepSpeed's "AdamW" is AdamW whatever adam_w_mode says */
    if (load_text(*state, &c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                              "{\"adam_w_mode\": false}}}") != 0)
        fail_msg("%s", c.err);
}

static void test_model_section_takes_llama_defaults(void **state)
{
    fso_config c;
    if (load_text(*state, &c, "{\"model\": {\"num_hidden_layers\": 2}, "
                              "\"data\": {\"seq_len\": 2048}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.model.vocab_size, 32000);
    assert_int_equal(c.model.hidden_size, 4096);
    assert_int_equal(c.model.intermediate_size, 11008);
    assert_int_equal(c.model.num_hidden_layers, 2);
    assert_int_equal(c.model.num_attention_heads, 32);
    assert_int_equal(c.model.num_key_value_heads, 32);
    assert_int_equal(c.model.head_dim, 128);
    assert_int_equal(c.model.max_position_embeddings, 2048);
    assert_close(c.model.rms_norm_eps, 1e-6);
    assert_close(c.model.rope_theta, 10000.0);
    assert_close(c.model.initializer_range, 0.02);
    assert_false(c.model.tie_word_embeddings);
    assert_int_equal(c.data.seq_len, 2048);
}

static void test_scheduler_section_is_replaced(void **state)
{
    fso_config c;
    if (load_text(*state, &c, "{\"scheduler\": {\"type\": \"WarmupDecayLR\"},"
                              " \"train\": {\"steps\": 5000}}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_WARMUP_DECAY);
    assert_int_equal(c.sched.warmup_num_steps, 1000);
    assert_int_equal(c.sched.warmup_type, FSO_WARMUP_LOG);
    assert_int_equal(c.sched.total_num_steps, 0);
    assert_close(c.sched.warmup_min_lr, 0.0);
    assert_close(c.sched.warmup_max_lr, 0.001);

    if (load_text(*state, &c, "{\"scheduler\": null}") != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_CONSTANT);
}

/* Setting only the scheduler's type over the built-in defaults keeps the
 * defaults' parameters the new type takes and drops the WarmupCosineLR
 * ones; parameters the user gave for another type stay errors, in their
 * own file. */
static void test_scheduler_type_set_over_the_defaults(void **state)
{
    fso_config c;
    const char *lr[] = {"scheduler.type=WarmupLR"};
    if (load_sets(&c, lr, 1) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_WARMUP);
    assert_int_equal(c.sched.warmup_num_steps, 30);           /* the defaults' */
    assert_int_equal(c.sched.warmup_type, FSO_WARMUP_LINEAR); /* the defaults' */
    assert_close(c.sched.warmup_max_lr, 0.001);               /* DeepSpeed's */
    const char *decay[] = {"scheduler.type=WarmupDecayLR", "scheduler.params.total_num_steps=500"};
    if (load_sets(&c, decay, 2) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_WARMUP_DECAY);
    assert_int_equal(c.sched.total_num_steps, 500);
    /* a WarmupCosineLR parameter the user set is checked against the type */
    const char *mine[] = {"scheduler.params.cos_min_ratio=0.2", "scheduler.type=WarmupLR"};
    assert_int_equal(load_sets(&c, mine, 2), -EINVAL);
    expect_err(&c, "--set scheduler.params.cos_min_ratio=0.2: scheduler.params.cos_min_ratio: "
                   "unknown key for WarmupLR; the keys here are: warmup_min_lr, warmup_max_lr, "
                   "warmup_num_steps, warmup_type, last_batch_iteration");
    tdir *t = *state;
    const char *file = write_cfg(t, "job.json", "{\"scheduler\": {\"type\": \"WarmupCosineLR\",\n"
                                                " \"params\": {\"warmup_min_ratio\": 0.2}}}");
    assert_int_equal(load(&c, file, lr, 1), -EINVAL);
    expect_err(&c, "%s:2:13: scheduler.params.warmup_min_ratio: unknown key for WarmupLR; the "
                   "keys here are: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, "
                   "last_batch_iteration", t->file);
}

static void test_other_sections_merge_key_by_key(void **state)
{
    fso_config c;
    if (load_text(*state, &c, "{\"data\": {\"path\": \"corpus.bin\"}, \"train\": {\"steps\": 50},"
                              " \"seed\": 7}") != 0)
        fail_msg("%s", c.err);
    assert_string_equal(c.data.path, "corpus.bin");
    assert_int_equal(c.data.seq_len, 128);
    assert_int_equal(c.data.format, FSO_DATA_AUTO);
    assert_int_equal(c.steps, 50);
    assert_true(c.activation_checkpointing);
    assert_int_equal(c.seed, 7);
    assert_close(c.optim.lr, 3e-3); /* untouched sections keep the tiny job */
}

/* ---------------------------------------------------------------- origins */

/* Every key says whether the file, a --set or the defaults gave it: what
 * the planner keeps as the user's choice. */
static void test_origin_of_every_key(void **state)
{
    tdir *t = *state;
    fso_config c;
    const char *sets[] = {
        "train.prefetch_blocks=3",
        "zero_optimization.offload_optimizer={\"device\": \"cpu\"}",
        "data.seq_len=32",                 /* over the file's value */
    };
    write_cfg(t, "job.json", "{\"data\": {\"seq_len\": 64}, \"train\": {\"steps\": 10},"
                             " \"model\": {\"hidden_size\": 64, \"num_attention_heads\": 4,"
                             " \"num_key_value_heads\": 4},"
                             " \"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}");
    if (load(&c, t->file, sets, 3) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(fso_config_origin_of(&c, "train.steps"), FSO_ORIGIN_FILE);
    assert_int_equal(fso_config_origin_of(&c, "model.hidden_size"), FSO_ORIGIN_FILE);
    assert_int_equal(fso_config_origin_of(&c, "zero_optimization.offload_param.device"),
                     FSO_ORIGIN_FILE);
    assert_int_equal(fso_config_origin_of(&c, "train.prefetch_blocks"), FSO_ORIGIN_SET);
    assert_int_equal(fso_config_origin_of(&c, "zero_optimization.offload_optimizer.device"),
                     FSO_ORIGIN_SET);
    assert_int_equal(fso_config_origin_of(&c, "data.seq_len"), FSO_ORIGIN_SET);
    assert_int_equal(c.data.seq_len, 32);
    /* the defaults, the file's replaced section's library defaults, keys no one wrote */
    assert_int_equal(fso_config_origin_of(&c, "train.activation_checkpointing"),
                     FSO_ORIGIN_DEFAULT);
    assert_int_equal(fso_config_origin_of(&c, "seed"), FSO_ORIGIN_DEFAULT);
    assert_int_equal(fso_config_origin_of(&c, "model.vocab_size"), FSO_ORIGIN_DEFAULT);
    assert_int_equal(c.model.vocab_size, 32000);
    assert_int_equal(fso_config_origin_of(&c, "aio.block_size"), FSO_ORIGIN_DEFAULT);
    assert_int_equal(fso_config_origin_of(&c, "train"), FSO_ORIGIN_DEFAULT); /* not a leaf */

    /* a --set that replaces a section leaves what it did not write at its default */
    const char *more[] = {"zero_optimization={\"offload_param\": {\"nvme_path\": \"/x\"}}"};
    if (load(&c, t->file, more, 1) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(fso_config_origin_of(&c, "zero_optimization.offload_param.device"),
                     FSO_ORIGIN_DEFAULT);
    assert_int_equal(c.offload.param_tier, FSO_TIER_DEVICE);
    assert_int_equal(fso_config_origin_of(&c, "zero_optimization.offload_param.nvme_path"),
                     FSO_ORIGIN_SET);
    assert_int_equal(fso_config_origin_of(&c, "train.steps"), FSO_ORIGIN_FILE);

    /* nothing given: every key is a default */
    fso_config_defaults(&c);
    assert_int_equal(fso_config_finish(&c), 0);
    assert_int_equal(c.given.n, 0);
    assert_int_equal(fso_config_origin_of(&c, "train.steps"), FSO_ORIGIN_DEFAULT);
}

/* ---------------------------------------------------------------- --set */

static void test_set_overrides(void **state)
{
    tdir *t = *state;
    fso_config c;
    const char *sets[] = {
        "train.steps=77",                  /* number */
        "bf16.enabled=true",               /* bool */
        "data.path=foo.bin",               /* bare string */
        "data.format=\"text\"",            /* JSON string */
        "optimizer.params.lr=1e-4",        /* nested; the rest of the section stays */
        "gradient_clipping=0",
    };
    write_cfg(t, "job.json", "{\"data\": {\"seq_len\": 64}, \"train\": {\"steps\": 10}}");
    if (load(&c, t->file, sets, 6) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.steps, 77);
    assert_true(c.bf16);
    assert_string_equal(c.data.path, "foo.bin");
    assert_int_equal(c.data.format, FSO_DATA_TEXT);
    assert_int_equal(c.data.seq_len, 64);
    assert_close(c.optim.lr, 1e-4);
    assert_close(c.optim.beta2, 0.95);
    assert_close(c.grad_clip, 0.0);
}

/* train's per-block placement keys (config.h fso_offload_config):
 * resident_blocks and device_state_blocks are counts no larger than the
 * model's blocks (-1 when not given: the planner's choice), device_state_from
 * "last" or "first". */
static void test_train_placement_keys(void **state)
{
    (void)state;
    fso_config c;
    if (load_sets(&c, NULL, 0) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.offload.resident_blocks, -1);
    assert_int_equal(c.offload.device_state_blocks, -1);
    assert_false(c.offload.device_state_first);
    const char *ok[] = {"train.resident_blocks=3", "train.device_state_blocks=2",
                        "train.device_state_from=first"};
    if (load_sets(&c, ok, 3) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.offload.resident_blocks, 3);
    assert_int_equal(c.offload.device_state_blocks, 2);
    assert_true(c.offload.device_state_first);
    const char *too_many[] = {"train.resident_blocks=999"};
    assert_int_not_equal(load_sets(&c, too_many, 1), 0);
    if (!strstr(c.err, "train.resident_blocks") || !strstr(c.err, "but the model has"))
        fail_msg("unexpected: %s", c.err);
    const char *state_many[] = {"train.device_state_blocks=999"};
    assert_int_not_equal(load_sets(&c, state_many, 1), 0);
    if (!strstr(c.err, "train.device_state_blocks"))
        fail_msg("unexpected: %s", c.err);
    const char *from[] = {"train.device_state_from=middle"};
    assert_int_not_equal(load_sets(&c, from, 1), 0);
    if (!strstr(c.err, "device_state_from") || !strstr(c.err, "\"first\""))
        fail_msg("unexpected: %s", c.err);
}

static void test_data_path_and_format(void **state)
{
    (void)state;
    fso_config c;
    const char *tokens[] = {"data.format=tokens", "data.path=/data/fineweb_train_000001.bin"};
    if (load_sets(&c, tokens, 2) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.data.format, FSO_DATA_TOKENS);
    assert_string_equal(c.data.path, "/data/fineweb_train_000001.bin");
    /* tokens without a file is a configuration error, located */
    const char *nopath[] = {"data.format=tokens"};
    assert_int_equal(load_sets(&c, nopath, 1), -EINVAL);
    expect_err(&c, "--set data.format=tokens: data.format: is \"tokens\" but data.path is empty "
                   "(the built-in corpus is text); give a token file with --data FILE, or set "
                   "data.format to \"auto\"");

    /* The longest path that fits, then one byte more. */
    size_t room = sizeof(c.data.path) - 1;
    char *set = malloc(room + 16);
    assert_non_null(set);
    memcpy(set, "data.path=", 10);
    memset(set + 10, 'a', room);
    set[10 + room] = '\0';
    const char *sets[] = {set};
    if (load_sets(&c, sets, 1) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(strlen(c.data.path), room);
    set[10 + room] = 'a';
    set[11 + room] = '\0';
    assert_int_equal(load_sets(&c, sets, 1), -EINVAL);
    char *tail = strstr(c.err, ": data.path: ");
    assert_non_null(tail);
    assert_string_equal(tail, ": data.path: is 4096 bytes long; fsoff takes paths up to 4095 "
                              "bytes");
    free(set);
}

static void test_set_creates_sections(void **state)
{
    (void)state;
    fso_config c;
    const char *sets[] = {"scheduler=null", "scheduler.type=WarmupLR",
                          "scheduler.params.warmup_num_steps=4",
                          "scheduler.params.warmup_type=linear"};
    if (load_sets(&c, sets, 1) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_CONSTANT);
    assert_close(fso_config_lr_at(&c, 1), 3e-3);
    if (load_sets(&c, sets, 4) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_WARMUP);
    assert_int_equal(c.sched.warmup_num_steps, 4);
    assert_int_equal(c.sched.warmup_type, FSO_WARMUP_LINEAR);
    assert_close(c.sched.warmup_max_lr, 0.001);
}

static void test_set_errors_name_the_assignment(void **state)
{
    (void)state;
    fso_config c;
    const char *bad_int[] = {"train.steps=abc"};
    assert_int_equal(load_sets(&c, bad_int, 1), -EINVAL);
    expect_err(&c, "--set train.steps=abc: train.steps: expected an integer >= 1, got \"abc\" "
                   "(string)");

    const char *bad_hidden[] = {"model.hidden_size=abc"};
    assert_int_equal(load_sets(&c, bad_hidden, 1), -EINVAL);
    expect_err(&c, "--set model.hidden_size=abc: model.hidden_size: expected an integer >= 1, "
                   "got \"abc\" (string)");

    const char *bad_lr[] = {"optimizer.params.lr=-1"};
    assert_int_equal(load_sets(&c, bad_lr, 1), -EINVAL);
    expect_err(&c, "--set optimizer.params.lr=-1: optimizer.params.lr: expected a number > 0, "
                   "got -1 (number)");

    const char *unknown[] = {"train.stepz=3"};
    assert_int_equal(load_sets(&c, unknown, 1), -EINVAL);
    expect_err(&c, "--set train.stepz=3: train.stepz: unknown key; did you mean \"steps\"?");

    /* A --set that makes another key invalid is named in that key's error. */
    const char *hidden[] = {"model.hidden_size=100"};
    assert_int_equal(load_sets(&c, hidden, 1), -EINVAL);
    expect_err(&c, "--set model.hidden_size=100: model.num_attention_heads: gives an odd head_dim "
                   "(model.hidden_size / num_attention_heads = 100 / 4 = 25); rotary embeddings "
                   "need an even head_dim, so pick a head count that leaves an even quotient");

    const char *fp16[] = {"fp16.enabled=true"};
    assert_int_equal(load_sets(&c, fp16, 1), -EINVAL);
    expect_err(&c, "--set fp16.enabled=true: fp16.enabled: fp16 loss scaling is not supported; "
                   "use bf16.enabled");
}

static void test_set_syntax_errors(void **state)
{
    (void)state;
    fso_config c;
    fso_config_defaults(&c);
    assert_int_equal(fso_config_set(&c, "train.steps"), -EINVAL);
    assert_string_equal(c.err, "--set train.steps: expected key.path=value");
    assert_int_equal(fso_config_set(&c, "=5"), -EINVAL);
    assert_string_equal(c.err, "--set =5: expected key.path=value");
    assert_int_equal(fso_config_set(&c, "train..steps=5"), -EINVAL);
    assert_string_equal(c.err, "--set train..steps=5: empty key in the path; expected "
                               "key.path=value");
    assert_int_equal(fso_config_set(&c, "seed.x=5"), -EINVAL);
    assert_string_equal(c.err, "--set seed.x=5: seed is a number, not an object, so it has no "
                               "key \"x\"");
    assert_int_equal(fso_config_set(&c, "optimizer.params.betas.x=5"), -EINVAL);
    assert_string_equal(c.err, "--set optimizer.params.betas.x=5: optimizer.params.betas is an "
                               "array, not an object, so it has no key \"x\"");
    /* The document is unharmed by the failed calls. */
    assert_int_equal(fso_config_set(&c, "train.steps=99"), 0);
    if (fso_config_finish(&c) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.steps, 99);
    fso_config_free(&c);
}

static void test_set_over_file_and_warmup_check(void **state)
{
    tdir *t = *state;
    fso_config c;
    /* The tiny job warms up for 30 steps; a 20-step run is all warmup: allowed. */
    assert_int_equal(load_text(t, &c, "{\n  \"train\": {\"steps\": 20}\n}\n"), 0);
    assert_int_equal(c.steps, 20);
    assert_true(fso_config_lr_at(&c, 20) < c.optim.lr);
    fso_config_free(&c);

    /* An explicit total shorter than the warmup contradicts itself. */
    const char *sets[] = {"scheduler.params.total_num_steps=10"};
    write_cfg(t, "job.json", "{}");
    assert_int_equal(load(&c, t->file, sets, 1), -EINVAL);
    expect_err(&c, "--set scheduler.params.total_num_steps=10: "
                   "scheduler.params.warmup_num_steps: must be less than "
                   "scheduler.params.total_num_steps (10), got 30; shorten the warmup or raise "
                   "total_num_steps");
}

/* ---------------------------------------------------------------- schedules */

static void test_lr_warmup_cosine(void **state)
{
    (void)state;
    fso_config c;
    const char *sets[] = {"scheduler={\"type\": \"WarmupCosineLR\", \"params\": {"
                          "\"warmup_num_steps\": 2, \"total_num_steps\": 3, "
                          "\"warmup_type\": \"linear\", \"warmup_min_ratio\": 0.1, "
                          "\"cos_min_ratio\": 0.1}}",
                          "optimizer.params.lr=2.0"};
    if (load_sets(&c, sets, 2) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 1), 2.0 * 0.1);
    assert_close(fso_config_lr_at(&c, 2), 2.0 * 0.55);
    assert_close(fso_config_lr_at(&c, 3), 2.0 * 0.1);
    assert_close(fso_config_lr_at(&c, 50), 2.0 * 0.1); /* past the end: the floor */

    /* Log warmup over 4 steps from 0, then a cosine over 8 more to 0. */
    const char *logw[] = {"scheduler={\"type\": \"WarmupCosineLR\", \"params\": {"
                          "\"warmup_num_steps\": 4, \"total_num_steps\": 12, "
                          "\"cos_min_ratio\": 0}}",
                          "optimizer.params.lr=1.0"};
    if (load_sets(&c, logw, 2) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 1), 0.0);
    assert_close(fso_config_lr_at(&c, 2), log(2.0) / log(4.0));
    assert_close(fso_config_lr_at(&c, 4), log(4.0) / log(4.0));
    assert_close(fso_config_lr_at(&c, 5), (1 + cos(M_PI * 1 / 8)) / 2);
    assert_close(fso_config_lr_at(&c, 8), 0.5);
    assert_close(fso_config_lr_at(&c, 12), 0.0);

    /* The tiny default: linear warmup 30 steps from 0.1 to 1, cosine to 0.1 at 300. */
    fso_config_defaults(&c);
    assert_close(fso_config_lr_at(&c, 1), 3e-3 * 0.1);
    assert_close(fso_config_lr_at(&c, 16), 3e-3 * (0.1 + 0.9 * 15.0 / 30.0));
    assert_close(fso_config_lr_at(&c, 300), 3e-3 * 0.1);
}

static void test_lr_warmup(void **state)
{
    (void)state;
    fso_config c;
    const char *lin[] = {"scheduler={\"type\": \"WarmupLR\", \"params\": {"
                         "\"warmup_num_steps\": 4, \"warmup_type\": \"linear\", "
                         "\"warmup_min_lr\": 0.1, \"warmup_max_lr\": 0.5}}"};
    if (load_sets(&c, lin, 1) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 1), 0.1);
    assert_close(fso_config_lr_at(&c, 2), 0.1 + 0.4 * 0.25);
    assert_close(fso_config_lr_at(&c, 4), 0.1 + 0.4 * 0.75);
    assert_close(fso_config_lr_at(&c, 5), 0.5);
    assert_close(fso_config_lr_at(&c, 1000), 0.5);

    /* Log warmup with DeepSpeed's defaults (0 to 1e-3 over 1000 steps). */
    const char *logw[] = {"scheduler={\"type\": \"warmuplr\"}"};
    if (load_sets(&c, logw, 1) != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.warmup_num_steps, 1000);
    assert_close(fso_config_lr_at(&c, 1), 0.0);
    assert_close(fso_config_lr_at(&c, 100), 1e-3 * log(100.0) / log(1000.0));
    assert_close(fso_config_lr_at(&c, 1001), 1e-3);

    /* W = 1 warms up over 2 steps, as DeepSpeed does. */
    const char *one[] = {"scheduler={\"type\": \"WarmupLR\", \"params\": {"
                         "\"warmup_num_steps\": 1, \"warmup_type\": \"linear\"}}"};
    if (load_sets(&c, one, 1) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 2), 0.5e-3);
    assert_close(fso_config_lr_at(&c, 3), 1e-3);
}

static void test_lr_warmup_decay(void **state)
{
    (void)state;
    fso_config c;
    const char *sets[] = {"scheduler={\"type\": \"WarmupDecayLR\", \"params\": {"
                          "\"warmup_num_steps\": 2, \"total_num_steps\": 6, "
                          "\"warmup_type\": \"linear\", \"warmup_max_lr\": 1.0}}"};
    if (load_sets(&c, sets, 1) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 1), 0.0);
    assert_close(fso_config_lr_at(&c, 2), 0.5);
    assert_close(fso_config_lr_at(&c, 3), 1.0);
    assert_close(fso_config_lr_at(&c, 4), 0.75);
    assert_close(fso_config_lr_at(&c, 6), 0.25);
    assert_close(fso_config_lr_at(&c, 7), 0.0);
    assert_close(fso_config_lr_at(&c, 9), 0.0);

    /* total_num_steps 0 means train.steps. */
    const char *steps[] = {"scheduler={\"type\": \"WarmupDecayLR\", \"params\": {"
                           "\"warmup_num_steps\": 2, \"warmup_type\": \"linear\", "
                           "\"warmup_max_lr\": 1.0}}",
                           "train.steps=10"};
    if (load_sets(&c, steps, 2) != 0)
        fail_msg("%s", c.err);
    assert_close(fso_config_lr_at(&c, 7), 4.0 / 8.0);
}

static void test_lr_constant_without_scheduler(void **state)
{
    fso_config c;
    if (load_text(*state, &c, "{\"scheduler\": null, \"optimizer\": {\"params\": {\"lr\": 0.25}}}")
        != 0)
        fail_msg("%s", c.err);
    assert_int_equal(c.sched.type, FSO_SCHED_CONSTANT);
    assert_close(fso_config_lr_at(&c, 1), 0.25);
    assert_close(fso_config_lr_at(&c, 12345), 0.25);
}

/* ---------------------------------------------------------------- json_locate */

static void test_json_locate_positions(void **state)
{
    (void)state;
    const char *text = "{\n"
                       "  \"a\\u00e9\": {\"x\": [10, {\"y\": 1}]},\n"
                       "  \"\xc3\xa9t\xc3\xa9\": 1, \"b\": 2\n"
                       "}\n";
    int line = 0, col = 0;
    const char *p1[] = {"a\xc3\xa9", "x"};
    assert_int_equal(fso_json_locate(text, p1, 2, &line, &col), 0);
    assert_int_equal(line, 2);
    assert_int_equal(col, 15);
    const char *p2[] = {"a\xc3\xa9", "x", "[1]", "y"};
    assert_int_equal(fso_json_locate(text, p2, 4, &line, &col), 0);
    assert_int_equal(line, 2);
    assert_int_equal(col, 26);
    const char *p3[] = {"a\xc3\xa9", "x", "0"};
    assert_int_equal(fso_json_locate(text, p3, 3, &line, &col), 0);
    assert_int_equal(col, 21);
    /* UTF-8 characters are one column each, as in jansson's messages. */
    const char *p4[] = {"b"};
    assert_int_equal(fso_json_locate(text, p4, 1, &line, &col), 0);
    assert_int_equal(line, 3);
    assert_int_equal(col, 13);
    const char *p5[] = {"x"};
    assert_int_equal(fso_json_locate(text, p5, 1, &line, &col), -ENOENT);
    const char *p6[] = {"b", "c"};
    assert_int_equal(fso_json_locate(text, p6, 2, &line, &col), -ENOENT);
    assert_int_equal(fso_json_locate("{\"a\": ", p4, 1, &line, &col), -EINVAL);
}

/* A trailing comma (JavaScript's, Python's) gets a hint naming its place. */
static void test_trailing_comma_is_hinted(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"seed\": 1,\n  \"train\": {\"steps\": 10,\n  }\n}\n"),
                     -EINVAL);
    expect_err(&c, "%s:4:3: string or '}' expected near '}'; a trailing comma? JSON allows none "
                   "after the last item: remove the ',' at 3:24", t->file);
    assert_int_equal(load_text(t, &c, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.95, ]}}}"),
                     -EINVAL);
    expect_err(&c, "%s:1:48: unexpected token near ']'; a trailing comma? JSON allows none after "
                   "the last item: remove the ',' at 1:46", t->file);
}

/* A key cut short at a word boundary is a near miss too. */
static void test_a_key_cut_short_gets_a_did_you_mean(void **state)
{
    tdir *t = *state;
    fso_config c;
    assert_int_equal(load_text(t, &c, "{\n  \"train_micro_batch_size\": 4\n}\n"), -EINVAL);
    expect_err(&c, "%s:2:3: train_micro_batch_size: unknown key; did you mean "
                   "\"train_micro_batch_size_per_gpu\"?", t->file);
}

/* An option that is a --set (--init-from DIR) is quoted as written. */
static void test_an_option_is_quoted_as_the_user_wrote_it(void **state)
{
    tdir *t = *state;
    fso_config c;
    char set[600], opt[600];
    write_cfg(t, "book.txt", "text\n");
    snprintf(set, sizeof set, "model.init_from=\"%s\"", t->file);
    snprintf(opt, sizeof opt, "--init-from %s", t->file);
    char *sets[] = {set}, *written[] = {opt};
    fso_config_defaults(&c);
    assert_int_equal(fso_config_load_written(&c, NULL, sets, written, 1), -EINVAL);
    fso_config_free(&c);
    expect_err(&c, "--init-from %s: model.init_from: %s/config.json: cannot read: Not a "
                   "directory; model.init_from must name a Hugging Face Llama folder (config.json "
                   "and *.safetensors)", t->file, t->file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_dir, teardown_dir)
        T(test_defaults_are_tiny_json),
        T(test_loading_tiny_json_gives_the_defaults),
        T(test_empty_object_is_the_default_job),
        T(test_missing_file_is_named),
        T(test_empty_file_is_an_error),
        T(test_malformed_json_reports_line_and_column),
        T(test_duplicate_key_reports_position),
        T(test_top_level_must_be_an_object),
        T(test_unknown_top_level_key_is_located),
        T(test_unknown_nested_key_names_full_path),
        T(test_wrong_types_are_explained),
        T(test_comm_timeout_default_and_bounds),
        T(test_comm_rails),
        T(test_heads_must_divide_hidden),
        T(test_kv_heads_must_divide_heads),
        T(test_head_dim_rules),
        T(test_seq_len_must_fit_max_positions),
        T(test_unsupported_llama_features_fail),
        T(test_model_types_and_the_attention_window),
        T(test_optimizer_section_is_replaced),
        T(test_model_section_takes_llama_defaults),
        T(test_scheduler_section_is_replaced),
        T(test_scheduler_type_set_over_the_defaults),
        T(test_other_sections_merge_key_by_key),
        T(test_origin_of_every_key),
        T(test_set_overrides),
        T(test_data_path_and_format),
        T(test_train_placement_keys),
        T(test_set_creates_sections),
        T(test_set_errors_name_the_assignment),
        T(test_set_syntax_errors),
        T(test_set_over_file_and_warmup_check),
        T(test_lr_warmup_cosine),
        T(test_lr_warmup),
        T(test_lr_warmup_decay),
        T(test_lr_constant_without_scheduler),
        T(test_json_locate_positions),
        T(test_trailing_comma_is_hinted),
        T(test_a_key_cut_short_gets_a_did_you_mean),
        T(test_an_option_is_quoted_as_the_user_wrote_it),
#undef T
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
