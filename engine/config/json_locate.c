/* json_locate.c — a position-tracking scanner over JSON text.
 *
 * Contract (json_locate.h): walk text that a JSON parser has already accepted,
 * keep line and column (1-based, UTF-8 characters, '\n' ends a line) and the
 * key path of the value being read, and stop at the first member or element
 * whose path is the one asked for. Keys are compared after decoding escapes,
 * so "a\u0062" matches the path element "ab". Nothing is allocated; recursion
 * is bounded by LOCATE_MAX_NEST.
 */
#include "json_locate.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOCATE_MAX_NEST 4096

typedef struct scanner {
    const char *p;              /* next byte to read */
    int line, col;              /* position of *p */
    const char *const *path;
    int depth;
    int found_line, found_col;
} scanner;

static void adv(scanner *s)
{
    unsigned char c = (unsigned char)*s->p;
    if (c == '\0')
        return;
    s->p++;
    if (c == '\n') {
        s->line++;
        s->col = 1;
    } else if ((c & 0xC0) != 0x80) { /* continuation bytes share their lead's column */
        s->col++;
    }
}

static void skip_ws(scanner *s)
{
    while (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')
        adv(s);
}

static int hex4(scanner *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *s->p;
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -EINVAL;
        v = v * 16 + (uint32_t)d;
        adv(s);
    }
    *out = v;
    return 0;
}

static int utf8_encode(uint32_t cp, char *buf)
{
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        buf[0] = (char)(0xC0 | (cp >> 6));
        buf[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        buf[0] = (char)(0xE0 | (cp >> 12));
        buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    buf[0] = (char)(0xF0 | (cp >> 18));
    buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* One escape sequence after the backslash; decoded bytes into buf. */
static int scan_escape(scanner *s, char *buf, int *n)
{
    char e = *s->p;
    *n = 1;
    switch (e) {
    case '"': case '\\': case '/': buf[0] = e; break;
    case 'b': buf[0] = '\b'; break;
    case 'f': buf[0] = '\f'; break;
    case 'n': buf[0] = '\n'; break;
    case 'r': buf[0] = '\r'; break;
    case 't': buf[0] = '\t'; break;
    case 'u': {
        uint32_t cp, lo;
        adv(s);
        if (hex4(s, &cp) < 0)
            return -EINVAL;
        if (cp >= 0xD800 && cp < 0xDC00 && s->p[0] == '\\' && s->p[1] == 'u') {
            adv(s);
            adv(s);
            if (hex4(s, &lo) < 0)
                return -EINVAL;
            if (lo >= 0xDC00 && lo < 0xE000)
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
                return -EINVAL;
        }
        *n = utf8_encode(cp, buf);
        return 0;
    }
    default:
        return -EINVAL;
    }
    adv(s);
    return 0;
}

/* A string token at s->p. With want, *equal says whether its decoded text is want. */
static int scan_string(scanner *s, const char *want, bool *equal)
{
    bool eq = want != NULL;
    size_t wi = 0;

    adv(s); /* opening quote */
    for (;;) {
        char buf[4];
        int n = 1;
        char c = *s->p;
        if (c == '\0')
            return -EINVAL;
        if (c == '"') {
            adv(s);
            break;
        }
        if (c == '\\') {
            adv(s);
            if (scan_escape(s, buf, &n) < 0)
                return -EINVAL;
        } else {
            buf[0] = c;
            adv(s);
        }
        for (int k = 0; eq && k < n; k++) {
            if (want[wi] == '\0' || want[wi] != buf[k])
                eq = false;
            else
                wi++;
        }
    }
    if (equal)
        *equal = eq && want[wi] == '\0';
    return 0;
}

/* The array index a path element names ("3" or "[3]"), or -1. */
static long path_index(const char *el)
{
    const char *p = el;
    bool bracket = *p == '[';
    if (bracket)
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno)
        return -1;
    if (bracket && *end++ != ']')
        return -1;
    return *end == '\0' ? v : -1;
}

static int scan_value(scanner *s, int matched, int nest);

#define MORE 2 /* scan_item: a ',' came, another item follows */

/* One member's or element's value, then what follows it: MORE after ',',
 * 0 after `close` (the container ends), 1 when the path was found inside
 * the value, -EINVAL for anything else. */
static int scan_item(scanner *s, int sub, int nest, char close)
{
    int rc = scan_value(s, sub, nest + 1);
    if (rc != 0)
        return rc;
    skip_ws(s);
    if (*s->p == ',') {
        adv(s);
        return MORE;
    }
    if (*s->p == close) {
        adv(s);
        return 0;
    }
    return -EINVAL;
}

/* matched: how many path elements the value being scanned equals (it is
 * path[0..matched)), or -1 when it is off the path. Returns 1 when found,
 * 0 when the value ended without a match, or -EINVAL. */
static int scan_object(scanner *s, int matched, int nest)
{
    bool on = matched >= 0 && matched < s->depth;

    adv(s); /* '{' */
    skip_ws(s);
    if (*s->p == '}') {
        adv(s);
        return 0;
    }
    for (;;) {
        skip_ws(s);
        if (*s->p != '"')
            return -EINVAL;
        int kline = s->line, kcol = s->col;
        bool eq = false;
        int rc = scan_string(s, on ? s->path[matched] : NULL, &eq);
        if (rc < 0)
            return rc;
        skip_ws(s);
        if (*s->p != ':')
            return -EINVAL;
        adv(s);
        int sub = -1;
        if (on && eq) {
            if (matched + 1 == s->depth) {
                s->found_line = kline;
                s->found_col = kcol;
                return 1;
            }
            sub = matched + 1;
        }
        rc = scan_item(s, sub, nest, '}');
        if (rc != MORE)
            return rc;
    }
}

static int scan_array(scanner *s, int matched, int nest)
{
    bool on = matched >= 0 && matched < s->depth;
    long want = on ? path_index(s->path[matched]) : -1;

    adv(s); /* '[' */
    skip_ws(s);
    if (*s->p == ']') {
        adv(s);
        return 0;
    }
    for (long idx = 0;; idx++) {
        skip_ws(s);
        int sub = -1;
        if (on && idx == want) {
            if (matched + 1 == s->depth) {
                s->found_line = s->line;
                s->found_col = s->col;
                return 1;
            }
            sub = matched + 1;
        }
        int rc = scan_item(s, sub, nest, ']');
        if (rc != MORE)
            return rc;
    }
}

static int scan_value(scanner *s, int matched, int nest)
{
    if (nest > LOCATE_MAX_NEST)
        return -EINVAL;
    skip_ws(s);
    char c = *s->p;
    if (c == '{')
        return scan_object(s, matched, nest);
    if (c == '[')
        return scan_array(s, matched, nest);
    if (c == '"')
        return scan_string(s, NULL, NULL);
    /* number or literal: [-+.0-9A-Za-z]+ */
    const char *start = s->p;
    while ((*s->p >= '0' && *s->p <= '9') || (*s->p >= 'a' && *s->p <= 'z') ||
           (*s->p >= 'A' && *s->p <= 'Z') || *s->p == '-' || *s->p == '+' || *s->p == '.')
        adv(s);
    return s->p == start ? -EINVAL : 0;
}

int fso_json_locate(const char *text, const char *const *path, int depth, int *line, int *col)
{
    if (!text || depth < 0 || (depth > 0 && !path))
        return -EINVAL;
    scanner s = { .p = text, .line = 1, .col = 1, .path = path, .depth = depth };
    skip_ws(&s);
    if (*s.p == '\0')
        return -EINVAL;
    if (depth == 0) {
        *line = s.line;
        *col = s.col;
        return 0;
    }
    int rc = scan_value(&s, 0, 0);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return -ENOENT;
    *line = s.found_line;
    *col = s.found_col;
    return 0;
}
