/* config_model.c — the "model" section: LlamaConfig's keys as Hugging Face
 * writes them, their ranges and defaults, the values fsoff requires (the
 * Llama features it lacks), the architectures near Llama it names, the
 * sliding window and rope_scaling, and the checks between the shape keys.
 * fso_cfg_apply_model (config_impl.h) is called by fso_cfg_apply
 * (config_keys.c) and by config_hf.c over a folder's config.json. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_impl.h"

#define HF_ONLY "fsoff builds the model from the shape keys alone"
const key_spec fso_cfg_model_keys[] = {
    {"init_from", NULL},
    {"vocab_size", NULL},
    {"hidden_size", NULL},
    {"intermediate_size", NULL},
    {"num_hidden_layers", NULL},
    {"num_attention_heads", NULL},
    {"num_key_value_heads", NULL},
    {"head_dim", NULL},
    {"max_position_embeddings", NULL},
    {"rms_norm_eps", NULL},
    {"rope_theta", NULL},
    {"initializer_range", NULL},
    {"tie_word_embeddings", NULL},
    {"hidden_act", NULL},
    {"attention_bias", NULL},
    {"mlp_bias", NULL},
    {"attention_dropout", NULL},
    {"rope_scaling", NULL},
    {"pretraining_tp", NULL},
    {"model_type", NULL},
    {"sliding_window", NULL},
    {"use_sliding_window", NULL},
    {"max_window_layers", NULL},
    {"layer_types", NULL},
    {"architectures", HF_ONLY},
    {"torch_dtype", "precision comes from bf16.enabled"},
    {"bos_token_id", "fsoff trains on token streams as they are"},
    {"eos_token_id", "fsoff trains on token streams as they are"},
    {"pad_token_id", "fsoff trains on token streams as they are"},
    {"transformers_version", HF_ONLY},
    {"use_cache", "a key-value cache is for inference"},
    {NULL, NULL},
};

/* Keys that must hold one particular value (Llama features fsoff lacks). */
static int model_fixed_keys(walker *w, json_t *m, const keypath *sec)
{
    json_t *v;
    char got[128];

    if ((v = json_object_get(m, "hidden_act"))) {
        keypath p = fso_cfg_kp_child(sec, "hidden_act");
        const char *s = "";
        CFG_TRY(fso_cfg_want_string(w, v, &p, &s));
        if (strcmp(s, "silu") != 0)
            return fso_cfg_fail(w, &p,
                                "fsoff's MLP is SwiGLU, so this must be \"silu\", got \"%s\"", s);
    }
    /* LlamaConfig's attention_bias puts a bias on o_proj too */
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    static const char *const why[] = {
        "biases on all four attention projections, the output's (o_proj) included, are not "
        "supported; fsoff has Qwen2's biases on q_proj, k_proj and v_proj alone, which "
        "model.model_type \"qwen2\" gives; set it to false",
        "biases on the MLP projections are not supported; set it to false"};
    for (int i = 0; i < 2; i++) {
        bool b = false;
        keypath p = fso_cfg_kp_child(sec, no_bias[i]);
        if ((v = json_object_get(m, no_bias[i]))) {
            CFG_TRY(fso_cfg_want_bool(w, v, &p, &b));
            if (b)
                return fso_cfg_fail(w, &p, "%s", why[i]);
        }
    }
    if ((v = json_object_get(m, "attention_dropout"))) {
        keypath p = fso_cfg_kp_child(sec, "attention_dropout");
        double x;
        CFG_TRY(fso_cfg_want_number(w, v, &p, RANGE_UNIT, &x));
        if (x != 0) {
            fso_cfg_describe(v, got, sizeof got);
            return fso_cfg_fail(w, &p, "must be 0 (fsoff has no dropout), got %s", got);
        }
    }
    if ((v = json_object_get(m, "pretraining_tp"))) {
        keypath p = fso_cfg_kp_child(sec, "pretraining_tp");
        int64_t tp;
        CFG_TRY(fso_cfg_want_int(w, v, &p, 1, INT_MAX, &tp));
        if (tp != 1)
            return fso_cfg_fail(w, &p, "must be 1 (fsoff does not emulate tensor-parallel "
                                   "pretraining slices), got %" PRId64, tp);
    }
    return 0;
}

/* Architectures near the ones fsoff has, and what it lacks to train them. */
static const struct {
    const char *type, *lacks;
} model_type_lacks[] = {
    {"qwen3", "its per-head RMSNorms of q and k (q_norm, k_norm)"},
    {"qwen2_moe", "mixture-of-experts layers"},
    {"mixtral", "mixture-of-experts layers"},
    {"gemma", "Gemma's RMSNorm (1 + weight) and scaled embedding"},
    {"phi3", "fused qkv_proj and gate_up_proj weights"},
    {NULL, NULL},
};

/* model.model_type: one of fso_config_model_type_choices. */
static int model_type_of(walker *w, json_t *m, const keypath *sec, fso_model_type *out)
{
    json_t *v = m ? json_object_get(m, "model_type") : NULL;
    keypath p = fso_cfg_kp_child(sec, "model_type");
    const char *s = "";
    *out = FSO_MODEL_LLAMA;
    if (!v)
        return 0;
    CFG_TRY(fso_cfg_want_string(w, v, &p, &s));
    int i = fso_config_choice_find(fso_config_model_type_choices, s, false);
    if (i >= 0) {
        *out = (fso_model_type)fso_config_model_type_choices[i].value;
        return 0;
    }
    char list[128];
    fso_config_choice_list(fso_config_model_type_choices, list, sizeof list);
    for (int k = 0; model_type_lacks[k].type; k++)
        if (strcmp(s, model_type_lacks[k].type) == 0)
            return fso_cfg_fail(w, &p, "\"%s\" is not supported: fsoff lacks %s; it trains %s",
                                s, model_type_lacks[k].lacks, list);
    return fso_cfg_fail(w, &p, "fsoff trains %s models, got \"%s\"", list, s);
}

/* sliding_window (a window or null), use_sliding_window and
 * max_window_layers with transformers' defaults for the type, and
 * layer_types, which newer transformers write: it must be what the other
 * keys make it (fso_model_window's rule), since fsoff derives it. */
static int apply_window(walker *w, json_t *m, const keypath *sec, fso_model_config *mc)
{
    json_t *v = m ? json_object_get(m, "sliding_window") : NULL;
    keypath p = fso_cfg_kp_child(sec, "sliding_window");
    mc->sliding_window = mc->model_type == FSO_MODEL_LLAMA ? 0 : FSO_SLIDING_WINDOW_DEFAULT;
    if (v && json_is_null(v)) {
        mc->sliding_window = 0;
    } else if (v) {
        int64_t x;
        CFG_TRY(fso_cfg_want_int(w, v, &p, 1, INT_MAX, &x));
        mc->sliding_window = (int)x;
    }
    CFG_TRY(
        fso_cfg_get_bool(w, m, sec, "use_sliding_window", BOOL(false), &mc->use_sliding_window));
    CFG_TRY(fso_cfg_get_int32(w, m, sec, "max_window_layers", 0,
                      I64(FSO_MAX_WINDOW_LAYERS_DEFAULT), &mc->max_window_layers));
    json_t *lt = m ? json_object_get(m, "layer_types") : NULL;
    if (!lt || json_is_null(lt))
        return 0;
    keypath lp = fso_cfg_kp_child(sec, "layer_types");
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)mc->num_hidden_layers)
        return fso_cfg_fail(w, &lp, "expected an array of num_hidden_layers (%d) strings",
                            mc->num_hidden_layers);
    const bool windowed = fso_model_window(mc) > 0;
    for (int l = 0; l < mc->num_hidden_layers; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        bool sliding = mc->model_type == FSO_MODEL_MISTRAL ||
                       (mc->model_type == FSO_MODEL_QWEN2 && l >= mc->max_window_layers);
        const char *want = windowed && sliding ? "sliding_attention" : "full_attention";
        if (!t || strcmp(t, want) != 0)
            return fso_cfg_fail(w, &lp, "layer %d is %s%s%s, but model_type, sliding_window, "
                                "use_sliding_window and max_window_layers make it \"%s\"; "
                                "fsoff derives the layers' attention from those keys, so drop "
                                "layer_types or make it agree", l, t ? "\"" : "",
                                t ? t : "not a string", t ? "\"" : "", want);
    }
    return 0;
}

static const key_spec rope_default_keys[] = {{"rope_type", NULL}, {"type", NULL}, {NULL, NULL}};
static const key_spec rope_linear_keys[] = {
    {"rope_type", NULL}, {"type", NULL}, {"factor", NULL}, {NULL, NULL},
};
static const key_spec rope_llama3_keys[] = {
    {"rope_type", NULL}, {"type", NULL}, {"factor", NULL}, {"low_freq_factor", NULL},
    {"high_freq_factor", NULL}, {"original_max_position_embeddings", NULL}, {NULL, NULL},
};

/* A key rope_scaling of this type needs. */
static int rope_member(walker *w, json_t *rs, const keypath *p, fso_rope_type type,
                       const char *key, json_t **v, keypath *vp)
{
    *vp = fso_cfg_kp_child(p, key);
    if ((*v = json_object_get(rs, key)))
        return 0;
    return fso_cfg_fail(w, vp, "missing; rope_scaling of type \"%s\" needs %s",
                        fso_rope_type_name(type),
                        type == FSO_ROPE_LINEAR
                            ? "factor"
                            : "factor, low_freq_factor, high_freq_factor and "
                              "original_max_position_embeddings");
}

/* model.rope_scaling (rope.h): null or absent, or of type linear or llama3,
 * named by "rope_type" or, as older configs do, "type"; the types' names are
 * fso_rope_type_name's. */
static int apply_rope_scaling(walker *w, json_t *m, const keypath *sec, fso_rope_scaling *rs)
{
    json_t *v = m ? json_object_get(m, "rope_scaling") : NULL, *x;
    keypath p = fso_cfg_kp_child(sec, "rope_scaling"), xp;
    memset(rs, 0, sizeof *rs);
    if (!v || json_is_null(v))
        return 0;
    CFG_TRY(fso_cfg_want_object(w, v, &p));
    json_t *t = json_object_get(v, "rope_type"), *t_old = json_object_get(v, "type");
    keypath tp = fso_cfg_kp_child(&p, t ? "rope_type" : "type");
    const char *type = NULL, *type_old = NULL;
    const char *linear = fso_rope_type_name(FSO_ROPE_LINEAR);
    const char *llama3 = fso_rope_type_name(FSO_ROPE_LLAMA3);
    if (!t && !t_old)
        return fso_cfg_fail(w, &p, "has no \"rope_type\"; fsoff implements \"%s\" and \"%s\"",
                            linear, llama3);
    CFG_TRY(fso_cfg_want_string(w, t ? t : t_old, &tp, &type));
    if (t && t_old) {
        keypath op = fso_cfg_kp_child(&p, "type");
        CFG_TRY(fso_cfg_want_string(w, t_old, &op, &type_old));
        if (strcmp(type, type_old) != 0)
            return fso_cfg_fail(w, &op, "is \"%s\" but rope_type is \"%s\"; keep one of them",
                                type_old, type);
    }
    static const key_spec *const type_keys[] = {
        [FSO_ROPE_DEFAULT] = rope_default_keys,
        [FSO_ROPE_LINEAR] = rope_linear_keys,
        [FSO_ROPE_LLAMA3] = rope_llama3_keys,
    };
    int rt = -1;
    for (int k = FSO_ROPE_DEFAULT; rt < 0 && k <= FSO_ROPE_LLAMA3; k++)
        if (strcmp(type, fso_rope_type_name((fso_rope_type)k)) == 0)
            rt = k;
    if (rt < 0)
        return fso_cfg_fail(w, &tp, "RoPE scaling of type \"%s\" is not supported; fsoff "
                                    "implements \"%s\" and \"%s\"", type, linear, llama3);
    char where[64];
    snprintf(where, sizeof where, " for rope_scaling of type %s", type);
    CFG_TRY(fso_cfg_check_keys(w, v, &p, type_keys[rt], where));
    if (rt == FSO_ROPE_DEFAULT)
        return 0;
    rs->type = (fso_rope_type)rt;
    CFG_TRY(rope_member(w, v, &p, rs->type, "factor", &x, &xp));
    CFG_TRY(fso_cfg_want_number(w, x, &xp, RANGE_POSITIVE, &rs->factor));
    if (rs->type == FSO_ROPE_LINEAR)
        return 0;
    CFG_TRY(rope_member(w, v, &p, rs->type, "low_freq_factor", &x, &xp));
    CFG_TRY(fso_cfg_want_number(w, x, &xp, RANGE_POSITIVE, &rs->low_freq_factor));
    CFG_TRY(rope_member(w, v, &p, rs->type, "high_freq_factor", &x, &xp));
    CFG_TRY(fso_cfg_want_number(w, x, &xp, RANGE_POSITIVE, &rs->high_freq_factor));
    if (rs->high_freq_factor <= rs->low_freq_factor) {
        char lo[32], hi[32];
        fso_cfg_format_double(rs->low_freq_factor, lo, sizeof lo);
        fso_cfg_format_double(rs->high_freq_factor, hi, sizeof hi);
        return fso_cfg_fail(w, &xp, "must be greater than low_freq_factor (%s), got %s", lo, hi);
    }
    int64_t n;
    CFG_TRY(rope_member(w, v, &p, rs->type, "original_max_position_embeddings", &x, &xp));
    CFG_TRY(fso_cfg_want_int(w, x, &xp, 1, INT_MAX, &n));
    rs->original_max_position_embeddings = (int)n;
    return 0;
}

/* The shape keys whose defaults differ between the configuration classes
 * (transformers' LlamaConfig, MistralConfig, Qwen2Config); the others
 * (hidden_size 4096, 32 layers of 32 heads, rope_theta 10000, ...) are
 * the same in all three. num_key_value_heads 0: num_attention_heads. */
static const struct {
    int64_t vocab_size, intermediate_size, num_key_value_heads, max_position_embeddings;
} type_defaults[] = {
    [FSO_MODEL_LLAMA] = {32000, 11008, 0, 2048},
    [FSO_MODEL_MISTRAL] = {32000, 14336, 8, 4096 * 32},
    [FSO_MODEL_QWEN2] = {151936, 22016, 32, 32768},
};

int fso_cfg_apply_model(walker *w, json_t *root)
{
    fso_model_config *mc = &w->out->model;
    keypath sec = {{"model"}, 1};
    json_t *m;

    /* Library defaults are Hugging Face's configuration class's of the
     * type (LlamaConfig's unless model_type says otherwise). */
    CFG_TRY(fso_cfg_get_section(w, root, "model", false, &m));
    CFG_TRY(fso_cfg_check_keys(w, m, &sec, fso_cfg_model_keys, ""));
    CFG_TRY(model_type_of(w, m, &sec, &mc->model_type));
    const int64_t *def_kv = &type_defaults[mc->model_type].num_key_value_heads;
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "vocab_size", 1,
                              &type_defaults[mc->model_type].vocab_size, &mc->vocab_size));
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "hidden_size", 1, I64(4096), &mc->hidden_size));
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "intermediate_size", 1,
                      &type_defaults[mc->model_type].intermediate_size, &mc->intermediate_size));
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "num_hidden_layers", 1, I64(32), &mc->num_hidden_layers));
    CFG_TRY(
        fso_cfg_get_int32(w, m, &sec, "num_attention_heads", 1, I64(32), &mc->num_attention_heads));
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "num_key_value_heads", 1,
                      *def_kv ? def_kv : I64(mc->num_attention_heads), &mc->num_key_value_heads));
    CFG_TRY(fso_cfg_get_int32(w, m, &sec, "max_position_embeddings", 1,
                      &type_defaults[mc->model_type].max_position_embeddings,
                      &mc->max_position_embeddings));
    CFG_TRY(fso_cfg_get_number(w, m, &sec, "rms_norm_eps", RANGE_POSITIVE, DBL(1e-6),
                               &mc->rms_norm_eps));
    CFG_TRY(fso_cfg_get_number(w, m, &sec, "rope_theta", RANGE_POSITIVE, DBL(10000.0),
                               &mc->rope_theta));
    CFG_TRY(fso_cfg_get_number(w, m, &sec, "initializer_range", RANGE_POSITIVE, DBL(0.02),
                       &mc->initializer_range));
    CFG_TRY(
        fso_cfg_get_bool(w, m, &sec, "tie_word_embeddings", BOOL(false), &mc->tie_word_embeddings));
    CFG_TRY(apply_window(w, m, &sec, mc));
    if (m)
        CFG_TRY(model_fixed_keys(w, m, &sec));
    CFG_TRY(apply_rope_scaling(w, m, &sec, &mc->rope_scaling));
    CFG_TRY(fso_cfg_get_path(w, m, &sec, "init_from", w->out->init_from, sizeof w->out->init_from));

    keypath heads = fso_cfg_kp_child(&sec, "num_attention_heads");
    keypath hidden = fso_cfg_kp_child(&sec, "hidden_size");
    keypath kv = fso_cfg_kp_child(&sec, "num_key_value_heads");
    int h = mc->hidden_size, nh = mc->num_attention_heads, hd;
    json_t *hdv = m ? json_object_get(m, "head_dim") : NULL;
    if (hdv && !json_is_null(hdv)) {
        keypath p = fso_cfg_kp_child(&sec, "head_dim");
        int64_t given;
        CFG_TRY(fso_cfg_want_int(w, hdv, &p, 2, INT_MAX, &given));
        if (given % 2 != 0)
            return fso_cfg_fail(w, &p, "must be even (rotary embeddings turn pairs of "
                                       "elements), got %" PRId64, given);
        hd = (int)given;
    } else {
        if (h % nh != 0)
            return fso_cfg_fail_rel(w, &heads, &hidden, NULL,
                                "must divide model.hidden_size (%d), got %d; pick a head count "
                                "that divides it, or give model.head_dim", h, nh);
        hd = h / nh;
        if (hd % 2 != 0)
            return fso_cfg_fail_rel(w, &heads, &hidden, NULL,
                                "gives an odd head_dim (model.hidden_size / num_attention_heads "
                                "= %d / %d = %d); rotary embeddings need an even head_dim, so "
                                "pick a head count that leaves an even quotient", h, nh, hd);
    }
    mc->head_dim = hd;
    if (nh % mc->num_key_value_heads != 0)
        return fso_cfg_fail_rel(w, &kv, &heads, NULL,
                            "must divide model.num_attention_heads (%d), got %d; pick a divisor "
                            "(equal to it for multi-head attention, 1 for multi-query)",
                            nh, mc->num_key_value_heads);
    return 0;
}
