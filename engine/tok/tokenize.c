/* tokenize.c — input files to a token file, encoded by a pool of workers
 * and written in input order (tokenize.h).
 *
 * The calling thread reads batches of records into a ring of chunks,
 * workers encode whole chunks, and the calling thread writes chunks in the
 * order they were read. Lock: run.mu guards every chunk's state and the
 * ring's counters; a chunk's other fields belong to the calling thread
 * while FREE or DONE and to one worker while BUSY.
 */
#include "tokenize.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "tok/chat.h"
#include "tok/tokenizer.h"
#include "util.h"

#define BATCH_BYTES ((size_t)1 << 20)

enum { CHUNK_FREE, CHUNK_READY, CHUNK_BUSY, CHUNK_DONE };

typedef struct chunk {
    int state;
    fso_docs_batch batch;
    fso_ids ids;            /* the batch's tokens */
    uint8_t *flags;         /* (ids.n) FSO_TOKEN_* */
    size_t flags_cap;
    size_t *doc_end;        /* (batch.n) end of each record's tokens in ids */
    size_t doc_cap;
    int rc;
    char err[FSO_TOKENIZE_ERR_MAX];
} chunk;

typedef struct run {
    const fso_tokenize_opts *o;
    fso_tokenizer *tok;
    fso_docs_format format;
    fso_chat_template ct;
    int32_t delimiter, bos, eos;
    int adds_bos;
    size_t batch_bytes;
    chunk *chunks;
    int n_chunks;
    pthread_mutex_t mu;
    pthread_cond_t work, done;     /* a chunk became READY (or quit); a chunk became DONE */
    uint64_t filled, next_encode;  /* chunks made READY; chunks taken by a worker */
    int quit;
} run;

void fso_tokenize_val_path(const char *out, char *buf, size_t len)
{
    size_t n = strlen(out);
    if (n > 4 && strcmp(out + n - 4, ".bin") == 0)
        snprintf(buf, len, "%.*s.val.bin", (int)(n - 4), out);
    else
        snprintf(buf, len, "%s.val", out);
}

static bool is_val_doc(double f, uint64_t i)
{
    return f > 0 && floor((double)(i + 1) * f) > floor((double)i * f);
}

/* --- encoding (workers) */

static int grow_flags(chunk *c, size_t n)
{
    return fso_reserve((void **)&c->flags, &c->flags_cap, n, 1, 1 << 16);
}

/* The pieces of r as tokens and flags appended to c. */
static int encode_pieces(fso_tok_worker *w, const fso_chat_render *r, chunk *c,
                         fso_ids *prefix, char *err, size_t errlen)
{
    size_t start = c->ids.n;
    int rc;
    for (size_t i = 0; i < r->n; i++) {
        const fso_chat_piece *p = &r->p[i];
        size_t from = c->ids.n;
        if (p->special >= 0) {
            if ((rc = fso_ids_push(&c->ids, p->special)) < 0 || (rc = grow_flags(c, c->ids.n)) < 0)
                return rc;
            c->flags[from] = p->trained ? FSO_TOKEN_TARGET : 0;
            continue;
        }
        if (p->len == 0)
            continue;
        const char *text = r->text + p->off;
        if ((rc = fso_tokenizer_encode(w, text, p->len, &c->ids, err, errlen)) < 0)
            return rc;
        if ((rc = grow_flags(c, c->ids.n)) < 0)
            return rc;
        size_t trained_from = c->ids.n;   /* none */
        if (p->target_from == 0) {
            trained_from = from;
        } else if (p->target_from < p->len) {
            /* the span's tokens that differ from its untrained part's own */
            prefix->n = 0;
            if ((rc = fso_tokenizer_encode(w, text, p->target_from, prefix, err, errlen)) < 0)
                return rc;
            size_t k = 0;
            while (k < prefix->n && from + k < c->ids.n && c->ids.v[from + k] == prefix->v[k])
                k++;
            trained_from = from + k;
        }
        for (size_t k = from; k < c->ids.n; k++)
            c->flags[k] = k >= trained_from ? FSO_TOKEN_TARGET : 0;
    }
    if (c->ids.n > start) {
        c->flags[start] &= (uint8_t)~FSO_TOKEN_TARGET;
        c->flags[start] |= FSO_TOKEN_DOC_START;
    }
    return 0;
}

/* Prefix "PATH:LINE: byte B: " to a message that lacks the place. */
static void place_err(chunk *c, const fso_docs_rec *rec, const char *path, const char *msg)
{
    snprintf(c->err, sizeof c->err, "%s:%llu: byte %llu: %.768s", path,
             (unsigned long long)rec->line, (unsigned long long)rec->byte, msg);
}

static void encode_chunk(run *R, fso_tok_worker *w, chunk *c, fso_chat_render *rend,
                         fso_ids *prefix)
{
    c->ids.n = 0;
    c->rc = 0;
    if (!w) {
        c->rc = -ENOMEM;
        fso_set_err(c->err, sizeof c->err, "out of memory for a tokenizer worker");
        return;
    }
    if (c->batch.n > c->doc_cap) {
        size_t *d = realloc(c->doc_end, c->batch.n * sizeof *d);
        if (!d) {
            c->rc = -ENOMEM;
            fso_set_err(c->err, sizeof c->err, "out of memory");
            return;
        }
        c->doc_end = d;
        c->doc_cap = c->batch.n;
    }
    char msg[FSO_TOKENIZE_ERR_MAX];
    for (size_t i = 0; i < c->batch.n; i++) {
        const fso_docs_rec *rec = &c->batch.recs[i];
        const char *path = R->o->inputs[rec->file];
        fso_doc d;
        int rc = fso_doc_parse(&d, R->format, c->batch.buf + rec->off, rec->len, path, rec->line,
                               rec->byte, c->err, sizeof c->err);
        if (rc == 0) {
            if (R->format != FSO_DOCS_CHAT)
                rc = fso_chat_render_text(d.text, d.len, R->delimiter, rend);
            else if (d.chat.pair)
                rc = fso_chat_render_pair(&d.chat, R->adds_bos ? R->bos : -1, R->eos, rend);
            else if ((rc = fso_chat_render_conv(&R->ct, &d.chat, rend, msg, sizeof msg)) < 0)
                place_err(c, rec, path, msg);
            if (rc == -ENOMEM)
                place_err(c, rec, path, "out of memory");
        }
        if (rc == 0 && (rc = encode_pieces(w, rend, c, prefix, msg, sizeof msg)) < 0)
            place_err(c, rec, path, rc == -ENOMEM ? "out of memory" : msg);
        fso_doc_free(&d);
        if (rc < 0) {
            c->rc = rc;
            return;
        }
        c->doc_end[i] = c->ids.n;
    }
}

static void *worker_main(void *arg)
{
    run *R = arg;
    fso_tok_worker *w = fso_tok_worker_new(R->tok);
    fso_chat_render rend = {0};
    fso_ids prefix = {0};
    pthread_mutex_lock(&R->mu);
    for (;;) {
        while (!R->quit && R->next_encode == R->filled)
            pthread_cond_wait(&R->work, &R->mu);
        if (R->quit)
            break;
        chunk *c = &R->chunks[R->next_encode++ % (uint64_t)R->n_chunks];
        c->state = CHUNK_BUSY;
        pthread_mutex_unlock(&R->mu);
        encode_chunk(R, w, c, &rend, &prefix);
        pthread_mutex_lock(&R->mu);
        c->state = CHUNK_DONE;
        pthread_cond_broadcast(&R->done);
    }
    pthread_mutex_unlock(&R->mu);
    fso_chat_render_free(&rend);
    fso_ids_free(&prefix);
    fso_tok_worker_free(w);
    return NULL;
}

/* --- the run (calling thread) */

typedef struct outputs {
    fso_token_writer train, val;
    int has_val;
    fso_tokenize_progress *prog;
} outputs;

static int write_chunk(const fso_tokenize_opts *o, outputs *out, chunk *c, char *err,
                       size_t errlen)
{
    size_t start = 0;
    for (size_t i = 0; i < c->batch.n; i++) {
        size_t end = c->doc_end[i];
        uint64_t index = out->prog->train.docs + out->prog->val.docs;
        bool val = out->has_val && is_val_doc(o->val_fraction, index);
        fso_token_writer *w = val ? &out->val : &out->train;
        fso_tokenize_stats *s = val ? &out->prog->val : &out->prog->train;
        int rc = fso_token_writer_add(w, c->ids.v + start, w->kind == FSO_TOKFILE_FLAGGED ?
                                      c->flags + start : NULL, end - start, err, errlen);
        if (rc < 0)
            return rc;
        s->docs++;
        s->tokens += end - start;
        for (size_t k = start; k < end; k++)
            s->targets += c->flags[k] & FSO_TOKEN_TARGET;
        start = end;
    }
    return 0;
}

/* Every input can be opened for reading before any work. */
static int check_inputs(const fso_tokenize_opts *o, char *err, size_t errlen)
{
    for (int i = 0; i < o->n_inputs; i++) {
        const char *p = o->inputs[i];
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            fso_set_err(err, errlen, "%s: cannot open: %s; %s", p, strerror(e),
                    e == ENOENT ? "check the path" : "make it readable, or leave it out");
            return -e;
        }
        struct stat st;
        int dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
        close(fd);
        if (dir) {
            fso_set_err(err, errlen, "%s: is a folder; give the files in it (e.g. %s/*.txt)", p, p);
            return -EISDIR;
        }
    }
    return 0;
}

/* What documents of the text and jsonl formats start with (tokenize.h). */
static int32_t pick_delimiter(const fso_tokenizer *t)
{
    if (fso_tokenizer_adds_bos(t) && fso_tokenizer_bos(t) >= 0)
        return fso_tokenizer_bos(t);
    int32_t eot = fso_tokenizer_token_id(t, "<|endoftext|>");
    if (eot >= 0)
        return eot;
    if (fso_tokenizer_eos(t) >= 0)
        return fso_tokenizer_eos(t);
    return fso_tokenizer_bos(t);
}

static void token_name(const fso_tokenizer *t, int32_t id, char *buf, size_t len)
{
    char *s = NULL;
    size_t n = 0;
    if (id >= 0 && fso_tokenizer_decode(t, &id, 1, &s, &n) == 0)
        snprintf(buf, len, "%s (id %d)", s, id);
    else
        snprintf(buf, len, id >= 0 ? "id %d" : "none", id);
    free(s);
}

static int run_setup(run *R, const fso_tokenize_opts *o, fso_tokenize_result *res, char *err,
                     size_t errlen)
{
    int rc;
    if (o->n_inputs < 1) {
        fso_set_err(err, errlen, "no input files; give one or more text or JSONL files");
        return -EINVAL;
    }
    if ((rc = check_inputs(o, err, errlen)) < 0)
        return rc;
    if ((rc = fso_tokenizer_load(&R->tok, o->tokenizer_dir, err, errlen)) < 0)
        return rc;
    if (o->format >= 0) {
        R->format = (fso_docs_format)o->format;
        snprintf(res->format_why, sizeof res->format_why, "given by --format");
    } else if ((rc = fso_docs_detect(o->inputs[0], &R->format, res->format_why,
                                     sizeof res->format_why, err, errlen)) < 0) {
        return rc;
    }
    res->format = R->format;
    if (o->template_kind >= 0 && R->format != FSO_DOCS_CHAT) {
        fso_set_err(err, errlen, "--template is for chat data, and %s was read as %s (%s); give "
                "--format chat or drop --template", o->inputs[0], fso_docs_format_name(R->format),
                res->format_why);
        return -EINVAL;
    }
    res->vocab_size = fso_tokenizer_vocab_size(R->tok);
    R->bos = fso_tokenizer_bos(R->tok);
    R->eos = fso_tokenizer_eos(R->tok);
    R->adds_bos = fso_tokenizer_adds_bos(R->tok);
    int flagged;
    if (R->format == FSO_DOCS_CHAT) {
        if ((rc = fso_chat_template_pick(&R->ct, R->tok, o->tokenizer_dir, o->template_kind,
                                         res->template_why, sizeof res->template_why, err,
                                         errlen)) < 0)
            return rc;
        R->delimiter = -1;
        flagged = 1;
    } else {
        R->delimiter = pick_delimiter(R->tok);
        flagged = R->delimiter < 0;
    }
    res->delimiter = R->delimiter;
    token_name(R->tok, R->delimiter, res->delimiter_name, sizeof res->delimiter_name);
    res->kind = fso_tokfile_pick(res->vocab_size, flagged, &res->elem_bytes);
    return 0;
}

/* Start n workers: how many started (n), or a negative errno after
 * *started of them did. */
static int start_workers(run *R, pthread_t *th, int n, int *started)
{
    for (*started = 0; *started < n; (*started)++) {
        int rc = pthread_create(&th[*started], NULL, worker_main, R);
        if (rc != 0)
            return -rc;
    }
    return n;
}

/* Open the token file, and the validation file when --val-fraction asks
 * for one (its path into res->val_path). */
static int open_outputs(const fso_tokenize_opts *o, fso_tokenize_result *res, outputs *out,
                        char *err, size_t errlen)
{
    int rc;
    if ((rc = fso_token_writer_open(&out->train, o->out_path, res->kind, res->elem_bytes,
                                    res->delimiter, err, errlen)) < 0)
        return rc;
    if (o->val_fraction > 0) {
        fso_tokenize_val_path(o->out_path, res->val_path, sizeof res->val_path);
        if ((rc = fso_token_writer_open(&out->val, res->val_path, res->kind, res->elem_bytes,
                                        res->delimiter, err, errlen)) < 0)
            return rc;
        out->has_val = 1;
    }
    return 0;
}

/* Wait for chunk c to be encoded, write it and free it for reading. */
static int write_next(run *R, chunk *c, outputs *out, char *err, size_t errlen)
{
    int rc;
    pthread_mutex_lock(&R->mu);
    while (c->state != CHUNK_DONE)
        pthread_cond_wait(&R->done, &R->mu);
    pthread_mutex_unlock(&R->mu);
    if (c->rc < 0) {
        fso_set_err(err, errlen, "%s", c->err);
        return c->rc;
    }
    if ((rc = write_chunk(R->o, out, c, err, errlen)) < 0)
        return rc;
    pthread_mutex_lock(&R->mu);
    c->state = CHUNK_FREE;
    pthread_mutex_unlock(&R->mu);
    return 0;
}

/* Read ahead into free chunks for the workers and write the oldest once
 * encoded, until every input is read and written; reports progress. A
 * chunk's or a write's error stops it at once; the reader's after the
 * chunks read before it are written. */
static int pump(run *R, fso_docs_reader *reader, outputs *out, fso_tokenize_result *res,
                double t0, char *err, size_t errlen)
{
    const fso_tokenize_opts *o = R->o;
    uint64_t written = 0;
    int eof = 0, read_rc = 0, rc;
    double last = t0;
    char read_err[FSO_TOKENIZE_ERR_MAX] = "";
    while (!eof || written < R->filled) {
        chunk *next = &R->chunks[R->filled % (uint64_t)R->n_chunks];
        if (!eof && R->filled - written < (uint64_t)R->n_chunks) {
            int n = fso_docs_read(reader, &next->batch, R->batch_bytes, read_err,
                                  sizeof read_err);
            res->done.bytes_read = reader->bytes_read;
            if (n <= 0) {
                eof = 1;
                read_rc = n;
                continue;
            }
            pthread_mutex_lock(&R->mu);
            next->state = CHUNK_READY;
            R->filled++;
            pthread_cond_signal(&R->work);
            pthread_mutex_unlock(&R->mu);
        } else {
            chunk *c = &R->chunks[written % (uint64_t)R->n_chunks];
            if ((rc = write_next(R, c, out, err, errlen)) < 0)
                return rc;
            written++;
        }
        double now = fso_now_ms();
        res->done.ms = now - t0;
        if (o->progress && o->progress_ms > 0 && now - last >= o->progress_ms) {
            o->progress(o->progress_ctx, &res->done);
            last = now;
        }
    }
    if (read_rc < 0) {
        fso_set_err(err, errlen, "%s", read_err);
        return read_rc;
    }
    return 0;
}

/* Refuse a run that wrote no documents, or held none out when asked to;
 * else finish both files (both or neither). */
static int finish_outputs(const fso_tokenize_opts *o, outputs *out, fso_tokenize_result *res,
                          char *err, size_t errlen)
{
    int rc;
    uint64_t docs = res->done.train.docs + res->done.val.docs;
    if (docs == 0) {
        fso_set_err(err, errlen, "%s%s: no documents (empty, or only blank lines); give files with "
                "text in them", o->inputs[0], o->n_inputs > 1 ? " and the other inputs" : "");
        return -EINVAL;
    }
    if (out->has_val && res->done.val.docs == 0) {
        fso_set_err(err, errlen, "--val-fraction %g holds out none of the %llu documents (one in "
                "every %.0f is held out); give more documents or a larger fraction",
                o->val_fraction, (unsigned long long)docs, ceil(1 / o->val_fraction));
        return -EINVAL;
    }
    if ((rc = fso_token_writer_finish(&out->train, err, errlen)) < 0)
        return rc;
    if (out->has_val && (rc = fso_token_writer_finish(&out->val, err, errlen)) < 0) {
        unlink(o->out_path);   /* both files or neither */
        return rc;
    }
    return 0;
}

/* Tell the started workers to quit and join them. */
static void stop_workers(run *R, pthread_t *th, int started)
{
    if (!started)
        return;
    pthread_mutex_lock(&R->mu);
    R->quit = 1;
    pthread_cond_broadcast(&R->work);
    pthread_mutex_unlock(&R->mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

/* Free the chunks, the chat template, the tokenizer and the locks. */
static void run_free(run *R)
{
    for (int i = 0; i < R->n_chunks && R->chunks; i++) {
        fso_docs_batch_free(&R->chunks[i].batch);
        fso_ids_free(&R->chunks[i].ids);
        free(R->chunks[i].flags);
        free(R->chunks[i].doc_end);
    }
    free(R->chunks);
    fso_chat_template_free(&R->ct);
    fso_tokenizer_free(R->tok);
    pthread_cond_destroy(&R->work);
    pthread_cond_destroy(&R->done);
    pthread_mutex_destroy(&R->mu);
}

int fso_tokenize_run(const fso_tokenize_opts *o, fso_tokenize_result *res, char *err,
                     size_t errlen)
{
    memset(res, 0, sizeof *res);
    run R = {.o = o, .batch_bytes = o->batch_bytes ? o->batch_bytes : BATCH_BYTES};
    outputs out = {.prog = &res->done};
    fso_docs_reader reader;
    fso_docs_reader_init(&reader, o->inputs, o->n_inputs, FSO_DOCS_TEXT);
    pthread_t *th = NULL;
    int started = 0, rc;
    double t0 = fso_now_ms();
    pthread_mutex_init(&R.mu, NULL);
    pthread_cond_init(&R.work, NULL);
    pthread_cond_init(&R.done, NULL);

    if ((rc = run_setup(&R, o, res, err, errlen)) < 0)
        goto out;
    fso_docs_reader_init(&reader, o->inputs, o->n_inputs, R.format);
    if ((rc = open_outputs(o, res, &out, err, errlen)) < 0)
        goto out;
    int threads = o->threads > 0 ? o->threads : 1;
    R.n_chunks = 2 * threads + 2;
    R.chunks = calloc((size_t)R.n_chunks, sizeof *R.chunks);
    th = calloc((size_t)threads, sizeof *th);
    if (!R.chunks || !th) {
        rc = -ENOMEM;
        fso_set_err(err, errlen, "out of memory");
        goto out;
    }
    if ((rc = start_workers(&R, th, threads, &started)) < 0) {
        fso_set_err(err, errlen, "cannot start %d tokenizer threads: %s; give fewer with --threads",
                threads, strerror(-rc));
        goto out;
    }
    if ((rc = pump(&R, &reader, &out, res, t0, err, errlen)) < 0 ||
        (rc = finish_outputs(o, &out, res, err, errlen)) < 0)
        goto out;
    res->done.ms = fso_now_ms() - t0;

out:
    stop_workers(&R, th, started);
    fso_token_writer_abort(&out.train);
    fso_token_writer_abort(&out.val);
    free(th);
    fso_docs_reader_free(&reader);
    run_free(&R);
    return rc;
}
