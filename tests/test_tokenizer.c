/* test_tokenizer.c — engine/tok/tokenizer.h against golden vectors made by
 * reference implementations (tests/fixtures/tokenizer/gen_vectors.mjs says
 * which made each family's), plus refusals, invalid UTF-8, unknown-token
 * fusing and concurrent workers.
 *
 * Vector files (tests/fixtures/tokenizer/FAMILY.jsonl): line 1 is a header
 * {"format": "fsoff-tokenizer-vectors", "version": 1, "family", "reference",
 * "cases": N}; then N lines {"text", "ids", "decoded"}. A case passes when
 * encode(text) == ids and decode(ids) == decoded.
 *
 * The committed tokenizers gpt2/, qwen3/ and mistral/ are gzip-compressed;
 * the build decompresses them (FSO_TOK_GPT2_JSON, FSO_TOK_QWEN3_JSON,
 * FSO_TOK_MISTRAL_JSON name the files)
 * and each test links them into its own folder beside tokenizer_config.json.
 *
 * Run with --licensed: the Llama 3 and Llama 2 vectors, against the
 * tokenizer folders that FSO_LLAMA3_TOKENIZER and FSO_LLAMA2_TOKENIZER name
 * (their vocabularies are not redistributable, so none is committed); exit
 * 77 (skip) when neither is set.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tok/tok_impl.h" /* test_pattern_scanner_matches_oniguruma checks which path runs */
#include "tok/tokenizer.h"

#include "test_util.h"

static char srcdir[512];

static const char *fixture(const char *rel, char *buf, size_t len)
{
    snprintf(buf, len, "%s/tests/fixtures/tokenizer/%.200s", srcdir, rel);
    return buf;
}

/* dir/tokenizer.json -> json (a symlink) and dir/tokenizer_config.json -> the
 * fixture folder's, when it has one. */
static void make_dir(const char *dir, const char *json, const char *family)
{
    char p[1024], c[1024];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    assert_int_equal(symlink(json, p), 0);
    snprintf(c, sizeof c, "%s/tokenizer_config.json", family);
    char src[1024];
    fixture(c, src, sizeof src);
    if (access(src, R_OK) == 0) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
        unlink(p);
        assert_int_equal(symlink(src, p), 0);
    }
}

static fso_tokenizer *load_ok(const char *dir)
{
    char err[1024] = "";
    fso_tokenizer *t = NULL;
    int rc = fso_tokenizer_load(&t, dir, err, sizeof err);
    if (rc)
        fail_msg("loading %s: %d: %s", dir, rc, err);
    return t;
}

/* The tokenizer of a family: committed plain (spm_*), or gzip'd and
 * decompressed by the build (env var), or a generated variant. */
static fso_tokenizer *load_family(const tdir *td, const char *family)
{
    char dir[600], buf[1024];
    const char *env = !strcmp(family, "gpt2") ? "FSO_TOK_GPT2_JSON"
                    : !strcmp(family, "qwen3") ? "FSO_TOK_QWEN3_JSON"
                    : !strcmp(family, "mistral") ? "FSO_TOK_MISTRAL_JSON" : NULL;
    if (!env)
        return load_ok(fixture(family, buf, sizeof buf));
    const char *json = getenv(env);
    if (!json)
        fail_msg("%s is not set: run this test through meson test", env);
    snprintf(dir, sizeof dir, "%s/%s", td->path, family);
    make_dir(dir, json, family);
    return load_ok(dir);
}

typedef struct vec_case {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    char *decoded;
    size_t dlen;
} vec_case;

typedef struct vecs {
    vec_case *c;
    size_t n;
} vecs;

static char *dup_json_str(json_t *s, size_t *len)
{
    *len = json_string_length(s);
    char *p = malloc(*len + 1);
    assert_non_null(p);
    memcpy(p, json_string_value(s), *len + 1);
    return p;
}

/* Reads a vector file; the header's case count must match its lines. */
static vecs read_vectors(const char *path, const char *family)
{
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("%s: %s", path, strerror(errno));
    vecs v = {0};
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    json_int_t want = -1;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &je);
        if (!o)
            fail_msg("%s:%zu: %s", path, lineno + 1, je.text);
        if (lineno++ == 0) {
            json_t *fmt = json_object_get(o, "format"), *fam = json_object_get(o, "family");
            assert_string_equal(json_string_value(fmt), "fsoff-tokenizer-vectors");
            assert_int_equal(json_integer_value(json_object_get(o, "version")), 1);
            assert_string_equal(json_string_value(fam), family);
            want = json_integer_value(json_object_get(o, "cases"));
            v.c = calloc((size_t)want + 1, sizeof *v.c);
            assert_non_null(v.c);
            json_decref(o);
            continue;
        }
        assert_true((json_int_t)v.n < want);
        vec_case *c = &v.c[v.n++];
        json_t *ids = json_object_get(o, "ids");
        c->text = dup_json_str(json_object_get(o, "text"), &c->len);
        c->decoded = dup_json_str(json_object_get(o, "decoded"), &c->dlen);
        c->n = json_array_size(ids);
        c->ids = calloc(c->n + 1, sizeof *c->ids);
        for (size_t i = 0; i < c->n; i++)
            c->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        json_decref(o);
    }
    free(line);
    fclose(f);
    if ((json_int_t)v.n != want)
        fail_msg("%s: the header says %lld cases, the file has %zu", path, (long long)want, v.n);
    return v;
}

static void free_vectors(vecs *v)
{
    for (size_t i = 0; i < v->n; i++) {
        free(v->c[i].text);
        free(v->c[i].ids);
        free(v->c[i].decoded);
    }
    free(v->c);
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Every case of FAMILY.jsonl: encode, then decode. Returns the failures. */
static int check_vectors(fso_tokenizer *t, const char *family, const char *vec_path)
{
    vecs v = read_vectors(vec_path, family);
    fso_tok_worker *w = fso_tok_worker_new(t);
    assert_non_null(w);
    int bad = 0;
    char err[512];
    for (size_t i = 0; i < v.n; i++) {
        vec_case *c = &v.c[i];
        fso_ids out = {0};
        int rc = fso_tokenizer_encode(w, c->text, c->len, &out, err, sizeof err);
        bool ok = rc == 0 && out.n == c->n && (c->n == 0 || !memcmp(out.v, c->ids, c->n * sizeof *c->ids));
        if (!ok) {
            if (bad++ < 5) {
                fprintf(stderr, "%s case %zu (%zu bytes): encode %s (rc %d)\n", family, i + 1, c->len,
                        rc ? err : "differs", rc);
                print_ids("got ", out.v, out.n);
                print_ids("want", c->ids, c->n);
            }
        } else {
            char *dec = NULL;
            size_t dl = 0;
            assert_int_equal(fso_tokenizer_decode(t, out.v, out.n, &dec, &dl), 0);
            if (dl != c->dlen || memcmp(dec, c->decoded, dl)) {
                if (bad++ < 5)
                    fprintf(stderr, "%s case %zu: decode gives \"%s\", want \"%s\"\n", family, i + 1,
                            dec, c->decoded);
            }
            free(dec);
        }
        fso_ids_free(&out);
    }
    fprintf(stderr, "%s: %zu cases, %d failed\n", family, v.n, bad);
    fso_tok_worker_free(w);
    free_vectors(&v);
    return bad;
}

static void run_family(void **state, const char *family)
{
    tdir *td = *state;
    char vp[1024], name[128];
    fso_tokenizer *t = load_family(td, family);
    snprintf(name, sizeof name, "%s.jsonl", family);
    assert_int_equal(check_vectors(t, family, fixture(name, vp, sizeof vp)), 0);
    fso_tokenizer_free(t);
}

static void test_gpt2_matches_tiktoken(void **state)
{
    run_family(state, "gpt2");
}

static void test_qwen3_nfc_and_added_tokens_match(void **state)
{
    run_family(state, "qwen3");
}

static void test_mistral_matches_its_sentencepiece_port(void **state)
{
    run_family(state, "mistral");
}

static void test_spm_legacy_byte_fallback_matches(void **state)
{
    run_family(state, "spm_legacy");
}

static void test_spm_metaspace_first_matches(void **state)
{
    run_family(state, "spm_metaspace");
}

/* SmolLM2's pre-tokenizer (Digits, then ByteLevel) on the GPT-2 vocabulary. */
static void test_digits_then_bytelevel_matches(void **state)
{
    tdir *td = *state;
    json_error_t je;
    const char *src = getenv("FSO_TOK_GPT2_JSON");
    assert_non_null(src);
    json_t *root = json_load_file(src, 0, &je);
    assert_non_null(root);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                            "pretokenizers", "type", "Digits", "individual_digits", 1, "type",
                            "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1);
    json_object_set_new(root, "pre_tokenizer", pre);
    char dir[600], json[700], vp[1024];
    snprintf(dir, sizeof dir, "%s/digits", td->path);
    mkdir(dir, 0755);
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(root, json, JSON_COMPACT), 0);
    json_decref(root);
    fso_tokenizer *t = load_ok(dir);
    assert_int_equal(check_vectors(t, "gpt2_digits", fixture("gpt2_digits.jsonl", vp, sizeof vp)), 0);
    fso_tokenizer_free(t);
}

/* BOS/EOS and ids from the files. */
static void test_special_ids_come_from_the_files(void **state)
{
    tdir *td = *state;
    fso_tokenizer *t = load_family(td, "gpt2");
    assert_int_equal(fso_tokenizer_vocab_size(t), 50257);
    assert_int_equal(fso_tokenizer_token_id(t, "<|endoftext|>"), 50256);
    assert_int_equal(fso_tokenizer_token_id(t, "Ġthe"), 262);
    assert_int_equal(fso_tokenizer_token_id(t, "no such token"), -1);
    assert_int_equal(fso_tokenizer_eos(t), 50256);
    assert_int_equal(fso_tokenizer_adds_bos(t), 0);
    fso_tokenizer_free(t);
    t = load_family(td, "qwen3");
    assert_int_equal(fso_tokenizer_token_id(t, "<|im_end|>"), 151645);
    assert_int_equal(fso_tokenizer_eos(t), 151645);
    assert_int_equal(fso_tokenizer_bos(t), -1);
    assert_int_equal(fso_tokenizer_adds_bos(t), 0);
    fso_tokenizer_free(t);
    char buf[1024];
    t = load_ok(fixture("spm_legacy", buf, sizeof buf));
    assert_int_equal(fso_tokenizer_bos(t), 1);
    assert_int_equal(fso_tokenizer_eos(t), 2);
    assert_int_equal(fso_tokenizer_adds_bos(t), 1);
    assert_int_equal(fso_tokenizer_token_id(t, "<0x0A>"), 3 + 0x0A);
    fso_tokenizer_free(t);
}

static int count_of(const fso_ids *ids, int32_t id)
{
    int n = 0;
    for (size_t i = 0; i < ids->n; i++)
        n += ids->v[i] == id;
    return n;
}

/* Without byte tokens, consecutive unknown characters fuse into one <unk>;
 * a known character between them keeps them apart. */
static void test_unknown_characters_fuse_into_one_unk(void **state)
{
    char buf[1024], err[256];
    fso_tokenizer *t = load_ok(fixture("spm_unk", buf, sizeof buf));
    fso_tok_worker *w = fso_tok_worker_new(t);
    int32_t unk = fso_tokenizer_token_id(t, "<unk>"), space = fso_tokenizer_token_id(t, "▁");
    assert_int_equal(unk, 0);
    assert_true(space > 0);
    fso_ids ids = {0};
    const char *two = "☃ꙮ"; /* neither is in the vocabulary */
    assert_int_equal(fso_tokenizer_encode(w, two, strlen(two), &ids, err, sizeof err), 0);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.v[0], space);
    assert_int_equal(ids.v[1], unk);
    ids.n = 0;
    const char *apart = "☃a☃☃";
    assert_true(fso_tokenizer_token_id(t, "a") > 0);
    assert_int_equal(fso_tokenizer_encode(w, apart, strlen(apart), &ids, err, sizeof err), 0);
    assert_int_equal(count_of(&ids, unk), 2);
    assert_int_equal(ids.v[ids.n - 1], unk);
    /* decode writes <unk> as the token it is */
    char *dec;
    size_t dl;
    assert_int_equal(fso_tokenizer_decode(t, ids.v, ids.n, &dec, &dl), 0);
    assert_string_equal(dec, "<unk>a<unk>");
    free(dec);
    fso_ids_free(&ids);
    fso_tok_worker_free(w);
    fso_tokenizer_free(t);
}

static void test_invalid_utf8_names_the_byte_offset(void **state)
{
    char buf[1024], err[256] = "";
    fso_tokenizer *t = load_ok(fixture("spm_legacy", buf, sizeof buf));
    fso_tok_worker *w = fso_tok_worker_new(t);
    fso_ids ids = {0};
    static const char *const bad[] = {"ab\xff" "cd", "abc\xc3", "ab\xe2\x82", "x\xed\xa0\x80", "\xc0\xaf"};
    static const size_t off[] = {2, 3, 2, 1, 0};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(fso_tokenizer_encode(w, bad[i], strlen(bad[i]), &ids, err, sizeof err), -EILSEQ);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu ", off[i]);
        if (!strstr(err, want))
            fail_msg("\"%s\" does not name %s", err, want);
    }
    assert_int_equal(ids.n, 0);
    fso_ids_free(&ids);
    fso_tok_worker_free(w);
    fso_tokenizer_free(t);
}

/* Writes text as dir/tokenizer.json and loads it, expecting rc; returns the message. */
static void expect_refusal(const tdir *td, const char *name, const char *text, int want_rc,
                           const char *const *needles)
{
    char dir[600], file[700], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/%s", td->path, name);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    fso_tokenizer *t = NULL;
    int rc = fso_tokenizer_load(&t, dir, err, sizeof err);
    fprintf(stderr, "%s: %s\n", name, err);
    assert_int_equal(rc, want_rc);
    assert_null(t);
    for (int i = 0; needles[i]; i++)
        if (!strstr(err, needles[i]))
            fail_msg("%s: \"%s\" does not contain \"%s\"", name, err, needles[i]);
}

#define BPE_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_unsupported_parts_are_refused_by_path(void **state)
{
    tdir *td = *state;
    expect_refusal(td, "nfkc", "{\"normalizer\": {\"type\": \"NFKC\"},\n" BPE_MODEL "}", -ENOTSUP,
                   (const char *const[]){"tokenizer.json:1:", "normalizer.type", "\"NFKC\"", NULL});
    expect_refusal(td, "wordpiece",
                   "{\n  \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}\n}", -ENOTSUP,
                   (const char *const[]){"tokenizer.json:2:", "model.type", "WordPiece", NULL});
    expect_refusal(td, "seq",
                   "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
                   "{\"type\": \"Lowercase\"}]},\n" BPE_MODEL "}", -ENOTSUP,
                   (const char *const[]){"normalizer.normalizers[1].type", "Lowercase", NULL});
    expect_refusal(td, "whitespace",
                   "{\"pre_tokenizer\": {\"type\": \"Whitespace\"},\n" BPE_MODEL "}", -ENOTSUP,
                   (const char *const[]){"pre_tokenizer.type", "Whitespace", NULL});
    expect_refusal(td, "dropout",
                   "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}",
                   -ENOTSUP, (const char *const[]){"model.dropout", "0.1", NULL});
    expect_refusal(td, "prefix",
                   "{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {}, "
                   "\"merges\": []}}", -ENOTSUP,
                   (const char *const[]){"model.continuing_subword_prefix", "\"##\"", NULL});
    expect_refusal(td, "split_removed",
                   "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                   "\"behavior\": \"Removed\", \"invert\": false},\n" BPE_MODEL "}", -ENOTSUP,
                   (const char *const[]){"pre_tokenizer.behavior", "Removed", NULL});
    expect_refusal(td, "decoder", "{\"decoder\": {\"type\": \"WordPiece\"},\n" BPE_MODEL "}", -ENOTSUP,
                   (const char *const[]){"decoder.type", "WordPiece", NULL});
    expect_refusal(td, "bad_merge",
                   "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                   -EINVAL, (const char *const[]){"model.merges[0]", "\"ab\" is not in model.vocab", NULL});
    expect_refusal(td, "bad_regex",
                   "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
                   "\"behavior\": \"Isolated\", \"invert\": false},\n" BPE_MODEL "}", -EINVAL,
                   (const char *const[]){"pre_tokenizer.pattern.Regex", "does not compile", NULL});
}

static void test_malformed_json_names_line_and_column(void **state)
{
    tdir *td = *state;
    expect_refusal(td, "malformed", "{\n  \"model\": {\n    \"type\": \"BPE\",,\n  }\n}\n", -EINVAL,
                   (const char *const[]){"tokenizer.json:3:", "not valid JSON", NULL});
}

static void test_missing_file_names_it_and_the_fix(void **state)
{
    tdir *td = *state;
    char err[1024] = "";
    fso_tokenizer *t = NULL;
    assert_int_equal(fso_tokenizer_load(&t, td->path, err, sizeof err), -ENOENT);
    assert_null(t);
    assert_non_null(strstr(err, td->path));
    assert_non_null(strstr(err, "tokenizer.json: no such file"));
}

/* A gpt2-vocabulary tokenizer whose pre-tokenizer is Split(pattern) then
 * ByteLevel, written to td/name. */
static fso_tokenizer *with_split(const tdir *td, const char *name, const char *pattern)
{
    json_error_t je;
    json_t *root = json_load_file(getenv("FSO_TOK_GPT2_JSON"), 0, &je);
    assert_non_null(root);
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                            "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", pattern,
                            "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                            "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    assert_non_null(pre);
    json_object_set_new(root, "pre_tokenizer", pre);
    char dir[600], json[700];
    snprintf(dir, sizeof dir, "%s/%s", td->path, name);
    mkdir(dir, 0755);
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(root, json, JSON_COMPACT), 0);
    json_decref(root);
    return load_ok(dir);
}

/* The hand scanner of the GPT-2, Llama 3 and Qwen2 split patterns gives
 * Oniguruma's pieces: each exact pattern (scanned) against the same pattern
 * wrapped in (?:...) (which only Oniguruma runs), on random text made of the
 * characters the patterns treat differently, some of them not ASCII. */
static void test_pattern_scanner_matches_oniguruma(void **state)
{
    tdir *td = *state;
    static const char *const pats[] = {
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    };
    static const char *const atoms[] = {
        " ", " ", "  ", "\n", "\r", "\r\n", "\t", "\v", "\f", "'", "'", "s", "S", "t", "T", "r", "e",
        "E", "v", "m", "M", "l", "L", "d", "D", "a", "x", "Z", "0", "1", "7", "!", ".", "-", "$", "\"",
        "\x1f", "\x7f", "ſ", "\u00a0", "é", "\xc2\x85", "١", "½", "日", "😀", "\u3000", "\u2029",
    };
    char *buf = malloc(4096);
    assert_non_null(buf);
    for (size_t k = 0; k < sizeof pats / sizeof *pats; k++) {
        char name[32], wrapped[512];
        snprintf(name, sizeof name, "scan%zu", k);
        fso_tokenizer *fast = with_split(td, name, pats[k]);
        snprintf(name, sizeof name, "onig%zu", k);
        snprintf(wrapped, sizeof wrapped, "(?:%s)", pats[k]);
        fso_tokenizer *slow = with_split(td, name, wrapped);
        assert_int_equal(fast->pre[0].scan, (tok_scan_kind)(TOK_SCAN_GPT2 + k));
        assert_int_equal(slow->pre[0].scan, TOK_SCAN_NONE);
        fso_tok_worker *wf = fso_tok_worker_new(fast), *ws = fso_tok_worker_new(slow);
        uint64_t x = 0x9E3779B97F4A7C15ull * (k + 1);
        char err[256];
        for (int n = 0; n < 4000; n++) {
            size_t len = 0, atoms_n = (size_t)(n % 40) + (n % 97 == 0 ? 300 : 0);
            for (size_t a = 0; a < atoms_n; a++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                const char *at = atoms[x % (sizeof atoms / sizeof *atoms)];
                size_t al = strlen(at);
                if (len + al >= 4096)
                    break;
                memcpy(buf + len, at, al);
                len += al;
            }
            fso_ids a = {0}, b = {0};
            assert_int_equal(fso_tokenizer_encode(wf, buf, len, &a, err, sizeof err), 0);
            assert_int_equal(fso_tokenizer_encode(ws, buf, len, &b, err, sizeof err), 0);
            if (a.n != b.n || (a.n && memcmp(a.v, b.v, a.n * sizeof *a.v))) {
                fprintf(stderr, "pattern %zu differs on \"%.*s\"\n", k, (int)len, buf);
                print_ids("scanner ", a.v, a.n);
                print_ids("Oniguruma", b.v, b.n);
                fail();
            }
            fso_ids_free(&a);
            fso_ids_free(&b);
        }
        fso_tok_worker_free(wf);
        fso_tok_worker_free(ws);
        fso_tokenizer_free(fast);
        fso_tokenizer_free(slow);
    }
    free(buf);
}

/* A pattern that matches the empty string splits the text at each empty
 * match, as the library's split does: "x*" cuts "ab" into "a" and "b", so
 * GPT-2's token "ab" is not formed. */
static void test_empty_matches_split_the_text(void **state)
{
    tdir *td = *state;
    fso_tokenizer *t = with_split(td, "empty", "x*");
    fso_tok_worker *w = fso_tok_worker_new(t);
    char err[256];
    fso_ids ids = {0};
    assert_int_equal(fso_tokenizer_encode(w, "ab", 2, &ids, err, sizeof err), 0);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.v[0], fso_tokenizer_token_id(t, "a"));
    assert_int_equal(ids.v[1], fso_tokenizer_token_id(t, "b"));
    assert_int_equal(fso_tokenizer_token_id(t, "ab"), 397);
    ids.n = 0;
    assert_int_equal(fso_tokenizer_encode(w, "abxxab", 6, &ids, err, sizeof err), 0);
    assert_int_equal(ids.n, 5); /* a b xx a b */
    assert_int_equal(ids.v[2], fso_tokenizer_token_id(t, "xx"));
    fso_ids_free(&ids);
    fso_tok_worker_free(w);
    fso_tokenizer_free(t);
}

typedef struct job {
    const fso_tokenizer *t;
    const vecs *v;
    fso_ids out;
    int rc;
} job;

static void *encode_all(void *arg)
{
    job *j = arg;
    fso_tok_worker *w = fso_tok_worker_new(j->t);
    char err[256];
    if (!w) {
        j->rc = -ENOMEM;
        return NULL;
    }
    for (int round = 0; round < 3 && !j->rc; round++) {
        j->out.n = 0;
        for (size_t i = 0; i < j->v->n && !j->rc; i++)
            j->rc = fso_tokenizer_encode(w, j->v->c[i].text, j->v->c[i].len, &j->out, err, sizeof err);
    }
    fso_tok_worker_free(w);
    return NULL;
}

/* Two workers of one tokenizer encode at once and give the serial ids. */
static void test_two_workers_encode_as_one(void **state)
{
    tdir *td = *state;
    char vp[1024];
    fso_tokenizer *t = load_family(td, "qwen3");
    vecs v = read_vectors(fixture("qwen3.jsonl", vp, sizeof vp), "qwen3");
    job serial = {t, &v, {0}, 0};
    encode_all(&serial);
    assert_int_equal(serial.rc, 0);
    job jobs[2] = {{t, &v, {0}, 0}, {t, &v, {0}, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, encode_all, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].rc, 0);
        assert_int_equal(jobs[i].out.n, serial.out.n);
        assert_memory_equal(jobs[i].out.v, serial.out.v, serial.out.n * sizeof *serial.out.v);
        fso_ids_free(&jobs[i].out);
    }
    fso_ids_free(&serial.out);
    free_vectors(&v);
    fso_tokenizer_free(t);
}

/* --licensed: Llama 3 / Llama 2 vectors against user-supplied folders. */
static int run_licensed(void)
{
    static const char *const fam[][2] = {{"llama3", "FSO_LLAMA3_TOKENIZER"},
                                         {"llama2", "FSO_LLAMA2_TOKENIZER"}};
    int ran = 0, bad = 0;
    for (int i = 0; i < 2; i++) {
        const char *dir = getenv(fam[i][1]);
        if (!dir || !*dir) {
            printf("%s: %s is not set; set it to a folder with the model's tokenizer.json to run "
                   "these vectors\n", fam[i][0], fam[i][1]);
            continue;
        }
        char err[1024] = "", name[64], vp[1024];
        fso_tokenizer *t = NULL;
        if (fso_tokenizer_load(&t, dir, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        snprintf(name, sizeof name, "%s.jsonl", fam[i][0]);
        int b = check_vectors(t, fam[i][0], fixture(name, vp, sizeof vp));
        printf("%s (%s): %s\n", fam[i][0], dir, b ? "FAILED" : "all cases match");
        bad += b;
        ran++;
        fso_tokenizer_free(t);
    }
    return ran == 0 ? 77 : bad != 0;
}

int main(int argc, char **argv)
{
    const char *s = getenv("FSO_SRCDIR");
    snprintf(srcdir, sizeof srcdir, "%s", s ? s : ".");
    if (argc > 1 && !strcmp(argv[1], "--licensed"))
        return run_licensed();
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_dir, teardown_dir)
        T(test_gpt2_matches_tiktoken),
        T(test_qwen3_nfc_and_added_tokens_match),
        T(test_mistral_matches_its_sentencepiece_port),
        T(test_spm_legacy_byte_fallback_matches),
        T(test_spm_metaspace_first_matches),
        T(test_digits_then_bytelevel_matches),
        T(test_special_ids_come_from_the_files),
        T(test_unknown_characters_fuse_into_one_unk),
        T(test_invalid_utf8_names_the_byte_offset),
        T(test_unsupported_parts_are_refused_by_path),
        T(test_malformed_json_names_line_and_column),
        T(test_missing_file_names_it_and_the_fix),
        T(test_pattern_scanner_matches_oniguruma),
        T(test_empty_matches_split_the_text),
        T(test_two_workers_encode_as_one),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
