/* tok_decode.c — fso_tokenizer_decode (tokenizer.h): the library's
 * decode(ids, skip_special_tokens=False).
 *
 * Ids become their tokens as tokenizer.json writes them (added tokens'
 * content included; unknown ids are dropped); the decoder steps then rewrite
 * the list of token strings in order and the result is their concatenation.
 * Without a decoder the tokens are joined with single spaces. Steps:
 * ByteLevel (each token's characters back to bytes, or the token as is when
 * one is outside the mapping; everything fused; invalid UTF-8 becomes
 * U+FFFD per maximal invalid subpart), Replace, ByteFallback (runs of <0xNN>
 * become their bytes, or one U+FFFD per byte token when not valid UTF-8),
 * Fuse, Strip and Metaspace.
 */
#include "tok_impl.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct tstr {
    char *p;
    size_t n;
} tstr;

typedef struct tlist {
    tstr *v;
    size_t n, cap;
} tlist;

static int tl_push(tlist *l, const char *p, size_t n)
{
    if (fso_reserve((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v, 64) < 0)
        return -ENOMEM;
    char *c = malloc(n + 1);
    if (!c)
        return -ENOMEM;
    memcpy(c, p, n);
    c[n] = '\0';
    l->v[l->n++] = (tstr){c, n};
    return 0;
}

static void tl_free(tlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].p);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The length of the maximal prefix of a valid sequence at s (at least 1),
 * for s where no valid character starts. */
static size_t invalid_len(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    if (k < avail && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k < need && k < avail && (s[k] & 0xC0) == 0x80)
            k++;
    }
    return k;
}

/* bytes -> valid UTF-8 with U+FFFD for invalid parts, appended to out. */
static int lossy(const unsigned char *s, size_t n, tlist *out)
{
    char *buf = malloc(n * 3 + 1);
    if (!buf)
        return -ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_len(s + i, n - i);
        if (l) {
            memcpy(buf + o, s + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += invalid_len(s + i, n - i);
        }
    }
    int rc = tl_push(out, buf, o);
    free(buf);
    return rc;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_len(s + i, n - i);
        if (!l)
            return false;
        i += (size_t)l;
    }
    return true;
}

/* The total length of in's tokens. */
static size_t tl_total(const tlist *in)
{
    size_t total = 0;
    for (size_t i = 0; i < in->n; i++)
        total += in->v[i].n;
    return total;
}

/* ByteLevel: each token's characters back to bytes (the token as is when one
 * is outside the mapping), all fused into one lossy-UTF-8 token on out. */
static int dec_bytelevel(tlist *in, tlist *out)
{
    unsigned char *b = malloc(tl_total(in) + 1);
    if (!b)
        return -ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t rl;
        if (!tok_bytes_of_mapped(in->v[i].p, in->v[i].n, (char *)b + o, &rl)) {
            memcpy(b + o, in->v[i].p, in->v[i].n);
            rl = in->v[i].n;
        }
        o += rl;
    }
    int rc = lossy(b, o, out);
    free(b);
    return rc;
}

/* Fuse: all tokens concatenated into one token on out. */
static int dec_fuse(tlist *in, tlist *out)
{
    char *b = malloc(tl_total(in) + 1);
    if (!b)
        return -ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < in->n; i++) {
        memcpy(b + o, in->v[i].p, in->v[i].n);
        o += in->v[i].n;
    }
    int rc = tl_push(out, b, o);
    free(b);
    return rc;
}

/* Replace (pattern d->a -> d->b) or Metaspace (replacement d->a -> ' ',
 * dropped in the first token unless the scheme is "never") on token i of
 * in, pushed to out. */
static int replace_one(const tok_dec *d, const tstr *s, size_t i, tlist *out)
{
    const char *pat = d->a, *rep = d->kind == TOK_DEC_REPLACE ? d->b : " ";
    size_t plen = d->alen, rlen = d->kind == TOK_DEC_REPLACE ? d->blen : 1;
    if (d->kind == TOK_DEC_METASPACE && i == 0 && d->prepend != TOK_PREPEND_NEVER)
        rlen = 0;
    size_t hits = 0;
    for (size_t p = 0; p + plen <= s->n;)
        if (!memcmp(s->p + p, pat, plen)) {
            hits++;
            p += plen;
        } else {
            p++;
        }
    char *b = malloc(s->n + hits * rlen + 1);
    if (!b)
        return -ENOMEM;
    size_t o = 0;
    for (size_t p = 0; p < s->n;)
        if (p + plen <= s->n && !memcmp(s->p + p, pat, plen)) {
            memcpy(b + o, rep, rlen);
            o += rlen;
            p += plen;
        } else {
            b[o++] = s->p[p++];
        }
    int rc = tl_push(out, b, o);
    free(b);
    return rc;
}

/* The byte a <0xNN> token stands for, or -1 when s is not one. */
static int fallback_byte(const tstr *s)
{
    if (!s || s->n != 6 || memcmp(s->p, "<0x", 3) || s->p[5] != '>')
        return -1;
    char hex[3] = {s->p[3], s->p[4], 0}, *end;
    long v = strtol(hex, &end, 16);
    bool hexdig = true;
    for (int k = 0; k < 2; k++) {
        char c = hex[k];
        hexdig &= (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }
    return hexdig && *end == '\0' ? (int)v : -1;
}

/* ByteFallback: runs of <0xNN> tokens become their bytes as one token, or
 * one U+FFFD per byte token when not valid UTF-8; other tokens pass. */
static int dec_bytefallback(tlist *in, tlist *out)
{
    int rc = 0;
    unsigned char *run = malloc(in->n + 1);
    size_t nrun = 0;
    if (!run)
        return -ENOMEM;
    for (size_t i = 0; i <= in->n && !rc; i++) {
        const tstr *s = i < in->n ? &in->v[i] : NULL;
        int byte = fallback_byte(s);
        if (byte >= 0) {
            run[nrun++] = (unsigned char)byte;
            continue;
        }
        if (nrun) {
            if (valid_utf8(run, nrun)) {
                rc = tl_push(out, (const char *)run, nrun);
            } else {
                for (size_t k = 0; k < nrun && !rc; k++)
                    rc = tl_push(out, "\xEF\xBF\xBD", 3);
            }
            nrun = 0;
        }
        if (s && !rc)
            rc = tl_push(out, s->p, s->n);
    }
    free(run);
    return rc;
}

/* Strip: up to d->start leading and d->stop trailing copies of the content
 * character d->a cut from s, pushed to out. */
static int strip_one(const tok_dec *d, const tstr *s, tlist *out)
{
    const unsigned char *u = (const unsigned char *)s->p;
    size_t cut_start = 0, cut_stop = 0, p = 0, start_bytes = 0;
    /* leading: up to `start` copies of the content character */
    while ((int)cut_start < d->start && p + d->alen <= s->n &&
           !memcmp(s->p + p, d->a, d->alen)) {
        cut_start++;
        p += d->alen;
    }
    start_bytes = p;
    size_t q = s->n;
    while ((int)cut_stop < d->stop && q >= start_bytes + d->alen &&
           !memcmp(s->p + q - d->alen, d->a, d->alen)) {
        cut_stop++;
        q -= d->alen;
    }
    /* The library keeps (byte length - cuts) characters after the
     * leading cut, which for multi-byte text can keep the tail. */
    size_t keep = s->n - cut_start - cut_stop, o = start_bytes, k = 0;
    while (o < s->n && k < keep) {
        int l = tok_utf8_len(u + o, s->n - o);
        o += (size_t)(l ? l : 1);
        k++;
    }
    return tl_push(out, s->p + start_bytes, o - start_bytes);
}

/* One decoder step: in's tokens rewritten onto out (empty on entry). */
static int step(const tok_dec *d, tlist *in, tlist *out)
{
    int rc = 0;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
        return dec_bytelevel(in, out);
    case TOK_DEC_FUSE:
        return dec_fuse(in, out);
    case TOK_DEC_REPLACE:
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = replace_one(d, &in->v[i], i, out);
        return rc;
    case TOK_DEC_BYTEFALLBACK:
        return dec_bytefallback(in, out);
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = strip_one(d, &in->v[i], out);
        return rc;
    }
    return -EINVAL;
}

int fso_tokenizer_decode(const fso_tokenizer *t, const int32_t *ids, size_t n, char **out,
                         size_t *len)
{
    tlist a = {0}, b = {0};
    int rc = 0;
    *out = NULL;
    *len = 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids && t->id_str[ids[i]])
            rc = tl_push(&a, t->id_str[ids[i]], t->id_len[ids[i]]);
    for (int k = 0; k < t->n_dec && !rc; k++) {
        rc = step(&t->dec[k], &a, &b);
        tl_free(&a);
        a = b;
        memset(&b, 0, sizeof b);
    }
    size_t total = 0;
    for (size_t i = 0; i < a.n; i++)
        total += a.v[i].n + 1;
    char *s = rc ? NULL : malloc(total + 1);
    if (!rc && !s)
        rc = -ENOMEM;
    if (!rc) {
        size_t o = 0;
        for (size_t i = 0; i < a.n; i++) {
            if (!t->has_decoder && i)
                s[o++] = ' ';
            memcpy(s + o, a.v[i].p, a.v[i].n);
            o += a.v[i].n;
        }
        s[o] = '\0';
        *out = s;
        *len = o;
    }
    tl_free(&a);
    tl_free(&b);
    return rc;
}
