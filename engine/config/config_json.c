/* config_json.c — a configuration as the JSON document that loads back to it
 * (config_json.h), and the keys where two such documents differ. */
#include "config_json.h"

#include <stdio.h>
#include <string.h>

static int set(json_t *obj, const char *key, json_t *v)
{
    return v ? json_object_set_new(obj, key, v) : -1;
}

static json_t *rope_scaling_json(const fso_rope_scaling *r)
{
    const char *type = fso_rope_type_name(r->type);
    if (r->type == FSO_ROPE_LINEAR)
        return json_pack("{s:s, s:f}", "rope_type", type, "factor", r->factor);
    if (r->type == FSO_ROPE_LLAMA3)
        return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", type, "factor", r->factor,
                         "low_freq_factor", r->low_freq_factor, "high_freq_factor",
                         r->high_freq_factor, "original_max_position_embeddings",
                         r->original_max_position_embeddings);
    return json_null();
}

static json_t *model_json(const fso_model_config *m, const char *init_from)
{
    json_t *o = json_object();
    int bad = !o;
    bad |= set(o, "vocab_size", json_integer(m->vocab_size));
    bad |= set(o, "hidden_size", json_integer(m->hidden_size));
    bad |= set(o, "intermediate_size", json_integer(m->intermediate_size));
    bad |= set(o, "num_hidden_layers", json_integer(m->num_hidden_layers));
    bad |= set(o, "num_attention_heads", json_integer(m->num_attention_heads));
    bad |= set(o, "num_key_value_heads", json_integer(m->num_key_value_heads));
    bad |= set(o, "head_dim", json_integer(m->head_dim));
    bad |= set(o, "max_position_embeddings", json_integer(m->max_position_embeddings));
    bad |= set(o, "rms_norm_eps", json_real(m->rms_norm_eps));
    bad |= set(o, "rope_theta", json_real(m->rope_theta));
    bad |= set(o, "rope_scaling", rope_scaling_json(&m->rope_scaling));
    if (init_from[0])
        bad |= set(o, "init_from", json_string(init_from));
    bad |= set(o, "initializer_range", json_real(m->initializer_range));
    bad |= set(o, "tie_word_embeddings", json_boolean(m->tie_word_embeddings));
    /* the keys of the other types only where they say something, so that a
     * Llama's document is what it was before fsoff had them (a checkpoint of
     * then resumes saying no change) */
    if (m->model_type != FSO_MODEL_LLAMA)
        bad |= set(o, "model_type", json_string(fso_config_choice_name(
                                        fso_config_model_type_choices, m->model_type)));
    if (m->model_type != FSO_MODEL_LLAMA || m->sliding_window > 0)
        bad |= set(o, "sliding_window",
                   m->sliding_window > 0 ? json_integer(m->sliding_window) : json_null());
    if (m->use_sliding_window)
        bad |= set(o, "use_sliding_window", json_true());
    if (m->max_window_layers != FSO_MAX_WINDOW_LAYERS_DEFAULT)
        bad |= set(o, "max_window_layers", json_integer(m->max_window_layers));
    if (bad && o) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *scheduler_json(const fso_sched_config *sc)
{
    if (sc->type == FSO_SCHED_CONSTANT)
        return json_null();
    json_t *p = json_object();
    int bad = !p;
    bad |= set(p, "warmup_num_steps", json_integer(sc->warmup_num_steps));
    const char *warmup = fso_config_choice_name(fso_config_warmup_type_choices, sc->warmup_type);
    bad |= set(p, "warmup_type", json_string(warmup));
    if (sc->type == FSO_SCHED_WARMUP_COSINE) {
        bad |= set(p, "warmup_min_ratio", json_real(sc->warmup_min_ratio));
        bad |= set(p, "cos_min_ratio", json_real(sc->cos_min_ratio));
    } else {
        bad |= set(p, "warmup_min_lr", json_real(sc->warmup_min_lr));
        bad |= set(p, "warmup_max_lr", json_real(sc->warmup_max_lr));
    }
    if (sc->type != FSO_SCHED_WARMUP && sc->total_num_steps > 0) /* 0: train.steps */
        bad |= set(p, "total_num_steps", json_integer(sc->total_num_steps));
    const char *type = fso_config_choice_name(fso_config_sched_type_choices, sc->type);
    json_t *s = bad ? NULL : json_pack("{s:s, s:o}", "type", type, "params", p);
    if (!s)
        json_decref(p);
    return s;
}

static json_t *offload_json(fso_tier tier, const char *path, bool pin)
{
    const char *device = fso_config_choice_name(fso_config_tier_choices, tier);
    json_t *o = json_pack("{s:s, s:b}", "device", device, "pin_memory", pin);
    if (o && path[0] && set(o, "nvme_path", json_string(path))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* train's placement keys into j's "train" (those given, or a plan's), so
 * that the configuration loads back as it ran; j, or NULL (j freed). */
static json_t *train_placement_json(json_t *j, const fso_config *c)
{
    const fso_offload_config *o = &c->offload;
    json_t *t = j ? json_object_get(j, "train") : NULL;
    if (!t)
        return j;
    int bad = 0;
    if (o->resident_blocks >= 0)
        bad |= json_object_set_new(t, "resident_blocks", json_integer(o->resident_blocks));
    if (o->device_state_blocks >= 0)
        bad |= json_object_set_new(t, "device_state_blocks", json_integer(o->device_state_blocks));
    bad |= json_object_set_new(t, "device_state_from",
                               json_string(fso_config_choice_name(fso_config_state_from_choices,
                                                                  o->device_state_first)));
    bad |= json_object_set_new(t, "whole_block_copies", json_boolean(o->whole_copy));
    bad |= json_object_set_new(t, "gradient_dtype",
                               json_string(fso_config_choice_name(fso_config_grad_dtype_choices,
                                                                  c->bf16_grads)));
    if (c->device_margin >= 0)
        bad |= json_object_set_new(t, "device_margin", json_real(c->device_margin));
    if (c->activations >= 0)
        bad |= json_object_set_new(
            t, "activations", json_string(fso_config_choice_name(fso_config_acts_choices,
                                                                 c->activations)));
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *fso_config_to_json(const fso_config *c)
{
    const fso_offload_config *o = &c->offload;
    const char *optimizer = fso_config_choice_name(fso_config_optimizer_choices, 0);
    const char *format = fso_config_choice_name(fso_config_data_format_choices, c->data.format);
    const char *docs = fso_config_choice_name(fso_config_data_docs_choices, c->data.documents);
    const char *overlap = fso_config_choice_name(fso_config_overlap_choices, c->optimizer_overlap);
    json_t *model = model_json(&c->model, c->init_from);
    json_t *sched = scheduler_json(&c->sched);
    json_t *op = offload_json(o->param_tier, o->param_nvme_path, o->pin_memory);
    json_t *oo = offload_json(o->optim_tier, o->optim_nvme_path, o->pin_memory);
    if (!model || !sched || !op || !oo) {
        json_decref(model);
        json_decref(sched);
        json_decref(op);
        json_decref(oo);
        return NULL;
    }
    /* json_pack's "o" takes the reference, also when packing fails */
    json_t *j = json_pack(
        "{s:o, s:i, s:i, s:f, s:I, s:I, s:{s:b}, s:{s:s, s:{s:f, s:[f,f], s:f, s:f}}, s:o, "
        "s:{s:s, s:s, s:i, s:s, s:I, s:i, s:s}, s:{s:I, s:i, s:b, s:b, s:b, s:i, s:s}, s:{s:i, s:o, s:o}, "
        "s:{s:I, s:i}, s:{s:s, s:I, s:i}, s:{s:f, s:s}}",
        "model", model, "train_micro_batch_size_per_gpu", c->micro_batch,
        "gradient_accumulation_steps", c->grad_accum, "gradient_clipping", c->grad_clip,
        "steps_per_print", (json_int_t)c->steps_per_print, "seed", (json_int_t)c->seed,
        "bf16", "enabled", c->bf16,
        "optimizer", "type", optimizer, "params", "lr", c->optim.lr, "betas", c->optim.beta1,
        c->optim.beta2, "eps", c->optim.eps, "weight_decay", c->optim.weight_decay,
        "scheduler", sched,
        "data", "path", c->data.path, "format", format, "seq_len", c->data.seq_len,
        "val_path", c->data.val_path, "val_every", (json_int_t)c->data.val_every,
        "val_batches", c->data.val_batches,
        "documents", docs,
        "train", "steps", (json_int_t)c->steps, "threads", c->threads,
        "activation_checkpointing", c->activation_checkpointing, "weight_decay_norms",
        c->optim.decay_norms, "weight_decay_embeddings", c->optim.decay_embeddings,
        "prefetch_blocks", o->prefetch_blocks, "optimizer_overlap", overlap,
        "zero_optimization", "stage", o->stage, "offload_param", op, "offload_optimizer", oo,
        "aio", "block_size", (json_int_t)o->aio_block_bytes, "queue_depth", o->aio_queue_depth,
        "checkpoint", "dir", c->checkpoint.dir, "every_steps", (json_int_t)c->checkpoint.every_steps,
        "keep", c->checkpoint.keep, "comm", "timeout_s", c->comm_timeout_s, "rails",
        fso_config_choice_name(fso_config_rails_choices, c->comm_rails));
    return train_placement_json(j, c);
}

/* ------------------------------------------------------------------ diff */

typedef struct diff {
    fso_config_change *out;
    int max, n;
} diff;

static void text_of(const json_t *v, char *buf, size_t len)
{
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(buf, len, "%s", s ? s : "absent");
    if (s && strlen(s) >= len && len > 4)
        memcpy(buf + len - 4, "...", 4);
    free(s);
}

static void add(diff *d, const char *key, const json_t *was, const json_t *now)
{
    if (d->n < d->max) {
        fso_config_change *c = &d->out[d->n];
        snprintf(c->key, sizeof c->key, "%s", key);
        text_of(was, c->was, sizeof c->was);
        text_of(now, c->now, sizeof c->now);
    }
    d->n++;
}

/* Leaves under prefix: those of `a` compared with `b`'s; with only_missing,
 * just the leaves of `a` that `b` lacks (the second pass, from `was`). */
static void walk(diff *d, const char *prefix, const json_t *a, const json_t *b, bool a_is_now,
                 bool only_missing)
{
    const char *k;
    json_t *va;
    json_object_foreach((json_t *)a, k, va) {
        char key[128];
        snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", k);
        json_t *vb = json_is_object(b) ? json_object_get(b, k) : NULL;
        if (only_missing && vb && json_is_object(va) != json_is_object(vb))
            continue; /* an object on one side, a value on the other: said once already */
        if (json_is_object(va) && json_object_size(va) > 0) {
            walk(d, key, va, vb, a_is_now, only_missing);
            continue;
        }
        if (only_missing ? vb != NULL : json_equal(va, vb))
            continue;
        if (a_is_now)
            add(d, key, vb, va);
        else
            add(d, key, va, vb);
    }
}

int fso_config_json_diff(const json_t *was, const json_t *now, fso_config_change *out, int max)
{
    diff d = {out, max, 0};
    walk(&d, "", now, was, true, false);
    walk(&d, "", was, now, false, true);
    return d.n;
}
