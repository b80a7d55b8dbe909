"""Tune panel: `ortlab.tune` over the Lab's session: the goal and budget, Run and Stop, progress as it runs, then
the table, the pareto figure and the best settings (export lines, the wrap call)."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import ipywidgets as W

from ortlab.engine.progress import Pace, duration
from ortlab.widgets.background import Background, error_html
from ortlab.widgets.export import SaveButton, shown_path
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import MISSING, flexible, row, stop_button, table

_COLUMNS = ["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
            "memory_change_pct", "rss_mb"]  # the reasons, sentences, go in a list under the table
HEADERS = {"median_step_ms": "median step after warm-up (ms)", "time_change_pct": "step time change",
           "activation_mb": "activation peak (MB)", "memory_change_pct": "activation change",
           "rss_mb": "resident set (MB)"}
_WHERE = re.compile(r"candidate (\d+)/(\d+)")


class TunePanel(Background, W.VBox):
    """Thin over ortlab.tuning.Tuner: Run starts a tuning in a background thread (`wait=True` blocks), Stop ends it
    after the burst in progress and shows what was measured."""

    def __init__(self, session=None, budget: float = 10.0, steps: int = 8):
        self._session = session
        self.tuner = None
        self.result = None
        self.on_done: Callable[[], None] | None = None  # after a tuning (the Lab refreshes its tabs)
        self.goal = W.Dropdown(options=["time", "memory", "both"], value="time", description="goal",
                               layout=W.Layout(width="200px"))
        self.conditions = flexible(W.Text(value="", placeholder="e.g. memory: percent-max-degradation 10",
                                          description="conditions"), "300px", "480px")
        self.budget = W.BoundedFloatText(value=budget, min=0.1, max=24 * 60, step=1, description="minutes",
                                         layout=W.Layout(width="180px"))
        self.steps = W.BoundedIntText(value=steps, min=5, max=100_000, description="steps",
                                      tooltip="steps per measured burst; the first ones are warm-up, the median is "
                                      "taken over the rest", layout=W.Layout(width="180px"))
        self.run_button = W.Button(description="Tune", button_style="primary", icon="play",
                                   tooltip="the defaults first, then one knob at a time, then the winners combined")
        self.stop_button = stop_button("end after the current burst; keep what was measured")
        self.status = W.HTML()
        self.pace = W.HTML()  # "baseline 2/3 · step 5/8 · 40 s of 10 min"
        self.progress = W.HTML()
        self.table = W.HTML()
        self.plot = figure_area(width="650px")
        self.best = W.HTML()
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        out = lambda: self.session.out  # noqa: E731
        self.save_table = SaveButton("tune table", lambda: None if self.result is None else self.result.table, out,
                                     kind="CSV")
        self.save_plot = SaveButton("tune pareto", lambda: self.plot.value, out)
        self._phase, self._pace, self._started = "", None, 0.0
        super().__init__([row(self.goal, self.budget, self.steps), row(self.conditions),
                          row(self.run_button, self.stop_button, self.pace), self.status, self.progress,
                          row(W.HTML("<b>Settings measured</b> (the baseline first; rejected: the verdict "
                                     "diverged)"), self.save_table),
                          self.table, self.plot, row(self.save_plot), self.best])

    @property
    def session(self):
        if self._session is None:
            from ortlab.engine.session import Session

            self._session = Session()
        return self._session

    def goals(self) -> list[str]:
        return [self.goal.value, *(c for c in self.conditions.value.split(";") if c.strip())]

    def run(self, wait: bool = False, **kwargs) -> None:
        """Start a tuning with the panel's goal, budget and steps (keywords go to Tuner: only, repeats, ...)."""
        from ortlab.tuning import Tuner

        if self.running:
            self.status.value = error_html(RuntimeError("a tuning is already running"))
            return
        lines: list[str] = []

        def progress(event: dict) -> None:
            lines.append(event["text"])
            where = _WHERE.search(event["text"])
            self._phase = (f"candidate {where[1]}/{where[2]}" if where else event["text"].split(":")[0].strip()
                           if event["phase"] in ("baseline", "guard", "confirm") else self._phase)
            warned = [line for line in lines if line.startswith("warning: ")]
            self.progress.value = ("".join(f"<div style='color:#b35900'>{html.escape(w)}</div>" for w in warned)
                                   + "<pre style='font-size:11px;line-height:1.35'>"
                                   + html.escape("\n".join(lines[-12:])) + "</pre>")

        try:
            self.tuner = Tuner(self.session, self.goals(), self.budget.value, steps=self.steps.value,
                               warmup=min(3, self.steps.value - 3), on_progress=progress,
                               on_step=self._step, **kwargs)
        except Exception as e:
            self.status.value = error_html(e)
            return
        import time

        self._started, self._pace = time.monotonic(), None
        self.status.value = "tuning: the baseline first (repeated for its noise)..."
        self.best.value = self.pace.value = ""
        self.table.value = _greyed(self.table.value)  # the last tuning's, until this one has rows
        self.plot.value = b""
        self.run_button.disabled, self.stop_button.disabled = True, False
        self._in_background(self._work, wait=wait)

    def _step(self, row: dict) -> None:
        """A step of the burst in progress: "candidate 2/5 · step 3/8 · 1.2 min of 10 min"."""
        import time

        if self._pace is None or row.get("step") == 0:
            self._pace = Pace(self.tuner.steps if row.get("step") == 0 or self._pace is None else self._pace.total)
        self._pace.step(row)
        spent = time.monotonic() - self._started
        parts = [self._phase, f"step {self._pace.done}/{self._pace.total}" if self._pace.done <= self._pace.total
                 else "", f"{duration(spent)} of {duration(self.tuner.budget_s)}"]
        where, cost = _WHERE.search(self._phase), getattr(self.tuner, "_cost", None)
        if where and cost and not self.tuner.stopped:  # the candidates left at the measured cost of one, within
            # the budget: while that means something (a second or more; nothing after a Stop)
            left = min(self.tuner.budget_s - spent, (int(where[2]) - int(where[1]) + 1) * cost)
            if left >= 1:
                parts.append(f"~{duration(left)} left")
        self.pace.value = f"<span style='color:#444'>{html.escape(' · '.join(p for p in parts if p))}</span>"

    def _work(self) -> None:
        try:
            self.show(self.tuner.run())
        except Exception as e:  # shown in the panel, never printed over the notebook
            self.status.value = error_html(e)
            if self.tuner is not None and self.tuner.result is not None:
                self.show(self.tuner.result, status=False)
        finally:
            self.pace.value = f"<span style='color:#444'>{html.escape(self._ended())}</span>"
            self.run_button.disabled, self.stop_button.disabled = False, True
            if self.on_done is not None:
                self.on_done()

    def _ended(self) -> str:
        """The progress line once the tuning ended: how, and how long it took (no estimate of a time left)."""
        import time

        result = getattr(self.tuner, "result", None)
        how = "stopped" if result is not None and result.stopped else "finished" if result is not None else "ended"
        return f"{how} · {duration(time.monotonic() - self._started)}"

    def show(self, result, status: bool = True) -> None:
        """Show a Tuning: its table, pareto figure and best settings."""
        from ortlab.common.plots import figure_png

        self.result = result
        if status:
            color = "#666" if result.stopped else "#000"
            stopped = " (stopped by you: what was measured is kept)" if result.stopped else ""
            self.status.value = f"<span style='color:{color}'>{html.escape(result.headline() + stopped)}</span>"
        if result.rows:
            frame = result.table
            why = "".join(f"<li><b>{html.escape(str(name))}</b>: {html.escape(str(reasons))}</li>"
                          for name, reasons in zip(frame["candidate"], frame["reasons"], strict=True)
                          if name != "baseline" and reasons)
            self.table.value = table(_shown(frame), headers=HEADERS) + (f"<ul style='margin:4px 0'>{why}</ul>"
                                                                       if why else "")
            self.plot.value = figure_png(result.pareto())
        pruned = "".join(f"<li>{html.escape(p.name)}: {html.escape(p.reason)}</li>" for p in result.pruned)
        strategy = (f"<p><b>Strategy</b>: {html.escape(result.strategy.name)} "
                    f"({html.escape(result.strategy.reason)})</p>" if result.strategy is not None else "")
        best = (f"<p><b>Best</b>: {html.escape(repr(result.best))}</p><pre>{html.escape(result.export_lines())}\n\n"
                f"{html.escape(result.wrap_call())}</pre>" if result.improved else "")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
        self.best.value = (strategy + best + (f"<b>Pruned</b><ul>{pruned}</ul>" if pruned else "")
                           + (f"<b>Notes</b><ul>{notes}</ul>" if notes else "")
                           + f"<p>folder: <code>{html.escape(shown_path(result.path))}</code></p>")

    def stop(self) -> None:
        if self.tuner is not None and self.running:
            self.status.value = "stopping after the current burst..."
            self.tuner.stop()

    def __repr__(self) -> str:
        best = self.result.best_name if self.result is not None else None
        return f"TunePanel(goal={self.goal.value!r}, budget={self.budget.value}, running={self.running}, best={best!r})"


def _shown(frame):
    """The tune table as the panel shows it: each change as measured with its sign, "(in noise)" where the
    baseline's noise covers it (it counts as no change)."""
    shown = frame[_COLUMNS].copy()
    inside = frame["inside_noise"] if "inside_noise" in frame else [""] * len(frame)
    for column, metric in (("time_change_pct", "time"), ("memory_change_pct", "memory")):
        shown[column] = [MISSING if value is None or value != value or name == "baseline" else
                         f"{value:+.1f}%" + (" (in noise)" if metric in (noise or "").split(", ") else "")
                         for value, noise, name in zip(frame[column], inside, frame["candidate"], strict=True)]
    return shown


def _greyed(text: str) -> str:
    return f"<div style='opacity:0.45'>{text}</div>" if text else ""
