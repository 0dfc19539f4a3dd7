/* data.h — training tokens: llm.c token files, fsoff's flagged token files,
 * plain text, or the built-in corpus.
 *
 * Token file: a header of 256 little-endian int32 — [0] magic 20240520,
 * [1] version, [2] token count — followed by the tokens. Version 1 stores
 * uint16 tokens (llm.c's format); version 2, fsoff's extension for
 * vocabularies above 65,535, stores uint32 tokens; fsoff reads it and no
 * longer writes it. llm.c's Llama 3 files (magic 20240801, version 7) store
 * uint32 tokens; fsoff writes these for vocabularies above 65,535.
 * header[3], zero in llm.c's files, is fsoff's note of the document
 * delimiter: its token id + 1, or 0 for none. A file that names one is a
 * sequence of documents, each starting at a delimiter token (llm.c's own
 * rule: the delimiter is prepended to every document).
 *
 * Flagged token file, fsoff's extension for what no standard format holds
 * (loss masks and documents with no delimiter token): header of 256 int32 —
 * [0] magic 20261202, [1] version 1, [2] token count n, [3] the delimiter as
 * above (or 0), [4] bytes per token (2 or 4) — then the n tokens, then n
 * uint8 flags, one per token: FSO_TOKEN_TARGET (predicting this token counts
 * in the loss) and FSO_TOKEN_DOC_START (a document starts at this token).
 *
 * Documents (a delimiter, or DOC_START flags): a token attends only to the
 * tokens of its own document, its position restarts at 0 at its document's
 * start, and the first token of a document is never a target (nothing of
 * its document precedes it) — packing documents into one window trains as
 * running them apart. A file with no documents is one stream, as llm.c's.
 * A flagged file's documents start at its DOC_START flags and, when its
 * header names a delimiter, at each delimiter token too. A document
 * starting at the file's first token changes nothing (it is no target
 * anyway). data.documents "stream" drops the documents (every window one
 * stream, as llm.c trains) and keeps the masks.
 *
 * Plain text is read
 * byte-level: each byte is one token (needs vocab_size >= 256; refused for a
 * model from model.init_from with a larger vocabulary, whose ids are not
 * bytes, unless data.format is "bytes"). With no path,
 * fsoff generates its built-in synthetic English-like corpus (byte-level).
 *
 * Batches: micro-batch i of the run reads B rows of T+1 consecutive tokens,
 * advancing B*T tokens per micro-batch and wrapping at the end (llm.c's
 * loader), so a run is fully determined by the file and the config.
 * Row b starts at pos + b*T; when the next batch would read past the end
 * (pos + B*T + 1 > n_tokens), pos returns to 0 first. A corpus shorter than
 * B*T+1 tokens (but at least T+1) cannot hold a whole batch: then row b
 * starts at (pos + b*T) mod (n_tokens - T) and pos advances by B*T modulo
 * (n_tokens - T), so rows repeat tokens but every row stays in bounds.
 */
#ifndef FSO_DATA_H
#define FSO_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

#define FSO_TOKENS_MAGIC 20240520
/* llm.c's Llama 3 token files: this magic, version 7, uint32 tokens. */
#define FSO_TOKENS_MAGIC_LLAMA3 20240801
#define FSO_TOKENS_LLAMA3_VERSION 7
#define FSO_TOKENS_HEADER_INTS 256
/* fsoff's flagged token file (above) and its per-token flags. */
#define FSO_TOKENS_MAGIC_FLAGGED 20261202
#define FSO_TOKENS_FLAGGED_VERSION 1
#define FSO_TOKEN_TARGET 0x01u
#define FSO_TOKEN_DOC_START 0x02u
#define FSO_DATA_ERR_MAX 512

/* The built-in corpus: its size and a fixed seed, independent of the training
 * seed, so the text is the same for every run. */
#define FSO_CORPUS_BYTES ((size_t)2 << 20)
#define FSO_CORPUS_SEED 0x66736f6666636f72ull   /* "fsoffcor" */

typedef struct fso_data {
    int32_t *tokens;         /* (n_tokens) */
    uint8_t *flags;          /* (n_tokens) FSO_TOKEN_* per token, or NULL: every token a
                                target and no documents (the batches of llm.c's loader) */
    bool documents;          /* some document starts after the first token */
    size_t n_targets;        /* with flags: tokens after the first that count as targets */
    size_t n_docs;           /* with flags: documents (1 + starts after the first token) */
    size_t n_tokens;
    size_t pos;              /* next batch start */
    int B, T;
    char desc[256];          /* "data/x.bin (tokens v1, 1234567 tokens)" for the banner */
    char err[FSO_DATA_ERR_MAX];
} fso_data;

/* Load per cfg->data and check every token < cfg->model.vocab_size and that at
 * least one row of seq_len+1 tokens exists. Returns 0 or negative errno with
 * data->err set ("data/x.bin: truncated: header says ... "). */
int fso_data_init(fso_data *data, const fso_config *cfg);
void fso_data_free(fso_data *data);

/* Fill inputs (B,T) and targets (B,T) with the next micro-batch; a target
 * that does not count (its token is not flagged FSO_TOKEN_TARGET, or starts
 * a document) is -1. With documents and pos not NULL, pos (B,T) gets each
 * token's position in its document: 0 at a document's start and at the
 * row's first token, else the previous position + 1 (pos is not written
 * without documents; it may be NULL). Returns the targets that count, B*T
 * for data without flags. */
size_t fso_data_next(fso_data *data, int32_t *inputs, int32_t *targets, int32_t *pos);

/* Whether the data has documents: batches then need their positions
 * (fso_data_next's pos) for the model to keep the documents apart. */
bool fso_data_documents(const fso_data *data);

/* Write the built-in corpus (n_bytes of text, from seed) to buf. */
void fso_corpus_generate(char *buf, size_t n_bytes, uint64_t seed);

/* Write a token file: version 1 (uint16) if every token fits uint16 and
 * !force_u32, else llm.c's Llama 3 format (magic 20240801, version 7,
 * uint32), through token_writer.h: PATH.tmp.PID (mode 0644 less the
 * umask), fsync'd and renamed over path, so a failure leaves no partial
 * file. Returns 0 or a
 * negative errno: -EINVAL for a negative token, -EOVERFLOW for n >
 * INT32_MAX, else the open/write/fsync/close/rename error (-ENOSPC, -EFBIG,
 * -EACCES, ...). */
int fso_data_write_tokens(const char *path, const int32_t *tokens, size_t n, int force_u32);

/* Write a flagged token file (above): tokens (n), their flags (n,
 * FSO_TOKEN_* bits only), delimiter the document delimiter's id or -1 for
 * none; 2 bytes per token if every token fits uint16, else 4. Written and
 * failing as fso_data_write_tokens (-EINVAL also for unknown flag bits). */
int fso_data_write_flagged(const char *path, const int32_t *tokens, const uint8_t *flags,
                           size_t n, int32_t delimiter);

#endif
