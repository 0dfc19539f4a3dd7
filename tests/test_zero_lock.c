/* test_zero_lock.c — the sharded trainer's lock order (engine/zero/zero_lock.h).
 *
 * The checker itself is tested in every build: locks taken in order pass,
 * and a lock taken at or before a place held, a lock let go that is not
 * held, or a wait that holds another lock abort (in a forked child) with a
 * message naming the lock site and the lock held. The lock wrapper that
 * calls the checker at every lock site of the trainer is tested where it
 * checks, in builds without NDEBUG (meson's debug buildtype); builds with
 * NDEBUG compile the check out and skip that test. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "zero/zero_lock.h"

/* Run fn in a child and expect it to abort, its stderr holding every
 * non-NULL needle. */
static void expect_abort(void (*fn)(void), const char *n1, const char *n2, const char *n3)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* an abort expected: no core file */
        signal(SIGABRT, SIG_DFL);         /* not CMocka's handler */
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char msg[2048];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof msg - 1 && (n = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0)
        len += (size_t)n;
    msg[len] = '\0';
    close(fds[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT)
        fail_msg("expected an abort, the child %s %d; stderr: %s",
                 WIFSIGNALED(st) ? "died of signal" : "exited with", WIFSIGNALED(st)
                                                                        ? WTERMSIG(st)
                                                                        : WEXITSTATUS(st),
                 msg);
    const char *needles[] = {"fsoff: internal error at ", n1, n2, n3};
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++)
        if (needles[i] && !strstr(msg, needles[i]))
            fail_msg("\"%s\" not in the abort's message: %s", needles[i], msg);
}

static void test_checker_passes_locks_taken_in_order(void **state)
{
    (void)state;
    assert_int_equal(zr_lock_order_held(), 0);
    for (int r = 0; r < ZR_N_LOCKS; r++) {
        zr_lock_order_take((zr_lock_rank)r, __FILE__, __LINE__, __func__);
        assert_int_equal(zr_lock_order_held(), (1u << (r + 1)) - 1);
    }
    for (int r = ZR_N_LOCKS - 1; r >= 0; r--)
        zr_lock_order_give((zr_lock_rank)r, __FILE__, __LINE__, __func__);
    assert_int_equal(zr_lock_order_held(), 0);
    /* what the prefetch does: io.pf_mu held across opt.mu, sc.mu and io.mu in turn */
    zr_lock_order_take(ZR_LOCK_PREFETCH, __FILE__, __LINE__, __func__);
    const zr_lock_rank inner[] = {ZR_LOCK_OPT, ZR_LOCK_SC, ZR_LOCK_IO, ZR_LOCK_OPT};
    for (size_t i = 0; i < sizeof inner / sizeof inner[0]; i++) {
        zr_lock_order_take(inner[i], __FILE__, __LINE__, __func__);
        zr_lock_order_give(inner[i], __FILE__, __LINE__, __func__);
    }
    zr_lock_order_give(ZR_LOCK_PREFETCH, __FILE__, __LINE__, __func__);
    /* a wait holding its own lock alone */
    zr_lock_order_take(ZR_LOCK_SAVE, __FILE__, __LINE__, __func__);
    zr_lock_order_wait(ZR_LOCK_SAVE, __FILE__, __LINE__, __func__);
    zr_lock_order_give(ZR_LOCK_SAVE, __FILE__, __LINE__, __func__);
    assert_int_equal(zr_lock_order_held(), 0);
    assert_string_equal(zr_lock_name(ZR_LOCK_IO), "io.mu");
    assert_string_equal(zr_lock_name(ZR_LOCK_PREFETCH), "io.pf_mu");
    assert_string_equal(zr_lock_name(ZR_N_LOCKS), "?");
}

static void io_then_opt(void)
{
    zr_lock_order_take(ZR_LOCK_IO, "zero_io.c", 48, "queue_io");
    zr_lock_order_take(ZR_LOCK_OPT, "zero_source.c", 37, "prefetch_params");
}

static void opt_twice(void) /* two devices' opt.mu: one place in the order */
{
    zr_lock_order_take(ZR_LOCK_OPT, "zero_optim.c", 505, "opt_wait");
    zr_lock_order_take(ZR_LOCK_OPT, "zero_optim.c", 534, "wait_peers");
}

static void give_unheld(void)
{
    zr_lock_order_give(ZR_LOCK_SC, "zero_source.c", 159, "sc_set");
}

static void wait_holding_another(void)
{
    zr_lock_order_take(ZR_LOCK_PREFETCH, "zero_source.c", 90, "kick");
    zr_lock_order_take(ZR_LOCK_SC, "zero_source.c", 165, "sc_wait");
    zr_lock_order_wait(ZR_LOCK_SC, "zero_source.c", 168, "sc_wait");
}

static void wait_unheld(void)
{
    zr_lock_order_wait(ZR_LOCK_OPT, "zero_optim.c", 416, "opt_main");
}

static void test_checker_aborts_out_of_order(void **state)
{
    (void)state;
    expect_abort(io_then_opt, "zero_source.c:37 in prefetch_params",
                 "opt.mu taken while holding io.mu (taken at zero_io.c:48)",
                 "threads.mu < save.mu < io.pf_mu < opt.mu < sc.mu < io.mu");
    expect_abort(opt_twice, "zero_optim.c:534 in wait_peers",
                 "opt.mu taken while holding opt.mu (taken at zero_optim.c:505)", NULL);
    expect_abort(give_unheld, "zero_source.c:159 in sc_set", "sc.mu let go but not held", NULL);
    expect_abort(wait_holding_another, "zero_source.c:168 in sc_wait",
                 "a wait on sc.mu while holding io.pf_mu too (taken at zero_source.c:90)",
                 NULL);
    expect_abort(wait_unheld, "zero_optim.c:416 in opt_main", "a wait on opt.mu, which is not held",
                 NULL);
}

#ifndef NDEBUG
static zr_mutex io_mu, opt_mu;

static void wrapper_io_then_opt(void)
{
    zr_mutex_init(&io_mu, ZR_LOCK_IO);
    zr_mutex_init(&opt_mu, ZR_LOCK_OPT);
    zr_lock(&io_mu);
    zr_lock(&opt_mu); /* the site the message names */
}

static void test_wrapper_checks_every_lock_site(void **state)
{
    (void)state;
    /* in order: held while held, let go after */
    zr_mutex a, b;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    zr_mutex_init(&a, ZR_LOCK_PREFETCH);
    zr_mutex_init(&b, ZR_LOCK_IO);
    zr_lock(&a);
    zr_lock(&b);
    assert_int_equal(zr_lock_order_held(), (1u << ZR_LOCK_PREFETCH) | (1u << ZR_LOCK_IO));
    zr_unlock(&b);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* already past: returns at once */
    assert_int_equal(zr_cond_timedwait(&cv, &a, &ts), ETIMEDOUT);
    zr_unlock(&a);
    assert_int_equal(zr_lock_order_held(), 0);
    zr_mutex_destroy(&a);
    zr_mutex_destroy(&b);
    pthread_cond_destroy(&cv);

    expect_abort(wrapper_io_then_opt, "test_zero_lock.c:", " in wrapper_io_then_opt: ",
                 "opt.mu taken while holding io.mu (taken at ");
}
#else
static void test_wrapper_checks_every_lock_site(void **state)
{
    (void)state;
    print_message("this build defines NDEBUG: the lock order check is compiled out\n");
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_passes_locks_taken_in_order),
        cmocka_unit_test(test_checker_aborts_out_of_order),
        cmocka_unit_test(test_wrapper_checks_every_lock_site),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
