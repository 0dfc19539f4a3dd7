/* model.c — Llama blocks (with Qwen2's q/k/v biases when the type has
 * them), their flat buffers, and the forward/backward pass over the
 * backend ops (see model.h). */
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rng.h"
#include "util.h"

#define TENSOR_ALIGN_ELEMS 64
#define SHARD_PAGE_ELEMS (FSO_IO_PAGE / 2) /* a page of bf16: every shard whole pages in
                                               either type */
#define LOGITS_CHUNK_BYTES (32u << 20)

/* Checked (util.h): a layout whose element counts overflow saturates, and
 * the budgets built on it refuse it. */
static size_t round_up(size_t x, size_t m)
{
    return fso_sat_round_up(x, m);
}

/* Rows of the logits the head computes at once: LOGITS_CHUNK_BYTES of fp32
 * logits, at least 1 and at most the N rows there are. */
static size_t logit_rows(size_t V, size_t N)
{
    size_t rows = LOGITS_CHUNK_BYTES / (sizeof(float) * V);
    return rows < 1 ? 1 : rows > N ? N : rows;
}

static void add_tensor(fso_block_layout *b, fso_tensor_kind kind, const char *name, int rows,
                       int cols, bool is_norm, bool decay)
{
    FSO_BUG_ON(b->n_tensors >= FSO_BLOCK_MAX_TENSORS, "block with more than %d tensors",
               FSO_BLOCK_MAX_TENSORS);
    fso_tensor_desc *t = &b->tensors[b->n_tensors++];
    t->kind = kind;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->offset_elems = round_up(b->used_elems, TENSOR_ALIGN_ELEMS);
    t->numel = (size_t)rows * cols;
    t->is_norm = is_norm;
    t->decay = decay;
    b->used_elems = fso_sat_add(t->offset_elems, t->numel);
}

int fso_model_n_blocks(const fso_model_config *mc)
{
    return mc->num_hidden_layers + 2;
}

int fso_model_max_visits(const fso_model_config *mc)
{
    return 2 * mc->num_hidden_layers + 5; /* tied: the head takes three */
}

int fso_model_visits(const fso_model_config *mc, fso_block_visit *out)
{
    const int L = mc->num_hidden_layers, head = L + 1;
    int n = 0;
    out[n++] = (fso_block_visit){0, FSO_PART_EMBED_FWD, true, false};
    for (int l = 0; l < L; l++)
        out[n++] = (fso_block_visit){1 + l, FSO_PART_LAYER_FWD, true, false};
    if (mc->tie_word_embeddings) { /* the head computes with its block and the embedding lent */
        out[n++] = (fso_block_visit){head, FSO_PART_NONE, true, false};
        out[n++] = (fso_block_visit){0, FSO_PART_HEAD, true, false};
        out[n++] = (fso_block_visit){head, FSO_PART_NONE, false, true};
    } else {
        out[n++] = (fso_block_visit){head, FSO_PART_HEAD, true, true};
    }
    for (int l = L - 1; l >= 0; l--)
        out[n++] = (fso_block_visit){1 + l, FSO_PART_LAYER_BWD, true, true};
    out[n++] = (fso_block_visit){0, FSO_PART_EMBED_BWD, false, true};
    return n;
}

int fso_model_layout(fso_block_layout *blocks, const fso_model_config *mc, int world)
{
    const int C = mc->hidden_size, F = mc->intermediate_size, V = mc->vocab_size;
    const int qd = mc->num_attention_heads * mc->head_dim;
    const int kvd = mc->num_key_value_heads * mc->head_dim;
    const int L = mc->num_hidden_layers;
    char name[64];

    memset(blocks, 0, sizeof *blocks * (size_t)fso_model_n_blocks(mc));
    fso_block_layout *b = &blocks[0];
    b->kind = FSO_BLOCK_EMBED;
    b->layer = -1;
    add_tensor(b, FSO_T_EMBED, "model.embed_tokens.weight", V, C, false, false);

    for (int l = 0; l < L; l++) {
        b = &blocks[1 + l];
        b->kind = FSO_BLOCK_LAYER;
        b->layer = l;
#define T_(kind, suffix, r, c, norm)                                                       \
    do {                                                                                   \
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, suffix);               \
        add_tensor(b, kind, name, r, c, norm, !(norm));                                    \
    } while (0)
        T_(FSO_T_ATTN_NORM, "input_layernorm", C, 1, true);
/* a bias (rows): no decay, set to 0 */
#define BIAS_(kind, suffix, r)                                                             \
    do {                                                                                   \
        if (fso_model_qkv_bias(mc)) {                                                      \
            snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, suffix);             \
            add_tensor(b, kind, name, r, 1, false, false);                                 \
            b->tensors[b->n_tensors - 1].is_bias = true;                                   \
        }                                                                                  \
    } while (0)
        T_(FSO_T_Q, "self_attn.q_proj", qd, C, false);
        BIAS_(FSO_T_Q_BIAS, "self_attn.q_proj", qd);
        T_(FSO_T_K, "self_attn.k_proj", kvd, C, false);
        BIAS_(FSO_T_K_BIAS, "self_attn.k_proj", kvd);
        T_(FSO_T_V, "self_attn.v_proj", kvd, C, false);
        BIAS_(FSO_T_V_BIAS, "self_attn.v_proj", kvd);
        T_(FSO_T_O, "self_attn.o_proj", C, qd, false);
        T_(FSO_T_MLP_NORM, "post_attention_layernorm", C, 1, true);
        T_(FSO_T_GATE, "mlp.gate_proj", F, C, false);
        T_(FSO_T_UP, "mlp.up_proj", F, C, false);
        T_(FSO_T_DOWN, "mlp.down_proj", C, F, false);
#undef T_
#undef BIAS_
    }

    b = &blocks[L + 1];
    b->kind = FSO_BLOCK_HEAD;
    b->layer = -1;
    add_tensor(b, FSO_T_FINAL_NORM, "model.norm.weight", C, 1, true, false);
    if (!mc->tie_word_embeddings)
        add_tensor(b, FSO_T_LM_HEAD, "lm_head.weight", V, C, false, true);

    for (int i = 0; i < fso_model_n_blocks(mc); i++)
        blocks[i].padded_elems = round_up(blocks[i].used_elems, (size_t)world * SHARD_PAGE_ELEMS);
    return fso_model_n_blocks(mc);
}

static const fso_tensor_desc *find_tensor(const fso_block_layout *b, fso_tensor_kind kind)
{
    for (int i = 0; i < b->n_tensors; i++)
        if (b->tensors[i].kind == kind)
            return &b->tensors[i];
    return NULL;
}

static size_t tensor_offset(const fso_model *m, int bi, fso_tensor_kind kind)
{
    const fso_tensor_desc *t = find_tensor(&m->blocks[bi], kind);
    FSO_BUG_ON(!t, "block %d has no tensor of kind %d", bi, kind);
    return t->offset_elems;
}

/* Tensor `kind` of block `bi` in the lent parameters [wt] / gradients. */
static const void *P_(const fso_model *m, int bi, fso_tensor_kind kind)
{
    FSO_BUG_ON(!m->params[bi], "block %d used without its parameters", bi);
    return (const char *)m->params[bi] + fso_dtype_size(m->wt) * tensor_offset(m, bi, kind);
}

static float *G_(const fso_model *m, int bi, fso_tensor_kind kind)
{
    FSO_BUG_ON(!m->grads[bi], "block %d used without its gradients", bi);
    return m->grads[bi] + tensor_offset(m, bi, kind);
}

static int dalloc(fso_model *m, void *out, size_t bytes)
{
    int rc = m->be->ops->buf_alloc(m->be, bytes, (void **)out);
    if (rc < 0) {
        snprintf(m->err, sizeof m->err, "%s backend: cannot allocate %.1f MiB (%.1f MiB held): %s",
                 m->be->ops->name, bytes / 1048576.0, m->device_bytes / 1048576.0, m->be->err);
        return rc;
    }
    m->device_bytes += bytes;
    return 0;
}

int fso_model_init(fso_model *m, const fso_model_config *mc, fso_backend *be, int B, int T,
                   int world, bool checkpointing, bool bf16)
{
    const fso_model_opts o = {.checkpointing = checkpointing, .bf16 = bf16, .acts = FSO_TIER_DEVICE};
    return fso_model_init_opts(m, mc, be, B, T, world, &o);
}

bool fso_model_acts_tier_ok(fso_tier t, bool checkpointing)
{
    return t == FSO_TIER_DEVICE || (t == FSO_TIER_HOST && checkpointing);
}

/* Kept inputs that leave the ring on the host tier: 0 .. L - FSO_ACT_RING
 * (the last FSO_ACT_RING, the final x among them, stay in their slots). */
static size_t host_kept(const fso_model_config *mc, fso_tier acts)
{
    const size_t kept = (size_t)mc->num_hidden_layers + 1;
    return acts == FSO_TIER_HOST && kept > FSO_ACT_RING ? kept - FSO_ACT_RING : 0;
}

/* Bytes of one kept input (N,C): bf16 with bf16 and checkpointing. */
static size_t kept_bytes(const fso_model_config *mc, int B, int T, bool checkpointing, bool bf16)
{
    const size_t eb = bf16 && checkpointing ? sizeof(uint16_t) : sizeof(float);
    return fso_sat_mul(fso_sat_mul(eb, (size_t)B * T), (size_t)mc->hidden_size);
}

size_t fso_model_host_act_bytes_for(const fso_model_config *mc, int B, int T,
                                    bool checkpointing, bool bf16, fso_tier acts)
{
    return fso_sat_mul(host_kept(mc, acts), kept_bytes(mc, B, T, checkpointing, bf16));
}

uint64_t fso_model_act_bytes_per_step(const fso_model_config *mc, int B, int T,
                                      bool checkpointing, bool bf16, fso_tier acts)
{
    return fso_sat_mul(2, fso_model_host_act_bytes_for(mc, B, T, checkpointing, bf16, acts));
}

int fso_model_init_opts(fso_model *m, const fso_model_config *mc, fso_backend *be, int B, int T,
                        int world, const fso_model_opts *o)
{
    const bool checkpointing = o->checkpointing, bf16 = o->bf16;
    memset(m, 0, sizeof *m);
    if (!fso_model_acts_tier_ok(o->acts, checkpointing)) {
        snprintf(m->err, sizeof m->err,
                 "activations on the %s: only the layer inputs kept with "
                 "train.activation_checkpointing move off the device; turn it on, or keep "
                 "train.activations \"device\"",
                 o->acts == FSO_TIER_HOST ? "host" : "NVMe");
        return -EINVAL;
    }
    if (o->acts == FSO_TIER_HOST && !o->host_acts &&
        fso_model_host_act_bytes_for(mc, B, T, checkpointing, bf16, o->acts) > 0) {
        snprintf(m->err, sizeof m->err, "activations on the host: no host buffer lent for them");
        return -EINVAL;
    }
    m->mc = *mc;
    m->be = be;
    m->B = B;
    m->T = T;
    m->world = world;
    m->checkpointing = checkpointing;
    m->bf16_acts = bf16 && checkpointing;
    m->wt = bf16 ? FSO_DT_BF16 : FSO_DT_F32;
    m->acts_tier = o->acts;
    m->n_host = (int)host_kept(mc, o->acts);
    m->host_acts = o->host_acts;

    const int L = mc->num_hidden_layers, C = mc->hidden_size, F = mc->intermediate_size;
    const int H = mc->num_attention_heads, Hkv = mc->num_key_value_heads, D = mc->head_dim;
    const int V = mc->vocab_size;
    const size_t N = (size_t)B * T;
    int rc = -ENOMEM;

    m->n_blocks = fso_model_n_blocks(mc);
    m->blocks = calloc((size_t)m->n_blocks, sizeof *m->blocks);
    m->params = calloc((size_t)m->n_blocks, sizeof *m->params);
    m->grads = calloc((size_t)m->n_blocks, sizeof *m->grads);
    m->layer_in = calloc((size_t)L + 1, sizeof *m->layer_in);
    m->kept16 = calloc((size_t)L + 1, sizeof *m->kept16);
    m->n_acts = checkpointing ? 1 : L;
    m->acts = calloc((size_t)(m->n_acts > 0 ? m->n_acts : 1), sizeof *m->acts);
    if (!m->blocks || !m->params || !m->grads || !m->layer_in || !m->kept16 || !m->acts) {
        snprintf(m->err, sizeof m->err, "out of host memory for the model tables");
        goto fail;
    }
    fso_model_layout(m->blocks, mc, world);

    for (int i = 0; i < m->n_blocks; i++)
        for (int t = 0; t < m->blocks[i].n_tensors; t++)
            m->n_params += m->blocks[i].tensors[t].numel;

    const size_t fN = sizeof(float) * N, wN = fso_dtype_size(m->wt) * N;
    if ((rc = dalloc(m, &m->tokens, sizeof(int32_t) * N)) < 0 ||
        (rc = dalloc(m, &m->targets, sizeof(int32_t) * N)) < 0 ||
        (rc = dalloc(m, &m->pos, sizeof(int32_t) * N)) < 0 ||
        (rc = dalloc(m, &m->rope_cos, sizeof(float) * (size_t)T * (D / 2))) < 0 ||
        (rc = dalloc(m, &m->rope_sin, sizeof(float) * (size_t)T * (D / 2))) < 0)
        goto fail;
    const size_t kept = m->bf16_acts ? sizeof(uint16_t) * N * C : fN * C;
    if (m->acts_tier == FSO_TIER_HOST) { /* a ring of slots; input l is slot l % FSO_ACT_RING */
        for (int r = 0; r < FSO_ACT_RING && r <= L; r++)
            if ((rc = dalloc(m, &m->ring[r], kept)) < 0)
                goto fail;
        for (int l = 0; l <= L; l++)
            if (m->bf16_acts)
                m->kept16[l] = m->ring[l % FSO_ACT_RING];
            else
                m->layer_in[l] = m->ring[l % FSO_ACT_RING];
    } else {
        for (int l = 0; l <= L; l++)
            if ((rc = m->bf16_acts ? dalloc(m, &m->kept16[l], kept)
                                   : dalloc(m, &m->layer_in[l], kept)) < 0)
                goto fail;
    }
    if (m->bf16_acts && ((rc = dalloc(m, &m->xa, fN * C)) < 0 || (rc = dalloc(m, &m->xb, fN * C)) < 0))
        goto fail;
    for (int a = 0; a < m->n_acts; a++) {
        fso_layer_acts *x = &m->acts[a];
        if ((rc = dalloc(m, &x->h1, wN * C)) < 0 || (rc = dalloc(m, &x->rstd1, fN)) < 0 ||
            (rc = dalloc(m, &x->q, wN * H * D)) < 0 || (rc = dalloc(m, &x->k, wN * Hkv * D)) < 0 ||
            (rc = dalloc(m, &x->v, wN * Hkv * D)) < 0 ||
            (rc = dalloc(m, &x->probs, fso_dtype_size(m->wt) * B * H * (size_t)T * T)) < 0 ||
            (rc = dalloc(m, &x->att, wN * H * D)) < 0 || (rc = dalloc(m, &x->x2, fN * C)) < 0 ||
            (rc = dalloc(m, &x->h2, wN * C)) < 0 || (rc = dalloc(m, &x->rstd2, fN)) < 0 ||
            (rc = dalloc(m, &x->gate, wN * F)) < 0 || (rc = dalloc(m, &x->up, wN * F)) < 0 ||
            (rc = dalloc(m, &x->act, wN * F)) < 0)
            goto fail;
    }
    m->chunk_rows = (int)logit_rows((size_t)V, N);
    if ((rc = dalloc(m, &m->xf, wN * C)) < 0 || (rc = dalloc(m, &m->rstdf, fN)) < 0 ||
        (rc = dalloc(m, &m->logits, sizeof(float) * (size_t)m->chunk_rows * V)) < 0 ||
        (rc = dalloc(m, &m->losses, fN)) < 0 || (rc = dalloc(m, &m->dres, fN * C)) < 0 ||
        (rc = dalloc(m, &m->dh, fN * C)) < 0 || (rc = dalloc(m, &m->dq, wN * H * D)) < 0 ||
        (rc = dalloc(m, &m->dk, wN * Hkv * D)) < 0 || (rc = dalloc(m, &m->dv, wN * Hkv * D)) < 0 ||
        (rc = dalloc(m, &m->datt, wN * H * D)) < 0 || (rc = dalloc(m, &m->dgate, wN * F)) < 0 ||
        (rc = dalloc(m, &m->dup, wN * F)) < 0 || (rc = dalloc(m, &m->dact, wN * F)) < 0)
        goto fail;

    {
        float *cs = malloc(sizeof(float) * (size_t)T * (D / 2) * 2);
        if (!cs) {
            rc = -ENOMEM;
            snprintf(m->err, sizeof m->err, "out of host memory for the RoPE tables");
            goto fail;
        }
        fso_rope_tables_scaled(cs, cs + (size_t)T * (D / 2), T, D, mc->rope_theta,
                               &mc->rope_scaling);
        be->ops->copy_h2d(be, m->rope_cos, cs, sizeof(float) * (size_t)T * (D / 2));
        be->ops->copy_h2d(be, m->rope_sin, cs + (size_t)T * (D / 2),
                          sizeof(float) * (size_t)T * (D / 2));
        rc = be->ops->sync(be);
        free(cs);
        if (rc < 0) {
            snprintf(m->err, sizeof m->err, "%s backend: %s", be->ops->name, be->err);
            goto fail;
        }
    }
    return 0;

fail:
    if (!m->err[0])
        snprintf(m->err, sizeof m->err, "out of memory while allocating the model");
    char keep[sizeof m->err];
    memcpy(keep, m->err, sizeof keep);
    fso_model_free(m);
    memcpy(m->err, keep, sizeof keep);
    return rc < 0 ? rc : -ENOMEM;
}

void fso_model_free(fso_model *m)
{
    if (!m || !m->be)
        return;
    fso_backend *be = m->be;
    void (*f)(fso_backend *, void *) = be->ops->buf_free;
    if (m->acts_tier == FSO_TIER_HOST) {
        be->ops->sync(be); /* no copy may still read or write a slot or the host buffers */
        for (int r = 0; r < FSO_ACT_RING; r++)
            f(be, m->ring[r]);
    } else {
        for (int l = 0; m->layer_in && l <= m->mc.num_hidden_layers; l++)
            f(be, m->layer_in[l]);
        for (int l = 0; m->kept16 && l <= m->mc.num_hidden_layers; l++)
            f(be, m->kept16[l]);
    }
    f(be, m->xa);
    f(be, m->xb);
    for (int a = 0; m->acts && a < m->n_acts; a++) {
        fso_layer_acts *x = &m->acts[a];
        void *bufs[] = {x->h1, x->rstd1, x->q, x->k, x->v, x->probs, x->att,
                        x->x2, x->h2, x->rstd2, x->gate, x->up, x->act};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            f(be, bufs[i]);
    }
    void *bufs[] = {m->tokens, m->targets, m->pos, m->rope_cos, m->rope_sin, m->xf, m->rstdf,
                    m->logits, m->losses, m->dres, m->dh, m->dq, m->dk,
                    m->dv, m->datt, m->dgate, m->dup, m->dact};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        f(be, bufs[i]);
    free(m->blocks);
    free(m->params);
    free(m->grads);
    free(m->layer_in);
    free(m->kept16);
    free(m->acts);
    memset(m, 0, sizeof *m);
}

/* Walk every tensor in HF order between a packed host array and the flat
 * block buffers (host). dir 0: hf -> flat, 1: flat -> hf. */
static void copy_hf(const fso_model *m, float *const *flat, float *hf, int dir)
{
    size_t off = 0;
    for (int i = 0; i < m->n_blocks; i++)
        for (int t = 0; t < m->blocks[i].n_tensors; t++) {
            const fso_tensor_desc *d = &m->blocks[i].tensors[t];
            float *f = flat[i] + d->offset_elems;
            if (dir == 0)
                memcpy(f, hf + off, sizeof(float) * d->numel);
            else
                memcpy(hf + off, f, sizeof(float) * d->numel);
            off += d->numel;
        }
}

void fso_model_flat_from_hf(const fso_model *m, float **flat, const float *hf)
{
    copy_hf(m, flat, (float *)hf, 0);
}

void fso_model_flat_to_hf(const fso_model *m, float *const *flat, float *hf)
{
    copy_hf(m, flat, hf, 1);
}

void fso_model_init_block(const fso_model *m, int i, float *flat, struct fso_rng *rng)
{
    memset(flat, 0, sizeof(float) * m->blocks[i].padded_elems);
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
        const fso_tensor_desc *d = &m->blocks[i].tensors[t];
        float *f = flat + d->offset_elems;
        for (size_t e = 0; e < d->numel; e++)
            f[e] = d->is_norm   ? 1.0f
                   : d->is_bias ? 0.0f
                                : (float)(m->mc.initializer_range * fso_rng_normal(rng));
    }
}

void fso_model_init_flat(const fso_model *m, float **flat, uint64_t seed)
{
    fso_rng rng;
    fso_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_blocks; i++)
        fso_model_init_block(m, i, flat[i], &rng);
}

size_t fso_model_activation_bytes(const fso_model *m)
{
    return m->device_bytes;
}

/* Mirrors the allocations of fso_model_init (each rounded to 64 bytes as
 * the CPU backend does); test_train checks the two agree. Checked: sizes
 * that overflow 64 bits give FSO_BYTES_OVERFLOW. */
size_t fso_model_activation_bytes_for(const fso_model_config *mc, int B, int T,
                                      bool checkpointing, bool bf16)
{
    return fso_model_activation_bytes_tier(mc, B, T, checkpointing, bf16, FSO_TIER_DEVICE);
}

size_t fso_model_activation_bytes_tier(const fso_model_config *mc, int B, int T,
                                       bool checkpointing, bool bf16, fso_tier acts)
{
    const size_t L = (size_t)mc->num_hidden_layers, C = (size_t)mc->hidden_size;
    const size_t F = (size_t)mc->intermediate_size, V = (size_t)mc->vocab_size;
    const size_t H = (size_t)mc->num_attention_heads, Hkv = (size_t)mc->num_key_value_heads;
#define M(a, b) fso_sat_mul(a, b)
#define A(a, b) fso_sat_add(a, b)
#define R64(x) fso_sat_round_up(x, 64)
    const size_t D = (size_t)mc->head_dim, N = (size_t)B * T, fN = M(sizeof(float), N);
    const size_t wb = bf16 ? sizeof(uint16_t) : sizeof(float), wN = M(wb, N);
    size_t total = A(M(3, R64(M(sizeof(int32_t), N))), /* tokens, targets, positions */
                     M(2, R64(M(sizeof(float) * (size_t)T, D / 2))));
    /* the kept inputs: L + 1, or the ring's slots on the host tier */
    const size_t slots = acts == FSO_TIER_HOST && L + 1 > FSO_ACT_RING ? FSO_ACT_RING : L + 1;
    if (bf16 && checkpointing)
        total = A(total, A(M(slots, R64(M(M(sizeof(uint16_t), N), C))), M(2, R64(M(fN, C)))));
    else
        total = A(total, M(slots, R64(M(fN, C))));
    /* the attention probabilities and the rest inside a layer */
    const size_t probs = R64(M(M(M(wb * (size_t)B, H), T), T));
    size_t inner = A(A(M(2, R64(M(M(wN, H), D))), M(2, R64(M(M(wN, Hkv), D)))),
                     M(3, R64(M(wN, F))));
    size_t per_layer = A(A(A(M(2, R64(M(wN, C))), R64(M(fN, C))), M(2, R64(fN))), A(inner, probs));
    total = A(total, M(checkpointing ? 1 : L, per_layer));
    const size_t rows = logit_rows(V, N);
    total = A(total, A(A(A(R64(M(wN, C)), M(2, R64(M(fN, C)))), M(2, R64(fN))),
                       A(R64(M(M(sizeof(float), rows), V)), inner)));
#undef M
#undef A
#undef R64
    return total;
}

static size_t max2(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* The widest op in floats, argument by argument as cpu_dtype.c widens them
 * (bf16 ones only; outputs that are fp32 need no space). */
size_t fso_model_cpu_widen_bytes_for(const fso_model_config *mc, int B, int T)
{
#define M(a, b) fso_sat_mul(a, b)
#define A(a, b) fso_sat_add(a, b)
    const size_t C = (size_t)mc->hidden_size, F = (size_t)mc->intermediate_size;
    const size_t V = (size_t)mc->vocab_size, N = (size_t)B * T;
    const size_t qd = (size_t)mc->num_attention_heads * mc->head_dim;
    const size_t kvd = (size_t)mc->num_key_value_heads * mc->head_dim;
    const size_t probs = M(M((size_t)B * mc->num_attention_heads, T), T);
    const size_t rows = logit_rows(V, N);
    const size_t NC = M(N, C), Nqd = M(N, qd), NF = M(N, F);
    size_t w = A(NC, C);                                    /* rmsnorm_fwd */
    w = max2(w, A(A(Nqd, NC), M(qd, C)));                   /* q (k, v, biases: smaller) */
    w = max2(w, A(Nqd, M(C, qd)));                          /* o */
    w = max2(w, A(A(NF, NC), M(F, C)));                     /* gate, up (fwd and bwd) */
    w = max2(w, A(M(2, NF), M(C, F)));                      /* down bwd */
    w = max2(w, A(M(2, Nqd), M(C, qd)));                    /* o bwd */
    w = max2(w, A(M(rows, C), M(V, C)));                    /* head */
    w = max2(w, A(A(M(3, Nqd), M(4, M(N, kvd))), probs));   /* attention bwd (fwd is less) */
    w = max2(w, M(5, NF));                                  /* swiglu bwd */
    return M(sizeof(float), w);
#undef M
#undef A
}

/* The CUDA backend's widest scratch request over a step (one buffer, grown
 * to it: kernels/cuda/cuda_backend.c), in 2 MiB: attention's backward per batch
 * element (cuda_attention.c), a matmul's fp32 dout rounded to bf16
 * (cuda_matmul.c: the residual gradient, a chunk of the logits' gradient),
 * RMSNorm's weight-gradient partials (cuda_ops.cu; the norms' are smaller). */
size_t fso_model_cuda_scratch_bytes_for(const fso_model_config *mc, int B, int T, bool bf16)
{
#define M(a, b) fso_sat_mul(a, b)
#define A(a, b) fso_sat_add(a, b)
#define R256(x) fso_sat_round_up(x, 256)
    const size_t C = (size_t)mc->hidden_size, V = (size_t)mc->vocab_size, N = (size_t)B * T;
    const size_t H = (size_t)mc->num_attention_heads, Hkv = (size_t)mc->num_key_value_heads;
    const size_t D = (size_t)mc->head_dim, TT = (size_t)T * T;
    size_t w;
    if (bf16) {
        w = A(A(R256(M(4 * Hkv, TT)), R256(M(2 * Hkv, TT))),
              H > Hkv ? M(2, R256(M(M(4 * (size_t)T, Hkv), D))) : 0);
        w = max2(w, R256(M(2, M(N, C))));
        w = max2(w, R256(M(2 * logit_rows(V, N), V)));
    } else {
        w = M(4 * H, TT);
    }
    w = max2(w, M(4 * ((N + 63) / 64), C)); /* RMSNorm: 64 rows a chunk */
    if (fso_model_qkv_bias(mc)) /* a bias's gradient: the same partials, q's the widest */
        w = max2(w, M(4 * ((N + 63) / 64), (size_t)mc->num_attention_heads * mc->head_dim));
    return fso_sat_round_up(w, (size_t)2 << 20);
#undef M
#undef A
#undef R256
}

/* A layer's dimensions, as its ops take them. */
typedef struct layer_dims {
    int B, T, N;          /* micro-batch, sequence, rows (B*T) */
    int C, F;             /* hidden, MLP width */
    int H, Hkv, D;        /* query heads, key-value heads, head size */
    float eps;            /* RMSNorm's */
} layer_dims;

static layer_dims dims_of(const fso_model *m)
{
    const fso_model_config *mc = &m->mc;
    return (layer_dims){.B = m->B, .T = m->T, .N = m->B * m->T, .C = mc->hidden_size,
                        .F = mc->intermediate_size, .H = mc->num_attention_heads,
                        .Hkv = mc->num_key_value_heads, .D = mc->head_dim,
                        .eps = (float)mc->rms_norm_eps};
}

/* Forward of layer l from x (N,C). y (N,C) gets the output; y == NULL stops
 * after the MLP activation (what backward needs when recomputing). The
 * branches' last matmuls write fp32 straight into the residual stream. */
static void layer_forward(fso_model *m, int l, fso_layer_acts *a, const float *x, float *y)
{
    fso_backend *be = m->be;
    const fso_backend_ops *op = be->ops;
    const fso_dtype wt = m->wt, f32 = FSO_DT_F32;
    const layer_dims d = dims_of(m);
    const int bi = 1 + l, N = d.N, C = d.C, qd = d.H * d.D, kvd = d.Hkv * d.D;

    op->rmsnorm_fwd(be, a->h1, a->rstd1, x, P_(m, bi, FSO_T_ATTN_NORM), wt, N, C, d.eps);
    op->matmul_fwd(be, a->q, wt, a->h1, P_(m, bi, FSO_T_Q), wt, N, C, qd);
    op->matmul_fwd(be, a->k, wt, a->h1, P_(m, bi, FSO_T_K), wt, N, C, kvd);
    op->matmul_fwd(be, a->v, wt, a->h1, P_(m, bi, FSO_T_V), wt, N, C, kvd);
    if (fso_model_qkv_bias(&m->mc)) { /* in bf16: rounded after the product, then the sum */
        op->bias_add(be, a->q, P_(m, bi, FSO_T_Q_BIAS), wt, N, qd);
        op->bias_add(be, a->k, P_(m, bi, FSO_T_K_BIAS), wt, N, kvd);
        op->bias_add(be, a->v, P_(m, bi, FSO_T_V_BIAS), wt, N, kvd);
    }
    const int32_t *pos = m->docs ? m->pos : NULL;
    op->rope(be, a->q, wt, m->rope_cos, m->rope_sin, pos, d.B, d.T, d.H, d.D, 0);
    op->rope(be, a->k, wt, m->rope_cos, m->rope_sin, pos, d.B, d.T, d.Hkv, d.D, 0);
    op->attention_fwd(be, a->att, a->probs, a->q, a->k, a->v, pos, wt, d.B, d.T, d.H, d.Hkv,
                      d.D);
    op->matmul_fwd(be, a->x2, f32, a->att, P_(m, bi, FSO_T_O), wt, N, qd, C);
    op->add(be, a->x2, a->x2, x, (size_t)N * C);
    op->rmsnorm_fwd(be, a->h2, a->rstd2, a->x2, P_(m, bi, FSO_T_MLP_NORM), wt, N, C, d.eps);
    op->matmul_fwd(be, a->gate, wt, a->h2, P_(m, bi, FSO_T_GATE), wt, N, C, d.F);
    op->matmul_fwd(be, a->up, wt, a->h2, P_(m, bi, FSO_T_UP), wt, N, C, d.F);
    op->swiglu_fwd(be, a->act, a->gate, a->up, wt, (size_t)N * d.F);
    if (y) {
        op->matmul_fwd(be, y, f32, a->act, P_(m, bi, FSO_T_DOWN), wt, N, d.F, C);
        op->add(be, y, y, a->x2, (size_t)N * C);
    }
}

/* Backward of layer l: m->dres holds dL/dy on entry and dL/dx on return. */
static void layer_backward(fso_model *m, int l, const fso_layer_acts *a, const float *x)
{
    fso_backend *be = m->be;
    const fso_backend_ops *op = be->ops;
    const fso_dtype wt = m->wt, f32 = FSO_DT_F32;
    const layer_dims d = dims_of(m);
    const int bi = 1 + l, N = d.N, C = d.C, F = d.F, qd = d.H * d.D, kvd = d.Hkv * d.D;
#define W(kind) P_(m, bi, kind)
#define DW(kind) G_(m, bi, kind)
    /* y = x2 + down(silu(gate(h2)) * up(h2)) */
    op->matmul_bwd(be, m->dact, wt, DW(FSO_T_DOWN), m->dres, f32, a->act, W(FSO_T_DOWN), wt, N, F,
                   C, 0.0f);
    op->swiglu_bwd(be, m->dgate, m->dup, m->dact, a->gate, a->up, wt, (size_t)N * F);
    op->matmul_bwd(be, m->dh, f32, DW(FSO_T_GATE), m->dgate, wt, a->h2, W(FSO_T_GATE), wt, N, C,
                   F, 0.0f);
    op->matmul_bwd(be, m->dh, f32, DW(FSO_T_UP), m->dup, wt, a->h2, W(FSO_T_UP), wt, N, C, F,
                   1.0f);
    op->rmsnorm_bwd(be, m->dres, DW(FSO_T_MLP_NORM), m->dh, a->x2, W(FSO_T_MLP_NORM), wt, a->rstd2,
                    N, C);
    /* x2 = x + o(attention(rope(q(h1)), rope(k(h1)), v(h1))) */
    op->matmul_bwd(be, m->datt, wt, DW(FSO_T_O), m->dres, f32, a->att, W(FSO_T_O), wt, N, qd, C,
                   0.0f);
    const int32_t *pos = m->docs ? m->pos : NULL;
    op->attention_bwd(be, m->dq, m->dk, m->dv, m->datt, a->probs, a->q, a->k, a->v, pos, wt, d.B,
                      d.T, d.H, d.Hkv, d.D);
    op->rope(be, m->dq, wt, m->rope_cos, m->rope_sin, pos, d.B, d.T, d.H, d.D, 1);
    op->rope(be, m->dk, wt, m->rope_cos, m->rope_sin, pos, d.B, d.T, d.Hkv, d.D, 1);
    if (fso_model_qkv_bias(&m->mc)) {
        op->bias_bwd(be, DW(FSO_T_Q_BIAS), m->dq, wt, N, qd);
        op->bias_bwd(be, DW(FSO_T_K_BIAS), m->dk, wt, N, kvd);
        op->bias_bwd(be, DW(FSO_T_V_BIAS), m->dv, wt, N, kvd);
    }
    op->matmul_bwd(be, m->dh, f32, DW(FSO_T_Q), m->dq, wt, a->h1, W(FSO_T_Q), wt, N, C, qd, 0.0f);
    op->matmul_bwd(be, m->dh, f32, DW(FSO_T_K), m->dk, wt, a->h1, W(FSO_T_K), wt, N, C, kvd, 1.0f);
    op->matmul_bwd(be, m->dh, f32, DW(FSO_T_V), m->dv, wt, a->h1, W(FSO_T_V), wt, N, C, kvd, 1.0f);
    op->rmsnorm_bwd(be, m->dres, DW(FSO_T_ATTN_NORM), m->dh, x, W(FSO_T_ATTN_NORM), wt, a->rstd1,
                    N, C);
#undef W
#undef DW
}

/* With standin_ms: wait the part's time in place of computing it, and
 * say so. A timed wait on the calling thread, as compute would take it. */
static bool stand_in(const fso_model *m, fso_visit_part part)
{
    if (!m->standin_ms)
        return false;
    double ms = m->standin_ms[part];
    if (ms > 0) {
        struct timespec ts = {.tv_sec = (time_t)(ms / 1e3),
                              .tv_nsec = (long)((ms - 1e3 * (double)(time_t)(ms / 1e3)) * 1e6)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return true;
}

static void lend_params(fso_model *m, const fso_block_source *src, int b)
{
    m->params[b] = src->params(src->ctx, b);
}

static void return_params(fso_model *m, const fso_block_source *src, int b)
{
    src->release(src->ctx, b);
    m->params[b] = NULL;
}

static void lend_grads(fso_model *m, const fso_block_source *src, int b)
{
    m->grads[b] = src->grads(src->ctx, b);
}

static void return_grads(fso_model *m, const fso_block_source *src, int b)
{
    src->grads_done(src->ctx, b);
    m->grads[b] = NULL;
}

/* Where the forward writes layer l's input (l = L: the final x): its kept
 * buffer, or with bf16_acts the work buffer the previous one is not. */
static float *layer_out(fso_model *m, int l)
{
    if (!m->bf16_acts)
        return m->layer_in[l];
    return l % 2 ? m->xb : m->xa;
}

/* Keep x, layer l's input, for backward: with bf16_acts round it to bf16
 * and go on from the rounded value, so the recomputation sees the same. */
static void keep(fso_model *m, int l, float *x)
{
    if (!m->bf16_acts)
        return;
    size_t n = (size_t)m->B * m->T * m->mc.hidden_size;
    m->be->ops->cast_f32_bf16(m->be, m->kept16[l], x, n);
    m->be->ops->cast_bf16_f32(m->be, x, m->kept16[l], n);
}

/* Layer l's kept input, as fp32 (bf16_acts: widened into xa). */
static const float *layer_input(fso_model *m, int l)
{
    if (!m->bf16_acts)
        return m->layer_in[l];
    m->be->ops->cast_bf16_f32(m->be, m->xa, m->kept16[l],
                              (size_t)m->B * m->T * m->mc.hidden_size);
    return m->xa;
}

/* ---- kept inputs on the host tier (model.h acts_tier) ----
 * Input l lives in ring slot l % FSO_ACT_RING. The forward copies it down
 * as soon as compute has written it, so the copy runs beside the layer that
 * reads it (compute does not wait for copies down), and orders the compute
 * that next writes the slot after that copy. The backward, once the reader
 * of input k is queued, copies input k-1 up into its slot after the mark
 * taken when that slot's last reader was queued, so the copy runs beside
 * reader k; compute waits for copies up queued before it, so reader k-1
 * finds it there. */

static uint64_t act_mark(fso_backend *be)
{
    return be->ops->mark ? be->ops->mark(be) : 0;
}

static void *kept_ptr(const fso_model *m, int l)
{
    return m->bf16_acts ? (void *)m->kept16[l] : (void *)m->layer_in[l];
}

static size_t kept_size(const fso_model *m)
{
    return (m->bf16_acts ? sizeof(uint16_t) : sizeof(float)) * (size_t)m->B * m->T *
           m->mc.hidden_size;
}

/* Before compute writes input l: after the copy down of the slot's last
 * input. */
static void act_before_write(fso_model *m, int l)
{
    if (m->acts_tier == FSO_TIER_HOST && l >= FSO_ACT_RING && l - FSO_ACT_RING < m->n_host)
        fso_backend_order_after(m->be, m->slot_mark[l % FSO_ACT_RING]);
}

/* Input l was written: down to the host when it leaves the ring. */
static void act_written(fso_model *m, int l)
{
    if (m->acts_tier != FSO_TIER_HOST || l >= m->n_host)
        return;
    const size_t kb = kept_size(m);
    m->be->ops->copy_d2h(m->be, m->host_acts + (size_t)l * kb, kept_ptr(m, l), kb);
    m->slot_mark[l % FSO_ACT_RING] = act_mark(m->be);
    m->act_bytes += kb;
}

/* The reader of input k (the head for k = L, else layer k's backward) is
 * queued: input k-1 up ahead of its reader, when it left the ring. */
static void act_read(fso_model *m, int k)
{
    if (m->acts_tier != FSO_TIER_HOST)
        return;
    fso_backend *be = m->be;
    m->slot_mark[k % FSO_ACT_RING] = act_mark(be);
    const int j = k - 1;
    if (j < 0 || j >= m->n_host)
        return;
    const size_t kb = kept_size(m);
    const char *from = m->host_acts + (size_t)j * kb;
    const uint64_t after = m->slot_mark[j % FSO_ACT_RING];
    if (be->ops->copy_h2d_after)
        be->ops->copy_h2d_after(be, kept_ptr(m, j), from, kb, after);
    else
        be->ops->copy_h2d(be, kept_ptr(m, j), from, kb);
    m->act_bytes += kb;
}

/* Embedding, layers, final norm; leaves the head's parameters (and the
 * embedding's when tied) lent. pos (N) host, or NULL: no documents.
 * for_backward: a training step's forward, whose kept inputs the backward
 * reads (on the host tier they are copied down). */
static void forward_blocks(fso_model *m, const fso_block_source *src, const int32_t *inputs,
                           const int32_t *pos, bool for_backward)
{
    fso_backend *be = m->be;
    const int N = m->B * m->T, C = m->mc.hidden_size, L = m->mc.num_hidden_layers;
    be->ops->copy_h2d(be, m->tokens, inputs, sizeof(int32_t) * (size_t)N);
    m->docs = pos != NULL;
    if (pos)
        be->ops->copy_h2d(be, m->pos, pos, sizeof(int32_t) * (size_t)N);
    lend_params(m, src, 0);
    float *x = layer_out(m, 0);
    if (!stand_in(m, FSO_PART_EMBED_FWD)) {
        be->ops->embedding_fwd(be, x, m->tokens, P_(m, 0, FSO_T_EMBED), m->wt, N, C);
        keep(m, 0, x);
        if (for_backward)
            act_written(m, 0);
    }
    return_params(m, src, 0);
    for (int l = 0; l < L; l++) {
        lend_params(m, src, 1 + l);
        float *y = layer_out(m, l + 1);
        if (!stand_in(m, FSO_PART_LAYER_FWD)) {
            if (for_backward)
                act_before_write(m, l + 1);
            layer_forward(m, l, &m->acts[m->checkpointing ? 0 : l], x, y);
            keep(m, l + 1, y);
            if (for_backward)
                act_written(m, l + 1);
        }
        x = y;
        return_params(m, src, 1 + l);
    }
    lend_params(m, src, L + 1);
    if (m->mc.tie_word_embeddings)
        lend_params(m, src, 0);
    if (!m->standin_ms) /* the head's part */
        be->ops->rmsnorm_fwd(be, m->xf, m->rstdf, x, P_(m, L + 1, FSO_T_FINAL_NORM), m->wt, N,
                             C, (float)m->mc.rms_norm_eps);
}

static void release_head(fso_model *m, const fso_block_source *src)
{
    return_params(m, src, m->n_blocks - 1);
    if (m->mc.tie_word_embeddings)
        return_params(m, src, 0);
}

static const void *head_weight(const fso_model *m)
{
    return m->mc.tie_word_embeddings ? P_(m, 0, FSO_T_EMBED)
                                     : P_(m, m->n_blocks - 1, FSO_T_LM_HEAD);
}

/* The final norm's output from row r0 on. */
static const void *xf_rows(const fso_model *m, int r0)
{
    return (const char *)m->xf + fso_dtype_size(m->wt) * (size_t)r0 * m->mc.hidden_size;
}

static float *head_grad(const fso_model *m)
{
    return m->mc.tie_word_embeddings ? G_(m, 0, FSO_T_EMBED) : G_(m, m->n_blocks - 1, FSO_T_LM_HEAD);
}

float fso_model_loss_scale(int64_t counted, int64_t n, int micro)
{
    if (counted <= 0)
        return 0.0f;
    if (counted == n * micro) /* every target counts: the arithmetic of unmasked data */
        return 1.0f / (float)micro / (float)n;
    return 1.0f / (float)counted;
}

void fso_model_step(fso_model *m, const fso_block_source *src, const int32_t *inputs,
                    const int32_t *targets, const int32_t *pos, float loss_scale,
                    double *loss_sum)
{
    fso_backend *be = m->be;
    const fso_backend_ops *op = be->ops;
    const int N = m->B * m->T, C = m->mc.hidden_size, V = m->mc.vocab_size;
    const int L = m->mc.num_hidden_layers;

    forward_blocks(m, src, inputs, pos, true);
    op->copy_h2d(be, m->targets, targets, sizeof(int32_t) * (size_t)N);

    /* Head, chunked over rows: logits -> loss and dlogits in place -> dxf (in dh). */
    lend_grads(m, src, L + 1);
    if (m->mc.tie_word_embeddings)
        lend_grads(m, src, 0);
    const void *Wh = head_weight(m);
    float *dWh = head_grad(m);
    const float dscale = loss_scale;
    const fso_dtype wt = m->wt, f32 = FSO_DT_F32;
    if (stand_in(m, FSO_PART_HEAD))
        op->memset0(be, m->losses, sizeof(float) * (size_t)N);
    for (int r0 = 0; r0 < N && !m->standin_ms; r0 += m->chunk_rows) {
        int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        const void *xf = xf_rows(m, r0);
        op->matmul_fwd(be, m->logits, f32, xf, Wh, wt, rows, C, V);
        op->cross_entropy(be, m->logits, m->losses + r0, m->logits, m->targets + r0, rows, V,
                          dscale);
        op->matmul_bwd(be, m->dh + (size_t)r0 * C, f32, dWh, m->logits, f32, xf, Wh, wt, rows, C,
                       V, 0.0f);
    }
    if (!m->standin_ms) {
        op->memset0(be, m->dres, sizeof(float) * (size_t)N * C);
        op->rmsnorm_bwd(be, m->dres, G_(m, L + 1, FSO_T_FINAL_NORM), m->dh, layer_input(m, L),
                        P_(m, L + 1, FSO_T_FINAL_NORM), wt, m->rstdf, N, C);
        act_read(m, L);
    }
    return_grads(m, src, L + 1);
    release_head(m, src);

    for (int l = L - 1; l >= 0; l--) {
        fso_layer_acts *a = &m->acts[m->checkpointing ? 0 : l];
        lend_params(m, src, 1 + l);
        if (m->standin_ms) {
            lend_grads(m, src, 1 + l);
            stand_in(m, FSO_PART_LAYER_BWD);
        } else {
            const float *x = layer_input(m, l);
            if (m->checkpointing)
                layer_forward(m, l, a, x, NULL);
            lend_grads(m, src, 1 + l);
            layer_backward(m, l, a, x);
            act_read(m, l);
        }
        return_grads(m, src, 1 + l);
        return_params(m, src, 1 + l);
    }
    if (!m->grads[0])
        lend_grads(m, src, 0);
    if (!stand_in(m, FSO_PART_EMBED_BWD))
        op->embedding_bwd(be, G_(m, 0, FSO_T_EMBED), m->tokens, m->dres, N, C);
    return_grads(m, src, 0);

    op->sum(be, loss_sum, m->losses, (size_t)N); /* no wait: it arrives with the next sync */
}

void fso_model_eval(fso_model *m, const fso_block_source *src, const int32_t *inputs,
                    const int32_t *targets, const int32_t *pos, double *loss_sum)
{
    fso_backend *be = m->be;
    const fso_backend_ops *op = be->ops;
    const int N = m->B * m->T, C = m->mc.hidden_size, V = m->mc.vocab_size;
    forward_blocks(m, src, inputs, pos, false);
    op->copy_h2d(be, m->targets, targets, sizeof(int32_t) * (size_t)N);
    const void *Wh = head_weight(m);
    for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        op->matmul_fwd(be, m->logits, FSO_DT_F32, xf_rows(m, r0), Wh, m->wt, rows, C, V);
        op->cross_entropy(be, m->logits, m->losses + r0, m->logits, m->targets + r0, rows, V,
                          0.0f);
    }
    release_head(m, src);
    op->sum(be, loss_sum, m->losses, (size_t)N);
}

void fso_model_forward_logits(fso_model *m, const fso_block_source *src, const int32_t *inputs,
                              float *logits)
{
    fso_backend *be = m->be;
    const int N = m->B * m->T, C = m->mc.hidden_size, V = m->mc.vocab_size;
    forward_blocks(m, src, inputs, NULL, false);
    const void *Wh = head_weight(m);
    for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        be->ops->matmul_fwd(be, m->logits, FSO_DT_F32, xf_rows(m, r0), Wh, m->wt, rows, C, V);
        be->ops->copy_d2h(be, logits + (size_t)r0 * V, m->logits, sizeof(float) * (size_t)rows * V);
        fso_backend_fence(be); /* the next chunk's matmul writes what the copy reads */
    }
    release_head(m, src);
    be->ops->sync(be);
}

double fso_model_flops_per_token(const fso_model_config *mc, int T)
{
    const double C = mc->hidden_size, F = mc->intermediate_size, V = mc->vocab_size;
    const double qd = (double)mc->num_attention_heads * mc->head_dim;
    const double kvd = (double)mc->num_key_value_heads * mc->head_dim;
    double linear = mc->num_hidden_layers * (C * qd + 2 * C * kvd + qd * C + 3 * C * F) + C * V;
    double attn = mc->num_hidden_layers * 2.0 * qd * (T + 1) / 2.0; /* QK^T and PV, causal */
    return 2.0 * (linear + attn);
}
