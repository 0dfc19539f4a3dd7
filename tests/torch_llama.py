"""Reference Llama decoder in plain PyTorch (no transformers package).

Used by tests/gen_golden.py (float64, to produce golden fixtures) and by
bench/cpu_vs_torch.py (float32, as a speed baseline). Semantics follow the
Hugging Face LlamaConfig / LlamaForCausalLM conventions:

  * pre-norm blocks with RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w
  * rotary embeddings in the rotate-half layout, with rope_scaling of type
    "linear" or "llama3" as transformers' ROPE_INIT_FUNCTIONS compute them
  * head_dim from the config when given (q/k/v project to heads * head_dim)
  * grouped-query attention (query head h reads kv head h // (H / Hkv))
  * SwiGLU MLP: down(silu(gate(h)) * up(h))
  * optional tying of the LM head to the token embedding
  * optional positions (B, T) for documents packed in a row: RoPE at each
    token's position, attention block-diagonal causal (token t sees s <= t
    with s >= t - pos[t]); targets of -100 do not count (cross_entropy's
    ignore_index)
  * optional biases on the q, k and v projections (qkv_bias: Qwen2's
    Qwen2ForCausalLM, which is otherwise this model; no bias on o_proj)

Parameter names mirror the HF checkpoint names, and the modules are registered
so that named_parameters() already yields "HF order"; hf_tensors() spells that
order out explicitly anyway.

Needs PyTorch >= 1.13 (run with /usr/bin/python3 on the build hosts).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


@dataclass
class LlamaCfg:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    head_dim: int = None          # None: hidden_size // num_attention_heads
    rope_scaling: dict = None     # None, or {"rope_type": "linear"|"llama3", ...}
    qkv_bias: bool = False        # Qwen2: q_proj, k_proj, v_proj have biases

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @staticmethod
    def from_dict(d):
        keys = LlamaCfg.__dataclass_fields__.keys()
        return LlamaCfg(**{k: d[k] for k in keys if k in d})

    def n_params(self):
        V, C, Fi = self.vocab_size, self.hidden_size, self.intermediate_size
        H, Hkv, D = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        per_layer = 2 * C + C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * Fi
        if self.qkv_bias:
            per_layer += H * D + 2 * Hkv * D
        n = V * C + self.num_hidden_layers * per_layer + C
        if not self.tie_word_embeddings:
            n += V * C
        return n


def _weight(*shape, dtype):
    return nn.Parameter(torch.empty(*shape, dtype=dtype))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, dtype):
        super().__init__()
        self.weight = _weight(dim, dtype=dtype)
        self.eps = eps

    def forward(self, x):
        ms = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(ms + self.eps) * self.weight


class Linear(nn.Module):
    """Linear layer, weight shaped (out, in) as torch.nn.Linear; x W^T + b
    with a bias (out), else x W^T."""

    def __init__(self, n_in, n_out, dtype, bias=False):
        super().__init__()
        self.weight = _weight(n_out, n_in, dtype=dtype)
        self.bias = _weight(n_out, dtype=dtype) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def inv_freq(D, theta, scaling=None, device=None):
    """The D/2 rotary frequencies in float64, with transformers' rope_scaling:
    linear divides every frequency by the factor; llama3 (Llama 3.1) keeps the
    high frequencies, divides the low ones (wavelength above
    original_max_position_embeddings / low_freq_factor) by the factor and
    blends the ones in between."""
    i = torch.arange(0, D // 2, dtype=torch.float64, device=device)
    f = 1.0 / (theta ** (2.0 * i / D))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return f
    factor = scaling["factor"]
    if kind == "linear":
        return f / factor
    assert kind == "llama3", kind
    lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / lo, old_len / hi
    wavelen = 2 * math.pi / f
    f_llama = torch.where(wavelen > low_freq_wavelen, f / factor, f)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, f_llama)


def rope_tables(T, D, theta, dtype, device=None, scaling=None):
    """cos/sin tables of shape (T, D), duplicated over both halves."""
    # Compute angles in float64 and cast at the end so float32 runs see the
    # best-rounded table rather than float32-accumulated error.
    t = torch.arange(T, dtype=torch.float64, device=device)
    ang = torch.outer(t, inv_freq(D, theta, scaling, device))   # (T, D/2)
    emb = torch.cat([ang, ang], dim=-1)                 # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    # x: (B, heads, T, D); cos/sin: (T, D), or (B, 1, T, D) per token
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        C, H, Hkv, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        assert H % Hkv == 0
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = Linear(C, H * D, dtype, bias=cfg.qkv_bias)
        self.k_proj = Linear(C, Hkv * D, dtype, bias=cfg.qkv_bias)
        self.v_proj = Linear(C, Hkv * D, dtype, bias=cfg.qkv_bias)
        self.o_proj = Linear(H * D, C, dtype)

    def forward(self, h, cos, sin, keep=None):
        """keep: (B, 1, T, T) bool, which keys each query sees; None: causal."""
        B, T, _ = h.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        q = self.q_proj(h).view(B, T, H, D).transpose(1, 2)      # (B, H, T, D)
        k = self.k_proj(h).view(B, T, Hkv, D).transpose(1, 2)    # (B, Hkv, T, D)
        v = self.v_proj(h).view(B, T, Hkv, D).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = H // Hkv
        if rep > 1:  # query head h uses kv head h // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
        if keep is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1)
        else:
            mask = ~keep
        s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        att = torch.matmul(p, v)                                  # (B, H, T, D)
        att = att.transpose(1, 2).reshape(B, T, H * D)
        return self.o_proj(att)


class MLP(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        C, Fi = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(C, Fi, dtype)
        self.up_proj = Linear(C, Fi, dtype)
        self.down_proj = Linear(Fi, C, dtype)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Block(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        # registration order == HF order
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x, cos, sin, keep=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, keep)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _weight(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList([Block(cfg, dtype) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaCfg, dtype=torch.float32, checkpointing=False):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.checkpointing = checkpointing
        self.model = Decoder(cfg, dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype)
        self._rope = None

    # ---- parameters -----------------------------------------------------
    def head_weight(self):
        if self.cfg.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def hf_tensors(self):
        """[(hf_name, parameter)] in HF order (lm_head only when untied)."""
        m = self.model
        out = [("model.embed_tokens.weight", m.embed_tokens.weight)]
        for l, b in enumerate(m.layers):
            p = f"model.layers.{l}."
            out.append((p + "input_layernorm.weight", b.input_layernorm.weight))
            for proj in ("q_proj", "k_proj", "v_proj"):   # each bias after its weight
                lin = getattr(b.self_attn, proj)
                out.append((p + "self_attn." + proj + ".weight", lin.weight))
                if lin.bias is not None:
                    out.append((p + "self_attn." + proj + ".bias", lin.bias))
            out += [
                (p + "self_attn.o_proj.weight", b.self_attn.o_proj.weight),
                (p + "post_attention_layernorm.weight", b.post_attention_layernorm.weight),
                (p + "mlp.gate_proj.weight", b.mlp.gate_proj.weight),
                (p + "mlp.up_proj.weight", b.mlp.up_proj.weight),
                (p + "mlp.down_proj.weight", b.mlp.down_proj.weight),
            ]
        out.append(("model.norm.weight", m.norm.weight))
        if not self.cfg.tie_word_embeddings:
            out.append(("lm_head.weight", self.lm_head.weight))
        return out

    def param_groups(self, weight_decay):
        """AdamW groups: decay = 2-D linear weights (incl. an untied lm_head);
        no decay = RMSNorm weights, biases and the embedding (and so a tied
        head), as transformers' Trainer groups them."""
        decay, no_decay = [], []
        for name, p in self.hf_tensors():
            if name.endswith("layernorm.weight") or name == "model.norm.weight" \
                    or name == "model.embed_tokens.weight" or name.endswith(".bias"):
                no_decay.append(p)
            else:
                decay.append(p)
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    @torch.no_grad()
    def init_weights(self, std=0.08, norm_jitter=0.1, generator=None):
        """Linear weights, biases and embedding ~ N(0, std^2); norm weights
        1 + norm_jitter * N(0, 1). Drawn in float32 (deterministic across
        dtypes), then cast."""
        for name, p in self.hf_tensors():
            r = torch.randn(p.shape, dtype=torch.float32, generator=generator)
            if p.dim() == 1 and not name.endswith(".bias"):
                p.copy_((1.0 + norm_jitter * r).to(p.dtype))
            else:
                p.copy_((std * r).to(p.dtype))

    # ---- forward ---------------------------------------------------------
    def _rope_tables(self, T, device):
        key = (T, device)
        if self._rope is None or self._rope[0] != key:
            cos, sin = rope_tables(T, self.cfg.head_dim, self.cfg.rope_theta, self.dtype, device,
                                   self.cfg.rope_scaling)
            self._rope = (key, cos, sin)
        return self._rope[1], self._rope[2]

    def forward(self, idx, targets=None, pos=None):
        """idx (B, T) int64 -> logits (B, T, V) [, mean CE loss over the targets
        that are not -100]. pos (B, T) int64: each token's position in its
        document (documents packed in a row); None: 0..T-1, one document."""
        B, T = idx.shape
        cos, sin = self._rope_tables(T, idx.device)
        keep = None
        if pos is not None:
            cos, sin = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)   # (B, 1, T, D)
            t = torch.arange(T, device=idx.device)
            first = (t - pos).unsqueeze(-1)                           # (B, T, 1)
            keep = ((t <= t.unsqueeze(-1)) & (t >= first)).unsqueeze(1)
        x = F.embedding(idx, self.model.embed_tokens.weight)
        for blk in self.model.layers:
            if self.checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, cos, sin, keep, use_reentrant=False)
            else:
                x = blk(x, cos, sin, keep)
        xf = self.model.norm(x)
        logits = F.linear(xf, self.head_weight())
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss


# ---- optimisation helpers -----------------------------------------------------

def warmup_cosine_ratio(step, warmup_num_steps, total_num_steps, warmup_min_ratio, cos_min_ratio):
    """DeepSpeed WarmupCosineLR (linear warmup) ratio; step counts from 1."""
    i = step - 1
    W = warmup_num_steps
    if i < W:
        return warmup_min_ratio + (1.0 - warmup_min_ratio) * (i / W)
    c = (1.0 + math.cos(math.pi * (i - W + 1) / (total_num_steps - W))) / 2.0
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * c)


def global_grad_norm(params):
    """L2 norm over all gradients, computed as torch.nn.utils.clip_grad_norm_ does."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)


def train_step(model, opt, idx, targets, lr, max_norm, on_grads=None):
    """One step: forward, loss, backward, clip (clip_grad_norm_), set lr, AdamW.
    on_grads(model), if given, is called after backward and before clipping.
    Returns (loss, pre-clip grad norm, clipped?)."""
    opt.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()
    if on_grads is not None:
        on_grads(model)
    params = [p for _, p in model.hf_tensors()]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    clipped = (max_norm / (float(norm) + 1e-6)) < 1.0
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(loss), float(norm), clipped
