/* hf_read.c — a Hugging Face Llama, Mistral or Qwen2 folder's weights, block by block
 * (hf.h, import). The folder's tensors are matched against the model's
 * block tables when it is opened; reading a block then preads each of its
 * tensors straight into the block's flat buffer. */
#include "hf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "safetensors.h"

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"

/* Where one of the model's tensors is in the folder. */
typedef struct placed {
    const fso_tensor_desc *desc;
    int file;
    const fso_st_tensor *t;
} placed;

struct fso_hf_folder {
    char *dir;
    int n_blocks;
    fso_block_layout *blocks;
    int nfiles;
    fso_st_file *files;
    int n_placed;
    placed *placed;             /* sorted by name */
};

static int by_desc_name(const void *a, const void *b)
{
    return strcmp(((const placed *)a)->desc->name, ((const placed *)b)->desc->name);
}

static placed *find_placed(fso_hf_folder *h, const char *name)
{
    fso_tensor_desc d;
    if (strlen(name) >= sizeof d.name)
        return NULL;
    snprintf(d.name, sizeof d.name, "%s", name);
    placed key = {.desc = &d};
    return bsearch(&key, h->placed, (size_t)h->n_placed, sizeof *h->placed, by_desc_name);
}

void fso_hf_close(fso_hf_folder *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->nfiles; i++)
        fso_st_close(&h->files[i]);
    free(h->files);
    free(h->placed);
    free(h->blocks);
    free(h->dir);
    free(h);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Open file `name` of the folder as files[nfiles]. */
static int open_file(fso_hf_folder *h, const char *name, char *err, size_t errlen)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", h->dir, name);
    fso_st_file *f = realloc(h->files, sizeof *f * (size_t)(h->nfiles + 1));
    if (!f) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    h->files = f;
    int rc = fso_st_open(&h->files[h->nfiles], path, err, errlen);
    if (rc == 0)
        h->nfiles++;
    return rc;
}

static int file_index(const fso_hf_folder *h, const char *path)
{
    for (int i = 0; i < h->nfiles; i++)
        if (strcmp(h->files[i].path, path) == 0)
            return i;
    return -1;
}

/* model.safetensors.index.json: open every shard it names, and check that
 * each name it maps is in that shard and each shard's tensor is mapped to
 * it. *map gets the weight map. */
static int open_index(fso_hf_folder *h, json_t **map, char *err, size_t errlen)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/" INDEX_NAME, h->dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    *map = NULL;
    if (!root) {
        snprintf(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
        return -EINVAL;
    }
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        snprintf(err, errlen, "%s: expected an object with \"weight_map\", an object from tensor "
                              "names to shard files", path);
        json_decref(root);
        return -EINVAL;
    }
    const char *name;
    json_t *v;
    int rc = 0;
    json_object_foreach(wm, name, v) {
        const char *file = json_is_string(v) ? json_string_value(v) : NULL;
        if (!file || !file[0] || strchr(file, '/') || strcmp(file, ".") == 0 ||
            strcmp(file, "..") == 0) {
            char *s = json_dumps(v, JSON_ENCODE_ANY);
            snprintf(err, errlen, "%s: weight_map[\"%s\"]: %s is not the name of a file in the "
                                  "folder", path, name, s ? s : "?");
            free(s);
            rc = -EINVAL;
            break;
        }
        char fpath[4352];
        snprintf(fpath, sizeof fpath, "%s/%s", h->dir, file);
        if (file_index(h, fpath) < 0 && (rc = open_file(h, file, err, errlen)) < 0) {
            if (rc == -ENOENT)
                snprintf(err, errlen, "%s: weight_map[\"%s\"] names %s, which is missing",
                         path, name, file);
            break;
        }
        const fso_st_file *f = &h->files[file_index(h, fpath)];
        if (!fso_st_find(f, name)) {
            snprintf(err, errlen, "%s: weight_map says '%s' is in %s, which has no such tensor",
                     path, name, file);
            rc = -EINVAL;
            break;
        }
    }
    for (int i = 0; rc == 0 && i < h->nfiles; i++) {
        const fso_st_file *f = &h->files[i];
        const char *base = strrchr(f->path, '/') + 1;
        for (int t = 0; t < f->n; t++) {
            json_t *to = json_object_get(wm, f->tensors[t].name);
            if (!to || strcmp(json_string_value(to), base) != 0) {
                snprintf(err, errlen, "%s: holds tensor '%s', which %s maps %s%s", f->path,
                         f->tensors[t].name, INDEX_NAME, to ? "to " : "nowhere",
                         to ? json_string_value(to) : "");
                rc = -EINVAL;
                break;
            }
        }
    }
    if (rc < 0)
        json_decref(root);
    else
        *map = root;
    return rc;
}

/* A tensor of the folder the model has no place for. */
static int unexpected(const fso_model_config *mc, const char *file,
                      const char *name, char *err, size_t errlen)
{
    int layer;
    const char *type = fso_config_choice_name(fso_config_model_type_choices, mc->model_type);
    if (ends_with(name, ".o_proj.bias"))
        snprintf(err, errlen, "%s: tensor '%s': a bias on the attention output (o_proj) is not "
                              "supported", file, name);
    else if (strstr(name, ".mlp.") && ends_with(name, ".bias"))
        snprintf(err, errlen, "%s: tensor '%s': biases on the MLP projections are not supported",
                 file, name);
    else if (ends_with(name, ".bias") && !fso_model_qkv_bias(mc))
        snprintf(err, errlen, "%s: tensor '%s': config.json's model_type \"%s\" has no biases "
                              "(q/k/v biases are Qwen2's: model_type \"qwen2\")", file, name,
                 type);
    else if (strstr(name, "_norm.") && !strstr(name, "layernorm"))
        snprintf(err, errlen, "%s: tensor '%s': fsoff's decoder has no such norm (Qwen3's per-head "
                              "q_norm and k_norm among them)", file, name);
    else if (sscanf(name, "model.layers.%d.", &layer) == 1 && layer >= mc->num_hidden_layers)
        snprintf(err, errlen, "%s: tensor '%s': config.json says num_hidden_layers is %d", file,
                 name, mc->num_hidden_layers);
    else
        snprintf(err, errlen, "%s: tensor '%s' is not a tensor of transformers' %s model with "
                              "this config.json", file, name, type);
    return -EINVAL;
}

/* Tensors transformers skips when it loads a Llama. */
static bool skipped(const fso_model_config *mc, const char *name)
{
    return ends_with(name, ".rotary_emb.inv_freq") ||
           (mc->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0);
}

/* Every tensor of file fi: the model's (placed there) or skipped. */
static int place_file(fso_hf_folder *h, const fso_model_config *mc, int fi, char *err,
                      size_t errlen)
{
    const fso_st_file *f = &h->files[fi];
    for (int i = 0; i < f->n; i++) {
        const fso_st_tensor *t = &f->tensors[i];
        placed *p = find_placed(h, t->name);
        if (!p) {
            if (skipped(mc, t->name))
                continue;
            return unexpected(mc, f->path, t->name, err, errlen);
        }
        if (p->t) {
            snprintf(err, errlen, "%s: tensor '%s' is also in %s", f->path, t->name,
                     h->files[p->file].path);
            return -EINVAL;
        }
        p->file = fi;
        p->t = t;
    }
    return 0;
}

static void format_shape(char *buf, size_t size, const uint64_t *shape, int ndim)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int d = 0; d < ndim && len < size; d++)
        len += (size_t)snprintf(buf + len, size - len, "%s%" PRIu64, d ? ", " : "", shape[d]);
}

/* Each of the model's tensors is there, with its shape and a dtype fsoff reads. */
static int check_placed(const fso_hf_folder *h, char *err, size_t errlen)
{
    for (int i = 0; i < h->n_placed; i++) {
        const placed *p = &h->placed[i];
        const fso_tensor_desc *d = p->desc;
        if (!p->t) {
            snprintf(err, errlen, "%s: tensor '%s' is missing; the folder's config.json says "
                                  "the model has it", h->dir, d->name);
            return -EINVAL;
        }
        const fso_st_file *f = &h->files[p->file];
        const fso_st_tensor *t = p->t;
        uint64_t want[2] = {(uint64_t)d->rows, (uint64_t)d->cols};
        int want_ndim = fso_tensor_ndim(d);
        if (t->ndim != want_ndim || t->shape[0] != want[0] ||
            (want_ndim == 2 && t->shape[1] != want[1])) {
            char got[160], exp[64];
            format_shape(got, sizeof got, t->shape, t->ndim);
            format_shape(exp, sizeof exp, want, want_ndim);
            snprintf(err, errlen, "%s: tensor '%s' has shape [%s]; config.json makes it [%s]",
                     f->path, d->name, got, exp);
            return -EINVAL;
        }
        if (t->dtype != FSO_ST_F32 && t->dtype != FSO_ST_BF16 && t->dtype != FSO_ST_F16) {
            snprintf(err, errlen, "%s: tensor '%s' is %s; fsoff reads F32, BF16 and F16 "
                                  "(quantized weights are not supported)", f->path, d->name,
                     fso_st_dtype_name(t->dtype));
            return -EINVAL;
        }
    }
    return 0;
}

int fso_hf_open(fso_hf_folder **out, const char *dir, const fso_model_config *mc, char *err,
                size_t errlen)
{
    fso_hf_folder *h = calloc(1, sizeof *h);
    char path[4352];
    json_t *index = NULL;
    int rc = -ENOMEM;
    *out = NULL;
    if (!h || !(h->dir = strdup(dir)))
        goto oom;
    h->n_blocks = fso_model_n_blocks(mc);
    if (!(h->blocks = calloc((size_t)h->n_blocks, sizeof *h->blocks)))
        goto oom;
    fso_model_layout(h->blocks, mc, 1);
    for (int b = 0; b < h->n_blocks; b++)
        h->n_placed += h->blocks[b].n_tensors;
    if (!(h->placed = calloc((size_t)h->n_placed, sizeof *h->placed)))
        goto oom;
    for (int b = 0, n = 0; b < h->n_blocks; b++)
        for (int i = 0; i < h->blocks[b].n_tensors; i++)
            h->placed[n++].desc = &h->blocks[b].tensors[i];
    qsort(h->placed, (size_t)h->n_placed, sizeof *h->placed, by_desc_name);

    snprintf(path, sizeof path, "%s/" SINGLE_NAME, dir);
    if (is_file(path)) {
        rc = open_file(h, SINGLE_NAME, err, errlen);
    } else {
        snprintf(path, sizeof path, "%s/" INDEX_NAME, dir);
        if (is_file(path)) {
            rc = open_index(h, &index, err, errlen);
        } else {
            snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
            snprintf(err, errlen, "%s: has no " SINGLE_NAME " or " INDEX_NAME "; fsoff reads "
                                  "Hugging Face folders in safetensors%s", dir,
                     is_file(path) ? " (this one has pytorch_model.bin: save it again with "
                                     "safe_serialization=True)" : "");
            rc = -ENOENT;
        }
    }
    for (int i = 0; rc == 0 && i < h->nfiles; i++)
        rc = place_file(h, mc, i, err, errlen);
    if (rc == 0)
        rc = check_placed(h, err, errlen);
    json_decref(index);
    if (rc < 0) {
        fso_hf_close(h);
        return rc;
    }
    *out = h;
    return 0;
oom:
    fso_hf_close(h);
    snprintf(err, errlen, "%s: out of memory", dir);
    return rc;
}

int fso_hf_read_block(fso_hf_folder *h, int block, float *flat, char *err, size_t errlen)
{
    const fso_block_layout *b = &h->blocks[block];
    size_t at = 0;
    for (int i = 0; i < b->n_tensors; i++) {
        const fso_tensor_desc *d = &b->tensors[i];
        const placed *p = find_placed(h, d->name);
        memset(flat + at, 0, sizeof(float) * (d->offset_elems - at));
        int rc = fso_st_read_f32(&h->files[p->file], p->t, 0, d->numel, flat + d->offset_elems,
                                 err, errlen);
        if (rc < 0)
            return rc;
        at = d->offset_elems + d->numel;
    }
    return 0;
}
