"""BatchNorm over every rank's samples (`sync_batchnorm`, ortlab.engine.ranks): the fix for a model whose BatchNorm
normalizes each rank's share by its own mean and variance, where one process normalizes the global batch.

On CUDA it is torch's `SyncBatchNorm.convert_sync_batchnorm`. torch's SyncBatchNorm refuses CPU tensors (2.6 and
2.14.1), so on the CPU each BatchNorm's forward is the same arithmetic with its statistics all-reduced over the
process group (`torch.distributed.nn.all_reduce`, which autograd differentiates: the gradient of a sum across
ranks is the sum of the ranks' gradients, as in SyncBatchNorm's backward)."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm


def convert(model: torch.nn.Module, device: torch.device) -> list[str]:
    """Every BatchNorm of `model` normalized over the process group, in place (parameters and buffers kept); returns
    their names."""
    names = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm) and not isinstance(m,
                                                                                                   torch.nn.SyncBatchNorm)]
    if device.type == "cuda":
        for name in names:
            parent, _, leaf = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, leaf, torch.nn.SyncBatchNorm.convert_sync_batchnorm(owner.get_submodule(leaf)))
        return names
    for name in names:
        module = model.get_submodule(name)
        module.forward = _synced(module)
    return names


def _synced(module: Any):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return type(module).forward(module, x)
        return synced_batch_norm(module, x)

    return forward


def synced_batch_norm(module: Any, x: torch.Tensor) -> torch.Tensor:
    """Training-mode batch norm of `x` with the mean and variance of every rank's samples (channels: dim 1)."""
    from torch.distributed.nn import all_reduce

    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, -1] + [1] * (x.dim() - 2)
    count = torch.tensor([float(x.numel() // x.shape[1])], dtype=x.dtype, device=x.device)
    summed = all_reduce(torch.cat([count, x.sum(dims)]))  # summed over the ranks, differentiably
    n = summed[0]
    mean = summed[1:] / n
    var = all_reduce((x - mean.view(shape)).square().sum(dims)) / n  # two passes, as one process's batch norm
    y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + module.eps)
    if module.affine:
        y = y * module.weight.view(shape) + module.bias.view(shape)
    if module.track_running_stats and module.running_mean is not None:
        with torch.no_grad():
            module.num_batches_tracked.add_(1)
            m = module.momentum if module.momentum is not None else 1.0 / float(module.num_batches_tracked)
            module.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
            module.running_var.mul_(1 - m).add_(var.detach() * n / (n - 1), alpha=m)
    return y
