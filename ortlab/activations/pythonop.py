"""The PythonOp tap: under ORTModule, hooks run only while ORT exports, so each observed tensor goes through
`Tap`, an autograd Function that the exporter turns into a PythonOp (ORT's own hooks package does the same):
ORT calls back into Python with the tensor in forward and with its gradient in backward. Both report to the
collector of the running burst, which `activate` makes known to this process; `tap()` reports a tensor of the
user's choosing the same way."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from ortlab import _ort

if TYPE_CHECKING:
    from ortlab.activations.collect import StatsCollector

_ACTIVE: StatsCollector | None = None  # the collector of the running burst (taps and ORT's callbacks find it)
_EXPORT_FLAG: list | None = None


def activate(collector: StatsCollector) -> None:
    """Make `collector` the one the PythonOps and `tap()` report to (StatsCollector.start; one at a time)."""
    global _ACTIVE
    _ACTIVE = collector


def deactivate(collector: StatsCollector) -> None:
    """Undo `activate` (StatsCollector.finish): outside a burst, taps report nothing."""
    global _ACTIVE
    if _ACTIVE is collector:
        _ACTIVE = None


def active() -> StatsCollector | None:
    """The collector of the running burst, or None."""
    return _ACTIVE


def prepare_export() -> None:
    """Before an ORTModule export: have ORT run Tap's PythonOps in its unsafe mode (see _ort.export_unsafe).
    Tap saves no tensor and changes nothing, and the safe mode's bookkeeping around each call was most of what
    a tap cost. On an ORT without that hook the ops stay safe, only slower."""
    with contextlib.suppress(_ort.OrtInternalsError):
        _ort.export_unsafe(Tap)


def exporting() -> bool:
    """True while ORT runs the model to export it (its schema run and the trace): no step is running then.
    ORT sets this flag of its hooks package around export for the same reason."""
    global _EXPORT_FLAG
    if _EXPORT_FLAG is None:
        _EXPORT_FLAG = _ort.exporting_flag()  # ORT flips element 0 of this very list
    return bool(_EXPORT_FLAG[0])


class Tap(torch.autograd.Function):
    """Identity that reports its input in forward and its gradient in backward. Exported as ORT PythonOp."""

    @staticmethod
    def forward(ctx, slot: int, x: torch.Tensor):
        ctx.slot = slot
        c = _ACTIVE
        if c is not None and not torch.jit.is_tracing() and not exporting():
            c.on_forward(slot, x)
        return x.detach()

    @staticmethod
    def backward(ctx, grad):
        c = _ACTIVE
        if c is not None and grad is not None:
            c.on_backward(ctx.slot, grad)
        return None, grad

    @staticmethod
    def infer_shape(node, tensor_input_shapes, tensor_input_dtypes):
        return tensor_input_shapes, tensor_input_dtypes

    @staticmethod
    def alias_input(node_proto_str: str):
        return [1], [-1, 0]  # output 0 is input 1; the gradient of input 1 is gradient output 0


def tap(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record `tensor` under `name` in the running burst's statistics (forward and gradient); returns the
    tensor to continue with. Use the result: under ORTModule it is a PythonOp's output, and an unused op is
    pruned. Outside a burst that collects "stats" it returns `tensor` itself."""
    c = _ACTIVE
    return tensor if c is None else c.tap(name, tensor)
