"""EmbeddingBag (sum, mean, max) computed as an embedding lookup and the reduction over each bag: a bag-membership
matrix (each row of a 2-D input a bag; for a 1-D input, the positions from one offset to the next) sums, or masks
for max, the rows of each bag. padding_idx entries count for nothing, per_sample_weights scale each row (mode
sum), an empty bag is zeros, and max takes the first of equal rows as torch does (its gradient goes to that one).
The exporter writes embedding_bag as an ONNX Loop, and ORT 1.19.2 fails to build the gradient graph of that Loop
("... name which does not exist"); with padding_idx the exporter has no symbolic for it at all: recommender and
fastText-style models do not train. max_norm, scale_grad_by_freq and sparse gradients are left to torch's
function."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import NO_GRADIENT, ORT_FAILED, UNSUPPORTED_OP
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind


def embedding_bag(input: Any, weight: Any, offsets: Any = None, max_norm: Any = None, norm_type: float = 2,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: Any = None, *,
                  original: Any) -> Any:
    import torch

    if max_norm is not None or scale_grad_by_freq or sparse or mode not in ("sum", "mean", "max"):
        return original(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                        per_sample_weights, include_last_offset, padding_idx)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    rows = weight[input.reshape(-1)]  # (positions, D)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    positions = torch.arange(input.numel(), device=input.device)
    if input.dim() == 2:  # each row a bag
        bag = torch.div(positions, input.shape[1], rounding_mode="floor")
        bags = torch.arange(input.shape[0], device=input.device)
    else:
        starts = offsets[:-1] if include_last_offset else offsets
        bag = (positions.unsqueeze(1) >= starts.unsqueeze(0)).sum(1) - 1
        bags = torch.arange(starts.shape[0], device=input.device)
    members = bag.unsqueeze(0) == bags.unsqueeze(1)  # (bags, positions)
    if input.dim() == 1 and include_last_offset:
        members = members & (positions < offsets[-1]).unsqueeze(0)
    if padding_idx is not None:
        members = members & (input.reshape(-1) != padding_idx).unsqueeze(0)
    count = members.sum(1, keepdim=True).to(weight.dtype)
    if mode == "max":
        masked = torch.where(members.unsqueeze(-1), rows.unsqueeze(0), torch.tensor(float("-inf"), dtype=rows.dtype))
        first = masked.argmax(1, keepdim=True)  # (bags, 1, D): the first of equal rows, as torch picks
        picked = positions.reshape(1, -1, 1) == first
        best = (rows.unsqueeze(0) * picked.to(rows.dtype)).sum(1)
        return torch.where(count > 0, best, torch.zeros_like(best))
    total = torch.matmul(members.to(rows.dtype), rows)
    return total if mode == "sum" else total / count.clamp(min=1)


def uses_embedding_bag(model: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.EmbeddingBag) for m in model.modules())


REPLACEMENTS = {"embedding_bag": embedding_bag}  # torch.nn.functional name -> its rewrite

FIX = Fix("embedding-bag", "F.embedding_bag computed as an embedding lookup and each bag's sum, mean or max",
          FixKind.MODULE, removes=lambda b: (b.kind in (ORT_FAILED, NO_GRADIENT) and b.op == "Loop") or (
              b.kind == UNSUPPORTED_OP and b.op == "aten::embedding_bag"), apply=replacing(REPLACEMENTS),
          applies_to=uses_embedding_bag)
