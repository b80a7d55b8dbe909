"""What runs say to a person: the list of runs (`listing`, `ortlab runs`), runs named by what sets them apart
(`labels`), per-node data over an exported graph (`overlay`), and a report a user can hand on: one self-contained
HTML page for a comparison's runs, a folder of runs or a tuning (`ortlab.report`, `ortlab report RUN...`, the Lab's
Report button). Runs are read, never executed.

Modules of the report: sources (what the arguments name, which runs were compared with which), gather (the sections
as plain data), views (the sections ortlab's views own: time, memory, statistics, graphs, plans, tunings), figures
(PNG data URIs), page (the HTML).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from ortlab.reporting.sources import ReportError

__all__ = ["ReportError", "report"]


def report(*runs: Any, out: str | Path | None = None) -> Path:
    """Write one offline HTML page about `runs` (Comparisons, Runs, run folders, folders of runs, tuning folders)
    and return its path: what was run, the summary, verdicts, losses, time and what changed in it, memory, the first
    divergence, graphs, recompute plans, tunings and how to reproduce. `out`: the file (default: report-<time>.html
    in the folder of the first run, or the folder given)."""
    from ortlab.reporting.gather import gather
    from ortlab.reporting.page import render
    from ortlab.reporting.sources import collect

    sources = collect(*runs)
    if not sources.runs and not sources.tunings:
        raise ReportError("nothing to report on: no run and no tuning in " + ", ".join(sources.given))
    path = Path(out).expanduser() if out is not None else _default(sources)
    if path.is_dir():
        path = path / _default(sources).name
    html = render(gather(sources))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path


def _default(sources) -> Path:
    folder = sources.runs[0].path.parent if sources.runs else sources.tunings[0]
    return folder / f"report-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.html"
