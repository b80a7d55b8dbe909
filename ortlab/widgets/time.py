"""Time panel: where a step's time goes in the latest runs burst with the collector "time" (the Burst tab's
'profile where the time goes'), one column per backend: the step's parts, the modules (and a figure of them),
where ORTModule is slower or faster than PyTorch, the top ORT nodes. Thin over ortlab.timing.table."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from ortlab.engine.backends import BACKENDS
from ortlab.timing.collector import FILE
from ortlab.widgets.export import SaveButton
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import row, table

# the time tables' columns as the panel heads them (every figure is milliseconds per profiled step)
HEADERS = {"ms": "time per step (ms)", "pytorch ms": "PyTorch (ms)", "difference ms": "difference (ms)",
           "profiled median ms": "profiled steps' median (ms)", "unprofiled median ms": "later steps' median (ms)",
           "ortlab_tap": "ortlab's tap", "phase": "phase", "s": "time per step (s)"}

HOW = ("burst with 'profile where the time goes' on (the Burst tab; in code collect={'time': {}}; CLI "
       "--collect time)")


def latest(runs: list) -> list:
    """The newest run with time data of each backend, PyTorch first (what the tab compares)."""
    from ortlab.runs.groups import newest_each

    return newest_each(runs, lambda run: (run.path / FILE).is_file() or any((r.path / FILE).is_file()
                                                                               for r in run.ranks), BACKENDS)


class TimePanel(W.VBox):
    """`TimePanel(runs)`: `runs()` lists the runs (the Lab passes its session's)."""

    def __init__(self, runs: Callable[[], list] | None = None):
        self.get_runs = runs or (lambda: [])
        self.top = W.BoundedIntText(value=10, min=1, max=200, description="rows", layout=W.Layout(width="160px"))
        self.status = W.HTML()
        self.figure = figure_area()
        self.tables = W.HTML()
        self.tables_of: Any = None  # the TimeTables shown
        self.top.observe(lambda change: self.refresh(), names="value")
        out = lambda: self._out  # noqa: E731
        self._out = "runs"
        self.save_figure = SaveButton("time by module", lambda: self.figure.value, out)
        self.save_table = SaveButton("time by module", lambda: None if self.tables_of is None else
                                     self.tables_of.modules.reset_index(), out, kind="CSV")
        super().__init__([row(self.top, self.save_figure, self.save_table), self.status, self.figure, self.tables])
        self.refresh()

    def refresh(self) -> None:
        from ortlab.common.plots import figure_png
        from ortlab.timing.table import KINDS, time

        runs = latest(list(self.get_runs() or []))
        if not runs:
            self.status.value = f"<p>No run with time data yet: {html.escape(HOW)}.</p>"
            self.figure.value, self.tables.value, self.tables_of = b"", "", None
            return
        try:
            t = self.tables_of = time(*runs)
        except Exception as e:  # a damaged time.json: said in the tab
            self.status.value = f"<p><b>Could not read the time data:</b> {html.escape(str(e))}</p>"
            self.figure.value, self.tables.value, self.tables_of = b"", "", None
            return
        n = self.top.value
        self._out = runs[-1].path.parent
        self.status.value = ("<p style='line-height:1.4'>milliseconds per profiled step: " + ", ".join(
            f"<b>{html.escape(label)}</b> <code style='overflow-wrap:anywhere'>{html.escape(path)}</code>"
            for label, path in zip(t.labels, t.paths, strict=True)) + " (each run's trace.json opens in "
            "Perfetto)</p>")
        self.figure.value = figure_png(t.figure(n))
        parts = [_section("The step, part by part", t.parts, KINDS),
                 _section(f"Modules (kernel time, forward + backward), top {n}", t.modules.head(n))]
        if len(t.difference):
            parts.append(_section("Where a backend is slower (+) or faster (-) than PyTorch, by module",
                                  t.difference.head(n), index=False))
        parts.append(_section(f"Op types, top {n}", t.ops.head(n)))
        if len(t.nodes):
            parts.append(_section(f"ORT graph nodes, top {n}", t.nodes.head(n), index=False))
        if len(t.python_ops):
            parts.append(_section("PythonOps", t.python_ops, index=False))
        parts.append(_section("What profiling cost (profiled steps' median against the steps after them)", t.cost))
        parts += [_note(f"{label}: {note}") for label, note in t.notes.items()]
        self.tables.value = "".join(parts)


def _note(text: str) -> str:
    """A footnote that reads: the table's font size, wrapped at the panel's width."""
    return f"<p style='font-size:12px;line-height:1.4;color:#444;overflow-wrap:anywhere'>{html.escape(text)}</p>"


def _section(title: str, frame, note: str = "", index: bool = True) -> str:
    return (f"<h4 style='margin:12px 0 4px'>{html.escape(title)}</h4>"
            + table(frame, index=index, headers=HEADERS) + (_note(note) if note else ""))
