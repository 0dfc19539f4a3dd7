/* probe.c — machine probes and their JSON cache (probe.h). */
#include "probe.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "adamw.h"
#include "backend.h"
#include "coll.h"
#include "pool.h"
#include "util.h"

#define MIB (1024.0 * 1024.0)
/* 3: NVMe rates measured through huge-page buffers (util.h fso_io_alloc),
 * several times those of version 2's 4 KiB pages on some disks: older
 * figures are measured again. */
#define CACHE_VERSION 3


/* ------------------------------------------------------------------ key */

static void cpu_model(char *buf, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, len, "unknown CPU");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon++;
            while (*colon == ' ' || *colon == '\t')
                colon++;
            colon[strcspn(colon, "\n")] = 0;
            snprintf(buf, len, "%s", colon);
            break;
        }
    }
    fclose(f);
}


/* The instruction set AdamW runs with here: FSO_ISA's, else the widest
 * (an FSO_ISA this machine cannot run is refused before any probe). */
static fso_isa adam_isa(void)
{
    fso_isa isa;
    char e[256];
    return fso_isa_from_env(&isa, e, sizeof e) == 0 ? isa : fso_isa_best();
}

void fso_probe_key(char *buf, size_t len, const char *dirs)
{
    char host[256] = "localhost", cpu[256], list[4096] = "", tmp[4096];
    const char *d[FSO_STORE_MAX_DIRS];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    cpu_model(cpu, sizeof cpu);
    snprintf(tmp, sizeof tmp, "%s", dirs ? dirs : "");
    int n = fso_split_list(tmp, ',', d, FSO_STORE_MAX_DIRS);
    if (n < 0) /* the first FSO_STORE_MAX_DIRS name the machine well enough */
        n = FSO_STORE_MAX_DIRS;
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof list; i++) {
        char real[PATH_MAX];
        const char *p = realpath(d[i], real) ? real : d[i];
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? "," : "", p);
    }
    snprintf(buf, len, "%s|%s|%s", host, cpu, list);
}

int fso_probe_cache_path(char *buf, size_t len)
{
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && x[0] == '/')
        snprintf(buf, len, "%s/fsoff/probe.json", x);
    else if (h && h[0])
        snprintf(buf, len, "%s/.cache/fsoff/probe.json", h);
    else
        return -ENOENT;
    return 0;
}

/* ------------------------------------------------------------------ probes */


/* Stream `cap` bytes through the store in block-sized requests, qd in flight. */
static int stream_io(fso_store *s, bool write, char *buf, size_t block, int qd, uint64_t cap,
                     char *err, size_t errlen)
{
    uint64_t off = 0;
    int inflight = 0;
    fso_io done[64];
    while (off < cap || inflight > 0) {
        while (off < cap && inflight < qd) {
            char *b = buf + (size_t)((off / block) % (uint64_t)qd) * block;
            int rc = write ? s->ops->prep_write(s, b, block, off, off)
                           : s->ops->prep_read(s, b, block, off, off);
            if (rc == -EBUSY)
                break;
            if (rc < 0) {
                snprintf(err, errlen, "%s", s->err[0] ? s->err : strerror(-rc));
                return rc;
            }
            off += block;
            inflight++;
        }
        int rc = s->ops->submit(s);
        if (rc < 0) {
            snprintf(err, errlen, "submit: %s", strerror(-rc));
            return rc;
        }
        int n = s->ops->reap(s, done, 64, 1);
        if (n < 0) {
            snprintf(err, errlen, "%s", s->err[0] ? s->err : strerror(-n));
            return n;
        }
        for (int i = 0; i < n; i++)
            if (done[i].res < 0) {
                snprintf(err, errlen, "%s at %llu: %s", write ? "write" : "read",
                         (unsigned long long)done[i].user, strerror((int)-done[i].res));
                return (int)done[i].res;
            }
        inflight -= n;
    }
    return 0;
}

/* The probes' store over dirs, `per_dir` bytes (whole 1 MiB requests) in
 * each, 16 requests in flight, O_DIRECT where the filesystem allows; its
 * capacity in *capacity. 0, or negative errno with the store's message. */
static int probe_store_open(const char **dirs, int n, uint64_t per_dir, fso_store **s,
                            uint64_t *capacity, char *err, size_t errlen)
{
    const size_t block = 1 << 20;
    fso_store_opts so = {0};
    char serr[512] = "";
    for (int i = 0; i < n; i++)
        so.dirs[i] = dirs[i];
    so.ndirs = n;
    so.capacity_bytes = (per_dir / block) * block * (uint64_t)n;
    so.block_bytes = block;
    so.queue_depth = 16;
    so.direct = true;
    so.file_prefix = "fsoff-probe";
    *capacity = so.capacity_bytes;
    int rc = fso_store_open_uring(s, &so, serr, sizeof serr);
    if (rc < 0)
        snprintf(err, errlen, "%s", serr);
    return rc;
}

/* Write then read `bytes` per folder of `dirs` striped together, 16
 * requests of 1 MiB in flight; then a few requests one at a time for the
 * latency beyond the transfer. The writes are timed twice: as they complete
 * (*burst) and until flushed (*wr, store.h flush). A cache in front of the
 * drive (a virtual disk's host page cache, a drive's DRAM) takes writes at
 * several times the rate it drains them at (on a virtio disk: 3.9 GB/s for
 * 512 MiB unflushed, 1.0 GB/s flushed). A step's writes come a block at a
 * time, between reads and compute, and the engine never flushes: they see
 * the burst rate as long as the step's whole volume drains within the step
 * (the planner bounds the step by that, planner.h nvme_drain_gbps), which
 * is why `bytes` is a large model's block (256 MiB), not a few MiB. */
static int probe_store(const char **dirs, int n, uint64_t bytes, double *rd, double *wr,
                       double *burst, double *rd_lat, double *wr_lat, bool *direct, char *err,
                       size_t errlen)
{
    const size_t block = 1 << 20;
    const int qd = 16;
    fso_store *s = NULL;
    uint64_t cap = 0;
    int rc = probe_store_open(dirs, n, bytes, &s, &cap, err, errlen);
    if (rc < 0)
        return rc;
    char *buf = fso_io_alloc(block * (size_t)qd);
    if (!buf) {
        fso_store_destroy(s);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < block * (size_t)qd; i++)
        buf[i] = (char)(i * 2654435761u >> 13);
    /* earlier writes (anyone's) still in a cache are flushed first, untimed:
     * a virtual disk flushes the whole disk at once */
    if ((rc = fso_store_flush(s)) < 0) {
        snprintf(err, errlen, "%s", s->err);
        fso_store_destroy(s);
        fso_io_free(buf, block * (size_t)qd);
        return rc;
    }
    double t0 = (fso_now_ms() / 1e3);
    rc = stream_io(s, true, buf, block, qd, cap, err, errlen);
    double tw = (fso_now_ms() / 1e3);
    if (rc == 0 && (rc = fso_store_flush(s)) < 0)
        snprintf(err, errlen, "%s", s->err);
    double t1 = (fso_now_ms() / 1e3);
    if (rc == 0)
        rc = stream_io(s, false, buf, block, qd, cap, err, errlen);
    double t2 = (fso_now_ms() / 1e3);
    const uint64_t one = 8 * (uint64_t)block < cap ? 8 * (uint64_t)block
                                                                 : cap;
    if (rc == 0)
        rc = stream_io(s, true, buf, block, 1, one, err, errlen);
    double t3 = (fso_now_ms() / 1e3);
    if (rc == 0)
        rc = stream_io(s, false, buf, block, 1, one, err, errlen);
    double t4 = (fso_now_ms() / 1e3);
    *direct = s->direct;
    fso_store_destroy(s);
    fso_io_free(buf, block * (size_t)qd);
    if (rc < 0)
        return rc;
    *wr = (double)cap / (t1 - t0) / 1e9;
    *burst = (double)cap / (tw - t0) / 1e9;
    *rd = (double)cap / (t2 - t1) / 1e9;
    double reqs = (double)(one / block);
    double wl = ((t3 - t2) / reqs - (double)block / (*wr * 1e9)) * 1e3;
    double rl = ((t4 - t3) / reqs - (double)block / (*rd * 1e9)) * 1e3;
    *wr_lat = wl > 0 ? wl : 0;
    *rd_lat = rl > 0 ? rl : 0;
    return 0;
}

/* ------------------------------------------------------------------ NVMe's cost to the cores */

typedef struct io_job {
    fso_store *s;
    char *buf;
    uint64_t bytes;
    bool write;
    volatile int done; /* 1: finished (rc set) */
    int rc;
    char err[512];
} io_job;

/* The transfer on its own thread: the writes and then a flush (the host
 * drains them in the background as a step goes on, and that work counts),
 * or the reads. */
static void *io_job_run(void *arg)
{
    io_job *j = arg;
    const size_t block = 1 << 20;
    j->rc = stream_io(j->s, j->write, j->buf, block, 16, j->bytes, j->err, sizeof j->err);
    if (j->rc == 0 && j->write && (j->rc = fso_store_flush(j->s)) < 0)
        snprintf(j->err, sizeof j->err, "%s", j->s->err);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* sgemm on all of the backend's threads until ms have passed or *stop is
 * set: GFLOP/s over the time it ran (*ran_ms). */
static double compute_rate(fso_backend *be, float *x, float *w, float *y, double ms,
                           const volatile int *stop, double *ran_ms)
{
    const int N = 256, Cin = 1024, Cout = 1024;
    double t0 = fso_now_ms(), t = t0, flops = 0;
    while (t - t0 < ms && !(stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE))) {
        be->ops->matmul_fwd(be, y, FSO_DT_F32, x, w, FSO_DT_F32, N, Cin, Cout);
        be->ops->sync(be);
        flops += 2.0 * N * Cin * Cout;
        t = fso_now_ms();
    }
    *ran_ms = t - t0;
    return t > t0 ? flops / ((t - t0) / 1e3) / 1e9 : 0;
}

/* What NVMe transfers cost the cores: the kernel's work per request and, on
 * a virtual disk, the host's, which takes the guest's cores (0.06 s per GB
 * read and 0.24 s per GB written on a 2-vCPU VM's virtio disk: a sixth of a
 * 2.28B model's step on two CPU devices). sgemm on all threads runs alone,
 * then while `bytes` are written (and flushed) through the store on another
 * thread, alone again, and while they are read back; what the compute lost
 * over each transfer, against the faster of the runs alone (other jobs
 * only slow a run), in seconds per GB. */
static int probe_io_cost(const char **dirs, int n, uint64_t bytes, int threads, double *rd_s,
                         double *wr_s, char *err, size_t errlen)
{
    const size_t block = 1 << 20;
    fso_store *s = NULL;
    fso_backend *be = NULL;
    char why[200] = "";
    uint64_t cap = 0;
    int rc = probe_store_open(dirs, n, bytes / (uint64_t)n, &s, &cap, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = fso_backend_create(&be, FSO_BACKEND_CPU, 0, threads, 0, why, sizeof why)) < 0) {
        snprintf(err, errlen, "cannot create the CPU backend: %s", why);
        fso_store_destroy(s);
        return rc;
    }
    io_job j = {.s = s, .bytes = cap};
    float *x = NULL, *w = NULL, *y = NULL;
    j.buf = fso_io_alloc(block * 16);
    if (!j.buf || be->ops->buf_alloc(be, sizeof(float) * 256 * 1024, (void **)&x) < 0 ||
        be->ops->buf_alloc(be, sizeof(float) * 1024 * 1024, (void **)&w) < 0 ||
        be->ops->buf_alloc(be, sizeof(float) * 256 * 1024, (void **)&y) < 0) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < block * 16; i++)
        j.buf[i] = (char)(i * 2654435761u >> 13);
    for (size_t i = 0; i < 256 * 1024; i++)
        x[i] = 0.01f * (float)(i % 97);
    for (size_t i = 0; i < 1024 * 1024; i++)
        w[i] = 0.01f * (float)(i % 89);
    if ((rc = fso_store_flush(s)) < 0) { /* earlier writes, untimed */
        snprintf(err, errlen, "%s", s->err);
        goto out;
    }
    double ran, alone = compute_rate(be, x, w, y, 300, NULL, &ran), busy[2] = {0, 0};
    double dur[2] = {0, 0};
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        pthread_t tid;
        j.write = pass == 0;
        j.done = 0;
        int e = pthread_create(&tid, NULL, io_job_run, &j);
        if (e != 0) {
            snprintf(err, errlen, "cannot start a thread: %s", strerror(e));
            rc = -e;
            break;
        }
        busy[pass] = compute_rate(be, x, w, y, 1e12, &j.done, &dur[pass]);
        pthread_join(tid, NULL);
        if ((rc = j.rc) < 0) {
            snprintf(err, errlen, "%s", j.err);
            break;
        }
        double again = compute_rate(be, x, w, y, 300, NULL, &ran);
        alone = again > alone ? again : alone;
    }
    if (rc == 0) {
        const double gb = (double)cap / 1e9;
        for (int pass = 0; pass < 2; pass++) {
            double lost = alone > 0 ? (1 - busy[pass] / alone) * dur[pass] / 1e3 : 0;
            *(pass == 0 ? wr_s : rd_s) = lost > 0 ? lost / gb : 0;
        }
    }
out:
    if (be) {
        be->ops->buf_free(be, x);
        be->ops->buf_free(be, w);
        be->ops->buf_free(be, y);
        fso_backend_destroy(be);
    }
    fso_io_free(j.buf, block * 16);
    fso_store_destroy(s);
    return rc;
}

/* Best of reps memcpy rates of `bytes`, in GB/s. */
static double probe_copy(fso_backend *be, bool h2d, size_t bytes)
{
    void *dev = NULL;
    char *host = malloc(bytes);
    double best = 0;
    if (!host || be->ops->buf_alloc(be, bytes, &dev) < 0) {
        free(host);
        return 0;
    }
    memset(host, 1, bytes);
    be->ops->memset0(be, dev, bytes);
    for (int r = 0; r < 4; r++) {
        double t0 = (fso_now_ms() / 1e3);
        if (h2d)
            be->ops->copy_h2d(be, dev, host, bytes);
        else
            be->ops->copy_d2h(be, host, dev, bytes);
        be->ops->sync(be);
        double g = (double)bytes / ((fso_now_ms() / 1e3) - t0) / 1e9;
        if (g > best)
            best = g;
    }
    be->ops->buf_free(be, dev);
    free(host);
    return best;
}

typedef struct coll_arg {
    fso_coll *c;
    int rank;
    float *send, *recv;
    size_t count;
    int reps;
    double secs;
} coll_arg;

static void *coll_worker(void *p)
{
    coll_arg *a = p;
    a->c->ops->all_gather(a->c, a->rank, a->send, a->recv, a->count, FSO_DT_F32, 0); /* warm */
    a->c->ops->barrier(a->c, a->rank);
    double t0 = (fso_now_ms() / 1e3);
    for (int r = 0; r < a->reps; r++)
        a->c->ops->all_gather(a->c, a->rank, a->send, a->recv, a->count, FSO_DT_F32, 0);
    a->c->ops->barrier(a->c, a->rank);
    a->secs = (fso_now_ms() / 1e3) - t0;
    return NULL;
}

/* All-gather bus bandwidth among W threads (nccl-tests: (W-1)/W of the
 * gathered bytes per unit time). */
static double probe_coll(int W)
{
    const size_t count = (size_t)(4 * MIB) / sizeof(float);
    fso_coll *c = NULL;
    coll_arg a[FSO_MAX_DEVICES];
    pthread_t tid[FSO_MAX_DEVICES];
    double bw = 0;
    if (W < 2)
        W = 2;
    if (W > FSO_MAX_DEVICES)
        W = FSO_MAX_DEVICES;
    if (fso_coll_create_threads(&c, W) < 0)
        return 0;
    int started = 0, ok = 1;
    for (int r = 0; r < W; r++) {
        a[r] = (coll_arg){.c = c, .rank = r, .count = count, .reps = 4};
        a[r].send = calloc(count, sizeof(float));
        a[r].recv = calloc(count * (size_t)W, sizeof(float));
        if (!a[r].send || !a[r].recv)
            ok = 0;
    }
    if (ok) {
        for (int r = 1; r < W; r++)
            if (pthread_create(&tid[r], NULL, coll_worker, &a[r]) == 0)
                started++;
            else
                break;
        if (started == W - 1) {
            coll_worker(&a[0]);
            bw = (double)(W - 1) * count * sizeof(float) * a[0].reps / a[0].secs / 1e9;
        } else {
            abort(); /* the started threads would wait in a collective forever */
        }
        for (int r = 1; r <= started; r++)
            pthread_join(tid[r], NULL);
    }
    for (int r = 0; r < W; r++) {
        free(a[r].send);
        free(a[r].recv);
    }
    fso_coll_destroy(c);
    return bw;
}

static double probe_adam(int threads)
{
    const size_t n = (size_t)4 << 20;
    const fso_adamw_kernel *k = NULL;
    fso_pool *pool = NULL;
    float *buf = malloc(sizeof(float) * n * 4);
    double best = 0;
    if (!buf || fso_pool_create(&pool, threads) < 0) {
        free(buf);
        return 0;
    }
    if (fso_adamw_select(adam_isa(), &k) < 0)
        k = NULL;
    for (size_t i = 0; i < n * 4; i++)
        buf[i] = 0.001f * (float)(i % 1000);
    fso_adamw_step st = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                         .weight_decay = 0.1, .grad_scale = 1, .t = 1};
    for (int r = 0; r < 4; r++) {
        double t0 = (fso_now_ms() / 1e3);
        fso_adamw_fused_mt(k, pool, buf, buf + n, FSO_DT_F32, buf + 2 * n, buf + 3 * n, NULL, n,
                           &st);
        double g = (double)n / ((fso_now_ms() / 1e3) - t0) / 1e9;
        if (g > best)
            best = g;
        st.t++;
    }
    fso_pool_destroy(pool);
    free(buf);
    return best;
}

/* sgemm (N, Cin) x (Cout, Cin)^T: a projection of a 1024-wide block over
 * 512 tokens. */
static double probe_gflops(fso_backend *be)
{
    const int N = 512, Cin = 1024, Cout = 2048;
    float *x = NULL, *w = NULL, *y = NULL;
    double best = 0;
    if (be->ops->buf_alloc(be, sizeof(float) * (size_t)N * Cin, (void **)&x) < 0 ||
        be->ops->buf_alloc(be, sizeof(float) * (size_t)Cout * Cin, (void **)&w) < 0 ||
        be->ops->buf_alloc(be, sizeof(float) * (size_t)N * Cout, (void **)&y) < 0)
        goto out;
    for (size_t i = 0; i < (size_t)N * Cin; i++)
        x[i] = 0.01f * (float)(i % 97);
    for (size_t i = 0; i < (size_t)Cout * Cin; i++)
        w[i] = 0.01f * (float)(i % 89);
    for (int r = 0; r < 4; r++) {
        double t0 = (fso_now_ms() / 1e3);
        be->ops->matmul_fwd(be, y, FSO_DT_F32, x, w, FSO_DT_F32, N, Cin, Cout);
        be->ops->sync(be);
        double g = 2.0 * N * Cin * Cout / ((fso_now_ms() / 1e3) - t0) / 1e9;
        if (g > best)
            best = g;
    }
out:
    be->ops->buf_free(be, x);
    be->ops->buf_free(be, w);
    be->ops->buf_free(be, y);
    return best;
}

/* The NVMe probes of opts->dirs into p (its key, folders and NVMe rates). */
static int probe_folders(fso_probe *p, const fso_probe_opts *opts, char *err, size_t errlen)
{
    char tmp[4096];
    const char *dirs[FSO_STORE_MAX_DIRS];
    int rc;
    snprintf(tmp, sizeof tmp, "%s", opts->dirs ? opts->dirs : "");
    p->n_dirs = fso_split_list(tmp, ',', dirs, FSO_STORE_MAX_DIRS);
    if (p->n_dirs < 0) /* the engine refuses more; probe the first ones */
        p->n_dirs = FSO_STORE_MAX_DIRS;
    uint64_t bytes = opts->nvme_bytes ? opts->nvme_bytes : (uint64_t)256 << 20;
    p->nvme_free_bytes = 0;
    p->nvme_read_gbps = p->nvme_write_gbps = p->nvme_read_lat_ms = p->nvme_write_lat_ms = 0;
    p->nvme_write_burst_gbps = 0;
    p->nvme_read_cpu_s_per_gb = p->nvme_write_cpu_s_per_gb = 0;
    p->nvme_cpu_known = false;
    if (p->n_dirs == 0)
        return 0;
    for (int i = 0; i < p->n_dirs; i++) {
        fso_probe_dir *d = &p->dirs[i];
        struct statvfs sv;
        char e[512];
        memset(d, 0, sizeof *d);
        snprintf(d->path, sizeof d->path, "%s", dirs[i]);
        if (statvfs(dirs[i], &sv) == 0)
            d->free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
        p->nvme_free_bytes += d->free_bytes;
        if ((rc = probe_store(&dirs[i], 1, bytes, &d->read_gbps, &d->write_gbps,
                              &d->write_burst_gbps, &d->read_lat_ms, &d->write_lat_ms, &d->direct, e, sizeof e)) < 0) {
            snprintf(err, errlen, "NVMe probe of %s: %s", dirs[i], e);
            return rc;
        }
    }
    if (p->n_dirs == 1) {
        p->nvme_read_gbps = p->dirs[0].read_gbps;
        p->nvme_write_gbps = p->dirs[0].write_gbps;
        p->nvme_write_burst_gbps = p->dirs[0].write_burst_gbps;
        p->nvme_read_lat_ms = p->dirs[0].read_lat_ms;
        p->nvme_write_lat_ms = p->dirs[0].write_lat_ms;
    } else if (p->n_dirs > 1) {
        char e[512];
        bool direct;
        if ((rc = probe_store(dirs, p->n_dirs, bytes, &p->nvme_read_gbps, &p->nvme_write_gbps,
                              &p->nvme_write_burst_gbps,
                              &p->nvme_read_lat_ms, &p->nvme_write_lat_ms, &direct, e,
                              sizeof e)) < 0) {
            snprintf(err, errlen, "NVMe probe of %s: %s", opts->dirs, e);
            return rc;
        }
    }
    /* what the transfers cost the cores: a step's volume, not a burst (four
     * times the rates' bytes, 1 GiB, over all folders, where they have room) */
    uint64_t cost_bytes = 4 * bytes;
    if (p->nvme_free_bytes < 4 * cost_bytes)
        cost_bytes = bytes;
    char e[512];
    if ((rc = probe_io_cost(dirs, p->n_dirs, cost_bytes,
                            opts->threads > 0 ? opts->threads : fso_cpu_count(),
                            &p->nvme_read_cpu_s_per_gb, &p->nvme_write_cpu_s_per_gb, e,
                            sizeof e)) < 0) {
        snprintf(err, errlen, "NVMe probe of %s: %s", opts->dirs, e);
        return rc;
    }
    p->nvme_cpu_known = true;
    return 0;
}

/* The probes of the machine itself into p: copies, compute, collectives,
 * AdamW, and the memory available. */
static int probe_machine(fso_probe *p, const fso_probe_opts *opts, char *err, size_t errlen)
{
    fso_backend *be = NULL;
    int rc;
    p->threads = opts->threads > 0 ? opts->threads : fso_cpu_count();
    p->host_mem_bytes = fso_mem_available_bytes();
    char why[200] = "";
    if ((rc = fso_backend_create(&be, FSO_BACKEND_CPU, 0, p->threads, 0, why, sizeof why)) < 0) {
        snprintf(err, errlen, "cannot create the CPU backend: %s", why);
        return rc;
    }
    const size_t copy_bytes = (size_t)(64 * MIB);
    p->h2d_gbps = probe_copy(be, true, copy_bytes);
    p->d2h_gbps = probe_copy(be, false, copy_bytes);
    p->host_copy_gbps = p->h2d_gbps < p->d2h_gbps ? p->h2d_gbps : p->d2h_gbps;
    p->gflops = probe_gflops(be);
    fso_backend_destroy(be);
    p->coll_gbps = probe_coll(p->threads);
    p->adam_gelems = probe_adam(p->threads);
    snprintf(p->adam_isa, sizeof p->adam_isa, "%s", fso_isa_name(adam_isa()));
    if (p->h2d_gbps <= 0 || p->gflops <= 0 || p->coll_gbps <= 0 || p->adam_gelems <= 0) {
        snprintf(err, errlen, "probes: out of host memory");
        return -ENOMEM;
    }
    return 0;
}

/* What a probe of these folders with these threads would say first. */
static void probe_announce(const fso_probe_opts *opts, bool machine, bool folders)
{
    char tmp[4096];
    const char *dirs[FSO_STORE_MAX_DIRS];
    snprintf(tmp, sizeof tmp, "%s", opts->dirs ? opts->dirs : "");
    int n = fso_split_list(tmp, ',', dirs, FSO_STORE_MAX_DIRS);
    if (opts->quiet)
        return;
    if (machine)
        fprintf(stderr, "fsoff: probing this machine (%d NVMe folder%s, %d threads)...\n",
                folders ? n : 0, n == 1 && folders ? "" : "s",
                opts->threads > 0 ? opts->threads : fso_cpu_count());
    else if (folders)
        fprintf(stderr, "fsoff: probing %d NVMe folder%s...\n", n, n == 1 ? "" : "s");
}

/* ------------------------------------------------------------------ cache */

/* The cache (version 2) keeps each figure under what it depends on:
 *   "machines"  one entry per host and CPU model, keyed "host|cpu": copies,
 *               compute, collectives, AdamW, the memory available;
 *   "nvme"      one entry per host, CPU model and set of folders, keyed as
 *               fso_probe_key: the probe's rates and free space;
 *   "tuned"     one entry per the same key: what `fsoff bench tune` found
 *               for those folders;
 *   "layers"    one entry per host, CPU model and model shape timed (tokens,
 *               types, threads, instruction set): one layer's rate and the
 *               embedding's and head's times, for the planner on CPU devices.
 * A new folder is probed alone; the compute figures stay one per machine.
 * When the cache is written, this host's nvme and tuned entries whose
 * folders no longer exist are dropped. Every number read is checked
 * against its range: an integer its type cannot hold reads as missing, no
 * rate or latency is negative, and what the planner divides by is
 * positive; an entry that fails is incomplete, and measured again. */

/* key = "host|cpu|folders": the machine part "host|cpu" into m; the
 * folders (after the second '|'), "" when none. */
static const char *split_key(const char *key, char *m, size_t mlen)
{
    const char *bar = strchr(key, '|');
    bar = bar ? strchr(bar + 1, '|') : NULL;
    size_t n = bar ? (size_t)(bar - key) : strlen(key);
    snprintf(m, mlen, "%.*s", (int)n, key);
    return bar ? bar + 1 : "";
}

static json_t *machine_to_json(const fso_probe *p)
{
    char mkey[sizeof p->key];
    split_key(p->key, mkey, sizeof mkey);
    return json_pack("{s:s, s:I, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:s, s:f}", "key", mkey,
                     "when", (json_int_t)p->when, "threads", p->threads, "host_mem_bytes",
                     (json_int_t)p->host_mem_bytes, "h2d_gbps", p->h2d_gbps, "d2h_gbps",
                     p->d2h_gbps, "host_copy_gbps", p->host_copy_gbps, "coll_gbps",
                     p->coll_gbps, "adam_gelems", p->adam_gelems, "adam_isa", p->adam_isa,
                     "gflops", p->gflops);
}

static json_t *nvme_to_json(const fso_probe *p)
{
    json_t *dirs = json_array();
    for (int i = 0; i < p->n_dirs; i++)
        json_array_append_new(
            dirs, json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:b}", "path", p->dirs[i].path,
                            "read_gbps", p->dirs[i].read_gbps, "write_gbps",
                            p->dirs[i].write_gbps, "write_burst_gbps",
                            p->dirs[i].write_burst_gbps, "read_lat_ms", p->dirs[i].read_lat_ms,
                            "write_lat_ms", p->dirs[i].write_lat_ms, "free_bytes",
                            (json_int_t)p->dirs[i].free_bytes, "direct", p->dirs[i].direct));
    if (json_array_size(dirs) != (size_t)p->n_dirs) { /* a path that is not UTF-8 */
        json_decref(dirs);
        return NULL;
    }
    json_t *o = json_pack("{s:s, s:I, s:o, s:f, s:f, s:f, s:f, s:f, s:I}", "key", p->key,
                          "when", (json_int_t)p->when, "dirs", dirs, "read_gbps",
                          p->nvme_read_gbps, "write_gbps", p->nvme_write_gbps,
                          "write_burst_gbps", p->nvme_write_burst_gbps, "read_lat_ms",
                          p->nvme_read_lat_ms, "write_lat_ms", p->nvme_write_lat_ms,
                          "free_bytes", (json_int_t)p->nvme_free_bytes);
    if (o && p->nvme_cpu_known) {
        json_object_set_new(o, "read_cpu_s_per_gb", json_real(p->nvme_read_cpu_s_per_gb));
        json_object_set_new(o, "write_cpu_s_per_gb", json_real(p->nvme_write_cpu_s_per_gb));
    }
    return o;
}

static json_t *tuned_to_json(const fso_probe_tuned *t)
{
    return json_pack("{s:s, s:I, s:i, s:I, s:i, s:f, s:f, s:f, s:f}", "key", t->key, "when",
                     (json_int_t)t->when, "devices", t->devices, "block_bytes",
                     (json_int_t)t->block_bytes, "queue_depth", t->queue_depth, "read_gbps",
                     t->read_gbps, "write_gbps", t->write_gbps, "read_lat_ms", t->read_lat_ms,
                     "write_lat_ms", t->write_lat_ms);
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0;
}

/* The same as an integer type; 0 when out of its range (converting it would
 * be undefined), which the checks below treat as missing. */
static int num_int(json_t *o, const char *k)
{
    double v = num(o, k);
    return v > (double)INT_MIN - 1 && v < (double)INT_MAX + 1 ? (int)v : 0;
}

static int64_t num_i64(json_t *o, const char *k)
{
    double v = num(o, k);
    return v >= -0x1p63 && v < 0x1p63 ? (int64_t)v : 0;
}

static uint64_t num_u64(json_t *o, const char *k)
{
    double v = num(o, k);
    return v >= 0 && v < 0x1p64 ? (uint64_t)v : 0;
}

/* A machine entry into p's machine figures: 0, or -EINVAL when one is
 * missing or out of range. */
static int machine_from_json(json_t *o, void *out)
{
    fso_probe *p = out;
    p->when = num_i64(o, "when");
    p->threads = num_int(o, "threads");
    p->host_mem_bytes = num_u64(o, "host_mem_bytes");
    p->h2d_gbps = num(o, "h2d_gbps");
    p->d2h_gbps = num(o, "d2h_gbps");
    p->host_copy_gbps = num(o, "host_copy_gbps");
    p->coll_gbps = num(o, "coll_gbps");
    p->adam_gelems = num(o, "adam_gelems");
    const char *isa = json_string_value(json_object_get(o, "adam_isa"));
    snprintf(p->adam_isa, sizeof p->adam_isa, "%s", isa ? isa : ""); /* none: measured again */
    p->gflops = num(o, "gflops");
    /* the planner divides by these; no rate below 0 */
    if (p->threads < 1 || p->h2d_gbps <= 0 || p->gflops <= 0 || p->adam_gelems <= 0 ||
        p->coll_gbps <= 0 || p->d2h_gbps < 0 || p->host_copy_gbps < 0)
        return -EINVAL;
    return 0;
}

/* An nvme entry into p's folders and NVMe figures: 0, or -EINVAL. */
static int nvme_from_json(json_t *o, void *out)
{
    fso_probe *p = out;
    json_t *dirs = json_object_get(o, "dirs");
    if (!json_is_array(dirs) || json_array_size(dirs) == 0 ||
        json_array_size(dirs) > FSO_STORE_MAX_DIRS)
        return -EINVAL;
    p->n_dirs = (int)json_array_size(dirs);
    for (int i = 0; i < p->n_dirs; i++) {
        json_t *d = json_array_get(dirs, (size_t)i);
        fso_probe_dir *pd = &p->dirs[i];
        const char *path = json_string_value(json_object_get(d, "path"));
        if (!path || snprintf(pd->path, sizeof pd->path, "%s", path) >= (int)sizeof pd->path)
            return -EINVAL; /* a path fsoff cannot have written */
        pd->read_gbps = num(d, "read_gbps");
        pd->write_gbps = num(d, "write_gbps");
        pd->write_burst_gbps = num(d, "write_burst_gbps");
        pd->read_lat_ms = num(d, "read_lat_ms");
        pd->write_lat_ms = num(d, "write_lat_ms");
        pd->free_bytes = num_u64(d, "free_bytes");
        pd->direct = json_is_true(json_object_get(d, "direct"));
        if (pd->read_gbps < 0 || pd->write_gbps < 0 || pd->write_burst_gbps < 0 ||
            pd->read_lat_ms < 0 ||
            pd->write_lat_ms < 0)
            return -EINVAL;
    }
    p->nvme_read_gbps = num(o, "read_gbps");
    p->nvme_write_gbps = num(o, "write_gbps");
    p->nvme_write_burst_gbps = num(o, "write_burst_gbps");
    p->nvme_read_lat_ms = num(o, "read_lat_ms");
    p->nvme_write_lat_ms = num(o, "write_lat_ms");
    p->nvme_free_bytes = num_u64(o, "free_bytes");
    /* an entry without the cores' cost (an older fsoff's) loads without
     * it, and fso_probe_get measures its folders again */
    p->nvme_cpu_known = json_is_number(json_object_get(o, "read_cpu_s_per_gb")) &&
                        json_is_number(json_object_get(o, "write_cpu_s_per_gb"));
    p->nvme_read_cpu_s_per_gb = num(o, "read_cpu_s_per_gb");
    p->nvme_write_cpu_s_per_gb = num(o, "write_cpu_s_per_gb");
    if (p->nvme_read_cpu_s_per_gb < 0 || p->nvme_write_cpu_s_per_gb < 0)
        return -EINVAL;
    /* the planner divides by the rates and adds the latencies; an entry
     * without the burst rate (an older fsoff's) loads with none, and
     * fso_probe_get measures its folders again */
    if (p->nvme_read_gbps <= 0 || p->nvme_write_gbps <= 0 || p->nvme_write_burst_gbps < 0 || p->nvme_read_lat_ms < 0 ||
        p->nvme_write_lat_ms < 0)
        return -EINVAL;
    return 0;
}

static int tuned_from_json(json_t *o, void *out)
{
    fso_probe_tuned *t = out;
    const char *key = json_string_value(json_object_get(o, "key"));
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key ? key : "");
    t->when = num_i64(o, "when");
    t->devices = num_int(o, "devices");
    t->block_bytes = num_u64(o, "block_bytes");
    t->queue_depth = num_int(o, "queue_depth");
    t->read_gbps = num(o, "read_gbps");
    t->write_gbps = num(o, "write_gbps");
    t->read_lat_ms = num(o, "read_lat_ms");
    t->write_lat_ms = num(o, "write_lat_ms");
    /* the planner divides by the rates and adds the latencies; the request
     * size is an aio.block_size (at most 1 GiB); the figures are of one or
     * more rings */
    if (t->read_gbps <= 0 || t->write_gbps <= 0 || t->read_lat_ms < 0 || t->write_lat_ms < 0 ||
        t->block_bytes == 0 || t->block_bytes > ((uint64_t)1 << 30) || t->queue_depth < 1 ||
        t->devices < 1)
        return -EINVAL;
    return 0;
}

static json_t *layer_to_json(const fso_probe_layer *l)
{
    return json_pack("{s:s, s:I, s:f, s:f, s:f, s:f}", "key", l->key, "when", (json_int_t)l->when,
                     "gflops", l->gflops, "embed_fwd_ms", l->embed_fwd_ms, "head_ms", l->head_ms,
                     "embed_bwd_ms", l->embed_bwd_ms);
}

static int layer_from_json(json_t *o, void *out)
{
    fso_probe_layer *l = out;
    const char *key = json_string_value(json_object_get(o, "key"));
    memset(l, 0, sizeof *l);
    snprintf(l->key, sizeof l->key, "%s", key ? key : "");
    l->when = num_i64(o, "when");
    l->gflops = num(o, "gflops");
    l->embed_fwd_ms = num(o, "embed_fwd_ms");
    l->head_ms = num(o, "head_ms");
    l->embed_bwd_ms = num(o, "embed_bwd_ms");
    /* the planner divides by the rate; times are never negative */
    if (!(l->gflops > 0) || !(l->embed_fwd_ms >= 0) || !(l->head_ms >= 0) ||
        !(l->embed_bwd_ms >= 0))
        return -EINVAL;
    return 0;
}

/* The cache document, or NULL with rc -ENOENT (no file, or one an older
 * fsoff wrote: measured again and rewritten) / -EINVAL. */
static json_t *cache_read(const char *path, int *rc, char *err, size_t errlen)
{
    json_error_t je;
    if (access(path, F_OK) != 0) {
        *rc = -ENOENT;
        return NULL;
    }
    json_t *root = json_load_file(path, 0, &je);
    json_t *version = root ? json_object_get(root, "version") : NULL;
    if (json_is_integer(version) && json_integer_value(version) < CACHE_VERSION) {
        json_decref(root);
        *rc = -ENOENT;
        return NULL;
    }
    json_t *tuned = root ? json_object_get(root, "tuned") : NULL;
    json_t *layers = root ? json_object_get(root, "layers") : NULL;
    if (!root || !json_is_object(root) || json_integer_value(version) != CACHE_VERSION ||
        !json_is_array(json_object_get(root, "machines")) ||
        !json_is_array(json_object_get(root, "nvme")) || (tuned && !json_is_array(tuned)) ||
        (layers && !json_is_array(layers))) {
        snprintf(err, errlen, "%s: not an fsoff probe cache (%s); delete it or run fsoff plan "
                              "--probe to rewrite it", path, root ? "unexpected layout" : je.text);
        json_decref(root);
        *rc = -EINVAL;
        return NULL;
    }
    *rc = 0;
    return root;
}

/* The entry of arr whose "key" is key, or NULL; *index (when not NULL) is
 * its place. */
static json_t *find_entry(json_t *arr, const char *key, size_t *index)
{
    json_t *e;
    size_t i;
    json_array_foreach(arr, i, e) {
        const char *k = json_string_value(json_object_get(e, "key"));
        if (k && strcmp(k, key) == 0) {
            if (index)
                *index = i;
            return e;
        }
    }
    return NULL;
}

/* key's entry in the array `section` of root (read from path), parsed by
 * from into out: 0, -ENOENT (no such entry), -EINVAL (an incomplete entry:
 * the message names it and ends with `fix`). */
static int entry_get(json_t *root, const char *path, const char *section, const char *key,
                     int (*from)(json_t *o, void *out), void *out, const char *fix, char *err,
                     size_t errlen)
{
    json_t *e = find_entry(json_object_get(root, section), key, NULL);
    int rc = e ? from(e, out) : -ENOENT;
    if (rc == -EINVAL)
        snprintf(err, errlen, "%s: the %s entry for %s is incomplete or out of range; %s", path,
                 section, key, fix);
    return rc;
}

static const char probe_again[] = "run fsoff plan --probe to measure again";

/* What root holds for key: the machine's figures (*machine) and, for a key
 * with folders, theirs (*folders; true for a key without). 0, or -EINVAL
 * for an entry that is there but incomplete (message in err). */
static int cache_find(json_t *root, const char *path, const char *key, fso_probe *p,
                      bool *machine, bool *folders, char *err, size_t errlen)
{
    char mkey[sizeof p->key];
    const char *dirs = split_key(key, mkey, sizeof mkey);
    int rc = entry_get(root, path, "machines", mkey, machine_from_json, p, probe_again, err,
                       errlen);
    *machine = rc == 0;
    *folders = false;
    if (rc == -EINVAL)
        return rc;
    rc = dirs[0] ? entry_get(root, path, "nvme", key, nvme_from_json, p, probe_again, err, errlen)
                 : 0;
    *folders = rc == 0;
    return rc == -EINVAL ? rc : 0;
}

int fso_probe_cache_load(const char *path, const char *key, fso_probe *p, char *err,
                         size_t errlen)
{
    int rc;
    bool machine, folders;
    json_t *root = cache_read(path, &rc, err, errlen);
    if (!root)
        return rc;
    memset(p, 0, sizeof *p);
    snprintf(p->key, sizeof p->key, "%s", key);
    rc = cache_find(root, path, key, p, &machine, &folders, err, errlen);
    json_decref(root);
    return rc < 0 ? rc : machine && folders ? 0 : -ENOENT;
}

int fso_probe_tuned_load(const char *path, const char *key, fso_probe_tuned *t, char *err,
                         size_t errlen)
{
    int rc;
    json_t *root = cache_read(path, &rc, err, errlen);
    if (!root)
        return rc;
    rc = entry_get(root, path, "tuned", key, tuned_from_json, t, "run fsoff bench tune again",
                   err, errlen);
    json_decref(root);
    return rc;
}

int fso_probe_layer_load(const char *path, const char *key, fso_probe_layer *l, char *err,
                         size_t errlen)
{
    int rc;
    json_t *root = cache_read(path, &rc, err, errlen);
    if (!root)
        return rc;
    rc = entry_get(root, path, "layers", key, layer_from_json, l, probe_again, err, errlen);
    json_decref(root);
    return rc;
}

static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    return 0;
}

/* An nvme or tuned entry of this host one of whose folders (its key's, as
 * fso_probe_key resolved them) no longer exists: a temporary folder, a
 * drive unmounted. */
static bool stale(json_t *e, const char *host)
{
    const char *key = json_string_value(json_object_get(e, "key"));
    char mkey[2048], list[4096];
    const char *dirs[FSO_STORE_MAX_DIRS];
    size_t hl = strlen(host);
    if (!key || strncmp(key, host, hl) != 0 || key[hl] != '|')
        return false; /* another host's, sharing this home folder */
    snprintf(list, sizeof list, "%s", split_key(key, mkey, sizeof mkey));
    int n = fso_split_list(list, ',', dirs, FSO_STORE_MAX_DIRS);
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(dirs[i], &st) != 0 || !S_ISDIR(st.st_mode))
            return true;
    }
    return false;
}

/* The array `name` of root, created when missing. */
static json_t *section(json_t *root, const char *name)
{
    json_t *arr = json_object_get(root, name);
    if (!json_is_array(arr)) {
        arr = json_array();
        json_object_set_new(root, name, arr);
    }
    return arr;
}

/* Puts each of the n entries (stolen) into its section of the cache at
 * path, in place of the one with the same "key", and drops this host's
 * stale nvme and tuned entries; a missing, unreadable or older file starts
 * afresh. Written to a temporary file and renamed, so readers never see
 * half a file. 0 or -errno. */
static int cache_put(const char *path, const char *const *sections, json_t **entries, int n,
                     char *err, size_t errlen)
{
    char e2[512] = "", host[256] = "localhost", tmp[PATH_MAX + 16];
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (!entries[i])
            rc = -EINVAL;
    if (rc < 0) {
        snprintf(err, errlen, "%s: cannot record the figures: a folder or this machine's "
                              "name is not UTF-8 text", path);
        for (int i = 0; i < n; i++)
            json_decref(entries[i]);
        return rc;
    }
    json_t *root = cache_read(path, &rc, e2, sizeof e2);
    if (!root)
        root = json_pack("{s:i}", "version", CACHE_VERSION);
    const char *all[] = {"machines", "nvme", "tuned", "layers"};
    for (size_t s = 0; s < sizeof all / sizeof *all; s++)
        section(root, all[s]);
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    for (size_t s = 1; s <= 2; s++) { /* nvme and tuned: entries of folders */
        json_t *arr = section(root, all[s]);
        for (size_t i = json_array_size(arr); i-- > 0;)
            if (stale(json_array_get(arr, i), host))
                json_array_remove(arr, i);
    }
    for (int i = 0; i < n; i++) {
        json_t *arr = section(root, sections[i]);
        size_t at;
        if (find_entry(arr, json_string_value(json_object_get(entries[i], "key")), &at))
            json_array_remove(arr, at);
        json_array_append_new(arr, entries[i]);
    }
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    if ((rc = mkdirs(path)) < 0) {
        snprintf(err, errlen, "%s: cannot create its folder: %s", path, strerror(-rc));
    } else {
        errno = 0;
        if (json_dump_file(root, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0 ||
            rename(tmp, path) != 0) {
            rc = errno ? -errno : -EIO;
            snprintf(err, errlen, "%s: cannot write the probe cache: %s", path, strerror(-rc));
            unlink(tmp);
        }
    }
    json_decref(root);
    return rc;
}

int fso_probe_cache_save(const char *path, const fso_probe *p, char *err, size_t errlen)
{
    const char *sections[] = {"machines", "nvme"};
    json_t *entries[] = {machine_to_json(p), p->n_dirs > 0 ? nvme_to_json(p) : NULL};
    return cache_put(path, sections, entries, p->n_dirs > 0 ? 2 : 1, err, errlen);
}

int fso_probe_tuned_save(const char *path, const fso_probe_tuned *t, char *err, size_t errlen)
{
    const char *sections[] = {"tuned"};
    json_t *entries[] = {tuned_to_json(t)};
    return cache_put(path, sections, entries, 1, err, errlen);
}

int fso_probe_layer_save(const char *path, const fso_probe_layer *l, char *err, size_t errlen)
{
    const char *sections[] = {"layers"};
    json_t *entries[] = {layer_to_json(l)};
    return cache_put(path, sections, entries, 1, err, errlen);
}

/* The tuned figures for p's folders, if `fsoff bench tune` left any. */
static void apply_tuned(fso_probe *p, const char *path)
{
    fso_probe_tuned t;
    char e[512];
    if (p->n_dirs == 0 || fso_probe_tuned_load(path, p->key, &t, e, sizeof e) < 0)
        return;
    p->nvme_read_gbps = t.read_gbps;
    p->nvme_write_gbps = t.write_gbps;
    p->nvme_read_lat_ms = t.read_lat_ms;
    p->nvme_write_lat_ms = t.write_lat_ms;
    p->nvme_tuned = true;
    p->nvme_tuned_devices = t.devices;
}

int fso_probe_get(fso_probe *p, const fso_probe_opts *opts, bool refresh, bool *probed,
                  char *err, size_t errlen)
{
    char path[PATH_MAX], e[512];
    bool have_path = fso_probe_cache_path(path, sizeof path) == 0;
    bool machine = false, folders = false;
    int rc;
    *probed = false;
    memset(p, 0, sizeof *p);
    fso_probe_key(p->key, sizeof p->key, opts->dirs);
    if (have_path && !refresh) {
        json_t *root = cache_read(path, &rc, e, sizeof e);
        if (root) /* an entry that is missing or incomplete is measured again */
            cache_find(root, path, p->key, p, &machine, &folders, e, sizeof e);
        json_decref(root);
        if (folders && p->n_dirs > 0 && (p->nvme_write_burst_gbps <= 0 || !p->nvme_cpu_known))
            folders = false; /* written by an fsoff that did not time the burst or the cost */
    }
    /* a machine known with AdamW's rate of another instruction set: that
     * rate alone is measured again */
    const bool adam = machine && strcmp(p->adam_isa, fso_isa_name(adam_isa())) != 0;
    if (!machine || !folders || adam) {
        /* measure what the cache lacks: the folders alone when the machine is known */
        probe_announce(opts, !machine, !folders);
        if (adam && !opts->quiet)
            fprintf(stderr, "fsoff: probing AdamW with %s (the cache holds its rate with %s)...\n",
                    fso_isa_name(adam_isa()), p->adam_isa[0] ? p->adam_isa : "another");
        if (!folders && (rc = probe_folders(p, opts, err, errlen)) < 0)
            return rc;
        if (!machine && (rc = probe_machine(p, opts, err, errlen)) < 0)
            return rc;
        if (adam) {
            if ((p->adam_gelems = probe_adam(p->threads)) <= 0) {
                snprintf(err, errlen, "probes: out of host memory");
                return -ENOMEM;
            }
            snprintf(p->adam_isa, sizeof p->adam_isa, "%s", fso_isa_name(adam_isa()));
        }
        p->when = (int64_t)time(NULL);
        *probed = true;
        if (have_path && fso_probe_cache_save(path, p, e, sizeof e) < 0)
            fprintf(stderr, "fsoff: warning: %s; the probes will run again next time\n", e);
    }
    if (have_path)
        apply_tuned(p, path);
    return 0;
}
