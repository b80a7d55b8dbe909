"""Channel dropout (nn.Dropout1d/2d/3d) and alpha dropout (nn.AlphaDropout, nn.FeatureAlphaDropout) in training
written as the input times a random mask, the mask drawn by an ordinary dropout of ones shaped as torch shapes its
noise (one value per sample and channel, or per element): the exporter of torch 2.6 cannot export these in
training mode ("Unsupported: ONNX export of operator aten::feature_dropout, training mode"), so any model with
them falls back to PyTorch. The mask has torch's distribution (kept with probability 1 - p, scaled by 1/(1 - p);
alpha dropout's affine correction as torch computes it), not torch's random numbers, as with nn.Dropout under
ORTModule; with the rate 0 (ortlab's parity mode) it is the identity."""

from __future__ import annotations

import math
from typing import Any

from ortlab.compat.blockers import EXPORT_FAILED, UNSUPPORTED_OP
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OPS = ("aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout", "SymbolicValueError")
ALPHA = 1.7580993408473766  # SELU's alpha times its scale: what alpha dropout sets dropped values to (negated)


def _rate(p: float, original: Any) -> float:
    """The rate to apply: 0 inside ortlab's parity mode (which wrapped torch's function before this fix did)."""
    return 0.0 if getattr(original, "_ortlab_original", None) is not None else float(p)


def _keep(input: Any, p: float, per_channel: bool, unbatched: bool) -> Any:
    """1 where kept, 0 where dropped, shaped as torch's noise (broadcast over the feature dimensions)."""
    import torch
    import torch.nn.functional as F

    if per_channel:
        lead = 1 if unbatched else 2
        shape = tuple(input.shape[:lead]) + (1,) * (input.dim() - lead)
    else:
        shape = tuple(input.shape)
    ones = torch.ones(shape, dtype=input.dtype, device=input.device)
    return (F.dropout(ones, p, True) > 0).to(input.dtype)


def _channel(dims: int) -> Any:
    def dropout_nd(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False, *,
                   original: Any) -> Any:
        p = _rate(p, original)
        if not training or p == 0.0:
            return input
        unbatched = dims != 2 and input.dim() == dims + 1
        return input * _keep(input, p, True, unbatched) / (1 - p)

    return dropout_nd


def _alpha(per_channel: bool) -> Any:
    def alpha_dropout(input: Any, p: float = 0.5, training: bool = False, inplace: bool = False, *,
                      original: Any) -> Any:
        p = _rate(p, original)
        if not training or p == 0.0:
            return input
        if p == 1.0:
            return input * 0
        a = 1.0 / math.sqrt((ALPHA * ALPHA * p + 1) * (1 - p))
        keep = _keep(input, p, per_channel, False)
        return input * keep * a + (keep - 1) * (ALPHA * a) + ALPHA * a * p

    return alpha_dropout


def _removes(blocker: Any) -> bool:
    return blocker.kind in (EXPORT_FAILED, UNSUPPORTED_OP) and (
        blocker.op in OPS or ("dropout" in blocker.message and "training mode" in blocker.message))


REPLACEMENTS = {  # torch.nn.functional name -> its rewrite
    "dropout1d": _channel(1),
    "dropout2d": _channel(2),
    "dropout3d": _channel(3),
    "alpha_dropout": _alpha(False),
    "feature_alpha_dropout": _alpha(True),
}

FIX = Fix("feature-dropout", "F.dropout1d/2d/3d, alpha_dropout and feature_alpha_dropout in training as the input "
          "times a dropout mask", FixKind.MODULE, removes=_removes, apply=replacing(REPLACEMENTS))
