"""Reading ORT's recompute plans from a wrapped model's memory observer, at this burst's shapes.

ORT 1.19.2 finds the plans whenever it builds a training session: its memory observer is always enabled and
the session creation probes the optimized graph and keeps every plan. The log level only decides whether ORT
also prints them (INFO and below), so reading them needs no log change. The ORT state is reached through
ortlab._ort only.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ortlab.recompute.expr import parse_cluster, requested, symbols, value_or_none

SOURCE = "ORTModule's memory observer (its plans and their symbolic savings)"


def _burst_dims(engine) -> dict[str, int]:
    """This burst's values of the graph's symbolic dimensions, from its first batch through ORT's own input
    accessors (ORT's observer keeps the first batch it ever saw: another burst's when a wrap is reused)."""
    import torch

    from ortlab.workload import call_arguments, to_device

    info = engine.current.ort_internals().post_export()
    inputs, _ = engine.feed.batch(0)  # this burst's first batch (its sampler's, its rank's)
    device = next(engine.model.parameters()).device
    inputs = to_device(inputs, device)
    args, kwargs = call_arguments(inputs)
    dims = {}
    for name, axes in info.dynamic_axes.items():
        accessor = info.input_accessors.get(name)
        if accessor is None:
            continue
        data = accessor(args, kwargs)
        if isinstance(data, torch.Tensor):
            for index, dim in axes.items():
                dims[str(dim)] = int(data.shape[int(index)])
    return dims


def read_plans(engine) -> dict[str, Any]:
    """Every plan ORT's memory observer holds for the current burst's ORTModule (`engine.current`: a backend
    with ONNX stages), evaluated at this burst's shapes."""
    observer = engine.current.ort_internals().memory_observer()
    config_path = observer.config_path
    config: list[str] = []
    if config_path:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            config = list(json.loads(Path(config_path).read_text(encoding="utf-8")))
    ort_dims = dict(observer.dims)
    try:
        dims = _burst_dims(engine) or ort_dims
    except Exception:  # an unusual input structure: ORT's own first-batch values are the next best
        dims = ort_dims
    wanted = requested(config)
    plans = []
    for summary in observer.plans:
        parts = parse_cluster(summary.cluster_id)
        expr = summary.saving_expr
        keys = [f"{s}:{t}" for s, t, _ in parts]
        applied = bool(keys) and all(k in wanted for k in keys)
        freq = summary.frequency
        counts = [freq if wanted[k] < 0 else min(wanted[k], freq) for k in keys] if applied else [0]
        ort_value = summary.ort_saving
        plans.append({
            "cluster_id": summary.cluster_id,
            "subgraph": ",".join(s for s, _, _ in parts),
            "type": max(t for _, t, _ in parts),
            "frequency": freq,
            "saving_expr": expr,
            "raw_expr": summary.raw_expr,
            "symbols": symbols(expr),
            "saving_bytes": value_or_none(expr, dims),
            "ort_saving_bytes": float(ort_value) if isinstance(ort_value, int | float) else None,
            "applied": applied,
            "applied_count": min(counts),
        })
    # ortlab's numbering: largest saving first, ties by id: stable (ORT's log breaks ties arbitrarily)
    plans.sort(key=lambda p: (-(p["saving_bytes"] or 0), p["cluster_id"]))
    for i, p in enumerate(plans, 1):
        p["plan"] = i
    return {
        "source": SOURCE,
        "observer_enabled": observer.enabled,
        "memory_opt_level": observer.memory_opt_level,
        "probe_config": observer.probe_config,
        "config_path": config_path,
        "config": config,
        "dims": dims,
        "ort_dims": ort_dims,
        "plans": plans,
    }


def recompute_nodes(onnx_path: str | Path) -> dict[str, Any]:
    """The recompute nodes ORT added to an execution graph (ORT names each `<original name>_recompute`)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    nodes = [n for n in model.graph.node if n.name.endswith("_recompute")]
    return {"file": str(onnx_path), "nodes": len(model.graph.node), "recompute_nodes": len(nodes),
            "recompute_ops": dict(sorted(Counter(n.op_type for n in nodes).items()))}
