"""Memory panel: the activation-memory account of the session's runs. Two runs' live-bytes timelines overlaid,
the peak and the largest tensors alive then, and PyTorch beside ORTModule for the last comparison. Thin over
ortlab.account: it reads what each burst's collector wrote (memory.json) and recomputes nothing."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from ortlab.engine.backends import has
from ortlab.reporting.labels import labels
from ortlab.runs.memory import GRAPH, MB, summary_fields
from ortlab.widgets.export import SaveButton
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import flexible, row, table

HOW = ("burst with 'account activation memory' on (the Burst tab; in code collect={'memory': {}}, and "
       "options={'save_onnx': True} for ORTModule)")


def _process_peak(run) -> float | None:
    """The process figure of a run (its largest per-step peak), read from its metrics alone."""
    m = run.metrics
    return float(m["peak_mem_mb"].max()) if len(m) and "peak_mem_mb" in m and m["peak_mem_mb"].notna().any() \
        else None


class MemoryPanel(W.VBox):
    """`MemoryPanel(runs)`: `runs()` lists the runs to choose from (the Lab passes its session's). Pick a run
    (and optionally a second one beside it) among the ORTModule runs with a graph account."""

    def __init__(self, runs: Callable[[], list] | None = None):
        self.get_runs = runs or (lambda: [])
        self._data: dict[str, dict] = {}  # run folder -> its memory.json (written once, when its burst ended)
        self._runs: dict[str, Any] = {}
        self._known: set[str] = set()  # the runs with an account seen by the last refresh
        self._quiet = False  # set while refresh() fills the pickers: their observers wait for it
        self.a = flexible(W.Dropdown(description="run", options=[]), "320px", "460px")
        self.b = flexible(W.Dropdown(description="beside", options=[("(none)", "")], value=""), "320px", "460px")
        self.top_n = W.BoundedIntText(value=8, min=1, max=200, description="top tensors",
                                      layout=W.Layout(width="180px"))
        self._labels: dict[str, str] = {}  # run folder -> what sets it apart from the other runs listed
        self.backends = W.HTML()
        self.status = W.HTML()
        self.timeline = figure_area()
        self.peak = W.HTML()
        for control in (self.a, self.b, self.top_n):
            control.observe(lambda change: None if self._quiet else self.show(), names="value")
        self.save_figure = SaveButton("memory timeline", lambda: self.timeline.value, self._out)
        super().__init__([self.backends, row(self.a, self.b, self.top_n), self.status, self.timeline,
                          row(self.save_figure), self.peak])
        self.refresh()

    # -- state

    def memory_of(self, run) -> dict:
        key = str(run.path)
        if key not in self._data:
            try:
                self._data[key] = run.memory
            except Exception as e:  # a damaged memory.json: named, the other runs still shown
                self._data[key] = {"missing": f"{type(e).__name__}: {e}"}
        return self._data[key]

    def refresh(self) -> None:
        """Re-read the runs: the pickers list ORTModule runs with a graph account, newest first (the newest
        picked when one is new since the last refresh or the choice is gone), and the last PyTorch/ORTModule pair
        is shown side by side."""
        runs = list(self.get_runs() or [])
        self._runs = {str(r.path): r for r in runs}
        graph = [r for r in reversed(runs) if self.memory_of(r).get("kind") == GRAPH
                 and not self.memory_of(r).get("missing")]
        named = labels(graph, backend=False)  # what sets each apart: an option set, steps, parity
        self._labels = {str(r.path): label for r, label in zip(graph, named, strict=True)}
        options = [(f"{label} ({r.path.name})" if label else r.path.name, str(r.path))
                   for r, label in zip(graph, named, strict=True)]
        paths = [p for _, p in options]
        new = [p for p in paths if p not in self._known]  # newest first
        self._known.update(paths)
        keep_a, keep_b = self.a.value, self.b.value
        self._quiet = True
        try:
            self.a.options = options
            self.b.options = [("(none)", ""), *options]
            self.a.value = new[0] if new else keep_a if keep_a in paths else (paths[0] if paths else None)
            self.b.value = "" if new else keep_b if keep_b in paths and keep_b != self.a.value else ""
        finally:
            self._quiet = False
        self.backends.value = self._backends(runs)
        self.show()

    # -- what is shown

    def accounts(self) -> list[tuple[str, Any]]:
        """(label, MemoryAccount) of the picked runs, the first run first."""
        from ortlab.account.account import MemoryAccount

        picked = [p for p in (self.a.value, self.b.value) if p]
        runs = [self._runs[p] for p in picked if p in self._runs]
        names = [self._labels.get(str(r.path)) or r.path.name for r in runs]
        if len(set(names)) < len(names):
            names = [r.path.name for r in runs]
        return [(name, MemoryAccount.from_dict(self.memory_of(r))) for name, r in zip(names, runs, strict=True)]

    def show(self) -> None:
        """Draw the picked runs' timelines and their peaks (what changing a picker does)."""
        if not self.a.value:
            self.timeline.value, self.peak.value = b"", ""
            self.status.value = self._nothing_yet()
            return
        try:
            from ortlab.account import timeline_figure
            from ortlab.common.plots import figure_png

            shown = self.accounts()
            fig = timeline_figure(*(a for _, a in shown), labels=[label for label, _ in shown])
            self.timeline.value = figure_png(fig)
            self.peak.value = "".join(self._peak(label, a) for label, a in shown)
        except Exception as e:  # the panel shows every failure itself: a notebook cell should not see it
            self.timeline.value, self.peak.value = b"", ""
            text = f"{type(e).__name__}: {e}".splitlines()[0]
            self.status.value = f"<span style='color:#c00'>{html.escape(text)}</span>"
            return
        self.status.value = ("<span style='color:#666'>live activation bytes per step of ORT's execution order, "
                             "exact at each burst's input shapes (dotted: the yield between forward and "
                             "backward)</span>")

    def _nothing_yet(self) -> str:
        reasons = [f"{r.path.name}: {self.memory_of(r)['missing']}" for r in self._runs.values()
                   if has(r.backend, "onnx_stages") and self.memory_of(r).get("missing")]
        text = f"<i>no ORTModule run with a memory account yet: {html.escape(HOW)}</i>"
        if reasons:
            text += f"<br><span style='color:#c60'>{html.escape(reasons[-1])}</span>"
        return text

    def _peak(self, label: str, a) -> str:
        top = a.top(self.top_n.value)
        found = "<i>no activation buffer alive at the peak</i>"
        if len(top):
            top = top.assign(size_mb=top["bytes"] / MB,
                             shape=top["shape"].map(lambda s: None if s is None else "x".join(map(str, s))))
            found = table(top[["size_mb", "shape", "dtype", "module", "op", "born", "name"]],
                          headers={"born": "made at step"})
        lower = f", at least: {a.uncertain_at_peak} buffers of unknown size alive" if a.uncertain_at_peak else ""
        stash = "" if a.stashed_bytes is None else f"; kept for backward {a.stashed_bytes / MB:.2f} MB"
        head = (f"<b>{html.escape(label)}</b>: peak {a.peak_activation_bytes / MB:.2f} MB{html.escape(lower)} at "
                f"step {a.peak_index} of {a.nodes} ({a.peak_phase}), {html.escape(a.peak_node)} "
                f"[{html.escape(a.peak_op)}]{stash}; order {html.escape(a.order)}")
        return f"<p style='line-height:1.4;overflow-wrap:anywhere'>{head}</p>{found}"

    def _backends(self, runs: list) -> str:
        """The last PyTorch burst followed by an ORTModule burst (what a comparison runs), side by side."""
        pair = next(((runs[i - 1], runs[i]) for i in range(len(runs) - 1, 0, -1)
                     if has(runs[i].backend, "onnx_stages") and has(runs[i - 1].backend, "reference")), None)
        if pair is None or not any(self.memory_of(r) for r in pair):
            return ""
        rows, notes = [], []
        for run in pair:
            s = summary_fields(self.memory_of(run))
            process = _process_peak(run)
            counted = s.get("memory_missing") or s.get("memory_counts") or ""
            rows.append([run.backend, s.get("saved_for_backward_mb"), s.get("activation_peak_mb"), process,
                         counted or None])
        pt, ort = (summary_fields(self.memory_of(r)).get("saved_for_backward_mb") for r in pair)
        if pt and ort is not None:
            notes.append(f"ORTModule keeps {ort / pt:.2f}x the bytes PyTorch keeps for backward")
        process = "peak CUDA allocated" if pair[0].meta.get("device") == "cuda" else "peak resident set"
        head = ("<b>PyTorch vs ORTModule activation memory</b> (the last comparison: "
                f"{html.escape(pair[0].path.name)}, {html.escape(pair[1].path.name)})")
        import pandas as pd

        shown = table(pd.DataFrame(rows, columns=["backend", "kept for backward (MB)", "activation peak (MB)",
                                                  f"{process} (MB, the whole process)", "what is counted"]))
        return head + shown + "".join(f"<div>{html.escape(n)}</div>" for n in notes)

    def _out(self):
        runs = list(self._runs.values())
        return runs[-1].path.parent if runs else "runs"

    def __repr__(self) -> str:
        picked = [self._runs[p].path.name for p in (self.a.value, self.b.value) if p in self._runs]
        return f"MemoryPanel(runs={len(self.a.options)}, shown={picked})"

