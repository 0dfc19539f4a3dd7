/* token_writer.h — a token file (data.h's formats) written as a stream:
 * tokens are appended as they come, the header is written last, and the
 * file appears at its path only when complete.
 *
 * The tokens go to PATH.tmp.PID; the flagged format's flags, which follow
 * every token in the file, wait in an unnamed temporary file in the same
 * folder until fso_token_writer_finish copies them after the tokens. finish
 * writes the header, fsyncs and renames PATH.tmp.PID over PATH; any failure,
 * or fso_token_writer_abort, removes the temporary file, so PATH is either
 * the whole new file or untouched. Errors name the file and the fix.
 */
#ifndef FSO_TOKEN_WRITER_H
#define FSO_TOKEN_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* The three layouts of data.h fsoff writes. */
typedef enum fso_tokfile_kind {
    FSO_TOKFILE_V1,        /* magic 20240520 version 1: uint16 tokens (llm.c's GPT-2 files) */
    FSO_TOKFILE_V7,        /* magic 20240801 version 7: uint32 tokens (llm.c's Llama 3 files) */
    FSO_TOKFILE_FLAGGED,   /* magic 20261202: tokens (2 or 4 bytes), then one flag byte each */
} fso_tokfile_kind;

/* The largest vocabulary whose ids a 2-byte token holds (data.h: version 1
 * is for vocabularies of at most 65,535; above, 4-byte tokens). */
#define FSO_TOKFILE_U16_VOCAB_MAX 65535

/* The layout for a vocabulary of vocab_size ids, flagged or not, and its
 * bytes per token (2 or 4). */
fso_tokfile_kind fso_tokfile_pick(int32_t vocab_size, int flagged, int *elem_bytes);
/* "llm.c v1, uint16", "llm.c v7, uint32", "fsoff flagged, uint16" ... */
const char *fso_tokfile_name(fso_tokfile_kind kind, int elem_bytes);

typedef struct fso_token_writer {
    char *path, *tmp;          /* the file, and where it is written until finish */
    int fd, flags_fd;          /* PATH.tmp.PID; the unnamed flags file (flagged only), or -1 */
    fso_tokfile_kind kind;
    int elem_bytes;
    int32_t delimiter;         /* header[3] is delimiter + 1; -1 for none */
    uint64_t n_tokens;
    unsigned char *stage;      /* tokens not yet written */
    size_t staged;
    unsigned char *fstage;     /* flags not yet written */
    size_t fstaged;
} fso_token_writer;

/* Create PATH.tmp.PID for a file of kind (elem_bytes 2 or 4; V1 takes 2,
 * V7 4) whose documents start with delimiter (-1: none). 0, or a negative
 * errno with err naming the file ("out/x.bin: cannot create out/x.bin.tmp.12:
 * No such file or directory; create the folder out first"). */
int fso_token_writer_open(fso_token_writer *w, const char *path, fso_tokfile_kind kind,
                          int elem_bytes, int32_t delimiter, char *err, size_t errlen);
/* Append n tokens (each 0 <= id < 2^(8*elem_bytes)) and, for the flagged
 * format, their n flags (FSO_TOKEN_*; NULL elsewhere). 0 or a negative
 * errno with err set; -EOVERFLOW past INT32_MAX tokens (header[2] is an
 * int32). */
int fso_token_writer_add(fso_token_writer *w, const int32_t *ids, const uint8_t *flags, size_t n,
                         char *err, size_t errlen);
/* Complete the file and rename it to its path; frees w. 0 or a negative
 * errno with err set and nothing left behind. */
int fso_token_writer_finish(fso_token_writer *w, char *err, size_t errlen);
/* Remove the temporary files and free w (a zeroed or finished w: nothing). */
void fso_token_writer_abort(fso_token_writer *w);

#endif
