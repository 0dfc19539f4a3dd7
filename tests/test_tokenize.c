/* test_tokenize.c — fsoff tokenize's parts that need no tokenizer: the
 * token file writer (headers, flags, nothing left on failure), the input
 * readers (document separation, line and byte places, UTF-8), the JSONL
 * and chat parsers' errors, and the chat templates' exact text and
 * trained parts; and the threaded run over many small batches, whose
 * output must not depend on the thread count. The command end to end,
 * with real tokenizers, is tests/tokenize_test.sh. */
#include "test_util.h"

#include <jansson.h>

#include "tok/chat.h"
#include "tok/docs.h"
#include "token_writer.h"
#include "tok/tokenize.h"

static void write_file(const char *path, const char *s, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(s, 1, len, f), len);
    fclose(f);
}



static int32_t i32_at(const unsigned char *b, size_t i)
{
    return (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
}

/* Names in folder dir other than . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- writer */

static void test_writer_v1_header_and_tokens(void **state)
{
    tdir *t = *state;
    snprintf(t->file, sizeof t->file, "%s/a.bin", t->path);
    char err[512];
    fso_token_writer w;
    int elem;
    fso_tokfile_kind k = fso_tokfile_pick(50257, 0, &elem);
    assert_int_equal(k, FSO_TOKFILE_V1);
    assert_int_equal(elem, 2);
    assert_int_equal(fso_token_writer_open(&w, t->file, k, elem, 50256, err, sizeof err), 0);
    const int32_t ids[] = {50256, 1, 65535, 7};
    assert_int_equal(fso_token_writer_add(&w, ids, NULL, 2, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_add(&w, ids + 2, NULL, 2, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_finish(&w, err, sizeof err), 0);
    size_t len;
    unsigned char *b = fso_test_read_file(t->file, &len);
    assert_int_equal(len, 1024 + 4 * 2);
    assert_int_equal(i32_at(b, 0), FSO_TOKENS_MAGIC);
    assert_int_equal(i32_at(b, 1), 1);
    assert_int_equal(i32_at(b, 2), 4);
    assert_int_equal(i32_at(b, 3), 50257);   /* delimiter + 1 */
    for (int i = 0; i < 4; i++)
        assert_int_equal(b[1024 + 2 * i] | b[1024 + 2 * i + 1] << 8, ids[i]);
    free(b);
    assert_int_equal(count_entries(t->path), 1);   /* no temporary file left */
}

static void test_writer_v7_and_flagged(void **state)
{
    tdir *t = *state;
    char err[512], path[600];
    int elem;
    fso_token_writer w;
    const int32_t ids[] = {128000, 5, 70000};
    const uint8_t flags[] = {FSO_TOKEN_DOC_START, 0, FSO_TOKEN_TARGET};

    fso_tokfile_kind k = fso_tokfile_pick(128256, 0, &elem);
    assert_int_equal(k, FSO_TOKFILE_V7);
    snprintf(path, sizeof path, "%s/v7.bin", t->path);
    assert_int_equal(fso_token_writer_open(&w, path, k, elem, 128000, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_add(&w, ids, NULL, 3, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_finish(&w, err, sizeof err), 0);
    size_t len;
    unsigned char *b = fso_test_read_file(path, &len);
    assert_int_equal(len, 1024 + 12);
    assert_int_equal(i32_at(b, 0), FSO_TOKENS_MAGIC_LLAMA3);
    assert_int_equal(i32_at(b, 1), FSO_TOKENS_LLAMA3_VERSION);
    assert_int_equal(i32_at(b, 2), 3);
    assert_int_equal(i32_at(b, 3), 128001);
    for (int i = 0; i < 3; i++)
        assert_int_equal(i32_at(b, 256 + (size_t)i), ids[i]);
    free(b);

    /* flagged, 4-byte tokens, flags after the tokens, no delimiter */
    k = fso_tokfile_pick(128256, 1, &elem);
    assert_int_equal(k, FSO_TOKFILE_FLAGGED);
    snprintf(path, sizeof path, "%s/f.bin", t->path);
    assert_int_equal(fso_token_writer_open(&w, path, k, elem, -1, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_add(&w, ids, flags, 3, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_finish(&w, err, sizeof err), 0);
    b = fso_test_read_file(path, &len);
    assert_int_equal(len, 1024 + 12 + 3);
    assert_int_equal(i32_at(b, 0), FSO_TOKENS_MAGIC_FLAGGED);
    assert_int_equal(i32_at(b, 1), FSO_TOKENS_FLAGGED_VERSION);
    assert_int_equal(i32_at(b, 2), 3);
    assert_int_equal(i32_at(b, 3), 0);
    assert_int_equal(i32_at(b, 4), 4);
    assert_memory_equal(b + 1024 + 12, flags, 3);
    free(b);

    /* flagged, 2-byte tokens */
    k = fso_tokfile_pick(32000, 1, &elem);
    assert_int_equal(elem, 2);
    snprintf(path, sizeof path, "%s/f2.bin", t->path);
    const int32_t small[] = {1, 2};
    assert_int_equal(fso_token_writer_open(&w, path, k, elem, 1, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_add(&w, small, flags, 2, err, sizeof err), 0);
    assert_int_equal(fso_token_writer_finish(&w, err, sizeof err), 0);
    b = fso_test_read_file(path, &len);
    assert_int_equal(len, 1024 + 4 + 2);
    assert_int_equal(i32_at(b, 3), 2);
    assert_int_equal(i32_at(b, 4), 2);
    assert_memory_equal(b + 1024 + 4, flags, 2);
    free(b);
    assert_int_equal(count_entries(t->path), 3);
}

static void test_writer_failure_leaves_nothing(void **state)
{
    tdir *t = *state;
    char err[512], path[600];
    fso_token_writer w;
    /* a folder that does not exist: named, with the fix */
    snprintf(path, sizeof path, "%s/nope/x.bin", t->path);
    assert_int_equal(fso_token_writer_open(&w, path, FSO_TOKFILE_V1, 2, -1, err, sizeof err),
                     -ENOENT);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "create the folder"));
    /* a token a 2-byte file cannot hold, then abort: nothing left */
    snprintf(path, sizeof path, "%s/x.bin", t->path);
    assert_int_equal(fso_token_writer_open(&w, path, FSO_TOKFILE_V1, 2, -1, err, sizeof err), 0);
    const int32_t big = 65536;
    assert_int_equal(fso_token_writer_add(&w, &big, NULL, 1, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "65536"));
    fso_token_writer_abort(&w);
    fso_token_writer_abort(&w);   /* twice: nothing */
    assert_int_equal(count_entries(t->path), 0);
    /* an existing file stays whole when a rewrite is abandoned */
    write_file(path, "old", 3);
    assert_int_equal(fso_token_writer_open(&w, path, FSO_TOKFILE_FLAGGED, 2, -1, err, sizeof err),
                     0);
    const int32_t one = 1;
    const uint8_t f = 0;
    assert_int_equal(fso_token_writer_add(&w, &one, &f, 1, err, sizeof err), 0);
    fso_token_writer_abort(&w);
    size_t len;
    unsigned char *b = fso_test_read_file(path, &len);
    assert_int_equal(len, 3);
    free(b);
    assert_int_equal(count_entries(t->path), 1);
}

/* ---------------------------------------------------------------- readers */

/* All records of paths as format, max_bytes per batch, as "LINE@BYTE:text|". */
static char *read_all(const char *const *paths, int n, fso_docs_format format, size_t max_bytes,
                      int *batches)
{
    fso_docs_reader r;
    fso_docs_batch b = {0};
    char err[512];
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap);
    assert_non_null(out);
    fso_docs_reader_init(&r, paths, n, format);
    int got;
    *batches = 0;
    while ((got = fso_docs_read(&r, &b, max_bytes, err, sizeof err)) > 0) {
        (*batches)++;
        for (size_t i = 0; i < b.n; i++) {
            const fso_docs_rec *rec = &b.recs[i];
            len += (size_t)snprintf(out + len, cap - len, "%d:%llu@%llu:%.*s|", rec->file,
                                    (unsigned long long)rec->line, (unsigned long long)rec->byte,
                                    (int)rec->len, b.buf + rec->off);
        }
    }
    assert_int_equal(got, 0);
    fso_docs_batch_free(&b);
    fso_docs_reader_free(&r);
    return out;
}

static void test_text_documents_split_at_two_blank_lines(void **state)
{
    tdir *t = *state;
    char a[600], c[600];
    snprintf(a, sizeof a, "%s/a.txt", t->path);
    snprintf(c, sizeof c, "%s/c.txt", t->path);
    /* one blank line stays inside; two or more separate; CRLF blank lines
     * count; leading and trailing separators make no empty document; one
     * trailing blank line belongs to the document */
    const char *text = "\n\n\nA\n\nA2\n\n\nB\r\n\r\n\r\nC\n\n\n\nD\n\n";
    write_file(a, text, strlen(text));
    write_file(c, "E", 1);
    const char *paths[] = {a, c};
    const char *want = "0:4@3:A\n\nA2\n|0:9@11:B\r\n|0:12@18:C\n|0:16@23:D\n\n|1:1@0:E|";
    int batches;
    char *got = read_all(paths, 2, FSO_DOCS_TEXT, 1 << 20, &batches);
    assert_string_equal(got, want);
    assert_int_equal(batches, 1);
    free(got);
    /* one document per batch: the same records */
    got = read_all(paths, 2, FSO_DOCS_TEXT, 1, &batches);
    assert_string_equal(got, want);
    assert_int_equal(batches, 5);
    free(got);
}

static void test_jsonl_records_skip_blank_lines(void **state)
{
    tdir *t = *state;
    snprintf(t->file, sizeof t->file, "%s/a.jsonl", t->path);
    const char *text = "{\"text\": \"a\"}\n\n  \n{\"text\": \"b\"}\r\n{\"text\": \"c\"}";
    write_file(t->file, text, strlen(text));
    const char *paths[] = {t->file};
    int batches;
    char *got = read_all(paths, 1, FSO_DOCS_JSONL, 1 << 20, &batches);
    assert_string_equal(got, "0:1@0:{\"text\": \"a\"}\n|0:4@18:{\"text\": \"b\"}\r\n|"
                             "0:5@33:{\"text\": \"c\"}|");
    free(got);
}

static void test_reader_unreadable_file_is_named(void **state)
{
    tdir *t = *state;
    snprintf(t->file, sizeof t->file, "%s/missing.txt", t->path);
    const char *paths[] = {t->file};
    fso_docs_reader r;
    fso_docs_batch b = {0};
    char err[512];
    fso_docs_reader_init(&r, paths, 1, FSO_DOCS_TEXT);
    assert_int_equal(fso_docs_read(&r, &b, 1 << 20, err, sizeof err), -ENOENT);
    assert_non_null(strstr(err, t->file));
    fso_docs_batch_free(&b);
    fso_docs_reader_free(&r);
}

static void test_utf8_check_matches_python(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t bad;
    } cases[] = {
        {"plain", 5},
        {"caf\xc3\xa9", 5},
        {"\xe2\x82\xac \xf0\x9f\x98\x80", 8},
        {"a\xff", 1},
        {"a\xc0\x80", 1},            /* overlong NUL */
        {"\xe0\x9f\xbf", 0},         /* overlong 3-byte */
        {"x\xed\xa0\x80", 1},        /* a surrogate */
        {"\xf4\x90\x80\x80", 0},     /* above U+10FFFF */
        {"ab\xe2\x82", 2},           /* cut short */
        {"\xef\xbf\xbf", 3},         /* U+FFFF is valid */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(fso_utf8_check(cases[i].s, strlen(cases[i].s)), cases[i].bad);
}

/* The error of parsing s as format (expect rc), with its pieces. */
static void expect_parse_error(fso_docs_format f, const char *s, int want_rc, const char *want1,
                               const char *want2)
{
    fso_doc d;
    char err[1024];
    int rc = fso_doc_parse(&d, f, s, strlen(s), "in.jsonl", 7, 100, err, sizeof err);
    fso_doc_free(&d);
    assert_int_equal(rc, want_rc);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("error \"%s\" lacks \"%s\" or \"%s\"", err, want1, want2 ? want2 : "");
}

static void test_parse_errors_name_line_and_byte(void **state)
{
    (void)state;
    expect_parse_error(FSO_DOCS_TEXT, "ok\nthen \xff here", -EILSEQ, "in.jsonl:8: byte 108:",
                       "invalid UTF-8 (byte 0xff)");
    expect_parse_error(FSO_DOCS_JSONL, "{\"text\": \"\xc3\"}", -EILSEQ, "in.jsonl:7: byte 110:",
                       "iconv");
    expect_parse_error(FSO_DOCS_JSONL, "[1, 2]", -EINVAL, "in.jsonl:7: byte 100:",
                       "an array, not a JSON object");
    expect_parse_error(FSO_DOCS_JSONL, "{\"text\": 3", -EINVAL, "in.jsonl:7:", "not JSON");
    expect_parse_error(FSO_DOCS_JSONL, "{\"txt\": \"a\"}", -EINVAL, "no \"text\" key", NULL);
    expect_parse_error(FSO_DOCS_JSONL, "{\"messages\": []}", -EINVAL, "--format chat", NULL);
    expect_parse_error(FSO_DOCS_CHAT, "{\"text\": \"a\"}", -EINVAL, "no \"messages\" array",
                       "--format jsonl");
    expect_parse_error(FSO_DOCS_CHAT,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                       "{\"role\": \"tool\", \"content\": \"b\"}]}",
                       -EINVAL, "messages[1].role is \"tool\"", "\"assistant\"");
    expect_parse_error(FSO_DOCS_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", -EINVAL,
                       "messages[0] has no \"content\"", NULL);
    expect_parse_error(FSO_DOCS_CHAT, "{\"messages\": [\"hi\"]}", -EINVAL,
                       "messages[0] is a string, not an object", NULL);
    expect_parse_error(FSO_DOCS_CHAT, "{\"prompt\": \"a\"}", -EINVAL,
                       "\"prompt\" and \"completion\"", NULL);
}

static void test_chat_parse_marks_completion_only(void **state)
{
    (void)state;
    fso_doc d;
    char err[512];
    const char *s = "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
                    "\"assistant\", \"content\": \"shown\"}], \"completion\": [{\"role\": "
                    "\"assistant\", \"content\": \"a\"}]}";
    assert_int_equal(fso_doc_parse(&d, FSO_DOCS_CHAT, s, strlen(s), "x", 1, 0, err, sizeof err), 0);
    assert_int_equal(d.chat.n, 3);
    assert_false(d.chat.msgs[1].trained);
    assert_true(d.chat.msgs[2].trained);
    fso_doc_free(&d);
    s = "{\"prompt\": \"Q: \", \"completion\": \"A\"}";
    assert_int_equal(fso_doc_parse(&d, FSO_DOCS_CHAT, s, strlen(s), "x", 1, 0, err, sizeof err), 0);
    assert_true(d.chat.pair);
    assert_int_equal(d.chat.prompt_len, 3);
    fso_doc_free(&d);
}

static void test_format_detection(void **state)
{
    tdir *t = *state;
    char why[256], err[512], path[600];
    fso_docs_format f;
    snprintf(path, sizeof path, "%s/a.txt", t->path);
    write_file(path, "{\"text\": 1}\n", 12);
    assert_int_equal(fso_docs_detect(path, &f, why, sizeof why, err, sizeof err), 0);
    assert_int_equal(f, FSO_DOCS_TEXT);
    snprintf(path, sizeof path, "%s/a.jsonl", t->path);
    write_file(path, "\n{\"text\": \"x\"}\n", 15);
    assert_int_equal(fso_docs_detect(path, &f, why, sizeof why, err, sizeof err), 0);
    assert_int_equal(f, FSO_DOCS_JSONL);
    assert_non_null(strstr(why, "line 2"));
    write_file(path, "{\"messages\": []}\n", 17);
    assert_int_equal(fso_docs_detect(path, &f, why, sizeof why, err, sizeof err), 0);
    assert_int_equal(f, FSO_DOCS_CHAT);
    write_file(path, "{\"x\": 1}\n", 9);
    assert_int_equal(fso_docs_detect(path, &f, why, sizeof why, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "--format"));
}

/* ---------------------------------------------------------------- chat templates */

static fso_chat sample_chat(void)
{
    fso_chat c = {0};
    fso_chat_push(&c, FSO_ROLE_SYSTEM, "You are terse. ", 15, 0);
    fso_chat_push(&c, FSO_ROLE_USER, " Hi ", 4, 0);
    fso_chat_push(&c, FSO_ROLE_ASSISTANT, "Hello!\n", 7, 1);
    fso_chat_push(&c, FSO_ROLE_USER, "Again", 5, 0);
    fso_chat_push(&c, FSO_ROLE_ASSISTANT, "Sure", 4, 1);
    return c;
}

static void expect_render(const fso_chat_template *ct, const fso_chat *c, const char *want,
                          const char *want_trained)
{
    fso_chat_render r = {0};
    char err[512];
    assert_int_equal(fso_chat_render_conv(ct, c, &r, err, sizeof err), 0);
    char *s = fso_chat_render_string(ct, &r, 0), *tr = fso_chat_render_string(ct, &r, 1);
    assert_string_equal(s, want);
    assert_string_equal(tr, want_trained);
    free(s);
    free(tr);
    fso_chat_render_free(&r);
}

static void test_llama3_template_text(void **state)
{
    (void)state;
    fso_chat c = sample_chat();
    fso_chat_template ct = {.kind = FSO_CHAT_LLAMA3, .ids = {128000, 128006, 128007, 128009}};
    expect_render(&ct, &c,
                  "<|begin_of_text|>"
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nSure<|eot_id|>",
                  "Hello!<|eot_id|>Sure<|eot_id|>");
    ct.dated = 1;
    expect_render(&ct, &c,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                  "You are terse.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nSure<|eot_id|>",
                  "Hello!<|eot_id|>Sure<|eot_id|>");
    /* no system message: the dated block is there, empty */
    fso_chat u = {0};
    fso_chat_push(&u, FSO_ROLE_USER, "q", 1, 0);
    fso_chat_push(&u, FSO_ROLE_ASSISTANT, " \t", 2, 1);
    expect_render(&ct, &u,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>",
                  "<|eot_id|>");
    fso_chat_free(&u);
    fso_chat_free(&c);
}

static void test_chatml_template_text(void **state)
{
    (void)state;
    fso_chat c = sample_chat();
    fso_chat_template ct = {.kind = FSO_CHAT_CHATML, .ids = {151644, 151645}};
    expect_render(&ct, &c,
                  "<|im_start|>system\nYou are terse. <|im_end|>\n"
                  "<|im_start|>user\n Hi <|im_end|>\n"
                  "<|im_start|>assistant\nHello!\n<|im_end|>\n"
                  "<|im_start|>user\nAgain<|im_end|>\n"
                  "<|im_start|>assistant\nSure<|im_end|>\n",
                  "Hello!\n<|im_end|>Sure<|im_end|>");
    /* the default system message when the conversation has none */
    ct.default_system = strdup("You are a helpful assistant.");
    fso_chat u = {0};
    fso_chat_push(&u, FSO_ROLE_USER, "q", 1, 0);
    fso_chat_push(&u, FSO_ROLE_ASSISTANT, "a", 1, 1);
    expect_render(&ct, &u,
                  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n",
                  "a<|im_end|>");
    fso_chat_free(&u);
    fso_chat_template_free(&ct);
    fso_chat_free(&c);
}

static void test_inst_template_text(void **state)
{
    (void)state;
    fso_chat c = sample_chat();
    fso_chat_template ct = {.kind = FSO_CHAT_INST, .ids = {1, 2}};
    expect_render(&ct, &c,
                  "<s>[INST] <<SYS>>\nYou are terse. \n<</SYS>>\n\n Hi [/INST] Hello! </s>"
                  "<s>[INST] Again [/INST] Sure </s>",
                  " Hello! </s> Sure </s>");
    /* roles out of turn: refused, naming the message */
    fso_chat bad = {0};
    fso_chat_push(&bad, FSO_ROLE_USER, "a", 1, 0);
    fso_chat_push(&bad, FSO_ROLE_USER, "b", 1, 0);
    fso_chat_render r = {0};
    char err[512];
    assert_int_equal(fso_chat_render_conv(&ct, &bad, &r, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "messages[1] is a user message"));
    fso_chat_render_free(&r);
    fso_chat_free(&bad);
    fso_chat_free(&c);
}

static void test_pieces_mark_trained_spans(void **state)
{
    (void)state;
    fso_chat c = {0};
    fso_chat_push(&c, FSO_ROLE_USER, "q", 1, 0);
    fso_chat_push(&c, FSO_ROLE_ASSISTANT, "a", 1, 1);
    fso_chat_template ct = {.kind = FSO_CHAT_CHATML, .ids = {10, 11}};
    fso_chat_render r = {0};
    char err[256];
    assert_int_equal(fso_chat_render_conv(&ct, &c, &r, err, sizeof err), 0);
    /* <|im_start|> "user\nq" <|im_end|> "\n" <|im_start|> "assistant\na" <|im_end|> "\n" */
    assert_int_equal(r.n, 8);
    assert_int_equal(r.p[0].special, 10);
    assert_int_equal(r.p[1].special, -1);
    assert_int_equal(r.p[1].target_from, r.p[1].len);   /* nothing trained */
    assert_int_equal(r.p[5].len, strlen("assistant\na"));
    assert_int_equal(r.p[5].target_from, strlen("assistant\n"));
    assert_int_equal(r.p[6].special, 11);
    assert_true(r.p[6].trained);
    assert_false(r.p[2].trained);
    /* a prompt-completion pair: BOS, the text with the completion trained, EOS trained */
    fso_chat pair = {.pair = 1, .prompt = "Q ", .prompt_len = 2, .completion = "A",
                     .completion_len = 1};
    assert_int_equal(fso_chat_render_pair(&pair, 1, 2, &r), 0);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.p[1].target_from, 2);
    assert_true(r.p[2].trained);
    fso_chat_render_free(&r);
    fso_chat_free(&c);
}

/* ---------------------------------------------------------------- the run */

static void test_run_is_the_same_for_every_thread_count(void **state)
{
    tdir *t = *state;
    const char *src = getenv("FSO_SRCDIR");
    if (!src)
        skip();
    char tok[600], in[600], out[600], err[FSO_TOKENIZE_ERR_MAX];
    snprintf(tok, sizeof tok, "%s/tests/fixtures/tokenize/chatml", src);
    snprintf(in, sizeof in, "%s/in.jsonl", t->path);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (int i = 0; i < 600; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"question %d\"}, "
                   "{\"role\": \"assistant\", \"content\": \"answer %d\"}]}\n", i, i * 7);
    fclose(f);
    const char *inputs[] = {in};
    size_t ref_len = 0;
    unsigned char *want = NULL;
    for (int threads = 1; threads <= 4; threads++) {
        snprintf(out, sizeof out, "%s/out%d.bin", t->path, threads);
        fso_tokenize_opts o = {.tokenizer_dir = tok, .inputs = inputs, .n_inputs = 1,
                               .format = -1, .template_kind = -1, .out_path = out,
                               .val_fraction = 0.25, .threads = threads, .batch_bytes = 2000};
        fso_tokenize_result res;
        if (fso_tokenize_run(&o, &res, err, sizeof err) != 0)
            fail_msg("%d threads: %s", threads, err);
        assert_int_equal(res.done.train.docs, 450);
        assert_int_equal(res.done.val.docs, 150);
        assert_true(res.done.train.targets > 0 && res.done.train.targets < res.done.train.tokens);
        size_t len;
        unsigned char *got = fso_test_read_file(out, &len);
        if (!want) {
            want = got;
            ref_len = len;
        } else {
            assert_int_equal(len, ref_len);
            assert_memory_equal(got, want, len);
            free(got);
        }
    }
    free(want);
    /* a bad line in a late batch: the error names it, nothing is left */
    f = fopen(in, "a");
    fprintf(f, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n");
    fclose(f);
    snprintf(out, sizeof out, "%s/bad.bin", t->path);
    fso_tokenize_opts o = {.tokenizer_dir = tok, .inputs = inputs, .n_inputs = 1, .format = -1,
                           .template_kind = -1, .out_path = out, .threads = 3,
                           .batch_bytes = 2000};
    fso_tokenize_result res;
    assert_int_equal(fso_tokenize_run(&o, &res, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, ":601: byte"));
    assert_non_null(strstr(err, "\"robot\""));
    assert_int_equal(access(out, F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_writer_v1_header_and_tokens, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_v7_and_flagged, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_failure_leaves_nothing, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_text_documents_split_at_two_blank_lines, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_jsonl_records_skip_blank_lines, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_reader_unreadable_file_is_named, setup_dir,
                                        teardown_dir),
        cmocka_unit_test(test_utf8_check_matches_python),
        cmocka_unit_test(test_parse_errors_name_line_and_byte),
        cmocka_unit_test(test_chat_parse_marks_completion_only),
        cmocka_unit_test_setup_teardown(test_format_detection, setup_dir, teardown_dir),
        cmocka_unit_test(test_llama3_template_text),
        cmocka_unit_test(test_chatml_template_text),
        cmocka_unit_test(test_inst_template_text),
        cmocka_unit_test(test_pieces_mark_trained_spans),
        cmocka_unit_test_setup_teardown(test_run_is_the_same_for_every_thread_count, setup_dir,
                                        teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
