/* test_checkpoint.c — checkpoints (engine/ckpt/checkpoint.h):
 *
 *  - CRC-32C: known values, the instruction path against the table;
 *  - the resolved configuration as JSON loads back to the same values;
 *  - a run saved while the next steps go on (the optimizer waiting for the
 *    saver block by block), then loaded into a new trainer on other tiers
 *    and schedules at the same device count, continues bit for bit as the
 *    uninterrupted run (GPU rules included: cpu-async);
 *  - saved under one per-block split (resident blocks, device-state
 *    blocks) and resumed under another, bit for bit, the split in the
 *    manifest's run record;
 *  - saved on 4 devices with state on NVMe and loaded on 1 and 2 with state
 *    in host memory it stays within float rounding;
 *  - a model of another shape or vocabulary is refused naming the key,
 *    harmless changes are said in one line;
 *  - corrupted, truncated and half-written checkpoints are refused naming
 *    the file and the offset, and `latest` always names a complete one;
 *  - ENOSPC and EIO while saving fail that save and lose nothing, training
 *    goes on and the next save works;
 *  - `keep` deletes the oldest only after a newer is complete, and follows
 *    no symlink; the save dir's lock keeps a second saver out;
 *  - the master comes out tensor by tensor in Hugging Face's order, and
 *    exported (fsoff export) reads back with --init-from bit for bit in fp32;
 *  - an export carries the starting folder's token ids, other config.json
 *    fields and tokenizer files, kept in the checkpoint; a checkpoint of an
 *    earlier fsoff (no "hf" in its manifest) still exports and says so.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_impl.h"
#include "config/config_json.h"
#include "ckpt/crc32c.h"
#include "data.h"
#include "test_util.h"
#include "train.h"
#include "zero/zero.h"

#define STEPS 5     /* the uninterrupted run */
#define SAVED_AT 2  /* the checkpoint's step */

static char work[256]; /* a temporary folder for this test program */

static void path_in(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(out, len, "%s/", work);
    va_start(ap, fmt);
    vsnprintf(out + n, len - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ a job */

typedef struct job {
    fso_config cfg;
    fso_data data;
    fso_trainer tr;
    int32_t *in, *tg;
    size_t n, bt;
} job;

static void config_for(fso_config *cfg, int world, fso_tier param, fso_tier optim)
{
    fso_test_small_model(cfg, world, 4);
    cfg->steps = STEPS;
    cfg->offload.param_tier = param;
    cfg->offload.optim_tier = optim;
    path_in(cfg->offload.param_nvme_path, sizeof cfg->offload.param_nvme_path, "nvme");
    path_in(cfg->offload.optim_nvme_path, sizeof cfg->offload.optim_nvme_path, "nvme");
    cfg->offload.aio_block_bytes = 8192; /* several chunks per shard */
}

static void job_open(job *j, const fso_config *cfg)
{
    memset(j, 0, sizeof *j);
    j->cfg = *cfg;
    if (fso_data_init(&j->data, &j->cfg) < 0)
        fail_msg("data: %s", j->data.err);
    if (fso_trainer_init(&j->tr, &j->cfg) < 0)
        fail_msg("trainer: %s", j->tr.err);
    j->n = fso_trainer_step_tokens(&j->cfg);
    j->bt = (size_t)j->cfg.micro_batch * j->cfg.data.seq_len;
    j->in = malloc(sizeof(int32_t) * j->n);
    j->tg = malloc(sizeof(int32_t) * j->n);
}

static void job_step(job *j, double *loss, double *norm)
{
    for (size_t a = 0; a < j->n / j->bt; a++)
        fso_data_next(&j->data, j->in + a * j->bt, j->tg + a * j->bt, NULL);
    fso_zero_step st;
    if (fso_trainer_step(&j->tr, j->in, j->tg, NULL, &st) < 0)
        fail_msg("step %lld: %s", (long long)fso_zero_steps(j->tr.zero) + 1, j->tr.err);
    *loss = st.loss;
    *norm = st.grad_norm;
}

static float *job_params(job *j, size_t *np)
{
    char err[512];
    *np = fso_zero_model(j->tr.zero)->n_params;
    float *p = malloc(sizeof(float) * *np);
    if (fso_zero_store_hf(j->tr.zero, p, err, sizeof err) < 0)
        fail_msg("store: %s", err);
    return p;
}

static void job_close(job *j)
{
    free(j->in);
    free(j->tg);
    fso_trainer_free(&j->tr);
    fso_data_free(&j->data);
}

static fso_ckpt_meta meta_of(job *j)
{
    return (fso_ckpt_meta){.cfg = &j->cfg, .data_position = (int64_t)j->data.pos,
                           .data_tokens = j->data.n_tokens, .hf = &j->tr.hf};
}

/* Start a save of the job's current step. */
static void save_begin(job *j, fso_ckpt_saver *sv)
{
    char err[512];
    fso_ckpt_meta m = meta_of(j);
    if (fso_ckpt_save_begin(sv, j->tr.zero, &m, err, sizeof err) < 0)
        fail_msg("save: %s", err);
}

static fso_ckpt_result save_wait(fso_ckpt_saver *sv)
{
    fso_ckpt_result r;
    assert_int_equal(fso_ckpt_save_poll(sv, true, &r), 1);
    return r;
}

static void save_dir(char *dir, size_t len, const char *name)
{
    path_in(dir, len, "%s", name);
    remove_tree(dir);
}

/* Load the checkpoint at path into a new job for cfg. */
static void job_resume(job *j, const fso_config *cfg, const char *path, char *said, size_t len)
{
    char err[1024];
    fso_ckpt *ck;
    if (fso_ckpt_open(&ck, path, err, sizeof err) < 0)
        fail_msg("open: %s", err);
    if (fso_ckpt_check_config(ck, cfg, said, len, err, sizeof err) < 0)
        fail_msg("check: %s", err);
    job_open(j, cfg);
    if (fso_ckpt_load(ck, j->tr.zero, err, sizeof err) < 0)
        fail_msg("load: %s", err);
    j->data.pos = (size_t)fso_ckpt_data_position(ck);
    assert_int_equal(fso_zero_steps(j->tr.zero), fso_ckpt_step(ck));
    fso_ckpt_close(ck);
}

/* SAVED_AT steps on `from`, a save started there while two more steps run
 * (so the updates of step SAVED_AT + 1 wait for the saver), then a new
 * trainer on `to` loaded from it runs steps SAVED_AT + 1 .. STEPS. */
static void interrupted(const fso_config *from, const fso_config *to, const char *dir,
                        run_result *r)
{
    job j;
    memset(r, 0, sizeof *r);
    r->steps = STEPS;
    char err[512], said[1024];
    fso_ckpt_saver *sv;
    if (fso_ckpt_saver_create(&sv, dir, 2, err, sizeof err) < 0)
        fail_msg("saver: %s", err);
    job_open(&j, from);
    double l, n;
    for (int s = 0; s < SAVED_AT; s++)
        job_step(&j, &r->loss[s], &r->norm[s]);
    save_begin(&j, sv);
    job_step(&j, &l, &n);
    job_step(&j, &l, &n);
    fso_ckpt_result res = save_wait(sv);
    if (res.rc < 0)
        fail_msg("save: %s", res.err);
    assert_int_equal(res.step, SAVED_AT);
    job_close(&j);
    fso_ckpt_saver_destroy(sv);

    job_resume(&j, to, dir, said, sizeof said);
    for (int s = SAVED_AT; s < STEPS; s++)
        job_step(&j, &r->loss[s], &r->norm[s]);
    r->params = job_params(&j, &r->np);
    job_close(&j);
}

/* A run on `from` straight through, and the same run saved at SAVED_AT
 * and resumed on `to` (interrupted): bit-identical from the step after the
 * save; dir keeps the checkpoint for the caller to read and remove. */
static void resume_is_bit_exact(const fso_config *from, const fso_config *to, const char *dir,
                                const char *what)
{
    run_result base, r;
    run_ok(from, NULL, &base);
    interrupted(from, to, dir, &r);
    assert_bit_identical(&base, &r, SAVED_AT + 1, what);
    result_free(&base);
    result_free(&r);
}

/* ------------------------------------------------------------------ CRC, config */

static void test_crc32c_known_values(void **state)
{
    (void)state;
    assert_int_equal(fso_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(fso_crc32c_sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(fso_crc32c(0, "", 0), 0);
    static unsigned char buf[3 * 3 * 8192 + 4099]; /* beyond three streams' stride, twice */
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += n < 4096 ? 97 : 1999) {
            uint32_t hw = fso_crc32c(0, buf + off, n), sw = fso_crc32c_sw(0, buf + off, n);
            if (hw != sw)
                fail_msg("offset %zu, %zu bytes: %08x vs %08x", off, n, hw, sw);
            /* a running CRC over two parts is the CRC of the whole */
            assert_int_equal(fso_crc32c(fso_crc32c(0, buf + off, n / 3), buf + off + n / 3,
                                        n - n / 3), hw);
        }
}

static void test_config_json_loads_back_to_the_same_values(void **state)
{
    (void)state;
    fso_config c, back;
    char path[512];
    fso_test_small_model(&c, 1, 4);
    c.grad_clip = 0.75;
    c.steps_per_print = 7;
    c.seed = 99;
    c.bf16 = true;
    c.optim.lr = 1.25e-4;
    c.optim.beta1 = 0.8;
    c.optim.beta2 = 0.97;
    c.optim.eps = 3e-7;
    c.optim.weight_decay = 0.05;
    c.optim.decay_norms = true;
    c.optim.decay_embeddings = true;
    c.sched.type = FSO_SCHED_WARMUP_DECAY;
    c.sched.warmup_type = FSO_WARMUP_LINEAR;
    c.sched.warmup_num_steps = 3;
    c.sched.total_num_steps = 40;
    c.sched.warmup_min_lr = 1e-6;
    c.sched.warmup_max_lr = 2e-3;
    c.data.format = FSO_DATA_TEXT;
    snprintf(c.data.path, sizeof c.data.path, "some \"text\".txt");
    c.steps = 123;
    c.threads = 3;
    c.activation_checkpointing = false;
    c.offload.stage = 2;
    c.offload.param_tier = FSO_TIER_HOST;
    c.offload.optim_tier = FSO_TIER_NVME;
    snprintf(c.offload.optim_nvme_path, sizeof c.offload.optim_nvme_path, "/a,/b");
    c.offload.pin_memory = true;
    c.offload.aio_block_bytes = 65536;
    c.offload.aio_queue_depth = 7;
    c.offload.prefetch_blocks = 3;
    c.optimizer_overlap = FSO_OVERLAP_NONE;
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "ckpts");
    c.checkpoint.every_steps = 10;
    c.checkpoint.keep = 3;
    c.model.rope_theta = 500000.0;
    c.model.rms_norm_eps = 1e-5;
    c.model.tie_word_embeddings = true;
    c.model.head_dim = 32; /* a head size of its own */
    c.model.rope_scaling = (fso_rope_scaling){FSO_ROPE_LLAMA3, 8.0, 1.0, 4.0, 128};
    json_t *j = fso_config_to_json(&c);
    assert_non_null(j);
    path_in(path, sizeof path, "config.json");
    assert_int_equal(json_dump_file(j, path, JSON_INDENT(1)), 0);
    fso_config_defaults(&back);
    if (fso_config_load_all(&back, path, NULL, 0) < 0)
        fail_msg("%s", back.err);
    json_t *again = fso_config_to_json(&back);
    fso_config_change ch[8];
    int n = fso_config_json_diff(j, again, ch, 8);
    for (int i = 0; i < n && i < 8; i++)
        print_message("%s: %s -> %s\n", ch[i].key, ch[i].was, ch[i].now);
    assert_int_equal(n, 0);
    /* and the values themselves */
    assert_true(back.grad_clip == c.grad_clip && back.optim.lr == c.optim.lr &&
                back.optim.beta2 == c.optim.beta2 && back.sched.total_num_steps == 40 &&
                back.offload.optim_tier == FSO_TIER_NVME && back.checkpoint.keep == 3 &&
                back.model.rope_theta == 500000.0 && back.seed == 99 &&
                back.model.head_dim == 32 && back.model.rope_scaling.type == FSO_ROPE_LLAMA3 &&
                back.model.rope_scaling.original_max_position_embeddings == 128 &&
                strcmp(back.data.path, c.data.path) == 0);
    /* one change is one line */
    back.optim.lr = 2e-4;
    json_decref(again);
    again = fso_config_to_json(&back);
    assert_int_equal(fso_config_json_diff(j, again, ch, 8), 1);
    assert_string_equal(ch[0].key, "optimizer.params.lr");
    json_decref(again);
    json_decref(j);
    fso_config_free(&back);

    /* the other model types' keys: a Qwen2 with its window on (and long
     * enough), a Mistral whose window is null (not its default 4096) */
    for (int k = 0; k < 2; k++) {
        c.model.model_type = k == 0 ? FSO_MODEL_QWEN2 : FSO_MODEL_MISTRAL;
        c.model.sliding_window = k == 0 ? 64 : 0;
        c.model.use_sliding_window = k == 0;
        c.model.max_window_layers = k == 0 ? 1 : 28;
        j = fso_config_to_json(&c);
        assert_non_null(j);
        assert_int_equal(json_dump_file(j, path, JSON_INDENT(1)), 0);
        fso_config_defaults(&back);
        if (fso_config_load_all(&back, path, NULL, 0) < 0)
            fail_msg("%s", back.err);
        again = fso_config_to_json(&back);
        assert_int_equal(fso_config_json_diff(j, again, ch, 8), 0);
        assert_memory_equal(&back.model, &c.model, sizeof c.model);
        json_decref(again);
        json_decref(j);
        fso_config_free(&back);
    }
    unlink(path);
}

/* ------------------------------------------------------------------ resume */

/* qwen2: model.model_type "qwen2", whose layers have q/k/v biases. */
static void tiers_case(int world, fso_tier p0, fso_tier o0, fso_overlap ov0, fso_tier p1,
                       fso_tier o1, fso_overlap ov1, bool bf16, const char *backend, bool qwen2)
{
    fso_config a, b;
    char dir[512], what[256];
    config_for(&a, world, p0, o0);
    config_for(&b, world, p1, o1);
    a.optimizer_overlap = ov0;
    b.optimizer_overlap = ov1;
    a.bf16 = b.bf16 = bf16;
    if (qwen2)
        a.model.model_type = b.model.model_type = FSO_MODEL_QWEN2;
    if (ov0 == FSO_OVERLAP_BACKWARD || ov1 == FSO_OVERLAP_BACKWARD)
        a.grad_clip = b.grad_clip = 0;
    if (backend) {
        a.backend = fso_backend_find(backend)->kind;
        b.backend = fso_backend_find(backend)->kind;
    }
    snprintf(what, sizeof what, "%d device(s)%s%s%s%s: tiers %d/%d overlap %d -> tiers %d/%d "
                                "overlap %d", world, bf16 ? ", bf16" : "",
             backend ? ", " : "", backend ? backend : "", qwen2 ? ", qwen2" : "", p0, o0, ov0, p1,
             o1, ov1);
    save_dir(dir, sizeof dir, "tiers");
    resume_is_bit_exact(&a, &b, dir, what);
    remove_tree(dir);
}

static void test_resume_is_bit_exact_on_any_tiers(void **state)
{
    (void)state;
    const fso_tier D = FSO_TIER_DEVICE, H = FSO_TIER_HOST, N = FSO_TIER_NVME;
    const fso_overlap none = FSO_OVERLAP_NONE, fwd = FSO_OVERLAP_FORWARD,
                      bwd = FSO_OVERLAP_BACKWARD;
    tiers_case(2, N, N, fwd, D, H, fwd, false, NULL, false);  /* NVMe (read, cloned) -> memory */
    tiers_case(2, H, H, none, N, N, fwd, false, NULL, false); /* host arena, written in place */
    tiers_case(2, D, D, bwd, H, N, none, false, NULL, false); /* device, copied (not aligned) */
    tiers_case(1, D, D, fwd, N, N, fwd, true, NULL, false);   /* bf16: params from the master */
    tiers_case(2, N, N, fwd, H, H, bwd, false, NULL, true);   /* Qwen2: biases resume too */
}

static void test_resume_is_bit_exact_with_gpu_rules(void **state)
{
    (void)state;
    /* cpu-async: device memory the CPU cannot address, copies after marks,
     * the optimizer's update on the device */
    const fso_tier D = FSO_TIER_DEVICE, H = FSO_TIER_HOST;
    tiers_case(2, D, D, FSO_OVERLAP_FORWARD, H, H, FSO_OVERLAP_FORWARD, false,
               fso_test_gpu_rules(), false);
    tiers_case(1, D, H, FSO_OVERLAP_FORWARD, D, D, FSO_OVERLAP_NONE, true, fso_test_gpu_rules(),
               true);
}

/* A checkpoint saved under one per-block split (resident parameter blocks,
 * blocks whose optimizer state is on the devices) resumes bit-exactly under
 * another: shards are saved in one format whatever their tier. The
 * manifest's run record says the split it was saved under. */
static void test_resume_across_block_splits_is_bit_exact(void **state)
{
    (void)state;
    const fso_tier H = FSO_TIER_HOST, N = FSO_TIER_NVME;
    const char *const backends[] = {NULL, fso_test_gpu_rules()};
    for (int be = 0; be < 2; be++) {
        fso_config a, b;
        char dir[512], what[160], p[1024];
        config_for(&a, 2, N, H);
        config_for(&b, 2, H, N);
        a.offload.resident_blocks = 2;
        a.offload.device_state_blocks = 3;
        a.offload.device_state_first = true;
        b.offload.resident_blocks = 0;
        b.offload.device_state_blocks = 1;
        a.optimizer_overlap = b.optimizer_overlap = FSO_OVERLAP_FORWARD;
        if (backends[be])
            a.backend = b.backend = fso_backend_find(backends[be])->kind;
        snprintf(what, sizeof what, "%s: 2 resident, state of the first 3 on the devices -> "
                                    "none resident, state of the last one on the devices",
                 backends[be] ? backends[be] : "cpu");
        save_dir(dir, sizeof dir, "splits");
        resume_is_bit_exact(&a, &b, dir, what);
        snprintf(p, sizeof p, "%s/step-%08d/%s", dir, SAVED_AT, FSO_CKPT_MANIFEST);
        json_t *man = json_load_file(p, 0, NULL);
        assert_non_null(man);
        json_t *run = json_object_get(man, "run");
        assert_int_equal(json_integer_value(json_object_get(run, "resident_blocks")), 2);
        assert_int_equal(json_integer_value(json_object_get(run, "device_state_blocks")), 3);
        assert_string_equal(json_string_value(json_object_get(run, "device_state_from")),
                            "first");
        json_decref(man);
        remove_tree(dir);
    }
}

/* bf16 working gradients (train.gradient_dtype) change nothing saved: the
 * gradient shards and the optimizer's state stay fp32, so a resume is bit
 * exact, on CPU devices (rounded in place) and on a GPU's rules (bf16 send
 * buffers, reduce_scatter_bf16). */
static void test_resume_with_bf16_gradients_is_bit_exact(void **state)
{
    (void)state;
    const fso_tier D = FSO_TIER_DEVICE, H = FSO_TIER_HOST, N = FSO_TIER_NVME;
    for (int gpu = 0; gpu < 2; gpu++) {
        fso_config a, b;
        char dir[512], what[96];
        config_for(&a, 2, gpu ? D : N, gpu ? D : N);
        config_for(&b, 2, H, H);
        a.bf16 = b.bf16 = a.bf16_grads = b.bf16_grads = true;
        if (gpu)
            a.backend = b.backend = fso_backend_find(fso_test_gpu_rules())->kind;
        snprintf(what, sizeof what, "bf16 gradients, 2 devices, %s",
                 gpu ? fso_test_gpu_rules() : "cpu");
        save_dir(dir, sizeof dir, "bf16g");
        resume_is_bit_exact(&a, &b, dir, what);
        remove_tree(dir);
    }
}

static void test_resume_on_other_device_counts_is_within_rounding(void **state)
{
    (void)state;
    fso_config four, other;
    char dir[512];
    run_result base;
    config_for(&four, 4, FSO_TIER_NVME, FSO_TIER_NVME); /* saved on 4 devices, state on NVMe */
    run_ok(&four, NULL, &base);
    const int worlds[] = {1, 2};
    for (int w = 0; w < 2; w++) {
        run_result r;
        /* loaded on 1 and 2 with state in host memory, the same global batch */
        config_for(&other, worlds[w], FSO_TIER_HOST, FSO_TIER_HOST);
        save_dir(dir, sizeof dir, "worlds");
        interrupted(&four, &other, dir, &r);
        for (int s = SAVED_AT; s < STEPS; s++)
            if (fabs(r.loss[s] - base.loss[s]) > 1e-5 * fabs(base.loss[s]) ||
                fabs(r.norm[s] - base.norm[s]) > 1e-5 * fabs(base.norm[s]))
                fail_msg("%d devices, step %d: loss %.9g norm %.9g; 4 devices: %.9g %.9g",
                         worlds[w], s + 1, r.loss[s], r.norm[s], base.loss[s], base.norm[s]);
        for (size_t p = 0; p < base.np; p++)
            if (fabs(r.params[p] - base.params[p]) > 1e-5 + 1e-4 * fabs(base.params[p]))
                fail_msg("%d devices: parameter %zu: %.9g vs %.9g", worlds[w], p, r.params[p],
                         base.params[p]);
        result_free(&r);
        remove_tree(dir);
    }
    result_free(&base);
}

/* A checkpoint of cfg after `steps` steps in dir; the master then, in
 * Hugging Face order, into *master when it is not NULL (*np values). */
static void save_after(const fso_config *cfg, const char *dir, int steps, float **master,
                       size_t *np)
{
    job j;
    char err[512];
    fso_ckpt_saver *sv;
    double l, n;
    remove_tree(dir);
    if (fso_ckpt_saver_create(&sv, dir, 2, err, sizeof err) < 0)
        fail_msg("saver: %s", err);
    job_open(&j, cfg);
    for (int s = 0; s < steps; s++)
        job_step(&j, &l, &n);
    save_begin(&j, sv);
    fso_ckpt_result r = save_wait(sv);
    if (r.rc < 0)
        fail_msg("save: %s", r.err);
    if (master)
        *master = job_params(&j, np);
    job_close(&j);
    fso_ckpt_saver_destroy(sv);
}

/* A saved checkpoint in dir at step SAVED_AT, and its configuration. */
static void saved(const char *dir, fso_config *cfg)
{
    config_for(cfg, 1, FSO_TIER_HOST, FSO_TIER_HOST);
    save_after(cfg, dir, SAVED_AT, NULL, NULL);
}

static int *hidden_of(fso_config *c) { return &c->model.hidden_size; }
static int *vocab_of(fso_config *c) { return &c->model.vocab_size; }
static int *layers_of(fso_config *c) { return &c->model.num_hidden_layers; }
static int *kv_of(fso_config *c) { return &c->model.num_key_value_heads; }

static void test_another_model_is_refused_naming_the_key(void **state)
{
    (void)state;
    fso_config cfg, changed;
    char dir[512], err[1024], said[1024];
    fso_ckpt *ck;
    save_dir(dir, sizeof dir, "shape");
    saved(dir, &cfg);
    assert_int_equal(fso_ckpt_open(&ck, dir, err, sizeof err), 0);
    assert_int_equal(fso_ckpt_check_config(ck, &cfg, said, sizeof said, err, sizeof err), 0);
    assert_string_equal(said, "");

    /* each a change of shape, refused naming its key */
    static const struct {
        const char *says;
        int *(*field)(fso_config *);
        int value;
    } refused[] = {
        {"model.hidden_size is 64 in", hidden_of, 128},
        {"model.vocab_size is 256 in", vocab_of, 512},
        {"model.num_hidden_layers is 2 in", layers_of, 3},
        {"model.num_key_value_heads is 2 in", kv_of, 4},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        changed = cfg;
        *refused[i].field(&changed) = refused[i].value;
        assert_int_equal(fso_ckpt_check_config(ck, &changed, said, sizeof said, err, sizeof err),
                         -EINVAL);
        if (!strstr(err, refused[i].says) || !strstr(err, "another shape"))
            fail_msg("%s: %s", refused[i].says, err);
    }
    changed = cfg; /* the vocabulary has its own words */
    changed.model.vocab_size = 512;
    fso_ckpt_check_config(ck, &changed, said, sizeof said, err, sizeof err);
    assert_non_null(strstr(err, "(another vocabulary)"));

    /* steps, devices, tiers, save dir, schedule length: accepted, said */
    changed = cfg;
    changed.steps = 50;
    changed.world = 2;
    changed.micro_batch = 2;
    changed.offload.optim_tier = FSO_TIER_NVME;
    changed.sched.total_num_steps = 80;
    snprintf(changed.checkpoint.dir, sizeof changed.checkpoint.dir, "elsewhere");
    assert_int_equal(fso_ckpt_check_config(ck, &changed, said, sizeof said, err, sizeof err), 0);
    print_message("said: %s\n", said);
    assert_null(strchr(said, '\n'));
    const char *want[] = {"train.steps 5 -> 50", "devices 1 -> 2",
                          "zero_optimization.offload_optimizer.device \"cpu\" -> \"nvme\"",
                          "scheduler.params.total_num_steps", "checkpoint.dir"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(said, want[i]))
            fail_msg("said lacks %s: %s", want[i], said);
    fso_ckpt_close(ck);
    remove_tree(dir);
}

/* ------------------------------------------------------------------ damage */

static bool g_without_uring; /* load_rc reads one chunk at a time */

/* Open and load path into a trainer for the saved configuration. */
static int load_rc(const char *path, char *err, size_t len)
{
    fso_ckpt *ck = NULL;
    err[0] = 0;
    int rc = fso_ckpt_open(&ck, path, err, len);
    if (rc == 0 && g_without_uring)
        fso_ckpt_read_without_uring(ck);
    if (rc == 0) {
        fso_config cfg;
        job j;
        config_for(&cfg, 1, FSO_TIER_HOST, FSO_TIER_HOST);
        job_open(&j, &cfg);
        rc = fso_ckpt_load(ck, j.tr.zero, err, len);
        job_close(&j);
        fso_ckpt_close(ck);
    }
    return rc;
}

static void expect_error(const char *path, const char *a, const char *b)
{
    char err[1024];
    if (load_rc(path, err, sizeof err) == 0)
        fail_msg("%s: loaded; expected an error with \"%s\"", path, a);
    if (!strstr(err, a) || (b && !strstr(err, b)))
        fail_msg("%s: the error lacks \"%s\"%s%s: %s", path, a, b ? " and " : "", b ? b : "",
                 err);
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char c;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &c, 1, off), 1);
    c ^= 0x10;
    assert_int_equal(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_corrupted_and_truncated_checkpoints_name_file_and_offset(void **state)
{
    (void)state;
    fso_config cfg;
    char dir[512], ck[600], data[700], man[700], want[800], err[1024];
    save_dir(dir, sizeof dir, "damage");
    saved(dir, &cfg);
    snprintf(ck, sizeof ck, "%s/step-%08d", dir, SAVED_AT);
    snprintf(data, sizeof data, "%s/%s", ck, FSO_CKPT_DATA);
    snprintf(man, sizeof man, "%s/%s", ck, FSO_CKPT_MANIFEST);
    struct stat st;
    assert_int_equal(stat(data, &st), 0);
    assert_int_equal(load_rc(dir, err, sizeof err), 0); /* as saved, through `latest` */

    /* one flipped bit: named by the file and its chunk's offset, whether
     * the chunks are read several at a time or one by one */
    const off_t at = st.st_size / 2 + 4100;
    flip_byte(data, at);
    snprintf(want, sizeof want, "%s: offset ", data);
    for (int one_by_one = 0; one_by_one < 2; one_by_one++) {
        g_without_uring = one_by_one;
        expect_error(ck, want, "checksum mismatch");
        load_rc(ck, err, sizeof err);
        unsigned long long off = strtoull(strstr(err, want) + strlen(want), NULL, 10);
        assert_true(off <= (unsigned long long)at &&
                    (unsigned long long)at < off + FSO_ZERO_SAVE_PIECE_BYTES);
        assert_int_equal(off % 4096, 0);
    }
    flip_byte(data, at);
    assert_int_equal(load_rc(ck, err, sizeof err), 0);
    g_without_uring = false;
    assert_int_equal(load_rc(ck, err, sizeof err), 0);

    /* truncated: the file and where it ends */
    assert_int_equal(truncate(data, st.st_size - 4096), 0);
    snprintf(want, sizeof want, "%s: truncated at offset %lld", data,
             (long long)st.st_size - 4096);
    expect_error(ck, want, NULL);
    assert_int_equal(truncate(data, st.st_size), 0); /* zeros: the checksum catches them */
    expect_error(ck, data, "checksum mismatch");

    /* a damaged manifest: the file, line and column */
    assert_int_equal(stat(man, &st), 0);
    assert_int_equal(truncate(man, st.st_size / 2), 0);
    snprintf(want, sizeof want, "%s:", man);
    expect_error(ck, want, "damaged");
    remove_tree(dir);
}

static void test_half_written_checkpoints_are_never_latest(void **state)
{
    (void)state;
    fso_config cfg;
    char dir[512], p[700], err[1024];
    save_dir(dir, sizeof dir, "half");
    saved(dir, &cfg);
    /* what a kill during later saves leaves: a temporary folder with part
     * of its data, and one renamed but... never: rename comes last. A
     * folder without its manifest is not a checkpoint either. */
    path_in(p, sizeof p, "half/.tmp-step-00000003");
    assert_int_equal(mkdir(p, 0755), 0);
    path_in(p, sizeof p, "half/.tmp-step-00000003/state.bin");
    write_text(p, "partial");
    path_in(p, sizeof p, "half/step-00000004");
    assert_int_equal(mkdir(p, 0755), 0);
    path_in(p, sizeof p, "half/step-00000004/state.bin");
    write_text(p, "no manifest");
    assert_int_equal(load_rc(dir, err, sizeof err), 0); /* latest: step 2 */
    path_in(p, sizeof p, "half/step-00000004");
    expect_error(p, "no checkpoint here", NULL);

    /* the next saver clears what killed saves left */
    fso_ckpt_saver *sv;
    assert_int_equal(fso_ckpt_saver_create(&sv, dir, 2, err, sizeof err), 0);
    path_in(p, sizeof p, "half/.tmp-step-00000003");
    assert_int_equal(access(p, F_OK), -1);
    fso_ckpt_saver_destroy(sv);

    /* `latest` naming nothing, or garbage */
    path_in(p, sizeof p, "half/latest");
    write_text(p, "step-00000009\n");
    expect_error(dir, "names step-00000009", NULL);
    write_text(p, "../../etc\n");
    expect_error(dir, "expected the name of a checkpoint folder", NULL);
    remove_tree(dir);
}

/* ------------------------------------------------------------------ faults */

static void save_with_fault(fso_fault_spec spec, const char *why)
{
    fso_config cfg;
    char dir[512], p[700], err[512];
    fso_ckpt_saver *sv;
    job j;
    double l, n;
    config_for(&cfg, 2, FSO_TIER_HOST, FSO_TIER_NVME);
    save_dir(dir, sizeof dir, "faults");
    assert_int_equal(fso_ckpt_saver_create(&sv, dir, 1, err, sizeof err), 0);
    job_open(&j, &cfg);
    job_step(&j, &l, &n);
    save_begin(&j, sv);
    fso_ckpt_result ok = save_wait(sv);
    assert_int_equal(ok.rc, 0);

    /* the next save fails partway through writing state.bin */
    fso_ckpt_saver_inject_faults(sv, &spec);
    job_step(&j, &l, &n);
    save_begin(&j, sv);
    job_step(&j, &l, &n); /* training goes on: the gate opens when the save fails */
    fso_ckpt_result bad = save_wait(sv);
    print_message("%s: %s\n", why, bad.err);
    assert_true(bad.rc < 0);
    assert_int_equal(bad.step, 2);
    assert_non_null(strstr(bad.err, why));
    assert_non_null(strstr(bad.err, FSO_CKPT_DATA));
    /* nothing lost: step 1 is still the latest, complete, and kept */
    fso_ckpt *ck;
    assert_int_equal(fso_ckpt_open(&ck, dir, err, sizeof err), 0);
    assert_int_equal(fso_ckpt_step(ck), 1);
    fso_ckpt_close(ck);
    path_in(p, sizeof p, "faults/.tmp-step-00000002");
    assert_int_equal(access(p, F_OK), -1);
    path_in(p, sizeof p, "faults/step-00000002");
    assert_int_equal(access(p, F_OK), -1);

    /* and the save after it works (keep 1: step 1 goes once step 3 is complete) */
    fso_fault_spec none = {0};
    fso_ckpt_saver_inject_faults(sv, &none);
    save_begin(&j, sv);
    assert_int_equal(save_wait(sv).rc, 0);
    path_in(p, sizeof p, "faults/step-00000001");
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(load_rc(dir, err, sizeof err), 0); /* saved on 2 devices, loads on 1 */
    job_close(&j);
    fso_ckpt_saver_destroy(sv);
    remove_tree(dir);
}

static void test_enospc_while_saving_loses_nothing(void **state)
{
    (void)state;
    fso_fault_spec spec = {.write_enospc_at = 3};
    save_with_fault(spec, "No space left on device");
}

static void test_eio_while_saving_loses_nothing(void **state)
{
    (void)state;
    fso_fault_spec spec = {.write_eio_at = 2};
    save_with_fault(spec, "Input/output error");
}

/* An update waiting for a save of an earlier step goes on when that save
 * ends and the next one, of the update's own step, is armed before the
 * update's thread runs again: that save waits for the update, so holding
 * the update back would hang training and the save. */
typedef struct step_job {
    job *j;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} step_job;

static void *step_main(void *arg)
{
    step_job *s = arg;
    double l, n;
    job_step(s->j, &l, &n);
    pthread_mutex_lock(&s->mu);
    s->done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void test_an_update_never_waits_for_a_save_of_its_own_step(void **state)
{
    (void)state;
    fso_config cfg;
    job j;
    double l, n;
    config_for(&cfg, 2, FSO_TIER_HOST, FSO_TIER_HOST);
    cfg.optimizer_overlap = FSO_OVERLAP_FORWARD; /* step t's update runs after step t */
    job_open(&j, &cfg);
    fso_zero *z = j.tr.zero;
    job_step(&j, &l, &n);
    assert_int_equal(fso_zero_save_arm(z), 0); /* a save of step 1, never streamed */
    job_step(&j, &l, &n);
    usleep(200 * 1000); /* step 2's update waits for that save, at block 0 */
    fso_zero_save_disarm(z);
    assert_int_equal(fso_zero_save_arm(z), 0); /* a save of step 2, at once */
    /* step 3's forward needs step 2's update: on a thread, so a hang fails here */
    step_job s = {.j = &j};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, step_main, &s), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&s.mu);
    while (!s.done && pthread_cond_timedwait(&s.cv, &s.mu, &until) == 0)
        ;
    const bool done = s.done;
    pthread_mutex_unlock(&s.mu);
    if (!done)
        fail_msg("step 3 did not finish in 60 s: step 2's update waited for the save of step 2");
    fso_zero_save_disarm(z); /* step 3's update waits for it until now */
    pthread_join(tid, NULL);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    job_close(&j);
}

/* ------------------------------------------------------------------ the save dir */

static void test_keep_deletes_the_oldest_after_a_newer_is_complete(void **state)
{
    (void)state;
    fso_config cfg;
    char dir[512], p[700], target[700], err[512];
    fso_ckpt_saver *sv;
    job j;
    double l, n;
    config_for(&cfg, 1, FSO_TIER_HOST, FSO_TIER_HOST);
    save_dir(dir, sizeof dir, "keep");
    assert_int_equal(fso_ckpt_saver_create(&sv, dir, 2, err, sizeof err), 0);
    /* a symlink that looks like an old checkpoint: neither it nor what it
     * points at is deleted */
    path_in(target, sizeof target, "keep-target");
    remove_tree(target);
    assert_int_equal(mkdir(target, 0755), 0);
    path_in(p, sizeof p, "keep-target/%s", FSO_CKPT_MANIFEST);
    write_text(p, "{}");
    path_in(p, sizeof p, "keep/step-00000000");
    assert_int_equal(symlink(target, p), 0);

    job_open(&j, &cfg);
    for (int s = 1; s <= 4; s++) {
        job_step(&j, &l, &n);
        save_begin(&j, sv);
        assert_int_equal(save_wait(sv).rc, 0);
    }
    job_close(&j);
    for (int s = 1; s <= 4; s++) {
        path_in(p, sizeof p, "keep/step-%08d", s);
        assert_int_equal(access(p, F_OK), s >= 3 ? 0 : -1);
    }
    path_in(p, sizeof p, "keep/step-00000000");
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    path_in(p, sizeof p, "keep-target/%s", FSO_CKPT_MANIFEST);
    assert_int_equal(access(p, F_OK), 0);

    /* a second saver on the same folder is refused while this one holds it */
    fso_ckpt_saver *other;
    assert_int_equal(fso_ckpt_saver_create(&other, dir, 2, err, sizeof err), -EBUSY);
    assert_non_null(strstr(err, "another fsoff is saving checkpoints there"));
    fso_ckpt_saver_destroy(sv);
    remove_tree(dir);
    remove_tree(target);
}

/* ------------------------------------------------------------------ export's view */

static void test_tensors_come_out_in_hugging_face_order(void **state)
{
    (void)state;
    fso_config cfg;
    char dir[512], err[512];
    config_for(&cfg, 2, FSO_TIER_NVME, FSO_TIER_NVME);
    cfg.model.tie_word_embeddings = false;
    save_dir(dir, sizeof dir, "tensors");
    size_t np;
    float *hf;
    save_after(&cfg, dir, 1, &hf, &np);
    const int n_blocks = fso_model_n_blocks(&cfg.model);
    fso_block_layout *blocks = calloc((size_t)n_blocks, sizeof *blocks);
    fso_model_layout(blocks, &cfg.model, 1);

    fso_ckpt *ck;
    assert_int_equal(fso_ckpt_open(&ck, dir, err, sizeof err), 0);
    const size_t slices[] = {0, 4096, 12288};
    for (size_t k = 0; k < 3; k++) {
        fso_ckpt_iter *it;
        fso_ckpt_tensor t;
        assert_int_equal(fso_ckpt_tensors_begin(ck, slices[k], &it, err, sizeof err), 0);
        size_t at = 0, pieces = 0;
        int b = 0, ti = 0, rc;
        while ((rc = fso_ckpt_tensors_next(it, &t, err, sizeof err)) == 1) {
            const fso_tensor_desc *d = &blocks[b].tensors[ti];
            assert_string_equal(t.name, d->name);
            assert_int_equal(t.rows, d->rows);
            assert_int_equal(t.cols, d->cols);
            assert_true(t.first + t.n <= t.numel && t.n > 0);
            if (memcmp(t.data, hf + at, sizeof(float) * t.n) != 0)
                fail_msg("%s [%zu, +%zu): not the master", t.name, t.first, t.n);
            at += t.n;
            pieces++;
            if (t.first + t.n == t.numel && ++ti == blocks[b].n_tensors) {
                ti = 0;
                b++;
            }
        }
        assert_int_equal(rc, 0);
        assert_int_equal(at, np);
        assert_int_equal(b, n_blocks);
        if (slices[k])
            assert_true(pieces > (size_t)n_blocks * 2); /* large tensors came in slices */
        fso_ckpt_tensors_end(it);
    }
    fso_ckpt_close(ck);
    free(hf);
    free(blocks);
    remove_tree(dir);
}

/* fsoff export's conversion: the folder read back with --init-from gives
 * the checkpoint's master bit for bit in fp32; bf16 is the master rounded. */
static void test_export_round_trip_is_bit_exact_in_fp32(void **state)
{
    (void)state;
    fso_config cfg;
    char dir[512], out[600], err[1024], set[700];
    job j;
    config_for(&cfg, 2, FSO_TIER_HOST, FSO_TIER_NVME);
    cfg.model.tie_word_embeddings = false;
    save_dir(dir, sizeof dir, "export");
    size_t np;
    float *master;
    save_after(&cfg, dir, 1, &master, &np);

    const fso_hf_dtype types[] = {FSO_HF_F32, FSO_HF_BF16};
    for (int d = 0; d < 2; d++) {
        fso_ckpt *ck;
        fso_hf_export_opts o = {.dtype = types[d]};
        path_in(out, sizeof out, "export-%s", fso_hf_dtype_name(types[d]));
        remove_tree(out);
        assert_int_equal(fso_ckpt_open(&ck, dir, err, sizeof err), 0);
        if (fso_ckpt_export_hf(ck, out, &o, err, sizeof err) < 0)
            fail_msg("export: %s", err);
        fso_ckpt_close(ck);

        fso_config from;
        fso_config_defaults(&from);
        char *sets[] = {set, "data.seq_len=32", "train_micro_batch_size_per_gpu=4"};
        snprintf(set, sizeof set, "model.init_from=\"%s\"", out);
        if (fso_config_load_all(&from, NULL, sets, 3) < 0)
            fail_msg("config: %s", from.err);
        from.threads = 2;
        job_open(&j, &from);
        size_t n2;
        float *back = job_params(&j, &n2);
        assert_int_equal(n2, np);
        for (size_t i = 0; i < np; i++) {
            float want = master[i];
            if (types[d] == FSO_HF_BF16) { /* round to nearest even */
                uint32_t u;
                memcpy(&u, &want, 4);
                u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
                memcpy(&want, &u, 4);
            }
            if (memcmp(&back[i], &want, sizeof(float)) != 0)
                fail_msg("%s: parameter %zu: %.9g read back, %.9g in the checkpoint",
                         fso_hf_dtype_name(types[d]), i, back[i], master[i]);
        }
        free(back);
        job_close(&j);
        fso_config_free(&from);
        remove_tree(out);
    }
    free(master);
    remove_tree(dir);
}

/* path's bytes (NUL-terminated), failing the test when it cannot be read. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: %s", path, strerror(errno));
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The configuration of a job from Hugging Face folder dir. */
static void folder_config(fso_config *from, const char *dir)
{
    char set[700];
    char *sets[] = {set, "data.seq_len=32", "train_micro_batch_size_per_gpu=4"};
    fso_config_defaults(from);
    snprintf(set, sizeof set, "model.init_from=\"%s\"", dir);
    if (fso_config_load_all(from, NULL, sets, 3) < 0)
        fail_msg("config: %s", from->err);
    from->threads = 2;
}

static void job_from_folder(job *j, fso_config *from, const char *dir)
{
    folder_config(from, dir);
    job_open(j, from);
}

static const char tokenizer[] = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n";

/* A Hugging Face folder (fp32) with Llama 3's token ids and tokenizer files. */
static void llama3_like_folder(const char *hf)
{
    fso_config cfg;
    job j;
    char err[1024], said[1024], p[700];
    config_for(&cfg, 1, FSO_TIER_HOST, FSO_TIER_HOST);
    job_open(&j, &cfg);
    remove_tree(hf);
    if (fso_trainer_export_hf(&j.tr, hf, FSO_HF_F32, said, sizeof said, err, sizeof err) < 0)
        fail_msg("export: %s", err);
    assert_non_null(strstr(said, "from scratch"));
    job_close(&j);
    snprintf(p, sizeof p, "%s/config.json", hf);
    json_t *c = json_load_file(p, 0, NULL);
    assert_non_null(c);
    assert_null(json_object_get(c, "bos_token_id"));
    json_object_set_new(c, "bos_token_id", json_integer(128000));
    json_object_set_new(c, "eos_token_id", json_pack("[i,i]", 128001, 128009));
    json_object_set_new(c, "transformers_version", json_string("4.45.0"));
    assert_int_equal(json_dump_file(c, p, JSON_INDENT(2)), 0);
    json_decref(c);
    snprintf(p, sizeof p, "%s/tokenizer.json", hf);
    write_text(p, tokenizer);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", hf);
    write_text(p, "{\"bos_token\": \"<|begin_of_text|>\"}\n");
    snprintf(p, sizeof p, "%s/generation_config.json", hf);
    write_text(p, "{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128009]}\n");
}

/* Export checkpoint dir into out; what the export said. */
static void export_into(const char *dir, const char *out, char *said, size_t len)
{
    char err[1024];
    fso_ckpt *ck;
    fso_hf_extras x;
    fso_hf_export_opts o = {.dtype = FSO_HF_BF16, .extras = &x};
    remove_tree(out);
    assert_int_equal(fso_ckpt_open(&ck, dir, err, sizeof err), 0);
    if (fso_ckpt_hf_extras(ck, &x, err, sizeof err) < 0 ||
        fso_ckpt_export_hf(ck, out, &o, err, sizeof err) < 0)
        fail_msg("export: %s", err);
    fso_hf_extras_describe(&x, said, len);
    fso_hf_extras_free(&x);
    fso_ckpt_close(ck);
}

static void test_export_carries_the_starting_folders_token_ids_and_files(void **state)
{
    (void)state;
    fso_config from;
    job j;
    char hf[512], dir[512], out[512], p[700], err[1024], said[2048];
    double l, n;
    path_in(hf, sizeof hf, "llama3-like");
    path_in(out, sizeof out, "carried");
    save_dir(dir, sizeof dir, "carry");
    llama3_like_folder(hf);

    /* trained from the folder and saved; the folder then changes */
    fso_ckpt_saver *sv;
    if (fso_ckpt_saver_create(&sv, dir, 1, err, sizeof err) < 0)
        fail_msg("saver: %s", err);
    job_from_folder(&j, &from, hf);
    job_step(&j, &l, &n);
    save_begin(&j, sv);
    fso_ckpt_result r = save_wait(sv);
    if (r.rc < 0)
        fail_msg("save: %s", r.err);
    fso_ckpt_saver_destroy(sv);
    job_close(&j);
    fso_config_free(&from);
    snprintf(p, sizeof p, "%s/tokenizer.json", hf);
    write_text(p, "changed after the run started\n");

    export_into(dir, out, said, sizeof said);
    snprintf(p, sizeof p, "%s/config.json", out);
    json_t *c = json_load_file(p, 0, NULL);
    assert_non_null(c);
    assert_int_equal(json_integer_value(json_object_get(c, "bos_token_id")), 128000);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(c, "eos_token_id"), 1)),
                     128009);
    assert_string_equal(json_string_value(json_object_get(c, "transformers_version")), "4.45.0");
    assert_string_equal(json_string_value(json_object_get(c, "torch_dtype")), "bfloat16");
    json_decref(c);
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    char *text = slurp(p);
    assert_string_equal(text, tokenizer); /* the one the run started with */
    free(text);
    snprintf(p, sizeof p, "%s/generation_config.json", out);
    free(slurp(p));
    snprintf(p, sizeof p, "%s/special_tokens_map.json", out);
    assert_int_equal(access(p, F_OK), -1);
    assert_non_null(strstr(said, "bos_token_id 128000, eos_token_id [128001, 128009]"));
    assert_non_null(strstr(said, "has no special_tokens_map.json"));

    /* a damaged copy is named; a checkpoint of an earlier fsoff exports and says so */
    char ck_dir[600];
    snprintf(ck_dir, sizeof ck_dir, "%s/step-00000001", dir);
    snprintf(p, sizeof p, "%s/tokenizer.json", ck_dir);
    flip_byte(p, 3);
    fso_ckpt *ck;
    fso_hf_extras x;
    assert_int_equal(fso_ckpt_open(&ck, ck_dir, err, sizeof err), 0);
    assert_int_equal(fso_ckpt_hf_extras(ck, &x, err, sizeof err), -EIO);
    assert_non_null(strstr(err, "tokenizer.json: its CRC-32C is not the manifest's"));
    fso_ckpt_close(ck);
    snprintf(p, sizeof p, "%s/%s", ck_dir, FSO_CKPT_MANIFEST);
    json_t *man = json_load_file(p, 0, NULL);
    assert_non_null(man);
    assert_int_equal(json_object_del(man, "hf"), 0);
    assert_int_equal(json_dump_file(man, p, JSON_INDENT(1)), 0);
    json_decref(man);
    export_into(dir, out, said, sizeof said);
    assert_non_null(strstr(said, "written by an earlier fsoff"));
    snprintf(p, sizeof p, "%s/config.json", out);
    c = json_load_file(p, 0, NULL);
    assert_null(json_object_get(c, "bos_token_id"));
    json_decref(c);

    /* a file too large to be a tokenizer is refused by name */
    snprintf(p, sizeof p, "%s/tokenizer.json", hf);
    assert_int_equal(truncate(p, (off_t)FSO_HF_CARRIED_MAX_BYTES + 1), 0);
    fso_trainer tr;
    folder_config(&from, hf);
    assert_true(fso_trainer_init(&tr, &from) < 0);
    assert_non_null(strstr(tr.err, "tokenizer.json: 64.0 MiB"));
    assert_non_null(strstr(tr.err, "remove or rename it"));
    fso_trainer_free(&tr);
    fso_config_free(&from);
    remove_tree(out);
    remove_tree(hf);
    remove_tree(dir);
}

static int setup(void **state)
{
    (void)state;
    char p[512];
    if (fso_test_group_dir(work, sizeof work, "fsoff-ckpt") < 0)
        return -1;
    path_in(p, sizeof p, "nvme");
    return mkdir(p, 0755);
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(work);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_known_values),
        cmocka_unit_test(test_config_json_loads_back_to_the_same_values),
        cmocka_unit_test(test_resume_is_bit_exact_on_any_tiers),
        cmocka_unit_test(test_resume_is_bit_exact_with_gpu_rules),
        cmocka_unit_test(test_resume_across_block_splits_is_bit_exact),
        cmocka_unit_test(test_resume_on_other_device_counts_is_within_rounding),
        cmocka_unit_test(test_resume_with_bf16_gradients_is_bit_exact),
        cmocka_unit_test(test_another_model_is_refused_naming_the_key),
        cmocka_unit_test(test_corrupted_and_truncated_checkpoints_name_file_and_offset),
        cmocka_unit_test(test_half_written_checkpoints_are_never_latest),
        cmocka_unit_test(test_enospc_while_saving_loses_nothing),
        cmocka_unit_test(test_eio_while_saving_loses_nothing),
        cmocka_unit_test(test_an_update_never_waits_for_a_save_of_its_own_step),
        cmocka_unit_test(test_keep_deletes_the_oldest_after_a_newer_is_complete),
        cmocka_unit_test(test_tensors_come_out_in_hugging_face_order),
        cmocka_unit_test(test_export_round_trip_is_bit_exact_in_fp32),
        cmocka_unit_test(test_export_carries_the_starting_folders_token_ids_and_files),
    };
    fso_test_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
