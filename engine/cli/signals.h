/* signals.h — SIGINT and SIGTERM during `fsoff train` (part of the fsoff
 * executable; the engine only reads the flag, fso_run_opts.stop).
 *
 * The first signal sets the flag and says at once, on stderr, what follows:
 * the run finishes the step in progress, saves (with a checkpoint dir), ends
 * its threads, removes its NVMe files, completes the metrics file and exits
 * with status FSO_EXIT_STOPPED (cli.h). A second one ends the
 * process at once: it removes the NVMe store's files (unlink(2), which a
 * signal handler may call; fso_store_unlink_created) and dies of the
 * signal. */
#ifndef FSO_SIGNALS_H
#define FSO_SIGNALS_H

#include <signal.h>

/* Handlers on, *flag the one they set (0 until a signal comes); save_dir:
 * the run's checkpoint dir ("" or NULL: none), which the first signal's
 * line names as where the step is saved. */
void fso_signals_install(volatile sig_atomic_t *flag, const char *save_dir);
/* The handlers there were before. */
void fso_signals_restore(void);

#endif
