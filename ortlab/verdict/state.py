"""The model's state at the end of a burst, summarized per parameter and buffer (final_state.json): enough to name
the tensors two runs disagree on, small enough to keep with every run. Buffers matter most: ORTModule can
train with equal losses while a buffer that forward mutates is updated differently (or not at all).

Whole-number tensors (counters, num_batches_tracked) must be equal. Float tensors are judged like gradients
(ortlab.verdict.exact): each run's summary (sum, norm) against a float64 PyTorch run's, beside PyTorch fp32's;
without a float64 run, against the spread of a PyTorch pair from a perturbed start."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE = "final_state.json"
NOISE_FACTOR = 10.0  # a float tensor differs when it is this many times further off than the noise pair
FLOOR = 1e-6  # ... and further than this (relative), whatever the noise


def summarize(model: Any) -> dict[str, dict[str, Any]]:
    """Per state_dict entry: parameter or buffer, dtype, size, the owning module's class, and the float64 sum and
    sum of squares."""
    import torch

    parameters = {n for n, _ in model.named_parameters()}
    types = {n: type(m).__name__ for n, m in model.named_modules()}
    out = {}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            values = (tensor.detach().abs() if tensor.is_complex() else tensor.detach()).double()
            out[name] = {"kind": "parameter" if name in parameters else "buffer",
                         "dtype": str(tensor.dtype).removeprefix("torch."), "numel": tensor.numel(),
                         "module_type": types.get(name.rpartition(".")[0]),
                         "sum": float(values.sum()), "sumsq": float((values * values).sum())}
    return out


def write(model: Any, run_dir: Path) -> None:
    from ortlab.run import write_json

    write_json(run_dir / FILE, summarize(model))


def read(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    path = Path(run_dir) / FILE
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far two summaries of one tensor are apart, relative to its size (0 for equal; inf for non-finite)."""
    values = (a["sum"], b["sum"], a["sumsq"], b["sumsq"])
    if not all(math.isfinite(v) for v in values):
        return 0.0 if values[0::2] == values[1::2] else math.inf
    scale = math.sqrt(max(a["sumsq"], b["sumsq"]) * max(a["numel"], 1)) or 1.0
    return max(abs(a["sum"] - b["sum"]) / scale,
               abs(a["sumsq"] - b["sumsq"]) / (max(a["sumsq"], b["sumsq"]) or 1.0))


def whole(entry: dict[str, Any]) -> bool:
    """A whole-number tensor (a counter, num_batches_tracked): it must match exactly."""
    return not entry["dtype"].startswith(("float", "bfloat", "complex"))


def differing(pytorch: dict, other: dict, noise: dict | None = None, exact: dict | None = None
              ) -> list[dict[str, Any]]:
    """The tensors whose end states differ: whole-number ones when not equal; float ones when the other run is
    measurably further from the float64 run (`exact`) than PyTorch fp32 is, or, without one, beyond what the noise
    pair shows (PyTorch against PyTorch from a perturbed start). Float tensors are not judged without either."""
    from ortlab.verdict.exact import close_numbers, judge_numbers

    out = []
    for name, pt in pytorch.items():
        ort = other.get(name)
        if ort is None:
            continue
        gap = distance(pt, ort)
        if whole(pt):
            if gap > 0:
                out.append(_row(name, pt, ort, gap, None))
            continue
        if exact is not None and name in exact:
            if close_numbers(vector(ort), vector(pt)):
                continue
            j = judge_numbers(vector(ort), vector(pt), vector(exact[name]))
            if j.diverged:
                out.append({**_row(name, pt, ort, gap, None), "to_float64": j.candidate,
                            "pytorch_to_float64": j.pytorch, "allowed": j.allowed, "norm": j.norm})
            continue
        if noise is None or name not in noise:
            continue
        spread = distance(pt, noise[name])
        if gap > max(NOISE_FACTOR * spread, FLOOR):
            out.append(_row(name, pt, ort, gap, spread))
    return sorted(out, key=lambda r: (r["kind"] != "buffer", -r["distance"]))


def vector(entry: dict[str, Any]) -> list[float]:
    """A tensor's summary as numbers to judge: its sum and its norm."""
    return [entry["sum"], math.sqrt(max(entry["sumsq"], 0.0)) if math.isfinite(entry["sumsq"]) else entry["sumsq"]]


def _row(name: str, pt: dict, ort: dict, gap: float, spread: float | None) -> dict[str, Any]:
    return {"name": name, "kind": pt["kind"], "dtype": pt["dtype"], "module_type": pt.get("module_type"),
            "whole": whole(pt), "distance": gap, "noise": spread, "pytorch_sum": pt["sum"], "ortmodule_sum": ort["sum"]}
