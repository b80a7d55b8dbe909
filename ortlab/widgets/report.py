"""The Report tab: one button that writes the offline HTML page (ortlab.report) of the newest comparison the Lab
made, beside its runs, and shows where it is. Thin over ortlab.reporting."""

from __future__ import annotations

import html
import os
from collections.abc import Callable

import ipywidgets as W


def newest_comparison(runs: list) -> list:
    """The runs of the newest comparison among `runs` (oldest first): the last run with the PyTorch run it was
    compared with and that run's other partners; a lone run alone; [] without runs."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.runs.groups import newest_comparison as newest

    return newest(runs, BACKENDS)


class ReportPanel(W.VBox):
    """`ReportPanel(runs)`: `runs()` returns the Lab's runs, oldest first; Write report writes the newest
    comparison's page (`write()` from code)."""

    def __init__(self, runs: Callable[[], list]):
        self._runs_fn = runs
        self.button = W.Button(description="Write report", icon="file-text", button_style="primary",
                               tooltip="one HTML page of the newest comparison (offline, self-contained): to hand on")
        self.about = W.HTML()
        self.result = W.HTML()
        self.path = None
        self.button.on_click(lambda _: self.write())
        super().__init__([W.HBox([self.button, self.about]), self.result])
        self.refresh()

    def refresh(self) -> None:
        runs = newest_comparison(list(self._runs_fn() or []))
        self.button.disabled = not runs
        self.about.value = ("<span style='color:#555'>no runs yet: run a burst first</span>" if not runs else
                            "<span style='color:#555'>the newest comparison: "
                            + html.escape(", ".join(f"{r.backend} ({r.path.name})" for r in runs)) + "</span>")

    def write(self):
        """Write the page of the newest comparison; its path (None when there is no run), shown with a link."""
        from ortlab.reporting import report

        runs = newest_comparison(list(self._runs_fn() or []))
        if not runs:
            self.result.value = "<span style='color:#c00'>no runs yet: run a burst first</span>"
            return None
        try:
            self.path = report(*runs)
        except Exception as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.result.value = f"<span style='color:#c00'>{html.escape(text)}</span>"
            return None
        shown = os.path.relpath(self.path) if self.path.resolve().is_relative_to(os.getcwd()) else str(self.path)
        size = self.path.stat().st_size / 2**20
        self.result.value = (f"wrote <a href='{html.escape(shown)}' target='_blank'><code>{html.escape(shown)}"
                             f"</code></a> ({size:.2f} MB): one page, readable offline in any browser; "
                             f"<code>ortlab report {' '.join(html.escape(str(r.path)) for r in runs)}</code> "
                             "writes the same")
        return self.path
