/* fuzz_tokenize.c — text as `fsoff tokenize` hands it to the tokenizer
 * (engine/tok/tokenizer.h).
 *
 * Input: the text's bytes. Small tokenizers written once (byte-level with the
 * Llama 3, GPT-2 and Qwen2 split patterns; SentencePiece-style with byte
 * fallback) encode it. Checks: encode gives 0, or -EILSEQ with a message,
 * exactly when the text is not valid UTF-8; every id is below the vocabulary
 * size; each split pattern that the hand scanner (tok_scan.c) runs gives the
 * ids of the same pattern run by Oniguruma alone (wrapped in (?:...)); and
 * decode gives the text back (byte-level without a normalizer; the
 * SentencePiece form when the text has no U+2581).
 */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tok/tok_impl.h"

static const char P_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char P_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char P_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void put_cp(char *o, size_t *n, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*n)++] = (char)(0xC0 | (cp >> 6));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*n)++] = (char)(0xE0 | (cp >> 12));
        o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A byte-level BPE: every byte, and a few merges of English. */
static json_t *byte_level_model(bool ignore_merges)
{
    json_t *vocab = json_object(), *merges = json_array();
    char k[8];
    for (int b = 0; b < 256; b++) {
        size_t n = 0;
        put_cp(k, &n, tok_byte_to_cp((uint8_t)b));
        k[n] = '\0';
        json_object_set_new(vocab, k, json_integer(b));
    }
    static const char *const m[][2] = {{"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"},
                                       {"in", "g"}, {"\xC4\xA0", "\xC4\xA0"}, {"e", "r"},
                                       {"\xC4\x8A", "\xC4\x8A"}, {"1", "2"}, {"'", "s"}};
    int id = 256;
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
        char cat[32];
        snprintf(cat, sizeof cat, "%s%s", m[i][0], m[i][1]);
        if (!json_object_get(vocab, cat))
            json_object_set_new(vocab, cat, json_integer(id++));
        json_array_append_new(merges, json_pack("[s,s]", m[i][0], m[i][1]));
    }
    return json_pack("{s:s, s:o, s:o, s:b}", "type", "BPE", "vocab", vocab, "merges", merges,
                     "ignore_merges", ignore_merges);
}

/* Each tokenizer is written as fuzz_dir()/tokenizer.json in turn and loaded
 * from there (a loaded tokenizer keeps nothing of its file). */
static fso_tokenizer *write_and_load(json_t *root)
{
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    FUZZ_CHECK(text != NULL);
    fuzz_file("tokenizer.json", (const uint8_t *)text, strlen(text));
    free(text);
    char err[512];
    fso_tokenizer *t = NULL;
    if (fso_tokenizer_load(&t, fuzz_dir(), err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        FUZZ_CHECK(!"a fuzz tokenizer loads");
    }
    return t;
}

static fso_tokenizer *split_tokenizer(const char *pattern, bool wrap, bool nfc,
                                      bool ignore_merges)
{
    char pat[512];
    snprintf(pat, sizeof pat, wrap ? "(?:%s)" : "%s", pattern);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}", "type", "Sequence",
                            "pretokenizers", "type", "Split", "pattern", "Regex", pat, "behavior",
                            "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                            "use_regex", 0);
    json_t *root = json_pack("{s:o, s:o, s:{s:s}}", "pre_tokenizer", pre, "model",
                             byte_level_model(ignore_merges), "decoder", "type", "ByteLevel");
    if (nfc)
        json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    return write_and_load(root);
}

static fso_tokenizer *spm_tokenizer(void)
{
    json_t *vocab = json_pack("{s:i, s:i, s:i}", "<unk>", 0, "<s>", 1, "</s>", 2);
    char k[16];
    for (int b = 0; b < 256; b++) {
        snprintf(k, sizeof k, "<0x%02X>", b);
        json_object_set_new(vocab, k, json_integer(3 + b));
    }
    static const char *const pieces[] = {"\xE2\x96\x81", "t", "h", "e", "\xE2\x96\x81t", "he",
                                         "\xE2\x96\x81the", "a", "\xE2\x96\x81\xE2\x96\x81"};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        json_object_set_new(vocab, pieces[i], json_integer(259 + (int)i));
    json_t *merges = json_pack("[[s,s],[s,s],[s,s],[s,s]]", "\xE2\x96\x81", "t", "h", "e",
                               "\xE2\x96\x81t", "he", "\xE2\x96\x81", "\xE2\x96\x81");
    json_t *root = json_pack(
        "{s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:{s:s, s:o, s:o, s:s, s:b, s:b},"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}}",
        "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend", "\xE2\x96\x81",
        "type", "Replace", "pattern", "String", " ", "content", "\xE2\x96\x81",
        "model", "type", "BPE", "vocab", vocab, "merges", merges, "unk_token", "<unk>",
        "byte_fallback", 1, "fuse_unk", 1,
        "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
        "content", " ", "start", 1, "stop", 0);
    FUZZ_CHECK(root != NULL);
    return write_and_load(root);
}

static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_len(s + i, n - i);
        if (!l)
            return false;
        i += (size_t)l;
    }
    return true;
}

/* Encodes with w (kept across inputs, as a tokenize worker is); returns rc,
 * ids in *out (checked below the vocabulary). */
static int encode(fso_tok_worker *w, const fso_tokenizer *t, const uint8_t *data, size_t size,
                  fso_ids *out)
{
    char err[512] = "";
    int rc = fso_tokenizer_encode(w, (const char *)data, size, out, err, sizeof err);
    FUZZ_CHECK(rc == 0 || (rc == -EILSEQ && strstr(err, "byte offset")));
    for (size_t i = 0; i < out->n; i++)
        FUZZ_CHECK(out->v[i] >= 0 && out->v[i] < fso_tokenizer_vocab_size(t));
    return rc;
}

static void check_decode(fso_tokenizer *t, const fso_ids *ids, const uint8_t *data, size_t size)
{
    char *dec = NULL;
    size_t dl = 0;
    FUZZ_CHECK(fso_tokenizer_decode(t, ids->v, ids->n, &dec, &dl) == 0);
    FUZZ_CHECK(dl == size && !memcmp(dec, data, size));
    free(dec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fso_tokenizer *fast[3], *slow[3], *spm;
    static fso_tok_worker *wfast[3], *wslow[3], *wspm;
    static const char *const pats[3] = {P_LLAMA3, P_GPT2, P_QWEN2};
    if (!spm) {
        for (int k = 0; k < 3; k++) {
            fast[k] = split_tokenizer(pats[k], false, k == 2, k == 0);
            slow[k] = split_tokenizer(pats[k], true, k == 2, k == 0);
            FUZZ_CHECK(fast[k]->pre[0].scan != TOK_SCAN_NONE && slow[k]->pre[0].scan == TOK_SCAN_NONE);
            wfast[k] = fso_tok_worker_new(fast[k]);
            wslow[k] = fso_tok_worker_new(slow[k]);
            FUZZ_CHECK(wfast[k] && wslow[k]);
        }
        spm = spm_tokenizer();
        wspm = fso_tok_worker_new(spm);
        FUZZ_CHECK(wspm != NULL);
    }
    bool valid = valid_utf8(data, size);
    for (int k = 0; k < 3; k++) {
        fso_ids a = {0}, b = {0};
        int ra = encode(wfast[k], fast[k], data, size, &a);
        int rb = encode(wslow[k], slow[k], data, size, &b);
        FUZZ_CHECK(ra == rb && (ra == 0) == valid);
        FUZZ_CHECK(a.n == b.n && (a.n == 0 || !memcmp(a.v, b.v, a.n * sizeof *a.v)));
        if (valid && k != 2) /* NFC need not give the text back */
            check_decode(fast[k], &a, data, size);
        fso_ids_free(&a);
        fso_ids_free(&b);
    }
    fso_ids ids = {0};
    int rc = encode(wspm, spm, data, size, &ids);
    FUZZ_CHECK((rc == 0) == valid);
    if (valid && !memmem(data, size, "\xE2\x96\x81", 3))
        check_decode(spm, &ids, data, size);
    fso_ids_free(&ids);
    return 0;
}
