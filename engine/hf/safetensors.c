/* safetensors.c — checking, reading and writing safetensors files
 * (safetensors.h). Little-endian hosts only, as fsoff is. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "backend.h"
#include "util.h"

/* Largest single read or write: Linux moves at most about 2 GiB a call. */
#define IO_MAX_BYTES ((size_t)1 << 30)

static const struct {
    const char *name;
    unsigned bits;
} dtypes[FSO_ST_N_DTYPES] = {
    [FSO_ST_BOOL] = {"BOOL", 8},         [FSO_ST_F4] = {"F4", 4},
    [FSO_ST_F6_E2M3] = {"F6_E2M3", 6},   [FSO_ST_F6_E3M2] = {"F6_E3M2", 6},
    [FSO_ST_U8] = {"U8", 8},             [FSO_ST_I8] = {"I8", 8},
    [FSO_ST_F8_E5M2] = {"F8_E5M2", 8},   [FSO_ST_F8_E4M3] = {"F8_E4M3", 8},
    [FSO_ST_F8_E8M0] = {"F8_E8M0", 8},   [FSO_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [FSO_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [FSO_ST_I16] = {"I16", 16},          [FSO_ST_U16] = {"U16", 16},
    [FSO_ST_F16] = {"F16", 16},          [FSO_ST_BF16] = {"BF16", 16},
    [FSO_ST_I32] = {"I32", 32},          [FSO_ST_U32] = {"U32", 32},
    [FSO_ST_F32] = {"F32", 32},          [FSO_ST_C64] = {"C64", 64},
    [FSO_ST_F64] = {"F64", 64},          [FSO_ST_I64] = {"I64", 64},
    [FSO_ST_U64] = {"U64", 64},
};

const char *fso_st_dtype_name(fso_st_dtype d)
{
    return (unsigned)d < FSO_ST_N_DTYPES ? dtypes[d].name : "?";
}

unsigned fso_st_dtype_bits(fso_st_dtype d)
{
    return (unsigned)d < FSO_ST_N_DTYPES ? dtypes[d].bits : 0;
}

/* ------------------------------------------------------------------ fp16 */

float fso_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);            /* inf, nan (payload kept) */
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);    /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        u = sign;                                        /* zero */
    } else {                                             /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    union { uint32_t u; float f; } x = {.u = u};
    return x.f;
}

uint16_t fso_f16_from_f32(float f)
{
    union { float f; uint32_t u; } x = {.f = f};
    const uint32_t sign = (x.u >> 16) & 0x8000u, a = x.u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* nan stays nan */
    if (a >= 0x477ff000u)      /* rounds past 65504 (and inf): infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {    /* normal in fp16: round the 13 dropped bits to nearest even */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u)       /* below half the smallest subnormal: zero */
        return (uint16_t)sign;
    /* subnormal in fp16: value = man * 2^-24 */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const unsigned shift = 126 - e;  /* the implicit one lands at bit 24 - shift + ... */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

/* ------------------------------------------------------------------ reading */

static void free_tensors(fso_st_tensor *t, int n)
{
    for (int i = 0; t && i < n; i++) {
        free(t[i].name);
        free(t[i].shape);
    }
    free(t);
}

void fso_st_close(fso_st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    free_tensors(f->tensors, f->n);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

static int by_offsets(const void *a, const void *b)
{
    const fso_st_tensor *x = *(fso_st_tensor *const *)a, *y = *(fso_st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const fso_st_tensor *)a)->name, ((const fso_st_tensor *)b)->name);
}

/* A non-negative JSON integer. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* One tensor's entry of the header. */
static int parse_entry(const fso_st_file *f, const char *name, json_t *v, fso_st_tensor *t,
                       char *err, size_t errlen)
{
    if (!json_is_object(v)) {
        snprintf(err, errlen, "%s: tensor '%s': expected an object with dtype, shape and "
                              "data_offsets", f->path, name);
        return -EINVAL;
    }
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    if (!dt || !shape || !off) {
        snprintf(err, errlen, "%s: tensor '%s': no %s", f->path, name,
                 !dt ? "dtype" : !shape ? "shape" : "data_offsets");
        return -EINVAL;
    }
    int d = 0;
    while (d < FSO_ST_N_DTYPES && !(json_is_string(dt) &&
                                    strcmp(json_string_value(dt), dtypes[d].name) == 0))
        d++;
    if (d == FSO_ST_N_DTYPES) {
        char *s = json_dumps(dt, JSON_ENCODE_ANY);
        snprintf(err, errlen, "%s: tensor '%s': dtype %s is not one of safetensors' (F32, BF16, "
                              "F16, I64, ...)", f->path, name, s ? s : "?");
        free(s);
        return -EINVAL;
    }
    t->dtype = (fso_st_dtype)d;
    if (!json_is_array(shape)) {
        snprintf(err, errlen, "%s: tensor '%s': shape must be a list of sizes", f->path, name);
        return -EINVAL;
    }
    t->ndim = (int)json_array_size(shape);
    t->shape = calloc((size_t)t->ndim + 1, sizeof *t->shape);
    if (!t->shape) {
        snprintf(err, errlen, "%s: out of memory", f->path);
        return -ENOMEM;
    }
    uint64_t numel = 1, bits;
    bool overflow = false;
    for (int i = 0; i < t->ndim; i++) {
        if (!get_u64(json_array_get(shape, (size_t)i), &t->shape[i])) {
            snprintf(err, errlen, "%s: tensor '%s': shape[%d] is not a size (a non-negative "
                                  "integer)", f->path, name, i);
            return -EINVAL;
        }
        overflow |= __builtin_mul_overflow(numel, t->shape[i], &numel);
    }
    overflow |= __builtin_mul_overflow(numel, (uint64_t)dtypes[d].bits, &bits);
    if (overflow) {
        snprintf(err, errlen, "%s: tensor '%s': its shape's size overflows 64 bits", f->path,
                 name);
        return -EINVAL;
    }
    if (bits % 8) {
        snprintf(err, errlen, "%s: tensor '%s': %" PRIu64 " elements of %s are not a whole "
                              "number of bytes", f->path, name, numel, dtypes[d].name);
        return -EINVAL;
    }
    t->numel = numel;
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !get_u64(json_array_get(off, 0), &t->begin) ||
        !get_u64(json_array_get(off, 1), &t->end)) {
        snprintf(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end], two "
                              "non-negative integers", f->path, name);
        return -EINVAL;
    }
    return 0;
}

static int check_metadata(const fso_st_file *f, json_t *v, char *err, size_t errlen)
{
    const char *key;
    json_t *s;
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v)) {
        snprintf(err, errlen, "%s: __metadata__ must be an object of strings", f->path);
        return -EINVAL;
    }
    json_object_foreach(v, key, s) {
        if (!json_is_string(s)) {
            snprintf(err, errlen, "%s: __metadata__: '%s' must be a string", f->path, key);
            return -EINVAL;
        }
    }
    return 0;
}

/* The tensors tile the data: in offset order, each starts where the last
 * ended, and holds exactly its shape's bytes. Returns the data's end. */
static int check_layout(const fso_st_file *f, uint64_t *data_end, char *err, size_t errlen)
{
    fso_st_tensor **order = malloc(sizeof *order * (size_t)(f->n ? f->n : 1));
    if (!order) {
        snprintf(err, errlen, "%s: out of memory", f->path);
        return -ENOMEM;
    }
    for (int i = 0; i < f->n; i++)
        order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n, sizeof *order, by_offsets);
    uint64_t at = 0;
    int rc = 0;
    for (int i = 0; i < f->n && rc == 0; i++) {
        const fso_st_tensor *t = order[i];
        const uint64_t bytes = t->numel * dtypes[t->dtype].bits / 8;
        if (t->begin != at || t->end < t->begin) {
            if (t->end < t->begin)
                snprintf(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                      "] end before they begin", f->path, t->name, t->begin,
                         t->end);
            else
                snprintf(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                      "] %s at %" PRIu64 "; tensors must fill the data back to "
                                      "back", f->path, t->name, t->begin, t->end,
                         t->begin > at ? "leave a gap after the data's previous end"
                                       : "overlap the data before",
                         at);
            rc = -EINVAL;
        } else if (t->end - t->begin != bytes) {
            char shape[160];
            size_t len = 0;
            shape[0] = '\0';
            for (int d = 0; d < t->ndim && len < sizeof shape; d++)
                len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%" PRIu64,
                                        d ? ", " : "", t->shape[d]);
            snprintf(err, errlen, "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, but "
                                  "shape [%s] of %s is %" PRIu64 " bytes", f->path, t->name,
                     t->end - t->begin, shape, dtypes[t->dtype].name, bytes);
            rc = -EINVAL;
        }
        at = t->end;
    }
    free(order);
    *data_end = at;
    return rc;
}

int fso_st_parse(fso_st_file *f, const char *path, const void *head, size_t head_len,
                 uint64_t file_size, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->size = file_size;
    if (!(f->path = strdup(path))) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    if (file_size < 8 || head_len < 8) {
        snprintf(err, errlen, "%s: %" PRIu64 " bytes, too short for a safetensors file (it "
                              "starts with an 8-byte header length)", path, file_size);
        goto invalid;
    }
    uint64_t N;
    memcpy(&N, head, 8);
    if (N > FSO_ST_MAX_HEADER_BYTES) {
        snprintf(err, errlen, "%s: header length %" PRIu64 " is over safetensors' limit of "
                              "%llu bytes: not a safetensors file, or a corrupt one", path, N,
                 FSO_ST_MAX_HEADER_BYTES);
        goto invalid;
    }
    if (8 + N > file_size || 8 + N > head_len) {
        snprintf(err, errlen, "%s: header length %" PRIu64 " runs past the end of the file "
                              "(%" PRIu64 " bytes): truncated, or not a safetensors file", path,
                 N, file_size);
        goto invalid;
    }
    f->data_offset = 8 + N;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)head + 8, N, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        bool dup = json_error_code(&jerr) == json_error_duplicate_key;
        snprintf(err, errlen, "%s: header at byte %d: %s%s", path, 8 + jerr.position,
                 jerr.text, dup ? " (a tensor name appears twice)" : "");
        goto invalid;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: the header is not a JSON object", path);
        json_decref(root);
        goto invalid;
    }
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        json_decref(root);
        snprintf(err, errlen, "%s: out of memory", path);
        fso_st_close(f);
        return -ENOMEM;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = check_metadata(f, v, err, errlen);
        } else {
            fso_st_tensor *t = &f->tensors[f->n++];
            rc = (t->name = strdup(key)) ? parse_entry(f, key, v, t, err, errlen) : -ENOMEM;
        }
        if (rc < 0)
            break;
    }
    json_decref(root);
    uint64_t end = 0;
    if (rc == 0)
        rc = check_layout(f, &end, err, errlen);
    if (rc == 0 && f->data_offset + end != file_size) {
        snprintf(err, errlen, "%s: the tensors' data ends at byte %" PRIu64 " but the file has "
                              "%" PRIu64 " bytes: %s", path, f->data_offset + end, file_size,
                 f->data_offset + end > file_size ? "truncated" : "trailing bytes");
        rc = -EINVAL;
    }
    if (rc < 0) {
        if (rc == -ENOMEM)
            snprintf(err, errlen, "%s: out of memory", path);
        fso_st_close(f);
        return rc;
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, by_name);
    return 0;

invalid:
    fso_st_close(f);
    return -EINVAL;
}

/* All of [off, off + len) of fd into buf. */
static int pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path, char *err,
                     size_t errlen)
{
    char *p = buf;
    while (len > 0) {
        size_t want = len < IO_MAX_BYTES ? len : IO_MAX_BYTES;
        ssize_t got = pread(fd, p, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = got < 0 ? errno : 0;
            if (e)
                snprintf(err, errlen, "%s: read at offset %" PRIu64 ": %s", path, off,
                         strerror(e));
            else
                snprintf(err, errlen, "%s: ends at offset %" PRIu64 ", before the data its "
                                      "header promises: truncated while in use?", path, off);
            return e ? -e : -EIO;
        }
        p += got;
        off += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

int fso_st_open(fso_st_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -EINVAL;
    }
    const uint64_t size = (uint64_t)st.st_size;
    uint64_t N = 0;
    char *head = NULL;
    int rc = 0;
    if (size >= 8 && (rc = pread_all(fd, &N, 8, 0, path, err, errlen)) < 0) {
        close(fd);
        return rc;
    }
    /* Read the header only when its length is plausible; else parse the
     * 8 bytes, which says what is wrong. */
    size_t head_len = size < 8 ? 0 : 8;
    if (size >= 8 && N <= FSO_ST_MAX_HEADER_BYTES && 8 + N <= size)
        head_len = (size_t)(8 + N);
    if (!(head = malloc(head_len ? head_len : 1))) {
        snprintf(err, errlen, "%s: out of memory for a %zu-byte header", path, head_len);
        close(fd);
        return -ENOMEM;
    }
    if (head_len >= 8)
        memcpy(head, &N, 8);
    if (head_len > 8 && (rc = pread_all(fd, head + 8, head_len - 8, 8, path, err, errlen)) < 0) {
        free(head);
        close(fd);
        return rc;
    }
    rc = fso_st_parse(f, path, head, head_len, size, err, errlen);
    free(head);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return 0;
}

const fso_st_tensor *fso_st_find(const fso_st_file *f, const char *name)
{
    fso_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n, sizeof *f->tensors, by_name);
}

int fso_st_read_f32(const fso_st_file *f, const fso_st_tensor *t, uint64_t first, size_t n,
                    float *dst, char *err, size_t errlen)
{
    if (t->dtype != FSO_ST_F32 && t->dtype != FSO_ST_BF16 && t->dtype != FSO_ST_F16) {
        snprintf(err, errlen, "%s: tensor '%s' is %s; fsoff reads F32, BF16 and F16", f->path,
                 t->name, dtypes[t->dtype].name);
        return -EINVAL;
    }
    if (first > t->numel || n > t->numel - first) {
        snprintf(err, errlen, "%s: tensor '%s': elements [%" PRIu64 ", %" PRIu64 ") asked of %"
                              PRIu64, f->path, t->name, first, first + n, t->numel);
        return -EINVAL;
    }
    const size_t eb = dtypes[t->dtype].bits / 8;
    const uint64_t off = f->data_offset + t->begin + first * eb;
    if (eb == 4)
        return pread_all(f->fd, dst, 4 * n, off, f->path, err, errlen);
    /* 16-bit values into the upper half of dst, widened forward in place:
     * element i's 4 bytes end at 4i + 4 <= 2n + 2i + 2 only for i >= n - 1,
     * where element i has been read already, so nothing unread is
     * overwritten. */
    uint16_t *half = (uint16_t *)(dst + n) - n;
    int rc = pread_all(f->fd, half, 2 * n, off, f->path, err, errlen);
    if (rc < 0)
        return rc;
    if (t->dtype == FSO_ST_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = fso_f32_from_bf16(half[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = fso_f32_from_f16(half[i]);
    return 0;
}

/* ------------------------------------------------------------------ writing */

uint64_t fso_st_entry_bytes(const fso_st_entry *e)
{
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++)
        numel *= e->shape[d];
    return numel * dtypes[e->dtype].bits / 8;
}

/* The header's JSON, padded to a multiple of 8 bytes (with the length),
 * into buf of cap bytes (NULL: only measured). Its length, or 0 when out
 * of memory. */
static size_t header_json(char *buf, size_t cap, const fso_st_entry *e, int n)
{
    size_t len = 0;
#define PUT(...)                                                                          \
    do {                                                                                  \
        int w_ = snprintf(buf ? buf + len : NULL, buf ? cap - len : 0, __VA_ARGS__);      \
        len += (size_t)w_;                                                                \
    } while (0)
    PUT("{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        char *name = fso_json_quote(e[i].name);
        if (!name)
            return 0;
        const uint64_t bytes = fso_st_entry_bytes(&e[i]);
        PUT(",%s:{\"dtype\":\"%s\",\"shape\":[", name, dtypes[e[i].dtype].name);
        for (int d = 0; d < e[i].ndim; d++)
            PUT("%s%" PRIu64, d ? "," : "", e[i].shape[d]);
        PUT("],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + bytes);
        at += bytes;
        free(name);
    }
    PUT("}");
#undef PUT
    while ((8 + len) % 8) {
        if (buf)
            buf[len] = ' ';
        len++;
    }
    return len;
}

uint64_t fso_st_header_bytes(const fso_st_entry *e, int n)
{
    return 8 + header_json(NULL, 0, e, n);
}

static int write_all(fso_st_writer *w, const void *data, size_t bytes, char *err, size_t errlen)
{
    const char *p = data;
    while (bytes > 0) {
        size_t want = bytes < IO_MAX_BYTES ? bytes : IO_MAX_BYTES;
        ssize_t put = write(w->fd, p, want);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0) {
            int e = put < 0 ? errno : EIO;
            snprintf(err, errlen, "%s: write at offset %" PRIu64 ": %s%s", w->path, w->written,
                     strerror(e), e == ENOSPC ? "; free space or choose another folder" : "");
            return -e;
        }
        p += put;
        bytes -= (size_t)put;
        w->written += (uint64_t)put;
    }
    return 0;
}

int fso_st_writer_open(fso_st_writer *w, const char *path, const fso_st_entry *e, int n,
                       char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    size_t len = header_json(NULL, 0, e, n);
    char *buf = len ? malloc(8 + len + 1) : NULL;
    w->path = strdup(path);
    if (!buf || !w->path || header_json(buf + 8, len + 1, e, n) != len) {
        free(buf);
        fso_st_writer_abandon(w);
        snprintf(err, errlen, "%s: out of memory for the header", path);
        return -ENOMEM;
    }
    uint64_t N = len;
    memcpy(buf, &N, 8);
    w->expect = 8 + N;
    for (int i = 0; i < n; i++)
        w->expect += fso_st_entry_bytes(&e[i]);
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (w->fd < 0) {
        int e2 = errno;
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(e2));
        free(buf);
        fso_st_writer_abandon(w);
        return -e2;
    }
    int rc = write_all(w, buf, 8 + len, err, errlen);
    free(buf);
    if (rc < 0)
        fso_st_writer_abandon(w);
    return rc;
}

int fso_st_writer_write(fso_st_writer *w, const void *data, size_t bytes, char *err,
                        size_t errlen)
{
    if (w->written + bytes > w->expect) {
        snprintf(err, errlen, "%s: %" PRIu64 " bytes more than its header describes", w->path,
                 w->written + bytes - w->expect);
        return -EINVAL;
    }
    return write_all(w, data, bytes, err, errlen);
}

int fso_st_writer_finish(fso_st_writer *w, char *err, size_t errlen)
{
    int rc = 0;
    if (w->written != w->expect) {
        snprintf(err, errlen, "%s: %" PRIu64 " bytes written, its header describes %" PRIu64,
                 w->path, w->written, w->expect);
        rc = -EINVAL;
    } else if (fsync(w->fd) < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot write it out: %s", w->path, strerror(-rc));
    } else {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) < 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: cannot write it out: %s", w->path, strerror(-rc));
        }
    }
    fso_st_writer_abandon(w);
    return rc;
}

void fso_st_writer_abandon(fso_st_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}
