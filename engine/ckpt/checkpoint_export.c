/* checkpoint_export.c — a checkpoint as a Hugging Face folder
 * (fso_ckpt_export_hf, checkpoint.h): its fp32 master, tensor by tensor in
 * Hugging Face order with every chunk checked, handed to the Hugging Face
 * writer (hf.h), which rounds it to the chosen type and writes config.json
 * and the safetensors shards. Neither side holds more than a slice of a
 * tensor. */
#include "checkpoint.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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
    int rc = fso_ckpt_tensors_begin(ck, sizeof(float) * FSO_HF_PIECE_ELEMS, &s.it, err, errlen);
    if (rc == 0) {
        fso_hf_source src = {.ctx = &s, .read = ckpt_read};
        rc = fso_hf_export(outdir, fso_ckpt_model(ck), o, &src, err, errlen);
    }
    fso_ckpt_tensors_end(s.it);
    return rc;
}
