/* config_impl.h — private to engine/config*.c: the layered document, key
 * paths, and the helpers that turn a bad value into a located message.
 * config.c builds and locates; config_values.c reads a value as its type;
 * config_keys.c knows every key, config_model.c the "model" section's. */
#ifndef FSO_CONFIG_IMPL_H
#define FSO_CONFIG_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "config.h"
#include "util.h"

#define CFG_MAX_DEPTH 16

#define CFG_TRY(expr)                                                                     \
    do {                                                                                  \
        int rc_ = (expr);                                                                 \
        if (rc_ < 0)                                                                      \
            return rc_;                                                                   \
    } while (0)

#define I64(x) (&(const int64_t){(x)})
#define DBL(x) (&(const double){(x)})
#define BOOL(x) (&(const bool){(x)})

typedef enum cfg_layer_kind { LAYER_DEFAULTS, LAYER_FILE, LAYER_SET } cfg_layer_kind;

typedef struct cfg_layer {
    cfg_layer_kind kind;
    char *name;                 /* FILE: the path; SET: the option as written ("--set
                                   KEY=VALUE", "--init-from DIR") */
    char *text;                 /* FILE: the file's text (DEFAULTS uses the embedded one) */
    json_t *root;               /* what this layer wrote, as a document from the root */
    int write_depth;            /* values at this depth (or shallower) were written whole */
    int text_skip;              /* leading keys of a path that text does not hold (a Hugging
                                   Face config.json is the "model" section: 1) */
} cfg_layer;

struct fso_config_doc {
    json_t *merged;             /* the document fso_config_finish() validates */
    cfg_layer *layers;          /* in the order applied; [0] is the built-in defaults */
    int nlayers, cap;
};

typedef struct keypath {
    const char *k[CFG_MAX_DEPTH];
    int n;
} keypath;

typedef struct walker {
    const struct fso_config_doc *doc;
    fso_config *out;
    bool warn;                  /* print "understood but ignored" warnings */
} walker;

typedef struct key_spec {
    const char *name;
    const char *ignored;        /* NULL: used; else why fsoff ignores it */
} key_spec;

keypath fso_cfg_kp_child(const keypath *p, const char *key);
/* config.c: add a layer on top (takes its allocations, also on failure);
 * the layer that decided p (its index) with "file:line:col" or "--set ..."
 * in buf. */
int fso_cfg_doc_add_layer(struct fso_config_doc *doc, cfg_layer *l);
int fso_cfg_where(const struct fso_config_doc *doc, const keypath *p, char *buf, size_t size);
/* Whether the value at p is the built-in defaults' (no file or --set gave it). */
bool fso_cfg_from_defaults(const struct fso_config_doc *doc, const keypath *p);
/* config.c: the whole file at path (at most 64 MiB), NUL-terminated, into
 * *text (the caller frees). 0, or -errno (-EFBIG when larger). */
int fso_cfg_read_file(const char *path, char **text, size_t *len);
/* A double as a person writes it: 0.001, 1e-08, 3. */
void fso_cfg_format_double(double x, char *buf, size_t size);
/* "12.5 (number)", "\"abc\" (string)": a value for a message. */
void fso_cfg_describe(const json_t *v, char *buf, size_t size);
/* "<where>: <key.path>: <message>" into the walker's err; -EINVAL. */
int fso_cfg_fail(walker *w, const keypath *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same, located at whichever of p, rel1, rel2 was set most recently. */
int fso_cfg_fail_rel(walker *w, const keypath *p, const keypath *rel1, const keypath *rel2,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* "fsoff: warning: <where>: <key.path>: understood but ignored: <why>" */
void fso_cfg_warn(walker *w, const keypath *p, const char *why);
/* Every key of obj must be in specs (unknown: an error with a suggestion);
 * ignored ones get a warning. */
int fso_cfg_check_keys(walker *w, json_t *obj, const keypath *sec, const key_spec *specs,
                       const char *where);

/* config_values.c: a key's value read as its type, or a located error
 * (fso_cfg_fail) naming what was expected and, for "auto", what to write
 * instead. want_*: the value v at path p; get_*: member `key` of obj in
 * section sec, def (NULL: the key is required) when absent; get_int32 takes
 * [lo, INT_MAX]; get_path copies a string of at most cap - 1 bytes ("" when
 * absent);
 * get_section: an object, or NULL when absent (or null, with null_ok). */
typedef struct num_range {
    double lo, hi;              /* hi = INFINITY: no upper bound */
    bool lo_open, hi_open;
} num_range;
static const num_range RANGE_POSITIVE = {0, INFINITY, true, true};
static const num_range RANGE_NONNEG = {0, INFINITY, false, true};
static const num_range RANGE_UNIT = {0, 1, false, false};
static const num_range RANGE_UNIT_OPEN = {0, 1, false, true};
/* When v is "auto": "; " and what to write instead, else "" (into buf). */
void fso_cfg_auto_hint(const json_t *v, const keypath *p, char *buf, size_t size);
int fso_cfg_want_object(walker *w, json_t *v, const keypath *p);
int fso_cfg_want_int(walker *w, json_t *v, const keypath *p, int64_t lo, int64_t hi,
                     int64_t *out);
int fso_cfg_want_number(walker *w, json_t *v, const keypath *p, num_range r, double *out);
int fso_cfg_want_bool(walker *w, json_t *v, const keypath *p, bool *out);
int fso_cfg_want_string(walker *w, json_t *v, const keypath *p, const char **out);
/* The value table names for the string v (nocase: any case), -1 if none. */
int fso_cfg_find_choice(const json_t *v, const fso_config_choice *table, bool nocase);
int fso_cfg_want_choice(walker *w, json_t *v, const keypath *p, const fso_config_choice *table,
                        bool nocase, int *out);
int fso_cfg_get_int(walker *w, json_t *obj, const keypath *sec, const char *key, int64_t lo,
                    int64_t hi, const int64_t *def, int64_t *out);
int fso_cfg_get_int32(walker *w, json_t *obj, const keypath *sec, const char *key, int lo,
                      const int64_t *def, int *out);
int fso_cfg_get_number(walker *w, json_t *obj, const keypath *sec, const char *key,
                       num_range r, const double *def, double *out);
int fso_cfg_get_bool(walker *w, json_t *obj, const keypath *sec, const char *key,
                     const bool *def, bool *out);
int fso_cfg_get_path(walker *w, json_t *obj, const keypath *sec, const char *key, char *dst,
                     size_t cap);
int fso_cfg_get_section(walker *w, json_t *root, const char *key, bool null_ok, json_t **out);

/* config_model.c: the "model" section's keys (LlamaConfig's names), and
 * the section applied to root's "model" alone (config_hf.c compares a
 * Hugging Face folder's config.json with the user's section through it). */
extern const key_spec fso_cfg_model_keys[];
int fso_cfg_apply_model(walker *w, json_t *root);

/* config_hf.c: when the merged "model" names model.init_from, its
 * config.json becomes the model section (a layer of its own), checked
 * against the model keys the user gave. 0, or -errno with cfg->err. */
int fso_cfg_hf_merge(fso_config *cfg, struct fso_config_doc *doc);

/* config_ds.c: DeepSpeed's own rules. is_auto: v is DeepSpeed's "auto"
 * placeholder (config.h lists the keys that take it). ds_top_keys: the
 * top-level keys of DeepSpeed's that no fsoff section reads (config_keys.c
 * checks the root against them and its own). apply_batch: the batch triple
 * into micro_batch, grad_accum and global_batch. apply_ds_sections: those
 * sections ignored with their line or refused by name. apply_ds_zero:
 * zero_optimization's switches for what fsoff lacks (true is refused). */
bool fso_cfg_is_auto(const json_t *v);
extern const key_spec fso_cfg_ds_top_keys[];
int fso_cfg_apply_batch(walker *w, json_t *root);
int fso_cfg_apply_ds_sections(walker *w, json_t *root);
int fso_cfg_apply_ds_zero(walker *w, json_t *z, const keypath *zsec);
/* What DeepSpeed's optimizer or scheduler type (section "optimizer" or
 * "scheduler") does that fsoff lacks, for a message; NULL for a type
 * DeepSpeed does not have. */
const char *fso_cfg_ds_type_lacks(const char *section, const char *type);
/* config_values.c: get_int_auto is get_int where "auto" also takes *def
 * (the library default, until the planner chooses; the origin is
 * FSO_ORIGIN_AUTO). */
int fso_cfg_get_int_auto(walker *w, json_t *obj, const keypath *sec, const char *key, int64_t lo,
                         int64_t hi, const int64_t *def, int64_t *out);

/* config_keys.c: validate doc->merged and fill cfg; on failure cfg keeps its
 * values and cfg->err holds the message. */
int fso_cfg_apply(fso_config *cfg, const struct fso_config_doc *doc, bool warn);

#endif
