/* fuzz_safetensors.c — safetensors files as users hand them to --init-from:
 * the header check and the reader (engine/hf/safetensors.c).
 *
 * Input: a file's bytes. They are checked from memory (fso_st_parse) and
 * from a file (fso_st_open); both must agree. A refusal gives a message
 * naming the file. An accepted header must describe the bytes exactly:
 * tensors sorted by name with distinct names, each found by fso_st_find,
 * their data back to back from the data's start to the file's end, each
 * holding its shape times its dtype's bits. Every F32, BF16 and F16 tensor
 * is then read in two pieces, which must give the same values as one read.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "hf/safetensors.h"

#define READ_MAX_ELEMS ((uint64_t)1 << 20)

static void check_accepted(const fso_st_file *f, size_t size)
{
    uint64_t total = 0;
    FUZZ_CHECK(f->data_offset >= 8 && f->data_offset <= size);
    for (int i = 0; i < f->n; i++) {
        const fso_st_tensor *t = &f->tensors[i];
        FUZZ_CHECK(i == 0 || strcmp(f->tensors[i - 1].name, t->name) < 0);
        FUZZ_CHECK(fso_st_find(f, t->name) == t);
        FUZZ_CHECK(t->begin <= t->end && t->end <= size - f->data_offset);
        FUZZ_CHECK((t->end - t->begin) * 8 == t->numel * fso_st_dtype_bits(t->dtype));
        total += t->end - t->begin;
    }
    FUZZ_CHECK(f->data_offset + total == size); /* tiles the data: no gap, no overlap */
}

static void read_back(const fso_st_file *f)
{
    char err[512];
    for (int i = 0; i < f->n; i++) {
        const fso_st_tensor *t = &f->tensors[i];
        if ((t->dtype != FSO_ST_F32 && t->dtype != FSO_ST_BF16 && t->dtype != FSO_ST_F16) ||
            t->numel > READ_MAX_ELEMS)
            continue;
        size_t n = (size_t)t->numel, h = n / 2;
        float *a = malloc(sizeof(float) * (n + 1)), *b = malloc(sizeof(float) * (n + 1));
        FUZZ_CHECK(a && b);
        FUZZ_CHECK(fso_st_read_f32(f, t, 0, n, a, err, sizeof err) == 0);
        FUZZ_CHECK(fso_st_read_f32(f, t, 0, h, b, err, sizeof err) == 0);
        FUZZ_CHECK(fso_st_read_f32(f, t, h, n - h, b + h, err, sizeof err) == 0);
        FUZZ_CHECK(memcmp(a, b, sizeof(float) * n) == 0);
        FUZZ_CHECK(fso_st_read_f32(f, t, n, 1, b, err, sizeof err) < 0 && err[0]);
        free(a);
        free(b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "", ferr[512] = "";
    fso_st_file m, f;
    int rc = fso_st_parse(&m, "x.safetensors", data, size, size, err, sizeof err);
    const char *path = fuzz_file("x.safetensors", data, size);
    int frc = fso_st_open(&f, path, ferr, sizeof ferr);
    FUZZ_CHECK((rc == 0) == (frc == 0));
    if (rc < 0) {
        FUZZ_CHECK(strstr(err, "x.safetensors") == err && strstr(ferr, path) == ferr);
        FUZZ_CHECK(m.tensors == NULL && f.tensors == NULL && f.fd < 0);
        return 0;
    }
    check_accepted(&m, size);
    check_accepted(&f, size);
    FUZZ_CHECK(m.n == f.n);
    read_back(&f);
    fso_st_close(&m);
    fso_st_close(&f);
    return 0;
}
