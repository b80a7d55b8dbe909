"""The runs of a folder as rows (`ortlab.list_runs`, `ortlab runs`): each run's summary, with its verdict's numbers
in one line beside what it said. Above the verdict on purpose: a run folder (ortlab.runs.run) knows nothing of how a
verdict is judged or worded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.runs.run import Run, RunError, load_run
from ortlab.verdict.judge import FILE, evidence


def summary_row(run: Run) -> dict[str, Any]:
    """A run's summary (Run.summary) with, for a judged run, the verdict's evidence in one line after its status,
    then when it started and where it is."""
    out: dict[str, Any] = {}
    for key, value in run.summary().items():
        out[key] = value
        if key == "verdict":
            verdict = run.read_json(FILE)
            line = evidence(verdict) if isinstance(verdict, dict) else None
            if line:
                out["verdict_evidence"] = line
    return {**out, "started": run.meta.get("started"), "path": str(run.path)}


def list_runs(folder: str | Path = "runs", asked: bool = False):
    """The user's runs in `folder`, newest first, as a DataFrame; `asked`: also the runs ortlab made for its own
    purposes (Tune's, the plans', a verdict's evidence: kept under what asked for them, ortlab.runs.groups), with the
    column "asked_by" saying for what."""
    import pandas as pd

    from ortlab.runs import groups

    rows = []
    folder = Path(folder)
    metas = [*folder.glob("*/meta.json"), *(folder.glob(f"**/{groups.OWN}/*/meta.json") if asked else ())]
    for meta in metas if folder.is_dir() else ():
        try:
            run = load_run(meta.parent)
            why = groups.asked_by(run)
            if why is None:
                rows.append(summary_row(run))
            elif asked:
                made_for = f"{why.get('purpose')} of {why.get('folder') or 'ortlab'}"
                rows.append({**summary_row(run), "asked_by": made_for})
        except RunError as e:  # one damaged run must not hide the others
            rows.append({"run": meta.parent.name, "status": "unreadable", "error": str(e),
                         "started": None, "path": str(meta.parent)})
    df = pd.DataFrame(rows)
    return df.sort_values("started", ascending=False, ignore_index=True, na_position="last") if len(df) else df
