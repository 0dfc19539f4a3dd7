/* docs.c — reading and parsing `fsoff tokenize`'s inputs (docs.h). */
#include "docs.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

#define READ_BYTES ((size_t)1 << 20)

static const char *const format_names[] = {"text", "jsonl", "chat"};

int fso_docs_format_parse(const char *name, fso_docs_format *f)
{
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, format_names[i]) == 0) {
            *f = (fso_docs_format)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *fso_docs_format_name(fso_docs_format f)
{
    return format_names[f];
}

static const char *open_fix(int e)
{
    switch (e) {
    case ENOENT:
        return "check the path";
    case EACCES:
    case EPERM:
        return "make it readable (chmod +r) or run as a user who may read it";
    case EISDIR:
        return "give the files inside the folder";
    default:
        return "check the file";
    }
}

/* --- UTF-8 */

size_t fso_utf8_check(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xbf;   /* the second byte's range */
        if (c >= 0xc2 && c <= 0xdf)
            need = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            if (c == 0xe0)
                lo = 0xa0;   /* overlong */
            if (c == 0xed)
                hi = 0x9f;   /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            if (c == 0xf0)
                lo = 0x90;   /* overlong */
            if (c == 0xf4)
                hi = 0x8f;   /* above U+10FFFF */
        } else
            return i;
        if (len - i <= need)
            return i;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
        i += need + 1;
    }
    return i;
}

/* --- reading */

void fso_docs_batch_free(fso_docs_batch *b)
{
    free(b->buf);
    free(b->recs);
    memset(b, 0, sizeof *b);
}

static int batch_put(fso_docs_batch *b, const char *s, size_t len)
{
    if (fso_reserve((void **)&b->buf, &b->cap, b->len + len, 1, 1 << 16) < 0)
        return -ENOMEM;
    memcpy(b->buf + b->len, s, len);
    b->len += len;
    return 0;
}

static int batch_rec(fso_docs_batch *b, fso_docs_rec rec)
{
    if (fso_reserve((void **)&b->recs, &b->cap_recs, b->n + 1, sizeof *b->recs, 256) < 0)
        return -ENOMEM;
    b->recs[b->n++] = rec;
    return 0;
}

void fso_docs_reader_init(fso_docs_reader *r, const char *const *paths, int n,
                          fso_docs_format format)
{
    memset(r, 0, sizeof *r);
    r->paths = paths;
    r->n_paths = n;
    r->format = format;
    r->fd = -1;
}

void fso_docs_reader_free(fso_docs_reader *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r->rbuf);
    free(r->line);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

static int open_file(fso_docs_reader *r, char *err, size_t errlen)
{
    const char *path = r->paths[r->file];
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        int e = errno;
        fso_set_err(err, errlen, "%s: cannot open: %s; %s", path, strerror(e), open_fix(e));
        return -e;
    }
    r->rlen = r->rpos = 0;
    r->rbuf_byte = 0;
    r->file_eof = 0;
    r->line_no = 0;
    return 0;
}

/* The next line of the current file into r->line (its '\n' kept), with its
 * number and file offset. 1, 0 at the end of the file, or negative errno. */
static int next_line(fso_docs_reader *r, uint64_t *line_no, uint64_t *byte, char *err,
                     size_t errlen)
{
    r->line_len = 0;
    *byte = r->rbuf_byte + r->rpos;
    for (;;) {
        if (r->rpos == r->rlen) {
            if (r->file_eof)
                break;
            if (!r->rbuf && !(r->rbuf = malloc(READ_BYTES)))
                return -ENOMEM;
            r->rbuf_byte += r->rlen;
            r->rpos = 0;
            ssize_t got = fso_read_full(r->fd, r->rbuf, READ_BYTES);
            if (got < 0) {
                fso_set_err(err, errlen, "%s: read failed at byte %llu: %s; check the file and the "
                        "drive", r->paths[r->file], (unsigned long long)r->rbuf_byte,
                        strerror((int)-got));
                return (int)got;
            }
            r->rlen = (size_t)got;
            r->bytes_read += (uint64_t)got;
            if ((size_t)got < READ_BYTES)
                r->file_eof = 1;
            if (got == 0)
                break;
        }
        const char *start = r->rbuf + r->rpos;
        const char *nl = memchr(start, '\n', r->rlen - r->rpos);
        size_t take = nl ? (size_t)(nl - start) + 1 : r->rlen - r->rpos;
        if (fso_reserve((void **)&r->line, &r->line_cap, r->line_len + take + 1, 1, 4096) < 0)
            return -ENOMEM;
        memcpy(r->line + r->line_len, start, take);
        r->line_len += take;
        r->rpos += take;
        if (nl)
            break;
    }
    if (r->line_len == 0)
        return 0;
    *line_no = ++r->line_no;
    return 1;
}

static bool is_blank_text_line(const char *s, size_t len)
{
    return (len == 1 && s[0] == '\n') || (len == 2 && s[0] == '\r' && s[1] == '\n');
}

static bool is_blank_json_line(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    return true;
}

static int doc_begin(fso_docs_reader *r, fso_docs_batch *b, uint64_t line, uint64_t byte)
{
    r->in_doc = 1;
    r->doc_start = b->len;
    r->doc_line = line;
    r->doc_byte = byte;
    return 0;
}

/* The document being read, if it has bytes, as a record. */
static int doc_end(fso_docs_reader *r, fso_docs_batch *b)
{
    int rc = 0;
    if (r->in_doc && b->len > r->doc_start)
        rc = batch_rec(b, (fso_docs_rec){.off = r->doc_start, .len = b->len - r->doc_start,
                                          .file = r->file, .line = r->doc_line,
                                          .byte = r->doc_byte});
    r->in_doc = 0;
    r->held = 0;
    return rc;
}

/* One line of a text file: blank lines are held until the next non-blank
 * line says whether they separate documents (two or more) or belong to
 * the document (one). 1 when the line ended a document and the batch holds
 * max_bytes: the line is left unread (r->pending) for the next batch. */
static int text_line(fso_docs_reader *r, fso_docs_batch *b, uint64_t line, uint64_t byte,
                     size_t max_bytes)
{
    const char *s = r->line;
    size_t len = r->line_len;
    int rc;
    if (is_blank_text_line(s, len)) {
        if (r->held++ == 0) {
            memcpy(r->held_first, s, len);
            r->held_first_len = len;
            r->held_line = line;
            r->held_byte = byte;
        }
        return 0;
    }
    if (r->held >= 2) {
        if ((rc = doc_end(r, b)) < 0)
            return rc;
        if (b->len >= max_bytes) {
            r->pending = 1;
            r->pending_line = line;
            r->pending_byte = byte;
            return 1;
        }
    } else if (r->held == 1) {
        if (!r->in_doc)
            doc_begin(r, b, r->held_line, r->held_byte);
        if ((rc = batch_put(b, r->held_first, r->held_first_len)) < 0)
            return rc;
    }
    r->held = 0;
    if (!r->in_doc)
        doc_begin(r, b, line, byte);
    return batch_put(b, s, len);
}

/* At a text file's end: one held blank line belongs to the document. */
static int text_eof(fso_docs_reader *r, fso_docs_batch *b)
{
    int rc;
    if (r->held == 1 && r->in_doc && (rc = batch_put(b, r->held_first, r->held_first_len)) < 0)
        return rc;
    return doc_end(r, b);
}

int fso_docs_read(fso_docs_reader *r, fso_docs_batch *b, size_t max_bytes, char *err,
                  size_t errlen)
{
    int rc;
    b->len = 0;
    b->n = 0;
    while (r->file < r->n_paths) {
        if (r->fd < 0 && (rc = open_file(r, err, errlen)) < 0)
            return rc;
        uint64_t line, byte;
        for (;;) {
            if (r->pending) {
                r->pending = 0;
                line = r->pending_line;
                byte = r->pending_byte;
            } else if ((rc = next_line(r, &line, &byte, err, errlen)) <= 0) {
                break;
            }
            if (r->format == FSO_DOCS_TEXT) {
                if ((rc = text_line(r, b, line, byte, max_bytes)) < 0)
                    goto nomem;
                if (rc > 0)
                    return (int)b->n;
            } else if (!is_blank_json_line(r->line, r->line_len)) {
                size_t len = r->line_len;
                if ((rc = batch_put(b, r->line, len)) < 0 ||
                    (rc = batch_rec(b, (fso_docs_rec){.off = b->len - len, .len = len,
                                                      .file = r->file, .line = line,
                                                      .byte = byte})) < 0)
                    goto nomem;
                if (b->len >= max_bytes)
                    return (int)b->n;
            }
        }
        if (rc < 0)
            return rc;
        if (r->format == FSO_DOCS_TEXT && (rc = text_eof(r, b)) < 0)
            goto nomem;
        close(r->fd);
        r->fd = -1;
        r->file++;
        if (b->len >= max_bytes)
            return (int)b->n;
    }
    return (int)b->n;
nomem:
    fso_set_err(err, errlen, "%s: out of memory reading line %llu", r->paths[r->file],
            (unsigned long long)r->line_no);
    return rc;
}

/* --- parsing */

/* "PATH:LINE: byte OFFSET: " for the byte at rec[i]. */
static int where(char *err, size_t errlen, const char *path, const char *rec, size_t i,
                 uint64_t line, uint64_t byte)
{
    for (size_t k = 0; k < i; k++)
        line += rec[k] == '\n';
    return snprintf(err, errlen, "%s:%llu: byte %llu: ", path, (unsigned long long)line,
                    (unsigned long long)(byte + i));
}

__attribute__((format(printf, 8, 9)))
static int rec_err(char *err, size_t errlen, int rc, const char *path, const char *rec, size_t i,
                   uint64_t line_byte[2], const char *fmt, ...)
{
    int k = where(err, errlen, path, rec, i, line_byte[0], line_byte[1]);
    if (k >= 0 && (size_t)k < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* The messages of array arr (named key) into d->chat, trained when
 * `trained` (and assistant). */
static int parse_messages(fso_doc *d, const json_t *arr, const char *key, int trained,
                          const char *path, const char *rec, uint64_t lb[2], char *err,
                          size_t errlen)
{
    size_t i;
    const json_t *m;
    json_array_foreach(arr, i, m) {
        if (!json_is_object(m))
            return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "%s[%zu] is %s, not an object "
                           "{\"role\": ..., \"content\": ...}; write each message as such an "
                           "object", key, i, json_kind(m));
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role))
            return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "%s[%zu] has no \"role\" string; "
                           "give each message a role: \"system\", \"user\" or \"assistant\"", key, i);
        if (!json_is_string(content))
            return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "%s[%zu] has no \"content\" "
                           "string%s; give each message its text as a string", key, i,
                           content ? " (it is not a string)" : "");
        fso_chat_role r;
        if (fso_chat_role_parse(json_string_value(role), json_string_length(role), &r) < 0)
            return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "%s[%zu].role is \"%s\", a role "
                           "fsoff's chat templates do not have; use \"system\", \"user\" or "
                           "\"assistant\"", key, i, json_string_value(role));
        if (fso_chat_push(&d->chat, r, json_string_value(content), json_string_length(content),
                          trained && r == FSO_ROLE_ASSISTANT) < 0)
            return -ENOMEM;
    }
    return 0;
}

int fso_doc_parse(fso_doc *d, fso_docs_format format, const char *rec, size_t len,
                  const char *path, uint64_t line, uint64_t byte, char *err, size_t errlen)
{
    uint64_t lb[2] = {line, byte};
    memset(d, 0, sizeof *d);
    size_t bad = fso_utf8_check(rec, len);
    if (bad < len)
        return rec_err(err, errlen, -EILSEQ, path, rec, bad, lb, "invalid UTF-8 (byte 0x%02x); "
                       "fsoff reads UTF-8 text, as Hugging Face tokenizers do: convert the file "
                       "(e.g. iconv -f LATIN1 -t UTF-8) or remove the byte",
                       (unsigned char)rec[bad]);
    if (format == FSO_DOCS_TEXT) {
        d->text = rec;
        d->len = len;
        return 0;
    }
    json_error_t je;
    json_t *root = json_loadb(rec, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return rec_err(err, errlen, -EINVAL, path, rec, je.position > 0 ? (size_t)je.position - 1 : 0,
                       lb, "not JSON: %s; each line must be one JSON object", je.text);
    d->root = root;
    if (!json_is_object(root))
        return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "the line is %s, not a JSON object; "
                       "each line must be an object such as %s", json_kind(root),
                       format == FSO_DOCS_JSONL ? "{\"text\": \"...\"}"
                                                : "{\"messages\": [{\"role\": \"user\", "
                                                  "\"content\": \"...\"}, ...]}");
    if (format == FSO_DOCS_JSONL) {
        const json_t *t = json_object_get(root, "text");
        if (!json_is_string(t))
            return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "%s; give every line a \"text\" "
                           "string%s", t ? "\"text\" is not a string" : "no \"text\" key",
                           json_object_get(root, "messages") || json_object_get(root, "prompt")
                               ? ", or use --format chat for conversations" : "");
        d->text = json_string_value(t);
        d->len = json_string_length(t);
        return 0;
    }
    const json_t *msgs = json_object_get(root, "messages");
    const json_t *prompt = json_object_get(root, "prompt"),
                 *completion = json_object_get(root, "completion");
    if (json_is_array(msgs))
        return parse_messages(d, msgs, "messages", 1, path, rec, lb, err, errlen);
    if (json_is_string(prompt) && json_is_string(completion)) {
        d->chat.pair = 1;
        d->chat.prompt = json_string_value(prompt);
        d->chat.prompt_len = json_string_length(prompt);
        d->chat.completion = json_string_value(completion);
        d->chat.completion_len = json_string_length(completion);
        return 0;
    }
    if (json_is_array(prompt) && json_is_array(completion)) {
        int rc = parse_messages(d, prompt, "prompt", 0, path, rec, lb, err, errlen);
        return rc < 0 ? rc : parse_messages(d, completion, "completion", 1, path, rec, lb, err,
                                            errlen);
    }
    if (msgs)
        return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "\"messages\" is %s, not an array; "
                       "give it as [{\"role\": ..., \"content\": ...}, ...]", json_kind(msgs));
    if (prompt || completion)
        return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "\"prompt\" and \"completion\" must "
                       "both be strings or both arrays of messages; give both, of one kind");
    return rec_err(err, errlen, -EINVAL, path, rec, 0, lb, "no \"messages\" array and no "
                   "\"prompt\"/\"completion\" pair; give every line one of them%s",
                   json_object_get(root, "text") ? ", or use --format jsonl for \"text\" lines"
                                                 : "");
}

void fso_doc_free(fso_doc *d)
{
    if (d->root)
        json_decref(d->root);
    fso_chat_free(&d->chat);
    memset(d, 0, sizeof *d);
}

/* --- detection */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int fso_docs_detect(const char *path, fso_docs_format *f, char *why, size_t whylen, char *err,
                    size_t errlen)
{
    static const char *const json_ext[] = {".jsonl", ".ndjson", ".json"};
    const char *ext = NULL;
    for (int i = 0; i < 3; i++)
        if (ends_with(path, json_ext[i]))
            ext = json_ext[i];
    if (!ext) {
        const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
        *f = FSO_DOCS_TEXT;
        if (dot && (!slash || dot > slash))
            snprintf(why, whylen, "by its extension %s", dot);
        else
            snprintf(why, whylen, "by its name, which has no .jsonl extension");
        return 0;
    }
    /* the first non-blank line */
    fso_docs_reader r;
    fso_docs_reader_init(&r, &path, 1, FSO_DOCS_JSONL);
    int rc = open_file(&r, err, errlen);
    uint64_t line = 0, byte = 0;
    while (rc == 0) {
        rc = next_line(&r, &line, &byte, err, errlen);
        if (rc == 0) {
            fso_set_err(err, errlen, "%s: empty: no documents; give a file with one JSON object "
                        "per line", path);
            rc = -EINVAL;
        } else if (rc > 0 && !is_blank_json_line(r.line, r.line_len)) {
            rc = 1;
            break;
        } else if (rc > 0) {
            rc = 0;
        }
    }
    if (rc == 1) {
        fso_doc d;
        uint64_t lb[2] = {line, byte};
        rc = fso_doc_parse(&d, FSO_DOCS_JSONL, r.line, r.line_len, path, line, byte, err, errlen);
        if (rc == 0 || (d.root && json_is_object(d.root))) {
            rc = 0;
            if (json_object_get(d.root, "text")) {
                *f = FSO_DOCS_JSONL;
                snprintf(why, whylen, "by its extension %s and the \"text\" key of line %llu", ext,
                         (unsigned long long)line);
            } else if (json_object_get(d.root, "messages") || json_object_get(d.root, "prompt")) {
                *f = FSO_DOCS_CHAT;
                snprintf(why, whylen, "by its extension %s and the \"%s\" key of line %llu", ext,
                         json_object_get(d.root, "messages") ? "messages" : "prompt",
                         (unsigned long long)line);
            } else {
                rc = rec_err(err, errlen, -EINVAL, path, r.line, 0, lb, "the object has no "
                             "\"text\", \"messages\" or \"prompt\" key, so its format is unknown; "
                             "give --format text, jsonl or chat");
            }
        }
        fso_doc_free(&d);
    }
    fso_docs_reader_free(&r);
    return rc;
}
