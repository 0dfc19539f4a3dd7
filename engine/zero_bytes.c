/* zero_bytes.c — the NVMe bytes one step of a placement moves, kind by
 * kind (zero.h fso_zero_step_nvme_bytes): the README's derivation, which
 * the step line's counts meet and `fsoff bench pipeline` times at the
 * store's own rates. */
#include "zero.h"

#include <stdlib.h>

#define PAGE 4096u

void fso_zero_step_nvme_bytes(const fso_config *cfg, uint64_t *read, uint64_t *write)
{
    const fso_model_config *mc = &cfg->model;
    const uint64_t W = (uint64_t)(cfg->world > 0 ? cfg->world : 1), G = (uint64_t)cfg->grad_accum;
    const int nb = fso_model_n_blocks(mc), nv = fso_model_max_visits(mc);
    fso_block_layout *bl = calloc((size_t)nb, sizeof *bl);
    fso_block_visit *visits = calloc((size_t)nv, sizeof *visits);
    uint64_t *lent = calloc((size_t)nb, sizeof *lent); /* parameter visits per micro-batch */
    for (int k = 0; k < FSO_N_KINDS; k++)
        read[k] = write[k] = 0;
    if (!bl || !visits || !lent)
        goto out;
    fso_model_layout(bl, mc, (int)W);
    for (int i = 0, n = fso_model_visits(mc, visits); i < n; i++)
        if (visits[i].params)
            lent[visits[i].block]++;
    for (int b = 0; b < nb; b++) {
        const uint64_t S = bl[b].padded_elems / W;
        for (int k = 0; k < FSO_N_KINDS; k++) {
            if (fso_offload_block_tier(&cfg->offload, (fso_kind)k, b) != FSO_TIER_NVME)
                continue;
            const uint64_t eb = k == FSO_KIND_PARAM && cfg->bf16 ? 2 : 4;
            const uint64_t shard = (eb * S + PAGE - 1) / PAGE * PAGE * W; /* all devices */
            switch (k) {
            case FSO_KIND_PARAM: /* read at every visit that lends them, written by AdamW */
                read[k] += lent[b] * G * shard;
                write[k] += shard;
                break;
            case FSO_KIND_GRAD: /* each micro-batch adds into them (the first overwrites);
                                   AdamW reads them */
                read[k] += G * shard;
                write[k] += G * shard;
                break;
            default: /* master, m, v: read and written by AdamW */
                read[k] += shard;
                write[k] += shard;
            }
        }
    }
out:
    free(bl);
    free(visits);
    free(lent);
}
