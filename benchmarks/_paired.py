"""Paired rounds, the figure most benchmarks here report (benchmarks/_turns.py interleaves finer, for two jobs that
can run at once): on a shared machine (these are 2-vCPU virtual machines)
the speed changes by 10-20% between minutes, more than the effects measured. So each round runs the two things
compared back to back (in alternating order, so that a trend in the load hits both alike) and gives their ratio;
the figure is the median of the rounds' ratios, printed with their range."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Paired:
    """The rounds of one comparison: what each side measured, and their ratios (ours over theirs)."""

    theirs: list[Any]
    ours: list[Any]
    ratios: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> str:
        return f"{min(self.ratios):.3f}-{max(self.ratios):.3f}"


def paired(rounds: int, theirs: Callable[[], Any], ours: Callable[[], Any],
           figure: Callable[[Any], float] = float, on_round: Callable[[int, Any, Any], None] | None = None) -> Paired:
    """Run `theirs` and `ours` once per round, `theirs` first in even rounds and `ours` first in odd ones; a
    round's ratio is figure(ours) / figure(theirs)."""
    out = Paired([], [], [])
    for i in range(rounds):
        if i % 2:
            mine = ours()
            other = theirs()
        else:
            other = theirs()
            mine = ours()
        out.theirs.append(other)
        out.ours.append(mine)
        out.ratios.append(figure(mine) / figure(other))
        if on_round:
            on_round(i, other, mine)
    return out


def verdict(ratios: dict[str, float], targets: dict[str, float], device: str | None = None) -> int:
    """Print whether every ratio meets its target (<=) and return the exit code: 0 if all do. With
    ORTLAB_BENCHMARK_RESULT set (scripts/gpu_check), also write them there as JSON (ratios, targets, device)."""
    misses = [f"{name} {ratios[name]:.3f} > {targets[name]}" for name in ratios if ratios[name] > targets[name]]
    print("meets the targets" if not misses else f"misses the target: {'; '.join(misses)}")
    if os.environ.get("ORTLAB_BENCHMARK_RESULT"):
        with open(os.environ["ORTLAB_BENCHMARK_RESULT"], "w", encoding="utf-8") as f:
            json.dump({"ratios": ratios, "targets": targets, "device": device}, f, indent=1)
    return 1 if misses else 0
