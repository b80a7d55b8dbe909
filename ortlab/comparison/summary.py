"""PyTorch beside the other backends (ORTModule, torch.compile) of the same snapshot and steps: the numbers a
person compares first, the verdict on each, and which backend to train with."""

from __future__ import annotations

import math
from typing import Any

from ortlab.engine.backends import BACKENDS, REFERENCE, has, registered
from ortlab.runs import facts
from ortlab.runs.run import Run, RunStatus

OTHERS = tuple(b for b in BACKENDS if b != REFERENCE)  # what PyTorch is compared with, in this order
# What a run that fell back to PyTorch cannot show of ORTModule (its figures would be PyTorch's under its name).
_COMPARED = ("median_step_s", "ort_init_s", "startup_s", "saved_for_backward_mb", "activation_peak_mb")


class Comparison:
    """The runs of one comparison, held by backend name. `Comparison(pt, ort)` (runs by position in the registry's
    order: PyTorch, ORTModule, torch.compile), `Comparison(pytorch=pt, compile=c)` or `Comparison(runs={...})`.
    `backends`: asked for, in order (by default the backends given; by position: at least PyTorch and the next). A
    backend's run is None when it was not asked for or the comparison was stopped before it ran; `c.<backend>`
    (`c.pytorch`, `c.ortmodule`, `c.compile`) is `c.run("<backend>")`."""

    def __init__(self, *positional: Run | None, backends: tuple[str, ...] | None = None,
                 runs: dict[str, Run | None] | None = None, stacks: dict[str, dict[str, str]] | None = None,
                 **named: Run | None):
        if len(positional) > len(BACKENDS):
            raise TypeError(f"Comparison takes at most {len(BACKENDS)} runs by position ({', '.join(BACKENDS)})")
        given = {**dict(zip(BACKENDS, positional, strict=False)), **(runs or {}), **named}
        for name in given:
            registered(name)  # an unknown name raises naming the backends, with a suggestion
        if backends is None:
            shown = max(2, len(positional)) if positional else 0  # Comparison(pt): PyTorch and ORTModule
            backends = tuple(b for i, b in enumerate(BACKENDS) if i < shown or b in given)
        self._given = given  # every run given, by backend (`run` finds one not asked for too)
        self.backends: tuple[str, ...] = tuple(backends)
        # a comparison across stacks (ortlab.comparison.cross_stack): each backend's {"stack", "torch"}; None: one
        # process
        self.stacks = stacks

    def label_of(self, backend: str) -> str:
        """A backend as its column names it: with its stack and torch in a comparison across stacks."""
        from ortlab.engine.backends import label

        where = (self.stacks or {}).get(backend)
        return label(backend) if where is None else f"{label(backend)} @{where['stack']} (torch {where['torch']})"

    def stacks_line(self) -> str | None:
        """Where each backend ran, in words (None in one process): "PyTorch and ORTModule on the ort stack (torch
        2.6.0), torch.compile on the current stack (torch 2.14.1)"."""
        if not self.stacks:
            return None
        from ortlab.engine.backends import label

        groups: dict[tuple[str, str], list[str]] = {}
        for backend in self.backends:
            where = self.stacks[backend]
            groups.setdefault((where["stack"], where["torch"]), []).append(label(backend))
        return ", ".join(f"{' and '.join(names)} on the {stack} stack (torch {torch})"
                         for (stack, torch), names in groups.items())

    def __getattr__(self, name: str) -> Run | None:
        if name in BACKENDS:  # c.pytorch, c.ortmodule, c.compile: a backend's run
            return self.run(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        runs = ", ".join(f"{b}={r.path.name if r is not None else None!r}" for b, r in self.by_backend.items())
        return f"Comparison({runs})"

    @property
    def by_backend(self) -> dict[str, Run | None]:
        """Each asked-for backend's run (None: not run), in the order of `backends`."""
        return {b: self.run(b) for b in self.backends}

    @property
    def reference(self) -> Run:
        """The reference backend's run (PyTorch's), which every other one is compared with."""
        return self.run(REFERENCE)

    @property
    def runs(self) -> list[Run]:
        """The runs that exist, in the order of `backends`."""
        return [r for r in self.by_backend.values() if r is not None]

    def run(self, backend: str) -> Run | None:
        """The run of `backend`, or None (not asked for, not run, or not a backend)."""
        return self.__dict__.get("_given", {}).get(backend)

    @property
    def others(self) -> list[str]:
        """The backends compared with PyTorch."""
        return [b for b in self.backends if b != REFERENCE]

    @property
    def headline(self) -> str | None:
        """The compared backend whose figures lead the comparison's (`verdict`, `not_compared`, to_dict's top):
        the first with ONNX stages (ORTModule), as ortlab has always given them; None without one."""
        return next((b for b in self.others if has(b, "onnx_stages")), None)

    def losses(self):
        """The loss per step (DataFrame), one column per backend, and each other backend's absolute difference from
        PyTorch (`abs_diff`: ORTModule's, `compile_diff`: torch.compile's)."""
        import pandas as pd

        columns = {}
        for backend in self.backends:
            run = self.run(backend)
            columns[backend] = (run.metrics.set_index("step")["loss"] if run is not None and len(run.metrics)
                                else pd.Series(dtype=float))
        df = pd.DataFrame(columns)
        for backend in self.others:
            df[_diff_column(backend)] = (df[REFERENCE] - df[backend]).abs()
        return df

    def verdict_of(self, backend: str):
        """The Verdict on a backend's run against PyTorch's (Session.judge wrote it into that run's folder)."""
        from ortlab.verdict.judge import FILE, Verdict

        run = self.run(backend)
        data = run.read_json(FILE) if run is not None else None
        return Verdict.from_dict(data) if data else None

    @property
    def verdict(self):
        """The Verdict on ORTModule's run (agree or diverged, the evidence and the causes); None without one."""
        return self.verdict_of(self.headline) if self.headline else None

    def not_compared_of(self, backend: str) -> str | None:
        """Why a backend's run is not compared with PyTorch's: it fell back to PyTorch (its numbers are
        PyTorch's)."""
        run = self.run(backend)
        if run is not None and run.status == RunStatus.FALLBACK:
            return f"the {backend} run is a PyTorch run ({run.error})"
        return None

    @property
    def not_compared(self) -> str | None:
        """Why ORTModule's run is not compared with PyTorch's (it fell back), or None."""
        return self.not_compared_of(self.headline) if self.headline else None

    def versus(self, backend: str) -> dict[str, Any]:
        """A backend against PyTorch: the largest loss difference, the step-time and memory ratios, its start-up,
        and its verdict; none of the comparisons when it did not really run on that backend."""
        pt, run = self.reference.summary(), self.run(backend)
        other = run.summary() if run is not None else {}
        losses = self.losses().dropna(subset=[backend]) if run is not None else None
        column = _diff_column(backend)
        out: dict[str, Any] = {"max_loss_diff": None, "step_time_ratio": None, "saved_for_backward_ratio": None,
                               "startup_s": other.get("startup_s")}
        if self.not_compared_of(backend):
            out["not_compared"] = self.not_compared_of(backend)
            out["startup_s"] = None
        elif run is not None:
            diffs = losses[column].dropna()
            out["max_loss_diff"] = float(diffs.max()) if len(diffs) else None
            if pt.get("median_step_s") and other.get("median_step_s"):
                out["step_time_ratio"] = other["median_step_s"] / pt["median_step_s"]
            if pt.get("saved_for_backward_mb") and other.get("saved_for_backward_mb") is not None:
                out["saved_for_backward_ratio"] = other["saved_for_backward_mb"] / pt["saved_for_backward_mb"]
        verdict = self.verdict_of(backend)
        out["verdict"] = verdict.to_dict() if verdict is not None else None
        return out

    def to_dict(self) -> dict[str, Any]:
        """The comparison as plain data: each backend's summary and path, each backend against PyTorch (`versus`),
        ORTModule's figures at the top (`ortlab burst --json`)."""
        out: dict[str, Any] = {"backends": list(self.backends)}
        if self.stacks:
            out["stacks"] = self.stacks
        for backend in self.backends:
            run = self.run(backend)
            summary = run.summary() if run is not None else {"backend": backend, "status": "not run"}
            if self.not_compared_of(backend):
                summary = {k: v for k, v in summary.items() if k not in _COMPARED}
            out[backend] = {**summary, "path": str(run.path) if run is not None else None}
        versus = {b: self.versus(b) for b in self.others}
        out["versus"] = versus
        top = self.headline  # ORTModule's figures at the top, as ortlab has always given them
        ort = versus.get(top) or {}
        out.update(max_loss_diff=ort.get("max_loss_diff"), step_time_ratio=ort.get("step_time_ratio"),
                   ort_init_s=None if ort.get("not_compared") or not top else out[top].get("ort_init_s"),
                   saved_for_backward_ratio=ort.get("saved_for_backward_ratio"), verdict=ort.get("verdict"),
                   parity=bool(self.reference.meta.get("config", {}).get("parity")))
        if ort.get("not_compared"):
            out["not_compared"] = ort["not_compared"]
        for run in self.runs:
            if run.error or run.meta.get("warning"):
                out.setdefault("problems", []).append(f"{run.backend}: {run.error or run.meta['warning']}")
        return out

    def decision(self, earlier=()):
        """Which backend to train with, as a table: per backend its status, speed after warm-up (median step, and
        the step time against PyTorch's with its 99 % interval: `ortlab.comparison.speed`), start-up cost, the steps
        after which it has made its start-up back against PyTorch ("can't tell" while the difference is inside the
        noise), memory, numerics (the verdict) and what failed. `earlier`: identical runs pooled with these."""
        import pandas as pd

        from ortlab.comparison.recommend import spreads_of
        from ortlab.comparison.speed import ratio, times

        spreads = spreads_of(self.runs, earlier)
        base = spreads.get(REFERENCE)
        where = {"device": self.reference.meta.get("device")}  # one device's labels for every column
        rows = []
        for backend in self.backends:
            run = self.run(backend)
            s = run.summary() if run is not None else {"status": "not run"}
            reference = has(backend, "reference")
            verdict = self.verdict_of(backend) if not reference else None
            mine, startup = spreads.get(backend), s.get("startup_s") or 0.0
            compared = not reference and run is not None and s.get("status") == RunStatus.OK and mine and base
            r = ratio(mine, base) if compared else None
            if r is None:
                even = vs = None
            else:
                vs = f"{times(r.value)} ({times(r.low)}-{times(r.high)})"
                gain = base.median_s - mine.median_s
                even = ("can't tell" if not r.told else "never (slower)" if gain <= 0 or r.slower
                        else f"{math.ceil(startup / gain):d}")
            shown = backend if not self.stacks else f"{backend}@{self.stacks[backend]['stack']}"
            rows.append({"backend": shown, "status": s.get("status"),
                         "median step after warm-up (ms)": None if mine is None or s.get("status") == RunStatus.FALLBACK
                         else mine.median_s * 1000,
                         "step time vs PyTorch (99% interval)": vs,
                         facts.title("startup_s"): s.get("startup_s"), "steps to break even": even,
                         facts.title("saved_for_backward_mb"): s.get("saved_for_backward_mb"),
                         facts.title("peak_mem_mb", where): s.get("peak_mem_mb"),
                         "numerics": "reference" if reference else
                         (verdict.headline if verdict is not None else "not judged"),
                         "failed": (run.error if run is not None and s.get("status") != RunStatus.OK else None)})
        return pd.DataFrame(rows)

    def recommendation(self, earlier=()):
        """Which backend to train with and why (ortlab.comparison.recommend.Recommendation): faster beyond the noise
        after N steps with the same numerics, "can't tell at this length" with the steps that would tell, or stay on
        PyTorch with each other backend's reason. `earlier`: identical runs (a session's) pooled with these."""
        from ortlab.comparison.recommend import recommend, spreads_of

        summaries = {b: (r.summary() if (r := self.run(b)) is not None else {"status": "not run"})
                     for b in self.backends}
        return recommend(summaries, {b: v.status if (v := self.verdict_of(b)) else None for b in self.others},
                         spreads_of(self.runs, earlier),
                         labels={b: self.label_of(b) for b in self.backends} if self.stacks else None,
                         where=self.stacks_line())

    def __str__(self) -> str:
        d = self.to_dict()

        def fmt(value, spec=".4f"):
            return facts.MISSING if value is None else format(value, spec)

        backends = list(self.backends)
        lines = table(d, backends, cuda=self.reference.meta.get("device") == "cuda",
                      headers=[self.label_of(b) for b in backends] if self.stacks else None)
        from ortlab.verdict.judge import Verdict, loss_note

        for backend in self.others:
            versus = d["versus"][backend]
            name = "" if self.others == [self.headline] else f"{backend} "
            if versus.get("verdict"):
                lines += [f"{name}verdict: {line}" if i == 0 else line
                          for i, line in enumerate(Verdict.from_dict(versus["verdict"]).lines())]
            if versus.get("not_compared"):
                lines.append(f"{name}loss difference, step time ratio, memory: not compared: {versus['not_compared']}")
            elif has(backend, "onnx_stages"):  # ORTModule's lines, as ortlab has always printed them
                lines.append(f"max |loss difference| {fmt(versus['max_loss_diff'], '.3g')}"
                             f"{loss_note(versus.get('verdict'))}")
                lines.append(f"step time ratio ({backend} / {REFERENCE}, median after step 0) "
                             f"{fmt(versus['step_time_ratio'], '.2f')}")
                lines.append(f"ORT init overhead {fmt(d['ort_init_s'], '.2f')} s")
            else:
                lines.append(f"{backend}: max |loss difference| {fmt(versus['max_loss_diff'], '.3g')}"
                             f"{loss_note(versus.get('verdict'))}, step time "
                             f"ratio ({backend} / {REFERENCE}) {fmt(versus['step_time_ratio'], '.2f')}, start-up "
                             f"{fmt(versus['startup_s'], '.2f')} s")
        lines += _memory_lines(d, backends)
        if not d["parity"]:
            lines.append("not in parity mode: dropout and ORT's compute optimizer can make losses differ "
                         "(use --parity)")
        for problem in d.get("problems", []):
            lines.append(f"problem: {problem}")
        lines.append("runs: " + "\n      ".join(_shown(r.path) for r in self.runs))
        return "\n".join(lines)


def _diff_column(backend: str) -> str:
    """A backend's loss-difference column: `abs_diff` for ORTModule, the backend with ONNX stages (its name since
    the first release)."""
    return "abs_diff" if has(backend, "onnx_stages") else f"{backend}_diff"


def table(summaries: dict[str, dict[str, Any]], backends: list[str], cuda: bool = False,
          headers: list[str] | None = None) -> list[str]:
    """The lines of the table every burst summary starts with: one labelled row per fact (ortlab.runs.facts), one
    column per backend (`summaries`: each backend's Run.summary()), for one backend or several alike. `cuda`: the
    device of a summary that does not name its own. `headers`: the columns' names when not the backends' (a
    comparison across stacks names each one's stack and torch)."""
    device = "cuda" if cuda else "cpu"
    shown = [{**summaries[b], "device": summaries[b].get("device") or device} for b in backends]
    return facts.text_table(shown, headers or backends)


def run_text(run: Run) -> str:
    """A burst of one backend as text: the same labelled table as a comparison's (one column), ORT's start-up,
    what the memory rows count, problems, and the run folder."""
    s = run.summary()
    lines = table({run.backend: s}, [run.backend], cuda=run.meta.get("device") == "cuda")
    if s.get("ort_init_s") is not None:
        lines.append(f"ORT init overhead {s['ort_init_s']:.2f} s")
    if s.get("hazards"):
        lines.append(f"export hazards: {s['hazards']} (the exporter's warnings, in meta.json)")
    if s.get("damaged_metrics_lines"):
        lines.append(f"damaged metrics lines (skipped): {s['damaged_metrics_lines']}")
    lines += _memory_lines({run.backend: s}, [run.backend])
    if run.error or run.meta.get("warning"):
        lines.append(f"problem: {run.error or run.meta['warning']}")
    lines.append(f"run: {_shown(run.path)}")
    return "\n".join(lines)


def _shown(path) -> str:
    """A run folder as a person reads it: relative to the working folder when inside it (no machine paths in a
    notebook's saved output), else absolute."""
    import os
    from pathlib import Path

    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:
        return str(path)


def _memory_lines(d: dict[str, Any], backends: list[str]) -> list[str]:
    """What the accounted rows count (the process figure counts everything the process holds), or why a backend
    has no account."""
    accounted = [b for b in backends if d[b].get("memory_counts") and not d[b].get("memory_missing")]
    lines = []
    if accounted:
        lines.append("accounted rows: activations only (ortlab.account), exact at the burst's shapes; the "
                     "process's peak counts everything it holds:")
        lines += [f"  {c}" for c in dict.fromkeys(d[b]["memory_counts"] for b in accounted)]
    lines += [f"no activation account for {b}: {d[b]['memory_missing']}" for b in backends
              if d[b].get("memory_missing")]
    lines += [f"CUDA allocator for {b} over its steps: peak allocated {a['peak_allocated']:.1f} MB, peak reserved "
              f"{a['peak_reserved']:.1f} MB (everything its tensors held: parameters, gradients, optimizer state, "
              "activations, workspaces)" for b in backends if (a := d[b].get("cuda_allocator_mb"))]
    return lines
