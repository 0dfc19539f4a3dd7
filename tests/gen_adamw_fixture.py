"""Generate tests/fixtures/adamw_torch.bin: torch.optim.AdamW steps for test_adamw.

Run from the repo root:   /usr/bin/python3 tests/gen_adamw_fixture.py
(deterministic; needs Debian's python3-torch).

One flat fp32 tensor of N elements, N_STEPS steps of torch.optim.AdamW(foreach=True) in
float32, three runs from the same initial parameters and gradients:

  run 0  fp32 gradients, weight decay, no clipping
  run 1  fp32 gradients, weight decay, clipping: p.grad.mul_(coef) with coef < 1 each step
  run 2  bf16 gradients (the fp32 gradients rounded with .to(torch.bfloat16)), weight decay

The learning rate changes every step (a schedule). Every hyperparameter, learning rate and
clip factor is float32-representable, so fsoff (which rounds them to float) and torch (which
computes 1 - lr * wd and lr / (1 - beta1^t) in double) start from the same numbers.

Layout (little-endian, sections back to back, no padding):

  header      int32 x 16                 magic 0x46534F41 ("AOSF"), version 1, N, N_STEPS,
                                         N_RUNS, zeros
  hyper       float64 x N_RUNS*(8+2*S)   per run: beta1, beta2, eps, weight_decay,
                                         grad_is_bf16, 0, 0, 0, lr[S], coef[S]
  params0     float32 x N
  grads       float32 x S*N              step s at s*N
  grads_bf16  uint16  x S*N              the same gradients rounded to bf16 (runs with
                                         grad_is_bf16 use these)
  results     float32 x N_RUNS*3*N       per run: params, exp_avg, exp_avg_sq after S steps
"""

import os
import struct

import numpy as np
import torch

MAGIC = 0x46534F41
VERSION = 1
SEED = 20240917
N = 3001          # odd, so SIMD tails are exercised
N_STEPS = 5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "adamw_torch.bin")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


LRS = [f32(1e-3 * (1.0 - 0.15 * s)) for s in range(N_STEPS)]
RUNS = [
    dict(beta1=f32(0.9), beta2=f32(0.999), eps=f32(1e-8), wd=f32(0.1), bf16=0,
         coef=[1.0] * N_STEPS),
    dict(beta1=f32(0.9), beta2=f32(0.95), eps=f32(1e-8), wd=f32(0.1), bf16=0,
         coef=[f32(c) for c in (0.37, 0.5, 0.81, 0.123, 0.999)]),
    dict(beta1=f32(0.8), beta2=f32(0.99), eps=f32(1e-6), wd=f32(0.05), bf16=1,
         coef=[1.0] * N_STEPS),
]


def make_data():
    g = torch.Generator().manual_seed(SEED)
    params0 = torch.randn(N, generator=g, dtype=torch.float32) * 0.05
    # Per-element gradient scales spread over five decades, some exact zeros.
    scale = torch.pow(10.0, torch.empty(N).uniform_(-4.0, 1.0, generator=g)).float()
    grads = torch.randn(N_STEPS, N, generator=g, dtype=torch.float32) * scale
    grads[:, ::97] = 0.0
    grads[2, 5::89] = 0.0      # zero only on one step
    return params0, grads


def run_torch(params0, grads, run):
    p = torch.nn.Parameter(params0.clone())
    opt = torch.optim.AdamW([p], lr=LRS[0], betas=(run["beta1"], run["beta2"]), eps=run["eps"],
                            weight_decay=run["wd"], foreach=True)
    for s in range(N_STEPS):
        g = grads[s].clone()
        if run["bf16"]:
            g = g.to(torch.bfloat16).to(torch.float32)
        if run["coef"][s] != 1.0:
            g.mul_(run["coef"][s])
        p.grad = g
        for group in opt.param_groups:
            group["lr"] = LRS[s]
        opt.step()
    st = opt.state[p]
    return p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()


def main():
    torch.set_num_threads(1)
    params0, grads = make_data()
    grads_bf16 = grads.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    header = [MAGIC, VERSION, N, N_STEPS, len(RUNS)] + [0] * 11
    hyper = []
    for r in RUNS:
        hyper += [r["beta1"], r["beta2"], r["eps"], r["wd"], float(r["bf16"]), 0.0, 0.0, 0.0]
        hyper += LRS + list(r["coef"])
    parts = [struct.pack("<16i", *header), struct.pack("<%dd" % len(hyper), *hyper),
             params0.numpy().astype("<f4").tobytes(), grads.numpy().astype("<f4").tobytes(),
             grads_bf16.astype("<u2").tobytes()]
    for i, r in enumerate(RUNS):
        p, m, v = run_torch(params0, grads, r)
        for t in (p, m, v):
            parts.append(t.numpy().astype("<f4").tobytes())
        moved = (p - params0).abs().max().item()
        print(f"run {i}: bf16 grads {r['bf16']}, coef {r['coef']}, max |p - p0| {moved:.3g}")
    blob = b"".join(parts)
    with open(OUT, "wb") as f:
        f.write(blob)
    print(f"wrote {OUT}: {len(blob)} bytes, N={N}, {N_STEPS} steps, {len(RUNS)} runs")


if __name__ == "__main__":
    main()
