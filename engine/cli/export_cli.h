/* export_cli.h — `fsoff export CKPT OUTDIR [--dtype fp32|bf16|fp16]`: a
 * checkpoint as a Hugging Face folder. Part of the fsoff executable. */
#ifndef FSO_EXPORT_CLI_H
#define FSO_EXPORT_CLI_H

/* argv[0] is "export". Exit status: 0 done, 1 failed, 2 bad command line. */
int fso_export_main(int argc, char **argv);

#endif
