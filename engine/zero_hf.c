/* zero_hf.c — whole-model copies in Hugging Face's layout: loading
 * parameters, reading back the master, the working parameters and the
 * gradients, one block at a time through zero_shard.c. */
#include "zero_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Host copies of every block's flat buffer (padded_elems each). */
static float **flat_alloc(const fso_zero *z)
{
    float **flat = calloc((size_t)z->n_blocks, sizeof *flat);
    if (!flat)
        return NULL;
    for (int b = 0; b < z->n_blocks; b++)
        if (!(flat[b] = calloc(z->blocks[b].padded_elems, sizeof(float)))) {
            for (int i = 0; i < b; i++)
                free(flat[i]);
            free(flat);
            return NULL;
        }
    return flat;
}

static void flat_free(const fso_zero *z, float **flat)
{
    for (int b = 0; flat && b < z->n_blocks; b++)
        free(flat[b]);
    free(flat);
}

static int shards_xfer(fso_zero *z, float **flat, fso_kind k, int dir)
{
    for (int b = 0; b < z->n_blocks; b++) {
        int rc = fso_zero_block_xfer(z, b, flat[b], k, dir);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_flat(fso_zero *z, float **flat, char *err, size_t errlen)
{
    int rc;
    if ((rc = shards_xfer(z, flat, FSO_KIND_PARAM, 0)) < 0 ||
        (rc = shards_xfer(z, flat, FSO_KIND_MASTER, 0)) < 0)
        fso_zero_first_error(z, err, errlen);
    return rc;
}

/* Before a whole-model copy: every update in, and host buffers for all
 * blocks. NULL with err set on failure (*rc says why). */
static float **whole_copy_begin(fso_zero *z, const char *what, int *rc, char *err, size_t errlen)
{
    double waited;
    if ((*rc = fso_zero_finish(z, &waited, err, errlen)) < 0)
        return NULL;
    float **flat = flat_alloc(z);
    if (!flat) {
        snprintf(err, errlen, "out of host memory copying %s", what);
        *rc = -ENOMEM;
    }
    return flat;
}

int fso_zero_load_hf(fso_zero *z, const float *hf, char *err, size_t errlen)
{
    int rc;
    float **flat = whole_copy_begin(z, "parameters", &rc, err, errlen);
    if (!flat)
        return rc;
    fso_model_flat_from_hf(&z->ranks[0].model, flat, hf);
    rc = load_flat(z, flat, err, errlen);
    flat_free(z, flat);
    return rc;
}

static int store_kind_hf(fso_zero *z, fso_kind k, float *hf, char *err, size_t errlen)
{
    int rc;
    float **flat = whole_copy_begin(z, fso_kind_name(k), &rc, err, errlen);
    if (!flat)
        return rc;
    rc = shards_xfer(z, flat, k, 1);
    if (rc < 0)
        fso_zero_first_error(z, err, errlen);
    else
        fso_model_flat_to_hf(&z->ranks[0].model, flat, hf);
    flat_free(z, flat);
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
