/* cli.c — `fsoff [train] [options]`: options, configuration, the run.
 * Part of the fsoff executable (cli.h). */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxes.h"
#include "ckpt/checkpoint_run.h"
#include "config/config.h"
#include "cpu_isa.h"
#include "cuda/cuda_backend.h"
#include "devices.h"
#include "fso_build.h"
#include "plan.h"
#include "signals.h"
#include "store.h"
#include "train.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fsoff [train] [options]\n"
            "       fsoff bench nvme|adam|h2d|allgather|tune|pipeline [options]   offload benchmarks\n"
            "       fsoff plan [options]              memory per tier, placement, predicted step\n"
            "       fsoff plot FILE... -o FILE.png    draw a --metrics file (a resumed run's files,\n"
            "                                         or -o FILE.svg) or a bench --json result\n"
            "       fsoff export CKPT OUTDIR [--dtype fp32|bf16|fp16]   a checkpoint as a\n"
            "                                         Hugging Face folder\n"
            "       fsoff tokenize --tokenizer DIR INPUT... -o OUT.bin   text, JSONL or chat\n"
            "                                         files as a token file to train on\n"
            "\n"
            "Train a Llama-family model. With no options, trains the default job: a\n"
            "0.8M-parameter model on a built-in corpus, on the CPU.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE      JSON configuration (DeepSpeed keys where they overlap,\n"
            "                         \"model\" with Hugging Face LlamaConfig names, \"data\", \"train\")\n"
            "  -d, --data FILE        training data: an llm.c token file (.bin) or plain text\n"
            "                         (same as --set data.path=FILE)\n"
            "      --val-data FILE    held-out tokens: a validation loss before the first\n"
            "                         step and after the last (= --set data.val_path=FILE)\n"
            "      --val-every N      also every N steps (= --set data.val_every=N)\n"
            "      --val-batches K    micro-batches per validation, the same ones each time,\n"
            "                         %d by default (= --set data.val_batches=K)\n"
            "  -n, --steps N          optimizer steps (same as --set train.steps=N)\n"
            "      --devices WHAT     auto (default: every CUDA GPU, else the CPU), cuda,\n"
            "                         cuda:N (the first N GPUs), cpu, or cpu:N (N virtual\n"
            "                         CPU devices sharing the work, ZeRO-3)\n"
            "      --device-mem SIZE  memory cap per device, e.g. 2G (default: an equal share\n"
            "                         of half the available memory)\n"
            "      --host-mem SIZE    host memory fsoff may use for state and staging, CPU\n"
            "                         devices' memory included (default: what is available\n"
            "                         less 10%%, at least 1 GiB, left to the machine)\n"
            "      --nvme DIR[,DIR]   NVMe folders, striped: a place the planner may put state\n"
            "                         that the host memory does not hold (the nvme_path of\n"
            "                         zero_optimization.offload_param and offload_optimizer;\n"
            "                         their device keys pin a tier)\n"
            "      --init-from DIR    start from a Hugging Face Llama, Mistral or Qwen2 folder:\n"
            "                         config.json and model.safetensors or shards with their\n"
            "                         index (same as --set model.init_from=DIR)\n"
            "  -m, --metrics FILE     write one JSON object per step, then a summary object\n"
            "      --save DIR         write checkpoints into DIR, at the end of the run and\n"
            "                         on the first SIGINT or SIGTERM (= --set checkpoint.dir=DIR)\n"
            "      --save-every N     also every N steps, while training goes on\n"
            "                         (= --set checkpoint.every_steps=N)\n"
            "      --keep K           complete checkpoints kept, %d by default\n"
            "                         (= --set checkpoint.keep=K)\n"
            "      --resume [PATH]    continue from the latest checkpoint in --save DIR, or\n"
            "                         from PATH: a checkpoint (DIR/step-N) or a save folder\n"
            "      --resume auto      continue from the latest checkpoint in --save DIR if it\n"
            "                         has one, else start from step 0 (one command line that\n"
            "                         starts a job and restarts it; a folder named auto: ./auto)\n"
            "      --auto-batch       split the global batch (train_batch_size, which stays)\n"
            "                         into the micro-batch x accumulation the planner predicts\n"
            "                         fastest among those that fit; one line says what it took\n"
            "      --print-every N    a step line every N steps, the first and last always\n"
            "                         (default: every step up to 10, then about 100 lines in\n"
            "                         all; = --set steps_per_print=N, 0 the default)\n"
            "  -s, --set KEY=VALUE    override one configuration key, e.g.\n"
            "                         --set model.num_hidden_layers=8 --set optimizer.params.lr=1e-3\n"
            "                         (VALUE is JSON, or a plain string); repeatable, applied in order\n"
            "  -h, --help             this help\n"
            "  -V, --version          print the version\n"
            "\n"
            "exit status: 0 done, 1 the run failed, 2 bad command line or configuration,\n"
            "%d stopped by a first SIGINT or SIGTERM before its last step (after saving\n"
            "it, with --save)\n",
            FSO_VAL_BATCHES_DEFAULT, FSO_CHECKPOINT_KEEP_DEFAULT, FSO_EXIT_STOPPED);
}

/* --devices: auto (every CUDA GPU, else the CPU), cpu, cpu:N, cuda, cuda:N.
 * Fills cfg->backend and cfg->world; one error line and -EINVAL when the
 * request cannot be honoured. */
static int select_devices(fso_config *cfg, const char *arg)
{
    char why[1024] = "";
    fso_devices d;
    if (fso_devices_parse(arg, false, &d, why, sizeof why) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", why);
        return -EINVAL;
    }
    int gpus = 0;
    /* only auto and cuda ask: that loads the CUDA module */
    if (d.is_auto || d.backend == FSO_BACKEND_CUDA) {
#if FSO_HAVE_CUDA
        if (fso_cuda_available(why, sizeof why) == 0)
            gpus = fso_cuda_device_count(why, sizeof why);
#else
        fso_cuda_available(why, sizeof why);
#endif
    }
    if (d.is_auto) {
        cfg->backend = gpus ? FSO_BACKEND_CUDA : FSO_BACKEND_CPU;
        cfg->world = gpus ? gpus : 1;
        return 0;
    }
    if (d.backend == FSO_BACKEND_CUDA && gpus == 0) {
        fprintf(stderr, "fsoff: error: --devices %s: %s; use --devices cpu (or auto)\n", arg, why);
        return -EINVAL;
    }
    if (d.backend == FSO_BACKEND_CUDA && d.count > gpus) {
        fprintf(stderr, "fsoff: error: --devices %s: only %d CUDA GPU%s visible\n", arg, gpus,
                gpus == 1 ? " is" : "s are");
        return -EINVAL;
    }
    cfg->backend = d.backend;
    cfg->world = d.count ? d.count : d.backend == FSO_BACKEND_CUDA ? gpus : 1;
    return 0;
}

/* A list of NVMe folders, as `what` names it (--nvme, or a configuration
 * key), checked by fso_nvme_folders_split: 0, or -EINVAL after one error
 * line: a bad command line or configuration. */
static int check_folders(const char *what, const char *list)
{
    char buf[4096], why[1024];
    const char *dirs[FSO_STORE_MAX_DIRS];
    if (fso_nvme_folders_split(what, list, true, buf, sizeof buf, dirs, why, sizeof why) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", why);
        return -EINVAL;
    }
    return 0;
}

/* The configuration's NVMe folders: a place the planner may use for any
 * kind a pin does not hold elsewhere, so each folder a section names must
 * exist here unless that section's device is pinned off NVMe. */
static int check_config_folders(const fso_config *cfg)
{
    fso_plan_pins pins;
    fso_plan_pins_from_config(cfg, &pins);
    const fso_offload_config *o = &cfg->offload;
    const int pp = pins.tier[FSO_KIND_PARAM], po = pins.tier[FSO_KIND_MASTER];
    if (o->param_nvme_path[0] && (pp < 0 || pp == FSO_TIER_NVME) &&
        check_folders("zero_optimization.offload_param.nvme_path", o->param_nvme_path) < 0)
        return -EINVAL;
    if (o->optim_nvme_path[0] && (po < 0 || po == FSO_TIER_NVME) &&
        check_folders("zero_optimization.offload_optimizer.nvme_path", o->optim_nvme_path) < 0)
        return -EINVAL;
    return 0;
}

/* What the command line said, beyond what goes into the configuration. */
typedef struct cli_args {
    const char *config_path, *metrics_path, *devices, *resume;
    bool devices_given, resume_auto, auto_batch;
    char **sets; /* --set KEY=VALUE strings, the options that are one included */
    char **written; /* [i]: how the user wrote sets[i] when an option other than --set
                       made it ("--init-from DIR"); NULL: a --set */
    int nsets;
} cli_args;

/* Append one --set string made from fmt: 0, or -ENOMEM after the error line. */
static int add_set(cli_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_set(cli_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&a->sets[a->nsets], fmt, ap);
    va_end(ap);
    if (n < 0) {
        a->sets[a->nsets] = NULL;
        fprintf(stderr, "fsoff: error: out of memory\n");
        return -ENOMEM;
    }
    a->nsets++;
    return 0;
}

/* KEY=VALUE with VALUE the option's argument as a JSON string, for each key. */
static int add_string_sets(cli_args *a, const char *value, const char *key1, const char *key2)
{
    char *lit = fso_json_quote(value);
    int rc = lit ? add_set(a, "%s=%s", key1, lit) : -ENOMEM;
    if (rc == 0 && key2)
        rc = add_set(a, "%s=%s", key2, lit);
    if (!lit)
        fprintf(stderr, "fsoff: error: out of memory\n");
    free(lit);
    return rc;
}

/* An option that is one --set of key to its argument as a JSON string,
 * quoted in errors as the user wrote it: "OPT VALUE". */
static int add_option_set(cli_args *a, const char *opt, const char *value, const char *key)
{
    int rc = add_string_sets(a, value, key, NULL);
    if (rc == 0 && asprintf(&a->written[a->nsets - 1], "%s %s", opt, value) < 0) {
        a->written[a->nsets - 1] = NULL;
        fprintf(stderr, "fsoff: error: out of memory\n");
        rc = -ENOMEM;
    }
    return rc;
}

/* --device-mem and --host-mem: a size above zero, else one error line. */
static int mem_option(const char *opt, const char *arg, const char *examples, uint64_t *out)
{
    if (fso_parse_size(arg, out) < 0 || *out == 0) {
        fprintf(stderr, "fsoff: error: %s %s: expected a size such as %s\n", opt, arg, examples);
        return -EINVAL;
    }
    return 0;
}

/* A whole number of at least min for option opt, as key's --set: 0, or
 * negative after one error line that says what was expected. */
static int count_option(cli_args *a, const char *opt, const char *arg, long long min,
                        const char *expected, const char *key)
{
    char *end;
    errno = 0;
    long long n = strtoll(arg, &end, 10);
    if (errno || end == arg || *end || n < min) {
        fprintf(stderr, "fsoff: error: %s %s: expected %s\n", opt, arg, expected);
        return -EINVAL;
    }
    return add_set(a, "%s=%lld", key, n);
}

/* One option (getopt's c and optarg) into a and cfg: 0, 1 when the command
 * is done (--help, --version), or negative after one error line. */
static int take_option(int c, int argc, char **argv, cli_args *a, fso_config *cfg)
{
    switch (c) {
    case 'c':
        a->config_path = optarg;
        return 0;
    case 'd':
        return add_string_sets(a, optarg, "data.path", NULL);
    case 'I':
        return add_option_set(a, "--init-from", optarg, "model.init_from");
    case 'v':
        return add_string_sets(a, optarg, "data.val_path", NULL);
    case 'w':
        return count_option(a, "--val-every", optarg, 0,
                            "a step count (0: only before the first step and after the last)",
                            "data.val_every");
    case 'A':
        a->auto_batch = true;
        return 0;
    case 'b':
        return count_option(a, "--val-batches", optarg, 1, "a positive number of micro-batches",
                            "data.val_batches");
    case 'n':
        return count_option(a, "--steps", optarg, 1, "a positive integer", "train.steps");
    case 'D':
        if (select_devices(cfg, optarg) < 0)
            return -EINVAL;
        a->devices = optarg;
        a->devices_given = true;
        return 0;
    case 'M':
        return mem_option("--device-mem", optarg, "512M, 4G or 80G", &cfg->device_mem_bytes);
    case 'H':
        return mem_option("--host-mem", optarg, "8G or 512G", &cfg->host_mem_bytes);
    case 'N': /* a place for state, not a pin: the planner decides what goes there */
        if (check_folders("--nvme", optarg) < 0)
            return -EINVAL;
        return add_string_sets(a, optarg, "zero_optimization.offload_param.nvme_path",
                               "zero_optimization.offload_optimizer.nvme_path");
    case 'm':
        a->metrics_path = optarg;
        return 0;
    case 'S': /* --save DIR, --save-every N, --keep K: the checkpoint keys */
        return add_string_sets(a, optarg, "checkpoint.dir", NULL);
    case 'E':
        return count_option(a, "--save-every", optarg, 0,
                            "a step count (0: save only at the end)", "checkpoint.every_steps");
    case 'K':
        return count_option(a, "--keep", optarg, 1,
                            "how many complete checkpoints to keep, at least 1", "checkpoint.keep");
    case 'R': /* --resume, --resume=PATH or --resume PATH */
        a->resume = optarg ? optarg : "";
        if (!optarg && optind < argc && argv[optind][0] != '-')
            a->resume = argv[optind++];
        a->resume_auto = strcmp(a->resume, "auto") == 0; /* a folder named auto: ./auto */
        if (a->resume_auto)
            a->resume = "";
        return 0;
    case 'P':
        return count_option(a, "--print-every", optarg, 0,
                            "a step count (0: every step up to 10, then about 100 lines)",
                            "steps_per_print");
    case 's':
        return add_set(a, "%s", optarg);
    case 'h':
        usage(stdout);
        return 1;
    case 'V':
        /* what this build can do, for scripts that ask (tests/boxes_train_test.sh) */
        printf("fsoff %s (cuda: %s, mpi: %s)\n", FSO_VERSION, FSO_HAVE_CUDA ? "yes" : "no",
               FSO_HAVE_MPI ? "yes" : "no");
        return 1;
    case ':':
        fprintf(stderr, "fsoff: error: %s needs a value; see fsoff --help\n", argv[optind - 1]);
        return -EINVAL;
    default:
        fprintf(stderr, "fsoff: error: unknown option '%s'; see fsoff --help\n", argv[optind - 1]);
        return -EINVAL;
    }
}

/* The command line into a and cfg (its devices and memory caps): 0, 1 when
 * the command is done, or negative after one error line. */
static int parse_args(int argc, char **argv, cli_args *a, fso_config *cfg)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},  {"data", required_argument, NULL, 'd'},
        {"steps", required_argument, NULL, 'n'},   {"devices", required_argument, NULL, 'D'},
        {"metrics", required_argument, NULL, 'm'}, {"set", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
        {"device-mem", required_argument, NULL, 'M'}, {"nvme", required_argument, NULL, 'N'},
        {"save", required_argument, NULL, 'S'},    {"save-every", required_argument, NULL, 'E'},
        {"keep", required_argument, NULL, 'K'},    {"resume", optional_argument, NULL, 'R'},
        {"init-from", required_argument, NULL, 'I'},  {"host-mem", required_argument, NULL, 'H'},
        {"print-every", required_argument, NULL, 'P'},
        {"val-data", required_argument, NULL, 'v'}, {"val-every", required_argument, NULL, 'w'},
        {"val-batches", required_argument, NULL, 'b'},
        {"auto-batch", no_argument, NULL, 'A'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:d:n:m:s:hV", longopts, NULL)) != -1)
        if ((rc = take_option(c, argc, argv, a, cfg)) != 0)
            return rc;
    if (optind < argc) {
        fprintf(stderr, "fsoff: error: unexpected argument '%s'; see fsoff --help\n", argv[optind]);
        return -EINVAL;
    }
    return 0;
}

/* The tests' holds on a run (fso_run_opts): FSOFF_TEST_SAVE_PAUSE=FILE and
 * FSOFF_TEST_STEP_PAUSE=N:FILE, read here only. -1 after an error line. */
static int test_pauses(fso_run_opts *opts)
{
    const char *save = getenv("FSOFF_TEST_SAVE_PAUSE"), *step = getenv("FSOFF_TEST_STEP_PAUSE");
    if (save && save[0])
        opts->pause_save = save;
    if (!step || !step[0])
        return 0;
    char *end;
    errno = 0;
    long long n = strtoll(step, &end, 10);
    if (errno || end == step || *end != ':' || !end[1] || n < 1) {
        fprintf(stderr, "fsoff: error: FSOFF_TEST_STEP_PAUSE='%s': expected N:FILE, a step "
                        "of 1 or more and the file to wait on (a test hook); unset it\n", step);
        return -1;
    }
    opts->pause_step = n;
    opts->pause_step_file = end + 1;
    return 0;
}

int fso_cli_main(int argc, char **argv)
{
    static volatile sig_atomic_t stop;
    cli_args a = {.devices = "auto", .sets = calloc(2 * (size_t)argc + 1, sizeof(char *)),
                  .written = calloc(2 * (size_t)argc + 1, sizeof(char *))};
    int status = 2, rc;
    fso_config cfg;

    fso_config_defaults(&cfg);
    if (!a.sets || !a.written) {
        fprintf(stderr, "fsoff: error: out of memory\n");
        free(a.sets);
        free(a.written);
        return 1;
    }
    /* A leading command other than those main.c dispatches: train, the default. */
    if (argc > 1 && argv[1][0] != '-') {
        if (strcmp(argv[1], "train") != 0) {
            fprintf(stderr, "fsoff: error: unknown command '%s'; the commands are 'train' "
                            "(the default), 'plan', 'bench', 'plot', 'export' and 'tokenize'; see "
                            "fsoff --help\n", argv[1]);
            goto out;
        }
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if ((rc = parse_args(argc, argv, &a, &cfg)) != 0) {
        status = rc > 0 ? 0 : 2;
        goto out;
    }
    if (!a.devices_given && select_devices(&cfg, "auto") < 0)
        goto out;
    if (fso_config_load_written(&cfg, a.config_path, a.sets, a.written, a.nsets) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }
    if (check_config_folders(&cfg) < 0)
        goto out;
    fso_isa isa; /* FSO_ISA: checked before the plan, as the trainer takes it */
    if (fso_isa_from_env(&isa, cfg.err, sizeof cfg.err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }

    /* several boxes (boxes.h): the global batch counts every box's devices;
     * box 0 speaks for the run (plan, step lines, metrics), the others say
     * only what goes wrong on them */
    FILE *quiet = NULL;
    if (fso_boxes_count() > 1) {
        if (fso_config_set_boxes(&cfg, fso_boxes_count(), fso_boxes_self()) < 0) {
            fprintf(stderr, "fsoff: error: %s\n", cfg.err);
            goto out;
        }
        if (fso_boxes_self() != 0 && !(quiet = fopen("/dev/null", "w"))) {
            fprintf(stderr, "fsoff: error: /dev/null: %s\n", strerror(errno));
            goto out;
        }
    }
    fso_run_opts opts = {.metrics_path = quiet ? NULL : a.metrics_path, .devices = a.devices,
                         .resume = a.resume, .resume_auto = a.resume_auto, .stop = &stop,
                         .auto_batch = a.auto_batch, .out = quiet};
    if (test_pauses(&opts) < 0)
        goto out;
    if (fso_ckpt_resume_check(&cfg, &opts, cfg.err, sizeof cfg.err) < 0) {
        fprintf(stderr, "fsoff: error: %s\n", cfg.err);
        goto out;
    }
    fso_signals_install(&stop, cfg.checkpoint.dir);
    rc = fso_train_run(&cfg, &opts);
    status = rc < 0 ? 1 : rc == FSO_RUN_STOPPED ? FSO_EXIT_STOPPED : 0;
    fso_signals_restore();
    if (quiet)
        fclose(quiet);

out:
    /* a box that fails takes the others down with it rather than leave them
     * waiting for it (its error line said why) */
    if (status != 0 && status != FSO_EXIT_STOPPED && fso_boxes_count() > 1) {
        fflush(stdout);
        fso_boxes_abort(NULL, status);
    }
    for (int i = 0; i < a.nsets; i++) {
        free(a.sets[i]);
        free(a.written[i]);
    }
    free(a.sets);
    free(a.written);
    fso_config_free(&cfg);
    return status;
}
