"""The result of a tuning: one row per setting measured (the baseline first), what was pruned and why, the strategy
and why, the best settings as Options, as `ORTMODULE_*` export lines and as the call that wraps a model with them;
a table, a pareto figure and tune.json in the tuning's folder (rewritten as the search goes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.options import Options
from ortlab.runs import clock
from ortlab.runs.run import RunStatus
from ortlab.tuning import measure
from ortlab.tuning.goals import BETTER, METRICS, MISSES, SAME, WORSE, Goals, decide, measured, score
from ortlab.tuning.space import Candidate, Pruned
from ortlab.verdict.judge import VerdictStatus

BASELINE = "baseline"
FILE = "tune.json"
DECIDED = (BETTER, SAME, WORSE, MISSES)
COLUMNS = ["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
           "memory_change_pct", "stash_mb", "rss_mb", "rss_change_pct", "inside_noise", "restart", "options",
           "reasons", "cause", "status", "run"]


@dataclass
class Tuning:
    """`table` (DataFrame), `best` (Options), `export_lines()`, `wrap_call()`, `pareto()`, `pruned`, `strategy`,
    `noise` (each metric's relative spread over the baseline's repeats), `notes`, `path` (its folder)."""

    goals: Goals
    path: Path
    budget_min: float
    base_options: Options = field(default_factory=Options)
    rows: list[dict[str, Any]] = field(default_factory=list)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)
    pruned: list[Pruned] = field(default_factory=list)
    strategy: Any = None
    noise: dict[str, float] = field(default_factory=dict)
    base_values: dict[str, float | None] = field(default_factory=dict)
    baseline_verdict: dict[str, Any] | None = None
    best_name: str | None = None
    stopped: bool = False
    stopped_during: str = ""  # where a Stop (Ctrl-C) ended the search
    budget_spent: bool = False
    elapsed_s: float = 0.0
    log: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # -- building

    def save_baseline(self, rows: list[dict[str, Any]]) -> None:
        """The baseline's row from its repeats (median figures) and the noise they show."""
        figures, self.noise = measure.baseline(rows)
        self.base_values = measure.metric_values(figures)
        row = {"candidate": BASELINE, "outcome": "baseline", "options": {}, "knobs": [], "restart": False,
               "status": RunStatus.OK, "repeats": len(rows), **figures}
        self.rows = [row, *self.rows[1:]] if self.rows else [row]
        row["reasons"] = [self._noise_words()]
        self.save()

    def add(self, row: dict[str, Any], candidate: Candidate) -> None:
        """Keep one measured candidate's row (tune.json rewritten)."""
        self.rows.append(row)
        self.candidates[candidate.name] = candidate
        self.save()

    def decide(self, row: dict[str, Any]) -> None:
        """Set an agreeing row's outcome, reasons and score against the baseline as measured so far."""
        values = measure.metric_values(row)
        outcome, reasons = decide(self.goals, self.base_values, values, self.noise)
        row.update(outcome=outcome, reasons=reasons, score=score(self.goals, self.base_values, values, self.noise))

    def winners(self) -> list[tuple[Candidate, dict[str, Any]]]:
        """The single candidates that agree and are better, best first."""
        found = [(self.candidates[r["candidate"]], r) for r in self.rows[1:]
                 if r.get("outcome") == BETTER and len(self.candidates[r["candidate"]].knobs) == 1]
        return sorted(found, key=lambda cr: -cr[1]["score"])

    def finish(self) -> None:
        """Choose the best (the best score among agreeing, better candidates; else the baseline) and the notes."""
        for row in self.rows[1:]:  # against the baseline's final figures and noise (confirmations add repeats)
            if row.get("verdict") == VerdictStatus.AGREE and row.get("outcome") in DECIDED:
                confirmed = [n for n in row["reasons"] if n.startswith(("confirmed", "not confirmed"))]
                self.decide(row)
                row["reasons"] += confirmed
        better = [r for r in self.rows[1:] if r.get("outcome") == BETTER]
        self.best_name = max(better, key=lambda r: r["score"])["candidate"] if better else BASELINE
        if self.baseline_verdict and self.baseline_verdict.get("verdict") == VerdictStatus.AGREE:
            self.notes.append("every setting is guarded by a parity burst (dropout off, compute optimizer off) "
                              "judged against one PyTorch parity burst: what ORT's compute optimizer changes is not "
                              "judged")
        if self.noise:
            self.notes.append(self._noise_words())
        if self.stopped:
            self.notes.append("stopped: the table holds what was measured before the Stop")

    # -- reading

    @property
    def best(self) -> Options:
        """The best settings found (the baseline's options when nothing beats it beyond its noise)."""
        for row in self.rows:
            if row["candidate"] == self.best_name:
                return self.base_options.replace(**row.get("options") or {})
        return self.base_options

    @property
    def improved(self) -> bool:
        """Whether a setting beats the baseline beyond its noise (and agrees)."""
        return self.best_name not in (None, BASELINE)

    @property
    def table(self):
        """One row per setting measured, the baseline first, with its changes as measured (percent) and the metrics
        whose change lies inside the baseline's noise (`inside_noise`: they count as no change)."""
        import pandas as pd

        rows = []
        for r in self.rows:
            row = {**r, "options": _text(r.get("options") or {}), "reasons": "; ".join(r.get("reasons") or [])}
            row.pop("timed_ms", None)
            inside = []
            for metric, name in (("time", "time_change_pct"), ("memory", "memory_change_pct"),
                                 ("rss", "rss_change_pct")):
                value = measured(self.base_values.get(metric), r.get(METRICS[metric][0]))
                row[name] = None if value is None else 100 * value
                if value is not None and value != 0 and abs(value) <= self.noise.get(metric, 0):
                    inside.append(metric)
            row["inside_noise"] = ", ".join(inside) if r["candidate"] != BASELINE else ""
            rows.append(row)
        df = pd.DataFrame(rows)
        return df.reindex(columns=[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)])

    def pruned_table(self):
        """What was not run, and why (DataFrame)."""
        import pandas as pd

        return pd.DataFrame([p.to_dict() for p in self.pruned], columns=["name", "reason"])

    def export_lines(self) -> str:
        """The shell lines that set the best options outside ortlab (empty when the defaults are best)."""
        return self.best.export_lines()

    def wrap_call(self) -> str:
        """The Python that trains a model with the best options in the user's own loop or Trainer (`ortlab.wrap`:
        ORTModule with these options, ortlab's fixes, fallback disabled)."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.best.to_dict().items())
        return "\n".join([
            f"model = ortlab.wrap(model, options=ortlab.Options({args}))",
            *(["# options read at import: ortlab.wrap sets them only before onnxruntime is imported; else export "
               "them before Python starts (export_lines())"]
              if any(c.restart for c in self.candidates.values() if c.name == self.best_name) else []),
        ])

    def pareto(self):
        """The pareto figure: step time against activation memory, the baseline marked, rejected settings greyed,
        the best ringed."""
        from ortlab.tuning.figures import pareto_figure

        return pareto_figure(self.table, self.best_name)

    def headline(self) -> str:
        """The answer in one line: the best setting and its changes, or that none beats the baseline's noise; for
        a stopped search, where it stopped, what was measured and what was not (never an answer it did not
        reach)."""
        if self.stopped:
            return f"stopped {self.stop_text()}"
        if not self.rows:
            return "nothing measured"
        objectives = " and ".join(self.goals.objectives)
        if self.improved:
            return f"best for {objectives}: {self.best_name} ({'; '.join(self._row(self.best_name)['reasons'])})"
        tried = sum(1 for r in self.rows[1:] if r.get("outcome") not in ("stopped", "failed"))
        return (f"no setting beats the baseline on {objectives} beyond its noise ({tried} measured; "
                f"{self._noise_words()})")

    def stop_text(self) -> str:
        """Where a stopped search stopped, what it measured and what it did not run ("during ...: measured ...;
        not run: ...")."""
        measured = [r for r in self.rows[1:] if r.get("outcome") not in ("stopped", None)]
        done = []
        if self.rows:
            repeats = self.rows[0].get("repeats", 0)
            done.append(f"the baseline ({repeats} burst{'s' if repeats != 1 else ''})")
        verdict = (self.baseline_verdict or {}).get("verdict")
        if verdict not in (None, VerdictStatus.NOT_JUDGED):
            done.append(f"its verdict ({verdict})")
        if measured:
            done.append(f"{len(measured)} candidate{'s' if len(measured) != 1 else ''} "
                        f"({', '.join(r['candidate'] for r in measured)})")
        if self.improved:
            done.append(f"the best of those: {self.best_name}")
        left = [] if verdict not in (None, VerdictStatus.NOT_JUDGED) else ["the baseline's verdict"]
        cut = [f"{r['candidate']} ({'; '.join(r.get('reasons') or [])})" for r in self.rows[1:]
               if r.get("outcome") == "stopped"]
        ran = {r["candidate"] for r in self.rows}
        if self.strategy is None:
            left.append("the candidates")
        else:
            rest = [c.name for c in self.strategy.order if c.name not in ran]
            if rest:
                left.append(f"{len(rest)} candidate{'s' if len(rest) != 1 else ''} ({', '.join(rest)})")
            if not any(len(self.candidates[r["candidate"]].knobs) > 1 for r in self.rows[1:]
                       if r["candidate"] in self.candidates):
                left.append("the combination of the winners")
        return (f"during {self.stopped_during or 'the search'}: measured {', '.join(done) or 'nothing'}"
                + (f"; cut short: {', '.join(cut)}" if cut else "") + f"; not run: {', '.join(left) or 'nothing'}")

    def lines(self) -> list[str]:
        """The tuning as text lines: headline, strategy, goals, table, rejections, pruned, notes, best settings."""
        out = [self.headline()]
        if self.strategy is not None:
            out.append(f"strategy: {self.strategy.name}: {self.strategy.reason}")
        out.append(f"goals: {self.goals}")
        cols = ["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
                "memory_change_pct", "rss_mb"]
        out.append(self.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        out += [f"rejected {r['candidate']}: {r['cause']}" for r in self.rows if r.get("outcome") == "rejected"]
        out += [f"pruned {p.name}: {p.reason}" for p in self.pruned]
        out += [f"note: {n}" for n in self.notes]
        if self.improved:
            out += ["best options: " + repr(self.best), "export lines:", self.export_lines(), "in Python:",
                    self.wrap_call()]
        out.append(f"folder: {self.path}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"Tuning({len(self.rows)} settings, best={self.best_name!r}, path={self.path})"

    def to_dict(self) -> dict[str, Any]:
        """The tuning as plain data (tune.json)."""
        return {"goals": self.goals.to_dict(), "budget_min": self.budget_min, "elapsed_s": self.elapsed_s,
                "base_options": self.base_options.to_dict(), "rows": self.rows, "noise": self.noise,
                "baseline_values": self.base_values, "baseline_verdict": self.baseline_verdict,
                "strategy": self.strategy.to_dict() if self.strategy is not None else None,
                "pruned": [p.to_dict() for p in self.pruned], "best": self.best_name,
                "best_options": self.best.to_dict(), "export_lines": self.export_lines(),
                "stopped": self.stopped, "stopped_during": self.stopped_during, "budget_spent": self.budget_spent,
                "notes": self.notes,
                "runs": {k: str(r.path) for k, r in self.runs.items()}, "log": self.log}

    def save(self) -> None:
        """Write tune.json into the tuning's folder (atomically: a reader never sees half of it)."""
        from ortlab.runs.run import write_json

        write_json(self.path / FILE, self.to_dict())

    def _row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["candidate"] == name)

    def _noise_words(self) -> str:
        parts = [f"{m} {_percent(v)}" for m, v in self.noise.items()]
        repeats = self.rows[0].get("repeats", 0) if self.rows else 0
        cpu = (self.rows[0].get("clock") if self.rows else None) == clock.CPU
        timed = (f"time: timed by {clock.said(clock.CPU)}, its steps' spread after warm-up and its repeats'" if cpu
                 else "time: timed by wall time, its steps' spread after warm-up, its repeats' and "
                 "the machine's load")
        return (f"the baseline's noise over {repeats} repeats ({timed}, 99 %; memory and rss: range / median): "
                f"{', '.join(parts)}; a change within it counts as none")


def _percent(value: float) -> str:
    return "beyond measure" if value >= 1000 else f"{100 * value:.1f}%"


def _text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())
