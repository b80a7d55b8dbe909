"""The Graphs tab's overlay: per-node data (the statistics' difference against PyTorch, ORT's kernel time, the
bytes alive) over the drawn neighbourhood, in the colours Model Explorer shows for the same JSON
(`ortlab graphs RUN --overlay KIND`), with the nodes of largest value listed. Thin over ortlab.reporting.overlay."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from ortlab.reporting.overlay import KINDS


class OverlayControl(W.VBox):
    """A picker (none, stats, time, memory) for the run shown; `current` is the Overlay (None: none picked or the
    run has no such data, said in its line); `on_change()` redraws the node view."""

    def __init__(self, on_change: Callable[[], None] | None = None):
        self.picker = W.ToggleButtons(options=["none", *KINDS], value="none", description="overlay",
                                      tooltip="colour the nodes by the statistics' difference against PyTorch, ORT's "
                                      "kernel time or the activation bytes alive")
        self.line = W.HTML()
        self.top = W.HTML()
        self.current = None
        self._run = None
        self._on_change = on_change
        self.picker.observe(lambda _: self._pick(), "value")
        super().__init__([self.picker, self.line, self.top])

    def load(self, run) -> None:
        """The run whose execution graph the overlay colours (None: clear it)."""
        self._run = run
        self._pick(redraw=False)

    def _pick(self, redraw: bool = True) -> None:
        from ortlab.reporting.overlay import overlay

        self.current, self.top.value = None, ""
        kind = self.picker.value
        if kind == "none" or self._run is None:
            self.line.value = ""
        else:
            try:
                self.current = overlay(self._run, kind)
            except Exception as e:
                text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                self.line.value = f"<span style='color:#c00'>no {kind} overlay: {html.escape(text)}</span>"
            else:
                o = self.current
                self.line.value = (f"<span style='color:#555'>{len(o.values)} nodes of {html.escape(o.stage_file.name)}"
                                   f": {html.escape(o.unit)}; the same JSON for Model Explorer: <code>ortlab graphs "
                                   f"{html.escape(str(self._run.path))} --overlay {kind}</code></span>")
                rows = "".join(f"<tr><td style='background:{o.colors[n]}'>{v:.4g}</td><td>{html.escape(n)}</td></tr>"
                               for n, v in o.top(8).itertuples(index=False))
                self.top.value = f"<table><tr><th>value</th><th>node (largest first)</th></tr>{rows}</table>"
        if redraw and self._on_change is not None:
            self._on_change()
