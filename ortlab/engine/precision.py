"""Mixed precision as a burst trains it: `fp16` is torch.autocast to float16 with a GradScaler (CUDA only), `bf16`
torch.autocast to bfloat16 without one (bfloat16 has float32's range: nothing underflows; the CPU and CUDA), `fp32`
no autocast context at all (even a disabled one sets the device's autocast state, which cost 1-3% of an ORTModule
step). The verdict's first-step gradients are taken in the burst's precision on both backends, so PyTorch's own
distance to float64 in that precision is the yardstick (ortlab.verdict.exact). Each function takes the `Precision`
member a BurstConfig holds (a user's string becomes one at the edge, and BurstConfig checks it once, here)."""

from __future__ import annotations

import contextlib
from typing import Any

from ortlab.engine.types import BurstError, Precision

# precision -> the torch dtype autocast runs in
DTYPES: dict[Precision, str] = {Precision.FP16: "float16", Precision.BF16: "bfloat16"}


def check(precision: Precision, device: Any, backend: str) -> None:
    """Refuse, in one line before anything starts, a precision this device or backend cannot train in (asked by
    BurstConfig as it is made)."""
    from ortlab.engine.backends import label, registered

    if precision is Precision.FP16 and device.type != "cuda":
        raise BurstError("precision 'fp16' needs CUDA (torch.autocast float16 + GradScaler); use fp32 or bf16 on the "
                         "CPU")
    if precision is Precision.BF16 and device.type == "cpu" and not registered(backend).autocast_cpu:
        raise BurstError(f"precision 'bf16' does not run on {label(backend)} on the CPU: ORT 1.19.2's CPU kernels "
                         "have no bfloat16 MatMul (the first step fails); use fp32 here, or bf16 on CUDA")


def autocast(precision: Precision, device: Any) -> Any:
    """The context a step's forward and loss run in: torch.autocast in the precision's dtype, none in fp32."""
    import torch

    if precision not in DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, DTYPES[precision]))


def scaler(precision: Precision) -> Any:
    """fp16's GradScaler (float16 gradients underflow without it); None otherwise."""
    import torch

    return torch.amp.GradScaler("cuda") if precision is Precision.FP16 else None


def note(precision: Precision) -> str | None:
    """What a verdict in this precision judged, in words (None in fp32)."""
    if precision not in DTYPES:
        return None
    return (f"judged in {precision} (torch.autocast {DTYPES[precision]} on both backends, the burst's precision): "
            f"each is measured by its distance to float64 beside PyTorch {precision}'s own, which is "
            f"{precision}-sized, not fp32-sized; an agreement here is not fp32 agreement")
