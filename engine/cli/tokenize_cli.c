/* tokenize_cli.c — `fsoff tokenize` (tokenize_cli.h): the command line over
 * fso_tokenize_run (tok/tokenize.h), its progress line and its summary. */
#include "tokenize_cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tok/tokenize.h"
#include "util.h"

/* The progress line: redrawn twice a second on a terminal, else a line
 * every PROGRESS_LOG_MS. */
#define PROGRESS_TTY_MS 500.0
#define PROGRESS_LOG_MS 10000.0

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff tokenize --tokenizer DIR [options] INPUT... -o OUT.bin\n"
            "\n"
            "Tokenize text, JSONL or chat files with a Hugging Face tokenizer (DIR holds its\n"
            "tokenizer.json, and tokenizer_config.json when it has one) into a token file\n"
            "fsoff trains on: llm.c's format (v1, uint16 tokens, for vocabularies of at most\n"
            "65,535; else v7, uint32), or, for chat, fsoff's flagged format with a loss mask.\n"
            "Each document starts with the tokenizer's BOS when it adds one, else with its\n"
            "<|endoftext|> or EOS (the delimiter, named in the header), as llm.c does.\n"
            "\n"
            "  -t, --tokenizer DIR    the Hugging Face tokenizer folder (required)\n"
            "  -o, --output FILE      the token file (required); written whole or not at all\n"
            "  -f, --format FMT       text: documents separated by two or more blank lines\n"
            "                         (a file without them is one document); jsonl: a\n"
            "                         {\"text\": ...} object per line; chat: a {\"messages\":\n"
            "                         [{\"role\", \"content\"}, ...]} or {\"prompt\", \"completion\"}\n"
            "                         object per line, trained on the assistant's or the\n"
            "                         completion's tokens only. Default: chat or jsonl for a\n"
            "                         .jsonl/.json/.ndjson first input (by its first line), else text\n"
            "      --template NAME    chat: llama3, chatml or inst (Llama 2); default: from the\n"
            "                         tokenizer's chat_template, else its special tokens\n"
            "      --val-fraction F   hold out one document in every 1/F (0 < F < 1, spread\n"
            "                         evenly, input order kept) into OUT.val.bin (OUT with .bin\n"
            "                         replaced, or OUT.val)\n"
            "      --threads N        tokenizer threads (default: one per CPU core); the output\n"
            "                         is the same for every N\n"
            "  -h, --help             this help\n"
            "\n"
            "See docs/tokenize.md. exit status: 0 done, 1 failed (no output left), 2 bad\n"
            "command line\n");
}

typedef struct progress_ctx {
    bool tty;
    bool drawn;
} progress_ctx;

static void progress_line(FILE *f, const fso_tokenize_progress *p)
{
    double mb = (double)p->bytes_read / 1e6, s = p->ms / 1e3;
    fprintf(f, "fsoff: tokenize: %.1f MB read, %.1f MB/s, %llu documents, %llu tokens", mb,
            s > 0 ? mb / s : 0.0, (unsigned long long)(p->train.docs + p->val.docs),
            (unsigned long long)(p->train.tokens + p->val.tokens));
}

static void on_progress(void *arg, const fso_tokenize_progress *p)
{
    progress_ctx *ctx = arg;
    if (ctx->tty)
        fputs("\r\033[K", stderr);
    progress_line(stderr, p);
    fputs(ctx->tty ? "" : "\n", stderr);
    fflush(stderr);
    ctx->drawn = ctx->tty;
}

static int parse_fraction(const char *s, double *f)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0 && v < 1))
        return -EINVAL;
    *f = v;
    return 0;
}

static int parse_threads(const char *s, int *n)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1024)
        return -EINVAL;
    *n = (int)v;
    return 0;
}

/* Parse one option into o. Returns -1 to go on parsing, else the exit status
 * to return: 0 after --help, 2 (message printed) on a bad option. */
static int parse_one_opt(int c, char **argv, fso_tokenize_opts *o)
{
    switch (c) {
    case 't':
        o->tokenizer_dir = optarg;
        return -1;
    case 'o':
        o->out_path = optarg;
        return -1;
    case 'f': {
        fso_docs_format f;
        if (fso_docs_format_parse(optarg, &f) < 0) {
            fprintf(stderr, "fsoff: error: tokenize --format %s: expected text, jsonl or "
                            "chat\n", optarg);
            return 2;
        }
        o->format = (int)f;
        return -1;
    }
    case 'T': {
        fso_chat_kind k;
        if (fso_chat_kind_parse(optarg, &k) < 0) {
            fprintf(stderr, "fsoff: error: tokenize --template %s: expected llama3, chatml "
                            "or inst\n", optarg);
            return 2;
        }
        o->template_kind = (int)k;
        return -1;
    }
    case 'v':
        if (parse_fraction(optarg, &o->val_fraction) < 0) {
            fprintf(stderr, "fsoff: error: tokenize --val-fraction %s: expected a number "
                            "between 0 and 1, e.g. 0.05\n", optarg);
            return 2;
        }
        return -1;
    case 'j':
        if (parse_threads(optarg, &o->threads) < 0) {
            fprintf(stderr, "fsoff: error: tokenize --threads %s: expected a whole number "
                            "from 1 to 1024\n", optarg);
            return 2;
        }
        return -1;
    case 'h':
        usage(stdout);
        return 0;
    case ':':
        fprintf(stderr, "fsoff: error: tokenize %s needs a value; see fsoff tokenize --help\n",
                argv[optind - 1]);
        return 2;
    default:
        fprintf(stderr, "fsoff: error: tokenize: unknown option '%s'; see fsoff tokenize "
                        "--help\n", argv[optind - 1]);
        return 2;
    }
}

/* Parse the command line into o (inputs included). Returns -1 when the run
 * should go ahead, else the exit status: 0 after --help, 2 on a usage error
 * (message printed). */
static int parse_opts(int argc, char **argv, fso_tokenize_opts *o)
{
    static const struct option longopts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"output", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'},
        {"template", required_argument, NULL, 'T'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"threads", required_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, st;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":t:o:f:h", longopts, NULL)) != -1)
        if ((st = parse_one_opt(c, argv, o)) >= 0)
            return st;
    if (!o->tokenizer_dir) {
        fprintf(stderr, "fsoff: error: tokenize: --tokenizer DIR is missing: give the Hugging "
                        "Face folder with the model's tokenizer.json\n");
        return 2;
    }
    if (!o->out_path) {
        fprintf(stderr, "fsoff: error: tokenize: -o OUT.bin is missing: give the token file to "
                        "write\n");
        return 2;
    }
    if (o->template_kind >= 0 && o->format >= 0 && o->format != FSO_DOCS_CHAT) {
        fprintf(stderr, "fsoff: error: tokenize --template is for --format chat, not %s; drop "
                        "it\n", fso_docs_format_name((fso_docs_format)o->format));
        return 2;
    }
    if (argc - optind < 1) {
        fprintf(stderr, "fsoff: error: tokenize: no input files; give one or more text or JSONL "
                        "files before -o\n");
        return 2;
    }
    o->inputs = (const char *const *)argv + optind;
    o->n_inputs = argc - optind;
    return -1;
}

/* Print the run's summary on stdout: what was read, then a line per token
 * file written (the validation file's only when one was asked for). */
static void print_summary(const fso_tokenize_opts *o, const fso_tokenize_result *res)
{
    const fso_tokenize_progress *p = &res->done;
    char fmt_desc[600];
    if (res->format == FSO_DOCS_CHAT)
        snprintf(fmt_desc, sizeof fmt_desc, "chat (%s; %s)", res->format_why, res->template_why);
    else
        snprintf(fmt_desc, sizeof fmt_desc, "%s (%s)", fso_docs_format_name(res->format),
                 res->format_why);
    double s = p->ms / 1e3, mb = (double)p->bytes_read / 1e6;
    printf("fsoff: tokenize: read %.1f MB of %d file%s as %s in %.1f s, %.1f MB/s with %d "
           "thread%s\n", mb, o->n_inputs, o->n_inputs == 1 ? "" : "s", fmt_desc, s,
           s > 0 ? mb / s : 0.0, o->threads, o->threads == 1 ? "" : "s");
    const struct {
        const char *path;
        const fso_tokenize_stats *st;
    } files[2] = {{o->out_path, &p->train}, {res->val_path, &p->val}};
    for (int i = 0; i < (o->val_fraction > 0 ? 2 : 1); i++) {
        const fso_tokenize_stats *st = files[i].st;
        printf("fsoff: tokenize: wrote %s: %llu documents, %llu tokens (%s, vocabulary %d, "
               "delimiter %s)", files[i].path, (unsigned long long)st->docs,
               (unsigned long long)st->tokens, fso_tokfile_name(res->kind, res->elem_bytes),
               res->vocab_size, res->delimiter_name);
        if (res->format == FSO_DOCS_CHAT)
            printf("; %.1f%% of its tokens are trained on", st->tokens ?
                   100.0 * (double)st->targets / (double)st->tokens : 0.0);
        if (i == 1)
            printf("; held out: one document in every %.4g", 1 / o->val_fraction);
        printf("\n");
    }
}

int fso_tokenize_main(int argc, char **argv)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fso_tokenize_opts o = {.format = -1, .template_kind = -1,
                           .threads = cores > 0 ? (int)cores : 1};
    int st = parse_opts(argc, argv, &o);
    if (st >= 0)
        return st;
    progress_ctx pc = {.tty = isatty(STDERR_FILENO) == 1};
    o.progress = on_progress;
    o.progress_ctx = &pc;
    o.progress_ms = pc.tty ? PROGRESS_TTY_MS : PROGRESS_LOG_MS;

    fso_tokenize_result res;
    char err[FSO_TOKENIZE_ERR_MAX];
    int rc = fso_tokenize_run(&o, &res, err, sizeof err);
    if (pc.drawn)
        fputs("\r\033[K", stderr);
    if (rc < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        return 1;
    }
    print_summary(&o, &res);
    return 0;
}
