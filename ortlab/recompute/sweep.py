"""Measuring plan sets: short ORTModule bursts per set, their step time, accounted memory, saving and loss equality.

The memory a plan saves is taken from the activation-memory account (ortlab.account) of the execution graph ORT
ran with the plan applied, against the graph without: exact at the burst's shapes, on any device. The process's
peak (the resident set on the CPU) stays as a secondary column: it cannot resolve a plan on the CPU.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.recompute.errors import PlanError
from ortlab.recompute.figures import pareto_figure, saving_figure
from ortlab.recompute.table import PLANS_FILE, plan_config, plans, write_config
from ortlab.runs.memory import MB
from ortlab.runs.run import RunStatus

COLUMNS = ["set", "plans", "memory_opt_level", "status", "median_step_ms", "accounted_peak_mb", "accounted_saving_mb",
           "predicted_saving_mb", "accounted_stash_mb", "stash_saving_mb", "accounted_exact", "recompute_nodes",
           "recompute_ops", "loss_equal", "max_loss_rel_diff", "process_peak_mb", "account_missing"]
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
    """A Sweep of short ORTModule bursts for several plan sets; per set: median step time, the accounted activation peak
    and stash of its execution graph, ORT's predicted saving beside the accounted one, recompute nodes in the
    graph, and whether the loss equals the no-plan burst's.

    `session_or_model`: a Session (its bursts), or a model factory for a session made and closed here.
    `sets` maps a name to a list of plan ids (see plan_config; [] = no plan) or to options such as
    {"memory_opt_level": 1}; default: default_sets(). The no-plan burst always runs first and is the
    reference. Every burst saves its graphs and collects its memory account ("memory"). `process_peak_mb` is
    the process's peak after step 0 (on the CPU its resident set: coarse, it counts everything the process
    holds), kept beside the account.
    """
    import pandas as pd

    from ortlab.engine.session import Session
    from ortlab.options import Options
    from ortlab.runs.run import write_json

    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise PlanError(f"steps {steps!r} is not allowed; allowed: a whole number >= 2 (step 0 exports)")
    own = not isinstance(session_or_model, Session)
    session = (Session(session_or_model, dict(model_kwargs or {}), out=out, in_process=in_process) if own
               else session_or_model)
    base = Options(options or {}).replace(save_onnx=True, memory_opt_level=0, memory_opt_config="")
    folder = Path(session.out).expanduser().resolve() / f"plan-sweep-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    collect = {"plans": {"steady_peak": True}, "memory": {}}
    kwargs = dict(parity=parity, progress=progress, collect=collect, **burst_kwargs)
    try:
        with session.asking(folder, "plans"):  # its bursts: in <folder>/ortlab-runs, not the user's runs
            baseline = session.burst("ortmodule", steps, base, name="plans-none", **kwargs)
            if baseline.status != RunStatus.OK:
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
            df = df[[*COLUMNS, *(c for c in df.columns if c not in COLUMNS)]]
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
           **_accounted(run),
           "predicted_saving_mb": None, "recompute_nodes": None, "recompute_ops": None,
           "process_peak_mb": float(later["peak_mem_mb"].max()) if len(later) else None, "run": run}
    try:
        table = plans(run)
    except PlanError:
        return row
    applied = table[table["applied"]]
    predicted = applied["saving_bytes"] * applied["applied_count"] / applied["frequency"]
    row["predicted_saving_mb"] = float(predicted.sum() / MB)
    graph = table.attrs.get("execution_graph") or {}
    row["recompute_nodes"] = graph.get("recompute_nodes")
    row["recompute_ops"] = graph.get("recompute_ops")
    return row


def _accounted(run) -> dict[str, Any]:
    """The account of the execution graph this burst ran: its activation peak and its stash (MB), whether every
    size was known, or why there is none. A burst that reused an ORTModule the memory collector did not see
    export has no memory.json account; the plans collector still names that export's graph, accounted here."""
    data = run.memory or {}
    if data.get("peak_activation_bytes") is None:
        from ortlab.account.build import account_of

        graph = (run.read_json(PLANS_FILE, {}) or {}).get("execution_graph") or {}
        if graph.get("file") and Path(graph["file"]).is_file():
            try:
                data = account_of(Path(graph["file"]), run).to_dict()
            except Exception as e:  # the sweep's other figures stand without it
                data = {"missing": f"the account of {Path(graph['file']).name} failed: {type(e).__name__}: {e}"}
    if data.get("peak_activation_bytes") is None:
        reason = data.get("missing") or "the burst wrote no memory account"
        return {"accounted_peak_mb": None, "accounted_stash_mb": None, "accounted_exact": None,
                "account_missing": reason}
    return {"accounted_peak_mb": data["peak_activation_bytes"] / MB,
            "accounted_stash_mb": None if data.get("stashed_bytes") is None else data["stashed_bytes"] / MB,
            "accounted_exact": bool(data.get("exact", not data.get("uncertain"))), "account_missing": None}


def _compare(df, runs: dict[str, Any], reference: str, rtol: float) -> list[str]:
    """Accounted saving and loss equality against the no-plan set; notes for what a reader must not miss."""
    cuda = str(runs[reference].meta.get("device", "")).startswith("cuda")
    process = ("torch's CUDA allocator peak after step 0, which covers ORT's allocations" if cuda else
               "the process's peak resident set after step 0: coarse, it counts everything the process holds, "
               "and cannot resolve a plan on the CPU")
    notes = ["memory: accounted_peak_mb is the most activation bytes alive at one step of ORT's execution graph "
             "(ortlab.account, at the burst's shapes; parameters, gradients, optimizer state apart), "
             "accounted_stash_mb what it keeps across the yield for backward; accounted_saving_mb and "
             "stash_saving_mb are the no-plan set's minus this set's, predicted_saving_mb ORT's symbolic saving "
             f"(what leaves the stash); process_peak_mb is {process}"]
    base = runs[reference].metrics["loss"].to_numpy()
    ref = df.loc[df["set"] == reference].iloc[0]
    df["accounted_saving_mb"] = _minus(ref["accounted_peak_mb"], df["accounted_peak_mb"])
    df["stash_saving_mb"] = _minus(ref["accounted_stash_mb"], df["accounted_stash_mb"])
    loss_diff = []
    for row in df.itertuples():
        losses = runs[row.set].metrics["loss"].to_numpy()
        n = min(len(losses), len(base))
        diff = float((abs(losses[:n] - base[:n]) / abs(base[:n]).clip(1e-12)).max()) if n else None
        loss_diff.append(diff)
        if diff is not None and diff > rtol:
            notes.append(f"{row.set}: loss differs from '{reference}' by {diff:.2e} (relative, > {rtol:g}): "
                         "recompute should not change the loss; if the model uses dropout, the recomputed "
                         "graph can draw other masks (compare with dropout 0 or parity=True)")
        if row.status != RunStatus.OK:
            notes.append(f"{row.set}: the burst is {row.status}: {runs[row.set].error}")
        if row.account_missing:
            notes.append(f"{row.set}: no memory account: {row.account_missing}")
        elif row.accounted_exact is False:
            notes.append(f"{row.set}: some activation sizes are unknown: its accounted peak is a lower bound")
        chosen = bool(row.plans) or row.memory_opt_level > 0
        if chosen and row.recompute_nodes == 0:
            notes.append(f"{row.set}: plans were chosen but the execution graph has no recompute node: "
                         "not applied")
        if not chosen and row.recompute_nodes:
            notes.append(f"{row.set}: no plan chosen, yet the execution graph has {row.recompute_nodes} "
                         "recompute nodes")
        if chosen and row.recompute_nodes and row.stash_saving_mb is not None and row.stash_saving_mb <= 0:
            notes.append(f"{row.set}: applied, yet the graph keeps no less for backward: the recompute needs "
                         "inputs kept in place of what it removes (see docs/recompute.md)")
    df["max_loss_rel_diff"] = loss_diff
    df["loss_equal"] = [d is not None and d <= rtol for d in loss_diff]
    return notes


def _minus(reference, values) -> list[float | None]:
    def known(v) -> bool:
        return v is not None and v == v  # NaN: pandas' missing float

    return [reference - v if known(reference) and known(v) else None for v in values]
