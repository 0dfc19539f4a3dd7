/* chat.c — the built-in chat templates (chat.h). */
#include "chat.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static const char *const role_names[] = {"system", "user", "assistant"};

int fso_chat_role_parse(const char *name, size_t len, fso_chat_role *role)
{
    for (int i = 0; i < 3; i++) {
        if (strlen(role_names[i]) == len && memcmp(role_names[i], name, len) == 0) {
            *role = (fso_chat_role)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *fso_chat_role_name(fso_chat_role role)
{
    return role_names[role];
}

int fso_chat_push(fso_chat *c, fso_chat_role role, const char *content, size_t len, int trained)
{
    if (fso_reserve((void **)&c->msgs, &c->cap, c->n + 1, sizeof *c->msgs, 8) < 0)
        return -ENOMEM;
    c->msgs[c->n++] = (fso_chat_msg){role, content, len, trained};
    return 0;
}

void fso_chat_free(fso_chat *c)
{
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

static const char *const kind_names[FSO_CHAT_KINDS] = {"llama3", "chatml", "inst"};
static const char *const specials[FSO_CHAT_KINDS][FSO_CHAT_SPECIALS] = {
    {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
    {"<|im_start|>", "<|im_end|>", NULL, NULL},
    {"<s>", "</s>", NULL, NULL},
};

int fso_chat_kind_parse(const char *name, fso_chat_kind *kind)
{
    for (int i = 0; i < FSO_CHAT_KINDS; i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            *kind = (fso_chat_kind)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *fso_chat_kind_name(fso_chat_kind kind)
{
    return kind_names[kind];
}

const char *fso_chat_special_name(fso_chat_kind kind, int i)
{
    return i < FSO_CHAT_SPECIALS ? specials[kind][i] : NULL;
}

int fso_chat_special_count(fso_chat_kind kind)
{
    int n = 0;
    while (n < FSO_CHAT_SPECIALS && specials[kind][n])
        n++;
    return n;
}

void fso_chat_template_free(fso_chat_template *ct)
{
    free(ct->default_system);
    memset(ct, 0, sizeof *ct);
}

/* --- rendering */

static void render_reset(fso_chat_render *r)
{
    r->len = 0;
    r->n = 0;
}

static int new_piece(fso_chat_render *r, fso_chat_piece p)
{
    if (fso_reserve((void **)&r->p, &r->cap_p, r->n + 1, sizeof *r->p, 16) < 0)
        return -ENOMEM;
    r->p[r->n++] = p;
    return 0;
}

static int put_special(fso_chat_render *r, int32_t id, bool trained)
{
    return new_piece(r, (fso_chat_piece){.special = id, .trained = trained});
}

/* Append s[0..len) to the text span being built (a new one after a special
 * token); trained text marks the span's target from here on. Within a span,
 * text after trained text is trained too: every template ends a trained
 * part with a special token. */
static int put_text(fso_chat_render *r, const char *s, size_t len, bool trained)
{
    fso_chat_piece *last = r->n ? &r->p[r->n - 1] : NULL;
    if (!last || last->special >= 0) {
        int rc = new_piece(r, (fso_chat_piece){.special = -1, .off = r->len});
        if (rc < 0)
            return rc;
        last = &r->p[r->n - 1];
        last->target_from = SIZE_MAX;
    }
    if (fso_reserve((void **)&r->text, &r->cap, r->len + len + 1, 1, 256) < 0)
        return -ENOMEM;
    if (trained && last->target_from == SIZE_MAX)
        last->target_from = last->len;
    memcpy(r->text + r->len, s, len);
    r->len += len;
    last->len += len;
    return 0;
}

static int put_str(fso_chat_render *r, const char *s, bool trained)
{
    return put_text(r, s, strlen(s), trained);
}

/* Close the spans: target_from == len where none was trained. */
static void render_seal(fso_chat_render *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->p[i].special < 0 && r->p[i].target_from > r->p[i].len)
            r->p[i].target_from = r->p[i].len;
}

/* The length of the code point at s (valid UTF-8) and its value. */
static size_t utf8_next(const unsigned char *s, size_t left, uint32_t *cp)
{
    if (s[0] < 0x80 || left < 2) {
        *cp = s[0];
        return 1;
    }
    if (s[0] < 0xe0) {
        *cp = (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
        return 2;
    }
    if (s[0] < 0xf0 && left >= 3) {
        *cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
        return 3;
    }
    if (left >= 4) {
        *cp = (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
              (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
        return 4;
    }
    *cp = s[0];
    return 1;
}

/* Python's str.isspace(), which Jinja's trim (str.strip) removes. */
static bool is_py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* s[0..*len) without leading and trailing whitespace (Jinja's trim). */
static const char *strip(const char *s, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = *len;
    uint32_t cp;
    while (a < b) {
        size_t k = utf8_next(u + a, b - a, &cp);
        if (!is_py_space(cp))
            break;
        a += k;
    }
    while (b > a) {
        size_t start = b - 1;
        while (start > a && (u[start] & 0xc0) == 0x80)
            start--;
        utf8_next(u + start, b - start, &cp);
        if (!is_py_space(cp))
            break;
        b = start;
    }
    *len = b - a;
    return s + a;
}

#define TRY(x)                                                                                    \
    do {                                                                                          \
        int rc_ = (x);                                                                            \
        if (rc_ < 0)                                                                              \
            return rc_;                                                                           \
    } while (0)

/* The Llama 3.1/3.2 system block's fixed lines; the date is the templates'
 * own fallback when no date is given. */
#define LLAMA3_DATED "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

static int render_llama3(const fso_chat_template *ct, const fso_chat *c, fso_chat_render *r)
{
    const int32_t bot = ct->ids[0], sh = ct->ids[1], eh = ct->ids[2], eot = ct->ids[3];
    size_t first = 0;
    TRY(put_special(r, bot, false));
    if (ct->dated) {
        TRY(put_special(r, sh, false));
        TRY(put_str(r, "system", false));
        TRY(put_special(r, eh, false));
        TRY(put_str(r, "\n\n" LLAMA3_DATED, false));
        if (c->n && c->msgs[0].role == FSO_ROLE_SYSTEM) {
            size_t len = c->msgs[0].len;
            const char *s = strip(c->msgs[0].content, &len);
            TRY(put_text(r, s, len, false));
            first = 1;
        }
        TRY(put_special(r, eot, false));
    }
    for (size_t i = first; i < c->n; i++) {
        const fso_chat_msg *m = &c->msgs[i];
        bool t = m->role == FSO_ROLE_ASSISTANT && m->trained;
        size_t len = m->len;
        const char *s = strip(m->content, &len);
        TRY(put_special(r, sh, false));
        TRY(put_str(r, fso_chat_role_name(m->role), false));
        TRY(put_special(r, eh, false));
        TRY(put_str(r, "\n\n", false));
        TRY(put_text(r, s, len, t));
        TRY(put_special(r, eot, t));
    }
    return 0;
}

static int render_chatml(const fso_chat_template *ct, const fso_chat *c, fso_chat_render *r)
{
    const int32_t ims = ct->ids[0], ime = ct->ids[1];
    if (ct->default_system && (c->n == 0 || c->msgs[0].role != FSO_ROLE_SYSTEM)) {
        TRY(put_special(r, ims, false));
        TRY(put_str(r, "system\n", false));
        TRY(put_str(r, ct->default_system, false));
        TRY(put_special(r, ime, false));
        TRY(put_str(r, "\n", false));
    }
    for (size_t i = 0; i < c->n; i++) {
        const fso_chat_msg *m = &c->msgs[i];
        bool t = m->role == FSO_ROLE_ASSISTANT && m->trained;
        TRY(put_special(r, ims, false));
        TRY(put_str(r, fso_chat_role_name(m->role), false));
        TRY(put_str(r, "\n", false));
        TRY(put_text(r, m->content, m->len, t));
        TRY(put_special(r, ime, t));
        TRY(put_str(r, "\n", false));
    }
    return 0;
}

static int render_inst(const fso_chat_template *ct, const fso_chat *c, fso_chat_render *r,
                       char *err, size_t errlen)
{
    const int32_t bos = ct->ids[0], eos = ct->ids[1];
    size_t first = 0;
    const fso_chat_msg *sys = NULL;
    if (c->n && c->msgs[0].role == FSO_ROLE_SYSTEM) {
        sys = &c->msgs[0];
        first = 1;
    }
    for (size_t i = first; i < c->n; i++) {
        const fso_chat_msg *m = &c->msgs[i];
        fso_chat_role want = (i - first) % 2 == 0 ? FSO_ROLE_USER : FSO_ROLE_ASSISTANT;
        if (m->role != want) {
            snprintf(err, errlen, "messages[%zu] is a %s message where the inst (Llama 2) template "
                     "takes only a %s message: after an optional first system message, its "
                     "messages alternate user, assistant, user, ...", i,
                     fso_chat_role_name(m->role), fso_chat_role_name(want));
            return -EINVAL;
        }
        if (m->role == FSO_ROLE_USER) {
            /* the template strips the user content after folding the
             * system message in: only the whole is stripped */
            size_t len = m->len;
            const char *s = m->content;
            TRY(put_special(r, bos, false));
            TRY(put_str(r, "[INST] ", false));
            if (sys && i == first) {
                size_t start = r->len;
                TRY(put_str(r, "<<SYS>>\n", false));
                TRY(put_text(r, sys->content, sys->len, false));
                TRY(put_str(r, "\n<</SYS>>\n\n", false));
                TRY(put_text(r, s, len, false));
                /* strip the folded whole in place */
                size_t whole = r->len - start;
                const char *w = strip(r->text + start, &whole);
                size_t drop = r->len - start - whole;
                memmove(r->text + start, w, whole);
                r->len -= drop;
                r->p[r->n - 1].len -= drop;
            } else {
                s = strip(s, &len);
                TRY(put_text(r, s, len, false));
            }
            TRY(put_str(r, " [/INST]", false));
        } else {
            bool t = m->trained;
            size_t len = m->len;
            const char *s = strip(m->content, &len);
            TRY(put_str(r, " ", t));
            TRY(put_text(r, s, len, t));
            TRY(put_str(r, " ", t));
            TRY(put_special(r, eos, t));
        }
    }
    return 0;
}

int fso_chat_render_conv(const fso_chat_template *ct, const fso_chat *c, fso_chat_render *r,
                         char *err, size_t errlen)
{
    render_reset(r);
    int rc = 0;
    switch (ct->kind) {
    case FSO_CHAT_LLAMA3:
        rc = render_llama3(ct, c, r);
        break;
    case FSO_CHAT_CHATML:
        rc = render_chatml(ct, c, r);
        break;
    case FSO_CHAT_INST:
        rc = render_inst(ct, c, r, err, errlen);
        break;
    }
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory rendering a conversation");
    render_seal(r);
    return rc;
}

int fso_chat_render_pair(const fso_chat *c, int32_t bos, int32_t eos, fso_chat_render *r)
{
    render_reset(r);
    if (bos >= 0)
        TRY(put_special(r, bos, false));
    TRY(put_text(r, c->prompt, c->prompt_len, false));
    TRY(put_text(r, c->completion, c->completion_len, true));
    if (eos >= 0)
        TRY(put_special(r, eos, true));
    render_seal(r);
    return 0;
}

int fso_chat_render_text(const char *text, size_t len, int32_t delimiter, fso_chat_render *r)
{
    render_reset(r);
    if (delimiter >= 0)
        TRY(put_special(r, delimiter, false));
    TRY(put_text(r, text, len, true));
    render_seal(r);
    return 0;
}

void fso_chat_render_free(fso_chat_render *r)
{
    free(r->text);
    free(r->p);
    memset(r, 0, sizeof *r);
}

char *fso_chat_render_string(const fso_chat_template *ct, const fso_chat_render *r,
                             int trained_only)
{
    size_t cap = r->len + 1, len = 0;
    for (size_t i = 0; i < r->n; i++)
        cap += 32;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (size_t i = 0; i < r->n; i++) {
        const fso_chat_piece *p = &r->p[i];
        if (p->special >= 0) {
            if (trained_only && !p->trained)
                continue;
            const char *name = NULL;
            for (int k = 0; k < fso_chat_special_count(ct->kind); k++)
                if (ct->ids[k] == p->special)
                    name = specials[ct->kind][k];
            if (name)
                len += (size_t)snprintf(s + len, cap - len, "%s", name);
            else
                len += (size_t)snprintf(s + len, cap - len, "<id %d>", p->special);
        } else {
            size_t from = trained_only ? p->target_from : 0;
            memcpy(s + len, r->text + p->off + from, p->len - from);
            len += p->len - from;
        }
    }
    s[len] = 0;
    return s;
}
