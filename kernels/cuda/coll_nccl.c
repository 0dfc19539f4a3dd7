/* coll_nccl.c — the collective interface (coll.h) over NCCL, for the CUDA
 * backends of one process: one communicator per device from
 * ncclCommInitAll, each rank's collectives issued by that rank's thread on
 * its backend's collective stream (contract: cuda_backend.h).
 *
 * Lifetime: the collectives use the backends and must be destroyed before
 * them (coll.h). Destroying needs only what the collectives own (the
 * devices' ordinals, saved at creation, and their own buffers), never a
 * backend, so a wrong order elsewhere cannot turn into a read of freed
 * memory here.
 *
 * A fault on one rank never becomes a hang. Every rank keeps joining the
 * collectives after a fault (so the others are not left waiting), but a
 * rank whose context died cannot queue its part, and its peers' NCCL
 * kernels would spin for ever, with their host threads in a stream or
 * event wait. With two ranks or more a watchdog thread polls every
 * WATCH_POLL_MS: each rank's kept failure (fso_cuda_status), its
 * communicator's asynchronous error (ncclCommGetAsyncError), and an event
 * recorded after each of its collectives (cudaEventQuery). On the first
 * failure, or when a rank's collectives have made no progress for
 * FSO_NCCL_TIMEOUT_S seconds (default DEFAULT_TIMEOUT_S; 0: never), it
 * records on every rank's backend an error naming the rank and the
 * collective, then aborts every communicator (ncclCommAbort), so the
 * kernels return, the host waits end and the run stops with that error.
 * Later collectives queue nothing and return the backend's error.
 *
 * Locks: x->mu guards the watch fields marked (mu) and is never held
 * together with a backend's ctx->mu (fso_cuda_fail, fso_cuda_status and
 * fso_cuda_check are called with x->mu released).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "cuda_impl.h"
#include "nccl_rows.h"
#include "util.h"

#define MAX_WORLD FSO_MAX_DEVICES
#define MAX_F64 64
#define WATCH_POLL_MS 50
#define WATCH_RING 64           /* names of a rank's latest collectives */
#define DEFAULT_TIMEOUT_S 300.0
#define ABORT_GRACE_MS 1000     /* for a rank thread inside an NCCL call to leave it */

/* What the watchdog knows of one rank's collectives. */
struct nccl_watch {
    cudaEvent_t done_ev;            /* recorded after each collective on the rank's stream */
    uint64_t entered;               /* (mu) collectives begun */
    uint64_t recorded;              /* (mu) entered when done_ev was last recorded */
    int in_call;                    /* (mu) the rank's thread is inside an NCCL call */
    const char *what[WATCH_RING];   /* (mu) collective n's name at n % WATCH_RING */
    uint64_t entered_before;        /* watchdog only: entered at the previous poll */
    double progress_ms;             /* watchdog only: when the rank last issued a collective
                                       or had none outstanding */
};

struct nccl_ctx {
    pthread_mutex_t mu;           /* the (mu) fields, aborted, stop */
    pthread_cond_t cv;            /* in_call dropped, or stop */
    bool aborted;                 /* (mu) the communicators are aborted: issue nothing */
    bool stop;                    /* (mu) nc_destroy asks the watchdog to return */
    bool watching;                /* the watchdog thread runs; set before it starts */
    pthread_t watchdog;
    double timeout_ms;            /* no progress for this long is a stall; 0: never */
    struct nccl_watch w[MAX_WORLD];
    ncclComm_t comm[MAX_WORLD];
    fso_backend *be[MAX_WORLD];   /* for issuing work only; not touched by nc_destroy */
    int ordinal[MAX_WORLD];       /* each rank's CUDA device, saved at creation */
    double *dev_f64[MAX_WORLD];   /* per rank: MAX_F64 in, world * MAX_F64 gathered */
    double *host_f64[MAX_WORLD];  /* pinned, the same layout */
    float *dev_one[MAX_WORLD];    /* barrier */
    uint16_t *dev_rows[MAX_WORLD]; /* per rank: reduce_scatter_bf16's world pieces received,
                                     rows_elems[rank] elements, grown to the largest call */
    size_t rows_elems[MAX_WORLD];
};


int fso_nccl_errno(int result)
{
    switch ((ncclResult_t)result) {
    case ncclSuccess:
        return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return -EINVAL;
    case ncclInProgress:
        return -EINPROGRESS;
    default:
        return -EIO;
    }
}

ncclResult_t fso_nccl_exchange_rows(const uint16_t *send, uint16_t *rows, size_t count, int world,
                                    ncclComm_t comm, cudaStream_t s)
{
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < world && r == ncclSuccess; k++) {
        r = ncclSend(send + (size_t)k * count, count, ncclBfloat16, k, comm, s);
        if (r == ncclSuccess)
            r = ncclRecv(rows + (size_t)k * count, count, ncclBfloat16, k, comm, s);
    }
    ncclResult_t r_end = ncclGroupEnd();
    return r == ncclSuccess ? r_end : r;
}

/* Record an NCCL failure in the rank's backend (its next sync reports it). */
static int nccl_fail(struct nccl_ctx *x, int rank, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return 0;
    int rc = fso_nccl_errno(r);
    char last[256] = "";
    pthread_mutex_lock(&x->mu); /* an aborted communicator is freed */
    if (x->comm[rank] && !x->aborted)
        snprintf(last, sizeof last, "%s", ncclGetLastError(x->comm[rank]));
    pthread_mutex_unlock(&x->mu);
    fso_cuda_fail(x->be[rank], rc, "NCCL %s on rank %d (CUDA device %d): %s%s%s", what, rank,
                  x->ordinal[rank], ncclGetErrorString(r), *last ? ": " : "", last);
    return rc;
}

static int rank_status(struct nccl_ctx *x, int rank)
{
    return fso_cuda_status(x->be[rank]);
}

/* Before rank's NCCL call `what`: false once the watchdog has aborted the
 * communicators (nothing may be issued; the backend holds the error). */
static bool coll_enter(struct nccl_ctx *x, int rank, const char *what)
{
    pthread_mutex_lock(&x->mu);
    bool ok = !x->aborted;
    if (ok) {
        struct nccl_watch *w = &x->w[rank];
        w->entered++;
        w->what[w->entered % WATCH_RING] = what;
        w->in_call++;
    }
    pthread_mutex_unlock(&x->mu);
    return ok;
}

/* After it: the rank's done event follows what was queued on s. */
static void coll_leave(struct nccl_ctx *x, int rank, cudaStream_t s)
{
    struct nccl_watch *w = &x->w[rank];
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&x->mu);
    if (w->done_ev) {
        e = cudaEventRecord(w->done_ev, s);
        if (e == cudaSuccess)
            w->recorded = w->entered;
    }
    if (--w->in_call == 0)
        pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    fso_cuda_check(x->be[rank], e, "NCCL watchdog: cudaEventRecord after a collective");
}

static int nc_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                         fso_dtype dt, uint64_t after)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    const ncclDataType_t type = dt == FSO_DT_BF16 ? ncclBfloat16 : ncclFloat;
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin_after(be, FSO_CS_COLL, after);
    if (!coll_enter(x, rank, "all_gather"))
        return rank_status(x, rank);
    ncclResult_t r = ncclAllGather(send, recv, count, type, x->comm[rank], s);
    coll_leave(x, rank, s);
    fso_cuda_end_gather(be, "all_gather"); /* compute reads what it gathers */
    int rc = nccl_fail(x, rank, r, "all_gather");
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc ? rc : rank_status(x, rank);
}

static int nc_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    if (!coll_enter(x, rank, "reduce_scatter"))
        return rank_status(x, rank);
    ncclResult_t r = ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, x->comm[rank], s);
    coll_leave(x, rank, s);
    fso_cuda_end(be, FSO_CS_COLL, "reduce_scatter");
    int rc = nccl_fail(x, rank, r, "reduce_scatter");
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc ? rc : rank_status(x, rank);
}

/* Every rank's bf16 piece for this rank (grouped sends and receives, an
 * all-to-all) into the rank's row buffer, then one kernel on the same
 * stream adds the world rows in rank order in fp32 into recv
 * (fso_cuda_sum_bf16_rows): the threads implementation's bits, where
 * ncclReduceScatter would sum in bf16 in its own order. The row buffer is
 * the collectives' own (world * count bf16, freed with them), grown by the
 * first call that needs more; a rank that cannot grow it fails on its
 * backend, and the watchdog ends its peers' waits. */
static int nc_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                  size_t count)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    const int W = c->world;
    const size_t need = (size_t)W * count;
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    if (need > x->rows_elems[rank]) {
        /* the old rows may still be read by this stream's last call */
        cudaError_t e = cudaStreamSynchronize(s);
        if (e == cudaSuccess) {
            cudaFree(x->dev_rows[rank]);
            x->dev_rows[rank] = NULL;
            x->rows_elems[rank] = 0;
            e = cudaMalloc((void **)&x->dev_rows[rank], sizeof(uint16_t) * need);
        }
        if (e != cudaSuccess) {
            x->dev_rows[rank] = NULL;
            fso_cuda_check(be, e, "reduce_scatter_bf16: the receive rows");
            fso_cuda_end(be, FSO_CS_COLL, "reduce_scatter_bf16");
            return rank_status(x, rank);
        }
        x->rows_elems[rank] = need;
    }
    if (!coll_enter(x, rank, "reduce_scatter_bf16"))
        return rank_status(x, rank);
    uint16_t *rows = x->dev_rows[rank];
    ncclResult_t r = fso_nccl_exchange_rows(send, rows, count, W, x->comm[rank], s);
    if (r == ncclSuccess)
        fso_cuda_sum_bf16_rows(s, recv, rows, W, count);
    coll_leave(x, rank, s);
    fso_cuda_end(be, FSO_CS_COLL, "reduce_scatter_bf16");
    int rc = nccl_fail(x, rank, r, "reduce_scatter_bf16");
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc ? rc : rank_status(x, rank);
}

/* Gather every rank's values and add them in rank order on the host: the
 * same bits on every rank and every run, as the thread implementation. */
static int nc_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    if (count > MAX_F64)
        return -EINVAL;
    double t0 = fso_now_ms();
    double *h = x->host_f64[rank], *d = x->dev_f64[rank];
    if (!coll_enter(x, rank, "all_reduce_f64"))
        return rank_status(x, rank);
    memcpy(h, buf, sizeof(double) * count);
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    fso_cuda_check(be, cudaMemcpyAsync(d, h, sizeof(double) * MAX_F64, cudaMemcpyHostToDevice, s),
                   "all_reduce_f64: copy in");
    ncclResult_t r = ncclAllGather(d, d + MAX_F64, MAX_F64, ncclDouble, x->comm[rank], s);
    coll_leave(x, rank, s);
    fso_cuda_check(be, cudaMemcpyAsync(h + MAX_F64, d + MAX_F64,
                                       sizeof(double) * MAX_F64 * (size_t)c->world,
                                       cudaMemcpyDeviceToHost, s),
                   "all_reduce_f64: copy out");
    fso_cuda_end(be, FSO_CS_COLL, "all_reduce_f64");
    int rc = nccl_fail(x, rank, r, "all_reduce_f64");
    fso_cuda_check(be, cudaStreamSynchronize(s), "all_reduce_f64");
    if (rc == 0) /* the wait failed, or the watchdog ended it */
        rc = rank_status(x, rank);
    if (rc == 0)
        for (size_t i = 0; i < count; i++) {
            double sum = 0;
            for (int k = 0; k < c->world; k++)
                sum += h[MAX_F64 + (size_t)k * MAX_F64 + i];
            buf[i] = sum;
        }
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

/* A one-float all-reduce after the rank's queued work, then wait for it:
 * every rank has reached the barrier when it completes. */
static int nc_barrier(fso_coll *c, int rank)
{
    struct nccl_ctx *x = c->ctx;
    fso_backend *be = x->be[rank];
    double t0 = fso_now_ms();
    cudaStream_t s = fso_cuda_begin(be, FSO_CS_COLL);
    if (!coll_enter(x, rank, "barrier"))
        return rank_status(x, rank);
    ncclResult_t r = ncclAllReduce(x->dev_one[rank], x->dev_one[rank], 1, ncclFloat, ncclSum,
                                   x->comm[rank], s);
    coll_leave(x, rank, s);
    fso_cuda_end(be, FSO_CS_COLL, "barrier");
    int rc = nccl_fail(x, rank, r, "barrier");
    fso_cuda_check(be, cudaStreamSynchronize(s), "barrier");
    if (rc == 0)
        rc = rank_status(x, rank);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

/* ------------------------------------------------------------ watchdog */

/* One rank as the watchdog saw it in one poll. */
struct watch_seen {
    uint64_t entered;     /* collectives issued (begun) */
    bool pending;         /* some of them have not completed */
};

/* Rank r's failure, if any, into why: its kept error, its communicator's
 * asynchronous error, or its done event's. Returns 0 or the negative errno. */
static int watch_failure(struct nccl_ctx *x, int r, struct watch_seen *seen, char *why,
                         size_t whylen)
{
    fso_backend *be = x->be[r];
    int rc = fso_cuda_status(be);
    if (rc == 0) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(x->comm[r], &ar);
        if (q == ncclSuccess && ar != ncclSuccess && ar != ncclInProgress)
            rc = nccl_fail(x, r, ar, "asynchronous error");
    }
    if (rc == 0) {
        struct nccl_watch *w = &x->w[r];
        cudaSetDevice(x->ordinal[r]);
        pthread_mutex_lock(&x->mu);
        cudaError_t e = w->done_ev ? cudaEventQuery(w->done_ev) : cudaSuccess;
        seen->entered = w->entered;
        seen->pending = e != cudaSuccess || w->in_call > 0 || w->recorded < w->entered;
        pthread_mutex_unlock(&x->mu);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            rc = fso_cuda_check(be, e, "a collective, as the NCCL watchdog saw it (cudaEventQuery)");
    }
    if (rc < 0) {
        fso_cuda_ctx *ctx = FSO_CUDA_CTX(be);
        pthread_mutex_lock(&ctx->mu);
        snprintf(why, whylen, "%s", be->err);
        pthread_mutex_unlock(&ctx->mu);
    }
    return rc;
}

/* Every rank's backend gets the error, then every communicator is aborted,
 * which ends the kernels the host waits on. */
static void watch_abort(struct nccl_ctx *x, int world, int rc, const char *msg)
{
    for (int r = 0; r < world; r++)
        fso_cuda_fail(x->be[r], rc, "%s", msg); /* the run's one error line says it */
    pthread_mutex_lock(&x->mu);
    x->aborted = true;
    /* a rank's thread inside an NCCL call leaves it before its communicator
     * is freed; one blocked there leaves only through the abort itself */
    double until = fso_now_ms() + ABORT_GRACE_MS;
    for (;;) {
        int inside = 0;
        for (int r = 0; r < world; r++)
            inside += x->w[r].in_call;
        double now = fso_now_ms();
        if (inside == 0 || now >= until)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + 10 * 1000000L;
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&x->cv, &x->mu, &ts);
    }
    pthread_mutex_unlock(&x->mu);
    for (int r = 0; r < world; r++) {
        cudaSetDevice(x->ordinal[r]);
        ncclCommAbort(x->comm[r]);
    }
    cudaGetLastError();
}

/* One poll: 0, or the communicators were aborted (the watchdog's work is done). */
static int watch_poll(struct nccl_ctx *x, int world)
{
    struct watch_seen seen[MAX_WORLD] = {{0}};
    char why[sizeof ((fso_backend *)0)->err], msg[sizeof why + 512];
    double now = fso_now_ms();
    for (int r = 0; r < world; r++) {
        int rc = watch_failure(x, r, &seen[r], why, sizeof why);
        if (rc < 0) {
            snprintf(msg, sizeof msg, "NCCL: rank %d (CUDA device %d) failed: %s; the "
                     "collectives every rank joins cannot complete, so the communicators of all "
                     "%d ranks were aborted", r, x->ordinal[r], why, world);
            watch_abort(x, world, rc, msg);
            return rc;
        }
        /* one event per rank, the latest collective's: progress is a new
         * collective issued, or all of them done */
        struct nccl_watch *w = &x->w[r];
        if (!seen[r].pending || seen[r].entered != w->entered_before)
            w->progress_ms = now;
        w->entered_before = seen[r].entered;
    }
    if (x->timeout_ms <= 0)
        return 0;
    int r = 0; /* the first rank whose collectives made no progress for the timeout */
    while (r < world && now - x->w[r].progress_ms < x->timeout_ms)
        r++;
    if (r == world)
        return 0;
    /* rank r waits for collective m, its latest; a rank that has not
     * issued all of them is the one that stalled */
    uint64_t m = seen[r].entered;
    int q = -1;
    for (int k = 0; k < world; k++)
        if (seen[k].entered < m && (q < 0 || seen[k].entered < seen[q].entered))
            q = k;
    uint64_t n = q >= 0 ? seen[q].entered + 1 : m; /* the collective named */
    pthread_mutex_lock(&x->mu);
    const char *what = m - n < WATCH_RING ? x->w[r].what[n % WATCH_RING] : NULL;
    pthread_mutex_unlock(&x->mu);
    char who[256];
    if (q >= 0) {
        snprintf(who, sizeof who, "rank %d (CUDA device %d) has not issued it (it issued %llu "
                 "collectives, rank %d %llu): rank %d stalled", q, x->ordinal[q],
                 (unsigned long long)seen[q].entered, r, (unsigned long long)m, q);
    } else { /* every rank issued it: name those still waiting */
        int off = snprintf(who, sizeof who, "every rank issued it; still waiting: ranks"), n_w = 0;
        for (int k = 0; k < world && off < (int)sizeof who; k++)
            if (seen[k].pending)
                off += snprintf(who + off, sizeof who - (size_t)off, "%s %d", n_w++ ? "," : "", k);
        if (off < (int)sizeof who)
            snprintf(who + off, sizeof who - (size_t)off, ", so one of their devices, or a link "
                     "between them, stopped");
    }
    snprintf(msg, sizeof msg, "NCCL: %s (collective %llu) made no progress on rank %d (CUDA device "
             "%d) in %.1f s: %s; the communicators of all %d ranks were aborted. If the step "
             "is only slow (a long pause between collectives, such as a large checkpoint), raise "
             "FSO_NCCL_TIMEOUT_S (now %g s)", what ? what : "a collective", (unsigned long long)n,
             r, x->ordinal[r], (now - x->w[r].progress_ms) / 1000.0, who, world,
             x->timeout_ms / 1000.0);
    watch_abort(x, world, -ETIMEDOUT, msg);
    return -ETIMEDOUT;
}

static void *watch_main(void *arg)
{
    fso_coll *c = arg;
    struct nccl_ctx *x = c->ctx;
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + WATCH_POLL_MS * 1000000L;
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&x->cv, &x->mu, &ts);
        if (x->stop)
            break;
        pthread_mutex_unlock(&x->mu);
        int rc = watch_poll(x, c->world);
        pthread_mutex_lock(&x->mu);
        if (rc < 0)
            break;
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* FSO_NCCL_TIMEOUT_S into *ms: 0, or -EINVAL with the message in err. */
static int watch_timeout(double *ms, char *err, size_t errlen)
{
    const char *v = getenv("FSO_NCCL_TIMEOUT_S");
    *ms = DEFAULT_TIMEOUT_S * 1000.0;
    if (!v || !*v)
        return 0;
    char *end;
    double s = strtod(v, &end);
    if (*end || !(s >= 0) || s > 1e7) {
        snprintf(err, errlen, "FSO_NCCL_TIMEOUT_S=%s: expected seconds (0 or more; 0: a stalled "
                 "collective is never ended; default %g)", v, DEFAULT_TIMEOUT_S);
        return -EINVAL;
    }
    *ms = s * 1000.0;
    return 0;
}

/* The watchdog's events and thread, with two ranks or more. */
static int watch_start(fso_coll *c, char *err, size_t errlen)
{
    struct nccl_ctx *x = c->ctx;
    if (c->world < 2)
        return 0; /* nobody to wait for */
    double now = fso_now_ms();
    for (int r = 0; r < c->world; r++) {
        cudaError_t e = cudaSetDevice(x->ordinal[r]);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&x->w[r].done_ev, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            x->w[r].done_ev = NULL;
            snprintf(err, errlen, "NCCL: CUDA device %d: cannot create the watchdog's event: %s",
                     x->ordinal[r], cudaGetErrorString(e));
            cudaGetLastError();
            return fso_cuda_errno(e);
        }
        x->w[r].progress_ms = now;
    }
    x->watching = true;
    int e = pthread_create(&x->watchdog, NULL, watch_main, c);
    if (e) {
        x->watching = false;
        snprintf(err, errlen, "NCCL: cannot start the watchdog thread: %s", strerror(e));
        return -e;
    }
    return 0;
}

static void nc_destroy(fso_coll *c)
{
    struct nccl_ctx *x = c->ctx;
    if (x && x->watching) {
        pthread_mutex_lock(&x->mu);
        x->stop = true;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->watchdog, NULL);
    }
    for (int r = 0; x && r < c->world; r++) {
        cudaSetDevice(x->ordinal[r]);
        if (x->comm[r] && !x->aborted) /* an aborted one is freed */
            ncclCommDestroy(x->comm[r]);
        if (x->w[r].done_ev)
            cudaEventDestroy(x->w[r].done_ev);
        cudaFree(x->dev_f64[r]);
        cudaFree(x->dev_one[r]);
        cudaFree(x->dev_rows[r]);
        cudaFreeHost(x->host_f64[r]);
    }
    cudaGetLastError();
    if (x) {
        pthread_cond_destroy(&x->cv);
        pthread_mutex_destroy(&x->mu);
    }
    free(x);
    free(c);
}

static const fso_coll_ops nccl_ops = {
    .name = "nccl",
    .all_gather = nc_all_gather,
    .reduce_scatter = nc_reduce_scatter,
    .reduce_scatter_bf16 = nc_reduce_scatter_bf16,
    .all_reduce_f64 = nc_all_reduce_f64,
    .barrier = nc_barrier,
    .destroy = nc_destroy,
};

int fso_coll_create_nccl(fso_coll **out, int world, fso_backend **devices, char *err,
                         size_t errlen)
{
    int devs[MAX_WORLD];
    *out = NULL;
    if (world < 1 || world > MAX_WORLD) {
        snprintf(err, errlen, "NCCL: %d devices; 1 to %d are supported", world, MAX_WORLD);
        return -EINVAL;
    }
    for (int r = 0; r < world; r++) {
        if (!fso_backend_is_cuda(devices[r])) {
            snprintf(err, errlen, "NCCL: rank %d's backend is \"%s\", not \"cuda\"", r,
                     devices[r] ? devices[r]->ops->name : "(none)");
            return -EINVAL;
        }
        devs[r] = FSO_CUDA_CTX(devices[r])->ordinal;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r]) {
                snprintf(err, errlen, "NCCL: ranks %d and %d are both CUDA device %d; one device "
                                      "per rank", q, r, devs[r]);
                return -EINVAL;
            }
    }
    fso_coll *c = calloc(1, sizeof *c);
    struct nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    double timeout_ms;
    int erc = watch_timeout(&timeout_ms, err, errlen);
    if (erc == 0) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the watchdog's timed waits */
        if (pthread_cond_init(&x->cv, &ca)) {
            snprintf(err, errlen, "NCCL: cannot create the watchdog's condition variable");
            erc = -ENOMEM;
        }
        pthread_condattr_destroy(&ca);
    }
    if (erc < 0) {
        free(c);
        free(x);
        return erc;
    }
    pthread_mutex_init(&x->mu, NULL);
    x->timeout_ms = timeout_ms;
    c->ops = &nccl_ops;
    c->ctx = x;
    c->world = world;
    for (int r = 0; r < world; r++) {
        x->be[r] = devices[r];
        x->ordinal[r] = devs[r];
    }

    ncclResult_t nr = ncclCommInitAll(x->comm, world, devs);
    if (nr != ncclSuccess) {
        snprintf(err, errlen, "NCCL: cannot create the communicators of %d devices: %s%s%s", world,
                 ncclGetErrorString(nr), *ncclGetLastError(NULL) ? ": " : "",
                 ncclGetLastError(NULL));
        memset(x->comm, 0, sizeof x->comm);
        nc_destroy(c);
        return fso_nccl_errno(nr);
    }
    for (int r = 0; r < world; r++) {
        cudaError_t e = cudaSetDevice(devs[r]);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&x->dev_f64[r], sizeof(double) * MAX_F64 * (size_t)(world + 1));
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&x->dev_one[r], sizeof(float));
        if (e == cudaSuccess)
            e = cudaMemset(x->dev_one[r], 0, sizeof(float));
        if (e == cudaSuccess)
            e = cudaHostAlloc((void **)&x->host_f64[r],
                              sizeof(double) * MAX_F64 * (size_t)(world + 1),
                              cudaHostAllocPortable);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "NCCL: CUDA device %d: %s", devs[r], cudaGetErrorString(e));
            cudaGetLastError();
            nc_destroy(c);
            return fso_cuda_errno(e);
        }
        memset(x->host_f64[r], 0, sizeof(double) * MAX_F64 * (size_t)(world + 1));
    }
    int wrc = watch_start(c, err, errlen);
    if (wrc < 0) {
        nc_destroy(c);
        return wrc;
    }
    *out = c;
    return 0;
}
