"""nn.Embedding(max_norm=...) trained as torch trains it. torch's forward renormalizes, in place and without
gradient, the weight's rows it looks up (a row whose norm exceeds max_norm is scaled by max_norm / (norm + 1e-7)),
then looks them up: the parameter changes in forward. ORT's graph cannot change a parameter, so ORTModule trains
another model from the second step on. With this fix the graph computes the renormalized rows itself (their
value; the gradient reaches the rows as torch's does, unscaled: the correction is a PythonOp without gradient),
and after ORTModule's forward ortlab's burst runs the model once in PyTorch without gradients (as with
pytorch-buffers), which renormalizes the weight in place exactly as torch's forward would have, before the
optimizer step (a loop of your own calls the model once under torch.no_grad() there). One forward per step."""

from __future__ import annotations

import functools
from typing import Any

from ortlab.compat.blockers import BUFFER_UPDATE
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind


def embedding(input: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False, *, original: Any) -> Any:
    import torch

    if max_norm is None:
        return original(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    if not torch.jit.is_tracing():  # PyTorch's own pass: the weight renormalized in place, as torch does
        with torch.no_grad():
            torch.embedding_renorm_(weight, input, max_norm, norm_type)
    rows = original(input, weight, padding_idx, None, norm_type, scale_grad_by_freq, sparse)
    norms = torch.linalg.vector_norm(rows, ord=norm_type, dim=-1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    return rows + _no_gradient(rows * scale - rows)  # the renormalized value, the gradient of the lookup


def _no_gradient(x: Any) -> Any:
    """x, with no gradient in ORT's graph too (the exporter drops detach(): ORT would differentiate through it; an
    autograd.Function becomes a PythonOp whose backward is this one's)."""
    return _function().apply(x)


@functools.cache
def _function() -> Any:
    import torch

    class NoGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value):
            return value.clone()

        @staticmethod
        def backward(ctx, grad):
            return torch.zeros_like(grad)

    return NoGradient


def uses_max_norm(model: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Embedding) and m.max_norm is not None for m in model.modules())


REPLACEMENTS = {"embedding": embedding}  # torch.nn.functional name -> its rewrite

FIX = Fix("embedding-max-norm", "Embedding's max_norm renormalization computed in the graph, and applied to the "
          "weight by a PyTorch pass after each forward", FixKind.MODULE,
          removes=lambda b: b.kind == BUFFER_UPDATE and b.op == "parameters",
          apply=replacing(REPLACEMENTS), applies_to=uses_max_norm)
