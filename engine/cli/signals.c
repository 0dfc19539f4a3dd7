/* signals.c — SIGINT and SIGTERM during training (signals.h). A handler
 * has nowhere else to find its flag: it is the one process-wide variable
 * here, set by fso_signals_install. */
#include "signals.h"

#include <string.h>
#include <unistd.h>

#include "store.h"

static volatile sig_atomic_t *stop_flag;
static struct sigaction before_int, before_term;

static void on_signal(int sig)
{
    if (stop_flag && *stop_flag == 0) {
        *stop_flag = sig;
        return;
    }
    /* the second: nothing but async-signal-safe calls from here */
    fso_store_unlink_created();
    static const char msg[] = "fsoff: second signal: stopped at once (NVMe files removed; "
                              "the checkpoints are as the last complete save left them)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig); /* delivered as the handler returns: the process dies of it */
}

void fso_signals_install(volatile sig_atomic_t *flag)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    stop_flag = flag;
    sigaction(SIGINT, &sa, &before_int);
    sigaction(SIGTERM, &sa, &before_term);
}

void fso_signals_restore(void)
{
    sigaction(SIGINT, &before_int, NULL);
    sigaction(SIGTERM, &before_term, NULL);
    stop_flag = NULL;
}
