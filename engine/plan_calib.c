/* plan_calib.c — the CPU devices' compute, timed (plan.h
 * fso_plan_calibrate_cpu): one layer of the model, with its embedding and
 * head, run on the devices side by side as training runs them; the rate
 * and the parts' times plan every layer. A timing that takes seconds is
 * kept in the probe cache (offload/probe.h); a quick one is taken again
 * by each process, since a shared machine's speed drifts from one minute
 * to the next. */
#include "plan.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_isa.h"
#include "model.h"
#include "probe.h"
#include "util.h"

typedef struct calib {
    float **flat, **grad;
    const fso_model *m;
    double t_open[3];    /* when block b's parameters were lent */
    double ms[8];        /* embed fwd, layer fwd, head, layer bwd, embed bwd */
    int layer_visits;
    double t_last_release;
} calib;


static const void *calib_params(void *ctx, int b)
{
    calib *c = ctx;
    c->t_open[b] = fso_now_ms();
    return c->flat[b];
}

static void calib_release(void *ctx, int b)
{
    calib *c = ctx;
    double dt = fso_now_ms() - c->t_open[b];
    c->t_last_release = fso_now_ms();
    if (b == 0 && c->ms[0] == 0)
        c->ms[0] = dt;
    else if (b == 1)
        c->ms[c->layer_visits++ == 0 ? 1 : 3] += dt;
    else if (b == 2)
        c->ms[2] += dt;
}

static float *calib_grads(void *ctx, int b)
{
    calib *c = ctx;
    memset(c->grad[b], 0, sizeof(float) * c->m->blocks[b].padded_elems);
    return c->grad[b];
}

static void calib_grads_done(void *ctx, int b)
{
    calib *c = ctx;
    if (b == 0 && c->ms[4] == 0) /* the embedding's backward follows the last release */
        c->ms[4] = fso_now_ms() - c->t_last_release;
}

/* The timing's place in the probe cache: this machine, then what the time
 * depends on (the layer's shapes, the tokens timed, the types, the devices
 * timed together and their threads, the backend and the instruction set). */
static void calib_key(const fso_config *cfg, int W, int B, int per_dev, char *buf, size_t len)
{
    const fso_model_config *mc = &cfg->model;
    char mkey[1024], e[256];
    fso_isa isa;
    fso_probe_key(mkey, sizeof mkey, NULL);
    const char *isa_name = fso_isa_from_env(&isa, e, sizeof e) == 0 ? fso_isa_name(isa) : "auto";
    snprintf(buf, len,
             "%slayer hidden %d ffn %d heads %d/%d head_dim %d vocab %d tied %d%s, %dx%d tokens, "
             "%s%s, %s: %d devices of %d threads, %s",
             mkey, mc->hidden_size, mc->intermediate_size, mc->num_attention_heads,
             mc->num_key_value_heads, mc->head_dim, mc->vocab_size, mc->tie_word_embeddings,
             fso_model_qkv_bias(mc) ? " qkv-bias" : "", B,
             cfg->data.seq_len, cfg->bf16 ? "bf16" : "fp32",
             cfg->activation_checkpointing ? ", checkpointed" : "",
             fso_backend_row_of(cfg->backend)->name, W, per_dev, isa_name);
}

/* One timed run of the layer, its embedding and its head, in ms, from a
 * timing's figures; layer_flops: one layer's forward and backward at the
 * timing's micro-batch. */
static double calib_run_ms(const fso_probe_layer *l, double layer_flops)
{
    return layer_flops / (l->gflops * 1e6) + l->embed_fwd_ms + l->head_ms + l->embed_bwd_ms;
}

/* ctx's compute from a timing of 1/scale of a micro-batch: every layer at
 * its rate, the embedding's and the head's visits their measured time,
 * scaled to the micro-batch, at it. */
static void calib_apply(fso_plan_ctx *ctx, const fso_probe_layer *l, double scale)
{
    const double part_ms[3] = {l->embed_fwd_ms * scale, l->head_ms * scale,
                               l->embed_bwd_ms * scale};
    ctx->in.machine.device_gflops = l->gflops;
    for (int k = 0; k < ctx->in.model.n_visits; k++) {
        const fso_visit_part p = ctx->visit_part[k];
        const int i = p == FSO_PART_EMBED_FWD ? 0 : p == FSO_PART_HEAD ? 1 : 2;
        ctx->visits[k].flops = p == FSO_PART_NONE ? 0
                               : p == FSO_PART_LAYER_FWD || p == FSO_PART_LAYER_BWD
                                   ? ctx->true_flops[k]
                                   : part_ms[i] * l->gflops * 1e6;
    }
}

/* After one untimed run (it pays the page faults), the best of up to
 * CALIB_REPS timed runs, another only while the timed runs stay within
 * CALIB_BUDGET_MS, judged by the run before. One run is not enough: a single
 * run of the 168M model of docs/benchmarks.md timed from 2.03 to 2.58 s of
 * compute in five quiet minutes (the best of three, 2.03 to 2.17, against
 * 2.02-2.09 s measured in training), and the 2.28B model's head, one run
 * each, 740 to 1500 ms. */
#define CALIB_REPS 3
#define CALIB_BUDGET_MS 12000.0

/* A timing whose runs take under CALIB_KEEP_MS is taken again by each
 * process rather than read from the probe cache: a shared machine's speed
 * drifts from one half minute to the next, and a small layer's most of
 * all. Ten training runs of configs/tiny.json in a row went from 89 to 70
 * ms per step (in the same minutes 1024-wide sgemm moved 8%), twelve runs
 * against a plan timed in the same process were within 5% of it, and the
 * cached timing of an earlier, busier minute planned 127 ms. A slow
 * layer's timing is kept for fsoff plan, which it would hold up for
 * seconds; fsoff train takes every timing afresh (fso_plan_time_afresh):
 * the 168M model of docs/benchmarks.md planned from a timing a quarter of
 * an hour old was 20% slow (2739 ms against 2280 measured), from its own
 * within 10%. */
#define CALIB_KEEP_MS 1000.0

/* The devices are timed side by side, as training runs them: they share
 * the machine's memory bandwidth and caches, and one device timed alone
 * computes 10-20% faster than each of two does in training. A thread per
 * device sets up, then every run starts together (a barrier before each);
 * if a device fails to set up, none runs. */
typedef struct calib_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived;
    unsigned gen;
    bool failed;
    /* set by the last device to arrive: whether the devices run again;
     * when the timed runs began, when the last run began, and the run
     * delay (run_delay_ms) at the start of the timed runs */
    bool more;
    double t_open, t_last, wait_open;
    /* the timed runs' window: its length and the time this process's
     * threads spent runnable but kept off a core by other jobs */
    double window_ms, waiting_ms;
} calib_gate;

/* The time this process's threads have spent runnable, waiting for a core
 * (the scheduler's run delay, /proc/self/task/(tid)/schedstat's second
 * field), summed, in ms; -1 where the kernel does not keep it. */
static double run_delay_ms(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    double sum = 0;
    bool any = false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long run = 0, wait = 0;
        if (f && fscanf(f, "%llu %llu", &run, &wait) == 2) {
            sum += (double)wait / 1e6;
            any = true;
        }
        if (f)
            fclose(f);
    }
    closedir(d);
    return any ? sum : -1;
}

/* The last device to arrive before run `gen` (0: the untimed one): whether
 * the devices run again, and the timed window when they stop. */
static void gate_decide(calib_gate *g, unsigned gen)
{
    const double now = fso_now_ms();
    if (gen == 1) { /* the timed runs start */
        g->t_open = now;
        g->wait_open = run_delay_ms();
    }
    /* the next run is taken as long as the last */
    const double next_end = now - g->t_open + (now - g->t_last);
    g->more = gen <= 1 || ((int)gen <= CALIB_REPS && next_end <= CALIB_BUDGET_MS);
    if (!g->more) {
        const double w = run_delay_ms();
        g->window_ms = now - g->t_open;
        g->waiting_ms = g->wait_open >= 0 && w >= g->wait_open ? w - g->wait_open : 0;
    }
    g->t_last = now;
}

/* Wait for the other n - 1 devices: 1 to run again, 0 when the timed runs
 * are done, -1 when a device failed. */
static int gate_pass(calib_gate *g, bool ok)
{
    pthread_mutex_lock(&g->mu);
    g->failed = g->failed || !ok;
    const unsigned gen = g->gen;
    if (++g->arrived >= g->n) {
        g->arrived = 0;
        if (!g->failed)
            gate_decide(g, gen);
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    const int go = g->failed ? -1 : g->more ? 1 : 0;
    pthread_mutex_unlock(&g->mu);
    return go;
}

/* Fewer devices than planned came to be (a thread could not start): the
 * gate opens for those there are, with the timing failed. */
static void gate_shrink(calib_gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    g->n = n;
    g->failed = true;
    if (g->arrived >= n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

typedef struct calib_dev {
    const fso_config *cfg;
    calib_gate *gate;
    int B, per_dev;
    double ms[5]; /* the best time of each part (calib.ms's order) */
    int rc;
    char err[512];
} calib_dev;

/* One device: B sequences through a one-layer model of cfg's shapes, as
 * many times as the gate says (an untimed run, then the timed ones), each
 * started with the other devices'. d->rc 0, or negative errno with the
 * reason in d->err (-ECANCELED: another device failed). */
static void *calib_run(void *arg)
{
    calib_dev *d = arg;
    const fso_config *cfg = d->cfg;
    const int B = d->B, T = cfg->data.seq_len;
    calib cal = {0}, *c = &cal;
    fso_model_config one = cfg->model;
    one.num_hidden_layers = 1;
    fso_backend *be = NULL;
    fso_model m;
    bool model_up = false;
    int32_t *tok = NULL;
    char why[200] = "";
    int rc = fso_backend_create(&be, cfg->backend, 0, d->per_dev, 0, why, sizeof why);
    if (rc < 0)
        snprintf(d->err, sizeof d->err, "cannot create the CPU backend: %s", why);
    else if ((rc = fso_model_init(&m, &one, be, B, T, 1, cfg->activation_checkpointing,
                                  cfg->bf16)) < 0)
        snprintf(d->err, sizeof d->err, "%s", m.err);
    else
        model_up = true;
    if (rc == 0) {
        c->m = &m;
        c->flat = calloc(3, sizeof *c->flat);
        c->grad = calloc(3, sizeof *c->grad);
        tok = malloc(sizeof(int32_t) * (size_t)B * T * 2);
        rc = c->flat && c->grad && tok ? 0 : -ENOMEM;
        for (int b = 0; b < 3 && rc == 0; b++) {
            /* in huge pages, as training's buffers and arena are: in 4 KiB
             * pages the 168M model of docs/benchmarks.md timed 70-85 GFLOP/s
             * from process to process (its head 317-542 ms), in huge pages
             * 82-85 (318-342 ms) */
            c->flat[b] = fso_io_alloc(sizeof(float) * m.blocks[b].padded_elems);
            c->grad[b] = fso_io_alloc(sizeof(float) * m.blocks[b].padded_elems);
            if (!c->flat[b] || !c->grad[b])
                rc = -ENOMEM;
        }
        if (rc == -ENOMEM)
            snprintf(d->err, sizeof d->err, "out of memory timing a layer");
    }
    if (rc == 0) {
        fso_model_init_flat(&m, c->flat, 1);
        if (m.wt == FSO_DT_BF16) /* lent as bf16: narrowed in place, front to back */
            for (int b = 0; b < 3; b++)
                for (size_t i = 0; i < m.blocks[b].padded_elems; i++)
                    ((uint16_t *)c->flat[b])[i] = fso_bf16_from_f32(c->flat[b][i]);
        for (size_t i = 0; i < (size_t)B * T * 2; i++)
            tok[i] = (int32_t)((i * 2654435761u) % (uint32_t)one.vocab_size);
    }
    fso_block_source src = {.ctx = c, .params = calib_params, .release = calib_release,
                            .grads = calib_grads, .grads_done = calib_grads_done};
    /* the first run pays the page faults; then the best of the rest (other
     * work on the machine only ever slows a run down) */
    for (int rep = 0;; rep++) {
        const int go = gate_pass(d->gate, rc == 0);
        if (go < 0 && rc == 0)
            rc = -ECANCELED;
        if (go <= 0)
            break;
        memset(c->ms, 0, sizeof c->ms);
        c->layer_visits = 0;
        double loss = 0;
        fso_model_step(&m, &src, tok, tok + (size_t)B * T, NULL,
                       fso_model_loss_scale((int64_t)B * T, (int64_t)B * T, 1), &loss);
        m.be->ops->sync(m.be);
        for (int i = 0; i < 5 && rep > 0; i++)
            d->ms[i] = rep == 1 || c->ms[i] < d->ms[i] ? c->ms[i] : d->ms[i];
    }
    if (rc == 0 && d->ms[1] + d->ms[3] <= 0) {
        rc = -EIO;
        snprintf(d->err, sizeof d->err, "timing a layer gave no time");
    }
    for (int b = 0; b < 3 && model_up; b++) { /* allocated only once the model is up */
        if (c->flat)
            fso_io_free(c->flat[b], sizeof(float) * m.blocks[b].padded_elems);
        if (c->grad)
            fso_io_free(c->grad[b], sizeof(float) * m.blocks[b].padded_elems);
    }
    free(c->flat);
    free(c->grad);
    free(tok);
    if (model_up)
        fso_model_free(&m);
    fso_backend_destroy(be);
    d->rc = rc;
    return NULL;
}

/* W devices of per_dev threads each timed side by side (calib_run); a
 * part's time is the slowest device's best, since training's devices meet
 * at every block; *share: of the timed window, the share other jobs kept
 * the threads off the cores (0 to 1). 0, or negative errno with the
 * reason in err. */
static int calib_time(const fso_config *cfg, int W, int B, int per_dev, double ms[5],
                      double *share, char *err, size_t errlen)
{
    if (share)
        *share = 0;
    calib_gate gate = {.n = W};
    calib_dev *d = calloc((size_t)W, sizeof *d);
    pthread_t *tid = calloc((size_t)W, sizeof *tid);
    if (!d || !tid) {
        free(d);
        free(tid);
        snprintf(err, errlen, "out of memory timing a layer");
        return -ENOMEM;
    }
    pthread_mutex_init(&gate.mu, NULL);
    pthread_cond_init(&gate.cv, NULL);
    int started = 0, rc = 0;
    for (int r = 0; r < W; r++)
        d[r] = (calib_dev){.cfg = cfg, .gate = &gate, .B = B, .per_dev = per_dev};
    for (; started < W; started++) {
        int e = pthread_create(&tid[started], NULL, calib_run, &d[started]);
        if (e != 0) {
            gate_shrink(&gate, started);
            rc = -e;
            snprintf(err, errlen, "cannot start a thread to time a device: %s", strerror(e));
            break;
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(tid[r], NULL);
    for (int i = 0; i < 5; i++)
        ms[i] = 0;
    for (int r = 0; r < started; r++) {
        if (rc == 0 && d[r].rc < 0 && d[r].rc != -ECANCELED) {
            rc = d[r].rc;
            snprintf(err, errlen, "%s", d[r].err);
        }
        for (int i = 0; i < 5; i++)
            ms[i] = d[r].ms[i] > ms[i] ? d[r].ms[i] : ms[i];
    }
    /* Other jobs on a shared machine: the share of the timed window the
     * devices' threads spent runnable but off the cores. It is not taken
     * out of the times: it understates what other jobs cost (threads
     * waiting on one kept off count as busy), so a time less that share is
     * still a busy minute's, only less so, and a run in the same minute is
     * slower than it; the caller reports it. */
    const double busy = gate.window_ms * (double)W * per_dev;
    if (rc == 0 && busy > 0 && gate.waiting_ms > 0 && share)
        *share = gate.waiting_ms / busy < 1 ? gate.waiting_ms / busy : 1;
    pthread_cond_destroy(&gate.cv);
    pthread_mutex_destroy(&gate.mu);
    free(d);
    free(tid);
    return rc;
}

/* When this process began timing layers (set once); whether it takes every
 * timing itself (fso_plan_time_afresh). Process-wide, and two runs in one
 * process may plan at once. */
static int64_t epoch;
static pthread_once_t epoch_once = PTHREAD_ONCE_INIT;
static atomic_bool afresh;

static void epoch_set(void)
{
    epoch = (int64_t)time(NULL);
}

void fso_plan_time_afresh(void)
{
    atomic_store(&afresh, true);
}

int fso_plan_calibrate_cpu(fso_plan_ctx *ctx, const fso_config *cfg, bool refresh, char *err,
                           size_t errlen)
{
    const int W = ctx->in.machine.devices;
    double layer_flops = 0, head_flops = 0; /* one layer's forward and backward; the head */
    for (int k = 0; k < ctx->in.model.n_visits; k++) {
        const fso_visit_part p = ctx->visit_part[k];
        if ((p == FSO_PART_LAYER_FWD || p == FSO_PART_LAYER_BWD) && ctx->visits[k].block == 1)
            layer_flops += ctx->true_flops[k];
        else if (p == FSO_PART_HEAD)
            head_flops += ctx->true_flops[k];
    }
    /* the configured micro-batch if it is quick, else one sequence; the
     * estimate here is only for the line below: the gate counts the runs */
    int B = cfg->micro_batch;
    double run_ms = 2.5 * (layer_flops + head_flops) / (ctx->probe_gflops * 1e6);
    if (4 * run_ms > 400 && B > 1) {
        run_ms /= B;
        B = 1;
    }
    int reps = (int)(CALIB_BUDGET_MS / run_ms);
    reps = reps < 1 ? 1 : reps > CALIB_REPS ? CALIB_REPS : reps;
    if (2 * run_ms > 20000) {
        snprintf(err, errlen, "the model is too large to time one layer in 20 s");
        return -E2BIG;
    }
    const double scale = (double)cfg->micro_batch / B;
    int threads = cfg->threads > 0 ? cfg->threads : fso_cpu_count();
    int per_dev = threads / W > 0 ? threads / W : 1;
    /* as many devices side by side as half the free memory holds, each a
     * one-layer model: its parameters and gradients in fp32, its
     * activations and the backend's working space */
    const int nb = ctx->in.model.n_blocks;
    fso_model_config one = cfg->model;
    one.num_hidden_layers = 1;
    const double one_bytes =
        8.0 * (double)(ctx->block_elems[0] + ctx->block_elems[1] + ctx->block_elems[nb - 1]) +
        (double)fso_model_activation_bytes_for(&one, B, cfg->data.seq_len,
                                               cfg->activation_checkpointing, cfg->bf16) +
        (cfg->bf16 ? (double)fso_model_cpu_widen_bytes_for(&one, B, cfg->data.seq_len) : 0);
    const double avail = (double)fso_mem_available_bytes();
    int together = W;
    if (avail > 0 && together * one_bytes > avail / 2)
        together = avail / 2 / one_bytes >= 1 ? (int)(avail / 2 / one_bytes) : 1;
    char path[PATH_MAX], e[512];
    fso_probe_layer l = {0};
    calib_key(cfg, together, B, per_dev, l.key, sizeof l.key);
    const bool cached = fso_probe_cache_path(path, sizeof path) == 0;
    /* the cache's timing if this process took it, or another process did
     * and it is slow to take (and this process does not take every one) */
    pthread_once(&epoch_once, epoch_set);
    const bool own = atomic_load(&afresh);
    if (cached && !refresh && fso_probe_layer_load(path, l.key, &l, e, sizeof e) == 0 &&
        (l.when >= epoch || (!own && (CALIB_REPS + 1) * calib_run_ms(&l, layer_flops / scale) >=
                                            CALIB_KEEP_MS))) {
        calib_apply(ctx, &l, scale);
        ctx->calibrated = true;
        return 0;
    }
    if ((reps + 1) * run_ms >= CALIB_KEEP_MS)
        fprintf(stderr, "fsoff: timing one layer of the model (about %.0f s%s)...\n",
                (reps + 1) * run_ms / 1e3,
                own ? ", at the machine's speed now" : ", once: kept in the probe cache");
    double ms[5], share = 0;
    int rc = calib_time(cfg, together, B, per_dev, ms, &share, err, errlen);
    if (rc < 0)
        return rc;
    /* the cache keeps the figures of B sequences, as timed */
    l.when = (int64_t)time(NULL);
    l.gflops = layer_flops / scale / (ms[1] + ms[3]) / 1e6;
    l.embed_fwd_ms = ms[0];
    l.head_ms = ms[2];
    l.embed_bwd_ms = ms[4];
    /* a kept timing plans every later run: one taken while other jobs held
     * the cores plans them all as slow as that minute */
    const bool kept = (CALIB_REPS + 1) * calib_run_ms(&l, layer_flops / scale) >= CALIB_KEEP_MS;
    if (share >= 0.1)
        fprintf(stderr, "fsoff: note: other jobs kept the timed layer's threads off the cores "
                        "%.0f%% of the time: the plan's compute is that minute's, slower than "
                        "this machine's%s\n",
                100 * share, kept ? "; it is kept in the probe cache, and `fsoff plan --probe` in "
                                    "a quiet minute times it again" : "");
    if (cached && fso_probe_layer_save(path, &l, e, sizeof e) < 0)
        fprintf(stderr, "fsoff: warning: %s\n", e);
    calib_apply(ctx, &l, scale);
    ctx->calibrated = true;
    return 0;
}
