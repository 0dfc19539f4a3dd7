"""Generate the masked-loss and packed-documents fixtures for fsoff's tests.

Run from the repo root:   /usr/bin/python3 tests/gen_masked_fixtures.py
Writes tests/fixtures/llama_tiny_masked.bin and tests/fixtures/llama_tiny_packed.bin
(format: tests/fixtures/README.md) and prints a summary.

A tiny Llama (tests/torch_llama.py) in float64 from float32-rounded weights:
one batch's loss, torch.nn.functional.cross_entropy with ignore_index=-100 (the
mean over the targets that count; fsoff writes -1 for the others), and the
gradients of that loss.

  masked: two rows of one document each, about a third of the targets masked.
  packed: documents packed into rows (positions restart at each document,
          attention block-diagonal causal, a document's first token no target),
          and the same documents apart, each at the start of a row of its own
          with the rest of the row masked. The generator checks that both give
          the same loss and gradients (float64, 1e-12) before writing them.
"""

import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama as tl  # noqa: E402

MAGIC = 0x46534F4D  # "FSOM"
VERSION = 1
SEED = 20261202
CFG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
           rms_norm_eps=1e-5, rope_theta=10000.0)
B, T = 2, 16
HERE = os.path.dirname(os.path.abspath(__file__))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def model():
    cfg = tl.LlamaCfg(**CFG)
    cfg.rms_norm_eps = f32(cfg.rms_norm_eps)
    cfg.rope_theta = f32(cfg.rope_theta)
    m = tl.LlamaForCausalLM(cfg, torch.float64)
    m.init_weights(generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():  # float32 values, as the file holds them
        for _, p in m.hf_tensors():
            p.copy_(p.to(torch.float32).to(torch.float64))
    return m


def loss_grads(m, inputs, targets, pos):
    """Loss (mean over targets >= 0) and its gradients, HF order, flat."""
    for _, p in m.hf_tensors():
        p.grad = None
    t = targets.clone()
    t[t < 0] = -100
    logits = m(inputs, pos=pos)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), ignore_index=-100)
    loss.backward()
    g = torch.cat([p.grad.reshape(-1) for _, p in m.hf_tensors()])
    return float(loss), g


def positions(starts):
    """(B, T) positions for rows whose documents start at starts[b] (and t = 0)."""
    pos = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for t in range(1, T):
            pos[b, t] = 0 if t in starts[b] else pos[b, t - 1] + 1
    return pos


def write(path, m, batches):
    params = torch.cat([p.detach().reshape(-1) for _, p in m.hf_tensors()])
    np_ = params.numel()
    hdr = [MAGIC, VERSION, CFG["vocab_size"], CFG["hidden_size"], CFG["intermediate_size"],
           CFG["num_hidden_layers"], CFG["num_attention_heads"], CFG["num_key_value_heads"],
           CFG["max_position_embeddings"], 0, B, T, len(batches), np_]
    hdr += [0] * (32 - len(hdr))
    hyper = [m.cfg.rms_norm_eps, m.cfg.rope_theta] + [0.0] * 6

    def f32b(t):
        return t.detach().to(torch.float32).contiguous().reshape(-1).numpy().astype("<f4").tobytes()

    def i32b(t):
        return t.to(torch.int32).contiguous().reshape(-1).numpy().astype("<i4").tobytes()

    with open(path, "wb") as f:
        f.write(struct.pack("<32i", *hdr))
        f.write(struct.pack("<8f", *hyper))
        f.write(f32b(params))
        for inputs, targets, pos, loss, grads in batches:
            micro = inputs.shape[0] // B
            f.write(struct.pack("<ii", micro, 0 if pos is None else 1))
            f.write(i32b(inputs))
            f.write(i32b(targets))
            f.write(i32b(torch.zeros_like(inputs) if pos is None else pos))
            f.write(struct.pack("<ff", loss, float(torch.linalg.vector_norm(grads))))
            f.write(f32b(grads))
    expect = 128 + 32 + 4 * np_ + sum(8 + 12 * b[0].numel() + 8 + 4 * np_ for b in batches)
    assert os.path.getsize(path) == expect, (path, os.path.getsize(path), expect)


def main():
    g = torch.Generator().manual_seed(SEED + 1)
    m = model()
    V = CFG["vocab_size"]

    # masked: one document a row, about a third of the targets masked (in runs)
    inputs = torch.randint(0, V, (B, T), generator=g)
    targets = torch.cat([inputs[:, 1:], torch.randint(0, V, (B, 1), generator=g)], dim=1)
    keep = torch.rand(B, T, generator=g) > 0.35
    keep[:, 3:6] = False
    targets = torch.where(keep, targets, torch.full_like(targets, -1))
    loss, grads = loss_grads(m, inputs, targets, None)
    write(os.path.join(HERE, "fixtures", "llama_tiny_masked.bin"), m,
          [(inputs, targets, None, loss, grads)])
    print(f"masked: loss {loss:.9g}, {int((targets >= 0).sum())} of {B * T} targets count")

    # packed: row 0 holds documents [0,6) [6,16); row 1 [0,9) [9,16)
    starts = [[6], [9]]
    docs = []
    for b in range(B):
        bounds = [0] + starts[b] + [T]
        for i in range(len(bounds) - 1):
            docs.append(torch.randint(0, V, (bounds[i + 1] - bounds[i] + 1,), generator=g))
    pin = torch.zeros(B, T, dtype=torch.int64)
    ptg = torch.zeros(B, T, dtype=torch.int64)
    k = 0
    for b in range(B):
        bounds = [0] + starts[b] + [T]
        for i in range(len(bounds) - 1):
            d, lo, hi = docs[k], bounds[i], bounds[i + 1]
            pin[b, lo:hi] = d[:hi - lo]
            # a target is the next token of the row; it does not count where
            # that token starts the next document (data.h)
            ptg[b, lo:hi - 1] = d[1:hi - lo]
            k += 1
        ptg[b, T - 1] = docs[k - 1][-1]  # the row's last target: the next token of its document
    for b in range(B):
        for s in starts[b]:
            ptg[b, s - 1] = -1
    ppos = positions(starts)
    ploss, pgrads = loss_grads(m, pin, ptg, ppos)

    # apart: each document at the start of a row of its own, the rest of
    # the row arbitrary tokens whose targets do not count: 2 * B rows, one
    # step of two micro-batches of B rows (the loss the mean over both)
    ain = torch.randint(0, V, (2 * B, T), generator=g)
    atg = torch.full((2 * B, T), -1, dtype=torch.int64)
    k = 0
    for b in range(B):
        bounds = [0] + starts[b] + [T]
        for i in range(len(bounds) - 1):
            d, n = docs[k], bounds[i + 1] - bounds[i]
            ain[k, :n] = d[:n]
            atg[k, :n - 1] = d[1:n]
            if i == len(bounds) - 2:  # the row's last document: its last target counts packed too
                atg[k, n - 1] = d[n]
            k += 1
    assert k == 2 * B
    aloss, agrads = loss_grads(m, ain, atg, None)
    assert abs(aloss - ploss) < 1e-12, (aloss, ploss)
    assert torch.allclose(agrads, pgrads, rtol=0, atol=1e-12), (agrads - pgrads).abs().max()
    assert int((ptg >= 0).sum()) == int((atg >= 0).sum())
    write(os.path.join(HERE, "fixtures", "llama_tiny_packed.bin"), m,
          [(pin, ptg, ppos, ploss, pgrads), (ain, atg, None, aloss, agrads)])
    print(f"packed: loss {ploss:.9g} (apart: {aloss:.9g}), "
          f"{int((ptg >= 0).sum())} of {B * T} targets count")


if __name__ == "__main__":
    main()
