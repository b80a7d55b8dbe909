"""A Hugging Face model's KV cache turned off for training: `config.use_cache = False` on every config among the
model's modules for the length of the burst (restored after). Decoders return their cache (a `DynamicCache`) while
`use_cache` is on, their default, and ORTModule fails at the first forward on it ("ORTModule fails to extract
schema from data: Unsupported flatten data type: <class 'transformers.cache_utils.DynamicCache'>"). The cache
only keeps keys and values for generating the next tokens: the loss, the logits and the gradients are the same
without it (what `Trainer` users do with gradient checkpointing, which turns it off too); the parameters are
untouched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ortlab.compat.blockers import UNSUPPORTED_OUTPUT
from ortlab.compat.registry import Fix, FixKind


def _configs(model: Any) -> list[Any]:
    """Every distinct Hugging Face config among the model's modules that has use_cache on."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", None) is True:
            seen.setdefault(id(config), config)
    return list(seen.values())


def caching(model: Any) -> tuple[str | None, list[str]]:
    """(the path of the outermost Hugging Face model among the modules with use_cache on, "" for the root; the
    configs that make `model` return a KV cache, as "LlamaConfig.use_cache=True")."""
    path = next((name for name, m in model.named_modules() if type(m).__module__.startswith("transformers.")
                 and getattr(getattr(m, "config", None), "use_cache", None) is True), None)
    return path, [f"{type(c).__name__}.use_cache=True" for c in _configs(model)]


@contextlib.contextmanager
def _apply(model: Any) -> Iterator[None]:
    configs = _configs(model)
    try:
        for config in configs:
            config.use_cache = False
        yield
    finally:
        for config in configs:
            config.use_cache = True


FIX = Fix("no-kv-cache", "a Hugging Face model's `use_cache` off for the burst: no KV cache returned (ORTModule "
          "cannot flatten it)", FixKind.MODULE,
          removes=lambda b: b.kind == UNSUPPORTED_OUTPUT and b.op.split()[0].endswith("Cache"), apply=_apply,
          applies_to=lambda model: bool(_configs(model)))
