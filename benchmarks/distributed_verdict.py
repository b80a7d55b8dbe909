"""What the verdict against one process of the same global batch adds to a 2-rank burst: the demo model on the CPU
over gloo, per strategy (ddp, zero1, and fsdp2 where this torch runs it on the CPU), the burst with its verdict
(`parity=True`: the ranks record their evidence, then the session judges them, ortlab.verdict.sharded) beside the
same burst without it, side by side in one run.

Each round is a fresh session (a user's first verdict: the process that judges starts, builds the model and replays
the global batch in fp32 and float64; a session's later verdict of the same reference reuses the replays), the
two bursts back to back in alternating order (benchmarks/_paired.py); the figure is the median of the rounds'
ratios, (burst with its verdict) / (burst without), with their range. Each line also gives the verdict's own part
(the time from the ranks' end to the verdict written) and what the verdict said.
Target: ratio <= 1.3 for each strategy.

    source bin/_env.sh && python benchmarks/distributed_verdict.py [--strategies ddp zero1 fsdp2] [--rounds 3]
        [--steps 20] [--device cpu|cuda]

`--device cuda` (the default when torch sees a GPU) trains the ranks on the GPUs over NCCL, one GPU per rank: it
needs 2 of them (refused in one line otherwise; --device cpu measures over gloo).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _device
import torch
from _paired import paired, verdict

from ortlab import Session
from ortlab.engine.config import fsdp2_cpu_missing, fully_shard_missing

TARGET = 1.3
STRATEGIES = ("ddp", "zero1", "fsdp2")


def burst(strategy: str, steps: int, parity: bool, device: str = "cpu") -> dict:
    """One 2-rank burst of the demo in a fresh session: its wall time, and with `parity` the verdict's part."""
    from ortlab.verdict.judge import Verdict

    with tempfile.TemporaryDirectory() as out, Session(None, out=out) as s:
        started = time.perf_counter()
        run = s.burst("pytorch", steps, nproc=2, strategy=strategy, parity=parity, device=device, progress=False)
        seconds = time.perf_counter() - started
        if run.status != "ok":
            raise SystemExit(f"the {strategy} burst ended {run.status}: {run.error}")
        found = {"seconds": seconds}
        if parity:
            judged = Path(run.path) / "verdict.json"
            found["verdict_s"] = max(0.0, judged.stat().st_mtime - max(
                (r.path / "metrics.jsonl").stat().st_mtime for r in run.ranks))
            found["verdict"] = Verdict.from_dict(run.read_json("verdict.json")).status
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if device == "cuda" and torch.cuda.device_count() < 2:
        parser.error(f"--device cuda: 2 ranks need 2 GPUs (one per rank over NCCL), this machine has "
                     f"{torch.cuda.device_count()}; use --device cpu")
    ratios = {}
    print(f"{'strategy':<9} {'round':>5} {'burst (s)':>10} {'with verdict (s)':>17} {'verdict part (s)':>17} "
          f"{'ratio':>6}   verdict   (2 ranks, {'nccl' if device == 'cuda' else 'gloo'}, the demo, {args.steps} "
          "steps)")
    for strategy in args.strategies:
        why = (fully_shard_missing() or (fsdp2_cpu_missing() if device == "cpu" else None)) \
            if strategy == "fsdp2" else None
        if why:
            print(f"{strategy:<9} left out: {why}")
            continue

        def told(i: int, plain: dict, judged: dict, strategy: str = strategy) -> None:
            print(f"{strategy:<9} {i:>5} {plain['seconds']:>10.1f} {judged['seconds']:>17.1f} "
                  f"{judged['verdict_s']:>17.1f} {judged['seconds'] / plain['seconds']:>6.3f}   {judged['verdict']}",
                  flush=True)

        rounds = paired(args.rounds, lambda s=strategy: burst(s, args.steps, False, device),
                        lambda s=strategy: burst(s, args.steps, True, device), lambda r: r["seconds"], told)
        ratios[strategy] = rounds.ratio
        print(f"{strategy:<9} (burst + verdict) / burst = {rounds.ratio:.3f} (rounds {rounds.spread})", flush=True)
    where = _device.describe(device)
    print("side by side: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()) + f" on {where}")
    return verdict(ratios, dict.fromkeys(ratios, TARGET), f"{where} ({'nccl' if device == 'cuda' else 'gloo'})")


if __name__ == "__main__":
    sys.exit(main())
