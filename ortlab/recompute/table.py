"""A run's recompute plans as a table; what-if at other shapes; choosing plans; ORT's config file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortlab.recompute.errors import PlanError
from ortlab.recompute.expr import PLAN_ID, TYPE_NAMES, evaluate, parse_cluster

PLANS_FILE = "plans.json"


_COLUMNS = ["plan", "cluster_id", "subgraph", "type", "type_name", "frequency", "saving_bytes", "saving_mb",
            "saving_expr", "symbols", "applied", "applied_count", "raw_expr", "ort_saving_bytes"]


def plans_data(run) -> dict[str, Any]:
    from ortlab.runs.run import Run, load_run

    if not isinstance(run, Run):
        run = load_run(run)
    data = run.read_json(PLANS_FILE)
    if data is None:
        from ortlab.engine.backends import has

        why = ("it is a PyTorch burst: plans exist only for ORTModule bursts" if not has(run.backend, "onnx_stages")
               else "run the ORTModule burst with collect={'plans': {}} (or `ortlab plans`)")
        raise PlanError(f"run {run.path.name} has no {PLANS_FILE}: {why}")
    return data


def plans(run) -> Any:
    """The recompute plans of a run (a Run or its folder) as a DataFrame, one row per plan, largest first.

    `df.attrs` keeps the burst's dimension values (`dims`), the memory optimizer level and config, and the
    execution graph's recompute node count when the burst saved its ONNX stages."""
    import pandas as pd

    data = plans_data(run)
    df = pd.DataFrame(data["plans"]).reindex(columns=_COLUMNS)
    df["type_name"] = df["type"].map(TYPE_NAMES)
    df["saving_mb"] = df["saving_bytes"] / 2**20
    for key in ("dims", "ort_dims", "memory_opt_level", "config", "probe_config", "execution_graph",
                "steady_peak"):
        df.attrs[key] = data.get(key)
    return df


def as_table(plans_or_run) -> Any:
    import pandas as pd

    return plans_or_run if isinstance(plans_or_run, pd.DataFrame) else plans(plans_or_run)


def what_if(plans_or_run, **dims: int) -> Any:
    """Every plan's saving for other values of the symbolic dimensions (the rest keep the burst's values).

    `what_if(run, idx_dim0=32)`: a DataFrame with the saving at the burst's shapes and at the new ones."""
    table = as_table(plans_or_run)
    base = dict(table.attrs.get("dims") or {})
    known = sorted(set(base) | {s for syms in table["symbols"] for s in syms})
    for name, value in dims.items():
        if name not in known:
            raise PlanError(f"dimension {name!r} is not a symbol of these plans; "
                            f"known: {', '.join(known) or 'none'}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"dimension {name}={value!r} is not allowed; allowed: a whole number >= 1")
    new = {**base, **dims}
    out = table[["plan", "cluster_id", "type", "saving_expr"]].copy()
    out["saving_bytes"] = table["saving_bytes"]
    out["what_if_bytes"] = [evaluate(e, new) for e in table["saving_expr"]]
    out["what_if_mb"] = out["what_if_bytes"] / 2**20
    out["ratio"] = out["what_if_bytes"] / out["saving_bytes"]
    out.attrs["dims"] = new
    out.attrs["base_dims"] = base
    return out


def plan_config(plan_ids: Sequence[int | str], plans_or_run=None) -> list[str]:
    """The `cluster:type:count` strings for these plans. An id is a plan number (needs the plans), a plan's
    cluster id, or `subgraph:type[:count]` (count -1 = every occurrence). Unknown ids are rejected with the
    list of valid ones when the plans are given."""
    if isinstance(plan_ids, str | int):
        plan_ids = [plan_ids]
    table = as_table(plans_or_run) if plans_or_run is not None else None
    valid: dict[str, str] = {}  # "subgraph:type" -> cluster id
    numbers: dict[int, str] = {}
    if table is not None:
        for number, cluster_id in zip(table["plan"], table["cluster_id"], strict=True):
            numbers[int(number)] = cluster_id
            for subgraph, opt_type, _ in parse_cluster(cluster_id):
                valid[f"{subgraph}:{opt_type}"] = cluster_id

    def listing() -> str:
        return "; ".join(f"{n} = {c}" for n, c in numbers.items()) or "none (this run has no plans)"

    out = []
    for pid in plan_ids:
        if isinstance(pid, bool) or not isinstance(pid, int | str):
            raise PlanError(f"plan id {pid!r} is not a plan number or a 'subgraph:type[:count]' string")
        if isinstance(pid, int):
            if table is None:
                raise PlanError(f"plan number {pid} needs the plans table (plans=...) to know which plan it "
                                "is; or give 'subgraph:type[:count]'")
            if pid not in numbers:
                raise PlanError(f"plan {pid} is not one of this run's plans; valid: {listing()}")
            out.append(numbers[pid])
            continue
        for text in pid.split(","):
            m = PLAN_ID.match(text.strip())
            if not m:
                raise PlanError(f"plan id {text!r} is not 'subgraph:type[:count]' (for example "
                                "'BiasGelu+:1:-1')" + (f"; valid: {listing()}" if table is not None else ""))
            opt_type, count = int(m["type"]), int(m["count"] or -1)
            if opt_type not in TYPE_NAMES:
                raise PlanError(f"plan {text!r}: type {opt_type} is not allowed; allowed: 1 (recompute), "
                                "2 (recompute with compromise)")
            if count == 0 or count < -1:
                raise PlanError(f"plan {text!r}: count {count} is not allowed; allowed: -1 (all occurrences) "
                                "or >= 1")
            key = f"{m['subgraph']}:{opt_type}"
            if table is not None and key not in valid:
                raise PlanError(f"plan {text.strip()!r} is not one of this run's plans; valid: {listing()}")
            out.append(f"{key}:{count}")
    return list(dict.fromkeys(out))


def write_config(plan_ids: Sequence[int | str], path: str | Path, plans=None) -> Path:
    """Write the file ORT 1.19.2 reads from ORTMODULE_MEMORY_OPT_CONFIG (a JSON list of 'cluster:type:count'
    strings) for these plans; use it as Options(memory_opt_config=path) with memory_opt_level 0."""
    from ortlab.runs.run import write_json

    entries = plan_config(plan_ids, plans)
    path = Path(path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, entries)
    return path
