/* config_values.c — a configuration key's value read as its type (an
 * object, an integer in a range, a number, a bool, a string, one of a few
 * strings, a path, a section), with the error that names the key, where it
 * was given and what to write instead ("auto" included): the readers every
 * section of config_keys.c uses (config_impl.h). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_impl.h"

/* The Hugging Face Trainer's argument that fills in each DeepSpeed key a
 * config may leave as "auto" (the Trainer replaces them before DeepSpeed
 * reads the config). */
static const struct {
    const char *key, *arg;
} trainer_args[] = {
    {"train_micro_batch_size_per_gpu", "per_device_train_batch_size"},
    {"train_batch_size", "per_device_train_batch_size x gradient_accumulation_steps x devices"},
    {"gradient_accumulation_steps", "gradient_accumulation_steps"},
    {"gradient_clipping", "max_grad_norm"},
    {"lr", "learning_rate"},
    {"betas", "[adam_beta1, adam_beta2]"},
    {"eps", "adam_epsilon"},
    {"weight_decay", "weight_decay"},
    {"warmup_max_lr", "learning_rate"},
    {"warmup_num_steps", "warmup_steps"},
    {"total_num_steps", "max_steps"},
    {"enabled", "bf16 or fp16"},
    {NULL, NULL},
};

/* When v is "auto": what it is and what to write instead, as "; ..." to
 * follow an error's "got ..."; else "". */
void fso_cfg_auto_hint(const json_t *v, const keypath *p, char *buf, size_t size)
{
    buf[0] = '\0';
    if (!json_is_string(v) || strcasecmp(json_string_value(v), "auto") != 0 || p->n < 1)
        return;
    const char *arg = NULL;
    for (int i = 0; trainer_args[i].key; i++)
        if (strcmp(p->k[p->n - 1], trainer_args[i].key) == 0)
            arg = trainer_args[i].arg;
    snprintf(buf, size, "; \"auto\" is a placeholder the Hugging Face Trainer fills in before "
                        "DeepSpeed reads the config, and fsoff reads the file as written: write "
                        "the value itself%s%s%s", arg ? " (the Trainer's " : "", arg ? arg : "",
             arg ? ")" : "");
}

int fso_cfg_want_object(walker *w, json_t *v, const keypath *p)
{
    if (json_is_object(v))
        return 0;
    char got[128];
    fso_cfg_describe(v, got, sizeof got);
    return fso_cfg_fail(w, p, "expected an object, got %s", got);
}

int fso_cfg_want_int(walker *w, json_t *v, const keypath *p, int64_t lo, int64_t hi, int64_t *out)
{
    bool integral = false;
    int64_t x = 0;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
        integral = true;
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9.0e18 && d <= 9.0e18) {
            x = (int64_t)d;
            integral = true;
        }
    }
    if (integral && x >= lo && x <= hi) {
        *out = x;
        return 0;
    }
    char got[128], hint[300];
    fso_cfg_describe(v, got, sizeof got);
    fso_cfg_auto_hint(v, p, hint, sizeof hint);
    if (integral && x > hi)
        return fso_cfg_fail(w, p, "expected an integer in [%" PRId64 ", %" PRId64 "], got %s", lo, hi,
                        got);
    return fso_cfg_fail(w, p, "expected an integer >= %" PRId64 ", got %s%s", lo, got, hint);
}


int fso_cfg_want_number(walker *w, json_t *v, const keypath *p, num_range r, double *out)
{
    if (json_is_number(v)) {
        double x = json_number_value(v);
        bool ok = isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) &&
                  (r.hi_open ? x < r.hi : x <= r.hi);
        if (ok) {
            *out = x;
            return 0;
        }
    }
    char got[128], lo[32], hi[32], hint[300];
    fso_cfg_describe(v, got, sizeof got);
    fso_cfg_auto_hint(v, p, hint, sizeof hint);
    fso_cfg_format_double(r.lo, lo, sizeof lo);
    if (isinf(r.hi))
        return fso_cfg_fail(w, p, "expected a number %s %s, got %s%s", r.lo_open ? ">" : ">=", lo,
                            got, hint);
    fso_cfg_format_double(r.hi, hi, sizeof hi);
    return fso_cfg_fail(w, p, "expected a number in %c%s, %s%c, got %s%s", r.lo_open ? '(' : '[',
                        lo, hi, r.hi_open ? ')' : ']', got, hint);
}

int fso_cfg_want_bool(walker *w, json_t *v, const keypath *p, bool *out)
{
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    char got[128], hint[300];
    fso_cfg_describe(v, got, sizeof got);
    fso_cfg_auto_hint(v, p, hint, sizeof hint);
    return fso_cfg_fail(w, p, "expected true or false, got %s%s", got, hint);
}

int fso_cfg_want_string(walker *w, json_t *v, const keypath *p, const char **out)
{
    if (json_is_string(v)) {
        *out = json_string_value(v);
        return 0;
    }
    char got[128];
    fso_cfg_describe(v, got, sizeof got);
    return fso_cfg_fail(w, p, "expected a string, got %s", got);
}

/* Index of v in a choice table (config.h; exact, or case-insensitive when
 * nocase), or -1. */
int fso_cfg_find_choice(const json_t *v, const fso_config_choice *table, bool nocase)
{
    return json_is_string(v) ? fso_config_choice_find(table, json_string_value(v), nocase) : -1;
}

/* One of the table's strings; returns the value it names in *out. */
int fso_cfg_want_choice(walker *w, json_t *v, const keypath *p, const fso_config_choice *table,
                       bool nocase, int *out)
{
    int i = fso_cfg_find_choice(v, table, nocase);
    if (i >= 0) {
        *out = table[i].value;
        return 0;
    }
    char got[128], list[256];
    fso_config_choice_list(table, list, sizeof list);
    fso_cfg_describe(v, got, sizeof got);
    return fso_cfg_fail(w, p, "expected %s, got %s", list, got);
}

/* Member `key` of section obj (NULL: every key absent) into *v, its path
 * into *p. Absent: 1 when there is a default, an error naming the key when
 * it is required; present: 0. */
static int member(walker *w, json_t *obj, const keypath *sec, const char *key, bool has_default,
                  json_t **v, keypath *p)
{
    *v = obj ? json_object_get(obj, key) : NULL;
    *p = fso_cfg_kp_child(sec, key);
    if (*v)
        return 0;
    if (!has_default)
        return fso_cfg_fail(w, p, "missing; add it (configs/tiny.json has an example)");
    return 1;
}

/* get_*: member `key` of section obj (which may be NULL: every key absent).
 * A NULL def makes the key required; otherwise an absent key takes *def. */
int fso_cfg_get_int(walker *w, json_t *obj, const keypath *sec, const char *key, int64_t lo,
                   int64_t hi, const int64_t *def, int64_t *out)
{
    json_t *v;
    keypath p;
    int rc = member(w, obj, sec, key, def != NULL, &v, &p);
    if (rc != 1)
        return rc < 0 ? rc : fso_cfg_want_int(w, v, &p, lo, hi, out);
    *out = *def;
    return 0;
}

int fso_cfg_get_int_auto(walker *w, json_t *obj, const keypath *sec, const char *key, int64_t lo,
                         int64_t hi, const int64_t *def, int64_t *out)
{
    if (obj && fso_cfg_is_auto(json_object_get(obj, key))) {
        *out = *def;
        return 0;
    }
    return fso_cfg_get_int(w, obj, sec, key, lo, hi, def, out);
}

int fso_cfg_get_int32(walker *w, json_t *obj, const keypath *sec, const char *key, int lo,
                     const int64_t *def, int *out)
{
    int64_t x;
    CFG_TRY(fso_cfg_get_int(w, obj, sec, key, lo, INT_MAX, def, &x));
    *out = (int)x;
    return 0;
}

int fso_cfg_get_number(walker *w, json_t *obj, const keypath *sec, const char *key, num_range r,
                      const double *def, double *out)
{
    json_t *v;
    keypath p;
    int rc = member(w, obj, sec, key, def != NULL, &v, &p);
    if (rc != 1)
        return rc < 0 ? rc : fso_cfg_want_number(w, v, &p, r, out);
    *out = *def;
    return 0;
}

int fso_cfg_get_bool(walker *w, json_t *obj, const keypath *sec, const char *key, const bool *def,
                    bool *out)
{
    json_t *v;
    keypath p;
    int rc = member(w, obj, sec, key, def != NULL, &v, &p);
    if (rc != 1)
        return rc < 0 ? rc : fso_cfg_want_bool(w, v, &p, out);
    *out = *def;
    return 0;
}

/* A path: absent is "", else a string that fits dst. */
int fso_cfg_get_path(walker *w, json_t *obj, const keypath *sec, const char *key, char *dst,
                    size_t cap)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    keypath p = fso_cfg_kp_child(sec, key);
    const char *path = "";
    dst[0] = '\0';
    if (!v)
        return 0;
    CFG_TRY(fso_cfg_want_string(w, v, &p, &path));
    size_t len = strlen(path);
    if (len >= cap)
        return fso_cfg_fail(w, &p, "is %zu bytes long; fsoff takes paths up to %zu bytes", len,
                            cap - 1);
    memcpy(dst, path, len + 1);
    return 0;
}

/* Section `key` of the root: an object, or NULL when absent (or null and null_ok). */
int fso_cfg_get_section(walker *w, json_t *root, const char *key, bool null_ok, json_t **out)
{
    json_t *v = json_object_get(root, key);
    keypath p = {{key}, 1};
    *out = NULL;
    if (!v || (null_ok && json_is_null(v)))
        return 0;
    CFG_TRY(fso_cfg_want_object(w, v, &p));
    *out = v;
    return 0;
}
