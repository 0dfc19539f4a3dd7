/* docs.h — the documents of `fsoff tokenize`'s input files, read as a
 * stream in batches, and each one parsed into what the tokenizer encodes.
 *
 * Formats (fso_docs_format):
 *   text   each file is a sequence of documents separated by two or more
 *          blank lines in a row (a blank line is empty or holds only a
 *          carriage return); the separating blank lines belong to no
 *          document, and a file without them is one document. A document
 *          keeps its bytes as they are, its last newline included.
 *   jsonl  one JSON object per line, its "text" string the document.
 *   chat   one JSON object per line: "messages", an array of {"role",
 *          "content"} with roles system, user and assistant; or
 *          "prompt" and "completion", both strings (a prompt-completion
 *          pair) or both arrays of messages (a conversation whose
 *          assistant messages of "completion" alone are trained on).
 * In jsonl and chat files, blank lines are skipped. Every byte read must be
 * UTF-8 (as Hugging Face tokenizers, which take Python str, require).
 *
 * A record is one document's bytes as read (text) or one line (jsonl,
 * chat), with the file, line and byte offset it starts at, for errors.
 */
#ifndef FSO_DOCS_H
#define FSO_DOCS_H

#include <stddef.h>
#include <stdint.h>

#include "tok/chat.h"

typedef enum fso_docs_format {
    FSO_DOCS_TEXT,
    FSO_DOCS_JSONL,
    FSO_DOCS_CHAT,
} fso_docs_format;

/* "text", "jsonl", "chat": 0, or -EINVAL for another name. */
int fso_docs_format_parse(const char *name, fso_docs_format *f);
const char *fso_docs_format_name(fso_docs_format f);
/* The format of a file by its name and first line: a name ending in
 * .jsonl, .ndjson or .json is jsonl when its first non-blank line has a
 * "text" key, chat when it has "messages" or "prompt"; any other name is
 * text. why gets how it was decided ("by extension .txt"). 0, or a negative
 * errno with err naming the file, line and fix. */
int fso_docs_detect(const char *path, fso_docs_format *f, char *why, size_t whylen, char *err,
                    size_t errlen);

typedef struct fso_docs_rec {
    size_t off, len;   /* its bytes in the batch's buf */
    int file;          /* index of its input file */
    uint64_t line;     /* 1-based line of its first byte */
    uint64_t byte;     /* file offset of its first byte */
} fso_docs_rec;

typedef struct fso_docs_batch {
    char *buf;
    size_t len, cap;
    fso_docs_rec *recs;
    size_t n, cap_recs;
} fso_docs_batch;

void fso_docs_batch_free(fso_docs_batch *b);

typedef struct fso_docs_reader {
    const char *const *paths;
    int n_paths;
    fso_docs_format format;
    int file;                  /* the file being read, n_paths at the end */
    int fd;
    char *rbuf;                /* read-ahead of the file */
    size_t rlen, rpos;
    uint64_t rbuf_byte;        /* file offset of rbuf[0] */
    int file_eof;
    char *line;                /* the line being assembled */
    size_t line_len, line_cap;
    uint64_t line_no;          /* lines read from this file */
    uint64_t bytes_read;       /* all files, for progress */
    /* text: the document being read */
    int in_doc;
    size_t doc_start;          /* its first byte in the batch */
    uint64_t doc_line, doc_byte;
    int held;                  /* blank lines read since its last non-blank line */
    char held_first[2];        /* the first of them ("\n" or "\r\n") */
    size_t held_first_len;
    uint64_t held_line, held_byte;
    int pending;               /* r->line is read but not yet taken */
    uint64_t pending_line, pending_byte;
} fso_docs_reader;

/* Read paths[0..n) in order as format. The paths must outlive the reader. */
void fso_docs_reader_init(fso_docs_reader *r, const char *const *paths, int n,
                          fso_docs_format format);
/* Empty b and fill it with the next whole records, stopping once it holds
 * max_bytes or more. Returns the number of records (0 at the end of the
 * last file), or a negative errno with err naming the file and the fix. */
int fso_docs_read(fso_docs_reader *r, fso_docs_batch *b, size_t max_bytes, char *err,
                  size_t errlen);
void fso_docs_reader_free(fso_docs_reader *r);

/* The index of the first byte of s[0..len) that is not part of valid
 * UTF-8 (overlong forms, surrogates and code points above U+10FFFF are
 * invalid, as in Python), or len. */
size_t fso_utf8_check(const char *s, size_t len);

/* One parsed record. text: the document's bytes (text, jsonl; for chat's
 * prompt-completion strings, see fso_chat). Strings point into the record
 * or into root. */
typedef struct fso_doc {
    struct json_t *root;
    const char *text;
    size_t len;
    fso_chat chat;
} fso_doc;

/* Parse rec (of path, at line and byte) as format: UTF-8 checked first.
 * 0, or -EILSEQ (invalid UTF-8) / -EINVAL (not what format needs) with err
 * "PATH:LINE: byte OFFSET: WHAT; FIX". */
int fso_doc_parse(fso_doc *d, fso_docs_format format, const char *rec, size_t len,
                  const char *path, uint64_t line, uint64_t byte, char *err, size_t errlen);
void fso_doc_free(fso_doc *d);

#endif
