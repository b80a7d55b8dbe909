"""The first step's gradients of both backends, from the same state and batch, compared parameter by parameter:
the evidence that cannot be fooled by optimizer noise (a few AdamW steps can make correct runs drift apart,
and a forward can agree while ORT's backward is wrong).

The measure is relative with a floor: |g_ort - g_pt| / max(|g_pt|, FLOOR * |all of PyTorch's gradients|), so a
parameter whose true gradient is zero (it carries only rounding noise on both sides) does not look 100% off.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLOOR = 1e-4  # of the norm of all gradients: what a "zero" gradient is measured against
AGREE = 1e-3  # the worst parameter's relative difference up to which the gradients agree


@dataclass
class Step:
    """One forward and backward: the loss and every trained parameter's gradient (None: it got none)."""

    loss: float
    grads: dict[str, Any]


@dataclass
class GradientCheck:
    """The first step's gradients compared: one row per parameter, worst first."""

    rows: list[dict[str, Any]]
    loss_pytorch: float
    loss_ortmodule: float
    tolerance: float = AGREE
    fixes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    @property
    def agree(self) -> bool:
        return self.worst is None or self.worst["relative"] <= self.tolerance

    @property
    def forward_agrees(self) -> bool:
        scale = max(abs(self.loss_pytorch), 1.0)
        return math.isfinite(self.loss_ortmodule) and abs(self.loss_ortmodule - self.loss_pytorch) <= 1e-4 * scale

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["parameter", "module", "relative", "difference", "pytorch_norm",
                                                "ortmodule_norm", "note"])

    def to_dict(self) -> dict[str, Any]:
        return {"agree": self.agree, "tolerance": self.tolerance, "loss_pytorch": self.loss_pytorch,
                "loss_ortmodule": self.loss_ortmodule, "forward_agrees": self.forward_agrees,
                "worst": self.rows[:5], "parameters": len(self.rows), "fixes": self.fixes}


def compare(pytorch: Step, ortmodule: Step, tolerance: float = AGREE, fixes: list[str] | None = None) -> GradientCheck:
    """Every parameter's gradient of both steps, worst first."""
    import torch

    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in pytorch.grads.values() if g is not None))
    floor = FLOOR * total
    rows = []
    for name, g_pt in pytorch.grads.items():
        g_ort = ortmodule.grads.get(name)
        module = name.rpartition(".")[0]
        if g_pt is None and g_ort is None:
            continue
        if g_pt is None or g_ort is None:
            rows.append({"parameter": name, "module": module, "relative": math.inf, "difference": math.nan,
                         "pytorch_norm": None if g_pt is None else float(g_pt.norm()),
                         "ortmodule_norm": None if g_ort is None else float(g_ort.norm()),
                         "note": f"only {'ORTModule' if g_pt is None else 'PyTorch'} gave it a gradient"})
            continue
        g_pt, g_ort = g_pt.double(), g_ort.double().to(g_pt.device)
        if not torch.isfinite(g_ort).all():
            note, diff = "ORTModule's gradient is not finite", math.inf
        else:
            note, diff = None, float((g_ort - g_pt).norm())
        reference = max(float(g_pt.norm()), floor, 1e-30)
        rows.append({"parameter": name, "module": module, "relative": diff / reference, "difference": diff,
                     "pytorch_norm": float(g_pt.norm()), "ortmodule_norm": float(g_ort.norm()), "note": note})
    rows.sort(key=lambda r: -r["relative"])
    return GradientCheck(rows, pytorch.loss, ortmodule.loss, tolerance, list(fixes or []))


def step(workload: Any, inputs: Any, target: Any, runner: Any = None) -> Step:
    """One forward and backward of the workload's model through `runner` (the model itself when None, or an
    ORTModule over it; no optimizer step); the model's parameters, buffers and gradients are as before
    afterwards. Raises what the step raises; an ORTModule that fell back to PyTorch raises why it fell back."""
    model = workload.model
    with kept(model):
        loss = _forward_backward(workload, model if runner is None else runner, inputs, target)
        if runner is not None and runner is not model:
            from ortlab import _ort

            if _ort.is_ortmodule(runner) and (fell_back := _ort.Wrap(runner, True).fallback()) is not None:
                raise fell_back
        return Step(loss, {n: None if p.grad is None else p.grad.detach().clone()
                           for n, p in model.named_parameters() if p.requires_grad})


def fresh_ortmodule(model: Any) -> Any:
    """A new ORTModule over `model` (its first forward exports), at ortlab's log level."""
    from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

    from ortlab import _ort

    _ort.patch_label_hook_bug()
    return ORTModule(model, DebugOptions(log_level=LogLevel.WARNING))


def _forward_backward(workload: Any, runner: Any, inputs: Any, target: Any) -> float:
    from ortlab.workload import call_model

    for p in workload.model.parameters():
        p.grad = None
    loss = workload.loss(call_model(runner, inputs), target)
    loss.backward()
    return float(loss.detach())


@contextlib.contextmanager
def kept(model: Any) -> Iterator[None]:
    """The model's state and gradients restored after the block (a step must leave no trace)."""
    from ortlab.snapshot import Snapshot

    snapshot = Snapshot.take(model)
    grads = {n: p.grad for n, p in model.named_parameters()}
    try:
        yield
    finally:
        snapshot.restore(model)
        for name, p in model.named_parameters():
            p.grad = grads[name]


def first_step(workload: Any, fixes: tuple[str, ...] | list[str] = (), seed: int = 0, tolerance: float = AGREE,
               log: Path | None = None, runner: Any = None, batch: tuple[Any, Any] | None = None) -> GradientCheck:
    """The first batch's gradients on PyTorch (the model as written) and on the other backend (with `fixes`
    applied), every dropout off, the same seeds, ORT's compute optimizer off (parity mode). `runner`: the other
    backend's module over the model (an ORTModule exported in parity mode, a compiled module); None: a fresh
    ORTModule (one export). `batch`: the inputs and target (default: the workload's batch 0)."""
    from ortlab.capture import captured_output
    from ortlab.compat import registry
    from ortlab.engine.parity import parity
    from ortlab.options import Options
    from ortlab.workload import to_device

    model = workload.model
    inputs, target = batch if batch is not None else workload.batch(0)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        inputs, target = to_device(inputs, device), to_device(target, device)
    model.train()
    with Options(enable_compute_optimizer=False).applied():
        with parity(model, True, seed):
            pt = step(workload, inputs, target)
        with parity(model, True, seed), registry.applied(model, list(fixes)), \
                captured_output(log or Path("/dev/null")):
            ort = step(workload, inputs, target, runner if runner is not None else fresh_ortmodule(model))
    return compare(pt, ort, tolerance, list(fixes))
