/* tokenize.h — input files to a token file with a Hugging Face tokenizer:
 * what `fsoff tokenize` runs (engine/cli/tokenize_cli.c).
 *
 * Documents (docs.h) are read in batches of about a megabyte, encoded by
 * `threads` workers (one fso_tok_worker each) and written in input order,
 * so the output does not depend on the thread count.
 *
 * Each document of the text and jsonl formats starts with the tokenizer's
 * BOS when its post-processor adds one (Llama), else with the delimiter
 * llm.c prepends: the token <|endoftext|> when the vocabulary has it (GPT-2,
 * Qwen2), else EOS, else BOS; the file (llm.c v1 for a vocabulary of at most
 * 65,535 ids, else v7) names it in header[3]. A tokenizer with none of them
 * gets the flagged format, documents marked by DOC_START flags. Chat
 * documents (chat.h) always give the flagged format: DOC_START at each
 * conversation's first token, TARGET on the trained tokens, header[3] 0.
 * The first token of a document is never a TARGET (data.h).
 *
 * A text span whose later part is trained on (chat.h's pieces) is encoded
 * whole, as the template's text is; its tokens from the first one that
 * differs from the encoding of the untrained part alone are TARGET (a
 * token that straddles the boundary counts, as a token holding any trained
 * character does in Hugging Face's assistant masks).
 *
 * val_fraction F > 0 holds out whole documents: document i (0-based, in
 * input order) goes to the validation file when floor((i+1)F) > floor(iF),
 * one in every 1/F spread evenly, so the split is the same on every run.
 */
#ifndef FSO_TOKENIZE_H
#define FSO_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "tok/docs.h"
#include "token_writer.h"

#define FSO_TOKENIZE_ERR_MAX 1024

typedef struct fso_tokenize_stats {
    uint64_t docs, tokens, targets;       /* written to the file */
} fso_tokenize_stats;

typedef struct fso_tokenize_progress {
    uint64_t bytes_read;
    fso_tokenize_stats train, val;
    double ms;                            /* since the start */
} fso_tokenize_progress;

typedef struct fso_tokenize_opts {
    const char *tokenizer_dir;
    const char *const *inputs;
    int n_inputs;
    int format;                 /* fso_docs_format, or -1: detect from inputs[0] */
    int template_kind;          /* fso_chat_kind, or -1: pick from the tokenizer */
    const char *out_path;
    double val_fraction;        /* 0 <= F < 1 */
    int threads;                /* >= 1 */
    size_t batch_bytes;         /* input bytes per batch; 0: about 1 MiB */
    /* called on the calling thread every progress_ms (0: never) */
    void (*progress)(void *ctx, const fso_tokenize_progress *p);
    void *progress_ctx;
    double progress_ms;
} fso_tokenize_opts;

typedef struct fso_tokenize_result {
    fso_docs_format format;
    char format_why[256];       /* "by its extension .txt" */
    char template_why[256];     /* chat: "llama3 template from ..." */
    int32_t vocab_size;
    int32_t delimiter;          /* header[3] - 1 */
    char delimiter_name[64];
    fso_tokfile_kind kind;
    int elem_bytes;
    char val_path[4096];        /* "" without val_fraction */
    fso_tokenize_progress done;
} fso_tokenize_result;

/* The validation file beside out: "x.bin" -> "x.val.bin", else out + ".val". */
void fso_tokenize_val_path(const char *out, char *buf, size_t len);

/* Tokenize o->inputs into o->out_path (and the validation file). 0, or a
 * negative errno with err naming the file, line and byte where the input
 * is at fault, and the fix; no output file is then left behind. */
int fso_tokenize_run(const fso_tokenize_opts *o, fso_tokenize_result *res, char *err,
                     size_t errlen);

#endif
