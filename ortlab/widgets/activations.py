"""Activations panel: compare two runs' activation statistics, see the first divergence, a tensor x step
heatmap, and one tensor's statistics over the steps. Thin over ortlab.activations.compare."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import ipywidgets as W

from ortlab.engine.backends import REFERENCE
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import table


def _png(fig) -> bytes:
    from ortlab.common.plots import figure_png

    return figure_png(fig)


def _label(run) -> str:
    rank = run.meta.get("rank") if "world_size" in run.meta else None
    if rank is not None:  # <run>/ranks/<r>
        return f"{run.path.parent.parent.name} ({run.backend}) rank {rank}"
    return f"{run.path.name} ({run.backend})"


class ActivationsPanel(W.VBox):
    """`runs()` lists the runs to choose from (the Lab passes its session's); runs without statistics are left
    out. A folder path (a run, or an ORT StatisticsSubscriber folder) can be typed instead."""

    def __init__(self, runs: Callable[[], list] | None = None):
        self.get_runs = runs or (lambda: [])
        self.diff = None  # the last ActivationDiff
        self._known: set[str] = set()  # the runs with statistics seen by the last refresh
        self.a = W.Dropdown(description="A", options=[], layout=W.Layout(width="420px"))
        self.b = W.Dropdown(description="B", options=[], layout=W.Layout(width="420px"))
        self.a_path = W.Text(placeholder="or a folder: run or ORT dump", layout=W.Layout(width="300px"))
        self.b_path = W.Text(placeholder="or a folder: run or ORT dump", layout=W.Layout(width="300px"))
        self.tolerance = W.FloatLogSlider(value=1e-3, base=10, min=-7, max=0, step=0.5,
                                          description="tolerance", readout_format=".0e")
        self.compare_button = W.Button(description="Compare", button_style="primary", icon="search")
        self.status = W.HTML()
        self.ops = W.HTML()  # the ops inside the module a verdict localized, the first that diverged marked
        self.heatmap = figure_area()
        self.tensor = W.Select(options=[], rows=12, description="tensor", layout=W.Layout(width="420px"))
        self.tensor_stats = W.HTML()
        self.tensor_plot = figure_area()
        self.compare_button.on_click(lambda _: self.compare())
        self.tensor.observe(lambda change: self.show_tensor(), names="value")
        super().__init__([
            W.HBox([self.a, self.a_path]), W.HBox([self.b, self.b_path]),
            W.HBox([self.tolerance, self.compare_button]), self.status, self.ops, self.heatmap,
            W.HTML("<b>Tensor over steps</b> (the first divergence is selected; pick another)"),
            W.HBox([self.tensor, self.tensor_stats]), self.tensor_plot])
        self.refresh()

    # -- state

    def refresh(self) -> None:
        """Re-read the runs (those that collected statistics; of a distributed run, each rank), newest first. When
        runs with statistics are new since the last refresh, A becomes the newest PyTorch run and B the newest
        other run, and they are compared at once (the tab shows the latest burst's first divergence); otherwise
        the choice is kept."""
        everything = list(reversed(self.get_runs() or []))
        self.ops.value = _op_table(everything)
        runs = [r for run in everything for r in [run, *run.ranks] if (Path(r.path) / "stats.npz").is_file()]
        options = [(_label(r), str(r.path)) for r in runs]
        keep_a, keep_b = self.a.value, self.b.value
        self.a.options, self.b.options = options, options
        paths = [p for _, p in options]
        new = [p for p in paths if p not in self._known]
        self._known.update(paths)
        newest = {}
        for r in runs:  # newest first: the first of each backend is its newest
            newest.setdefault(r.backend, str(r.path))
        pytorch = newest.get(REFERENCE, paths[-1] if paths else None)
        other = next((p for b, p in newest.items() if b != REFERENCE),  # the newest run of another backend
                     next((p for p in paths if p != pytorch), pytorch))
        if new:
            self.a.value, self.b.value = pytorch, other
        else:
            self.a.value = keep_a if keep_a in paths else pytorch
            self.b.value = keep_b if keep_b in paths else other
        if not runs:
            self.status.value = ("<i>no run with statistics yet: switch on “record activation statistics” in the "
                                 "Burst tab and run (in Python: collect={'stats': {}})</i>")
        elif new and self.a.value and self.b.value and self.a.value != self.b.value:
            self.compare()
        elif self.diff is None:
            self.status.value = f"<i>{len(runs)} run(s) with statistics: choose A and B, then Compare</i>"

    def _source(self, path_box: W.Text, dropdown: W.Dropdown) -> str | None:
        return path_box.value.strip() or dropdown.value

    # -- actions

    def compare(self):
        """Compare A and B (what the button does); returns the ActivationDiff, or None after an error
        (shown)."""
        from ortlab.activations import compare

        a, b = self._source(self.a_path, self.a), self._source(self.b_path, self.b)
        if not a or not b:
            self._error("choose two runs (or type two folders)")
            return None
        from ortlab.activations.ranks import rank_of

        ranks = None not in (rank_of(a), rank_of(b)) and rank_of(a) != rank_of(b)
        try:  # two ranks: parameter gradients must be equal, the tolerance is for runs
            self.diff = compare(a, b, None if ranks else self.tolerance.value)
            self.heatmap.value = _png(self.diff.heatmap())
        except Exception as e:  # the panel shows every failure itself: a notebook cell should not see it
            self._error(f"{type(e).__name__}: {e}")
            return None
        self.status.value = self._summary()
        rows = self.diff.table.drop_duplicates(["phase", "name"]).sort_values("seq")
        self.tensor.options = [({"backward": "grad ", "param_grad": "param grad "}.get(p, "") + n, (p, n))
                               for p, n in zip(rows["phase"], rows["name"], strict=True)]
        first = self.diff.first
        if first:
            self.tensor.value = (first.phase, first.name)
        else:
            self.tensor.value = self.tensor.options[0][1] if rows.size else None
        self.show_tensor()
        return self.diff

    def show_tensor(self) -> None:
        if self.diff is None or self.tensor.value is None:
            return
        phase, name = self.tensor.value
        try:
            t = self.diff.over_steps(name, phase)
            self.tensor_plot.value = _png(self.diff.figure(name, phase))
        except Exception as e:
            self.tensor_stats.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return
        cols = [c for c in ("mean_a", "mean_b", "std_a", "std_b", "norm_a", "norm_b", "score") if c in t]
        self.tensor_stats.value = table(t[cols], index=True, headers={c: c.replace("_", " of ") for c in cols})

    def _summary(self) -> str:
        d = self.diff
        head = f"<b>{html.escape(d.a)}</b> vs <b>{html.escape(d.b)}</b>, aligned by {d.aligned_by}<br>"
        if d.ranks is not None:  # what may differ between ranks, and whether what must not does
            from ortlab.activations.ranks import rank_lines

            head += "".join(f"{html.escape(line)}<br>" for line in rank_lines(d))
        if d.first:
            head += ("<span style='color:#c00;font-weight:bold'>first divergence: "
                     f"{html.escape(str(d.first))}</span>")
        else:
            head += "<span style='color:#080'>no divergence beyond tolerance</span>"
        for label, nf in d.nonfinite.items():
            if nf:
                head += (f"<br><span style='color:#c60'>first nan/inf in {html.escape(label)}: "
                         f"{html.escape(str(nf))}</span>")
        for e in d.errors[:3]:
            head += f"<br><span style='color:#c60'>unreadable: {html.escape(e)}</span>"
        return head

    def _error(self, text: str) -> None:
        self.status.value = f"<span style='color:#c00'>{html.escape(text.splitlines()[0])}</span>"

    def __repr__(self) -> str:
        first = "none"
        if self.diff is not None and self.diff.first is not None:
            first = f"{self.diff.first.name!r} at step {self.diff.first.step}"
        elif self.diff is None:
            first = "not compared"
        return f"ActivationsPanel(runs={len(self.a.options)}, first divergence: {first})"


def _op_table(runs: list) -> str:
    """The newest verdict's op table (ortlab.verdict.ops) as a preformatted block: the ops inside the module its
    divergence was localized to, the first that diverged there marked ">>"; "" when no verdict holds one."""
    from ortlab.verdict.judge import FILE
    from ortlab.verdict.ops import lines, table_of

    for run in runs:  # newest first
        try:
            table = table_of(run.read_json(FILE))
        except Exception:  # a damaged verdict shows nothing here (the Log tab names it)
            continue
        if table:
            head = f"<b>Ops inside the localized module</b> (run {html.escape(run.path.name)})"
            return f"{head}<pre style='font-size:11px'>{html.escape(chr(10).join(lines(table)))}</pre>"
    return ""
