"""A report's content as plain data, section by section, from its Sources: what was run, the summary table, the
verdicts, the loss curves, and how to run it again; the views' sections (time, memory, statistics, graphs,
recompute plans, tunings) come from `reporting.views`. A section without data says why and how to collect it."""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from ortlab.reporting import views
from ortlab.reporting.sources import Sources
from ortlab.runs import facts, groups
from ortlab.runs.provenance import command, python_call, repro_script, what_ran
from ortlab.runs.run import Run, RunStatus

SECTIONS = ("what was run", "summary", "verdict", "the move", "loss curves", "where the time goes",
            "what changed in the time", "memory", "first divergence", "exported graphs", "recompute plans", "tuning",
            "how to reproduce")


def labels(runs: list[Run]) -> dict[str, str]:
    """Each run's label on the page: its backend, with the run's name where two runs share a backend."""
    backends = [r.backend for r in runs]
    return {r.path.name: r.backend if backends.count(r.backend) == 1 else f"{r.backend} ({r.path.name})"
            for r in runs}


def gather(sources: Sources) -> dict[str, Any]:
    """Every section's data (JSON-ready) for the page of `sources`."""
    from ortlab import __version__

    runs, pairs = sources.runs, sources.pairs()
    names = labels(runs)
    return {"generated": _dt.datetime.now().isoformat(timespec="seconds"), "ortlab": __version__,
            "given": sources.given, "labels": names,
            "what was run": [what_ran(r) for r in runs],
            "summary": _summary(runs, names, pairs),
            "verdict": _verdicts(runs, names),
            "the move": _moves(runs, pairs, names),
            "loss curves": _losses(runs, names),
            "where the time goes": views.time_tables(runs),
            "what changed in the time": views.time_diffs(pairs, names),
            "memory": views.memory(runs, names),
            "first divergence": views.divergences(pairs, names),
            "exported graphs": views.graphs(runs, names),
            "recompute plans": views.plans(runs, names),
            "tuning": views.tunings(sources.tunings),
            "how to reproduce": _reproduce(runs, pairs, names)}


def _summary(runs: list[Run], names: dict[str, str], pairs: list[tuple[Run, Run]]) -> dict[str, Any]:
    """The labelled rows every summary starts with, one column per run; each compared run against PyTorch; and
    each comparison's recommendation."""
    summaries = {r.path.name: r.summary() for r in runs}
    rows = [[fact.title, *cells] for fact, cells in facts.rows([summaries[r.path.name] for r in runs])]
    versus = []
    for reference, run in pairs:
        a, b = summaries[reference.path.name], summaries[run.path.name]
        ratio = (b["median_step_s"] / a["median_step_s"]) if a.get("median_step_s") and b.get("median_step_s") \
            else None
        diffs = [abs(x - y) for x, y in zip(reference.losses, run.losses, strict=False)
                 if math.isfinite(x) and math.isfinite(y)]
        versus.append({"run": names[run.path.name], "against": names[reference.path.name],
                       "max_loss_diff": max(diffs) if diffs else None, "step_time_ratio": ratio,
                       "not_compared": f"it fell back to PyTorch ({run.error})" if run.status == RunStatus.FALLBACK
                       else None})
    return {"columns": [names[r.path.name] for r in runs], "rows": rows, "versus": versus,
            "recommendations": _recommendations(runs, pairs)}


def _recommendations(runs: list[Run], pairs: list[tuple[Run, Run]]) -> list[str]:
    """Each comparison's recommendation (ortlab.comparison.summary.Comparison), as `ortlab compare` prints it."""
    from ortlab.comparison.summary import Comparison

    out = []
    for comparison_runs in groups.comparisons(pairs):
        members = {r.backend: r for r in comparison_runs}
        try:
            comparison = Comparison(**members, backends=tuple(members))
            out.append(comparison.recommendation().line)
        except Exception as e:  # a damaged run: the rest of the page still says what it can
            out.append(f"no recommendation: {type(e).__name__}: {e}")
    return out


def _verdicts(runs: list[Run], names: dict[str, str]) -> dict[str, Any]:
    from ortlab.verdict.judge import FILE, Verdict, evidence
    from ortlab.verdict.ops import table_of

    items = []
    for run in runs:
        data = run.read_json(FILE)
        if not data:
            continue
        verdict = Verdict.from_dict(data)
        items.append({"run": names[run.path.name], "status": verdict.status, "headline": verdict.headline,
                      "evidence": evidence(data), "causes": [c.get("text") for c in verdict.causes],
                      "notes": verdict.notes, "localized": (data.get("localized") or {}).get("text"),
                      "ops": _op_lines(table_of(data))})
    missing = None if items else ("no run here was judged against PyTorch: a verdict comes with a comparison "
                                  "(ortlab compare, ortlab burst --backend both, Session.compare)")
    return {"items": items, "missing": missing}


def _op_lines(table: dict[str, Any] | None) -> list[str]:
    """The ops inside the localized module as the CLI prints them (ortlab.verdict.ops.lines; [] without them)."""
    from ortlab.verdict.ops import lines

    return lines(table) if table else []


def _moves(runs: list[Run], pairs: list[tuple[Run, Run]], names: dict[str, str]) -> dict[str, Any]:
    """The move report (ortlab.move) of each ORTModule run here beside a torch.compile run: the one compared with
    the same PyTorch run, else the newest; no items (the page leaves the section out) without both."""
    from ortlab.engine.backends import has
    from ortlab.move.report import move_report

    compiled = [r for r in runs if not has(r.backend, "onnx_stages") and not has(r.backend, "reference")]
    reference = {run.path.name: ref.path.name for ref, run in pairs}
    items = []
    for ort in (r for r in runs if has(r.backend, "onnx_stages")):
        mates = [c for c in compiled if reference.get(c.path.name) == reference.get(ort.path.name, "-")]
        target = (mates or compiled or [None])[-1]
        if target is not None:
            try:
                items.append({"runs": [names[ort.path.name], names[target.path.name]],
                              **move_report(ort, target).to_dict()})
            except Exception as e:  # a damaged run: the rest of the page still says what it can
                items.append({"runs": [names[ort.path.name], names[target.path.name]], "error": str(e)})
    return {"items": items, "missing": None}


def _losses(runs: list[Run], names: dict[str, str]) -> dict[str, Any]:
    series = {names[r.path.name]: [None if not math.isfinite(v) else v for v in r.losses] for r in runs}
    series = {k: v for k, v in series.items() if v}
    return {"series": series, "missing": None if series else "no run here has a step"}


def _reproduce(runs: list[Run], pairs: list[tuple[Run, Run]], names: dict[str, str]) -> dict[str, Any]:
    """Per comparison (or lone run): the command that runs it again, each run's Python call, the repro script."""
    together = groups.comparisons(pairs)
    placed = {r.path.name for group in together for r in group}
    together += [[r] for r in runs if r.path.name not in placed]
    items = []
    for group in together:
        cwd = next((r.meta.get("cwd") for r in group if r.meta.get("cwd")), None)
        items.append({"runs": [names[r.path.name] for r in group], "command": command(group), "cwd": cwd,
                      "recorded": bool(group[0].meta.get("command")),
                      "calls": {names[r.path.name]: python_call(r) for r in group},
                      "scripts": [dict(s, run=names[r.path.name]) for r in group if (s := repro_script(r))]})
    return {"items": items, "missing": None if items else "no runs"}
