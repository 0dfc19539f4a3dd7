/* chat.h — conversations rendered as fsoff's built-in chat templates, into
 * pieces the tokenizer encodes: text spans and special tokens given by id
 * (never parsed from the conversation's text), each marked as trained on
 * (a target of the loss) or not.
 *
 * Templates (the Hugging Face chat_template each one reproduces, for
 * conversations of system, user and assistant messages, without tools and
 * without a generation prompt):
 *   llama3  <|begin_of_text|>, then per message
 *           <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *           with CONTENT stripped of surrounding whitespace (Jinja's trim).
 *           Dated (Llama 3.1 and 3.2): a system block always comes first,
 *           "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul
 *           2024\n\n" and the first message's content when it is a system
 *           message. The date is pinned to the templates' own fallback, so
 *           a file tokenized on any day is the same.
 *   chatml  (Qwen2, Qwen2.5) per message <|im_start|>ROLE\nCONTENT<|im_end|>\n,
 *           after the tokenizer's default system message when the
 *           conversation does not start with one.
 *   inst    (Llama 2) after an optional first system message, messages
 *           alternate user, assistant, ...: a user message is
 *           <s>[INST] CONTENT [/INST] and an assistant message " CONTENT "
 *           then </s>, contents stripped; the system message is folded into
 *           the first user message as <<SYS>>\nSYSTEM\n<</SYS>>\n\n.
 * Trained on: an assistant message's content and the special token that
 * ends its turn (<|eot_id|>, <|im_end|>, </s>), as TRL's assistant-only
 * loss counts them; everything else is context.
 */
#ifndef FSO_CHAT_H
#define FSO_CHAT_H

#include <stddef.h>
#include <stdint.h>

typedef enum fso_chat_role {
    FSO_ROLE_SYSTEM,
    FSO_ROLE_USER,
    FSO_ROLE_ASSISTANT,
} fso_chat_role;

/* "system", "user", "assistant" (exactly): 0, or -EINVAL. */
int fso_chat_role_parse(const char *name, size_t len, fso_chat_role *role);
const char *fso_chat_role_name(fso_chat_role role);

typedef struct fso_chat_msg {
    fso_chat_role role;
    const char *content;
    size_t len;
    int trained;      /* an assistant message whose content is a target */
} fso_chat_msg;

/* A conversation, or (pair) a prompt-completion pair of strings. */
typedef struct fso_chat {
    fso_chat_msg *msgs;
    size_t n, cap;
    int pair;
    const char *prompt, *completion;
    size_t prompt_len, completion_len;
} fso_chat;

int fso_chat_push(fso_chat *c, fso_chat_role role, const char *content, size_t len, int trained);
void fso_chat_free(fso_chat *c);

typedef enum fso_chat_kind {
    FSO_CHAT_LLAMA3,
    FSO_CHAT_CHATML,
    FSO_CHAT_INST,
} fso_chat_kind;
#define FSO_CHAT_KINDS 3

/* "llama3", "chatml", "inst": 0, or -EINVAL. */
int fso_chat_kind_parse(const char *name, fso_chat_kind *kind);
const char *fso_chat_kind_name(fso_chat_kind kind);

/* The special tokens of a template, in this order:
 *   llama3  <|begin_of_text|> <|start_header_id|> <|end_header_id|> <|eot_id|>
 *   chatml  <|im_start|> <|im_end|>
 *   inst    the tokenizer's BOS and EOS (<s>, </s>) */
#define FSO_CHAT_SPECIALS 4
/* Their contents (NULL past the kind's last; inst's are the usual names). */
const char *fso_chat_special_name(fso_chat_kind kind, int i);
int fso_chat_special_count(fso_chat_kind kind);

typedef struct fso_chat_template {
    fso_chat_kind kind;
    int dated;                          /* llama3: the 3.1/3.2 system block */
    char *default_system;               /* chatml: or NULL for none */
    int32_t ids[FSO_CHAT_SPECIALS];     /* the specials' ids */
} fso_chat_template;

void fso_chat_template_free(fso_chat_template *ct);

/* The template for the tokenizer t loaded from folder dir: kind when
 * kind >= 0, else by dir/tokenizer_config.json's chat_template text (which
 * names <|start_header_id|>, <|im_start|> or [INST]), else by the special
 * tokens t has (<|start_header_id|> and <|eot_id|>, or <|im_start|>). The
 * chat_template text also says whether llama3 is dated ("Cutting Knowledge
 * Date") and chatml's default system message (its literal
 * '<|im_start|>system\n...<|im_end|>'); a chat_template that writes
 * <think> blocks (Qwen3's) is refused unless kind is given, as chatml does
 * not reproduce it. why gets how the choice was made.
 * 0, or -EINVAL (no template fits, a special token is missing) with err
 * naming the folder and the fix. */
struct fso_tokenizer;
int fso_chat_template_pick(fso_chat_template *ct, const struct fso_tokenizer *t, const char *dir,
                           int kind, char *why, size_t whylen, char *err, size_t errlen);

/* A rendered conversation: pieces in order, each a special token (special
 * >= 0, trained or not) or a span text[off, off+len) of which the bytes
 * from target_from on are trained on (target_from == len: none). */
typedef struct fso_chat_piece {
    int32_t special;
    int trained;
    size_t off, len, target_from;
} fso_chat_piece;

typedef struct fso_chat_render {
    char *text;
    size_t len, cap;
    fso_chat_piece *p;
    size_t n, cap_p;
} fso_chat_render;

/* Render c with ct into r (emptied first). 0, -ENOMEM, or -EINVAL with err
 * saying what the template cannot take (inst: roles out of turn). */
int fso_chat_render_conv(const fso_chat_template *ct, const fso_chat *c, fso_chat_render *r,
                         char *err, size_t errlen);
/* A prompt-completion pair of strings as one document: bos (when >= 0),
 * prompt + completion as one text span whose completion is trained on,
 * then eos (when >= 0, trained on) — TRL's completion-only loss with EOS
 * added. */
int fso_chat_render_pair(const fso_chat *c, int32_t bos, int32_t eos, fso_chat_render *r);
/* One text span, all of it trained on, after delimiter (when >= 0): a
 * document of the text and jsonl formats. */
int fso_chat_render_text(const char *text, size_t len, int32_t delimiter, fso_chat_render *r);
void fso_chat_render_free(fso_chat_render *r);

/* r as the template's text (special tokens written as their contents, from
 * ct's kind), or only its trained parts (trained_only), as a malloc'd
 * string: what a test compares with the template's own rendering. NULL on
 * no memory. */
char *fso_chat_render_string(const fso_chat_template *ct, const fso_chat_render *r,
                             int trained_only);

#endif
