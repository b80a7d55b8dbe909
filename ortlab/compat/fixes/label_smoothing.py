"""Cross-entropy with label smoothing written as torch defines it: (1 - e) times the negative log-likelihood of
the target plus e/C times the sum over the classes of the negative log-probabilities (each class weighted by
`weight` when given), ignored targets counting for nothing, the mean taken over the targets' weights as torch
takes it. ORTModule exports cross_entropy with its own symbolic, which refuses label smoothing ("Unsupported:
ONNX does not support label_smoothing"; torch's own symbolic refuses it too), so a model that computes its loss
inside forward with it falls back to PyTorch. log_softmax and a gather have ORT gradients (torch's exporter
would fuse log_softmax and nll_loss into SoftmaxCrossEntropyLoss again). Class-probability targets are left
to torch's function."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import EXPORT_FAILED, UNSUPPORTED_OP
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OP = "aten::cross_entropy_loss"  # the exporter's symbolic refuses label smoothing: no symbolic, it reports


def cross_entropy(input: Any, target: Any, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
                  reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0, *,
                  original: Any) -> Any:
    import torch
    import torch.nn.functional as F

    if not label_smoothing or target.is_floating_point() or size_average is not None or reduce is not None:
        return original(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    dim = 1 if input.dim() > 1 else 0
    classes = input.shape[dim]
    logp = F.log_softmax(input, dim=dim)
    kept = target != ignore_index
    safe = torch.where(kept, target, torch.zeros_like(target))
    picked = -logp.gather(dim, safe.unsqueeze(dim)).squeeze(dim)  # the target's negative log-probability
    per_class = -logp if weight is None else -logp * weight.reshape((-1,) + (1,) * (logp.dim() - dim - 1))
    smooth = per_class.sum(dim)
    w = torch.ones_like(picked) if weight is None else weight[safe]
    zero = torch.zeros_like(picked)
    nll, smooth, w = torch.where(kept, picked * w, zero), torch.where(kept, smooth, zero), torch.where(kept, w, zero)
    loss = (1 - label_smoothing) * nll + (label_smoothing / classes) * smooth
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / w.sum()
    return loss


REPLACEMENTS = {"cross_entropy": cross_entropy}  # torch.nn.functional name -> its rewrite

FIX = Fix("label-smoothing", "F.cross_entropy with label_smoothing written as log_softmax, nll_loss and the "
          "smoothing term", FixKind.MODULE,
          removes=lambda b: (b.kind == EXPORT_FAILED and "label_smoothing" in b.message) or (
              b.kind == UNSUPPORTED_OP and b.op == OP), apply=replacing(REPLACEMENTS))
