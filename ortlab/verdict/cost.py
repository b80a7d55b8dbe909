"""What the verdict's float64 burst costs in memory, said before it is spent, and whether it fits.

The first step's float64 gradients are taken block by block (ortlab.verdict.blockwise) and cost little. The loss
curve and the end state need the burst's steps in float64: a float64 copy of the model, its gradients and its
optimizer state, and the activations of a step, all twice their fp32 size: 40 bytes a parameter with AdamW
(8 weights, 8 gradients, 16 moments, 8 the first step's gradients the gradient check reuses), beside the fp32
model and snapshot the process already holds, where training itself needs 16. GPT-2 medium (355M) needs 14 GB
more for it; a 1B model 40 GB. So the float64 burst is a choice:

- "auto" (the default): run it when its estimated need is small (at most AUTO_BYTES: models up to ~40M
  parameters, the model zoo's, whose verdicts float64 settles in seconds) and fits in what the device has free
  (FITS of it); else judge the losses and end state against fp32's spread alone (a PyTorch pair from a perturbed
  start) and say so, with the figures. So the verdict's memory grows like training's, not 2.5 times faster;
- "burst": always run it (a model that does not fit is killed for memory, and the verdict says so);
- "first-step": never: the first step's gradients against float64, the losses and end state against fp32's spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FITS = 0.8  # the share of the free memory the float64 burst may be estimated to need and still run
AUTO_BYTES = 2 * 2**30  # "auto" runs the float64 burst up to this estimated need


@dataclass
class Need:
    """An estimate of the bytes the float64 burst adds, by part."""

    parts: dict[str, int]

    @property
    def bytes(self) -> int:
        return sum(self.parts.values())

    def __str__(self) -> str:
        from ortlab.engine.headroom import gb

        return f"{gb(self.bytes)} (" + ", ".join(f"{k} {gb(v)}" for k, v in self.parts.items() if v) + ")"


def float64_burst(model: Any, optimizer: str, activations: int | None) -> Need:
    """The float64 burst's need for `model` trained with `optimizer`; `activations`: the fp32 burst's activation
    bytes at its peak (None: unknown, not counted)."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = sum(p.numel() for p in model.parameters() if p.is_floating_point())
    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    return need(weights + buffers, trained, optimizer, activations)


def need(weights: int, trained: int, optimizer: str, activations: int | None = None) -> Need:
    """The float64 burst's need from counts: `weights` floating values in the model (parameters and buffers),
    `trained` of them trained."""
    return Need({"the model in float64": 8 * weights, "its gradients": 8 * trained,
                 "the optimizer's state": 8 * _moments(optimizer) * trained, "the first step's gradients": 8 * trained,
                 "activations in float64": 2 * (activations or 0)})


def activations(peak: dict[str, Any] | None, model: Any, optimizer: str) -> int | None:
    """The fp32 burst's activations at its peak, estimated from its peak memory (`peak`: {"bytes", "device"}, the
    device it was measured on): on CUDA the allocator's peak less the weights, gradients and optimizer state; on
    the CPU the process's peak resident set less those, the snapshot and torch's own (RUNTIME)."""
    if not peak or peak.get("bytes") is None:
        return None
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    static = weights + 4 * trained + 4 * _moments(optimizer) * trained
    if peak.get("device") != "cuda":
        static += weights + RUNTIME  # the snapshot on the CPU, and torch itself
    return max(int(peak["bytes"] - static), 0)


def _moments(optimizer: str) -> int:
    from ortlab.engine.headroom import MOMENTS

    return MOMENTS.get(str(optimizer), 2)


RUNTIME = 400 * 2**20  # what a torch process holds before any model (measured: 0.3-0.5 GB on the CPU)


def decide(model: Any, optimizer: str, device: Any, chosen: str, peak: dict[str, Any] | None = None
           ) -> tuple[bool, str | None]:
    """Whether to run the float64 burst in mode `chosen` (ortlab.engine.types.Float64), and why not in words (None
    when it runs); `peak`: the fp32 burst's peak memory and the device it was measured on."""
    from ortlab.engine.headroom import free, gb
    from ortlab.engine.types import Float64

    chosen = Float64(chosen)
    if chosen == Float64.FIRST_STEP:
        return False, "the float64 burst was not asked for (float64 first-step)"
    if chosen == Float64.BURST:
        return True, None
    estimate = float64_burst(model, optimizer, activations(peak, model, optimizer))
    have, where = free(device)
    if estimate.bytes > AUTO_BYTES:
        return False, (f"the float64 burst would need about {estimate}, more than the {gb(AUTO_BYTES)} a verdict "
                       "spends on it unasked: not run (--float64 burst runs it where it fits)")
    if have is None or estimate.bytes <= FITS * have:
        return True, None
    return False, (f"the float64 burst would need about {estimate}, and {gb(have)} is {where}: not run "
                   "(--float64 burst runs it anyway)")
