"""LayerNorm with a weight and no bias (nn.LayerNorm(bias=False), timm's LayerNorm2dNoBias) given a bias of zeros
computed from the weight (weight * 0: its gradient adds zero to the weight's), not a parameter: the same math, and
ORT's LayerNormalization then has all its inputs (a constant would not do: ORT shares equal constants between
layers, and then finds the gradient of that one constant defined twice). Without a
bias ORT 1.19.2's gradient builder names the missing bias's gradient "_grad": one such layer crashes the process,
several fail with "Duplicate definition of name (_grad)" (timm's PoolFormerV2 and ConvNeXt-style models with
bias-free norms). A layer without a weight but with a bias gets a weight of ones the same way."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import ORT_FAILED
from ortlab.compat.failures import NO_BIAS_NORM
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, *,
               original: Any) -> Any:
    if weight is not None and bias is None:
        bias = weight * 0  # computed from the weight: a constant would be one value ORT shares between layers
    elif weight is None and bias is not None:
        weight = bias * 0 + 1
    return original(input, normalized_shape, weight, bias, eps)


REPLACEMENTS = {"layer_norm": layer_norm}  # torch.nn.functional name -> its rewrite

FIX = Fix("layer-norm-bias", "F.layer_norm without a bias given weight * 0 (without a weight, bias * 0 + 1)",
          FixKind.MODULE, removes=lambda b: b.kind == ORT_FAILED and b.op == NO_BIAS_NORM,
          apply=replacing(REPLACEMENTS))
