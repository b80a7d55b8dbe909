"""`torch.diff` (aten::diff), which the exporter of torch 2.4-2.6 cannot export at any opset, written as ONNX
slices and a subtraction: prepend and append concatenated along `dim` first, then `n` times
x[1:] - x[:-1] along `dim` (a logical xor for bool tensors, as torch computes it). Transformers 5 calls it in its
attention-mask code (`find_packed_sequence_indices`), so GPT-2, Llama, Qwen2 and most decoders need it there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ortlab.compat.blockers import UNSUPPORTED_OP
from ortlab.compat.fixes._symbolic import const, registered, scalar_type
from ortlab.compat.registry import Fix, FixKind

OP = "aten::diff"
_END = 2**63 - 1


def symbolic(g: Any, self: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
    import torch
    from torch.onnx import symbolic_helper

    n = symbolic_helper._get_const(n, "i", "n")
    dim = symbolic_helper._get_const(dim, "i", "dim")
    parts = [p for p in (prepend, self, append) if not symbolic_helper._is_none(p)]
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else self
    logical = scalar_type(self) == torch.bool
    for _ in range(n):
        later = g.op("Slice", x, const(g, [1]), const(g, [_END]), const(g, [dim]))
        earlier = g.op("Slice", x, const(g, [0]), const(g, [-1]), const(g, [dim]))
        x = g.op("Xor" if logical else "Sub", later, earlier)
    return x


@contextlib.contextmanager
def _apply(model: Any) -> Iterator[None]:
    with registered(OP, symbolic):
        yield


FIX = Fix("diff", "exports torch.diff (aten::diff) as slices and a subtraction", FixKind.EXPORTER,
          removes=lambda b: b.kind == UNSUPPORTED_OP and b.op == OP, apply=_apply)
