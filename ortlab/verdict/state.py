"""The model's state at the end of a burst, summarized per parameter and buffer (final_state.json): enough to name
the tensors two runs disagree on, small enough to keep with every run. Buffers matter most: ORTModule can
train with equal losses while a buffer that forward mutates is updated differently (or not at all)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE = "final_state.json"
NOISE_FACTOR = 10.0  # a float tensor differs when it is this many times further off than the noise pair
FLOOR = 1e-6  # ... and further than this (relative), whatever the noise


def summarize(model: Any) -> dict[str, dict[str, Any]]:
    """Per state_dict entry: parameter or buffer, dtype, size, and the float64 sum and sum of squares."""
    import torch

    parameters = {n for n, _ in model.named_parameters()}
    out = {}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            values = (tensor.detach().abs() if tensor.is_complex() else tensor.detach()).double()
            out[name] = {"kind": "parameter" if name in parameters else "buffer",
                         "dtype": str(tensor.dtype).removeprefix("torch."), "numel": tensor.numel(),
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


def differing(pytorch: dict, ortmodule: dict, noise: dict | None) -> list[dict[str, Any]]:
    """The tensors whose end states differ beyond what the noise pair shows (PyTorch against PyTorch from a
    perturbed start). Whole-number tensors must be equal; float ones are judged only with a noise pair."""
    out = []
    for name, pt in pytorch.items():
        ort = ortmodule.get(name)
        if ort is None:
            continue
        whole = not pt["dtype"].startswith(("float", "bfloat", "complex"))
        gap = distance(pt, ort)
        if whole:
            if gap > 0:
                out.append(_row(name, pt, ort, gap, None))
            continue
        if noise is None or name not in noise:
            continue
        spread = distance(pt, noise[name])
        if gap > max(NOISE_FACTOR * spread, FLOOR):
            out.append(_row(name, pt, ort, gap, spread))
    return sorted(out, key=lambda r: (r["kind"] != "buffer", -r["distance"]))


def _row(name: str, pt: dict, ort: dict, gap: float, spread: float | None) -> dict[str, Any]:
    return {"name": name, "kind": pt["kind"], "distance": gap, "noise": spread,
            "pytorch_sum": pt["sum"], "ortmodule_sum": ort["sum"]}
