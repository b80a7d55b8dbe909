"""Model and optimizer state that every burst starts from, saved and loaded without executing code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "ortlab-snapshot-1"


@dataclass
class Snapshot:
    """fp32 master copies of the model's floating-point state (as ZeRO-1 keeps them when training in fp16),
    the original dtypes to restore, and optionally the optimizer state."""

    model: dict[str, torch.Tensor]
    dtypes: dict[str, str]
    optimizer: dict[str, Any] | None = None

    @classmethod
    def take(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Snapshot:
        """The snapshot of `model` (and `optimizer`) as they are now, on the CPU."""
        state, dtypes = {}, {}
        for name, tensor in model.state_dict().items():
            dtypes[name] = str(tensor.dtype).removeprefix("torch.")
            copy = tensor.detach().to("cpu", copy=True)
            state[name] = copy.float() if copy.is_floating_point() else copy
        opt = _to_cpu(optimizer.state_dict()) if optimizer is not None else None
        return cls(state, dtypes, opt)

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Copy the state into `model` in place (an ORTModule wrapping it stays valid: parameters are graph
        inputs) and into `optimizer` when the snapshot has optimizer state."""
        current = model.state_dict()
        missing = sorted(set(current) - set(self.model))
        if missing:
            raise ValueError(f"snapshot does not match the model: missing {', '.join(missing[:5])}")
        with torch.no_grad():
            for name, tensor in current.items():
                tensor.copy_(self.model[name].to(device=tensor.device, dtype=tensor.dtype))
        if optimizer is not None and self.optimizer is not None:
            optimizer.load_state_dict(self.optimizer)

    def save(self, path: str | Path) -> Path:
        """Write the snapshot to `path` (whole or not at all); returns the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"format": FORMAT, "model": self.model, "dtypes": self.dtypes, "optimizer": self.optimizer}, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Snapshot:
        """The Snapshot saved at `path`, loaded with `weights_only=True`: tensors and plain containers only, never
        code. A bare model state dict (no optimizer state) loads too."""
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return cls(data["model"], data["dtypes"], data.get("optimizer"))
        if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
            dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in data.items()}
            return cls({k: v.float() if v.is_floating_point() else v for k, v in data.items()}, dtypes)
        raise ValueError(f"{path} is neither an ortlab snapshot nor a model state_dict")


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


@contextlib.contextmanager
def kept(model: torch.nn.Module) -> Iterator[None]:
    """The model's state and gradients restored after the block (a step, a trace, a probe must leave no trace)."""
    snapshot = Snapshot.take(model)
    grads = {n: p.grad for n, p in model.named_parameters()}
    try:
        yield
    finally:
        snapshot.restore(model)
        for name, p in model.named_parameters():
            p.grad = grads[name]
