/* tok_load.c — reading a Hugging Face tokenizer folder into fso_tokenizer
 * (tok_impl.h): tokenizer.json (model, added tokens, post-processor; the
 * normalizer, pre-tokenizer and decoder through tok_steps.c) and
 * tokenizer_config.json (bos_token, eos_token, add_bos_token).
 *
 * Contract: every key that changes what encode() or decode() produce is
 * either implemented exactly or refused, with the file, line:column, the JSON
 * path, the value and what fsoff supports. Keys that only concern offsets
 * (trim_offsets) or batching (padding, truncation) are accepted and unused.
 */
#include "tok_load.h"
#include "config/json_locate.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int tok_load_fail(ld *l, int rc, const char *const *path, int depth, const char *fmt, ...)
{
    char where[256] = "", msg[768];
    int line, col;
    size_t o = 0;
    for (int i = 0; i < depth && o < sizeof where - 1; i++) {
        bool idx = path[i][0] >= '0' && path[i][0] <= '9';
        o += (size_t)snprintf(where + o, sizeof where - o, idx ? "[%s]" : (i ? ".%s" : "%s"), path[i]);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (l->err) {
        if (l->text && depth && !fso_json_locate(l->text, path, depth, &line, &col))
            snprintf(l->err, l->errlen, "%s:%d:%d: %s: %s", l->file, line, col, where, msg);
        else if (depth)
            snprintf(l->err, l->errlen, "%s: %s: %s", l->file, where, msg);
        else
            snprintf(l->err, l->errlen, "%s: %s", l->file, msg);
    }
    return rc;
}

const char *tok_json_type(json_t *o)
{
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

/* A key that must be absent, null, false, "" or the given harmless value. */
static bool unset(json_t *v)
{
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_string(v) && json_string_length(v) == 0);
}

int tok_json_bool(ld *l, json_t *o, const char *key, bool dflt, bool *out,
                    const char **path, int depth)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) {
        path[depth] = key;
        return BAD(l, path, depth + 1, "expected true or false");
    }
    *out = json_is_true(v);
    return 0;
}

int tok_json_str(json_t *v, char **s, size_t *len)
{
    *len = json_string_length(v);
    *s = malloc(*len + 1);
    if (!*s)
        return -ENOMEM;
    memcpy(*s, json_string_value(v), *len + 1);
    return 0;
}

/* ---- model ---- */

#define SPM_SPACE "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* Whether a token has "▁" after another character ("a▁b", "a▁"): a vocabulary
 * without such tokens never merges across the start of a "▁" that follows
 * another character, so BPE may run on each such part alone (tok_bpe.c). */
static bool spm_split_breaks(const char *k, size_t len)
{
    bool other = false;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && !memcmp(k + i, SPM_SPACE, 3)) {
            if (other)
                return true;
            i += 3;
        } else {
            other = true;
            i++;
        }
    }
    return false;
}

/* The id of a token as tokenizer.json writes it (vocab or added), or -1. */
static int32_t written_id(const fso_tokenizer *t, const char *s, size_t len, tok_strmap *written)
{
    return tok_strmap_get(written, s, len);
}

/* model.type (BPE only), the keys fsoff refuses and the flags it reads,
 * into l->t. path[0] is "model". */
static int load_model_flags(ld *l, json_t *m, const char **path)
{
    fso_tokenizer *t = l->t;
    const char *ty = tok_json_type(m);
    if (ty && strcmp(ty, "BPE")) {
        path[1] = "type";
        return REFUSE(l, path, 2, "model type \"%s\" is not supported: fsoff runs BPE models "
                      "only (byte-level BPE and SentencePiece-style BPE)", ty);
    }
    static const char *const off[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < sizeof off / sizeof *off; k++) {
        json_t *v = json_object_get(m, off[k]);
        if (!unset(v)) {
            path[1] = off[k];
            char *val = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
            int rc = REFUSE(l, path, 2, "%s is not supported (got %s); fsoff runs BPE without it",
                            off[k], val ? val : "?");
            free(val);
            return rc;
        }
    }
    int rc;
    if ((rc = tok_json_bool(l, m, "fuse_unk", false, &t->fuse_unk, path, 1)) ||
        (rc = tok_json_bool(l, m, "byte_fallback", false, &t->byte_fallback, path, 1)) ||
        (rc = tok_json_bool(l, m, "ignore_merges", false, &t->ignore_merges, path, 1)))
        return rc;
    return 0;
}

/* model.vocab into t->vocab (byte-level tokens as their bytes) and written
 * (tokens as the file writes them); sets n_ids and spm_split. */
static int load_vocab(ld *l, json_t *m, tok_strmap *written, const char **path)
{
    fso_tokenizer *t = l->t;
    int rc;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) {
        path[1] = "vocab";
        return BAD(l, path, 1, "model.vocab is missing or not an object of token -> id");
    }
    size_t nv = json_object_size(vocab);
    if ((rc = tok_strmap_init(&t->vocab, (uint32_t)nv)) ||
        (rc = tok_strmap_init(written, (uint32_t)nv + 1024)))
        return rc;
    const char *key;
    json_t *val;
    char *raw = NULL;
    size_t raw_cap = 0;
    bool spm_ok = true;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= INT32_MAX / 2) {
            free(raw);
            path[1] = "vocab";
            path[2] = key;
            return BAD(l, path, 3, "expected a non-negative id");
        }
        size_t klen = strlen(key);
        if ((rc = tok_strmap_put(written, key, klen, (int32_t)id)) < 0)
            break;
        if (t->byte_level) {
            if (klen + 1 > raw_cap && !(raw = realloc(raw, raw_cap = klen * 2 + 16)))
                return -ENOMEM;
            size_t rl;
            /* A token outside the byte-to-character mapping can never come
             * out of byte-level text; it keeps only its written form. */
            if (tok_bytes_of_mapped(key, klen, raw, &rl) &&
                (rc = tok_strmap_put(&t->vocab, raw, rl, (int32_t)id)) < 0)
                break;
        } else {
            if ((rc = tok_strmap_put(&t->vocab, key, klen, (int32_t)id)) < 0)
                break;
            if (spm_split_breaks(key, klen))
                spm_ok = false;
        }
        if ((int32_t)id >= t->n_ids)
            t->n_ids = (int32_t)id + 1;
        rc = 0;
    }
    free(raw);
    if (rc < 0)
        return rc;
    t->spm_split = !t->byte_level && spm_ok && tok_strmap_get(&t->vocab, SPM_SPACE, 3) >= 0;
    return 0;
}

/* model.unk_token's id and the single-byte tokens' ids: byte-level models
 * need all 256; byte_fallback uses <0xNN>. */
static int load_unk_and_bytes(ld *l, json_t *m, tok_strmap *written, const char **path)
{
    fso_tokenizer *t = l->t;
    json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = tok_strmap_get(written, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) {
            path[1] = "unk_token";
            return BAD(l, path, 2, "\"%s\" is not in model.vocab", json_string_value(unk));
        }
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            char c = (char)b;
            t->byte_id[b] = tok_strmap_get(&t->vocab, &c, 1);
            if (t->byte_id[b] < 0) {
                path[1] = "vocab";
                return BAD(l, path, 2, "has no token for byte 0x%02X, which a byte-level "
                           "vocabulary needs", b);
            }
        } else {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = tok_strmap_get(&t->vocab, name, 6);
        }
    }
    return 0;
}

/* model.merges ("a b" or ["a", "b"], each token and their concatenation in
 * the vocabulary) into t->merges, ranked by position. */
static int load_merges(ld *l, json_t *m, tok_strmap *written, const char **path)
{
    fso_tokenizer *t = l->t;
    int rc;
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) {
        path[1] = "merges";
        return BAD(l, path, 1, "model.merges is missing or not an array");
    }
    size_t nm = json_array_size(merges);
    if ((rc = tok_pairmap_init(&t->merges, (uint32_t)nm)))
        return rc;
    char *cat = NULL;
    size_t cat_cap = 0;
    char idx[24];
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t alen, blen;
        snprintf(idx, sizeof idx, "%zu", i);
        path[1] = "merges";
        path[2] = idx;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(cat);
                return BAD(l, path, 3, "\"%s\": a merge written as a string is two tokens "
                           "separated by one space", a);
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            alen = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            blen = json_string_length(json_array_get(e, 1));
        } else {
            free(cat);
            return BAD(l, path, 3, "expected \"a b\" or [\"a\", \"b\"]");
        }
        if (alen + blen + 1 > cat_cap && !(cat = realloc(cat, cat_cap = (alen + blen) * 2 + 16)))
            return -ENOMEM;
        memcpy(cat, a, alen);
        memcpy(cat + alen, b, blen);
        int32_t ia = written_id(t, a, alen, written), ib = written_id(t, b, blen, written);
        int32_t im = written_id(t, cat, alen + blen, written);
        if (ia < 0 || ib < 0 || im < 0) {
            int w = ia < 0 ? 0 : ib < 0 ? 1 : 2;
            int len = (int)(w == 0 ? alen : w == 1 ? blen : alen + blen);
            const char *which = w == 0 ? a : w == 1 ? b : cat;
            int r2 = BAD(l, path, 3, "token \"%.*s\" is not in model.vocab; the file is "
                         "inconsistent: download it again", len, which);
            free(cat);
            return r2;
        }
        /* A pair listed twice keeps its last rank, as in the library. */
        if ((rc = tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, im)) < 0) {
            free(cat);
            return rc;
        }
    }
    free(cat);
    return 0;
}

/* tokenizer.json's "model" (a BPE model) into l->t; written gets every
 * vocabulary token as the file writes it. */
static int load_model(ld *l, json_t *root, tok_strmap *written)
{
    const char *path[4] = {"model"};
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m))
        return BAD(l, path, 0, "no \"model\" object; the file is not a tokenizers tokenizer.json");
    int rc;
    if ((rc = load_model_flags(l, m, path)) || (rc = load_vocab(l, m, written, path)) ||
        (rc = load_unk_and_bytes(l, m, written, path)))
        return rc;
    return load_merges(l, m, written, path);
}

/* ---- added tokens ---- */

static int load_added(ld *l, json_t *root, tok_strmap *written)
{
    fso_tokenizer *t = l->t;
    json_t *arr = json_object_get(root, "added_tokens");
    const char *path[4] = {"added_tokens"};
    char idx[24];
    int rc;
    if ((rc = tok_strmap_init(&t->added_map, 64)))
        return rc;
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return BAD(l, path, 1, "expected an array");
    size_t n = json_array_size(arr);
    for (int k = 0; k < 2; k++)
        if (!(t->matched[k] = calloc(n + 1, sizeof *t->matched[k])))
            return -ENOMEM;
    bool splits[2] = {false, false};
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(arr, i);
        snprintf(idx, sizeof idx, "%zu", i);
        path[1] = idx;
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX / 2 || !json_is_string(content) ||
            json_string_length(content) == 0)
            return BAD(l, path, 2, "expected {\"id\": N, \"content\": \"...\", ...}");
        int32_t iid = (int32_t)json_integer_value(id);
        const char *c = json_string_value(content);
        size_t clen = json_string_length(content);
        bool special = false, normalized = false, flag = false;
        if ((rc = tok_json_bool(l, a, "special", false, &special, path, 2)) ||
            (rc = tok_json_bool(l, a, "normalized", !special, &normalized, path, 2)))
            return rc;
        if ((rc = tok_strmap_put(&t->added_map, c, clen, iid)) < 0)
            return rc;
        if (tok_strmap_put(written, c, clen, iid) < 0)
            return -ENOMEM;
        if (iid >= t->n_ids)
            t->n_ids = iid + 1;
        if (!special) {
            static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
            for (int k = 0; k < 3; k++) {
                if ((rc = tok_json_bool(l, a, flags[k], false, &flag, path, 2)))
                    return rc;
                if (flag) {
                    path[2] = flags[k];
                    return REFUSE(l, path, 3, "a non-special added token (\"%s\") with %s=true "
                                  "is not supported", c, flags[k]);
                }
            }
            if (normalized && t->n_norm) {
                path[2] = "normalized";
                return REFUSE(l, path, 3, "a non-special added token (\"%s\") matched after the "
                              "normalizer is not supported", c);
            }
            splits[normalized] = true;
        }
        /* split_special_tokens=True: a special token found is left as text */
        int pass = normalized;
        tok_added *m = &t->matched[pass][t->n_matched[pass]++];
        if ((rc = tok_json_str(content, &m->content, &m->len)))
            return rc;
        m->id = iid;
        m->special = special;
        unsigned char f = (unsigned char)c[0];
        t->matched_first[pass][f >> 3] |= (uint8_t)(1u << (f & 7));
    }
    for (int k = 0; k < 2; k++)
        if (!splits[k]) {
            for (int i = 0; i < t->n_matched[k]; i++)
                free(t->matched[k][i].content);
            t->n_matched[k] = 0;
        }
    return 0;
}

/* ---- BOS / EOS ---- */

/* The id a TemplateProcessing item names ({"SpecialToken": {"id": NAME}}). */
static int32_t template_special(json_t *proc, json_t *item)
{
    json_t *st = json_object_get(item, "SpecialToken");
    if (!st)
        return -2; /* not a special-token item */
    const char *name = json_string_value(json_object_get(st, "id"));
    json_t *spec = json_object_get(json_object_get(proc, "special_tokens"), name ? name : "");
    json_t *ids = json_object_get(spec, "ids");
    if (json_array_size(ids) != 1 || !json_is_integer(json_array_get(ids, 0)))
        return -1;
    return (int32_t)json_integer_value(json_array_get(ids, 0));
}

static void load_template(fso_tokenizer *t, json_t *pp, int32_t *bos, int32_t *eos)
{
    const char *ty = tok_json_type(pp);
    if (!ty)
        return;
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++)
            load_template(t, json_array_get(arr, i), bos, eos);
        return;
    }
    if (strcmp(ty, "TemplateProcessing"))
        return;
    json_t *single = json_object_get(pp, "single");
    size_t n = json_array_size(single);
    if (n == 0)
        return;
    int32_t first = template_special(pp, json_array_get(single, 0));
    if (first >= 0) {
        *bos = first;
        t->adds_bos = 1;
    }
    int32_t last = template_special(pp, json_array_get(single, n - 1));
    if (last >= 0 && n > 1)
        *eos = last;
}

/* tokenizer_config.json's bos_token/eos_token: a string, {"content": ...} or null. */
static int config_token(ld *l, json_t *cfg, const char *key, int32_t *id)
{
    json_t *v = json_object_get(cfg, key);
    if (!v)
        return 0;
    if (json_is_null(v)) {
        *id = -1;
        return 0;
    }
    if (json_is_object(v))
        v = json_object_get(v, "content");
    const char *path[1] = {key};
    if (!json_is_string(v))
        return BAD(l, path, 1, "expected a token string or {\"content\": \"...\"}");
    *id = fso_tokenizer_token_id(l->t, json_string_value(v));
    if (*id < 0)
        return BAD(l, path, 1, "\"%s\" is not a token of tokenizer.json; the two files are from "
                   "different models", json_string_value(v));
    return 0;
}

static int load_config(ld *l, const char *dir, int32_t bos, int32_t eos)
{
    fso_tokenizer *t = l->t;
    char file[600];
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
    t->bos = bos;
    t->eos = eos;
    struct stat st;
    if (stat(file, &st))
        return 0;
    json_error_t je;
    /* Integers as reals: model_max_length is often 1e30 written as an integer. */
    json_t *cfg = json_load_file(file, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) {
        if (l->err)
            snprintf(l->err, l->errlen, "%s:%d:%d: %s; the file is not valid JSON: download it "
                     "again with the model", file, je.line, je.column, je.text);
        return -EINVAL;
    }
    ld lc = *l;
    lc.file = file;
    lc.text = NULL;
    int rc = config_token(&lc, cfg, "bos_token", &t->bos);
    if (!rc)
        rc = config_token(&lc, cfg, "eos_token", &t->eos);
    json_t *ab = json_object_get(cfg, "add_bos_token");
    if (!rc && json_is_boolean(ab))
        t->adds_bos = json_is_true(ab) && t->bos >= 0;
    json_decref(cfg);
    return rc;
}

/* ---- the whole file ---- */

static char *read_text(const char *file, int *err)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err = -errno;
        return NULL;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st)) {
        *err = -errno;
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        *err = -ENOMEM;
    } else {
        ssize_t got = fso_read_full(fd, buf, (size_t)st.st_size);
        if (got < 0 || (size_t)got != (size_t)st.st_size) {
            *err = got < 0 ? (int)got : -EIO;
            free(buf);
            buf = NULL;
        } else {
            buf[got] = '\0';
        }
    }
    close(fd);
    return buf;
}

int tok_load_json(fso_tokenizer *t, const char *dir, char *err, size_t errlen)
{
    ld l = {.t = t, .file = t->path, .err = err, .errlen = errlen};
    snprintf(t->path, sizeof t->path, "%s/tokenizer.json", dir);
    int rc = 0;
    char *text = read_text(t->path, &rc);
    if (!text) {
        if (rc == -ENOENT)
            return tok_load_fail(&l, rc, NULL, 0, "no such file; the tokenizer folder must hold the "
                        "model's Hugging Face tokenizer.json (copy it from the model repository)");
        return tok_load_fail(&l, rc, NULL, 0, "cannot read it: %s", strerror(-rc));
    }
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) {
        if (err)
            snprintf(err, errlen, "%s:%d:%d: %s; the file is not valid JSON: download it again "
                     "with the model", t->path, je.line, je.column, je.text);
        free(text);
        return -EINVAL;
    }
    l.text = text;
    tok_strmap written = {0};
    const char *path[24];
    int32_t bos = -1, eos = -1;
    if (!json_is_object(root)) {
        rc = BAD(&l, NULL, 0, "expected a JSON object");
        goto out;
    }
    json_t *n = json_object_get(root, "normalizer");
    path[0] = "normalizer";
    if (n && !json_is_null(n) && (rc = tok_load_norm(&l, n, path, 1)))
        goto out;
    json_t *p = json_object_get(root, "pre_tokenizer");
    path[0] = "pre_tokenizer";
    if (p && !json_is_null(p) && (rc = tok_load_pre(&l, p, path, 1)))
        goto out;
    /* ByteLevel must come last: the model then sees every byte as one character. */
    for (int i = 0; i + 1 < t->n_pre; i++)
        if (t->pre[i].kind == TOK_PRE_BYTELEVEL) {
            rc = REFUSE(&l, path, 1, "ByteLevel followed by another pre-tokenizer is not supported");
            goto out;
        }
    if ((rc = load_model(&l, root, &written)) || (rc = load_added(&l, root, &written)))
        goto out;
    json_t *d = json_object_get(root, "decoder");
    path[0] = "decoder";
    if (d && !json_is_null(d)) {
        t->has_decoder = true;
        if ((rc = tok_load_dec(&l, d, path, 1)))
            goto out;
    }
    /* id -> written token, added tokens over the vocabulary. */
    t->id_str = calloc((size_t)t->n_ids + 1, sizeof *t->id_str);
    t->id_len = calloc((size_t)t->n_ids + 1, sizeof *t->id_len);
    t->id_added = calloc((size_t)t->n_ids + 1, sizeof *t->id_added);
    if (!t->id_str || !t->id_len || !t->id_added) {
        rc = -ENOMEM;
        goto out;
    }
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        t->id_str[id] = (char *)key; /* replaced by copies below */
    }
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->id_str[id] = (char *)json_string_value(json_object_get(a, "content"));
        t->id_added[id] = true;
    }
    for (int32_t i = 0; i < t->n_ids; i++) {
        if (!t->id_str[i])
            continue;
        size_t len = strlen(t->id_str[i]);
        char *c = malloc(len + 1);
        if (!c) {
            for (int32_t j = i; j < t->n_ids; j++)
                t->id_str[j] = NULL;
            rc = -ENOMEM;
            goto out;
        }
        memcpy(c, t->id_str[i], len + 1);
        t->id_str[i] = c;
        t->id_len[i] = len;
    }
    json_t *pp = json_object_get(root, "post_processor");
    if (pp && !json_is_null(pp))
        load_template(t, pp, &bos, &eos);
    tok_strmap_free(&written);
    json_decref(root);
    free(text);
    return load_config(&l, dir, bos, eos);
out:
    tok_strmap_free(&written);
    json_decref(root);
    free(text);
    return rc;
}

int fso_tokenizer_load(fso_tokenizer **out, const char *dir, char *err, size_t errlen)
{
    *out = NULL;
    fso_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->bos = t->eos = t->unk_id = -1;
    int rc = tok_load_json(t, dir, err, errlen);
    if (rc) {
        fso_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void fso_tokenizer_free(fso_tokenizer *t)
{
    if (!t)
        return;
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->added_map);
    tok_pairmap_free(&t->merges);
    if (t->id_str)
        for (int32_t i = 0; i < t->n_ids; i++)
            free(t->id_str[i]);
    free(t->id_str);
    free(t->id_len);
    free(t->id_added);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < t->n_matched[k]; i++)
            free(t->matched[k][i].content);
        free(t->matched[k]);
    }
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->n_pre; i++) {
        if (t->pre[i].re)
            onig_free(t->pre[i].re);
        free(t->pre[i].pattern);
    }
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    free(t);
}
