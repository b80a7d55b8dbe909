"""What the verdict adds to a comparison: a 3-step parity burst of torchvision's ResNet-18 (batch 2, 64x64,
`--fix auto`) on PyTorch and ORTModule, with and without judging it, side by side in one run.

A new user's comparison is one process: the ORTModule burst exports, the verdict's gradient check reuses that
ORTModule (no second export), and its float64 burst (spent only when the runs are not allclose) gives the
first step's float64 gradients too. So each round is a fresh in-process session running both bursts (the
export included), then the verdict on them; its ratio is (bursts + verdict) / bursts. Rounds alternate nothing
(the verdict needs its bursts), so the figure is the median of the rounds' ratios, with their range. A warm
figure follows: the same session's bursts again (no export) against them plus the verdict.
Target: ratio <= 1.3 (the cold figure: what a user waits for).

On `--device` (cuda when torch sees a GPU; ORTModule: it needs onnxruntime-training, refused in one line without).

    source bin/_env.sh && python benchmarks/verdict_cost.py [--rounds 3] [--steps 3] [--device cpu|cuda]
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
MODEL = f"{ROOT / 'tests' / 'factories' / 'zoo.py'}:resnet18"
TARGET = 1.3


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def bursts(session, steps: int, device: str = "cpu"):
    pt = session.burst("pytorch", steps, parity=True, progress=False, fixes="auto", device=device)
    ort = session.burst("ortmodule", steps, parity=True, progress=False, fixes="auto", device=device)
    return pt, ort


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if _device.ortmodule_missing():
        parser.error(f"the verdict judged here is ORTModule's: {_device.ortmodule_missing()}")
    zoo = os.environ.get("ORTLAB_ZOO_PACKAGES")
    if not zoo:
        sys.exit("ORTLAB_ZOO_PACKAGES is not set: run through bin/_env.sh (source bin/_env.sh)")
    sys.path.insert(0, zoo)
    from ortlab import Session

    cold, warm = [], []
    print(f"{'round':<6} {'bursts (s)':>11} {'verdict (s)':>12} {'ratio':>7}   warm: {'bursts':>7} {'verdict':>8} "
          f"{'ratio':>6}   verdict")
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as out, Session(MODEL, out=out, in_process=True) as s:
            base, (pt, ort) = timed(bursts, s, args.steps, device)
            judging, verdict = timed(s.judge, pt, ort)
            cold.append((base + judging) / base)
            base2, (pt2, ort2) = timed(bursts, s, args.steps, device)
            judging2, _ = timed(s.judge, pt2, ort2)
            warm.append((base2 + judging2) / base2)
            print(f"{i:<6} {base:>11.1f} {judging:>12.1f} {cold[-1]:>7.3f}   {base2:>13.1f} {judging2:>8.1f} "
                  f"{warm[-1]:>6.3f}   {verdict.status} ({(verdict.gradients or {}).get('judged_by')}, losses "
                  f"{(verdict.losses or {}).get('judged_by')})", flush=True)
    ratio = statistics.median(cold)
    print(f"ResNet-18, {args.steps}-step parity comparison: (bursts + verdict) / bursts = {ratio:.3f} "
          f"(rounds {min(cold):.3f}-{max(cold):.3f}); warm (no export) {statistics.median(warm):.3f}; on "
          f"{_device.describe(device)}")
    print("meets the target" if ratio <= TARGET else f"misses the target: {ratio:.3f} > {TARGET}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
