"""The memory optimizer's recompute plans as data: read from ORT, evaluate for other shapes, choose, measure.

ORT 1.19.2 finds the plans whenever it builds a training session: `MemoryObserver._is_enabled` is always True
and `TrainingManager._create_execution_agent` calls `find_memory_optimization_opportunity`, which probes the
optimized graph and keeps every plan in `memory_ob.cluster_id_combination_to_saving_symbolics_map`. The log
level only decides whether ORT also prints them (INFO and below), so reading them needs no log change.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import re
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLANS_FILE = "plans.json"
TYPE_NAMES = {1: "recompute", 2: "recompute with compromise"}
LOSS_RTOL = 1e-4  # recompute reruns the same kernels: losses agree to float noise unless dropout masks differ

# sympy's parser evaluates text: an expression read from plans.json must be arithmetic on names and numbers
# (no attribute access: a '.' only inside a number).
_SAFE_EXPR = re.compile(r"^(?:\s+|[A-Za-z_]\w*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\*\*|[-+*/()])*$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_PLAN_ID = re.compile(r"^(?P<subgraph>[^:,\s]+):(?P<type>-?\d+)(?::(?P<count>-?\d+))?$")


class PlanError(ValueError):
    """A plan id, dimension or run that cannot be used as asked; the message lists what is allowed."""


# --------------------------------------------------------------------------- reading ORT's plans (a burst)


def _parse_cluster(cluster_id: str) -> list[tuple[str, int, int]]:
    """'A+:1:-1,B+:2:-1' -> [(subgraph, type, count), ...]: ORT joins one node cluster's options by commas."""
    parts = []
    for text in cluster_id.split(","):
        subgraph, opt_type, count = text.rsplit(":", 2)
        parts.append((subgraph, int(opt_type), int(count)))
    return parts


def _requested(config_entries: Iterable[str]) -> dict[str, int]:
    """{'subgraph:type': count} that a config asks for (count 0 means off), as ORT's display reads it."""
    out: dict[str, int] = {}
    for entry in config_entries:
        for text in filter(None, entry.split(",")):
            subgraph, opt_type, count = text.strip().rsplit(":", 2)
            if int(count) != 0:
                out[f"{subgraph}:{opt_type}"] = int(count)
    return out


def _symbols(expr: str) -> list[str]:
    return sorted(set(_NAME.findall(expr)))


def evaluate(expr: str, dims: Mapping[str, int]) -> float | None:
    """The value of a saving expression for these dimension values (None if a symbol has no value)."""
    import sympy

    if not _SAFE_EXPR.match(expr) or "__" in expr:
        raise PlanError(f"saving expression {expr!r} is not plain arithmetic; refusing to evaluate it")
    local = {name: sympy.Symbol(name) for name in _symbols(expr)}  # E, I, N stay symbols, not constants
    values = {local[k]: v for k, v in dims.items() if k in local}
    value = sympy.parse_expr(expr, local_dict=local).subs(values)
    return float(value) if value.is_number else None


def _value(expr: str, dims: Mapping[str, int]) -> float | None:
    try:
        return evaluate(expr, dims)
    except Exception:  # an expression sympy cannot take: keep the plan, without a value
        return None


def _burst_dims(engine) -> dict[str, int]:
    """This burst's values of the graph's symbolic dimensions, from its first batch through ORT's own input
    accessors (ORT's observer keeps the first batch it ever saw: another burst's when a wrap is reused)."""
    import torch

    from ortlab.workload import to_device

    info = engine.wrapper._manager()._graph_transition_manager._post_export_processed_model_info
    inputs, _ = engine.workload.batch(0)
    device = next(engine.model.parameters()).device
    inputs = to_device(inputs, device)
    if isinstance(inputs, Mapping):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, tuple | list):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}
    dims = {}
    for name, axes in info.onnx_graph_input_dynamic_axes_map.items():
        accessor = info.onnx_graph_input_data_accessor_user_defined.get(name)
        if accessor is None:
            continue
        data = accessor(args, kwargs)
        if isinstance(data, torch.Tensor):
            for index, dim in axes.items():
                dims[str(dim)] = int(data.shape[int(index)])
    return dims


def read_plans(engine) -> dict[str, Any]:
    """Every plan ORT's memory observer holds for the current ORTModule, evaluated at this burst's shapes."""
    manager = engine.wrapper._manager()
    observer = manager._runtime_inspector.memory_ob
    runtime = manager._runtime_options
    config_path = runtime.memory_optimizer_config_file_path or ""
    config: list[str] = []
    if config_path:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            config = list(json.loads(Path(config_path).read_text(encoding="utf-8")))
    ort_dims = {str(k): int(v) for k, v in observer.symbolic_dim_name_to_value_map.items()}
    try:
        dims = _burst_dims(engine) or ort_dims
    except Exception:  # an unusual input structure: ORT's own first-batch values are the next best
        dims = ort_dims
    requested = _requested(config)
    plans = []
    for cluster_id, summary in observer.cluster_id_combination_to_saving_symbolics_map.items():
        parts = _parse_cluster(cluster_id)
        expr = str(summary.simplified_symbolic_saving_expr)
        keys = [f"{s}:{t}" for s, t, _ in parts]
        applied = bool(keys) and all(k in requested for k in keys)
        freq = int(summary.freq)
        counts = [freq if requested[k] < 0 else min(requested[k], freq) for k in keys] if applied else [0]
        ort_value = summary.evaluated_saving
        plans.append({
            "cluster_id": cluster_id,
            "subgraph": ",".join(s for s, _, _ in parts),
            "type": max(t for _, t, _ in parts),
            "frequency": freq,
            "saving_expr": expr,
            "raw_expr": summary.raw_symbolic_saving_str,
            "symbols": _symbols(expr),
            "saving_bytes": _value(expr, dims),
            "ort_saving_bytes": float(ort_value) if isinstance(ort_value, int | float) else None,
            "applied": applied,
            "applied_count": min(counts),
        })
    # ortlab's numbering: largest saving first, ties by id: stable (ORT's log breaks ties arbitrarily)
    plans.sort(key=lambda p: (-(p["saving_bytes"] or 0), p["cluster_id"]))
    for i, p in enumerate(plans, 1):
        p["plan"] = i
    return {
        "source": "ORTModule runtime inspector: memory_ob.cluster_id_combination_to_saving_symbolics_map",
        "observer_enabled": bool(observer.is_enabled()),
        "memory_opt_level": int(runtime.memory_optimization_level),
        "probe_config": runtime.recompute_probe_config,
        "config_path": config_path,
        "config": config,
        "dims": dims,
        "ort_dims": ort_dims,
        "plans": plans,
    }


def _execution_model_path(engine) -> Path | None:
    """Where ORT saved the execution_model stage of the current wrap in this burst (save_onnx), if it did."""
    from onnxruntime.training.ortmodule._onnx_models import _get_onnx_file_name

    manager = engine.wrapper._manager()
    save = manager._debug_options.save_onnx_models
    if not save.save:
        return None
    path = Path(save.path) / _get_onnx_file_name(save.name_prefix, "execution_model", manager._export_mode)
    return path if path.is_file() else None


def recompute_nodes(onnx_path: str | Path) -> dict[str, Any]:
    """The recompute nodes ORT added to an execution graph (ORT names each `<original name>_recompute`)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    nodes = [n for n in model.graph.node if n.name.endswith("_recompute")]
    return {"file": str(onnx_path), "nodes": len(model.graph.node), "recompute_nodes": len(nodes),
            "recompute_ops": dict(sorted(Counter(n.op_type for n in nodes).items()))}


# The execution graph's recompute nodes per ORTModule: ORT saves the stage files only when it exports, and a
# later burst that reuses the wrap writes its onnx/ folder empty.
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _PlanCollection:
    """Collector "plans": after the first ORTModule step, writes ORT's recompute plans into plans.json.

    `steady_peak=True` resets the process's peak-memory counter after step 0, so the run's peak_mem_mb of
    later steps measures training steps, not the export (which dominates the first step's peak on the CPU)."""

    def __init__(self, steady_peak: bool = False):
        self.steady_peak = bool(steady_peak)
        self._engine = None
        self._cfg = None
        self._run_dir: Path | None = None
        self._data: dict[str, Any] | None = None

    def start(self, engine, cfg, run_dir: Path) -> None:
        self._engine, self._cfg, self._run_dir = engine, cfg, run_dir

    def step_begin(self, step: int) -> None:
        if step == 1 and self.steady_peak:
            _reset_peak(self._cfg.device)

    def step_end(self, step: int) -> None:
        if step == 0 and self._cfg.backend == "ortmodule":
            with contextlib.suppress(Exception):  # must not fail the burst; finish() retries and reports
                self._collect()

    def _collect(self) -> None:
        from ortlab.run import write_json

        data = read_plans(self._engine)
        data["steady_peak"] = self.steady_peak
        self._data = data
        write_json(self._run_dir / PLANS_FILE, data)  # now: a worker that dies later keeps the plans

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        if cfg.backend != "ortmodule" or engine.wrapper.ort_module is None:
            return
        if self._data is None:
            self._collect()  # failed or stopped after ORT built its session, or before: then no plans
        path = _execution_model_path(engine)
        ort_module = engine.wrapper.ort_module
        if path is not None:
            _GRAPHS[ort_module] = recompute_nodes(path)
        if ort_module in _GRAPHS:  # a reused wrap did not export: its graph is in the burst that exported it
            self._data["execution_graph"] = _GRAPHS[ort_module]
        from ortlab.run import write_json

        write_json(run_dir / PLANS_FILE, self._data)


def __getattr__(name: str):
    # PlanCollector is _PlanCollection with ortlab.burst.Collector as a base, built on first use: ortlab.burst
    # imports torch (~2 s), and the CLI imports this module just to register `ortlab plans`.
    if name == "PlanCollector":
        from ortlab.burst import Collector

        namespace = {"__module__": __name__, "__doc__": _PlanCollection.__doc__}
        cls = type("PlanCollector", (_PlanCollection, Collector), namespace)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _reset_peak(device: str) -> None:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    else:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS (Linux)


# --------------------------------------------------------------------------- the plans as a table


_COLUMNS = ["plan", "cluster_id", "subgraph", "type", "type_name", "frequency", "saving_bytes", "saving_mb",
            "saving_expr", "symbols", "applied", "applied_count", "raw_expr", "ort_saving_bytes"]


def _plans_data(run) -> dict[str, Any]:
    from ortlab.run import Run, load_run

    if not isinstance(run, Run):
        run = load_run(run)
    data = run.read_json(PLANS_FILE)
    if data is None:
        why = ("it is a PyTorch burst: plans exist only for ORTModule bursts" if run.backend != "ortmodule"
               else "run the ORTModule burst with collect={'plans': {}} (or `ortlab plans`)")
        raise PlanError(f"run {run.path.name} has no {PLANS_FILE}: {why}")
    return data


def plans(run) -> Any:
    """The recompute plans of a run (a Run or its folder) as a DataFrame, one row per plan, largest first.

    `df.attrs` keeps the burst's dimension values (`dims`), the memory optimizer level and config, and the
    execution graph's recompute node count when the burst saved its ONNX stages."""
    import pandas as pd

    data = _plans_data(run)
    df = pd.DataFrame(data["plans"]).reindex(columns=_COLUMNS)
    df["type_name"] = df["type"].map(TYPE_NAMES)
    df["saving_mb"] = df["saving_bytes"] / 2**20
    for key in ("dims", "ort_dims", "memory_opt_level", "config", "probe_config", "execution_graph",
                "steady_peak"):
        df.attrs[key] = data.get(key)
    return df


def _as_table(plans_or_run) -> Any:
    import pandas as pd

    return plans_or_run if isinstance(plans_or_run, pd.DataFrame) else plans(plans_or_run)


def what_if(plans_or_run, **dims: int) -> Any:
    """Every plan's saving for other values of the symbolic dimensions (the rest keep the burst's values).

    `what_if(run, idx_dim0=32)`: a DataFrame with the saving at the burst's shapes and at the new ones."""
    table = _as_table(plans_or_run)
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


def what_if_figure(table, top: int | None = 12):
    """Bar chart of a what_if() table: saving per plan at the burst's shapes and at the what-if shapes."""
    from matplotlib.figure import Figure

    rows = table.head(top) if top else table
    fig = Figure(figsize=(7, 0.4 * len(rows) + 1.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    y = range(len(rows))
    labels = [f"{p}: {c.rsplit(':', 1)[0]}" for p, c in zip(rows["plan"], rows["cluster_id"], strict=True)]
    for shift, column, dims in ((0.2, "saving_bytes", "base_dims"), (-0.2, "what_if_bytes", "dims")):
        label = _dims_label(table.attrs.get(dims))
        ax.barh([v + shift for v in y], rows[column] / 2**20, height=0.4, label=label)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted saving (MiB)")
    ax.set_title("recompute plans: saving at other shapes")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _dims_label(dims) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((dims or {}).items())) or "burst shapes"


# --------------------------------------------------------------------------- choosing plans


def plan_config(plan_ids: Sequence[int | str], plans_or_run=None) -> list[str]:
    """The `cluster:type:count` strings for these plans. An id is a plan number (needs the plans), a plan's
    cluster id, or `subgraph:type[:count]` (count -1 = every occurrence). Unknown ids are rejected with the
    list of valid ones when the plans are given."""
    if isinstance(plan_ids, str | int):
        plan_ids = [plan_ids]
    table = _as_table(plans_or_run) if plans_or_run is not None else None
    valid: dict[str, str] = {}  # "subgraph:type" -> cluster id
    numbers: dict[int, str] = {}
    if table is not None:
        for number, cluster_id in zip(table["plan"], table["cluster_id"], strict=True):
            numbers[int(number)] = cluster_id
            for subgraph, opt_type, _ in _parse_cluster(cluster_id):
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
            m = _PLAN_ID.match(text.strip())
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
    from ortlab.run import write_json

    entries = plan_config(plan_ids, plans)
    path = Path(path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, entries)
    return path


# --------------------------------------------------------------------------- measuring plan sets


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

    from ortlab.options import Options
    from ortlab.run import write_json
    from ortlab.worker import Session

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


def _labelled_scatter(table, x: str, y: str, size: tuple[float, float]):
    """A figure with one labelled point per plan set that has both values; returns (fig, ax, rows used)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ok = table.dropna(subset=[x, y])
    ax.scatter(ok[x], ok[y])
    for name, px, py in zip(ok["set"], ok[x], ok[y], strict=True):
        ax.annotate(name, (px, py), textcoords="offset points", xytext=(4, 4), fontsize=8)
    return fig, ax, ok


def pareto_figure(table):
    """Peak memory against median step time, one point per plan set; the non-dominated sets on a line."""
    fig, ax, ok = _labelled_scatter(table, "median_step_ms", "peak_mem_mb", (6.5, 4))
    front = _front(list(zip(ok["median_step_ms"], ok["peak_mem_mb"], strict=True)))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), linestyle="--", alpha=0.5, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_xlabel("median step time (ms)")
    ax.set_ylabel("peak memory after step 0 (MB)")
    ax.set_title("recompute plan sets: memory vs time")
    ax.grid(alpha=0.3)
    return fig


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    front, best = [], float("inf")
    for x, y in sorted(points):
        if y < best:
            front.append((x, y))
            best = y
    return front


def saving_figure(table):
    """Predicted saving (ORT's expressions) against measured saving (peak memory vs the no-plan set)."""
    fig, ax, ok = _labelled_scatter(table, "predicted_saving_mb", "measured_saving_mb", (5.5, 4))
    hi = max([1.0, *ok["predicted_saving_mb"], *ok["measured_saving_mb"]])
    ax.plot([0, hi], [0, hi], linestyle=":", color="gray", label="measured = predicted")
    ax.set_xlabel("predicted saving (MB)")
    ax.set_ylabel("measured saving (MB)")
    ax.set_title("recompute: predicted vs measured")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


# --------------------------------------------------------------------------- CLI


def register_cli(subparsers) -> None:
    """`ortlab plans [--model M] [--model-arg K=V]... [--json] [--sweep] [--steps N] [--out DIR]`."""
    p = subparsers.add_parser("plans", help="the memory optimizer's recompute plans; --sweep measures them")
    p.add_argument("--model", default=None, help="module:callable or file.py:callable (default: the demo)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="factory keyword")
    p.add_argument("--json", action="store_true")
    p.add_argument("--sweep", action="store_true", help="measure plan sets (none, top plans, level 1, 2...)")
    p.add_argument("--steps", type=int, default=None, help="steps per burst (default 1; with --sweep 6)")
    p.add_argument("--out", default="runs", help="folder for run folders (default ./runs)")
    p.set_defaults(func=cmd_plans)


def cmd_plans(args) -> int:
    import sys

    from ortlab.burst import BurstError
    from ortlab.cli import _parse_model_arg
    from ortlab.options import OptionError
    from ortlab.worker import Session, WorkerError
    from ortlab.workload import WorkloadError

    try:
        model_kwargs = dict(_parse_model_arg(a) for a in args.model_arg)
        least = 2 if args.sweep else 1
        steps = args.steps if args.steps is not None else (6 if args.sweep else 1)
        if steps < least:
            raise PlanError(f"--steps {steps} is not allowed; allowed: a whole number >= {least}")
        with Session(args.model, model_kwargs, out=args.out) as session:
            if args.sweep:
                return _print_sweep(plan_sweep(session, steps=steps), args.json)
            run = session.burst("ortmodule", steps, {}, collect={"plans": {}}, progress=False)
            if run.status != "ok":
                print(f"ortlab plans: the burst {run.status}: {run.error}", file=sys.stderr)
                return 1
            return _print_plans(run, args.json)
    except (PlanError, OptionError, BurstError, WorkloadError, WorkerError) as e:
        print(f"ortlab plans: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2


def _print_plans(run, as_json: bool) -> int:
    data = _plans_data(run)
    if as_json:
        print(json.dumps({**data, "run": str(run.path)}, indent=2))
        return 0
    table = plans(run)
    print(f"{len(table)} recompute plans at {_dims_label(data['dims'])} (run {run.path})")
    if len(table):
        shown = table[["plan", "cluster_id", "type", "frequency", "saving_mb", "applied", "saving_expr"]]
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print("apply: ortlab.recompute.write_config([plan numbers], 'plans.json', plans=run), then "
              "--option memory_opt_config=plans.json; or --option memory_opt_level=1 (or 2)")
    return 0


def _print_sweep(sweep: Sweep, as_json: bool) -> int:
    cols = ["set", "status", "median_step_ms", "peak_mem_mb", "predicted_saving_mb", "measured_saving_mb",
            "recompute_nodes", "loss_equal"]
    if as_json:
        rows = sweep.table[[*cols, "plans", "max_loss_rel_diff"]].to_dict(orient="records")
        data = {"rows": rows, "notes": sweep.notes, "path": str(sweep.path)}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(sweep.table[cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        for note in sweep.notes:
            print(f"note: {note}")
    return 0 if (sweep.table["status"] == "ok").all() else 1
