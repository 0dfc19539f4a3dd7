/* tokenizer.h — a Hugging Face tokenizer.json, run exactly as the
 * `tokenizers` library runs it: added tokens, normalizer, pre-tokenizer, BPE
 * model. Families: byte-level BPE (GPT-2, Llama 3 with ignore_merges, Qwen2
 * with NFC, SmolLM2 with Digits) and SentencePiece-style BPE with byte
 * fallback (Llama 2, TinyLlama, Mistral). A tokenizer.json that uses
 * anything else is refused by name, never approximated.
 *
 * fso_tokenizer_encode() is the library's encode(text,
 * add_special_tokens=False) with split_special_tokens=True: special-token
 * strings inside the text are plain text. Callers add BOS/EOS and the chat
 * templates' special tokens themselves, by id.
 */
#ifndef FSO_TOKENIZER_H
#define FSO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fso_tokenizer fso_tokenizer;
/* Per-thread working state (regex match regions, word buffers). */
typedef struct fso_tok_worker fso_tok_worker;

/* A growing array of token ids. */
typedef struct fso_ids {
    int32_t *v;
    size_t n, cap;
} fso_ids;

/* Load dir/tokenizer.json and, when present, dir/tokenizer_config.json
 * (bos_token, eos_token). Returns 0 or a negative errno with err naming the
 * file, the JSON place and the fix. */
int fso_tokenizer_load(fso_tokenizer **out, const char *dir, char *err, size_t errlen);
void fso_tokenizer_free(fso_tokenizer *t);

/* Ids 0 .. n-1 cover every token, added ones included. */
int32_t fso_tokenizer_vocab_size(const fso_tokenizer *t);
/* The id of a token (an added token's content, or a vocabulary entry as
 * written in tokenizer.json), or -1. */
int32_t fso_tokenizer_token_id(const fso_tokenizer *t, const char *content);
/* BOS and EOS from tokenizer_config.json (else the post-processor's
 * template), -1 when the tokenizer has none. add_bos: the tokenizer's
 * post-processor puts BOS before every sequence (Llama 2 and 3, not GPT-2
 * or Qwen2). */
int32_t fso_tokenizer_bos(const fso_tokenizer *t);
int32_t fso_tokenizer_eos(const fso_tokenizer *t);
int fso_tokenizer_adds_bos(const fso_tokenizer *t);

fso_tok_worker *fso_tok_worker_new(const fso_tokenizer *t);
void fso_tok_worker_free(fso_tok_worker *w);

/* Append the ids of text (len bytes of UTF-8, no special tokens parsed) to
 * out. Returns 0, -ENOMEM, or -EILSEQ for invalid UTF-8 with err naming the
 * byte offset. Thread-safe across workers of one tokenizer. */
int fso_tokenizer_encode(fso_tok_worker *w, const char *text, size_t len, fso_ids *out,
                         char *err, size_t errlen);

/* Append the text of ids to a NUL-terminated malloc'd string (*out, *len):
 * the library's decode(ids, skip_special_tokens=False). 0 or -ENOMEM. */
int fso_tokenizer_decode(const fso_tokenizer *t, const int32_t *ids, size_t n, char **out,
                         size_t *len);

int fso_ids_push(fso_ids *ids, int32_t id);
void fso_ids_free(fso_ids *ids);

#endif
