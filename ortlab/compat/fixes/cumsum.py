"""`torch.cumsum` of bool and integer tensors exported with the type torch computes in: torch sums them as int64,
the exporter of torch 2.6 emits an ONNX CumSum on the input's own type, and ORT 1.19.2 rejects CumSum on bool
("Type 'tensor(bool)' of input parameter ... of operator (CumSum) is invalid") and has no CPU kernel for the
smaller integer types. The input is cast to int64 first (or to the `dtype=` asked for, which the stock symbolic
ignores). Transformers 5's attention-mask code sums a bool mask this way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ortlab.compat.blockers import INVALID_TYPE, NO_KERNEL
from ortlab.compat.fixes._symbolic import registered, scalar_type
from ortlab.compat.registry import Fix, FixKind

OP = "aten::cumsum"


def symbolic(g: Any, self: Any, dim: Any, dtype: Any = None) -> Any:
    import torch
    from torch.onnx import _type_utils, symbolic_helper

    dim = symbolic_helper._get_const(dim, "i", "dim")
    wanted = None
    if dtype is not None and not symbolic_helper._is_none(dtype):
        wanted = _type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype")).dtype()
    elif (source := scalar_type(self)) is not None and (source == torch.bool or not source.is_floating_point):
        wanted = torch.int64
    if wanted is not None and wanted != scalar_type(self):
        self = g.op("Cast", self, to_i=_type_utils.JitScalarType.from_dtype(wanted).onnx_type())
    return g.op("CumSum", self, g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int64)))


@contextlib.contextmanager
def _apply(model: Any) -> Iterator[None]:
    with registered(OP, symbolic):
        yield


FIX = Fix("cumsum-int64", "exports torch.cumsum of bool and integer tensors on int64, as torch computes it",
          FixKind.EXPORTER, removes=lambda b: b.kind in (INVALID_TYPE, NO_KERNEL) and b.op == "CumSum", apply=_apply)
