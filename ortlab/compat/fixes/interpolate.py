"""Linear, bilinear and trilinear interpolation (nn.Upsample, F.interpolate) computed as what they are: a linear map
per spatial dimension, out = A_h x A_w^T, with each row of A holding the two weights torch's kernel gives the two
nearest input positions (align_corners, scale_factor and recompute_scale_factor as torch reads them). The
exporter writes the interpolation as ONNX Resize, whose gradient ORT 1.19.2 builds as ResizeGrad: a kernel on CUDA
(orttraining/training_ops/cuda/tensor/resize_grad.cc, 4-D linear only) and none on the CPU ("Could not find an
implementation for ResizeGrad(1)"): U-Nets, FPNs and segmentation heads do not train there. MatMul has a CPU
gradient. The matrices are built from the input's size when the graph is exported: the graph holds that size
(another image size needs another export, which `ortlab check` names as a baked input). Nearest, bicubic, area and
antialiased modes are left to torch's function."""

from __future__ import annotations

import math
from typing import Any

from ortlab.compat.blockers import NO_GRADIENT_KERNEL
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OPS = ("Resize", "ResizeGrad")
MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}


def weights(size_in: int, size_out: int, align_corners: bool, scale: float | None) -> list[list[float]]:
    """The (size_out, size_in) interpolation matrix of one dimension, by torch's source-index rule."""
    if align_corners:
        ratio = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size_in / size_out
    rows = []
    for dst in range(size_out):
        src = ratio * dst if align_corners else max(ratio * (dst + 0.5) - 0.5, 0.0)
        i0 = min(int(src), size_in - 1)
        i1 = i0 + 1 if i0 < size_in - 1 else i0
        frac = src - i0
        row = [0.0] * size_in
        row[i0] += 1.0 - frac
        row[i1] += frac
        rows.append(row)
    return rows


def interpolate(input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False, *, original: Any) -> Any:
    import torch

    dims = MODES.get(mode)
    if dims is None or antialias or input.dim() != dims + 2:
        return original(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    spatial = [int(s) for s in input.shape[2:]]
    scales: list[float | None]
    if size is not None:
        out_sizes = [int(s) for s in (size if isinstance(size, list | tuple) else [size] * dims)]
        scales = [None] * dims
    else:
        factors = [float(f) for f in (scale_factor if isinstance(scale_factor, list | tuple)
                                      else [scale_factor] * dims)]
        out_sizes = [math.floor(s * f) for s, f in zip(spatial, factors, strict=True)]
        scales = [None] * dims if recompute_scale_factor else list(factors)
    x = input
    for axis, (n_in, n_out, scale) in enumerate(zip(spatial, out_sizes, scales, strict=True)):
        matrix = torch.tensor(weights(n_in, n_out, bool(align_corners), scale), dtype=x.dtype, device=x.device)
        dim = axis + 2
        x = torch.matmul(x.transpose(dim, -1), matrix.t()).transpose(dim, -1)
    return x


REPLACEMENTS = {"interpolate": interpolate}  # torch.nn.functional name -> its rewrite

FIX = Fix("linear-interpolation", "F.interpolate's linear, bilinear and trilinear modes computed as matrix "
          "products", FixKind.MODULE, removes=lambda b: b.kind == NO_GRADIENT_KERNEL and b.op in OPS,
          apply=replacing(REPLACEMENTS))
