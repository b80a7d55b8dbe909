"""RMSNorm written out: x / sqrt(mean(x^2) + eps) * weight over the normalized dimensions, eps defaulting to the
dtype's machine epsilon, as torch computes it. The exporter of torch 2.6 has no ONNX symbolic for `aten::rms_norm`
at opset 17, so nn.RMSNorm (Llama-style blocks written with torch.nn) does not export and ORTModule falls back to
PyTorch."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import UNSUPPORTED_OP
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OP = "aten::rms_norm"


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None, *,
             original: Any) -> Any:
    import torch

    dims = tuple(range(-len(normalized_shape), 0))
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    out = input / torch.sqrt((input * input).mean(dims, keepdim=True) + eps)
    return out * weight if weight is not None else out


REPLACEMENTS = {"rms_norm": rms_norm}  # torch.nn.functional name -> its rewrite

FIX = Fix("rms-norm", "F.rms_norm written out (x / sqrt(mean(x^2) + eps) * weight)", FixKind.MODULE,
          removes=lambda b: b.kind == UNSUPPORTED_OP and b.op == OP, apply=replacing(REPLACEMENTS))
