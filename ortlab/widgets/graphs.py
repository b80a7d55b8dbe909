"""Graphs panel: a run's exported stages, what each stage changed, node search with a drawn neighbourhood,
the re-export table, and netron inline. Thin over ortlab.graphs."""

from __future__ import annotations

import contextlib
import functools
import html
from collections.abc import Callable

import ipywidgets as W

from ortlab.graphs import Graphs, GraphsError, NetronError, find_stage_files, load, serve
from ortlab.graphs.collection import run_stage_folders
from ortlab.graphs.ranks import describe
from ortlab.widgets.burst_panel import SAVE_GRAPHS
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import table

CODE = "options={'save_onnx': True}"  # how the graphs' messages say to save graphs, in code
_TABS = ("Summary", "Stage diff", "Search", "Re-exports", "netron")


def _table(df, max_rows: int | None = None) -> str:
    if not len(df):
        return "<i>none</i>"
    more = ""
    if max_rows is not None and len(df) > max_rows:
        more = f"<div style='color:#666'>... {len(df) - max_rows} more rows</div>"
        df = df.head(max_rows)
    return table(df) + more  # the Lab's tables: readable headers, one spelling for what is missing


def _runs_on_disk() -> list:
    from ortlab.reporting.listing import list_runs
    from ortlab.runs.run import load_run

    df = list_runs("runs")
    return [load_run(p) for p in reversed(df["path"].tolist())] if len(df) else []


def _guarded(method):
    """Errors go to the panel's status line, never to the notebook's output."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self._say(f"{type(e).__name__}: {text}" if not isinstance(e, GraphsError) else text, error=True)
            return None

    return wrapper


class GraphsPanel(W.VBox):
    """`GraphsPanel(runs)`: `runs()` returns the runs to pick from (default: the run folders in ./runs)."""

    def __init__(self, runs: Callable[[], list] | None = None):
        self._runs_fn = runs or _runs_on_disk
        self._runs: dict[str, object] = {}
        self.graphs: Graphs | None = None
        self.netron = None  # the NetronServer while one is serving
        self._updating = False  # set while the panel itself changes pickers: their observers stay quiet
        wide = W.Layout(width="420px")
        self.run_picker = W.Dropdown(description="run", options=[], layout=wide)
        self.refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="100px"))
        self.stage_picker = W.Dropdown(description="stage", options=[], layout=W.Layout(width="320px"))
        self.status = W.HTML()
        self.summary = W.HTML()
        self.compare_picker = W.Dropdown(description="from", options=[], layout=W.Layout(width="320px"))
        self.chart = figure_area()
        self.diff_table = W.HTML()
        self.search_box = W.Text(placeholder="node name, op type (MatMul) or module (blocks.0.attn)",
                                 continuous_update=False, layout=W.Layout(width="420px"))
        self.search_by = W.Dropdown(options=["any", "name", "op", "module"], value="any", description="by",
                                    layout=W.Layout(width="160px"))
        self.search_button = W.Button(description="Search", icon="search", layout=W.Layout(width="100px"))
        self.matches = W.Select(options=[], rows=8, layout=W.Layout(width="100%"))
        self.hops = W.BoundedIntText(value=1, min=1, max=6, description="hops",
                                     layout=W.Layout(width="140px"))
        self.neighbourhood = W.HTML()
        self.node_time = W.HTML()  # the picked node's kernel time, when the run was profiled (collector "time")
        from ortlab.widgets.overlay import OverlayControl

        self.overlay = OverlayControl(on_change=lambda: self._show_neighbourhood())  # per-node data, coloured
        self._node_times: dict[str, list[dict]] = {}
        self.transitions = W.HTML()
        self.netron_button = W.Button(description="Open in netron", icon="external-link", button_style="info")
        self.netron_stop_button = W.Button(description="Stop netron", icon="stop", disabled=True)
        self.netron_frame = W.HTML()
        self.tabs = W.Tab(children=[
            self.summary,
            W.VBox([self.compare_picker, self.chart, self.diff_table]),
            W.VBox([W.HBox([self.search_box, self.search_by, self.search_button]), self.matches, self.hops,
                    self.overlay, self.node_time, self.neighbourhood]),
            self.transitions,
            W.VBox([W.HBox([self.netron_button, self.netron_stop_button]), self.netron_frame]),
        ], titles=_TABS)

        self.refresh_button.on_click(lambda _: self.refresh())
        self.search_button.on_click(lambda _: self.search())
        self.netron_button.on_click(lambda _: self.open_netron())
        self.netron_stop_button.on_click(lambda _: self.stop_netron())
        for widget, handler in ((self.run_picker, self._load_run), (self.stage_picker, self._show_stage),
                                (self.compare_picker, self._show_diff), (self.search_box, self.search),
                                (self.matches, self._show_neighbourhood),
                                (self.hops, self._show_neighbourhood)):
            widget.observe(lambda _, h=handler: None if self._updating else h(), "value")
        pickers = W.HBox([self.run_picker, self.refresh_button, self.stage_picker])
        super().__init__([pickers, self.status, self.tabs])
        self.refresh()

    # -- what the controls do (callable from code as well)

    @_guarded
    def refresh(self) -> None:
        """Re-read the runs: show the newest run with graphs that is new since the last refresh, else keep the
        selected run while it is there."""
        runs = list(self._runs_fn() or [])
        known = set(self._runs)
        self._runs = {str(r.path): r for r in reversed(runs)}  # newest first
        options = [(self._run_label(r), key) for key, r in self._runs.items()]
        keep = self.run_picker.value
        with_graphs = [key for key, r in self._runs.items() if self._has_graphs(r)]
        new = [key for key in with_graphs if key not in known]
        fallback = with_graphs[0] if with_graphs else (options[0][1] if options else None)
        value = new[0] if new else keep if keep in self._runs else fallback
        with self._quiet():
            self.run_picker.options = options
            self.run_picker.value = value
        if value is None:
            self._clear(f"no runs yet: run an ORTModule burst with \"{SAVE_GRAPHS}\" checked (the Burst tab)")
        elif value != keep or self.graphs is None:
            self._load_run()

    @_guarded
    def search(self) -> None:
        stage = self._stage()
        text = self.search_box.value.strip()
        if stage is None or not text:
            self.matches.options = []
            return
        found = stage.search(text, by=self.search_by.value, limit=500)
        self.matches.options = [(f"{r.op.split('::')[-1]:<22} {r.name}", r.name) for r in found.itertuples()]
        more = " (first 500)" if len(found) == 500 else ""
        self._say(f"{len(found)} node(s) in {stage.label} match {text!r}{more}"
                  + ("; pick one to draw its neighbourhood" if len(found) else ""))
        if len(found):
            self.matches.value = found["name"].iloc[0]
        else:
            self.neighbourhood.value = ""

    @_guarded
    def open_netron(self) -> None:
        """Serve the selected stage with netron and embed it; if netron cannot, say why in one line."""
        stage = self._stage()
        if stage is None:
            return
        self.stop_netron()
        try:
            self.netron = serve(stage.path)
        except NetronError as e:
            self.netron_frame.value = ""
            self._say(f"{e} (Search tab)", error=True)
            self.tabs.selected_index = _TABS.index("Search")
            return
        self.netron_frame.value = self.netron.iframe_html(650)
        self.netron_stop_button.disabled = False
        self.tabs.selected_index = _TABS.index("netron")
        self._say(f"netron is serving {stage.path.name} at {self.netron.browser_url}")

    def stop_netron(self) -> None:
        if self.netron is not None:
            self.netron.stop()
            self.netron = None
            self.netron_frame.value = ""
            self._say("netron stopped")
        self.netron_stop_button.disabled = True

    def close(self) -> None:
        self.stop_netron()
        super().close()

    # -- internals

    @staticmethod
    def _has_graphs(run) -> bool:
        from ortlab.graphs.compiled import has_compiled_code

        return any(find_stage_files(where) for where in run_stage_folders(run)) or has_compiled_code(run)

    def _run_label(self, run) -> str:
        label = f"{run.path.name}  {run.backend}, {run.status}"
        return label if self._has_graphs(run) else label + " (no graphs)"

    @contextlib.contextmanager
    def _quiet(self):
        self._updating = True
        try:
            yield
        finally:
            self._updating = False

    def _say(self, text: str, error: bool = False) -> None:
        color = "#c00" if error else "#555"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def _clear(self, message: str = "", error: bool = False) -> None:
        self.graphs = None
        self.overlay.load(None)
        with self._quiet():
            self.stage_picker.options = []
            self.compare_picker.options = []
            self.matches.options = []
        for w in (self.summary, self.diff_table, self.neighbourhood, self.transitions):
            w.value = ""
        self.chart.value = b""
        self._say(message, error)

    def _stage(self):
        if self.graphs is None or not self.stage_picker.value:
            return None
        mode, name = self.stage_picker.value
        return self.graphs.stage(name, mode)

    @_guarded
    def _load_run(self) -> None:
        run = self._runs.get(self.run_picker.value)
        self.stop_netron()
        if run is None:
            self._clear()
            return
        if run.read_json("compile.json") is not None:  # a torch.compile burst: its generated code, no graph
            self._show_compiled(run)
            return
        try:
            g = load(run)
        except GraphsError as e:  # what to do, said with the Burst tab's checkbox, not the code it sets
            self._clear(str(e).replace(CODE, f"\"{SAVE_GRAPHS}\" checked (the Burst tab)"), error=True)
            return
        self.graphs = g
        self.overlay.load(run)
        from ortlab.timing.table import node_times

        self._node_times = node_times(run)
        self.transitions.value = _table(g.transitions)
        stages = [(m, s) for m in g.modes for s in g.stages(m)]
        options = [(s if len(g.modes) == 1 else f"{m}/{s}", (m, s)) for m, s in stages]
        with self._quiet():
            self.compare_picker.options = options
            self.stage_picker.options = options
            self.stage_picker.value = stages[-1]  # the execution model: what ORT runs
        ranks = describe(g.rank_graphs)
        self._say(f"{run.path.name}: {len(stages)} stage files, prefix {g.prefix!r}" + (f"; {ranks}" if ranks else ""),
                  error=not (g.rank_graphs or {}).get("identical", True))
        self._show_stage()

    def _show_compiled(self, run) -> None:
        """A torch.compile burst: inductor's generated code (the files, their kernels, the start of the first),
        its graph breaks and re-compilations; netron has nothing to open."""
        from ortlab.graphs.compiled import compiled_code, excerpt

        self._clear()
        code = compiled_code(run)
        info = run.read_json("compile.json", {}) or {}
        breaks = info.get("graph_breaks") or []
        parts = [f"<b>torch.compile's generated code</b> ({len(code)} files in {html.escape(run.path.name)}/compiled)",
                 _table(code.drop(columns=["path"])) if len(code) else "<i>no generated code kept</i>"]
        if len(code):
            parts.append(f"<pre style='max-height:300px;overflow:auto'>{html.escape(excerpt(code['path'][0]))}"
                         "</pre>")
        import pandas as pd

        parts.append(f"<b>graph breaks</b> ({len(breaks)})" + (_table(pd.DataFrame(breaks)) if breaks else ""))
        recompiles = info.get("recompiles") or []
        parts.append(f"<b>re-compilations</b> ({len(recompiles)})" +
                     (_table(pd.DataFrame(recompiles)) if recompiles else ""))
        self.summary.value = "".join(parts)
        self._say(f"{run.path.name}: torch.compile, {len(code)} generated files, {len(breaks)} graph breaks")

    @_guarded
    def _show_stage(self) -> None:
        stage = self._stage()
        if stage is None:
            return
        mode = stage.mode
        s = stage.summary()
        kinds = ", ".join(f"{k} {s[k]}" for k in ("forward", "gradient", "recompute"))
        facts = (f"<b>{html.escape(stage.label)}</b>: {s['nodes']} nodes ({kinds}), {s['op_types']} op "
                 f"types; {s['user_inputs']} user input(s), {s['parameters']} parameters "
                 f"({s['parameter_elements']:,} elements, {s['parameter_bytes'] / 2**20:.2f} MB), "
                 f"{s['outputs']} outputs; "
                 f"file {s['file_bytes'] / 2**20:.2f} MB"
                 + (f"<br><i>{html.escape(stage.taps_note)}</i>" if stage.taps else ""))
        inputs = stage.inputs
        hist = stage.histogram().reset_index()
        cols = ["stage", "nodes", "forward", "gradient", "recompute", "op_types", "initializers",
                "file_bytes"]
        self.summary.value = "".join([
            f"<p>{facts}</p>",
            "<h4>All stages</h4>", _table(self.graphs.summary(mode)[cols]),
            "<h4>Ops (domain::op)</h4>", _table(hist, 25),
            "<h4>User inputs</h4>", _table(inputs[inputs["role"] == "user input"]),
            "<h4>Parameters</h4>", _table(inputs[inputs["role"] == "parameter"], 12),
            "<h4>Outputs</h4>", _table(stage.outputs, 12)])
        names = [v for _, v in self.compare_picker.options if v[0] == mode]
        at = names.index(self.stage_picker.value)
        previous = names[at - 1] if at > 0 else names[0]
        with self._quiet():
            self.compare_picker.value = previous
        self._show_diff()
        if self.search_box.value.strip():
            self.search()

    @_guarded
    def _show_diff(self) -> None:
        from ortlab.common.plots import figure_png

        stage = self._stage()
        if stage is None or not self.compare_picker.value:
            return
        mode, name = self.compare_picker.value
        if mode != stage.mode:
            raise GraphsError(f"compare stages of one mode: {mode} and {stage.mode} differ")
        d = self.graphs.diff(name, stage.name, mode)
        self.chart.value = figure_png(d.chart())
        s = d.summary()
        self.diff_table.value = "".join([
            f"<p>{html.escape(repr(d))}</p>", "<h4>Op counts that changed</h4>", _table(d.ops, 40),
            f"<h4>Fused away ({s['fused_away']})</h4>", _table(d.fused, 20),
            f"<h4>Gradient nodes added ({s['gradient']})</h4>", _table(d.gradient[["name", "op"]], 20),
            f"<h4>Recompute nodes added ({s['recompute']})</h4>", _table(d.recompute[["name", "op"]], 20)])

    @_guarded
    def _show_neighbourhood(self) -> None:
        stage = self._stage()
        if stage is None or not self.matches.value:
            self.neighbourhood.value = ""
            return
        nb = stage.neighbourhood(self.matches.value, hops=self.hops.value)
        self.node_time.value = self._time_of(self.matches.value)
        svg = nb.svg(overlay=self.overlay.current)
        self.neighbourhood.value = f"<div style='overflow:auto;max-height:700px'>{svg}</div>"

    def _time_of(self, node: str) -> str:
        """The node's ORT kernel time per step in this run, if it was profiled (`ortlab.time`)."""
        if not self._node_times:
            return ""
        rows = self._node_times.get(node)
        if not rows:
            return "<i>ORT kernel time: not among the run's profiled top nodes</i>"
        return "<b>ORT kernel time</b>: " + ", ".join(
            f"{r['ms']:.3f} ms per step ({html.escape(r['phase'])}, {html.escape(r['op'])})" for r in rows)

    def __repr__(self) -> str:
        stage = "/".join(self.stage_picker.value) if self.stage_picker.value else None
        return (f"GraphsPanel(runs={len(self._runs)}, stage={stage!r}, "
                f"netron={'serving' if self.netron is not None else 'off'})")
