/* hf_write.c — writing a Hugging Face Llama folder from a stream of fp32
 * tensors (hf.h, export). Shards are planned before anything is written
 * (greedily in Hugging Face order, as transformers does), then each is
 * filled a piece at a time from the source; only one piece is in memory. */
#include "hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "backend.h"
#include "safetensors.h"
#include "util.h"

/* Each export type's names: fsoff's, and torch's (also config.json's
 * torch_dtype); its safetensors type. */
static const struct {
    const char *name, *torch;
    fso_st_dtype st;
} dtype_info[] = {
    [FSO_HF_F32] = {"fp32", "float32", FSO_ST_F32},
    [FSO_HF_BF16] = {"bf16", "bfloat16", FSO_ST_BF16},
    [FSO_HF_F16] = {"fp16", "float16", FSO_ST_F16},
};

int fso_hf_dtype_parse(const char *s, fso_hf_dtype *out)
{
    for (int d = 0; d < 3; d++)
        if (strcmp(s, dtype_info[d].name) == 0 || strcmp(s, dtype_info[d].torch) == 0) {
            *out = (fso_hf_dtype)d;
            return 0;
        }
    return -EINVAL;
}

const char *fso_hf_dtype_name(fso_hf_dtype d)
{
    return (unsigned)d <= FSO_HF_F16 ? dtype_info[d].name : "?";
}

const char *fso_hf_dtype_torch_name(fso_hf_dtype d)
{
    return (unsigned)d <= FSO_HF_F16 ? dtype_info[d].torch : "?";
}

/* One tensor of the export, in Hugging Face order. */
typedef struct out_tensor {
    fso_st_entry e;
    int block;
    const fso_tensor_desc *desc;
    int shard;
} out_tensor;

/* Files written so far, removed again on failure. */
typedef struct written {
    char **paths;
    int n;
} written;

static int remember(written *w, const char *path)
{
    char **p = realloc(w->paths, sizeof *p * (size_t)(w->n + 1));
    if (!p || !(p[w->n] = strdup(path))) {
        if (p)
            w->paths = p;
        return -ENOMEM;
    }
    w->paths = p;
    w->n++;
    return 0;
}

static void forget(written *w, bool remove_files)
{
    for (int i = 0; i < w->n; i++) {
        if (remove_files)
            unlink(w->paths[i]);
        free(w->paths[i]);
    }
    free(w->paths);
    w->paths = NULL;
    w->n = 0;
}

static bool is_model_file(const char *name)
{
    size_t n = strlen(name);
    return strcmp(name, "config.json") == 0 || strcmp(name, "model.safetensors") == 0 ||
           strcmp(name, "model.safetensors.index.json") == 0 ||
           (strncmp(name, "model-", 6) == 0 && n > 12 &&
            strcmp(name + n - 12, ".safetensors") == 0);
}

/* outdir exists as a folder without a model in it (made when missing). */
static int prepare_dir(const char *outdir, bool *made, char *err, size_t errlen)
{
    *made = false;
    if (mkdir(outdir, 0755) == 0) {
        *made = true;
        return 0;
    }
    if (errno != EEXIST) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot create the folder: %s", outdir, strerror(e));
        return -e;
    }
    DIR *d = opendir(outdir);
    if (!d) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", outdir,
                 e == ENOTDIR ? "exists and is not a folder" : strerror(e));
        return -e;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        if (is_model_file(de->d_name)) {
            snprintf(err, errlen, "%s: already holds %s; export into a new or empty folder (or "
                                  "one with only tokenizer files)", outdir, de->d_name);
            rc = -EEXIST;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* A header that certainly holds n entries: the writer's exact size is at
 * most this (names escaped at worst 6 bytes a byte, offsets 20 digits). */
static uint64_t header_bound(const out_tensor *t, int n)
{
    uint64_t b = 8 + 64 + 8;
    for (int i = 0; i < n; i++)
        b += 6 * strlen(t[i].e.name) + 128;
    return b;
}

/* Assign shards greedily: a tensor goes into the current shard unless that
 * would take it over max; a tensor over max alone gets its own. Returns the
 * shard count. */
static int plan_shards(out_tensor *t, int n, uint64_t max)
{
    int shard = 0, first = 0;
    uint64_t data = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = fso_st_entry_bytes(&t[i].e);
        if (i > first && data + bytes + header_bound(t + first, i + 1 - first) > max) {
            shard++;
            first = i;
            data = 0;
        }
        t[i].shard = shard;
        data += bytes;
    }
    return n ? shard + 1 : 0;
}

static void shard_name(char *buf, size_t size, int shard, int n_shards)
{
    if (n_shards == 1)
        snprintf(buf, size, "model.safetensors");
    else
        snprintf(buf, size, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

/* fsync a folder, so renames in it last. */
static int sync_dir(const char *dir, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        snprintf(err, errlen, "%s: cannot sync the folder: %s", dir, strerror(e));
        return -e;
    }
    close(fd);
    return 0;
}

/* tmp into place as final. */
static int publish(const char *tmp, const char *final, written *w, char *err, size_t errlen)
{
    if (rename(tmp, final) < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot rename to %s: %s", tmp, final, strerror(e));
        return -e;
    }
    return remember(w, final) < 0 ? -ENOMEM : 0;
}

/* A small file, written whole under tmp, synced, renamed to final. */
static int write_bytes(const char *final, const void *data, size_t len, written *w, char *err,
                       size_t errlen)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (remember(w, tmp) < 0) { /* removed on failure, however far it got */
        snprintf(err, errlen, "%s: out of memory", tmp);
        return -ENOMEM;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(e));
        return -e;
    }
    int rc = fso_write_full(fd, data, len);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc < 0) {
        snprintf(err, errlen, "%s: cannot write: %s", tmp, strerror(-rc));
        return rc;
    }
    return publish(tmp, final, w, err, errlen);
}

static int write_text(const char *final, const char *text, written *w, char *err, size_t errlen)
{
    return write_bytes(final, text, strlen(text), w, err, errlen);
}

/* The carried files outdir does not hold already (a file the user put
 * there is theirs). */
static int write_carried(const char *outdir, const fso_hf_extras *x, written *w, char *err,
                         size_t errlen)
{
    for (int i = 0; x && i < x->n_files; i++) {
        char path[4352];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", outdir, x->files[i].name);
        if (lstat(path, &st) == 0)
            continue;
        int rc = write_bytes(path, x->files[i].data, x->files[i].bytes, w, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int write_config(const char *outdir, const fso_model_config *mc, fso_hf_dtype dtype,
                        const fso_hf_extras *x, written *w, char *err, size_t errlen)
{
    char path[4352], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", outdir);
    FILE *f = open_memstream(&text, &len);
    int rc = f ? fso_hf_config_write(f, mc, dtype, x ? x->config : NULL) : -ENOMEM;
    if (f && fclose(f) != 0 && rc == 0)
        rc = -ENOMEM;
    if (rc < 0) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return rc;
    }
    rc = write_text(path, text, w, err, errlen);
    free(text);
    return rc;
}

static int write_index(const char *outdir, const out_tensor *t, int n, int n_shards,
                       written *w, char *err, size_t errlen)
{
    char path[4352], name[64];
    uint64_t total = 0;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", outdir);
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    int rc = root && meta && map ? 0 : -ENOMEM;
    for (int i = 0; i < n && rc == 0; i++) {
        shard_name(name, sizeof name, t[i].shard, n_shards);
        total += fso_st_entry_bytes(&t[i].e);
        if (json_object_set_new(map, t[i].e.name, json_string(name)) < 0)
            rc = -ENOMEM;
    }
    if (rc == 0 && (json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) < 0 ||
                    json_object_set(root, "metadata", meta) < 0 ||
                    json_object_set(root, "weight_map", map) < 0))
        rc = -ENOMEM;
    char *text = rc == 0 ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(meta);
    json_decref(map);
    json_decref(root);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    size_t len = strlen(text);
    char *nl = realloc(text, len + 2);
    if (!nl) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    memcpy(nl + len, "\n", 2);
    rc = write_text(path, nl, w, err, errlen);
    free(nl);
    return rc;
}

/* n fp32 values of tensor t into out in the export's type. */
static int narrow(fso_hf_dtype dtype, void *out, const float *in, size_t n, const char *tensor,
                  uint64_t first, char *err, size_t errlen)
{
    if (dtype == FSO_HF_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++)
            o[i] = fso_bf16_from_f32(in[i]);
        return 0;
    }
    uint16_t *o = out;
    for (size_t i = 0; i < n; i++) {
        o[i] = fso_f16_from_f32(in[i]);
        if ((o[i] & 0x7fffu) == 0x7c00u && isfinite(in[i])) {
            snprintf(err, errlen, "tensor '%s': element %" PRIu64 " is %g, beyond fp16's range "
                                  "(65504); export as bf16 or fp32", tensor, first + i,
                     (double)in[i]);
            return -ERANGE;
        }
    }
    return 0;
}

/* Shard s: its header, then each of its tensors from the source, piece by piece. */
static int write_shard(const char *outdir, out_tensor *t, int n, int s, int n_shards,
                       const fso_hf_export_opts *o, const fso_hf_source *src, float *piece,
                       void *narrowed, written *w, char *err, size_t errlen)
{
    char name[64], final[4352], tmp[4400];
    int first = 0;
    while (first < n && t[first].shard != s)
        first++;
    int last = first;
    while (last < n && t[last].shard == s)
        last++;
    fso_st_entry *e = malloc(sizeof *e * (size_t)(last - first));
    if (!e) {
        snprintf(err, errlen, "%s: out of memory", outdir);
        return -ENOMEM;
    }
    for (int i = first; i < last; i++)
        e[i - first] = t[i].e;
    shard_name(name, sizeof name, s, n_shards);
    snprintf(final, sizeof final, "%s/%s", outdir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    fso_st_writer sw;
    int rc = remember(w, tmp); /* removed on failure, however far it got */
    if (rc < 0)
        snprintf(err, errlen, "%s: out of memory", tmp);
    else
        rc = fso_st_writer_open(&sw, tmp, e, last - first, err, errlen);
    free(e);
    if (rc < 0)
        return rc;
    const size_t eb = fso_st_dtype_bits(dtype_info[o->dtype].st) / 8;
    for (int i = first; i < last && rc == 0; i++) {
        const fso_tensor_desc *d = t[i].desc;
        for (size_t at = 0; at < d->numel && rc == 0; at += FSO_HF_PIECE_ELEMS) {
            size_t k = d->numel - at < FSO_HF_PIECE_ELEMS ? d->numel - at : FSO_HF_PIECE_ELEMS;
            char serr[400] = "";
            rc = src->read(src->ctx, t[i].block, d, at, k, piece, serr, sizeof serr);
            if (rc < 0) {
                snprintf(err, errlen, "%s: tensor '%s': %s", outdir, d->name,
                         serr[0] ? serr : strerror(-rc));
                break;
            }
            const void *bytes = piece;
            if (o->dtype != FSO_HF_F32) {
                if ((rc = narrow(o->dtype, narrowed, piece, k, d->name, at, serr,
                                 sizeof serr)) < 0) {
                    snprintf(err, errlen, "%s: %s", outdir, serr);
                    break;
                }
                bytes = narrowed;
            }
            rc = fso_st_writer_write(&sw, bytes, eb * k, err, errlen);
        }
    }
    if (rc < 0) {
        fso_st_writer_abandon(&sw);
        return rc;
    }
    if ((rc = fso_st_writer_finish(&sw, err, errlen)) < 0)
        return rc;
    return publish(tmp, final, w, err, errlen);
}

int fso_hf_export(const char *outdir, const fso_model_config *mc, const fso_hf_export_opts *o,
                  const fso_hf_source *src, char *err, size_t errlen)
{
    const uint64_t max = o->max_shard_bytes ? o->max_shard_bytes : FSO_HF_MAX_SHARD_BYTES;
    const int n_blocks = fso_model_n_blocks(mc);
    fso_block_layout *blocks = calloc((size_t)n_blocks, sizeof *blocks);
    out_tensor *t = NULL;
    float *piece = NULL;
    void *narrowed = NULL;
    written w = {0};
    bool made = false;
    int rc = -ENOMEM, n = 0;

    if ((unsigned)o->dtype > FSO_HF_F16) {
        snprintf(err, errlen, "%s: export dtype %d is not fp32, bf16 or fp16", outdir, o->dtype);
        free(blocks);
        return -EINVAL;
    }
    if (!blocks)
        goto oom;
    fso_model_layout(blocks, mc, 1);
    for (int b = 0; b < n_blocks; b++)
        n += blocks[b].n_tensors;
    t = calloc((size_t)n, sizeof *t);
    piece = malloc(sizeof(float) * FSO_HF_PIECE_ELEMS);
    narrowed = malloc(sizeof(uint16_t) * FSO_HF_PIECE_ELEMS);
    if (!t || !piece || !narrowed)
        goto oom;
    for (int b = 0, i = 0; b < n_blocks; b++)
        for (int k = 0; k < blocks[b].n_tensors; k++, i++) {
            const fso_tensor_desc *d = &blocks[b].tensors[k];
            t[i].desc = d;
            t[i].block = b;
            t[i].e.name = d->name;
            t[i].e.dtype = dtype_info[o->dtype].st;
            t[i].e.ndim = fso_tensor_ndim(d);
            t[i].e.shape[0] = (uint64_t)d->rows;
            t[i].e.shape[1] = (uint64_t)d->cols;
        }
    const int n_shards = plan_shards(t, n, max);

    if ((rc = prepare_dir(outdir, &made, err, errlen)) < 0)
        goto out;
    for (int s = 0; s < n_shards && rc == 0; s++)
        rc = write_shard(outdir, t, n, s, n_shards, o, src, piece, narrowed, &w, err, errlen);
    if (rc == 0)
        rc = write_carried(outdir, o->extras, &w, err, errlen);
    if (rc == 0)
        rc = write_config(outdir, mc, o->dtype, o->extras, &w, err, errlen);
    if (rc == 0 && n_shards > 1)
        rc = write_index(outdir, t, n, n_shards, &w, err, errlen);
    if (rc == 0)
        rc = sync_dir(outdir, err, errlen);
    goto out;
oom:
    snprintf(err, errlen, "%s: out of memory", outdir);
    rc = -ENOMEM;
out:
    forget(&w, rc < 0);
    if (rc < 0 && made)
        rmdir(outdir);
    free(narrowed);
    free(piece);
    free(t);
    free(blocks);
    return rc;
}
