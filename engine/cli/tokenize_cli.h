/* tokenize_cli.h — `fsoff tokenize --tokenizer DIR [options] INPUT... -o
 * OUT.bin`: text, JSONL or chat files to a token file with a Hugging Face
 * tokenizer (engine/tok/tokenize.h). Part of the fsoff executable. */
#ifndef FSO_TOKENIZE_CLI_H
#define FSO_TOKENIZE_CLI_H

/* argv[0] is "tokenize". Exit status: 0 done, 1 failed, 2 bad command line. */
int fso_tokenize_main(int argc, char **argv);

#endif
