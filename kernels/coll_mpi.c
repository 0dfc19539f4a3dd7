/* coll_mpi.c — a rail over MPI (coll.h, fso_coll_create_mpi): the
 * collectives among the boxes of a run, one rank per box, host buffers.
 *
 * Every collective is point-to-point: each box posts a non-blocking send to
 * and a receive from every other box, then polls them against the rail's
 * deadline. Polling, not MPI's blocking calls, so that a box that stops
 * answering costs a bounded wait and is named (the receives still pending
 * say which boxes); point-to-point, not MPI's reductions, so that the sums
 * run in box order 0..B-1 on every box and every run (MPI does not fix the
 * order of its reductions), the order coll_threads.c uses among devices.
 * Each rail has its own communicator (a dup of the caller's) with
 * MPI_ERRORS_RETURN, so rails used from different threads at once never
 * match each other's messages and an MPI failure comes back as an error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "coll_mpi.h"
#include "fso_build.h"
#include "util.h"

static fso_coll_mpi_describe_fn describe_box;

void fso_coll_mpi_set_describe(fso_coll_mpi_describe_fn fn)
{
    describe_box = fn;
}

#if FSO_HAVE_MPI
#include <mpi.h>

/* Messages are cut in pieces of at most this many bytes: MPI counts are int. */
#define PIECE_BYTES ((size_t)1 << 30)

enum { TAG_GATHER = 101, TAG_RS, TAG_RS16, TAG_AR, TAG_BARRIER };

struct ctx {
    MPI_Comm comm;
    double timeout_s;
    int broken;             /* a call timed out or failed: the rail's messages are out of step */
    void *scratch;          /* the pieces of a reduction, grown as needed */
    size_t scratch_bytes;
    MPI_Request *reqs;      /* one call's requests, and the box each one waits on */
    int *req_box;
    char *req_recv;         /* 1: a receive (its box has not sent yet when it is pending) */
    int nreq, cap;
};

static int req_add(struct ctx *x, int box, int recv)
{
    if (x->nreq == x->cap) {
        int cap = x->cap ? 2 * x->cap : 64;
        MPI_Request *r = realloc(x->reqs, sizeof(*r) * (size_t)cap);
        if (!r)
            return -ENOMEM;
        x->reqs = r;
        int *b = realloc(x->req_box, sizeof(*b) * (size_t)cap);
        if (!b)
            return -ENOMEM;
        x->req_box = b;
        char *v = realloc(x->req_recv, (size_t)cap);
        if (!v)
            return -ENOMEM;
        x->req_recv = v;
        x->cap = cap;
    }
    x->req_box[x->nreq] = box;
    x->req_recv[x->nreq] = (char)recv;
    return x->nreq++;
}

static int mpi_fail(fso_coll *c, int rc, const char *what, int box)
{
    struct ctx *x = c->ctx;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    snprintf(c->err, sizeof c->err, "rail %s with box %d: MPI error: %s", what, box, msg);
    x->broken = 1;
    return -EIO;
}

/* Post the send of `bytes` at buf to box `to`, or the receive from it, in
 * pieces. */
static int post(fso_coll *c, const char *what, int recv, void *buf, size_t bytes, int box, int tag)
{
    struct ctx *x = c->ctx;
    size_t off = 0;
    do {
        size_t n = bytes - off < PIECE_BYTES ? bytes - off : PIECE_BYTES;
        int i = req_add(x, box, recv);
        if (i < 0) {
            snprintf(c->err, sizeof c->err, "rail %s: out of host memory", what);
            x->broken = 1; /* some of this call's messages are posted */
            return i;
        }
        int rc = recv ? MPI_Irecv((char *)buf + off, (int)n, MPI_BYTE, box, tag, x->comm,
                                  &x->reqs[i])
                      : MPI_Isend((char *)buf + off, (int)n, MPI_BYTE, box, tag, x->comm,
                                  &x->reqs[i]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(c, rc, what, box);
        off += n;
    } while (off < bytes);
    return 0;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Wait for every posted request, polling until the rail's deadline. A
 * waiting thread sleeps between polls (from a few microseconds up to
 * NAP_MAX_US), so that it leaves the cores to compute and to MPI's own
 * progress and still sees a step's small all-reduce soon after it lands.
 * On timeout err names the first box whose message has not come. */
#define NAP_MAX_US 250
static int wait_all(fso_coll *c, const char *what)
{
    struct ctx *x = c->ctx;
    const double t0 = fso_now_ms();
    const double deadline = t0 + x->timeout_s * 1000.0;
    long nap = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(x->nreq, x->reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            int box = x->nreq ? x->req_box[0] : -1;
            for (int i = 0; i < x->nreq; i++) {
                int one = 0;
                if (x->reqs[i] != MPI_REQUEST_NULL &&
                    MPI_Test(&x->reqs[i], &one, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                    box = x->req_box[i];
                    break;
                }
            }
            return mpi_fail(c, rc, what, box);
        }
        if (done) {
            x->nreq = 0;
            return 0;
        }
        if (fso_now_ms() > deadline)
            break;
        if (nap == 0)
            nap = 2;
        else if (nap < NAP_MAX_US)
            nap = nap * 2 < NAP_MAX_US ? nap * 2 : NAP_MAX_US;
        sleep_us(nap);
    }
    /* The first box still owing a message; a box we only send to (its
     * receive not posted) when none does. */
    int quiet = -1;
    for (int pass = 0; pass < 2 && quiet < 0; pass++)
        for (int i = 0; i < x->nreq; i++) {
            int one = 0;
            if (x->reqs[i] == MPI_REQUEST_NULL)
                continue;
            MPI_Test(&x->reqs[i], &one, MPI_STATUS_IGNORE);
            if (!one && (pass == 1 || x->req_recv[i])) {
                quiet = x->req_box[i];
                break;
            }
        }
    char who[400];
    if (quiet >= 0 && describe_box)
        describe_box(quiet, who, sizeof who);
    else
        snprintf(who, sizeof who, "box %d", quiet);
    snprintf(c->err, sizeof c->err, "%s; it has not joined the rail's %s within %.0f s "
             "(comm.timeout_s)", who, what, x->timeout_s);
    /* The pending requests stay posted (destroy cancels them): the run
     * is failing, and the rail refuses further calls. */
    x->broken = 1;
    return -ETIMEDOUT;
}

static int check_usable(fso_coll *c, int rank, const char *what)
{
    struct ctx *x = c->ctx;
    if (x->broken) {
        snprintf(c->err, sizeof c->err, "rail %s: an earlier call on this rail failed; "
                 "the boxes are out of step and the run has to stop", what);
        return -EIO;
    }
    int me = -1;
    MPI_Comm_rank(x->comm, &me);
    if (rank != me) {
        snprintf(c->err, sizeof c->err, "rail %s called as box %d by box %d", what, rank, me);
        return -EINVAL;
    }
    c->err[0] = 0;
    x->nreq = 0;
    return 0;
}

static void *scratch(struct ctx *x, size_t bytes)
{
    if (bytes > x->scratch_bytes) {
        void *p = realloc(x->scratch, bytes);
        if (!p)
            return NULL;
        x->scratch = p;
        x->scratch_bytes = bytes;
    }
    return x->scratch;
}

static int mpi_all_gather(fso_coll *c, int rank, const void *send, void *recv, size_t count,
                          fso_dtype dt, uint64_t after)
{
    (void)after; /* host memory: the caller's writes are done */
    const char *what = "all-gather";
    int rc = check_usable(c, rank, what);
    if (rc)
        return rc;
    double t0 = fso_now_ms();
    const size_t bytes = fso_dtype_size(dt) * count;
    char *own = (char *)recv + (size_t)rank * bytes;
    if (own != send)
        memmove(own, send, bytes);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 1, (char *)recv + (size_t)k * bytes, bytes, k, TAG_GATHER);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 0, own, bytes, k, TAG_GATHER);
    if (!rc)
        rc = wait_all(c, what);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

/* Reduce-scatter of pieces `elem` bytes wide: box k gets its slice from
 * every box into slot k of the scratch (its own slice copied there first, so
 * that recv may alias it), then adds the slots in box order. */
static int reduce_scatter_any(fso_coll *c, int rank, const void *send, float *recv, size_t count,
                              size_t elem, int tag, const char *what)
{
    struct ctx *x = c->ctx;
    int rc = check_usable(c, rank, what);
    if (rc)
        return rc;
    double t0 = fso_now_ms();
    const size_t bytes = elem * count;
    char *slots = scratch(x, bytes * (size_t)c->world);
    if (!slots && bytes) {
        snprintf(c->err, sizeof c->err, "rail %s: out of host memory for %zu bytes", what,
                 bytes * (size_t)c->world);
        return -ENOMEM;
    }
    memcpy(slots + (size_t)rank * bytes, (const char *)send + (size_t)rank * bytes, bytes);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 1, slots + (size_t)k * bytes, bytes, k, tag);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 0, (char *)send + (size_t)k * bytes, bytes, k, tag);
    if (!rc)
        rc = wait_all(c, what);
    if (!rc) {
        if (elem == sizeof(float)) {
            const float *p = (const float *)slots;
            for (size_t i = 0; i < count; i++) {
                float s = p[i];
                for (int k = 1; k < c->world; k++)
                    s += p[(size_t)k * count + i];
                recv[i] = s;
            }
        } else {
            const uint16_t *p = (const uint16_t *)slots;
            for (size_t i = 0; i < count; i++) {
                float s = fso_f32_from_bf16(p[i]);
                for (int k = 1; k < c->world; k++)
                    s += fso_f32_from_bf16(p[(size_t)k * count + i]);
                recv[i] = s;
            }
        }
    }
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

static int mpi_reduce_scatter(fso_coll *c, int rank, const float *send, float *recv, size_t count)
{
    return reduce_scatter_any(c, rank, send, recv, count, sizeof(float), TAG_RS,
                              "reduce-scatter");
}

static int mpi_reduce_scatter_bf16(fso_coll *c, int rank, const uint16_t *send, float *recv,
                                   size_t count)
{
    return reduce_scatter_any(c, rank, send, recv, count, sizeof(uint16_t), TAG_RS16,
                              "reduce-scatter (bf16)");
}

/* Every box gets every box's vector and adds them in box order from 0.0,
 * as coll_threads.c does: the same bits on every box. */
static int mpi_all_reduce_f64(fso_coll *c, int rank, double *buf, size_t count)
{
    struct ctx *x = c->ctx;
    const char *what = "all-reduce";
    int rc = check_usable(c, rank, what);
    if (rc)
        return rc;
    double t0 = fso_now_ms();
    const size_t bytes = sizeof(double) * count;
    /* slot world holds this box's values while the others arrive */
    double *slots = scratch(x, bytes * (size_t)(c->world + 1));
    if (!slots && bytes) {
        snprintf(c->err, sizeof c->err, "rail %s: out of host memory", what);
        return -ENOMEM;
    }
    memcpy(slots + (size_t)rank * count, buf, bytes);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 1, slots + (size_t)k * count, bytes, k, TAG_AR);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 0, slots + (size_t)rank * count, bytes, k, TAG_AR);
    if (!rc)
        rc = wait_all(c, what);
    if (!rc)
        for (size_t i = 0; i < count; i++) {
            double s = 0;
            for (int k = 0; k < c->world; k++)
                s += slots[(size_t)k * count + i];
            buf[i] = s;
        }
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

/* One empty message to and from every box: a barrier that knows who is late. */
static int mpi_barrier(fso_coll *c, int rank)
{
    const char *what = "barrier";
    int rc = check_usable(c, rank, what);
    if (rc)
        return rc;
    double t0 = fso_now_ms();
    static char none[1];
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 1, none, 0, k, TAG_BARRIER);
    for (int k = 0; k < c->world && !rc; k++)
        if (k != rank)
            rc = post(c, what, 0, none, 0, k, TAG_BARRIER);
    if (!rc)
        rc = wait_all(c, what);
    c->busy_ms[rank] += fso_now_ms() - t0;
    return rc;
}

static void mpi_destroy(fso_coll *c)
{
    struct ctx *x = c->ctx;
    if (x->broken) {
        /* A rail whose peer stopped answering keeps requests MPI may never
         * finish: its receives are cancelled, its sends let go, and its
         * communicator and scratch are left to the process's end, since a
         * late box's message may still land in the scratch and freeing the
         * communicator could wait for it. */
        for (int i = 0; i < x->nreq; i++) {
            if (x->reqs[i] == MPI_REQUEST_NULL)
                continue;
            if (x->req_recv[i])
                MPI_Cancel(&x->reqs[i]);
            MPI_Request_free(&x->reqs[i]);
        }
        x->scratch = NULL;
    } else {
        MPI_Comm_free(&x->comm);
    }
    free(x->scratch);
    free(x->reqs);
    free(x->req_box);
    free(x->req_recv);
    free(x);
    free(c);
}

static const fso_coll_ops mpi_ops;

void fso_coll_mpi_set_timeout(fso_coll *c, double timeout_s)
{
    if (c && c->ops == &mpi_ops && timeout_s > 0)
        ((struct ctx *)c->ctx)->timeout_s = timeout_s;
}

static const fso_coll_ops mpi_ops = {
    .name = "mpi",
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .reduce_scatter_bf16 = mpi_reduce_scatter_bf16,
    .all_reduce_f64 = mpi_all_reduce_f64,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

int fso_coll_create_mpi(fso_coll **out, const void *comm, double timeout_s)
{
    *out = NULL;
    if (!comm || !(timeout_s > 0))
        return -EINVAL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return -ENOTSUP;
    fso_coll *c = calloc(1, sizeof *c);
    struct ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return -ENOMEM;
    }
    if (MPI_Comm_dup(*(const MPI_Comm *)comm, &x->comm) != MPI_SUCCESS) {
        free(c);
        free(x);
        return -EIO;
    }
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(x->comm, &c->world);
    if (c->world > FSO_MAX_DEVICES) {
        /* busy_ms has one slot per rank */
        MPI_Comm_free(&x->comm);
        free(c);
        free(x);
        return -E2BIG;
    }
    x->timeout_s = timeout_s;
    c->ops = &mpi_ops;
    c->ctx = x;
    *out = c;
    return 0;
}

#else

void fso_coll_mpi_set_timeout(fso_coll *c, double timeout_s)
{
    (void)c;
    (void)timeout_s;
}

int fso_coll_create_mpi(fso_coll **out, const void *comm, double timeout_s)
{
    (void)comm;
    (void)timeout_s;
    *out = NULL;
    return -ENOTSUP;
}

#endif
