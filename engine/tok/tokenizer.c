/* tokenizer.c — encoding text as the `tokenizers` library does
 * (tokenizer.h), on a tokenizer loaded by tok_load.c:
 *
 *   text -> split on the non-special added tokens (leftmost, longest; special
 *   ones stay text: split_special_tokens=True) -> each other segment through
 *   the normalizers -> the pre-tokenizers, each refining the pieces of the
 *   one before -> BPE on each final piece (tok_bpe.c).
 *
 * Pieces flow depth-first: a pre-tokenizer hands each piece it makes to the
 * next one at once, so nothing is collected per piece and nothing is
 * allocated once the worker's buffers have grown. The tokenizer is read-only
 * here; all mutable state is the worker's: its own compiled regexes and
 * match regions, buffers and cache.
 */
#include "tok_impl.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int fso_ids_push(fso_ids *ids, int32_t id)
{
    if (fso_reserve((void **)&ids->v, &ids->cap, ids->n + 1, sizeof *ids->v, 256) < 0)
        return -ENOMEM;
    ids->v[ids->n++] = id;
    return 0;
}

void fso_ids_free(fso_ids *ids)
{
    if (!ids)
        return;
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

int32_t fso_tokenizer_vocab_size(const fso_tokenizer *t)
{
    return t->n_ids;
}

int32_t fso_tokenizer_token_id(const fso_tokenizer *t, const char *content)
{
    size_t len = strlen(content);
    int32_t id = tok_strmap_get(&t->added_map, content, len);
    if (id >= 0)
        return id;
    if (!t->byte_level)
        return tok_strmap_get(&t->vocab, content, len);
    char *raw = malloc(len + 1);
    size_t rl;
    id = -1;
    if (raw && tok_bytes_of_mapped(content, len, raw, &rl))
        id = tok_strmap_get(&t->vocab, raw, rl);
    free(raw);
    return id;
}

int32_t fso_tokenizer_bos(const fso_tokenizer *t)
{
    return t->bos;
}

int32_t fso_tokenizer_eos(const fso_tokenizer *t)
{
    return t->eos;
}

int fso_tokenizer_adds_bos(const fso_tokenizer *t)
{
    return t->adds_bos;
}

fso_tok_worker *fso_tok_worker_new(const fso_tokenizer *t)
{
    fso_tok_worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->t = t;
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re &&
            (!(w->region[i] = onig_region_new()) ||
             tok_regex_new(&w->re[i], t->pre[i].pattern, t->pre[i].pattern_len, NULL) != ONIG_NORMAL))
            goto fail;
    if (!(w->cache = calloc(TOK_CACHE_SLOTS, sizeof *w->cache)))
        goto fail;
    return w;
fail:
    fso_tok_worker_free(w);
    return NULL;
}

void fso_tok_worker_free(fso_tok_worker *w)
{
    if (!w)
        return;
    for (int i = 0; i < TOK_MAX_PRE; i++) {
        if (w->region[i])
            onig_region_free(w->region[i], 1);
        if (w->re[i])
            onig_free(w->re[i]);
        free(w->stage[i].p);
    }
    free(w->norm.p);
    free(w->norm2.p);
    free(w->sym);
    free(w->heap);
    free(w->rank);
    free(w->cache);
    free(w);
}

/* ---- pre-tokenizers ---- */

static int pre_stage(fso_tok_worker *w, int i, const char *s, size_t len, bool at_origin,
                     fso_ids *out);

static int emit(fso_tok_worker *w, int i, const char *s, size_t len, bool at_origin, fso_ids *out)
{
    if (len == 0)
        return 0;
    return pre_stage(w, i + 1, s, len, at_origin, out);
}

/* Isolated split: every match and every gap between matches is a piece. */
static int split_regex(fso_tok_worker *w, int i, OnigRegex re, tok_scan_kind scan,
                       const char *s, size_t len, bool at_origin, fso_ids *out)
{
    const UChar *start = (const UChar *)s, *end = start + len;
    OnigRegion *rg = w->region[i];
    size_t pos = 0, gap = 0;
    while (pos < len) {
        /* The leftmost match from pos: the hand scanner's when it knows the
         * pattern and the text there is ASCII (tok_scan.c); else Oniguruma,
         * anchored at pos first (the patterns in use match at every
         * position), then searching (the same result when nothing matches
         * at pos). */
        size_t b, e;
        int r;
        if (scan && (e = tok_scan_match(scan, s, len, pos)) > pos) {
            b = pos;
        } else if ((r = onig_match(re, start, end, start + pos, rg, ONIG_OPTION_NONE)) > 0) {
            b = pos;
            e = pos + (size_t)r;
        } else {
            if (r != ONIG_MISMATCH && r < 0)
                return -EINVAL;
            r = onig_search(re, start, end, start + pos, end, rg, ONIG_OPTION_NONE);
            if (r == ONIG_MISMATCH)
                break;
            if (r < 0)
                return -EINVAL;
            b = (size_t)rg->beg[0];
            e = (size_t)rg->end[0];
        }
        int rc;
        if (e == b) {
            /* An empty match still ends the gap before it (as the library's
             * split does); the search goes on one character further. */
            if (b > gap && (rc = emit(w, i, s + gap, b - gap, at_origin && gap == 0, out)))
                return rc;
            if (b > gap)
                gap = b;
            int cl = tok_utf8_len(start + b, len - b);
            pos = b + (size_t)(cl ? cl : 1);
            continue;
        }
        if (b > gap && (rc = emit(w, i, s + gap, b - gap, at_origin && gap == 0, out)))
            return rc;
        if ((rc = emit(w, i, s + b, e - b, at_origin && b == 0, out)))
            return rc;
        gap = pos = e;
    }
    if (gap < len)
        return emit(w, i, s + gap, len - gap, at_origin && gap == 0, out);
    return 0;
}

static bool is_numeric(const unsigned char *s, size_t avail, int *cl)
{
    if (s[0] < 0x80) {
        *cl = 1;
        return s[0] >= '0' && s[0] <= '9';
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate(s, (utf8proc_ssize_t)avail, &cp);
    *cl = l > 0 ? (int)l : 1;
    if (l <= 0)
        return false;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static int split_digits(fso_tok_worker *w, int i, bool individual, const char *s, size_t len,
                        bool at_origin, fso_ids *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t piece = 0;
    bool in_num = false;
    int rc;
    for (size_t p = 0; p < len;) {
        int cl;
        bool num = is_numeric(u + p, len - p, &cl);
        if (num && (individual || !in_num)) {
            if (p > piece && (rc = emit(w, i, s + piece, p - piece, at_origin && piece == 0, out)))
                return rc;
            piece = p;
        } else if (!num && in_num) {
            if ((rc = emit(w, i, s + piece, p - piece, at_origin && piece == 0, out)))
                return rc;
            piece = p;
        }
        in_num = num;
        p += (size_t)cl;
    }
    return emit(w, i, s + piece, len - piece, at_origin && piece == 0, out);
}

static int metaspace(fso_tok_worker *w, int i, const tok_pre *pt, const char *s, size_t len,
                     bool at_origin, fso_ids *out)
{
    tok_buf *b = &w->stage[i];
    size_t spaces = 0;
    for (size_t p = 0; p < len; p++)
        spaces += s[p] == ' ';
    if (tok_buf_reserve(b, len + (spaces + 1) * pt->repl_len + 1))
        return -ENOMEM;
    size_t n = 0;
    bool starts = len > 0 && (s[0] == ' ' ||
                              (len >= pt->repl_len && !memcmp(s, pt->repl, pt->repl_len)));
    if (!starts && (pt->prepend == TOK_PREPEND_ALWAYS ||
                    (pt->prepend == TOK_PREPEND_FIRST && at_origin))) {
        memcpy(b->p, pt->repl, pt->repl_len);
        n = pt->repl_len;
    }
    for (size_t p = 0; p < len; p++) {
        if (s[p] == ' ') {
            memcpy(b->p + n, pt->repl, pt->repl_len);
            n += pt->repl_len;
        } else {
            b->p[n++] = s[p];
        }
    }
    if (!pt->split)
        return emit(w, i, b->p, n, at_origin, out);
    /* MergedWithNext: each replacement character starts a piece. */
    size_t piece = 0;
    int rc;
    for (size_t p = 0; p + pt->repl_len <= n;) {
        if (!memcmp(b->p + p, pt->repl, pt->repl_len)) {
            if (p > piece && (rc = emit(w, i, b->p + piece, p - piece, at_origin && piece == 0, out)))
                return rc;
            piece = p;
            p += pt->repl_len;
        } else {
            p++;
        }
    }
    return emit(w, i, b->p + piece, n - piece, at_origin && piece == 0, out);
}

static int pre_stage(fso_tok_worker *w, int i, const char *s, size_t len, bool at_origin,
                     fso_ids *out)
{
    const fso_tokenizer *t = w->t;
    if (i == t->n_pre)
        return tok_bpe_word(w, s, len, out);
    const tok_pre *pt = &t->pre[i];
    switch (pt->kind) {
    case TOK_PRE_SPLIT:
        return split_regex(w, i, w->re[i], pt->scan, s, len, at_origin, out);
    case TOK_PRE_BYTELEVEL:
        if (pt->add_prefix_space && s[0] != ' ') {
            tok_buf *b = &w->stage[i];
            if (tok_buf_reserve(b, len + 1))
                return -ENOMEM;
            b->p[0] = ' ';
            memcpy(b->p + 1, s, len);
            s = b->p;
            len++;
        }
        if (pt->re)
            return split_regex(w, i, w->re[i], pt->scan, s, len, at_origin, out);
        return emit(w, i, s, len, at_origin, out);
    case TOK_PRE_DIGITS:
        return split_digits(w, i, pt->individual, s, len, at_origin, out);
    case TOK_PRE_METASPACE:
        return metaspace(w, i, pt, s, len, at_origin, out);
    }
    return -EINVAL;
}

/* ---- normalizers ---- */

static int normalize(fso_tok_worker *w, const char *s, size_t len, const char **ns, size_t *nlen)
{
    const fso_tokenizer *t = w->t;
    tok_buf *cur = NULL, *other = &w->norm;
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm *nm = &t->norm[k];
        if (len == 0)
            break;
        tok_buf *dst = other;
        switch (nm->kind) {
        case TOK_NORM_NFC: {
            bool ascii = true;
            for (size_t p = 0; p < len && ascii; p++)
                ascii = (unsigned char)s[p] < 0x80;
            if (ascii)
                continue;
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t rl = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len,
                                               &r, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (rl < 0) {
                free(r);
                return rl == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
            }
            if (tok_buf_reserve(dst, (size_t)rl + 1)) {
                free(r);
                return -ENOMEM;
            }
            memcpy(dst->p, r, (size_t)rl);
            free(r);
            dst->n = (size_t)rl;
            break;
        }
        case TOK_NORM_PREPEND:
            if (tok_buf_reserve(dst, len + nm->alen + 1))
                return -ENOMEM;
            memcpy(dst->p, nm->a, nm->alen);
            memcpy(dst->p + nm->alen, s, len);
            dst->n = len + nm->alen;
            break;
        case TOK_NORM_REPLACE: {
            size_t hits = 0;
            for (size_t p = 0; p + nm->alen <= len;)
                if (!memcmp(s + p, nm->a, nm->alen)) {
                    hits++;
                    p += nm->alen;
                } else {
                    p++;
                }
            if (tok_buf_reserve(dst, len + hits * nm->blen + 1))
                return -ENOMEM;
            size_t n = 0;
            for (size_t p = 0; p < len;)
                if (p + nm->alen <= len && !memcmp(s + p, nm->a, nm->alen)) {
                    memcpy(dst->p + n, nm->b, nm->blen);
                    n += nm->blen;
                    p += nm->alen;
                } else {
                    dst->p[n++] = s[p++];
                }
            dst->n = n;
            break;
        }
        }
        s = dst->p;
        len = dst->n;
        other = dst == &w->norm ? &w->norm2 : &w->norm;
        cur = dst;
    }
    (void)cur;
    *ns = s;
    *nlen = len;
    return 0;
}

static int encode_segment(fso_tok_worker *w, const char *s, size_t len, size_t at, fso_ids *out)
{
    if (len == 0)
        return 0;
    const char *ns;
    size_t nlen;
    int rc = normalize(w, s, len, &ns, &nlen);
    if (rc)
        return rc;
    if (nlen == 0)
        return 0;
    return pre_stage(w, 0, ns, nlen, at == 0, out);
}

/* The longest added token of a pass starting at s[p], or NULL. */
static const tok_added *added_at(const fso_tokenizer *t, int pass, const char *s, size_t len,
                                 size_t p)
{
    unsigned char c = (unsigned char)s[p];
    if (!(t->matched_first[pass][c >> 3] & (1u << (c & 7))))
        return NULL;
    const tok_added *best = NULL;
    for (int k = 0; k < t->n_matched[pass]; k++) {
        const tok_added *a = &t->matched[pass][k];
        if (a->len <= len - p && (!best || a->len > best->len) && !memcmp(s + p, a->content, a->len))
            best = a;
    }
    return best;
}

/* Splits text (at offset `at` of the whole) on the added tokens of a pass,
 * leftmost and longest first: non-special ones become their ids, special
 * ones stay text; then the next pass, or the normalizer and the rest. */
static int split_added(fso_tok_worker *w, int pass, const char *text, size_t len, size_t at,
                       fso_ids *out)
{
    const fso_tokenizer *t = w->t;
    if (pass == 2)
        return encode_segment(w, text, len, at, out);
    if (!t->n_matched[pass])
        return split_added(w, pass + 1, text, len, at, out);
    size_t seg = 0;
    int rc;
    for (size_t p = 0; p < len;) {
        const tok_added *a = added_at(t, pass, text, len, p);
        if (!a) {
            p++;
            continue;
        }
        if (a->special) {
            p += a->len;
            continue;
        }
        if ((rc = split_added(w, pass + 1, text + seg, p - seg, at + seg, out)))
            return rc;
        if ((rc = fso_ids_push(out, a->id)))
            return rc;
        p += a->len;
        seg = p;
    }
    return split_added(w, pass + 1, text + seg, len - seg, at + seg, out);
}

int fso_tokenizer_encode(fso_tok_worker *w, const char *text, size_t len, fso_ids *out,
                         char *err, size_t errlen)
{
    const unsigned char *u = (const unsigned char *)text;
    for (size_t p = 0; p < len;) {
        if (u[p] < 0x80) {
            p++;
            continue;
        }
        int cl = tok_utf8_len(u + p, len - p);
        if (cl == 0) {
            if (err)
                snprintf(err, errlen,
                         "the text is not valid UTF-8 at byte offset %zu (byte 0x%02X); "
                         "convert it to UTF-8 first (e.g. iconv -f LATIN1 -t UTF-8)", p, u[p]);
            return -EILSEQ;
        }
        p += (size_t)cl;
    }
    const fso_tokenizer *t = w->t;
    int rc = split_added(w, 0, text, len, 0, out);
    if (rc == 0)
        return 0;
    if (err)
        snprintf(err, errlen, "%s: encoding failed: %s", t->path,
                 rc == -ENOMEM ? "out of memory" : "the regex engine failed");
    return rc;
}
