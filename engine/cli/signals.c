/* signals.c — SIGINT and SIGTERM during training (signals.h). A handler
 * has nowhere else to find its flag and its words: they are the one set of
 * process-wide variables here, set by fso_signals_install. */
#include "signals.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

static volatile sig_atomic_t *stop_flag;
static struct sigaction before_int, before_term;
/* the first signal's acknowledgement, written by the handler: made here
 * before any signal can come, since a handler may not format */
static char said_int[4400], said_term[4400];
static size_t said_int_len, said_term_len;

static void on_signal(int sig)
{
    if (stop_flag && *stop_flag == 0) {
        *stop_flag = sig;
        /* said at once: the step in progress may take a while */
        ssize_t ignored = write(STDERR_FILENO, sig == SIGINT ? said_int : said_term,
                                sig == SIGINT ? said_int_len : said_term_len);
        (void)ignored;
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

static size_t acknowledgement(char *buf, size_t len, const char *name, const char *save_dir)
{
    const bool saving = save_dir && save_dir[0];
    int n = snprintf(buf, len, "fsoff: %s: stopping after the step in progress%s%s; a second "
                               "SIGINT or SIGTERM stops at once without saving\n",
                     name, saving ? ", then saving it in " : " (no --save DIR: nothing is saved)",
                     saving ? save_dir : "");
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

void fso_signals_install(volatile sig_atomic_t *flag, const char *save_dir)
{
    struct sigaction sa;
    said_int_len = acknowledgement(said_int, sizeof said_int, "SIGINT", save_dir);
    said_term_len = acknowledgement(said_term, sizeof said_term, "SIGTERM", save_dir);
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
