"""Two forwards' outputs compared: the tensors of any nesting, relative to their size."""

from __future__ import annotations

from typing import Any

AGREE = 1e-4  # relative difference of outputs up to which two forwards agree


def outputs_differ(expected: Any, got: Any, tolerance: float = AGREE) -> float | None:
    """The largest relative difference between the tensors of two outputs when above `tolerance`, else None."""
    from ortlab.compat.probe import output_tensors

    a, b = output_tensors(expected), output_tensors(got)
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return float("inf")
        x, y = x.detach().double(), y.detach().double().to(x.device)
        scale = max(float(x.norm()), 1e-12)
        worst = max(worst, float((x - y).norm()) / scale)
    return worst if worst > tolerance else None
