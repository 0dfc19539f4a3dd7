/* small_model.h — the small training job that test_zero and test_cuda run
 * on every placement: 2 layers, hidden 64, 4 heads over 2 KV heads, 32
 * tokens, 2 micro-batches per step, 3 steps, one warm-up step. */
#ifndef FSO_TEST_SMALL_MODEL_H
#define FSO_TEST_SMALL_MODEL_H

#include "config.h"

#define FSO_TEST_STEPS 3

/* Defaults, then the small job over `world` devices sharing `global_batch`
 * sequences per micro-step; 2 threads, a 256 MiB cap per CPU device. */
static inline void fso_test_small_model(fso_config *cfg, int world, int global_batch)
{
    fso_config_defaults(cfg);
    cfg->model.hidden_size = 64;
    cfg->model.intermediate_size = 128;
    cfg->model.num_hidden_layers = 2;
    cfg->model.num_attention_heads = 4;
    cfg->model.num_key_value_heads = 2;
    cfg->model.head_dim = 16;
    cfg->data.seq_len = 32;
    cfg->world = world;
    cfg->micro_batch = global_batch / world;
    cfg->grad_accum = 2;
    cfg->steps = FSO_TEST_STEPS;
    cfg->sched.warmup_num_steps = 1;
    cfg->threads = 2;
    cfg->device_mem_bytes = 256u << 20;
}

#endif
