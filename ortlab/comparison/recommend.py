"""Which backend to train with, and why, from a comparison's plain figures: a backend is worth moving to only when
it trains the same model (its verdict agrees with PyTorch) and is faster per step beyond the noise of the step times
(`ortlab.comparison.speed`: the steps after warm-up, their spread, repeated bursts, the machine's load), and then the
start-up it costs is paid back after a number of steps. When the difference lies inside the noise it says so, with
about how many more steps would tell, instead of naming a winner. Otherwise: stay on PyTorch, with each other backend's
reason."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ortlab.comparison.speed import Ratio, Spread, clock_of, of_runs, ratio
from ortlab.engine.backends import REFERENCE, has, label
from ortlab.runs import clock
from ortlab.runs.run import RunStatus
from ortlab.verdict.judge import VerdictStatus

CANT_TELL = "can't tell at this length"


@dataclass(frozen=True)
class Recommendation:
    """`backend`: the one to train with ("pytorch" when none beats it, and while a difference cannot be told);
    `reason`: why, in words; `told`: False when the speed difference lies inside the noise ("can't tell");
    `break_even_steps`: after how many steps the recommended backend has paid back its start-up (None for PyTorch);
    `ratios`: each agreeing backend's step time over PyTorch's with its 99 % interval; `more_steps`: about how many
    more steps per backend would tell (None: told, or more steps would not)."""

    backend: str
    reason: str
    break_even_steps: int | None = None
    busy: bool = False  # timed on a busy machine: the speeds behind the choice are not representative
    told: bool = True
    more_steps: int | None = None
    ratios: dict[str, dict[str, Any]] | None = None
    labels: dict[str, str] | None = None  # each backend as named, where not label()'s (its stack and torch)
    where: str | None = None  # where each backend ran, in words (a comparison across stacks)
    clock: str | None = None  # the step time the speeds were judged by, in words (ortlab.runs.clock)

    @property
    def line(self) -> str:
        """The recommendation as the one line a summary ends with."""
        name = (self.labels or {}).get(self.backend) or label(self.backend)
        if not self.told:
            action = CANT_TELL
        else:
            action = "stay on PyTorch" if has(self.backend, "reference") else f"train with {name}"
        said = not self.told and self.more_steps is None and "busy" in self.reason  # the reason says it already
        by_cpu = self.clock == clock.said(clock.CPU)  # other processes' turns left out: a busy machine did not decide
        caveat = "; timed on a busy machine: measure again on a quiet one" if self.busy and not said and not by_cpu \
            else ""
        where = f" [{self.where}]" if self.where else ""
        timed = f"; timed by {self.clock}" if self.clock and self.ratios else ""
        return f"recommendation: {action}: {self.reason}{caveat}{timed}{where}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"line": self.line}


def recommend(summaries: dict[str, dict[str, Any]], verdicts: dict[str, str | None],
              spreads: dict[str, Spread | None] | None = None, labels: dict[str, str] | None = None,
              where: str | None = None) -> Recommendation:
    """What `_recommend` says, each backend named by `labels` where given (its stack and torch: a comparison
    across stacks), `where` (each backend's stack, in words) at the end of its line."""
    def name_of(backend: str) -> str:
        return (labels or {}).get(backend) or label(backend)

    found = _recommend(summaries, verdicts, spreads, name_of)
    timed = [s for s in (spreads or {}).values() if s is not None]
    if timed:  # the clock the spreads were measured by (spreads_of gives them one)
        device = next((s.get("device") for s in summaries.values() if s and s.get("device")), None)
        found = replace(found, clock=clock.said(clock.common(s.clock for s in timed), device))
    return replace(found, labels=labels, where=where) if labels or where else found


def _recommend(summaries: dict[str, dict[str, Any]], verdicts: dict[str, str | None],
               spreads: dict[str, Spread | None] | None, name_of: Any) -> Recommendation:
    """`summaries`: each backend's Run.summary() ("pytorch" and the others compared with it); `verdicts`: each
    other backend's verdict status (agree, diverged, not judged; None without one); `spreads`: each backend's step
    times after warm-up (`ortlab.comparison.speed.of_runs`; without one, the summary's median is taken as exact). The
    fastest backend beyond the noise among those that agree with PyTorch; "can't tell" when the fastest candidate's
    difference lies inside the noise; else PyTorch, with every other one's reason."""
    spreads = spreads or {}
    pytorch = summaries.get(REFERENCE) or {}
    busy = any((s or {}).get("busy") for s in summaries.values())
    base = _spread(pytorch, spreads.get(REFERENCE))
    if pytorch.get("status") != RunStatus.OK or base is None:
        return Recommendation(REFERENCE, "the PyTorch run, the reference, did not finish: nothing to compare with",
                              busy=busy)
    reasons, faster, unclear, ratios = [], [], [], {}
    for backend, summary in summaries.items():
        if has(backend, "reference"):
            continue
        name, summary = name_of(backend), summary or {}
        verdict = verdicts.get(backend)
        mine = _spread(summary, spreads.get(backend))
        if summary.get("status") != RunStatus.OK:
            status = summary.get("status") or "not run"
            reasons.append(f"{name} fell back to PyTorch" if status == RunStatus.FALLBACK
                           else f"{name}'s run: {status}")
        elif verdict != VerdictStatus.AGREE:
            reasons.append(f"{name} trains a different model (verdict: diverged)" if verdict == VerdictStatus.DIVERGED
                           else f"{name}'s numerics were not judged")
        elif mine is None:
            reasons.append(f"{name} has no step time")
        else:
            r = ratios[backend] = ratio(mine, base)
            startup = summary.get("startup_s") or 0.0
            if r.faster:
                faster.append((backend, r, startup, mine))
            elif r.slower:
                reasons.append(f"{name} is {r.value:.2f}x PyTorch's step time ({r.interval_text()}: slower)")
            else:
                unclear.append((backend, r))
    shown = {b: r.to_dict() for b, r in ratios.items()}
    if faster:
        backend, r, startup, mine = min(faster, key=lambda f: f[1].value)
        gain, slow_gain = base.median_s - mine.median_s, base.median_s * (1 - r.high)
        steps = max(1, math.ceil(startup / gain))
        worst = max(1, math.ceil(startup / slow_gain)) if slow_gain > 0 else None
        slow_end = f", at the interval's slow end {worst}" if worst is not None and worst != steps else ""
        return Recommendation(
            backend, f"{1 / r.value:.2f}x faster per step than PyTorch (step time {r.value:.2f}x, {_per_step(r)}), "
            f"same numerics (verdict: agree); its start-up ({startup:.1f} s) is paid back after {steps} steps"
            f"{slow_end}",
            break_even_steps=steps, busy=busy, ratios=shown)
    if unclear:
        backend, r = min(unclear, key=lambda u: u[1].value)
        name = name_of(backend)
        others = f"; {'; '.join(reasons)}" if reasons else ""
        return Recommendation(REFERENCE, f"{name} is {r.value:.2f}x PyTorch's step time, inside the noise "
                              f"({_per_step(r)}); {_more(r)}; until then PyTorch, which costs no start-up{others}",
                              busy=busy, told=False, more_steps=r.more_steps, ratios=shown)
    return Recommendation(REFERENCE, "; ".join(reasons) or "no other backend was compared", busy=busy, ratios=shown)


def spreads_of(runs: Sequence[Any], earlier: Sequence[Any] = ()) -> dict[str, Spread | None]:
    """Each backend's Spread from a comparison's runs, pooled with `earlier` identical runs of the same backend
    (`repeats`: the Lab passes its session's runs) and with the bursts ortlab ran to time it again
    (ortlab.comparison.drift), all by one clock: each step's CPU time where every run has it,
    else wall time (ortlab.runs.clock)."""
    from ortlab.comparison.drift import repeats_of

    pooled = {run.backend: [*(r for r in earlier if r is not run and r.backend == run.backend and same_burst(r, run)),
                            *repeats_of(run), run] for run in runs}
    chosen = clock.common(clock_of(same) for same in pooled.values())
    return {backend: of_runs(same, clock=chosen) for backend, same in pooled.items()}


def recommend_runs(runs: Sequence[Any], verdicts: dict[str, str | None], earlier: Sequence[Any] = ()
                   ) -> Recommendation:
    """The recommendation of a comparison's runs (PyTorch first), each backend's steps pooled with `earlier`
    identical bursts (what the CLI, `Comparison.recommendation()` and the Lab call)."""
    return recommend({r.backend: r.summary() for r in runs}, verdicts, spreads_of(runs, earlier))


def same_burst(a: Any, b: Any) -> bool:
    """Two runs of one backend are repeats of one burst: the same model, steps, options and settings (their names,
    seeds and output folders aside), both finished."""
    if a.status != RunStatus.OK or b.status != RunStatus.OK:
        return False
    def key(run: Any) -> tuple:
        config = {k: v for k, v in (run.meta.get("config") or {}).items() if k not in ("name", "out", "seed")}
        model = run.meta.get("model") or {}
        return config, model.get("factory"), model.get("name"), run.meta.get("effective_options")

    return bool(a.meta.get("config")) and key(a) == key(b)


def _spread(summary: dict[str, Any], given: Spread | None) -> Spread | None:
    if given is not None:
        return given
    step = summary.get("median_step_s")
    return Spread(step, summary.get("steps") or 1, 0.0) if step else None


def _per_step(r: Ratio) -> str:
    return f"{r.interval_text()}, {r.steps} steps after warm-up"


def _more(r: Ratio) -> str:
    if r.more_steps is not None:
        return f"about {r.more_steps} more steps per backend would tell"
    if 0.98 <= r.value <= 1.02:
        return "they run at the same speed for any purpose"
    if "busy" in r.fixed_by:
        return "more steps would not tell while other work takes the cores: the machine is busy, measure again on a " \
            "quiet one"
    return f"more steps would not tell while {r.fixed_by}"
