"""The report's sections that ortlab's views own, each read from the run folders as plain data: where the time goes
(ortlab.time), what changed in it (timing.diff), the memory account (memory.json), the first divergence of the
statistics (ortlab.compare), the exported graphs' stages, the recompute plans, the tunings. A view that cannot read
a run says why in the section instead of failing the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortlab.runs.files import RunError, read_json
from ortlab.runs.run import Run

TOP = 10
TIMELINE_POINTS = 400  # a memory timeline is drawn from at most this many points (the page stays small)


def _records(df, top: int | None = TOP) -> list[dict[str, Any]]:
    frame = df if top is None else df.head(top)
    return json.loads(frame.to_json(orient="records"))


def _why(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def time_tables(runs: list[Run]) -> dict[str, Any]:
    from ortlab.timing.collector import FILE
    from ortlab.timing.table import HOW, time

    timed = [r for r in runs if (r.path / FILE).is_file()]
    if not timed:
        return {"missing": f"no run here was profiled: {HOW}"}
    try:
        tables = time(*timed)
    except Exception as e:
        return {"missing": f"the time data could not be read: {_why(e)}"}
    parts = tables.parts.reset_index()
    return {"runs": tables.labels, "parts": _records(parts, None),
            "modules": {"index": [str(i) for i in tables.modules.head(12).index],
                        "columns": list(tables.modules.columns),
                        "values": json.loads(tables.modules.head(12).to_json(orient="values"))},
            "ops": _records(tables.ops.reset_index()), "nodes": _records(tables.nodes),
            "cost": _records(tables.cost.reset_index(names="run"), None), "notes": tables.notes}


def time_diffs(pairs: list[tuple[Run, Run]], names: dict[str, str]) -> dict[str, Any]:
    from ortlab.timing.collector import FILE
    from ortlab.timing.diff import SAME, UNSEEN, time_diff

    items = []
    for reference, run in pairs:
        if not ((reference.path / FILE).is_file() and (run.path / FILE).is_file()):
            continue
        try:
            diff = time_diff(reference, run)
        except Exception as e:
            items.append({"title": f"{names[reference.path.name]} -> {names[run.path.name]}", "error": _why(e)})
            continue
        changed = diff.rows[~diff.rows["change"].isin((SAME, UNSEEN))]
        items.append({"title": f"{names[reference.path.name]} -> {names[run.path.name]}",
                      "headline": diff.headline(), "parts": _records(diff.parts, None),
                      "rows": _records(changed, 12),
                      "counts": {k: int(v) for k, v in changed["change"].value_counts().items()},
                      "notes": diff.notes})
    missing = None if items else ("no two runs of one comparison were both profiled: burst them with --collect "
                                  "time, then `ortlab time A B --diff`")
    return {"items": items, "missing": missing}


def memory(runs: list[Run], names: dict[str, str]) -> dict[str, Any]:
    from ortlab.runs.memory import summary_fields

    items = []
    for run in runs:
        data = run.memory
        if not data:
            continue
        fields = summary_fields(data)
        item = {"run": names[run.path.name], "kind": data.get("kind"), "counts": fields.get("memory_counts"),
                "missing": fields.get("memory_missing"), "kept_mb": fields.get("saved_for_backward_mb"),
                "peak_mb": fields.get("activation_peak_mb"), "peak_node": data.get("peak_node"),
                "peak_phase": data.get("peak_phase"),
                "top": [{"tensor": t.get("name") or t.get("saved_by") or "", "module": t.get("module"),
                         "MB": round((t.get("bytes") or 0) / 2**20, 3), "shape": t.get("shape")}
                        for t in (data.get("top_tensors") or [])[:5]],
                "per_module": (data.get("per_module") or [])[:8]}
        timeline = data.get("timeline") or {}
        if timeline.get("live"):
            live = timeline["live"]
            every = max(1, len(live) // TIMELINE_POINTS)
            item["timeline"] = {"live_mb": [v / 2**20 for v in live[::every]], "every": every,
                                "yield": data.get("yield_index"), "peak": data.get("peak_index")}
        items.append(item)
    return {"items": items, "missing": None if items else "no run here has a memory account (collect={'memory': "
                                                          "{}}, on by default; --no-memory turns it off)"}


def divergences(pairs: list[tuple[Run, Run]], names: dict[str, str]) -> dict[str, Any]:
    from dataclasses import asdict

    from ortlab.activations.diff import compare
    from ortlab.activations.table import STATS_FILE

    items = []
    for reference, run in pairs:
        if not ((reference.path / STATS_FILE).is_file() and (run.path / STATS_FILE).is_file()):
            continue
        title = f"{names[reference.path.name]} vs {names[run.path.name]}"
        try:
            diff = compare(reference, run)
        except Exception as e:
            items.append({"title": title, "error": _why(e)})
            continue
        items.append({"title": title, "first": str(diff.first) if diff.first else None,
                      "where": asdict(diff.first) if diff.first else None,
                      "nonfinite": {k: str(v) for k, v in diff.nonfinite.items() if v},
                      "compared": f"{diff.table['name'].nunique()} tensors x {diff.table['step'].nunique()} steps, "
                                  f"aligned by {diff.aligned_by}",
                      "top": _records(diff.top(8))})
    missing = None if items else ("no two runs of one comparison hold activation statistics: burst them with "
                                  "--collect stats (Python: collect={'stats': {}})")
    return {"items": items, "missing": missing}


def graphs(runs: list[Run], names: dict[str, str]) -> dict[str, Any]:
    from ortlab.engine.backends import has
    from ortlab.graphs.collection import load

    items = []
    for run in runs:
        if run.backend not in _known() or not has(run.backend, "onnx_stages"):
            continue
        try:
            g = load(run)
            summary = g.summary()
        except Exception as e:
            items.append({"run": names[run.path.name], "error": _why(e)})
            continue
        cols = [c for c in ("mode", "stage", "nodes", "forward", "gradient", "recompute", "op_types",
                            "user_inputs", "parameters", "outputs", "file_bytes") if c in summary]
        items.append({"run": names[run.path.name], "prefix": g.prefix, "stages": _records(summary[cols], None),
                      "overlays": f"ortlab graphs {run.path} --overlay stats|time|memory"})
    return {"items": items, "missing": None if items else "no ORTModule run here (only ORTModule exports graphs)"}


def plans(runs: list[Run], names: dict[str, str]) -> dict[str, Any]:
    from ortlab.engine.backends import has
    from ortlab.recompute.table import PLANS_FILE, as_table

    items = []
    for run in runs:
        if not (run.path / PLANS_FILE).is_file():
            continue
        try:
            table = as_table(run)
        except Exception as e:
            items.append({"run": names[run.path.name], "error": _why(e)})
            continue
        cols = [c for c in ("plan", "type_name", "frequency", "saving_mb", "saving_expr", "applied") if c in table]
        items.append({"run": names[run.path.name], "count": len(table), "plans": _records(table[cols])})
    ort = [r for r in runs if r.backend in _known() and has(r.backend, "onnx_stages")]
    why = ("no ORTModule run here collected them: `ortlab burst --backend ortmodule --collect plans` (Python: "
           "collect={'plans': {}}), or `ortlab plans`" if ort else "plans exist only for ORTModule runs")
    return {"items": items, "missing": None if items else why}


def tunings(folders: list[Path]) -> dict[str, Any]:
    from ortlab.tuning.result import FILE

    items = []
    for folder in folders:
        try:
            data = read_json(folder / FILE)
            if data is None:
                raise FileNotFoundError(f"no {FILE} in {folder}")
        except (OSError, RunError) as e:
            items.append({"folder": str(folder), "error": _why(e)})
            continue
        cols = ("candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
                "memory_change_pct")
        rows = [{c: r.get(c) if not isinstance(r.get(c), dict) else r[c].get("status") for c in cols}
                for r in data.get("rows") or []]
        items.append({"folder": str(folder), "best": data.get("best"), "rows": rows,
                      "export_lines": data.get("export_lines") or [], "notes": data.get("notes") or []})
    return {"items": items, "missing": None if items else "no tuning here: `ortlab tune` writes one (a folder with "
                                                          "tune.json), give it or the folder that holds it"}


def _known() -> tuple[str, ...]:
    from ortlab.engine.backends import BACKENDS

    return tuple(BACKENDS)
