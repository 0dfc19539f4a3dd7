/* test_train.c — properties of the training step that the golden test does
 * not pin down: determinism, gradient accumulation, activation
 * checkpointing, thread counts, AdamW's instruction set (FSO_ISA),
 * divergence handling, two training runs at once in one process, and what
 * the report says of stale marks and refused pinning. */
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "cpu_isa.h"
#include "data.h"
#include "report.h"
#include "test_util.h"
#include "train.h"

#define STEPS FSO_TEST_STEPS

/* STEPS optimizer steps of cfg on the built-in corpus with `threads`
 * threads; the test fails when the trainer does. */
static void run_threads(const fso_config *cfg, int threads, run_result *out)
{
    fso_config c = *cfg;
    c.threads = threads;
    run_ok(&c, NULL, out);
}

static void test_same_seed_is_bit_identical(void **state)
{
    (void)state;
    fso_config cfg;
    fso_test_tiny_model(&cfg);
    run_result a, b, c;
    run_threads(&cfg, 2, &a);
    run_threads(&cfg, 2, &b);
    assert_bit_identical(&a, &b, 1, "two runs, same seed");
    cfg.seed += 1;
    run_threads(&cfg, 2, &c);
    assert_true(a.loss[0] != c.loss[0]); /* the seed matters */
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

static void test_checkpointing_is_bit_identical(void **state)
{
    (void)state;
    fso_config cfg;
    fso_test_tiny_model(&cfg);
    run_result a, b;
    cfg.activation_checkpointing = false;
    run_threads(&cfg, 2, &a);
    cfg.activation_checkpointing = true;
    run_threads(&cfg, 2, &b);
    assert_bit_identical(&a, &b, 1, "checkpointing off vs on");
    result_free(&a);
    result_free(&b);
}

/* Thread counts change no bit: 1 vs 3 threads on one device, 1 vs 3
 * threads per device on two (the devices' matmuls then run at once), fp32
 * and bf16, Llama and Qwen2 (its biases' gradients). */
static void test_thread_count_changes_nothing(void **state)
{
    (void)state;
    for (int v = 0; v < 8; v++) {
        fso_config cfg;
        fso_test_tiny_model(&cfg);
        cfg.world = v & 1 ? 2 : 1;
        cfg.bf16 = v & 2;
        if (v & 4)
            cfg.model.model_type = FSO_MODEL_QWEN2;
        run_result a, b;
        char what[128];
        run_threads(&cfg, cfg.world, &a);
        run_threads(&cfg, 3 * cfg.world, &b);
        snprintf(what, sizeof what, "%s%d device%s, %s: 1 thread vs 3 threads per device",
                 v & 4 ? "Qwen2, " : "", cfg.world, cfg.world > 1 ? "s" : "",
                 cfg.bf16 ? "bf16" : "fp32");
        assert_bit_identical(&a, &b, 1, what);
        result_free(&a);
        result_free(&b);
    }
}

/* Every AdamW path (FSO_ISA) trains to the scalar path's bits, with bf16
 * working parameters (the kernels' bf16 output too) on two devices. A set
 * this CPU or build lacks is skipped, saying so. */
static void test_isa_changes_nothing(void **state)
{
    (void)state;
    const char *saved = getenv("FSO_ISA");
    char *keep = saved ? strdup(saved) : NULL;
    fso_config cfg;
    fso_test_tiny_model(&cfg);
    cfg.world = 2;
    cfg.bf16 = true;
    run_result scalar;
    setenv("FSO_ISA", "scalar", 1);
    run_threads(&cfg, 2, &scalar);
    for (int i = FSO_ISA_AVX2; i < FSO_ISA_COUNT; i++) {
        const char *name = fso_isa_name((fso_isa)i);
        if (!fso_isa_supported((fso_isa)i)) {
            print_message("FSO_ISA=%s: skipped, this %s lacks it\n", name,
                          fso_isa_built((fso_isa)i) ? "CPU" : "build");
            continue;
        }
        run_result r;
        char what[64];
        setenv("FSO_ISA", name, 1);
        run_threads(&cfg, 2, &r);
        snprintf(what, sizeof what, "FSO_ISA=scalar vs %s", name);
        assert_bit_identical(&scalar, &r, 1, what);
        result_free(&r);
        print_message("FSO_ISA=%s: the scalar path's bits\n", name);
    }
    result_free(&scalar);
    if (keep)
        setenv("FSO_ISA", keep, 1);
    else
        unsetenv("FSO_ISA");
    free(keep);
}

/* Two micro-batches of 2 rows accumulate to the gradient of one batch of 4. */
static void test_accumulation_matches_one_large_batch(void **state)
{
    (void)state;
    fso_config big, acc;
    fso_test_tiny_model(&big);
    big.micro_batch = 4;
    fso_test_tiny_model(&acc);
    acc.micro_batch = 2;
    acc.grad_accum = 2;
    run_result a, b;
    run_threads(&big, 2, &a);
    run_threads(&acc, 2, &b);
    for (int s = 0; s < STEPS; s++) {
        if (fabs(a.loss[s] - b.loss[s]) > 1e-6 * fabs(a.loss[s]) ||
            fabs(a.norm[s] - b.norm[s]) > 1e-5 * fabs(a.norm[s]))
            fail_msg("step %d: batch 4 loss %.9g norm %.9g, 2x2 accumulated loss %.9g norm %.9g",
                     s + 1, a.loss[s], a.norm[s], b.loss[s], b.norm[s]);
    }
    for (size_t i = 0; i < a.np; i++)
        if (fabs(a.params[i] - b.params[i]) > 1e-5 + 1e-4 * fabs(a.params[i]))
            fail_msg("parameter %zu: %.9g vs %.9g", i, a.params[i], b.params[i]);
    result_free(&a);
    result_free(&b);
}

static void test_divergence_stops_without_update(void **state)
{
    (void)state;
    fso_config cfg;
    fso_test_tiny_model(&cfg);
    fso_data data = {0};
    fso_trainer tr;
    char err[512];
    assert_int_equal(fso_data_init(&data, &cfg), 0);
    assert_int_equal(fso_trainer_init(&tr, &cfg), 0);
    size_t np = fso_zero_model(tr.zero)->n_params, bt = (size_t)cfg.micro_batch * cfg.data.seq_len;
    float *p = malloc(sizeof(float) * np), *after = malloc(sizeof(float) * np);
    assert_int_equal(fso_zero_store_hf(tr.zero, p, err, sizeof err), 0);
    p[np / 2] = INFINITY; /* one poisoned weight */
    assert_int_equal(fso_zero_load_hf(tr.zero, p, err, sizeof err), 0);
    int32_t *in = malloc(sizeof(int32_t) * bt), *tg = malloc(sizeof(int32_t) * bt);
    fso_data_next(&data, in, tg, NULL);
    fso_zero_step st;
    assert_int_equal(fso_trainer_step(&tr, in, tg, NULL, &st), -ERANGE);
    assert_non_null(strstr(tr.err, "step 1"));
    assert_non_null(strstr(tr.err, "not applied"));
    assert_int_equal(fso_zero_store_hf(tr.zero, after, err, sizeof err), 0);
    for (size_t i = 0; i < np; i++)
        if (i != np / 2)
            assert_true(after[i] == p[i]);
    assert_int_equal(fso_zero_steps(tr.zero), 0);
    free(p);
    free(after);
    free(in);
    free(tg);
    fso_trainer_free(&tr);
    fso_data_free(&data);
}

/* A block source over zeroed host buffers, in the model's working type. */
#define MAX_TEST_BLOCKS 16
typedef struct lender {
    const fso_model *m;
    void *params[MAX_TEST_BLOCKS];
    float *grads[MAX_TEST_BLOCKS];
} lender;

static const void *lend_params(void *ctx, int b)
{
    lender *l = ctx;
    if (!l->params[b])
        l->params[b] = calloc(l->m->blocks[b].padded_elems, fso_dtype_size(l->m->wt));
    assert_non_null(l->params[b]);
    return l->params[b];
}

static void lend_release(void *ctx, int b)
{
    (void)ctx;
    (void)b;
}

static float *lend_grads(void *ctx, int b)
{
    lender *l = ctx;
    if (!l->grads[b])
        l->grads[b] = calloc(l->m->blocks[b].padded_elems, sizeof(float));
    assert_non_null(l->grads[b]);
    return l->grads[b];
}

static void lend_grads_done(void *ctx, int b)
{
    (void)ctx;
    (void)b;
}

static void lender_free(lender *l)
{
    for (int b = 0; b < MAX_TEST_BLOCKS; b++) {
        free(l->params[b]);
        free(l->grads[b]);
    }
}

static void test_activation_estimate_matches_allocation(void **state)
{
    (void)state;
    {
        fso_config cfg;
        fso_test_tiny_model(&cfg);
        assert_true(cfg.model.num_hidden_layers + 2 <= MAX_TEST_BLOCKS);
    }
    for (int v = 0; v < 8; v++) { /* 4..7: Qwen2, its biases' ops in the step */
        const bool ck = v & 1, bf16 = v & 2;
        fso_config cfg;
        fso_test_tiny_model(&cfg);
        if (v & 4)
            cfg.model.model_type = FSO_MODEL_QWEN2;
        fso_backend *be = NULL;
        fso_model m;
        assert_int_equal(fso_backend_create(&be, FSO_BACKEND_CPU, 0, 1, 0, NULL, 0), 0);
        assert_int_equal(fso_model_init(&m, &cfg.model, be, cfg.micro_batch, cfg.data.seq_len, 1,
                                        ck, bf16), 0);
        const size_t act = fso_model_activation_bytes_for(&cfg.model, cfg.micro_batch,
                                                          cfg.data.seq_len, ck, bf16);
        assert_int_equal(be->mem_used_bytes, act);
        /* a step adds the CPU backend's fp32 working space for bf16 tensors, as
         * the planner reserves it, and nothing else */
        lender l = {.m = &m};
        fso_block_source src = {.ctx = &l, .params = lend_params, .release = lend_release,
                                .grads = lend_grads, .grads_done = lend_grads_done};
        const size_t N = (size_t)cfg.micro_batch * cfg.data.seq_len;
        int32_t *tok = calloc(N, sizeof *tok);
        assert_non_null(tok);
        double loss = 0;
        fso_model_step(&m, &src, tok, tok, NULL, fso_model_loss_scale((int64_t)N, (int64_t)N, 1),
                       &loss);
        assert_int_equal(be->ops->sync(be), 0);
        assert_true(loss > 0);
        assert_int_equal(be->mem_peak_bytes,
                         act + (bf16 ? fso_model_cpu_widen_bytes_for(&cfg.model, cfg.micro_batch,
                                                                     cfg.data.seq_len)
                                     : 0));
        free(tok);
        lender_free(&l);
        fso_model_free(&m);
        fso_backend_destroy(be);
    }
}

/* ---------------------------------------------------------------- two runs */

/* One whole run (fso_train_run) of a small job whose placement the config
 * pins, its output and metrics captured. With `meet` set, the run's
 * output stream waits there, when the plan table starts, for the other
 * run to reach its plan table too: both have chosen their plans before
 * either prints one. */
typedef struct whole_run {
    const char *sets[8];
    int nsets, world;
    char metrics[64];
    char *out;
    size_t out_len;
    pthread_barrier_t *meet;
    bool met;
    int rc;
} whole_run;

static ssize_t capture_write(void *cookie, const char *buf, size_t size)
{
    whole_run *w = cookie;
    if (w->meet && !w->met && memmem(buf, size, "plan: memory", 12)) {
        w->met = true;
        pthread_barrier_wait(w->meet);
    }
    char *grown = realloc(w->out, w->out_len + size + 1);
    if (!grown)
        return -1;
    memcpy(grown + w->out_len, buf, size);
    w->out = grown;
    w->out_len += size;
    w->out[w->out_len] = 0;
    return (ssize_t)size;
}

static void *whole_run_main(void *arg)
{
    whole_run *w = arg;
    fso_config cfg;
    fso_config_defaults(&cfg);
    for (int i = 0; i < w->nsets; i++)
        if (fso_config_set(&cfg, w->sets[i]) < 0)
            fail_msg("%s", cfg.err);
    if (fso_config_finish(&cfg) < 0)
        fail_msg("%s", cfg.err);
    cfg.world = w->world;
    cfg.device_mem_bytes = 256u << 20;
    cfg.threads = 1;
    FILE *f = fopencookie(w, "w", (cookie_io_functions_t){.write = capture_write});
    assert_non_null(f);
    setvbuf(f, NULL, _IONBF, 0);
    fso_run_opts opts = {.metrics_path = w->metrics, .devices = "cpu", .out = f};
    w->rc = fso_train_run(&cfg, &opts);
    fclose(f);
    return NULL;
}

/* The lines of s that start with `prefix`, in order, into buf. */
static void lines_with(const char *s, const char *prefix, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = 0;
    for (const char *l = s; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (strncmp(l, prefix, strlen(prefix)) == 0 && off + n + 2 < len) {
            memcpy(buf + off, l, n);
            off += n;
            buf[off++] = '\n';
            buf[off] = 0;
        }
    }
}

/* The "loss" values of a metrics file, as written. */
static void losses_of(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    size_t off = 0;
    buf[0] = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":");
        if (l && off + 32 < len)
            off += (size_t)snprintf(buf + off, len - off, "%.24s;", l);
    }
    fclose(f);
}

/* Two different jobs run at the same time in one process (two threads)
 * give what each gives alone: the same plan, placement and losses. The run
 * keeps nothing between calls, so nothing of one leaks into the other. */
static void test_two_runs_at_once_in_one_process(void **state)
{
    (void)state;
    char cache[] = "fsoff-train-cache-XXXXXX";
    assert_non_null(mkdtemp(cache));
    setenv("XDG_CACHE_HOME", cache, 1);
    whole_run jobs[2][2] = {{{
        .sets = {"model.num_hidden_layers=2", "model.hidden_size=64", "train.steps=6",
                 "data.seq_len=32", "train_micro_batch_size_per_gpu=2",
                 "zero_optimization.offload_param.device=\"cpu\"",
                 "zero_optimization.offload_optimizer.device=\"none\""},
        .nsets = 7, .world = 1}, {
        .sets = {"model.num_hidden_layers=3", "model.hidden_size=32", "train.steps=7",
                 "data.seq_len=16", "train_micro_batch_size_per_gpu=2", "seed=7",
                 "zero_optimization.offload_param.device=\"none\"",
                 "zero_optimization.offload_optimizer.device=\"cpu\""},
        .nsets = 8, .world = 2}}};
    pthread_barrier_t meet;
    pthread_barrier_init(&meet, NULL, 2);
    for (int j = 0; j < 2; j++) {
        jobs[1][j] = jobs[0][j];
        jobs[1][j].meet = &meet;
        for (int k = 0; k < 2; k++)
            snprintf(jobs[k][j].metrics, sizeof jobs[k][j].metrics, "%s/m%d%d.jsonl", cache, k, j);
    }
    /* each alone (the first one probes this machine into the cache), then both at once */
    for (int j = 0; j < 2; j++)
        whole_run_main(&jobs[0][j]);
    pthread_t t[2];
    for (int j = 0; j < 2; j++)
        assert_int_equal(pthread_create(&t[j], NULL, whole_run_main, &jobs[1][j]), 0);
    for (int j = 0; j < 2; j++)
        pthread_join(t[j], NULL);
    pthread_barrier_destroy(&meet);
    static const char *const kept[] = {"plan:   device", "plan: placement", "fsoff: model",
                                       "fsoff: state"};
    for (int j = 0; j < 2; j++) {
        static char a[8192], b[8192];
        assert_int_equal(jobs[0][j].rc, 0);
        assert_int_equal(jobs[1][j].rc, 0);
        for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++) {
            lines_with(jobs[0][j].out, kept[k], a, sizeof a);
            lines_with(jobs[1][j].out, kept[k], b, sizeof b);
            assert_true(a[0] != 0);
            assert_string_equal(a, b);
        }
        losses_of(jobs[0][j].metrics, a, sizeof a);
        losses_of(jobs[1][j].metrics, b, sizeof b);
        assert_true(strlen(a) > 100);
        assert_string_equal(a, b);
    }
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++) {
            unlink(jobs[k][j].metrics);
            free(jobs[k][j].out);
        }
    char probe[256];
    snprintf(probe, sizeof probe, "%s/fsoff/probe.json", cache);
    unlink(probe);
    snprintf(probe, sizeof probe, "%s/fsoff", cache);
    rmdir(probe);
    rmdir(cache);
    unsetenv("XDG_CACHE_HOME");
}

/* The report: stale marks (waits stricter than asked, each a lost overlap)
 * show on the step line only once there are some, and every metrics line
 * carries the count; the summary says whether pinning was refused. */
static void test_report_shows_stale_marks_and_refused_pinning(void **state)
{
    (void)state;
    char *text = NULL, path[] = "/tmp/fsoff-report-XXXXXX", err[256];
    size_t len = 0;
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    fso_report rep;
    assert_int_equal(fso_report_init(&rep, out, path, false, 2, 1, 1e6, err, sizeof err), 0);
    rep.pin_refused = true;
    fso_zero_step st = {.step = 1, .loss = 5, .lr = 1e-3, .grad_norm = 1, .clip_coef = 1,
                         .step_ms = 10, .tokens = 64};
    fso_report_step(&rep, &st);
    st.step = 2;
    st.stale_marks = 3;
    fso_report_step(&rep, &st);
    assert_int_equal(fso_report_finish(&rep, err, sizeof err), 0);
    fclose(out);
    char *second = strstr(text, "step     2/2");
    assert_non_null(second);
    assert_null(memmem(text, (size_t)(second - text), "stale marks", 11)); /* step 1: none */
    assert_non_null(strstr(second, "| stale marks 3"));

    char metrics[4096] = "";
    FILE *m = fopen(path, "r");
    assert_non_null(m);
    size_t got = fread(metrics, 1, sizeof metrics - 1, m);
    metrics[got] = 0;
    fclose(m);
    unlink(path);
    assert_non_null(strstr(metrics, "\"stale_marks\": 0}"));
    assert_non_null(strstr(metrics, "\"stale_marks\": 3}"));
    assert_non_null(strstr(metrics, "\"pin_refused\": true"));
    free(text);
}

/* A run on masked data whose first steps' batches hold no target that
 * counts passes them over (one warning each) and trains its steps on the
 * next ones; the metrics count every step. */
static void test_fully_masked_batches_are_passed_over(void **state)
{
    (void)state;
    char dir[] = "/tmp/fso_test_train_masked.XXXXXX", path[128], metrics[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/masked.bin", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    fso_config cfg;
    fso_test_tiny_model(&cfg);
    cfg.steps = 2;
    const size_t span = (size_t)cfg.micro_batch * cfg.data.seq_len, n = 20 * span;
    int32_t *tok = malloc(n * sizeof *tok);
    uint8_t *f = malloc(n);
    assert_true(tok && f);
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)((i * 31 + 7) % 256);
        f[i] = i > 3 * span ? FSO_TOKEN_TARGET : 0; /* the first three steps learn nothing */
    }
    assert_int_equal(fso_data_write_flagged(path, tok, f, n, -1), 0);
    snprintf(cfg.data.path, sizeof cfg.data.path, "%s", path);
    FILE *out = fopen("/dev/null", "w");
    assert_non_null(out);
    fso_run_opts opts = {.metrics_path = metrics, .devices = "cpu", .out = out};
    assert_int_equal(fso_train_run(&cfg, &opts), 0);
    fclose(out);
    FILE *m = fopen(metrics, "r");
    assert_non_null(m);
    char line[4096];
    int steps = 0;
    while (fgets(line, sizeof line, m))
        steps += strstr(line, "\"loss\"") != NULL;
    fclose(m);
    assert_int_equal(steps, 2);
    unlink(metrics);
    unlink(path);
    rmdir(dir);
    free(tok);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_is_bit_identical),
        cmocka_unit_test(test_checkpointing_is_bit_identical),
        cmocka_unit_test(test_thread_count_changes_nothing),
        cmocka_unit_test(test_isa_changes_nothing),
        cmocka_unit_test(test_accumulation_matches_one_large_batch),
        cmocka_unit_test(test_divergence_stops_without_update),
        cmocka_unit_test(test_fully_masked_batches_are_passed_over),
        cmocka_unit_test(test_activation_estimate_matches_allocation),
        cmocka_unit_test(test_two_runs_at_once_in_one_process),
        cmocka_unit_test(test_report_shows_stale_marks_and_refused_pinning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
