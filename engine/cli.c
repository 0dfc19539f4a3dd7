/* cli.c — `fsoff [train] [options]`: options, configuration, the run. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fso_build.h"
#include "train.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff [train] [options]\n"
            "\n"
            "Train a Llama-family model. With no options, trains the default job: a\n"
            "0.8M-parameter model on a built-in corpus, on the CPU.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE      JSON configuration (DeepSpeed keys where they overlap,\n"
            "                         \"model\" with Hugging Face LlamaConfig names, \"data\", \"train\")\n"
            "  -d, --data FILE        training data: an llm.c token file (.bin) or plain text\n"
            "                         (same as --set data.path=FILE)\n"
            "  -n, --steps N          optimizer steps (same as --set train.steps=N)\n"
            "      --devices WHAT     cpu or auto (default auto: the CPU backend in this build)\n"
            "  -m, --metrics FILE     write one JSON object per step, then a summary object\n"
            "  -s, --set KEY=VALUE    override one configuration key, e.g.\n"
            "                         --set model.num_hidden_layers=8 --set optimizer.params.lr=1e-3\n"
            "                         (VALUE is JSON, or a plain string); repeatable, applied in order\n"
            "  -h, --help             this help\n"
            "  -V, --version          print the version\n"
            "\n"
            "exit status: 0 done, 1 the run failed, 2 bad command line or configuration\n");
}

/* A JSON string literal for `s`, for --data. */
static char *json_string(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(n * 6 + 3), *o = out;
    if (!out)
        return NULL;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20) {
            o += sprintf(o, "\\u%04x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

int fso_cli_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},  {"data", required_argument, NULL, 'd'},
        {"steps", required_argument, NULL, 'n'},   {"devices", required_argument, NULL, 'D'},
        {"metrics", required_argument, NULL, 'm'}, {"set", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *metrics_path = NULL, *devices = "auto";
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int nsets = 0, status = 2, c;
    fso_config cfg;

    fso_config_defaults(&cfg);
    if (!sets) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        return 1;
    }
    /* A leading subcommand; `train` is the only one and the default. */
    if (argc > 1 && argv[1][0] != '-') {
        if (strcmp(argv[1], "train") != 0) {
            fprintf(stderr, "fsoff: error: unknown command '%s'; the command is 'train' "
                            "(the default); see fsoff --help\n", argv[1]);
            goto out;
        }
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:d:n:m:s:hV", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config_path = optarg;
            break;
        case 'd': {
            char *lit = json_string(optarg);
            if (!lit || asprintf(&sets[nsets++], "data.path=%s", lit) < 0) {
                free(lit);
                fprintf(stderr, "fsoff: error: out of memory\n");
                goto out;
            }
            free(lit);
            break;
        }
        case 'n': {
            char *end;
            errno = 0;
            long long n = strtoll(optarg, &end, 10);
            if (errno || end == optarg || *end || n < 1) {
                fprintf(stderr, "fsoff: error: --steps %s: expected a positive integer\n", optarg);
                goto out;
            }
            if (asprintf(&sets[nsets++], "train.steps=%lld", n) < 0) {
                fprintf(stderr, "fsoff: error: out of memory\n");
                goto out;
            }
            break;
        }
        case 'D':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "auto") != 0) {
                fprintf(stderr, "fsoff: error: --devices %s: expected cpu or auto (this build "
                                "has the CPU backend only)\n", optarg);
                goto out;
            }
            devices = optarg;
            break;
        case 'm':
            metrics_path = optarg;
            break;
        case 's':
            if (!(sets[nsets++] = strdup(optarg))) {
                fprintf(stderr, "fsoff: error: out of memory\n");
                goto out;
            }
            break;
        case 'h':
            usage(stdout);
            status = 0;
            goto out;
        case 'V':
            printf("fsoff %s\n", FSO_VERSION);
            status = 0;
            goto out;
        case ':':
            fprintf(stderr, "fsoff: error: %s needs a value; see fsoff --help\n", argv[optind - 1]);
            goto out;
        default:
            fprintf(stderr, "fsoff: error: unknown option '%s'; see fsoff --help\n",
                    argv[optind - 1]);
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: unexpected argument '%s'; see fsoff --help\n", argv[optind]);
        goto out;
    }

    if (config_path && fso_config_load_file(&cfg, config_path) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }
    for (int i = 0; i < nsets; i++)
        if (fso_config_set(&cfg, sets[i]) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", cfg.err);
            goto out;
        }
    if (fso_config_finish(&cfg) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }

    fso_run_opts opts = {.metrics_path = metrics_path, .devices = devices};
    status = fso_train_run(&cfg, &opts) < 0 ? 1 : 0;

out:
    for (int i = 0; i < nsets; i++)
        free(sets[i]);
    free(sets);
    fso_config_free(&cfg);
    return status;
}
