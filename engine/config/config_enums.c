/* config_enums.c — the strings of the configuration keys that take one of a
 * few values (config.h): one table per key, which the parser reads
 * (config_keys.c), fso_config_to_json writes (config_json.c) and the
 * messages that list a key's values are made from. */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* model.model_type: Hugging Face's names */
const fso_config_choice fso_config_model_type_choices[] = {
    {FSO_MODEL_LLAMA, "llama"}, {FSO_MODEL_MISTRAL, "mistral"}, {FSO_MODEL_QWEN2, "qwen2"},
    {0, NULL},
};

/* optimizer.type: both name fsoff's AdamW ("Adam" with adam_w_mode true is
 * the same); the first is the one written */
const fso_config_choice fso_config_optimizer_choices[] = {{0, "AdamW"}, {0, "Adam"}, {0, NULL}};

/* zero_optimization.offload_param.device, zero_optimization.offload_optimizer.device */
const fso_config_choice fso_config_tier_choices[] = {
    {FSO_TIER_DEVICE, "none"}, {FSO_TIER_HOST, "cpu"}, {FSO_TIER_NVME, "nvme"}, {0, NULL},
};

/* train.optimizer_overlap */
const fso_config_choice fso_config_overlap_choices[] = {
    {FSO_OVERLAP_NONE, "none"}, {FSO_OVERLAP_FORWARD, "forward"},
    {FSO_OVERLAP_BACKWARD, "backward"}, {0, NULL},
};

/* train.device_state_from: 0 from the last block down, 1 from block 0 up */
const fso_config_choice fso_config_state_from_choices[] = {
    {0, "last"}, {1, "first"}, {0, NULL},
};

/* train.gradient_dtype: 0 fp32, 1 bf16 */
const fso_config_choice fso_config_grad_dtype_choices[] = {
    {0, "fp32"}, {1, "bf16"}, {0, NULL},
};

/* train.activations: where the layer inputs kept for backward live */
const fso_config_choice fso_config_acts_choices[] = {
    {FSO_TIER_DEVICE, "device"}, {FSO_TIER_HOST, "host"}, {0, NULL},
};

/* comm.rails */
const fso_config_choice fso_config_rails_choices[] = {
    {FSO_RAILS_AUTO, "auto"}, {FSO_RAILS_NCCL, "nccl"}, {FSO_RAILS_MPI, "mpi"}, {0, NULL},
};

/* data.format */
const fso_config_choice fso_config_data_format_choices[] = {
    {FSO_DATA_AUTO, "auto"}, {FSO_DATA_TOKENS, "tokens"}, {FSO_DATA_TEXT, "text"},
    {FSO_DATA_BYTES, "bytes"}, {0, NULL},
};

/* data.documents */
const fso_config_choice fso_config_data_docs_choices[] = {
    {FSO_DATA_DOCS_ISOLATE, "isolate"}, {FSO_DATA_DOCS_STREAM, "stream"}, {0, NULL},
};

/* scheduler.type (DeepSpeed's names; FSO_SCHED_CONSTANT is scheduler null) */
const fso_config_choice fso_config_sched_type_choices[] = {
    {FSO_SCHED_WARMUP_COSINE, "WarmupCosineLR"},
    {FSO_SCHED_WARMUP, "WarmupLR"},
    {FSO_SCHED_WARMUP_DECAY, "WarmupDecayLR"},
    {0, NULL},
};

/* scheduler.params.warmup_type */
const fso_config_choice fso_config_warmup_type_choices[] = {
    {FSO_WARMUP_LOG, "log"}, {FSO_WARMUP_LINEAR, "linear"}, {0, NULL},
};

const char *fso_config_choice_name(const fso_config_choice *table, int value)
{
    for (const fso_config_choice *c = table; c->name; c++)
        if (c->value == value)
            return c->name;
    return "?";
}

int fso_config_choice_find(const fso_config_choice *table, const char *s, bool nocase)
{
    for (int i = 0; table[i].name; i++)
        if (nocase ? strcasecmp(s, table[i].name) == 0 : strcmp(s, table[i].name) == 0)
            return i;
    return -1;
}

void fso_config_choice_list(const fso_config_choice *table, char *buf, size_t len)
{
    int n = 0;
    while (table[n].name)
        n++;
    size_t off = 0;
    buf[0] = '\0';
    for (int k = 0; k < n && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s\"%s\"",
                                k == 0 ? "" : k == n - 1 ? " or " : ", ", table[k].name);
}
