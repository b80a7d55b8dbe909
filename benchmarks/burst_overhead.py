"""ortlab's burst time over a bare hand-written training loop of the same steps, measured side by side.

Both run the same model, batches and optimizer in this process; on ORTModule both use the same (already
exported) wrap, so the ratio is ortlab's own cost: run folder, per-step metrics, log capture, option scoping.
Rounds alternate between the two so that machine noise hits both alike. Target: ratio <= 1.05.

    python benchmarks/burst_overhead.py [--steps 60] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from ortlab.engine import BurstConfig, Engine
from ortlab.workload import ModelRef, call_model

TARGET = 1.05


def bare_loop(engine: Engine, runner, steps: int) -> None:
    engine.initial.restore(engine.model)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(engine.model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = engine.workload.batch(step)
        loss = engine.workload.loss(call_model(runner, x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)  # two cores: keep the measurement off the other one
    engine = Engine(ModelRef.of())
    worst = 0.0
    print(f"{'backend':<10} {'bare (s)':>9} {'ortlab (s)':>11} {'ratio':>7}   "
          f"({args.steps} steps, median of {args.rounds})")
    with tempfile.TemporaryDirectory() as out:
        for backend in ("pytorch", "ortmodule"):
            cfg = BurstConfig(backend=backend, steps=args.steps, out=out)
            engine.run(BurstConfig(backend=backend, steps=2, out=out))  # warm up (and export once)
            runner = engine.model if backend == "pytorch" else engine.wrapper.ort_module
            bare_loop(engine, runner, 2)
            bare, ours = [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                bare_loop(engine, runner, args.steps)
                bare.append(time.perf_counter() - started)
                started = time.perf_counter()
                engine.run(cfg)
                ours.append(time.perf_counter() - started)
            ratio = statistics.median(ours) / statistics.median(bare)
            worst = max(worst, ratio)
            print(f"{backend:<10} {statistics.median(bare):>9.3f} {statistics.median(ours):>11.3f} {ratio:>7.3f}")
    verdict = "meets" if worst <= TARGET else "misses"
    print(f"worst ratio {worst:.3f}: {verdict} the target <= {TARGET}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
