/* standin_nccl.c — the NCCL entry points fsoff's CUDA module calls, on the
 * CPU: ncclCommInitAll makes one clique of n ranks (one device each), and
 * so do the n threads of this process that call ncclCommInitRankConfig (or
 * ncclCommInitRank) with the same ncclGetUniqueId bytes, each for its rank
 * on its current device: they meet in the open cliques' list by those
 * bytes. A non-blocking config (blocking = 0) returns ncclInProgress at
 * once and ncclCommGetAsyncError reports ncclInProgress until every rank
 * has joined and for INIT_POLLS looks after that (so a caller's poll loop
 * runs); ncclCommFinalize on such a communicator likewise for
 * FINALIZE_POLLS. Its collectives return ncclSuccess directly;
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
#include <unistd.h>

#include <nccl.h>

#include "standin_rt.h"

#define COMM_MAGIC 0x4e43434cu
#define ID_MAGIC "fsoff stand-in NCCL id"
#define INIT_POLLS 3      /* ncclInProgress looks after a non-blocking init completed */
#define FINALIZE_POLLS 2  /* and after a non-blocking ncclCommFinalize */

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
    pthread_cond_t cv;     /* an arrival, a departure, a rank joining or the abort */
    int n, live;           /* ranks; communicators not yet freed */
    bool aborted;
    /* ncclCommInitRankConfig's rendezvous: written with open_mu and mu
     * both held (in that order), read under either */
    bool open;             /* in the open list: ranks may still join */
    int joined;            /* ranks joined; n once complete */
    struct ncclComm *member[SI_MAX_DEV]; /* joined ranks' communicators */
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
    struct clique *next_open; /* open_mu */
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
    bool blocking;         /* its config's blocking (ncclCommInitAll's: 1) */
    int busy_polls;        /* cl->mu: ncclInProgress looks left once its work is done */
};

static __thread char t_why[256]; /* ncclGetLastError's text, per thread */

static pthread_mutex_t zombie_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *zombies;
/* The cliques ranks may still join by id; taken before a clique's mu when
 * both are held (the only nesting in the stand-in). */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct clique *open_cliques;
static _Atomic uint64_t ids_made;

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

static bool comm_ok(ncclComm_t c)
{
    return c && c->magic == COMM_MAGIC;
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

/* Take cl out of the open list (open_mu held). */
static void unlink_open_locked(struct clique *cl)
{
    for (struct clique **p = &open_cliques; *p; p = &(*p)->next_open)
        if (*p == cl) {
            *p = cl->next_open;
            break;
        }
    cl->next_open = NULL;
}

/* Nobody may join cl any more (cl->mu and open_mu held): its ranks are
 * complete, or one of them was aborted or destroyed first. A clique is
 * closed before it can be freed, so the open list holds only live ones. */
static void close_locked(struct clique *cl)
{
    if (cl->open) {
        cl->open = false;
        unlink_open_locked(cl);
    }
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
    cl->n = cl->live = cl->joined = ndev;
    for (int r = 0; r < ndev; r++) {
        *c[r] = (struct ncclComm){.magic = COMM_MAGIC, .cl = cl, .rank = r,
                                  .dev = si_device(devs[r]), .refs = 1, .blocking = true};
        cl->member[r] = c[r];
        comms[r] = c[r];
    }
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    t_why[0] = 0;
    if (!id)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
    /* unique within the process, which is where the stand-in's ranks live */
    memset(id, 0, sizeof *id);
    const uint64_t k = atomic_fetch_add(&ids_made, 1) + 1;
    const int pid = (int)getpid();
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    memcpy(id->internal + sizeof ID_MAGIC, &k, sizeof k);
    memcpy(id->internal + sizeof ID_MAGIC + sizeof k, &pid, sizeof pid);
    return ncclSuccess;
}

/* The clique of id for nranks, found in the open list or made and put
 * there (open_mu held); NULL: out of memory. */
static struct clique *open_clique_locked(const ncclUniqueId *id, int nranks)
{
    for (struct clique *cl = open_cliques; cl; cl = cl->next_open)
        if (memcmp(cl->id, id->internal, sizeof cl->id) == 0)
            return cl;
    struct clique *cl = calloc(1, sizeof *cl);
    if (!cl)
        return NULL;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
    cl->n = nranks;
    cl->open = true;
    memcpy(cl->id, id->internal, sizeof cl->id);
    cl->next_open = open_cliques;
    open_cliques = cl;
    return cl;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    t_why[0] = 0;
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > SI_MAX_DEV || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d (1 to %d "
                    "ranks)", rank, nranks, SI_MAX_DEV);
    if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRankConfig: the id is not one "
                    "ncclGetUniqueId made");
    si_dev *dev = si_device(si_current());
    if (!dev)
        return fail(ncclInvalidUsage, "ncclCommInitRankConfig: no current CUDA device");
    /* NCCL_CONFIG_UNDEF_INT (the initializer's) means the default, blocking */
    const bool blocking = !config || config->blocking != 0;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "ncclCommInitRankConfig: out of host memory");
    *c = (struct ncclComm){.magic = COMM_MAGIC, .rank = rank, .dev = dev, .refs = 1,
                           .blocking = blocking, .busy_polls = blocking ? 0 : INIT_POLLS};
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&open_mu);
    struct clique *cl = open_clique_locked(&id, nranks);
    if (!cl) {
        r = fail(ncclSystemError, "ncclCommInitRankConfig: out of host memory");
    } else {
        pthread_mutex_lock(&cl->mu);
        if (cl->n != nranks)
            r = fail(ncclInvalidUsage, "ncclCommInitRankConfig: rank %d says %d ranks, a "
                     "peer with the same id %d", rank, nranks, cl->n);
        else if (cl->member[rank])
            r = fail(ncclInvalidUsage, "ncclCommInitRankConfig: rank %d joined twice", rank);
        for (int q = 0; q < cl->n && r == ncclSuccess; q++)
            if (cl->member[q] && cl->member[q]->dev == dev)
                r = fail(ncclInvalidUsage, "ncclCommInitRankConfig: ranks %d and %d are both "
                         "CUDA device %d (NCCL: one device per rank)", q, rank, dev->index);
        if (r == ncclSuccess) {
            c->cl = cl;
            cl->member[rank] = c;
            cl->live++;
            if (++cl->joined == cl->n)
                close_locked(cl);
            pthread_cond_broadcast(&cl->cv);
        }
        const bool unused = cl->live == 0;
        pthread_mutex_unlock(&cl->mu);
        if (unused) { /* made for a call that failed */
            close_locked(cl);
            pthread_cond_destroy(&cl->cv);
            pthread_mutex_destroy(&cl->mu);
            free(cl);
        }
    }
    pthread_mutex_unlock(&open_mu);
    if (r != ncclSuccess) {
        free(c);
        return r;
    }
    *comm = c;
    if (!blocking)
        return ncclInProgress;
    pthread_mutex_lock(&cl->mu); /* NCCL's blocking init returns once every rank joined */
    while (cl->joined < cl->n && !cl->aborted)
        pthread_cond_wait(&cl->cv, &cl->mu);
    pthread_mutex_unlock(&cl->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    t_why[0] = 0;
    if (!comm_ok(c))
        return fail(ncclInvalidArgument, "ncclCommFinalize: not a communicator");
    pthread_mutex_lock(&c->cl->mu);
    const bool gone = c->gone;
    if (!gone && !c->blocking)
        c->busy_polls = FINALIZE_POLLS;
    pthread_mutex_unlock(&c->cl->mu);
    if (gone)
        return fail(ncclInvalidUsage, "ncclCommFinalize: rank %d's communicator was aborted or "
                    "destroyed", c->rank);
    return c->blocking ? ncclSuccess : ncclInProgress;
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
    pthread_mutex_lock(&open_mu); /* a rank joining later makes a clique of its own */
    pthread_mutex_lock(&cl->mu);
    close_locked(cl);
    pthread_mutex_unlock(&open_mu);
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
    pthread_mutex_lock(&open_mu); /* a rank joining later makes a clique of its own */
    pthread_mutex_lock(&cl->mu);
    close_locked(cl);
    pthread_mutex_unlock(&open_mu);
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
    struct clique *cl = c->cl;
    pthread_mutex_lock(&cl->mu);
    const bool aborted = c->aborted;
    *err = cl->aborted && c->async == ncclSuccess ? ncclSystemError : c->async;
    if (*err == ncclSuccess && cl->joined < cl->n)
        *err = ncclInProgress; /* a non-blocking init waiting for its peers */
    else if (*err == ncclSuccess && c->busy_polls > 0) {
        c->busy_polls--;
        *err = ncclInProgress;
    }
    pthread_mutex_unlock(&cl->mu);
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
    bool bad = c->gone || cl->aborted, early = cl->joined < cl->n;
    if (!bad && !early)
        c->refs++;
    pthread_mutex_unlock(&cl->mu);
    if (bad || early) {
        free(x);
        return bad ? fail(ncclInvalidUsage, "%s: the communicator was aborted or destroyed "
                          "(rank %d)", name, c->rank)
                   : fail(ncclInvalidUsage, "%s: rank %d's communicator is still initializing "
                          "(poll ncclCommGetAsyncError until ncclSuccess)", name, c->rank);
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
