"""Log panel: the captured log of a chosen run, filterable by level and source, newest first. A distributed run
has one log per rank and the launcher's: the rank picker chooses (the failed rank's, else rank 0's, first)."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from ortlab.common.capture import log_records
from ortlab.widgets.layout import flexible, row, status_word

LEVELS = ["all", "WARNING and above", "ERROR and above"]
_RANK = {"VERBOSE": 0, "DEBUG": 0, "OUTPUT": 1, "INFO": 1, "WARNING": 2, "ERROR": 3, "CRITICAL": 3, "FATAL": 3}


class LogPanel(W.VBox):
    def __init__(self, runs: Callable[[], list]):
        self.get_runs = runs
        self.run = flexible(W.Dropdown(description="run", options=[]), "360px", "520px")
        self.rank = W.Dropdown(description="log of", options=[], layout=W.Layout(width="220px", display="none"))
        self.level = flexible(W.Dropdown(description="level", options=LEVELS, value="all"), "220px", "300px")
        self.source = flexible(W.Dropdown(description="source", options=["all", "ortmodule", "ortlab", "output"],
                                          value="all"), "200px", "300px")
        self.search = flexible(W.Text(description="contains", continuous_update=False), "220px", "300px")
        self.view = W.HTML()
        self._quiet = False  # set while the panel itself fills the rank picker
        self.run.observe(lambda _: self._show_ranks(), names="value")
        self.rank.observe(lambda _: None if self._quiet else self.render(), names="value")
        for control in (self.level, self.source, self.search):
            control.observe(lambda _: self.render(), names="value")
        super().__init__([row(self.run, self.rank), row(self.level, self.source, self.search), self.view])
        self.refresh()

    def refresh(self) -> None:
        runs = list(reversed(self.get_runs()))
        self.run.options = [(f"{r.path.name} ({status_word(r.status)})", i) for i, r in enumerate(runs)]
        self._runs = runs
        if runs:  # the newest run that logged anything (a burst that reused its ORTModule may log nothing)
            self.run.value = next((i for i, r in enumerate(runs) if r.log.strip()), 0)
        self._show_ranks()

    def _show_ranks(self) -> None:
        """The rank picker of the chosen run: its ranks and the launcher, shown only for a distributed run."""
        runs = getattr(self, "_runs", None)
        ranks = runs[self.run.value].ranks if runs and self.run.value is not None else []
        failed = runs[self.run.value].meta.get("failed_rank") if ranks else None
        numbers = [int(r.path.name) for r in ranks]
        options = [(f"rank {n}", n) for n in numbers] + [("launcher", -1)] if ranks else []
        self._quiet = True  # one render below, not one per change
        try:
            self.rank.options = options
            self.rank.value = (failed if failed in numbers else numbers[0]) if ranks else None
        finally:
            self._quiet = False
        self.rank.layout.display = None if ranks else "none"
        self.render()

    def log(self) -> str:
        """The chosen log: the run's, or a rank's of a distributed run (-1: the launcher's, the run's own)."""
        run = self._runs[self.run.value]
        if self.rank.value is None or self.rank.value < 0:
            return run.log
        return next((r.log for r in run.ranks if int(r.path.name) == self.rank.value), "")

    def records(self) -> list[dict]:
        if not getattr(self, "_runs", None) or self.run.value is None:
            return []
        minimum = {"all": 0, "WARNING and above": 2, "ERROR and above": 3}[self.level.value]
        out = []
        for rec in reversed(log_records(self.log())):
            if _RANK.get(rec["level"], 1) < minimum:
                continue
            if self.source.value != "all" and rec["source"] != self.source.value:
                continue
            if self.search.value and self.search.value.lower() not in rec["text"].lower():
                continue
            out.append(rec)
        return out

    def render(self) -> None:
        recs = self.records()
        if not recs:
            runs = getattr(self, "_runs", None)
            empty = runs and self.run.value is not None and not self.log().strip()
            self.view.value = "<i>this run logged nothing</i>" if empty else "<i>no log records match</i>"
            return
        body = "\n".join(html.escape(r["text"]) for r in recs[:2000])
        more = f"<i>{len(recs) - 2000} more not shown</i>" if len(recs) > 2000 else ""
        self.view.value = (f"<div style='max-height:400px;overflow:auto'><pre style='font-size:11px'>{body}</pre>"
                           f"</div>{more}")

    def __repr__(self) -> str:
        rank = f", rank={self.rank.value}" if self.rank.options else ""
        return (f"LogPanel(runs={len(self.run.options)}{rank}, level={self.level.value!r}, "
                f"source={self.source.value!r})")
