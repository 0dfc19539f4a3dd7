/* tune_sweep.c — the measurements of `fsoff bench tune` (tune_sweep.h). */
#include "tune_sweep.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "util.h"

typedef struct tn_ring {
    fso_store *stores[FSO_TUNE_MAX_LIST]; /* one per request size */
    fso_store *s;             /* the point's */
    char *area;               /* FSO_TUNE_MAX_QD * the largest block, registered */
    size_t area_bytes;
    uint64_t region;          /* bytes this ring cycles over */
    /* the point */
    bool write;
    size_t block;
    int qd;
    double seconds;           /* time-boxed, when count is 0 */
    uint64_t count;           /* else exactly this many requests */
    pthread_barrier_t *go;
    uint64_t bytes;
    double elapsed;
    int rc;
} tn_ring;

/* Requests of r->block, qd in flight, from offset 0 up, wrapping around the
 * region. With r->count, that many (the untimed fill). Otherwise a rate
 * in steady state: the first queue's worth of completions warms the queue
 * up, then the bytes completed over the next r->seconds count, and what is
 * still in flight after that is reaped uncounted. */
static void *tn_run(void *arg)
{
    tn_ring *r = arg;
    fso_store *s = r->s;
    const uint64_t per_region = r->region / r->block;
    uint64_t next = 0, done = 0;
    int inflight = 0;
    bool warm = false, counting = true;
    double t0 = 0, stop = 0;
    fso_io io[FSO_TUNE_MAX_QD];
    r->rc = 0;
    r->bytes = 0;
    r->elapsed = 0;
    if (r->go)
        pthread_barrier_wait(r->go);
    for (;;) {
        bool more = r->count ? next < r->count : counting && r->rc == 0;
        while (more && inflight < r->qd) {
            char *buf = r->area + (size_t)(next % (uint64_t)r->qd) * r->block;
            uint64_t off = (next % per_region) * r->block;
            int rc = r->write ? s->ops->prep_write(s, buf, r->block, off, next)
                              : s->ops->prep_read(s, buf, r->block, off, next);
            if (rc < 0) {
                r->rc = rc;
                break;
            }
            next++;
            inflight++;
        }
        if (inflight == 0)
            break;
        int rc = s->ops->submit(s);
        int got = rc < 0 ? rc : s->ops->reap(s, io, FSO_TUNE_MAX_QD, 1);
        if (got < 0) {
            r->rc = got;
            break;
        }
        double now = fso_now_ms();
        for (int i = 0; i < got; i++) {
            if (io[i].res < 0 && r->rc == 0)
                r->rc = (int)io[i].res;
            else if (warm && counting)
                r->bytes += (uint64_t)io[i].res;
        }
        inflight -= got;
        done += (uint64_t)got;
        if (r->count)
            continue;
        if (warm && counting && now >= stop) {
            counting = false;
            r->elapsed = (now - t0) / 1e3;
        }
        if (!warm && done >= (uint64_t)r->qd) {
            warm = true;
            t0 = now;
            stop = now + r->seconds * 1e3;
        }
    }
    return NULL;
}

/* Rings [0, rings) run their set-up point (tn_run) together, started at
 * one barrier, and are joined. */
static void tn_launch(tn_ring *ring, int rings)
{
    if (rings == 1) {
        ring[0].go = NULL;
        tn_run(&ring[0]);
        return;
    }
    pthread_t tid[FSO_TUNE_MAX_RINGS];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)rings);
    for (int i = 0; i < rings; i++) {
        ring[i].go = &go;
        if (pthread_create(&tid[i], NULL, tn_run, &ring[i]) != 0)
            abort(); /* the started ones would wait at the barrier forever */
    }
    for (int i = 0; i < rings; i++) {
        pthread_join(tid[i], NULL);
        ring[i].go = NULL;
    }
    pthread_barrier_destroy(&go);
}

/* One point on `rings` rings; GB/s, or -errno with the message printed. */
static double tn_point_run(tn_ring *ring, const fso_tune_point *p, bool write, double seconds)
{
    const int rings = p->rings;
    for (int i = 0; i < rings; i++) {
        ring[i].s = ring[i].stores[p->bi];
        ring[i].write = write;
        ring[i].block = p->block;
        ring[i].qd = p->qd;
        ring[i].seconds = seconds;
        ring[i].count = 0;
    }
    tn_launch(ring, rings);
    double gbps = 0;
    for (int i = 0; i < rings; i++) {
        if (ring[i].rc < 0) {
            fprintf(stderr, "fsoff: error: bench tune: %s\n",
                    ring[i].s->err[0] ? ring[i].s->err : strerror(-ring[i].rc));
            return ring[i].rc;
        }
        if (ring[i].elapsed > 0)
            gbps += (double)ring[i].bytes / ring[i].elapsed / 1e9;
    }
    return gbps;
}

static void tn_close(tn_ring *ring, int n)
{
    for (int i = 0; i < n; i++)
        for (int b = 0; b < FSO_TUNE_MAX_LIST; b++) {
            fso_store_destroy(ring[i].stores[b]);
            ring[i].stores[b] = NULL;
        }
}

/* Opens every ring's store for every request size and writes each whole;
 * 0 or 1 with the error printed (and everything closed). */
static int tn_open(fso_tune_sweep *sw, tn_ring *ring, int n)
{
    for (int i = 0; i < n; i++)
        for (int b = 0; b < sw->nblocks; b++) {
            fso_store_opts o;
            char prefix[32], err[FSO_STORE_ERR_MAX];
            memset(&o, 0, sizeof o);
            for (int d = 0; d < sw->ndirs; d++)
                o.dirs[d] = sw->dirs[d];
            o.ndirs = sw->ndirs;
            o.capacity_bytes = ring[i].region;
            o.block_bytes = sw->blocks[b];
            o.queue_depth = FSO_TUNE_MAX_QD;
            o.direct = true;
            snprintf(prefix, sizeof prefix, "fsoff-tune%d-%d", i, b);
            o.file_prefix = prefix;
            fso_store **s = &ring[i].stores[b];
            if (fso_store_open_uring(s, &o, err, sizeof err) < 0) {
                fprintf(stderr, "fsoff: error: bench tune: %s\n", err);
                tn_close(ring, n);
                return 1;
            }
            sw->direct = sw->direct && (*s)->direct;
            if (sw->registered &&
                (*s)->ops->register_buffers(*s, ring[i].area, ring[i].area_bytes) < 0) {
                fprintf(stderr, "fsoff: warning: bench tune: %s; measuring without registered "
                        "buffers\n", (*s)->err);
                sw->registered = false;
            }
            /* the untimed first write of the region */
            tn_ring one = ring[i];
            one.s = *s;
            one.write = true;
            one.block = sw->blocks[b];
            one.count = ring[i].region / sw->blocks[b];
            one.qd = one.count < 16 ? (int)one.count : 16;
            one.go = NULL;
            tn_run(&one);
            if (one.rc < 0) {
                fprintf(stderr, "fsoff: error: bench tune: %s\n",
                        (*s)->err[0] ? (*s)->err : strerror(-one.rc));
                tn_close(ring, n);
                return 1;
            }
        }
    return 0;
}

static double tn_median(const double *v, int n)
{
    double s[FSO_TUNE_SAMPLES];
    memcpy(s, v, sizeof *v * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double fso_tune_rate(const fso_tune_point *p, int write)
{
    return p->n[write] ? tn_median(p->gbps[write], p->n[write]) : 0;
}

/* Seconds to move one GB each way: what ranks a setting for training. */
static double tn_cost(const fso_tune_point *p)
{
    double r = fso_tune_rate(p, 0), w = fso_tune_rate(p, 1);
    return r > 0 && w > 0 ? 1 / r + 1 / w : INFINITY;
}

double fso_tune_score(const fso_tune_point *p, fso_tune_rank k)
{
    return k == FSO_TUNE_READ ? fso_tune_rate(p, 0)
           : k == FSO_TUNE_WRITE ? fso_tune_rate(p, 1) : 1 / tn_cost(p);
}


/* One sample of every point, in order (backwards when reverse), reads or
 * writes first as asked; only the points marked in `only` when given, and
 * those only until the budget (ms on the monotonic clock) is spent. */
static int tn_pass(fso_tune_sweep *sw, tn_ring *ring, const bool *only, bool reverse,
                   bool read_first, double deadline_ms)
{
    for (int j = 0; j < sw->npts; j++) {
        int i = reverse ? sw->npts - 1 - j : j;
        fso_tune_point *p = &sw->pts[i];
        if (only && !only[i])
            continue;
        if (only && deadline_ms > 0 && fso_now_ms() > deadline_ms) {
            sw->over_budget = true;
            return 0;
        }
        for (int o = 0; o < 2; o++) {
            int w = read_first ? o : 1 - o;
            double g = tn_point_run(ring, p, w, sw->seconds);
            if (g < 0)
                return 1;
            if (p->n[w] < FSO_TUNE_SAMPLES)
                p->gbps[w][p->n[w]++] = g;
        }
    }
    return 0;
}

/* The points within FSO_TUNE_CONTEND of their ring count's best, under any
 * ranking. */
static void tn_contenders(const fso_tune_sweep *sw, bool *contender)
{
    for (int i = 0; i < sw->npts; i++)
        for (int k = FSO_TUNE_READ; k <= FSO_TUNE_BOTH && !contender[i]; k++) {
            double best = 0;
            for (int j = 0; j < sw->npts; j++)
                if (sw->pts[j].rings == sw->pts[i].rings && fso_tune_score(&sw->pts[j], k) > best)
                    best = fso_tune_score(&sw->pts[j], k);
            contender[i] = fso_tune_score(&sw->pts[i], k) >= FSO_TUNE_CONTEND * best;
        }
}

double fso_tune_flushed_write(const fso_tune_sweep *sw, const fso_tune_point *p)
{
    tn_ring ring[FSO_TUNE_MAX_RINGS];
    const size_t one_block[1] = {p->block};
    fso_tune_sweep one = *sw;
    one.blocks = one_block;
    one.nblocks = 1;
    memset(ring, 0, sizeof ring);
    double gbps = 0;
    int rings = 0, status = 0;
    for (; rings < p->rings && status == 0; rings++) {
        ring[rings].area_bytes = p->block * FSO_TUNE_MAX_QD; /* tn_open's fill too */
        ring[rings].region = sw->region_bytes / p->block * p->block;
        if (!(ring[rings].area = fso_io_alloc(ring[rings].area_bytes))) {
            fprintf(stderr, "fsoff: error: bench tune: out of memory for I/O buffers\n");
            status = 1;
        }
    }
    if (status == 0)
        status = tn_open(&one, ring, rings); /* writes each region once, untimed */
    /* what earlier writes left in the caches is flushed first, untimed: a
     * virtual disk flushes the whole disk at once */
    for (int i = 0; i < rings && status == 0; i++)
        if (fso_store_flush(ring[i].stores[0]) < 0) {
            fprintf(stderr, "fsoff: error: bench tune: %s\n", ring[i].stores[0]->err);
            status = 1;
        }
    const double t0 = fso_now_ms();
    for (int i = 0; i < rings && status == 0; i++) {
        ring[i].s = ring[i].stores[0];
        ring[i].write = true;
        ring[i].block = p->block;
        ring[i].qd = p->qd;
        ring[i].count = ring[i].region / p->block;
    }
    if (status == 0)
        tn_launch(ring, rings);
    uint64_t bytes = 0;
    for (int i = 0; i < rings && status == 0; i++) {
        fso_store *s = ring[i].s;
        int rc = ring[i].rc < 0 ? ring[i].rc : fso_store_flush(s);
        if (rc < 0) {
            fprintf(stderr, "fsoff: error: bench tune: %s\n", s->err[0] ? s->err : strerror(-rc));
            status = 1;
        }
        bytes += ring[i].region;
    }
    const double secs = (fso_now_ms() - t0) / 1e3;
    if (status == 0 && secs > 0)
        gbps = (double)bytes / secs / 1e9;
    tn_close(ring, rings);
    for (int i = 0; i < rings; i++)
        fso_io_free(ring[i].area, ring[i].area_bytes);
    return status == 0 ? gbps : 0;
}

int fso_tune_run(fso_tune_sweep *sw)
{
    tn_ring ring[FSO_TUNE_MAX_RINGS];
    size_t max_block = 0;
    int status = 0;
    const double deadline = sw->budget_s > 0 ? fso_now_ms() + sw->budget_s * 1e3 : 0;
    sw->over_budget = false;
    memset(ring, 0, sizeof ring);
    sw->direct = sw->registered = true;
    for (int b = 0; b < sw->nblocks; b++)
        max_block = sw->blocks[b] > max_block ? sw->blocks[b] : max_block;
    for (int i = 0; i < sw->max_rings && status == 0; i++) {
        ring[i].area_bytes = max_block * FSO_TUNE_MAX_QD;
        ring[i].region = sw->region_bytes;
        ring[i].area = fso_io_alloc(ring[i].area_bytes);
        if (!ring[i].area) {
            char b[32];
            fso_human_bytes(b, sizeof b, (double)ring[i].area_bytes * sw->max_rings);
            fprintf(stderr, "fsoff: error: bench tune: cannot map %s of I/O buffers; lower "
                    "--block-sizes or --rings\n", b);
            status = 1;
            break;
        }
        for (size_t o = 0; o < ring[i].area_bytes; o += 64)
            ring[i].area[o] = (char)(o * 2654435761u >> 13);
    }
    bool *contender = calloc((size_t)sw->npts, sizeof *contender);
    if (!contender && status == 0) {
        fprintf(stderr, "fsoff: error: bench tune: out of memory\n");
        status = 1;
    }
    if (status == 0)
        status = tn_open(sw, ring, sw->max_rings);
    if (status == 0) /* every point, writes first */
        status = tn_pass(sw, ring, NULL, false, false, 0);
    if (status == 0) {
        tn_contenders(sw, contender);
        status = tn_pass(sw, ring, contender, true, true, deadline);
    }
    if (status == 0)
        status = tn_pass(sw, ring, contender, false, true, deadline);
    free(contender);
    tn_close(ring, sw->max_rings);
    for (int i = 0; i < sw->max_rings; i++)
        if (ring[i].area)
            fso_io_free(ring[i].area, ring[i].area_bytes);
    return status;
}
