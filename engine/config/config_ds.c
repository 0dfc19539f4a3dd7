/* config_ds.c — DeepSpeed's own rules, so a DeepSpeed config loads as
 * DeepSpeed loads it: the batch triple (train_batch_size,
 * train_micro_batch_size_per_gpu, gradient_accumulation_steps: any two give
 * the third), "auto" where fsoff's planner can choose (config.h says which
 * keys), and DeepSpeed's top-level sections, each either ignored with one
 * line (it does not change what is computed) or refused by name (it does).
 * Called by config_keys.c's top-level section (config_impl.h). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_impl.h"

bool fso_cfg_is_auto(const json_t *v)
{
    return json_is_string(v) && strcasecmp(json_string_value(v), "auto") == 0;
}

/* ---------------------------------------------------------------- top-level keys */

#define NO_PARALLEL "every device holds a shard of every block (ZeRO stage 3 data parallelism)"
#define METRICS "fsoff writes its metrics as JSON lines (--metrics)"
/* DeepSpeed's top-level keys that no other fsoff section reads. A reason:
 * the key changes nothing fsoff computes, and loading says so in one line.
 * NULL: fso_cfg_apply_ds_sections below decides (refused when it would
 * change the arithmetic, else ignored with its line). */
const key_spec fso_cfg_ds_top_keys[] = {
    {"autotuning", "fsoff's planner chooses placement and prefetch itself (fsoff plan); "
                   "DeepSpeed's autotuner does not run"},
    {"cuda_visible_devices", "fsoff takes its devices from --devices"},
    {"flops_profiler", "fsoff prints each step's time and tokens per second instead"},
    {"tensorboard", METRICS},
    {"wandb", METRICS},
    {"csv_monitor", METRICS},
    {"comet", METRICS},
    {"comms_logger", "fsoff does not log its collectives"},
    {"memory_breakdown", "fsoff plan prints the memory of every tier"},
    {"zero_force_ds_cpu_optimizer", "the host runs fsoff's own CPU AdamW"},
    {"timers", "fsoff times every step itself"},
    {"nebula", "fsoff writes its own checkpoints (checkpoint.dir)"},
    {"dataloader_drop_last", "fsoff's data reader cuts its own windows"},
    {"disable_allgather", "parameters are gathered per block"},
    {"sparse_gradients", "embedding gradients are reduced dense, the same sums"},
    {"eigenvalue", "eigenvalues only drive DeepSpeed's MoQ quantization schedule "
                   "(quantize_training), which fsoff refuses"},
    {"graph_harvesting", "fsoff does not capture CUDA graphs"},
    {"pipeline", "fsoff has no pipeline parallelism: " NO_PARALLEL},
    {"tensor_parallel", "fsoff has no tensor parallelism: " NO_PARALLEL},
    {"seq_parallel_comm_data_type", "fsoff has no sequence parallelism"},
    {"use_data_before_expert_parallelism", "fsoff has no expert parallelism"},
    {"compile", "fsoff runs its own kernels, not torch.compile"},
    {"communication_data_type", NULL},
    {"data_types", NULL},
    {"amp", NULL},
    {"elasticity", NULL},
    {"progressive_layer_drop", NULL},
    {"curriculum_learning", NULL},
    {"data_efficiency", NULL},
    {"compression_training", NULL},
    {"quantize_training", NULL},
    {"sparse_attention", NULL},
    {"weight_quantization", NULL},
    {"hybrid_engine", NULL},
    {NULL, NULL},
};

/* How a section says it is in use. */
typedef enum ds_active {
    ACTIVE_ENABLED,     /* its "enabled" is true (DeepSpeed's default: false) */
    ACTIVE_PRESENT,     /* it is there (not null): the model or engine reads it */
    ACTIVE_TECHNIQUE,   /* one of its techniques' "enabled", or their
                           shared_parameters' "enabled", is true */
} ds_active;

/* Sections that change what is computed: the feature fsoff lacks and how
 * it changes the arithmetic; inactive, they are ignored with their line. */
static const struct {
    const char *name;
    ds_active active;
    const char *feature, *detail;
} refused_sections[] = {
    {"amp", ACTIVE_ENABLED, "NVIDIA Apex AMP", " mixed precision (fp16 with loss scaling); "
                                               "use bf16.enabled"},
    {"elasticity", ACTIVE_ENABLED, "elastic training", ", which picks the batch size and "
                                   "micro-batch from the allowed device counts; give "
                                   "train_batch_size and train_micro_batch_size_per_gpu"},
    {"progressive_layer_drop", ACTIVE_ENABLED, "progressive layer drop",
     ", which skips layers with a probability that grows over training"},
    {"curriculum_learning", ACTIVE_ENABLED, "curriculum learning",
     ", which shortens the sequences of early steps"},
    {"data_efficiency", ACTIVE_ENABLED, "data efficiency",
     " (curriculum data sampling, random layerwise token dropping), which changes what "
     "each step trains on"},
    {"compression_training", ACTIVE_TECHNIQUE, "compression training",
     " (quantization-aware training, pruning, layer reduction), which changes the weights "
     "the forward uses"},
    {"quantize_training", ACTIVE_ENABLED, "MoQ quantization",
     ", which quantizes the weights during training"},
    {"sparse_attention", ACTIVE_PRESENT, "sparse attention",
     " (block-sparse layouts); fsoff's attention is dense causal attention"},
    {"weight_quantization", ACTIVE_PRESENT, "weight quantization",
     ", which quantizes the weights the forward uses"},
    {"hybrid_engine", ACTIVE_ENABLED, "hybrid engine",
     " (DeepSpeed-Chat's generation between training steps)"},
    {NULL, ACTIVE_PRESENT, NULL, NULL},
};

/* Whether section s (at p) is in use, as its kind says; *at: the key that
 * says so (for the message). */
static int section_active(walker *w, json_t *s, const keypath *p, ds_active kind, bool *on,
                          keypath *at)
{
    *on = false;
    *at = *p;
    if (json_is_null(s))
        return 0;
    if (kind == ACTIVE_PRESENT) {
        *on = true;
        return 0;
    }
    CFG_TRY(fso_cfg_want_object(w, s, p));
    if (kind == ACTIVE_ENABLED) {
        json_t *e = json_object_get(s, "enabled");
        *at = fso_cfg_kp_child(p, "enabled");
        return e ? fso_cfg_want_bool(w, e, at, on) : 0;
    }
    const char *key;
    json_t *t;
    json_object_foreach(s, key, t) {
        if (!json_is_object(t))
            continue;
        keypath tp = fso_cfg_kp_child(p, key);
        json_t *e = json_object_get(t, "enabled");
        keypath ep = fso_cfg_kp_child(&tp, "enabled");
        json_t *sh = json_object_get(t, "shared_parameters");
        if (!e && json_is_object(sh)) {
            tp = fso_cfg_kp_child(&tp, "shared_parameters");
            ep = fso_cfg_kp_child(&tp, "enabled");
            e = json_object_get(sh, "enabled");
        }
        if (e)
            CFG_TRY(fso_cfg_want_bool(w, e, &ep, on));
        if (*on) {
            *at = ep;
            return 0;
        }
    }
    return 0;
}

/* A key whose only value fsoff computes is fp32: null or "fp32" load (with
 * the line), another is refused. */
static int fp32_only(walker *w, json_t *v, const keypath *p, const char *what, const char *why)
{
    char got[128];
    if (json_is_null(v) || (json_is_string(v) && strcasecmp(json_string_value(v), "fp32") == 0)) {
        fso_cfg_warn(w, p, why);
        return 0;
    }
    fso_cfg_describe(v, got, sizeof got);
    return fso_cfg_fail(w, p, "%s in fp32 only, got %s; write \"fp32\" or drop it", what, got);
}

int fso_cfg_apply_ds_sections(walker *w, json_t *root)
{
    for (int i = 0; refused_sections[i].name; i++) {
        json_t *s = json_object_get(root, refused_sections[i].name);
        keypath p = {{refused_sections[i].name}, 1}, at;
        bool on;
        if (!s)
            continue;
        CFG_TRY(section_active(w, s, &p, refused_sections[i].active, &on, &at));
        if (on)
            return fso_cfg_fail(w, &at, "fsoff does not implement DeepSpeed's %s%s; remove "
                                        "the \"%s\" section%s", refused_sections[i].feature,
                                refused_sections[i].detail, refused_sections[i].name,
                                refused_sections[i].active == ACTIVE_PRESENT ? ""
                                : refused_sections[i].active == ACTIVE_ENABLED
                                    ? " or set its enabled to false"
                                    : " or set its techniques' enabled to false");
        char why[200];
        snprintf(why, sizeof why, "not enabled, as DeepSpeed reads it (fsoff has no %s)",
                 refused_sections[i].feature);
        fso_cfg_warn(w, &p, why);
    }
    json_t *v = json_object_get(root, "communication_data_type");
    if (v) {
        keypath p = {{"communication_data_type"}, 1};
        CFG_TRY(fp32_only(w, v, &p, "fsoff reduces gradients",
                          "fsoff reduces gradients in fp32 (train.gradient_dtype \"bf16\" "
                          "sends bf16 and sums in fp32)"));
    }
    v = json_object_get(root, "data_types");
    if (v && !json_is_null(v)) {
        keypath p = {{"data_types"}, 1};
        CFG_TRY(fso_cfg_want_object(w, v, &p));
        static const key_spec dt_keys[] = {{"grad_accum_dtype", NULL}, {NULL, NULL}};
        CFG_TRY(fso_cfg_check_keys(w, v, &p, dt_keys, ""));
        json_t *g = json_object_get(v, "grad_accum_dtype");
        keypath gp = fso_cfg_kp_child(&p, "grad_accum_dtype");
        if (g)
            CFG_TRY(fp32_only(w, g, &gp, "fsoff accumulates gradients",
                              "fsoff accumulates gradients in fp32"));
    }
    return 0;
}

/* zero_optimization's switches that true would change what fsoff does:
 * false (or absent) loads with its line, true is refused with the fix.
 * DeepSpeed's old offload switches are refused rather than mapped: their
 * tier would not be a pinned offload_*.device the planner keeps. */
#define ZPP_FIX "set it to false or remove it"
static const struct {
    const char *key, *why, *fix;
} zero_refused[] = {
    {"zero_quantized_weights", "fsoff does not implement ZeRO++'s quantized weight all-gather "
                               "(int8 weights in the gathers, which changes the forward)", ZPP_FIX},
    {"zero_quantized_nontrainable_weights", "fsoff does not implement ZeRO++'s quantized "
                                            "frozen weights", ZPP_FIX},
    {"zero_quantized_gradients", "fsoff does not implement ZeRO++'s quantized gradient "
                                 "reduce-scatter (int4 gradients, which changes the sums)",
     ZPP_FIX},
    {"cpu_offload", "DeepSpeed's old spelling of optimizer offload",
     "write \"offload_optimizer\": {\"device\": \"cpu\"} instead"},
    {"cpu_offload_param", "DeepSpeed's old spelling of parameter offload",
     "write \"offload_param\": {\"device\": \"cpu\"} instead"},
    {"cpu_offload_use_pin_memory", "DeepSpeed's old spelling of pin_memory",
     "write \"pin_memory\": true in offload_param or offload_optimizer instead"},
    {NULL, NULL, NULL},
};

int fso_cfg_apply_ds_zero(walker *w, json_t *z, const keypath *zsec)
{
    for (int i = 0; z && zero_refused[i].key; i++) {
        json_t *v = json_object_get(z, zero_refused[i].key);
        keypath p = fso_cfg_kp_child(zsec, zero_refused[i].key);
        bool on = false;
        if (!v || json_is_null(v))
            continue;
        CFG_TRY(fso_cfg_want_bool(w, v, &p, &on));
        if (on)
            return fso_cfg_fail(w, &p, "%s; %s", zero_refused[i].why, zero_refused[i].fix);
        fso_cfg_warn(w, &p, "false, as fsoff does");
    }
    return 0;
}

/* ---------------------------------------------------------------- the batch triple */

#define TB "train_batch_size"
#define MB "train_micro_batch_size_per_gpu"
#define GA "gradient_accumulation_steps"

typedef enum batch_state { B_DEFAULT, B_AUTO, B_GIVEN } batch_state;

/* One of the three: given (a number from a file or a --set), "auto", or
 * the built-in defaults' value (*val; 0 when they have none). */
static int batch_key(walker *w, json_t *root, const char *key, int64_t hi, int64_t *val,
                     batch_state *st)
{
    json_t *v = json_object_get(root, key);
    json_t *def = json_object_get(w->doc->layers[0].root, key);
    keypath p = {{key}, 1};
    *val = json_is_integer(def) ? json_integer_value(def) : 0;
    *st = B_DEFAULT;
    if (!v || fso_cfg_from_defaults(w->doc, &p))
        return 0;
    if (fso_cfg_is_auto(v) && strcmp(key, TB) != 0) {
        *st = B_AUTO;
        return 0;
    }
    CFG_TRY(fso_cfg_want_int(w, v, &p, 1, hi, val));
    *st = B_GIVEN;
    return 0;
}

/* DeepSpeed's rule (its runtime config's batch parameters), on its own:
 * T, M, G say which of train_batch_size (*tb), the micro-batch (*mb) and
 * the accumulation (*ga) the user gave; the others are derived: all three
 * given must agree; two give the third; train_batch_size alone takes one
 * accumulation step and train_batch_size / devices per micro-batch; the
 * micro-batch alone takes one accumulation step; otherwise *mb and *ga
 * stand (fsoff's defaults, where DeepSpeed refuses). *tb is the product on
 * return. A contradiction: -EINVAL with what is wrong and the fix in msg,
 * *rel the other keys it names (REL_MB, REL_GA: a mask). */
enum { REL_MB = 1, REL_GA = 2 };
static int batch_resolve(bool T, bool M, bool G, int64_t W, int64_t *tb, int64_t *mb,
                         int64_t *ga, char *msg, size_t len, int *rel)
{
    *rel = 0;
    if (T && M && G) {
        if (*tb != *mb * *ga * W) {
            *rel = REL_MB | REL_GA;
            snprintf(msg, len, "must equal " MB " (%" PRId64 ") x " GA " (%" PRId64 ") x "
                               "devices (%" PRId64 ") = %" PRId64 ", got %" PRId64 "; drop one "
                               "of the three and fsoff derives it as DeepSpeed does, or make "
                               "them agree", *mb, *ga, W, *mb * *ga * W, *tb);
            return -EINVAL;
        }
    } else if (T && (M || G)) {
        int64_t per = (M ? *mb : *ga) * W;
        const char *given = M ? MB : GA, *derived = M ? GA : MB;
        *rel = M ? REL_MB : REL_GA;
        if (*tb % per != 0) {
            snprintf(msg, len, "%" PRId64 " is not a multiple of %s (%" PRId64 ") x devices "
                               "(%" PRId64 ") = %" PRId64 ", so no whole %s gives it; make "
                               "train_batch_size a multiple of %" PRId64 ", or change %s",
                     *tb, given, M ? *mb : *ga, W, per, derived, per, given);
            return -EINVAL;
        }
        if (*tb / per > INT_MAX) {
            snprintf(msg, len, "%" PRId64 " / %" PRId64 " gives %s %" PRId64 ", more than "
                               "fsoff takes (%d)", *tb, per, derived, *tb / per, INT_MAX);
            return -EINVAL;
        }
        *(M ? ga : mb) = *tb / per;
    } else if (T) {
        if (*tb % W != 0) {
            snprintf(msg, len, "%" PRId64 " is not a multiple of the devices (%" PRId64 "); "
                               "with neither " MB " nor " GA " given, each device takes "
                               "train_batch_size / devices sequences in one step, so make it "
                               "a multiple of %" PRId64, *tb, W, W);
            return -EINVAL;
        }
        if (*tb / W > INT_MAX) {
            snprintf(msg, len, "%" PRId64 " sequences per device is more than fsoff takes in "
                               "one micro-batch (%d); give " GA " too", *tb / W, INT_MAX);
            return -EINVAL;
        }
        *mb = *tb / W;
        *ga = 1;
    } else if (M && !G) {
        *ga = 1;
    }
    *tb = *mb * *ga * W;
    return 0;
}

/* "auto" counts as not given (the Hugging Face Trainer fills it from the
 * others), and a micro-batch or accumulation left to the planner gets a
 * provisional value that holds the global batch (config.h). */
int fso_cfg_apply_batch(walker *w, json_t *root)
{
    fso_config *c = w->out;
    int64_t tb, mb, ga;
    batch_state ts, ms, gs;
    keypath tp = {{TB}, 1}, gp = {{GA}, 1};

    CFG_TRY(batch_key(w, root, TB, INT64_MAX, &tb, &ts));
    CFG_TRY(batch_key(w, root, MB, INT_MAX, &mb, &ms));
    CFG_TRY(batch_key(w, root, GA, INT_MAX, &ga, &gs));
    if (mb < 1)
        mb = 1;
    if (ga < 1)
        ga = 1;
    if (gs == B_AUTO && ts != B_GIVEN)
        return fso_cfg_fail(w, &gp, "\"auto\" needs a train_batch_size to split: the planner "
                                    "chooses the accumulation steps that give it; give "
                                    "train_batch_size, or a number here");
    char msg[400];
    int rel;
    if (batch_resolve(ts == B_GIVEN, ms == B_GIVEN, gs == B_GIVEN, fso_config_ranks(c), &tb,
                      &mb, &ga, msg, sizeof msg, &rel) < 0) {
        keypath mp = {{MB}, 1};
        return fso_cfg_fail_rel(w, &tp, rel & REL_MB ? &mp : &tp, rel & REL_GA ? &gp : NULL,
                                "%s", msg);
    }
    c->micro_batch = (int)mb;
    c->grad_accum = (int)ga;
    c->global_batch = tb;
    return 0;
}

/* The batch triple again over the run's devices (world x boxes). */
static int resolve_ranks(fso_config *cfg)
{
    int64_t tb = cfg->global_batch, mb = cfg->micro_batch, ga = cfg->grad_accum;
    char msg[400];
    int rel;
    if (batch_resolve(fso_config_pinned(cfg, TB), fso_config_pinned(cfg, MB),
                      fso_config_pinned(cfg, GA), fso_config_ranks(cfg), &tb, &mb, &ga, msg,
                      sizeof msg, &rel) < 0) {
        if (fso_config_boxes(cfg) > 1)
            snprintf(cfg->err, sizeof cfg->err, "on %d boxes of %d devices: " TB ": %s",
                     fso_config_boxes(cfg), fso_config_world(cfg), msg);
        else
            snprintf(cfg->err, sizeof cfg->err, "on %d devices: " TB ": %s",
                     fso_config_world(cfg), msg);
        return -EINVAL;
    }
    cfg->micro_batch = (int)mb;
    cfg->grad_accum = (int)ga;
    cfg->global_batch = tb;
    return 0;
}

int fso_config_set_world(fso_config *cfg, int world)
{
    cfg->world = world;
    return resolve_ranks(cfg);
}

int fso_config_set_boxes(fso_config *cfg, int boxes, int box)
{
    cfg->boxes = boxes;
    cfg->box = box;
    return resolve_ranks(cfg);
}

/* ---------------------------------------------------------------- optimizers and schedules */

/* DeepSpeed's optimizer and scheduler types fsoff does not have (the names
 * as DeepSpeed matches them, any case), and what each does differently. */
static const struct {
    const char *section, *type, *what;
} ds_types[] = {
    {"optimizer", "Lamb", "LAMB, which scales each layer's update by its trust ratio"},
    {"optimizer", "OneBitAdam", "1-bit Adam, which compresses the momentum it communicates "
                                "after freeze_step"},
    {"optimizer", "ZeroOneAdam", "0/1 Adam, which freezes the variance and communicates "
                                 "1-bit updates"},
    {"optimizer", "OneBitLamb", "1-bit LAMB, which compresses the momentum it communicates"},
    {"optimizer", "Adagrad", "Adagrad"},
    {"optimizer", "Lion", "Lion, which updates by the sign of an interpolated momentum"},
    {"optimizer", "Muon", "Muon, which orthogonalizes 2-D updates"},
    {"optimizer", "MuAdam", "muP's Adam, which scales learning rates by width"},
    {"optimizer", "MuAdamW", "muP's AdamW, which scales learning rates by width"},
    {"optimizer", "MuSGD", "muP's SGD"},
    {"optimizer", "SGD", "SGD"},
    {"scheduler", "OneCycle", "OneCycle schedule, which cycles the learning rate and "
                              "momentum"},
    {"scheduler", "LRRangeTest", "LRRangeTest schedule, which raises the learning rate "
                                 "step by step to find a good one"},
    {NULL, NULL, NULL},
};

const char *fso_cfg_ds_type_lacks(const char *section, const char *type)
{
    for (int i = 0; ds_types[i].section; i++)
        if (strcmp(ds_types[i].section, section) == 0 && strcasecmp(ds_types[i].type, type) == 0)
            return ds_types[i].what;
    return NULL;
}
