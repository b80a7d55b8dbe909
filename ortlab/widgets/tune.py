"""Tune panel: `ortlab.tune` over the Lab's session: the goal and budget, Run and Stop, progress as it runs, then
the table, the pareto figure and the best settings (export lines, the wrap call)."""

from __future__ import annotations

import html
import threading

import ipywidgets as W

from ortlab.widgets.images import figure_area

_COLUMNS = ["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
            "memory_change_pct", "rss_mb", "reasons"]


class TunePanel(W.VBox):
    """Thin over ortlab.tuning.Tuner: Run starts a tuning in a background thread (`wait=True` blocks), Stop ends it
    after the burst in progress and shows what was measured."""

    def __init__(self, session=None, budget: float = 10.0, steps: int = 8):
        self._session = session
        self.tuner = None
        self.result = None
        self._thread: threading.Thread | None = None
        self.goal = W.Dropdown(options=["time", "memory", "both"], value="time", description="goal")
        self.conditions = W.Text(value="", placeholder="e.g. memory: percent-max-degradation 10",
                                 description="conditions", layout=W.Layout(width="420px"))
        self.budget = W.BoundedFloatText(value=budget, min=0.1, max=24 * 60, step=1, description="minutes")
        self.steps = W.BoundedIntText(value=steps, min=3, max=100_000, description="steps")
        self.run_button = W.Button(description="Tune", button_style="primary", icon="play",
                                   tooltip="the defaults first, then one knob at a time, then the winners combined")
        self.stop_button = W.Button(description="Stop", icon="stop", disabled=True,
                                    tooltip="end after the current burst; keep what was measured")
        self.status = W.HTML()
        self.progress = W.HTML()
        self.table = W.HTML()
        self.plot = figure_area(width="650px")
        self.best = W.HTML()
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        super().__init__([W.HBox([self.goal, self.budget, self.steps]), W.HBox([self.conditions]),
                          W.HBox([self.run_button, self.stop_button]), self.status, self.progress,
                          W.HTML("<b>Settings measured</b> (the baseline first; rejected: the verdict diverged)"),
                          self.table, self.plot, self.best])

    @property
    def session(self):
        if self._session is None:
            from ortlab.engine.session import Session

            self._session = Session()
        return self._session

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def goals(self) -> list[str]:
        return [self.goal.value, *(c for c in self.conditions.value.split(";") if c.strip())]

    def run(self, wait: bool = False, **kwargs) -> None:
        """Start a tuning with the panel's goal, budget and steps (keywords go to Tuner: only, repeats, ...)."""
        from ortlab.tuning import Tuner

        if self.running:
            self.status.value = _error(RuntimeError("a tuning is already running"))
            return
        lines: list[str] = []

        def progress(event: dict) -> None:
            lines.append(event["text"])
            self.progress.value = "<pre style='font-size:11px'>" + html.escape("\n".join(lines[-12:])) + "</pre>"

        try:
            self.tuner = Tuner(self.session, self.goals(), self.budget.value, steps=self.steps.value,
                               warmup=min(3, self.steps.value - 2), on_progress=progress, **kwargs)
        except Exception as e:
            self.status.value = _error(e)
            return
        self.status.value = "tuning: the baseline first (repeated for its noise)..."
        self.table.value = self.best.value = ""
        self.plot.value = b""
        self._thread = threading.Thread(target=self._work, daemon=True)
        self.run_button.disabled, self.stop_button.disabled = True, False
        self._thread.start()
        if wait:
            self.wait()

    def _work(self) -> None:
        try:
            self.show(self.tuner.run())
        except Exception as e:  # shown in the panel, never printed over the notebook
            self.status.value = _error(e)
            if self.tuner is not None and self.tuner.result is not None:
                self.show(self.tuner.result, status=False)
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def show(self, result, status: bool = True) -> None:
        """Show a Tuning: its table, pareto figure and best settings."""
        from ortlab.plots import figure_png

        self.result = result
        if status:
            self.status.value = html.escape(result.headline())
        if result.rows:
            self.table.value = result.table[_COLUMNS].to_html(index=False, float_format=lambda v: f"{v:.4g}",
                                                              border=0, escape=True)
            self.plot.value = figure_png(result.pareto())
        pruned = "".join(f"<li>{html.escape(p.name)}: {html.escape(p.reason)}</li>" for p in result.pruned)
        strategy = (f"<p><b>Strategy</b>: {html.escape(result.strategy.name)} "
                    f"({html.escape(result.strategy.reason)})</p>" if result.strategy is not None else "")
        best = (f"<p><b>Best</b>: {html.escape(repr(result.best))}</p><pre>{html.escape(result.export_lines())}\n\n"
                f"{html.escape(result.wrap_call())}</pre>" if result.improved else "")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
        self.best.value = (strategy + best + (f"<b>Pruned</b><ul>{pruned}</ul>" if pruned else "")
                           + (f"<b>Notes</b><ul>{notes}</ul>" if notes else "")
                           + f"<p>folder: <code>{html.escape(str(result.path))}</code></p>")

    def stop(self) -> None:
        if self.tuner is not None and self.running:
            self.status.value = "stopping after the current burst..."
            self.tuner.stop()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def __repr__(self) -> str:
        best = self.result.best_name if self.result is not None else None
        return f"TunePanel(goal={self.goal.value!r}, budget={self.budget.value}, running={self.running}, best={best!r})"


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return f"<span style='color:#c00'>{html.escape(text)}</span>"
