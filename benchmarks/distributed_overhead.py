"""ortlab's 2-rank burst over a bare hand-written DDP script launched by torchrun, measured side by side.

Both train the demo model on the CPU over gloo, rank r on batch(step * world_size + r), AdamW, inside
DistributedDataParallel (ORTModule inside DDP on the ORTModule backend); the bare script is
benchmarks/ddp_bare.py under `torchrun --nproc-per-node 2`. The figure is the time of a whole training iteration
on rank 0 (from one step's start to the next's: ortlab's in-sync check, metrics line and Stop check included).

Side by side: both jobs run at once and take turns every `--block` steps (benchmarks/_turns.py), so that the drift
of this shared machine's speed, 10-30% between bursts of ten seconds, hits both alike. For each turn after the
first (ORTModule exports in step 0) the ratio of the two jobs' median iterations, leaving out each turn's first
iterations (the wait for the turn, then cold caches); the figure is the median of those ratios over `--rounds`
runs. The bare script runs in the environment ortlab gives its ranks (one thread each, glibc's heap thresholds:
ortlab.engine.launch.RANK_ENV), so that the ratio is what ortlab's own machinery costs. Target: ratio <= 1.05.

    python benchmarks/distributed_overhead.py [--steps 300] [--block 12] [--rounds 5] [--backends pytorch ortmodule]
                                              [--device cpu|cuda]

`--device cuda` (the default when torch sees a GPU) trains both jobs on the GPUs over NCCL, one GPU per rank: it
needs 2 of them (refused in one line otherwise; --device cpu measures over gloo). ORTModule is left out, with the
reason, where onnxruntime-training is not installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _device
import _turns
import torch
from _paired import verdict

from ortlab import Session
from ortlab.engine.launch import RANK_ENV

TARGET = 1.05
BARE = Path(__file__).with_name("ddp_bare.py")


def per_block(rows: list[dict], block: int, key: str) -> dict[int, float]:
    """Turn -> the median of its measured iterations (key "iteration") or compute times ("step_time_s"), from
    the second turn on."""
    found: dict[int, list[float]] = {}
    for row, following in itertools.pairwise(rows):
        step = row["step"]
        if step >= block and _turns.measured(step, block):
            value = following["started_s"] - row["started_s"] if key == "iteration" else row[key]
            found.setdefault(step // block, []).append(value)
    return {turn: statistics.median(values) for turn, values in found.items()}


def in_turns(session: Session, backend: str, steps: int, block: int, progress: Path, out: Path, device: str = "cpu"
             ) -> tuple[list, list]:
    """One run of both jobs taking turns: (the bare script's rank-0 rows, ortlab's rank-0 rows)."""
    _turns.create(progress)
    env = {**RANK_ENV, **os.environ}  # what ortlab gives its ranks: the ratio is ortlab's machinery alone
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", str(BARE), "--backend", backend, "--steps", str(steps),
               "--out", str(out), "--turns", str(progress), "--block", str(block), "--device", device]
    # a session of its own, as ortlab's launcher starts its agent: with the kernel's autogroup scheduling, processes
    # share the CPU by session, so both must be alike there
    bare = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        run = session.burst(backend, steps, nproc=2, progress=False, device=device)
        if run.status != "ok":
            raise SystemExit(f"the ortlab burst failed: {run.error}")
        if bare.wait(timeout=600):
            raise SystemExit(f"the bare script failed (exit {bare.returncode}): {' '.join(command)}")
    finally:
        if bare.poll() is None:  # torchrun and its ranks: the session it leads (start_new_session)
            os.killpg(bare.pid, signal.SIGKILL)
    lines = (out / "rank0.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines], run.ranks[0].metrics.to_dict("records")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--block", type=int, default=12, help="steps per turn")
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs per backend (one run's figure moves by ~3%% on ORTModule)")
    parser.add_argument("--backends", nargs="+", default=["pytorch", "ortmodule"], choices=("pytorch", "ortmodule"))
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if device == "cuda" and torch.cuda.device_count() < _turns.WORLD:
        parser.error(f"--device cuda: {_turns.WORLD} ranks need {_turns.WORLD} GPUs (one per rank over NCCL), this "
                     f"machine has {torch.cuda.device_count()}; use --device cpu")
    where = _device.describe(device)
    if args.block <= _turns.FIRST_LEFT_OUT or args.steps < 3 * args.block:
        parser.error(f"--block must be > {_turns.FIRST_LEFT_OUT} and --steps at least 3 blocks")
    ratios = {}
    print(f"{'backend':<10} {'bare (ms)':>10} {'ortlab (ms)':>12} {'ratio':>7} {'runs':>13} {'turns p10-p90':>14}   "
          f"{'compute only: bare':>19} {'ortlab':>7}   (rank 0, median iteration; {args.steps} steps in turns of "
          f"{args.block}, {args.rounds} runs)")
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "turns"
        factory = f"{Path(__file__).with_name('_turns.py')}:demo"
        kwargs = {"turns": str(progress), "block": args.block, "steps": args.steps}
        with Session(factory, kwargs, out=Path(tmp) / "runs") as session:
            for backend in args.backends:
                if backend == "ortmodule" and _device.ortmodule_missing():
                    print(f"{backend:<10} left out: {_device.ortmodule_missing()}")
                    continue
                turn_ratios, per_run, figures = [], [], {"bare": [], "ortlab": [], "bare_c": [], "ortlab_c": []}
                for i in range(args.rounds):
                    bare, ours = in_turns(session, backend, args.steps, args.block, progress,
                                          Path(tmp) / f"bare-{backend}-{i}", device)
                    b, o = per_block(bare, args.block, "iteration"), per_block(ours, args.block, "iteration")
                    run_ratios = [o[t] / b[t] for t in sorted(b.keys() & o.keys())]
                    turn_ratios += run_ratios
                    per_run.append(statistics.median(run_ratios))
                    figures["bare"] += b.values()
                    figures["ortlab"] += o.values()
                    figures["bare_c"] += per_block(bare, args.block, "step_time_s").values()
                    figures["ortlab_c"] += per_block(ours, args.block, "step_time_s").values()
                    print(f"  run {i + 1}: bare {statistics.median(b.values()) * 1e3:.1f} ms, ortlab "
                          f"{statistics.median(o.values()) * 1e3:.1f} ms, median of {len(run_ratios)} turns' "
                          f"ratios {per_run[-1]:.3f}", flush=True)
                ratios[backend] = ratio = statistics.median(turn_ratios)
                deciles = statistics.quantiles(turn_ratios, n=10)
                med = {k: statistics.median(v) * 1e3 for k, v in figures.items()}
                print(f"{backend:<10} {med['bare']:>10.2f} {med['ortlab']:>12.2f} {ratio:>7.3f} "
                      f"{min(per_run):>6.3f}-{max(per_run):.3f} {deciles[0]:>7.3f}-{deciles[-1]:.3f}   "
                      f"{med['bare_c']:>19.2f} {med['ortlab_c']:>7.2f}   on {where}", flush=True)
    return verdict(ratios, dict.fromkeys(ratios, TARGET), where)


if __name__ == "__main__":
    sys.exit(main())
