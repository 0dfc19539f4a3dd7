/* boxes.c — several boxes under mpirun or srun (boxes.h): MPI's start and
 * end, the boxes' host names, the heartbeat, the rails, and the bounded
 * waits on the main thread.
 *
 * The state is one static: MPI's own state is process-wide, and so is the
 * heartbeat that describes it. Main-thread waits (sum, bcast, barrier,
 * agree) run over a rail of their own (`main`), so they are bounded and
 * name the quiet box as the device rails do.
 *
 * The heartbeat thread sends this box's phase (fso_boxes_phase) to every
 * other box about once a second on its own communicator, and records when
 * each box was last heard from and what it said; a rail that times out asks
 * it (coll_mpi.h) to describe the box it waits for.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "boxes.h"
#include "coll_mpi.h"
#include "fso_build.h"
#include "gpu_info.h"
#include "store.h"
#include "util.h"

#if FSO_HAVE_MPI
#include <mpi.h>
#endif
#if FSO_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define HOST_LEN 64
#define PHASE_LEN 48
#define HEARTBEAT_MS 1000.0

struct hb_msg {
    int64_t step;
    int32_t block;
    int32_t pad;
    char phase[PHASE_LEN];
};

static struct {
    int mpi;                  /* 1: this process initialised MPI */
    int boxes, self;
    char (*hosts)[HOST_LEN];
    double timeout_s;
    fso_coll *main;           /* the main thread's waits */
    double net_gbps;          /* what device 0's rail sent per second when made (GB/s) */
    pthread_mutex_t lock;     /* guards mine, peers, seen_ms */
    struct hb_msg mine;
    struct hb_msg *peers;     /* last heard from each box */
    double *seen_ms;          /* when (fso_now_ms), or the start */
    int *heard;
    double start_ms;
    pthread_t hb_thread;
    int hb_running;
    atomic_int hb_stop;
#if FSO_HAVE_MPI
    MPI_Comm hb_comm;
#endif
} g = {
    .boxes = 1,
    .timeout_s = FSO_BOXES_TIMEOUT_S,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .mine = {.step = -1, .block = -1},
};

int fso_boxes_count(void)
{
    return g.boxes;
}

int fso_boxes_self(void)
{
    return g.self;
}

const char *fso_boxes_host(int box)
{
    if (!g.hosts || box < 0 || box >= g.boxes)
        return "?";
    return g.hosts[box];
}

void fso_boxes_set_timeout(double seconds)
{
    if (seconds > 0) {
        g.timeout_s = seconds;
        fso_coll_mpi_set_timeout(g.main, seconds);
    }
}

double fso_boxes_timeout_s(void)
{
    return g.timeout_s;
}

void fso_boxes_phase(const char *what, int64_t step, int block)
{
    pthread_mutex_lock(&g.lock);
    snprintf(g.mine.phase, sizeof g.mine.phase, "%s", what ? what : "");
    g.mine.step = step;
    g.mine.block = block;
    pthread_mutex_unlock(&g.lock);
}

#if FSO_HAVE_MPI
/* What a heartbeat says, for a message: "step 12, reduce-scatter of block 3". */
static void phase_text(const struct hb_msg *m, char *buf, size_t len)
{
    char step[32] = "", block[32] = "";
    if (m->step >= 0)
        snprintf(step, sizeof step, "step %" PRId64 ", ", m->step);
    if (m->block >= 0)
        snprintf(block, sizeof block, " of block %d", (int)m->block);
    snprintf(buf, len, "%s%s%s", step, m->phase[0] ? m->phase : "starting", block);
}

/* coll_mpi.h's describe: what the heartbeat knows of `box`. */
static void describe(int box, char *buf, size_t len)
{
    if (box < 0 || box >= g.boxes || !g.peers) {
        snprintf(buf, len, "box %d", box);
        return;
    }
    pthread_mutex_lock(&g.lock);
    struct hb_msg m = g.peers[box];
    double age_s = (fso_now_ms() - g.seen_ms[box]) / 1000.0;
    int heard = g.heard[box];
    pthread_mutex_unlock(&g.lock);
    char last[PHASE_LEN + 64];
    phase_text(&m, last, sizeof last);
    if (!heard)
        snprintf(buf, len, "box %d (host %s): no heartbeat since the start, %.0f s ago", box,
                 fso_boxes_host(box), age_s);
    else if (age_s < 3 * HEARTBEAT_MS / 1000.0)
        snprintf(buf, len, "box %d (host %s): alive (heartbeat %.1f s ago) but elsewhere; "
                 "last: %s", box, fso_boxes_host(box), age_s, last);
    else
        snprintf(buf, len, "box %d (host %s): no heartbeat for %.0f s; last: %s", box,
                 fso_boxes_host(box), age_s, last);
}
#endif

/* The launcher's process count, from the environment it sets: Open MPI's
 * mpirun, a PMI launcher (MPICH's hydra, Slurm's pmi2), srun (a job step:
 * SLURM_STEP_NUM_TASKS, else SLURM_NTASKS with SLURM_PROCID; a batch
 * script's own environment has SLURM_NTASKS without being a step of that
 * many processes, so SLURM_PROCID is required), PMIx (size unknown here:
 * 0). 1 without a launcher. */
static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

int fso_boxes_launcher_check(char *const *envp, bool have_mpi, char *err, size_t errlen)
{
    static const struct {
        const char *size, *needs, *who;
    } launchers[] = {
        {"OMPI_COMM_WORLD_SIZE", NULL, "mpirun"},
        {"PMI_SIZE", NULL, "an MPI launcher (PMI)"},
        {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"},
        {"SLURM_NTASKS", "SLURM_PROCID", "srun"},
    };
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const char *v = env_get(envp, launchers[i].size);
        if (!v || (launchers[i].needs && !env_get(envp, launchers[i].needs)))
            continue;
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (end == v || *end || n < 1) {
            snprintf(err, errlen, "%s=%s: expected a process count; unset it or start fsoff "
                     "with %s", launchers[i].size, v, launchers[i].who);
            return -EINVAL;
        }
        if (n > 1 && !have_mpi) {
            snprintf(err, errlen, "started by %s with %ld processes, but this fsoff was built "
                     "without MPI: install libopenmpi-dev and run meson setup --reconfigure "
                     "-Dmpi=enabled", launchers[i].who, n);
            return -ENOTSUP;
        }
        return (int)(n > 1 ? n : 1);
    }
    if (env_get(envp, "PMIX_RANK") && have_mpi)
        return 0;
    return 1;
}

static int gather_bytes(const char *what, const void *buf, size_t len, void *all, char *err,
                        size_t errlen);

#if FSO_HAVE_MPI

static void *heartbeat(void *arg)
{
    (void)arg;
    const int B = g.boxes;
    struct hb_msg *rx = calloc((size_t)B, sizeof *rx), *tx = calloc((size_t)B, sizeof *tx);
    MPI_Request *rreq = malloc(sizeof *rreq * (size_t)B), *sreq = malloc(sizeof *sreq * (size_t)B);
    if (!rx || !tx || !rreq || !sreq)
        goto out;
    for (int k = 0; k < B; k++) {
        rreq[k] = sreq[k] = MPI_REQUEST_NULL;
        if (k != g.self)
            MPI_Irecv(&rx[k], sizeof rx[k], MPI_BYTE, k, 1, g.hb_comm, &rreq[k]);
    }
    double last_sent = -1e30;
    while (!atomic_load(&g.hb_stop)) {
        for (int k = 0; k < B; k++) {
            int done = 0;
            if (rreq[k] == MPI_REQUEST_NULL ||
                MPI_Test(&rreq[k], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done)
                continue;
            pthread_mutex_lock(&g.lock);
            g.peers[k] = rx[k];
            g.peers[k].phase[PHASE_LEN - 1] = 0;
            g.seen_ms[k] = fso_now_ms();
            g.heard[k] = 1;
            pthread_mutex_unlock(&g.lock);
            MPI_Irecv(&rx[k], sizeof rx[k], MPI_BYTE, k, 1, g.hb_comm, &rreq[k]);
        }
        double now = fso_now_ms();
        if (now - last_sent >= HEARTBEAT_MS) {
            last_sent = now;
            for (int k = 0; k < B; k++) {
                int done = 1;
                if (k == g.self)
                    continue;
                if (sreq[k] != MPI_REQUEST_NULL)
                    MPI_Test(&sreq[k], &done, MPI_STATUS_IGNORE);
                if (!done)
                    continue; /* that box is not taking them: no pile-up */
                pthread_mutex_lock(&g.lock);
                tx[k] = g.mine;
                pthread_mutex_unlock(&g.lock);
                MPI_Isend(&tx[k], sizeof tx[k], MPI_BYTE, k, 1, g.hb_comm, &sreq[k]);
            }
        }
        struct timespec nap = {0, 50 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    for (int k = 0; k < B; k++) {
        if (rreq[k] != MPI_REQUEST_NULL) {
            MPI_Cancel(&rreq[k]);
            MPI_Wait(&rreq[k], MPI_STATUS_IGNORE);
        }
        /* a send to a box that stopped may never finish: give it a moment */
        for (int tries = 0; sreq[k] != MPI_REQUEST_NULL && tries < 20; tries++) {
            int done = 0;
            MPI_Test(&sreq[k], &done, MPI_STATUS_IGNORE);
            if (!done) {
                struct timespec nap = {0, 10 * 1000 * 1000};
                nanosleep(&nap, NULL);
            }
        }
        if (sreq[k] != MPI_REQUEST_NULL)
            MPI_Request_free(&sreq[k]);
    }
out:
    free(rx);
    free(tx);
    free(rreq);
    free(sreq);
    return NULL;
}

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}

extern char **environ;

int fso_boxes_init(int *argc, char ***argv, char *err, size_t errlen)
{
    int n = fso_boxes_launcher_check(environ, true, err, errlen);
    if (n < 0)
        return n;
    if (n == 1)
        return 0;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init_thread failed: check the launcher's output above");
        return -EIO;
    }
    g.mpi = 1;
    if (provided < MPI_THREAD_MULTIPLE) {
        snprintf(err, errlen, "this MPI library gives %s, and fsoff needs MPI_THREAD_MULTIPLE "
                 "(each device's rail runs from its own thread): use an Open MPI built with "
                 "thread support (ompi_info | grep THREAD_MULTIPLE)", level_name(provided));
        MPI_Finalize();
        g.mpi = 0;
        return -ENOTSUP;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &g.boxes);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.self);
    if (g.boxes > FSO_MAX_DEVICES) {
        snprintf(err, errlen, "started with %d processes; fsoff joins at most %d boxes",
                 g.boxes, FSO_MAX_DEVICES);
        return -E2BIG;
    }
    g.start_ms = fso_now_ms();
    g.hosts = calloc((size_t)g.boxes, sizeof *g.hosts);
    g.peers = calloc((size_t)g.boxes, sizeof *g.peers);
    g.seen_ms = calloc((size_t)g.boxes, sizeof *g.seen_ms);
    g.heard = calloc((size_t)g.boxes, sizeof *g.heard);
    if (!g.hosts || !g.peers || !g.seen_ms || !g.heard) {
        snprintf(err, errlen, "out of host memory for %d boxes", g.boxes);
        return -ENOMEM;
    }
    for (int k = 0; k < g.boxes; k++) {
        g.seen_ms[k] = g.start_ms;
        g.peers[k].step = -1;
        g.peers[k].block = -1;
    }
    int rc = fso_coll_create_mpi(&g.main, &(MPI_Comm){MPI_COMM_WORLD}, g.timeout_s);
    if (rc) {
        snprintf(err, errlen, "cannot make the boxes' main communicator: %s", strerror(-rc));
        return rc;
    }
    if (MPI_Comm_dup(MPI_COMM_WORLD, &g.hb_comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "cannot make the boxes' heartbeat communicator");
        return -EIO;
    }
    MPI_Comm_set_errhandler(g.hb_comm, MPI_ERRORS_RETURN);
    fso_coll_mpi_set_describe(describe);
    if (pthread_create(&g.hb_thread, NULL, heartbeat, NULL) != 0) {
        snprintf(err, errlen, "cannot start the heartbeat thread");
        return -EAGAIN;
    }
    g.hb_running = 1;
    char name[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    MPI_Get_processor_name(name, &len);
    snprintf(g.hosts[g.self], HOST_LEN, "%s", name);
    return gather_bytes("the boxes' host names", g.hosts[g.self], HOST_LEN, g.hosts, err,
                        errlen);
}

void fso_boxes_finalize(void)
{
    if (!g.mpi)
        return;
    if (g.hb_running) {
        atomic_store(&g.hb_stop, 1);
        pthread_join(g.hb_thread, NULL);
        g.hb_running = 0;
    }
    fso_coll_mpi_set_describe(NULL);
    fso_coll_destroy(g.main);
    g.main = NULL;
    MPI_Finalize();
    g.mpi = 0;
    free(g.hosts);
    free(g.peers);
    free(g.seen_ms);
    free(g.heard);
    g.hosts = NULL;
    g.peers = NULL;
    g.seen_ms = NULL;
    g.heard = NULL;
    g.boxes = 1;
    g.self = 0;
}

_Noreturn void fso_boxes_abort(const char *why, int code)
{
    if (why)
        fprintf(stderr, "%s\n", why);
    fflush(stderr);
    fso_store_unlink_created(); /* MPI_Abort ends the process without its cleanup */
    if (g.mpi)
        MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

#else

int fso_boxes_init(int *argc, char ***argv, char *err, size_t errlen)
{
    (void)argc;
    (void)argv;
    extern char **environ;
    int n = fso_boxes_launcher_check(environ, false, err, errlen);
    return n < 0 ? n : 0;
}

void fso_boxes_finalize(void)
{
}

_Noreturn void fso_boxes_abort(const char *why, int code)
{
    if (why)
        fprintf(stderr, "%s\n", why);
    fso_store_unlink_created();
    exit(code);
}

#endif

/* The main rail's error with `what` in front. */
static int main_failed(const char *what, int rc, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", what, g.main && g.main->err[0] ? g.main->err
                                                                    : strerror(-rc));
    return rc;
}

int fso_boxes_sum(const char *what, double *v, int n, char *err, size_t errlen)
{
    if (g.boxes == 1 || n <= 0)
        return 0;
    int rc = g.main->ops->all_reduce_f64(g.main, g.self, v, (size_t)n);
    return rc ? main_failed(what, rc, err, errlen) : 0;
}

int fso_boxes_barrier(const char *what, char *err, size_t errlen)
{
    if (g.boxes == 1)
        return 0;
    int rc = g.main->ops->barrier(g.main, g.self);
    return rc ? main_failed(what, rc, err, errlen) : 0;
}

/* All boxes' `len` bytes, box k's at all + k*len (len the same on every
 * box: the callers exchange lengths first). */
static int gather_bytes(const char *what, const void *buf, size_t len, void *all, char *err,
                        size_t errlen)
{
    if (g.boxes == 1) {
        memcpy(all, buf, len);
        return 0;
    }
    /* all-gather counts elements of a dtype: bytes go as bf16 pairs, padded */
    size_t pairs = (len + 1) / 2;
    char *tmp = calloc((size_t)g.boxes, pairs * 2 + 2);
    if (!tmp) {
        snprintf(err, errlen, "%s: out of host memory", what);
        return -ENOMEM;
    }
    memcpy(tmp + (size_t)g.self * pairs * 2, buf, len);
    int rc = g.main->ops->all_gather(g.main, g.self, tmp + (size_t)g.self * pairs * 2, tmp,
                                     pairs, FSO_DT_BF16, 0);
    if (!rc)
        for (int k = 0; k < g.boxes; k++)
            memcpy((char *)all + (size_t)k * len, tmp + (size_t)k * pairs * 2, len);
    free(tmp);
    return rc ? main_failed(what, rc, err, errlen) : 0;
}

/* A gather that keeps box 0's bytes: what is broadcast is small (ids,
 * tokens, a check's verdict), and the gather's point-to-point messages name
 * a box that does not come. */
int fso_boxes_bcast(const char *what, void *buf, size_t len, char *err, size_t errlen)
{
    if (g.boxes == 1 || len == 0)
        return 0;
    char *all = malloc(len * (size_t)g.boxes);
    if (!all) {
        snprintf(err, errlen, "%s: out of host memory", what);
        return -ENOMEM;
    }
    int rc = gather_bytes(what, buf, len, all, err, errlen);
    if (!rc)
        memcpy(buf, all, len);
    free(all);
    return rc;
}

/* Two FNV-1a 64-bit hashes with different starts: 128 bits that tell
 * files and builds apart (no adversary here). */
void fso_boxes_hash(const void *buf, size_t len, uint64_t h[2])
{
    const unsigned char *p = buf;
    uint64_t a = h[0] ? h[0] : 0xcbf29ce484222325ull, b = h[1] ? h[1] : 0x84222325cbf29ce4ull;
    for (size_t i = 0; i < len; i++) {
        a = (a ^ p[i]) * 0x100000001b3ull;
        b = (b ^ p[i]) * 0x100000001b3ull;
        b ^= b >> 29;
    }
    h[0] = a;
    h[1] = b;
}

/* The first line where two texts differ, quoted, at most 120 bytes. */
static void first_line_diff(const char *a, size_t alen, const char *b, size_t blen, char *out,
                            size_t outlen)
{
    size_t i = 0, line = 1, start = 0;
    while (i < alen && i < blen && a[i] == b[i]) {
        if (a[i] == '\n') {
            line++;
            start = i + 1;
        }
        i++;
    }
    size_t ae = start, be = start;
    while (ae < alen && a[ae] != '\n')
        ae++;
    while (be < blen && b[be] != '\n')
        be++;
    int al = (int)(ae - start > 120 ? 120 : ae - start);
    int bl = (int)(be - start > 120 ? 120 : be - start);
    snprintf(out, outlen, "line %zu: \"%.*s\" against box 0's \"%.*s\"", line, bl,
             b + start, al, a + start);
}

#define TEXT_EXCHANGE_MAX (64u * 1024u)

/* Every box's `len` (they may differ), then the bytes themselves when every
 * box's are short, else a hash; the first box that differs from box 0 is
 * named, with the first differing line when the bytes are text. */
static int agree_detail(const char *what, const void *buf, size_t len, bool say_line, char *err,
                        size_t errlen)
{
    if (g.boxes == 1)
        return 0;
    const int B = g.boxes;
    uint64_t *lens = calloc((size_t)B, sizeof *lens);
    uint64_t mylen = len;
    if (!lens) {
        snprintf(err, errlen, "%s: out of host memory", what);
        return -ENOMEM;
    }
    int rc = gather_bytes(what, &mylen, sizeof mylen, lens, err, errlen);
    if (rc) {
        free(lens);
        return rc;
    }
    uint64_t maxlen = 0;
    for (int k = 0; k < B; k++)
        maxlen = lens[k] > maxlen ? lens[k] : maxlen;
    bool whole = maxlen <= TEXT_EXCHANGE_MAX;
    size_t piece = whole ? (size_t)maxlen : 2 * sizeof(uint64_t);
    char *mine = calloc(1, piece + 1), *all = calloc((size_t)B, piece + 1);
    if (!mine || !all) {
        free(lens);
        free(mine);
        free(all);
        snprintf(err, errlen, "%s: out of host memory", what);
        return -ENOMEM;
    }
    if (whole) {
        memcpy(mine, buf, len);
    } else {
        uint64_t h[2] = {0, 0};
        fso_boxes_hash(buf, len, h);
        memcpy(mine, h, sizeof h);
    }
    rc = gather_bytes(what, mine, piece, all, err, errlen);
    int bad = -1;
    for (int k = 1; k < B && !rc && bad < 0; k++)
        if (lens[k] != lens[0] || memcmp(all, all + (size_t)k * piece, piece) != 0)
            bad = k;
    if (bad > 0) {
        char detail[400] = "";
        const char *a = all, *b = all + (size_t)bad * piece;
        if (whole && say_line && !memchr(a, 0, lens[0]) && !memchr(b, 0, lens[bad]))
            first_line_diff(a, lens[0], b, lens[bad], detail, sizeof detail);
        else
            snprintf(detail, sizeof detail, "%" PRIu64 " bytes against box 0's %" PRIu64,
                     lens[bad], lens[0]);
        snprintf(err, errlen, "%s differs between boxes: box %d (host %s) has %s (host %s)",
                 what, bad, fso_boxes_host(bad), detail, fso_boxes_host(0));
        rc = -EINVAL;
    }
    free(lens);
    free(mine);
    free(all);
    return rc;
}

int fso_boxes_agree(const char *what, const void *buf, size_t len, char *err, size_t errlen)
{
    return agree_detail(what, buf, len, false, err, errlen);
}

int fso_boxes_check_bytes(const char *what, const void *buf, size_t len, char *err,
                          size_t errlen)
{
    return agree_detail(what, buf, len, true, err, errlen);
}

#if FSO_HAVE_MPI
/* MPI's communicator of every box, for the rails to duplicate. */
static int world_rail(fso_coll **out, char *err, size_t errlen, const char *which, int dev)
{
    int rc = fso_coll_create_mpi(out, &(MPI_Comm){MPI_COMM_WORLD}, g.timeout_s);
    if (rc)
        snprintf(err, errlen, "device %d's %s rail: cannot make its communicator: %s", dev,
                 which, strerror(-rc));
    return rc;
}
#endif

#if FSO_HAVE_MPI
/* The rate a rail sends at (fso_boxes_net_gbps): the best of three
 * all-gathers of 8 MiB from every box, each box sending (B-1) slices. */
static int time_rail(fso_coll *c, char *err, size_t errlen)
{
    const size_t slice = (size_t)8 << 20;
    char *buf = malloc(slice * (size_t)g.boxes);
    if (!buf) {
        snprintf(err, errlen, "out of host memory timing the rails");
        return -ENOMEM;
    }
    memset(buf, 0, slice * (size_t)g.boxes);
    double best = 0;
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        const double t0 = fso_now_ms();
        rc = c->ops->all_gather(c, g.self, buf + slice * (size_t)g.self, buf, slice / 4,
                                FSO_DT_F32, 0);
        const double ms = fso_now_ms() - t0;
        if (rc == 0 && ms > 0 && (best == 0 || ms < best))
            best = ms;
    }
    free(buf);
    if (rc < 0) {
        snprintf(err, errlen, "timing the rails: %s", c->err);
        return rc;
    }
    g.net_gbps = best > 0 ? (double)slice * (g.boxes - 1) / (best * 1e6) : 0;
    return 0;
}
#endif

double fso_boxes_net_gbps(void)
{
    return g.boxes > 1 ? g.net_gbps : 0;
}

#if FSO_HAVE_CUDA && FSO_HAVE_MPI
/* Whether one GPU serves two boxes (same host, same PCI bus id): NCCL
 * refuses two ranks of one communicator on one GPU. *why says which. */
static int gpu_shared(int devices, bool *shared, char *why, size_t whylen, char *err,
                      size_t errlen)
{
    const int B = g.boxes;
    char(*mine)[32] = calloc((size_t)devices, 32);
    char(*all)[32] = calloc((size_t)devices * (size_t)B, 32);
    int rc = mine && all ? 0 : -ENOMEM;
    if (rc)
        snprintf(err, errlen, "out of host memory comparing the boxes' GPUs");
    for (int d = 0; d < devices && !rc; d++) {
        fso_gpu_info gi;
        char gerr[256];
        if ((rc = fso_gpu_info_query(d, &gi, gerr, sizeof gerr)) < 0)
            snprintf(err, errlen, "CUDA device %d: %s", d, gerr);
        else
            snprintf(mine[d], 32, "%s", gi.pci_bus_id);
    }
    if (!rc)
        rc = gather_bytes("the boxes' GPUs", mine, (size_t)devices * 32, all, err, errlen);
    *shared = false;
    for (int a = 0; a < B && !rc && !*shared; a++)
        for (int b = a + 1; b < B && !*shared; b++)
            for (int d = 0; d < devices && !*shared; d++)
                for (int e = 0; e < devices && !*shared; e++)
                    if (strcmp(fso_boxes_host(a), fso_boxes_host(b)) == 0 &&
                        strcmp(all[(size_t)a * devices + d], all[(size_t)b * devices + e]) == 0) {
                        *shared = true;
                        snprintf(why, whylen, "boxes %d and %d share GPU %s on host %s", a, b,
                                 all[(size_t)a * devices + d], fso_boxes_host(a));
                    }
    free(mine);
    free(all);
    return rc;
}

/* The NCCL rails of every device: box 0 makes two ids per device, MPI
 * hands them out, and every box makes its ends in the same order. */
static int nccl_rails(int devices, fso_rails *out, char *err, size_t errlen)
{
    const size_t n = (size_t)2 * devices * FSO_NCCL_ID_BYTES;
    unsigned char *ids = calloc(1, n);
    if (!ids) {
        snprintf(err, errlen, "out of host memory for NCCL's ids");
        return -ENOMEM;
    }
    int rc = 0;
    char why[512] = "";
    for (int i = 0; i < 2 * devices && g.self == 0 && !rc; i++)
        rc = fso_nccl_rail_id(ids + (size_t)i * FSO_NCCL_ID_BYTES, why, sizeof why);
    /* box 0's failure reaches the others as its flag, not as a wait */
    double failed = rc ? 1 : 0;
    int src = fso_boxes_sum("NCCL's ids", &failed, 1, err, errlen);
    if (src)
        rc = src;
    else if (failed > 0) {
        snprintf(err, errlen, "box 0 (host %s) could not make NCCL's ids%s%s; set comm.rails "
                 "to \"mpi\" to meet over MPI through host memory", fso_boxes_host(0),
                 why[0] ? ": " : "", why);
        rc = -EIO;
    }
    if (!rc)
        rc = fso_boxes_bcast("NCCL's ids", ids, n, err, errlen);
    for (int d = 0; d < devices && !rc; d++) {
        fso_coll **ends[2] = {&out->grad_dev[d], &out->param_dev[d]};
        for (int k = 0; k < 2 && !rc; k++) {
            rc = fso_coll_create_nccl_rail(ends[k], d, g.boxes, g.self,
                                           ids + (size_t)(2 * d + k) * FSO_NCCL_ID_BYTES,
                                           g.timeout_s, describe, why, sizeof why);
            if (rc)
                snprintf(err, errlen, "CUDA device %d's %s rail over NCCL: %s; set comm.rails "
                         "to \"mpi\" to meet over MPI through host memory", d,
                         k ? "parameter" : "gradient", why);
        }
    }
    free(ids);
    return rc;
}
#endif

int fso_boxes_rails(int devices, bool cuda, fso_rails_kind rails, fso_rails *out, char *err,
                    size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->box = g.self;
    out->boxes = g.boxes;
    if (g.boxes == 1)
        return 0;
    if (devices < 1 || devices > FSO_MAX_DEVICES) {
        snprintf(err, errlen, "rails for %d devices: expected 1 to %d", devices,
                 FSO_MAX_DEVICES);
        return -EINVAL;
    }
    /* every box's devices and their kind, against box 0's */
    const int B = g.boxes;
    int32_t mine[2] = {devices, cuda ? 1 : 0};
    int32_t *all = calloc((size_t)B, sizeof mine);
    if (!all) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    int rc = gather_bytes("the boxes' devices", mine, sizeof mine, all, err, errlen);
    for (int k = 1; k < B && !rc; k++) {
        if (all[2 * k + 1] != all[1]) {
            int gpu = all[1] ? 0 : k, cpu = all[1] ? k : 0;
            snprintf(err, errlen, "box %d (host %s) trains on GPUs and box %d (host %s) on CPU "
                     "devices: every box needs the same kind of devices", gpu,
                     fso_boxes_host(gpu), cpu, fso_boxes_host(cpu));
            rc = -EINVAL;
        } else if (all[2 * k] != all[0]) {
            snprintf(err, errlen, "box %d (host %s) has %d devices and box 0 (host %s) %d: "
                     "every box needs the same number of devices", k, fso_boxes_host(k),
                     all[2 * k], fso_boxes_host(0), all[0]);
            rc = -EINVAL;
        }
    }
    free(all);
    if (rc)
        return rc;
    /* every device meets on MPI rails over host memory; GPUs also on NCCL
     * rails over their own memory, for the shards that live there
     * (engine/zero/zero_rail.h) */
#if FSO_HAVE_MPI
    for (int d = 0; d < devices && !rc; d++) {
        rc = world_rail(&out->grad[d], err, errlen, "gradient", d);
        if (!rc)
            rc = world_rail(&out->param[d], err, errlen, "parameter", d);
    }
    out->devices = devices;
    if (!rc)
        rc = time_rail(out->param[0], err, errlen);
    if (!rc && cuda) {
#if FSO_HAVE_CUDA
        bool shared = false;
        char why[256] = "";
        if (rails != FSO_RAILS_MPI)
            rc = gpu_shared(devices, &shared, why, sizeof why, err, errlen);
        if (!rc && shared && rails == FSO_RAILS_NCCL) {
            snprintf(err, errlen, "comm.rails is \"nccl\", but %s, and NCCL refuses two ranks "
                     "of one communicator on one GPU: give each box its own GPUs, or set "
                     "comm.rails to \"auto\" or \"mpi\"", why);
            rc = -EINVAL;
        } else if (!rc && (shared || rails == FSO_RAILS_MPI)) {
            snprintf(out->note, sizeof out->note, "rails: MPI, through host memory (%s)",
                     shared ? why : "comm.rails \"mpi\"");
        } else if (!rc) {
            rc = nccl_rails(devices, out, err, errlen);
            if (!rc)
                snprintf(out->note, sizeof out->note,
                         "rails: NCCL for the shards on the GPUs, MPI for those in host "
                         "memory or on NVMe");
        }
#else
        snprintf(err, errlen, "this fsoff was built without CUDA, so its boxes cannot train "
                 "on GPUs");
        rc = -ENOTSUP;
#endif
    }
    if (rc)
        fso_boxes_rails_free(out);
    return rc;
#else
    snprintf(err, errlen, "this fsoff was built without MPI");
    return -ENOTSUP;
#endif
}

void fso_boxes_rails_free(fso_rails *r)
{
    if (!r)
        return;
    for (int d = 0; d < FSO_MAX_DEVICES; d++) {
        fso_coll_destroy(r->grad_dev[d]);
        fso_coll_destroy(r->param_dev[d]);
        fso_coll_destroy(r->grad[d]);
        fso_coll_destroy(r->param[d]);
        r->grad[d] = r->param[d] = r->grad_dev[d] = r->param_dev[d] = NULL;
    }
    r->devices = 0;
}
