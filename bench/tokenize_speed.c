/* tokenize_speed.c — how fast fsoff's tokenizer (engine/tok/tokenizer.h)
 * encodes text on one core: MB/s of UTF-8 input, one worker, the text cut
 * into chunks at line ends (as documents would be) and encoded over and over
 * for at least --seconds. The round-trip column checks that decode(encode)
 * gives the text back (byte-level tokenizers; "-" for others, whose
 * normalizers need not round-trip).
 *
 *   tokenize_speed --tokenizer DIR --text FILE [--seconds S] [--json]
 *
 * bench/tokenize_speed.sh runs it beside tiktoken (node) on the same text
 * and prints the ratio.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok/tokenizer.h"

#define CHUNK_BYTES (64 << 10)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static void usage(void)
{
    fprintf(stderr, "usage: tokenize_speed --tokenizer DIR --text FILE [--seconds S] [--json]\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *text_path = NULL;
    double seconds = 3.0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text_path = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            usage();
            return 2;
        }
    }
    if (!dir || !text_path) {
        usage();
        return 2;
    }
    char err[1024] = "";
    fso_tokenizer *t = NULL;
    int rc = fso_tokenizer_load(&t, dir, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tokenize_speed: %s\n", err);
        return 1;
    }
    size_t len = 0;
    char *text = read_file(text_path, &len);
    if (!text) {
        fprintf(stderr, "tokenize_speed: %s: %s\n", text_path, strerror(errno));
        return 1;
    }
    /* chunks end at a newline (or the end), never inside a character */
    size_t nchunks = 0, *cut = malloc((len / CHUNK_BYTES + 2) * 2 * sizeof *cut);
    for (size_t p = 0; p < len;) {
        size_t e = p + CHUNK_BYTES < len ? p + CHUNK_BYTES : len;
        while (e < len && text[e - 1] != '\n')
            e++;
        cut[nchunks++] = e;
        p = e;
    }
    fso_tok_worker *w = fso_tok_worker_new(t);
    fso_ids ids = {0};
    size_t tokens = 0;
    /* one untimed pass: the round trip, the token count */
    bool round_trip = true;
    char *dec = NULL;
    size_t dl;
    for (size_t c = 0, p = 0; c < nchunks; p = cut[c++]) {
        ids.n = 0;
        if ((rc = fso_tokenizer_encode(w, text + p, cut[c] - p, &ids, err, sizeof err))) {
            fprintf(stderr, "tokenize_speed: %s: %s\n", text_path, err);
            return 1;
        }
        tokens += ids.n;
        if (fso_tokenizer_decode(t, ids.v, ids.n, &dec, &dl) == 0)
            round_trip &= dl == cut[c] - p && !memcmp(dec, text + p, dl);
        free(dec);
    }
    bool byte_level = fso_tokenizer_token_id(t, "Ġ") >= 0 || fso_tokenizer_token_id(t, "Ċ") >= 0;
    double t0 = now_s(), el;
    size_t passes = 0;
    do {
        for (size_t c = 0, p = 0; c < nchunks; p = cut[c++]) {
            ids.n = 0;
            fso_tokenizer_encode(w, text + p, cut[c] - p, &ids, err, sizeof err);
        }
        passes++;
        el = now_s() - t0;
    } while (el < seconds);
    double mbps = (double)len * (double)passes / el / 1e6;
    const char *rt = !byte_level ? "-" : round_trip ? "OK" : "FAILED";
    if (json) {
        printf("{\"tokenizer\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"passes\": %zu, "
               "\"seconds\": %.3f, \"mb_per_s\": %.2f, \"round_trip\": \"%s\"}\n",
               dir, len, tokens, passes, el, mbps, rt);
    } else {
        printf("# tokenize_speed: fsoff's tokenizer, one worker on one core\n");
        printf("# %10s %10s %7s %8s %8s %10s\n", "bytes", "tokens", "passes", "seconds", "MB/s",
               "round-trip");
        printf("# %10s %10s %7s %8s %8s %10s\n", "(B)", "(count)", "", "(s)", "(1e6 B/s)", "");
        printf("  %10zu %10zu %7zu %8.2f %8.2f %10s\n", len, tokens, passes, el, mbps, rt);
        printf("# %s: %.2f bytes/token, %.2f MB/s per core: %s\n", dir,
               tokens ? (double)len / (double)tokens : 0.0, mbps,
               strcmp(rt, "FAILED") ? "OK" : "FAILED");
    }
    fso_ids_free(&ids);
    fso_tok_worker_free(w);
    fso_tokenizer_free(t);
    free(cut);
    free(text);
    return strcmp(rt, "FAILED") ? 0 : 1;
}
