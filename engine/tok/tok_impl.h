/* tok_impl.h — the private shapes behind tokenizer.h, shared by the files of
 * engine/tok/: the loaded tokenizer (read-only once loaded, so any number of
 * workers may encode with it at once), the per-thread worker, the two hash
 * maps (token string -> id, id pair -> merge) and the stages of the pipeline
 * as tokenizer.json names them.
 *
 * Byte-level models (a ByteLevel pre-tokenizer) keep their vocabulary keyed
 * by the raw bytes a token stands for, not by the byte-to-character mapped
 * string tokenizer.json writes: a piece of text is then looked up as it is,
 * and decoding is a copy. tok_bytes_of_mapped() converts a written token.
 */
#ifndef FSO_TOK_IMPL_H
#define FSO_TOK_IMPL_H

#include "tok/tokenizer.h"

#include <oniguruma.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- string -> id map: open addressing, keys in one arena ----
 * A slot holds the key's 32-bit hash and its entry's index, so a probe
 * touches an entry only when the hashes agree; an entry holds the key's
 * first 8 bytes, so a key of up to 8 bytes (most tokens) is compared
 * without reading the arena. */
typedef struct tok_strent {
    uint64_t head;    /* the key's first 8 bytes, zero-padded */
    uint64_t off;     /* the key in the arena */
    uint32_t len;
    int32_t val;
} tok_strent;

typedef struct tok_strmap {
    uint64_t *slot;   /* hash << 32 | (entry index + 1); 0 = empty */
    uint32_t mask;    /* slots - 1 (a power of two, at least 2x entries) */
    uint32_t n, cap;  /* entries, capacity of ent */
    tok_strent *ent;
    char *arena;
    size_t arena_len, arena_cap;
} tok_strmap;

int tok_strmap_init(tok_strmap *m, uint32_t expect);
void tok_strmap_free(tok_strmap *m);
/* 0 added, 1 when the key was already there (its value is left), -ENOMEM. */
int tok_strmap_put(tok_strmap *m, const char *k, size_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t len); /* -1 if absent */
uint32_t tok_hash(const char *k, size_t len);

/* ---- (left id, right id) -> (rank, merged id) ---- */
typedef struct tok_pairmap {
    uint64_t *key;    /* (a << 32 | b) + 1, 0 = empty */
    int32_t *rank, *merged;
    uint32_t mask, n;
} tok_pairmap;

int tok_pairmap_init(tok_pairmap *m, uint32_t expect);
void tok_pairmap_free(tok_pairmap *m);
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* The rank of a b (and *merged), or INT32_MAX when they do not merge. */
static inline int32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *merged)
{
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k) {
            *merged = m->merged[i];
            return m->rank[i];
        }
        if (m->key[i] == 0)
            return INT32_MAX;
    }
}

/* ---- the pipeline ---- */
typedef enum tok_norm_kind { TOK_NORM_NFC, TOK_NORM_PREPEND, TOK_NORM_REPLACE } tok_norm_kind;
typedef struct tok_norm {
    tok_norm_kind kind;
    char *a, *b;      /* PREPEND: a = text; REPLACE: a = pattern string, b = content */
    size_t alen, blen;
} tok_norm;

typedef enum tok_pre_kind {
    TOK_PRE_SPLIT,      /* Split(Regex, Isolated, invert false) */
    TOK_PRE_BYTELEVEL,  /* ByteLevel: optional regex split; bytes are already the model's keys */
    TOK_PRE_DIGITS,     /* Digits(individual_digits) */
    TOK_PRE_METASPACE,  /* Metaspace(replacement, prepend_scheme, split) */
} tok_pre_kind;
/* The split patterns tok_scan.c matches by hand on ASCII text. */
typedef enum tok_scan_kind { TOK_SCAN_NONE, TOK_SCAN_GPT2, TOK_SCAN_LLAMA3, TOK_SCAN_QWEN2 } tok_scan_kind;
tok_scan_kind tok_scan_kind_of(const char *pat, size_t len);
/* The end of Oniguruma's match at pos, or 0 when it depends on non-ASCII. */
size_t tok_scan_match(tok_scan_kind kind, const char *s, size_t len, size_t pos);

typedef enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend;
typedef struct tok_pre {
    tok_pre_kind kind;
    OnigRegex re;             /* SPLIT, BYTELEVEL with use_regex: compiled at load to check it */
    char *pattern;            /* its source, which each worker compiles for itself */
    size_t pattern_len;
    tok_scan_kind scan;       /* re is one tok_scan.c knows */
    bool add_prefix_space;    /* BYTELEVEL */
    bool individual;          /* DIGITS */
    char repl[8];             /* METASPACE replacement, UTF-8 */
    size_t repl_len;
    tok_prepend prepend;      /* METASPACE */
    bool split;               /* METASPACE */
} tok_pre;

typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP,
    TOK_DEC_METASPACE,
} tok_dec_kind;
typedef struct tok_dec {
    tok_dec_kind kind;
    char *a, *b;              /* REPLACE pattern and content; STRIP content; METASPACE replacement */
    size_t alen, blen;
    int start, stop;          /* STRIP */
    tok_prepend prepend;      /* METASPACE */
} tok_dec;

/* An added token as encode() matches it in text: the library splits text on
 * non-special added tokens even with split_special_tokens=True; a special
 * one it finds is left as text (so it still hides what overlaps it). */
typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special;
} tok_added;

#define TOK_MAX_NORM 8
#define TOK_MAX_PRE 8
#define TOK_MAX_DEC 8

struct fso_tokenizer {
    char path[512];           /* tokenizer.json, for messages */
    bool byte_level;          /* vocab keyed by raw bytes (ByteLevel pre-tokenizer) */
    bool ignore_merges, byte_fallback, fuse_unk;
    bool spm_split;           /* words may be cut before each "▁" after another character (tok_bpe.c) */
    int32_t unk_id;           /* -1 when none */
    int32_t byte_id[256];     /* byte-level: the id of each single byte; SPM: <0xNN> or -1 */
    tok_strmap vocab;         /* model vocabulary */
    tok_strmap added_map;     /* added tokens' contents */
    tok_pairmap merges;
    char **id_str;            /* id -> token as written in tokenizer.json (decode) */
    size_t *id_len;
    bool *id_added;
    int32_t n_ids;
    /* Added tokens matched in text, in the library's two passes: [0] those
     * with normalized=false on the raw text, then [1] normalized=true ones on
     * what is left (only when no normalizer runs). A pass without a
     * non-special token is skipped: it cannot split anything. */
    tok_added *matched[2];
    int n_matched[2];
    uint8_t matched_first[2][32]; /* bitmaps of their first bytes */
    tok_norm norm[TOK_MAX_NORM];
    int n_norm;
    tok_pre pre[TOK_MAX_PRE];
    int n_pre;
    tok_dec dec[TOK_MAX_DEC];
    int n_dec;
    bool has_decoder;
    int32_t bos, eos;
    int adds_bos;
};

/* A growable byte buffer. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t cap);

/* One BPE symbol during merging. */
typedef struct tok_sym {
    int32_t id;
    int32_t prev, next;       /* -1 at the ends */
    int32_t len;              /* 0 once merged into its left neighbour */
} tok_sym;
typedef struct tok_heap_ent {
    int32_t rank, pos, merged;
} tok_heap_ent;

#define TOK_CACHE_SLOTS 4096
#define TOK_CACHE_KEY 23
#define TOK_CACHE_IDS 7
typedef struct tok_cache_ent {
    uint8_t len, nids;        /* len 0 = empty */
    char key[TOK_CACHE_KEY];
    int32_t ids[TOK_CACHE_IDS];
} tok_cache_ent;

struct fso_tok_worker {
    const fso_tokenizer *t;
    OnigRegex re[TOK_MAX_PRE];    /* the worker's own copy of each stage's regex */
    OnigRegion *region[TOK_MAX_PRE];
    tok_buf stage[TOK_MAX_PRE];   /* pre-tokenizer stage i's rewritten piece */
    tok_buf norm, norm2;          /* normalized segment */
    tok_sym *sym;
    size_t sym_cap;
    tok_heap_ent *heap;
    size_t heap_cap;
    int32_t *rank;                /* small-word path: rank of pair (i, next) */
    size_t rank_cap;
    tok_cache_ent *cache;         /* exact piece -> ids cache (models without ignore_merges) */
    int32_t seg_start;            /* the segment's offset in the text (Metaspace "first") */
};

/* BPE on one pre-tokenized word (raw bytes for byte-level models, the
 * normalized UTF-8 otherwise); appends its ids. 0 or -ENOMEM. */
int tok_bpe_word(fso_tok_worker *w, const char *s, size_t len, fso_ids *out);

/* tok_regex_new (tok_steps.c) compiles a pattern as the library does
 * (UTF-8, no options, Oniguruma's default syntax); tok_load_json
 * (tok_load.c) reads a folder. */
int tok_regex_new(OnigRegex *re, const char *pat, size_t len, OnigErrorInfo *einfo);
int tok_load_json(fso_tokenizer *t, const char *dir, char *err, size_t errlen);

/* The byte-level mapping: byte -> code point, and the inverse of a mapped
 * string into raw bytes (false when a character is not in the mapping). */
uint32_t tok_byte_to_cp(uint8_t b);
bool tok_bytes_of_mapped(const char *s, size_t len, char *out, size_t *outlen);

/* UTF-8: the length of the valid character at s (1..4), or 0 when invalid. */
int tok_utf8_len(const unsigned char *s, size_t avail);

#endif
