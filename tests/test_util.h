/* test_util.h — what fsoff's CMocka test programs share, one copy each:
 *
 *  - the small training jobs (fso_test_small_model, fso_test_tiny_model);
 *  - a run of a job (run_result, run, run_ok) and the bit-for-bit
 *    comparison of two runs (assert_bit_identical);
 *  - folders: a per-test temporary folder (setup_dir, teardown_dir) and
 *    remove_tree, which removes a tree without following a symlink;
 *  - op outputs: guard regions around a buffer (gbuf, guard_check, ...)
 *    and compare(), the normalized error of an output against a reference.
 *
 * Every function is static, so each program has its own copy and links no
 * other's; unused ones draw no warning. */
#ifndef FSO_TEST_UTIL_H
#define FSO_TEST_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "cpu_async.h"
#include "cuda/cuda_backend.h"
#include "data.h"
#include "train.h"
#include "zero/zero.h"

#define FSO_TEST_FN static inline __attribute__((unused))

/* ---------------------------------------------------------------- main */

/* FSO_TEST_FILTER=PATTERN: the program runs only the tests whose names
 * match (CMocka's * and ? wildcards): bench/gpu_check.sh re-runs a failed
 * test alone, CI runs the GPU-rules cases alone under ThreadSanitizer.
 * Called by main before the group runs. */
FSO_TEST_FN void fso_test_filter_from_env(void)
{
    const char *only = getenv("FSO_TEST_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
}

/* ---------------------------------------------------------------- GPU rules */

/* The backend of the tests' GPU-rules cases: "cpu-async", a CPU device
 * with a discrete GPU's rules (kernels/cpu_async.h); or, with
 * FSO_TEST_GPU=cuda, "cuda": the CUDA module's own code, on a GPU or on the
 * tests' stand-in of the CUDA runtime (tests/standin, which FSO_CUDA_MODULE
 * names). Asked for cuda where there is none, the test fails: it never
 * quietly runs cpu-async instead. */
FSO_TEST_FN const char *fso_test_gpu_rules(void)
{
    const char *g = getenv("FSO_TEST_GPU");
    if (!g || !*g || strcmp(g, "cpu-async") == 0)
        return "cpu-async";
    if (strcmp(g, "cuda") != 0)
        fail_msg("FSO_TEST_GPU=%s: expected \"cpu-async\" or \"cuda\"", g);
    char why[512] = "";
    if (fso_cuda_available(why, sizeof why) < 0)
        fail_msg("FSO_TEST_GPU=cuda: %s", why);
    return "cuda";
}

/* 1 when the GPU-rules cases run on the CUDA backend (fso_test_gpu_rules). */
FSO_TEST_FN int fso_test_gpu_is_cuda(void)
{
    return strcmp(fso_test_gpu_rules(), "cuda") == 0;
}

/* ---------------------------------------------------------------- small jobs */

/* State on the tiers given, both offload sections' NVMe in folder dir. */
static inline void fso_test_set_tiers(fso_config *cfg, fso_tier param, fso_tier optim,
                                      const char *dir)
{
    cfg->offload.param_tier = param;
    cfg->offload.optim_tier = optim;
    snprintf(cfg->offload.param_nvme_path, sizeof cfg->offload.param_nvme_path, "%s", dir);
    snprintf(cfg->offload.optim_nvme_path, sizeof cfg->offload.optim_nvme_path, "%s", dir);
}

/* Each kind of state on its own tier, t[kind], NVMe in folder dir. */
static inline void fso_test_set_kind_tiers(fso_config *cfg, const fso_tier *t, const char *dir)
{
    fso_test_set_tiers(cfg, t[FSO_KIND_PARAM], t[FSO_KIND_MASTER], dir);
    cfg->offload.per_kind = true;
    memcpy(cfg->offload.kind_tier, t, sizeof cfg->offload.kind_tier);
}

#define FSO_TEST_STEPS 3

/* Defaults, then the shape both small jobs share: 2 layers of `hidden`,
 * the feed-forward twice as wide, 4 heads of head_dim over 2 KV heads,
 * seq_len tokens, FSO_TEST_STEPS steps, one warm-up step. */
/* The whole file at path, with a NUL after its *len bytes (malloc'd); the
 * test fails naming the file when it cannot be read. */
FSO_TEST_FN void *fso_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

/* A committed fixture, tests/fixtures/NAME of the source tree FSO_SRCDIR
 * names (meson's test environment), as fso_test_read_file; its path into
 * path (len bytes) for messages. */
FSO_TEST_FN void *fso_test_read_fixture(const char *name, size_t *size, char *path, size_t len)
{
    const char *src = getenv("FSO_SRCDIR");
    snprintf(path, len, "%s/tests/fixtures/%s", src ? src : "..", name);
    if (access(path, R_OK) != 0)
        fail_msg("%s: cannot read: %s (FSO_SRCDIR must point to the source tree)", path,
                 strerror(errno));
    return fso_test_read_file(path, size);
}

FSO_TEST_FN void fso_test_model_shape(fso_config *cfg, int hidden, int head_dim, int seq_len)
{
    fso_config_defaults(cfg);
    cfg->model.hidden_size = hidden;
    cfg->model.intermediate_size = 2 * hidden;
    cfg->model.num_hidden_layers = 2;
    cfg->model.num_attention_heads = 4;
    cfg->model.num_key_value_heads = 2;
    cfg->model.head_dim = head_dim;
    cfg->data.seq_len = seq_len;
    cfg->steps = FSO_TEST_STEPS;
    cfg->sched.warmup_num_steps = 1;
}

/* Defaults, then the small job that test_zero, test_checkpoint and test_cuda
 * run on every placement: 2 layers, hidden 64, 4 heads over 2 KV heads, 32
 * tokens, 2 micro-batches per step, FSO_TEST_STEPS steps, one warm-up step;
 * `world` devices share `global_batch` sequences per micro-step; 2 threads,
 * a 256 MiB cap per CPU device. */
FSO_TEST_FN void fso_test_small_model(fso_config *cfg, int world, int global_batch)
{
    fso_test_model_shape(cfg, 64, 16, 32);
    cfg->world = world;
    cfg->micro_batch = global_batch / world;
    cfg->grad_accum = 2;
    cfg->threads = 2;
    cfg->device_mem_bytes = 256u << 20;
}

/* Defaults, then the smaller job of test_train, whose tests feed one
 * micro-batch per step by hand (grad_accum 1) and whose tolerances are
 * set for it: 2 layers, hidden 48, 4 heads over 2 KV heads of 12, 24
 * tokens, 2 sequences, FSO_TEST_STEPS steps, one warm-up step, on one
 * device with the default threads and memory. */
FSO_TEST_FN void fso_test_tiny_model(fso_config *cfg)
{
    fso_test_model_shape(cfg, 48, 12, 24);
    cfg->micro_batch = 2;
    cfg->grad_accum = 1;
}

/* ---------------------------------------------------------------- runs */

#define FSO_TEST_MAX_STEPS 8

/* What a run of cfg->steps steps gave. */
typedef struct run_result {
    int steps;
    double loss[FSO_TEST_MAX_STEPS], norm[FSO_TEST_MAX_STEPS];
    float *params;        /* the fp32 master, in Hugging Face order */
    float *working;       /* the working parameters widened to fp32; NULL: not taken */
    size_t np;
    uint64_t peak_device, arena, nvme_read;
    fso_async_counts dev; /* cpu-async: what rank 0's device saw during the steps */
    int rc;               /* 0, or the first failure of the trainer (err says it) */
    char err[512];
} run_result;

/* Calls into a run, each optional. */
typedef struct run_hooks {
    void (*started)(fso_trainer *tr);          /* after the trainer starts, before step 1 */
    void (*stepped)(fso_trainer *tr, int step); /* after each step that worked, from 1 */
} run_hooks;

/* cfg->steps optimizer steps on cfg's data into *out (which the caller frees
 * with result_free). A trainer that fails to start or step ends the run with
 * out->rc and out->err; the parameters are taken either way. */
FSO_TEST_FN void run(const fso_config *cfg, const run_hooks *hooks, run_result *out)
{
    fso_data data = {0};
    fso_trainer tr;
    memset(out, 0, sizeof *out);
    if (cfg->steps > FSO_TEST_MAX_STEPS)
        fail_msg("run: %lld steps, at most %d", (long long)cfg->steps, FSO_TEST_MAX_STEPS);
    out->steps = (int)cfg->steps;
    if (fso_data_init(&data, cfg) < 0)
        fail_msg("data: %s", data.err);
    if ((out->rc = fso_trainer_init(&tr, cfg)) < 0) {
        snprintf(out->err, sizeof out->err, "%s", tr.err);
        fso_data_free(&data);
        return;
    }
    if (hooks && hooks->started)
        hooks->started(&tr);
    fso_backend *be0 = fso_zero_model(tr.zero)->be;
    fso_async_counts dev0 = {0};
    if (fso_backend_is_async(be0))
        dev0 = fso_async_counts_of(be0);
    size_t bt = (size_t)cfg->micro_batch * cfg->data.seq_len, n = fso_trainer_step_tokens(cfg);
    int32_t *in = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n);
    int32_t *pos = fso_data_documents(&data) ? malloc(sizeof(int32_t) * n) : NULL;
    assert_non_null(in);
    assert_non_null(tg);
    assert_true(pos || !fso_data_documents(&data));
    for (int s = 0; s < out->steps && out->rc == 0; s++) {
        for (size_t a = 0; a < n / bt; a++)
            fso_data_next(&data, in + a * bt, tg + a * bt, pos ? pos + a * bt : NULL);
        fso_zero_step st;
        if ((out->rc = fso_trainer_step(&tr, in, tg, pos, &st)) < 0)
            snprintf(out->err, sizeof out->err, "%s", tr.err);
        out->loss[s] = st.loss;
        out->norm[s] = st.grad_norm;
        out->nvme_read += st.nvme_read_bytes;
        if (hooks && hooks->stepped && out->rc == 0)
            hooks->stepped(&tr, s + 1);
    }
    if (fso_backend_is_async(be0)) {
        out->dev = fso_async_counts_of(be0);
        out->dev.syncs -= dev0.syncs;
        out->dev.drains -= dev0.drains;
        out->dev.allocs -= dev0.allocs;
        out->dev.ahead -= dev0.ahead;
        out->dev.marks -= dev0.marks;
        out->dev.copy_marks -= dev0.copy_marks;
        out->dev.stale_marks -= dev0.stale_marks;
    }
    out->np = fso_zero_model(tr.zero)->n_params;
    out->params = malloc(sizeof(float) * out->np);
    out->working = malloc(sizeof(float) * out->np);
    assert_non_null(out->params);
    assert_non_null(out->working);
    char err[512];
    if (fso_zero_store_hf(tr.zero, out->params, err, sizeof err) < 0 && out->rc == 0)
        fail_msg("store: %s", err);
    if (fso_zero_store_working_hf(tr.zero, out->working, err, sizeof err) < 0 && out->rc == 0)
        fail_msg("store working parameters: %s", err);
    out->peak_device = fso_zero_peak_device_bytes(tr.zero);
    out->arena = fso_zero_host_arena_bytes(tr.zero);
    free(in);
    free(tg);
    free(pos);
    fso_trainer_free(&tr);
    fso_data_free(&data);
}

/* run(), failing the test with the trainer's message unless every step worked. */
FSO_TEST_FN void run_ok(const fso_config *cfg, const run_hooks *hooks, run_result *out)
{
    run(cfg, hooks, out);
    if (out->rc < 0)
        fail_msg("trainer: %s", out->err);
}

FSO_TEST_FN void result_free(run_result *r)
{
    free(r->params);
    free(r->working);
    r->params = r->working = NULL;
}

/* Fails, naming `what`, unless both runs worked and are the same bits: the
 * same number of steps, the loss and gradient norm of every step from
 * `from_step` (1: all) on, the master parameters, and the working
 * parameters where both runs took them. */
FSO_TEST_FN void assert_bit_identical(const run_result *a, const run_result *b, int from_step,
                                      const char *what)
{
    if (a->rc || b->rc)
        fail_msg("%s: a run failed: rc %d (%s), rc %d (%s)", what, a->rc, a->err, b->rc, b->err);
    assert_int_equal(a->steps, b->steps);
    for (int s = from_step - 1; s < a->steps; s++)
        if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) ||
            memcmp(&a->norm[s], &b->norm[s], sizeof(double)))
            fail_msg("%s: step %d: loss %.17g vs %.17g, norm %.17g vs %.17g", what, s + 1,
                     a->loss[s], b->loss[s], a->norm[s], b->norm[s]);
    assert_int_equal(a->np, b->np);
    for (size_t i = 0; i < a->np; i++)
        if (memcmp(&a->params[i], &b->params[i], sizeof(float)))
            fail_msg("%s: parameter %zu: %.9g vs %.9g", what, i, a->params[i], b->params[i]);
    if (a->working && b->working)
        for (size_t i = 0; i < a->np; i++)
            if (memcmp(&a->working[i], &b->working[i], sizeof(float)))
                fail_msg("%s: working parameter %zu: %.9g vs %.9g", what, i, a->working[i],
                         b->working[i]);
}

/* A GPU-rules run against the CPU backend's: the same bits on cpu-async;
 * on the CUDA backend (fso_test_gpu_is_cuda), whose attention and matmuls
 * run as its cuBLAS calls do (two batched GEMMs around the softmax rows;
 * column-major products; bf16 operands multiplied as bf16), within
 * test_cuda's tolerance: each step's loss and gradient norm relative 1e-4
 * (bf16 working parameters: 3e-2), the parameters' normalized error the
 * same. */
FSO_TEST_FN void assert_gpu_rules_match(const run_result *cpu, const run_result *gpu,
                                        int from_step, bool bf16, const char *what)
{
    if (!fso_test_gpu_is_cuda()) {
        assert_bit_identical(cpu, gpu, from_step, what);
        return;
    }
    const double tol = bf16 ? 3e-2 : 1e-4;
    if (cpu->rc || gpu->rc)
        fail_msg("%s: a run failed: rc %d (%s), rc %d (%s)", what, cpu->rc, cpu->err, gpu->rc,
                 gpu->err);
    assert_int_equal(cpu->steps, gpu->steps);
    for (int s = from_step - 1; s < cpu->steps; s++)
        if (!(fabs(gpu->loss[s] - cpu->loss[s]) <= tol * fabs(cpu->loss[s])) ||
            !(fabs(gpu->norm[s] - cpu->norm[s]) <= tol * fabs(cpu->norm[s])))
            fail_msg("%s: step %d: loss %.17g vs the CPU's %.17g, norm %.17g vs %.17g "
                     "(tolerance %g)", what, s + 1, gpu->loss[s], cpu->loss[s], gpu->norm[s],
                     cpu->norm[s], tol);
    assert_int_equal(cpu->np, gpu->np);
    double d2 = 0, a2 = 0;
    for (size_t i = 0; i < cpu->np; i++) {
        const double d = (double)gpu->params[i] - cpu->params[i];
        d2 += d * d;
        a2 += (double)cpu->params[i] * cpu->params[i];
    }
    if (!(sqrt(d2) <= tol * sqrt(a2)))
        fail_msg("%s: parameters: normalized error %.3g (tolerance %g)", what,
                 sqrt(d2 / (a2 > 0 ? a2 : 1)), tol);
}

/* ---------------------------------------------------------------- folders */

/* Removes `name` in the folder dirfd and, when it is a folder, everything
 * in it first. A symlink is unlinked, never followed: whatever it points
 * to stays. 0 when nothing is left, or -errno of the first failure. */
FSO_TEST_FN int remove_tree_at(int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dirfd, name, 0) < 0 ? -errno : 0;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int r = remove_tree_at(fd, e->d_name);
        if (r < 0 && rc == 0)
            rc = r;
    }
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* Removes path and, when it is a folder, the tree under it, following no
 * symlink (remove_tree_at). 0 when nothing is left (or nothing was there). */
FSO_TEST_FN int remove_tree(const char *path)
{
    return remove_tree_at(AT_FDCWD, path);
}

/* A CMocka group's folder: <working folder>/NAME-XXXXXX, created (the
 * tests run in the build folder: a disk, where /tmp may be tmpfs and refuse
 * O_DIRECT). 0, or -1 when it cannot be made. */
FSO_TEST_FN int fso_test_group_dir(char *buf, size_t len, const char *name)
{
    char cwd[800];
    if (!getcwd(cwd, sizeof cwd))
        return -1;
    if ((size_t)snprintf(buf, len, "%s/%s-XXXXXX", cwd, name) >= len)
        return -1;
    return mkdtemp(buf) ? 0 : -1;
}

/* A test's own temporary folder, /tmp/fso_<program>.XXXXXX. */
typedef struct tdir {
    char path[256];
    char file[512]; /* a path in it, for the test's use */
} tdir;

/* CMocka setup: a new tdir in *state, its folder created. */
FSO_TEST_FN int setup_dir(void **state)
{
    tdir *t = calloc(1, sizeof(*t));
    if (!t)
        return -1;
    snprintf(t->path, sizeof(t->path), "/tmp/fso_%.64s.XXXXXX", program_invocation_short_name);
    if (!mkdtemp(t->path)) {
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

/* CMocka teardown: the folder and whatever the test left in it go. */
FSO_TEST_FN int teardown_dir(void **state)
{
    tdir *t = *state;
    remove_tree(t->path);
    free(t);
    return 0;
}

/* ---------------------------------------------------------------- op outputs */

#define GUARD 16             /* sentinel elements on each side of an output */
#define GUARD_VAL 12345.678f /* the fp32 sentinel */

/* Fills n + 2 GUARD elements of es bytes from base with *guard. */
FSO_TEST_FN void guard_fill_es(void *base, size_t n, size_t es, const void *guard)
{
    for (size_t i = 0; i < n + 2 * GUARD; i++)
        memcpy((char *)base + i * es, guard, es);
}

/* Fails, naming `what`, unless the GUARD elements of es bytes on each side
 * of the n at p still hold *guard: nothing wrote outside the output. */
FSO_TEST_FN void guard_check_es(const void *p, size_t n, size_t es, const void *guard,
                                const char *what)
{
    const char *c = p;
    for (size_t i = 1; i <= GUARD; i++)
        if (memcmp(c - i * es, guard, es) != 0 || memcmp(c + (n + i - 1) * es, guard, es) != 0)
            fail_msg("%s: write outside the output (guard %zu)", what, i);
}

/* A host buffer of n floats between two GUARD-float sentinel regions. */
FSO_TEST_FN float *gbuf(size_t n)
{
    const float guard = GUARD_VAL;
    float *p = malloc(sizeof(float) * (n + 2 * GUARD));
    assert_non_null(p);
    guard_fill_es(p, n, sizeof(float), &guard);
    return p + GUARD;
}

FSO_TEST_FN void gfree(float *p)
{
    if (p)
        free(p - GUARD);
}

/* guard_check_es for a gbuf of n floats. */
FSO_TEST_FN void guard_check(const float *p, size_t n, const char *what)
{
    const float guard = GUARD_VAL;
    guard_check_es(p, n, sizeof(float), &guard, what);
}

/* Fails, naming `what` and printing the first five elements off by more
 * than tol of their size, unless every element of got is finite and
 * ||got - want|| / ||want|| <= tol (tol 0: got is want exactly). */
FSO_TEST_FN void compare(const char *what, const float *got, const float *want, size_t n,
                         double tol)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            fail_msg("%s: element %zu is %g", what, i, got[i]);
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    double err = sqrt(num / (den > 0 ? den : 1));
    if (err > tol || (tol == 0 && num != 0)) {
        int shown = 0;
        for (size_t i = 0; i < n && shown < 5; i++)
            if (fabs((double)got[i] - want[i]) > tol * (fabs(want[i]) + 1e-3)) {
                fprintf(stderr, "  %s[%zu]: got %.8g want %.8g\n", what, i, got[i], want[i]);
                shown++;
            }
        fail_msg("%s: normalized error %.3g > %.3g", what, err, tol);
    }
}

#endif
