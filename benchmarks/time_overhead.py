"""What the time collector costs on the steps it does not profile, and how long `ortlab time` takes.

1. A burst with the collector "time" (steps 2-4 profiled) against a burst without it, same backend, in paired
   rounds (benchmarks/_paired.py): a round's figure is the lower quartile of the step times after the profiled
   ones (5 to the end) in each burst (other jobs on the machine only ever add time to a step; the median of a
   round moved by 50% between rounds when the machine was busy). ORTModule: each burst exports anew (ORT's
   profiler is set when ORTModule creates its session), so both sides export; the steps compared come after.
   Target: ratio <= 1.02.
2. With --gpt2: `ortlab time` (the CLI, a new process, as a user runs it) on profiled GPT-2-small-shaped runs
   (124M parameters, random weights, batch 2, sequence 128; PyTorch and ORTModule, a few minutes to burst).
   Target: < 2 s.

On `--device` (cuda when torch sees a GPU: torch.profiler with CUDA activity); ORTModule is left out, with the
reason, where onnxruntime-training is not installed.

    python benchmarks/time_overhead.py [--steps 25] [--rounds 15] [--backend pytorch,ortmodule] [--gpt2]
                                       [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import _device
import torch
from _paired import paired, verdict

from ortlab.engine import BurstConfig, Engine
from ortlab.runs.run import load_run
from ortlab.workload import ModelRef

TARGET_RATIO, TARGET_CLI_S = 1.02, 2.0
PROFILED = [2, 3, 4]


def after_profiled(engine: Engine, cfg: BurstConfig) -> float:
    """The lower quartile of the step times of a burst's steps after the profiled ones."""
    run = load_run(engine.run(cfg))
    assert run.ok, run.error
    return float(run.metrics["step_time_s"].iloc[PROFILED[-1] + 1:].quantile(0.25))


def cli_seconds(paths: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ortlab.cli", "time", *paths], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--backend", default="pytorch,ortmodule", help="backends of part 1 (none: skip it)")
    parser.add_argument("--gpt2", action="store_true", help="also time `ortlab time` on GPT-2 small's shape")
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if device == "cpu":
        torch.set_num_threads(1)  # two cores: keep the measurement off the other one
    engine = Engine(ModelRef.of())
    ratios, targets = {}, {}
    where = _device.describe(device)
    print(f"{'backend':<10} {'without (ms)':>12} {'with (ms)':>10} {'ratio':>7} {'rounds':>12}   (lower quartile of "
          f"the steps after the profiled steps {PROFILED}, {args.steps} steps, median of {args.rounds} paired rounds, "
          f"on {where})")
    with tempfile.TemporaryDirectory() as out:
        for backend in [b for b in args.backend.split(",") if b not in ("", "none")]:
            if backend == "ortmodule" and _device.ortmodule_missing():
                print(f"{backend:<10} left out: {_device.ortmodule_missing()}")
                continue
            plain = BurstConfig(backend=backend, steps=args.steps, out=out, device=device)
            timed = BurstConfig(backend=backend, steps=args.steps, out=out, collect={"time": {"steps": PROFILED}},
                                device=device)
            engine.run(BurstConfig(backend=backend, steps=2, out=out, device=device))  # warm up
            rounds = paired(args.rounds, lambda: after_profiled(engine, plain),  # noqa: B023
                            lambda: after_profiled(engine, timed))  # noqa: B023
            ratios[backend], targets[backend] = rounds.ratio, TARGET_RATIO
            print(f"{backend:<10} {statistics.median(rounds.theirs) * 1e3:>12.2f} "
                  f"{statistics.median(rounds.ours) * 1e3:>10.2f} {rounds.ratio:>7.3f} {rounds.spread:>12}   "
                  f"on {where}")
        if args.gpt2:
            from memory_account import gpt2_small

            import ortlab

            started = time.perf_counter()
            backends = ("pytorch",) if _device.ortmodule_missing() else ("pytorch", "ortmodule")
            with ortlab.Session(gpt2_small, out=out, in_process=True) as s:
                runs = [s.burst(backend, 6, progress=False, collect={"time": {"steps": [2, 3]}}, device=device)
                        for backend in backends]
            print(f"(GPT-2 small bursts with the time collector: {time.perf_counter() - started:.0f} s, "
                  f"{[r.status for r in runs]})")
            seconds = cli_seconds([str(r.path) for r in runs], 3)
            ok = seconds < TARGET_CLI_S
            print(f"ortlab time on GPT-2 small ({' and '.join(backends)} runs on {where}): {seconds:.2f} s (target < "
                  f"{TARGET_CLI_S} s) {'ok' if ok else 'SLOW'}")
            if not ok:
                ratios["ortlab time (s)"], targets["ortlab time (s)"] = seconds, TARGET_CLI_S
    return verdict(ratios, targets, where)


if __name__ == "__main__":
    sys.exit(main())
