"""How collector "stats" taps a backend: one adapter per way of observing its tensors, which a backend's registry
entry names (`ortlab.engine.backends.Registered.stats_taps`), so that the collector never asks what kind of
backend it serves. `Hooks`: forward hooks, attached only on the recorded steps (a module with hooks takes torch's
slower call path); `GraphTaps`: a PythonOp per observed tensor in the exported graph, put there by the hooks
while ORT exports (they run only then), which reports the tensor at run time; `CompiledHooks`: hooks kept out of
the compiled graph (a graph break each) and attached for the whole burst (another set of hooks would be another
graph to compile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Hooks:
    """Forward hooks, attached only on the recorded steps."""

    in_graph = False  # observed tensors go through a PythonOp in the exported graph, which reports them at run time
    hooks_stay = False  # the hooks stay attached for the whole burst (else: only on the recorded steps)
    # copy observed tensors where they are observed: on a GPU their memory may be reused without an in-place op
    # torch would see (ORT after a PythonOp, CUDA graphs' pools; ortlab.activations.batched)
    copy_observed = False

    def prepare(self) -> None:
        """Before the collector's hooks are attached."""

    def hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A hook as it is registered on a module."""
        return fn


class GraphTaps(Hooks):
    """PythonOp taps in the exported graph (the hooks run once, during the export)."""

    in_graph = True
    hooks_stay = True
    copy_observed = True

    def prepare(self) -> None:
        from ortlab.activations import pythonop

        pythonop.prepare_export()


class CompiledHooks(Hooks):
    """Hooks kept out of the compiled graph, attached for the whole burst."""

    hooks_stay = True
    copy_observed = True

    def hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        return torch.compiler.disable(fn)  # a graph break per hook
