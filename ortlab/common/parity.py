"""Parity mode: the same seeds, every dropout off (modules and functional calls), deterministic algorithms,
all restored afterwards."""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator

import torch

# Functional dropouts a model may call directly with a rate from its config, which no nn.Dropout module holds (T5's
# eager attention calls nn.functional.dropout; Hugging Face's sdpa attention passes dropout_p to
# scaled_dot_product_attention): (module, attribute) whose rate parity mode sets to 0.
_FUNCTIONAL = (
    (torch.nn.functional, "dropout"), (torch.nn.functional, "dropout1d"), (torch.nn.functional, "dropout2d"),
    (torch.nn.functional, "dropout3d"), (torch.nn.functional, "alpha_dropout"),
    (torch.nn.functional, "feature_alpha_dropout"), (torch, "dropout"), (torch, "alpha_dropout"),
    (torch, "feature_dropout"), (torch, "feature_alpha_dropout"),
)
_ATTENTION = ((torch.nn.functional, "scaled_dot_product_attention"),)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed)


def _rate_zero(fn):
    @functools.wraps(fn)
    def no_dropout(input, p=0.5, *args, **kwargs):
        kwargs.pop("p", None)
        return fn(input, 0.0, *args, **kwargs)

    no_dropout._ortlab_original = fn
    return no_dropout


def _attention_dropout_zero(fn):
    @functools.wraps(fn)
    def no_dropout(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        kwargs.pop("dropout_p", None)
        return fn(query, key, value, attn_mask, 0.0, *args, **kwargs)

    no_dropout._ortlab_original = fn
    return no_dropout


@contextlib.contextmanager
def functional_dropout_off() -> Iterator[None]:
    """Every functional dropout, and the attention dropout of scaled_dot_product_attention, runs with rate 0
    inside the block (this process only: bursts run in ortlab's own worker, or in-process by the user's
    choice)."""
    saved = []
    for patches, wrap in ((_FUNCTIONAL, _rate_zero), (_ATTENTION, _attention_dropout_zero)):
        for owner, name in patches:
            fn = getattr(owner, name, None)
            if fn is None or hasattr(fn, "_ortlab_original"):
                continue
            saved.append((owner, name, fn))
            setattr(owner, name, wrap(fn))
    try:
        yield
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


@contextlib.contextmanager
def parity(model: torch.nn.Module, enabled: bool, seed: int) -> Iterator[None]:
    """Seeds always; with parity also every dropout at 0 and deterministic algorithms, all restored afterwards."""
    seed_everything(seed)
    if not enabled:
        yield
        return
    saved_p = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            saved_p[name] = module.p
            module.p = 0.0
    saved_det = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with functional_dropout_off():
            yield
    finally:
        torch.use_deterministic_algorithms(saved_det[0], warn_only=saved_det[1])
        modules = dict(model.named_modules())
        for name, p in saved_p.items():
            modules[name].p = p
