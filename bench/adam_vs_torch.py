"""Benchmark: fsoff's fused CPU AdamW against torch.optim.AdamW on the same elements and threads.

Run from the repo root with Debian's python3-torch:

    /usr/bin/python3 bench/adam_vs_torch.py [--elems 32M] [--threads 1,2] [--tensors 4]
        [--reps 5] [--isa auto] [--json FILE]

For each thread count, torch.optim.AdamW(foreach=True) steps fp32 parameters (the elements
split over --tensors equal tensors, fp32 gradients, weight decay) under
torch.set_num_threads(T); the first step is a warm-up and the best of --reps steps is kept.
Then `$FSOFF bench adam --json - --grad fp32 --elems N --threads LIST` (FSOFF defaults to
build/fsoff) times fsoff's fused pass, which also writes the bf16 copy of the parameters that
torch does not, with the same best-of rule. Printed: elements/s of both, the ratio
fsoff/torch, and fsoff's fraction of the STREAM triad bandwidth it measured in the same run.
This is a benchmark, not a test; the machine's noise applies to both sides alike.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_count(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1].lower(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def bench_torch(elems, threads, tensors, reps):
    torch.set_num_threads(threads)
    sizes = [elems // tensors] * tensors
    sizes[-1] += elems - sum(sizes)
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, generator=g) * 0.05) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 0.01
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    opt.step()  # warm-up: allocates the state
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    del opt, params
    return elems / best


def bench_fsoff(fsoff, elems, threads, reps, isa):
    cmd = [fsoff, "bench", "adam", "--json", "-", "--grad", "fp32", "--elems", str(elems),
           "--threads", ",".join(str(t) for t in threads), "--reps", str(reps), "--isa", isa]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode != 0 and not out.stdout.strip():
        sys.exit(f"adam_vs_torch: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    res = json.loads(out.stdout)
    if not res.get("ok", False):
        sys.exit(f"adam_vs_torch: fsoff bench adam reported FAILED:\n{out.stdout}{out.stderr}")
    return cmd, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elems", default="32M", help="elements (suffix k, M, G; default 32M)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tensors", type=int, default=4, help="torch tensors the elements span")
    ap.add_argument("--reps", type=int, default=5, help="timed steps; the best is kept")
    ap.add_argument("--isa", default="auto", help="fsoff kernel: auto, scalar, avx2, avx512")
    ap.add_argument("--json", metavar="FILE",
                    help='also write the results as one JSON object ("-": to stdout instead of the table)')
    args = ap.parse_args()
    elems = parse_count(args.elems)
    threads = [int(t) for t in args.threads.split(",")]
    fsoff = os.environ.get("FSOFF", os.path.join(ROOT, "build", "fsoff"))
    if not os.path.exists(fsoff):
        sys.exit(f"adam_vs_torch: {fsoff} not found; build it (ninja -C build) or set FSOFF")

    torch_eps = {t: bench_torch(elems, t, args.tensors, args.reps) for t in threads}
    cmd, fs = bench_fsoff(fsoff, elems, threads, args.reps, args.isa)
    rows = []
    for r in fs["results"]:
        t = r["threads"]
        rows.append(dict(threads=t, elems=elems, torch_elems_per_s=torch_eps[t],
                         fsoff_elems_per_s=r["elems_per_s"],
                         ratio=r["elems_per_s"] / torch_eps[t], fsoff_gbps=r["gbps"],
                         stream_gbps=r["stream_gbps"], fraction=r["fraction"],
                         of_touch=r.get("of_touch")))
    rec = dict(bench="adam_vs_torch", torch=torch.__version__, kernel=fs["kernel"], command=cmd,
               results=rows)
    if args.json == "-":
        print(json.dumps(rec))
        return
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)
    print(f"# adam_vs_torch: {elems} elements, fp32 gradients, weight decay; best of {args.reps}")
    print(f"# torch {torch.__version__}: AdamW(foreach=True) over {args.tensors} tensors, "
          f"torch.set_num_threads(T)")
    print(f"# fsoff: {' '.join(cmd)}  (kernel {fs['kernel']}, also writes the bf16 params; "
          f"{fs['bytes_per_elem']} B/elem)")
    print("# fraction: fsoff GB/s over the STREAM triad GB/s of the same run; of_touch: over a "
          "kernel with the same reads and writes and no arithmetic")
    print("#")
    hdr = ("threads", "torch", "fsoff", "ratio", "fsoff", "stream", "fraction", "of_touch")
    units = ("", "Melem/s", "Melem/s", "x", "GB/s", "GB/s", "", "")
    fmt = "# %7s %10s %10s %7s %8s %8s %8s %8s"
    print(fmt % hdr)
    print(fmt % units)
    for r in rows:
        print("  %7d %10.1f %10.1f %7.2f %8.2f %8.2f %8.3f %8.3f" % (
            r["threads"], r["torch_elems_per_s"] / 1e6, r["fsoff_elems_per_s"] / 1e6, r["ratio"],
            r["fsoff_gbps"], r["stream_gbps"], r["fraction"], r["of_touch"] or 0.0))
    print("# min ratio fsoff/torch: %.2f (target >= 5); min fraction of STREAM: %.3f (target >= "
          "0.85)" % (min(r["ratio"] for r in rows), min(r["fraction"] for r in rows)))


if __name__ == "__main__":
    main()
