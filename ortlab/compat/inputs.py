"""Each step's inputs against the ones the current ORTModule graph was exported with.

ORTModule turns bool, int and float arguments into tensors and exports; a graph input that the graph reads
carries its value at every step (a temperature used in arithmetic), but one the trace consumed in Python (an
`if use_residual:`, a `range(n)`, a str compared to a constant) is baked in, and ORT's re-export check looks at
types and ranks, not values: a later step with another value trains the graph of the first. Named after ORT's
own input names (the forward's parameter names, `name_i` / `name_key` inside lists and dicts), judged from the
exported graph itself: which of its inputs any node reads.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# hazard kinds after which a changed input shape can mean another graph (a branch on x.shape, say)
SHAPE_SENSITIVE = ("tensor used as a Python bool", "tensor read as a Python number", "tensor used as a Python index",
                   "iteration over a tensor")


@dataclass(frozen=True)
class Leaf:
    """One input as ORT names it: a tensor's dtype and shape, or another value."""

    tensor: bool
    value: Any  # (dtype, shape) for a tensor

    def shown(self) -> str:
        return f"shape {list(self.value[1])}" if self.tensor else repr(self.value)


def leaves(forward: inspect.Signature | None, inputs: Any) -> dict[str, Leaf]:
    """The inputs of one step by ORT's input names."""
    import torch

    from ortlab.workload import call_arguments

    args, kwargs = call_arguments(inputs)
    try:
        bound = forward.bind(*args, **kwargs).arguments if forward is not None else None
    except TypeError:
        bound = None
    if bound is None:
        bound = {**{f"input{i}": a for i, a in enumerate(args)}, **kwargs}
    out: dict[str, Leaf] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[name] = Leaf(True, (str(value.dtype).removeprefix("torch."), tuple(value.shape)))
        elif isinstance(value, tuple | list):
            for i, v in enumerate(value):
                walk(f"{name}_{i}", v)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{name}_{k}", v)
        else:
            out[name] = Leaf(False, value if isinstance(value, bool | int | float | str | type(None)) else repr(value))

    for name, value in bound.items():
        kind = forward.parameters[name].kind if forward is not None and name in forward.parameters else None
        if kind is inspect.Parameter.VAR_KEYWORD:
            for k, v in value.items():
                walk(k, v)
        else:
            walk(name, value)
    return out


@dataclass
class InputWatch:
    """The inputs one ORTModule graph was exported with, the graph inputs it reads, and whether its export traced
    shape-dependent Python. `changes` says what of a later step's inputs ORT will not see."""

    forward: inspect.Signature | None
    baseline: dict[str, Leaf]
    read: set[str]
    shape_sensitive: bool
    hazards: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def exported(cls, model: Any, inputs: Any, read: set[str], hazards: list[dict[str, Any]]) -> InputWatch:
        try:
            forward = inspect.signature(model.forward)
        except (TypeError, ValueError):
            forward = None
        return cls(forward, leaves(forward, inputs), set(read), any(h["kind"] in SHAPE_SENSITIVE for h in hazards),
                   list(hazards))

    def changes(self, inputs: Any) -> list[dict[str, Any]]:
        """What of these inputs differs from the export's in a way the graph cannot follow: a baked value that
        changed, or a shape that changed when the export traced shape-dependent Python."""
        out = []
        for name, leaf in leaves(self.forward, inputs).items():
            base = self.baseline.get(name)
            if base is None or leaf == base:
                continue
            if not leaf.tensor and not base.tensor and name not in self.read:
                out.append({"input": name, "old": base.shown(), "new": leaf.shown(), "what": "value"})
            elif leaf.tensor and base.tensor and leaf.value[0] == base.value[0] and self.shape_sensitive:
                out.append({"input": name, "old": base.shown(), "new": leaf.shown(), "what": "shape"})
        return out

    def key(self, inputs: Any) -> tuple:
        """What a graph is exported for: the baked values, and the shapes when the export read shapes."""
        now = leaves(self.forward, inputs)
        return tuple(sorted((name, leaf.value) for name, leaf in now.items()
                            if (not leaf.tensor and name not in self.read) or (leaf.tensor and self.shape_sensitive)))
