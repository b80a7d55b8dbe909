"""GroupNorm without weight or bias (timm's GroupNorm1NoBias, `affine=False`) written out: each sample's groups of
C/G channels normalized over their channels and positions by their own mean and biased variance, then scaled and
shifted per channel, as torch computes it, for any number of groups. With weight and bias ORTModule exports
group_norm as ATen's native_group_norm, which it differentiates; without either it falls back to torch's
symbolic, which writes it as ONNX InstanceNormalization on the input reshaped to (N, G, -1), and ORT 1.19.2 has
no gradient builder for that ("The gradient builder has not been registered: InstanceNormalization"): timm's
PoolFormerV2 (GroupNorm with one group and no bias) does not train. The form with both is left to torch's
function (ORT trains it as it is)."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import NO_GRADIENT
from ortlab.compat.fixes._patch import from_function, replacing
from ortlab.compat.registry import Fix, FixKind

OP = "InstanceNormalization"


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5, *,
               original: Any) -> Any:
    import torch

    if weight is not None and bias is not None:
        return original(input, num_groups, weight, bias, eps)
    grouped = input.reshape(input.shape[0], num_groups, -1)  # (N, G, C/G * positions)
    centered = grouped - grouped.mean(-1, keepdim=True)
    var = (centered * centered).mean(-1, keepdim=True)
    out = (centered / torch.sqrt(var + eps)).reshape(input.shape)
    shape = (1, -1) + (1,) * (input.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


REPLACEMENTS = {"group_norm": group_norm}  # torch.nn.functional name -> its rewrite

FIX = Fix("group-norm", "F.group_norm without weight or bias written out (per group: mean, biased variance, square "
          "root)", FixKind.MODULE,
          removes=lambda b: b.kind == NO_GRADIENT and b.op == OP and from_function(b, "group_norm"),
          apply=replacing(REPLACEMENTS))
