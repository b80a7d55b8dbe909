"""What recording activation statistics every step costs: ortlab's collector beside ORT's subscriber.

For each model (the demo, and a 4-layer d=128 GPT with batch 8, sequence 128) and backend, two figures:
- "steps", the one checked against the targets: in one burst that records every other step, the median time of
  the steps with statistics over that of the steps without (a step is forward, backward and optimizer). The two
  kinds of step alternate every few milliseconds, so that the load of a shared machine, which changes by the
  second, hits both alike. A PyTorch step without statistics runs without any hook (the collector registers its
  hooks only for the steps it records), so it is a step without the collector; under ORTModule the PythonOps stay
  in the graph and return at once, which a step without statistics still pays (a little: the ratio is a floor).
- "bursts": the same bursts with and without collect={"stats": {}} on two engines built from the same seed (so
  neither re-exports), run back to back per round in alternating order (benchmarks/_paired.py); each round's
  ratio of median step times (after step 0).
Each figure is the median over rounds, printed with the rounds' range. ORT's subscriber is measured in a plain
training loop. Output size per step: ortlab's stats.npz, ORT's step_N folder.
Targets: <= 1.15 on PyTorch, <= 1.3 on ORTModule. The same method on `--device` (cuda when torch sees a GPU: there
the statistics are summarized on the device, a step's rows reaching the host in one copy before the optimizer, inside
the step's time); ORTModule and ORT's subscriber are left out, with the reason, where onnxruntime-training is not
installed.

    python benchmarks/stats_overhead.py [--steps 60] [--rounds 7] [--models demo,gpt4] [--threads N] [--numpy]
                                        [--device cpu|cuda] [--backends pytorch,ortmodule]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _device
import numpy as np
import torch
from _paired import paired, verdict

from ortlab.common.capture import captured_output
from ortlab.engine import BurstConfig, Engine
from ortlab.workload import ModelRef, call_model

TARGETS = {"pytorch": 1.15, "ortmodule": 1.3}
MODELS = {"demo": {}, "gpt4": {"n_layer": 4, "d_model": 128, "seq_len": 128, "batch_size": 8}}


def checked_run(engine: Engine, cfg: BurstConfig):
    """Run one burst and return its Run; a failed burst or collector ends the benchmark."""
    from ortlab.runs.run import load_run

    run = load_run(engine.run(cfg))
    if run.status != "ok" or run.meta.get("collector_errors"):
        raise RuntimeError(f"{cfg.backend} burst failed: {run.error or run.meta.get('collector_errors')}")
    return run


def ortlab_ratio(kwargs: dict, backend: str, steps: int, rounds: int, out: str, device: str = "cpu"
                 ) -> tuple[list[float], float, int]:
    """(per round: median step time with stats / without, bytes of statistics per step, tensors per step)."""
    plain, stats = Engine(ModelRef.of(None, **kwargs)), Engine(ModelRef.of(None, **kwargs))
    cfg = BurstConfig(backend=backend, steps=steps, parity=True, out=out, device=device)
    with_stats = BurstConfig(backend=backend, steps=steps, parity=True, out=out, collect={"stats": {}}, device=device)
    for engine, c in ((plain, cfg), (stats, with_stats)):
        engine.run(BurstConfig(**{**c.__dict__, "steps": 2}))  # warm up: export once
    found = {"size": 0.0, "tensors": 0}

    def median_step(engine: Engine, c: BurstConfig) -> float:
        run = checked_run(engine, c)
        if c is with_stats:
            found["size"] = (run.path / "stats.npz").stat().st_size / steps
            with np.load(run.path / "stats.npz") as z:
                found["tensors"] = len(z["slot_name"])
        median = statistics.median(run.metrics["step_time_s"].iloc[1:])
        shutil.rmtree(run.path)
        return median

    rounds_ = paired(rounds, lambda: median_step(plain, cfg), lambda: median_step(stats, with_stats))
    return rounds_.ratios, found["size"], found["tensors"]


def interleaved_ratio(kwargs: dict, backend: str, steps: int, rounds: int, out: str, device: str = "cpu"
                      ) -> list[float]:
    """Per round: in one burst that records every other step, the median time of the steps with statistics over
    that of the steps without (a PyTorch step without statistics has no hooks at all: the collector registers
    them only for the steps it records; under ORTModule the PythonOps stay in the graph and return at once)."""
    engine = Engine(ModelRef.of(None, **kwargs))
    cfg = BurstConfig(backend=backend, steps=steps, parity=True, out=out, collect={"stats": {"steps": [0, steps, 2]}},
                      device=device)
    engine.run(BurstConfig(**{**cfg.__dict__, "steps": 2}))  # warm up: export once
    ratios = []
    for _ in range(rounds):
        run = checked_run(engine, cfg)
        times = run.metrics.set_index("step")["step_time_s"].iloc[2:]
        ratios.append(times[times.index % 2 == 0].median() / times[times.index % 2 == 1].median())
        shutil.rmtree(run.path)
    return ratios


def subscriber_ratio(kwargs: dict, backend: str, steps: int, rounds: int, out: str, device: str = "cpu"
                     ) -> tuple[float, float]:
    """ORT's StatisticsSubscriber in a plain loop: (median step time ratio, bytes written per step)."""
    from onnxruntime.training.utils.hooks import StatisticsSubscriber, SubscriberManager

    from ortlab._ort import patch_label_hook_bug

    def loop(subscribe: bool):
        torch.manual_seed(0)
        w = ModelRef.of(None, **kwargs).build()
        w.model.to(device)
        for m in w.model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        runner = w.model
        if backend == "ortmodule":
            from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

            patch_label_hook_bug()
            runner = ORTModule(w.model, DebugOptions(log_level=LogLevel.WARNING))
        folder = Path(out) / f"dump-{backend}-{subscribe}"
        if subscribe:
            subscriber = StatisticsSubscriber(str(folder), override_output_dir=True)
            SubscriberManager().subscribe(runner, [subscriber])
        opt = torch.optim.AdamW(w.model.parameters(), lr=1e-3)
        state = {"step": 0}

        def run(n: int) -> float:
            times = []
            for _ in range(n):
                x, y = _device.to(w.batch(state["step"] % 50), device)
                state["step"] += 1
                started = time.perf_counter()
                loss = w.loss(call_model(runner, x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                float(loss.detach())
                _device.sync(device)
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        run(2)
        return run, folder

    base_run, _ = loop(False)
    sub_run, folder = loop(True)
    base, sub = [], []
    for _ in range(rounds):
        base.append(base_run(steps))
        sub.append(sub_run(steps))
    step_dir = folder / "step_3"
    size = sum(f.stat().st_size for f in step_dir.iterdir()) if step_dir.is_dir() else float("nan")
    return min(sub) / min(base), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)  # 12-step medians moved by +-0.3 even on a quiet machine
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="demo,gpt4", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own, what a user gets)")
    parser.add_argument("--no-subscriber", action="store_true", help="skip ORT's StatisticsSubscriber")
    parser.add_argument("--numpy", action="store_true",
                        help="summarize with numpy instead of the one-pass C kernel")
    parser.add_argument("--backends", default="pytorch,ortmodule", help="comma-separated: pytorch, ortmodule")
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if args.numpy:
        os.environ["ORTLAB_STATS_KERNEL"] = "numpy"
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    where = _device.describe(device)
    os.environ.setdefault("TQDM_DISABLE", "1")
    print(f"torch intra-op threads: {torch.get_num_threads()} ({'set by --threads' if args.threads else 'default'}); "
          f"measured on {where}")
    print(f"{'model':<6} {'backend':<10} {'steps':>6} {'rounds':>12} {'bursts':>7} {'rounds':>12} {'target':>7} "
          f"{'ORT subscriber':>15} {'ortlab/step':>12} {'ORT/step':>10} {'tensors':>8}   ({args.steps} steps, median "
          f"of {args.rounds} rounds)")
    ratios, targets = {}, {}
    with tempfile.TemporaryDirectory() as out:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                if backend == "ortmodule" and _device.ortmodule_missing():
                    print(f"{model:<6} {backend:<10} left out: {_device.ortmodule_missing()}")
                    continue
                steps = interleaved_ratio(MODELS[model], backend, args.steps, args.rounds, out, device)
                bursts, size, tensors = ortlab_ratio(MODELS[model], backend, args.steps, args.rounds, out, device)
                skip = args.no_subscriber or _device.ortmodule_missing()  # ORT's subscriber is onnxruntime-training's
                with captured_output(Path(out) / "subscriber.log"):  # ORT prints at C level
                    sub, sub_size = (float("nan"), float("nan")) if skip else subscriber_ratio(
                        MODELS[model], backend, args.steps, max(2, args.rounds // 2), out, device)
                name = f"{model}/{backend}"
                ratios[name], targets[name] = statistics.median(steps), TARGETS[backend]
                print(f"{model:<6} {backend:<10} {ratios[name]:>6.3f} {_spread(steps):>12} "
                      f"{statistics.median(bursts):>7.3f} {_spread(bursts):>12} {targets[name]:>7.2f} {sub:>15.2f} "
                      f"{size / 1024:>10.1f}KB {sub_size / 1024:>8.0f}KB {tensors:>8}   statistics ratio on {where}",
                      flush=True)
    return verdict(ratios, targets, where)


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


if __name__ == "__main__":
    sys.exit(main())
