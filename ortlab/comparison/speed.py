"""How sure a step-time difference is: one noise model for `ortlab compare`'s recommendation, the Lab's Burst panel
and `ortlab tune`'s baseline, so that two identical bursts give the same answer or both say they cannot tell.

A burst's step time is the median of its steps after warm-up (the first steps build caches, allocate, compile). Its
uncertainty, on the log scale (a relative error, one standard error), adds three parts:

- **within**: the spread of its own steps: 1.4826 x the median absolute deviation of the log step times (a robust
  standard deviation), x 1.2533 (a median's standard error against a mean's) / sqrt(steps timed);
- **between**: the spread of repeated bursts' medians (their standard deviation on the log scale) / sqrt(bursts),
  when the same burst ran more than once (Tune repeats its baseline; the Lab keeps a session's earlier bursts; a
  comparison on the CPU times its reference again after the others: ortlab.comparison.drift); a backend timed in
  one burst takes the other side's, since the drift from one burst to the next is the machine's;
- **load**: for bursts timed by wall time (CUDA, ranks, and CPU runs recorded before a step's CPU time was), the
  share of the burst's time it waited for a core (other work on the machine; `engine.machine`), or, where that was
  not measured, the share a load average above the cores implies: other work could have taken a different share of
  the other burst. A step on the CPU on one thread is timed by its CPU time (`ortlab.runs.clock`: its thread's), which
  leaves the other work out: no load part, and the interval narrows as steps are added.

Two bursts' ratio (candidate / reference) has the 99 % interval exp(log ratio +- t x the root sum of squares of
both errors), t Student's quantile for the fewer steps timed (a 10-step burst times 8: t = 3.5; a 100-step one
2.6): two identical bursts then name opposite winners about once in 20,000 (the 95 % interval's z = 1.96 told a
difference between identical 10-step bursts one time in eleven). A difference is told only when that interval leaves
1; otherwise the steps that would tell it are estimated from the within-spread (which shrinks with more steps; the
other parts do not).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ortlab.runs.clock import CPU, WALL, column, common

LEVEL = 99  # the interval's coverage, percent
Z = 2.576  # its normal quantile (two-sided 99 %), the limit of `quantile` for many steps
# Student's t, two-sided 99 %, for 1..30 degrees of freedom
_T99 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977, 2.947,
        2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750)
ROBUST_SD = 1.4826  # a normal sample's standard deviation from its median absolute deviation
MEDIAN_SE = 1.2533  # a median's standard error over a mean's (normal data)
MAX_STEPS = 100_000  # beyond this many more steps the two backends run at the same speed for any purpose


def quantile(df: int) -> float:
    """Student's t for a two-sided 99 % interval with `df` degrees of freedom (beyond 30: within 0.003)."""
    return _T99[max(1, df) - 1] if df <= len(_T99) else Z + 5.2 / df


def warmup_of(steps: int) -> int:
    """The steps a burst of `steps` leaves out as warm-up: one in five, at least 1 and at most 3 (10 steps: 2)."""
    return min(3, max(1, steps // 5)) if steps > 1 else 0


@dataclass(frozen=True)
class Spread:
    """One backend's step time after warm-up: `median_s`, the steps timed (`steps`, over `bursts` bursts), and the
    relative errors of the median (log scale, one standard error): `within`, `between`, `load` (see the module)."""

    median_s: float
    steps: int
    within: float
    between: float = 0.0
    load: float = 0.0
    bursts: int = 1
    clock: str = WALL  # the step time it was measured by (ortlab.runs.clock: CPU or WALL)

    @property
    def error(self) -> float:
        """The median's whole relative error (log scale, one standard error)."""
        return math.sqrt(self.within ** 2 + self.between ** 2 + self.load ** 2)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"error": self.error}


def load_share(machine: dict[str, Any] | None) -> float:
    """The share of a burst's time other work on the machine could have taken: the measured wait for a core, or
    1 - cores / load average when the load was above the cores (runs that did not measure the wait), else 0."""
    machine = machine or {}
    if machine.get("cpu_wait") is not None:
        return max(0.0, min(1.0, float(machine["cpu_wait"])))
    cores, load = machine.get("cores"), machine.get("load")
    return max(0.0, 1.0 - cores / load) if cores and load else 0.0


def timed(step_times: Sequence[float], warmup: int | None = None) -> list[float]:
    """The step times after warm-up (`warmup_of` by default), positive and finite ones only."""
    skip = warmup_of(len(step_times)) if warmup is None else warmup
    return [float(t) for t in list(step_times)[skip:] if t is not None and math.isfinite(t) and t > 0]


def spread(bursts: Iterable[Sequence[float]], loads: Iterable[float] = (), warmup: int | None = None,
           clock: str = WALL) -> Spread | None:
    """The Spread of one backend from the step times of one or more identical bursts (each with its warm-up left
    out) and each burst's `load_share` (by the `clock` they were measured with); None when no step is left to
    time."""
    kept = [t for t in (timed(b, warmup) for b in bursts) if t]
    if not kept:
        return None
    pooled = [math.log(t) for b in kept for t in b]
    n = len(pooled)
    middle = statistics.median(pooled)
    mad = statistics.median(abs(x - middle) for x in pooled)
    within = MEDIAN_SE * ROBUST_SD * mad / math.sqrt(n) if n > 1 else math.inf
    medians = [math.log(statistics.median(b)) for b in kept]
    between = statistics.stdev(medians) / math.sqrt(len(medians)) if len(medians) > 1 else 0.0
    loads = list(loads)
    return Spread(math.exp(middle), n, within, between, max(loads, default=0.0), len(kept), clock)


def clock_of(runs: Sequence[Any]) -> str:
    """The clock runs can be judged by together (ortlab.runs.clock): their CPU time when every one has it."""
    return common(column(run.metrics) for run in runs)


def of_runs(runs: Sequence[Any], warmup: int | None = None, clock: str | None = None) -> Spread | None:
    """The Spread of identical runs of one backend (ortlab.runs.run.Run: their metrics' step times and machine), by
    `clock` (default: `clock_of(runs)`); the CPU time has no load part (other work is not in it)."""
    clock = clock or clock_of(runs)
    bursts, loads = [], []
    for run in runs:
        m = run.metrics
        if len(m) and clock in m:
            bursts.append(list(m[clock]))
            loads.append(0.0 if clock == CPU else load_share(run.meta.get("machine")))
    return spread(bursts, loads, warmup, clock)


@dataclass(frozen=True)
class Ratio:
    """A candidate's step time over the reference's: the `value`, its 99 % interval (`low`, `high`), whether the
    interval leaves 1 (`told`), and when it does not, about how many more steps per backend would tell
    (`more_steps`; None when more steps cannot: the load or the repeats' spread alone covers the difference)."""

    value: float
    low: float
    high: float
    told: bool
    more_steps: int | None
    steps: int  # the steps timed per backend (the fewer of the two)
    fixed_by: str = ""  # what more steps cannot shrink, in words, when it is most of the error


    @property
    def faster(self) -> bool:
        """The candidate is faster beyond the noise."""
        return self.told and self.high < 1.0

    @property
    def slower(self) -> bool:
        return self.told and self.low > 1.0

    def interval_text(self) -> str:
        return f"{LEVEL}% interval {times(self.low)}-{times(self.high)}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ratio(candidate: Spread, reference: Spread) -> Ratio:
    """The candidate's step time over the reference's, with its interval and the steps that would tell. A side
    timed in one burst takes the other's `between` where that one was timed in several (the machine's drift from
    burst to burst is the machine's, not a backend's: ortlab.comparison.drift)."""
    candidate, reference = drifted(candidate, reference), drifted(reference, candidate)
    log_ratio = math.log(candidate.median_s / reference.median_s)
    error = math.sqrt(candidate.error ** 2 + reference.error ** 2)
    steps = min(candidate.steps, reference.steps)
    if not math.isfinite(error):
        low, high = 0.0, math.inf
    else:
        t = quantile(steps - 1)
        low, high = math.exp(log_ratio - t * error), math.exp(log_ratio + t * error)
    told = math.isfinite(error) and (high < 1.0 or low > 1.0)
    loads = candidate.load ** 2 + reference.load ** 2
    betweens = candidate.between ** 2 + reference.between ** 2
    fixed_by = ("other work takes the cores (the machine is busy)" if loads >= betweens else
                "the machine's speed drifts from burst to burst (repeated bursts differ this much)")
    return Ratio(math.exp(log_ratio), low, high, told, None if told else more_steps(candidate, reference, log_ratio),
                 steps, fixed_by)


def drifted(one: Spread, other: Spread) -> Spread:
    """`one`, timed in a single burst, with `other`'s between-burst error where `other` has one; else `one`."""
    if one.bursts > 1 or other.bursts < 2 or one.between >= other.between:
        return one
    return replace(one, between=other.between)


def more_steps(candidate: Spread, reference: Spread, log_ratio: float) -> int | None:
    """About how many more steps per backend would make `log_ratio` leave the interval: the within-spread shrinks
    as 1/steps, the repeats' spread and the load do not, and the interval is the one `ratio` draws (Student's t for
    that many steps, not the normal quantile: with it, a 27-step burst was told "2 more" where 8 were needed).
    None when the fixed parts alone cover the difference."""
    fixed = candidate.between ** 2 + candidate.load ** 2 + reference.between ** 2 + reference.load ** 2
    if (log_ratio / Z) ** 2 - fixed <= 0:
        return None
    per_step = sum(s.within ** 2 * s.steps for s in (candidate, reference) if math.isfinite(s.within))
    if not all(math.isfinite(s.within) for s in (candidate, reference)):  # one step timed: its spread is unknown
        per_step = max(per_step, 2 * 0.1 ** 2)  # assume 10 % per step, a quiet machine's usual spread
    now = min(candidate.steps, reference.steps)

    def tells(n: int) -> bool:
        return quantile(n - 1) ** 2 * (per_step / n + fixed) < log_ratio ** 2

    high = now + 1
    while not tells(high):  # doubling, then halving: the fewest steps that tell
        if high > now + MAX_STEPS:
            return None
        high *= 2
    low = max(now, high // 2)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if tells(middle) else (middle, high)
    return _round(max(1, high - now))


def relative_noise(reference: Spread, one: Spread | None = None) -> float:
    """The relative change of a median that the noise covers (99 %): between the reference and one burst like it
    (`one`: the reference's own per-burst spread when not given). What Tune counts as 'no change'."""
    one = one or Spread(reference.median_s, max(1, reference.steps // max(1, reference.bursts)),
                        reference.within * math.sqrt(reference.bursts), reference.between * math.sqrt(reference.bursts),
                        reference.load)
    error = math.sqrt(reference.error ** 2 + one.error ** 2)
    return math.exp(quantile(one.steps - 1) * error) - 1.0 if math.isfinite(error) else math.inf


def times(value: float) -> str:
    """A ratio as a person reads it: "0.82x", "<0.01x", ">100x"."""
    return "<0.01x" if value < 0.01 else ">100x" if value > 100 else f"{value:.2f}x"


def _round(n: int) -> int:
    """A step count to two significant figures (an estimate: 'about 140 more steps', not 137)."""
    if n < 100:
        return n
    digits = 10 ** (len(str(n)) - 2)
    return int(math.ceil(n / digits) * digits)
