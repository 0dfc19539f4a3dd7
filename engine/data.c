/* data.c — loading training tokens and cutting them into micro-batches.
 *
 * Sources (data.h has the formats): an llm.c token file (v1 uint16, v2
 * uint32), plain text read one byte per token, or the built-in corpus from
 * corpus.c. Everything ends up as int32 tokens in memory; every check that
 * can fail on a user's file (header, size, token range, length) happens here
 * once, so fso_data_next() never fails.
 *
 * Files are read with plain read(2) in chunks, never mmap'd: a file truncated
 * while we read it shows up as a short read and a clear error, not SIGBUS.
 * fso_data_write_tokens() writes PATH.tmp.PID.K and renames it over PATH, so
 * a failed write leaves no partial file behind.
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

static void put_u32le(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
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

/* Check a token file's header against the file's size and the config; on
 * success *version_out is 1 or 2 and *n_tokens_out the count the header gives. */
static int check_token_header(fso_data *d, const fso_config *cfg, const char *path,
                              const unsigned char *hdr, size_t hdr_bytes,
                              const struct stat *st, int32_t *version_out,
                              uint64_t *n_tokens_out)
{
    const uint32_t magic = hdr_bytes >= 4 ? get_u32le(hdr) : 0;
    if (hdr_bytes >= 4 && magic != FSO_TOKENS_MAGIC && magic != FSO_TOKENS_MAGIC_LLAMA3) {
        data_err(d, "%s: not a token file (magic %d; token files have %d, or %d for llm.c's "
                 "Llama 3 files); re-create it as a token file, or if it is plain text, set "
                 "data.format=text", path, (int32_t)magic, FSO_TOKENS_MAGIC,
                 FSO_TOKENS_MAGIC_LLAMA3);
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
    const size_t elem_bytes = version == 1 ? 2 : 4;
    const uint64_t n_tokens = get_u32le(hdr + 8);
    const uint64_t want_bytes = n_tokens * elem_bytes;

    if (S_ISREG(st->st_mode)) {
        uint64_t have = (uint64_t)st->st_size > HEADER_BYTES
                            ? (uint64_t)st->st_size - HEADER_BYTES : 0;
        if (have != want_bytes) {
            data_err(d, "%s: %s: header says %llu tokens (%llu bytes) but the file holds "
                     "%llu bytes of tokens; re-create the file", path,
                     have < want_bytes ? "truncated" : "too long",
                     (unsigned long long)n_tokens, (unsigned long long)want_bytes,
                     (unsigned long long)have);
            return -EINVAL;
        }
    }
    if (n_tokens < (uint64_t)cfg->data.seq_len + 1)
        return err_short(d, path, (size_t)n_tokens, cfg->data.seq_len);
    if (n_tokens > SIZE_MAX / sizeof(int32_t)) {
        data_err(d, "%s: %llu tokens do not fit in this process's address space", path,
                 (unsigned long long)n_tokens);
        return -ENOMEM;
    }
    *version_out = version;
    *n_tokens_out = n_tokens;
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

static int load_token_file(fso_data *d, const fso_config *cfg, int fd, const char *path,
                           const unsigned char *hdr, size_t hdr_bytes, const struct stat *st)
{
    const int vocab = cfg->model.vocab_size;
    unsigned char *stage = NULL;
    int32_t version = 0;
    uint64_t n_tokens = 0;
    int rc = check_token_header(d, cfg, path, hdr, hdr_bytes, st, &version, &n_tokens);
    if (rc)
        return rc;
    const size_t elem_bytes = version == 1 ? 2 : 4;
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
    /* Anything after the tokens (a file that grew, or a pipe) is an error too. */
    ssize_t extra = fso_read_full(fd, stage, CHUNK_BYTES);
    if (extra < 0) {
        rc = err_read(d, path, extra);
        goto out;
    }
    if (extra > 0) {
        data_err(d, "%s: too long: header says %llu tokens (%llu bytes) but the file holds "
                 "more bytes of tokens; re-create the file", path,
                 (unsigned long long)n_tokens, (unsigned long long)want_bytes);
        rc = -EINVAL;
        goto out;
    }
    d->n_tokens = (size_t)n_tokens;
    if (version == FSO_TOKENS_LLAMA3_VERSION)
        data_desc(d, "%s (llm.c Llama 3 tokens, %zu tokens)", path, d->n_tokens);
    else
        data_desc(d, "%s (tokens v%d, %zu tokens)", path, version, d->n_tokens);
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
        is_tokens = (hdr_bytes == HEADER_BYTES && (get_u32le(hdr) == FSO_TOKENS_MAGIC ||
                                                   get_u32le(hdr) == FSO_TOKENS_MAGIC_LLAMA3)) ||
                    named_bin(path);
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
        data->tokens = NULL;
        data->n_tokens = 0;
        data->desc[0] = '\0';
    }
    return rc;
}

void fso_data_free(fso_data *data)
{
    if (!data)
        return;
    free(data->tokens);
    data->tokens = NULL;
    data->n_tokens = 0;
    data->pos = 0;
}

void fso_data_next(fso_data *data, int32_t *inputs, int32_t *targets)
{
    FSO_BUG_ON(!data->tokens || data->B < 1 || data->T < 1,
               "a batch of %d x %d asked with %s", data->B, data->T,
               data->tokens ? "tokens loaded" : "no tokens loaded");
    const size_t B = (size_t)data->B, T = (size_t)data->T, n = data->n_tokens;
    const size_t span = B * T;
    FSO_BUG_ON(n < T + 1, "%zu tokens, fewer than a sequence of %zu and its target", n, T);

    for (size_t b = 0; b < B; b++) {
        size_t start;
        if (n >= span + 1) {
            if (b == 0 && data->pos + span + 1 > n)
                data->pos = 0;
            start = data->pos + b * T;
        } else {
            start = (data->pos + b * T) % (n - T);
        }
        const int32_t *row = data->tokens + start;
        memcpy(inputs + b * T, row, T * sizeof(int32_t));
        memcpy(targets + b * T, row + 1, T * sizeof(int32_t));
    }
    if (n >= span + 1)
        data->pos += span;
    else
        data->pos = (data->pos + span) % (n - T);
}

int fso_data_write_tokens(const char *path, const int32_t *tokens, size_t n, int force_v2)
{
    unsigned char *stage = NULL;
    char *tmp = NULL;
    int fd = -1, rc = 0;

    if (!path || !path[0] || (!tokens && n))
        return -EINVAL;
    if (n > INT32_MAX)
        return -EOVERFLOW;   /* the header's token count is an int32 */
    int version = force_v2 ? 2 : 1;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return -EINVAL;
        if (tokens[i] > 0xffff)
            version = 2;
    }
    const size_t elem_bytes = version == 1 ? 2 : 4;

    size_t tmp_len = strlen(path) + 64;
    tmp = malloc(tmp_len);
    stage = malloc(CHUNK_BYTES);
    if (!tmp || !stage) {
        free(tmp);
        free(stage);
        return -ENOMEM;
    }
    for (int attempt = 0; fd < 0; attempt++) {
        snprintf(tmp, tmp_len, "%s.tmp.%ld.%d", path, (long)getpid(), attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != EEXIST || attempt >= 1000)) {
            rc = -errno;
            free(tmp);
            free(stage);
            return rc;   /* nothing was created */
        }
    }

    memset(stage, 0, HEADER_BYTES);
    put_u32le(stage, FSO_TOKENS_MAGIC);
    put_u32le(stage + 4, (uint32_t)version);
    put_u32le(stage + 8, (uint32_t)n);
    rc = fso_write_full(fd, stage, HEADER_BYTES);
    for (size_t i = 0; rc == 0 && i < n;) {
        size_t fill = 0;
        for (; i < n && fill + elem_bytes <= CHUNK_BYTES; i++, fill += elem_bytes) {
            uint32_t v = (uint32_t)tokens[i];
            if (elem_bytes == 2) {
                stage[fill] = (unsigned char)v;
                stage[fill + 1] = (unsigned char)(v >> 8);
            } else {
                put_u32le(stage + fill, v);
            }
        }
        rc = fso_write_full(fd, stage, fill);
    }
    if (rc < 0)
        goto fail;
    if (fsync(fd) < 0) {
        rc = -errno;
        goto fail;
    }
    int c = close(fd);   /* no retry on EINTR: Linux has closed the fd already */
    fd = -1;
    if (c < 0) {
        rc = -errno;
        goto fail;
    }
    if (rename(tmp, path) < 0) {
        rc = -errno;
        goto fail;
    }
    free(tmp);
    free(stage);
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    free(stage);
    return rc;
}
