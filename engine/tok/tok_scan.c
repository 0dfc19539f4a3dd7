/* tok_scan.c — the three split patterns of the byte-level families (GPT-2's
 * built-in one, Llama 3's and Qwen2's), matched by hand on ASCII text.
 *
 * Contract: tok_scan_match(kind, s, len, pos) returns the end of the match
 * that Oniguruma finds at pos (the first alternative that matches, each
 * quantifier greedy and backtracking), or 0 when that match would depend on
 * a byte >= 0x80: the caller then asks Oniguruma. On ASCII the classes are
 * fixed: \p{L} = [A-Za-z], \p{N} = [0-9], \s = [\t\n\v\f\r ], and the
 * case-insensitive contractions fold only ASCII letters (the non-ASCII ones
 * that fold to them, like U+017F for s, make the scan give up). Only the
 * exact pattern strings are recognized (tok_scan_kind); any other pattern,
 * even an equivalent one, runs on Oniguruma.
 *
 *   GPT2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   LLAMA3 (QWEN2 has \p{N} for \p{N}{1,3}):
 *          (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 */
#include "tok_impl.h"

#include <string.h>

static const char P_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char P_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char P_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

tok_scan_kind tok_scan_kind_of(const char *pat, size_t len)
{
    if (len == sizeof P_GPT2 - 1 && !memcmp(pat, P_GPT2, len))
        return TOK_SCAN_GPT2;
    if (len == sizeof P_LLAMA3 - 1 && !memcmp(pat, P_LLAMA3, len))
        return TOK_SCAN_LLAMA3;
    if (len == sizeof P_QWEN2 - 1 && !memcmp(pat, P_QWEN2, len))
        return TOK_SCAN_QWEN2;
    return TOK_SCAN_NONE;
}

/* Character classes of one byte; H (high) means >= 0x80: unknown here. */
enum { C_L = 1, C_N = 2, C_S = 4, C_NL = 8, C_H = 16 };

static inline int cls(unsigned char c)
{
    if (c >= 0x80)
        return C_H;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
        return C_L;
    if (c >= '0' && c <= '9')
        return C_N;
    if (c == '\n' || c == '\r')
        return C_S | C_NL;
    if (c == ' ' || (c >= '\t' && c <= '\f'))
        return C_S;
    return 0; /* other ASCII: punctuation, symbols, controls */
}

/* The end of a run of class mask from p (p itself included when it is in
 * it), or 0 when the run reaches a byte >= 0x80. */
static size_t run(const char *s, size_t len, size_t p, int mask)
{
    while (p < len) {
        int c = cls((unsigned char)s[p]);
        if (c & C_H)
            return 0;
        if (!(c & mask))
            break;
        p++;
    }
    return p;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) or the case-sensitive form at s[p] == '\''. */
static size_t contraction(const char *s, size_t len, size_t p, bool fold, bool *unknown)
{
    *unknown = false;
    if (p + 1 >= len)
        return 0;
    unsigned char a = (unsigned char)s[p + 1], b = p + 2 < len ? (unsigned char)s[p + 2] : 0;
    if (a >= 0x80 || (b >= 0x80 && fold)) {
        *unknown = true;
        return 0;
    }
    if (fold) {
        a = (unsigned char)(a >= 'A' && a <= 'Z' ? a | 0x20 : a);
        b = (unsigned char)(b >= 'A' && b <= 'Z' ? b | 0x20 : b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return p + 2;
    if ((a == 'r' || a == 'v') && b == 'e')
        return p + 3;
    if (a == 'l' && b == 'l')
        return p + 3;
    return 0;
}

/* The end of a run of "other" ASCII (not \s, \p{L}, \p{N}) from p, or 0. */
static size_t run_other(const char *s, size_t len, size_t p)
{
    while (p < len) {
        int c = cls((unsigned char)s[p]);
        if (c & C_H)
            return 0;
        if (c != 0)
            break;
        p++;
    }
    return p;
}

size_t tok_scan_match(tok_scan_kind kind, const char *s, size_t len, size_t pos)
{
    int c0 = cls((unsigned char)s[pos]);
    if (c0 & C_H)
        return 0;
    bool unknown, has1 = pos + 1 < len;
    int c1 = has1 ? cls((unsigned char)s[pos + 1]) : 0;
    if (has1 && (c1 & C_H) && !(c0 & C_NL) && c0 != C_L && c0 != C_N)
        return 0; /* the next character decides, and it is not ASCII */
    if (s[pos] == '\'') {
        size_t e = contraction(s, len, pos, kind != TOK_SCAN_GPT2, &unknown);
        if (unknown)
            return 0;
        if (e)
            return e;
    }
    if (kind == TOK_SCAN_GPT2) {
        /* ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+` */
        size_t q = pos;
        int c = c0;
        if (s[pos] == ' ' && has1 && (c1 == C_L || c1 == C_N || c1 == 0)) {
            q = pos + 1;
            c = c1;
        }
        if (c == C_L)
            return run(s, len, q, C_L);
        if (c == C_N)
            return run(s, len, q, C_N);
        if (c == 0)
            return run_other(s, len, q);
    } else {
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!(c0 & (C_NL | C_L | C_N)) && has1 && c1 == C_L)
            return run(s, len, pos + 1, C_L);
        if (c0 == C_L)
            return run(s, len, pos, C_L);
        /* \p{N}{1,3} (Llama 3) or \p{N} (Qwen2) */
        if (c0 == C_N) {
            size_t max = kind == TOK_SCAN_QWEN2 ? 1 : 3, e = pos;
            while (e < len && e - pos < max) {
                int c = cls((unsigned char)s[e]);
                if (c & C_H)
                    return 0;
                if (c != C_N)
                    break;
                e++;
            }
            return e;
        }
        /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
        bool other = c0 == 0;
        size_t q = pos;
        if (!other && s[pos] == ' ' && has1 && c1 == 0) {
            other = true;
            q = pos + 1;
        }
        if (other) {
            size_t e = run_other(s, len, q);
            if (!e)
                return 0;
            while (e < len && (s[e] == '\r' || s[e] == '\n'))
                e++;
            return e;
        }
    }
    if (!(c0 & C_S))
        return 0; /* not reached on ASCII: every class is handled above */
    /* whitespace: the run [pos, q) and what ends it */
    size_t q = run(s, len, pos, C_S);
    if (!q)
        return 0;
    if (kind != TOK_SCAN_GPT2) {
        /* \s*[\r\n]+: up to and including the run's last CR or LF */
        for (size_t k = q; k > pos; k--)
            if (cls((unsigned char)s[k - 1]) & C_NL)
                return k;
    }
    /* \s+(?!\S): all of the run at the end of the text, else all but its
     * last character; \s+: the whole run */
    if (q == len)
        return q;
    if (q - pos >= 2)
        return q - 1;
    return q;
}
