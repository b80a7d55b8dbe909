"""What the module-kind fixes share: torch.nn.functional's functions replaced for the length of a burst or a check.
torch.nn's modules look their functions up in `torch.nn.functional` at every call, so the replacement reaches
every layer of the model and of every other model in the process until the block ends; parameters and state_dict
keys are untouched."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def functional(replacements: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """`torch.nn.functional.<name>` is `replacements[name]` until the block ends; each replacement gets the
    original as its keyword `original`."""
    import functools

    import torch.nn.functional as F

    originals = {name: getattr(F, name) for name in replacements}
    try:
        for name, fn in replacements.items():
            setattr(F, name, functools.wraps(originals[name])(functools.partial(fn, original=originals[name])))
        yield
    finally:
        for name, fn in originals.items():
            setattr(F, name, fn)


def replacing(replacements: dict[str, Callable[..., Any]]) -> Callable[[Any], contextlib.AbstractContextManager]:
    """A Fix's `apply` that replaces torch.nn.functional's functions (`functional`), whatever the model: the
    replacement reaches every layer that calls them."""
    return lambda model: functional(replacements)


def from_function(blocker: Any, function: str) -> bool:
    """The blocker's Python stack passes through torch.nn.functional's `function` (or it has no stack: a failure
    ORT named without a node of the probe export)."""
    return not blocker.stack or any(frame.endswith(f": {function}") and "torch/nn/functional.py"
                                    in frame.replace("\\", "/") for frame in blocker.stack)
