/* config_hf.c — a Hugging Face folder's config.json as the "model" section
 * (model.init_from, --init-from), and config.json for an exported folder,
 * of the folder's type (llama, mistral, qwen2: model.model_type) with that
 * configuration class's keys, so that transformers loads it as that class.
 *
 * When the merged document's model.init_from names a folder, its
 * config.json (LlamaConfig, MistralConfig or Qwen2Config, by its
 * model_type) becomes the model section, as a layer of its
 * own above the others, so that an error in it is located in it
 * (DIR/config.json:line:col):
 *   - the built-in defaults' model keys no longer apply; what config.json
 *     leaves out takes its class's defaults, as transformers does;
 *   - config.json's keys that change nothing in fsoff (token ids, dtype,
 *     transformers' bookkeeping) are skipped without a word (an export
 *     carries them back: fso_hf_config_writes_key, hf_extras.c); the Llama
 *     features fsoff lacks are refused by config_model.c as in any model
 *     section (attention_bias, mlp_bias, other rope_scaling types, ...);
 *     quantization_config is refused here;
 *   - newer transformers write rope_theta and rope_scaling together as
 *     rope_parameters: read as the two keys;
 *   - every model key the user gave (a config file or --set) must mean
 *     what config.json says, or be one config.json does not set whose
 *     value is the class's default: otherwise an error names the key, its
 *     place and config.json's.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_impl.h"
#include "hf/hf.h"

/* ---------------------------------------------------------------- reading */

static const keypath init_from_path = {{"model", "init_from"}, 2};

/* The message into cfg->err (cut to fit). */
__attribute__((format(printf, 2, 3)))
static void set_err(fso_config *cfg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->err, sizeof cfg->err, fmt, ap);
    va_end(ap);
}

/* An error about the folder, located where model.init_from was given. */
static int fail_init_from(fso_config *cfg, const struct fso_config_doc *doc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_init_from(fso_config *cfg, const struct fso_config_doc *doc, const char *fmt, ...)
{
    char where[300];
    va_list ap;
    fso_cfg_where(doc, &init_from_path, where, sizeof where);
    int n = snprintf(cfg->err, sizeof cfg->err, "%s: model.init_from: ", where);
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof cfg->err)
        vsnprintf(cfg->err + n, sizeof cfg->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* The model keys fsoff reads (init_from and the ignored ones excluded). */
static bool used_model_key(const char *key)
{
    if (strcmp(key, "init_from") == 0)
        return false;
    for (const key_spec *s = fso_cfg_model_keys; s->name; s++)
        if (strcmp(s->name, key) == 0)
            return s->ignored == NULL;
    return false;
}

/* config.json's keys that fsoff reads, rope_parameters split into
 * rope_theta and rope_scaling. NULL when out of memory. */
static json_t *model_section_of(json_t *hf)
{
    json_t *m = json_object(), *v;
    const char *key;
    if (!m)
        return NULL;
    json_object_foreach(hf, key, v) {
        if (used_model_key(key) && json_object_set(m, key, v) < 0)
            goto oom;
    }
    json_t *rp = json_object_get(hf, "rope_parameters");
    if (json_is_object(rp)) {
        json_t *theta = json_object_get(rp, "rope_theta");
        if (theta && !json_object_get(m, "rope_theta") && json_object_set(m, "rope_theta", theta) < 0)
            goto oom;
        if (!json_object_get(m, "rope_scaling")) {
            json_t *rs = json_deep_copy(rp);
            if (!rs)
                goto oom;
            json_object_del(rs, "rope_theta"); /* absent: nothing to drop */
            if (json_object_set_new(m, "rope_scaling", rs) < 0)
                goto oom;
        }
    }
    return m;
oom:
    json_decref(m);
    return NULL;
}

/* Each type's configuration class in transformers, whose defaults apply to
 * what config.json leaves out. */
static const char *const config_class[] = {
    [FSO_MODEL_LLAMA] = "LlamaConfig",
    [FSO_MODEL_MISTRAL] = "MistralConfig",
    [FSO_MODEL_QWEN2] = "Qwen2Config",
};

/* Do a and b hold the same value (numbers compared as numbers)? */
static bool values_agree(json_t *a, json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    if (json_is_object(a) && json_is_object(b)) {
        const char *key;
        json_t *v;
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach(a, key, v) {
            json_t *w = json_object_get(b, key);
            if (!w || !values_agree(v, w))
                return false;
        }
        return true;
    }
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!values_agree(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    }
    return json_equal(a, b);
}

static bool model_configs_equal(const fso_model_config *a, const fso_model_config *b)
{
    const fso_rope_scaling *ra = &a->rope_scaling, *rb = &b->rope_scaling;
    return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size &&
           a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           a->initializer_range == b->initializer_range &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->model_type == b->model_type &&
           a->sliding_window == b->sliding_window &&
           a->use_sliding_window == b->use_sliding_window &&
           a->max_window_layers == b->max_window_layers && ra->type == rb->type &&
           ra->factor == rb->factor && ra->low_freq_factor == rb->low_freq_factor &&
           ra->high_freq_factor == rb->high_freq_factor &&
           ra->original_max_position_embeddings == rb->original_max_position_embeddings;
}

/* The model section `section` parsed as fso_cfg_apply would, errors located
 * through doc; the result in scratch->model. */
static int parse_model(fso_config *scratch, const struct fso_config_doc *doc, json_t *section)
{
    json_t *root = json_object();
    if (!root || json_object_set(root, "model", section) < 0) {
        json_decref(root);
        snprintf(scratch->err, sizeof scratch->err, "out of memory reading config.json");
        return -ENOMEM;
    }
    walker w = {.doc = doc, .out = scratch, .warn = false};
    int rc = fso_cfg_apply_model(&w, root);
    json_decref(root);
    return rc;
}

/* Each model key the user gave must agree with config.json (section: its
 * keys fsoff reads; hf_mc: what they mean). */
static int check_user_keys(fso_config *cfg, const struct fso_config_doc *doc, json_t *user_model,
                           json_t *section, const fso_model_config *hf_mc, const char *hf_path,
                           const cfg_layer *hf_layer, fso_config *scratch)
{
    const char *key;
    json_t *v;
    json_object_foreach(user_model, key, v) {
        keypath p = {{"model", key}, 2};
        char where[300];
        if (strcmp(key, "init_from") == 0)
            continue;
        if (doc->layers[fso_cfg_where(doc, &p, where, sizeof where)].kind == LAYER_DEFAULTS)
            continue; /* the built-in defaults' model: replaced by the folder's */
        json_t *hv = json_object_get(section, key);
        if (hv && values_agree(v, hv))
            continue;
        /* The value as it would be read in place of config.json's. */
        json_t *trial = json_deep_copy(section);
        int rc = trial && json_object_set(trial, key, v) == 0 ? 0 : -ENOMEM;
        if (rc == 0)
            rc = parse_model(scratch, doc, trial);
        json_decref(trial);
        if (rc == -ENOMEM) {
            set_err(cfg, "out of memory reading %s", hf_path);
            return rc;
        }
        if (rc == 0 && model_configs_equal(&scratch->model, hf_mc))
            continue;
        if (rc < 0 && !hv) { /* not in config.json, and wrong in itself */
            memcpy(cfg->err, scratch->err, sizeof cfg->err);
            return rc;
        }
        char got[128];
        fso_cfg_describe(v, got, sizeof got);
        if (!hv) {
            set_err(cfg,
                     "%s: model.%s: %s disagrees with %s, which leaves %s at %s's "
                     "default; the model comes from model.init_from's folder, so drop "
                     "model.%s", where, key, got, hf_path, key, config_class[hf_mc->model_type],
                     key);
            return -EINVAL;
        }
        char hf_where[300], hf_val[128];
        struct fso_config_doc view = {.merged = NULL, .layers = (cfg_layer *)hf_layer,
                                      .nlayers = 1};
        fso_cfg_where(&view, &p, hf_where, sizeof hf_where);
        fso_cfg_describe(hv, hf_val, sizeof hf_val);
        set_err(cfg,
                 "%s: model.%s: %s disagrees with %s, which says %s; the model comes from "
                 "model.init_from's folder, so drop model.%s or make it agree",
                 where, key, got, hf_where, hf_val, key);
        return -EINVAL;
    }
    return 0;
}

/* The merged model section: config.json's keys, and the user's (which
 * agree with them). 0 or -ENOMEM. */
static int replace_model_section(struct fso_config_doc *doc, json_t *model, json_t *section)
{
    json_t *merged = json_deep_copy(section), *v;
    const char *key;
    if (!merged)
        return -ENOMEM;
    json_object_foreach(model, key, v) {
        keypath p = {{"model", key}, 2};
        if (fso_cfg_from_defaults(doc, &p) || json_object_get(merged, key))
            continue;
        if (json_object_set(merged, key, v) < 0) {
            json_decref(merged);
            return -ENOMEM;
        }
    }
    return json_object_set_new(doc->merged, "model", merged) < 0 ? -ENOMEM : 0;
}

int fso_cfg_hf_merge(fso_config *cfg, struct fso_config_doc *doc)
{
    json_t *model = json_object_get(doc->merged, "model");
    json_t *from = json_is_object(model) ? json_object_get(model, "init_from") : NULL;
    if (!json_is_string(from) || json_string_length(from) == 0)
        return 0; /* none, or of the wrong type: config_model.c says so */
    cfg_layer l = {.kind = LAYER_FILE, .write_depth = 2, .text_skip = 1};
    fso_config *scratch = NULL;
    json_t *section = NULL;
    size_t len = 0;
    int rc;

    if (asprintf(&l.name, "%s/config.json", json_string_value(from)) < 0) {
        l.name = NULL;
        goto oom;
    }
    if ((rc = fso_cfg_read_file(l.name, &l.text, &len)) < 0) {
        rc = fail_init_from(cfg, doc, "%s: cannot read: %s; model.init_from must name a Hugging "
                                      "Face Llama folder (config.json and *.safetensors)",
                            l.name, strerror(-rc));
        goto out;
    }
    json_error_t jerr;
    json_t *hf = json_loadb(l.text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!hf || !json_is_object(hf)) {
        if (hf)
            set_err(cfg, "%s: expected a JSON object (LlamaConfig)", l.name);
        else
            set_err(cfg, "%s:%d:%d: %s", l.name, jerr.line, jerr.column, jerr.text);
        json_decref(hf);
        rc = -EINVAL;
        goto out;
    }
    bool quantized = !json_is_null(json_object_get(hf, "quantization_config")) &&
                     json_object_get(hf, "quantization_config");
    section = model_section_of(hf);
    json_decref(hf);
    if (quantized) {
        set_err(cfg, "%s: quantization_config: quantized models are not supported; start from "
                     "the unquantized weights", l.name);
        rc = -EINVAL;
        goto out;
    }
    if (!section || !(l.root = json_object()) || json_object_set(l.root, "model", section) < 0 ||
        !(scratch = malloc(sizeof *scratch)))
        goto oom;
    *scratch = *cfg;
    /* config.json alone, errors located in it */
    struct fso_config_doc view = {.merged = l.root, .layers = &l, .nlayers = 1};
    if ((rc = parse_model(scratch, &view, section)) < 0) {
        memcpy(cfg->err, scratch->err, sizeof cfg->err);
        goto out;
    }
    const fso_model_config hf_mc = scratch->model;
    if ((rc = check_user_keys(cfg, doc, model, section, &hf_mc, l.name, &l, scratch)) < 0)
        goto out;
    if (replace_model_section(doc, model, section) < 0)
        goto oom;
    rc = fso_cfg_doc_add_layer(doc, &l); /* takes l */
    memset(&l, 0, sizeof l);
    if (rc < 0)
        goto oom;
    goto out;
oom:
    set_err(cfg, "out of memory reading %s", l.name ? l.name : "config.json");
    rc = -ENOMEM;
out:
    free(scratch);
    json_decref(section);
    json_decref(l.root);
    free(l.name);
    free(l.text);
    return rc;
}

/* ---------------------------------------------------------------- writing */

static void put_double(FILE *f, const char *key, double x, bool comma)
{
    char buf[40];
    fso_cfg_format_double(x, buf, sizeof buf);
    if (!strpbrk(buf, ".eEn")) /* a float in Python's eyes, as transformers writes it */
        strcat(buf, ".0");
    fprintf(f, "  \"%s\": %s%s\n", key, buf, comma ? "," : "");
}

bool fso_hf_config_writes_key(const char *key)
{
    /* the model's keys, and those fso_hf_config_write spells itself or that
     * describe what it writes another way (newer transformers' dtype and
     * rope_parameters); quantization_config is refused on reading */
    static const char *const own[] = {"architectures", "model_type", "torch_dtype", "dtype",
                                      "rope_parameters", "quantization_config", NULL};
    for (int i = 0; own[i]; i++)
        if (strcmp(key, own[i]) == 0)
            return true;
    return used_model_key(key);
}

/* carried's keys that config.json does not get from the model, one a line,
 * each followed by a comma. 0 or -ENOMEM. */
static int put_carried(FILE *f, const json_t *carried)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)carried, key, v) {
        if (fso_hf_config_writes_key(key))
            continue;
        json_t *k = json_string(key);
        char *ks = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
        char *vs = json_dumps(v, JSON_ENCODE_ANY);
        json_decref(k);
        if (ks && vs)
            fprintf(f, "  %s: %s,\n", ks, vs);
        free(ks);
        free(vs);
        if (!ks || !vs)
            return -ENOMEM;
    }
    return 0;
}

/* Each type's class in transformers, which config.json's architectures names. */
static const char *const architecture[] = {
    [FSO_MODEL_LLAMA] = "LlamaForCausalLM",
    [FSO_MODEL_MISTRAL] = "MistralForCausalLM",
    [FSO_MODEL_QWEN2] = "Qwen2ForCausalLM",
};

static void put_window(FILE *f, int window)
{
    if (window > 0)
        fprintf(f, "  \"sliding_window\": %d,\n", window);
    else
        fprintf(f, "  \"sliding_window\": null,\n");
}

int fso_hf_config_write(FILE *f, const fso_model_config *mc, fso_hf_dtype dtype,
                        const json_t *carried)
{
    const fso_rope_scaling *rs = &mc->rope_scaling;
    fprintf(f, "{\n");
    fprintf(f, "  \"architectures\": [\"%s\"],\n", architecture[mc->model_type]);
    fprintf(f, "  \"model_type\": \"%s\",\n",
            fso_config_choice_name(fso_config_model_type_choices, mc->model_type));
    fprintf(f, "  \"vocab_size\": %d,\n", mc->vocab_size);
    fprintf(f, "  \"hidden_size\": %d,\n", mc->hidden_size);
    fprintf(f, "  \"intermediate_size\": %d,\n", mc->intermediate_size);
    fprintf(f, "  \"num_hidden_layers\": %d,\n", mc->num_hidden_layers);
    fprintf(f, "  \"num_attention_heads\": %d,\n", mc->num_attention_heads);
    fprintf(f, "  \"num_key_value_heads\": %d,\n", mc->num_key_value_heads);
    fprintf(f, "  \"head_dim\": %d,\n", mc->head_dim);
    fprintf(f, "  \"max_position_embeddings\": %d,\n", mc->max_position_embeddings);
    put_double(f, "rms_norm_eps", mc->rms_norm_eps, true);
    put_double(f, "rope_theta", mc->rope_theta, true);
    if (rs->type == FSO_ROPE_DEFAULT) {
        fprintf(f, "  \"rope_scaling\": null,\n");
    } else {
        char fac[40];
        fso_cfg_format_double(rs->factor, fac, sizeof fac);
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"%s\", \"factor\": %s",
                fso_rope_type_name(rs->type), fac);
        if (rs->type == FSO_ROPE_LLAMA3) {
            char lo[40], hi[40];
            fso_cfg_format_double(rs->low_freq_factor, lo, sizeof lo);
            fso_cfg_format_double(rs->high_freq_factor, hi, sizeof hi);
            fprintf(f, ", \"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                       "\"original_max_position_embeddings\": %d", lo, hi,
                    rs->original_max_position_embeddings);
        }
        fprintf(f, "},\n");
    }
    put_double(f, "initializer_range", mc->initializer_range, true);
    fprintf(f, "  \"tie_word_embeddings\": %s,\n", mc->tie_word_embeddings ? "true" : "false");
    fprintf(f, "  \"hidden_act\": \"silu\",\n");
    fprintf(f, "  \"attention_dropout\": 0.0,\n");
    switch (mc->model_type) { /* each configuration class's own keys */
    case FSO_MODEL_LLAMA:
        fprintf(f, "  \"attention_bias\": false,\n");
        fprintf(f, "  \"mlp_bias\": false,\n");
        fprintf(f, "  \"pretraining_tp\": 1,\n");
        break;
    case FSO_MODEL_MISTRAL:
        put_window(f, mc->sliding_window);
        break;
    case FSO_MODEL_QWEN2:
        fprintf(f, "  \"use_sliding_window\": %s,\n", mc->use_sliding_window ? "true" : "false");
        put_window(f, mc->sliding_window);
        fprintf(f, "  \"max_window_layers\": %d,\n", mc->max_window_layers);
        break;
    }
    if (json_is_object(carried) && put_carried(f, carried) < 0)
        return -ENOMEM;
    fprintf(f, "  \"torch_dtype\": \"%s\"\n", fso_hf_dtype_torch_name(dtype));
    fprintf(f, "}\n");
    return ferror(f) ? -EIO : 0;
}
