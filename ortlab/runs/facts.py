"""The facts a run's summary shows, each said once: the Run.summary() key it reads, its label and unit, how its value
is written, and when it applies (the device, a backend's output such as torch.compile's graph breaks, a collector's,
a distributed run's ranks). The CLI's tables, the report page and the Lab's results render these rows and keep only
how a cell looks in their medium; a fact added here appears in all of them. One spelling of a missing value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from ortlab.runs.run import RunStatus

MISSING = "—"  # a value that is not there, in every table ortlab shows (the CLI's, the report's, the Lab's)


def _always(summary: dict[str, Any]) -> bool:
    return True


def _cuda(summary: dict[str, Any]) -> bool:
    return summary.get("device") == "cuda"


def _not_cuda(summary: dict[str, Any]) -> bool:
    return summary.get("device") != "cuda"


def _stack(value: Any) -> str:
    """meta.json's "stack" ({"name", "python", "lock"}) as a person reads it: the stack and its lock file."""
    if not isinstance(value, dict) or not value.get("name"):
        return MISSING
    lock = value.get("lock")
    return f"{value['name']} ({PurePath(lock).name})" if lock else str(value["name"])


def _joined(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or MISSING
    return str(value)


def _ranks(value: Any) -> str:
    return str(len(value)) if isinstance(value, list | tuple) else str(value)


@dataclass(frozen=True)
class Fact:
    """One figure of a run. `key`: Run.summary()'s key (`part`: the key inside that value when it is a dict);
    `spec`: a format spec for numbers, "ms" (seconds written as milliseconds), "s" (as it is), or a function of the
    value; `applies`: whether the fact is one of this run's (a row is shown when it applies to one of the runs);
    `always`: shown even when every run lacks it (else only where one has it); `compared`: a figure of the backend
    itself, which a run that fell back to PyTorch cannot show; `instead`: the summary key whose words stand in
    for a missing value (why there is none); `sentence`: its text is a sentence (a text table says it on a line
    of its own under the rows)."""

    key: str
    label: str
    unit: str = ""
    spec: str | Callable[[Any], str] = "s"
    part: str | None = None
    applies: Callable[[dict[str, Any]], bool] = _always
    always: bool = False
    compared: bool = False
    instead: str | None = None
    sentence: bool = False

    @property
    def title(self) -> str:
        """The row's name with its unit: "median step (ms)"."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def value(self, summary: dict[str, Any]) -> Any:
        """This fact of a run's summary in the label's unit (milliseconds for "ms"); None when the run does not
        have it, the fact is not one of this run's, or the run fell back and the figure is its backend's."""
        if not self.applies(summary) or (self.compared and summary.get("status") == RunStatus.FALLBACK):
            return None
        value = summary.get(self.key)
        if self.part is not None:
            value = value.get(self.part) if isinstance(value, dict) else None
        if value is None or value in ([], {}, "") or (isinstance(value, float) and not math.isfinite(value)):
            return None
        return value * 1000 if self.spec == "ms" else value

    def held(self, summary: dict[str, Any]) -> bool:
        """Whether the run says something of this fact: its value, or why it has none."""
        return self.value(summary) is not None or bool(self.instead and self.applies(summary)
                                                       and summary.get(self.instead))

    def numeric(self) -> bool:
        """Whether the fact is a number (a medium may show it as one: right-aligned, to its own digits)."""
        return isinstance(self.spec, str) and (self.spec == "ms" or self.spec[-1:] in ("d", "f"))

    def text(self, summary: dict[str, Any]) -> str:
        """The fact as text, MISSING (or why it is missing) when the run does not have it."""
        value = self.value(summary)
        if value is None:
            why = summary.get(self.instead) if self.instead and self.applies(summary) else None
            return str(why) if why else MISSING
        if callable(self.spec):
            return self.spec(value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        if self.spec == "ms":
            return f"{value:.1f}"
        if self.spec == "s" or isinstance(value, str):
            return str(value)
        return format(value, self.spec)


FACTS: tuple[Fact, ...] = (
    Fact("status", "status", always=True),
    Fact("fixes", "fixes", spec=_joined),  # ortlab.compat's fixes applied
    Fact("steps", "steps", spec="d", always=True),
    Fact("final_loss", "final loss", spec=".4f", always=True),
    Fact("median_step_s", "median step", "ms", "ms", always=True, compared=True),  # by the clock below
    Fact("median_wall_s", "median step, wall time", "ms", "ms", compared=True),  # CPU: beside its CPU time
    Fact("step_clock", "step timed by"),  # ortlab.runs.clock: "CPU time" (its thread's) or "wall time"
    Fact("startup_s", "start-up", "s", ".2f", compared=True, instead="startup_note"),  # ORT's init, compile time
    Fact("peak_mem_mb", "peak resident set", "MB", ".0f", applies=_not_cuda, always=True),
    Fact("peak_mem_mb", "peak CUDA allocated", "MB", ".0f", applies=_cuda, always=True),
    Fact("peak_reserved_mb", "peak CUDA reserved", "MB", ".0f", applies=_cuda, always=True),
    Fact("saved_for_backward_mb", "kept for backward", "MB", ".2f", always=True, compared=True),
    Fact("activation_peak_mb", "activation peak", "MB", ".2f", always=True, compared=True),
    Fact("graph_breaks", "graph breaks", spec="d"),  # torch.compile (its compile.json)
    Fact("recompiles", "recompiles", spec="d"),
    Fact("ranks", "ranks", spec=_ranks),  # a distributed burst
    Fact("strategy", "strategy"),  # how its ranks shared the model: ddp, zero1, fsdp2 (ortlab.engine.ranks)
    Fact("in_sync", "in sync"),
    Fact("comm_share", "time in communication (of step)", spec=".1%"),  # rank 0's median (ortlab.engine.comm)
    Fact("rank_graphs", "same graphs on all ranks", part="identical"),
    Fact("imbalance", "load imbalance (max/mean)", spec=".3f", part="load"),  # ortlab.engine.balance
    Fact("imbalance", "ranks waited (of step)", spec=".1%", part="wait_share"),
    Fact("verdict", "verdict"),  # an ORTModule run judged against its PyTorch run
    Fact("busy", "busy machine", sentence=True),  # timings taken beside other work (ortlab.engine.machine)
    Fact("stack", "stack", spec=_stack),  # meta.json's "stack" (runs before it was recorded: missing)
)


def facts() -> tuple[Fact, ...]:
    """The facts, in the order every table shows them (read at each call: a fact added to FACTS is shown)."""
    return FACTS


def rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[Fact, list[str]]]:
    """The facts these runs' summaries show (one per column), each with its text per run: those that apply to one
    of the runs, and are either always shown or held by one of them."""
    out = []
    for fact in facts():
        if not any(fact.applies(s) for s in summaries):
            continue
        if fact.always or any(fact.held(s) for s in summaries):
            out.append((fact, [fact.text(s) for s in summaries]))
    return out


def title(key: str, summary: dict[str, Any] | None = None) -> str:
    """The label (with its unit) of the fact `key` for a run with this summary: "peak CUDA allocated (MB)" for a
    CUDA run's peak_mem_mb, "peak resident set (MB)" for a CPU run's."""
    summary = summary or {}
    return next((f.title for f in facts() if f.key == key and f.applies(summary)),
                next(f.title for f in facts() if f.key == key))


def text_table(summaries: Sequence[dict[str, Any]], headers: Sequence[str]) -> list[str]:
    """The rows as aligned text lines, a header line first (the CLI's table); a sentence's fact on a line of its own
    after them, per run that has it: "busy machine (pytorch): it waited for a core 46% of the time"."""
    found = rows(summaries)
    lines = [("", *headers)] + [(fact.title, *cells) for fact, cells in found if not fact.sentence]
    width = max(len(r[0]) for r in lines)
    cells = [max(12, *(len(r[i]) for r in lines)) for i in range(1, len(lines[0]))]
    out = ["  ".join([f"{r[0]:<{width}}", *(f"{c:>{w}}" for c, w in zip(r[1:], cells, strict=True))]) for r in lines]
    return out + [f"{fact.title}{f' ({header})' if len(headers) > 1 else ''}: {text}" for fact, texts in found
                  if fact.sentence for header, text, s in zip(headers, texts, summaries, strict=True) if fact.held(s)]


def frame(summaries: Sequence[dict[str, Any]], columns: Sequence[str]):
    """The rows as a DataFrame, one row per fact (its title as the index), one column per run: numbers as numbers
    in the label's unit, the rest as their text, None where a run lacks the fact (the Lab's results, their CSV)."""
    import pandas as pd

    def shown(fact: Fact, summary: dict[str, Any], text: str) -> Any:
        value = fact.value(summary)
        return value if fact.numeric() and value is not None else None if text == MISSING else text

    data = {fact.title: [shown(fact, s, text) for s, text in zip(summaries, texts, strict=True)]
            for fact, texts in rows(summaries)}
    return pd.DataFrame.from_dict(data, orient="index", columns=list(columns)) if data else pd.DataFrame()
