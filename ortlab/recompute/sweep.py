"""Measuring plan sets: short ORTModule bursts per set, their step time, memory, saving and loss equality."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.recompute.errors import PlanError
from ortlab.recompute.figures import pareto_figure, saving_figure
from ortlab.recompute.table import plan_config, plans, write_config

LOSS_RTOL = 1e-4  # recompute reruns the same kernels: losses agree to float noise unless dropout masks differ


@dataclass
class Sweep:
    """A plan sweep: one row per plan set (`table`), its runs, and the notes a reader must see."""

    table: Any
    runs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: Path | None = None

    def pareto(self):
        return pareto_figure(self.table)

    def savings(self):
        return saving_figure(self.table)

    def __repr__(self) -> str:
        return f"Sweep({len(self.table)} plan sets, {len(self.notes)} notes, path={self.path})"


def default_sets(table, top: int = 3) -> dict[str, Any]:
    """none, each of the `top` plans alone, all type-1 plans, level 1, level 2."""
    sets: dict[str, Any] = {"none": []}
    for number, cluster_id in list(zip(table["plan"], table["cluster_id"], strict=True))[:top]:
        sets[f"plan {number}: {cluster_id.rsplit(':', 2)[0]}"] = [int(number)]
    type1 = [int(n) for n, t in zip(table["plan"], table["type"], strict=True) if t == 1]
    if type1:
        sets["all type 1"] = type1
    sets["level 1"] = {"memory_opt_level": 1}
    sets["level 2"] = {"memory_opt_level": 2}
    return sets


def plan_sweep(session_or_model=None, steps: int = 6, sets: Mapping[str, Any] | None = None, *, top: int = 3,
               options: Mapping[str, Any] | None = None, model_kwargs: Mapping[str, Any] | None = None,
               out: str | Path = "runs", in_process: bool = False, parity: bool = False,
               rtol: float = LOSS_RTOL, progress: bool = False, **burst_kwargs: Any) -> Sweep:
    """Short ORTModule bursts for several plan sets; per set: median step time, peak memory, predicted and
    measured saving, recompute nodes in the execution graph, and whether the loss equals the no-plan burst's.

    `session_or_model`: a Session (its bursts), or a model factory for a session made and closed here.
    `sets` maps a name to a list of plan ids (see plan_config; [] = no plan) or to options such as
    {"memory_opt_level": 1}; default: default_sets(). The no-plan burst always runs first and is the
    reference. Peak memory is taken after step 0 (the export excluded); on the CPU it is the process's peak
    resident set, which is coarse: it counts everything the process holds.
    """
    import pandas as pd

    from ortlab.engine.session import Session
    from ortlab.options import Options
    from ortlab.run import write_json

    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise PlanError(f"steps {steps!r} is not allowed; allowed: a whole number >= 2 (step 0 exports)")
    own = not isinstance(session_or_model, Session)
    session = (Session(session_or_model, dict(model_kwargs or {}), out=out, in_process=in_process) if own
               else session_or_model)
    base = Options(options or {}).replace(save_onnx=True, memory_opt_level=0, memory_opt_config="")
    folder = Path(session.out).expanduser().resolve() / f"plan-sweep-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = dict(parity=parity, progress=progress, collect={"plans": {"steady_peak": True}}, **burst_kwargs)
    try:
        baseline = session.burst("ortmodule", steps, base, name="plans-none", **kwargs)
        if baseline.status != "ok":
            raise PlanError(f"the no-plan burst did not finish ({baseline.status}): {baseline.error}")
        table = plans(baseline)
        chosen = dict(sets) if sets is not None else default_sets(table, top)
        if not any(spec == [] for spec in chosen.values()):
            chosen = {"none": [], **chosen}
        runs: dict[str, Any] = {}
        rows = []
        reference = None
        for i, (name, spec) in enumerate(chosen.items()):
            entries = None if isinstance(spec, Mapping) else plan_config(list(spec), table)
            if entries == [] and reference is None:
                run, reference = baseline, name  # the no-plan burst is this set
            else:
                opts = base.replace(**spec) if entries is None else base
                if entries:
                    opts = base.replace(memory_opt_config=str(write_config(entries, folder / f"set{i}.json")))
                run = session.burst("ortmodule", steps, opts, name=f"plans-set{i}", **kwargs)
            runs[name] = run
            rows.append(_measure(name, entries, run))
        df = pd.DataFrame(rows)
        notes = _compare(df, runs, reference, rtol)
        write_json(folder / "sweep.json", {"rows": df.drop(columns=["run"]).to_dict(orient="records"),
                                           "runs": {k: str(r.path) for k, r in runs.items()}, "notes": notes,
                                           "steps": steps, "parity": parity})
        return Sweep(df, runs, notes, folder)
    finally:
        if own:
            session.close()


def _measure(name: str, entries: list[str] | None, run) -> dict[str, Any]:
    later = run.metrics.iloc[1:]
    row = {"set": name, "plans": ",".join(entries or []),
           "memory_opt_level": run.meta.get("effective_options", {}).get("memory_opt_level", 0),
           "status": run.status,
           "median_step_ms": float(later["step_time_s"].median() * 1000) if len(later) else None,
           "peak_mem_mb": float(later["peak_mem_mb"].max()) if len(later) else None,
           "predicted_saving_mb": None, "recompute_nodes": None, "recompute_ops": None, "run": run}
    try:
        table = plans(run)
    except PlanError:
        return row
    applied = table[table["applied"]]
    predicted = applied["saving_bytes"] * applied["applied_count"] / applied["frequency"]
    row["predicted_saving_mb"] = float(predicted.sum() / 2**20)
    graph = table.attrs.get("execution_graph") or {}
    row["recompute_nodes"] = graph.get("recompute_nodes")
    row["recompute_ops"] = graph.get("recompute_ops")
    return row


def _compare(df, runs: dict[str, Any], reference: str, rtol: float) -> list[str]:
    """Measured saving and loss equality against the no-plan set; notes for what a reader must not miss."""
    cuda = str(runs[reference].meta.get("device", "")).startswith("cuda")
    notes = ["peak memory after step 0 is torch's CUDA allocator peak, which covers ORT's allocations" if cuda
             else "peak memory after step 0 is the process's peak resident set on the CPU: coarse, it counts "
             "everything the process holds (ORT's arena keeps its high-water mark, which is what differs)"]
    base = runs[reference].metrics["loss"].to_numpy()
    base_peak = df.loc[df["set"] == reference, "peak_mem_mb"].iloc[0]
    measured, loss_diff = [], []
    for row in df.itertuples():
        losses = runs[row.set].metrics["loss"].to_numpy()
        n = min(len(losses), len(base))
        diff = float((abs(losses[:n] - base[:n]) / abs(base[:n]).clip(1e-12)).max()) if n else None
        loss_diff.append(diff)
        measured.append(None if row.peak_mem_mb is None or base_peak is None else base_peak - row.peak_mem_mb)
        if diff is not None and diff > rtol:
            notes.append(f"{row.set}: loss differs from '{reference}' by {diff:.2e} (relative, > {rtol:g}): "
                         "recompute should not change the loss; if the model uses dropout, the recomputed "
                         "graph can draw other masks (compare with dropout 0 or parity=True)")
        if row.status != "ok":
            notes.append(f"{row.set}: the burst is {row.status}: {runs[row.set].error}")
        chosen = bool(row.plans) or row.memory_opt_level > 0
        if chosen and row.recompute_nodes == 0:
            notes.append(f"{row.set}: plans were chosen but the execution graph has no recompute node: "
                         "not applied")
        if not chosen and row.recompute_nodes:
            notes.append(f"{row.set}: no plan chosen, yet the execution graph has {row.recompute_nodes} "
                         "recompute nodes")
    df["measured_saving_mb"] = measured
    df["max_loss_rel_diff"] = loss_diff
    df["loss_equal"] = [d is not None and d <= rtol for d in loss_diff]
    return notes
