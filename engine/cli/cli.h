/* cli.h — the fsoff command line: `fsoff [train] [options]`. Part of the
 * fsoff executable (engine/cli/main.c), not of the engine library. */
#ifndef FSO_CLI_H
#define FSO_CLI_H

/* The exit status of a run that a first SIGINT or SIGTERM stopped before
 * its last step (after the save it asked for): not 0, so that a script's
 * next command does not take an incomplete run for a finished one. */
#define FSO_EXIT_STOPPED 3

/* Parse argv (argv[1] may be "train", or another command, which is an
 * error naming the commands), run the training job, return the process
 * exit status: 0 success, 1 the run failed, 2 bad command line or
 * configuration, FSO_EXIT_STOPPED stopped by a signal. */
int fso_cli_main(int argc, char **argv);

#endif
