"""Per-node data over an ORTModule run's execution graph (the stage ORT runs, whose node names ORT's profiler and the
memory account use): the statistics' difference against PyTorch, ORT's kernel time, the activation bytes alive.

Written as Google Model Explorer's node-data JSON (`ModelNodeData`: per graph id, `results` keyed by node id, each
with its `value` and `bgColor`, and a `gradient` or `thresholds` legend), which its ONNX adapter (model-explorer-onnx)
matches by node name within the graph named as the ONNX graph is; ortlab's own node view colours its nodes the
same way (`Overlay.color`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.graphs.errors import GraphsError

KINDS = ("stats", "time", "memory")
UNITS = {"stats": "largest relative difference of the module's statistics against PyTorch (max over the steps)",
         "time": "ORT's kernel time, ms per profiled step", "memory": "activation MB alive when the node has run"}
LOW, HIGH = "#f8f9fa", "#e8590c"  # time and memory: the gradient from the smallest value to the largest
OK, NEAR, OVER = "#d3f9d8", "#fff3bf", "#ffc9c9"  # stats: within a tenth of the tolerance, within it, beyond it
STAGE = "execution_model"


@dataclass
class Overlay:
    """One kind of per-node data (`kind`: stats, time or memory) over a run's execution graph: `values` (node name
    -> value, in `unit`), `colors` (node name -> CSS colour), `graph` (the ONNX graph's name: Model Explorer's graph
    id), `stage_file` (the ONNX file to open), `notes` (what it could not attribute)."""

    kind: str
    run: str
    stage_file: Path
    graph: str
    values: dict[str, float]
    colors: dict[str, str]
    unit: str
    legend: dict[str, Any] = field(default_factory=dict)  # Model Explorer's gradient or thresholds
    notes: list[str] = field(default_factory=list)

    def color(self, node: str) -> str | None:
        """The node's colour (the same as Model Explorer's), None where it has no value."""
        return self.colors.get(node)

    def node_data(self) -> dict[str, Any]:
        """Model Explorer's node data (ModelNodeData.to_json_string's shape): {graph id: GraphNodeData}."""
        results = {n: {"value": v, "bgColor": self.colors[n]} for n, v in self.values.items()}
        return {self.graph: {"results": results, **self.legend}}

    def save(self, path: str | Path) -> Path:
        """Write the node data JSON (Model Explorer: `model-explorer --extensions=model_explorer_onnx STAGE_FILE
        --node_data_paths=PATH`, or its UI's "add per-node data")."""
        path = Path(path).expanduser()
        path.write_text(json.dumps(self.node_data(), indent=1) + "\n", encoding="utf-8")
        return path

    def top(self, n: int = 10):
        """The `n` nodes with the largest values (DataFrame: node, value)."""
        import pandas as pd

        rows = sorted(self.values.items(), key=lambda kv: -kv[1])[:n]
        return pd.DataFrame(rows, columns=["node", "value"])

    def __repr__(self) -> str:
        return f"Overlay({self.kind!r}, run={self.run!r}, {len(self.values)} nodes, graph={self.graph!r})"


def overlay(run: Any, kind: str, against: Any = None) -> Overlay:
    """The per-node `kind` (stats, time or memory) of an ORTModule run (a Run or its folder) with saved graphs.
    stats needs `against`: the PyTorch run it is compared with (default: the reference run of its comparison, the
    latest PyTorch run of the same model and steps started before it in the same folder)."""
    from ortlab.graphs.collection import load
    from ortlab.runs.run import Run, load_run

    if kind not in KINDS:
        raise GraphsError(f"overlay {kind!r} is not known; allowed: {', '.join(KINDS)}")
    run = run if isinstance(run, Run) else load_run(run)
    graphs = load(run)
    stage = graphs.stage(STAGE if STAGE in graphs.stages("training") else None, "training")
    import onnx

    name = onnx.load(str(stage.path), load_external_data=False).graph.name or "main_graph"
    values, notes, scores = {"stats": _stats, "time": _time, "memory": _memory}[kind](run, stage, against)
    values = {n: v for n, v in values.items() if n in stage.nodes_by_name}
    if not values:
        raise GraphsError(f"run {run.path.name} has no {kind} value for any node of {stage.path.name}")
    colors, legend = _colors(values, scores)
    return Overlay(kind, run.path.name, stage.path, name, values, colors, UNITS[kind], legend, notes)


Values = tuple[dict[str, float], list[str], dict[str, float] | None]  # values, notes, scores (stats only)


def _time(run, stage, against) -> Values:
    from ortlab.timing.errors import TimeError
    from ortlab.timing.table import HOW, node_times

    times = node_times(run)
    if not times:
        raise TimeError(f"run {run.path.name} has no ORT node times (time.json): {HOW}")
    data = run.read_json("time.json", {})
    notes = [f"the {len(times)} costliest of {data.get('nodes_total', '?')} nodes that ORT's profiler timed"]
    return {n: sum(r["ms"] for r in rows) for n, rows in times.items()}, notes, None


def _memory(run, stage, against) -> Values:
    from ortlab.account.errors import AccountError

    data = run.memory
    timeline = data.get("timeline") or {}
    if not timeline.get("node"):
        why = data.get("missing") or "the burst did not collect it (collect={'memory': {}}, on by default)"
        raise AccountError(f"run {run.path.name} has no memory account of ORT's graph: {why}")
    notes = [f"bytes alive after each node in ORT's {data.get('order', 'default')} execution order "
             f"(peak {data.get('peak_activation_bytes', 0) / 2**20:.2f} MB at {data.get('peak_node')})"]
    return {n: b / 2**20 for n, b in zip(timeline["node"], timeline["live"], strict=True)}, notes, None


def _stats(run, stage, against) -> Values:
    from ortlab.activations.diff import compare
    from ortlab.timing.profile import NONE, ROOT, module_of

    if against is None:
        from ortlab.reporting.sources import reference_of

        against = reference_of(run)
        if against is None:
            raise GraphsError(f"the stats overlay compares run {run.path.name} with its PyTorch run: none found "
                              "beside it; name it (--against RUN)")
    diff = compare(against, run)
    table = diff.table.dropna(subset=["score"])
    table = table.assign(rel=[row[f"rel_{row['worst']}"] for _, row in table.iterrows()])
    per_module = table.groupby(["module", "phase"]).agg(rel=("rel", "max"), score=("score", "max"))
    worst = per_module.to_dict(orient="index")
    modules = {m for m, _ in worst}
    values, scores = {}, {}
    for node in stage.model_nodes:
        module = module_of(node.name, modules)
        phase = "backward" if node.kind in ("gradient", "recompute") else "forward"
        if module in (ROOT, NONE) or (module, phase) not in worst:
            continue
        values[node.name] = float(worst[module, phase]["rel"])
        scores[node.name] = float(worst[module, phase]["score"])
    first = f"first divergence: {diff.first}" if diff.first else "no divergence beyond tolerance"
    return values, [f"against {Path(getattr(against, 'path', against)).name}: each node carries its module's worst "
                    "statistic (forward nodes the module's output, gradient nodes its gradient); nodes in no "
                    f"module have none; {first}"], scores


def _colors(values: dict[str, float], scores: dict[str, float] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """Stats by their multiple of the tolerance (green, yellow, red); time and memory on a gradient."""
    if scores is not None:
        colors = {n: OK if scores[n] <= 0.1 else NEAR if scores[n] <= 1 else OVER for n in values}
        return colors, {"thresholds": [{"value": 1e-4, "bgColor": OK}, {"value": 1e-3, "bgColor": NEAR},
                                       {"value": 1e300, "bgColor": OVER}]}
    lo, hi = min(values.values()), max(values.values())
    span = (hi - lo) or 1.0
    colors = {n: _mix(LOW, HIGH, (v - lo) / span) for n, v in values.items()}
    return colors, {"gradient": [{"stop": 0, "bgColor": LOW}, {"stop": 1, "bgColor": HIGH}]}


def _mix(a: str, b: str, t: float) -> str:
    ca, cb = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (a, b))
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))
