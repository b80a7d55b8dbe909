"""Runs' time.json side by side: `ortlab.time(*runs)` -> `TimeTables` (DataFrames and a figure), per step part,
module, op type and ORT node, and where a backend is slower or faster than PyTorch, by module."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.runs.files import RunError, read_json
from ortlab.timing.collector import FILE
from ortlab.timing.errors import TimeError
from ortlab.timing.profile import TAPS

KINDS = ("kernels: ORT's kernels (ORTModule), PyTorch's ops (PyTorch, torch.compile); outside: the rest of the "
         "phase (ORTModule: its Python, input/output handling, DLPack, the loss; PyTorch: "
         "Python, hooks, the autograd engine); ORTModule's optimizer is PyTorch's, outside ORT; PythonOps call back "
         "into PyTorch inside their node (ORT's kernels); wait (ranks of a "
         "distributed burst): the wait for the slowest rank, taken out of the backward's outside")
HOW = ("collect it with `ortlab burst --collect time` (Python: collect={'time': {}}; the Lab: the Burst panel's "
       "'time' switch)")


@dataclass
class TimeTables:
    """Milliseconds per profiled step (the mean of a run's profiled steps); one column per run, labelled by
    backend (and rank, or run name when two runs share one)."""

    labels: list[str]
    paths: list[str]
    parts: Any  # DataFrame: (phase, kernels | outside) x run; adds up to the "step" row (KINDS: what they are)
    modules: Any  # DataFrame: module x run, the kernel time of each module (forward + backward)
    ops: Any  # DataFrame: op type x run
    nodes: Any  # DataFrame: the top ORT nodes of every ORTModule run: run, node, op, module, phase, ms
    python_ops: Any  # DataFrame: run, node, function, phase, ortlab_tap (ortlab's statistics tap), ms
    difference: Any  # DataFrame: module, run, pytorch ms, its ms, difference (sorted: slower first)
    cost: Any  # DataFrame: run x (profiled median ms, unprofiled median ms, ratio)
    notes: dict[str, str] = field(default_factory=dict)

    def figure(self, top: int = 12):
        """The modules' figure: bars per module (the `top` costliest), one per run side by side."""
        from ortlab.timing.figures import modules_figure

        return modules_figure(self.modules, top)

    def to_dict(self, top: int = 20) -> dict[str, Any]:
        """The tables as plain data (JSON-ready; `top` rows of the long ones): what `ortlab time --json` prints."""

        def records(df, index=True):
            return json.loads((df.reset_index() if index else df).to_json(orient="records"))

        return {"runs": dict(zip(self.labels, self.paths, strict=True)), "parts": records(self.parts),
                "modules": records(self.modules.head(top)), "ops": records(self.ops.head(top)),
                "nodes": records(self.nodes.head(top), False), "python_ops": records(self.python_ops, False),
                "difference": records(self.difference.head(top), False), "cost": records(self.cost),
                "notes": self.notes}

    def report(self, top: int = 10) -> str:
        """The tables as text (`top` rows each): what `ortlab time` prints."""
        import pandas as pd

        with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_colwidth", 60,
                               "display.float_format", "{:.3f}".format):
            out = ["milliseconds per profiled step (mean of the profiled steps)", "",
                   "the step, part by part:", self.parts.to_string(), KINDS, "",
                   f"modules (their kernel time, forward + backward), top {top}:",
                   self.modules.head(top).to_string(), "",
                   f"op types, top {top}:", self.ops.head(top).to_string()]
            if len(self.difference):
                out += ["", "where a backend is slower (+) or faster (-) than PyTorch, by module:",
                        _ends(self.difference, top).to_string(index=False)]
            if len(self.nodes):
                out += ["", f"ORT graph nodes, top {top}:", self.nodes.head(top).to_string(index=False)]
            if len(self.python_ops):
                out += ["", "PythonOps (the autograd.Function each runs; ortlab_tap: ortlab's statistics taps, whose "
                        f"time is the module {TAPS}, not the model's):", self.python_ops.to_string(index=False)]
            out += ["", "what profiling cost (profiled steps' median against the steps after them):",
                    self.cost.to_string()]
        out += [f"{label}: {note}" for label, note in self.notes.items()]
        return "\n".join(out)


def _ends(df, top: int):
    """The `top` largest differences each way."""
    import pandas as pd

    if len(df) <= 2 * top:
        return df
    return pd.concat([df.head(top), df.tail(top)])


def load(run: Any) -> list[tuple[str, dict[str, Any]]]:
    """A run's time data: [(label, time.json)], one per rank for a distributed run."""
    from ortlab.runs.run import Run, load_run

    run = run if isinstance(run, Run) else load_run(run)
    ranks = run.ranks if (run.path / "ranks").is_dir() else []
    sources = [(f"{run.backend} rank {i}", r) for i, r in enumerate(ranks)] or [(run.backend, run)]
    out = []
    for label, r in sources:
        path = r.path / FILE
        if not path.is_file():
            raise TimeError(f"{run.path} has no time data ({FILE}): {HOW}")
        try:
            data = read_json(path)
        except RunError as e:
            raise TimeError(str(e)) from None
        if data.get("error"):
            raise TimeError(f"{path}: no profiled steps: {data['error']}")
        out.append((label, {**data, "_path": str(r.path)}))
    return out


def node_times(run: Any) -> dict[str, list[dict[str, Any]]]:
    """A profiled ORTModule run's top nodes: node name -> [{phase, op, ms}] ({} for a run without time data)."""
    data = read_json(Path(getattr(run, "path", run)) / FILE, {}, strict=False)
    if not isinstance(data, dict):
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for n in data.get("nodes", []):
        out.setdefault(n["node"], []).append({"phase": n["phase"], "op": n["op"], "ms": n["s"] * 1e3})
    return out


def time(*runs: Any) -> TimeTables:
    """Where the time of a step goes in each run (folders or Runs with time data), side by side."""
    import pandas as pd

    if not runs:
        raise TimeError(f"ortlab.time needs at least one run with time data: {HOW}")
    loaded = [item for run in runs for item in load(run)]
    labels = [label for label, _ in loaded]
    labels = [f"{label} ({Path(d['_path']).name})" if labels.count(label) > 1 else label
              for label, d in loaded]
    datas = [d for _, d in loaded]

    parts = {}
    for label, d in zip(labels, datas, strict=True):
        col = {(p["phase"], p["kind"]): p["s"] * 1e3 for p in d["parts"]}
        col[("step", "")] = d["step_s"] * 1e3
        parts[label] = col
    parts = pd.DataFrame(parts)
    parts.index.names = ["phase", "part"]

    def pivot(key: str, rows: str) -> Any:
        frame = pd.DataFrame({label: _sum(d[rows], key) for label, d in zip(labels, datas, strict=True)})
        if len(frame):
            frame = frame.loc[frame.fillna(0).max(axis=1).sort_values(ascending=False).index]
        frame.index.name = key
        return frame * 1e3

    modules, ops = pivot("module", "modules"), pivot("op", "ops")
    nodes = pd.DataFrame([{"run": label, **{k: n[k] for k in ("node", "op", "module", "phase")}, "ms": n["s"] * 1e3}
                          for label, d in zip(labels, datas, strict=True) for n in d.get("nodes", [])],
                         columns=["run", "node", "op", "module", "phase", "ms"])
    nodes = nodes.sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)
    python_ops = pd.DataFrame([{"run": label, "node": p["node"], "function": p["function"], "phase": p["phase"],
                                "ortlab_tap": p.get("ortlab_tap", False), "ms": p["s"] * 1e3}
                               for label, d in zip(labels, datas, strict=True) for p in d.get("python_ops", [])],
                              columns=["run", "node", "function", "phase", "ortlab_tap", "ms"])
    cost = pd.DataFrame({label: {"profiled median ms": _ms(d["cost"].get("profiled_median_s")),
                                 "unprofiled median ms": _ms(d["cost"].get("unprofiled_median_s")),
                                 "ratio": d["cost"].get("ratio")}
                         for label, d in zip(labels, datas, strict=True)}).T
    notes = {label: d["note"] for label, d in zip(labels, datas, strict=True) if d.get("note")}
    return TimeTables(labels, [d["_path"] for d in datas], parts, modules, ops, nodes, python_ops,
                      _difference(modules, labels, datas), cost, notes)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _sum(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0.0) + r["s"]
    return out


def _difference(modules, labels: list[str], datas: list[dict[str, Any]]):
    """Each non-PyTorch run against the first PyTorch run (a rank against PyTorch's same rank), module by module:
    the difference in ms, slower first."""
    import pandas as pd

    from ortlab.engine.backends import has

    columns = ["module", "run", "pytorch ms", "ms", "difference ms"]
    bases = [label for label, d in zip(labels, datas, strict=True) if has(d["backend"], "reference")]
    if not bases:
        return pd.DataFrame(columns=columns)
    rows = []
    for label, d in zip(labels, datas, strict=True):
        if has(d["backend"], "reference"):
            continue
        rank = label.rpartition(" rank ")[2] if " rank " in label else None
        base = next((b for b in bases if rank is not None and b.endswith(f" rank {rank}")), bases[0])
        both = modules[[base, label]].fillna(0.0)
        for module, (mine_base, mine) in both.iterrows():
            rows.append({"module": module, "run": label, "pytorch ms": mine_base, "ms": mine,
                         "difference ms": mine - mine_base})
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("difference ms", ascending=False, kind="stable").reset_index(drop=True)
