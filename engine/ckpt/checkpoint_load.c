/* checkpoint_load.c — reading checkpoints (checkpoint.h): finding one from a
 * save dir, checking its manifest and its data file's size, comparing the
 * configuration it was saved with to a run's, loading it into the trainer,
 * and handing out the master tensor by tensor. Every byte read is checked
 * against its chunk's CRC-32C first. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "config/config_json.h"
#include "crc32c.h"
#include "model.h"
#include "util.h"

#define READ_DEPTH 8

typedef struct chunk {
    uint64_t off, bytes;
    uint32_t crc;
} chunk;

typedef struct tensor {
    const char *name;         /* in the manifest */
    int rows, cols;
    uint64_t off;             /* of its master in state.bin, bytes */
} tensor;

struct fso_ckpt {
    char path[4200];          /* the checkpoint folder */
    char data_path[4400];
    json_t *man;
    json_t *config;           /* in man */
    int64_t step, data_pos;
    int devices;
    fso_model_config mc;
    fso_ckpt_layout layout;   /* of mc: the manifest's blocks are checked against it */
    tensor *tensors;
    int n_tensors;
    chunk *chunks;            /* sorted by offset, tiling the file */
    size_t n_chunks;
    int fd;
    struct io_uring ring;     /* reads, READ_DEPTH in flight */
    bool ring_up;
};

/* ------------------------------------------------------------------ finding it */

/* path is a checkpoint folder (it has a manifest), or a save dir whose
 * `latest` names one. */
static int resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    char p[4400];
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s; give a checkpoint folder or a save folder", path,
                 strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: not a folder; give a checkpoint folder (step-N) or a save "
                              "folder", path);
        return -ENOTDIR;
    }
    snprintf(p, sizeof p, "%s/%s", path, FSO_CKPT_MANIFEST);
    if (stat(p, &st) == 0) {
        snprintf(out, outlen, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/%s", path, FSO_CKPT_LATEST);
    FILE *f = fopen(p, "r");
    if (!f) {
        snprintf(err, errlen, "%s: no checkpoint here: neither %s nor %s (no save has completed "
                              "in this folder)", path, FSO_CKPT_MANIFEST, FSO_CKPT_LATEST);
        return -ENOENT;
    }
    char name[128] = "";
    char *got = fgets(name, sizeof name, f);
    fclose(f);
    size_t n = got ? strlen(name) : 0;
    while (n && (name[n - 1] == '\n' || name[n - 1] == '\r'))
        name[--n] = 0;
    if (fso_ckpt_step_of_name(name) < 0) {
        snprintf(err, errlen, "%s: expected the name of a checkpoint folder (step-N), got \"%s\"",
                 p, name);
        return -EINVAL;
    }
    snprintf(out, outlen, "%s/%s", path, name);
    snprintf(p, sizeof p, "%s/%s", out, FSO_CKPT_MANIFEST);
    if (stat(p, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s names %s, but %s: %s", path, name, p, strerror(e));
        return -e;
    }
    return 0;
}

int fso_ckpt_dir_has_saves(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d && errno == ENOENT)
        return 0;
    if (!d) {
        int e = errno;
        snprintf(err, errlen, "%s: %s; give a save folder (--save DIR)", dir, strerror(e));
        return -e;
    }
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d)))
        found = strcmp(de->d_name, FSO_CKPT_MANIFEST) == 0 ||
                strcmp(de->d_name, FSO_CKPT_LATEST) == 0 ||
                fso_ckpt_step_of_name(de->d_name) >= 0;
    closedir(d);
    return found;
}

/* ------------------------------------------------------------------ the manifest */

#define BAD(...)                                                                             \
    do {                                                                                     \
        int n_ = snprintf(err, errlen, "%s/%s: ", ck->path, FSO_CKPT_MANIFEST);              \
        if (n_ > 0 && (size_t)n_ < errlen)                                                   \
            snprintf(err + n_, errlen - (size_t)n_, __VA_ARGS__);                            \
        return -EINVAL;                                                                      \
    } while (0)

static int get_i64(const json_t *obj, const char *key, int64_t lo, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo)
        return -1;
    *out = json_integer_value(v);
    return 0;
}

/* The model the checkpoint holds: its configuration read back by fsoff's
 * own parser, section by section (the folder a run started from is not
 * read again). */
static int read_model(fso_ckpt *ck, char *err, size_t errlen)
{
    fso_config c;
    const char *key;
    json_t *v;
    int rc = 0;
    fso_config_defaults(&c);
    json_object_foreach(ck->config, key, v) {
        json_t *copy = json_deep_copy(v);
        if (copy && json_is_object(copy) && strcmp(key, "model") == 0)
            json_object_del(copy, "init_from");
        char *text = copy ? json_dumps(copy, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        char *set = NULL;
        json_decref(copy);
        if (!text || asprintf(&set, "%s=%s", key, text) < 0) {
            free(text);
            fso_config_free(&c);
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        free(text);
        rc = fso_config_set(&c, set);
        free(set);
        if (rc < 0)
            break;
    }
    if (rc == 0)
        rc = fso_config_finish(&c);
    if (rc < 0) {
        fso_config_free(&c);
        BAD("config: %s", c.err);
    }
    ck->mc = c.model;
    fso_config_free(&c);
    return 0;
}

/* The blocks and tensors the manifest lists are those of its model. */
static int read_tensors(fso_ckpt *ck, char *err, size_t errlen)
{
    const fso_ckpt_layout *l = &ck->layout;
    json_t *model = json_object_get(ck->man, "model");
    json_t *blocks = json_object_get(model, "blocks"), *tensors = json_object_get(model, "tensors");
    if (!json_is_array(blocks) || (int)json_array_size(blocks) != l->n_blocks)
        BAD("model.blocks: expected %d blocks for the model in config.model", l->n_blocks);
    for (int b = 0; b < l->n_blocks; b++) {
        json_t *e = json_array_get(blocks, (size_t)b);
        json_t *o = json_array_get(e, 0), *n = json_array_get(e, 1);
        if (!json_is_integer(o) || !json_is_integer(n) ||
            (uint64_t)json_integer_value(o) != l->off[b] ||
            (uint64_t)json_integer_value(n) != sizeof(float) * l->elems[b])
            BAD("model.blocks[%d]: not where this fsoff lays out block %d of the model in "
                "config.model (offset %" PRIu64 ", %zu bytes)", b, b, l->off[b],
                sizeof(float) * l->elems[b]);
    }
    fso_block_layout *bl = calloc((size_t)l->n_blocks, sizeof *bl);
    size_t nt = json_is_array(tensors) ? json_array_size(tensors) : 0;
    ck->tensors = calloc(nt ? nt : 1, sizeof *ck->tensors);
    if (!bl || !ck->tensors) {
        free(bl);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    fso_model_layout(bl, &ck->mc, 1);
    int rc = 0;
    size_t i = 0;
    for (int b = 0; b < l->n_blocks && rc == 0; b++)
        for (int t = 0; t < bl[b].n_tensors && rc == 0; t++, i++) {
            const fso_tensor_desc *d = &bl[b].tensors[t];
            json_t *e = json_array_get(tensors, i);
            json_t *name = json_object_get(e, "name"), *shape = json_object_get(e, "shape");
            json_t *off = json_object_get(e, "offset");
            size_t dims = json_array_size(shape);
            int rows = (int)json_integer_value(json_array_get(shape, 0));
            int cols = dims == 2 ? (int)json_integer_value(json_array_get(shape, 1)) : 1;
            uint64_t want = l->off[b] + sizeof(float) * d->offset_elems;
            if (!json_is_string(name) || strcmp(json_string_value(name), d->name) != 0 ||
                (dims != 1 && dims != 2) || rows != d->rows || cols != d->cols ||
                !json_is_integer(off) || (uint64_t)json_integer_value(off) != want) {
                snprintf(err, errlen, "%s/%s: model.tensors[%zu]: expected %s (%d x %d) at "
                                      "offset %" PRIu64 " for the model in config.model",
                         ck->path, FSO_CKPT_MANIFEST, i, d->name, d->rows, d->cols, want);
                rc = -EINVAL;
                break;
            }
            ck->tensors[i] = (tensor){json_string_value(name), rows, cols, want};
        }
    free(bl);
    if (rc == 0 && i != nt) {
        snprintf(err, errlen, "%s/%s: model.tensors: %zu entries, the model has %zu tensors",
                 ck->path, FSO_CKPT_MANIFEST, nt, i);
        rc = -EINVAL;
    }
    ck->n_tensors = (int)i;
    return rc;
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const chunk *)a)->off, y = ((const chunk *)b)->off;
    return (x > y) - (x < y);
}

/* Chunks tile state.bin: sorted, no gap, no overlap, whole pages. */
static int read_chunks(fso_ckpt *ck, char *err, size_t errlen)
{
    json_t *chunks = json_object_get(ck->man, "chunks");
    size_t n = json_is_array(chunks) ? json_array_size(chunks) : 0;
    if (n == 0)
        BAD("chunks: missing");
    ck->chunks = calloc(n, sizeof *ck->chunks);
    if (!ck->chunks) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(chunks, i);
        json_t *o = json_array_get(e, 0), *b = json_array_get(e, 1), *c = json_array_get(e, 2);
        if (!json_is_integer(o) || !json_is_integer(b) || !json_is_integer(c) ||
            json_integer_value(o) < 0 || json_integer_value(b) <= 0 ||
            json_integer_value(b) % FSO_IO_PAGE || json_integer_value(b) > ((json_int_t)1 << 30) ||
            json_integer_value(c) < 0 || json_integer_value(c) > 0xffffffffLL)
            BAD("chunks[%zu]: expected [offset, bytes, crc32c]", i);
        ck->chunks[i] = (chunk){(uint64_t)json_integer_value(o), (uint64_t)json_integer_value(b),
                                (uint32_t)json_integer_value(c)};
    }
    qsort(ck->chunks, n, sizeof *ck->chunks, by_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (ck->chunks[i].off != at)
            BAD("chunks: %s at offset %" PRIu64 " of %s", ck->chunks[i].off > at ? "a gap" :
                "an overlap", at, FSO_CKPT_DATA);
        at += ck->chunks[i].bytes;
    }
    if (at != ck->layout.total_bytes)
        BAD("chunks: they cover %" PRIu64 " bytes of %s, the model's state is %" PRIu64, at,
            FSO_CKPT_DATA, ck->layout.total_bytes);
    ck->n_chunks = n;
    return 0;
}

static int read_manifest(fso_ckpt *ck, char *err, size_t errlen)
{
    char p[4400];
    json_error_t je;
    snprintf(p, sizeof p, "%s/%s", ck->path, FSO_CKPT_MANIFEST);
    ck->man = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!ck->man) {
        snprintf(err, errlen, "%s:%d:%d: %s: the manifest is damaged; resume from an earlier "
                              "checkpoint", p, je.line, je.column, je.text);
        return -EINVAL;
    }
    json_t *fmt = json_object_get(ck->man, "format");
    int64_t version = -1;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FSO_CKPT_FORMAT) != 0)
        BAD("not an fsoff checkpoint (\"format\" is not \"%s\")", FSO_CKPT_FORMAT);
    if (get_i64(ck->man, "version", 0, &version) < 0 || version != FSO_CKPT_VERSION)
        BAD("format version %" PRId64 "; this fsoff reads version %d", version,
            FSO_CKPT_VERSION);
    int64_t devices = 0;
    json_t *data = json_object_get(ck->man, "data"), *run = json_object_get(ck->man, "run");
    if (get_i64(ck->man, "step", 0, &ck->step) < 0)
        BAD("step: missing or negative");
    if (get_i64(data, "position", 0, &ck->data_pos) < 0)
        BAD("data.position: missing or negative");
    if (get_i64(run, "devices", 1, &devices) < 0 || devices > 1 << 16)
        BAD("run.devices: missing");
    ck->devices = (int)devices;
    ck->config = json_object_get(ck->man, "config");
    if (!json_is_object(ck->config))
        BAD("config: missing");
    int rc = read_model(ck, err, errlen);
    if (rc == 0 && (rc = fso_ckpt_layout_init(&ck->layout, &ck->mc)) < 0)
        snprintf(err, errlen, "out of memory");
    if (rc == 0)
        rc = read_tensors(ck, err, errlen);
    if (rc == 0)
        rc = read_chunks(ck, err, errlen);
    return rc;
}

int fso_ckpt_open(fso_ckpt **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    fso_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    ck->fd = -1;
    int rc = resolve(path, ck->path, sizeof ck->path, err, errlen);
    if (rc == 0)
        rc = read_manifest(ck, err, errlen);
    if (rc == 0) {
        snprintf(ck->data_path, sizeof ck->data_path, "%s/%s", ck->path, FSO_CKPT_DATA);
        ck->fd = open(ck->data_path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (ck->fd < 0 && errno == EINVAL) /* no O_DIRECT here (tmpfs): through the cache */
            ck->fd = open(ck->data_path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (ck->fd < 0 || fstat(ck->fd, &st) != 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s: the checkpoint is incomplete; resume from an earlier "
                                  "one", ck->data_path, strerror(errno));
        } else if ((uint64_t)st.st_size != ck->layout.total_bytes) {
            rc = -EIO;
            snprintf(err, errlen, "%s: %s at offset %lld: the manifest says %" PRIu64 " bytes; "
                                  "the checkpoint is damaged, resume from an earlier one",
                     ck->data_path,
                     (uint64_t)st.st_size < ck->layout.total_bytes ? "truncated" : "too long",
                     (long long)st.st_size, ck->layout.total_bytes);
        }
    }
    if (rc < 0) {
        fso_ckpt_close(ck);
        return rc;
    }
    /* without io_uring (a container may forbid it) reads go one at a time */
    ck->ring_up = io_uring_queue_init(2 * READ_DEPTH, &ck->ring, 0) == 0;
    *out = ck;
    return 0;
}

void fso_ckpt_close(fso_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->ring_up)
        io_uring_queue_exit(&ck->ring);
    if (ck->fd >= 0)
        close(ck->fd);
    fso_ckpt_layout_free(&ck->layout);
    free(ck->tensors);
    free(ck->chunks);
    json_decref(ck->man);
    free(ck);
}

void fso_ckpt_read_without_uring(fso_ckpt *ck)
{
    if (ck->ring_up)
        io_uring_queue_exit(&ck->ring);
    ck->ring_up = false;
}

const char *fso_ckpt_path(const fso_ckpt *ck)
{
    return ck->path;
}

int64_t fso_ckpt_step(const fso_ckpt *ck)
{
    return ck->step;
}

int64_t fso_ckpt_data_position(const fso_ckpt *ck)
{
    return ck->data_pos;
}

const json_t *fso_ckpt_manifest(const fso_ckpt *ck)
{
    return ck->man;
}

const fso_model_config *fso_ckpt_model(const fso_ckpt *ck)
{
    return &ck->mc;
}

/* ------------------------------------------------------------------ reading, checked */

/* The chunk that starts at off, or -1. */
static ssize_t chunk_at(const fso_ckpt *ck, uint64_t off)
{
    size_t lo = 0, hi = ck->n_chunks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ck->chunks[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ck->n_chunks && ck->chunks[lo].off == off ? (ssize_t)lo : -1;
}

/* The chunk that holds byte off. */
static size_t chunk_holding(const fso_ckpt *ck, uint64_t off)
{
    size_t lo = 0, hi = ck->n_chunks;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (ck->chunks[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static int check_chunk(const fso_ckpt *ck, const chunk *c, const void *data, char *err,
                       size_t errlen)
{
    uint32_t crc = fso_crc32c(0, data, c->bytes);
    if (crc == c->crc)
        return 0;
    snprintf(err, errlen, "%s: offset %" PRIu64 ": checksum mismatch in the %" PRIu64 " bytes "
                          "from there (crc32c %08x, the manifest says %08x): the checkpoint is "
                          "corrupted; resume from an earlier one",
             ck->data_path, c->off, c->bytes, crc, c->crc);
    return -EIO;
}

static int read_error(const fso_ckpt *ck, uint64_t off, int e, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: offset %" PRIu64 ": %s; the checkpoint is damaged, resume from "
                          "an earlier one", ck->data_path, off,
             e ? strerror(e) : "unexpected end of file");
    return -(e ? e : EIO);
}

/* Reads of whole chunks, READ_DEPTH in flight (io_uring), each checked as it
 * arrives, for up to two regions of state.bin at a time: the load reads
 * the next region while the trainer takes the one before. Without io_uring
 * (a container may forbid it) a region is read when it begins, one chunk
 * at a time. */
typedef struct region {
    size_t next, end;         /* chunks [next, end) not yet asked for */
    size_t left;              /* chunks not yet in and checked */
    char *dst;                /* where the region's first chunk goes */
    uint64_t base;            /* its offset in the file */
} region;

typedef struct reader {
    fso_ckpt *ck;
    region reg[2];
    struct {
        int reg;
        size_t c;
        uint64_t got;
    } slot[READ_DEPTH];
    int free_slots[READ_DEPTH], n_free, inflight;
    int rc;                   /* the first failure; err has it */
    char *err;
    size_t errlen;
} reader;

static void reader_init(reader *r, fso_ckpt *ck, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->ck = ck;
    r->err = err;
    r->errlen = errlen;
    r->n_free = READ_DEPTH;
    for (int k = 0; k < READ_DEPTH; k++)
        r->free_slots[k] = k;
}

static void issue(reader *r, int k)
{
    const chunk *c = &r->ck->chunks[r->slot[k].c];
    const region *g = &r->reg[r->slot[k].reg];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ck->ring);
    io_uring_prep_read(sqe, r->ck->fd, g->dst + (c->off - g->base) + r->slot[k].got,
                       (unsigned)(c->bytes - r->slot[k].got), c->off + r->slot[k].got);
    io_uring_sqe_set_data64(sqe, (uint64_t)k);
}

/* Ask for what the regions still need, the older region first. */
static void fill(reader *r, int first)
{
    for (int i = 0; i < 2; i++) {
        region *g = &r->reg[(first + i) & 1];
        for (; g->next < g->end && r->n_free; g->next++) {
            int k = r->free_slots[--r->n_free];
            r->slot[k].reg = (first + i) & 1;
            r->slot[k].c = g->next;
            r->slot[k].got = 0;
            issue(r, k);
            r->inflight++;
        }
    }
    io_uring_submit(&r->ck->ring);
}

/* One completion: the rest of a short read asked for again, or a chunk in
 * and checked. */
static void complete_one(reader *r)
{
    fso_ckpt *ck = r->ck;
    struct io_uring_cqe *cqe;
    int w = io_uring_wait_cqe(&ck->ring, &cqe);
    if (w < 0) {
        if (w != -EINTR && r->rc == 0)
            r->rc = read_error(ck, 0, -w, r->err, r->errlen);
        return;
    }
    int k = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
    io_uring_cqe_seen(&ck->ring, cqe);
    const chunk *c = &ck->chunks[r->slot[k].c];
    region *g = &r->reg[r->slot[k].reg];
    if (res == -EINTR || res == -EAGAIN ||
        (res > 0 && r->slot[k].got + (uint64_t)res < c->bytes && r->rc == 0)) {
        r->slot[k].got += res > 0 ? (uint64_t)res : 0;
        issue(r, k);
        io_uring_submit(&ck->ring);
        return;
    }
    r->inflight--;
    r->free_slots[r->n_free++] = k;
    g->left--;
    if (r->rc == 0 && res <= 0)
        r->rc = read_error(ck, c->off + r->slot[k].got, -res, r->err, r->errlen);
    else if (r->rc == 0)
        r->rc = check_chunk(ck, c, g->dst + (c->off - g->base), r->err, r->errlen);
}

/* The chunks from the one at off to off + len into dst (4 KiB aligned),
 * as region i. */
static int region_begin(reader *r, int i, uint64_t off, uint64_t len, void *dst)
{
    fso_ckpt *ck = r->ck;
    ssize_t first = chunk_at(ck, off);
    if (first < 0) {
        snprintf(r->err, r->errlen, "%s: offset %" PRIu64 " is not where a chunk starts (fsoff "
                                    "bug)", ck->data_path, off);
        return r->rc = -EINVAL;
    }
    size_t end = (size_t)first;
    while (end < ck->n_chunks && ck->chunks[end].off < off + len)
        end++;
    r->reg[i] = (region){(size_t)first, end, end - (size_t)first, dst, off};
    if (r->rc == 0 && ck->ring_up) {
        fill(r, i ^ 1);
        return 0;
    }
    for (region *g = &r->reg[i]; g->next < g->end && r->rc == 0; g->next++, g->left--) {
        const chunk *c = &ck->chunks[g->next];
        char *p = g->dst + (c->off - g->base);
        for (uint64_t got = 0; got < c->bytes && r->rc == 0;) {
            ssize_t n = pread(ck->fd, p + got, c->bytes - got, (off_t)(c->off + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                r->rc = read_error(ck, c->off + got, n < 0 ? errno : 0, r->err, r->errlen);
            else
                got += (uint64_t)n;
        }
        if (r->rc == 0)
            r->rc = check_chunk(ck, c, p, r->err, r->errlen);
    }
    return r->rc;
}

/* Region i all in and checked (or the first failure). */
static int region_end(reader *r, int i)
{
    while (r->reg[i].left > 0 && r->rc == 0) {
        fill(r, i);
        complete_one(r);
    }
    return r->rc;
}

/* After a failure: what is in flight lands before the buffers go. */
static void reader_drain(reader *r)
{
    while (r->inflight > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&r->ck->ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(&r->ck->ring, cqe);
        r->inflight--;
    }
}

/* [off, off+len) of state.bin into dst (4 KiB aligned): whole chunks, each
 * checked. */
static int read_checked(fso_ckpt *ck, uint64_t off, uint64_t len, void *dst, char *err,
                        size_t errlen)
{
    reader r;
    reader_init(&r, ck, err, errlen);
    if (region_begin(&r, 0, off, len, dst) == 0)
        region_end(&r, 0);
    reader_drain(&r);
    return r.rc;
}

/* ------------------------------------------------------------------ resuming */

int fso_ckpt_check_config(const fso_ckpt *ck, const fso_config *cfg, char *said, size_t saidlen,
                          char *err, size_t errlen)
{
    static const char *const shape[] = {
        "model.vocab_size", "model.hidden_size", "model.intermediate_size",
        "model.num_hidden_layers", "model.num_attention_heads", "model.num_key_value_heads",
        "model.head_dim", "model.tie_word_embeddings", "model.model_type"};
    enum { MAX_SAID = 64 };
    fso_config_change ch[MAX_SAID];
    json_t *now = fso_config_to_json(cfg);
    if (!now) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int n = fso_config_json_diff(ck->config, now, ch, MAX_SAID);
    json_decref(now);
    for (int i = 0; i < n && i < MAX_SAID; i++)
        for (size_t s = 0; s < sizeof shape / sizeof shape[0]; s++)
            if (strcmp(ch[i].key, shape[s]) == 0) {
                snprintf(err, errlen, "resume: %s is %s in %s and %s in this run: the "
                                      "checkpoint's tensors have another shape%s; resume with "
                                      "the model it was saved with (its \"config\" in %s/%s)",
                         ch[i].key, ch[i].was, ck->path, ch[i].now,
                         s == 0 ? " (another vocabulary)" : "", ck->path, FSO_CKPT_MANIFEST);
                return -EINVAL;
            }
    size_t len = 0;
    said[0] = 0;
#define SAY(...)                                                                              \
    do {                                                                                      \
        if (len < saidlen)                                                                    \
            len += (size_t)snprintf(said + len, saidlen - len, __VA_ARGS__);                  \
    } while (0)
    const int world = fso_config_world(cfg);
    if (ck->devices != world)
        SAY("devices %d -> %d", ck->devices, world);
    /* the sequences of a step: the same for the same data order */
    json_int_t mb = json_integer_value(json_object_get(ck->config, "train_micro_batch_size_per_gpu"));
    json_int_t ga = json_integer_value(json_object_get(ck->config, "gradient_accumulation_steps"));
    int64_t was_seqs = (int64_t)mb * ga * ck->devices;
    int64_t now_seqs = (int64_t)cfg->micro_batch * cfg->grad_accum * world;
    if (was_seqs != now_seqs)
        SAY("%ssequences per step %lld -> %lld (the data no longer comes as it would have)",
            len ? ", " : "", (long long)was_seqs, (long long)now_seqs);
    for (int i = 0; i < n && i < MAX_SAID; i++)
        SAY("%s%s %s -> %s", len ? ", " : "", ch[i].key, ch[i].was, ch[i].now);
    if (n > MAX_SAID)
        SAY(" and %d more", n - MAX_SAID);
#undef SAY
    return 0;
}

int fso_ckpt_load(fso_ckpt *ck, fso_zero *z, char *err, size_t errlen)
{
    const fso_model *m = fso_zero_model(z);
    const fso_ckpt_layout *l = &ck->layout;
    fso_ckpt_layout mine;
    int rc = fso_ckpt_layout_init(&mine, &m->mc);
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    bool same = mine.n_blocks == l->n_blocks && mine.total_bytes == l->total_bytes &&
                memcmp(mine.elems, l->elems, sizeof *l->elems * (size_t)l->n_blocks) == 0;
    fso_ckpt_layout_free(&mine);
    if (!same) {
        snprintf(err, errlen, "%s: the checkpoint holds another model than this run's; resume "
                              "with the model it was saved with", ck->path);
        return -EINVAL;
    }
    size_t most = 0;
    for (int b = 0; b < m->n_blocks; b++)
        if (m->blocks[b].padded_elems > most)
            most = m->blocks[b].padded_elems;
    /* two buffers: the next region is read while the trainer takes this one */
    float *flat[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        if (posix_memalign((void **)&flat[i], FSO_IO_PAGE, sizeof(float) * most) != 0) {
            flat[i] = NULL;
            free(flat[0]);
            snprintf(err, errlen, "out of host memory for two blocks (%zu bytes each)",
                     sizeof(float) * most);
            return -ENOMEM;
        }
    reader r;
    reader_init(&r, ck, err, errlen);
    const int n = l->n_blocks * FSO_ZERO_SAVED_KINDS; /* regions: block-major, then kind */
#define REGION(j) l->off[(size_t)((j) % FSO_ZERO_SAVED_KINDS) * l->n_blocks + (j) / FSO_ZERO_SAVED_KINDS]
#define REGION_BYTES(j) (sizeof(float) * l->elems[(j) / FSO_ZERO_SAVED_KINDS])
    rc = region_begin(&r, 0, REGION(0), REGION_BYTES(0), flat[0]);
    for (int j = 0; j < n && rc == 0; j++) {
        const int b = j / FSO_ZERO_SAVED_KINDS, i = j % FSO_ZERO_SAVED_KINDS;
        if (j + 1 < n && (rc = region_begin(&r, (j + 1) & 1, REGION(j + 1), REGION_BYTES(j + 1),
                                            flat[(j + 1) & 1])) < 0)
            break;
        if ((rc = region_end(&r, j & 1)) < 0)
            break;
        const size_t E = l->elems[b], P = m->blocks[b].padded_elems;
        memset(flat[j & 1] + E, 0, sizeof(float) * (P - E));
        rc = fso_zero_load_block(z, b, (fso_kind)(FSO_KIND_MASTER + i), flat[j & 1], err, errlen);
    }
#undef REGION
#undef REGION_BYTES
    reader_drain(&r);
    free(flat[0]);
    free(flat[1]);
    if (rc == 0)
        fso_zero_set_steps(z, ck->step);
    return rc;
}

/* ------------------------------------------------------------------ the tensors */

struct fso_ckpt_iter {
    fso_ckpt *ck;
    size_t slice;             /* bytes; 0 = whole tensors */
    int t;                    /* the tensor */
    size_t pos;               /* its next element */
    float *buf;
    size_t cap;               /* bytes */
};

int fso_ckpt_tensors_begin(fso_ckpt *ck, size_t slice_bytes, fso_ckpt_iter **out, char *err,
                           size_t errlen)
{
    *out = calloc(1, sizeof **out);
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    (*out)->ck = ck;
    (*out)->slice = slice_bytes;
    return 0;
}

int fso_ckpt_tensors_next(fso_ckpt_iter *it, fso_ckpt_tensor *t, char *err, size_t errlen)
{
    fso_ckpt *ck = it->ck;
    if (it->t >= ck->n_tensors)
        return 0;
    const tensor *d = &ck->tensors[it->t];
    const size_t numel = (size_t)d->rows * (size_t)d->cols;
    const uint64_t a = d->off + sizeof(float) * it->pos, e = d->off + sizeof(float) * numel;
    uint64_t want = it->slice && e - a > it->slice ? a + it->slice : e;
    /* the whole chunks that hold [a, want) */
    const chunk *c0 = &ck->chunks[chunk_holding(ck, a)];
    const chunk *c1 = &ck->chunks[chunk_holding(ck, want - 1)];
    const uint64_t w0 = c0->off, w1 = c1->off + c1->bytes;
    if (w1 - w0 > it->cap) {
        free(it->buf);
        it->buf = NULL;
        it->cap = 0;
        if (posix_memalign((void **)&it->buf, FSO_IO_PAGE, w1 - w0) != 0) {
            it->buf = NULL;
            snprintf(err, errlen, "out of host memory for %s (%" PRIu64 " bytes)", d->name,
                     w1 - w0);
            return -ENOMEM;
        }
        it->cap = w1 - w0;
    }
    int rc = read_checked(ck, w0, w1 - w0, it->buf, err, errlen);
    if (rc < 0)
        return rc;
    const uint64_t end = w1 < e ? w1 : e;
    *t = (fso_ckpt_tensor){.name = d->name, .rows = d->rows, .cols = d->cols, .numel = numel,
                           .first = it->pos, .n = (size_t)(end - a) / sizeof(float),
                           .data = it->buf + (a - w0) / sizeof(float)};
    it->pos += t->n;
    if (it->pos == numel) {
        it->t++;
        it->pos = 0;
    }
    return 1;
}

void fso_ckpt_tensors_end(fso_ckpt_iter *it)
{
    if (!it)
        return;
    free(it->buf);
    free(it);
}
