"""ortlab's compatibility fixes: small named transformations that let ORTModule 1.19.2 train a model it cannot
train as it is, without changing the model's math, its parameters or its state_dict keys.

Each fix is one module under `ortlab/compat/fixes/` defining `FIX`; it is applied for the length of an
ORTModule burst (or a check) and undone after, so the PyTorch baseline always runs the model as the user wrote
it. `ortlab check` says which fix removes which blocker; a burst applies none, the ones check recommends
(`fixes="auto"`), or named ones, and records which.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ortlab.common.enums import StrEnum
from ortlab.errors import InputError, did_you_mean

# name -> module defining FIX (loaded on first use)
PYTORCH_PASS = ("pytorch-buffers", "embedding-max-norm")  # fixes that need a PyTorch forward after ORT's
FIXES: dict[str, str] = {
    "diff": "ortlab.compat.fixes.diff",
    "cumsum-int64": "ortlab.compat.fixes.cumsum",
    "eager-attention": "ortlab.compat.fixes.attention",
    "global-avg-pool": "ortlab.compat.fixes.pooling",
    "graph-per-value": "ortlab.compat.fixes.per_value",
    "pytorch-buffers": "ortlab.compat.fixes.buffers",
    "activations": "ortlab.compat.fixes.activations",
    "pixel-shuffle": "ortlab.compat.fixes.pixel_shuffle",
    "instance-norm": "ortlab.compat.fixes.instance_norm",
    "group-norm": "ortlab.compat.fixes.group_norm",
    "layer-norm-bias": "ortlab.compat.fixes.layer_norm",
    "rms-norm": "ortlab.compat.fixes.rms_norm",
    "bidirectional-rnn": "ortlab.compat.fixes.rnn",
    "explicit-attention": "ortlab.compat.fixes.multihead_attention",
    "embedding-bag": "ortlab.compat.fixes.embedding_bag",
    "conv-transpose": "ortlab.compat.fixes.conv_transpose",
    "linear-interpolation": "ortlab.compat.fixes.interpolate",
    "feature-dropout": "ortlab.compat.fixes.feature_dropout",
    "label-smoothing": "ortlab.compat.fixes.label_smoothing",
    "embedding-max-norm": "ortlab.compat.fixes.embedding_max_norm",
    "no-kv-cache": "ortlab.compat.fixes.kv_cache",
}
AUTO, NONE = "auto", "none"


class FixError(InputError):
    """A fix that is not known, or a fixes argument that is not "auto", "none" or fix names."""


class FixKind(StrEnum):
    """What a fix changes (the strings check.json and the fix table keep)."""

    EXPORTER = "exporter"  # a symbolic: how the exporter writes an operator
    MODULE = "module"  # the model's code or modules, parameters kept
    ENGINE = "engine"  # how ortlab drives ORTModule: the engine reads the fix's name; `apply` changes nothing


@dataclass(frozen=True)
class Fix:
    """A compatibility fix. `removes(blocker)` says whether it removes a blocker; `applies_to(model)` whether it
    can act on this model at all; `apply(model)` is a context manager that applies it and undoes it on exit."""

    name: str
    summary: str  # one line: what it changes
    kind: FixKind
    removes: Callable[[Any], bool]
    apply: Callable[[Any], contextlib.AbstractContextManager]
    applies_to: Callable[[Any], bool] = lambda model: True

    def __post_init__(self):
        object.__setattr__(self, "kind", FixKind(self.kind))

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind, "summary": self.summary,
                "doc": (importlib.import_module(FIXES[self.name]).__doc__ or "").strip()}


@contextlib.contextmanager
def engine_side(model: Any) -> Iterator[None]:
    """The `apply` of a fix that the engine carries out itself (kind "engine")."""
    yield


def get(name: str) -> Fix:
    if name not in FIXES:
        raise FixError(f"fix {name!r} is not known; known: {', '.join(FIXES)} (or 'auto', 'none')"
                       f"{did_you_mean(name, (*FIXES, 'auto', 'none'))}")
    return importlib.import_module(FIXES[name]).FIX


def parse(value: Any) -> str | tuple[str, ...]:
    """A fixes argument as given by a user: "auto", "none" (or None, ()), a fix name, "a,b", or a list of names
    -> "auto" or a tuple of known names (empty: none)."""
    if value is None or value == () or value == []:
        return ()
    if isinstance(value, str):
        value = value.strip()
        if value in (AUTO, NONE):
            return AUTO if value == AUTO else ()
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise FixError(f"fixes {value!r} is not allowed; allowed: 'auto', 'none', or fix names "
                       f"({', '.join(FIXES)})")
    names = tuple(dict.fromkeys(v.strip() for v in value))
    for name in names:
        get(name)
    return names


def for_blocker(blocker: Any, model: Any) -> list[str]:
    """The fixes that remove `blocker` and can act on `model`."""
    out = []
    for name in FIXES:
        fix = get(name)
        if fix.removes(blocker) and fix.applies_to(model):
            out.append(name)
    return out


@contextlib.contextmanager
def applied(model: Any, names: tuple[str, ...] | list[str]) -> Iterator[list[str]]:
    """Apply the named fixes to `model` (and the exporter) until the block ends; yields the names applied."""
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(get(name).apply(model))
        yield list(names)


def catalogue():
    """Every fix as a row: name, kind, what it changes (a DataFrame)."""
    import pandas as pd

    return pd.DataFrame([get(name).describe() for name in FIXES]).drop(columns="doc")
