"""ortlab's 2-rank burst over a bare hand-written DDP script launched by torchrun, measured side by side.

Both train the demo model on the CPU over gloo, rank r on batch(step * world_size + r), AdamW, inside
DistributedDataParallel (ORTModule inside DDP on the ORTModule backend); the bare script is
benchmarks/ddp_bare.py under `torchrun --nproc-per-node 2`. The figure is the median time of a whole training
iteration on rank 0 (from one step's start to the next's: ortlab's in-sync check, metrics line and Stop check
included), after the first steps (ORTModule exports in step 0). Each round runs both, back to back; the
figure is the median of the rounds' ratios (benchmarks/_paired.py). The bare script runs in the environment ortlab
gives its ranks (one thread each, glibc's heap thresholds: ortlab.engine.launch.RANK_ENV), so that the ratio is
what ortlab's own machinery costs. Target: ratio <= 1.05.

    python benchmarks/distributed_overhead.py [--steps 100] [--rounds 7] [--backends pytorch ortmodule]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _paired import paired, verdict

from ortlab import Session
from ortlab.engine.launch import RANK_ENV

TARGET = 1.05
WARMUP = 5  # steps left out: the export, the first allocations, the ranks' staggered start
BARE = Path(__file__).with_name("ddp_bare.py")


def medians(rows: list[dict]) -> tuple[float, float]:
    """The median whole iteration and the median compute time (forward to the loss) of one rank's steps."""
    starts = [r["started_s"] for r in rows[WARMUP:]]
    iterations = [b - a for a, b in itertools.pairwise(starts)]
    return statistics.median(iterations), statistics.median(r["step_time_s"] for r in rows[WARMUP:])


def bare(backend: str, steps: int, out: Path) -> tuple[float, float]:
    env = {**RANK_ENV, **os.environ}  # what ortlab gives its ranks: the ratio is ortlab's machinery alone
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", str(BARE), "--backend", backend, "--steps", str(steps),
               "--out", str(out)]
    # a session of its own, as ortlab's launcher starts its agent: with the kernel's autogroup scheduling, processes
    # share the CPU by session, so both must be alike there
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True)
    lines = (out / "rank0.jsonl").read_text(encoding="utf-8").splitlines()
    return medians([json.loads(line) for line in lines])


def ortlab(session: Session, backend: str, steps: int) -> tuple[float, float]:
    run = session.burst(backend, steps, nproc=2, progress=False)
    if run.status != "ok":
        raise SystemExit(f"the ortlab burst failed: {run.error}")
    return medians(run.ranks[0].metrics.to_dict("records"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backends", nargs="+", default=["pytorch", "ortmodule"], choices=("pytorch", "ortmodule"))
    args = parser.parse_args()
    ratios = {}
    print(f"{'backend':<10} {'bare (ms)':>10} {'ortlab (ms)':>12} {'ratio':>7} {'rounds':>13}   "
          f"{'compute only: bare':>19} {'ortlab':>7}   (rank 0, median iteration, {args.steps} steps, median of "
          f"{args.rounds} paired rounds)")
    with tempfile.TemporaryDirectory() as tmp, Session(out=Path(tmp) / "runs") as session:
        for backend in args.backends:
            folders = (Path(tmp) / f"bare-{backend}-{i}" for i in itertools.count())
            rounds = paired(args.rounds, lambda: bare(backend, args.steps, next(folders)),  # noqa: B023
                            lambda: ortlab(session, backend, args.steps), figure=lambda t: t[0],  # noqa: B023
                            on_round=lambda i, b, o: print(f"  round {i + 1}: bare {b[0] * 1e3:.1f} ms, ortlab "
                                                           f"{o[0] * 1e3:.1f} ms ({o[0] / b[0]:.3f})", flush=True))
            ratios[backend] = rounds.ratio
            b, o = (statistics.median(t[0] for t in rounds.theirs), statistics.median(t[0] for t in rounds.ours))
            bc, oc = (statistics.median(t[1] for t in rounds.theirs), statistics.median(t[1] for t in rounds.ours))
            print(f"{backend:<10} {b * 1e3:>10.2f} {o * 1e3:>12.2f} {rounds.ratio:>7.3f} {rounds.spread:>13}   "
                  f"{bc * 1e3:>19.2f} {oc * 1e3:>7.2f}", flush=True)
    return verdict(ratios, dict.fromkeys(ratios, TARGET))


if __name__ == "__main__":
    sys.exit(main())
