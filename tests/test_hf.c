/* test_hf.c — Hugging Face folders: the safetensors reader's checks and
 * conversions, --init-from against PyTorch, export, the round trip, and
 * what is refused; last, that remove_tree (test_util.h), which cleans up
 * the folders here, follows no symlink.
 *
 * The fixtures (tests/fixtures/hf/, written by tests/gen_hf_fixtures.py
 * with transformers' semantics in float64) are small Llama folders with
 * what PyTorch computes from them: the weights as float32, the rotary
 * tables, one batch's loss and gradients, and the weights after one AdamW
 * step. Tolerances, fp32 against float64 truth, as test_golden.c's:
 *   the weights as loaded: bit for bit (BF16 and F16 widen exactly);
 *   rotary tables: 2e-7 absolute (both round the same angle to fp32);
 *   loss: relative 1e-5; gradients: normalized error 1e-5 per tensor;
 *   weights after the step: |diff| <= 1e-5 + 1e-4 |value| per element.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "adamw.h"
#include "config/config.h"
#include "hf/hf.h"
#include "model.h"
#include "hf/safetensors.h"
#include "rng.h"
#include "test_util.h"
#include "train.h"
#include "zero/zero.h"

/* ------------------------------------------------------------------ helpers */

static char tmp_root[256];

static int make_tmp(void **state)
{
    (void)state;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/fso_test_hf.XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int drop_tmp(void **state)
{
    (void)state;
    remove_tree(tmp_root);
    return 0;
}

static void src_path(char *buf, size_t size, const char *rel)
{
    const char *src = getenv("FSO_SRCDIR");
    snprintf(buf, size, "%s/tests/fixtures/hf/%s", src ? src : "..", rel);
}

/* A fresh folder under the test's temporary root. */
static void tmp_dir(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp_root, name);
    remove_tree(buf);
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}


/* A copy of fixture folder `name` under the temporary root, as dst. */
static void copy_fixture(char *dst, size_t size, const char *name)
{
    char src[1024];
    src_path(src, sizeof src, name);
    tmp_dir(dst, size, name);
    assert_int_equal(mkdir(dst, 0755), 0);
    DIR *d = opendir(src);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char from[1300], to[1300];
        size_t len;
        snprintf(from, sizeof from, "%.1023s/%.255s", src, e->d_name);
        snprintf(to, sizeof to, "%.1023s/%.255s", dst, e->d_name);
        void *buf = fso_test_read_file(from, &len);
        write_bytes(to, buf, len);
        free(buf);
    }
    closedir(d);
}

static void assert_contains(const char *msg, const char *part)
{
    if (!strstr(msg, part))
        fail_msg("expected \"%s\" in: %s", part, msg);
}

/* A safetensors file from an 8-byte length and a header text, then `data` bytes. */
static size_t st_bytes(char *out, const char *header, size_t data)
{
    uint64_t n = strlen(header);
    memcpy(out, &n, 8);
    memcpy(out + 8, header, n);
    memset(out + 8 + n, 0x3c, data);
    return 8 + n + data;
}

/* Parse header+data from memory; the error message, or "" when accepted. */
static const char *parse_err(const char *header, size_t data)
{
    static char err[512];
    static char buf[8192];
    size_t len = st_bytes(buf, header, data);
    fso_st_file f;
    err[0] = '\0';
    int rc = fso_st_parse(&f, "x.safetensors", buf, len, len, err, sizeof err);
    if (rc == 0) {
        fso_st_close(&f);
        return "";
    }
    assert_int_equal(rc, -EINVAL);
    assert_true(err[0] != '\0');
    return err;
}

/* ------------------------------------------------------------------ the reader's checks */

static void test_valid_headers_are_read(void **state)
{
    (void)state;
    /* Any order in the header; offsets decide. Metadata, an empty tensor, a
     * dtype fsoff does not read, a member the format does not define. */
    const char *h = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
                    "\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8],\"x\":1},"
                    "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,4],\"data_offsets\":[24,24]}}  ";
    char buf[512], err[512];
    size_t len = st_bytes(buf, h, 24);
    fso_st_file f;
    if (fso_st_parse(&f, "x.safetensors", buf, len, len, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(f.n, 3);
    const fso_st_tensor *b = fso_st_find(&f, "b");
    assert_non_null(b);
    assert_int_equal(b->numel, 4);
    assert_int_equal(b->begin, 8);
    assert_int_equal(fso_st_find(&f, "a")->dtype, FSO_ST_I64);
    assert_int_equal(fso_st_find(&f, "e")->numel, 0);
    assert_null(fso_st_find(&f, "__metadata__"));
    fso_st_close(&f);
    assert_string_equal(parse_err("{}", 0), "");
}

static void test_header_rules_are_enforced(void **state)
{
    (void)state;
    /* Each rule of the reference implementation, and the message names the
     * file and the tensor. */
    assert_contains(parse_err("[1]", 0), "x.safetensors: the header is not a JSON object");
    assert_contains(parse_err("{\"a\":", 0), "x.safetensors: header at byte");
    assert_contains(parse_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                    "a tensor name appears twice");
    assert_contains(parse_err("{\"\xff\":1}", 0), "x.safetensors: header at byte");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                    "x.safetensors: tensor 'w': dtype \"F33\" is not one of safetensors'");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
                    "tensor 'w': shape[0] is not a size");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4),
                    "tensor 'w': shape[0] is not a size");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4),
                    "tensor 'w': data_offsets must be [begin, end]");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
                    "tensor 'w': no shape");
    assert_contains(parse_err("{\"w\":[1]}", 0), "tensor 'w': expected an object");
    /* offsets: a gap, an overlap, an end before the begin, a size that is not shape x dtype */
    assert_contains(parse_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12),
                    "tensor 'b': data_offsets [8, 12] leave a gap after the data's previous end");
    assert_contains(parse_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                    "tensor 'b': data_offsets [4, 8] overlap the data before at 8");
    assert_contains(parse_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,-1]}}", 0),
                    "data_offsets must be [begin, end]");
    assert_contains(parse_err("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4),
                    "tensor 'b'");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
                    "tensor 'w': data_offsets span 8 bytes, but shape [3] of BF16 is 6 bytes");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                              "\"data_offsets\":[0,4]}}", 4),
                    "tensor 'w': its shape's size overflows 64 bits");
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
                    "3 elements of F4 are not a whole number of bytes");
    /* the data must end where the file ends */
    assert_contains(parse_err("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6),
                    "the tensors' data ends at byte");
    assert_contains(parse_err("{\"__metadata__\":{\"format\":1}}", 0),
                    "__metadata__: 'format' must be a string");
}

static void test_header_length_and_truncation(void **state)
{
    (void)state;
    char err[512], path[1024], buf[256];
    fso_st_file f;
    uint64_t huge = 100000001;
    memcpy(buf, &huge, 8);
    assert_int_equal(fso_st_parse(&f, "x.safetensors", buf, 8, 1u << 30, err, sizeof err),
                     -EINVAL);
    assert_contains(err, "x.safetensors: header length 100000001 is over safetensors' limit");
    assert_int_equal(fso_st_parse(&f, "x.safetensors", buf, 4, 4, err, sizeof err), -EINVAL);
    assert_contains(err, "x.safetensors: 4 bytes, too short for a safetensors file");

    /* A file cut short: in the header, then in the data. */
    size_t len = st_bytes(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                          16);
    tmp_dir(path, sizeof path, "cut.safetensors");
    write_bytes(path, buf, len);
    assert_int_equal(fso_st_open(&f, path, err, sizeof err), 0);
    fso_st_close(&f);
    write_bytes(path, buf, 30);
    assert_int_equal(fso_st_open(&f, path, err, sizeof err), -EINVAL);
    assert_contains(err, "cut.safetensors: header length");
    assert_contains(err, "runs past the end of the file (30 bytes)");
    write_bytes(path, buf, len - 3);
    assert_int_equal(fso_st_open(&f, path, err, sizeof err), -EINVAL);
    assert_contains(err, "cut.safetensors: the tensors' data ends at byte");
    assert_contains(err, "truncated");
}

/* ------------------------------------------------------------------ dtypes */

static double f16_value(uint16_t h)
{
    return (double)fso_f32_from_f16(h);
}

static void test_f16_conversions_are_exact_and_round_to_nearest_even(void **state)
{
    (void)state;
    /* Widening: every fp16 value, against its definition. */
    for (uint32_t h = 0; h < 65536; h++) {
        int e = (h >> 10) & 31, m = h & 1023;
        double want = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (h & 0x8000)
            want = -want;
        float got = fso_f32_from_f16((uint16_t)h);
        if (e == 31) {
            assert_true(m ? isnan(got) : isinf(got));
            assert_int_equal(fso_f16_from_f32(got) & 0xfc00, h & 0xfc00);
            continue;
        }
        if ((double)got != want)
            fail_msg("f16 %04x: got %.10g want %.10g", h, got, want);
        assert_int_equal(fso_f16_from_f32(got), h); /* and back */
    }
    /* Narrowing: the nearest fp16, ties to even, over many fp32 values. */
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 2000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        union { uint32_t u; float f; } x = {.u = (uint32_t)s};
        if (!isfinite(x.f) || fabsf(x.f) >= 65520.0f)
            continue;
        uint16_t h = fso_f16_from_f32(x.f);
        double d = fabs(f16_value(h) - x.f);
        uint16_t up = (uint16_t)(h + 1), down = (uint16_t)(h - 1);
        double du = (up & 0x7c00) == 0x7c00 ? INFINITY : fabs(f16_value(up) - x.f);
        double dd = (h & 0x7fff) == 0 ? INFINITY : fabs(f16_value(down) - x.f);
        if (d > du || d > dd || ((d == du || d == dd) && (h & 1)))
            fail_msg("f32 %a: f16 %04x is not the nearest even", (double)x.f, h);
    }
    assert_int_equal(fso_f16_from_f32(65504.0f), 0x7bff);
    assert_int_equal(fso_f16_from_f32(65519.99f), 0x7bff);
    assert_int_equal(fso_f16_from_f32(65520.0f), 0x7c00);       /* the tie goes to even: inf */
    assert_int_equal(fso_f16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* tie down to even */
    assert_int_equal(fso_f16_from_f32(1.0f + 0x3p-11f), 0x3c02); /* tie up to even */
    assert_int_equal(fso_f16_from_f32(0x1p-25f), 0x0000);        /* half the smallest: even 0 */
    assert_int_equal(fso_f16_from_f32(0x1.8p-25f), 0x0001);
    assert_int_equal(fso_f16_from_f32(-0.0f), 0x8000);
}

/* Write F32, BF16 and F16 tensors with the writer and read them back in pieces. */
static void test_writer_and_reader_agree_on_every_dtype(void **state)
{
    (void)state;
    enum { N = 1000 };
    float v[N], back[N];
    uint16_t b16[N], h16[N];
    for (int i = 0; i < N; i++) {
        v[i] = (float)sin(i * 0.37) * (float)(1 << (i % 13));
        b16[i] = fso_bf16_from_f32(v[i]);
        h16[i] = fso_f16_from_f32(v[i]);
    }
    fso_st_entry e[3] = {{"a.f32", FSO_ST_F32, 2, {10, 100}},
                         {"b.bf16", FSO_ST_BF16, 1, {N}},
                         {"c.f16", FSO_ST_F16, 2, {N / 2, 2}}};
    char path[1024], err[512];
    tmp_dir(path, sizeof path, "dtypes.safetensors");
    fso_st_writer w;
    if (fso_st_writer_open(&w, path, e, 3, err, sizeof err) < 0 ||
        fso_st_writer_write(&w, v, sizeof v, err, sizeof err) < 0 ||
        fso_st_writer_write(&w, b16, sizeof b16, err, sizeof err) < 0)
        fail_msg("%s", err);
    /* finishing short of what the header promised is refused */
    fso_st_writer w2;
    char path2[1100];
    snprintf(path2, sizeof path2, "%s.short", path);
    assert_int_equal(fso_st_writer_open(&w2, path2, e, 3, err, sizeof err), 0);
    assert_int_equal(fso_st_writer_finish(&w2, err, sizeof err), -EINVAL);
    assert_contains(err, "bytes written, its header describes");
    if (fso_st_writer_write(&w, h16, sizeof h16, err, sizeof err) < 0 ||
        fso_st_writer_finish(&w, err, sizeof err) < 0)
        fail_msg("%s", err);

    fso_st_file f;
    if (fso_st_open(&f, path, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(f.data_offset % 8, 0); /* header padded as transformers writes it */
    const char *names[3] = {"a.f32", "b.bf16", "c.f16"};
    for (int k = 0; k < 3; k++) {
        const fso_st_tensor *t = fso_st_find(&f, names[k]);
        assert_non_null(t);
        memset(back, 0xff, sizeof back);
        for (size_t at = 0; at < N; at += 333) { /* uneven pieces */
            size_t n = N - at < 333 ? N - at : 333;
            if (fso_st_read_f32(&f, t, at, n, back + at, err, sizeof err) < 0)
                fail_msg("%s", err);
        }
        for (int i = 0; i < N; i++) {
            float want = k == 0 ? v[i] : k == 1 ? fso_f32_from_bf16(b16[i])
                                                : fso_f32_from_f16(h16[i]);
            if (memcmp(&back[i], &want, 4) != 0)
                fail_msg("%s[%d]: got %g want %g", names[k], i, back[i], want);
        }
    }
    assert_int_equal(fso_st_read_f32(&f, fso_st_find(&f, "a.f32"), 990, 11, back, err,
                                     sizeof err), -EINVAL);
    fso_st_close(&f);
}

/* ------------------------------------------------------------------ PyTorch fixtures */

typedef struct expected {
    fso_st_file f;
    float hyper[7];
    int B, T;
} expected;

static void load_expected(expected *x, const char *name)
{
    char path[1024], file[300], err[512];
    snprintf(file, sizeof file, "%s.expected.safetensors", name);
    src_path(path, sizeof path, file);
    if (fso_st_open(&x->f, path, err, sizeof err) < 0)
        fail_msg("%s (FSO_SRCDIR must point to the source tree)", err);
    const fso_st_tensor *h = fso_st_find(&x->f, "hyper");
    assert_non_null(h);
    assert_int_equal(fso_st_read_f32(&x->f, h, 0, 7, x->hyper, err, sizeof err), 0);
    x->B = (int)x->hyper[5];
    x->T = (int)x->hyper[6];
}

/* Tensor `name` of the expected file as fp32 (numel floats, caller frees). */
static float *expected_tensor(expected *x, const char *name, size_t numel)
{
    char err[512];
    const fso_st_tensor *t = fso_st_find(&x->f, name);
    if (!t)
        fail_msg("%s: no tensor %s", x->f.path, name);
    assert_int_equal(t->numel, numel);
    float *v = malloc(sizeof(float) * (numel ? numel : 1));
    assert_non_null(v);
    if (fso_st_read_f32(&x->f, t, 0, numel, v, err, sizeof err) < 0)
        fail_msg("%s", err);
    return v;
}

typedef struct variant {
    int world;
    const char *tier;   /* "none": every kind on the device; "cpu": in the host arena */
    fso_backend_kind backend; /* the devices' (0: the fast CPU backend) */
} variant;

/* The configuration a user would give: the folder, the batch, one AdamW step. */
static int fixture_config(fso_config *cfg, const char *dir, const expected *x, const variant *v,
                          const char *extra)
{
    char sets[12][1200];
    int n = 0;
    fso_config_defaults(cfg);
    cfg->world = v->world;
    cfg->backend = v->backend;
    snprintf(sets[n++], sizeof sets[0], "model.init_from=\"%s\"", dir);
    snprintf(sets[n++], sizeof sets[0], "data.seq_len=%d", x->T);
    snprintf(sets[n++], sizeof sets[0], "train_micro_batch_size_per_gpu=%d", x->B / v->world);
    snprintf(sets[n++], sizeof sets[0], "gradient_clipping=0");
    snprintf(sets[n++], sizeof sets[0], "scheduler=null");
    snprintf(sets[n++], sizeof sets[0],
             "optimizer={\"type\": \"AdamW\", \"params\": {\"lr\": %.9g, \"betas\": [%.9g, %.9g], "
             "\"eps\": %.9g, \"weight_decay\": %.9g}}",
             x->hyper[0], x->hyper[1], x->hyper[2], x->hyper[3], x->hyper[4]);
    snprintf(sets[n++], sizeof sets[0], "train.threads=2");
    snprintf(sets[n++], sizeof sets[0],
             "zero_optimization={\"offload_param\": {\"device\": \"%s\"}, "
             "\"offload_optimizer\": {\"device\": \"%s\"}}", v->tier, v->tier);
    if (extra)
        snprintf(sets[n++], sizeof sets[0], "%s", extra);
    char *argv[12];
    for (int i = 0; i < n; i++)
        argv[i] = sets[i];
    return fso_config_load_all(cfg, NULL, argv, n);
}

/* Per-tensor normalized error against want (HF order); the bad tensor count. */
static int compare_tensors(const char *what, const fso_model *m, const float *got,
                           expected *x, const char *prefix, double tol)
{
    size_t off = 0;
    int bad = 0;
    for (int b = 0; b < m->n_blocks; b++)
        for (int i = 0; i < m->blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &m->blocks[b].tensors[i];
            char name[128];
            snprintf(name, sizeof name, "%s%s", prefix, d->name);
            float *want = expected_tensor(x, name, d->numel);
            double num = 0, den = 0;
            for (size_t e = 0; e < d->numel; e++) {
                double diff = (double)got[off + e] - want[e];
                num += isfinite(got[off + e]) ? diff * diff : INFINITY;
                den += (double)want[e] * want[e];
            }
            double err = sqrt(num / (den > 0 ? den : 1));
            if (!(err <= tol)) {
                fprintf(stderr, "%s %s: normalized error %.3g > %.3g\n", what, d->name, err, tol);
                bad++;
            }
            free(want);
            off += d->numel;
        }
    return bad;
}

/* Read a whole exported folder back, in HF order (n_params floats). */
static float *read_folder(const char *dir, const fso_model_config *mc, size_t n_params)
{
    char err[512];
    fso_hf_folder *h;
    if (fso_hf_open(&h, dir, mc, err, sizeof err) < 0)
        fail_msg("%s", err);
    int nb = fso_model_n_blocks(mc);
    fso_block_layout *blocks = calloc((size_t)nb, sizeof *blocks);
    float *hf = malloc(sizeof(float) * n_params);
    assert_non_null(blocks);
    assert_non_null(hf);
    fso_model_layout(blocks, mc, 1);
    size_t off = 0;
    for (int b = 0; b < nb; b++) {
        float *flat = calloc(blocks[b].padded_elems, sizeof(float));
        assert_non_null(flat);
        if (fso_hf_read_block(h, b, flat, err, sizeof err) < 0)
            fail_msg("%s", err);
        for (int i = 0; i < blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &blocks[b].tensors[i];
            memcpy(hf + off, flat + d->offset_elems, sizeof(float) * d->numel);
            off += d->numel;
        }
        free(flat);
    }
    assert_int_equal(off, n_params);
    free(blocks);
    fso_hf_close(h);
    return hf;
}

static void run_fixture(const char *name, variant v)
{
    expected x;
    char dir[1024], out[1024], err[512];
    load_expected(&x, name);
    src_path(dir, sizeof dir, name);
    fso_config cfg;
    if (fixture_config(&cfg, dir, &x, &v, NULL) < 0)
        fail_msg("%s", cfg.err);
    fso_trainer tr;
    if (fso_trainer_init(&tr, &cfg) < 0)
        fail_msg("trainer: %s", tr.err);
    const fso_model *m = fso_zero_model(tr.zero);
    const size_t np = m->n_params;
    float *buf = malloc(sizeof(float) * np);
    assert_non_null(buf);

    /* the weights, widened exactly from the file's dtype */
    assert_int_equal(fso_zero_store_hf(tr.zero, buf, err, sizeof err), 0);
    size_t off = 0;
    for (int b = 0; b < m->n_blocks; b++)
        for (int i = 0; i < m->blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &m->blocks[b].tensors[i];
            char tn[128];
            snprintf(tn, sizeof tn, "param0.%s", d->name);
            float *want = expected_tensor(&x, tn, d->numel);
            if (memcmp(buf + off, want, sizeof(float) * d->numel) != 0)
                fail_msg("%s: %s as loaded differs from PyTorch's", name, d->name);
            free(want);
            off += d->numel;
        }

    /* the rotary tables (rope_scaling included) */
    const int half = m->mc.head_dim / 2;
    float *cs = expected_tensor(&x, "rope.cos", (size_t)x.T * half);
    float *sn = expected_tensor(&x, "rope.sin", (size_t)x.T * half);
    for (int i = 0; i < x.T * half; i++)
        if (fabsf(m->rope_cos[i] - cs[i]) > 2e-7f || fabsf(m->rope_sin[i] - sn[i]) > 2e-7f)
            fail_msg("%s: rope table [t %d, pair %d]: cos %.9g sin %.9g, PyTorch %.9g %.9g",
                     name, i / half, i % half, m->rope_cos[i], m->rope_sin[i], cs[i], sn[i]);
    free(cs);
    free(sn);

    /* one step: the loss and the gradients */
    const size_t ntok = (size_t)x.B * x.T;
    float *fin = expected_tensor(&x, "inputs", ntok), *ftg = expected_tensor(&x, "targets", ntok);
    int32_t *in = malloc(sizeof(int32_t) * ntok), *tg = malloc(sizeof(int32_t) * ntok);
    assert_non_null(in);
    assert_non_null(tg);
    for (size_t i = 0; i < ntok; i++)
        in[i] = (int32_t)fin[i], tg[i] = (int32_t)ftg[i];
    fso_zero_step st;
    if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
        fail_msg("step: %s", tr.err);
    float *loss = expected_tensor(&x, "loss", 1);
    if (!(fabs(st.loss - loss[0]) <= 1e-5 * fabs(loss[0])))
        fail_msg("%s: loss %.9g, PyTorch %.9g", name, st.loss, loss[0]);
    assert_int_equal(fso_zero_store_grads_hf(tr.zero, buf, err, sizeof err), 0);
    assert_int_equal(compare_tensors("gradient", m, buf, &x, "grad.", 1e-5), 0);

    /* exported after the step, the weights are PyTorch's after its AdamW step. The first
     * step moves a weight by lr * g / (|g| + eps) (m and v bias-corrected are g and g^2) and
     * the decay, so where g is near eps the step follows g's last bits: each element may
     * differ by that function's change between fsoff's gradient and PyTorch's, beyond the
     * fixed tolerance. */
    tmp_dir(out, sizeof out, "export");
    fso_hf_export_opts o = {.dtype = FSO_HF_F32};
    if (fso_zero_export_hf(tr.zero, out, &o, err, sizeof err) < 0)
        fail_msg("export: %s", err);
    float *exported = read_folder(out, &m->mc, np);
    const double lr = x.hyper[0], eps = x.hyper[3];
    off = 0;
    int bad = 0;
    for (int b = 0; b < m->n_blocks; b++)
        for (int i = 0; i < m->blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &m->blocks[b].tensors[i];
            char tn[128], gn[128];
            snprintf(tn, sizeof tn, "param1.%s", d->name);
            snprintf(gn, sizeof gn, "grad.%s", d->name);
            float *want = expected_tensor(&x, tn, d->numel);
            float *gt = expected_tensor(&x, gn, d->numel);
            for (size_t e = 0; e < d->numel; e++) {
                double g = exported[off + e], w = want[e], gf = buf[off + e];
                double follows = lr * fabs(gf / (fabs(gf) + eps) - gt[e] / (fabs(gt[e]) + eps));
                if (!(fabs(g - w) <= 1e-5 + 1e-4 * fabs(w) + 1.01 * follows) && bad++ < 5)
                    fprintf(stderr, "%s: %s[%zu] after the step %.9g, PyTorch %.9g\n", name,
                            d->name, e, g, w);
            }
            free(want);
            free(gt);
            off += d->numel;
        }
    assert_int_equal(bad, 0);
    remove_tree(out);

    free(exported);
    free(loss);
    free(fin);
    free(ftg);
    free(in);
    free(tg);
    free(buf);
    fso_trainer_free(&tr);
    fso_config_free(&cfg);
    fso_st_close(&x.f);
}

static void test_gqa_head_dim_bf16_matches_pytorch(void **state)
{
    (void)state;
    run_fixture("gqa_head_dim_bf16", (variant){1, "none", FSO_BACKEND_CPU});
    run_fixture("gqa_head_dim_bf16", (variant){2, "cpu", FSO_BACKEND_CPU});
}

static void test_llama3_rope_scaling_tied_f16_shards_match_pytorch(void **state)
{
    (void)state;
    run_fixture("llama3_tied_f16", (variant){1, "none", FSO_BACKEND_CPU});
    run_fixture("llama3_tied_f16", (variant){2, "cpu", FSO_BACKEND_CPU});
}

/* Qwen2: the q/k/v biases' gradients and AdamW step (no weight decay on
 * them), rope_theta 1e6, a tied head, and a sliding_window that
 * use_sliding_window false turns off; on the reference backend and the
 * fast one. */
static void test_qwen2_biases_tied_bf16_match_pytorch(void **state)
{
    (void)state;
    run_fixture("qwen2_tied_bf16", (variant){1, "none", FSO_BACKEND_CPU_REF});
    run_fixture("qwen2_tied_bf16", (variant){1, "none", FSO_BACKEND_CPU});
    run_fixture("qwen2_tied_bf16", (variant){2, "cpu", FSO_BACKEND_CPU});
}

static void test_linear_rope_scaling_f32_matches_pytorch(void **state)
{
    (void)state;
    run_fixture("linear_f32", (variant){1, "cpu", FSO_BACKEND_CPU});
}

/* ------------------------------------------------------------------ round trip and export */

/* A trainer started from folder dir (world devices on tier), its master in HF order. */
static float *master_of(const char *dir, int world, const char *tier, fso_config *cfg,
                        fso_trainer *tr, const char *extra)
{
    expected x = {.hyper = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, .B = 2, .T = 16};
    variant v = {world, tier, FSO_BACKEND_CPU};
    char err[512];
    if (fixture_config(cfg, dir, &x, &v, extra) < 0)
        fail_msg("%s", cfg->err);
    if (fso_trainer_init(tr, cfg) < 0)
        fail_msg("trainer: %s", tr->err);
    const fso_model *m = fso_zero_model(tr->zero);
    float *p = malloc(sizeof(float) * m->n_params);
    assert_non_null(p);
    assert_int_equal(fso_zero_store_hf(tr->zero, p, err, sizeof err), 0);
    return p;
}

static size_t file_size(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        fail_msg("%s: %s", path, strerror(errno));
    return (size_t)st.st_size;
}

static void test_export_then_init_from_is_bit_exact(void **state)
{
    (void)state;
    const char *cases[] = {"gqa_head_dim_bf16", "llama3_tied_f16"};
    for (int c = 0; c < 2; c++) {
        char dir[1024], out[1024], out2[1024], err[512];
        src_path(dir, sizeof dir, cases[c]);
        fso_config cfg, cfg2;
        fso_trainer tr, tr2;
        /* move every parameter off its loaded value first */
        float *p = master_of(dir, 2, "cpu", &cfg, &tr, NULL);
        const fso_model *m = fso_zero_model(tr.zero);
        for (size_t i = 0; i < m->n_params; i++)
            p[i] = p[i] * 1.000123f + 1e-7f * (float)(i % 7);
        assert_int_equal(fso_zero_load_hf(tr.zero, p, err, sizeof err), 0);

        /* fp32, sharded small so that an index is written */
        tmp_dir(out, sizeof out, "rt32");
        fso_hf_export_opts o = {.dtype = FSO_HF_F32, .max_shard_bytes = 60000};
        if (fso_zero_export_hf(tr.zero, out, &o, err, sizeof err) < 0)
            fail_msg("export: %s", err);
        char path[1200];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        assert_true(file_size(path) > 0);
        int shards = 0;
        DIR *d = opendir(out);
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (strncmp(de->d_name, "model-", 6) == 0) {
                snprintf(path, sizeof path, "%.900s/%.255s", out, de->d_name);
                assert_true(file_size(path) <= 60000);
                shards++;
            }
        closedir(d);
        assert_true(shards >= 2);
        /* transformers' tied head: no lm_head.weight in the files */
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        size_t len;
        char *index = fso_test_read_file(path, &len);
        assert_int_equal(strstr(index, "\"lm_head.weight\"") != NULL, !m->mc.tie_word_embeddings);
        assert_non_null(strstr(index, "\"total_size\""));
        free(index);
        /* the metadata transformers checks for */
        snprintf(path, sizeof path, "%s/model-00001-of-%05d.safetensors", out, shards);
        char *shard = fso_test_read_file(path, &len);
        assert_non_null(strstr(shard + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
        free(shard);

        /* read back on another device count and tier: the same bits */
        float *q = master_of(out, 1, "none", &cfg2, &tr2, NULL);
        assert_memory_equal(p, q, sizeof(float) * m->n_params);
        free(q);
        fso_trainer_free(&tr2);
        fso_config_free(&cfg2);

        /* bf16 and fp16: each value rounded to nearest even, one file */
        const fso_hf_dtype dts[2] = {FSO_HF_BF16, FSO_HF_F16};
        for (int k = 0; k < 2; k++) {
            tmp_dir(out2, sizeof out2, "rt16");
            fso_hf_export_opts o2 = {.dtype = dts[k]};
            if (fso_zero_export_hf(tr.zero, out2, &o2, err, sizeof err) < 0)
                fail_msg("export: %s", err);
            snprintf(path, sizeof path, "%s/model.safetensors", out2);
            assert_true(file_size(path) > 0);
            snprintf(path, sizeof path, "%s/config.json", out2);
            char *conf = fso_test_read_file(path, &len);
            assert_non_null(strstr(conf, k == 0 ? "\"bfloat16\"" : "\"float16\""));
            free(conf);
            float *r = read_folder(out2, &m->mc, m->n_params);
            for (size_t i = 0; i < m->n_params; i++) {
                float want = k == 0 ? fso_f32_from_bf16(fso_bf16_from_f32(p[i]))
                                    : fso_f32_from_f16(fso_f16_from_f32(p[i]));
                if (memcmp(&r[i], &want, 4) != 0)
                    fail_msg("%s %s [%zu]: %.9g, expected %.9g", cases[c],
                             fso_hf_dtype_name(dts[k]), i, r[i], want);
            }
            free(r);
            remove_tree(out2);
        }
        remove_tree(out);
        free(p);
        fso_trainer_free(&tr);
        fso_config_free(&cfg);
    }
}

static void test_export_refuses_what_it_cannot_write(void **state)
{
    (void)state;
    char dir[1024], out[1024], path[1200], err[512];
    src_path(dir, sizeof dir, "linear_f32");
    fso_config cfg;
    fso_trainer tr;
    float *p = master_of(dir, 1, "none", &cfg, &tr, NULL);
    const fso_model *m = fso_zero_model(tr.zero);

    /* a value fp16 cannot hold names the tensor, and leaves nothing behind */
    p[m->n_params - 5] = 70000.0f;
    assert_int_equal(fso_zero_load_hf(tr.zero, p, err, sizeof err), 0);
    tmp_dir(out, sizeof out, "f16");
    fso_hf_export_opts o = {.dtype = FSO_HF_F16};
    assert_int_equal(fso_zero_export_hf(tr.zero, out, &o, err, sizeof err), -ERANGE);
    assert_contains(err, "tensor 'lm_head.weight': element");
    assert_contains(err, "beyond fp16's range (65504); export as bf16 or fp32");
    assert_int_equal(access(out, F_OK), -1); /* the folder it made is gone */

    /* a folder that already holds a model */
    tmp_dir(out, sizeof out, "busy");
    assert_int_equal(mkdir(out, 0755), 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    write_bytes(path, "{}", 2);
    o.dtype = FSO_HF_BF16;
    if (fso_zero_export_hf(tr.zero, out, &o, err, sizeof err) < 0) /* tokenizer files are fine */
        fail_msg("%s", err);
    assert_int_equal(fso_zero_export_hf(tr.zero, out, &o, err, sizeof err), -EEXIST);
    assert_contains(err, "already holds");
    remove_tree(out);

    fso_hf_dtype d;
    assert_int_equal(fso_hf_dtype_parse("bf16", &d), 0);
    assert_int_equal(d, FSO_HF_BF16);
    assert_int_equal(fso_hf_dtype_parse("float16", &d), 0);
    assert_int_equal(d, FSO_HF_F16);
    assert_int_equal(fso_hf_dtype_parse("fp8", &d), -EINVAL);
    free(p);
    fso_trainer_free(&tr);
    fso_config_free(&cfg);
}

/* ------------------------------------------------------------------ refusals */

/* Configure from folder dir with extra --sets; the error (or "" when it loads). */
static const char *config_err(const char *dir, const char *const *sets, int n)
{
    static fso_config cfg;
    char first[1200];
    char *argv[8];
    snprintf(first, sizeof first, "model.init_from=\"%s\"", dir);
    argv[0] = first;
    for (int i = 0; i < n; i++)
        argv[1 + i] = (char *)sets[i];
    fso_config_defaults(&cfg);
    int rc = fso_config_load_all(&cfg, NULL, argv, n + 1);
    fso_config_free(&cfg);
    return rc == 0 ? "" : cfg.err;
}

/* Replace `from` by `to` in file dir/name. */
static void edit_file(const char *dir, const char *name, const char *from, const char *to)
{
    char path[1200];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = fso_test_read_file(path, &len);
    char *at = strstr(text, from);
    if (!at)
        fail_msg("%s has no \"%s\"", path, from);
    char *out = malloc(len + strlen(to) + 1);
    assert_non_null(out);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    write_bytes(path, out, strlen(out));
    free(out);
    free(text);
}

static void test_config_json_is_the_model_section(void **state)
{
    (void)state;
    char dir[1024];
    src_path(dir, sizeof dir, "llama3_tied_f16");
    fso_config cfg;
    char first[1200];
    snprintf(first, sizeof first, "model.init_from=\"%s\"", dir);
    char *argv[1] = {first};
    fso_config_defaults(&cfg);
    if (fso_config_load_all(&cfg, NULL, argv, 1) < 0)
        fail_msg("%s", cfg.err);
    /* the folder's shape, not the built-in defaults' */
    assert_int_equal(cfg.model.vocab_size, 64);
    assert_int_equal(cfg.model.num_key_value_heads, 1);
    assert_int_equal(cfg.model.head_dim, 8);
    assert_true(cfg.model.tie_word_embeddings);
    assert_int_equal(cfg.model.rope_scaling.type, FSO_ROPE_LLAMA3);
    assert_true(cfg.model.rope_scaling.factor == 8.0);
    assert_int_equal(cfg.model.rope_scaling.original_max_position_embeddings, 64);
    assert_string_equal(cfg.init_from, dir);
    fso_config_free(&cfg);

    /* a user's key that restates the folder, or one it leaves at LlamaConfig's default */
    const char *agree[] = {"model.hidden_size=32", "model.rms_norm_eps=0.00001",
                           "model.attention_dropout=0", "model.rope_theta=10000"};
    assert_string_equal(config_err(dir, agree, 4), "");
}

static void test_a_disagreeing_user_config_names_the_key(void **state)
{
    (void)state;
    char dir[1024];
    src_path(dir, sizeof dir, "gqa_head_dim_bf16");
    const char *hidden[] = {"model.hidden_size=64"};
    const char *e = config_err(dir, hidden, 1);
    assert_contains(e, "--set model.hidden_size=64: model.hidden_size: 64 (number) disagrees with ");
    assert_contains(e, "gqa_head_dim_bf16/config.json:");
    assert_contains(e, ", which says 32 (number); the model comes from model.init_from's folder, "
                       "so drop model.hidden_size or make it agree");
    const char *scaling[] = {"model.rope_scaling={\"rope_type\": \"linear\", \"factor\": 2}"};
    assert_contains(config_err(dir, scaling, 1), "model.rope_scaling: {...} (object) disagrees");
    /* not in config.json, and not LlamaConfig's default (hidden_size / heads = 16) */
    char linear[1024];
    src_path(linear, sizeof linear, "linear_f32");
    const char *hd[] = {"model.head_dim=32"};
    assert_contains(config_err(linear, hd, 1), "--set model.head_dim=32: model.head_dim: 32 "
                                               "(number) disagrees with ");
    assert_contains(config_err(linear, hd, 1), "linear_f32/config.json, which leaves head_dim at "
                                               "LlamaConfig's default; the model comes from "
                                               "model.init_from's folder, so drop model.head_dim");
    const char *hd16[] = {"model.head_dim=16"};
    assert_string_equal(config_err(linear, hd16, 1), "");
    char qwen[1024];
    src_path(qwen, sizeof qwen, "qwen2_tied_bf16");
    assert_contains(config_err(qwen, hd16, 1), "qwen2_tied_bf16/config.json, which leaves "
                                               "head_dim at Qwen2Config's default");
    /* a user file's model section, located in that file */
    char path[1200], cfgfile[1200];
    tmp_dir(cfgfile, sizeof cfgfile, "user.json");
    snprintf(path, sizeof path, "{\n  \"model\": {\n    \"init_from\": \"%s\",\n"
                                "    \"num_hidden_layers\": 3\n  }\n}\n", dir);
    write_bytes(cfgfile, path, strlen(path));
    fso_config cfg;
    fso_config_defaults(&cfg);
    assert_int_equal(fso_config_load_all(&cfg, cfgfile, NULL, 0), -EINVAL);
    assert_contains(cfg.err, "user.json:4:5: model.num_hidden_layers: 3 (number) disagrees with");
    fso_config_free(&cfg);
}

static void test_unsupported_configs_are_refused_by_name(void **state)
{
    (void)state;
    char dir[1024];
    copy_fixture(dir, sizeof dir, "linear_f32");
    /* errors in config.json are located in it */
    edit_file(dir, "config.json", "\"attention_bias\": false", "\"attention_bias\": true");
    const char *e = config_err(dir, NULL, 0);
    assert_contains(e, "linear_f32/config.json:5:3: model.attention_bias: biases on all four "
                       "attention projections, the output's (o_proj) included, are not "
                       "supported");
    edit_file(dir, "config.json", "\"attention_bias\": true", "\"attention_bias\": false");
    edit_file(dir, "config.json", "\"type\": \"linear\"", "\"type\": \"yarn\"");
    assert_contains(config_err(dir, NULL, 0), "model.rope_scaling.type: RoPE scaling of type "
                                              "\"yarn\" is not supported");
    edit_file(dir, "config.json", "\"type\": \"yarn\"", "\"type\": \"linear\"");
    edit_file(dir, "config.json", "\"model_type\": \"llama\"", "\"model_type\": \"qwen3\"");
    assert_contains(config_err(dir, NULL, 0), "model.model_type: \"qwen3\" is not supported: "
                                              "fsoff lacks its per-head RMSNorms of q and k");
    edit_file(dir, "config.json", "\"model_type\": \"qwen3\"",
              "\"model_type\": \"llama\", \"quantization_config\": {\"bits\": 4}");
    assert_contains(config_err(dir, NULL, 0), "linear_f32/config.json: quantization_config: "
                                              "quantized models are not supported");
    edit_file(dir, "config.json", "\"quantization_config\": {\"bits\": 4}",
              "\"quantization_config\": null");
    assert_string_equal(config_err(dir, NULL, 0), "");
    edit_file(dir, "config.json", "\"rms_norm_eps\"", "\"rms_norm_eps\": 1, \"rms_norm_eps\"");
    assert_contains(config_err(dir, NULL, 0), "linear_f32/config.json:");
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/nothing-here", dir);
    assert_contains(config_err(missing, NULL, 0), "--set model.init_from=");
    assert_contains(config_err(missing, NULL, 0), "nothing-here/config.json: cannot read: No such "
                                                  "file or directory");
    remove_tree(dir);
}

/* Open folder dir as the fixture's model; the error. */
static const char *open_err(const char *dir)
{
    static char err[512];
    fso_config cfg;
    char first[1200], seq[] = "data.seq_len=16";
    snprintf(first, sizeof first, "model.init_from=\"%s\"", dir);
    char *argv[2] = {first, seq};
    fso_config_defaults(&cfg);
    if (fso_config_load_all(&cfg, NULL, argv, 2) < 0)
        fail_msg("%s", cfg.err);
    fso_hf_folder *h;
    err[0] = '\0';
    if (fso_hf_open(&h, dir, &cfg.model, err, sizeof err) == 0) {
        fso_hf_close(h);
        return "";
    }
    assert_true(err[0] != '\0');
    return err;
}

/* A one-file folder whose model.safetensors is replaced by one written with
 * the tensors of the original, edited by `edit` (the HF-order entry list). */
static void rewrite_single(const char *dir, void (*edit)(fso_st_entry *e, int *n, float *v))
{
    char path[1200], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fso_st_file f;
    if (fso_st_open(&f, path, err, sizeof err) < 0)
        fail_msg("%s", err);
    fso_st_entry e[64];
    int n = 0;
    size_t total = 0;
    for (int i = 0; i < f.n; i++)
        total += f.tensors[i].numel;
    float *v = calloc(total + 4096, sizeof(float));
    assert_non_null(v);
    size_t at = 0;
    for (int i = 0; i < f.n; i++) {
        const fso_st_tensor *t = &f.tensors[i];
        e[n] = (fso_st_entry){strdup(t->name), FSO_ST_F32, t->ndim,
                              {t->shape[0], t->ndim > 1 ? t->shape[1] : 0}};
        assert_int_equal(fso_st_read_f32(&f, t, 0, t->numel, v + at, err, sizeof err), 0);
        at += t->numel;
        n++;
    }
    fso_st_close(&f);
    edit(e, &n, v);
    fso_st_writer w;
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += fso_st_entry_bytes(&e[i]);
    if (fso_st_writer_open(&w, path, e, n, err, sizeof err) < 0 ||
        fso_st_writer_write(&w, v, bytes, err, sizeof err) < 0 ||
        fso_st_writer_finish(&w, err, sizeof err) < 0)
        fail_msg("%s", err);
    for (int i = 0; i < n; i++)
        free((char *)e[i].name);
    free(v);
}

static void add_bias(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    e[*n] = (fso_st_entry){strdup("model.layers.0.self_attn.q_proj.bias"), FSO_ST_F32, 1, {32}};
    (*n)++;
}

static void add_o_bias(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    e[*n] = (fso_st_entry){strdup("model.layers.0.self_attn.o_proj.bias"), FSO_ST_F32, 1, {32}};
    (*n)++;
}

static void add_q_norm(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    e[*n] = (fso_st_entry){strdup("model.layers.0.self_attn.q_norm.weight"), FSO_ST_F32, 1, {16}};
    (*n)++;
}

static void drop_last(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    (*n)--;
    free((char *)e[*n].name);
}

static void bad_shape(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    for (int i = 0; i < *n; i++)
        if (strcmp(e[i].name, "model.norm.weight") == 0) {
            e[i].ndim = 2;               /* [32] as [4, 8] */
            e[i].shape[0] = 4;
            e[i].shape[1] = 8;
        }
}

static void int8_weight(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    for (int i = 0; i < *n; i++)
        if (strcmp(e[i].name, "model.norm.weight") == 0) {
            e[i].dtype = FSO_ST_I32;     /* same bytes, a dtype fsoff does not read */
        }
}

static void extra_layer(fso_st_entry *e, int *n, float *v)
{
    (void)v;
    e[*n] = (fso_st_entry){strdup("model.layers.7.mlp.up_proj.weight"), FSO_ST_F32, 2, {1, 1}};
    (*n)++;
}

static void test_folder_tensors_are_checked_against_the_config(void **state)
{
    (void)state;
    char dir[1024];
    struct {
        void (*edit)(fso_st_entry *, int *, float *);
        const char *want;
    } cases[] = {
        {add_bias, "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.bias': "
                   "config.json's model_type \"llama\" has no biases (q/k/v biases are Qwen2's: "
                   "model_type \"qwen2\")"},
        {add_o_bias, "tensor 'model.layers.0.self_attn.o_proj.bias': a bias on the attention "
                     "output (o_proj) is not supported"},
        {add_q_norm, "tensor 'model.layers.0.self_attn.q_norm.weight': fsoff's decoder has no "
                     "such norm (Qwen3's per-head q_norm and k_norm among them)"},
        {drop_last, "tensor 'model.norm.weight' is missing; the folder's config.json says the "
                    "model has it"},
        {bad_shape, "model.safetensors: tensor 'model.norm.weight' has shape [4, 8]; config.json "
                    "makes it [32]"},
        {int8_weight, "model.safetensors: tensor 'model.norm.weight' is I32; fsoff reads F32, "
                      "BF16 and F16"},
        {extra_layer, "tensor 'model.layers.7.mlp.up_proj.weight': config.json says "
                      "num_hidden_layers is 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_fixture(dir, sizeof dir, "linear_f32");
        assert_string_equal(open_err(dir), "");
        rewrite_single(dir, cases[i].edit);
        assert_contains(open_err(dir), cases[i].want);
        remove_tree(dir);
    }
    /* a truncated file, and no weights at all */
    char path[1200];
    copy_fixture(dir, sizeof dir, "gqa_head_dim_bf16");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(truncate(path, (off_t)file_size(path) - 100), 0);
    assert_contains(open_err(dir), "gqa_head_dim_bf16/model.safetensors: the tensors' data ends");
    unlink(path);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    write_bytes(path, "x", 1);
    assert_contains(open_err(dir), "has no model.safetensors or model.safetensors.index.json; "
                                   "fsoff reads Hugging Face folders in safetensors (this one has "
                                   "pytorch_model.bin");
    remove_tree(dir);
}

static void test_a_bad_index_is_refused(void **state)
{
    (void)state;
    char dir[1024];
    struct {
        const char *from, *to, *want;
    } cases[] = {
        {"\"weight_map\"", "\"weight_mop\"", "model.safetensors.index.json: expected an object "
                                             "with \"weight_map\""},
        {"{", "{{", "model.safetensors.index.json:1:"},
        {"\"model.norm.weight\": \"model-00002-of-00002.safetensors\"",
         "\"model.norm.weight\": \"../model-00002-of-00002.safetensors\"",
         "weight_map[\"model.norm.weight\"]: \"../model-00002-of-00002.safetensors\" is not the "
         "name of a file in the folder"},
        {"\"model.norm.weight\": \"model-00002-of-00002.safetensors\"",
         "\"model.norm.weight\": \"model-00003-of-00002.safetensors\"",
         "weight_map[\"model.norm.weight\"] names model-00003-of-00002.safetensors, which is "
         "missing"},
        {"\"model.norm.weight\": \"model-00002-of-00002.safetensors\"",
         "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"",
         "weight_map says 'model.norm.weight' is in model-00001-of-00002.safetensors, which has "
         "no such tensor"},
        {",\n    \"model.norm.weight\": \"model-00002-of-00002.safetensors\"", "",
         "model-00002-of-00002.safetensors: holds tensor 'model.norm.weight', which "
         "model.safetensors.index.json maps nowhere"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_fixture(dir, sizeof dir, "llama3_tied_f16");
        edit_file(dir, "model.safetensors.index.json", cases[i].from, cases[i].to);
        assert_contains(open_err(dir), cases[i].want);
        remove_tree(dir);
    }
}

/* ------------------------------------------------------------------ the families */

/* A folder as transformers saves one: dir/config.json (config_text) and
 * model.safetensors with every tensor of the model config.json describes,
 * F32, drawn from seed (norms near 1, the rest near 0). Returns the
 * values in Hugging Face order (*n_out of them; the caller frees). */
static float *write_folder(const char *dir, const char *config_text, uint64_t seed,
                           size_t *n_out)
{
    char path[1200], err[512], first[1200], seq[] = "data.seq_len=16";
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, config_text, strlen(config_text));
    fso_config cfg;
    snprintf(first, sizeof first, "model.init_from=\"%s\"", dir);
    char *argv[2] = {first, seq};
    fso_config_defaults(&cfg);
    if (fso_config_load_all(&cfg, NULL, argv, 2) < 0)
        fail_msg("%s", cfg.err);
    const int nb = fso_model_n_blocks(&cfg.model);
    fso_block_layout *bl = calloc((size_t)nb, sizeof *bl);
    assert_non_null(bl);
    fso_model_layout(bl, &cfg.model, 1);
    fso_config_free(&cfg);
    fso_st_entry e[64 * FSO_BLOCK_MAX_TENSORS];
    int n = 0;
    size_t total = 0;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < bl[b].n_tensors; i++) {
            const fso_tensor_desc *d = &bl[b].tensors[i];
            assert_true(n < (int)(sizeof e / sizeof e[0]));
            e[n++] = (fso_st_entry){d->name, FSO_ST_F32, fso_tensor_ndim(d),
                                    {(uint64_t)d->rows, (uint64_t)d->cols}};
            total += d->numel;
        }
    float *v = malloc(sizeof(float) * total);
    assert_non_null(v);
    fso_rng rng;
    fso_rng_seed(&rng, seed);
    size_t at = 0;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < bl[b].n_tensors; i++) {
            const fso_tensor_desc *d = &bl[b].tensors[i];
            for (size_t k = 0; k < d->numel; k++)
                v[at++] = (float)((d->is_norm ? 1.0 : 0.0) + 0.05 * fso_rng_normal(&rng));
        }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fso_st_writer w;
    if (fso_st_writer_open(&w, path, e, n, err, sizeof err) < 0 ||
        fso_st_writer_write(&w, v, sizeof(float) * total, err, sizeof err) < 0 ||
        fso_st_writer_finish(&w, err, sizeof err) < 0)
        fail_msg("%s", err);
    free(bl);
    *n_out = total;
    return v;
}

/* Every key of config.json `a` is in `b` with the same value (numbers as
 * numbers), torch_dtype excepted (an export says its own). */
static void assert_config_kept(const char *a_path, const char *b_path)
{
    json_error_t je;
    json_t *a = json_load_file(a_path, 0, &je), *b = json_load_file(b_path, 0, &je);
    assert_non_null(a);
    assert_non_null(b);
    const char *key;
    json_t *v;
    json_object_foreach(a, key, v) {
        json_t *w = json_object_get(b, key);
        if (strcmp(key, "torch_dtype") == 0)
            continue;
        bool same = w && ((json_is_number(v) && json_is_number(w))
                              ? json_number_value(v) == json_number_value(w)
                              : json_equal(v, w));
        if (!same) {
            char *vs = json_dumps(v, JSON_ENCODE_ANY);
            char *ws = w ? json_dumps(w, JSON_ENCODE_ANY) : NULL;
            fail_msg("%s: \"%s\" is %s, the export's %s: %s", a_path, key, vs, b_path,
                     ws ? ws : "missing");
        }
    }
    json_decref(a);
    json_decref(b);
}

/* Small folders shaped as the families' own (their config.json keys, as
 * transformers writes them): --init-from loads each bit for bit, an
 * export straight away and after a step writes the same tensors and the
 * family's config.json (its class, model_type and keys; no lm_head.weight
 * when tied), and reads back bit for bit. */
static void test_families_load_and_export_as_they_came(void **state)
{
    (void)state;
    static const char *const qwen2 =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, "
        "\"bos_token_id\": 70, \"eos_token_id\": 71, \"hidden_act\": \"silu\", "
        "\"hidden_size\": 32, \"initializer_range\": 0.02, \"intermediate_size\": 40, "
        "\"max_position_embeddings\": 32768, \"max_window_layers\": 2, "
        "\"model_type\": \"qwen2\", \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
        "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
        "\"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true, "
        "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\", "
        "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 80}\n";
    static const char *const mistral =
        "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, "
        "\"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 32, "
        "\"initializer_range\": 0.02, \"intermediate_size\": 56, "
        "\"max_position_embeddings\": 32768, \"model_type\": \"mistral\", "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, "
        "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": 4096, "
        "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
        "\"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true, "
        "\"vocab_size\": 64}\n";
    static const char *const smollm2 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
        "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0, "
        "\"hidden_act\": \"silu\", \"hidden_size\": 24, "
        "\"initializer_range\": 0.041666666666666664, \"intermediate_size\": 64, "
        "\"is_llama_config\": true, \"max_position_embeddings\": 8192, \"mlp_bias\": false, "
        "\"model_type\": \"llama\", \"num_attention_heads\": 3, \"num_hidden_layers\": 2, "
        "\"num_key_value_heads\": 1, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
        "\"rope_interleaved\": false, \"rope_scaling\": null, \"rope_theta\": 100000, "
        "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
        "\"transformers_version\": \"4.42.3\", \"use_cache\": true, \"vocab_size\": 72}\n";
    static const char *const tinyllama =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, "
        "\"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 32, "
        "\"initializer_range\": 0.02, \"intermediate_size\": 88, "
        "\"max_position_embeddings\": 2048, \"model_type\": \"llama\", "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, "
        "\"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, "
        "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
        "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.35.0\", "
        "\"use_cache\": true, \"vocab_size\": 64}\n";
    const struct {
        const char *name, *config;
        bool tied, bias;
    } cases[] = {
        {"qwen2", qwen2, true, true},
        {"mistral", mistral, false, false},
        {"smollm2", smollm2, true, false},
        {"tinyllama", tinyllama, false, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[1024], out[1024], path[1200], path2[1200], err[512];
        size_t n, len;
        tmp_dir(dir, sizeof dir, cases[c].name);
        float *v = write_folder(dir, cases[c].config, 7 + c, &n);
        fso_config cfg;
        fso_trainer tr;
        float *p = master_of(dir, 2, "cpu", &cfg, &tr, NULL);
        const fso_model *m = fso_zero_model(tr.zero);
        assert_int_equal(m->n_params, n);
        assert_memory_equal(p, v, sizeof(float) * n);
        assert_int_equal(fso_model_qkv_bias(&m->mc), cases[c].bias);
        assert_int_equal(m->mc.tie_word_embeddings, cases[c].tied);

        for (int step = 0; step < 2; step++) { /* straight away, then after a step */
            if (step == 1) {
                int32_t in[32], tg[32];
                for (int i = 0; i < 32; i++)
                    in[i] = (i * 7 + 3) % m->mc.vocab_size, tg[i] = (i * 5 + 1) % m->mc.vocab_size;
                fso_zero_step st;
                if (fso_trainer_step(&tr, in, tg, NULL, &st) < 0)
                    fail_msg("step: %s", tr.err);
                assert_int_equal(fso_zero_store_hf(tr.zero, p, err, sizeof err), 0);
                assert_true(memcmp(p, v, sizeof(float) * n) != 0);
            }
            tmp_dir(out, sizeof out, "family-export");
            char said[512];
            if (fso_trainer_export_hf(&tr, out, FSO_HF_F32, said, sizeof said, err,
                                      sizeof err) < 0)
                fail_msg("export: %s", err);
            float *r = read_folder(out, &m->mc, n);
            assert_memory_equal(r, p, sizeof(float) * n);
            free(r);
            snprintf(path, sizeof path, "%s/config.json", dir);
            snprintf(path2, sizeof path2, "%s/config.json", out);
            assert_config_kept(path, path2);
            char *conf = fso_test_read_file(path2, &len);
            /* LlamaConfig's own keys only in a Llama's */
            assert_int_equal(strstr(conf, "\"pretraining_tp\"") != NULL,
                             m->mc.model_type == FSO_MODEL_LLAMA);
            free(conf);
            snprintf(path, sizeof path, "%s/model.safetensors", out);
            char *st = fso_test_read_file(path, &len);
            assert_int_equal(strstr(st + 8, "\"lm_head.weight\"") != NULL, !cases[c].tied);
            assert_int_equal(strstr(st + 8, "\"model.layers.1.self_attn.v_proj.bias\"") != NULL,
                             cases[c].bias);
            free(st);
            remove_tree(out);
        }
        free(p);
        free(v);
        fso_trainer_free(&tr);
        fso_config_free(&cfg);
        remove_tree(dir);
    }

    /* a Mistral whose window is shorter than the sequence is another model */
    char dir[1024], path[1200];
    tmp_dir(dir, sizeof dir, "mistral-short");
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, mistral, strlen(mistral));
    edit_file(dir, "config.json", "\"sliding_window\": 4096", "\"sliding_window\": 8");
    const char *seq[] = {"data.seq_len=16"};
    const char *e = config_err(dir, seq, 1);
    assert_contains(e, "--set data.seq_len=16: data.seq_len: 16 is longer than "
                       "model.sliding_window (8, ");
    assert_contains(e, "mistral-short/config.json:1:");
    assert_contains(e, "set data.seq_len to at most 8 (the same model then)");
    const char *seq8[] = {"data.seq_len=8"};
    assert_string_equal(config_err(dir, seq8, 1), "");
    remove_tree(dir);
}

/* ------------------------------------------------------------------ the test folders */

/* remove_tree (test_util.h), which every test here cleans up with, unlinks
 * a symlink in the tree, to a folder or a file, or named as the tree
 * itself, and never descends into or empties what it points to. */
static void test_remove_tree_follows_no_symlink(void **state)
{
    (void)state;
    char tree[512], outside[512], p[1100], kept[1100];
    size_t len;
    struct stat st;
    tmp_dir(tree, sizeof tree, "tree");
    tmp_dir(outside, sizeof outside, "outside");
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(kept, sizeof kept, "%s/kept", outside);
    write_bytes(kept, "kept", 4);
    assert_int_equal(mkdir(tree, 0755), 0);
    snprintf(p, sizeof p, "%s/sub", tree);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/sub/file", tree);
    write_bytes(p, "gone", 4);
    snprintf(p, sizeof p, "%s/sub/to_folder", tree);
    assert_int_equal(symlink(outside, p), 0);
    snprintf(p, sizeof p, "%s/to_file", tree);
    assert_int_equal(symlink(kept, p), 0);

    assert_int_equal(remove_tree(tree), 0);
    assert_int_equal(lstat(tree, &st), -1);
    assert_int_equal(errno, ENOENT);
    char *back = fso_test_read_file(kept, &len);
    assert_int_equal(len, 4);
    assert_string_equal(back, "kept");
    free(back);

    /* the tree named by a symlink: the link goes, the folder stays */
    snprintf(p, sizeof p, "%s/link", tmp_root);
    assert_int_equal(symlink(outside, p), 0);
    assert_int_equal(remove_tree(p), 0);
    assert_int_equal(lstat(p, &st), -1);
    assert_int_equal(stat(kept, &st), 0);
    assert_int_equal(remove_tree(outside), 0);
    assert_int_equal(lstat(outside, &st), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_headers_are_read),
        cmocka_unit_test(test_header_rules_are_enforced),
        cmocka_unit_test(test_header_length_and_truncation),
        cmocka_unit_test(test_f16_conversions_are_exact_and_round_to_nearest_even),
        cmocka_unit_test(test_writer_and_reader_agree_on_every_dtype),
        cmocka_unit_test(test_gqa_head_dim_bf16_matches_pytorch),
        cmocka_unit_test(test_llama3_rope_scaling_tied_f16_shards_match_pytorch),
        cmocka_unit_test(test_linear_rope_scaling_f32_matches_pytorch),
        cmocka_unit_test(test_qwen2_biases_tied_bf16_match_pytorch),
        cmocka_unit_test(test_export_then_init_from_is_bit_exact),
        cmocka_unit_test(test_export_refuses_what_it_cannot_write),
        cmocka_unit_test(test_config_json_is_the_model_section),
        cmocka_unit_test(test_a_disagreeing_user_config_names_the_key),
        cmocka_unit_test(test_unsupported_configs_are_refused_by_name),
        cmocka_unit_test(test_folder_tensors_are_checked_against_the_config),
        cmocka_unit_test(test_a_bad_index_is_refused),
        cmocka_unit_test(test_families_load_and_export_as_they_came),
        cmocka_unit_test(test_remove_tree_follows_no_symlink),
    };
    return cmocka_run_group_tests(tests, make_tmp, drop_tmp);
}
