/* test_standin_rt.c — the CUDA runtime stand-in (standin_rt.c and its
 * neighbours) against the runtime, cuBLAS and NCCL API directly: the rules
 * it enforces (device memory the host cannot read, copy classification,
 * stream and event order, sticky faults, communicators met by unique id,
 * collective rendezvous and abort)
 * and the results it computes. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "fso_standin.h"
#include "standin.h"

#define CK(x) assert_int_equal((x), cudaSuccess)
#define NK(x) assert_int_equal((x), ncclSuccess)

/* Linked in here; a test of the module finds it with dlsym (fso_standin.h). */
const fso_standin_api *fso_standin_control(void);

static const fso_standin_api *ctl;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Run fn(arg) on a thread; fail (no hang) unless it returns within ms. */
static void within_ms(void *(*fn)(void *), void *arg, int ms)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(t, NULL, &dl) != 0)
        fail_msg("still blocked after %d ms", ms);
}

static int setup(void **state)
{
    ctl->reset();
    return 0;
}

static int teardown(void **state)
{
    ctl->reset();
    ctl->record(0);
    cudaGetLastError();
    return 0;
}

/* ------------------------------------------------------------ kernels */

struct fill_arg {
    float *p;   /* device */
    size_t n;
    float v;
};

static void k_fill(void *a)
{
    struct fill_arg *f = a;
    float *x = standin_view(f->p);
    for (size_t i = 0; i < f->n; i++)
        x[i] = f->v;
}

struct gate_arg {
    volatile int *open;
};

static void k_gate(void *a)
{
    struct gate_arg *g = a;
    while (!__atomic_load_n(g->open, __ATOMIC_ACQUIRE))
        sleep_ms(1);
}

struct nap_arg {
    int ms;
};

static void k_nap(void *a)
{
    sleep_ms(((struct nap_arg *)a)->ms);
}

static void k_none(void *a)
{
    (void)a;
}

/* ------------------------------------------------------------ memory */

static void test_copies_round_trip_through_device_memory(void **state)
{
    const size_t n = 100000;
    cudaStream_t s;
    float *d1, *d2, *h;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&d1, n * sizeof(float)));
    CK(cudaMalloc((void **)&d2, n * sizeof(float)));
    assert_int_equal((uintptr_t)d1 % 256, 0);
    CK(cudaHostAlloc((void **)&h, n * sizeof(float), cudaHostAllocPortable));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i;
    CK(cudaMemcpyAsync(d1, h, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(d2, d1, n * sizeof(float), cudaMemcpyDefault, s));
    CK(cudaMemsetAsync(d1, 0, n * sizeof(float), s));
    CK(cudaStreamSynchronize(s));
    memset(h, 0xff, n * sizeof(float));
    CK(cudaMemcpyAsync(h, d2, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++)
        assert_true(h[i] == (float)i);
    CK(cudaMemcpy(h, d1, sizeof(float) * 4, cudaMemcpyDeviceToHost));
    assert_true(h[0] == 0.0f && h[3] == 0.0f);
    /* the wrong kind, a range past an allocation, an unknown pointer */
    assert_int_equal(cudaMemcpyAsync(h, d1, 4, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyAsync(h, d1, n * sizeof(float) + 1024, cudaMemcpyDefault, s),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaFree(h), cudaErrorInvalidValue);
    size_t fr, tot, fr2;
    CK(cudaMemGetInfo(&fr, &tot));
    CK(cudaFree(d1));
    CK(cudaMemGetInfo(&fr2, &tot));
    assert_true(fr2 >= fr + n * sizeof(float));
    struct cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, d2 + 5));
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    assert_int_equal(a.device, 0);
    CK(cudaPointerGetAttributes(&a, h + 5));
    assert_int_equal(a.type, cudaMemoryTypeHost);
    assert_ptr_equal(a.devicePointer, h + 5);
    int local;
    CK(cudaPointerGetAttributes(&a, &local));
    assert_int_equal(a.type, cudaMemoryTypeUnregistered);
    CK(cudaFree(d2));
    CK(cudaFreeHost(h));
    CK(cudaStreamDestroy(s));
}

static void test_stream_ordered_free_waits_for_earlier_work(void **state)
{
    cudaStream_t s;
    char *p;
    size_t fr0, fr1, fr2, tot;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMemGetInfo(&fr0, &tot));
    CK(cudaMallocAsync((void **)&p, 1 << 20, s));
    volatile int open = 0;
    struct gate_arg g = {&open};
    CK(standin_launch(s, "gate", k_gate, &g, sizeof g));
    CK(cudaMemsetAsync(p, 1, 1 << 20, s));
    CK(cudaFreeAsync(p, s));
    /* freed in stream order: still held, but no longer an operand */
    CK(cudaMemGetInfo(&fr1, &tot));
    assert_true(fr1 <= fr0 - (1 << 20));
    assert_int_equal(cudaMemsetAsync(p, 0, 16, s), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(p + 256), cudaErrorInvalidValue);
    __atomic_store_n(&open, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemGetInfo(&fr2, &tot));
    assert_int_equal(fr2, fr0);
    cudaGetLastError();
    CK(cudaStreamDestroy(s));
}

static void test_devices_show_as_configured(void **state)
{
    int n, v;
    char bus[32];
    struct cudaDeviceProp p;
    unsigned flags;
    CK(cudaGetDeviceCount(&n));
    assert_int_equal(n, 2);
    CK(cudaGetDeviceProperties(&p, 1));
    assert_non_null(strstr(p.name, "stand-in"));
    assert_int_equal(p.major, 9);
    assert_int_equal(p.totalGlobalMem, (size_t)64 << 20);
    CK(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, 0));
    assert_int_equal(v, 1);
    CK(cudaDeviceGetPCIBusId(bus, sizeof bus, 1));
    assert_string_equal(bus, "0000:02:00.0");
    assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
    cudaGetLastError();
    CK(cudaSetDevice(1));
    CK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
    CK(cudaGetDeviceFlags(&flags));
    assert_int_equal(flags, cudaDeviceScheduleBlockingSync);
    CK(cudaSetDeviceFlags(0));
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceFlags(&flags));
    assert_int_equal(flags, 0);
    int cur = -1;
    CK(cudaGetDevice(&cur));
    assert_int_equal(cur, 0);
}

static void test_allocation_beyond_capacity_fails(void **state)
{
    void *p;
    size_t fr, tot;
    CK(cudaSetDevice(1));
    CK(cudaMemGetInfo(&fr, &tot));
    assert_int_equal(cudaMalloc(&p, tot + 1), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    CK(cudaMalloc(&p, fr));
    CK(cudaFree(p));
    CK(cudaSetDevice(0));
}

static void test_host_read_of_device_pointer_faults(void **state)
{
    char *d;
    CK(cudaSetDevice(0));
    CK(cudaMalloc((void **)&d, 4096));
    CK(cudaMemset(d, 7, 4096));
    assert_int_equal(((char *)standin_view(d))[100], 7); /* the workers' view reads */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile char c = *(volatile char *)d;
        (void)c;
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGSEGV);
    CK(cudaFree(d));
}

static void test_pinned_copy_returns_before_it_ran_pageable_stalls(void **state)
{
    const size_t n = 1 << 16;
    cudaStream_t s;
    char *d, *pinned, *pageable = malloc(n);
    assert_non_null(pageable);
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&d, n));
    CK(cudaHostAlloc((void **)&pinned, n, 0));
    CK(cudaMemsetAsync(d, 5, n, s));
    memset(pinned, 0, n);

    volatile int open = 0;
    struct gate_arg g = {&open};
    CK(standin_launch(s, "gate", k_gate, &g, sizeof g));
    uint64_t stalls = ctl->pageable_stalls();
    CK(cudaMemcpyAsync(pinned, d, n, cudaMemcpyDeviceToHost, s)); /* returns at once */
    assert_int_equal(ctl->pageable_stalls(), stalls);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    __atomic_store_n(&open, 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(s));
    assert_int_equal(pinned[n - 1], 5);

    struct nap_arg nap = {30};
    CK(standin_launch(s, "nap", k_nap, &nap, sizeof nap));
    memset(pageable, 0, n);
    CK(cudaMemcpyAsync(pageable, d, n, cudaMemcpyDeviceToHost, s)); /* waits for the nap */
    assert_int_equal(ctl->pageable_stalls(), stalls + 1);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(pageable[i], 5);
    CK(cudaStreamQuery(s));
    CK(cudaFree(d));
    CK(cudaFreeHost(pinned));
    CK(cudaStreamDestroy(s));
    free(pageable);
}

static void test_host_range_spanning_two_registrations_is_refused(void **state)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    cudaStream_t s;
    char *d;
    char *h = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(h != MAP_FAILED);
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&d, 3 * page));
    uint64_t regs = ctl->registrations(), refused = ctl->spanning_refused();
    CK(cudaHostRegister(h, page, cudaHostRegisterPortable));
    CK(cudaHostRegister(h + page, page, cudaHostRegisterPortable));
    assert_int_equal(ctl->registrations(), regs + 2);
    int pol = ctl->last_registration_policy();
    assert_true(pol >= -1 && pol < 16);
    assert_int_equal(cudaHostRegister(h + page / 2, page, 0),
                     cudaErrorHostMemoryAlreadyRegistered);
    /* inside one registration: pinned */
    CK(cudaMemcpyAsync(d, h + page, page, cudaMemcpyHostToDevice, s));
    /* across two, and pinned + pageable */
    assert_int_equal(cudaMemcpyAsync(d, h + page / 2, page, cudaMemcpyHostToDevice, s),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyAsync(h + page, d, 2 * page, cudaMemcpyDeviceToHost, s),
                     cudaErrorInvalidValue);
    assert_int_equal(ctl->spanning_refused(), refused + 2);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    CK(cudaStreamSynchronize(s));
    assert_int_equal(cudaHostUnregister(h + 1), cudaErrorHostMemoryNotRegistered);
    CK(cudaHostUnregister(h));
    CK(cudaHostUnregister(h + page));
    cudaGetLastError();
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    munmap(h, 3 * page);
}

/* ------------------------------------------------------------ order */

static const fso_standin_item *find(const fso_standin_item *it, size_t n, int stream,
                                    const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (it[i].device == 0 && it[i].stream == stream && strcmp(it[i].what, what) == 0)
            return &it[i];
    return NULL;
}

static int slot_of(const fso_standin_item *it, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(it[i].what, what) == 0)
            return it[i].stream;
    return -1;
}

static void test_events_order_work_across_streams(void **state)
{
    cudaStream_t a, b, c;
    cudaEvent_t ev, never;
    float *x;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming));
    CK(cudaEventQuery(never)); /* never recorded: complete */
    CK(cudaEventSynchronize(never));
    CK(cudaMalloc((void **)&x, 1024 * sizeof(float)));
    ctl->record(1000);

    struct nap_arg nap = {20};
    struct fill_arg f = {x, 1024, 3.0f};
    CK(standin_launch(a, "first", k_nap, &nap, sizeof nap));
    CK(standin_launch(a, "fill", k_fill, &f, sizeof f));
    CK(cudaEventRecord(ev, a));
    CK(standin_launch(a, "later_on_a", k_none, NULL, 0)); /* after the capture */
    CK(cudaStreamWaitEvent(b, ev, 0));
    CK(standin_launch(b, "after_wait", k_none, NULL, 0));
    CK(standin_launch(c, "unordered", k_none, NULL, 0));
    CK(cudaEventSynchronize(ev));
    CK(cudaEventQuery(ev));
    CK(cudaStreamSynchronize(a));
    CK(cudaStreamSynchronize(b));
    CK(cudaStreamSynchronize(c));

    const fso_standin_item *it;
    size_t n = ctl->recorded(&it);
    assert_int_equal(n, 6);
    const int sa = slot_of(it, n, "kernel fill"), sb = slot_of(it, n, "kernel after_wait"),
              sc = slot_of(it, n, "kernel unordered");
    assert_true(sa >= 0 && sb >= 0 && sc >= 0 && sa != sb && sb != sc);
    const fso_standin_item *fill = find(it, n, sa, "kernel fill");
    const fso_standin_item *later = find(it, n, sa, "kernel later_on_a");
    const fso_standin_item *wait = find(it, n, sb, "wait");
    const fso_standin_item *aw = find(it, n, sb, "kernel after_wait");
    const fso_standin_item *un = find(it, n, sc, "kernel unordered");
    assert_non_null(fill);
    assert_non_null(later);
    assert_non_null(wait);
    assert_non_null(aw);
    assert_non_null(un);
    assert_int_equal(fill->after[sa], fill->seq);
    assert_true(aw->after[sa] >= fill->seq);     /* ordered after the fill */
    assert_true(aw->after[sa] < later->seq);     /* not after what followed the record */
    assert_true(aw->start_tick > fill->end_tick);
    assert_true(aw->after[sb] == aw->seq && aw->seq > wait->seq);
    assert_true(un->after[sa] < fill->seq);      /* no wait: not ordered */

    /* re-recording replaces the capture; a wait takes the one at its call */
    volatile int open = 0;
    struct gate_arg g = {&open};
    CK(standin_launch(a, "gate", k_gate, &g, sizeof g));
    CK(cudaEventRecord(ev, a));
    assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
    __atomic_store_n(&open, 1, __ATOMIC_RELEASE);
    CK(cudaEventSynchronize(ev));
    CK(cudaStreamQuery(a));

    CK(cudaFree(x));
    CK(cudaEventDestroy(ev));
    CK(cudaEventDestroy(never));
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
    CK(cudaStreamDestroy(c));
}

struct add_arg {
    int *p; /* device */
    size_t n;
};

static void k_add_one(void *a)
{
    struct add_arg *f = a;
    int *x = standin_view(f->p);
    for (size_t i = 0; i < f->n; i++)
        x[i]++;
}

#define SHARERS 2
#define ROUNDS 100

struct sharer {
    int id;
    cudaStream_t s;
    cudaEvent_t *ev;  /* SHARERS events, one recorded by each thread */
    int *d;           /* device, 64 ints */
    int *h;           /* pinned */
    cudaError_t e;
};

/* A host thread of a device shared with another: kernels and copies on its
 * stream, each round ordered after the other thread's latest event. */
static void *sharer_main(void *p)
{
    struct sharer *sh = p;
    struct add_arg a = {sh->d, 64};
    cudaError_t e = cudaSetDevice(0);
    for (int r = 0; r < ROUNDS && e == cudaSuccess; r++) {
        e = standin_launch(sh->s, "add_one", k_add_one, &a, sizeof a);
        if (e == cudaSuccess)
            e = cudaEventRecord(sh->ev[sh->id], sh->s);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(sh->s, sh->ev[(sh->id + 1) % SHARERS], 0);
        if (e == cudaSuccess && r % 10 == 0)
            e = cudaMemcpyAsync(sh->h, sh->d, 64 * sizeof(int), cudaMemcpyDeviceToHost, sh->s);
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(sh->h, sh->d, 64 * sizeof(int), cudaMemcpyDeviceToHost, sh->s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(sh->s);
    sh->e = e;
    return NULL;
}

static void *sharers_run(void *p)
{
    struct sharer *sh = p;
    pthread_t t[SHARERS];
    for (int i = 0; i < SHARERS; i++)
        pthread_create(&t[i], NULL, sharer_main, &sh[i]);
    for (int i = 0; i < SHARERS; i++)
        pthread_join(t[i], NULL);
    return NULL;
}

static void test_two_host_threads_share_a_device(void **state)
{
    struct sharer sh[SHARERS];
    cudaEvent_t ev[SHARERS];
    CK(cudaSetDevice(0));
    for (int i = 0; i < SHARERS; i++) {
        sh[i] = (struct sharer){.id = i, .ev = ev};
        CK(cudaStreamCreateWithFlags(&sh[i].s, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        CK(cudaMalloc((void **)&sh[i].d, 64 * sizeof(int)));
        CK(cudaMemset(sh[i].d, 0, 64 * sizeof(int)));
        CK(cudaHostAlloc((void **)&sh[i].h, 64 * sizeof(int), 0));
    }
    within_ms(sharers_run, sh, 60000);
    for (int i = 0; i < SHARERS; i++) {
        CK(sh[i].e);
        for (int j = 0; j < 64; j++)
            assert_int_equal(sh[i].h[j], ROUNDS);
        CK(cudaFree(sh[i].d));
        CK(cudaFreeHost(sh[i].h));
        CK(cudaEventDestroy(ev[i]));
        CK(cudaStreamDestroy(sh[i].s));
    }
}

static void test_injected_kernel_fault_is_sticky_until_reset(void **state)
{
    cudaStream_t s;
    void *p;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ctl->fail_kernel(2);
    CK(standin_launch(s, "ok", k_none, NULL, 0));
    CK(standin_launch(s, "faults", k_none, NULL, 0)); /* fails when it runs */
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    assert_int_equal(cudaMalloc(&p, 256), cudaErrorLaunchFailure);
    assert_int_equal(standin_launch(s, "refused", k_none, NULL, 0), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* sticky */
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    CK(cudaSetDevice(1)); /* the other device is fine */
    CK(cudaMalloc(&p, 256));
    CK(cudaFree(p));
    CK(cudaSetDevice(0));
    ctl->reset();
    cudaGetLastError();
    CK(cudaStreamSynchronize(s));
    CK(cudaMalloc(&p, 256));

    ctl->fail_copy(1);
    CK(cudaMemsetAsync(p, 0, 256, s));
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
    assert_string_equal(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
    ctl->reset();
    cudaGetLastError();
    CK(cudaFree(p));
    CK(cudaStreamDestroy(s));
}

/* ------------------------------------------------------------ NCCL */

#define RANKS 2
#define CNT 1000

struct rank_ctx {
    int rank;
    ncclComm_t comm;
    cudaStream_t s;
    float *send, *recv; /* device: CNT * RANKS each */
    double *dd;
    float *host;        /* pinned: CNT * RANKS */
    double hd[4];
    ncclResult_t r;
    cudaError_t e;
};

static void rank_setup(struct rank_ctx *rc, int rank, ncclComm_t comm)
{
    memset(rc, 0, sizeof *rc);
    rc->rank = rank;
    rc->comm = comm;
    CK(cudaSetDevice(rank));
    CK(cudaStreamCreateWithFlags(&rc->s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&rc->send, sizeof(float) * CNT * RANKS));
    CK(cudaMalloc((void **)&rc->recv, sizeof(float) * CNT * RANKS));
    CK(cudaMalloc((void **)&rc->dd, sizeof(double) * 4));
    CK(cudaHostAlloc((void **)&rc->host, sizeof(float) * CNT * RANKS, 0));
}

static void rank_teardown(struct rank_ctx *rc)
{
    CK(cudaSetDevice(rc->rank));
    CK(cudaFree(rc->send));
    CK(cudaFree(rc->recv));
    CK(cudaFree(rc->dd));
    CK(cudaFreeHost(rc->host));
    CK(cudaStreamDestroy(rc->s));
}

/* One rank's thread: the three collectives, in place where NCCL allows. */
static void *rank_main(void *p)
{
    struct rank_ctx *rc = p;
    const int r = rc->rank;
    const size_t all = (size_t)CNT * RANKS;
    cudaSetDevice(r);
    for (size_t i = 0; i < all; i++)
        rc->host[i] = (float)(r * 10000 + (int)i);
    cudaMemcpyAsync(rc->send, rc->host, sizeof(float) * all, cudaMemcpyHostToDevice, rc->s);
    /* all_gather, in place: my part already at recv + r * CNT */
    cudaMemcpyAsync(rc->recv + (size_t)r * CNT, rc->send, sizeof(float) * CNT,
                    cudaMemcpyDeviceToDevice, rc->s);
    rc->r = ncclAllGather(rc->recv + (size_t)r * CNT, rc->recv, CNT, ncclFloat, rc->comm, rc->s);
    if (rc->r != ncclSuccess)
        return NULL;
    cudaMemcpyAsync(rc->host, rc->recv, sizeof(float) * all, cudaMemcpyDeviceToHost, rc->s);
    rc->e = cudaStreamSynchronize(rc->s);
    for (int q = 0; q < RANKS && rc->e == cudaSuccess; q++)
        for (size_t i = 0; i < CNT; i++)
            if (rc->host[(size_t)q * CNT + i] != (float)(q * 10000 + (int)i))
                rc->e = cudaErrorInvalidValue;
    /* reduce_scatter, in place: recv = send + r * CNT */
    rc->r = ncclReduceScatter(rc->send, rc->send + (size_t)r * CNT, CNT, ncclFloat, ncclSum,
                              rc->comm, rc->s);
    if (rc->r != ncclSuccess)
        return NULL;
    cudaMemcpyAsync(rc->host, rc->send + (size_t)r * CNT, sizeof(float) * CNT,
                    cudaMemcpyDeviceToHost, rc->s);
    if (rc->e == cudaSuccess)
        rc->e = cudaStreamSynchronize(rc->s);
    for (size_t i = 0; i < CNT && rc->e == cudaSuccess; i++) {
        float want = 0;
        for (int q = 0; q < RANKS; q++)
            want += (float)(q * 10000 + r * CNT + (int)i);
        if (rc->host[i] != want)
            rc->e = cudaErrorInvalidValue;
    }
    /* all_reduce of doubles, in place */
    for (int i = 0; i < 4; i++)
        rc->hd[i] = (r + 1) * 0.5 + i;
    double *hd = (double *)rc->host;
    memcpy(hd, rc->hd, sizeof rc->hd);
    cudaMemcpyAsync(rc->dd, hd, sizeof rc->hd, cudaMemcpyHostToDevice, rc->s);
    rc->r = ncclAllReduce(rc->dd, rc->dd, 4, ncclDouble, ncclSum, rc->comm, rc->s);
    if (rc->r != ncclSuccess)
        return NULL;
    cudaMemcpyAsync(hd, rc->dd, sizeof rc->hd, cudaMemcpyDeviceToHost, rc->s);
    if (rc->e == cudaSuccess)
        rc->e = cudaStreamSynchronize(rc->s);
    for (int i = 0; i < 4 && rc->e == cudaSuccess; i++)
        if (hd[i] != 0.5 + 1.0 + 2 * i)
            rc->e = cudaErrorInvalidValue;
    /* all-to-all by a group of sends and receives: piece q of my send goes
     * to rank q, piece r of rank q's lands at recv + q * CNT; outside a
     * group the stand-in refuses them */
    if (ncclSend(rc->send, CNT, ncclFloat, 0, rc->comm, rc->s) != ncclInvalidUsage)
        rc->e = cudaErrorInvalidValue;
    for (size_t i = 0; i < all; i++)
        rc->host[i] = (float)(r * 10000 + (int)i);
    cudaMemcpyAsync(rc->send, rc->host, sizeof(float) * all, cudaMemcpyHostToDevice, rc->s);
    ncclGroupStart();
    for (int q = 0; q < RANKS; q++) {
        ncclSend(rc->send + (size_t)q * CNT, CNT, ncclFloat, q, rc->comm, rc->s);
        ncclRecv(rc->recv + (size_t)q * CNT, CNT, ncclFloat, q, rc->comm, rc->s);
    }
    rc->r = ncclGroupEnd();
    if (rc->r != ncclSuccess)
        return NULL;
    cudaMemcpyAsync(rc->host, rc->recv, sizeof(float) * all, cudaMemcpyDeviceToHost, rc->s);
    if (rc->e == cudaSuccess)
        rc->e = cudaStreamSynchronize(rc->s);
    for (int q = 0; q < RANKS && rc->e == cudaSuccess; q++)
        for (size_t i = 0; i < CNT; i++)
            if (rc->host[(size_t)q * CNT + i] != (float)(q * 10000 + r * CNT + (int)i))
                rc->e = cudaErrorInvalidValue;
    return NULL;
}

static void *ranks_run(void *p)
{
    struct rank_ctx *rc = p;
    pthread_t t[RANKS];
    for (int r = 0; r < RANKS; r++)
        pthread_create(&t[r], NULL, rank_main, &rc[r]);
    for (int r = 0; r < RANKS; r++)
        pthread_join(t[r], NULL);
    return NULL;
}

static void test_collectives_give_nccl_results(void **state)
{
    ncclComm_t comm[RANKS];
    struct rank_ctx rc[RANKS];
    NK(ncclCommInitAll(comm, RANKS, NULL));
    for (int r = 0; r < RANKS; r++)
        rank_setup(&rc[r], r, comm[r]);
    within_ms(ranks_run, rc, 20000);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(rc[r].r, ncclSuccess);
        assert_int_equal(rc[r].e, cudaSuccess);
    }
    for (int r = 0; r < RANKS; r++) {
        rank_teardown(&rc[r]);
        NK(ncclCommDestroy(comm[r]));
    }
}

static void test_collective_blocks_until_all_ranks_arrive(void **state)
{
    ncclComm_t comm[RANKS];
    struct rank_ctx rc[RANKS];
    NK(ncclCommInitAll(comm, RANKS, NULL));
    for (int r = 0; r < RANKS; r++)
        rank_setup(&rc[r], r, comm[r]);
    CK(cudaSetDevice(0));
    NK(ncclAllReduce(rc[0].send, rc[0].recv, CNT, ncclFloat, ncclSum, comm[0], rc[0].s));
    sleep_ms(50);
    assert_int_equal(cudaStreamQuery(rc[0].s), cudaErrorNotReady); /* rank 1 has not come */
    CK(cudaSetDevice(1));
    NK(ncclAllReduce(rc[1].send, rc[1].recv, CNT, ncclFloat, ncclSum, comm[1], rc[1].s));
    CK(cudaStreamSynchronize(rc[1].s));
    CK(cudaStreamSynchronize(rc[0].s));
    /* the wrong stream, an unsupported reduction type */
    assert_int_equal(ncclAllReduce(rc[1].send, rc[1].recv, CNT, ncclFloat, ncclSum, comm[1],
                                   rc[0].s),
                     ncclInvalidArgument);
    assert_true(strlen(ncclGetLastError(comm[1])) > 0);
    assert_int_equal(ncclAllReduce(rc[1].send, rc[1].recv, CNT, ncclBfloat16, ncclSum, comm[1],
                                   rc[1].s),
                     ncclInvalidArgument);
    for (int r = 0; r < RANKS; r++) {
        rank_teardown(&rc[r]);
        NK(ncclCommDestroy(comm[r]));
    }
}

static void *sync_stream(void *p)
{
    struct rank_ctx *rc = p;
    rc->e = cudaStreamSynchronize(rc->s);
    return NULL;
}

static void test_stalled_rank_is_released_by_abort(void **state)
{
    ncclComm_t comm[RANKS];
    struct rank_ctx rc[RANKS];
    NK(ncclCommInitAll(comm, RANKS, NULL));
    for (int r = 0; r < RANKS; r++)
        rank_setup(&rc[r], r, comm[r]);
    ctl->stall_rank(1);
    for (int r = 0; r < RANKS; r++) {
        CK(cudaSetDevice(r));
        NK(ncclAllGather(rc[r].send, rc[r].recv, CNT, ncclFloat, comm[r], rc[r].s));
    }
    sleep_ms(50);
    assert_int_equal(cudaStreamQuery(rc[0].s), cudaErrorNotReady);
    assert_int_equal(cudaStreamQuery(rc[1].s), cudaErrorNotReady);
    ncclResult_t ae;
    NK(ncclCommGetAsyncError(comm[0], &ae));
    assert_int_equal(ae, ncclSuccess);
    NK(ncclCommAbort(comm[1])); /* the stalled rank's: releases the clique */
    within_ms(sync_stream, &rc[0], 5000);
    within_ms(sync_stream, &rc[1], 5000);
    assert_int_equal(rc[0].e, cudaSuccess);
    NK(ncclCommGetAsyncError(comm[0], &ae));
    assert_int_equal(ae, ncclSystemError);
    assert_int_equal(ncclAllGather(rc[0].send, rc[0].recv, CNT, ncclFloat, comm[0], rc[0].s),
                     ncclInvalidUsage);
    /* an aborted handle is not to be used again (NCCL frees it) */
    assert_int_equal(ncclCommGetAsyncError(comm[1], &ae), ncclInvalidUsage);
    assert_int_equal(ncclCommDestroy(comm[1]), ncclInvalidUsage);
    assert_non_null(strstr(ncclGetLastError(NULL), "aborted"));
    NK(ncclCommAbort(comm[0]));
    for (int r = 0; r < RANKS; r++)
        rank_teardown(&rc[r]);
}

/* Polls of ncclCommGetAsyncError until it leaves ncclInProgress (at most
 * 1000): how many said ncclInProgress; *last gets the final state. */
static int polls_in_progress(ncclComm_t c, ncclResult_t *last)
{
    int n = 0;
    for (; n < 1000; n++) {
        NK(ncclCommGetAsyncError(c, last));
        if (*last != ncclInProgress)
            break;
    }
    return n;
}

struct init_job {
    int rank;
    ncclUniqueId id;
    ncclComm_t comm;
    ncclResult_t r;
};

static void *init_rank_main(void *p) /* the blocking init: returns once both joined */
{
    struct init_job *j = p;
    cudaSetDevice(j->rank);
    j->r = ncclCommInitRank(&j->comm, RANKS, j->id, j->rank);
    return NULL;
}

static void *init_pair(void *p)
{
    struct init_job *j = p;
    pthread_t t[RANKS];
    for (int r = 0; r < RANKS; r++)
        pthread_create(&t[r], NULL, init_rank_main, &j[r]);
    for (int r = 0; r < RANKS; r++)
        pthread_join(t[r], NULL);
    return NULL;
}

static void test_ranks_meet_by_unique_id(void **state)
{
    ncclUniqueId id, other;
    NK(ncclGetUniqueId(&id));
    NK(ncclGetUniqueId(&other));
    assert_true(memcmp(&id, &other, sizeof id) != 0);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm[RANKS] = {0}, bad = NULL;
    CK(cudaSetDevice(0));
    assert_int_equal(ncclCommInitRankConfig(&comm[0], RANKS, id, 0, &cfg), ncclInProgress);
    assert_non_null(comm[0]);
    ncclResult_t st;
    NK(ncclCommGetAsyncError(comm[0], &st));
    assert_int_equal(st, ncclInProgress); /* rank 1 has not joined */
    struct rank_ctx rc[RANKS];
    rank_setup(&rc[0], 0, comm[0]);
    CK(cudaSetDevice(0));
    assert_int_equal(ncclAllGather(rc[0].send, rc[0].recv, CNT, ncclFloat, comm[0], rc[0].s),
                     ncclInvalidUsage); /* before the init completed */
    /* NCCL's rules: one device per rank, each rank once, one rank count */
    assert_int_equal(ncclCommInitRankConfig(&bad, RANKS, id, 1, &cfg), ncclInvalidUsage);
    assert_non_null(strstr(ncclGetLastError(NULL), "both CUDA device 0"));
    CK(cudaSetDevice(1));
    assert_int_equal(ncclCommInitRankConfig(&bad, RANKS, id, 0, &cfg), ncclInvalidUsage);
    assert_int_equal(ncclCommInitRankConfig(&bad, RANKS + 1, id, 1, &cfg), ncclInvalidUsage);
    assert_null(bad);
    assert_int_equal(ncclCommInitRankConfig(&comm[1], RANKS, id, 1, &cfg), ncclInProgress);
    /* complete now, reported after a few looks (a caller's poll loop runs) */
    for (int r = 0; r < RANKS; r++) {
        int n = polls_in_progress(comm[r], &st);
        assert_int_equal(st, ncclSuccess);
        assert_true(n >= 1 && n < 1000);
    }
    rank_setup(&rc[1], 1, comm[1]);
    within_ms(ranks_run, rc, 20000);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(rc[r].r, ncclSuccess);
        assert_int_equal(rc[r].e, cudaSuccess);
    }
    for (int r = 0; r < RANKS; r++) {
        rank_teardown(&rc[r]);
        assert_int_equal(ncclCommFinalize(comm[r]), ncclInProgress);
        int n = polls_in_progress(comm[r], &st);
        assert_int_equal(st, ncclSuccess);
        assert_true(n >= 1 && n < 1000);
        NK(ncclCommDestroy(comm[r]));
    }
    /* the blocking init returns once every rank has joined */
    struct init_job jobs[RANKS];
    for (int r = 0; r < RANKS; r++)
        jobs[r] = (struct init_job){.rank = r, .id = other};
    within_ms(init_pair, jobs, 5000);
    for (int r = 0; r < RANKS; r++) {
        NK(jobs[r].r);
        NK(ncclCommGetAsyncError(jobs[r].comm, &st));
        assert_int_equal(st, ncclSuccess);
        NK(ncclCommDestroy(jobs[r].comm));
    }
}

/* ------------------------------------------------------------ cuBLAS */

static float bf(float f) /* round to bf16 and back, nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf_bits(float f)
{
    f = bf(f);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float bf_val(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* C(m, n) = alpha op(A) op(B) + beta C, column-major, one batch. */
static void naive(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
                float b = tb ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
                s += (double)a * b;
            }
            float *c = &C[(size_t)j * ldc + i];
            *c = (float)(alpha * s + (beta != 0.0f ? beta * *c : 0.0f));
        }
}

static void gemm_case(cublasHandle_t h, cudaStream_t s, int bf16, int ta, int tb, int batch,
                      float beta)
{
    const int m = 17, n = 9, k = 23, lda = 30, ldb = 31, ldc = 20;
    const long long sa = (long long)lda * 30, sb = (long long)ldb * 30, sc = (long long)ldc * 10;
    const size_t na = (size_t)sa * batch, nb = (size_t)sb * batch, nc = (size_t)sc * batch;
    const size_t es = bf16 ? 2 : 4;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4);
    void *hA = malloc(na * es), *hB = malloc(nb * es), *hC = malloc(nc * es);
    void *dA, *dB, *dC;
    srand(42);
    for (size_t i = 0; i < na; i++)
        A[i] = bf((float)(rand() % 2001 - 1000) / 250.0f);
    for (size_t i = 0; i < nb; i++)
        B[i] = bf((float)(rand() % 2001 - 1000) / 250.0f);
    for (size_t i = 0; i < nc; i++)
        C[i] = bf((float)(rand() % 201 - 100) / 50.0f);
    for (size_t i = 0; i < na; i++)
        bf16 ? (void)(((uint16_t *)hA)[i] = bf_bits(A[i])) : (void)(((float *)hA)[i] = A[i]);
    for (size_t i = 0; i < nb; i++)
        bf16 ? (void)(((uint16_t *)hB)[i] = bf_bits(B[i])) : (void)(((float *)hB)[i] = B[i]);
    for (size_t i = 0; i < nc; i++)
        bf16 ? (void)(((uint16_t *)hC)[i] = bf_bits(C[i])) : (void)(((float *)hC)[i] = C[i]);
    CK(cudaMalloc(&dA, na * es));
    CK(cudaMalloc(&dB, nb * es));
    CK(cudaMalloc(&dC, nc * es));
    CK(cudaMemcpyAsync(dA, hA, na * es, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(dB, hB, nb * es, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(dC, hC, nc * es, cudaMemcpyHostToDevice, s));
    const float alpha = 0.75f;
    const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA, t, lda, dB, t, ldb, &beta, dC, t, ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, dA, t, lda, sa, dB, t, ldb, sb,
                                        &beta, dC, t, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    assert_int_equal(st, CUBLAS_STATUS_SUCCESS);
    CK(cudaMemcpyAsync(hC, dC, nc * es, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int b = 0; b < batch; b++)
        naive(ta, tb, m, n, k, alpha, A + b * sa, lda, B + b * sb, ldb, beta, C + b * sc, ldc);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                size_t at = (size_t)(b * sc) + (size_t)j * ldc + (size_t)i;
                float got = bf16 ? bf_val(((uint16_t *)hC)[at]) : ((float *)hC)[at];
                float want = bf16 ? bf(C[at]) : C[at];
                float tol = bf16 ? 0.01f * (1.0f + fabsf(want)) : 1e-4f * (1.0f + fabsf(want));
                if (fabsf(got - want) > tol)
                    fail_msg("gemm bf16=%d ta=%d tb=%d batch=%d: C[%d](%d, %d) = %g, want %g",
                             bf16, ta, tb, batch, b, i, j, got, want);
            }
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    free(A);
    free(B);
    free(C);
    free(hA);
    free(hB);
    free(hC);
}

static void test_gemm_matches_naive_loop(void **state)
{
    cublasHandle_t h;
    cudaStream_t s;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case(h, s, bf16, ta, tb, 1, 0.0f);
                gemm_case(h, s, bf16, ta, tb, 3, 0.5f);
            }
    /* a leading dimension too small; fp32 operands into a bf16 C */
    const float one = 1.0f;
    void *d;
    CK(cudaMalloc(&d, 4096));
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 4, d,
                                  CUDA_R_32F, 8, &one, d, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 8, d,
                                  CUDA_R_32F, 8, &one, d, CUDA_R_16BF, 8, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    CK(cudaFree(d));
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    CK(cudaStreamDestroy(s));
}

int main(void)
{
    /* two small devices (the tests count on them); set before the stand-in
     * first reads them. FSO_STANDIN_DELAY_US and _SEED may vary. */
    setenv("FSO_STANDIN_MEM_MIB", "64", 1);
    setenv("FSO_STANDIN_DEVICES", "2", 1);
    ctl = fso_standin_control();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_copies_round_trip_through_device_memory, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stream_ordered_free_waits_for_earlier_work, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_devices_show_as_configured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allocation_beyond_capacity_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_read_of_device_pointer_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_copy_returns_before_it_ran_pageable_stalls,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_range_spanning_two_registrations_is_refused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_order_work_across_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_host_threads_share_a_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_injected_kernel_fault_is_sticky_until_reset, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_collectives_give_nccl_results, setup, teardown),
        cmocka_unit_test_setup_teardown(test_collective_blocks_until_all_ranks_arrive, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stalled_rank_is_released_by_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ranks_meet_by_unique_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm_matches_naive_loop, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
