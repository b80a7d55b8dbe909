"""A global average pool, `adaptive_avg_pool2d(x, 1)` (nn.AdaptiveAvgPool2d(1)), computed as the spatial mean
`x.mean((-2, -1), keepdim=True)`: the same math. ORTModule 1.19.2 exports the pool as its ATen op, and on the CPU
the gradients that flow through it into a broadcast product come out wrong while the forward agrees:
squeeze-and-excitation blocks (EfficientNet, RegNetY, MobileNetV3) get gradients 1-18x off PyTorch's, found by
ortlab's first-step gradient check and localized by its activation statistics. With the mean, ORT's gradients
agree (<= 1e-5)."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import WRONG_GRADIENT
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OP = "aten::_adaptive_avg_pool2d"


def _global(output_size: Any) -> bool:
    return output_size == 1 or (isinstance(output_size, list | tuple) and list(output_size) == [1, 1])


def adaptive_avg_pool2d(input: Any, output_size: Any, *, original: Any) -> Any:
    if _global(output_size) and input.dim() in (3, 4):
        return input.mean((-2, -1), keepdim=True)
    return original(input, output_size)


REPLACEMENTS = {"adaptive_avg_pool2d": adaptive_avg_pool2d}  # torch.nn.functional name -> its rewrite

FIX = Fix("global-avg-pool", "adaptive_avg_pool2d(x, 1) computed as x.mean((-2, -1), keepdim=True)", FixKind.MODULE,
          removes=lambda b: b.kind == WRONG_GRADIENT and b.op == OP, apply=replacing(REPLACEMENTS))
