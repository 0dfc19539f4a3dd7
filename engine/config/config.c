/* config.c — load, merge and validate the job configuration (config.h).
 *
 * The document is built in layers: the built-in defaults (configs/tiny.json,
 * embedded at build time), then each config file, then each --set. Files
 * replace the "model", "optimizer" and "scheduler" sections whole and merge
 * every other section key by key; a --set replaces the one value it names.
 * Every layer is kept, so an error about a key can say where its value came
 * from: the --set that wrote it, the line and column in the file, or the line
 * and column in the built-in defaults. fso_config_finish() walks the merged
 * document once, fills the struct and reports the first problem only.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "fso_default_config.h"
#include "json_locate.h"
#include "config_impl.h"

#define CFG_MAX_FILE_BYTES ((size_t)64 << 20)
#define CFG_DEFAULTS_NAME "built-in defaults (configs/tiny.json)"

/* ---------------------------------------------------------------- documents */

/* Sections a file replaces whole; their missing keys take library defaults. */
static bool is_replaced_section(const char *key)
{
    return strcmp(key, "model") == 0 || strcmp(key, "optimizer") == 0 ||
           strcmp(key, "scheduler") == 0;
}

static void layer_free(cfg_layer *l)
{
    free(l->name);
    free(l->text);
    json_decref(l->root);
}

static void doc_destroy(struct fso_config_doc *doc)
{
    if (!doc)
        return;
    for (int i = 0; i < doc->nlayers; i++)
        layer_free(&doc->layers[i]);
    free(doc->layers);
    json_decref(doc->merged);
    free(doc);
}

/* Takes ownership of the layer's allocations, also on failure. */
static int doc_add_layer(struct fso_config_doc *doc, cfg_layer *l)
{
    if (doc->nlayers == doc->cap) {
        int cap = doc->cap ? doc->cap * 2 : 8;
        cfg_layer *n = realloc(doc->layers, (size_t)cap * sizeof *n);
        if (!n) {
            layer_free(l);
            return -ENOMEM;
        }
        doc->layers = n;
        doc->cap = cap;
    }
    doc->layers[doc->nlayers++] = *l;
    return 0;
}

static struct fso_config_doc *doc_create(void)
{
    struct fso_config_doc *doc = calloc(1, sizeof *doc);
    if (!doc)
        return NULL;
    json_error_t jerr;
    json_t *root = json_loads(fso_default_config_json, JSON_REJECT_DUPLICATES, &jerr);
    /* The embedded text is configs/tiny.json; a syntax error there is a build bug. */
    FSO_BUG_ON(root == NULL, "%s:%d:%d: %s", CFG_DEFAULTS_NAME, jerr.line, jerr.column, jerr.text);
    FSO_BUG_ON(!json_is_object(root), "the %s are not a JSON object", CFG_DEFAULTS_NAME);
    doc->merged = json_deep_copy(root);
    cfg_layer l = {.kind = LAYER_DEFAULTS, .root = root, .write_depth = 1};
    if (!doc->merged || doc_add_layer(doc, &l) < 0) {
        doc_destroy(doc);
        return NULL;
    }
    return doc;
}

static int doc_ensure(fso_config *cfg)
{
    if (cfg->doc)
        return 0;
    cfg->doc = doc_create();
    if (!cfg->doc) {
        snprintf(cfg->err, sizeof cfg->err, "out of memory loading the built-in defaults");
        return -ENOMEM;
    }
    return 0;
}

/* dst := src key by key, recursing into objects both sides have. At the top
 * level of a file (top), the replaced sections are taken whole instead. */
static int merge_objects(json_t *dst, json_t *src, bool top)
{
    const char *key;
    json_t *val;
    json_object_foreach(src, key, val) {
        json_t *cur = json_object_get(dst, key);
        if (!(top && is_replaced_section(key)) && cur && json_is_object(cur) &&
            json_is_object(val)) {
            CFG_TRY(merge_objects(cur, val, false));
            continue;
        }
        if (json_object_set_new(dst, key, json_deep_copy(val)) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* Keys a --set left out of a merged section come back from the defaults. */
static int fill_missing(json_t *dst, json_t *defaults, bool top)
{
    const char *key;
    json_t *val;
    json_object_foreach(defaults, key, val) {
        if (top && is_replaced_section(key))
            continue;
        json_t *cur = json_object_get(dst, key);
        if (!cur) {
            if (json_object_set_new(dst, key, json_deep_copy(val)) < 0)
                return -ENOMEM;
        } else if (json_is_object(cur) && json_is_object(val)) {
            CFG_TRY(fill_missing(cur, val, false));
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- key paths */

keypath fso_cfg_kp_child(const keypath *p, const char *key)
{
    keypath c = *p;
    FSO_BUG_ON(c.n >= CFG_MAX_DEPTH, "key path deeper than %d keys", CFG_MAX_DEPTH);
    c.k[c.n++] = key;
    return c;
}

/* "optimizer.params.betas[1]": elements written "[i]" are array indices. */
static void kp_format(const keypath *p, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n && len < size; i++) {
        const char *sep = (i == 0 || p->k[i][0] == '[') ? "" : ".";
        int w = snprintf(buf + len, size - len, "%s%s", sep, p->k[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

static long kp_index(const char *el)
{
    if (el[0] != '[')
        return -1;
    char *end;
    long v = strtol(el + 1, &end, 10);
    return (end != el + 1 && end[0] == ']' && end[1] == '\0' && v >= 0) ? v : -1;
}

/* ---------------------------------------------------------------- provenance */

/* Does layer l decide the value at p? If so, *d is how many elements of p
 * exist in what the layer wrote (the position to show is that prefix's). */
static bool layer_provides(const cfg_layer *l, const keypath *p, int *d)
{
    json_t *node = l->root;
    int depth = 0;
    bool whole = false;
    while (depth < p->n) {
        json_t *child = NULL;
        if (json_is_object(node)) {
            child = json_object_get(node, p->k[depth]);
        } else if (json_is_array(node)) {
            long i = kp_index(p->k[depth]);
            child = i >= 0 ? json_array_get(node, (size_t)i) : NULL;
        } else {
            whole = depth > 0; /* a scalar here replaced everything below it */
            break;
        }
        if (!child)
            break;
        node = child;
        depth++;
    }
    *d = depth;
    if (depth == p->n || whole)
        return true;
    /* Inside a value written whole, a missing key takes the library default
     * (in a replaced section), or falls through to the layers below. */
    return depth >= l->write_depth && p->n > 0 && is_replaced_section(p->k[0]);
}

/* The layer that decided p (index), and "where" text for messages. */
static int cfg_where(const struct fso_config_doc *doc, const keypath *p, char *buf, size_t size)
{
    int d = 0, li = 0;
    for (li = doc->nlayers - 1; li > 0; li--)
        if (layer_provides(&doc->layers[li], p, &d))
            break;
    const cfg_layer *l = &doc->layers[li];
    if (li == 0)
        layer_provides(l, p, &d);
    if (l->kind == LAYER_SET) {
        snprintf(buf, size, "%s", l->name);
        return li;
    }
    const char *name = l->kind == LAYER_DEFAULTS ? CFG_DEFAULTS_NAME : l->name;
    const char *text = l->kind == LAYER_DEFAULTS ? fso_default_config_json : l->text;
    int line, col, skip = l->text_skip;
    if (d > skip && fso_json_locate(text, p->k + skip, d - skip, &line, &col) == 0)
        snprintf(buf, size, "%s:%d:%d", name, line, col);
    else
        snprintf(buf, size, "%s", name);
    return li;
}

int fso_cfg_where(const struct fso_config_doc *doc, const keypath *p, char *buf, size_t size)
{
    return cfg_where(doc, p, buf, size);
}

bool fso_cfg_from_defaults(const struct fso_config_doc *doc, const keypath *p)
{
    char where[16];
    return doc->layers[cfg_where(doc, p, where, sizeof where)].kind == LAYER_DEFAULTS;
}

int fso_cfg_doc_add_layer(struct fso_config_doc *doc, cfg_layer *l)
{
    return doc_add_layer(doc, l);
}

/* ---------------------------------------------------------------- messages */

static const char *json_type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER:
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "value";
}

void fso_cfg_format_double(double x, char *buf, size_t size)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* `2.5 (number)`, `"abc" (string)`, `null`: the "got ..." of a message. */
void fso_cfg_describe(const json_t *v, char *buf, size_t size)
{
    char val[96];
    switch (json_typeof(v)) {
    case JSON_INTEGER:
        snprintf(val, sizeof val, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        fso_cfg_format_double(json_real_value(v), val, sizeof val);
        break;
    case JSON_TRUE:
        snprintf(buf, size, "true (boolean)");
        return;
    case JSON_FALSE:
        snprintf(buf, size, "false (boolean)");
        return;
    case JSON_NULL:
        snprintf(buf, size, "null");
        return;
    case JSON_OBJECT:
        snprintf(buf, size, "{...} (object)");
        return;
    case JSON_STRING:
    case JSON_ARRAY: {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
        if (!s) {
            snprintf(val, sizeof val, "%s", json_is_string(v) ? "\"...\"" : "[...]");
        } else if (strlen(s) >= 64) {
            snprintf(val, sizeof val, "%.60s...", s);
        } else {
            snprintf(val, sizeof val, "%s", s);
        }
        free(s);
        break;
    }
    }
    snprintf(buf, size, "%s (%s)", val, json_type_word(v));
}

/* "<where>: <key.path>: <message>" into out->err; where follows the newest
 * layer among p and the related keys (the one the user most likely just changed). */
static int vfail(walker *w, const keypath *p, const keypath *const *rel, int nrel,
                 const char *fmt, va_list ap)
{
    char where[280], key[200];
    int best = cfg_where(w->doc, p, where, sizeof where);
    for (int i = 0; i < nrel; i++) {
        char rw[sizeof where];
        int li = cfg_where(w->doc, rel[i], rw, sizeof rw);
        if (li > best) {
            best = li;
            memcpy(where, rw, sizeof where);
        }
    }
    kp_format(p, key, sizeof key);
    int n = snprintf(w->out->err, sizeof w->out->err, "%s: %s: ", where, key);
    if (n >= 0 && (size_t)n < sizeof w->out->err)
        vsnprintf(w->out->err + n, sizeof w->out->err - (size_t)n, fmt, ap);
    return -EINVAL;
}

__attribute__((format(printf, 3, 4)))
int fso_cfg_fail(walker *w, const keypath *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(w, p, NULL, 0, fmt, ap);
    va_end(ap);
    return rc;
}

__attribute__((format(printf, 5, 6)))
int fso_cfg_fail_rel(walker *w, const keypath *p, const keypath *rel1, const keypath *rel2,
                        const char *fmt, ...)
{
    const keypath *rel[2] = {rel1, rel2};
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(w, p, rel, rel2 ? 2 : 1, fmt, ap);
    va_end(ap);
    return rc;
}

void fso_cfg_warn(walker *w, const keypath *p, const char *why)
{
    if (!w->warn)
        return;
    char where[280], key[200];
    cfg_where(w->doc, p, where, sizeof where);
    kp_format(p, key, sizeof key);
    fprintf(stderr, "fsoff: warning: %s: %s: understood but ignored: %s\n", where, key, why);
}

/* ---------------------------------------------------------------- key tables */

/* Optimal string alignment distance, ASCII case folded; capped inputs. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAXLEN || lb >= MAXLEN)
        return INT_MAX;
    int d[MAXLEN + 1][MAXLEN + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = a[i - 1] | 0x20, cb = b[j - 1] | 0x20;
            int cost = ca != cb;
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && ca == (b[j - 2] | 0x20) && (a[i - 2] | 0x20) == cb &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

static int unknown_key(walker *w, const keypath *p, const key_spec *specs, const char *where)
{
    const char *key = p->k[p->n - 1];
    const char *best = NULL;
    int best_d = INT_MAX;
    size_t list_len = 0;
    for (const key_spec *s = specs; s->name; s++) {
        int d = edit_distance(key, s->name);
        if (d < best_d) {
            best_d = d;
            best = s->name;
        }
        list_len += strlen(s->name) + 2;
    }
    int limit = strlen(key) <= 4 ? 1 : strlen(key) <= 12 ? 2 : 3;
    if (!best || best_d > limit) /* a key cut short at a word: "train_micro_batch_size" */
        for (const key_spec *s = specs; s->name && strlen(key) >= 6; s++)
            if (strncasecmp(s->name, key, strlen(key)) == 0 && s->name[strlen(key)] == '_' &&
                (best_d > limit || strlen(s->name) < strlen(best))) {
                best = s->name;
                best_d = 0;
            }
    if (best && best_d <= limit)
        return fso_cfg_fail(w, p, "unknown key%s; did you mean \"%s\"?", where, best);
    if (list_len > 240)
        return fso_cfg_fail(w, p, "unknown key%s; check its spelling, or remove it", where);
    char list[256];
    size_t len = 0;
    list[0] = '\0';
    for (const key_spec *s = specs; s->name; s++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", s->name);
    return fso_cfg_fail(w, p, "unknown key%s; the keys here are: %s", where, list);
}

/* The ignored DeepSpeed keys whose "auto" the planner takes as its own to
 * choose (config.h: train.prefetch_blocks): the plan says what each became
 * (plan.h fso_plan_auto_print), so no "ignored" warning. */
static bool planner_takes_auto(const keypath *p, const json_t *val)
{
    static const char *const keys[] = {
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.prefetch_bucket_size",
        "zero_optimization.stage3_max_live_parameters", "zero_optimization.max_live_parameters",
    };
    if (!fso_cfg_is_auto(val))
        return false;
    char key[200];
    kp_format(p, key, sizeof key);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(key, keys[i]) == 0)
            return true;
    return false;
}

/* Every key of obj must be in specs; ignored ones get a warning. */
int fso_cfg_check_keys(walker *w, json_t *obj, const keypath *sec, const key_spec *specs,
                      const char *where)
{
    if (!obj)
        return 0;
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        const key_spec *s = specs;
        while (s->name && strcmp(s->name, key) != 0)
            s++;
        keypath p = fso_cfg_kp_child(sec, key);
        if (!s->name)
            return unknown_key(w, &p, specs, where);
        if (s->ignored && !planner_takes_auto(&p, val))
            fso_cfg_warn(w, &p, s->ignored);
    }
    return 0;
}

/* ---------------------------------------------------------------- public API */

void fso_config_defaults(fso_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->world = 1;
    struct fso_config_doc *doc = doc_create();
    FSO_BUG_ON(doc == NULL, "no document of the built-in defaults (out of memory)");
    int rc = fso_cfg_apply(cfg, doc, false);
    if (rc < 0)
        fprintf(stderr, "%s\n", cfg->err);
    FSO_BUG_ON(rc != 0, "the built-in defaults do not apply (%d)", rc);
    doc_destroy(doc);
}

int fso_cfg_read_file(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        if (n + 1 == cap) {
            if (cap >= CFG_MAX_FILE_BYTES) {
                rc = -EFBIG;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = errno ? -errno : -EIO;
            break;
        }
    }
    fclose(f);
    if (!buf)
        return -ENOMEM;
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

static int read_text(fso_config *cfg, const char *path, char **text, size_t *len)
{
    int rc = fso_cfg_read_file(path, text, len);
    if (rc == -EFBIG)
        snprintf(cfg->err, sizeof cfg->err,
                 "%s: config is larger than %zu MiB; is this the right file?", path,
                 CFG_MAX_FILE_BYTES >> 20);
    else if (rc == -ENOMEM)
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory reading config", path);
    else if (rc < 0)
        snprintf(cfg->err, sizeof cfg->err, "%s: cannot %s config: %s%s", path,
                 rc == -ENOENT || rc == -EACCES ? "open" : "read", strerror(-rc),
                 rc == -ENOENT || rc == -EACCES ? "; check the --config path" : "");
    return rc;
}

/* When a parse error is a '}' or ']' right after a comma (JavaScript and
 * Python allow one there, JSON does not), a hint naming the comma's place. */
static void trailing_comma_hint(const char *text, size_t len, const json_error_t *e, char *hint,
                                size_t size)
{
    size_t p = e->position >= 0 && (size_t)e->position < len ? (size_t)e->position : len;
    while (p > 0 && strchr(" \t\r\n", text[p - 1]))
        p--;
    if (p == 0 || (text[p - 1] != '}' && text[p - 1] != ']'))
        return;
    p--;
    while (p > 0 && strchr(" \t\r\n", text[p - 1]))
        p--;
    if (p == 0 || text[p - 1] != ',')
        return;
    int line = 1, col = 1;
    for (size_t i = 0; i + 1 < p; i++, col++)
        if (text[i] == '\n')
            line++, col = 0;
    snprintf(hint, size, "; a trailing comma? JSON allows none after the last item: remove the "
                         "',' at %d:%d", line, col);
}

int fso_config_load_file(fso_config *cfg, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;

    cfg->err[0] = '\0';
    CFG_TRY(doc_ensure(cfg));
    CFG_TRY(read_text(cfg, path, &text, &len));
    if (strspn(text, " \t\r\n") == len) {
        snprintf(cfg->err, sizeof cfg->err,
                 "%s: config file is empty; write a JSON object ({} runs the built-in defaults)",
                 path);
        free(text);
        return -EINVAL;
    }
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char hint[128] = "";
        if (json_error_code(&jerr) == json_error_duplicate_key)
            snprintf(hint, sizeof hint, "; each key may appear once per object");
        else
            trailing_comma_hint(text, len, &jerr, hint, sizeof hint);
        snprintf(cfg->err, sizeof cfg->err, "%s:%d:%d: %s%s", path, jerr.line, jerr.column,
                 jerr.text, hint);
        free(text);
        return -EINVAL;
    }
    if (!json_is_object(root)) {
        int line = 1, col = 1;
        fso_json_locate(text, NULL, 0, &line, &col);
        snprintf(cfg->err, sizeof cfg->err,
                 "%s:%d:%d: expected a JSON object at the top level, got %s; put the settings "
                 "in { }", path, line, col, json_type_word(root));
        json_decref(root);
        free(text);
        return -EINVAL;
    }
    int rc = merge_objects(cfg->doc->merged, root, true);
    cfg_layer l = {.kind = LAYER_FILE, .name = strdup(path), .text = text, .root = root,
                   .write_depth = 1};
    if (rc == 0 && !l.name)
        rc = -ENOMEM;
    if (rc < 0) {
        layer_free(&l);
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory merging config", path);
        return rc;
    }
    CFG_TRY(doc_add_layer(cfg->doc, &l));
    snprintf(cfg->source, sizeof cfg->source, "%s", path);
    return 0;
}

/* One KEY=VALUE override; label is how errors quote it: the option as the
 * user wrote it ("--set KEY=VALUE", "--init-from DIR"). */
static int config_set(fso_config *cfg, const char *assignment, const char *label)
{
    const char *eq = strchr(assignment, '=');
    const char *key[CFG_MAX_DEPTH];
    int depth = 0;

    cfg->err[0] = '\0';
    if (!eq || eq == assignment) {
        snprintf(cfg->err, sizeof cfg->err, "%s: expected key.path=value", label);
        return -EINVAL;
    }
    char *keys = strndup(assignment, (size_t)(eq - assignment));
    if (!keys) {
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory", label);
        return -ENOMEM;
    }
    for (char *k = keys;;) {
        char *dot = strchr(k, '.');
        if (dot)
            *dot = '\0';
        if (*k == '\0' || depth == CFG_MAX_DEPTH) {
            if (*k == '\0')
                snprintf(cfg->err, sizeof cfg->err,
                         "%s: empty key in the path; expected key.path=value", label);
            else
                snprintf(cfg->err, sizeof cfg->err, "%s: key path is deeper than %d levels",
                         label, CFG_MAX_DEPTH);
            free(keys);
            return -EINVAL;
        }
        key[depth++] = k;
        if (!dot)
            break;
        k = dot + 1;
    }

    int rc = doc_ensure(cfg);
    if (rc < 0) {
        free(keys);
        return rc;
    }
    /* The whole path must run through objects (absent or null ones are created). */
    json_t *node = cfg->doc->merged;
    for (int i = 0; i < depth - 1 && node; i++) {
        json_t *child = json_object_get(node, key[i]);
        if (child && !json_is_object(child) && !json_is_null(child)) {
            keypath p = {{0}, i + 1};
            char name[256];
            memcpy(p.k, key, sizeof key);
            kp_format(&p, name, sizeof name);
            snprintf(cfg->err, sizeof cfg->err,
                     "%s: %s is a%s %s, not an object, so it has no key \"%s\"", label,
                     name, json_is_array(child) ? "n" : "",
                     json_type_word(child), key[i + 1]);
            free(keys);
            return -EINVAL;
        }
        node = child && json_is_object(child) ? child : NULL;
    }

    json_error_t jerr;
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!value && !(value = json_string(eq + 1))) {
        snprintf(cfg->err, sizeof cfg->err, "%s: the value is not valid UTF-8",
                 label);
        free(keys);
        return -EINVAL;
    }
    /* What this --set wrote, as a document from the root, for error locations. */
    json_t *written = json_incref(value);
    for (int i = depth - 1; i >= 0 && written; i--) {
        json_t *o = json_object();
        if (o && json_object_set_new(o, key[i], written) == 0) {
            written = o;
        } else {
            json_decref(o);
            written = NULL;
        }
    }
    rc = written ? 0 : -ENOMEM;
    node = cfg->doc->merged;
    for (int i = 0; i < depth - 1 && rc == 0; i++) {
        json_t *child = json_object_get(node, key[i]);
        if (!child || json_is_null(child)) {
            child = json_object();
            if (!child || json_object_set_new(node, key[i], child) < 0)
                rc = -ENOMEM;
        }
        node = child;
    }
    if (rc == 0 && json_object_set(node, key[depth - 1], value) < 0)
        rc = -ENOMEM;
    json_decref(value);
    free(keys);
    if (rc < 0) {
        json_decref(written);
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory", label);
        return rc;
    }
    cfg_layer l = {.kind = LAYER_SET, .name = strdup(label), .root = written,
                   .write_depth = depth};
    if (!l.name) {
        layer_free(&l);
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory", label);
        return -ENOMEM;
    }
    rc = doc_add_layer(cfg->doc, &l);
    if (rc < 0)
        snprintf(cfg->err, sizeof cfg->err, "%s: out of memory", label);
    return rc;
}

int fso_config_set_as(fso_config *cfg, const char *assignment, const char *written)
{
    char *label = NULL;
    if (!written && asprintf(&label, "--set %s", assignment) < 0) {
        snprintf(cfg->err, sizeof cfg->err, "--set %s: out of memory", assignment);
        return -ENOMEM;
    }
    int rc = config_set(cfg, assignment, written ? written : label);
    free(label);
    return rc;
}

int fso_config_set(fso_config *cfg, const char *assignment)
{
    return fso_config_set_as(cfg, assignment, NULL);
}

/* ---------------------------------------------------------------- origins */

static uint64_t key_hash(const char *key)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

/* Whether top-level key k is one of DeepSpeed's sections fsoff reads as a
 * whole (config_ds.c): ignored, or refused unless inactive. Their contents
 * are DeepSpeed's to define and unbounded, so such a section is recorded as
 * one key. */
static bool is_ds_section(const char *k)
{
    for (const key_spec *s = fso_cfg_ds_top_keys; s->name; s++)
        if (strcmp(s->name, k) == 0)
            return true;
    return false;
}

/* Record the origin of every leaf below node (at path p) that a file or a
 * --set gave. */
static void record_given(const struct fso_config_doc *doc, json_t *node, keypath *p,
                         fso_config_given *given)
{
    if (json_is_object(node) && json_object_size(node) > 0 && p->n < CFG_MAX_DEPTH &&
        !(p->n == 1 && is_ds_section(p->k[0]))) {
        const char *key;
        json_t *v;
        json_object_foreach(node, key, v) {
            keypath c = fso_cfg_kp_child(p, key);
            record_given(doc, v, &c, given);
        }
        return;
    }
    char where[64], name[1024];
    int li = cfg_where(doc, p, where, sizeof where);
    if (doc->layers[li].kind == LAYER_DEFAULTS)
        return;
    FSO_BUG_ON(given->n >= FSO_CONFIG_MAX_GIVEN, "more than %d keys given",
               FSO_CONFIG_MAX_GIVEN);
    kp_format(p, name, sizeof name);
    given->key_hash[given->n] = key_hash(name);
    /* "auto" passed validation only where config.h says a key takes it */
    given->origin[given->n++] =
        (uint8_t)(fso_cfg_is_auto(node)                 ? FSO_ORIGIN_AUTO
                  : doc->layers[li].kind == LAYER_FILE ? FSO_ORIGIN_FILE
                                                       : FSO_ORIGIN_SET);
}

fso_tier fso_offload_tier(const fso_offload_config *o, fso_kind k)
{
    if (o->per_kind)
        return o->kind_tier[k];
    return k == FSO_KIND_PARAM ? o->param_tier : o->optim_tier;
}

void fso_offload_block_rule(const fso_offload_config *o, int n_blocks, fso_block_rule *r)
{
    r->n_blocks = n_blocks;
    for (int k = 0; k < FSO_N_KINDS; k++)
        r->tier[k] = fso_offload_tier(o, (fso_kind)k);
    r->resident_blocks = o->resident_blocks;
    r->device_state_blocks = o->device_state_blocks;
    r->device_state_first = o->device_state_first;
    r->state_host_blocks = o->state_host_blocks;
}

fso_tier fso_offload_block_tier(const fso_offload_config *o, fso_kind k, int b, int n_blocks)
{
    fso_block_rule r;
    fso_offload_block_rule(o, n_blocks, &r);
    return fso_block_tier(&r, k, b);
}

fso_config_origin fso_config_origin_of(const fso_config *cfg, const char *key)
{
    const uint64_t h = key_hash(key);
    for (int i = 0; i < cfg->given.n; i++)
        if (cfg->given.key_hash[i] == h)
            return (fso_config_origin)cfg->given.origin[i];
    return FSO_ORIGIN_DEFAULT;
}

bool fso_config_acts_pinned(const fso_config *cfg)
{
    return fso_config_pinned(cfg, "train.activations") ||
           fso_config_pinned(cfg, "activation_checkpointing.cpu_checkpointing");
}

int fso_config_finish(fso_config *cfg)
{
    cfg->err[0] = '\0';
    if (!cfg->doc)
        return 0; /* nothing loaded or set: the struct holds the built-in defaults */
    struct fso_config_doc *doc = cfg->doc;
    int rc = fill_missing(doc->merged, doc->layers[0].root, true);
    if (rc < 0)
        snprintf(cfg->err, sizeof cfg->err, "out of memory validating the configuration");
    else if ((rc = fso_cfg_hf_merge(cfg, doc)) == 0)
        rc = fso_cfg_apply(cfg, doc, true);
    if (rc == 0) {
        keypath root = {{0}, 0};
        memset(&cfg->given, 0, sizeof cfg->given);
        record_given(doc, doc->merged, &root, &cfg->given);
    }
    cfg->doc = NULL;
    doc_destroy(doc);
    return rc;
}

int fso_config_load_written(fso_config *cfg, const char *path, char *const *sets,
                            char *const *written, int nsets)
{
    int rc;
    if (path && (rc = fso_config_load_file(cfg, path)) < 0)
        return rc;
    for (int i = 0; i < nsets; i++)
        if ((rc = fso_config_set_as(cfg, sets[i], written ? written[i] : NULL)) < 0)
            return rc;
    return fso_config_finish(cfg);
}

int fso_config_load_all(fso_config *cfg, const char *path, char *const *sets, int nsets)
{
    return fso_config_load_written(cfg, path, sets, NULL, nsets);
}

void fso_config_free(fso_config *cfg)
{
    if (!cfg)
        return;
    doc_destroy(cfg->doc);
    cfg->doc = NULL;
}

/* ---------------------------------------------------------------- schedule */

/* Warmup fraction at iteration i of W: i/W (linear) or log(i+1)/log(W). */
static double warmup_fraction(fso_warmup_type t, double i, double W)
{
    if (t == FSO_WARMUP_LINEAR)
        return i / W;
    return log(i + 1) / log(W > 2 ? W : 2);
}

double fso_config_lr_at(const fso_config *cfg, int64_t step)
{
    const fso_sched_config *s = &cfg->sched;
    double i = (double)(step > 1 ? step - 1 : 0); /* DeepSpeed's last_batch_iteration */
    double total = (double)(s->total_num_steps > 0 ? s->total_num_steps : cfg->steps);
    double W = (double)s->warmup_num_steps;

    switch (s->type) {
    case FSO_SCHED_WARMUP_COSINE: {
        double ratio;
        if (i < W) {
            ratio = s->warmup_min_ratio +
                    (1 - s->warmup_min_ratio) * warmup_fraction(s->warmup_type, i, W);
        } else {
            double span = total - W > 1 ? total - W : 1;
            double t = (i - W + 1) / span;
            if (t > 1)
                t = 1; /* past total_num_steps: stay at the floor */
            ratio = s->cos_min_ratio + (1 - s->cos_min_ratio) * (1 + cos(M_PI * t)) / 2;
            if (ratio < 0)
                ratio = 0;
        }
        return cfg->optim.lr * ratio;
    }
    case FSO_SCHED_WARMUP:
    case FSO_SCHED_WARMUP_DECAY: {
        double Wp = W > 2 ? W : 2, gamma;
        if (i < Wp)
            gamma = warmup_fraction(s->warmup_type, i, Wp);
        else if (s->type == FSO_SCHED_WARMUP)
            gamma = 1;
        else
            gamma = fmax(0, (total - i) / fmax(1, total - Wp));
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case FSO_SCHED_CONSTANT:
        break;
    }
    return cfg->optim.lr;
}
