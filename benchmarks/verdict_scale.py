"""What the verdict costs at the size people train: GPT-2 shapes of 2, 6 and 12 layers and GPT-2 medium
(ortlab.demo.sizes), PyTorch and ORTModule (or torch.compile where ORTModule does not run), parity, 3 steps, AdamW.

For each model two child processes run the same bursts from one snapshot, side by side: one the bursts alone
(Session.burst per backend), one the comparison with its verdict (`ortlab burst --backend both --parity`, the
default float64 mode). Each child's process tree (the worker included) has its private memory sampled every 0.1 s
(RssAnon + RssShmem of every process: tensors and heaps; not the shared libraries' file pages, which a memory cgroup
would charge to whichever run touched them first). Per model: the bursts' peak, the comparison's peak, what the
verdict adds and that in bytes per parameter, the evidence on disk per run (every file the comparison wrote,
evidence bursts included, over the runs it made), the wall time of each, and the verdict. Then the slope of what the
verdict adds over the parameters (a least-squares line through the models). Targets: the verdict adds at most 8
bytes a parameter over the bursts' own peak, as the slope (what a fixed part costs, the float64 copy of a
vocabulary's embedding while its block is judged, is the intercept: per model it is printed, and weighs most on the
smallest); the evidence on disk under 64 MB a run; every model judged (agree or diverged, not "not judged").

    source bin/_env.sh && python benchmarks/verdict_scale.py [--models 2,6,12,medium] [--steps 3] [--device cpu]
        [--backend ortmodule|compile] [--float64 auto|burst|first-step]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _device

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"2": ("n_layer=2",), "6": ("n_layer=6",), "12": ("n_layer=12",),
          "medium": ("n_layer=24", "n_embd=1024", "n_head=16")}
TARGET_BYTES_PER_PARAMETER = 8.0
TARGET_DISK = 64 * 2**20

BURSTS_ONLY = """
import json, sys
from ortlab.engine.session import Session
args = json.loads(sys.argv[1])
with Session("ortlab.demo.sizes:gpt2", args["kwargs"], out=args["out"]) as s:
    for backend in ("pytorch", args["backend"]):
        run = s.burst(backend, args["steps"], parity=True, progress=False, device=args["device"])
        assert run.ok, run.error
"""


def private_memory(pid: int) -> int:
    """The private memory of a process and its descendants (bytes): each one's anonymous and shared-memory resident
    pages (RssAnon + RssShmem: tensors, the heap), not the shared libraries' file pages, which every process of
    a tree maps once and the kernel can drop."""
    total, seen, todo = 0, set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
            for t in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def measured(command: list[str], env: dict) -> tuple[int, float, subprocess.CompletedProcess]:
    """Run `command`; (the peak of its process tree's private memory, sampled every 0.1 s; its wall seconds; the
    process)."""
    started = time.perf_counter()
    popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    peak = [0]

    def sample() -> None:
        while popen.poll() is None:
            peak[0] = max(peak[0], private_memory(popen.pid))
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = popen.communicate()
    watcher.join()
    return peak[0], time.perf_counter() - started, subprocess.CompletedProcess(command, popen.returncode, out, err)


def disk(folder: Path) -> tuple[int, int]:
    """(bytes of every file under `folder`, run folders in it)."""
    total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    runs = sum(1 for d in folder.iterdir() if d.is_dir() and (d / "meta.json").is_file())
    return total, runs


def parameters(kwargs: dict) -> int:
    from ortlab.demo.sizes import gpt2

    return sum(p.numel() for p in gpt2(**kwargs).model.parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="2,6,12,medium", help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", default=None, help="the candidate: ortmodule (default where it runs) or compile")
    parser.add_argument("--float64", default="auto", choices=("auto", "burst", "first-step"))
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser)
    backend = args.backend or ("compile" if _device.ortmodule_missing() else "ortmodule")
    where = _device.describe(device)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    print(f"PyTorch and {backend}, parity, {args.steps} steps, AdamW, float64 {args.float64}, on {where}", flush=True)
    header = (f"{'model':<8} {'params':>7} {'bursts peak':>12} {'with verdict':>13} {'verdict adds':>13} "
              f"{'B/param':>8} {'disk/run':>9} {'bursts s':>9} {'verdict s':>10}  verdict")
    print(header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            kwargs = dict(a.split("=") for a in SHAPES[name])
            kwargs = {k: int(v) for k, v in kwargs.items()}
            count = parameters(kwargs)
            alone_out, judged_out = Path(tmp) / f"{name}-bursts", Path(tmp) / f"{name}-verdict"
            spec = {"kwargs": kwargs, "out": str(alone_out), "backend": backend, "steps": args.steps,
                    "device": device.type}
            alone = measured([sys.executable, "-c", BURSTS_ONLY, json.dumps(spec)], env)
            if alone[2].returncode != 0:
                print(f"{name}: the bursts failed: {alone[2].stderr[-2000:]}", flush=True)
                return 1
            command = [sys.executable, "-m", "ortlab.cli", "burst", "--model", "ortlab.demo.sizes:gpt2",
                       *[x for kv in SHAPES[name] for x in ("--model-arg", kv)], "--backend", f"pytorch,{backend}",
                       "--parity", "--steps", str(args.steps), "--device", device.type, "--float64", args.float64,
                       "--no-memory", "--out", str(judged_out), "--json"]
            judged = measured(command, env)
            verdict = _verdict(judged_out)
            size, runs = disk(judged_out)
            row = {"model": name, "parameters": count, "bursts_peak": alone[0], "verdict_peak": judged[0],
                   "adds": judged[0] - alone[0], "bytes_per_parameter": (judged[0] - alone[0]) / count,
                   "disk_per_run": size / max(runs, 1), "runs": runs, "bursts_s": round(alone[1], 1),
                   "verdict_s": round(judged[1], 1), "verdict": verdict.get("status", "none"),
                   "headline": verdict.get("headline"), "exit": judged[2].returncode,
                   "notes": verdict.get("notes", [])}
            rows.append(row)
            print(f"{name:<8} {count / 1e6:>6.0f}M {alone[0] / 1e9:>10.2f}GB {judged[0] / 1e9:>11.2f}GB "
                  f"{row['adds'] / 1e9:>11.2f}GB {row['bytes_per_parameter']:>8.1f} "
                  f"{row['disk_per_run'] / 2**20:>7.1f}MB "
                  f"{alone[1]:>9.0f} {judged[1]:>10.0f}  {row['verdict']}", flush=True)
            if row["verdict"] not in ("agree", "diverged"):
                print(f"  {row['headline']}\n  {judged[2].stderr[-1500:]}", flush=True)
    slope = _slope([r["parameters"] for r in rows], [r["adds"] for r in rows])
    worst = max(r["bytes_per_parameter"] for r in rows)
    disk_worst = max(r["disk_per_run"] for r in rows)
    print(f"slope of what the verdict adds: {slope:.1f} bytes a parameter (least squares over {len(rows)} models); "
          f"worst model {worst:.1f}; peaks: the process tree's private memory (RssAnon + RssShmem), sampled every "
          "0.1 s")
    misses = []
    if slope > TARGET_BYTES_PER_PARAMETER:
        misses.append(f"the verdict adds {slope:.1f} > {TARGET_BYTES_PER_PARAMETER:g} bytes a parameter (slope)")
    if disk_worst > TARGET_DISK:
        misses.append(f"evidence on disk {disk_worst / 2**20:.0f} MB a run > 64 MB")
    if any(r["verdict"] not in ("agree", "diverged") for r in rows):
        misses.append("a model was not judged")
    print("meets the targets" if not misses else "misses the target: " + "; ".join(misses))
    if os.environ.get("ORTLAB_BENCHMARK_RESULT"):
        Path(os.environ["ORTLAB_BENCHMARK_RESULT"]).write_text(json.dumps({
            "rows": rows, "slope": slope, "device": where,
            "ratios": {"bytes per parameter": slope}, "targets": {"bytes per parameter": 8.0}},
            indent=1))
    return 1 if misses else 0


def _verdict(folder: Path) -> dict:
    for run in sorted(folder.iterdir()):
        f = run / "verdict.json"
        if f.is_file():
            return json.loads(f.read_text())
    return {}


def _slope(x: list[float], y: list[float]) -> float:
    if len(x) < 2:
        return y[0] / x[0] if x else 0.0
    mx, my = sum(x) / len(x), sum(y) / len(y)
    den = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / den if den else 0.0


if __name__ == "__main__":
    sys.exit(main())
