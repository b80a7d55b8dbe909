"""Which backend to train with, and why, from a comparison's plain figures: a backend is worth moving to only when
it trains the same model (its verdict agrees with PyTorch) and is faster per step, and then the start-up it costs
is paid back after a number of steps. Otherwise: stay on PyTorch, with each other backend's reason."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ortlab.engine.backends import has

NAMES = {"pytorch": "PyTorch", "ortmodule": "ORTModule", "compile": "torch.compile"}


@dataclass(frozen=True)
class Recommendation:
    """`backend`: the one to train with ("pytorch" when none beats it); `reason`: why, in words;
    `break_even_steps`: after how many steps the recommended backend has paid back its start-up (None for PyTorch)."""

    backend: str
    reason: str
    break_even_steps: int | None = None
    busy: bool = False  # timed on a busy machine: the speeds behind the choice are not representative

    @property
    def line(self) -> str:
        """The recommendation as the one line a summary ends with."""
        name = NAMES.get(self.backend, self.backend)
        action = "stay on PyTorch" if has(self.backend, "reference") else f"train with {name}"
        caveat = "; timed on a busy machine: measure again on a quiet one" if self.busy else ""
        return f"recommendation: {action}: {self.reason}{caveat}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"line": self.line}


def recommend(summaries: dict[str, dict[str, Any]], verdicts: dict[str, str | None]) -> Recommendation:
    """`summaries`: each backend's Run.summary() ("pytorch" and the others compared with it); `verdicts`: each
    other backend's verdict status (agree, diverged, not judged; None without one). The fastest backend after
    start-up among those that agree with PyTorch and beat it per step; else PyTorch, with every other one's reason."""
    pytorch = summaries.get("pytorch") or {}
    busy = any((s or {}).get("busy") for s in summaries.values())
    base = pytorch.get("median_step_s")
    if pytorch.get("status") != "ok" or not base:
        return Recommendation("pytorch", "the PyTorch run, the reference, did not finish: nothing to compare with",
                              busy=busy)
    reasons, best = [], None
    for backend, summary in summaries.items():
        if has(backend, "reference"):
            continue
        name, summary = NAMES.get(backend, backend), summary or {}
        step, verdict = summary.get("median_step_s"), verdicts.get(backend)
        if summary.get("status") != "ok":
            status = summary.get("status") or "not run"
            reasons.append(f"{name} fell back to PyTorch" if status == "fallback" else f"{name}'s run: {status}")
        elif verdict != "agree":
            reasons.append(f"{name} trains a different model (verdict: diverged)" if verdict == "diverged"
                           else f"{name}'s numerics were not judged")
        elif not step or step >= base:
            reasons.append(f"{name} is {step / base:.2f}x PyTorch's step time (no faster)" if step
                           else f"{name} has no step time")
        else:
            gain = base - step
            steps = max(1, math.ceil((summary.get("startup_s") or 0.0) / gain))
            if best is None or gain > best[1]:
                best = (backend, gain, steps, base / step, summary.get("startup_s") or 0.0)
    if best is None:
        return Recommendation("pytorch", "; ".join(reasons) or "no other backend was compared", busy=busy)
    backend, _gain, steps, speedup, startup = best
    return Recommendation(
        backend, f"{speedup:.2f}x faster per step than PyTorch, same numerics (verdict: agree); its start-up "
        f"({startup:.1f} s) is paid back after {steps} steps", break_even_steps=steps, busy=busy)
