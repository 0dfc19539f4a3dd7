/* test_boxes.c — several boxes (engine/boxes.h, kernels/coll_mpi.c).
 *
 * Without arguments: the launcher check alone (no MPI started), as a unit
 * test. With a case name, run under `mpirun -np 2` by boxes_test.sh:
 *   sums            rails' collectives give box-order sums, bit for bit,
 *                   in place
 *   threads         four rails at once from four threads each
 *   timeout         box 1 stops itself (SIGSTOP) in a reduce-scatter;
 *                   box 0's call fails within the 3 s timeout naming box 1
 *                   and what its heartbeat last said, then wakes box 1
 *   check_bytes     a configuration text that differs on box 1 is refused
 *                   naming box 1 and the first differing line
 *   shared_dir DIR  DIR-<box> is a private folder per box: refused naming
 *                   box 1; DIR itself is shared: accepted
 *   same            the build and a file agree
 *   other_build     box 1 runs another binary: refused naming box 1
 *   other_file DIR  DIR-<box>/tokens.bin differs on box 1: refused naming it
 *   abort           box 1 calls fso_boxes_abort: the whole run ends, non-zero
 * Every box exits non-zero on a failed check (so mpirun does).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "boxes.h"
#include "util.h"

static int failures;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "FAIL box %d %s:%d: %s: ", fso_boxes_self(), __FILE__, __LINE__, \
                    #cond);                                                                  \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

static void test_launcher_check(void)
{
    char err[512];
    char *none[] = {"HOME=/root", NULL};
    CHECK(fso_boxes_launcher_check(none, false, err, sizeof err) == 1, "no launcher: one box");
    char *ompi2[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", NULL};
    err[0] = 0;
    CHECK(fso_boxes_launcher_check(ompi2, false, err, sizeof err) == -ENOTSUP, "refused");
    CHECK(strstr(err, "started by mpirun with 2 processes") &&
              strstr(err, "built without MPI") && strstr(err, "-Dmpi=enabled"),
          "err: %s", err);
    CHECK(fso_boxes_launcher_check(ompi2, true, err, sizeof err) == 2, "two boxes with MPI");
    char *ompi1[] = {"OMPI_COMM_WORLD_SIZE=1", NULL};
    CHECK(fso_boxes_launcher_check(ompi1, false, err, sizeof err) == 1, "mpirun -np 1");
    /* a batch script's environment is not a step of that many processes */
    char *batch[] = {"SLURM_NTASKS=4", NULL};
    CHECK(fso_boxes_launcher_check(batch, false, err, sizeof err) == 1, "sbatch alone");
    char *srun[] = {"SLURM_NTASKS=4", "SLURM_PROCID=3", NULL};
    CHECK(fso_boxes_launcher_check(srun, false, err, sizeof err) == -ENOTSUP, "srun");
    CHECK(strstr(err, "started by srun with 4 processes") != NULL, "err: %s", err);
    char *pmi[] = {"PMI_SIZE=x2", NULL};
    CHECK(fso_boxes_launcher_check(pmi, true, err, sizeof err) == -EINVAL, "bad count");
    CHECK(strstr(err, "PMI_SIZE=x2") != NULL, "err: %s", err);
}

/* box b's value i: exact in bf16, small and varied, so box-order sums differ
 * from other orders for three boxes or more and are exact for two */
static float val(int b, size_t i)
{
    return (float)((int)((i * 7 + (size_t)b * 13) % 23) - 11) * 0.15625f + (float)b * 0.5f;
}

static int same_bits(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

static void test_sums(void)
{
    char err[512];
    fso_rails r;
    int rc = fso_boxes_rails(2, false, FSO_RAILS_AUTO, &r, err, sizeof err);
    CHECK(rc == 0, "rails: %s", err);
    if (rc)
        return;
    const int B = r.boxes, me = r.box;
    CHECK(B == 2 && r.devices == 2, "boxes %d devices %d", B, r.devices);
    const size_t n = 1000;
    float *send = malloc(sizeof(float) * n * (size_t)B), want[1000];
    uint16_t *send16 = malloc(sizeof(uint16_t) * n * (size_t)B);
    for (size_t i = 0; i < n * (size_t)B; i++) {
        send[i] = val(me, i);
        send16[i] = fso_bf16_from_f32(val(me, i));
    }
    for (size_t i = 0; i < n; i++) {
        float s = val(0, (size_t)me * n + i);
        for (int k = 1; k < B; k++)
            s += val(k, (size_t)me * n + i);
        want[i] = s;
    }
    fso_coll *c = r.grad[1];
    /* in place: recv is this box's own slice of send */
    float *own = send + (size_t)me * n;
    rc = c->ops->reduce_scatter(c, me, send, own, n);
    CHECK(rc == 0, "reduce-scatter: %s", c->err);
    CHECK(same_bits(own, want, sizeof want), "reduce-scatter bits");
    float got[1000];
    rc = c->ops->reduce_scatter_bf16(c, me, send16, got, n);
    CHECK(rc == 0, "reduce-scatter bf16: %s", c->err);
    CHECK(same_bits(got, want, sizeof want), "reduce-scatter bf16 bits");
    /* all-gather in place over what reduce-scatter left: every box's slice */
    fso_coll *p = r.param[0];
    rc = p->ops->all_gather(p, me, own, send, n, FSO_DT_F32, 0);
    CHECK(rc == 0, "all-gather: %s", p->err);
    for (int k = 0; k < B; k++)
        for (size_t i = 0; i < n; i++) {
            float s = val(0, (size_t)k * n + i);
            for (int j = 1; j < B; j++)
                s += val(j, (size_t)k * n + i);
            if (!same_bits(&send[(size_t)k * n + i], &s, sizeof s)) {
                CHECK(0, "all-gather slice %d element %zu: %g, want %g", k, i,
                      send[(size_t)k * n + i], s);
                k = B;
                break;
            }
        }
    /* bf16 all-gather: half the bytes, bits moved */
    uint16_t g16[2000];
    uint16_t mine16[1000];
    for (size_t i = 0; i < n; i++)
        mine16[i] = (uint16_t)(me * 1000 + (int)i);
    rc = p->ops->all_gather(p, me, mine16, g16, n, FSO_DT_BF16, 0);
    CHECK(rc == 0, "all-gather bf16: %s", p->err);
    for (int k = 0; k < B; k++)
        CHECK(g16[(size_t)k * n + 7] == (uint16_t)(k * 1000 + 7), "bf16 slice %d", k);
    /* all-reduce in double, box order from 0.0 */
    double d[3] = {0.1 * (me + 1), 1e16 * (me ? -1 : 1), 1.0 + me};
    double dw[3] = {0, 0, 0};
    for (int k = 0; k < B; k++) {
        dw[0] += 0.1 * (k + 1);
        dw[1] += 1e16 * (k ? -1 : 1);
        dw[2] += 1.0 + k;
    }
    rc = c->ops->all_reduce_f64(c, me, d, 3);
    CHECK(rc == 0, "all-reduce: %s", c->err);
    CHECK(same_bits(d, dw, sizeof d), "all-reduce bits: %.17g %.17g %.17g", d[0], d[1], d[2]);
    rc = c->ops->barrier(c, me);
    CHECK(rc == 0, "barrier: %s", c->err);
    /* the main thread's waits */
    double v[2] = {1.0, (double)me};
    CHECK(fso_boxes_sum("test sum", v, 2, err, sizeof err) == 0, "sum: %s", err);
    CHECK(v[0] == B && v[1] == 1.0, "sum %g %g", v[0], v[1]);
    char word[16] = "";
    if (me == 0)
        snprintf(word, sizeof word, "from box 0");
    CHECK(fso_boxes_bcast("test bcast", word, sizeof word, err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(word, "from box 0") == 0, "bcast: %s", word);
    CHECK(strcmp(fso_boxes_host(1), "?") != 0 && fso_boxes_host(1)[0], "host of box 1");
    fso_boxes_rails_free(&r);
    free(send);
    free(send16);
    /* a box with another device count is named */
    rc = fso_boxes_rails(me == 1 ? 3 : 2, false, FSO_RAILS_AUTO, &r, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "box 1 (host ") && strstr(err, "has 3 devices"),
          "devices differ: %d %s", rc, err);
    rc = fso_boxes_rails(1, me == 1, FSO_RAILS_AUTO, &r, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "box 1 (host ") && strstr(err, "trains on GPUs") &&
              strstr(err, "box 0 (host "),
          "kinds differ: %d %s", rc, err);
}

/* Rails are used at once from different threads (each device's compute
 * thread and updater): four threads, each on its own rail, many calls. */
struct rail_job {
    fso_coll *c;
    int me, B, seed, bad;
};

static void *rail_worker(void *arg)
{
    struct rail_job *j = arg;
    enum { N = 4096, CALLS = 40 };
    float *send = malloc(sizeof(float) * N * (size_t)j->B), *recv = malloc(sizeof(float) * N);
    for (int call = 0; call < CALLS && !j->bad; call++) {
        for (size_t i = 0; i < (size_t)N * (size_t)j->B; i++)
            send[i] = (float)(j->me * 1000 + j->seed * 10 + call % 7);
        if (j->c->ops->reduce_scatter(j->c, j->me, send, recv, N) != 0) {
            j->bad = -1;
            break;
        }
        float want = 0;
        for (int k = 0; k < j->B; k++)
            want += (float)(k * 1000 + j->seed * 10 + call % 7);
        for (int i = 0; i < N; i++)
            if (recv[i] != want) {
                j->bad = i + 1;
                break;
            }
    }
    free(send);
    free(recv);
    return NULL;
}

static void test_threads(void)
{
    char err[512];
    fso_rails r;
    int rc = fso_boxes_rails(2, false, FSO_RAILS_AUTO, &r, err, sizeof err);
    CHECK(rc == 0, "rails: %s", err);
    if (rc)
        return;
    struct rail_job jobs[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (struct rail_job){.c = t & 1 ? r.param[t / 2] : r.grad[t / 2], .me = r.box,
                                    .B = r.boxes, .seed = t};
        pthread_create(&th[t], NULL, rail_worker, &jobs[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].bad == 0, "thread %d: %d %s", t, jobs[t].bad, jobs[t].c->err);
    }
    fso_boxes_rails_free(&r);
}

static void test_timeout(void)
{
    char err[512];
    fso_boxes_set_timeout(3.0);
    fso_rails r;
    int rc = fso_boxes_rails(1, false, FSO_RAILS_AUTO, &r, err, sizeof err);
    CHECK(rc == 0, "rails: %s", err);
    if (rc)
        return;
    const int me = r.box;
    /* box 0 needs box 1's pid to wake it */
    double pids[2] = {0, 0};
    pids[me] = (double)getpid();
    CHECK(fso_boxes_sum("pids", pids, 2, err, sizeof err) == 0, "%s", err);
    static float send[2048], recv[1024];
    fso_coll *c = r.grad[0];
    if (me == 1) {
        fso_boxes_phase("reduce-scatter", 12, 3);
        sleep(2); /* a heartbeat carries it */
        raise(SIGSTOP);
        /* woken: join late; box 0 has left, its messages are there */
        rc = c->ops->reduce_scatter(c, me, send, recv, 1024);
        CHECK(rc == 0, "late reduce-scatter: %s", c->err);
    } else {
        sleep(3); /* box 1 stops at about 2 s, and its heartbeat goes quiet */
        double t0 = fso_now_ms();
        rc = c->ops->reduce_scatter(c, me, send, recv, 1024);
        double s = (fso_now_ms() - t0) / 1000.0;
        kill((pid_t)pids[1], SIGCONT);
        CHECK(rc == -ETIMEDOUT, "rc %d", rc);
        CHECK(s >= 2.9 && s < 5.0, "timed out after %.1f s", s);
        CHECK(strstr(c->err, "box 1 (host ") && strstr(c->err, "no heartbeat for") &&
                  strstr(c->err, "step 12, reduce-scatter of block 3") &&
                  strstr(c->err, "comm.timeout_s"),
              "err: %s", c->err);
        printf("box 0's error: %s\n", c->err);
        /* the rail is out of step now, and says so */
        rc = c->ops->barrier(c, me);
        CHECK(rc == -EIO && strstr(c->err, "earlier call"), "after: %d %s", rc, c->err);
    }
    fso_boxes_set_timeout(30.0);
    CHECK(fso_boxes_barrier("after the timeout", err, sizeof err) == 0, "%s", err);
    fso_boxes_rails_free(&r);
}

static void test_check_bytes(void)
{
    char err[512] = "";
    const char *same = "{\n  \"train\": {\n    \"steps\": 10\n  }\n}\n";
    CHECK(fso_boxes_check_bytes("the resolved configuration", same, strlen(same), err,
                                sizeof err) == 0,
          "same text: %s", err);
    const char *other = fso_boxes_self() == 1 ? "{\n  \"train\": {\n    \"steps\": 12\n  }\n}\n"
                                               : same;
    int rc = fso_boxes_check_bytes("the resolved configuration", other, strlen(other), err,
                                   sizeof err);
    CHECK(rc == -EINVAL, "rc %d", rc);
    CHECK(strstr(err, "the resolved configuration differs") && strstr(err, "box 1 (host ") &&
              strstr(err, "line 3: \"    \"steps\": 12\"") && strstr(err, "\"steps\": 10"),
          "err: %s", err);
    if (fso_boxes_self() == 0)
        printf("refused: %s\n", err);
    /* longer than the text exchange: by hash, still naming box 1 */
    size_t big = 100000;
    char *buf = malloc(big);
    memset(buf, 'a', big);
    if (fso_boxes_self() == 1)
        buf[big - 1] = 'b';
    rc = fso_boxes_check_bytes("the data digest", buf, big, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "box 1 (host "), "big: %d %s", rc, err);
    free(buf);
}

static void test_shared_dir(const char *dir)
{
    char err[512] = "", mine[4096];
    snprintf(mine, sizeof mine, "%s-%d", dir, fso_boxes_self());
    mkdir(mine, 0755);
    mkdir(dir, 0755);
    int rc = fso_boxes_check_shared_dir(mine, err, sizeof err);
    CHECK(rc < 0 && strstr(err, "is not shared: box 1 (host ") &&
              strstr(err, "put it on a filesystem every box mounts"),
          "private: %d %s", rc, err);
    if (fso_boxes_self() == 0)
        printf("refused: %s\n", err);
    rc = fso_boxes_check_shared_dir(dir, err, sizeof err);
    CHECK(rc == 0, "shared: %s", err);
    /* box 0's token is gone */
    CHECK(fso_boxes_barrier("listing", err, sizeof err) == 0, "%s", err);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q .fsoff-shared", dir);
    CHECK(system(cmd) != 0, "token left in %s", dir);
}

static void test_same(void)
{
    char err[512] = "";
    CHECK(fso_boxes_check_build(err, sizeof err) == 0, "build: %s", err);
    CHECK(fso_boxes_check_file("the test program", "/proc/self/exe", err, sizeof err) == 0,
          "file: %s", err);
    int rc = fso_boxes_check_file("data.train", "/nonexistent/fsoff-test", err, sizeof err);
    CHECK(rc < 0 && strstr(err, "data.train /nonexistent/fsoff-test cannot be read on box 0"),
          "missing: %d %s", rc, err);
}

/* The same path names another file on box 1 (here: a folder per box). */
static void test_other_file(const char *dir)
{
    char err[512] = "", path[4096];
    snprintf(path, sizeof path, "%s-%d", dir, fso_boxes_self());
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s-%d/tokens.bin", dir, fso_boxes_self());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    if (!f)
        return;
    fprintf(f, "tokens %s\n", fso_boxes_self() == 1 ? "stale" : "fresh");
    fclose(f);
    int rc = fso_boxes_check_file("data.train", path, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "data.train ") && strstr(err, "box 1 (host ") &&
              strstr(err, "copy the same file to every box"),
          "other file: %d %s", rc, err);
    if (fso_boxes_self() == 0)
        printf("refused: %s\n", err);
}

/* box 1 fails the run: every box ends, non-zero, its line on stderr */
static void test_abort(void)
{
    char err[512] = "";
    if (fso_boxes_self() == 1)
        fso_boxes_abort("box 1: test_boxes stops the run", 75);
    /* box 0 waits in a barrier that box 1 never joins: MPI_Abort ends it */
    fso_boxes_set_timeout(20.0);
    fso_boxes_barrier("waiting for box 1", err, sizeof err);
    CHECK(0, "box 0 still running after box 1's abort: %s", err);
}

/* box 1 runs a copy of this program with one more byte (boxes_test.sh) */
static void test_other_build(void)
{
    char err[512] = "";
    int rc = fso_boxes_check_build(err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "box 1 (host ") &&
              strstr(err, "runs a different fsoff build than box 0") &&
              strstr(err, "copy the same build to every box"),
          "other build: %d %s", rc, err);
    if (fso_boxes_self() == 0)
        printf("refused: %s\n", err);
}

int main(int argc, char **argv)
{
    char err[512] = "";
    if (argc < 2) {
        test_launcher_check();
        return failures ? 1 : 0;
    }
    if (fso_boxes_init(&argc, &argv, err, sizeof err) != 0) {
        fprintf(stderr, "test_boxes: %s\n", err);
        return 1;
    }
    if (fso_boxes_count() != 2) {
        fprintf(stderr, "test_boxes %s: run it under mpirun -np 2 (boxes_test.sh)\n", argv[1]);
        fso_boxes_finalize();
        return 77;
    }
    if (strcmp(argv[1], "sums") == 0)
        test_sums();
    else if (strcmp(argv[1], "threads") == 0)
        test_threads();
    else if (strcmp(argv[1], "timeout") == 0)
        test_timeout();
    else if (strcmp(argv[1], "check_bytes") == 0)
        test_check_bytes();
    else if (strcmp(argv[1], "shared_dir") == 0 && argc > 2)
        test_shared_dir(argv[2]);
    else if (strcmp(argv[1], "same") == 0)
        test_same();
    else if (strcmp(argv[1], "other_build") == 0)
        test_other_build();
    else if (strcmp(argv[1], "other_file") == 0 && argc > 2)
        test_other_file(argv[2]);
    else if (strcmp(argv[1], "abort") == 0)
        test_abort();
    else {
        fprintf(stderr, "test_boxes: unknown case %s\n", argv[1]);
        failures++;
    }
    int self = fso_boxes_self();
    fso_boxes_finalize();
    if (!failures && self == 0)
        printf("ok %s\n", argv[1]);
    return failures ? 1 : 0;
}
