"""A comparison across stacks against the same bursts run one by one on their stacks, wall-clock, measured side by
side in paired rounds (benchmarks/_paired.py). Target: <= 1.3.

ours:   `bin/ortlab compare --backends pytorch,ortmodule@ort,compile@current` (one process: a worker per stack,
        the snapshot saved once, every run judged from the folders, float64 run once);
theirs: what a user runs by hand: `bin/ortlab burst --parity` of PyTorch and ORTModule (ORTLAB_STACK=ort) and of
        torch.compile (ORTLAB_STACK=current), one process each. The figure is ours over theirs; a second figure adds
        to theirs the two `ortlab judge` calls that give the same verdicts by hand (reported, not the target's).

Both environments must exist (bin/ortlab builds them on first use; run each stack's bin/ortlab once before).
On the CPU: the bursts run where bin/ortlab puts them.

    python benchmarks/cross_stack.py [--steps 20] [--rounds 3] [--model-arg n_layer=2 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _paired import paired, verdict

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.3
PLACED = "pytorch,ortmodule@ort,compile@current"
BY_HAND = (("ort", "pytorch"), ("ort", "ortmodule"), ("current", "compile"))


def ortlab(stack: str, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ORTLAB_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run([str(ROOT / "bin" / "ortlab"), *args], capture_output=True, text=True,
                          env={**env, "ORTLAB_STACK": stack})
    if done.returncode not in ok:
        sys.exit(f"cross_stack: `ortlab {' '.join(args)}` on {stack} failed ({done.returncode}): "
                 f"{done.stderr.strip().splitlines()[-1:] or ''}")
    return done


def across(out: Path, common: list[str]) -> float:
    started = time.perf_counter()
    ortlab("ort", "compare", "--backends", PLACED, "--out", str(out), *common)
    return time.perf_counter() - started


def by_hand(out: Path, common: list[str], judged: list[float]) -> float:
    """The three bursts one by one on their stacks (the figure); the `ortlab judge` calls after them are timed
    apart, into `judged`."""
    started = time.perf_counter()
    paths = {}
    for stack, backend in BY_HAND:
        done = ortlab(stack, "burst", "--backend", backend, "--parity", "--out", str(out / backend), "--json", *common)
        paths[backend] = json.loads(done.stdout)["path"]
    bursts = time.perf_counter() - started
    for other in ("ortmodule", "compile"):
        ortlab("ort", "judge", paths["pytorch"], paths[other], ok=(0, 1))
    judged.append(time.perf_counter() - started - bursts)
    return bursts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    common = ["--steps", str(args.steps), *(a for kv in args.model_arg for a in ("--model-arg", kv))]
    judged: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        n = iter(range(10**6))
        rounds = paired(args.rounds, lambda: by_hand(Path(tmp) / f"hand{next(n)}", common, judged),
                        lambda: across(Path(tmp) / f"across{next(n)}", common),
                        on_round=lambda i, t, o: print(f"round {i}: one by one {t:.1f} s (+ judge {judged[-1]:.1f} s),"
                                                       f" across stacks {o:.1f} s", flush=True))
    with_judge = sorted(o / (t + j) for o, t, j in zip(rounds.ours, rounds.theirs, judged, strict=True))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(f"{PLACED}, {args.steps} steps: across stacks / the same bursts one by one on their stacks: ratio "
          f"{rounds.ratio:.3f} (rounds {rounds.spread}, {args.rounds} paired rounds); against the bursts and two "
          f"`ortlab judge` calls: {with_judge[len(with_judge) // 2]:.3f}; wall clock on the CPU ({machine})")
    return verdict({"cross_stack": rounds.ratio}, {"cross_stack": TARGET}, f"cpu ({machine})")


if __name__ == "__main__":
    sys.exit(main())
