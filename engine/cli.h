/* cli.h — the fsoff command line: `fsoff [train] [options]`. */
#ifndef FSO_CLI_H
#define FSO_CLI_H

/* Parse argv, run the command, return the process exit status:
 * 0 success, 1 the run failed, 2 bad command line or configuration. */
int fso_cli_main(int argc, char **argv);


#endif
