"""InstanceNorm (1d, 2d, 3d) written out with means, a square root and a division: the formula torch's kernel
computes. The exporter writes it as ONNX InstanceNormalization, and ORT 1.19.2 has no gradient builder for it ("The
gradient builder has not been registered: InstanceNormalization"): style-transfer and GAN generators do not train.

In training (or without running statistics) each sample's channel is normalized by its own mean and biased
variance; with `track_running_stats` the running mean and (unbiased) variance are updated as torch updates them,
in place and without gradient (ORT's graph does not carry buffer updates: `ortlab check` names them and the fix
pytorch-buffers advances them, as for BatchNorm); in eval mode with running statistics those are used."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import NO_GRADIENT
from ortlab.compat.fixes._patch import from_function, replacing
from ortlab.compat.registry import Fix, FixKind

OP = "InstanceNormalization"


def instance_norm(input: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                  bias: Any = None, use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5, *,
                  original: Any) -> Any:
    import torch

    dims = tuple(range(2, input.dim()))
    shape = (1, -1) + (1,) * len(dims)
    if use_input_stats:
        mean = input.mean(dims, keepdim=True)
        centered = input - mean
        var = (centered * centered).mean(dims, keepdim=True)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                n = input[0, 0].numel()
                unbiased = var.detach().mean(0).reshape(-1) * (n / max(n - 1, 1))
                running_mean.mul_(1 - momentum).add_(mean.detach().mean(0).reshape(-1), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
    else:
        centered = input - running_mean.reshape(shape)
        var = running_var.reshape(shape)
    out = centered / torch.sqrt(var + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


REPLACEMENTS = {"instance_norm": instance_norm}  # torch.nn.functional name -> its rewrite

FIX = Fix("instance-norm", "F.instance_norm written out (mean, biased variance, square root)", FixKind.MODULE,
          removes=lambda b: b.kind == NO_GRADIENT and b.op == OP and from_function(b, "instance_norm"),
          apply=replacing(REPLACEMENTS))
