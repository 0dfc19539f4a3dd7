/* tok_bpe.c — the BPE model on one pre-tokenized word, as the library's
 * BPE::tokenize runs it (dropout none):
 *
 *   1. ignore_merges: a word that is a whole vocabulary entry is that entry.
 *   2. The word becomes symbols: one per byte for byte-level models; one per
 *      UTF-8 character otherwise, a character missing from the vocabulary
 *      becoming its bytes' <0xNN> tokens (byte_fallback, when all exist) or
 *      the unknown token (consecutive ones fused into one with fuse_unk), or
 *      nothing when the model has no unknown token.
 *   3. Merges: repeatedly the adjacent pair of lowest rank, ties to the
 *      leftmost, is replaced by its merged token. Short words scan for it
 *      (a rank per pair, recomputed around each merge); long words use a
 *      min-heap on (rank, position) whose stale entries are skipped. Both
 *      pick the same pair at every step.
 *
 * Words of models without ignore_merges go through the worker's exact cache
 * (the result of a word depends on the word alone).
 */
#include "tok_impl.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TOK_SCAN_MAX 48 /* symbols: scanning beats the heap below this */

static int push_id(fso_ids *out, int32_t id)
{
    return fso_ids_push(out, id);
}

/* Step 2: the symbols of a word; returns their count or -ENOMEM. */
static long make_symbols(fso_tok_worker *w, const char *s, size_t len)
{
    const fso_tokenizer *t = w->t;
    if (fso_reserve((void **)&w->sym, &w->sym_cap, len + 1, sizeof *w->sym, 64))
        return -ENOMEM;
    tok_sym *sym = w->sym;
    long n = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++)
            sym[n++] = (tok_sym){t->byte_id[(unsigned char)s[i]], -1, -1, 1};
    } else {
        long unk = -1; /* index of the open (fusable) unknown symbol */
        for (size_t i = 0; i < len;) {
            int cl = tok_utf8_len((const unsigned char *)s + i, len - i);
            if (cl == 0)
                cl = 1; /* normalized text is valid UTF-8; be safe anyway */
            int32_t id = tok_strmap_get(&t->vocab, s + i, (size_t)cl);
            if (id >= 0) {
                sym[n++] = (tok_sym){id, -1, -1, cl};
                unk = -1;
            } else {
                bool done = false;
                if (t->byte_fallback) {
                    done = true;
                    for (int k = 0; k < cl; k++)
                        if (t->byte_id[(unsigned char)s[i + k]] < 0)
                            done = false;
                    if (done) {
                        for (int k = 0; k < cl; k++)
                            sym[n++] = (tok_sym){t->byte_id[(unsigned char)s[i + k]], -1, -1, 1};
                        unk = -1;
                    }
                }
                if (!done && t->unk_id >= 0) {
                    if (t->fuse_unk && unk >= 0) {
                        sym[unk].len += cl;
                    } else {
                        unk = n;
                        sym[n++] = (tok_sym){t->unk_id, -1, -1, cl};
                    }
                }
            }
            i += (size_t)cl;
        }
    }
    for (long i = 0; i < n; i++) {
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    return n;
}

static void merge_scan(fso_tok_worker *w, long n)
{
    const tok_pairmap *mp = &w->t->merges;
    tok_sym *sym = w->sym;
    int32_t *rank = w->rank;
    int32_t *mid = rank + n; /* merged id per pair */
    for (long i = 0; i + 1 < n; i++)
        rank[i] = tok_pairmap_get(mp, sym[i].id, sym[i + 1].id, &mid[i]);
    if (n > 0)
        rank[n - 1] = INT32_MAX;
    for (;;) {
        int32_t best = INT32_MAX, at = -1;
        for (int32_t i = 0; i >= 0; i = sym[i].next)
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        if (at < 0)
            return;
        int32_t r = sym[at].next;
        sym[at].id = mid[at];
        sym[at].len += sym[r].len;
        sym[r].len = 0;
        sym[at].next = sym[r].next;
        if (sym[r].next >= 0)
            sym[sym[r].next].prev = at;
        rank[at] = sym[at].next >= 0
            ? tok_pairmap_get(mp, sym[at].id, sym[sym[at].next].id, &mid[at]) : INT32_MAX;
        int32_t p = sym[at].prev;
        if (p >= 0)
            rank[p] = tok_pairmap_get(mp, sym[p].id, sym[at].id, &mid[p]);
    }
}

static inline bool heap_less(tok_heap_ent a, tok_heap_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(tok_heap_ent *h, size_t *n, tok_heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static tok_heap_ent heap_pop(tok_heap_ent *h, size_t *n)
{
    tok_heap_ent top = h[0], e = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], e))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
    return top;
}

/* Every merge pushes at most two entries, so 3n bounds the heap. */
static void merge_heap(fso_tok_worker *w, long n)
{
    const tok_pairmap *mp = &w->t->merges;
    tok_sym *sym = w->sym;
    tok_heap_ent *h = w->heap;
    size_t hn = 0;
    int32_t m;
    for (long i = 0; i + 1 < n; i++) {
        int32_t r = tok_pairmap_get(mp, sym[i].id, sym[i + 1].id, &m);
        if (r != INT32_MAX)
            heap_push(h, &hn, (tok_heap_ent){r, (int32_t)i, m});
    }
    while (hn) {
        tok_heap_ent top = heap_pop(h, &hn);
        tok_sym *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        int32_t r = cur->next;
        if (tok_pairmap_get(mp, cur->id, sym[r].id, &m) == INT32_MAX || m != top.merged)
            continue;
        cur->id = top.merged;
        cur->len += sym[r].len;
        sym[r].len = 0;
        cur->next = sym[r].next;
        if (cur->next >= 0)
            sym[cur->next].prev = top.pos;
        if (cur->prev >= 0) {
            int32_t rk = tok_pairmap_get(mp, sym[cur->prev].id, cur->id, &m);
            if (rk != INT32_MAX)
                heap_push(h, &hn, (tok_heap_ent){rk, cur->prev, m});
        }
        if (cur->next >= 0) {
            int32_t rk = tok_pairmap_get(mp, cur->id, sym[cur->next].id, &m);
            if (rk != INT32_MAX)
                heap_push(h, &hn, (tok_heap_ent){rk, top.pos, m});
        }
    }
}

static int bpe_piece(fso_tok_worker *w, const char *s, size_t len, fso_ids *out)
{
    const fso_tokenizer *t = w->t;
    if (len == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, s, len);
        if (id >= 0)
            return push_id(out, id);
    }
    tok_cache_ent *ce = NULL;
    if (w->cache && len <= TOK_CACHE_KEY) {
        ce = &w->cache[tok_hash(s, len) & (TOK_CACHE_SLOTS - 1)];
        if (ce->len == len && !memcmp(ce->key, s, len)) {
            for (int i = 0; i < ce->nids; i++)
                if (push_id(out, ce->ids[i]))
                    return -ENOMEM;
            return 0;
        }
    }
    long n = make_symbols(w, s, len);
    if (n < 0)
        return (int)n;
    if (n <= TOK_SCAN_MAX) {
        if (fso_reserve((void **)&w->rank, &w->rank_cap, 2 * (size_t)n + 2, sizeof *w->rank, 64))
            return -ENOMEM;
        merge_scan(w, n);
    } else {
        if (fso_reserve((void **)&w->heap, &w->heap_cap, 3 * (size_t)n + 2, sizeof *w->heap, 64))
            return -ENOMEM;
        merge_heap(w, n);
    }
    size_t first = out->n;
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->sym[i].next)
        if (push_id(out, w->sym[i].id))
            return -ENOMEM;
    if (ce) {
        size_t k = out->n - first;
        if (k <= TOK_CACHE_IDS) {
            ce->len = (uint8_t)len;
            memcpy(ce->key, s, len);
            ce->nids = (uint8_t)k;
            memcpy(ce->ids, out->v + first, k * sizeof *out->v);
        }
    }
    return 0;
}

/* A SentencePiece-style word (no pre-tokenizer: a whole text segment) is cut
 * before each "▁" that follows another character when the vocabulary has no
 * token with "▁" after another character (fso_tokenizer.spm_split, checked at
 * load). No merge can then join the two sides of such a cut, and merges on
 * one side never change the pairs of the other, so each part's BPE is the
 * whole word's: the same ids, in linear rather than quadratic time, and each
 * part short enough for the cache. Byte fallback and unknown characters are
 * per character; a "▁" is in the vocabulary, so no unknown run crosses a cut. */
int tok_bpe_word(fso_tok_worker *w, const char *s, size_t len, fso_ids *out)
{
    const fso_tokenizer *t = w->t;
    if (!t->spm_split || len <= 3 ||
        (t->ignore_merges && tok_strmap_get(&t->vocab, s, len) >= 0))
        return bpe_piece(w, s, len, out);
    size_t start = 0;
    bool other = false;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && (unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x96 &&
            (unsigned char)s[i + 2] == 0x81) {
            if (other) {
                int rc = bpe_piece(w, s + start, i - start, out);
                if (rc)
                    return rc;
                start = i;
                other = false;
            }
            i += 3;
        } else {
            other = true;
            i++;
        }
    }
    return bpe_piece(w, s + start, len - start, out);
}
