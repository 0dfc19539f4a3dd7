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
#include <stdbool.h>

/* Handlers on, *flag the one they set (0 until a signal comes); saving:
 * the run has a checkpoint dir, so the first signal's line says it saves. */
void fso_signals_install(volatile sig_atomic_t *flag, bool saving);
/* The handlers there were before. */
void fso_signals_restore(void);

#endif
