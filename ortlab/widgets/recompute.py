"""Recompute panel: the memory optimizer's plans with checkboxes, what-if sliders, apply and run, a sweep."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import ipywidgets as W

from ortlab.runs.run import RunStatus
from ortlab.widgets import layout
from ortlab.widgets.background import Background, error_html
from ortlab.widgets.images import figure_area

_HEADERS = {"saving_expr": "saving (expression)", "ratio": "what-if / now", "set": "plan set",
            "loss_equal": "same losses", "process_peak_mb": "process peak (MB)", "cluster_id": "cluster"}


def _table(df) -> str:
    return layout.table(df, headers=_HEADERS)


def _accounted(run, reference) -> str:
    """The applied run's accounted activation peak and stash, and their change from the plans' run."""
    data = run.memory or {}
    if data.get("peak_activation_bytes") is None:
        return f"no memory account: {data.get('missing') or 'none collected'}"
    mb, keys = 2**20, ("peak_activation_bytes", "stashed_bytes")
    peak, kept = (None if data.get(k) is None else data[k] / mb for k in keys)
    text = f"accounted activation peak {peak:.2f} MB" + ("" if kept is None else f", kept for backward {kept:.2f} MB")
    base = getattr(reference, "memory", None) or {}
    if all(base.get(k) is not None and data.get(k) is not None for k in keys):
        text += (f" (from the plans' run: peak {peak - base[keys[0]] / mb:+.2f} MB, kept for backward "
                 f"{kept - base[keys[1]] / mb:+.2f} MB)")
    return text


class RecomputePanel(Background, W.VBox):
    """Thin over ortlab.recompute: Find plans runs a short ORTModule burst that collects them; the sliders
    re-evaluate every plan's saving for other dimension values; Apply and run trains with the checked plans
    (memory_opt_config); Sweep measures plan sets. Bursts run in a background thread (`wait=True` blocks)."""

    def __init__(self, session=None, steps: int = 4):
        self._session = session
        self.table = None  # the plans DataFrame shown
        self.plans_run = None
        self.last_run = None
        self.last_sweep = None
        self._known: set[str] = set()  # the runs with plans seen by the last refresh
        self._folder: Path | None = None  # where its bursts go (<out>/<stamp>-plans/ortlab-runs): not the user's
        self.on_done: Callable[[], None] | None = None  # after each action (the Lab refreshes its tabs)
        self.steps = W.BoundedIntText(value=steps, min=2, max=100_000, description="steps",
                                      layout=W.Layout(width="170px"))
        self.find_button = W.Button(description="Find plans", icon="search",
                                    tooltip="a short ORTModule burst that reads ORT's plans")
        self.apply_button = W.Button(description="Apply and run", button_style="primary", icon="play",
                                     tooltip="a burst with the checked plans (memory_opt_config)")
        self.sweep_button = W.Button(description="Sweep", icon="chart-line",
                                     tooltip="none, each top plan, all type 1, level 1, level 2")
        self.status = W.HTML()
        self.checkboxes = W.VBox()
        self.sliders = W.VBox()
        self.what_if_table = W.HTML()
        self.what_if_plot = figure_area(width="650px")
        self.apply_result = W.HTML()
        self.sweep_table = W.HTML()
        self.sweep_plots = layout.row(figure_area(width="500px"), figure_area(width="430px"))
        self.find_button.on_click(lambda _: self.find())
        self.apply_button.on_click(lambda _: self.apply())
        self.sweep_button.on_click(lambda _: self.sweep())
        super().__init__([
            layout.row(self.find_button, self.steps, self.apply_button, self.sweep_button), self.status,
            W.HTML("<b>Plans</b> (check the ones to apply)"), self.checkboxes,
            W.HTML("<b>What if</b> (symbolic dimensions)"), self.sliders, self.what_if_table,
            self.what_if_plot, W.HTML("<b>Apply and run</b>"), self.apply_result,
            W.HTML("<b>Sweep</b>"), self.sweep_table, self.sweep_plots])

    # -- state

    @property
    def session(self):
        if self._session is None:
            from ortlab.engine.session import Session

            self._session = Session()
        return self._session

    @property
    def checked(self) -> list[int]:
        return [box.plan for box in self.checkboxes.children if box.value]

    @property
    def dims(self) -> dict[str, int]:
        return {s.description: s.value for s in self.sliders.children}

    # -- actions

    def _asking(self):
        """This panel's bursts are ortlab's own (plans to read, plans tried): under <out>/<stamp>-plans."""
        if self._folder is None:
            import datetime as _dt

            self._folder = Path(self.session.out).expanduser().resolve() / f"{_dt.datetime.now():%Y%m%d-%H%M%S}-plans"
        return self.session.asking(self._folder, "plans")

    def find(self, wait: bool = False) -> None:
        def work():
            with self._asking():
                run = self.session.burst("ortmodule", self.steps.value, {"save_onnx": True},
                                         collect={"plans": {}, "memory": {}}, progress=False, name="plans")
            self.load(run)

        self._launch("finding plans (an ORTModule burst; the first one exports the model)...", work, wait)

    def load(self, run) -> None:
        """Show the plans of a run (a Run or its folder) that collected them."""
        from ortlab.recompute import plans

        try:
            table = plans(run)
        except Exception as e:
            self.status.value = error_html(e)
            return
        self.table, self.plans_run = table, run
        boxes = []
        for row in table.itertuples():
            label = (f"{row.plan}: {row.cluster_id} (type {row.type}, x{row.frequency}) "
                     f"saves {row.saving_mb:.3f} MB")
            box = W.Checkbox(value=False, indent=False, description=label, layout=W.Layout(width="auto"))
            box.plan = int(row.plan)
            boxes.append(box)
        self.checkboxes.children = boxes
        sliders = []
        for name, value in sorted((table.attrs.get("dims") or {}).items()):
            slider = W.IntSlider(value=value, min=1, max=max(4 * value, 8), description=name,
                                 continuous_update=False)
            slider.observe(lambda _: self.update_what_if(), names="value")
            sliders.append(slider)
        self.sliders.children = sliders
        name = Path(str(getattr(run, "path", run))).name
        self.status.value = html.escape(f"{len(table)} plans from run {name}")
        self.update_what_if()

    def update_what_if(self) -> None:
        from ortlab.common.plots import figure_png
        from ortlab.recompute import what_if, what_if_figure

        if self.table is None or not len(self.table):
            self.what_if_table.value, self.what_if_plot.value = "", b""
            return
        try:
            table = what_if(self.table, **self.dims)
            shown = table[["plan", "cluster_id", "saving_expr", "saving_bytes", "what_if_bytes", "ratio"]]  # MB
            self.what_if_table.value = _table(shown)
            self.what_if_plot.value = figure_png(what_if_figure(table))
        except Exception as e:
            self.status.value = error_html(e)

    def apply(self, wait: bool = False) -> None:
        if self.table is None:
            self.status.value = error_html(ValueError("no plans yet: click Find plans first"))
            return
        self._launch("running with the checked plans...", self._apply, wait)

    def _apply(self) -> None:
        from ortlab.recompute import plan_config, plans, write_config

        checked = self.checked
        options = {"save_onnx": True}
        entries = plan_config(checked, self.table) if checked else []
        if entries:
            path = Path(self.session.out).expanduser().resolve() / "plan-configs" / \
                f"plans-{'-'.join(map(str, checked))}.json"
            options["memory_opt_config"] = str(write_config(entries, path))
        with self._asking():
            run = self.session.burst("ortmodule", self.steps.value, options, progress=False, name="plans-applied",
                                     collect={"plans": {"steady_peak": True}, "memory": {}})
        self.last_run = run
        graph = (plans(run).attrs.get("execution_graph") or {}) if run.status == RunStatus.OK else {}
        later = run.metrics.iloc[1:]
        parts = [f"{run.status}: {len(entries)} plan(s) {', '.join(entries) or '(none)'}",
                 f"recompute nodes in the execution graph: {graph.get('recompute_nodes', 'unknown')}"]
        if entries and graph.get("recompute_nodes") == 0:
            parts.append("chosen but not applied")
        parts.append(_accounted(run, self.plans_run))
        if len(later):
            parts.append(f"median step {later['step_time_s'].median() * 1000:.1f} ms, process peak after "
                         f"step 0 {later['peak_mem_mb'].max():.0f} MB (the resident set on the CPU: coarse)")
        reference = getattr(self.plans_run, "metrics", None)
        if reference is not None and len(reference) and len(run.metrics):
            n = min(len(reference), len(run.metrics))
            a, b = reference["loss"].to_numpy()[:n], run.metrics["loss"].to_numpy()[:n]
            diff = float((abs(a - b) / abs(a).clip(1e-12)).max())
            parts.append(f"loss vs the plans' run {self.plans_run.path.name}: max relative difference "
                         f"{diff:.1e}")
        if run.error:
            parts.append(run.error)
        self.apply_result.value = html.escape("; ".join(parts))

    def sweep(self, wait: bool = False) -> None:
        def work():
            from ortlab.common.plots import figure_png
            from ortlab.recompute import plan_sweep

            sweep = plan_sweep(self.session, steps=self.steps.value)
            self.last_sweep = sweep
            cols = ["set", "status", "median_step_ms", "accounted_peak_mb", "accounted_saving_mb",
                    "predicted_saving_mb", "stash_saving_mb", "recompute_nodes", "loss_equal", "process_peak_mb"]
            notes = "".join(f"<li>{html.escape(n)}</li>" for n in sweep.notes)
            self.sweep_table.value = _table(sweep.table[cols]) + (f"<ul>{notes}</ul>" if notes else "")
            self.sweep_plots.children[0].value = figure_png(sweep.pareto())
            self.sweep_plots.children[1].value = figure_png(sweep.savings())
            if self.table is None:
                self.load(next(iter(sweep.runs.values())))

        self._launch("sweeping plan sets (one short burst each)...", work, wait)

    def refresh(self) -> None:
        """After a burst elsewhere (the Lab): show the newest run's plans when it is new since the last refresh
        (or none are shown yet); not while this panel's own burst runs."""
        if self.running or self._session is None:
            return
        with_plans = [run for run in self.session.runs if (run.path / "plans.json").exists()]
        new = [run for run in with_plans if str(run.path) not in self._known]
        self._known.update(str(run.path) for run in with_plans)
        if with_plans and (new or self.table is None):
            self.load(with_plans[-1])

    def _launch(self, message: str, work: Callable[[], None], wait: bool) -> None:
        if self.running:
            self.status.value = error_html(RuntimeError("a burst is already running"))
            return
        self.status.value = html.escape(message)
        buttons = (self.find_button, self.apply_button, self.sweep_button)

        def target():
            for b in buttons:
                b.disabled = True
            try:
                work()
                if self.status.value == html.escape(message):
                    self.status.value = "done"
            except Exception as e:  # shown in the panel, never printed over the notebook
                self.status.value = error_html(e)
            finally:
                for b in buttons:
                    b.disabled = False
                if self.on_done is not None:
                    self.on_done()

        self._in_background(target, wait=wait)

    def __repr__(self) -> str:
        n = 0 if self.table is None else len(self.table)
        return f"RecomputePanel(plans={n}, checked={self.checked}, dims={self.dims}, running={self.running})"
