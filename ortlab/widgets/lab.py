"""The Lab: ortlab's panels as tabs over one Session. Displaying it is the whole user interface: its widgets, and
beside them its last results as plain HTML (ortlab.widgets.static) for wherever no widget front end runs."""

from __future__ import annotations

import contextlib
import html
import importlib
from pathlib import Path
from typing import Any

import ipywidgets as W

from ortlab.engine.backends import default_backends, has
from ortlab.options import Options
from ortlab.stacks.table import ortmodule_line
from ortlab.widgets.burst_panel import BurstPanel
from ortlab.widgets.export import shown_path
from ortlab.widgets.layout import STYLE
from ortlab.widgets.log_panel import LogPanel
from ortlab.widgets.options_panel import OptionsPanel

# The view tabs: title -> (module, class, how it is built, whether it is ORTModule's alone). A view that fails to
# load shows its error in its tab; one that is ORTModule's alone says, where ORTModule does not run, why and where.
_VIEW_TABS = (
    ("Graphs", "ortlab.widgets.graphs", "GraphsPanel", "runs", False),
    ("Recompute", "ortlab.widgets.recompute", "RecomputePanel", "session", True),
    ("Activations", "ortlab.widgets.activations", "ActivationsPanel", "runs", False),
    ("Memory", "ortlab.widgets.memory", "MemoryPanel", "runs", False),
    ("Time", "ortlab.widgets.time", "TimePanel", "runs", False),
    ("Tune", "ortlab.widgets.tune", "TunePanel", "session", True),
    ("Move", "ortlab.widgets.move", "MovePanel", "runs", False),
    ("Report", "ortlab.widgets.report", "ReportPanel", "runs", False),
)


class Lab(W.Tab):
    """`ortlab.Lab()` over the bundled demo, or `ortlab.Lab(my_factory, {"kw": 1})` over your model.

    Everything it does is a Session call (`lab.session`); `lab.runs` are the runs it made, oldest first.
    """

    def __init__(self, model_factory: Any = None, model_kwargs: dict | None = None, out: str = "runs",
                 in_process: bool = False, cuda_available: bool | None = None):
        from ortlab.engine.session import Session

        self.session = Session(model_factory, model_kwargs or {}, out=out, in_process=in_process)
        # The panel shows ORTMODULE_* variables set in the shell as its starting values, and owns them from then on.
        self.options_panel = OptionsPanel(cuda_available=cuda_available, start=self.session.shell_options)
        self.session.shell_options = Options()
        self.ortmodule_missing = ortmodule_line()  # the current stack: ORTModule's own tabs say so instead
        if self.ortmodule_missing:
            note = _note(f"{self.ortmodule_missing}. These options are ORTModule's: set here, they are kept in the "
                         "runs' settings and used on the ort stack.")
            self.options_panel.children = (*note.children, *self.options_panel.children)
        self.burst_panel = BurstPanel(self.session, lambda: self.options_panel.options, on_done=self._after_burst)
        self.log_panel = LogPanel(lambda: self.runs)
        panels = {"Options": self.options_panel, "Burst": self.burst_panel, "Log": self.log_panel}
        self.extra_panels: dict[str, W.Widget] = {}
        for title, module, cls, needs, ortmodule_only in _VIEW_TABS:
            if ortmodule_only and self.ortmodule_missing:
                panels[title] = _note(f"The {title} tab is ORTModule's. {self.ortmodule_missing}.")
                continue
            try:
                panel_cls = getattr(importlib.import_module(module), cls)
                panel = panel_cls(self.session) if needs == "session" else panel_cls(lambda: self.runs)
            except Exception as e:  # one broken view must not take the Lab down: say what broke, in its tab
                panels[title] = _broken_view(title, module, e)
                continue
            self.extra_panels[title] = panels[title] = panel
            if hasattr(panel, "on_done"):  # Tune, Find plans: every tab shows what their action changed
                panel.on_done = lambda: self._after_burst([])
        # the model's name atop every tab (one widget shown in each), with the Lab's stylesheet (ortlab.widgets.layout)
        self.header = W.HTML(self._header())
        for panel in panels.values():
            if isinstance(panel, W.Box):
                panel.children = (self.header, *panel.children)
        super().__init__(children=list(panels.values()), titles=tuple(panels))
        self.add_class("ortlab-lab")
        self.selected_index = 1
        self._static_id: str | None = None  # the display id of the static results, once the Lab was displayed
        self._last: tuple[list, str, bytes | None] = ([], "", None)  # the last burst's runs, status HTML, distances
        self._mirror = None  # the Lab as one anywidget, once asked for (marimo asks: _display_)

    @property
    def runs(self) -> list:
        """The user's runs the Lab's session made, oldest first (not the ones Tune, Recompute or a verdict made for
        their own purposes: ortlab.runs.groups.users)."""
        from ortlab.runs.groups import users

        return users(self.session.runs)

    def compare(self, steps: int = 20, **kwargs):
        """A PyTorch burst beside an ORTModule one (on the current stack, torch.compile) with the panel's current
        options (what the Run button does for backend 'both'), returned as a Comparison."""
        comparison = self.session.compare(steps, self.options_panel.options, **kwargs)
        verdicts = {b: v for b in comparison.others if (v := comparison.verdict_of(b)) is not None}
        status = self.burst_panel._summary(comparison.runs, verdicts)
        with contextlib.suppress(Exception):  # a recommendation that cannot be made costs nothing of the results
            status += f"<br><b>{html.escape(comparison.recommendation().line)}</b>"
        self._after_burst(comparison.runs, status)
        return comparison

    def burst(self, backend: str | None = None, steps: int = 20, **kwargs):
        """One burst with the Options tab's options, shown in the Lab's panels; returns the Run. The backend by
        default is the one a comparison sets beside PyTorch here: ORTModule, or torch.compile on the current stack."""
        run = self.session.burst(backend or default_backends()[1], steps, self.options_panel.options, **kwargs)
        self._after_burst([run], self.burst_panel._summary([run]))
        return run

    def _header(self, style: bool = True) -> str:
        """The model the Lab trains, by name (its class and arguments, size and batch once a burst has built it);
        `style`: with the Lab's stylesheet (not in the static results, which it hides)."""
        model = next((r.meta.get("model") for r in reversed(self.session.runs) if r.meta.get("model")), None) or {}
        ref = self.session.ref.describe()
        name = model.get("name") or ref
        facts = [f"{ref}" if name != ref else "",
                 f"{model['parameters']:,} parameters" if model.get("parameters") else "",
                 f"batch {model['batch_size']}" if model.get("batch_size") else "",
                 "" if model else "its size once a burst has built it",
                 f"runs in {shown_path(Path(self.session.out))}"]
        return ((STYLE if style else "") + "<div style='line-height:1.4;margin:2px 0 6px'><b>model</b> "
                + html.escape(name) + "<span style='color:#666'> · " + html.escape(" · ".join(f for f in facts if f))
                + "</span></div>")

    def _after_burst(self, runs: list, status: str | None = None) -> None:
        """Every tab shows what a burst (or Tune, Find plans: `runs` empty) changed; the static results the last
        burst's (the Burst tab's Run: its status and distances)."""
        self.header.value = self._header()
        if runs:
            panel = self.burst_panel
            ran_here = runs == panel.last_runs
            self._last = (list(runs), panel.status.value if ran_here else status or "",
                          panel.distances.value or None if ran_here else None)
            self._show_static()
        if any(has(r.backend, "onnx_stages") for r in runs):  # a burst that ran ORTModule's options
            self.options_panel.reference = self.options_panel.options
            self.options_panel._refresh()
        self.log_panel.refresh()
        for panel in self.extra_panels.values():
            if hasattr(panel, "refresh"):
                panel.refresh()

    def static_html(self) -> str:
        """The last burst's results as self-contained HTML (ortlab.widgets.static): what an exported HTML, GitHub
        and nbviewer show of the Lab."""
        from ortlab.widgets.static import results_html

        runs, status, distances = self._last
        return results_html(self._header(style=False), runs, status, None, distances)

    def _ipython_display_(self) -> None:
        """The widgets (what JupyterLab, Notebook, VS Code and Colab show), then the static results as an output of
        their own, which every burst updates (where the widgets render, the Lab's stylesheet hides it)."""
        import uuid

        from IPython.display import display

        from ortlab.widgets.static import bundle

        display(self._repr_mimebundle_(), raw=True)
        self._static_id = self._static_id or f"ortlab-lab-{uuid.uuid4().hex}"
        display(bundle(self.static_html()), raw=True, display_id=self._static_id)

    def mirror(self):
        """The Lab as one anywidget (ortlab.widgets.mirror: its JavaScript ships in ortlab), for the front ends that
        render anywidget and not ipywidgets' containers (marimo), or fetch widget code from a CDN; shown by
        `display(lab.mirror())` in JupyterLab too. Every panel works through it as it does in the widgets."""
        if self._mirror is None:
            from ortlab.widgets.mirror import Mirror

            self._mirror = Mirror(self)
        return self._mirror

    def _display_(self):
        """marimo's display protocol: a cell that ends with the Lab shows its anywidget mirror."""
        return self.mirror()

    def _show_static(self) -> None:
        """The static results updated where the Lab was displayed (nowhere else: no output outside IPython)."""
        if self._static_id is None:
            return
        from IPython.display import update_display

        from ortlab.widgets.static import bundle

        with contextlib.suppress(Exception):  # a failed extra output never costs the burst it shows
            update_display(bundle(self.static_html()), raw=True, display_id=self._static_id)

    def close(self) -> None:
        """Stop the worker and whatever the panels run (a netron server, a burst thread)."""
        if "extra_panels" not in self.__dict__:  # __init__ failed (a bad model): nothing was started
            return
        for panel in (self.burst_panel, *self.extra_panels.values()):
            if getattr(panel, "running", False):
                panel.stop()
        for panel in self.extra_panels.values():
            panel.close()
        if self._mirror is not None:
            self._mirror.close()
        self.session.close()
        super().close()

    def __repr__(self) -> str:
        tabs = ", ".join(self.titles)
        return f"Lab(model={self.session.ref.describe()!r}, tabs=[{tabs}], runs={len(self.runs)})"


def _broken_view(title: str, module: str, error: Exception) -> W.HTML:
    return W.HTML(f"<p><b>The {html.escape(title)} view could not load</b> ({html.escape(module)}): "
                  f"<code>{html.escape(type(error).__name__)}: {html.escape(str(error))}</code></p>")


def _note(text: str) -> W.VBox:
    """A line where a tab's content would be (in a box: the model's name goes atop it as on every tab)."""
    return W.VBox([W.HTML(f"<p style='color:#555'>{html.escape(text)}</p>")])
