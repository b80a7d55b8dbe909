"""ortlab's burst time over a bare hand-written training loop of the same steps, measured side by side.

Both run the same model, batches and optimizer in this process; on ORTModule both use the same (already
exported) wrap, so the ratio is ortlab's own cost: run folder, per-step metrics, log capture, option scoping.
Each round runs both back to back; the figure is the median of the rounds' ratios (benchmarks/_paired.py).
On `--device` (cuda when torch sees a GPU): both loops' batches on it, the GPU waited for at the end of each.
ORTModule is left out, with the reason, where onnxruntime-training is not installed.
Target: ratio <= 1.05.

    python benchmarks/burst_overhead.py [--steps 60] [--rounds 7] [--device cpu|cuda] [--backends pytorch,ortmodule]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import _device
import torch
from _paired import paired, verdict

from ortlab.engine import BurstConfig, Engine
from ortlab.workload import ModelRef, call_model

TARGET = 1.05


def bare_loop(engine: Engine, runner, steps: int, device: torch.device) -> None:
    engine.initial.restore(engine.model)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(engine.model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = _device.to(engine.workload.batch(step), device)
        loss = engine.workload.loss(call_model(runner, x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())
    _device.sync(device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backends", default="pytorch,ortmodule", help="comma-separated: pytorch, ortmodule")
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser)
    if device.type == "cpu":
        torch.set_num_threads(1)  # two cores: keep the measurement off the other one
    engine = Engine(ModelRef.of())
    ratios = {}
    where = _device.describe(device)
    print(f"{'backend':<10} {'bare (s)':>9} {'ortlab (s)':>11} {'ratio':>7} {'rounds':>12}   "
          f"({args.steps} steps, median of {args.rounds} paired rounds, on {where})")
    with tempfile.TemporaryDirectory() as out:
        for backend in args.backends.split(","):
            if backend == "ortmodule" and _device.ortmodule_missing():
                print(f"{backend:<10} left out: {_device.ortmodule_missing()}")
                continue
            cfg = BurstConfig(backend=backend, steps=args.steps, out=out, device=device.type)
            engine.run(BurstConfig(backend=backend, steps=2, out=out, device=device.type))  # warm up (export once)
            runner = engine.runner  # the model, or the ORTModule of the warm-up burst
            bare_loop(engine, runner, 2, device)
            rounds = paired(args.rounds, lambda: timed(device, bare_loop, engine, runner, args.steps,  # noqa: B023
                                                       device),
                            lambda: timed(device, engine.run, cfg))  # noqa: B023
            ratios[backend] = rounds.ratio
            print(f"{backend:<10} {statistics.median(rounds.theirs):>9.3f} {statistics.median(rounds.ours):>11.3f} "
                  f"{rounds.ratio:>7.3f} {rounds.spread:>12}   burst bookkeeping ratio on {where}")
    return verdict(ratios, dict.fromkeys(ratios, TARGET), where)


def timed(device: torch.device, fn, *args) -> float:
    _device.sync(device)
    started = time.perf_counter()
    fn(*args)
    _device.sync(device)
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
