/* chat_pick.c — which built-in chat template a tokenizer folder takes
 * (fso_chat_template_pick, chat.h). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/chat.h"
#include "tok/tokenizer.h"

/* dir/tokenizer_config.json's chat_template (a string, or the one named
 * "default" of a list of {name, template}), malloc'd, or NULL when the
 * file or the key is absent or unreadable. */
static char *read_chat_template(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    /* integers as reals: model_max_length is often 1e30 written as an integer */
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!root)
        return NULL;
    const json_t *ct = json_object_get(root, "chat_template");
    const char *text = NULL;
    if (json_is_string(ct)) {
        text = json_string_value(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        const json_t *e;
        json_array_foreach(ct, i, e) {
            const json_t *name = json_object_get(e, "name");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 &&
                json_is_string(json_object_get(e, "template")))
                text = json_string_value(json_object_get(e, "template"));
        }
    }
    char *copy = text ? strdup(text) : NULL;
    json_decref(root);
    return copy;
}

/* chatml's default system message: the text of a literal
 * '<|im_start|>system\n' ... '<|im_end|>' in the template (the Jinja
 * source writes the newline as backslash-n), free of Jinja syntax. */
static char *chatml_default_system(const char *tmpl)
{
    static const char open_tag[] = "<|im_start|>system\\n", close_tag[] = "<|im_end|>";
    for (const char *p = tmpl; (p = strstr(p, open_tag)) != NULL; p++) {
        const char *s = p + strlen(open_tag), *e = strstr(s, close_tag);
        if (!e || e == s || strcspn(s, "'\"{}\\") < (size_t)(e - s))
            continue;
        return strndup(s, (size_t)(e - s));
    }
    return NULL;
}

int fso_chat_template_pick(fso_chat_template *ct, const struct fso_tokenizer *t, const char *dir,
                           int kind, char *why, size_t whylen, char *err, size_t errlen)
{
    memset(ct, 0, sizeof *ct);
    char *tmpl = read_chat_template(dir);
    const char *how;
    if (kind >= 0) {
        how = "given by --template";
    } else if (tmpl && strstr(tmpl, "<|start_header_id|>")) {
        kind = FSO_CHAT_LLAMA3;
        how = "from tokenizer_config.json's chat_template";
    } else if (tmpl && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "<think>")) {
        snprintf(err, errlen, "%s: tokenizer_config.json's chat_template writes <think> blocks "
                 "(Qwen3's), which fsoff's chatml template does not reproduce; give --template "
                 "chatml for Qwen2.5's form without them, or render the conversations yourself "
                 "and use --format jsonl", dir);
        free(tmpl);
        return -EINVAL;
    } else if (tmpl && strstr(tmpl, "<|im_start|>")) {
        kind = FSO_CHAT_CHATML;
        how = "from tokenizer_config.json's chat_template";
    } else if (tmpl && strstr(tmpl, "[INST]") && !strstr(tmpl, "<<SYS>>")) {
        snprintf(err, errlen, "%s: tokenizer_config.json's chat_template is an [INST] template "
                 "other than Llama 2's (Mistral's forms differ from it in spacing and in where a "
                 "system message goes, and so in their tokens), which fsoff does not reproduce; "
                 "give --template inst for Llama 2's form, or render the conversations yourself "
                 "and use --format jsonl", dir);
        free(tmpl);
        return -EINVAL;
    } else if (tmpl && strstr(tmpl, "[INST]")) {
        kind = FSO_CHAT_INST;
        how = "from tokenizer_config.json's chat_template";
    } else if (fso_tokenizer_token_id(t, "<|start_header_id|>") >= 0 &&
               fso_tokenizer_token_id(t, "<|eot_id|>") >= 0) {
        kind = FSO_CHAT_LLAMA3;
        how = "by the tokenizer's special tokens";
    } else if (fso_tokenizer_token_id(t, "<|im_start|>") >= 0) {
        kind = FSO_CHAT_CHATML;
        how = "by the tokenizer's special tokens";
    } else {
        snprintf(err, errlen, "%s: no chat template fsoff has fits this tokenizer: %s, and it has "
                 "neither <|start_header_id|> nor <|im_start|>; give --template llama3, chatml or "
                 "inst, or render the conversations yourself and use --format jsonl", dir,
                 tmpl ? "tokenizer_config.json's chat_template names none of <|start_header_id|>, "
                        "<|im_start|> and [INST]"
                      : "tokenizer_config.json has no chat_template");
        free(tmpl);
        return -EINVAL;
    }
    ct->kind = (fso_chat_kind)kind;
    if (kind == FSO_CHAT_INST) {
        ct->ids[0] = fso_tokenizer_bos(t);
        ct->ids[1] = fso_tokenizer_eos(t);
    } else {
        for (int i = 0; i < fso_chat_special_count(ct->kind); i++)
            ct->ids[i] = fso_tokenizer_token_id(t, fso_chat_special_name(ct->kind, i));
    }
    for (int i = 0; i < fso_chat_special_count(ct->kind); i++) {
        if (ct->ids[i] < 0) {
            snprintf(err, errlen, "%s: the %s chat template needs the token %s%s, which this "
                     "tokenizer does not have; give --template with another template, or render "
                     "the conversations yourself and use --format jsonl", dir,
                     fso_chat_kind_name(ct->kind), fso_chat_special_name(ct->kind, i),
                     kind == FSO_CHAT_INST ? (i == 0 ? " (its BOS)" : " (its EOS)") : "");
            free(tmpl);
            return -EINVAL;
        }
    }
    const char *extra = "";
    if (kind == FSO_CHAT_LLAMA3 && tmpl && strstr(tmpl, "Cutting Knowledge Date")) {
        ct->dated = 1;
        extra = ", dated (Llama 3.1/3.2: Today Date pinned to 26 Jul 2024)";
    }
    if (kind == FSO_CHAT_CHATML && tmpl) {
        ct->default_system = chatml_default_system(tmpl);
        if (ct->default_system)
            extra = ", with the template's default system message";
    }
    snprintf(why, whylen, "%s template %s%s", fso_chat_kind_name(ct->kind), how, extra);
    free(tmpl);
    return 0;
}
