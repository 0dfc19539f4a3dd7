"""Generate the Hugging Face folder fixtures for fsoff's --init-from tests.

Run from the repo root:   /usr/bin/python3 tests/gen_hf_fixtures.py

Each case is a small Llama (or Qwen2: Llama with q/k/v biases) written as
transformers saves one (config.json and safetensors, written here with the
format's rules, not with fsoff's code) under
tests/fixtures/hf/<case>/, and what PyTorch computes from it in
tests/fixtures/hf/<case>.expected.safetensors (format: tests/fixtures/README.md):
the weights as float32, the rotary tables, one batch, the loss and gradients at
those weights, and the weights after one AdamW step.

The model is tests/torch_llama.py (transformers' LlamaForCausalLM semantics:
rotate-half RoPE with rope_scaling, repeat-kv GQA, head_dim from the config) in
float64, starting from weights that are exactly representable in the stored
dtype, so float64 runs on exactly the values in the files.
"""

import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama as tl  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
B, T = 2, 16
# One AdamW step, constant lr, no clipping; weight decay on linear weights only.
HYPER = dict(lr=2e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

CASES = {
    # head_dim 16 with hidden 32 and 4 heads (q/k/v project to 64), GQA 4/2,
    # BF16 in one file, and a rotary inv_freq buffer transformers skips.
    "gqa_head_dim_bf16": dict(
        dtype="BF16", shards=1, inv_freq_buffer=True,
        config=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                    tie_word_embeddings=False, rope_scaling=None)),
    # Llama 3.1's rope_scaling: with head_dim 8 and original_max_position_embeddings
    # 64 the four frequencies fall in all three of llama3's bands. Tied, multi-query,
    # F16 in two shards with an index.
    "llama3_tied_f16": dict(
        dtype="F16", shards=2, inv_freq_buffer=False,
        config=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0,
                                      original_max_position_embeddings=64))),
    # Qwen2 (Qwen2ForCausalLM): q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6, tied
    # as Qwen2.5's small sizes are, BF16; use_sliding_window false, so its
    # sliding_window (shorter than the sequence here) is ignored as transformers does.
    "qwen2_tied_bf16": dict(
        dtype="BF16", shards=1, inv_freq_buffer=False, model_type="qwen2",
        config=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                    rope_scaling=None, use_sliding_window=False, sliding_window=8,
                    max_window_layers=1)),
    # Linear scaling as older configs spell it ("type"), F32.
    "linear_f32": dict(
        dtype="F32", shards=1, inv_freq_buffer=False,
        config=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False,
                    rope_scaling=dict(type="linear", factor=4.0))),
}

TORCH_DTYPE = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
CONFIG_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def tensor_bytes(t):
    """Little-endian bytes of a CPU tensor (16-bit floats through their int16 bits)."""
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    fmt = {torch.int16: "h", torch.float32: "f"}[t.dtype]
    vals = t.reshape(-1).tolist()
    return struct.pack("<%d%s" % (len(vals), fmt), *vals)


def write_safetensors(path, tensors):
    """tensors: [(name, tensor, dtype name)] in file order. Header as the format
    defines it: {"__metadata__": {"format": "pt"}, name: {dtype, shape,
    data_offsets}}, offsets back to back, padded with spaces to 8 bytes."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, at = [], 0
    for name, t, dt in tensors:
        b = tensor_bytes(t)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def build(name, case):
    cfg = tl.LlamaCfg.from_dict(case["config"])
    cfg.qkv_bias = case.get("model_type") == "qwen2"
    seed = sum(map(ord, name))
    g = torch.Generator().manual_seed(seed)
    model = tl.LlamaForCausalLM(cfg, dtype=torch.float64)
    model.init_weights(std=0.08, norm_jitter=0.1, generator=g)
    sd = TORCH_DTYPE[case["dtype"]]
    with torch.no_grad():  # the stored dtype's values, exactly, in float64
        for _, p in model.hf_tensors():
            p.copy_(p.to(sd).to(torch.float64))
    tok = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=tok)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=tok)
    return cfg, model, inputs, targets


def write_case(name, case):
    cfg, model, inputs, targets = build(name, case)
    folder = os.path.join(ROOT, name)
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.unlink(os.path.join(folder, f))

    if case.get("model_type") == "qwen2":  # Qwen2Config's keys
        conf = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                    attention_dropout=0.0, initializer_range=0.02, bos_token_id=60,
                    eos_token_id=61)
    else:
        conf = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                    attention_bias=False, mlp_bias=False, attention_dropout=0.0,
                    initializer_range=0.02, pretraining_tp=1, bos_token_id=1, eos_token_id=2)
    conf.update(torch_dtype=CONFIG_DTYPE[case["dtype"]], transformers_version="4.44.0",
                use_cache=True)
    conf.update(case["config"])
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")

    sd = TORCH_DTYPE[case["dtype"]]
    weights = [(n, p.detach().to(sd), case["dtype"]) for n, p in model.hf_tensors()]
    if case["inv_freq_buffer"]:
        invf = tl.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(torch.float32)
        weights.insert(1, ("model.layers.0.self_attn.rotary_emb.inv_freq", invf, "F32"))
    if case["shards"] == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), weights)
    else:
        n = case["shards"]
        per = (len(weights) + n - 1) // n
        weight_map, total = {}, 0
        for s in range(n):
            part = weights[s * per:(s + 1) * per]
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, n)
            write_safetensors(os.path.join(folder, fname), part)
            for wn, t, _ in part:
                weight_map[wn] = fname
                total += t.numel() * t.element_size()
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")

    params0 = {n: p.detach().clone() for n, p in model.hf_tensors()}
    opt = torch.optim.AdamW(model.param_groups(HYPER["weight_decay"]), lr=HYPER["lr"],
                            betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"],
                            foreach=False)
    opt.zero_grad(set_to_none=True)
    _, loss = model(inputs, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.hf_tensors()}
    opt.step()
    cos, sin = tl.rope_tables(T, cfg.head_dim, cfg.rope_theta, torch.float64,
                              scaling=cfg.rope_scaling)
    half = cfg.head_dim // 2

    f32 = torch.float32
    expected = [("hyper", torch.tensor([HYPER["lr"], HYPER["beta1"], HYPER["beta2"], HYPER["eps"],
                                        HYPER["weight_decay"], B, T], dtype=f32), "F32"),
                ("inputs", inputs.to(f32), "F32"),      # token ids, exact in float32
                ("targets", targets.to(f32), "F32"),
                ("loss", torch.tensor([loss.item()], dtype=f32), "F32"),
                ("rope.cos", cos[:, :half].to(f32), "F32"),
                ("rope.sin", sin[:, :half].to(f32), "F32")]
    for n, p in model.hf_tensors():
        expected.append(("param0." + n, params0[n].to(f32), "F32"))
        expected.append(("grad." + n, grads[n].to(f32), "F32"))
        expected.append(("param1." + n, p.detach().to(f32), "F32"))
    write_safetensors(os.path.join(ROOT, name + ".expected.safetensors"), expected)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print("%-20s loss %.6f  folder %d bytes  expected %d bytes" %
          (name, loss.item(), size, os.path.getsize(os.path.join(ROOT, name +
                                                                 ".expected.safetensors"))))


def main():
    torch.set_num_threads(1)
    os.makedirs(ROOT, exist_ok=True)
    for name, case in CASES.items():
        write_case(name, case)


if __name__ == "__main__":
    main()
