"""ConvTranspose (1d, 2d, 3d) computed as the convolution it is the gradient of: the input stuffed with stride - 1
zeros between its values, padded by dilation * (kernel - 1) - padding on each side (plus output_padding after),
convolved with stride 1 by the kernel flipped in space and with its input and output channels swapped (per
group). Every output is the same sum of the same products. ORT 1.19.2 builds ConvTranspose's gradient as
ConvTransposeGrad, which has a kernel on CUDA (orttraining/training_ops/cuda/nn/conv_transpose_grad.cc) and none on
the CPU ("Could not find an implementation for ConvTransposeGrad(1)"): U-Nets, autoencoders and GAN generators do
not train there. Conv, Pad and Reshape have CPU gradients. The convolution runs on stride * (input - 1) + 1
positions per dimension, so it costs up to stride^dims times the transposed convolution's multiplications."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import NO_GRADIENT_KERNEL
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OPS = ("ConvTranspose", "ConvTransposeGrad")


def _tuple(value: Any, n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, list | tuple) else (int(value),) * n


def _as_convolution(input: Any, weight: Any, bias: Any, stride: Any, padding: Any, output_padding: Any,
                    groups: int, dilation: Any) -> Any:
    import torch
    import torch.nn.functional as F

    n = weight.dim() - 2
    if isinstance(padding, str):
        raise ValueError(f"conv_transpose{n}d padding {padding!r}: only numbers are allowed")
    stride, padding, output_padding, dilation = (_tuple(v, n) for v in (stride, padding, output_padding, dilation))
    kernel = weight.shape[2:]
    batched = input.dim() == n + 2
    x = input if batched else input.unsqueeze(0)
    lead, spatial = x.shape[:2], x.shape[2:]
    if any(s > 1 for s in stride):  # (N, C, H, W) -> (N, C, H, 1, W, 1) -> pad each 1 to s -> (N, C, H*s, W*s)
        x = x.reshape(*lead, *[v for size in spatial for v in (size, 1)])
        pads = []
        for s in reversed(stride):
            pads += [0, s - 1, 0, 0]
        x = F.pad(x, pads).reshape(*lead, *[size * s for size, s in zip(spatial, stride, strict=True)])
    pads = []  # F.pad's order: last dimension first; the s - 1 trailing zeros stuffing made count as padding
    for k, s, p, op, d in reversed(list(zip(kernel, stride, padding, output_padding, dilation, strict=True))):
        before = d * (k - 1) - p
        pads += [before, before + op - (s - 1)]
    x = F.pad(x, pads)
    c_in, c_out_per_group = weight.shape[:2]
    w = weight.reshape(groups, c_in // groups, c_out_per_group, *kernel).transpose(1, 2)
    w = w.reshape(groups * c_out_per_group, c_in // groups, *kernel)
    for dim, k in enumerate(kernel, 2):  # flipped by a gather: ORT's gradient of a negative-step Slice fails
        w = w.index_select(dim, torch.arange(k - 1, -1, -1, device=w.device))
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    out = conv(x, w, bias, 1, 0, dilation, groups)
    return out if batched else out.squeeze(0)


def conv_transpose(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                   output_padding: Any = 0, groups: int = 1, dilation: Any = 1, *, original: Any) -> Any:
    return _as_convolution(input, weight, bias, stride, padding, output_padding, groups, dilation)


REPLACEMENTS = {  # torch.nn.functional name -> its rewrite
    "conv_transpose1d": conv_transpose,
    "conv_transpose2d": conv_transpose,
    "conv_transpose3d": conv_transpose,
}

FIX = Fix("conv-transpose", "F.conv_transpose1d/2d/3d computed as a convolution of the zero-stuffed input by the "
          "flipped kernel", FixKind.MODULE, removes=lambda b: b.kind == NO_GRADIENT_KERNEL and b.op in OPS,
          apply=replacing(REPLACEMENTS))
