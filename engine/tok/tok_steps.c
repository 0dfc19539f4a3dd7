/* tok_steps.c — the steps of tokenizer.json around the model, read into
 * fso_tokenizer (tok_impl.h): the normalizer (NFC, Prepend, Replace with a
 * string), the pre-tokenizer (Split with a regex, Isolated; ByteLevel;
 * Digits; Metaspace) and the decoder (ByteLevel, Replace, ByteFallback,
 * Fuse, Strip, Metaspace), each possibly a Sequence. Anything else is
 * refused by its JSON path (tok_load.h). Regexes are compiled here as the
 * library's onig feature compiles them, once to check them; each worker
 * compiles its own copy (tokenizer.c).
 */
#include "tok_load.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The built-in split pattern of ByteLevel(use_regex=true). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- normalizer ---- */

int tok_load_norm(ld *l, json_t *n, const char **path, int depth)
{
    fso_tokenizer *t = l->t;
    const char *ty = tok_json_type(n);
    path[depth] = "type";
    if (!ty)
        return BAD(l, path, depth, "a normalizer needs a \"type\"");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        path[depth] = "normalizers";
        if (!json_is_array(arr))
            return BAD(l, path, depth + 1, "expected an array");
        char idx[24];
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(idx, sizeof idx, "%zu", i);
            path[depth] = "normalizers";
            path[depth + 1] = idx;
            int rc = tok_load_norm(l, json_array_get(arr, i), path, depth + 2);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (t->n_norm == TOK_MAX_NORM)
        return REFUSE(l, path, depth, "more than %d normalizers", TOK_MAX_NORM);
    tok_norm *nm = &t->norm[t->n_norm];
    if (!strcmp(ty, "NFC")) {
        nm->kind = TOK_NORM_NFC;
    } else if (!strcmp(ty, "Prepend")) {
        json_t *p = json_object_get(n, "prepend");
        path[depth] = "prepend";
        if (!json_is_string(p))
            return BAD(l, path, depth + 1, "expected a string");
        nm->kind = TOK_NORM_PREPEND;
        if (tok_json_str(p, &nm->a, &nm->alen))
            return -ENOMEM;
    } else if (!strcmp(ty, "Replace")) {
        json_t *pat = json_object_get(n, "pattern"), *content = json_object_get(n, "content");
        json_t *s = json_object_get(pat, "String");
        path[depth] = "pattern";
        if (!json_is_string(s) || json_string_length(s) == 0)
            return REFUSE(l, path, depth + 1, "Replace supports a {\"String\": \"...\"} pattern "
                          "only (a Regex pattern is not supported)");
        path[depth] = "content";
        if (!json_is_string(content))
            return BAD(l, path, depth + 1, "expected a string");
        nm->kind = TOK_NORM_REPLACE;
        if (tok_json_str(s, &nm->a, &nm->alen) || tok_json_str(content, &nm->b, &nm->blen))
            return -ENOMEM;
    } else {
        return REFUSE(l, path, depth + 1, "normalizer \"%s\" is not supported; fsoff runs NFC, "
                      "Prepend, Replace (String) and Sequence of them", ty);
    }
    t->n_norm++;
    return 0;
}

/* ---- pre-tokenizer ---- */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static void onig_setup(void)
{
    OnigEncoding enc = ONIG_ENCODING_UTF8;
    onig_initialize(&enc, 1);
}

/* Oniguruma as the library's onig feature calls it. 0 or an Oniguruma code. */
int tok_regex_new(OnigRegex *re, const char *pat, size_t len, OnigErrorInfo *einfo)
{
    pthread_once(&onig_once, onig_setup);
    return onig_new(re, (const UChar *)pat, (const UChar *)pat + len, ONIG_OPTION_NONE,
                    ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, einfo);
}

static int compile_regex(ld *l, const char *pat, size_t len, tok_pre *pt,
                         const char **path, int depth)
{
    OnigErrorInfo einfo;
    OnigRegex *re = &pt->re;
    int r = tok_regex_new(re, pat, len, &einfo);
    if (r != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, r, &einfo);
        *re = NULL;
        return BAD(l, path, depth, "the regex does not compile: %s", (char *)msg);
    }
    if (!(pt->pattern = malloc(len + 1)))
        return -ENOMEM;
    memcpy(pt->pattern, pat, len);
    pt->pattern[len] = '\0';
    pt->pattern_len = len;
    return 0;
}

int tok_load_pre(ld *l, json_t *p, const char **path, int depth)
{
    fso_tokenizer *t = l->t;
    const char *ty = tok_json_type(p);
    path[depth] = "type";
    if (!ty)
        return BAD(l, path, depth, "a pre-tokenizer needs a \"type\"");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        path[depth] = "pretokenizers";
        if (!json_is_array(arr))
            return BAD(l, path, depth + 1, "expected an array");
        char idx[24];
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(idx, sizeof idx, "%zu", i);
            path[depth] = "pretokenizers";
            path[depth + 1] = idx;
            int rc = tok_load_pre(l, json_array_get(arr, i), path, depth + 2);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (t->n_pre == TOK_MAX_PRE)
        return REFUSE(l, path, depth, "more than %d pre-tokenizers", TOK_MAX_PRE);
    if (t->byte_level)
        return REFUSE(l, path, depth + 1, "a pre-tokenizer (\"%s\") after ByteLevel is not "
                      "supported", ty);
    tok_pre *pt = &t->pre[t->n_pre];
    int rc;
    if (!strcmp(ty, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex");
        json_t *beh = json_object_get(p, "behavior");
        bool invert = false;
        path[depth] = "pattern";
        if (!json_is_string(rx))
            return REFUSE(l, path, depth + 1, "Split supports a {\"Regex\": \"...\"} pattern only");
        path[depth] = "behavior";
        if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"))
            return REFUSE(l, path, depth + 1, "Split behavior %s is not supported; fsoff runs "
                          "\"Isolated\"", json_is_string(beh) ? json_string_value(beh) : "(none)");
        if ((rc = tok_json_bool(l, p, "invert", false, &invert, path, depth)))
            return rc;
        if (invert) {
            path[depth] = "invert";
            return REFUSE(l, path, depth + 1, "Split with invert=true is not supported");
        }
        pt->kind = TOK_PRE_SPLIT;
        path[depth] = "pattern";
        path[depth + 1] = "Regex";
        if ((rc = compile_regex(l, json_string_value(rx), json_string_length(rx), pt, path,
                                depth + 2)))
            return rc;
        pt->scan = tok_scan_kind_of(json_string_value(rx), json_string_length(rx));
    } else if (!strcmp(ty, "ByteLevel")) {
        bool use_regex = true;
        pt->kind = TOK_PRE_BYTELEVEL;
        if ((rc = tok_json_bool(l, p, "add_prefix_space", false, &pt->add_prefix_space, path, depth)) ||
            (rc = tok_json_bool(l, p, "use_regex", true, &use_regex, path, depth)))
            return rc;
        if (use_regex && (rc = compile_regex(l, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, pt,
                                             path, depth)))
            return rc;
        if (use_regex)
            pt->scan = tok_scan_kind_of(GPT2_PATTERN, sizeof GPT2_PATTERN - 1);
        t->byte_level = true;
    } else if (!strcmp(ty, "Digits")) {
        pt->kind = TOK_PRE_DIGITS;
        if ((rc = tok_json_bool(l, p, "individual_digits", false, &pt->individual, path, depth)))
            return rc;
    } else if (!strcmp(ty, "Metaspace")) {
        json_t *rep = json_object_get(p, "replacement"), *sch = json_object_get(p, "prepend_scheme");
        pt->kind = TOK_PRE_METASPACE;
        path[depth] = "replacement";
        if (!json_is_string(rep) || json_string_length(rep) == 0 ||
            json_string_length(rep) >= sizeof pt->repl)
            return BAD(l, path, depth + 1, "expected one character");
        memcpy(pt->repl, json_string_value(rep), json_string_length(rep));
        pt->repl_len = json_string_length(rep);
        if ((rc = tok_json_bool(l, p, "split", true, &pt->split, path, depth)))
            return rc;
        if (json_is_string(sch)) {
            const char *s = json_string_value(sch);
            path[depth] = "prepend_scheme";
            if (!strcmp(s, "always"))
                pt->prepend = TOK_PREPEND_ALWAYS;
            else if (!strcmp(s, "first"))
                pt->prepend = TOK_PREPEND_FIRST;
            else if (!strcmp(s, "never"))
                pt->prepend = TOK_PREPEND_NEVER;
            else
                return BAD(l, path, depth + 1, "\"%s\": expected \"always\", \"first\" or \"never\"", s);
        } else {
            bool aps = true; /* older files: add_prefix_space */
            if ((rc = tok_json_bool(l, p, "add_prefix_space", true, &aps, path, depth)))
                return rc;
            pt->prepend = aps ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        }
    } else {
        return REFUSE(l, path, depth + 1, "pre-tokenizer \"%s\" is not supported; fsoff runs "
                      "Split (Regex, Isolated), ByteLevel, Digits, Metaspace and Sequence of them", ty);
    }
    t->n_pre++;
    return 0;
}

/* ---- decoder ---- */

int tok_load_dec(ld *l, json_t *d, const char **path, int depth)
{
    fso_tokenizer *t = l->t;
    const char *ty = tok_json_type(d);
    path[depth] = "type";
    if (!ty)
        return BAD(l, path, depth, "a decoder needs a \"type\"");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(d, "decoders");
        path[depth] = "decoders";
        if (!json_is_array(arr))
            return BAD(l, path, depth + 1, "expected an array");
        char idx[24];
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(idx, sizeof idx, "%zu", i);
            path[depth] = "decoders";
            path[depth + 1] = idx;
            int rc = tok_load_dec(l, json_array_get(arr, i), path, depth + 2);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (t->n_dec == TOK_MAX_DEC)
        return REFUSE(l, path, depth, "more than %d decoders", TOK_MAX_DEC);
    tok_dec *dc = &t->dec[t->n_dec];
    if (!strcmp(ty, "ByteLevel")) {
        dc->kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(ty, "ByteFallback")) {
        dc->kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        dc->kind = TOK_DEC_FUSE;
    } else if (!strcmp(ty, "Replace")) {
        json_t *s = json_object_get(json_object_get(d, "pattern"), "String");
        json_t *content = json_object_get(d, "content");
        path[depth] = "pattern";
        if (!json_is_string(s) || json_string_length(s) == 0 || !json_is_string(content))
            return REFUSE(l, path, depth + 1, "the Replace decoder supports a {\"String\": \"...\"} "
                          "pattern only");
        dc->kind = TOK_DEC_REPLACE;
        if (tok_json_str(s, &dc->a, &dc->alen) || tok_json_str(content, &dc->b, &dc->blen))
            return -ENOMEM;
    } else if (!strcmp(ty, "Strip")) {
        json_t *c = json_object_get(d, "content"), *st = json_object_get(d, "start"),
               *sp = json_object_get(d, "stop");
        path[depth] = "content";
        if (!json_is_string(c) || !json_is_integer(st) || !json_is_integer(sp))
            return BAD(l, path, depth + 1, "expected content (one character), start and stop");
        dc->kind = TOK_DEC_STRIP;
        if (tok_json_str(c, &dc->a, &dc->alen))
            return -ENOMEM;
        dc->start = (int)json_integer_value(st);
        dc->stop = (int)json_integer_value(sp);
    } else if (!strcmp(ty, "Metaspace")) {
        json_t *rep = json_object_get(d, "replacement"), *sch = json_object_get(d, "prepend_scheme");
        path[depth] = "replacement";
        if (!json_is_string(rep) || json_string_length(rep) == 0)
            return BAD(l, path, depth + 1, "expected one character");
        dc->kind = TOK_DEC_METASPACE;
        if (tok_json_str(rep, &dc->a, &dc->alen))
            return -ENOMEM;
        const char *s = json_is_string(sch) ? json_string_value(sch) : NULL;
        json_t *aps = json_object_get(d, "add_prefix_space");
        dc->prepend = s ? (!strcmp(s, "never") ? TOK_PREPEND_NEVER : !strcmp(s, "first")
                           ? TOK_PREPEND_FIRST : TOK_PREPEND_ALWAYS)
                        : (json_is_false(aps) ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS);
    } else {
        return REFUSE(l, path, depth + 1, "decoder \"%s\" is not supported; fsoff runs ByteLevel, "
                      "Replace (String), ByteFallback, Fuse, Strip, Metaspace and Sequence of them", ty);
    }
    t->n_dec++;
    return 0;
}

