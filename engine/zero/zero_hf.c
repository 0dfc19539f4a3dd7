/* zero_hf.c — the trainer's parameters in Hugging Face's order: set from a
 * host array, read back into one (the master, the working parameters, the
 * gradients), or written as a Hugging Face folder (hf.h). Each goes one
 * block at a time through zero_shard.c, so host memory holds one block's
 * flat buffer besides the caller's, never a copy of the model. */
#include "zero_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf/hf.h"

/* An fso_hf_source over kind k of the trainer's state: the block asked for
 * is fetched from every device's shard into flat, then served from there. */
typedef struct kind_source {
    fso_zero *z;
    fso_kind k;
    int block;                   /* in flat, or -1 */
    float *flat;                 /* (max_padded) */
} kind_source;

static int kind_read(void *ctx, int block, const fso_tensor_desc *t, size_t first, size_t n,
                     float *dst, char *err, size_t errlen)
{
    kind_source *s = ctx;
    if (s->block != block) {
        s->block = -1;
        int rc = zr_block_xfer(s->z, block, s->flat, s->k, 1);
        if (rc < 0) {
            zr_first_error(s->z, err, errlen);
            return rc;
        }
        s->block = block;
    }
    memcpy(dst, s->flat + t->offset_elems + first, sizeof(float) * n);
    return 0;
}

/* Every update in, and a source over kind k. */
static int kind_source_open(fso_zero *z, fso_kind k, kind_source *s, char *err, size_t errlen)
{
    double waited;
    *s = (kind_source){.z = z, .k = k, .block = -1};
    int rc = fso_zero_finish(z, &waited, err, errlen);
    if (rc < 0)
        return rc;
    if (!(s->flat = malloc(sizeof(float) * z->max_padded))) {
        snprintf(err, errlen, "out of host memory copying %s", fso_kind_name(k));
        return -ENOMEM;
    }
    return 0;
}

int fso_zero_load_hf(fso_zero *z, const float *hf, char *err, size_t errlen)
{
    kind_source s;
    int rc = kind_source_open(z, FSO_KIND_MASTER, &s, err, errlen);
    const fso_block_layout *blocks = z->blocks;
    for (int b = 0; rc == 0 && b < z->n_blocks; b++) {
        memset(s.flat, 0, sizeof(float) * blocks[b].padded_elems);
        for (int i = 0; i < blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &blocks[b].tensors[i];
            memcpy(s.flat + d->offset_elems, hf, sizeof(float) * d->numel);
            hf += d->numel;
        }
        if ((rc = zr_block_xfer(z, b, s.flat, FSO_KIND_PARAM, 0)) < 0 ||
            (rc = zr_block_xfer(z, b, s.flat, FSO_KIND_MASTER, 0)) < 0)
            zr_first_error(z, err, errlen);
    }
    free(s.flat);
    return rc;
}

static int store_kind_hf(fso_zero *z, fso_kind k, float *hf, char *err, size_t errlen)
{
    kind_source s;
    int rc = kind_source_open(z, k, &s, err, errlen);
    for (int b = 0; rc == 0 && b < z->n_blocks; b++)
        for (int i = 0; rc == 0 && i < z->blocks[b].n_tensors; i++) {
            const fso_tensor_desc *d = &z->blocks[b].tensors[i];
            rc = kind_read(&s, b, d, 0, d->numel, hf, err, errlen);
            hf += d->numel;
        }
    free(s.flat);
    return rc;
}

int fso_zero_store_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_MASTER, hf, err, errlen);
}

int fso_zero_store_grads_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_GRAD, hf, err, errlen);
}

int fso_zero_store_working_hf(fso_zero *z, float *hf, char *err, size_t errlen)
{
    return store_kind_hf(z, FSO_KIND_PARAM, hf, err, errlen);
}

int fso_zero_export_hf(fso_zero *z, const char *outdir, const fso_hf_export_opts *o, char *err,
                       size_t errlen)
{
    if (z->boxes > 1) { /* the master's slices are spread over the boxes */
        snprintf(err, errlen, "a Hugging Face folder of a run on %d boxes comes from its "
                              "checkpoint, where every box wrote its slices: fsoff export "
                              "CHECKPOINT OUTDIR", z->boxes);
        return -ENOTSUP;
    }
    kind_source s;
    int rc = kind_source_open(z, FSO_KIND_MASTER, &s, err, errlen);
    if (rc < 0)
        return rc;
    fso_hf_source src = {.ctx = &s, .read = kind_read};
    rc = fso_hf_export(outdir, &z->cfg->model, o, &src, err, errlen);
    free(s.flat);
    return rc;
}
