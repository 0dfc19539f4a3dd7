/* tok_map.c — the tokenizer's small data structures (tok_impl.h): the
 * string -> id map (open addressing, sized to at least twice its entries,
 * keys copied into one arena, hashes in the slots), the (id, id) -> merge map, growable buffers,
 * UTF-8 character lengths and the byte-level byte <-> character mapping.
 * None of them allocates after loading except the buffers, which grow
 * geometrically and are reused.
 */
#include "tok_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t tok_hash(const char *k, size_t len)
{
    uint64_t h = 0x243F6A8885A308D3ull ^ len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, k + i, 8);
        h = (h ^ v) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    uint64_t v = 0;
    for (size_t j = 0; i < len; i++, j += 8)
        v |= (uint64_t)(unsigned char)k[i] << j;
    h = (h ^ v) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    return (uint32_t)h;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t s = 16;
    while (s < n)
        s <<= 1;
    return s;
}

static inline uint64_t key_head(const char *k, size_t len)
{
    uint64_t h = 0;
    memcpy(&h, k, len < 8 ? len : 8);
    return h;
}

int tok_strmap_init(tok_strmap *m, uint32_t expect)
{
    memset(m, 0, sizeof *m);
    m->mask = pow2_at_least((uint64_t)expect * 2 + 16) - 1;
    m->slot = calloc((size_t)m->mask + 1, sizeof *m->slot);
    m->cap = expect + 16;
    m->ent = malloc(m->cap * sizeof *m->ent);
    m->arena_cap = (size_t)expect * 8 + 64;
    m->arena = malloc(m->arena_cap);
    if (!m->slot || !m->ent || !m->arena) {
        tok_strmap_free(m);
        return -ENOMEM;
    }
    return 0;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slot);
    free(m->ent);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static int strmap_grow_slots(tok_strmap *m)
{
    uint32_t nmask = (m->mask + 1) * 2 - 1;
    uint64_t *ns = calloc((size_t)nmask + 1, sizeof *ns);
    if (!ns)
        return -ENOMEM;
    for (uint32_t i = 0; i <= m->mask; i++) {
        if (!m->slot[i])
            continue;
        uint32_t j = (uint32_t)(m->slot[i] >> 32) & nmask;
        while (ns[j])
            j = (j + 1) & nmask;
        ns[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = ns;
    m->mask = nmask;
    return 0;
}

static inline bool ent_is(const tok_strmap *m, const tok_strent *e, const char *k, size_t len,
                          uint64_t head)
{
    return e->len == len && e->head == head &&
           (len <= 8 || !memcmp(m->arena + e->off + 8, k + 8, len - 8));
}

int tok_strmap_put(tok_strmap *m, const char *k, size_t len, int32_t val)
{
    uint32_t h = tok_hash(k, len);
    uint64_t head = key_head(k, len);
    for (uint32_t i = h & m->mask; m->slot[i]; i = (i + 1) & m->mask)
        if ((uint32_t)(m->slot[i] >> 32) == h &&
            ent_is(m, &m->ent[(uint32_t)m->slot[i] - 1], k, len, head))
            return 1;
    if ((uint64_t)(m->n + 1) * 2 > m->mask + 1 && strmap_grow_slots(m))
        return -ENOMEM;
    if (m->n == m->cap) {
        tok_strent *e = realloc(m->ent, (size_t)m->cap * 2 * sizeof *e);
        if (!e)
            return -ENOMEM;
        m->ent = e;
        m->cap *= 2;
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t nc = m->arena_cap * 2 + len + 1;
        char *a = realloc(m->arena, nc);
        if (!a)
            return -ENOMEM;
        m->arena = a;
        m->arena_cap = nc;
    }
    memcpy(m->arena + m->arena_len, k, len);
    m->arena[m->arena_len + len] = '\0';
    uint32_t e = m->n++;
    m->ent[e] = (tok_strent){head, m->arena_len, (uint32_t)len, val};
    m->arena_len += len + 1;
    uint32_t i = h & m->mask;
    while (m->slot[i])
        i = (i + 1) & m->mask;
    m->slot[i] = (uint64_t)h << 32 | (e + 1);
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t len)
{
    if (!m->slot)
        return -1;
    uint32_t h = tok_hash(k, len);
    uint64_t head = key_head(k, len);
    for (uint32_t i = h & m->mask; m->slot[i]; i = (i + 1) & m->mask)
        if ((uint32_t)(m->slot[i] >> 32) == h) {
            const tok_strent *e = &m->ent[(uint32_t)m->slot[i] - 1];
            if (ent_is(m, e, k, len, head))
                return e->val;
        }
    return -1;
}

int tok_pairmap_init(tok_pairmap *m, uint32_t expect)
{
    memset(m, 0, sizeof *m);
    m->mask = pow2_at_least((uint64_t)expect * 2 + 16) - 1;
    m->key = calloc((size_t)m->mask + 1, sizeof *m->key);
    m->rank = malloc(((size_t)m->mask + 1) * sizeof *m->rank);
    m->merged = malloc(((size_t)m->mask + 1) * sizeof *m->merged);
    if (!m->key || !m->rank || !m->merged) {
        tok_pairmap_free(m);
        return -ENOMEM;
    }
    return 0;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->key);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

/* A pair put twice keeps the later rank, as the library's map does. The
 * table is sized at init for all merges. */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    if ((uint64_t)(m->n + 1) * 2 > (uint64_t)m->mask + 1)
        return -ENOMEM;
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    uint32_t i = (uint32_t)(h >> 32) & m->mask;
    for (; m->key[i]; i = (i + 1) & m->mask)
        if (m->key[i] == k) {
            m->rank[i] = rank;
            m->merged[i] = merged;
            return 1;
        }
    m->key[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
    m->n++;
    return 0;
}

int tok_buf_reserve(tok_buf *b, size_t cap)
{
    if (cap <= b->cap)
        return 0;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < cap)
        nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->cap = nc;
    return 0;
}

int tok_utf8_len(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0) {
        if (avail < 2 || (s[1] & 0xC0) != 0x80)
            return 0;
        return 2;
    }
    if (c < 0xF0) {
        if (avail < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && s[1] < 0xA0)
            return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0)
            return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (avail < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90)
            return 0;
        if (c == 0xF4 && s[1] >= 0x90)
            return 0;
        return 4;
    }
    return 0;
}

/* Printable bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) stand for themselves;
 * the other 68, in increasing order, for U+0100 onwards. */
uint32_t tok_byte_to_cp(uint8_t b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7Fu);
    if (b == 0xAD)
        return 0x100 + 67;
    return b;
}

static int cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68)
        return -1;
    uint32_t n = cp - 0x100;
    if (n <= 0x20)
        return (int)n;
    if (n < 67)
        return (int)(0x7F + n - 33);
    return 0xAD;
}

bool tok_bytes_of_mapped(const char *s, size_t len, char *out, size_t *outlen)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        int l = tok_utf8_len(u + i, len - i);
        if (l == 0 || l > 2)
            return false;
        uint32_t cp = l == 1 ? u[i] : ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
        int b = cp_to_byte(cp);
        if (b < 0)
            return false;
        out[o++] = (char)b;
        i += (size_t)l;
    }
    *outlen = o;
    return true;
}
