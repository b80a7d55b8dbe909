"""Goals in Olive's vocabulary, relative to the baseline, and the decision on each candidate, noise respected.

`--goal time` (or memory, both) names what to improve; a goal such as `time: percent-min-improvement 5` or
`memory: percent-max-degradation 10` adds a condition a candidate must meet (Olive's goal types: threshold,
min-improvement, max-degradation, percent-min-improvement, percent-max-degradation). Every metric is lower-is-
better. A difference within the spread of the repeated baseline measurements counts as no change: it improves
nothing and degrades nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ortlab.tuning.errors import TuneError

# metric -> (the measurement's column, unit, in words)
METRICS = {
    "time": ("median_step_ms", "ms", "median step time after warm-up"),
    "memory": ("activation_mb", "MB", "activation peak from ortlab's memory account"),
    "rss": ("rss_mb", "MB", "the process's peak resident set"),
}
OBJECTIVES = {"time": ("time",), "memory": ("memory",), "both": ("time", "memory")}
KINDS = ("threshold", "min-improvement", "max-degradation", "percent-min-improvement", "percent-max-degradation")
BETTER, SAME, WORSE, MISSES = "better", "no change", "worse", "misses a goal"
_GOAL = re.compile(r"^\s*(?P<metric>[a-z]+)\s*:\s*(?P<kind>[a-z-]+)\s*[= ]\s*(?P<value>[-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Goal:
    """One condition on one metric, relative to the baseline (threshold: absolute)."""

    metric: str
    kind: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric}: {self.kind} {self.value:g}"

    def met(self, base: float, candidate: float, noise: float) -> bool:
        """Whether `candidate` meets the goal against `base`; a difference within `noise` (relative) is none."""
        change = candidate - base
        if abs(change) <= noise * abs(base):
            change = 0.0
        percent = 100.0 * change / base if base else 0.0
        if self.kind == "threshold":
            return candidate <= self.value
        if self.kind == "min-improvement":
            return -change >= self.value and change < 0
        if self.kind == "max-degradation":
            return change <= self.value
        if self.kind == "percent-min-improvement":
            return -percent >= self.value and change < 0
        return percent <= self.value  # percent-max-degradation


@dataclass(frozen=True)
class Goals:
    """What to improve (`objectives`, in order) and the conditions every accepted candidate meets (`rules`)."""

    objectives: tuple[str, ...]
    rules: tuple[Goal, ...] = ()

    def __str__(self) -> str:
        return ", ".join([f"improve {' and '.join(self.objectives)}", *map(str, self.rules)])

    def to_dict(self) -> dict[str, Any]:
        return {"objectives": list(self.objectives), "rules": [str(r) for r in self.rules]}


def parse_goals(goals: str | Iterable[str] | Goals) -> Goals:
    """Goals from "time", "memory", "both" and Olive-style conditions ("time: percent-min-improvement 5"); a
    condition's metric becomes an objective when no word names one. Bad input: TuneError naming what is allowed."""
    if isinstance(goals, Goals):
        return goals
    items = [goals] if isinstance(goals, str) else list(goals)
    objectives: list[str] = []
    rules: list[Goal] = []
    for item in items:
        for text in str(item).split(","):
            text = text.strip()
            if text in OBJECTIVES:
                objectives += OBJECTIVES[text]
                continue
            rules.append(parse_goal(text))
    if not objectives:
        objectives = [r.metric for r in rules if r.kind != "percent-max-degradation" and r.kind != "max-degradation"]
    if not objectives:
        raise TuneError(f"goals {items!r} name nothing to improve; allowed: time, memory or both, with or without "
                        "conditions such as 'memory: percent-max-degradation 10'")
    return Goals(tuple(dict.fromkeys(objectives)), tuple(rules))


def parse_goal(text: str) -> Goal:
    allowed = ("allowed: time, memory, both, or 'METRIC: TYPE NUMBER' with METRIC one of "
               f"{', '.join(METRICS)} and TYPE one of {', '.join(KINDS)} (e.g. 'time: percent-min-improvement 5')")
    m = _GOAL.match(text)
    if not m:
        raise TuneError(f"goal {text!r} is not allowed; {allowed}")
    metric, kind = m["metric"], m["kind"]
    try:
        value = float(m["value"])
    except ValueError:
        value = math.nan
    if metric not in METRICS or kind not in KINDS or not math.isfinite(value):
        raise TuneError(f"goal {text!r} is not allowed; {allowed}")
    return Goal(metric, kind, value)


def change(base: float | None, candidate: float | None, noise: float) -> float | None:
    """The relative change (candidate - base) / base as decisions count it: 0.0 when it lies within the noise, None
    when unknown (`measured` gives the change as measured)."""
    relative = measured(base, candidate)
    return None if relative is None else 0.0 if abs(relative) <= noise else relative


def measured(base: float | None, candidate: float | None) -> float | None:
    """The relative change (candidate - base) / base as measured, None when unknown."""
    if base is None or candidate is None or not base or _nan(base) or _nan(candidate):
        return None
    return (candidate - base) / base


def decide(goals: Goals, base: Mapping[str, float | None], candidate: Mapping[str, float | None],
           noise: Mapping[str, float]) -> tuple[str, list[str]]:
    """The outcome of one agreeing candidate against the baseline (metric -> value of each, metric -> relative
    noise): better (an objective improved beyond the noise, none worse), no change, worse, or misses a goal;
    with the reasons in words."""
    reasons = []
    for rule in goals.rules:
        b, c = base.get(rule.metric), candidate.get(rule.metric)
        if b is None or c is None or _nan(b) or _nan(c):
            reasons.append(f"{rule}: not measured")
        elif not rule.met(b, c, noise.get(rule.metric, 0.0)):
            reasons.append(f"{rule}: not met ({_words(rule.metric, b, c)})")
    if reasons:
        return MISSES, reasons
    changes = {m: change(base.get(m), candidate.get(m), noise.get(m, 0.0)) for m in goals.objectives}
    words = [_words(m, base.get(m), candidate.get(m)) + (f" (within the baseline's noise, {_percent(noise.get(m))})"
                                                          if changes[m] == 0 else "") for m in goals.objectives]
    if any(v is None for v in changes.values()):
        return MISSES, [f"{m}: not measured" for m, v in changes.items() if v is None]
    if any(v > 0 for v in changes.values()):
        return WORSE, words
    if any(v < 0 for v in changes.values()):
        return BETTER, words
    return SAME, words


def score(goals: Goals, base: Mapping[str, float | None], candidate: Mapping[str, float | None],
          noise: Mapping[str, float]) -> float:
    """How much better a candidate is over the objectives: the sum of their relative improvements (noise: 0)."""
    return -sum(change(base.get(m), candidate.get(m), noise.get(m, 0.0)) or 0.0 for m in goals.objectives)


def _words(metric: str, base: float | None, candidate: float | None) -> str:
    unit = METRICS[metric][1]
    if base is None or candidate is None:
        return f"{metric}: not measured"
    percent = f" ({100 * (candidate - base) / base:+.1f}%)" if base else ""
    return f"{metric} {base:.3g} -> {candidate:.3g} {unit}{percent}"


def _percent(noise: float | None) -> str:
    """A relative noise in words: "+-12.3%", or "more than 1000x" for a burst too short to measure."""
    if noise is None or not math.isfinite(noise) or noise >= 1000:
        return "beyond measure at this length"
    return f"+-{100 * noise:.1f}%"


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
