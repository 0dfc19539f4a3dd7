/* tok_load.h — what the two halves of tokenizer loading share: tok_load.c
 * (the file, the model, added tokens, BOS/EOS) and tok_steps.c (the
 * normalizer, pre-tokenizer and decoder steps). Private to engine/tok/.
 */
#ifndef FSO_TOK_LOAD_H
#define FSO_TOK_LOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "tok_impl.h"

/* One load: the tokenizer being filled and where its messages go. */
typedef struct ld {
    fso_tokenizer *t;
    const char *text;  /* tokenizer.json's text, for positions */
    const char *file;
    char *err;
    size_t errlen;
} ld;

/* Sets the message "FILE:LINE:COL: a.b[2].c: MESSAGE" (the path's position
 * found in text, when it is there) and returns rc. */
int tok_load_fail(ld *l, int rc, const char *const *path, int depth, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define REFUSE(l, path, depth, ...) tok_load_fail(l, -ENOTSUP, path, depth, __VA_ARGS__)
#define BAD(l, path, depth, ...) tok_load_fail(l, -EINVAL, path, depth, __VA_ARGS__)

/* o's "type" string, or NULL. */
const char *tok_json_type(json_t *o);
/* key of o as a bool (dflt when absent or null); path[depth] names it in errors. */
int tok_json_bool(ld *l, json_t *o, const char *key, bool dflt, bool *out, const char **path,
                  int depth);
/* A malloc'd copy of a JSON string and its length. 0 or -ENOMEM. */
int tok_json_str(json_t *v, char **s, size_t *len);

/* The steps (tok_steps.c), each at path[0..depth) of tokenizer.json: the
 * normalizer, the pre-tokenizer and the decoder, a Sequence flattened. */
int tok_load_norm(ld *l, json_t *n, const char **path, int depth);
int tok_load_pre(ld *l, json_t *p, const char **path, int depth);
int tok_load_dec(ld *l, json_t *d, const char **path, int depth);

#endif
