"""What one burst measured, as the figures a goal is judged on, and the baseline's noise from its repeats.

Every figure comes from the run folder the burst wrote: the median step after warm-up (metrics.jsonl), the
activation peak and stash from ortlab's memory account (collector "memory": memory.json), and the process's peak
resident set (peak_mem_mb on the CPU; torch's allocator peak on CUDA).

The time noise is `ortlab.comparison.speed`'s, the one `ortlab compare`'s recommendation uses: the spread of the
baseline's steps after warm-up, of its repeats' medians and (for wall time) the machine's load, as the change between
the baseline and one burst like it that a 99 % interval covers. Steps on the CPU on one thread are timed by their CPU
time (ortlab.runs.clock: the thread's that runs them), so the noise is the model's, not other processes'. The
memory figures' noise is their repeats' range over their median (the account is exact: 0).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from ortlab.comparison import speed
from ortlab.runs import clock
from ortlab.runs.memory import MB
from ortlab.tuning.goals import METRICS

SAID = {clock.CPU: "CPU time, other processes excluded", clock.WALL: "wall time"}  # the clock, in the warning
QUIET_SPREAD = 0.05  # a quiet CPU's spread of step times (log scale): what `resolvable` assumes before measuring

COLLECT = {"memory": {}}  # every measured burst: its activation-memory account


def figures(run: Any, warmup: int) -> dict[str, Any]:
    """{median_step_ms, activation_mb, stash_mb, rss_mb, exact, steps_timed, timed_ms, clock, device, load} of a burst
    (None: not measured; `timed_ms`: the step times after warm-up by `clock` (ortlab.runs.clock: each step's CPU
    time on the CPU, else wall time), `load`: the share of its time other work took where wall time counts it)."""
    m = run.metrics
    timed = m.iloc[warmup:] if len(m) > warmup else m.iloc[0:0]
    judged = clock.column(m)  # each step's CPU time on the CPU (other processes excluded), else wall time
    times = [round(float(t) * 1000, 4) for t in timed[judged]] if len(timed) else []
    memory = run.memory or {}
    peak, stash = memory.get("peak_activation_bytes"), memory.get("stashed_bytes")
    return {"median_step_ms": float(timed[judged].median() * 1000) if len(timed) else None,
            "activation_mb": None if peak is None else peak / MB,
            "stash_mb": None if stash is None else stash / MB,
            "rss_mb": float(m["peak_mem_mb"].max()) if len(m) and "peak_mem_mb" in m else None,
            "exact": bool(memory.get("exact", not memory.get("uncertain"))) if peak is not None else None,
            "steps_timed": len(timed), "timed_ms": times, "clock": judged, "device": run.meta.get("device"),
            "load": 0.0 if judged == clock.CPU else speed.load_share(run.meta.get("machine"))}


def metric_values(row: dict[str, Any]) -> dict[str, float | None]:
    """{metric: value} of a row of figures (the goals' view of it)."""
    return {metric: row.get(column) for metric, (column, _, _) in METRICS.items()}


def baseline(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    """The baseline's figures (the median of its repeats) and each metric's noise: time's from
    `ortlab.comparison.speed` (see the module), the others' their repeats' range over their median. One repeat has no
    measured range: 0."""
    merged: dict[str, Any] = {}
    noise: dict[str, float] = {}
    for key in ("median_step_ms", "activation_mb", "stash_mb", "rss_mb"):
        values = [r[key] for r in rows if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
    merged["exact"] = all(r.get("exact") for r in rows) if rows else None
    merged["steps_timed"] = sum(r.get("steps_timed", 0) for r in rows)
    merged["clock"] = clock_of(rows)
    for metric, (column, _, _) in METRICS.items():
        values = [r[column] for r in rows if r.get(column) is not None]
        middle = statistics.median(values) if values else None
        noise[metric] = (max(values) - min(values)) / middle if len(values) > 1 and middle else 0.0
    spread = time_spread(rows)
    if spread is not None:
        noise["time"] = min(speed.relative_noise(spread), 1e6)
    return merged, noise


def time_spread(rows: Sequence[dict[str, Any]]) -> speed.Spread | None:
    """The Spread of the baseline's step times after warm-up, over its repeats (rows without `timed_ms`: None)."""
    bursts = [r["timed_ms"] for r in rows if r.get("timed_ms")]
    return speed.spread(bursts, [r.get("load") or 0.0 for r in rows if r.get("timed_ms")], warmup=0,
                        clock=clock_of(rows)) if bursts else None


def clock_of(rows: Sequence[dict[str, Any]]) -> str:
    """The clock the rows' times were taken by (rows of runs recorded before a step's CPU time: wall time)."""
    return clock.common(r.get("clock") or clock.WALL for r in rows if r.get("timed_ms"))


def resolvable(timed: int, repeats: int, spread: float = QUIET_SPREAD) -> float:
    """The smallest relative time change `timed` steps per burst can tell against `repeats` baseline bursts, with
    the steps spread by `spread` (log scale) and nothing else on the machine (math.inf: none)."""
    if timed < 2:
        return math.inf
    per_step = speed.MEDIAN_SE * spread
    one = speed.Spread(1.0, timed, per_step / math.sqrt(timed))
    base = speed.Spread(1.0, timed * repeats, per_step / math.sqrt(timed * repeats), bursts=repeats)
    return speed.relative_noise(base, one)


def steps_for(rows: Sequence[dict[str, Any]], target: float) -> int | None:
    """About how many timed steps per burst would bring the measured time noise down to `target` (relative), or None
    when more steps cannot (the machine's load or the repeats' spread alone is more)."""
    spread = time_spread(rows)
    if spread is None or not math.isfinite(spread.within):
        return None
    k = spread.bursts
    per_step = spread.within ** 2 * spread.steps  # one step's share of a median's variance (log scale)
    fixed = 2 * spread.load ** 2 + spread.between ** 2 * k * (1 + 1 / k)
    room = (math.log1p(target) / speed.Z) ** 2 - fixed
    if room <= 0:
        return None
    return max(1, math.ceil(per_step * (1 / k + 1) / room))


def times(goals: Any) -> bool:
    """Whether the goals judge the step time (an objective or a condition on it)."""
    return "time" in goals.objectives or any(r.metric == "time" for r in goals.rules)


def steps_check(goals: Any, steps: int, warmup: int, repeats: int) -> list[str]:
    """Before anything runs: TuneError when the steps left after warm-up cannot tell any time change (fewer than 3:
    Student's t for one degree of freedom is 64), else a warning when even a quiet machine could not tell a change
    under 20 % (none, or for a goal that does not judge time)."""
    from ortlab.tuning.errors import TuneError

    if not times(goals):
        return []
    timed = steps - warmup
    if timed < 3:
        raise TuneError(f"steps {steps} with warm-up {warmup} leave {timed} timed step{'s' * (timed != 1)}: too few "
                        f"to tell any time change; allowed: steps >= warmup + 3 ({warmup + 3}) for a time goal, "
                        f"{warmup + 6} or more to tell changes of about 10 %")
    finest = resolvable(timed, repeats)
    if finest <= 0.20:
        return []
    return [f"steps {steps} with warm-up {warmup} time {timed} steps per burst: even on a quiet machine a time change "
            f"under about {100 * finest:.0f}% counts as none; more steps tell finer changes"]


def noise_check(goals: Any, rows: Sequence[dict[str, Any]], noise: dict[str, float]) -> list[str]:
    """After the baseline: a warning when its measured time noise is over 20 %, with the steps that would bring it
    to 10 % (or that more steps would not: the machine's load or the repeats' spread)."""
    value = noise.get("time", 0.0)
    if not times(goals) or value <= 0.20:
        return []
    shown = "more than 1000x" if value >= 1000 else f"{100 * value:.0f}%"
    steps = steps_for(rows, 0.10)
    more = (f"about {steps} timed steps per burst would bring it to 10 %" if steps is not None else
            "more steps would not bring it down: other work on the machine or the repeats' spread is most of it; "
            "tune on a quieter machine")
    timed = clock_of(rows)
    if timed == clock.WALL and any(r.get("device") == "cpu" for r in rows):  # benchmarks/step_clock.py
        more += ("; on a shared CPU, threads=1 (--threads 1) times each step by its CPU time, "
                 "which other processes do not count")
    return [f"the baseline's step time noise is {shown} (timed by {SAID[timed]}): a time change smaller than "
            f"that counts as none ({more})"]
