/* export_cli.c — `fsoff export` (export_cli.h): the command line over
 * fso_ckpt_export_hf (checkpoint.h). */
#include "export_cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "hf/hf.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: fsoff export CKPT OUTDIR [--dtype fp32|bf16|fp16]\n"
               "\n"
               "Write the parameters of checkpoint CKPT (a folder DIR/step-N, or a save folder\n"
               "DIR: its latest) as a Hugging Face folder OUTDIR of the model's own type\n"
               "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): config.json and\n"
               "model.safetensors, or shards of at most 5 GB with model.safetensors.index.json.\n"
               "Every chunk of the checkpoint is checked before it is written. When the run\n"
               "started from a Hugging Face folder (--init-from), config.json gets that folder's\n"
               "token ids and other fields fsoff does not model, and its tokenizer and\n"
               "generation files are copied (a file OUTDIR already holds is kept).\n"
               "\n"
               "  --dtype TYPE   fp32 (the default: the master as it is), bf16 or fp16\n"
               "                 (rounded to nearest even)\n");
}

int fso_export_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"dtype", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    fso_hf_export_opts o = {.dtype = FSO_HF_F32};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (fso_hf_dtype_parse(optarg, &o.dtype) < 0) {
                fprintf(stderr, "fsoff: error: export --dtype %s: expected fp32, bf16 or fp16\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "fsoff: error: export %s needs a value; see fsoff export --help\n",
                    argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "fsoff: error: export: unknown option '%s'; see fsoff export --help\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "fsoff: error: export: expected CKPT and OUTDIR, got %d argument%s; see "
                        "fsoff export --help\n", argc - optind, argc - optind == 1 ? "" : "s");
        return 2;
    }
    const char *from = argv[optind], *outdir = argv[optind + 1];
    char err[FSO_CKPT_ERR_MAX];
    fso_ckpt *ck = NULL;
    fso_hf_extras hf = {0};
    double t0 = fso_now_ms();
    int rc = fso_ckpt_open(&ck, from, err, sizeof err);
    if (rc == 0)
        rc = fso_ckpt_hf_extras(ck, &hf, err, sizeof err);
    o.extras = &hf;
    if (rc == 0)
        rc = fso_ckpt_export_hf(ck, outdir, &o, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
    } else {
        char said[2048];
        fso_hf_extras_describe(&hf, said, sizeof said);
        printf("fsoff: export: step %lld of %s to %s (%s) in %.1f s\n",
               (long long)fso_ckpt_step(ck), fso_ckpt_path(ck), outdir,
               fso_hf_dtype_name(o.dtype), (fso_now_ms() - t0) / 1e3);
        printf("fsoff: export: %s\n", said);
    }
    fso_hf_extras_free(&hf);
    fso_ckpt_close(ck);
    return rc < 0 ? 1 : 0;
}
