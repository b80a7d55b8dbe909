"""FSDP2 in a rank (strategy "fsdp2", ortlab.engine.ranks): `torch.distributed.fsdp.fully_shard` on each block, then
on the root, as torch's FSDP2 tutorial and torchtitan shard a model. A block is a module the forward calls: each
direct child that holds parameters, a container's items in its place (nn.Sequential, nn.ModuleList, nn.ModuleDict:
a ModuleList is never called, so its own hooks would never gather), or the modules the workload names
(`Workload.blocks`). A transformers model declares its blocks: the modules of its `_no_split_modules` classes
(GPT2Block, BertLayer: the unit its own FSDP wrapping and device maps keep whole), found wherever they sit
(GPT-2's `transformer.h.0`); the embeddings, the final norm and the head then stay with the root. A parameter shared
by two blocks (tied weights) stays with the root."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def blocks(model: torch.nn.Module, named: Sequence[str] | None = None) -> list[str]:
    """The names of the modules sharded one by one, in the model's order (the root comes after them)."""
    modules = dict(model.named_modules())
    if named is not None:
        missing = [n for n in named if n not in modules or not n]
        if missing:
            from ortlab.engine.types import BurstError

            raise BurstError(f"the workload's blocks name {missing[0]!r}, which is not a submodule of "
                             f"{type(model).__name__}; allowed: the names of model.named_modules()")
        chosen = list(named)
    elif declared(model):
        chosen = declared(model)
    else:
        chosen = []
        for name, child in model.named_children():
            if not any(True for _ in child.parameters()):
                continue
            if isinstance(child, CONTAINERS):
                chosen += [f"{name}.{item}" for item, sub in child.named_children()
                           if any(True for _ in sub.parameters())]
            else:
                chosen.append(name)
    owners: dict[int, set[str]] = {}  # each parameter: the chosen blocks using it, "" for the rest of the model
    for name, module in model.named_modules(remove_duplicate=False):
        owner = next((c for c in chosen if name == c or name.startswith(f"{c}.")), "")
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(owner)
    shared = {n for names in owners.values() if len(names) > 1 for n in names}
    return [n for n in chosen if n not in shared]


def declared(model: torch.nn.Module) -> list[str]:
    """The blocks a transformers model declares (`_no_split_modules`: class names), outermost ones, in order."""
    kinds = set(getattr(model, "_no_split_modules", None) or ())
    found: list[str] = []
    for name, module in model.named_modules():
        if name and type(module).__name__ in kinds and not any(name.startswith(f"{f}.") for f in found):
            found.append(name)
    return found


def shard(model: torch.nn.Module, device: torch.device, world: int, reshard_after_forward: bool = True,
          named: Sequence[str] | None = None) -> list[str]:
    """`fully_shard` each block of `model`, then the model itself, in place, over a 1-D mesh of the `world` ranks on
    `device`'s type (gloo on the CPU, nccl on CUDA); returns the blocks' names. The parameters become DTensors
    holding this rank's shard: an optimizer made before holds the old ones (ortlab.engine.ranks makes it again)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    names = blocks(model, named)
    modules: dict[str, Any] = dict(model.named_modules())
    for name in names:
        fully_shard(modules[name], mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return names

