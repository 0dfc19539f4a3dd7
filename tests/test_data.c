/* test_data.c — token files, text, the built-in corpus and micro-batches.
 *
 * Each test gets its own mkdtemp folder. Configs are filled by hand (only the
 * fields data.c reads), so these tests do not depend on the config loader.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "data.h"
#include "test_util.h"

static void tpath(const tdir *t, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", t->path, name);
}

static int count_entries(const char *path)
{
    DIR *dir = opendir(path);
    int n = 0;
    assert_non_null(dir);
    struct dirent *e;
    while ((e = readdir(dir)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(dir);
    return n;
}

static void write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static off_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static void cfg_for(fso_config *cfg, const char *path, fso_data_format format, int vocab,
                    int T, int B)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->data.path, sizeof(cfg->data.path), "%s", path);
    cfg->data.format = format;
    cfg->data.seq_len = T;
    cfg->model.vocab_size = vocab;
    cfg->micro_batch = B;
    cfg->seed = 1234;
}

/* The data of cfg_for's configuration, or the test fails saying why. */
static void open_data(fso_data *d, const char *path, fso_data_format format, int vocab, int T,
                      int B)
{
    fso_config cfg;
    cfg_for(&cfg, path, format, vocab, T, B);
    int rc = fso_data_init(d, &cfg);
    if (rc)
        fail_msg("%s: init: %d %s", path, rc, d->err);
}

#define assert_has(hay, needle)                                                 \
    do {                                                                        \
        if (!strstr((hay), (needle)))                                           \
            fail_msg("expected \"%s\" in \"%s\"", (needle), (hay));             \
    } while (0)

/* fso_data_init must fail and say both the file and the fact. */
static void expect_init_error(const fso_config *cfg, const char *name, const char *fact1,
                              const char *fact2)
{
    fso_data d;
    int rc = fso_data_init(&d, cfg);
    if (rc >= 0)
        fail_msg("fso_data_init(%s) returned %d, expected an error (%s)", cfg->data.path,
                 rc, fact1);
    assert_null(d.tokens);
    assert_has(d.err, name);
    assert_has(d.err, fact1);
    if (fact2)
        assert_has(d.err, fact2);
    fso_data_free(&d);
}

static int32_t *make_tokens(size_t n, uint32_t mul, uint32_t mod)
{
    int32_t *t = malloc(n * sizeof(int32_t));
    assert_non_null(t);
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(((uint64_t)i * mul + 3) % mod);
    return t;
}

static uint32_t header_int(const char *path, int idx)
{
    unsigned char h[20];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(h, 1, sizeof(h), f), sizeof(h));
    fclose(f);
    const unsigned char *p = h + 4 * idx;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void patch_header_int(const char *path, int idx, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, b, 4, 4 * idx), 4);
    close(fd);
}

/* Check one batch against the tokens, with row b starting at starts[b]. */
static void check_batch(const int32_t *tokens, int B, int T, const size_t *starts,
                        const int32_t *in, const int32_t *tg)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            if (in[i] != tokens[starts[b] + t] || tg[i] != tokens[starts[b] + t + 1])
                fail_msg("row %d col %d: got input %d target %d, expected %d %d (row start "
                         "%zu)", b, t, in[i], tg[i], tokens[starts[b] + t],
                         tokens[starts[b] + t + 1], starts[b]);
        }
}

/* ---- round trips ---------------------------------------------------------- */

static void test_v1_round_trip_and_batches_wrap(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "v1.bin", path, sizeof(path));
    const size_t n = 1000;
    const int B = 4, T = 8;
    int32_t *tok = make_tokens(n, 7919, 1000);

    assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);
    assert_int_equal(file_size(path), 1024 + 2 * n);
    assert_int_equal(header_int(path, 0), FSO_TOKENS_MAGIC);
    assert_int_equal(header_int(path, 1), 1);
    assert_int_equal(header_int(path, 2), n);
    assert_int_equal(count_entries(td->path), 1);   /* no temp file left */

    fso_data d;
    open_data(&d, path, FSO_DATA_AUTO, 1000, T, B);
    assert_int_equal(d.n_tokens, n);
    assert_memory_equal(d.tokens, tok, n * sizeof(int32_t));
    assert_has(d.desc, path);
    assert_has(d.desc, "tokens v1");
    assert_has(d.desc, "1000 tokens");

    /* 1000 tokens, 32 per batch: batches 0..30 start at 32*k; batch 31 would
     * read token 1024 > 999, so it wraps to 0. */
    int32_t in[32], tg[32];
    size_t pos = 0;
    for (int k = 0; k < 70; k++) {
        if (pos + (size_t)B * T + 1 > n)
            pos = 0;
        if (k == 31)
            assert_int_equal(pos, 0);
        size_t starts[4];
        for (int b = 0; b < B; b++)
            starts[b] = pos + (size_t)b * T;
        fso_data_next(&d, in, tg, NULL);
        check_batch(tok, B, T, starts, in, tg);
        pos += (size_t)B * T;
    }
    fso_data_free(&d);
    fso_data_free(&d);   /* twice is fine */
    free(tok);
}

/* The wrap is exact: a batch needs B*T+1 tokens from pos, no more, no fewer. */
static void test_wrap_boundary_is_exact(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "edge.bin", path, sizeof(path));
    const int B = 4, T = 8;
    int32_t tok[65], in[32], tg[32];
    for (int i = 0; i < 65; i++)
        tok[i] = i;
    /* 64 tokens: the second batch would need token 64, so it wraps to 0.
     * 65 tokens: the second batch ends exactly on the last token. */
    const size_t second_start[2] = {0, 32};
    for (int k = 0; k < 2; k++) {
        size_t n = 64 + (size_t)k;
        assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);
        fso_data d;
        open_data(&d, path, FSO_DATA_TOKENS, 100, T, B);
        size_t s0[4] = {0, 8, 16, 24}, s1[4];
        for (int b = 0; b < B; b++)
            s1[b] = second_start[k] + (size_t)b * T;
        fso_data_next(&d, in, tg, NULL);
        check_batch(tok, B, T, s0, in, tg);
        fso_data_next(&d, in, tg, NULL);
        check_batch(tok, B, T, s1, in, tg);
        fso_data_free(&d);
    }
}

/* Ids above 65535 are written in llm.c's Llama 3 format (v7), and
 * fsoff's old version 2 (the same tokens under magic 20240520) still reads. */
static void test_large_vocab_writes_llama3_and_v2_still_reads(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "v7.bin", path, sizeof(path));
    const size_t n = 5000;
    int32_t *tok = make_tokens(n, 104729, 128000);   /* many ids above 65535 */

    assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);
    assert_int_equal(header_int(path, 0), FSO_TOKENS_MAGIC_LLAMA3);
    assert_int_equal(header_int(path, 1), FSO_TOKENS_LLAMA3_VERSION);
    assert_int_equal(file_size(path), 1024 + 4 * n);

    for (int v2 = 0; v2 < 2; v2++) {
        if (v2) {
            patch_header_int(path, 0, FSO_TOKENS_MAGIC);
            patch_header_int(path, 1, 2);
        }
        fso_data d;
        open_data(&d, path, FSO_DATA_TOKENS, 128000, 16, 3);
        assert_int_equal(d.n_tokens, n);
        assert_memory_equal(d.tokens, tok, n * sizeof(int32_t));
        assert_has(d.desc, v2 ? "tokens v2" : "llm.c Llama 3 tokens");
        assert_has(d.desc, "5000 tokens");
        int32_t in[48], tg[48];
        size_t starts[3] = {0, 16, 32};
        assert_int_equal(fso_data_next(&d, in, tg, NULL), 48);
        check_batch(tok, 3, 16, starts, in, tg);
        fso_data_free(&d);
    }
    free(tok);
}

static void test_force_u32_with_small_ids(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "forced.bin", path, sizeof(path));
    const size_t n = 300;
    int32_t *tok = make_tokens(n, 31, 256);

    assert_int_equal(fso_data_write_tokens(path, tok, n, 1), 0);
    assert_int_equal(header_int(path, 1), FSO_TOKENS_LLAMA3_VERSION);
    assert_int_equal(file_size(path), 1024 + 4 * n);
    fso_data d;
    open_data(&d, path, FSO_DATA_AUTO, 256, 16, 2);
    assert_memory_equal(d.tokens, tok, n * sizeof(int32_t));
    fso_data_free(&d);

    /* Overwriting an existing file replaces it. */
    assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);
    assert_int_equal(header_int(path, 1), 1);
    assert_int_equal(count_entries(td->path), 1);
    free(tok);
}

static void test_batches_are_deterministic(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "det.bin", path, sizeof(path));
    const size_t n = 777;
    int32_t *tok = make_tokens(n, 12345, 50257);
    assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);

    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 50257, 10, 5);
    fso_data a, b;
    assert_int_equal(fso_data_init(&a, &cfg), 0);
    cfg.seed = 99;   /* the training seed does not change the batches */
    assert_int_equal(fso_data_init(&b, &cfg), 0);
    int32_t ia[50], ta[50], ib[50], tb[50];
    for (int k = 0; k < 100; k++) {
        fso_data_next(&a, ia, ta, NULL);
        fso_data_next(&b, ib, tb, NULL);
        assert_memory_equal(ia, ib, sizeof(ia));
        assert_memory_equal(ta, tb, sizeof(ta));
        for (int i = 0; i < 50; i++)
            if (i % 10 != 9)
                assert_int_equal(ta[i], ia[i + 1]);   /* targets are inputs shifted by one */
    }
    fso_data_free(&a);
    fso_data_free(&b);
    free(tok);
}

static void test_short_corpus_rows_wrap_in_bounds(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "short.bin", path, sizeof(path));
    const int B = 4, T = 8;
    const size_t n = 20;   /* >= T+1 but < B*T+1 */
    int32_t tok[20];
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)i;
    assert_int_equal(fso_data_write_tokens(path, tok, n, 0), 0);

    fso_data d;
    open_data(&d, path, FSO_DATA_TOKENS, 100, T, B);
    int32_t in[32], tg[32];
    size_t pos = 0, m = n - T;
    for (int k = 0; k < 20; k++) {
        size_t starts[4];
        for (int b = 0; b < B; b++) {
            starts[b] = (pos + (size_t)b * T) % m;
            assert_true(starts[b] + T < n);
        }
        fso_data_next(&d, in, tg, NULL);
        check_batch(tok, B, T, starts, in, tg);
        pos = (pos + (size_t)B * T) % m;
    }
    fso_data_free(&d);

    /* Exactly T+1 tokens: every row is the whole corpus. */
    assert_int_equal(fso_data_write_tokens(path, tok, (size_t)T + 1, 0), 0);
    open_data(&d, path, FSO_DATA_TOKENS, 100, T, B);
    fso_data_next(&d, in, tg, NULL);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[b * T + t], t);
            assert_int_equal(tg[b * T + t], t + 1);
        }
    fso_data_free(&d);
}

/* ---- text and the built-in corpus ----------------------------------------- */

static void test_text_file_is_byte_level(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "a.txt", path, sizeof(path));
    unsigned char text[3000];
    for (size_t i = 0; i < sizeof(text); i++)
        text[i] = (unsigned char)("the quick brown fox\n"[i % 20]);
    text[5] = 0xe9;   /* bytes above 127 are tokens 128..255 */
    write_file(path, text, sizeof(text));

    for (int f = 0; f < 2; f++) {
        fso_data d;
        open_data(&d, path, f ? FSO_DATA_TEXT : FSO_DATA_AUTO, 256, 32, 2);
        assert_int_equal(d.n_tokens, sizeof(text));
        for (size_t i = 0; i < sizeof(text); i++)
            assert_int_equal(d.tokens[i], text[i]);
        assert_int_equal(d.tokens[5], 0xe9);
        assert_has(d.desc, path);
        assert_has(d.desc, "text");
        assert_has(d.desc, "3000 bytes");
        int32_t in[64], tg[64];
        fso_data_next(&d, in, tg, NULL);
        assert_int_equal(in[0], 't');
        assert_int_equal(tg[0], 'h');
        fso_data_free(&d);
    }
}

static void test_auto_detects_tokens_and_text(void **state)
{
    tdir *td = *state;
    char bin[512], txt[512], small[512];
    tpath(td, "x.bin", bin, sizeof(bin));
    tpath(td, "x.txt", txt, sizeof(txt));
    tpath(td, "small", small, sizeof(small));
    int32_t *tok = make_tokens(600, 3, 300);
    assert_int_equal(fso_data_write_tokens(bin, tok, 600, 0), 0);
    char text[2048];
    memset(text, 'a', sizeof(text));
    write_file(txt, text, sizeof(text));
    /* The magic, but shorter than a header: text under auto. */
    unsigned char m[200] = {0};
    uint32_t magic = FSO_TOKENS_MAGIC;
    for (int i = 0; i < 4; i++)
        m[i] = (unsigned char)(magic >> (8 * i));
    for (size_t i = 4; i < sizeof(m); i++)
        m[i] = 'z';
    write_file(small, m, sizeof(m));

    fso_config cfg;
    fso_data d;
    cfg_for(&cfg, bin, FSO_DATA_AUTO, 300, 16, 2);
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    assert_int_equal(d.n_tokens, 600);
    assert_has(d.desc, "tokens v1");
    fso_data_free(&d);

    cfg_for(&cfg, txt, FSO_DATA_AUTO, 300, 16, 2);
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    assert_int_equal(d.n_tokens, sizeof(text));
    assert_has(d.desc, "text");
    fso_data_free(&d);

    cfg_for(&cfg, small, FSO_DATA_AUTO, 256, 16, 2);
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    assert_int_equal(d.n_tokens, sizeof(m));
    assert_has(d.desc, "text");
    fso_data_free(&d);

    /* The token file read as text is its raw bytes. */
    cfg_for(&cfg, bin, FSO_DATA_TEXT, 256, 16, 2);
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    assert_int_equal(d.n_tokens, 1024 + 2 * 600);
    fso_data_free(&d);
    free(tok);
}

static void test_corpus_is_deterministic_printable_exact(void **state)
{
    (void)state;
    const size_t n = 200000;
    char *a = malloc(n + 16), *b = malloc(n + 16), *c = malloc(n + 16);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    memset(a, '#', n + 16);
    memset(b, '@', n + 16);
    fso_corpus_generate(a, n, 42);
    fso_corpus_generate(b, n, 42);
    fso_corpus_generate(c, n, 43);
    assert_memory_equal(a, b, n);
    assert_true(memcmp(a, c, n) != 0);
    for (size_t i = 0; i < 16; i++) {   /* nothing past n_bytes */
        assert_int_equal(a[n + i], '#');
        assert_int_equal(b[n + i], '@');
    }
    size_t newlines = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)a[i];
        if (!(ch == '\n' || (ch >= 32 && ch <= 126)))
            fail_msg("byte %zu is 0x%02x, not printable ASCII", i, ch);
        newlines += ch == '\n';
    }
    assert_true(newlines > n / 2000);   /* short paragraphs */
    /* Some structure the model can learn. */
    char *s = malloc(n + 1);
    assert_non_null(s);
    memcpy(s, a, n);
    s[n] = '\0';
    assert_has(s, " plus ");
    assert_has(s, " is ");
    assert_has(s, ". ");

    /* Short outputs: exactly n bytes, a prefix-free cut. */
    char tiny[8];
    memset(tiny, '#', sizeof(tiny));
    fso_corpus_generate(tiny, 0, 42);
    assert_int_equal(tiny[0], '#');
    fso_corpus_generate(tiny, 5, 42);
    assert_memory_equal(tiny, a, 5);
    assert_int_equal(tiny[5], '#');
    free(s);
    free(a);
    free(b);
    free(c);
}

static void test_builtin_corpus_ignores_training_seed(void **state)
{
    (void)state;
    fso_config cfg;
    fso_data a, b;
    cfg_for(&cfg, "", FSO_DATA_AUTO, 256, 64, 4);
    assert_int_equal(fso_data_init(&a, &cfg), 0);
    cfg.seed = 777;
    assert_int_equal(fso_data_init(&b, &cfg), 0);
    assert_int_equal(a.n_tokens, FSO_CORPUS_BYTES);
    assert_int_equal(b.n_tokens, FSO_CORPUS_BYTES);
    assert_memory_equal(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t));
    assert_has(a.desc, "built-in corpus");
    assert_has(a.desc, "2097152 bytes");

    char *ref = malloc(FSO_CORPUS_BYTES);
    assert_non_null(ref);
    fso_corpus_generate(ref, FSO_CORPUS_BYTES, FSO_CORPUS_SEED);
    for (size_t i = 0; i < FSO_CORPUS_BYTES; i++)
        if (a.tokens[i] != (unsigned char)ref[i])
            fail_msg("token %zu is %d, corpus byte is %d", i, a.tokens[i], ref[i]);
    free(ref);
    fso_data_free(&a);
    fso_data_free(&b);

    cfg_for(&cfg, "", FSO_DATA_AUTO, 100, 64, 4);
    expect_init_error(&cfg, "built-in corpus", "model.vocab_size >= 256", "(it is 100)");
    cfg_for(&cfg, "", FSO_DATA_TOKENS, 256, 64, 4);
    expect_init_error(&cfg, "built-in corpus", "data.path", NULL);
}

/* ---- errors --------------------------------------------------------------- */

static void test_missing_file_is_an_error(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "nope.bin", path, sizeof(path));
    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 256, 8, 1);
    fso_data d;
    assert_int_equal(fso_data_init(&d, &cfg), -ENOENT);
    assert_has(d.err, path);
    assert_has(d.err, "cannot open");
    assert_has(d.err, strerror(ENOENT));

    cfg_for(&cfg, td->path, FSO_DATA_AUTO, 256, 8, 1);
    expect_init_error(&cfg, td->path, "is a directory", NULL);
}

/* Under data.format auto a file named .bin is a token file: without the
 * magic it is refused with the message users see, never trained on as text;
 * data.format text trains on its bytes. */
static void test_bin_without_magic_is_an_error(void **state)
{
    tdir *td = *state;
    char bin[512], upper[512], tiny[512], half[512];
    tpath(td, "x.bin", bin, sizeof(bin));
    tpath(td, "X.BIN", upper, sizeof(upper));
    tpath(td, "tiny.bin", tiny, sizeof(tiny));
    tpath(td, "half.bin", half, sizeof(half));
    unsigned char buf[3000];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)('a' + i % 26);
    buf[0] = 0x39, buf[1] = 0x30, buf[2] = 0, buf[3] = 0; /* magic 12345 */
    write_file(bin, buf, sizeof(buf));
    write_file(upper, buf, sizeof(buf));
    write_file(tiny, "ab", 2);

    fso_config cfg;
    fso_data d;
    char want[800];
    cfg_for(&cfg, bin, FSO_DATA_AUTO, 256, 16, 2);
    assert_true(fso_data_init(&d, &cfg) < 0);
    snprintf(want, sizeof want, "%s: not a token file (magic 12345; token files have 20240520, "
             "20240801 for llm.c's Llama 3 files or 20261202 for fsoff's flagged files); "
             "re-create it as a token file, or if it is plain text, set data.format=text", bin);
    assert_string_equal(d.err, want);
    assert_null(d.tokens);
    cfg_for(&cfg, upper, FSO_DATA_AUTO, 256, 16, 2);
    expect_init_error(&cfg, upper, "not a token file (magic 12345", "data.format=text");

    /* shorter than the magic; the magic, then the end inside the header */
    cfg_for(&cfg, tiny, FSO_DATA_AUTO, 256, 16, 2);
    expect_init_error(&cfg, tiny, "truncated header: the file holds 2 bytes", "re-create the file");
    int32_t *tok = make_tokens(500, 5, 256);
    assert_int_equal(fso_data_write_tokens(half, tok, 500, 0), 0);
    assert_int_equal(truncate(half, 600), 0);
    cfg_for(&cfg, half, FSO_DATA_AUTO, 256, 16, 2);
    expect_init_error(&cfg, half, "truncated header", "600 bytes");
    free(tok);

    /* what the message says to do */
    open_data(&d, bin, FSO_DATA_TEXT, 256, 16, 2);
    assert_int_equal(d.n_tokens, sizeof(buf));
    assert_int_equal(d.tokens[0], 0x39);
    assert_has(d.desc, "text");
    fso_data_free(&d);
}

/* llm.c's Llama 3 token files (magic 20240801, version 7, uint32) are read,
 * under data.format auto whatever their name; another version is refused
 * without advice to train on the file's bytes. */
static void test_llama3_token_files_are_read(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "llama3.tok", path, sizeof(path));
    int32_t *tok = make_tokens(700, 7919, 128256);
    assert_int_equal(fso_data_write_tokens(path, tok, 700, 1), 0);
    patch_header_int(path, 0, 20240801);
    patch_header_int(path, 1, 7);
    fso_data d;
    fso_config cfg;
    for (int f = 0; f < 2; f++) {
        open_data(&d, path, f ? FSO_DATA_TOKENS : FSO_DATA_AUTO, 128256, 16, 2);
        assert_int_equal(d.n_tokens, 700);
        assert_memory_equal(d.tokens, tok, 700 * sizeof(int32_t));
        assert_has(d.desc, "llm.c Llama 3 tokens, 700 tokens");
        fso_data_free(&d);
    }
    patch_header_int(path, 1, 6);
    cfg_for(&cfg, path, FSO_DATA_AUTO, 128256, 16, 2);
    expect_init_error(&cfg, path, "llm.c Llama 3 token file of version 6; fsoff reads version 7",
                      "re-create the file");
    assert_int_equal(fso_data_init(&d, &cfg), -EINVAL);
    assert_null(strstr(d.err, "bytes"));
    fso_data_free(&d);
    free(tok);
}

/* Text is bytes as token ids: refused for a model from a Hugging Face folder
 * whose vocabulary is larger, naming the fix and the key that forces it. */
static void test_text_for_a_pretrained_vocabulary_is_refused(void **state)
{
    tdir *td = *state;
    char txt[512];
    tpath(td, "book.txt", txt, sizeof(txt));
    char text[3000];
    for (size_t i = 0; i < sizeof(text); i++)
        text[i] = (char)('a' + i % 26);
    write_file(txt, text, sizeof(text));
    fso_config cfg;
    fso_data d;
    const fso_data_format refused[] = {FSO_DATA_AUTO, FSO_DATA_TEXT};
    for (int f = 0; f < 2; f++) {
        cfg_for(&cfg, txt, refused[f], 32000, 16, 2);
        snprintf(cfg.init_from, sizeof cfg.init_from, "models/Llama-2-7b");
        expect_init_error(&cfg, txt, "the model from models/Llama-2-7b has a 32000-token "
                                     "vocabulary whose ids are not bytes; tokenize the text with "
                                     "the model's tokenizer into a token file",
                          "or set data.format=bytes to train on its bytes anyway");
    }
    cfg_for(&cfg, txt, FSO_DATA_BYTES, 32000, 16, 2);
    snprintf(cfg.init_from, sizeof cfg.init_from, "models/Llama-2-7b");
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    assert_int_equal(d.n_tokens, sizeof(text));
    assert_int_equal(d.tokens[1], 'b');
    fso_data_free(&d);
    open_data(&d, txt, FSO_DATA_AUTO, 32000, 16, 2); /* from scratch: bytes are its tokens */
    fso_data_free(&d);
    /* the built-in corpus is text too */
    cfg_for(&cfg, "", FSO_DATA_AUTO, 32000, 16, 2);
    snprintf(cfg.init_from, sizeof cfg.init_from, "models/Llama-2-7b");
    expect_init_error(&cfg, "built-in corpus (no data.path)",
                      "the model from models/Llama-2-7b has a 32000-token vocabulary",
                      "data.format=bytes");
    cfg.data.format = FSO_DATA_BYTES;
    assert_int_equal(fso_data_init(&d, &cfg), 0);
    fso_data_free(&d);
}

static void test_token_header_errors(void **state)
{
    tdir *td = *state;
    char path[512], txt[512], half[512];
    tpath(td, "h.bin", path, sizeof(path));
    tpath(td, "t.txt", txt, sizeof(txt));
    tpath(td, "half.bin", half, sizeof(half));
    int32_t *tok = make_tokens(500, 5, 400);
    fso_config cfg;

    /* format=tokens on a text file. */
    char text[2000];
    memset(text, 'q', sizeof(text));
    write_file(txt, text, sizeof(text));
    cfg_for(&cfg, txt, FSO_DATA_TOKENS, 50257, 8, 1);
    expect_init_error(&cfg, txt, "not a token file (magic 1903260017; token files have 20240520",
                      "if it is plain text, set data.format=text");

    /* The magic, then the file ends inside the header. */
    assert_int_equal(fso_data_write_tokens(half, tok, 500, 0), 0);
    assert_int_equal(truncate(half, 600), 0);
    cfg_for(&cfg, half, FSO_DATA_TOKENS, 50257, 8, 1);
    expect_init_error(&cfg, half, "truncated header", "600 bytes");
    write_file(half, "", 0);
    expect_init_error(&cfg, half, "truncated header", "0 bytes");

    /* Unsupported version. */
    assert_int_equal(fso_data_write_tokens(path, tok, 500, 0), 0);
    patch_header_int(path, 1, 3);
    cfg_for(&cfg, path, FSO_DATA_AUTO, 50257, 8, 1);
    expect_init_error(&cfg, path, "version 3", "1 = uint16");
    free(tok);
}

static void test_truncated_and_overlong_token_files(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "cut.bin", path, sizeof(path));
    int32_t *tok = make_tokens(1000, 11, 50000);
    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 50257, 8, 1);

    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    assert_int_equal(truncate(path, 1024 + 2000 - 10), 0);
    expect_init_error(&cfg, path,
                      "truncated: header says 1000 tokens (2000 bytes) but the file holds "
                      "1990 bytes of tokens", NULL);

    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 1), 0);
    assert_int_equal(truncate(path, 1024 + 4000 - 1), 0);
    expect_init_error(&cfg, path, "truncated: header says 1000 tokens (4000 bytes)",
                      "3999 bytes");

    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    assert_int_equal(truncate(path, 1024 + 2000 + 6), 0);
    expect_init_error(&cfg, path, "too long", "2006 bytes of tokens");

    /* A header count beyond the data, e.g. a damaged count field. */
    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    patch_header_int(path, 2, 0x7fffffff);
    expect_init_error(&cfg, path, "truncated: header says 2147483647 tokens", NULL);
    free(tok);
}

static void test_token_beyond_vocab_is_an_error(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "big.bin", path, sizeof(path));
    int32_t *tok = make_tokens(1000, 1, 50000);
    tok[123] = 70000;
    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 50257, 8, 1);
    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    expect_init_error(&cfg, path, "token 70000 at index 123 is >= model.vocab_size (50257)",
                      "largest token is 70000, so the model needs a vocabulary of at least "
                      "70001: for Llama 3 tokens, --set model.vocab_size=128256");

    /* v1: the limit is the vocabulary, not uint16. */
    tok[123] = 3;
    tok[999] = 50257;
    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    assert_int_equal(header_int(path, 1), 1);
    expect_init_error(&cfg, path, "token 50257 at index 999 is >= model.vocab_size (50257)",
                      NULL);

    /* GPT-2 tokens against the byte-level default: the size to set, named */
    tok[999] = 3;
    tok[5] = 50256;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 256, 8, 1);
    assert_int_equal(fso_data_write_tokens(path, tok, 1000, 0), 0);
    expect_init_error(&cfg, path, "token 50256 at index 5 is >= model.vocab_size (256)",
                      "largest token is 50256, so the model needs a vocabulary of at least "
                      "50257: for GPT-2 tokens, --set model.vocab_size=50257");
    free(tok);
}

static void test_short_corpus_is_an_error(void **state)
{
    tdir *td = *state;
    char path[512], txt[512];
    tpath(td, "few.bin", path, sizeof(path));
    tpath(td, "few.txt", txt, sizeof(txt));
    int32_t *tok = make_tokens(128, 1, 100);
    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 256, 128, 1);
    assert_int_equal(fso_data_write_tokens(path, tok, 100, 0), 0);
    expect_init_error(&cfg, path, "has 100 tokens, fewer than data.seq_len + 1 = 129", NULL);
    /* T tokens is still one short. */
    assert_int_equal(fso_data_write_tokens(path, tok, 128, 0), 0);
    expect_init_error(&cfg, path, "has 128 tokens", "= 129");

    char text[50];
    memset(text, 'x', sizeof(text));
    write_file(txt, text, sizeof(text));
    cfg_for(&cfg, txt, FSO_DATA_TEXT, 256, 128, 1);
    expect_init_error(&cfg, txt, "has 50 tokens, fewer than data.seq_len + 1 = 129", NULL);
    free(tok);
}

static void test_text_errors(void **state)
{
    tdir *td = *state;
    char empty[512], txt[512];
    tpath(td, "empty.txt", empty, sizeof(empty));
    tpath(td, "ok.txt", txt, sizeof(txt));
    write_file(empty, "", 0);
    fso_config cfg;
    cfg_for(&cfg, empty, FSO_DATA_AUTO, 256, 8, 1);
    expect_init_error(&cfg, empty, "empty", NULL);
    cfg_for(&cfg, empty, FSO_DATA_TEXT, 256, 8, 1);
    expect_init_error(&cfg, empty, "empty", NULL);

    char text[500];
    memset(text, 'y', sizeof(text));
    write_file(txt, text, sizeof(text));
    cfg_for(&cfg, txt, FSO_DATA_AUTO, 100, 8, 1);
    expect_init_error(&cfg, txt, "model.vocab_size >= 256", "token file");

    cfg_for(&cfg, txt, FSO_DATA_AUTO, 256, 0, 1);
    expect_init_error(&cfg, "data.seq_len", "must be >= 1", NULL);
}

/* ---- writing -------------------------------------------------------------- */

static void test_write_failures_leave_no_file(void **state)
{
    tdir *td = *state;
    char path[512], sub[512];
    int32_t *tok = make_tokens(100000, 3, 60000);

    /* Missing folder. */
    tpath(td, "no/such/dir.bin", path, sizeof(path));
    assert_int_equal(fso_data_write_tokens(path, tok, 10, 0), -ENOENT);
    assert_int_equal(count_entries(td->path), 0);

    /* The target is a folder: the rename fails and the temp file goes. */
    tpath(td, "adir", sub, sizeof(sub));
    assert_int_equal(mkdir(sub, 0755), 0);
    int rc = fso_data_write_tokens(sub, tok, 10, 0);
    assert_true(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST);
    assert_int_equal(count_entries(td->path), 1);
    assert_int_equal(count_entries(sub), 0);

    /* Negative ids cannot be stored. */
    tpath(td, "neg.bin", path, sizeof(path));
    tok[7] = -1;
    assert_int_equal(fso_data_write_tokens(path, tok, 10, 0), -EINVAL);
    tok[7] = 7;
    assert_int_equal(count_entries(td->path), 1);

    /* A write that runs out of room (RLIMIT_FSIZE stands in for ENOSPC). */
    struct rlimit old, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 8192) {
        free(tok);
        skip();
    }
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    small = old;
    small.rlim_cur = 8192;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    tpath(td, "full.bin", path, sizeof(path));
    rc = fso_data_write_tokens(path, tok, 100000, 0);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(rc, -EFBIG);
    assert_int_equal(count_entries(td->path), 1);
    free(tok);
}

/* ---- masks and documents ------------------------------------------------- */

/* What fso_data_next must give for row start `start` of T under flags f
 * (NULL: every token a target, no documents), written the plain way: a
 * target counts when its token is flagged a target and starts no document;
 * a position is the distance back to the nearest document start within the
 * row (the row's first token counting as one). */
static size_t expect_row(const int32_t *tok, const uint8_t *f, size_t start, int T, int32_t *in,
                         int32_t *tg, int32_t *pos)
{
    size_t counted = 0;
    for (int t = 0; t < T; t++) {
        const size_t i = start + (size_t)t;
        in[t] = tok[i];
        const bool counts = !f || ((f[i + 1] & FSO_TOKEN_TARGET) &&
                                   !(f[i + 1] & FSO_TOKEN_DOC_START));
        tg[t] = counts ? tok[i + 1] : -1;
        counted += counts;
        int back = 0;
        while (back < t && !(f && (f[i - (size_t)back] & FSO_TOKEN_DOC_START)))
            back++;
        pos[t] = back;
    }
    return counted;
}

/* Flags with masks and document starts, both token widths: every batch
 * holds the masked targets as -1 and the positions within documents,
 * and fso_data_next counts the targets that count. */
static void test_flagged_file_masks_targets_and_positions(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "flagged.bin", path, sizeof(path));
    enum { N = 300, T = 12, B = 3 };
    for (int wide = 0; wide < 2; wide++) {
        const int vocab = wide ? 70000 : 1000;
        int32_t *tok = make_tokens(N, 37, 1000);
        for (size_t i = 0; wide && i < N; i += 5)
            tok[i] = 65536 + (int32_t)i; /* uint32 tokens */
        uint8_t f[N];
        for (size_t i = 0; i < N; i++) {
            f[i] = (i % 7 == 3 || i % 11 == 5) ? 0 : FSO_TOKEN_TARGET; /* masked spans */
            if (i % 17 == 0 || i % 29 == 4)
                f[i] |= FSO_TOKEN_DOC_START;
        }
        assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
        assert_int_equal(header_int(path, 0), FSO_TOKENS_MAGIC_FLAGGED);
        assert_int_equal(header_int(path, 1), FSO_TOKENS_FLAGGED_VERSION);
        assert_int_equal(header_int(path, 3), 0);
        assert_int_equal(header_int(path, 4), wide ? 4 : 2);
        assert_int_equal(file_size(path), 1024 + (wide ? 5 : 3) * N);
        fso_data d;
        open_data(&d, path, FSO_DATA_AUTO, vocab, T, B);
        assert_true(fso_data_documents(&d));
        assert_has(d.desc, "flagged tokens");
        assert_memory_equal(d.tokens, tok, N * sizeof(int32_t));
        for (int step = 0; step < 12; step++) { /* wraps: 8 batches fit */
            const size_t p0 = d.pos + B * T + 1 > N ? 0 : d.pos;
            int32_t in[B * T], tg[B * T], pos[B * T], ein[B * T], etg[B * T], epos[B * T];
            size_t want = 0;
            for (int b = 0; b < B; b++)
                want += expect_row(tok, f, p0 + (size_t)b * T, T, ein + b * T, etg + b * T,
                                   epos + b * T);
            assert_int_equal(fso_data_next(&d, in, tg, pos), want);
            assert_memory_equal(in, ein, sizeof in);
            assert_memory_equal(tg, etg, sizeof tg);
            assert_memory_equal(pos, epos, sizeof pos);
            assert_true(want < B * T); /* the masks bite in every batch */
        }
        fso_data_free(&d);

        /* data.documents "stream": the masks stay, the documents go */
        fso_config cfg;
        cfg_for(&cfg, path, FSO_DATA_AUTO, vocab, T, B);
        cfg.data.documents = FSO_DATA_DOCS_STREAM;
        assert_int_equal(fso_data_init(&d, &cfg), 0);
        assert_false(fso_data_documents(&d));
        uint8_t fs[N];
        for (size_t i = 0; i < N; i++)
            fs[i] = f[i] & FSO_TOKEN_TARGET;
        int32_t in[B * T], tg[B * T], pos[B * T], ein[B * T], etg[B * T], epos[B * T];
        size_t want = 0;
        for (int b = 0; b < B; b++)
            want += expect_row(tok, fs, (size_t)b * T, T, ein + b * T, etg + b * T, epos + b * T);
        memset(pos, 0x5a, sizeof pos);
        assert_int_equal(fso_data_next(&d, in, tg, pos), want);
        assert_memory_equal(tg, etg, sizeof tg);
        for (int i = 0; i < B * T; i++) /* not written without documents */
            assert_int_equal(pos[i], 0x5a5a5a5a);
        fso_data_free(&d);
        free(tok);
    }
}

/* header[3] of a standard token file names a delimiter: documents start
 * at it (its prediction does not count); under "stream", or without the
 * note, the file gives exactly the batches of llm.c's loader. */
static void test_delimiter_note_makes_documents(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "delim.bin", path, sizeof(path));
    enum { N = 400, T = 16, B = 2, DELIM = 999 };
    int32_t *tok = make_tokens(N, 31, 900);
    uint8_t f[N];
    for (size_t i = 0; i < N; i++) {
        if (i % 23 == 0)
            tok[i] = DELIM; /* llm.c prepends it to every document */
        f[i] = FSO_TOKEN_TARGET | (tok[i] == DELIM ? FSO_TOKEN_DOC_START : 0);
    }
    for (int wide = 0; wide < 2; wide++) {
        assert_int_equal(fso_data_write_tokens(path, tok, N, wide), 0);
        patch_header_int(path, 3, DELIM + 1);
        fso_data d;
        open_data(&d, path, FSO_DATA_AUTO, 1000, T, B);
        assert_true(fso_data_documents(&d));
        for (int step = 0; step < 5; step++) {
            const size_t p0 = d.pos;
            int32_t in[B * T], tg[B * T], pos[B * T], ein[B * T], etg[B * T], epos[B * T];
            size_t want = 0;
            for (int b = 0; b < B; b++)
                want += expect_row(tok, f, p0 + (size_t)b * T, T, ein + b * T, etg + b * T,
                                   epos + b * T);
            assert_int_equal(fso_data_next(&d, in, tg, pos), want);
            assert_memory_equal(tg, etg, sizeof tg);
            assert_memory_equal(pos, epos, sizeof pos);
        }
        fso_data_free(&d);

        fso_config cfg;
        cfg_for(&cfg, path, FSO_DATA_AUTO, 1000, T, B);
        cfg.data.documents = FSO_DATA_DOCS_STREAM;
        assert_int_equal(fso_data_init(&d, &cfg), 0);
        assert_false(fso_data_documents(&d));
        assert_null(d.flags); /* the plain path */
        int32_t in[B * T], tg[B * T];
        size_t starts[B] = {0, T};
        assert_int_equal(fso_data_next(&d, in, tg, NULL), B * T);
        check_batch(tok, B, T, starts, in, tg);
        fso_data_free(&d);

        /* a delimiter the vocabulary lacks */
        cfg_for(&cfg, path, FSO_DATA_AUTO, 999, T, B);
        expect_init_error(&cfg, path, "names token 999 as the document delimiter",
                          "model.vocab_size is 999");
    }
    free(tok);
}

/* A flagged file whose every token is a target and that starts no document
 * after its first token runs the plain path: no flags kept, batches as a
 * v1 file's. */
static void test_flagged_file_without_masks_is_plain(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "plain.bin", path, sizeof(path));
    enum { N = 200, T = 8, B = 4 };
    int32_t *tok = make_tokens(N, 13, 500);
    uint8_t f[N];
    memset(f, FSO_TOKEN_TARGET, sizeof f);
    f[0] |= FSO_TOKEN_DOC_START;
    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    fso_data d;
    open_data(&d, path, FSO_DATA_TOKENS, 500, T, B);
    assert_null(d.flags);
    assert_false(fso_data_documents(&d));
    int32_t in[B * T], tg[B * T];
    size_t starts[B] = {0, T, 2 * T, 3 * T};
    assert_int_equal(fso_data_next(&d, in, tg, NULL), B * T);
    check_batch(tok, B, T, starts, in, tg);
    fso_data_free(&d);
    free(tok);
}

/* Each way a flagged file can be wrong is refused naming the file and the
 * fix. */
static void test_flagged_file_errors(void **state)
{
    tdir *td = *state;
    char path[512];
    tpath(td, "bad.bin", path, sizeof(path));
    enum { N = 100 };
    int32_t *tok = make_tokens(N, 7, 300);
    uint8_t f[N];
    for (size_t i = 0; i < N; i++)
        f[i] = i % 3 ? FSO_TOKEN_TARGET : 0;
    fso_config cfg;
    cfg_for(&cfg, path, FSO_DATA_AUTO, 300, 8, 2);

    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    assert_int_equal(truncate(path, 1024 + 2 * N + N / 2), 0);
    expect_init_error(&cfg, path, "truncated: header says 100 tokens (200 bytes) and as many "
                      "flag bytes", "the flags are cut short");
    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    assert_int_equal(truncate(path, 1024 + 2 * N - 2), 0);
    expect_init_error(&cfg, path, "truncated", "re-create the file");

    f[40] = 0x80;
    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), -EINVAL);
    f[40] = FSO_TOKEN_TARGET;
    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x84", 1, 1024 + 2 * N + 40), 1);
    close(fd);
    expect_init_error(&cfg, path, "token 40 has flags 0x84, with bits fsoff does not know",
                      "fsoff tokenize");

    assert_int_equal(fso_data_write_flagged(path, tok, f, N, 300), 0);
    expect_init_error(&cfg, path, "names token 300 as the document delimiter", "vocab_size");

    assert_int_equal(fso_data_write_flagged(path, tok, f, N, -1), 0);
    patch_header_int(path, 4, 3);
    expect_init_error(&cfg, path, "3 bytes per token (header[4]); it must be 2 or 4", NULL);
    patch_header_int(path, 4, 2);
    patch_header_int(path, 1, 2);
    expect_init_error(&cfg, path, "flagged token file of version 2; this fsoff reads version 1",
                      NULL);

    uint8_t none[N];
    memset(none, 0, sizeof none);
    none[0] = FSO_TOKEN_TARGET; /* the first token is never a target */
    assert_int_equal(fso_data_write_flagged(path, tok, none, N, -1), 0);
    expect_init_error(&cfg, path, "no token of the file is a target", "flagged as targets");
    free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_dir, teardown_dir)
        T(test_v1_round_trip_and_batches_wrap),
        T(test_wrap_boundary_is_exact),
        T(test_large_vocab_writes_llama3_and_v2_still_reads),
        T(test_force_u32_with_small_ids),
        T(test_flagged_file_masks_targets_and_positions),
        T(test_delimiter_note_makes_documents),
        T(test_flagged_file_without_masks_is_plain),
        T(test_flagged_file_errors),
        T(test_batches_are_deterministic),
        T(test_short_corpus_rows_wrap_in_bounds),
        T(test_text_file_is_byte_level),
        T(test_auto_detects_tokens_and_text),
        T(test_corpus_is_deterministic_printable_exact),
        T(test_builtin_corpus_ignores_training_seed),
        T(test_missing_file_is_an_error),
        T(test_bin_without_magic_is_an_error),
        T(test_token_header_errors),
        T(test_llama3_token_files_are_read),
        T(test_text_for_a_pretrained_vocabulary_is_refused),
        T(test_truncated_and_overlong_token_files),
        T(test_token_beyond_vocab_is_an_error),
        T(test_short_corpus_is_an_error),
        T(test_text_errors),
        T(test_write_failures_leave_no_file),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
