/* config_keys.c — every configuration key fsoff knows: its type, range,
 * default and meaning, section by section, and the cross-key checks.
 * Called once over the merged document by fso_config_finish() (config.c). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "boxes.h"
#include "config_impl.h"

/* ---------------------------------------------------------------- sections */

static const key_spec top_keys[] = {
    {"train_micro_batch_size_per_gpu", NULL},
    {"gradient_accumulation_steps", NULL},
    {"train_batch_size", NULL},
    {"gradient_clipping", NULL},
    {"steps_per_print", NULL},
    {"seed", NULL},
    {"bf16", NULL},
    {"bfloat16", NULL},
    {"fp16", NULL},
    {"optimizer", NULL},
    {"scheduler", NULL},
    {"model", NULL},
    {"data", NULL},
    {"train", NULL},
    {"zero_optimization", NULL},
    {"aio", NULL},
    {"checkpoint", NULL},
    {"comm", NULL},
    {"activation_checkpointing", NULL},
    {"wall_clock_breakdown", "fsoff prints the time of every step anyway"},
    {"zero_allow_untested_optimizer", "fsoff always runs its own AdamW"},
    {"prescale_gradients", "fsoff reduces gradients in fp32 in rank order"},
    {"gradient_predivide_factor", "fsoff reduces gradients in fp32 in rank order"},
    {"dump_state", "fsoff does not dump engine state"},
    {NULL, NULL},
};

static int apply_top(walker *w, json_t *root)
{
    fso_config *c = w->out;
    keypath top = {{0}, 0};
    int64_t v;

    /* fsoff's own keys and DeepSpeed's (config_ds.c), checked as one list
     * so a misspelling gets the nearest of either */
    enum { MAX_TOP = 96 };
    key_spec all[MAX_TOP];
    int n = 0;
    for (const key_spec *k = top_keys; k->name; k++)
        all[n++] = *k;
    for (const key_spec *k = fso_cfg_ds_top_keys; k->name; k++) {
        FSO_BUG_ON(n >= MAX_TOP - 1, "more than %d top-level keys", MAX_TOP - 1);
        all[n++] = *k;
    }
    all[n] = (key_spec){NULL, NULL};
    CFG_TRY(fso_cfg_check_keys(w, root, &top, all, ""));
    CFG_TRY(fso_cfg_apply_batch(w, root));
    CFG_TRY(fso_cfg_apply_ds_sections(w, root));
    CFG_TRY(
        fso_cfg_get_number(w, root, &top, "gradient_clipping", RANGE_NONNEG, NULL, &c->grad_clip));
    CFG_TRY(
        fso_cfg_get_int(w, root, &top, "steps_per_print", 0, INT64_MAX, NULL, &c->steps_per_print));
    CFG_TRY(fso_cfg_get_int(w, root, &top, "seed", 0, INT64_MAX, NULL, &v));
    c->seed = (uint64_t)v;
    return 0;
}

static const key_spec bf16_keys[] = {
    {"enabled", NULL},
    {"immediate_grad_update", "fsoff accumulates every micro-batch's gradients in fp32"},
    {"check_grad_overflow", "bf16 gradients do not overflow as fp16's do; fsoff checks none"},
    {NULL, NULL},
};

#define FP16_IGNORED "fp16 is disabled (fsoff has no fp16 loss scaling)"
static const key_spec fp16_keys[] = {
    {"enabled", NULL},
    {"auto_cast", FP16_IGNORED},
    {"loss_scale", FP16_IGNORED},
    {"initial_scale_power", FP16_IGNORED},
    {"loss_scale_window", FP16_IGNORED},
    {"hysteresis", FP16_IGNORED},
    {"consecutive_hysteresis", FP16_IGNORED},
    {"min_loss_scale", FP16_IGNORED},
    {"fp16_master_weights_and_grads", FP16_IGNORED},
    {NULL, NULL},
};

/* bf16.enabled, or DeepSpeed's older section name bfloat16 (DeepSpeed
 * reads "bf16" first when both are there; so does fsoff). fp16.enabled
 * "auto" can only mean false here: fsoff has no fp16. */
static int apply_precision(walker *w, json_t *root)
{
    json_t *s;
    keypath bf = {{"bf16"}, 1}, fp = {{"fp16"}, 1}, old = {{"bfloat16"}, 1};

    json_t *o = json_object_get(root, "bfloat16");
    bool use_old = o && !json_is_null(o) && fso_cfg_from_defaults(w->doc, &bf);
    if (o && !use_old)
        fso_cfg_warn(w, &old, "bf16 is given too, and DeepSpeed reads bf16 first");
    CFG_TRY(fso_cfg_get_section(w, root, use_old ? "bfloat16" : "bf16", true, &s));
    CFG_TRY(fso_cfg_check_keys(w, s, use_old ? &old : &bf, bf16_keys, ""));
    CFG_TRY(fso_cfg_get_bool(w, s, use_old ? &old : &bf, "enabled", BOOL(false), &w->out->bf16));

    bool fp16 = false;
    CFG_TRY(fso_cfg_get_section(w, root, "fp16", true, &s));
    json_t *e = s ? json_object_get(s, "enabled") : NULL;
    keypath p = {{"fp16", "enabled"}, 2};
    if (fso_cfg_is_auto(e))
        fso_cfg_warn(w, &p, "\"auto\" is false here: fsoff has no fp16, and bf16.enabled "
                            "decides the precision");
    else
        CFG_TRY(fso_cfg_get_bool(w, s, &fp, "enabled", BOOL(false), &fp16));
    if (fp16)
        return fso_cfg_fail(w, &p, "fp16 loss scaling is not supported; use bf16.enabled");
    return fso_cfg_check_keys(w, s, &fp, fp16_keys, "");
}

static const key_spec optimizer_keys[] = {{"type", NULL}, {"params", NULL}, {NULL, NULL}};

#define OWN_ADAMW "fsoff runs its own AdamW"
static const key_spec adam_keys[] = {
    {"lr", NULL},
    {"betas", NULL},
    {"eps", NULL},
    {"weight_decay", NULL},
    {"adam_w_mode", NULL},
    {"bias_correction", NULL},
    {"amsgrad", NULL},
    {"torch_adam", OWN_ADAMW " (true: weight_decay's default is torch's, 0.01)"},
    {"fused", OWN_ADAMW},
    {"foreach", OWN_ADAMW},
    {NULL, NULL},
};

static int apply_betas(walker *w, json_t *params, const keypath *sec)
{
    fso_optim_config *o = &w->out->optim;
    json_t *v = params ? json_object_get(params, "betas") : NULL;
    keypath p = fso_cfg_kp_child(sec, "betas");

    if (!v) {
        o->beta1 = 0.9;
        o->beta2 = 0.999;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) != 2) {
        char got[128], hint[300];
        fso_cfg_describe(v, got, sizeof got);
        fso_cfg_auto_hint(v, &p, hint, sizeof hint);
        return fso_cfg_fail(w, &p, "expected an array of two numbers [beta1, beta2], got %s%s",
                            got, hint);
    }
    static const char *const idx[] = {"[0]", "[1]"};
    double b[2];
    for (int i = 0; i < 2; i++) {
        keypath e = fso_cfg_kp_child(&p, idx[i]);
        CFG_TRY(fso_cfg_want_number(w, json_array_get(v, (size_t)i), &e, RANGE_UNIT_OPEN, &b[i]));
    }
    o->beta1 = b[0];
    o->beta2 = b[1];
    return 0;
}

static int apply_optimizer(walker *w, json_t *root)
{
    fso_optim_config *o = &w->out->optim;
    keypath sec = {{"optimizer"}, 1};
    keypath psec = {{"optimizer", "params"}, 2};
    json_t *opt, *params = NULL, *v;

    /* Library defaults are DeepSpeed's Adam's (FusedAdam's, DeepSpeedCPUAdam's):
     * torch.optim.AdamW's but weight_decay 0; with torch_adam true it runs
     * torch.optim.AdamW, whose weight_decay default is 0.01. */
    bool adamw_type = false;
    CFG_TRY(fso_cfg_get_section(w, root, "optimizer", false, &opt));
    CFG_TRY(fso_cfg_check_keys(w, opt, &sec, optimizer_keys, ""));
    if (opt && (v = json_object_get(opt, "type"))) {
        const fso_config_choice *types = fso_config_optimizer_choices;
        keypath p = fso_cfg_kp_child(&sec, "type");
        if (fso_cfg_find_choice(v, types, true) < 0) {
            char got[128];
            const char *lacks =
                json_is_string(v) ? fso_cfg_ds_type_lacks("optimizer", json_string_value(v)) : NULL;
            fso_cfg_describe(v, got, sizeof got);
            if (lacks)
                return fso_cfg_fail(w, &p, "fsoff does not implement DeepSpeed's %s; it "
                                           "implements \"%s\" (\"%s\" with adam_w_mode true is "
                                           "the same)", lacks, types[0].name, types[1].name);
            return fso_cfg_fail(w, &p, "fsoff implements \"%s\" (\"%s\" with adam_w_mode true "
                                   "is the same), got %s", types[0].name, types[1].name, got);
        }
        adamw_type = fso_cfg_find_choice(v, types, true) == 0;
    }
    if (opt && (v = json_object_get(opt, "params"))) {
        CFG_TRY(fso_cfg_want_object(w, v, &psec));
        params = v;
    }
    CFG_TRY(fso_cfg_check_keys(w, params, &psec, adam_keys, ""));
    CFG_TRY(fso_cfg_get_number(w, params, &psec, "lr", RANGE_POSITIVE, DBL(1e-3), &o->lr));
    CFG_TRY(apply_betas(w, params, &psec));
    CFG_TRY(fso_cfg_get_number(w, params, &psec, "eps", RANGE_POSITIVE, DBL(1e-8), &o->eps));
    bool b = false;
    CFG_TRY(fso_cfg_get_bool(w, params, &psec, "torch_adam", BOOL(false), &b));
    CFG_TRY(fso_cfg_get_number(w, params, &psec, "weight_decay", RANGE_NONNEG, DBL(b ? 0.01 : 0.0),
                       &o->weight_decay));

    keypath p = fso_cfg_kp_child(&psec, "adam_w_mode");
    CFG_TRY(fso_cfg_get_bool(w, params, &psec, "adam_w_mode", BOOL(true), &b));
    if (!b && adamw_type)
        fso_cfg_warn(w, &p, "DeepSpeed's \"AdamW\" decouples weight decay whatever "
                            "adam_w_mode says, as fsoff's does");
    else if (!b)
        return fso_cfg_fail(w, &p, "fsoff does not implement DeepSpeed's Adam with L2 "
                               "regularization; fsoff's AdamW decouples weight decay, so set it "
                               "to true or drop it");
    p = fso_cfg_kp_child(&psec, "bias_correction");
    CFG_TRY(fso_cfg_get_bool(w, params, &psec, "bias_correction", BOOL(true), &b));
    if (!b)
        return fso_cfg_fail(w, &p, "fsoff does not implement DeepSpeed's Adam without "
                               "bias correction; fsoff's AdamW always corrects the moment bias, "
                               "so set it to true or drop it");
    p = fso_cfg_kp_child(&psec, "amsgrad");
    CFG_TRY(fso_cfg_get_bool(w, params, &psec, "amsgrad", BOOL(false), &b));
    if (b)
        return fso_cfg_fail(w, &p, "fsoff does not implement DeepSpeed's Adam with AMSGrad; "
                               "set it to false");
    return 0;
}

static const key_spec data_keys[] = {
    {"path", NULL},      {"format", NULL},      {"seq_len", NULL},     {"documents", NULL},
    {"val_path", NULL},  {"val_every", NULL},   {"val_batches", NULL}, {NULL, NULL},
};

static int apply_data(walker *w, json_t *root)
{
    fso_data_config *d = &w->out->data;
    keypath sec = {{"data"}, 1};
    json_t *s, *v;

    CFG_TRY(fso_cfg_get_section(w, root, "data", false, &s));
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, data_keys, ""));
    CFG_TRY(fso_cfg_get_path(w, s, &sec, "path", d->path, sizeof d->path));
    d->format = FSO_DATA_AUTO;
    if (s && (v = json_object_get(s, "format"))) {
        const fso_config_choice *formats = fso_config_data_format_choices;
        keypath p = fso_cfg_kp_child(&sec, "format");
        int f = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, formats, false, &f));
        d->format = (fso_data_format)f;
        if (d->format == FSO_DATA_TOKENS && !d->path[0]) {
            keypath dp = fso_cfg_kp_child(&sec, "path");
            return fso_cfg_fail_rel(w, &p, &dp, NULL,
                                    "is \"%s\" but data.path is empty (the built-in "
                                    "corpus is text); give a token file with --data FILE, or "
                                    "set data.format to \"%s\"",
                                    fso_config_choice_name(formats, FSO_DATA_TOKENS),
                                    fso_config_choice_name(formats, FSO_DATA_AUTO));
        }
    }
    CFG_TRY(fso_cfg_get_int32(w, s, &sec, "seq_len", 2, NULL, &d->seq_len));
    CFG_TRY(fso_cfg_get_path(w, s, &sec, "val_path", d->val_path, sizeof d->val_path));
    CFG_TRY(fso_cfg_get_int(w, s, &sec, "val_every", 0, INT64_MAX, &(int64_t){0}, &d->val_every));
    CFG_TRY(fso_cfg_get_int32(w, s, &sec, "val_batches", 1, &(int64_t){FSO_VAL_BATCHES_DEFAULT},
                      &d->val_batches));
    d->documents = FSO_DATA_DOCS_ISOLATE;
    if (s && (v = json_object_get(s, "documents"))) {
        keypath p = fso_cfg_kp_child(&sec, "documents");
        int m = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_data_docs_choices, false, &m));
        d->documents = (fso_data_docs)m;
    }

    int maxpos = w->out->model.max_position_embeddings;
    if (d->seq_len > maxpos) {
        keypath p = fso_cfg_kp_child(&sec, "seq_len");
        keypath mp = {{"model", "max_position_embeddings"}, 2};
        return fso_cfg_fail_rel(w, &p, &mp, NULL,
                            "must be <= model.max_position_embeddings (%d), got %d; shorten "
                            "data.seq_len or raise model.max_position_embeddings",
                            maxpos, d->seq_len);
    }
    int window = fso_model_window(&w->out->model);
    if (window > 0 && window < d->seq_len) {
        keypath p = fso_cfg_kp_child(&sec, "seq_len");
        keypath sw = {{"model", "sliding_window"}, 2};
        char where[300];
        fso_cfg_where(w->doc, &sw, where, sizeof where);
        return fso_cfg_fail(w, &p,
                                "%d is longer than model.sliding_window (%d, %s): there each "
                                "position attends to the last %d positions only, and fsoff's "
                                "attention sees the whole sequence; set data.seq_len to at "
                                "most %d (the same model then)", d->seq_len, window, where,
                                window, window);
    }
    return 0;
}

static const key_spec train_keys[] = {
    {"steps", NULL},
    {"threads", NULL},
    {"activation_checkpointing", NULL},
    {"weight_decay_norms", NULL},
    {"weight_decay_embeddings", NULL},
    {"prefetch_blocks", NULL},
    {"optimizer_overlap", NULL},
    {"resident_blocks", NULL},
    {"device_state_blocks", NULL},
    {"device_state_from", NULL},
    {"whole_block_copies", NULL},
    {"gradient_dtype", NULL},
    {"device_margin", NULL},
    {"activations", NULL},
    {NULL, NULL},
};

/* train's placement keys (config.h fso_offload_config, fso_config): a
 * count of blocks no larger than the model's, "first" or "last", a bool,
 * "fp32" or "bf16" (bf16 needs bf16.enabled), a fraction under one half. */
static int apply_train_placement(walker *w, json_t *s, const keypath *sec)
{
    fso_config *c = w->out;
    fso_offload_config *o = &c->offload;
    const int nb = c->model.num_hidden_layers + 2; /* model.h fso_model_n_blocks */
    static const char *const counts[] = {"resident_blocks", "device_state_blocks"};
    int *const count_of[] = {&o->resident_blocks, &o->device_state_blocks};
    for (int i = 0; i < 2; i++) {
        CFG_TRY(fso_cfg_get_int32(w, s, sec, counts[i], 0, I64(-1), count_of[i]));
        if (*count_of[i] > nb) {
            keypath p = fso_cfg_kp_child(sec, counts[i]);
            return fso_cfg_fail(w, &p, "%d blocks, but the model has %d (the embedding, %d "
                                       "layers, the head); give 0 to %d",
                                *count_of[i], nb, nb - 2, nb);
        }
    }
    int m = 0;
    json_t *v = s ? json_object_get(s, "device_state_from") : NULL;
    if (v) {
        keypath p = fso_cfg_kp_child(sec, "device_state_from");
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_state_from_choices, false, &m));
    }
    o->device_state_first = m == 1;
    CFG_TRY(fso_cfg_get_bool(w, s, sec, "whole_block_copies", BOOL(false), &o->whole_copy));
    m = 0;
    if (s && (v = json_object_get(s, "gradient_dtype"))) {
        keypath p = fso_cfg_kp_child(sec, "gradient_dtype");
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_grad_dtype_choices, false, &m));
        if (m == 1 && !c->bf16) {
            keypath bf = {{"bf16", "enabled"}, 2};
            return fso_cfg_fail_rel(w, &p, &bf, NULL,
                                    "\"%s\" gradients need bf16 working parameters; set "
                                    "bf16.enabled true, or use \"%s\"",
                                    fso_config_choice_name(fso_config_grad_dtype_choices, 1),
                                    fso_config_choice_name(fso_config_grad_dtype_choices, 0));
        }
    }
    c->bf16_grads = m == 1;
    static const num_range RANGE_MARGIN = {0, 0.5, false, true};
    CFG_TRY(fso_cfg_get_number(w, s, sec, "device_margin", RANGE_MARGIN, &(const double){-1},
                       &c->device_margin));
    return 0;
}

static int apply_train(walker *w, json_t *root)
{
    fso_config *c = w->out;
    keypath sec = {{"train"}, 1};
    json_t *s;

    CFG_TRY(fso_cfg_get_section(w, root, "train", false, &s));
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, train_keys, ""));
    CFG_TRY(fso_cfg_get_int(w, s, &sec, "steps", 1, INT64_MAX, NULL, &c->steps));
    CFG_TRY(fso_cfg_get_int32(w, s, &sec, "threads", 0, NULL, &c->threads));
    CFG_TRY(fso_cfg_get_bool(w, s, &sec, "activation_checkpointing", NULL,
                             &c->activation_checkpointing));
    CFG_TRY(fso_cfg_get_bool(w, s, &sec, "weight_decay_norms", NULL, &c->optim.decay_norms));
    CFG_TRY(
        fso_cfg_get_bool(w, s, &sec, "weight_decay_embeddings", NULL, &c->optim.decay_embeddings));
    CFG_TRY(
        fso_cfg_get_int32(w, s, &sec, "prefetch_blocks", 0, I64(2), &c->offload.prefetch_blocks));
    CFG_TRY(apply_train_placement(w, s, &sec));
    c->optimizer_overlap = FSO_OVERLAP_FORWARD;
    json_t *v = s ? json_object_get(s, "optimizer_overlap") : NULL;
    if (v) {
        const fso_config_choice *modes = fso_config_overlap_choices;
        keypath p = fso_cfg_kp_child(&sec, "optimizer_overlap");
        int m = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, modes, false, &m));
        c->optimizer_overlap = (fso_overlap)m;
        if (c->optimizer_overlap == FSO_OVERLAP_BACKWARD && c->grad_clip != 0) {
            keypath gc = {{"gradient_clipping"}, 1};
            return fso_cfg_fail_rel(w, &p, &gc, NULL,
                                "\"%s\" updates blocks before the global gradient norm is "
                                "known, so it needs gradient_clipping 0 (it is %g); use "
                                "\"%s\" to keep clipping exact",
                                fso_config_choice_name(modes, FSO_OVERLAP_BACKWARD), c->grad_clip,
                                fso_config_choice_name(modes, FSO_OVERLAP_FORWARD));
        }
    }
    return 0;
}

/* ------------------------------------------------------- activations */

/* DeepSpeed's activation_checkpointing section. Its activation checkpointing
 * is the model's own (train.activation_checkpointing turns fsoff's on); of
 * the section, cpu_checkpointing says where the checkpointed activations go,
 * as train.activations does. */
static const key_spec act_ckpt_keys[] = {
    {"cpu_checkpointing", NULL},
    {"partition_activations", "fsoff has no model parallelism to partition activations "
                              "across: each device keeps its own micro-batch's layer inputs"},
    {"contiguous_memory_optimization", "fsoff keeps each layer input in one contiguous "
                                       "buffer already"},
    {"number_checkpoints", "fsoff checkpoints every layer; it counts the kept inputs from the "
                           "model"},
    {"synchronize_checkpoint_boundary", "fsoff orders the activations' copies with the "
                                        "device's marks, never a device-wide synchronize"},
    {"profile", "fsoff counts the activations' copies in its metrics (act_bytes)"},
    {NULL, NULL},
};

/* train.activations ("device" | "host") and activation_checkpointing.
 * cpu_checkpointing (true: "host", false: "device"); both given must agree.
 * The host takes only checkpointed layer inputs (model.h). */
static int apply_activations(walker *w, json_t *root)
{
    fso_config *c = w->out;
    keypath tsec = {{"train"}, 1}, asec = {{"activation_checkpointing"}, 1};
    keypath tp = fso_cfg_kp_child(&tsec, "activations");
    keypath ap = fso_cfg_kp_child(&asec, "cpu_checkpointing");
    json_t *t = json_object_get(root, "train"), *a, *v;
    int tier = -1, from_ds = -1;
    CFG_TRY(fso_cfg_get_section(w, root, "activation_checkpointing", true, &a));
    CFG_TRY(fso_cfg_check_keys(w, a, &asec, act_ckpt_keys, ""));
    if (json_is_object(t) && (v = json_object_get(t, "activations")))
        CFG_TRY(fso_cfg_want_choice(w, v, &tp, fso_config_acts_choices, false, &tier));
    if (a && (v = json_object_get(a, "cpu_checkpointing"))) {
        bool cpu = false;
        CFG_TRY(fso_cfg_want_bool(w, v, &ap, &cpu));
        from_ds = cpu ? FSO_TIER_HOST : FSO_TIER_DEVICE;
    }
    if (tier >= 0 && from_ds >= 0 && tier != from_ds)
        return fso_cfg_fail_rel(w, &tp, &ap, NULL,
                                "\"%s\", but activation_checkpointing.cpu_checkpointing is %s; "
                                "give one of them, or make them agree",
                                fso_config_choice_name(fso_config_acts_choices, tier),
                                from_ds == FSO_TIER_HOST ? "true" : "false");
    if (tier < 0)
        tier = from_ds;
    if (tier == FSO_TIER_HOST && !c->activation_checkpointing) {
        keypath ck = fso_cfg_kp_child(&tsec, "activation_checkpointing");
        return fso_cfg_fail_rel(w, tier == from_ds ? &ap : &tp, &ck, NULL,
                                "activations on the host need train.activation_checkpointing "
                                "true: only the layer inputs it keeps move to the host (as "
                                "DeepSpeed's cpu_checkpointing moves checkpointed activations "
                                "only); turn checkpointing on, or keep them on the device");
    }
    c->activations = tier;
    return 0;
}

/* ---------------------------------------------------------------- offload */

/* "auto" in stage3_prefetch_bucket_size or stage3_max_live_parameters (or
 * their unprefixed spellings) leaves train.prefetch_blocks to the planner
 * (config.h); a number there is ignored with this line. */
#define ZERO_SCHED "fsoff schedules gathers and prefetch per block itself (train.prefetch_blocks)"
#define ZERO_SAVE "fsoff export writes any checkpoint as a Hugging Face folder"
#define ZERO_SHARDS "fsoff shards every block over all the devices"
#define ZERO_ANY_COUNT "every fsoff checkpoint loads on any device count and tiers"
static const key_spec zero_keys[] = {
    {"stage", NULL},
    {"offload_param", NULL},
    {"offload_optimizer", NULL},
    {"overlap_comm", "collectives always overlap the next block's prefetch"},
    {"contiguous_gradients", "each block's gradients are one flat buffer already"},
    {"reduce_bucket_size", "gradients are reduce-scattered per block"},
    {"reduce_scatter", "gradients are always reduce-scattered"},
    {"use_multi_rank_bucket_allreduce", "gradients are reduce-scattered per block"},
    {"allgather_partitions", "parameters are gathered per block"},
    {"allgather_bucket_size", "parameters are gathered per block"},
    {"stage3_prefetch_bucket_size", ZERO_SCHED},
    {"prefetch_bucket_size", ZERO_SCHED},
    {"stage3_max_live_parameters", ZERO_SCHED},
    {"max_live_parameters", ZERO_SCHED},
    {"stage3_max_reuse_distance", ZERO_SCHED},
    {"max_reuse_distance", ZERO_SCHED},
    {"stage3_param_persistence_threshold", ZERO_SCHED},
    {"param_persistence_threshold", ZERO_SCHED},
    {"stage3_model_persistence_threshold", ZERO_SCHED},
    {"model_persistence_threshold", ZERO_SCHED},
    {"stage3_module_granularity_threshold", ZERO_SCHED},
    {"module_granularity_threshold", ZERO_SCHED},
    {"stage3_use_all_reduce_for_fetch_params", "parameters are gathered per block"},
    {"use_all_reduce_for_fetch_params", "parameters are gathered per block"},
    {"stage3_gather_16bit_weights_on_model_save", ZERO_SAVE},
    {"gather_16bit_weights_on_model_save", ZERO_SAVE},
    {"stage3_gather_fp16_weights_on_model_save", ZERO_SAVE},
    {"sub_group_size", "the optimizer works block by block"},
    {"round_robin_gradients", "gradients are reduce-scattered per block"},
    {"load_from_fp32_weights", "fsoff's checkpoints hold the fp32 master weights, and "
                               "resuming loads them"},
    {"elastic_checkpoint", ZERO_ANY_COUNT},
    {"ignore_unused_parameters", "every parameter of fsoff's model is used"},
    {"legacy_stage1", ZERO_SHARDS},
    {"zero_hpz_partition_size", ZERO_SHARDS},
    {"mics_shard_size", ZERO_SHARDS},
    {"mics_hierarchical_params_gather", ZERO_SHARDS},
    {"zeropp_loco_param", "it tunes quantized gradients, which fsoff does not have"},
    {"memory_efficient_linear", "fsoff's linear layers keep only what their backward needs"},
    {"pipeline_loading_checkpoint", "fsoff has no pipeline parallelism"},
    {"override_module_apply", "fsoff builds its model itself"},
    {"log_trace_cache_warnings", "fsoff traces nothing"},
    /* config_ds.c: false loads, true is refused */
    {"zero_quantized_weights", NULL},
    {"zero_quantized_nontrainable_weights", NULL},
    {"zero_quantized_gradients", NULL},
    {"cpu_offload", NULL},
    {"cpu_offload_param", NULL},
    {"cpu_offload_use_pin_memory", NULL},
    {NULL, NULL},
};

#define OFFLOAD_POOL "fsoff sizes its staging pool from train.prefetch_blocks"
static const key_spec offload_param_keys[] = {
    {"device", NULL}, {"nvme_path", NULL}, {"pin_memory", NULL},
    {"buffer_count", OFFLOAD_POOL}, {"buffer_size", OFFLOAD_POOL},
    {"max_in_cpu", "the host tier holds whole shards or none"},
    {NULL, NULL},
};

static const key_spec offload_optimizer_keys[] = {
    {"device", NULL}, {"nvme_path", NULL}, {"pin_memory", NULL},
    {"buffer_count", OFFLOAD_POOL}, {"fast_init", "NVMe files are preallocated at start"},
    {"pipeline_read", "optimizer reads are always pipelined"},
    {"pipeline_write", "optimizer writes are always pipelined"},
    {"pipeline", "optimizer reads and writes are always pipelined"},
    {"ratio", "the whole optimizer step runs on the CPU"},
    {NULL, NULL},
};

static const key_spec aio_keys[] = {
    {"block_size", NULL}, {"queue_depth", NULL},
    {"single_submit", "io_uring submits in batches"},
    {"overlap_events", "io_uring completions are reaped as they come"},
    {"thread_count", "one io_uring per device thread"},
    {"intra_op_parallelism", "one io_uring per device thread"},
    {"use_gds", "GPUDirect Storage is not supported"},
    {NULL, NULL},
};

/* zero_optimization.<name>: device, nvme_path, pin_memory. */
static int apply_offload_section(walker *w, json_t *z, const keypath *zsec, const char *name,
                                 const key_spec *keys, fso_tier *tier, char *path,
                                 size_t pathlen)
{
    json_t *s = z ? json_object_get(z, name) : NULL, *v;
    keypath sec = fso_cfg_kp_child(zsec, name);
    *tier = FSO_TIER_DEVICE;
    path[0] = '\0';
    if (!s || json_is_null(s))
        return 0;
    CFG_TRY(fso_cfg_want_object(w, s, &sec));
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, keys, ""));
    if ((v = json_object_get(s, "device"))) {
        keypath p = fso_cfg_kp_child(&sec, "device");
        int t = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_tier_choices, false, &t));
        *tier = (fso_tier)t;
    }
    CFG_TRY(fso_cfg_get_path(w, s, &sec, "nvme_path", path, pathlen));
    if (*tier == FSO_TIER_NVME && !path[0]) {
        keypath p = fso_cfg_kp_child(&sec, "nvme_path");
        keypath d = fso_cfg_kp_child(&sec, "device");
        return fso_cfg_fail_rel(w, &p, &d, NULL,
                            "missing while device is \"%s\"; give a folder on an NVMe drive "
                            "(or use --nvme DIR)",
                            fso_config_choice_name(fso_config_tier_choices, FSO_TIER_NVME));
    }
    bool pin = w->out->offload.pin_memory;
    CFG_TRY(fso_cfg_get_bool(w, s, &sec, "pin_memory", &pin, &w->out->offload.pin_memory));
    return 0;
}

static int apply_offload(walker *w, json_t *root)
{
    fso_offload_config *o = &w->out->offload;
    keypath zsec = {{"zero_optimization"}, 1}, asec = {{"aio"}, 1};
    json_t *z, *a;
    int64_t v;

    CFG_TRY(fso_cfg_get_section(w, root, "zero_optimization", true, &z));
    CFG_TRY(fso_cfg_check_keys(w, z, &zsec, zero_keys, ""));
    CFG_TRY(fso_cfg_apply_ds_zero(w, z, &zsec));
    CFG_TRY(fso_cfg_get_int32(w, z, &zsec, "stage", 0, I64(3), &o->stage));
    if (o->stage > 3) {
        keypath p = fso_cfg_kp_child(&zsec, "stage");
        return fso_cfg_fail(w, &p, "expected 0, 1, 2 or 3, got %d", o->stage);
    }
    if (o->stage != 3) {
        keypath p = fso_cfg_kp_child(&zsec, "stage");
        fso_cfg_warn(w, &p, "fsoff partitions parameters, gradients and optimizer state across "
                        "devices as stage 3 does");
    }
    o->pin_memory = false;
    o->per_kind = false; /* the keys place every kind */
    CFG_TRY(apply_offload_section(w, z, &zsec, "offload_param", offload_param_keys,
                                  &o->param_tier, o->param_nvme_path, sizeof o->param_nvme_path));
    CFG_TRY(apply_offload_section(w, z, &zsec, "offload_optimizer", offload_optimizer_keys,
                                  &o->optim_tier, o->optim_nvme_path, sizeof o->optim_nvme_path));

    CFG_TRY(fso_cfg_get_section(w, root, "aio", true, &a));
    CFG_TRY(fso_cfg_check_keys(w, a, &asec, aio_keys, ""));
    /* "auto" (config.h): the library default until the planner chooses */
    CFG_TRY(fso_cfg_get_int_auto(w, a, &asec, "block_size", FSO_IO_PAGE, (int64_t)1 << 30,
                                 I64(1 << 20), &v));
    if (v % FSO_IO_PAGE) {
        keypath p = fso_cfg_kp_child(&asec, "block_size");
        return fso_cfg_fail(w, &p, "must be a multiple of %u bytes (O_DIRECT), got %" PRId64,
                            FSO_IO_PAGE, v);
    }
    o->aio_block_bytes = v;
    CFG_TRY(fso_cfg_get_int_auto(w, a, &asec, "queue_depth", 1, INT_MAX, I64(32), &v));
    o->aio_queue_depth = (int)v;
    return 0;
}

static const key_spec scheduler_keys[] = {{"type", NULL}, {"params", NULL}, {NULL, NULL}};

static const key_spec cosine_keys[] = {
    {"total_num_steps", NULL}, {"warmup_num_steps", NULL}, {"warmup_min_ratio", NULL},
    {"cos_min_ratio", NULL},   {"warmup_type", NULL},      {"last_batch_iteration", NULL},
    {NULL, NULL},
};
static const key_spec warmup_keys[] = {
    {"warmup_min_lr", NULL},    {"warmup_max_lr", NULL}, {"warmup_num_steps", NULL},
    {"warmup_type", NULL},      {"last_batch_iteration", NULL}, {NULL, NULL},
};
static const key_spec decay_keys[] = {
    {"total_num_steps", NULL}, {"warmup_min_lr", NULL}, {"warmup_max_lr", NULL},
    {"warmup_num_steps", NULL}, {"warmup_type", NULL},  {"last_batch_iteration", NULL},
    {NULL, NULL},
};

static int apply_scheduler(walker *w, json_t *root)
{
    fso_sched_config *sc = &w->out->sched;
    keypath sec = {{"scheduler"}, 1};
    keypath psec = {{"scheduler", "params"}, 2};
    json_t *s, *params = NULL, *v;

    memset(sc, 0, sizeof *sc);
    sc->type = FSO_SCHED_CONSTANT;
    CFG_TRY(fso_cfg_get_section(w, root, "scheduler", true, &s));
    if (!s)
        return 0;
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, scheduler_keys, ""));

    const fso_config_choice *types = fso_config_sched_type_choices;
    static const key_spec *const type_keys[] = {
        [FSO_SCHED_WARMUP_COSINE] = cosine_keys,
        [FSO_SCHED_WARMUP] = warmup_keys,
        [FSO_SCHED_WARMUP_DECAY] = decay_keys,
    };
    keypath tp = fso_cfg_kp_child(&sec, "type");
    char names[128];
    fso_config_choice_list(types, names, sizeof names);
    int t;
    if (!(v = json_object_get(s, "type")))
        return fso_cfg_fail(w, &tp, "missing; use %s, or set scheduler to null for a constant "
                                "learning rate", names);
    if ((t = fso_cfg_find_choice(v, types, true)) < 0) {
        char got[128];
        const char *lacks =
            json_is_string(v) ? fso_cfg_ds_type_lacks("scheduler", json_string_value(v)) : NULL;
        if (lacks)
            return fso_cfg_fail(w, &tp, "fsoff does not implement DeepSpeed's %s; use %s (or "
                                        "scheduler null for a constant learning rate)", lacks,
                                names);
        fso_cfg_describe(v, got, sizeof got);
        return fso_cfg_fail(w, &tp, "expected %s (or scheduler null for a constant learning "
                                "rate), got %s", names, got);
    }
    sc->type = (fso_sched_type)types[t].value;
    char type_where[64];
    snprintf(type_where, sizeof type_where, " for %s", types[t].name);
    if ((v = json_object_get(s, "params"))) {
        CFG_TRY(fso_cfg_want_object(w, v, &psec));
        params = v;
    }
    /* The built-in defaults' parameters belong to their type, WarmupCosineLR:
     * a type set over them keeps those it takes and drops the others. What a
     * file or a --set gave is the user's and is checked. */
    const char *key;
    json_t *tmp;
    json_object_foreach_safe(params, tmp, key, v) {
        keypath kp = fso_cfg_kp_child(&psec, key);
        bool taken = false;
        for (const key_spec *k = type_keys[sc->type]; k->name && !taken; k++)
            taken = strcmp(k->name, key) == 0;
        if (!taken && fso_cfg_from_defaults(w->doc, &kp))
            json_object_del(params, key);
    }
    CFG_TRY(fso_cfg_check_keys(w, params, &psec, type_keys[sc->type], type_where));

    /* DeepSpeed's last_batch_iteration starts the schedule part-way; fsoff's
     * starts at the run's step (a resumed run's at its checkpoint's). */
    if (params && (v = json_object_get(params, "last_batch_iteration"))) {
        keypath p = fso_cfg_kp_child(&psec, "last_batch_iteration");
        if (!json_is_integer(v) || json_integer_value(v) != -1) {
            char got[128];
            fso_cfg_describe(v, got, sizeof got);
            return fso_cfg_fail(w, &p, "fsoff does not implement DeepSpeed's schedule started "
                                       "part-way; it starts at the run's step (a resumed "
                                       "run's at its checkpoint's), so only -1, DeepSpeed's "
                                       "default, is taken, got %s", got);
        }
    }
    /* Library defaults are DeepSpeed's. */
    CFG_TRY(fso_cfg_get_int(w, params, &psec, "warmup_num_steps", 0, INT64_MAX, I64(1000),
                    &sc->warmup_num_steps));
    sc->warmup_type = FSO_WARMUP_LOG;
    if (params && (v = json_object_get(params, "warmup_type"))) {
        keypath p = fso_cfg_kp_child(&psec, "warmup_type");
        int wt = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_warmup_type_choices, false, &wt));
        sc->warmup_type = (fso_warmup_type)wt;
    }
    if (sc->type == FSO_SCHED_WARMUP_COSINE) {
        CFG_TRY(fso_cfg_get_number(w, params, &psec, "warmup_min_ratio", RANGE_UNIT, DBL(0.0),
                           &sc->warmup_min_ratio));
        CFG_TRY(fso_cfg_get_number(w, params, &psec, "cos_min_ratio", RANGE_UNIT, DBL(0.0001),
                           &sc->cos_min_ratio));
    } else {
        CFG_TRY(fso_cfg_get_number(w, params, &psec, "warmup_min_lr", RANGE_NONNEG, DBL(0.0),
                           &sc->warmup_min_lr));
        CFG_TRY(fso_cfg_get_number(w, params, &psec, "warmup_max_lr", RANGE_POSITIVE, DBL(0.001),
                           &sc->warmup_max_lr));
    }
    if (sc->type == FSO_SCHED_WARMUP)
        return 0;

    CFG_TRY(fso_cfg_get_int(w, params, &psec, "total_num_steps", 1, INT64_MAX, I64(0),
                    &sc->total_num_steps));
    keypath wp = fso_cfg_kp_child(&psec, "warmup_num_steps");
    if (sc->total_num_steps > 0 && sc->warmup_num_steps >= sc->total_num_steps) {
        keypath tn = fso_cfg_kp_child(&psec, "total_num_steps");
        return fso_cfg_fail_rel(w, &wp, &tn, NULL,
                            "must be less than scheduler.params.total_num_steps (%" PRId64
                            "), got %" PRId64 "; shorten the warmup or raise total_num_steps",
                            sc->total_num_steps, sc->warmup_num_steps);
    }
    /* A warmup as long as the run (total from train.steps) is allowed: the
     * run is all warmup, and the trainer says so when it starts. */
    return 0;
}

/* ---------------------------------------------------------------- checkpoint */

static const key_spec checkpoint_keys[] = {
    {"dir", NULL},
    {"every_steps", NULL},
    {"keep", NULL},
    {"tag_validation", "fsoff checkpoints are named by their step, not tagged"},
    {"load_universal", ZERO_ANY_COUNT},
    {"use_node_local_storage", "one process writes each checkpoint"},
    {"parallel_write", "the saver streams every device's shards itself"},
    {NULL, NULL},
};

static int apply_checkpoint(walker *w, json_t *root)
{
    fso_checkpoint_config *ck = &w->out->checkpoint;
    keypath sec = {{"checkpoint"}, 1};
    json_t *s;

    CFG_TRY(fso_cfg_get_section(w, root, "checkpoint", true, &s));
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, checkpoint_keys, ""));
    /* room after the folder for the checkpoint's own names */
    CFG_TRY(fso_cfg_get_path(w, s, &sec, "dir", ck->dir, sizeof ck->dir - 64));
    CFG_TRY(fso_cfg_get_int(w, s, &sec, "every_steps", 0, INT64_MAX, I64(0), &ck->every_steps));
    CFG_TRY(fso_cfg_get_int32(w, s, &sec, "keep", 1, I64(FSO_CHECKPOINT_KEEP_DEFAULT), &ck->keep));
    return 0;
}

/* ---------------------------------------------------------------- comm */

/* Across boxes (boxes.h): how long any wait for another box may last, and
 * what carries the rails. */
static const key_spec comm_keys[] = {
    {"timeout_s", NULL},
    {"rails", NULL},
    {NULL, NULL},
};

static int apply_comm(walker *w, json_t *root)
{
    keypath sec = {{"comm"}, 1};
    json_t *s;

    CFG_TRY(fso_cfg_get_section(w, root, "comm", true, &s));
    CFG_TRY(fso_cfg_check_keys(w, s, &sec, comm_keys, ""));
    CFG_TRY(fso_cfg_get_number(w, s, &sec, "timeout_s", RANGE_POSITIVE,
                               DBL(FSO_BOXES_TIMEOUT_S), &w->out->comm_timeout_s));
    w->out->comm_rails = FSO_RAILS_AUTO;
    json_t *v = s ? json_object_get(s, "rails") : NULL;
    if (v) {
        keypath p = fso_cfg_kp_child(&sec, "rails");
        int m = 0;
        CFG_TRY(fso_cfg_want_choice(w, v, &p, fso_config_rails_choices, false, &m));
        w->out->comm_rails = (fso_rails_kind)m;
    }
    return 0;
}

/* Validate doc->merged and fill cfg; on failure cfg keeps its values and
 * cfg->err holds the message. */
int fso_cfg_apply(fso_config *cfg, const struct fso_config_doc *doc, bool warn)
{
    fso_config *c = malloc(sizeof *c);
    if (!c) {
        snprintf(cfg->err, sizeof cfg->err, "out of memory validating the configuration");
        return -ENOMEM;
    }
    *c = *cfg;
    c->err[0] = '\0';
    walker w = {.doc = doc, .out = c, .warn = warn};
    json_t *root = doc->merged;
    int rc = apply_top(&w, root);
    if (rc == 0)
        rc = apply_precision(&w, root);
    if (rc == 0)
        rc = fso_cfg_apply_model(&w, root);
    if (rc == 0)
        rc = apply_optimizer(&w, root);
    if (rc == 0)
        rc = apply_train(&w, root);
    if (rc == 0)
        rc = apply_activations(&w, root);
    if (rc == 0)
        rc = apply_data(&w, root);
    if (rc == 0)
        rc = apply_scheduler(&w, root);
    if (rc == 0)
        rc = apply_offload(&w, root);
    if (rc == 0)
        rc = apply_checkpoint(&w, root);
    if (rc == 0)
        rc = apply_comm(&w, root);
    if (rc == 0)
        *cfg = *c;
    else
        memcpy(cfg->err, c->err, sizeof cfg->err);
    free(c);
    return rc;
}
