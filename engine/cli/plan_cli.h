/* plan_cli.h — `fsoff plan [options]`: the memory each tier needs, where
 * each kind of state would live and the predicted step, for a job on this
 * machine or on one the options describe. Part of the fsoff executable. */
#ifndef FSO_PLAN_CLI_H
#define FSO_PLAN_CLI_H

/* argv[0] is "plan". Returns the exit status: 0, 1 when no placement fits,
 * 2 for bad usage. */
int fso_plan_main(int argc, char **argv);

#endif
