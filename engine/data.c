/* data.c — loading training tokens and cutting them into micro-batches.
 *
 * Sources (data.h has the formats): an llm.c token file (v1 uint16, v2 and
 * llm.c's Llama 3 v7 uint32), fsoff's flagged token file, plain text read
 * one byte per token, or the built-in corpus from corpus.c. Everything ends
 * up as int32 tokens in memory, and, when the file has loss masks or
 * documents, one FSO_TOKEN_* byte per token (d->flags; NULL otherwise, and
 * then batches are cut exactly as before masks existed). Every check that
 * can fail on a user's file (header, size, token range, flags, delimiter,
 * length) happens here once, so fso_data_next() never fails.
 *
 * Files are read with plain read(2) in chunks, never mmap'd: a file truncated
 * while we read it shows up as a short read and a clear error, not SIGBUS.
 * fso_data_write_tokens() and fso_data_write_flagged() write through the one
 * token file writer (token_writer.h): a failed write leaves no partial file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "token_writer.h"
#include "util.h"

#define HEADER_BYTES ((size_t)FSO_TOKENS_HEADER_INTS * 4)
#define CHUNK_BYTES ((size_t)1 << 20)   /* staging buffer for reads and writes */

__attribute__((format(printf, 2, 3)))
static void data_err(fso_data *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof(d->err), fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 2, 3)))
static void data_desc(fso_data *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->desc, sizeof(d->desc), fmt, ap);
    va_end(ap);
}

static const char *errno_str(int err, char *buf, size_t n)
{
    return strerror_r(err, buf, n);   /* GNU variant (_GNU_SOURCE) */
}

static uint32_t get_u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int err_read(fso_data *d, const char *path, ssize_t rc)
{
    char eb[128];
    data_err(d, "%s: read failed: %s; check that the file is readable", path,
             errno_str((int)-rc, eb, sizeof(eb)));
    return (int)rc;
}

static int err_short(fso_data *d, const char *path, size_t n_tokens, int T)
{
    data_err(d, "%s: has %zu tokens, fewer than data.seq_len + 1 = %d; give a longer "
             "file or lower data.seq_len", path, n_tokens, T + 1);
    return -EINVAL;
}

/* ---- token files ---------------------------------------------------------- */

/* What a token file's header says (check_token_header). */
typedef struct token_header {
    uint32_t magic;
    int32_t version;
    size_t elem_bytes;        /* 2 or 4 */
    uint64_t n_tokens;
    bool flagged;             /* n flag bytes follow the tokens */
    uint32_t delim_note;      /* header[3]: the delimiter + 1, or 0 */
} token_header;

static bool token_magic(uint32_t magic)
{
    return magic == FSO_TOKENS_MAGIC || magic == FSO_TOKENS_MAGIC_LLAMA3 ||
           magic == FSO_TOKENS_MAGIC_FLAGGED;
}

/* Check a token file's header against the file's size and the config; on
 * success *th holds what it says. */
static int check_token_header(fso_data *d, const fso_config *cfg, const char *path,
                              const unsigned char *hdr, size_t hdr_bytes,
                              const struct stat *st, token_header *th)
{
    const uint32_t magic = hdr_bytes >= 4 ? get_u32le(hdr) : 0;
    if (hdr_bytes >= 4 && !token_magic(magic)) {
        data_err(d, "%s: not a token file (magic %d; token files have %d, %d for llm.c's "
                 "Llama 3 files or %d for fsoff's flagged files); re-create it as a token "
                 "file, or if it is plain text, set data.format=text", path, (int32_t)magic,
                 FSO_TOKENS_MAGIC, FSO_TOKENS_MAGIC_LLAMA3, FSO_TOKENS_MAGIC_FLAGGED);
        return -EINVAL;
    }
    if (hdr_bytes < HEADER_BYTES) {
        data_err(d, "%s: truncated header: the file holds %zu bytes, fewer than the "
                 "%zu-byte token file header; re-create the file", path, hdr_bytes,
                 HEADER_BYTES);
        return -EINVAL;
    }
    int32_t version = (int32_t)get_u32le(hdr + 4);
    if (magic == FSO_TOKENS_MAGIC_LLAMA3 && version != FSO_TOKENS_LLAMA3_VERSION) {
        data_err(d, "%s: llm.c Llama 3 token file of version %d; fsoff reads version %d "
                 "(uint32 tokens): re-create the file with llm.c's current scripts", path,
                 version, FSO_TOKENS_LLAMA3_VERSION);
        return -EINVAL;
    }
    if (magic == FSO_TOKENS_MAGIC && version != 1 && version != 2) {
        data_err(d, "%s: unsupported token file version %d (1 = uint16 tokens, 2 = uint32 "
                 "tokens); re-create the file with fsoff or llm.c", path, version);
        return -EINVAL;
    }
    const bool flagged = magic == FSO_TOKENS_MAGIC_FLAGGED;
    if (flagged && version != FSO_TOKENS_FLAGGED_VERSION) {
        data_err(d, "%s: flagged token file of version %d; this fsoff reads version %d: "
                 "re-create the file with this fsoff (fsoff tokenize)", path, version,
                 FSO_TOKENS_FLAGGED_VERSION);
        return -EINVAL;
    }
    const uint32_t width = get_u32le(hdr + 16);
    if (flagged && width != 2 && width != 4) {
        data_err(d, "%s: flagged token file with %u bytes per token (header[4]); it must be "
                 "2 or 4: re-create the file", path, width);
        return -EINVAL;
    }
    const size_t elem_bytes = flagged ? width : version == 1 ? 2 : 4;
    const uint64_t n_tokens = get_u32le(hdr + 8);
    const uint64_t token_bytes = n_tokens * elem_bytes;
    const uint64_t want_bytes = token_bytes + (flagged ? n_tokens : 0);
    const uint32_t delim_note = get_u32le(hdr + 12);

    if (S_ISREG(st->st_mode)) {
        uint64_t have = (uint64_t)st->st_size > HEADER_BYTES
                            ? (uint64_t)st->st_size - HEADER_BYTES : 0;
        if (have != want_bytes && flagged) {
            data_err(d, "%s: %s: header says %llu tokens (%llu bytes) and as many flag bytes, "
                     "%llu bytes in all, but the file holds %llu bytes after the header%s; "
                     "re-create the file", path,
                     have < want_bytes ? "truncated" : "too long",
                     (unsigned long long)n_tokens, (unsigned long long)token_bytes,
                     (unsigned long long)want_bytes, (unsigned long long)have,
                     have >= token_bytes && have < want_bytes ? " (the flags are cut short)"
                                                              : "");
            return -EINVAL;
        }
        if (have != want_bytes) {
            data_err(d, "%s: %s: header says %llu tokens (%llu bytes) but the file holds "
                     "%llu bytes of tokens; re-create the file", path,
                     have < want_bytes ? "truncated" : "too long",
                     (unsigned long long)n_tokens, (unsigned long long)want_bytes,
                     (unsigned long long)have);
            return -EINVAL;
        }
    }
    if (delim_note != 0 && (cfg->model.vocab_size <= 0 ||
                            delim_note - 1 >= (uint32_t)cfg->model.vocab_size)) {
        data_err(d, "%s: the header names token %u as the document delimiter (header[3] = "
                 "%u), but model.vocab_size is %d; give the model the file's tokenizer's "
                 "vocabulary, or re-create the file", path, delim_note - 1, delim_note,
                 cfg->model.vocab_size);
        return -EINVAL;
    }
    if (n_tokens < (uint64_t)cfg->data.seq_len + 1)
        return err_short(d, path, (size_t)n_tokens, cfg->data.seq_len);
    if (n_tokens > SIZE_MAX / sizeof(int32_t)) {
        data_err(d, "%s: %llu tokens do not fit in this process's address space", path,
                 (unsigned long long)n_tokens);
        return -ENOMEM;
    }
    *th = (token_header){.magic = magic, .version = version, .elem_bytes = elem_bytes,
                         .n_tokens = n_tokens, .flagged = flagged, .delim_note = delim_note};
    return 0;
}

/* The error for a token outside the vocabulary, read once the whole file is
 * read: it names the vocabulary the file needs and a tokenizer that has it. */
static int err_vocab(fso_data *d, const char *path, uint32_t bad_token, size_t bad_idx,
                     int vocab, uint32_t max_token)
{
    const uint64_t need = (uint64_t)max_token + 1;
    static const struct {
        uint64_t size;
        const char *name;
    } tokenizers[] = {{32000, "Llama 2"}, {50257, "GPT-2"}, {128256, "Llama 3"}};
    char hint[160];
    snprintf(hint, sizeof hint, "--set model.vocab_size=%llu", (unsigned long long)need);
    for (size_t i = 0; i < sizeof tokenizers / sizeof tokenizers[0]; i++)
        if (tokenizers[i].size >= need) {
            snprintf(hint, sizeof hint, "for %s tokens, --set model.vocab_size=%llu",
                     tokenizers[i].name, (unsigned long long)tokenizers[i].size);
            break;
        }
    data_err(d, "%s: token %u at index %zu is >= model.vocab_size (%d); the file's "
             "largest token is %u, so the model needs a vocabulary of at least %llu: %s "
             "(the tokenizer's vocabulary size)", path, bad_token, bad_idx, vocab,
             max_token, (unsigned long long)need, hint);
    return -EINVAL;
}

/* Read the n flag bytes of a flagged file into d->flags, refusing bits
 * fsoff does not know. */
static int read_flags(fso_data *d, int fd, const char *path, const token_header *th,
                      unsigned char *stage)
{
    const uint8_t known = FSO_TOKEN_TARGET | FSO_TOKEN_DOC_START;
    const size_t n = (size_t)th->n_tokens;
    d->flags = malloc(n ? n : 1);
    if (!d->flags) {
        data_err(d, "%s: cannot allocate %zu bytes for the token flags; use a smaller file",
                 path, n);
        return -ENOMEM;
    }
    for (size_t done = 0; done < n;) {
        size_t want = n - done < CHUNK_BYTES ? n - done : CHUNK_BYTES;
        ssize_t got = fso_read_full(fd, stage, want);
        if (got < 0)
            return err_read(d, path, got);
        for (size_t i = 0; i < (size_t)got; i++) {
            if (stage[i] & ~known) {
                data_err(d, "%s: token %zu has flags 0x%02x, with bits fsoff does not know "
                         "(it knows 0x%02x target, 0x%02x document start); re-create the "
                         "file with this fsoff (fsoff tokenize)", path, done + i, stage[i],
                         FSO_TOKEN_TARGET, FSO_TOKEN_DOC_START);
                return -EINVAL;
            }
            d->flags[done + i] = stage[i];
        }
        done += (size_t)got;
        if ((size_t)got < want) {
            data_err(d, "%s: truncated: header says %zu tokens, but the file ends after %zu "
                     "of their flag bytes; re-create the file", path, n, done);
            return -EINVAL;
        }
    }
    return 0;
}

/* The documents and masks of a loaded token file: DOC_START at the
 * delimiter tokens the header names, every token a target when the file
 * has no flags; the document starts dropped under data.documents "stream".
 * Then d->flags is freed when it says nothing (every token a target, no
 * document starting after the first token): such a file trains as one
 * stream, on the code path of files without flags. */
static int settle_documents(fso_data *d, const fso_config *cfg, const char *path,
                            const token_header *th)
{
    const size_t n = d->n_tokens;
    const bool stream = cfg->data.documents == FSO_DATA_DOCS_STREAM;
    if (th->delim_note && !stream) {
        const int32_t delim = (int32_t)(th->delim_note - 1);
        if (!d->flags) {
            d->flags = malloc(n);
            if (!d->flags) {
                data_err(d, "%s: cannot allocate %zu bytes for the document starts; use a "
                         "smaller file", path, n);
                return -ENOMEM;
            }
            memset(d->flags, FSO_TOKEN_TARGET, n);
        }
        for (size_t i = 0; i < n; i++)
            if (d->tokens[i] == delim)
                d->flags[i] |= FSO_TOKEN_DOC_START;
    }
    if (!d->flags)
        return 0;
    size_t targets = 0, docs = 0;
    for (size_t i = 0; i < n; i++) {
        if (stream)
            d->flags[i] &= (uint8_t)~FSO_TOKEN_DOC_START;
        if (i == 0) /* a document starting at the first token changes nothing */
            continue;
        targets += (d->flags[i] & FSO_TOKEN_TARGET) && !(d->flags[i] & FSO_TOKEN_DOC_START);
        docs += (d->flags[i] & FSO_TOKEN_DOC_START) != 0;
    }
    if (targets == 0) {
        data_err(d, "%s: no token of the file is a target (every one is masked%s), so "
                 "training on it learns nothing; re-create it with the tokens to learn "
                 "flagged as targets", path,
                 docs ? ", or starts a document" : "");
        return -EINVAL;
    }
    d->n_targets = targets;
    d->n_docs = docs + 1;
    d->documents = docs > 0;
    if (!d->documents && targets == n - 1) { /* nothing to say: the plain path */
        free(d->flags);
        d->flags = NULL;
    }
    return 0;
}

static int load_token_file(fso_data *d, const fso_config *cfg, int fd, const char *path,
                           const unsigned char *hdr, size_t hdr_bytes, const struct stat *st)
{
    const int vocab = cfg->model.vocab_size;
    unsigned char *stage = NULL;
    token_header th;
    int rc = check_token_header(d, cfg, path, hdr, hdr_bytes, st, &th);
    if (rc)
        return rc;
    const uint64_t n_tokens = th.n_tokens;
    const size_t elem_bytes = th.elem_bytes;
    const uint64_t want_bytes = n_tokens * elem_bytes;

    d->tokens = malloc((size_t)n_tokens * sizeof(int32_t));
    stage = malloc(CHUNK_BYTES);
    if (!d->tokens || !stage) {
        data_err(d, "%s: cannot allocate %llu bytes for %llu tokens; use a smaller file",
                 path, (unsigned long long)(n_tokens * sizeof(int32_t)),
                 (unsigned long long)n_tokens);
        rc = -ENOMEM;
        goto out;
    }

    uint64_t done_bytes = 0;
    size_t idx = 0, bad_idx = 0;
    uint32_t max_token = 0, bad_token = 0;
    bool bad = false;
    while (done_bytes < want_bytes) {
        size_t want = (size_t)(want_bytes - done_bytes < CHUNK_BYTES ? want_bytes - done_bytes
                                                                     : CHUNK_BYTES);
        ssize_t got = fso_read_full(fd, stage, want);
        if (got < 0) {
            rc = err_read(d, path, got);
            goto out;
        }
        done_bytes += (uint64_t)got;
        if ((size_t)got < want) {   /* the file shrank after fstat, or is a pipe */
            data_err(d, "%s: truncated: header says %llu tokens (%llu bytes) but the file "
                     "holds %llu bytes of tokens; re-create the file", path,
                     (unsigned long long)n_tokens, (unsigned long long)want_bytes,
                     (unsigned long long)done_bytes);
            rc = -EINVAL;
            goto out;
        }
        for (size_t off = 0; off < want; off += elem_bytes, idx++) {
            uint32_t v = elem_bytes == 2 ? (uint32_t)stage[off] | (uint32_t)stage[off + 1] << 8
                                         : get_u32le(stage + off);
            if ((vocab <= 0 || v >= (uint32_t)vocab) && !bad) {
                bad = true;
                bad_token = v;
                bad_idx = idx;
            }
            if (v > max_token)
                max_token = v;
            d->tokens[idx] = (int32_t)v;
        }
    }
    if (bad) { /* the whole file read: the vocabulary it needs */
        rc = err_vocab(d, path, bad_token, bad_idx, vocab, max_token);
        goto out;
    }
    if (th.flagged && (rc = read_flags(d, fd, path, &th, stage)) < 0)
        goto out;
    /* Anything after the tokens (a file that grew, or a pipe) is an error too. */
    ssize_t extra = fso_read_full(fd, stage, CHUNK_BYTES);
    if (extra < 0) {
        rc = err_read(d, path, extra);
        goto out;
    }
    if (extra > 0) {
        data_err(d, "%s: too long: header says %llu tokens (%llu bytes%s) but the file holds "
                 "more bytes; re-create the file", path, (unsigned long long)n_tokens,
                 (unsigned long long)want_bytes, th.flagged ? " and as many flag bytes" : "");
        rc = -EINVAL;
        goto out;
    }
    d->n_tokens = (size_t)n_tokens;
    if ((rc = settle_documents(d, cfg, path, &th)) < 0)
        goto out;
    char what[96] = "";
    if (d->documents || d->flags)
        snprintf(what, sizeof what, ", %zu documents, %zu targets", d->n_docs, d->n_targets);
    if (th.flagged)
        data_desc(d, "%s (flagged tokens, %zu tokens%s)", path, d->n_tokens, what);
    else if (th.version == FSO_TOKENS_LLAMA3_VERSION)
        data_desc(d, "%s (llm.c Llama 3 tokens, %zu tokens%s)", path, d->n_tokens, what);
    else
        data_desc(d, "%s (tokens v%d, %zu tokens%s)", path, th.version, d->n_tokens, what);
out:
    free(stage);
    return rc;
}

/* ---- plain text ----------------------------------------------------------- */

static int append_bytes(fso_data *d, size_t *cap, const unsigned char *p, size_t n)
{
    if (d->n_tokens + n > *cap) {
        size_t new_cap = *cap;
        while (new_cap < d->n_tokens + n)
            new_cap *= 2;
        int32_t *t = realloc(d->tokens, new_cap * sizeof(int32_t));
        if (!t)
            return -ENOMEM;
        d->tokens = t;
        *cap = new_cap;
    }
    for (size_t i = 0; i < n; i++)
        d->tokens[d->n_tokens + i] = p[i];
    d->n_tokens += n;
    return 0;
}

/* Text read one byte per token (a file, or the built-in corpus: `what`)
 * for a model from --init-from whose vocabulary is not bytes: -EINVAL with
 * the fix in d's error, unless data.format "bytes" asks for it. */
static int refuse_bytes_for_pretrained(fso_data *d, const fso_config *cfg, const char *what)
{
    if (!cfg->init_from[0] || cfg->model.vocab_size <= 256 || cfg->data.format == FSO_DATA_BYTES)
        return 0;
    data_err(d, "%s: text is read one byte per token, but the model from %s has a %d-token "
             "vocabulary whose ids are not bytes; tokenize the text with the model's tokenizer "
             "into a token file and give that as data.path (see docs/configuration.md, Data), "
             "or set data.format=bytes to train on its bytes anyway", what, cfg->init_from,
             cfg->model.vocab_size);
    return -EINVAL;
}

static int load_text_file(fso_data *d, const fso_config *cfg, int fd, const char *path,
                          const unsigned char *hdr, size_t hdr_bytes, const struct stat *st)
{
    unsigned char *stage = NULL;
    size_t cap = 0;
    int rc;

    if (cfg->model.vocab_size < 256) {
        data_err(d, "%s: plain text is read one byte per token and needs model.vocab_size "
                 ">= 256 (it is %d); raise model.vocab_size or give a token file", path,
                 cfg->model.vocab_size);
        return -EINVAL;
    }
    if (refuse_bytes_for_pretrained(d, cfg, path) < 0)
        return -EINVAL;
    /* A regular file's size is known: +1 so that the end-of-file read fits. */
    cap = S_ISREG(st->st_mode) ? (size_t)st->st_size + 1 : CHUNK_BYTES;
    d->tokens = malloc(cap * sizeof(int32_t));
    stage = malloc(CHUNK_BYTES);
    rc = d->tokens && stage ? append_bytes(d, &cap, hdr, hdr_bytes) : -ENOMEM;
    while (rc == 0) {
        ssize_t got = fso_read_full(fd, stage, CHUNK_BYTES);
        if (got < 0) {
            rc = err_read(d, path, got);
            goto out;
        }
        if (got == 0)
            break;
        rc = append_bytes(d, &cap, stage, (size_t)got);
    }
    if (rc == -ENOMEM) {
        data_err(d, "%s: cannot allocate memory for %zu+ tokens (4 bytes each); use a "
                 "smaller file or a token file", path, d->n_tokens);
        goto out;
    }
    if (d->n_tokens == 0) {
        data_err(d, "%s: the text file is empty; give a file with at least data.seq_len + 1 "
                 "= %d bytes", path, cfg->data.seq_len + 1);
        rc = -EINVAL;
        goto out;
    }
    if (d->n_tokens < (size_t)cfg->data.seq_len + 1) {
        rc = err_short(d, path, d->n_tokens, cfg->data.seq_len);
        goto out;
    }
    data_desc(d, "%s (text, %zu bytes, byte-level)", path, d->n_tokens);
out:
    free(stage);
    return rc;
}

/* ---- the built-in corpus -------------------------------------------------- */

static int load_builtin(fso_data *d, const fso_config *cfg)
{
    const size_t n = FSO_CORPUS_BYTES;

    if (cfg->data.format == FSO_DATA_TOKENS) {
        data_err(d, "built-in corpus: data.format is \"tokens\" but data.path is empty; set "
                 "data.path to a token file, or data.format to \"auto\"");
        return -EINVAL;
    }
    if (refuse_bytes_for_pretrained(d, cfg, "built-in corpus (no data.path)") < 0)
        return -EINVAL;
    if (cfg->model.vocab_size < 256) {
        data_err(d, "built-in corpus: the text is read one byte per token and needs "
                 "model.vocab_size >= 256 (it is %d); raise model.vocab_size or set "
                 "data.path to a token file", cfg->model.vocab_size);
        return -EINVAL;
    }
    char *text = malloc(n);
    d->tokens = malloc(n * sizeof(int32_t));
    if (!text || !d->tokens) {
        free(text);
        data_err(d, "built-in corpus: cannot allocate %zu bytes", n * 5);
        return -ENOMEM;
    }
    fso_corpus_generate(text, n, FSO_CORPUS_SEED);
    for (size_t i = 0; i < n; i++)
        d->tokens[i] = (unsigned char)text[i];
    free(text);
    d->n_tokens = n;
    if (d->n_tokens < (size_t)cfg->data.seq_len + 1)
        return err_short(d, "built-in corpus", d->n_tokens, cfg->data.seq_len);
    data_desc(d, "built-in corpus (%zu bytes, byte-level)", n);
    return 0;
}

/* ---- public --------------------------------------------------------------- */

/* Whether path's name ends in ".bin" (any case): under data.format auto such
 * a file must be a token file; it is never read as text. */
static bool named_bin(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && strcasecmp(path + n - 4, ".bin") == 0;
}

int fso_data_init(fso_data *data, const fso_config *cfg)
{
    const char *path = cfg->data.path;
    unsigned char hdr[HEADER_BYTES];
    struct stat st;
    int fd = -1, rc;
    char eb[128];

    memset(data, 0, sizeof(*data));
    data->B = cfg->micro_batch;
    data->T = cfg->data.seq_len;
    if (data->B < 1 || data->T < 1) {
        data_err(data, "data: train_micro_batch_size_per_gpu is %d and data.seq_len is %d; "
                 "both must be >= 1", data->B, data->T);
        return -EINVAL;
    }

    if (path[0] == '\0') {
        rc = load_builtin(data, cfg);
        goto out;
    }

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        data_err(data, "%s: cannot open: %s; check data.path", path,
                 errno_str(-rc, eb, sizeof(eb)));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        data_err(data, "%s: cannot stat: %s; check data.path", path,
                 errno_str(-rc, eb, sizeof(eb)));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        data_err(data, "%s: is a directory; data.path must name a token file or a text file",
                 path);
        rc = -EISDIR;
        goto out;
    }

    ssize_t got = fso_read_full(fd, hdr, sizeof(hdr));
    if (got < 0) {
        rc = err_read(data, path, got);
        goto out;
    }
    size_t hdr_bytes = (size_t)got;
    int is_tokens;
    switch (cfg->data.format) {
    case FSO_DATA_TOKENS:
        is_tokens = 1;
        break;
    case FSO_DATA_TEXT:
    case FSO_DATA_BYTES:
        is_tokens = 0;
        break;
    default: /* auto: a whole header with the magic, or a name that says token file */
        is_tokens = (hdr_bytes == HEADER_BYTES && token_magic(get_u32le(hdr))) || named_bin(path);
        break;
    }
    if (is_tokens)
        rc = load_token_file(data, cfg, fd, path, hdr, hdr_bytes, &st);
    else
        rc = load_text_file(data, cfg, fd, path, hdr, hdr_bytes, &st);

out:
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        free(data->tokens);
        free(data->flags);
        data->tokens = NULL;
        data->flags = NULL;
        data->n_tokens = 0;
        data->documents = false;
        data->desc[0] = '\0';
    }
    return rc;
}

void fso_data_free(fso_data *data)
{
    if (!data)
        return;
    free(data->tokens);
    free(data->flags);
    data->tokens = NULL;
    data->flags = NULL;
    data->n_tokens = 0;
    data->documents = false;
    data->pos = 0;
}

bool fso_data_documents(const fso_data *data)
{
    return data->documents;
}

/* Row b's window at start: targets masked by the flags, and positions. */
static size_t cut_row(const fso_data *d, size_t start, int32_t *in, int32_t *tg, int32_t *pos)
{
    const size_t T = (size_t)d->T;
    const int32_t *row = d->tokens + start;
    memcpy(in, row, T * sizeof(int32_t));
    if (!d->flags) {
        memcpy(tg, row + 1, T * sizeof(int32_t));
        return T;
    }
    const uint8_t *f = d->flags + start;
    size_t counted = 0;
    for (size_t t = 0; t < T; t++) {
        const bool counts = (f[t + 1] & FSO_TOKEN_TARGET) && !(f[t + 1] & FSO_TOKEN_DOC_START);
        tg[t] = counts ? row[t + 1] : -1;
        counted += counts;
    }
    if (pos && d->documents) {
        pos[0] = 0; /* a window starts a document's visible part */
        for (size_t t = 1; t < T; t++)
            pos[t] = (f[t] & FSO_TOKEN_DOC_START) ? 0 : pos[t - 1] + 1;
    }
    return counted;
}

size_t fso_data_next(fso_data *data, int32_t *inputs, int32_t *targets, int32_t *pos)
{
    FSO_BUG_ON(!data->tokens || data->B < 1 || data->T < 1,
               "a batch of %d x %d asked with %s", data->B, data->T,
               data->tokens ? "tokens loaded" : "no tokens loaded");
    const size_t B = (size_t)data->B, T = (size_t)data->T, n = data->n_tokens;
    const size_t span = B * T;
    FSO_BUG_ON(n < T + 1, "%zu tokens, fewer than a sequence of %zu and its target", n, T);

    size_t counted = 0;
    for (size_t b = 0; b < B; b++) {
        size_t start;
        if (n >= span + 1) {
            if (b == 0 && data->pos + span + 1 > n)
                data->pos = 0;
            start = data->pos + b * T;
        } else {
            start = (data->pos + b * T) % (n - T);
        }
        counted += cut_row(data, start, inputs + b * T, targets + b * T,
                           pos ? pos + b * T : NULL);
    }
    if (n >= span + 1)
        data->pos += span;
    else
        data->pos = (data->pos + span) % (n - T);
    return counted;
}

/* n tokens (and their flags, or NULL) as a file of kind, through the one
 * token file writer. 0 or a negative errno. */
static int write_token_file(const char *path, fso_tokfile_kind kind, int elem_bytes,
                            int32_t delimiter, const int32_t *tokens, const uint8_t *flags,
                            size_t n)
{
    fso_token_writer w;
    char err[FSO_DATA_ERR_MAX];
    int rc = fso_token_writer_open(&w, path, kind, elem_bytes, delimiter, err, sizeof err);
    if (rc < 0)
        return rc;
    if ((rc = fso_token_writer_add(&w, tokens, flags, n, err, sizeof err)) < 0) {
        fso_token_writer_abort(&w);
        return rc;
    }
    return fso_token_writer_finish(&w, err, sizeof err);
}

/* Whether n tokens are valid (>= 0) and fit uint16: 0/1, or -EINVAL. */
static int tokens_narrow(const int32_t *tokens, size_t n)
{
    int narrow = 1;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return -EINVAL;
        if (tokens[i] > 0xffff)
            narrow = 0;
    }
    return narrow;
}

int fso_data_write_tokens(const char *path, const int32_t *tokens, size_t n, int force_u32)
{
    if (!path || !path[0] || (!tokens && n))
        return -EINVAL;
    if (n > INT32_MAX)
        return -EOVERFLOW;   /* the header's token count is an int32 */
    int narrow = tokens_narrow(tokens, n);
    if (narrow < 0)
        return narrow;
    const bool v1 = narrow && !force_u32;
    return write_token_file(path, v1 ? FSO_TOKFILE_V1 : FSO_TOKFILE_V7, v1 ? 2 : 4, -1, tokens,
                            NULL, n);
}

int fso_data_write_flagged(const char *path, const int32_t *tokens, const uint8_t *flags,
                           size_t n, int32_t delimiter)
{
    if (!path || !path[0] || (!tokens && n) || (!flags && n) || delimiter < -1)
        return -EINVAL;
    if (n > INT32_MAX)
        return -EOVERFLOW;
    int narrow = tokens_narrow(tokens, n);
    if (narrow < 0)
        return narrow;
    for (size_t i = 0; i < n; i++)
        if (flags[i] & ~(FSO_TOKEN_TARGET | FSO_TOKEN_DOC_START))
            return -EINVAL;
    return write_token_file(path, FSO_TOKFILE_FLAGGED, narrow ? 2 : 4, delimiter, tokens, flags,
                            n);
}
