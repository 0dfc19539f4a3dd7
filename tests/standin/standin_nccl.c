/* standin_nccl.c — the NCCL entry points fsoff's CUDA module calls, on the
 * CPU: ncclCommInitAll makes one clique of n ranks (one device each);
 * ncclAllGather, ncclReduceScatter and ncclAllReduce (ncclSum; fp32, fp64,
 * and bf16 for the gather) queue one item on the rank's stream, and so
 * does each ncclGroupStart..ncclGroupEnd of ncclSend and ncclRecv (any
 * type; only inside a group), which meets the peers' groups the same way
 * and copies what each peer sends this rank into its receive buffers.
 *
 * When a rank's item runs it arrives at the clique's k-th collective (k
 * counted per rank) and blocks until every rank's k-th has arrived, as NCCL
 * does; each rank then reads its peers' inputs and writes its own output
 * (reductions through a temporary, in rank order, so in-place calls work),
 * and a second barrier keeps every input untouched until all ranks have
 * read it. ncclCommAbort aborts the whole clique: blocked items return with
 * their outputs as they were, every rank's async error becomes
 * ncclSystemError and later calls fail with ncclInvalidUsage. stall_rank(d)
 * makes device d's next collective never arrive (its item blocks until the
 * abort). Collectives still run on a device with a sticky CUDA error, so a
 * fault does not hang the peers.
 *
 * Lifetime: a communicator is freed when its handle is destroyed and its
 * queued items have run (each holds a reference); the clique with its last
 * communicator. ncclCommAbort frees the handle in NCCL; here it is kept,
 * aborted, until reset(), so that a later call on it is caught
 * (ncclInvalidUsage) instead of reading freed memory.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "standin_rt.h"

#define COMM_MAGIC 0x4e43434cu

enum coll_op { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_SEND_RECV };
static const char *const op_name[] = {"all_gather", "reduce_scatter", "all_reduce",
                                      "send/recv group"};

struct coll {
    struct ncclComm *comm;
    enum coll_op op;
    ncclDataType_t type;
    size_t count;          /* elements: per rank (gather, scatter) or in all (reduce) */
    const void *send;      /* worker views */
    void *recv;
    /* OP_SEND_RECV (one ncclGroupStart..End of sends and receives, type
     * `type`): to each peer, from each peer (worker views, NULL: none) */
    const void *to[SI_MAX_DEV];
    size_t to_count[SI_MAX_DEV];
    void *from[SI_MAX_DEV];
    size_t from_count[SI_MAX_DEV];
};

struct clique {
    pthread_mutex_t mu;    /* every field, and the comms' mutable fields */
    pthread_cond_t cv;     /* an arrival, a departure or the abort */
    int n, live;           /* ranks; communicators not yet freed */
    bool aborted;
    uint64_t arrived[SI_MAX_DEV];  /* per rank: the last collective it arrived at */
    uint64_t left[SI_MAX_DEV];     /* per rank: the last collective it finished reading */
    struct coll cur[SI_MAX_DEV];   /* each rank's arrived collective */
};

struct ncclComm {
    uint32_t magic;
    struct clique *cl;
    int rank;
    si_dev *dev;
    uint64_t ran;          /* cl->mu: collectives its items started */
    int refs;              /* cl->mu: the handle + queued items */
    bool gone;             /* cl->mu: destroyed or aborted handle */
    bool aborted;          /* cl->mu: ncclCommAbort was called on it */
    struct ncclComm *next_zombie; /* zombie_mu: aborted handles, freed by reset() */
    ncclResult_t async;    /* cl->mu */
    char why[160];         /* cl->mu: the async error's detail */
};

static __thread char t_why[256]; /* ncclGetLastError's text, per thread */

static pthread_mutex_t zombie_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *zombies;

/* Keep the text ncclGetLastError gives; returns r. */
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_why, sizeof t_why, fmt, ap);
    va_end(ap);
    return r;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat32:
        return 4;
    case ncclFloat64:
        return 8;
    case ncclBfloat16:
        return 2;
    default:
        return 0;
    }
}

/* Drop one reference (cl->mu held); true when the clique must be freed. */
static bool unref_locked(struct ncclComm *c)
{
    if (--c->refs > 0)
        return false;
    struct clique *cl = c->cl;
    c->magic = 0;
    free(c);
    return --cl->live == 0;
}

static void clique_free(struct clique *cl)
{
    pthread_cond_destroy(&cl->cv);
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}

static void unref(struct ncclComm *c)
{
    struct clique *cl = c->cl;
    pthread_mutex_lock(&cl->mu);
    bool last = unref_locked(c);
    pthread_mutex_unlock(&cl->mu);
    if (last)
        clique_free(cl);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    t_why[0] = 0;
    if (!comms || ndev < 1 || ndev > SI_MAX_DEV)
        return fail(ncclInvalidArgument, "ncclCommInitAll: %d ranks (1 to %d)", ndev, SI_MAX_DEV);
    int devs[SI_MAX_DEV];
    for (int r = 0; r < ndev; r++) {
        devs[r] = devlist ? devlist[r] : r;
        if (!si_device(devs[r]))
            return fail(ncclInvalidArgument, "ncclCommInitAll: no CUDA device %d", devs[r]);
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return fail(ncclInvalidUsage, "ncclCommInitAll: device %d given twice", devs[r]);
    }
    struct clique *cl = calloc(1, sizeof *cl);
    struct ncclComm *c[SI_MAX_DEV] = {0};
    bool ok = cl != NULL;
    for (int r = 0; r < ndev && ok; r++)
        ok = (c[r] = calloc(1, sizeof *c[r])) != NULL;
    if (!ok) {
        for (int r = 0; r < ndev; r++)
            free(c[r]);
        free(cl);
        return fail(ncclSystemError, "ncclCommInitAll: out of host memory");
    }
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
    cl->n = cl->live = ndev;
    for (int r = 0; r < ndev; r++) {
        *c[r] = (struct ncclComm){.magic = COMM_MAGIC, .cl = cl, .rank = r,
                                  .dev = si_device(devs[r]), .refs = 1};
        comms[r] = c[r];
    }
    return ncclSuccess;
}

static bool comm_ok(ncclComm_t c)
{
    return c && c->magic == COMM_MAGIC;
}

/* Abort the clique (cl->mu held): blocked items return. */
static void abort_locked(struct clique *cl)
{
    cl->aborted = true;
    pthread_cond_broadcast(&cl->cv);
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    if (!comm_ok(c))
        return fail(ncclInvalidArgument, "ncclCommAbort: not a communicator");
    struct clique *cl = c->cl;
    pthread_mutex_lock(&cl->mu);
    const bool was_gone = c->gone;
    abort_locked(cl);
    c->gone = c->aborted = true;
    pthread_mutex_unlock(&cl->mu);
    if (was_gone)
        return fail(ncclInvalidUsage, "ncclCommAbort: rank %d's communicator was already "
                    "aborted or destroyed", c->rank);
    pthread_mutex_lock(&zombie_mu);
    c->next_zombie = zombies;
    zombies = c;
    pthread_mutex_unlock(&zombie_mu);
    return ncclSuccess;
}

void si_nccl_reset(void)
{
    pthread_mutex_lock(&zombie_mu);
    struct ncclComm *z = zombies;
    zombies = NULL;
    pthread_mutex_unlock(&zombie_mu);
    while (z) {
        struct ncclComm *next = z->next_zombie;
        unref(z);
        z = next;
    }
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    if (!comm_ok(c))
        return fail(ncclInvalidArgument, "ncclCommDestroy: not a communicator");
    struct clique *cl = c->cl;
    pthread_mutex_lock(&cl->mu);
    bool was_gone = c->gone, last = false;
    if (!was_gone) {
        c->gone = true;
        last = unref_locked(c);
    }
    pthread_mutex_unlock(&cl->mu);
    if (last)
        clique_free(cl);
    return was_gone ? fail(ncclInvalidUsage, "ncclCommDestroy: rank %d's communicator was "
                           "already destroyed or aborted (ncclCommAbort frees it)", c->rank)
                    : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err)
{
    if (!comm_ok(c) || !err)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: bad argument");
    pthread_mutex_lock(&c->cl->mu);
    const bool aborted = c->aborted;
    *err = c->cl->aborted && c->async == ncclSuccess ? ncclSystemError : c->async;
    pthread_mutex_unlock(&c->cl->mu);
    if (aborted)
        return fail(ncclInvalidUsage, "ncclCommGetAsyncError: rank %d's communicator was "
                    "aborted (ncclCommAbort frees it)", c->rank);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c)
{
    if (!t_why[0] && comm_ok(c)) {
        pthread_mutex_lock(&c->cl->mu);
        if (c->cl->aborted)
            snprintf(t_why, sizeof t_why, "communicator aborted (ncclCommAbort)");
        else if (c->why[0])
            snprintf(t_why, sizeof t_why, "%s", c->why);
        pthread_mutex_unlock(&c->cl->mu);
    }
    return t_why;
}

/* ------------------------------------------------------------ running */

static bool same_call(const struct coll *a, const struct coll *b)
{
    return a->op == b->op && a->type == b->type && a->count == b->count;
}

/* Rank r's receives match what its peers send it, element for element. */
static bool pairs_match(const struct clique *cl, const struct coll *x, int r)
{
    for (int q = 0; q < cl->n; q++) {
        const struct coll *p = &cl->cur[q];
        if ((x->from[q] != NULL) != (p->to[r] != NULL) ||
            (x->from[q] && x->from_count[q] != p->to_count[r]) ||
            (x->to[q] != NULL) != (cl->cur[q].from[r] != NULL))
            return false;
    }
    return true;
}

/* Rank order sums of the peers' inputs (cl->cur) into out: count elements
 * of each input from element `from`. */
static void reduce(const struct clique *cl, ncclDataType_t type, size_t from, size_t count,
                   void *out)
{
    for (int q = 0; q < cl->n; q++) {
        const void *in = cl->cur[q].send;
        if (type == ncclFloat32) {
            const float *x = (const float *)in + from;
            float *y = out;
            for (size_t i = 0; i < count; i++)
                y[i] = q ? y[i] + x[i] : x[i];
        } else {
            const double *x = (const double *)in + from;
            double *y = out;
            for (size_t i = 0; i < count; i++)
                y[i] = q ? y[i] + x[i] : x[i];
        }
    }
}

/* Wait until every rank's counter reaches k, or the abort (cl->mu held):
 * false after the abort. */
static bool barrier_locked(struct clique *cl, const uint64_t *counter, uint64_t k)
{
    for (;;) {
        if (cl->aborted)
            return false;
        int q = 0;
        while (q < cl->n && counter[q] >= k)
            q++;
        if (q == cl->n)
            return true;
        pthread_cond_wait(&cl->cv, &cl->mu);
    }
}

static cudaError_t run_coll(void *p)
{
    struct coll *x = p;
    struct ncclComm *c = x->comm;
    struct clique *cl = c->cl;
    const int r = c->rank;
    const size_t es = type_size(x->type);
    const bool stalled = si_take_stall(c->dev->index);
    void *tmp = NULL;
    pthread_mutex_lock(&cl->mu);
    const uint64_t k = ++c->ran;
    if (stalled) { /* never arrives */
        while (!cl->aborted)
            pthread_cond_wait(&cl->cv, &cl->mu);
    }
    if (cl->aborted)
        goto out;
    cl->cur[r] = *x;
    cl->arrived[r] = k;
    pthread_cond_broadcast(&cl->cv);
    if (!barrier_locked(cl, cl->arrived, k))
        goto out;
    bool match = true;
    for (int q = 0; q < cl->n; q++)
        match = match && same_call(&cl->cur[q], x);
    match = match && (x->op != OP_SEND_RECV || pairs_match(cl, x, r));
    if (!match && c->async == ncclSuccess) {
        c->async = ncclInvalidUsage;
        snprintf(c->why, sizeof c->why, "rank %d's collective %llu (%s) differs from a peer's", r,
                 (unsigned long long)k, op_name[x->op]);
    }
    pthread_mutex_unlock(&cl->mu);
    /* the peers' inputs stay as they are until everyone has left */
    if (match && x->op == OP_SEND_RECV) {
        for (int q = 0; q < cl->n; q++)
            if (x->from[q])
                memmove(x->from[q], cl->cur[q].to[r], x->from_count[q] * es);
    } else if (match && x->op == OP_ALL_GATHER) {
        const size_t bytes = x->count * es;
        for (int q = 0; q < cl->n; q++) {
            char *dst = (char *)x->recv + (size_t)q * bytes;
            if (dst != cl->cur[q].send)
                memmove(dst, cl->cur[q].send, bytes);
        }
    } else if (match) {
        tmp = malloc(x->count * es + 1);
        if (tmp)
            reduce(cl, x->type, x->op == OP_REDUCE_SCATTER ? (size_t)r * x->count : 0, x->count,
                   tmp);
    }
    pthread_mutex_lock(&cl->mu);
    if (match && x->op != OP_ALL_GATHER && x->op != OP_SEND_RECV && !tmp &&
        c->async == ncclSuccess) {
        c->async = ncclSystemError;
        snprintf(c->why, sizeof c->why, "out of host memory for a reduction");
    }
    cl->left[r] = k;
    pthread_cond_broadcast(&cl->cv);
    if (barrier_locked(cl, cl->left, k) && tmp)
        memcpy(x->recv, tmp, x->count * es);
out:
    pthread_mutex_unlock(&cl->mu);
    free(tmp);
    return cudaSuccess;
}

static void fini_coll(void *p)
{
    struct coll *x = p;
    unref(x->comm);
    free(x);
}

static ncclResult_t submit(struct coll *x, cudaStream_t s);

static ncclResult_t issue(enum coll_op op, const void *send, void *recv, size_t count,
                          ncclDataType_t type, ncclRedOp_t red, ncclComm_t c, cudaStream_t s)
{
    const char *name = op_name[op];
    t_why[0] = 0;
    if (!comm_ok(c))
        return fail(ncclInvalidArgument, "%s: not a communicator", name);
    const size_t es = type_size(type);
    if (es == 0 || (op != OP_ALL_GATHER && type == ncclBfloat16))
        return fail(ncclInvalidArgument, "%s: data type %d is not supported by the stand-in",
                    name, (int)type);
    if (op != OP_ALL_GATHER && red != ncclSum)
        return fail(ncclInvalidArgument, "%s: reduction %d is not supported by the stand-in",
                    name, (int)red);
    si_dev *sd = si_stream_dev(s);
    if (sd != c->dev)
        return fail(ncclInvalidArgument, "%s: the stream is not one of rank %d's device", name,
                    c->rank);
    struct clique *cl = c->cl;
    const size_t n = (size_t)cl->n;
    const size_t send_bytes = count * es * (op == OP_REDUCE_SCATTER ? n : 1);
    const size_t recv_bytes = count * es * (op == OP_ALL_GATHER ? n : 1);
    if (count && (si_classify(send, send_bytes, NULL) != SI_DEVICE ||
                  si_classify(recv, recv_bytes, NULL) != SI_DEVICE))
        return fail(ncclInvalidArgument, "%s: a buffer is not in one device allocation (rank %d)",
                    name, c->rank);
    struct coll *x = malloc(sizeof *x);
    if (!x)
        return fail(ncclSystemError, "%s: out of host memory", name);
    *x = (struct coll){.comm = c, .op = op, .type = type, .count = count, .send = si_view(send),
                       .recv = si_view(recv)};
    return submit(x, s);
}

/* Queue collective x (malloc'ed; taken) on s. */
static ncclResult_t submit(struct coll *x, cudaStream_t s)
{
    ncclComm_t c = x->comm;
    struct clique *cl = c->cl;
    const char *name = op_name[x->op];
    pthread_mutex_lock(&cl->mu);
    bool bad = c->gone || cl->aborted;
    if (!bad)
        c->refs++;
    pthread_mutex_unlock(&cl->mu);
    if (bad) {
        free(x);
        return fail(ncclInvalidUsage, "%s: the communicator was aborted or destroyed (rank %d)",
                    name, c->rank);
    }
    cudaError_t e = si_enqueue(s, name, run_coll, x, fini_coll, SI_ALWAYS_RUN, NULL);
    if (e != cudaSuccess) { /* the device's sticky error, or a bad stream */
        snprintf(t_why, sizeof t_why, "%s: CUDA: %s", name, cudaGetErrorString(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t c, cudaStream_t s)
{
    return issue(OP_ALL_GATHER, send, recv, count, type, ncclSum, c, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    return issue(OP_REDUCE_SCATTER, send, recv, count, type, op, c, s);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    return issue(OP_ALL_REDUCE, send, recv, count, type, op, c, s);
}

/* ------------------------------------------------------------ send/recv */

/* The calling thread's open group: ncclSend and ncclRecv only inside one
 * (the stand-in's limit), all on one communicator, stream and type; its
 * ncclGroupEnd queues them as one item that meets the peers' groups, so
 * every receive is matched with the peer's send to this rank. */
static __thread struct group {
    int depth;
    struct coll *x;
    cudaStream_t s;
    ncclResult_t err;
} t_group;

/* nccl.h declares these with no parameter list */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void)
{
    t_group.depth++;
    return ncclSuccess;
}

static ncclResult_t group_add(bool to, const void *buf, size_t count, ncclDataType_t type,
                              int peer, ncclComm_t c, cudaStream_t s)
{
    const char *name = to ? "ncclSend" : "ncclRecv";
    t_why[0] = 0;
    if (t_group.depth == 0)
        return fail(ncclInvalidUsage, "%s: outside ncclGroupStart/End (the stand-in's limit)",
                    name);
    if (!comm_ok(c))
        return t_group.err = fail(ncclInvalidArgument, "%s: not a communicator", name);
    if (type_size(type) == 0 || peer < 0 || peer >= c->cl->n)
        return t_group.err = fail(ncclInvalidArgument, "%s: type %d or peer %d", name,
                                  (int)type, peer);
    if (si_stream_dev(s) != c->dev)
        return t_group.err = fail(ncclInvalidArgument,
                                  "%s: the stream is not one of rank %d's device", name, c->rank);
    if (count && si_classify(buf, count * type_size(type), NULL) != SI_DEVICE)
        return t_group.err = fail(ncclInvalidArgument,
                                  "%s: the buffer is not in one device allocation (rank %d)",
                                  name, c->rank);
    if (!t_group.x) {
        t_group.x = calloc(1, sizeof *t_group.x);
        if (!t_group.x)
            return t_group.err = fail(ncclSystemError, "%s: out of host memory", name);
        *t_group.x = (struct coll){.comm = c, .op = OP_SEND_RECV, .type = type};
        t_group.s = s;
    }
    struct coll *x = t_group.x;
    if (x->comm != c || x->type != type || t_group.s != s ||
        (to ? x->to[peer] != NULL : x->from[peer] != NULL))
        return t_group.err = fail(ncclInvalidUsage,
                                  "%s: one communicator, stream and type per group and one "
                                  "send and receive per peer (the stand-in's limit)", name);
    /* count 0 still pairs with the peer's, through a non-NULL view */
    if (to) {
        x->to[peer] = count ? si_view(buf) : (const void *)x;
        x->to_count[peer] = count;
    } else {
        x->from[peer] = count ? si_view(buf) : (void *)x;
        x->from_count[peer] = count;
    }
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t c, cudaStream_t s)
{
    return group_add(true, send, count, type, peer, c, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                      cudaStream_t s)
{
    return group_add(false, recv, count, type, peer, c, s);
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_group.depth > 0)
        return ncclSuccess;
    struct coll *x = t_group.x;
    ncclResult_t err = t_group.err;
    cudaStream_t s = t_group.s;
    t_group = (struct group){0};
    if (err != ncclSuccess) {
        free(x);
        return err;
    }
    return x ? submit(x, s) : ncclSuccess;
}
