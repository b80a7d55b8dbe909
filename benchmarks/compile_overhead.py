"""ortlab's compile burst against a bare hand-written torch.compile training loop of the same model, data and
optimizer, measured side by side in this process (both on the same compiled module, so that compilation happens
once, before the rounds); the figure is the median of paired rounds' ratios of median steps (benchmarks/_paired.py).
Target: <= 1.05. Start-up (compilation) is reported, not part of the ratio. On `--device` (cuda when torch sees a
GPU): the bare loop's batches on it; in both loops a step's time includes waiting for the GPU where the loss is
read back (in steady state each step pays for the GPU's work of one step).

    python benchmarks/compile_overhead.py [--steps 60] [--rounds 7] [--device cpu|cuda]
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
from ortlab.runs.run import load_run
from ortlab.workload import ModelRef, call_model

TARGET = 1.05


def bare_loop(engine: Engine, compiled, steps: int, device: torch.device) -> float:
    """The median step of a hand-written loop over the compiled module (the first step left out)."""
    engine.initial.restore(engine.model)
    optimizer = torch.optim.AdamW(engine.model.parameters(), lr=1e-3)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        x, y = _device.to(engine.workload.batch(step), device)
        loss = engine.workload.loss(call_model(compiled, x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())
        times.append(time.perf_counter() - started)
    _device.sync(device)
    return statistics.median(times[1:])


def ortlab_burst(engine: Engine, cfg: BurstConfig) -> float:
    return float(load_run(engine.run(cfg)).metrics["step_time_s"].iloc[1:].median())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=7)
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser)
    if device.type == "cpu":
        torch.set_num_threads(1)  # two cores: keep the measurement off the other one
    engine = Engine(ModelRef.of())
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        warm = load_run(engine.run(BurstConfig(backend="compile", steps=2, out=out, device=device.type)))  # compiles
        print(f"start-up: {warm.summary().get('compile_s', 0):.1f} s compiling "
              f"({time.perf_counter() - started:.1f} s for the first burst)")
        compiled = engine.runner
        bare_loop(engine, compiled, 2, device)
        cfg = BurstConfig(backend="compile", steps=args.steps, out=out, device=device.type)
        rounds = paired(args.rounds, lambda: bare_loop(engine, compiled, args.steps, device),
                        lambda: ortlab_burst(engine, cfg))
    print(f"median step: bare {statistics.median(rounds.theirs) * 1000:.2f} ms, ortlab "
          f"{statistics.median(rounds.ours) * 1000:.2f} ms; ratio {rounds.ratio:.3f} (rounds {rounds.spread}, "
          f"{args.rounds} paired rounds of {args.steps} steps); compile bookkeeping ratio on "
          f"{_device.describe(device)}")
    return verdict({"compile": rounds.ratio}, {"compile": TARGET}, _device.describe(device))


if __name__ == "__main__":
    sys.exit(main())
