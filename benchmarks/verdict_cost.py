"""What the verdict adds to a comparison: a 3-step parity burst on PyTorch and ORTModule (`--fix auto`), with and
without judging it, side by side in one run, for ortlab's demo (allclose: the fast path) and torchvision's
ResNet-18 (batch 2, 64x64: float64, and fp32's spread where one PyTorch run does not settle it).

A new user's comparison is one process: the ORTModule burst exports, the verdict's gradient check reuses that
ORTModule (no second export), and its float64 burst (spent only when the runs are not allclose) gives the
first step's float64 gradients too. So each round is a fresh in-process session running both bursts (the
export included), then the verdict on them; its ratio is (bursts + verdict) / bursts. Rounds alternate nothing
(the verdict needs its bursts), so the figure is the median of the rounds' ratios, with their range. A warm
figure follows: the same session's bursts again (no export) against them plus the verdict. Each round's line says
what judged the gradients and the losses, and how many fp32 runs the ensemble spent (ortlab.verdict.ensemble).
Target: ratio <= 1.3 for each model (the cold figure: what a user waits for).

On `--device` (cuda when torch sees a GPU; ORTModule: it needs onnxruntime-training, refused in one line without).

    source bin/_env.sh && python benchmarks/verdict_cost.py [--model demo|resnet18|both] [--rounds 3] [--steps 3]
        [--start N]   # the model from another start (the session's seed): ResNet-18's start 1 spends the ensemble
        [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _device

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"demo": ("ortlab.demo:gpt", "demo"),
          "resnet18": (f"{ROOT / 'tests' / 'factories' / 'zoo.py'}:resnet18", "ResNet-18")}
TARGET = 1.3


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def bursts(session, steps: int, device: str = "cpu"):
    pt = session.burst("pytorch", steps, parity=True, progress=False, fixes="auto", device=device)
    ort = session.burst("ortmodule", steps, parity=True, progress=False, fixes="auto", device=device)
    return pt, ort


def spent(verdict) -> str:
    """What judged the verdict's evidence, and the fp32 runs its ensemble spent."""
    grads, losses = verdict.gradients or {}, verdict.losses or {}
    members = len(grads.get("members") or []) + len(losses.get("members") or [])
    return (f"{verdict.status} (gradients {grads.get('judged_by')}, losses {losses.get('judged_by')}"
            f"{', ensemble ' + str(members) + ' runs' if members else ''})")


def measure(model: str, label: str, rounds: int, steps: int, start: int = 0, device: str = "cpu") -> float:
    from ortlab import Session

    cold, warm = [], []
    print(f"{label}: {'round':<6} {'bursts (s)':>11} {'verdict (s)':>12} {'ratio':>7}   warm: {'bursts':>7} "
          f"{'verdict':>8} {'ratio':>6}   verdict")
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as out, Session(model, out=out, in_process=True, seed=start) as s:
            base, (pt, ort) = timed(bursts, s, steps, device)
            judging, verdict = timed(s.judge, pt, ort)
            cold.append((base + judging) / base)
            base2, (pt2, ort2) = timed(bursts, s, steps, device)
            judging2, _ = timed(s.judge, pt2, ort2)
            warm.append((base2 + judging2) / base2)
            print(f"{label}: {i:<6} {base:>11.1f} {judging:>12.1f} {cold[-1]:>7.3f}   {base2:>13.1f} "
                  f"{judging2:>8.1f} {warm[-1]:>6.3f}   {spent(verdict)}", flush=True)
    ratio = statistics.median(cold)
    print(f"{label} (start {start}), {steps}-step parity comparison: (bursts + verdict) / bursts = {ratio:.3f} "
          f"(rounds {min(cold):.3f}-{max(cold):.3f}); warm (no export) {statistics.median(warm):.3f}; on "
          f"{_device.describe(device)}")
    print(f"{label}: meets the target" if ratio <= TARGET else f"{label}: misses the target: {ratio:.3f} > {TARGET}")
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    _device.add_argument(parser)
    parser.add_argument("--start", type=int, default=0, help="the session's seed: the model's initialization")
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if _device.ortmodule_missing():
        parser.error(f"the verdict judged here is ORTModule's: {_device.ortmodule_missing()}")
    zoo = os.environ.get("ORTLAB_ZOO_PACKAGES")
    if not zoo:
        sys.exit("ORTLAB_ZOO_PACKAGES is not set: run through bin/_env.sh (source bin/_env.sh)")
    sys.path.insert(0, zoo)
    chosen = list(MODELS) if args.model == "both" else [args.model]
    ratios = [measure(*MODELS[name], args.rounds, args.steps, args.start, device) for name in chosen]
    return 0 if all(r <= TARGET for r in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
