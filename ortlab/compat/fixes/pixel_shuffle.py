"""PixelShuffle and PixelUnshuffle written as reshape, permute, reshape: the same rearrangement of the same
values. The exporter writes them as ONNX DepthToSpace and SpaceToDepth, and ORT 1.19.2 has no gradient builder for
either ("The gradient builder has not been registered: DepthToSpace"): super-resolution models (ESPCN-style
upsamplers) do not train. Reshape and Transpose have ORT gradients; the gradients are PyTorch's exactly."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import NO_GRADIENT
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OPS = ("DepthToSpace", "SpaceToDepth")


def pixel_shuffle(input: Any, upscale_factor: int, *, original: Any) -> Any:
    r = int(upscale_factor)
    *lead, c, h, w = input.shape
    x = input.reshape(-1, c // (r * r), r, r, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Any, downscale_factor: int, *, original: Any) -> Any:
    r = int(downscale_factor)
    *lead, c, h, w = input.shape
    x = input.reshape(-1, c, h // r, r, w // r, r).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(*lead, c * r * r, h // r, w // r)


REPLACEMENTS = {  # torch.nn.functional name -> its rewrite
    "pixel_shuffle": pixel_shuffle,
    "pixel_unshuffle": pixel_unshuffle,
}

FIX = Fix("pixel-shuffle", "F.pixel_shuffle and F.pixel_unshuffle written as reshape, permute, reshape", FixKind.MODULE,
          removes=lambda b: b.kind == NO_GRADIENT and b.op in OPS, apply=replacing(REPLACEMENTS))
