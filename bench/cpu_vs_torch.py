"""Benchmark: fsoff's CPU backend against PyTorch on the same model and threads.

Run from the repo root with Debian's python3-torch:

    /usr/bin/python3 bench/cpu_vs_torch.py [--fsoff build/fsoff] [--config configs/tiny.json]
        [--steps 30] [--threads N] [--checkpointing 0|1] [--json FILE] [--torch-only]

Both sides train `steps` steps on random tokens of shape (B, T) taken from the config
(train_micro_batch_size_per_gpu, data.seq_len, gradient_accumulation_steps); the first
3 steps are warm-up and left out of the mean step time. This is a benchmark, not a test.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import torch_llama as tl  # noqa: E402

WARMUP_STEPS = 3
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "tiny.json")


def merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(path):
    with open(DEFAULT_CONFIG) as f:
        base = json.load(f)
    with open(path) as f:
        cfg = json.load(f)
    return merge(base, cfg)


def fmt_params(n):
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.2f}M"


def bench_torch(cfg, steps, threads, checkpointing, seed=0):
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    mc = tl.LlamaCfg.from_dict(cfg["model"])
    B = int(cfg["train_micro_batch_size_per_gpu"])
    T = int(cfg["data"]["seq_len"])
    ga = int(cfg.get("gradient_accumulation_steps", 1) or 1)
    clip = float(cfg.get("gradient_clipping", 0.0) or 0.0)
    op = cfg.get("optimizer", {}).get("params", {})
    sp = cfg.get("scheduler", {}).get("params", {})
    lr_max = float(op.get("lr", 1e-3))
    wd = float(op.get("weight_decay", 0.0))
    warm = int(sp.get("warmup_num_steps", 0))
    wmin = float(sp.get("warmup_min_ratio", 0.0))
    cmin = float(sp.get("cos_min_ratio", 0.0))

    model = tl.LlamaForCausalLM(mc, dtype=torch.float32, checkpointing=checkpointing)
    model.init_weights(std=float(cfg["model"].get("initializer_range", 0.02)), norm_jitter=0.0)
    opt = torch.optim.AdamW(model.param_groups(wd), lr=lr_max,
                            betas=tuple(op.get("betas", (0.9, 0.999))),
                            eps=float(op.get("eps", 1e-8)), foreach=True)
    params = [p for _, p in model.hf_tensors()]
    data = torch.randint(0, mc.vocab_size, (steps, ga, B, T + 1))

    times = []
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(ga):
            chunk = data[s - 1, m]
            _, loss = model(chunk[:, :-1], chunk[:, 1:])
            (loss / ga).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        total = max(steps, warm + 1)
        lr = lr_max * tl.warmup_cosine_ratio(s, warm, total, wmin, cmin)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        times.append(time.perf_counter() - t0)
    mean_s = sum(times[WARMUP_STEPS:]) / len(times[WARMUP_STEPS:])
    return B * T * ga / mean_s


def bench_fsoff(exe, config, cfg, steps, threads, checkpointing):
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise SystemExit(f"error: fsoff binary not found or not executable: {exe} "
                         f"(build it first, or pass --fsoff PATH, or use --torch-only)")
    B = int(cfg["train_micro_batch_size_per_gpu"])
    T = int(cfg["data"]["seq_len"])
    ga = int(cfg.get("gradient_accumulation_steps", 1) or 1)
    with tempfile.TemporaryDirectory(prefix="fsoff_bench_") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [exe, "--config", config, "--steps", str(steps), "--metrics", metrics,
               "--set", f"train.threads={threads}",
               "--set", f"train.activation_checkpointing={'true' if checkpointing else 'false'}"]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr.decode(errors="replace"))
            raise SystemExit(f"error: fsoff exited with status {proc.returncode}: {' '.join(cmd)}")
        if not os.path.exists(metrics):
            raise SystemExit(f"error: fsoff wrote no metrics file ({metrics})")
        rows = []
        with open(metrics) as f:
            for ln, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"error: bad JSON on line {ln} of fsoff metrics: {e}")
                if "event" not in obj and "step" in obj:
                    rows.append(obj)
    rows.sort(key=lambda r: r["step"])
    timed = rows[WARMUP_STEPS:]
    if not timed:
        raise SystemExit(f"error: fsoff reported {len(rows)} step lines; need more than "
                         f"{WARMUP_STEPS}")
    mean_ms = sum(float(r["step_ms"]) for r in timed) / len(timed)
    return B * T * ga / (mean_ms / 1000.0)


def main():
    ap = argparse.ArgumentParser(description="fsoff CPU backend vs PyTorch throughput")
    ap.add_argument("--fsoff", default=os.path.join("build", "fsoff"))
    ap.add_argument("--config", default=os.path.join("configs", "tiny.json"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--checkpointing", type=int, choices=(0, 1), default=0)
    ap.add_argument("--json", metavar="FILE",
                    help='also write the results as one JSON object ("-": to stdout instead of the table)')
    ap.add_argument("--torch-only", action="store_true", help="skip running fsoff")
    a = ap.parse_args()
    if a.steps <= WARMUP_STEPS:
        ap.error(f"--steps must be greater than {WARMUP_STEPS} (warm-up steps are not timed)")
    if a.threads < 1:
        ap.error("--threads must be >= 1")

    cfg = load_config(a.config)
    mc = tl.LlamaCfg.from_dict(cfg["model"])
    B = int(cfg["train_micro_batch_size_per_gpu"])
    T = int(cfg["data"]["seq_len"])

    fsoff_tok_s = None
    if not a.torch_only:
        fsoff_tok_s = bench_fsoff(a.fsoff, a.config, cfg, a.steps, a.threads, a.checkpointing)
    torch_tok_s = bench_torch(cfg, a.steps, a.threads, bool(a.checkpointing))
    ratio = fsoff_tok_s / torch_tok_s if fsoff_tok_s is not None else None

    rec = {"bench": "cpu_vs_torch", "fsoff_tok_s": fsoff_tok_s, "torch_tok_s": torch_tok_s,
           "ratio": ratio, "threads": a.threads}
    if a.json == "-":
        print(json.dumps(rec))
        return
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    name = os.path.splitext(os.path.basename(a.config))[0]
    fs = f"{fsoff_tok_s:13.1f}" if fsoff_tok_s is not None else f"{'-':>13}"
    rs = f"{ratio:7.2f}" if ratio is not None else f"{'-':>7}"
    print("# fsoff CPU backend vs PyTorch (same model, same threads)")
    print("#  model      params    B    T  threads   fsoff tok/s   torch tok/s   ratio")
    print(f"  {name:<8} {fmt_params(mc.n_params()):>7} {B:>5} {T:>4} {a.threads:>8} "
          f"{fs} {torch_tok_s:13.1f} {rs}")
    print(f"ratio fsoff/torch: {ratio:.2f}" if ratio is not None else "ratio fsoff/torch: -")


if __name__ == "__main__":
    main()
