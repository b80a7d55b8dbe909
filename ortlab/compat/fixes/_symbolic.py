"""What the exporter-symbolic fixes share: registering a symbolic for the length of a burst or a check."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

# The opsets a fix's symbolic serves. The exporter picks, for the opset it exports at, the symbolic registered at
# the highest opset not above it, custom and built-in alike: a symbolic registered at 9 alone would lose to a
# built-in one registered at 11, so it is registered at each.
OPSETS = range(9, 21)


@contextlib.contextmanager
def registered(name: str, symbolic: Callable[..., Any]) -> Iterator[None]:
    """`symbolic` exports ATen operator `name` ("aten::diff") at every opset until the block ends."""
    import torch

    for opset in OPSETS:
        torch.onnx.register_custom_op_symbolic(name, symbolic, opset)
    try:
        yield
    finally:
        for opset in OPSETS:
            torch.onnx.unregister_custom_op_symbolic(name, opset)
        _drop_if_empty(name)


def _drop_if_empty(name: str) -> None:
    """torch 2.4-2.6 keeps an operator's function group after its last custom symbolic is unregistered, and the
    next export of that operator then fails with "min() arg is an empty sequence" instead of saying it is not
    supported: an emptied group is removed (torch's registry is private: nothing is done if it moved)."""
    try:
        from torch.onnx._internal.registration import registry
    except ImportError:
        return
    table = getattr(registry, "_registry", None)
    if not isinstance(table, dict):
        return
    group = table.get(name)
    if group is not None and not len(getattr(group, "_functions", ())):
        del table[name]


def scalar_type(value: Any):
    """The torch dtype of a symbolic value (None when the exporter does not know it)."""
    from torch.onnx import _type_utils

    t = _type_utils.JitScalarType.from_value(value, _type_utils.JitScalarType.UNDEFINED)
    return None if t == _type_utils.JitScalarType.UNDEFINED else t.dtype()


def const(g: Any, values: list[int]) -> Any:
    import torch

    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))
