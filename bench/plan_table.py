#!/usr/bin/python3
"""The table of plans for real machines in docs/planning.md, from `fsoff plan --json`.

Each row is one `fsoff plan` command for a machine described on the command line
(--gpus, --gpu, --host-mem, the NVMe drives, the CPU AdamW rate); the figures not
given (host copies, 10 GB/s on the VM the table was made on) come from this
machine's cached probes, as `fsoff plan` says on its `plan: note:` line. The table
is printed as Markdown, one row per machine, the same columns as the page:

    /usr/bin/python3 bench/plan_table.py [--fsoff build/fsoff] [--json FILE]

--json also writes every row's plan object (what `fsoff plan --json` printed) with
its command, for comparing two builds row by row. Exit status 1 when a command
fails or a row does not fit.
"""
import argparse
import json
import os
import subprocess
import sys

GIB = 1 << 30

# model config, the machine in words, the command's flags
H200_BOX = ("1 × H200 141 GB, 1.5 TiB host, 4 NVMe (24 / 16 GB/s, 12 TiB), AdamW 8 Gelem/s",
            "--auto --gpus 1 --gpu h200 --host-mem 1536G --nvme-free 12T --nvme-read 24 "
            "--nvme-write 16 --adam-gelems 8")
ROWS = [
    ("llama-8b", "Llama-3 8B", *H200_BOX),
    ("llama-70b", "Llama-2 70B", *H200_BOX),
    ("llama-120b", "120B (Llama shape, configs/llama-120b.json)", *H200_BOX),
    ("llama-70b", "Llama-2 70B",
     "8 × H200 141 GB, 2 TiB host, 4 NVMe (24 / 16 GB/s, 12 TiB), AdamW 8 Gelem/s",
     "--auto --gpus 8 --gpu h200 --host-mem 2T --nvme-free 12T --nvme-read 24 "
     "--nvme-write 16 --adam-gelems 8"),
    ("llama-70b", "same, the config's own pins (all on NVMe, as DeepSpeed's `device: \"nvme\"`)",
     "same",
     "--gpus 8 --gpu h200 --host-mem 2T --nvme-free 12T --nvme-read 24 --nvme-write 16 "
     "--adam-gelems 8"),
    ("llama-70b", "Llama-2 70B", "8 × A100 80 GB, 1 TiB host, 4 NVMe, AdamW 6 Gelem/s",
     "--auto --gpus 8 --gpu a100 --host-mem 1T --nvme-free 12T --nvme-read 24 "
     "--nvme-write 16 --adam-gelems 6"),
    ("llama-13b", "Llama-2 13B",
     "1 × RTX 4090 24 GB, 128 GiB host, 1 NVMe (6.5 / 5 GB/s, 1.8 TiB), AdamW 3 Gelem/s",
     "--auto --gpus 1 --gpu 4090 --host-mem 128G --nvme-free 1843G --nvme-read 6.5 "
     "--nvme-write 5 --adam-gelems 3"),
    ("llama-13b", "Llama-2 13B", "1 × RTX 4090 24 GB, 256 GiB host, AdamW 3 Gelem/s",
     "--auto --gpus 1 --gpu 4090 --host-mem 256G --nvme-free 0 --adam-gelems 3"),
    ("llama-7b", "Llama-2 7B", "1 × RTX 4090 24 GB, 64 GiB host, 1 NVMe, AdamW 3 Gelem/s",
     "--auto --gpus 1 --gpu 4090 --host-mem 64G --nvme-free 1843G --nvme-read 6.5 "
     "--nvme-write 5 --adam-gelems 3"),
    ("llama-13b", "Llama-2 13B", "8 × RTX 4090, 256 GiB host, 2 NVMe, AdamW 4 Gelem/s",
     "--auto --gpus 8 --gpu 4090 --host-mem 256G --nvme-free 3686G --nvme-read 13 "
     "--nvme-write 10 --adam-gelems 4"),
    ("llama-7b", "Llama-2 7B", "8 × H100 80 GB, 1 TiB host",
     "--auto --gpus 8 --gpu h100 --host-mem 1T --nvme-free 0 --adam-gelems 8"),
    # several boxes: the machine given is one box; host and NVMe needs are per box
    ("llama-70b", "Llama-2 70B",
     "4 boxes × 8 H200, each 2 TiB host, 4 NVMe, AdamW 8 Gelem/s; 400 GB/s per box",
     "--auto --gpus 8 --gpu h200 --host-mem 2T --nvme-free 12T --nvme-read 24 "
     "--nvme-write 16 --adam-gelems 8 --boxes 4 --net-gbps 400"),
    ("llama-70b", "Llama-2 70B",
     "2 boxes × 1 H200, each 1.5 TiB host, 4 NVMe, AdamW 8 Gelem/s; 50 GB/s per box",
     "--auto --gpus 1 --gpu h200 --host-mem 1536G --nvme-free 12T --nvme-read 24 "
     "--nvme-write 16 --adam-gelems 8 --boxes 2 --net-gbps 50"),
    ("llama-70b", "Llama-2 70B", "the same 2 boxes on 12.5 GB/s (100 Gb/s Ethernet)",
     "--auto --gpus 1 --gpu h200 --host-mem 1536G --nvme-free 12T --nvme-read 24 "
     "--nvme-write 16 --adam-gelems 8 --boxes 2 --net-gbps 12.5"),
]

BOTTLENECK = {"nvme-read": "NVMe read", "nvme-write": "NVMe write", "h2d": "host to device",
              "d2h": "device to host", "collectives": "collectives", "compute": "compute",
              "optimizer": "CPU optimizer", "network": "network between boxes"}


def gib(n):
    """Bytes as the table writes them: '–' for none, else GiB (whole from 10 up)."""
    if n <= 0:
        return "–"
    g = n / GIB
    return f"{g:.0f} GiB" if g >= 10 else f"{g:.1f} GiB"


def seconds(ms):
    s = ms / 1000
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def plan(fsoff, src, config, flags):
    cmd = [fsoff, "plan", "--config", os.path.join(src, "configs", config + ".json"),
           *flags.split(), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 1) or not r.stdout.strip():
        sys.exit(f"plan_table: {' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return cmd, r.returncode, json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsoff", default="build/fsoff")
    ap.add_argument("--json", help="also write every row's plan object here")
    a = ap.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out, failed = [], False
    print("| model | machine (given) | device need, each (of what the margin leaves) | host need "
          "| NVMe need | placement | step | tok/s | MFU | bottleneck |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for config, model, machine, flags in ROWS:
        cmd, rc, j = plan(a.fsoff, src, config, flags)
        t = j["tiers"]
        dev = t["device"]
        fits = rc == 0 and j["fits"]
        failed |= not fits
        need = f"{gib(dev['bytes'])} of {gib(dev['capacity_bytes'])}"
        step = seconds(j["predicted_step_ms"]) if fits else "does not fit"
        tok = f"{j['tokens_per_s']:.0f}" if fits else "–"
        mfu = f"{100 * j['mfu']:.0f}%" if fits and j.get("mfu") else "–"
        print(f"| {model} | {machine} | {need} | {gib(t['host']['bytes'])} | "
              f"{gib(t['nvme']['bytes'])} | {j['placement_text']} | {step} | {tok} | {mfu} | "
              f"{BOTTLENECK.get(j['bottleneck'], j['bottleneck']) if fits else '–'} |")
        out.append({"command": cmd[1:], "plan": j})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
