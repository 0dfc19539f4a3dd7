/* checkpoint_export.c — a checkpoint as a Hugging Face folder
 * (fso_ckpt_export_hf, checkpoint.h): its fp32 master, tensor by tensor in
 * Hugging Face order with every chunk checked, handed to the Hugging Face
 * writer (hf.h), which rounds it to the chosen type and writes config.json
 * and the safetensors shards. Neither side holds more than a slice of a
 * tensor. The token ids and tokenizer files the run carried come from the
 * manifest's "hf" and the files beside state.bin (fso_ckpt_hf_extras). */
#include "checkpoint.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_impl.h"
#include "crc32c.h"

/* The carried file the manifest's entry e names, read and checked into x. */
static int read_carried(const fso_ckpt *ck, const json_t *e, fso_hf_extras *x, char *err,
                        size_t errlen)
{
    const char *name = json_string_value(json_object_get(e, "name"));
    json_t *jb = json_object_get(e, "bytes"), *jc = json_object_get(e, "crc32c");
    const char *known = NULL;
    for (int i = 0; name && fso_hf_carried_files[i]; i++)
        if (strcmp(name, fso_hf_carried_files[i]) == 0)
            known = fso_hf_carried_files[i];
    if (!known || !json_is_integer(jb) || !json_is_integer(jc) || json_integer_value(jb) < 0 ||
        (uint64_t)json_integer_value(jb) > FSO_HF_CARRIED_MAX_BYTES ||
        x->n_files >= FSO_HF_CARRIED_FILES) {
        snprintf(err, errlen, "%s/%s: hf.files: an entry is not a carried file with its bytes "
                              "and crc32c; the manifest is damaged", fso_ckpt_path(ck), FSO_CKPT_MANIFEST);
        return -EINVAL;
    }
    const size_t bytes = (size_t)json_integer_value(jb);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", fso_ckpt_path(ck), known);
    FILE *f = fopen(path, "rb");
    char *data = malloc(bytes + 1);
    size_t got = f && data ? fread(data, 1, bytes + 1, f) : 0;
    int rc = !f ? -errno : !data ? -ENOMEM : 0;
    if (f)
        fclose(f);
    if (rc == 0 && (got != bytes || fso_crc32c(0, data, bytes) !=
                                        (uint32_t)json_integer_value(jc)))
        rc = -EIO;
    if (rc < 0) {
        free(data);
        snprintf(err, errlen, "%s: %s; the checkpoint is damaged: export an earlier one, or "
                              "copy %s from the folder the run started from", path,
                 rc == -EIO ? (got != bytes ? "not the size the manifest says"
                                            : "its CRC-32C is not the manifest's")
                            : strerror(-rc), known);
        return rc;
    }
    x->files[x->n_files++] = (fso_hf_file){.name = known, .data = data, .bytes = bytes};
    return 0;
}

int fso_ckpt_hf_extras(const fso_ckpt *ck, fso_hf_extras *x, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    const json_t *hf = json_object_get(fso_ckpt_manifest(ck), "hf");
    if (!hf) {
        x->origin = FSO_HF_EXTRAS_UNRECORDED;
        return 0;
    }
    json_t *from = json_object_get(hf, "from"), *config = json_object_get(hf, "config");
    json_t *files = json_object_get(hf, "files");
    if (json_is_null(from))
        return 0; /* from scratch */
    if (!json_is_string(from) || !json_is_object(config) || !json_is_array(files)) {
        snprintf(err, errlen, "%s/%s: hf: expected \"from\", \"config\" and \"files\"; the "
                              "manifest is damaged", fso_ckpt_path(ck), FSO_CKPT_MANIFEST);
        return -EINVAL;
    }
    x->origin = FSO_HF_EXTRAS_FOLDER;
    snprintf(x->from, sizeof x->from, "%s", json_string_value(from));
    x->config = json_incref(config);
    size_t i;
    json_t *e;
    json_array_foreach(files, i, e) {
        int rc = read_carried(ck, e, x, err, errlen);
        if (rc < 0) {
            fso_hf_extras_free(x);
            return rc;
        }
    }
    return 0;
}

/* The writer asks for each tensor's elements back to back in Hugging Face
 * order, as the checkpoint hands them out: one slice at hand. */
typedef struct ckpt_source {
    fso_ckpt_iter *it;
    fso_ckpt_tensor cur;
    bool have;
} ckpt_source;

static int ckpt_read(void *ctx, int block, const fso_tensor_desc *t, size_t first, size_t n,
                     float *dst, char *err, size_t errlen)
{
    ckpt_source *s = ctx;
    (void)block;
    for (size_t done = 0; done < n;) {
        const size_t at = first + done;
        if (!s->have || strcmp(s->cur.name, t->name) != 0 || at >= s->cur.first + s->cur.n) {
            int rc = fso_ckpt_tensors_next(s->it, &s->cur, err, errlen);
            if (rc < 0)
                return rc;
            s->have = rc == 1;
        }
        if (!s->have || strcmp(s->cur.name, t->name) != 0 || at < s->cur.first ||
            at >= s->cur.first + s->cur.n) {
            snprintf(err, errlen, "export: the checkpoint hands out %s [%zu, +%zu), the writer "
                                  "asks for %s element %zu (fsoff bug)",
                     s->have ? s->cur.name : "nothing", s->have ? s->cur.first : 0,
                     s->have ? s->cur.n : 0, t->name, at);
            return -EINVAL;
        }
        size_t k = s->cur.first + s->cur.n - at;
        if (k > n - done)
            k = n - done;
        memcpy(dst + done, s->cur.data + (at - s->cur.first), sizeof(float) * k);
        done += k;
    }
    return 0;
}

int fso_ckpt_export_hf(fso_ckpt *ck, const char *outdir, const fso_hf_export_opts *o,
                       char *err, size_t errlen)
{
    ckpt_source s = {0};
    fso_hf_extras own = {0};
    fso_hf_export_opts with = *o;
    int rc = o->extras ? 0 : fso_ckpt_hf_extras(ck, &own, err, errlen);
    if (!o->extras)
        with.extras = &own;
    if (rc == 0)
        rc = fso_ckpt_tensors_begin(ck, sizeof(float) * FSO_HF_PIECE_ELEMS, &s.it, err, errlen);
    if (rc == 0) {
        fso_hf_source src = {.ctx = &s, .read = ckpt_read};
        rc = fso_hf_export(outdir, fso_ckpt_model(ck), &with, &src, err, errlen);
    }
    fso_ckpt_tensors_end(s.it);
    fso_hf_extras_free(&own);
    return rc;
}
