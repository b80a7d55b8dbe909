"""Model and optimizer state that every burst starts from, saved and loaded without executing code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ortlab.errors import OrtlabError

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


KEPT_WHOLE_BYTES = 256 * 2**20  # a model's parameters up to this size are copied by `kept`; larger ones are watched


class ChangedInPlace(OrtlabError, RuntimeError):
    """A parameter of a large model changed in place inside `kept` (a forward or backward that writes to its own
    weights), which `kept` cannot put back: it names the parameter."""


@contextlib.contextmanager
def kept(model: torch.nn.Module) -> Iterator[None]:
    """The model's state and gradients restored after the block (a step, a trace, a probe must leave no trace).
    Buffers are copied (a forward changes them: running statistics, counters); parameters are copied when small
    (KEPT_WHOLE_BYTES), else watched by their version counters, so that a step of a 1B model does not hold a second
    copy of its weights: one changed in place raises ChangedInPlace."""
    params = list(model.named_parameters())
    whole = sum(p.numel() * p.element_size() for _, p in params) <= KEPT_WHOLE_BYTES
    if whole:
        snapshot = Snapshot.take(model)
    else:
        snapshot = Snapshot({n: b.detach().to("cpu", copy=True) for n, b in model.named_buffers()}, {})
        versions = {n: p._version for n, p in params}
    grads = {n: p.grad for n, p in params}
    try:
        yield
    finally:
        if whole:
            snapshot.restore(model)
        else:
            with torch.no_grad():
                for name, b in model.named_buffers():
                    if name in snapshot.model:
                        b.copy_(snapshot.model[name].to(device=b.device, dtype=b.dtype))
        for name, p in model.named_parameters():
            p.grad = grads[name]
        if not whole:
            changed = [n for n, p in params if p._version != versions[n]]
            if changed:
                raise ChangedInPlace(f"parameter {changed[0]} changed in place during a forward or backward (its "
                                     "version counter moved), which ortlab cannot put back in a model this large")
