/* standin_rt.c — the CUDA runtime stand-in's devices, streams, events,
 * errors and controls (fso_standin.h): the real entry points of
 * <cuda_runtime.h> that fsoff's CUDA module calls, on the CPU.
 *
 * A stream is a worker thread running its FIFO in order; each item sleeps a
 * random 0..FSO_STANDIN_DELAY_US first, so only the stream order and event
 * waits order work. An item's sequence numbers its slot (the stream's index
 * on its device); they continue across a slot's reuse, so vector clocks stay
 * comparable. Stream 0 (the legacy default stream) is refused:
 * cudaErrorInvalidResourceHandle. Device memory, host registrations and
 * copies are in standin_mem.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"
#include "standin_rt.h"

#define STREAM_MAGIC 0x53545231u
#define EVENT_MAGIC 0x45565431u

struct item {
    struct item *next;
    char what[40];
    uint64_t seq;
    uint64_t issue_tick;   /* tick() when queued */
    uint64_t after[SI_MAX_STREAMS];
    si_item_fn fn;         /* NULL: a wait on (wdev, wslot, wseq) */
    void *arg;
    void (*fini)(void *);
    unsigned flags;
    cudaError_t fail;      /* injected: the item ends with this instead of running */
    si_dev *wdev;
    int wslot;
    uint64_t wseq;
};

struct CUstream_st {
    uint32_t magic;
    si_dev *dev;
    int slot;                        /* immutable */
    unsigned flags;
    pthread_t thr;
    pthread_cond_t cv;               /* dev->mu: an item queued or stop */
    struct item *head, *tail;        /* dev->mu */
    uint64_t clock[SI_MAX_STREAMS];  /* dev->mu: the last queued item's clock */
    bool stop;                       /* dev->mu */
    uint64_t rng;                    /* the worker's only */
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    pthread_mutex_t mu;              /* the capture below */
    bool recorded;
    si_dev *dev;
    int slot;
    uint64_t seq;
    uint64_t clock[SI_MAX_STREAMS];
};

static struct {
    pthread_once_t once;
    int n_dev;
    unsigned delay_us;
    uint64_t seed;
    si_dev dev[SI_MAX_DEV];
    _Atomic uint64_t tick, streams_made;
    pthread_mutex_t ctl_mu;          /* the fault countdowns */
    uint64_t kfault, cfault;
    _Atomic int stall;
    pthread_mutex_t rec_mu;          /* the record */
    fso_standin_item *rec;
    size_t n_rec, cap_rec;
} G = {.once = PTHREAD_ONCE_INIT, .ctl_mu = PTHREAD_MUTEX_INITIALIZER,
       .rec_mu = PTHREAD_MUTEX_INITIALIZER, .stall = -1};

static __thread int t_cur;                 /* current device */
static __thread cudaError_t t_last;        /* last error */

static unsigned long env_ul(const char *name, unsigned long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long x = strtoul(v, &end, 0);
    if (*end) {
        fprintf(stderr, "fsoff CUDA stand-in: %s=%s is not a number\n", name, v);
        abort();
    }
    return x;
}

static void init_once(void)
{
    unsigned long n = env_ul("FSO_STANDIN_DEVICES", 2);
    unsigned long mib = env_ul("FSO_STANDIN_MEM_MIB", 1024);
    G.delay_us = (unsigned)env_ul("FSO_STANDIN_DELAY_US", 50);
    G.seed = env_ul("FSO_STANDIN_SEED", 0x5eed);
    if (n > SI_MAX_DEV)
        n = SI_MAX_DEV;
    if (mib == 0)
        mib = 1;
    for (unsigned long i = 0; i < n; i++) {
        si_dev *d = &G.dev[i];
        d->index = (int)i;
        d->bytes = (size_t)mib << 20;
        d->fd = memfd_create("fso-standin-device", MFD_CLOEXEC);
        if (d->fd < 0 || ftruncate(d->fd, (off_t)d->bytes) != 0) {
            perror("fsoff CUDA stand-in: device memory (memfd)");
            abort();
        }
        d->base = mmap(NULL, d->bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE, d->fd, 0);
        d->view = mmap(NULL, d->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                       d->fd, 0);
        if (d->base == MAP_FAILED || d->view == MAP_FAILED) {
            perror("fsoff CUDA stand-in: device memory (mmap)");
            abort();
        }
        pthread_mutex_init(&d->mu, NULL);
        pthread_cond_init(&d->done_cv, NULL);
    }
    G.n_dev = (int)n;
}

void si_init(void)
{
    pthread_once(&G.once, init_once);
}

int si_device_count(void)
{
    si_init();
    return G.n_dev;
}

si_dev *si_device(int index)
{
    si_init();
    return index >= 0 && index < G.n_dev ? &G.dev[index] : NULL;
}

int si_current(void)
{
    return t_cur;
}

int standin_current_device(void)
{
    return t_cur;
}

cudaError_t si_set_last(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

cudaError_t si_sticky(const si_dev *d)
{
    return (cudaError_t)atomic_load(&((si_dev *)d)->sticky);
}

static void set_sticky(si_dev *d, cudaError_t e)
{
    int zero = 0;
    atomic_compare_exchange_strong(&d->sticky, &zero, (int)e);
}

bool si_take_stall(int device)
{
    int want = device;
    return atomic_compare_exchange_strong(&G.stall, &want, -1);
}

/* ------------------------------------------------------------ errors */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    si_dev *d = si_device(t_cur);
    if (e == cudaSuccess && d)
        e = si_sticky(d);
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    si_dev *d = si_device(t_cur);
    if (t_last == cudaSuccess && d)
        return si_sticky(d);
    return t_last;
}

static const struct {
    cudaError_t e;
    const char *name, *text;
} err_tab[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported",
     "operation not supported (by the fsoff CUDA stand-in)"},
};

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof err_tab / sizeof err_tab[0]; i++)
        if (err_tab[i].e == e)
            return err_tab[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof err_tab / sizeof err_tab[0]; i++)
        if (err_tab[i].e == e)
            return err_tab[i].name;
    return "cudaErrorUnknown";
}

/* ------------------------------------------------------------ devices */

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return si_set_last(cudaErrorInvalidValue);
    *count = si_device_count();
    return *count ? cudaSuccess : si_set_last(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (!si_device(device))
        return si_set_last(cudaErrorInvalidDevice);
    t_cur = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return si_set_last(cudaErrorInvalidValue);
    si_init();
    *device = t_cur;
    return cudaSuccess;
}

cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    si_dev *d = si_device(t_cur);
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    if (flags & ~(unsigned)cudaDeviceMask)
        return si_set_last(cudaErrorInvalidValue);
    pthread_mutex_lock(&d->mu);
    d->flags = flags;
    pthread_mutex_unlock(&d->mu);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    si_dev *d = si_device(t_cur);
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    if (!flags)
        return si_set_last(cudaErrorInvalidValue);
    pthread_mutex_lock(&d->mu);
    *flags = d->flags;
    pthread_mutex_unlock(&d->mu);
    return cudaSuccess;
}

#define SI_SMS 4

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    si_dev *d = si_device(device);
    if (!d)
        return si_set_last(cudaErrorInvalidDevice);
    if (!p)
        return si_set_last(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "fsoff CUDA stand-in (CPU)");
    p->totalGlobalMem = d->bytes;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = SI_SMS;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->pciDomainID = 0;
    p->pciBusID = device + 1;
    p->pciDeviceID = 0;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->memoryPoolsSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!si_device(device))
        return si_set_last(cudaErrorInvalidDevice);
    if (!value)
        return si_set_last(cudaErrorInvalidValue);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
        *value = 9;
        return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
        *value = 0;
        return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
        *value = SI_SMS;
        return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported:
    case cudaDevAttrUnifiedAddressing:
        *value = 1;
        return cudaSuccess;
    case cudaDevAttrPciBusId:
        *value = device + 1;
        return cudaSuccess;
    default:
        return si_set_last(cudaErrorNotSupported);
    }
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int device)
{
    if (!si_device(device))
        return si_set_last(cudaErrorInvalidDevice);
    if (!buf || len < 13)
        return si_set_last(cudaErrorInvalidValue);
    snprintf(buf, (size_t)len, "0000:%02x:00.0", device + 1);
    return cudaSuccess;
}

void si_dev_drain(si_dev *d)
{
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < SI_MAX_STREAMS; i++)
        while (d->done[i] < d->issued[i])
            pthread_cond_wait(&d->done_cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

cudaError_t cudaDeviceSynchronize(void)
{
    si_dev *d = si_device(t_cur);
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    si_dev_drain(d);
    return si_set_last(si_sticky(d));
}

/* ------------------------------------------------------------ record */

static uint64_t tick(void)
{
    return atomic_fetch_add(&G.tick, 1) + 1;
}

static void record_item(si_dev *d, int slot, const struct item *it, uint64_t t0, uint64_t t1)
{
    pthread_mutex_lock(&G.rec_mu);
    if (G.n_rec < G.cap_rec) {
        fso_standin_item *r = &G.rec[G.n_rec++];
        memset(r, 0, sizeof *r);
        r->device = d->index;
        r->stream = slot;
        r->seq = it->seq;
        snprintf(r->what, sizeof r->what, "%s", it->what);
        memcpy(r->after, it->after, sizeof r->after);
        r->issue_tick = it->issue_tick;
        r->start_tick = t0;
        r->end_tick = t1;
    }
    pthread_mutex_unlock(&G.rec_mu);
}

/* ------------------------------------------------------------ streams */

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void run_item(si_dev *d, struct item *it)
{
    if (!it->fn) { /* a wait */
        pthread_mutex_lock(&it->wdev->mu);
        while (it->wdev->done[it->wslot] < it->wseq)
            pthread_cond_wait(&it->wdev->done_cv, &it->wdev->mu);
        pthread_mutex_unlock(&it->wdev->mu);
        return;
    }
    if (it->fail != cudaSuccess) {
        set_sticky(d, it->fail);
        return;
    }
    if (si_sticky(d) != cudaSuccess && !(it->flags & SI_ALWAYS_RUN))
        return; /* the context is lost: nothing runs any more */
    cudaError_t e = it->fn(it->arg);
    if (e != cudaSuccess)
        set_sticky(d, e);
}

static void *worker(void *p)
{
    struct CUstream_st *s = p;
    si_dev *d = s->dev;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &d->mu);
        struct item *it = s->head;
        if (!it)
            break;
        pthread_mutex_unlock(&d->mu);
        if (G.delay_us) {
            uint64_t us = next_rand(&s->rng) % ((uint64_t)G.delay_us + 1);
            struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
            if (us)
                nanosleep(&ts, NULL);
        }
        uint64_t t0 = tick();
        run_item(d, it);
        uint64_t t1 = tick();
        if (!(it->flags & SI_NO_RECORD))
            record_item(d, s->slot, it, t0, t1);
        if (it->fini)
            it->fini(it->arg);
        else
            free(it->arg);
        pthread_mutex_lock(&d->mu);
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        d->done[s->slot] = it->seq;
        pthread_cond_broadcast(&d->done_cv);
        pthread_mutex_unlock(&d->mu);
        free(it);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

si_dev *si_stream_dev(cudaStream_t s)
{
    return s && s->magic == STREAM_MAGIC ? s->dev : NULL;
}

int standin_stream_device(cudaStream_t s)
{
    si_dev *d = si_stream_dev(s);
    return d ? d->index : -1;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    si_dev *d = si_device(t_cur);
    if (!d)
        return si_set_last(cudaErrorNoDevice);
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return si_set_last(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->dev = d;
    s->flags = flags;
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&d->mu);
    int slot = -1;
    for (int i = 0; i < SI_MAX_STREAMS && slot < 0; i++)
        if (!d->slot[i])
            slot = i;
    if (slot >= 0) {
        d->slot[slot] = s;
        s->slot = slot;
        s->clock[slot] = d->issued[slot];
    }
    pthread_mutex_unlock(&d->mu);
    if (slot < 0) { /* more live streams than the record's clocks hold */
        pthread_cond_destroy(&s->cv);
        free(s);
        return si_set_last(cudaErrorNotSupported);
    }
    uint64_t k = atomic_fetch_add(&G.streams_made, 1) + 1;
    s->rng = (G.seed + k * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(d->index * SI_MAX_STREAMS + slot) << 32);
    if (!s->rng)
        s->rng = 1;
    if (pthread_create(&s->thr, NULL, worker, s) != 0) {
        pthread_mutex_lock(&d->mu);
        d->slot[slot] = NULL;
        pthread_mutex_unlock(&d->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return si_set_last(cudaErrorMemoryAllocation);
    }
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    si_dev *d = si_stream_dev(s);
    if (!d)
        return si_set_last(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&d->mu);
    while (d->done[s->slot] < d->issued[s->slot])
        pthread_cond_wait(&d->done_cv, &d->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(s->thr, NULL);
    pthread_mutex_lock(&d->mu);
    d->slot[s->slot] = NULL;
    pthread_mutex_unlock(&d->mu);
    pthread_cond_destroy(&s->cv);
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    si_dev *d = si_stream_dev(s);
    if (!d)
        return si_set_last(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&d->mu);
    while (d->done[s->slot] < d->issued[s->slot])
        pthread_cond_wait(&d->done_cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    return si_set_last(si_sticky(d));
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    si_dev *d = si_stream_dev(s);
    if (!d)
        return si_set_last(cudaErrorInvalidResourceHandle);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    pthread_mutex_lock(&d->mu);
    bool idle = d->done[s->slot] >= d->issued[s->slot];
    pthread_mutex_unlock(&d->mu);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

void si_wait_seq(cudaStream_t s, uint64_t seq)
{
    si_dev *d = s->dev;
    pthread_mutex_lock(&d->mu);
    while (d->done[s->slot] < seq)
        pthread_cond_wait(&d->done_cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

/* The nth from now of a countdown: true for the one that hits 1. */
static bool count_down(uint64_t *n)
{
    pthread_mutex_lock(&G.ctl_mu);
    bool hit = *n == 1;
    if (*n)
        (*n)--;
    pthread_mutex_unlock(&G.ctl_mu);
    return hit;
}

/* Queue it on s (dev->mu held): its seq and clock. */
static void push_locked(struct CUstream_st *s, struct item *it)
{
    si_dev *d = s->dev;
    it->seq = ++d->issued[s->slot];
    it->issue_tick = tick();
    s->clock[s->slot] = it->seq;
    memcpy(it->after, s->clock, sizeof it->after);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv);
}

cudaError_t si_enqueue(cudaStream_t s, const char *what, si_item_fn fn, void *arg,
                       void (*fini)(void *), unsigned flags, uint64_t *seq)
{
    si_dev *d = si_stream_dev(s);
    cudaError_t e = !d ? cudaErrorInvalidResourceHandle : si_sticky(d);
    struct item *it = e == cudaSuccess ? calloc(1, sizeof *it) : NULL;
    if (e == cudaSuccess && !it)
        e = cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        if (fini)
            fini(arg);
        else
            free(arg);
        return e;
    }
    snprintf(it->what, sizeof it->what, "%s", what);
    it->fn = fn;
    it->arg = arg;
    it->fini = fini;
    it->flags = flags;
    if ((flags & SI_FAULT_KERNEL) && count_down(&G.kfault))
        it->fail = cudaErrorLaunchFailure;
    if ((flags & SI_FAULT_COPY) && count_down(&G.cfault))
        it->fail = cudaErrorIllegalAddress;
    pthread_mutex_lock(&d->mu);
    push_locked(s, it);
    if (seq)
        *seq = it->seq;
    pthread_mutex_unlock(&d->mu);
    return cudaSuccess;
}

bool si_sync_copy_faults(si_dev *d)
{
    if (!count_down(&G.cfault))
        return false;
    set_sticky(d, cudaErrorIllegalAddress);
    return true;
}

struct launch_arg {
    void (*fn)(void *arg);
    max_align_t data[]; /* the launch's argument bytes */
};

static cudaError_t run_launch(void *p)
{
    struct launch_arg *a = p;
    a->fn(a->data);
    return cudaSuccess;
}

cudaError_t standin_launch(cudaStream_t s, const char *what, void (*fn)(void *arg),
                           const void *arg, size_t bytes)
{
    struct launch_arg *a = malloc(sizeof *a + bytes);
    if (!a)
        return si_set_last(cudaErrorMemoryAllocation);
    a->fn = fn;
    if (bytes)
        memcpy(a->data, arg, bytes);
    char name[40];
    snprintf(name, sizeof name, "kernel %s", what);
    return si_set_last(si_enqueue(s, name, run_launch, a, NULL, SI_FAULT_KERNEL, NULL));
}

/* ------------------------------------------------------------ events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    if (!out || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)))
        return si_set_last(cudaErrorInvalidValue);
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev)
        return si_set_last(cudaErrorMemoryAllocation);
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    pthread_mutex_init(&ev->mu, NULL);
    *out = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out)
{
    return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev || ev->magic != EVENT_MAGIC)
        return si_set_last(cudaErrorInvalidResourceHandle);
    ev->magic = 0;
    pthread_mutex_destroy(&ev->mu);
    free(ev);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    si_dev *d = si_stream_dev(s);
    if (!ev || ev->magic != EVENT_MAGIC || !d)
        return si_set_last(cudaErrorInvalidResourceHandle);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    uint64_t clock[SI_MAX_STREAMS];
    pthread_mutex_lock(&d->mu);
    uint64_t seq = d->issued[s->slot];
    memcpy(clock, s->clock, sizeof clock);
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_lock(&ev->mu);
    ev->recorded = true;
    ev->dev = d;
    ev->slot = s->slot;
    ev->seq = seq;
    memcpy(ev->clock, clock, sizeof clock);
    pthread_mutex_unlock(&ev->mu);
    return cudaSuccess;
}

/* The event's capture; false when it was never recorded. */
static bool capture(cudaEvent_t ev, si_dev **d, int *slot, uint64_t *seq, uint64_t *clock)
{
    pthread_mutex_lock(&ev->mu);
    bool rec = ev->recorded;
    *d = ev->dev;
    *slot = ev->slot;
    *seq = ev->seq;
    if (clock)
        memcpy(clock, ev->clock, sizeof ev->clock);
    pthread_mutex_unlock(&ev->mu);
    return rec;
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    if (!ev || ev->magic != EVENT_MAGIC)
        return si_set_last(cudaErrorInvalidResourceHandle);
    si_dev *d;
    int slot;
    uint64_t seq;
    if (!capture(ev, &d, &slot, &seq, NULL))
        return cudaSuccess;
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    pthread_mutex_lock(&d->mu);
    bool done = d->done[slot] >= seq;
    pthread_mutex_unlock(&d->mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    if (!ev || ev->magic != EVENT_MAGIC)
        return si_set_last(cudaErrorInvalidResourceHandle);
    si_dev *d;
    int slot;
    uint64_t seq;
    if (!capture(ev, &d, &slot, &seq, NULL))
        return cudaSuccess;
    pthread_mutex_lock(&d->mu);
    while (d->done[slot] < seq)
        pthread_cond_wait(&d->done_cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    return si_set_last(si_sticky(d));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    si_dev *d = si_stream_dev(s);
    if (!ev || ev->magic != EVENT_MAGIC || !d)
        return si_set_last(cudaErrorInvalidResourceHandle);
    if (flags != 0)
        return si_set_last(cudaErrorInvalidValue);
    if (si_sticky(d))
        return si_set_last(si_sticky(d));
    si_dev *ed;
    int slot;
    uint64_t seq, clock[SI_MAX_STREAMS];
    if (!capture(ev, &ed, &slot, &seq, clock))
        return cudaSuccess; /* never recorded: nothing to wait for */
    struct item *it = calloc(1, sizeof *it);
    if (!it)
        return si_set_last(cudaErrorMemoryAllocation);
    snprintf(it->what, sizeof it->what, "wait");
    it->wdev = ed;
    it->wslot = slot;
    it->wseq = seq;
    pthread_mutex_lock(&d->mu);
    if (ed == d)
        for (int i = 0; i < SI_MAX_STREAMS; i++)
            if (clock[i] > s->clock[i])
                s->clock[i] = clock[i];
    push_locked(s, it);
    pthread_mutex_unlock(&d->mu);
    return cudaSuccess;
}

/* ------------------------------------------------------------ controls */

static void ctl_fail_kernel(uint64_t nth)
{
    pthread_mutex_lock(&G.ctl_mu);
    G.kfault = nth;
    pthread_mutex_unlock(&G.ctl_mu);
}

static void ctl_fail_copy(uint64_t nth)
{
    pthread_mutex_lock(&G.ctl_mu);
    G.cfault = nth;
    pthread_mutex_unlock(&G.ctl_mu);
}

static void ctl_stall_rank(int device)
{
    atomic_store(&G.stall, device);
}

static void ctl_reset(void)
{
    si_init();
    ctl_fail_kernel(0);
    ctl_fail_copy(0);
    atomic_store(&G.stall, -1);
    si_nccl_reset();
    for (int i = 0; i < G.n_dev; i++)
        atomic_store(&G.dev[i].sticky, 0);
}

static void ctl_record(size_t cap)
{
    pthread_mutex_lock(&G.rec_mu);
    free(G.rec);
    G.rec = cap ? calloc(cap, sizeof *G.rec) : NULL;
    G.cap_rec = G.rec ? cap : 0;
    G.n_rec = 0;
    pthread_mutex_unlock(&G.rec_mu);
}

static size_t ctl_recorded(const fso_standin_item **items)
{
    pthread_mutex_lock(&G.rec_mu);
    *items = G.rec;
    size_t n = G.n_rec;
    pthread_mutex_unlock(&G.rec_mu);
    return n;
}

static const fso_standin_api api = {
    .fail_kernel = ctl_fail_kernel,
    .fail_copy = ctl_fail_copy,
    .stall_rank = ctl_stall_rank,
    .reset = ctl_reset,
    .record = ctl_record,
    .recorded = ctl_recorded,
    .pageable_stalls = si_mem_pageable_stalls,
    .spanning_refused = si_mem_spanning_refused,
    .registrations = si_mem_registrations,
    .last_registration_policy = si_mem_last_policy,
};

const fso_standin_api *fso_standin_control(void);
const fso_standin_api *fso_standin_control(void)
{
    si_init();
    return &api;
}
