"""The search's own cost beyond the bursts it runs: `ortlab.tune` on the demo, its wall time against the time spent
inside the Session's bursts and verdicts (the measured bursts, the guards, the verdicts' noise bursts and gradient
checks), measured in one run. What is left is the search itself: pruning, the strategy, reading runs, deciding,
writing tune.json after every candidate. Target: (wall - bursts) / bursts < 0.05.

`--gpt2` tunes GPT-2 small's shape instead (the demo's GPT at 12 layers, width 768, 12 heads, sequence 128,
batch 2): the documented run of docs/tune.md (minutes; prints the table).

The bursts run on `--device` (cuda when torch sees a GPU); tune searches ORTModule's options, so it needs
onnxruntime-training (refused in one line without it).

    python benchmarks/tune_overhead.py [--goal memory] [--steps 6] [--budget 30] [--gpt2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import _device

from ortlab.engine.session import Session
from ortlab.tuning import tune

TARGET = 0.05
GPT2_SMALL = {"n_layer": 12, "d_model": 768, "n_head": 12, "seq_len": 128, "batch_size": 2}


class Timed(Session):
    """A Session that adds up the time spent inside its bursts and verdicts."""

    inside = 0.0

    def burst(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return super().burst(*args, **kwargs)
        finally:
            self.inside += time.perf_counter() - started

    def judge(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return super().judge(*args, **kwargs)
        finally:
            self.inside += time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--goal", default="memory")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--budget", type=float, default=30.0)
    p.add_argument("--only", action="append", default=None)
    p.add_argument("--gpt2", action="store_true", help="GPT-2 small's shape instead of the demo")
    p.add_argument("--in-process", action="store_true")
    _device.add_argument(p)
    args = p.parse_args()
    device = _device.chosen(args, p).type
    if _device.ortmodule_missing():
        p.error(f"tune searches ORTModule's options: {_device.ortmodule_missing()}")
    kwargs = GPT2_SMALL if args.gpt2 else {}
    only = args.only or (["memory_opt_level", "plans"] if args.gpt2 else None)
    with tempfile.TemporaryDirectory() as out:
        session = Timed(None, kwargs, out=out, in_process=args.in_process)
        with session:
            started = time.perf_counter()
            result = tune(session, args.goal, args.budget, steps=args.steps, warmup=2, only=only, device=device,
                          on_progress=lambda e: print(f"[{time.perf_counter() - started:7.1f} s] {e['text']}",
                                                      file=sys.stderr, flush=True))
            wall = time.perf_counter() - started
        print(result)
        ratio = (wall - session.inside) / session.inside
        print(f"wall {wall:.1f} s, inside bursts and verdicts {session.inside:.1f} s, the search's own "
              f"{wall - session.inside:.2f} s: {100 * ratio:.2f}% of the bursts (target < {100 * TARGET:g}%), on "
              f"{_device.describe(device)}")
    print("meets the target" if ratio < TARGET else "misses the target")
    return 0 if ratio < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
