"""The same computation in float64 PyTorch: the yardstick every backend is measured against (ortlab.verdict.exact).

A float64 copy of the model (parameters, buffers and optimizer state cast; inputs cast; every dropout off, the same
seeds) runs one forward and backward (the first step's gradients) or the burst's steps (its losses and end
state). A model that cannot run in float64 (an op without a double kernel, a dtype checked in forward) raises
`NoFloat64`, and the verdict falls back to comparing with PyTorch fp32, with a note.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

from ortlab.errors import OrtlabError


class NoFloat64(OrtlabError):
    """The model cannot run in float64: the message says why."""


def double(value: Any) -> Any:
    """Every floating tensor in a nested structure of tuples, lists and dicts cast to float64."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, dict):
        return type(value)({k: double(v) for k, v in value.items()})
    if isinstance(value, tuple | list):
        return type(value)(double(v) for v in value)
    return value


def _keeper() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    narrow = (torch.float32, torch.float16, torch.bfloat16)

    class KeepFloat64(TorchFunctionMode):
        """Inside a float64 step, what is asked to be float32 (or narrower) is float64: .float(), a narrower dtype
        given to .to() (with or without a device), and a `dtype=` keyword of any call (torch.arange(...,
        dtype=torch.float), x.sum(dtype=torch.float32)). Models upcast for accuracy that way (Hugging Face's
        causal-LM loss, Llama's RMSNorm and rotary frequencies, whose code changes from one transformers release to
        the next), which on a float64 tensor is a downcast: the yardstick would compute its loss and norms in fp32,
        ~1e-7 off, as far as fp32's own rounding it is meant to measure, or fail mixing the two in a matmul."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.float and len(args) == 1 and not kwargs:
                return args[0].double()
            if kwargs.get("dtype") in narrow:
                kwargs["dtype"] = torch.float64
            if func is torch.Tensor.to:
                args = tuple(torch.float64 if isinstance(a, torch.dtype) and a in narrow else a for a in args)
            return func(*args, **kwargs)

    return KeepFloat64


_KEEPER = None


@contextlib.contextmanager
def keep_float64() -> Iterator[None]:
    """Inside the block, what the model casts to float32 (or narrower) becomes float64 (KeepFloat64)."""
    global _KEEPER
    if _KEEPER is None:
        _KEEPER = _keeper()
    with _KEEPER():
        yield


def model64(model: Any) -> Any:
    """A float64 copy of `model` (the original untouched)."""
    try:
        return copy.deepcopy(model).double()
    except Exception as e:
        raise NoFloat64(f"the model cannot be copied to float64: {type(e).__name__}: {e}") from e


def step(workload: Any, batches: list[tuple[Any, Any]], seed: int = 0) -> Any:
    """One step's forward and backward (every micro-batch of it) of a float64 copy of the workload's model
    (dropout off): a gradients.Step whose gradients are keyed by the original's parameter names."""
    from ortlab.common.parity import parity
    from ortlab.verdict.gradients import Step

    model = model64(workload.model)
    model.train()
    try:
        with parity(model, True, seed), keep_float64():
            loss = workload.backward(model, batches, double)
    except Exception as e:
        raise NoFloat64(f"the model does not run in float64: {type(e).__name__}: {_first_line(e)}") from e
    return Step(loss, {n: None if p.grad is None else p.grad.detach()
                       for n, p in model.named_parameters() if p.requires_grad})


def burst(workload: Any, feed: Any, initial: Any, optimizer: str, lr: float, steps: int, seed: int = 0
          ) -> tuple[dict[str, Any], Any]:
    """The burst's steps on a float64 copy of the model from the initial snapshot (its optimizer state cast),
    every dropout off, with the workload's own step (its micro-batches, clipping, and its optimizer and scheduler
    made anew over the copy): ({"losses": [...], "state": the end state's summary (ortlab.verdict.state)}, the
    first step as a gradients.Step: the float64 gradients the first-step check needs, at no extra cost)."""
    try:
        return replay(workload, feed, initial, optimizer, lr, steps, seed)
    except NoFloat64:
        raise
    except Exception as e:
        raise NoFloat64(f"the model does not train in float64: {type(e).__name__}: {_first_line(e)}") from e


def replay(workload: Any, feed: Any, initial: Any, optimizer: str, lr: float, steps: int, seed: int = 0,
           float64: bool = True, nudge: int | None = None, jitter: dict[str, float] | None = None,
           fixes: tuple[str, ...] = (), ulps: int = 1) -> tuple[dict[str, Any], Any]:
    """The burst's steps on a copy of the model from the initial snapshot (`burst`: the float64 one). Without
    `float64`, an fp32 run whose rounding differs from the PyTorch burst's, a member of the verdict's ensemble
    (ortlab.verdict.ensemble): `nudge` (a seed), every floating parameter moved by `ulps` ulps up or down at the
    start, and with `jitter` (per parameter, a size), each step's gradient moved by noise of that size per
    element (another summation order's rounding); `fixes`, the module-kind fixes' formulas (what ORTModule ran)
    in place of the model's. Raises what the steps raise."""
    import torch

    from ortlab.common.parity import parity
    from ortlab.engine.config import optimizer_for
    from ortlab.verdict import state
    from ortlab.verdict.gradients import Step
    from ortlab.workload import to_device

    initial.restore(workload.model)
    model = model64(workload.model) if float64 else copy.deepcopy(workload.model)
    model.train()
    if nudge is not None:
        nudged(model, nudge, ulps)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    opt, scheduler = optimizer_for(workload, model, optimizer, lr, device)
    if initial.optimizer is not None:
        with contextlib.suppress(ValueError, KeyError):
            opt.load_state_dict(initial.optimizer)  # floating state is cast to the parameters' dtype
    _fused(opt)
    cast = double if float64 else (lambda v: v)
    noise = torch.Generator().manual_seed(nudge or 0)
    losses, first = [], None
    # The keeper holds the forward and backward only: inside the optimizer's step it made AdamW's step counters
    # float64, and CUDA's fused AdamW then gave NaN (every float64 burst on an H200 did, 2026-11-28).
    keeper = keep_float64 if float64 else contextlib.nullcontext
    with parity(model, True, seed), formulas(model, fixes):
        for t in range(steps):
            batches = [to_device(b, device) for b in workload.micro_batches(feed.batch, t)]
            with keeper():
                loss = workload.backward(model, batches, cast)
            if t == 0:
                first = Step(loss, {n: None if p.grad is None else p.grad.detach().clone()
                                    for n, p in model.named_parameters() if p.requires_grad})
            if jitter:
                _jittered(model, jitter, noise)
            workload.optimizer_step(model, opt, scheduler)
            losses.append(loss)
    return {"losses": losses, "state": state.summarize(model)}, first


def nudged(model: Any, seed: int, ulps: int = 1) -> Any:
    """`model` with every floating parameter moved by `ulps` ulps (up or down, as a generator seeded with `seed`
    draws): a start PyTorch fp32 cannot tell from the original (one ulp), whose rounding then differs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                up = (torch.rand(p.shape, generator=g) < 0.5).to(p.device)
                if ulps == 1:
                    p.copy_(torch.nextafter(p, torch.where(up, math.inf, -math.inf).to(p.dtype)))
                else:
                    ulp = torch.nextafter(p, torch.full_like(p, math.inf)) - p
                    p.add_(torch.where(up, ulp, -ulp) * ulps)
    return model


def _jittered(model: Any, sizes: dict[str, float], generator: Any) -> None:
    """Each parameter's gradient plus noise of its size (RMS) per element, uniform (named in `sizes`)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.grad is not None and sizes.get(name):
                noise = torch.rand(p.shape, generator=generator).to(p.device, p.dtype)
                p.grad.add_(noise.sub_(0.5).mul_(math.sqrt(12) * sizes[name]))


@contextlib.contextmanager
def formulas(model: Any, fixes: tuple[str, ...] | list[str]) -> Iterator[None]:
    """The module-kind fixes among `fixes` (those that rewrite the model's arithmetic: the formula ORTModule ran)
    applied to PyTorch for the block."""
    from ortlab.compat import registry

    with registry.applied(model, rewriting(fixes)):
        yield


def rewriting(fixes: tuple[str, ...] | list[str]) -> list[str]:
    """The fixes among `fixes` that rewrite the model's arithmetic (module-kind: a formula in place of torch's)."""
    from ortlab.compat import registry

    return [f for f in fixes if registry.get(f).kind == registry.FixKind.MODULE]


def _fused(opt: Any) -> None:
    """torch's Adam and AdamW updated by their fused kernel: the same update to the last bit of float64 here, 3-4x
    faster than the per-tensor loop on the CPU (float64 AdamW was a third of the verdict's cost on ResNet-18)."""
    import torch

    if type(opt) in (torch.optim.Adam, torch.optim.AdamW):
        for group in opt.param_groups:
            if not group.get("differentiable"):
                group["foreach"], group["fused"] = False, True


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
