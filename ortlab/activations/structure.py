"""The tensors inside a module's output, whatever its structure (tuples, dicts, model outputs, dataclasses,
cache objects), and the same output with some of them replaced: under ORTModule each observed tensor is
replaced by the output of the PythonOp that reports it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

_ATOMS = (str, bytes, int, float, complex, type, torch.nn.Module)


def _opaque(obj: Any, seen: set, depth: int) -> bool:
    """Not walked: nothing, plain values, modules, callables, what was seen, and anything nested too deep."""
    return obj is None or depth > 6 or id(obj) in seen or isinstance(obj, _ATOMS) or callable(obj)


def leaves(obj: Any, path: str = "", out: list | None = None, seen: set | None = None,
           depth: int = 0) -> list:
    """Every tensor in a module's output with its path: tuples, lists, dicts, model outputs, dataclasses and
    plain objects (cache objects) are walked; everything else is skipped."""
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return out
    seen = set() if seen is None else seen
    if _opaque(obj, seen, depth):
        return out
    seen.add(id(obj))
    for key, value in _children(obj):
        leaves(value, f"{path}.{key}" if path else str(key), out, seen, depth + 1)
    return out


def _children(obj: Any) -> list[tuple[str | int, Any]]:
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return list(zip(obj._fields, obj, strict=True))
    if isinstance(obj, list | tuple):
        return list(enumerate(obj))
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if hasattr(obj, "__dict__"):
        return [(k, v) for k, v in vars(obj).items() if not k.startswith("_")]
    return []


def substitute(obj: Any, new: dict[int, torch.Tensor], seen: set | None = None, depth: int = 0) -> Any:
    """`obj` with each tensor whose id is in `new` replaced: immutable containers are rebuilt, mutable ones
    (and cache objects) are changed in place, mirroring `leaves`."""
    if isinstance(obj, torch.Tensor):
        return new.get(id(obj), obj)
    seen = set() if seen is None else seen
    if _opaque(obj, seen, depth):
        return obj
    seen.add(id(obj))
    if isinstance(obj, tuple):
        items = [substitute(v, new, seen, depth + 1) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        obj[:] = [substitute(v, new, seen, depth + 1) for v in obj]
        return obj
    if isinstance(obj, dict) or (isinstance(obj, Mapping) and hasattr(obj, "__setitem__")):
        for k, v in list(obj.items()):
            obj[k] = substitute(v, new, seen, depth + 1)  # transformers' ModelOutput sets the field too
        return obj
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            object.__setattr__(obj, f.name, substitute(getattr(obj, f.name, None), new, seen, depth + 1))
        return obj
    if hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            if not k.startswith("_"):
                setattr(obj, k, substitute(v, new, seen, depth + 1))
    return obj
