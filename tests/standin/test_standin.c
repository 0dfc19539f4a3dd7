/* test_standin.c — the CUDA module's own code (cuda_backend.c, coll_nccl.c)
 * trained on the tests' stand-in of the CUDA runtime (fso_standin.h), for
 * what no CPU backend can show:
 *   - a failing kernel, a failing copy and a stalled rank each end a run
 *     with an error that says what happened, within a bound: never a hang;
 *   - the backward's gradient copies to the host and its reduce-scatters
 *     are not waited for by the compute issued after them (the stand-in
 *     records, for every item a stream ran, the last item of each other
 *     stream it was ordered after: its vector clock);
 *   - a step copies nothing through pageable host memory (such a copy
 *     stalls the rank until its device catches up).
 * Run with FSO_CUDA_MODULE naming libfso_cuda_standin.so (meson does);
 * without it the program exits 77.
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "fso_standin.h"

#define STREAM_COMPUTE 0 /* the CUDA backend's streams, in creation order */
#define STREAM_D2H 2
#define STREAM_COLL 3
#define FAULT_BOUND_S 60 /* a fault must end the run sooner than this */

static const fso_standin_api *ctl;
static char nvme_dir[256];

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_standin: a run did not end within the bound: a hang\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
        /* nothing more to say */
    }
    _exit(1);
}

/* The small job on `world` stand-in devices, state on the tiers given. */
static void job(fso_config *cfg, int world, fso_tier param, fso_tier optim)
{
    fso_test_small_model(cfg, world, 4);
    cfg->backend = FSO_BACKEND_CUDA;
    cfg->device_mem_bytes = 0;
    fso_test_set_tiers(cfg, param, optim, nvme_dir);
}

/* ---------------------------------------------------------------- faults */

typedef enum { FAULT_KERNEL, FAULT_COPY, FAULT_STALL } fault_kind;
static fault_kind g_fault;

static void inject(fso_trainer *tr)
{
    (void)tr;
    switch (g_fault) {
    case FAULT_KERNEL:
        ctl->fail_kernel(40); /* inside the first step's forward */
        break;
    case FAULT_COPY:
        ctl->fail_copy(6);
        break;
    case FAULT_STALL:
        ctl->stall_rank(1);
        break;
    }
}

/* A run with the fault injected after start-up ends with an error that
 * says `want`, within FAULT_BOUND_S, and so does freeing the trainer. */
static void fault_ends_the_run(fault_kind f, int world, fso_tier param, const char *want)
{
    fso_config cfg;
    run_result r;
    job(&cfg, world, param, FSO_TIER_HOST);
    g_fault = f;
    double t0 = now_s();
    alarm(FAULT_BOUND_S);
    run(&cfg, &(run_hooks){.started = inject}, &r);
    alarm(0);
    double took = now_s() - t0;
    ctl->reset();
    print_message("# fault %d: rc %d after %.1f s: %s\n", (int)f, r.rc, took, r.err);
    if (r.rc >= 0)
        fail_msg("fault %d: the run went on (rc %d)", (int)f, r.rc);
    if (!strstr(r.err, want))
        fail_msg("fault %d: \"%s\" does not say \"%s\"", (int)f, r.err, want);
    result_free(&r);
}

static void test_a_failing_kernel_ends_the_run_with_its_error(void **state)
{
    (void)state;
    fault_ends_the_run(FAULT_KERNEL, 2, FSO_TIER_DEVICE, "launch failure");
}

static void test_a_failing_copy_ends_the_run_with_its_error(void **state)
{
    (void)state;
    fault_ends_the_run(FAULT_COPY, 2, FSO_TIER_HOST, "illegal memory access");
}

/* Rank 1's device never joins a collective: every rank issued it, so the
 * host cannot tell whose device stopped; the watchdog gives up after
 * FSO_NCCL_TIMEOUT_S, aborts the communicators and says so. */
static void test_a_stalled_rank_ends_the_run_after_the_timeout(void **state)
{
    (void)state;
    fault_ends_the_run(FAULT_STALL, 2, FSO_TIER_DEVICE, "made no progress");
}

/* ---------------------------------------------------------------- overlap */

/* Items of stream `s` of device 0 that some compute item issued after
 * them is not ordered after: work the compute went ahead of. */
static size_t overtaken(const fso_standin_item *it, size_t n, int s, const char *what)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (it[i].device != 0 || it[i].stream != s || !strstr(it[i].what, what))
            continue;
        for (size_t j = 0; j < n; j++)
            if (it[j].device == 0 && it[j].stream == STREAM_COMPUTE &&
                strncmp(it[j].what, "kernel", 6) == 0 && it[j].issue_tick > it[i].issue_tick &&
                it[j].after[s] < it[i].seq) {
                count++;
                break;
            }
    }
    return count;
}

static void record_step(fso_trainer *tr, int step)
{
    (void)tr;
    if (step == 1)
        ctl->record(1u << 20); /* step 2 and on */
}

/* The backward of a step with the gradients landing in host memory, on two
 * devices: its gradient copies down (d2h) and reduce-scatters run beside
 * the compute issued after them, which is ordered after neither. */
static void test_backward_copies_and_collectives_run_under_compute(void **state)
{
    (void)state;
    fso_config cfg;
    run_result r;
    job(&cfg, 2, FSO_TIER_DEVICE, FSO_TIER_HOST);
    run(&cfg, &(run_hooks){.stepped = record_step}, &r);
    if (r.rc)
        fail_msg("%s", r.err);
    const fso_standin_item *it;
    size_t n = ctl->recorded(&it);
    size_t d2h = overtaken(it, n, STREAM_D2H, "copy"),
           rs = overtaken(it, n, STREAM_COLL, "reduce_scatter"), all_d2h = 0, all_rs = 0;
    for (size_t i = 0; i < n; i++) {
        all_d2h += it[i].device == 0 && it[i].stream == STREAM_D2H;
        all_rs += it[i].device == 0 && strstr(it[i].what, "reduce_scatter") != NULL;
    }
    ctl->record(0);
    print_message("# %zu items; compute went ahead of %zu of %zu d2h copies and %zu of %zu "
                  "reduce-scatters\n", n, d2h, all_d2h, rs, all_rs);
    if (all_d2h == 0 || all_rs == 0)
        fail_msg("no d2h copies (%zu) or reduce-scatters (%zu) recorded", all_d2h, all_rs);
    if (d2h == 0 || rs == 0)
        fail_msg("compute waited for every gradient copy (%zu of %zu overtaken) or every "
                 "reduce-scatter (%zu of %zu) issued before it",
                 d2h, all_d2h, rs, all_rs);
    result_free(&r);
}

/* ---------------------------------------------------------------- pinning */

static uint64_t g_stalls_after_step1;

static void count_stalls(fso_trainer *tr, int step)
{
    (void)tr;
    if (step == 1)
        g_stalls_after_step1 = ctl->pageable_stalls();
}

/* After the first step (which grows the device scratch and pins what it
 * first meets), a step copies nothing between the host and the devices
 * through pageable memory, whose copies would stall the rank thread until
 * the device caught up: the batches' tokens, targets and positions, the
 * state staged in host memory and on NVMe, the norms, the losses. */
static void test_steps_copy_no_pageable_memory(void **state)
{
    (void)state;
    static const fso_tier tiers[][2] = {
        {FSO_TIER_DEVICE, FSO_TIER_DEVICE}, {FSO_TIER_HOST, FSO_TIER_HOST},
        {FSO_TIER_NVME, FSO_TIER_NVME},     {FSO_TIER_DEVICE, FSO_TIER_HOST},
    };
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
        fso_config cfg;
        run_result r;
        job(&cfg, 2, tiers[t][0], tiers[t][1]);
        run(&cfg, &(run_hooks){.stepped = count_stalls}, &r);
        if (r.rc)
            fail_msg("%s", r.err);
        const uint64_t stalls = ctl->pageable_stalls() - g_stalls_after_step1;
        print_message("# tiers %d/%d: %llu pageable copies in steps 2 to %d\n", tiers[t][0],
                      tiers[t][1], (unsigned long long)stalls, r.steps);
        if (stalls)
            fail_msg("tiers %d/%d: %llu copies through pageable memory in steps 2 to %d",
                     tiers[t][0], tiers[t][1], (unsigned long long)stalls, r.steps);
        result_free(&r);
    }
}

/* ---------------------------------------------------------------- main */

static int setup(void **state)
{
    (void)state;
    snprintf(nvme_dir, sizeof nvme_dir, "/tmp/fso_test_standin_XXXXXX");
    return mkdtemp(nvme_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(nvme_dir);
    return 0;
}

int main(void)
{
    const char *path = getenv("FSO_CUDA_MODULE");
    char why[512] = "";
    if (!path || fso_cuda_available(why, sizeof why) < 0) {
        printf("test_standin: skipped: %s\n", path ? why : "FSO_CUDA_MODULE is not set");
        return 77;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    fso_standin_control_fn get = NULL;
    if (h)
        *(void **)&get = dlsym(h, FSO_STANDIN_SYMBOL);
    if (!get) {
        fprintf(stderr, "test_standin: %s is not the CUDA stand-in (no %s)\n", path,
                FSO_STANDIN_SYMBOL);
        return 1;
    }
    ctl = get();
    /* a stalled rank is given up on after this long */
    setenv("FSO_NCCL_TIMEOUT_S", "3", 1);
    signal(SIGALRM, on_alarm);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_copies_and_collectives_run_under_compute),
        cmocka_unit_test(test_steps_copy_no_pageable_memory),
        cmocka_unit_test(test_a_failing_kernel_ends_the_run_with_its_error),
        cmocka_unit_test(test_a_failing_copy_ends_the_run_with_its_error),
        cmocka_unit_test(test_a_stalled_rank_ends_the_run_after_the_timeout),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
