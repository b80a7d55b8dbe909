"""Hugging Face attention switched to its eager implementation (matmul, softmax, matmul) for ORTModule: the
exporter writes `scaled_dot_product_attention`'s attention dropout as an ONNX Dropout without its mask output,
and ORT 1.19.2's Dropout gradient needs the mask ("i < node_->OutputDefs().size() was false"); ORT's own
efficient-attention ATen export of it has no CPU gradient either. The math is the same attention; the
parameters are untouched. Transformers 4 picks an attention class per module when the model is built (its Sdpa
class is a subclass of the eager one, with no parameters of its own: the module takes the eager class back for
the burst); transformers 5 reads `config._attn_implementation` at every forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ortlab.compat.blockers import NO_GRADIENT, ORT_FAILED
from ortlab.compat.registry import Fix, FixKind

SDPA_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_efficient_attention")


def _configs(model: Any) -> list[Any]:
    """Every distinct Hugging Face config object among the model's modules (sub-models may hold their own)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def _sdpa_modules(model: Any) -> list[tuple[Any, type]]:
    """(module, its eager class) for transformers 4's Sdpa attention modules."""
    out = []
    for module in model.modules():
        cls = type(module)
        base = cls.__mro__[1] if len(cls.__mro__) > 1 else None
        if "Sdpa" in cls.__name__ and base is not None and base.__name__ == cls.__name__.replace("Sdpa", ""):
            out.append((module, base))
    return out


def uses_sdpa(model: Any) -> bool:
    return any(c._attn_implementation == "sdpa" for c in _configs(model)) or bool(_sdpa_modules(model))


@contextlib.contextmanager
def _apply(model: Any) -> Iterator[None]:
    configs = [(c, c._attn_implementation) for c in _configs(model)]
    modules = [(m, type(m), base) for m, base in _sdpa_modules(model)]
    try:
        for config, _ in configs:
            config._attn_implementation = "eager"
        for module, _, base in modules:
            module.__class__ = base
        yield
    finally:
        for module, cls, _ in modules:
            module.__class__ = cls
        for config, before in configs:
            config._attn_implementation = before


def _removes(blocker: Any) -> bool:
    return blocker.kind in (NO_GRADIENT, ORT_FAILED) and (blocker.op in SDPA_OPS or blocker.op == "Dropout")


FIX = Fix("eager-attention", "Hugging Face attention computed by its eager implementation instead of sdpa",
          FixKind.MODULE, removes=_removes, apply=_apply, applies_to=uses_sdpa)
