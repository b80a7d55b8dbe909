"""Exact arithmetic as the arbiter: a backend diverges only where it is measurably further from float64 than
PyTorch fp32 is.

PyTorch fp32 is not exact: a different kernel order (ORT's, inductor's) rounds differently, and on an
ill-conditioned layer PyTorch's own rounding can be the larger error. So a tensor of the candidate backend (ORT,
torch.compile) is judged by its distance to the same computation in float64 PyTorch, against PyTorch fp32's
distance to it (torch._dynamo's accuracy checker, `same()`, does the same for outputs and gradients, with 2-3x).

The constants, from first-step gradients measured on these machines (2026-11-25; ORTModule 1.19.2, torch 2.6,
batch 2; per model the worst parameter's ORT->float64 over PyTorch->float64):
- models ORT trains right: torchvision ResNet-18 0.71, EfficientNet-B0 (global-avg-pool) 1.63, RegNetY-400MF
  (global-avg-pool) 2.02, ConvNeXt-T 2.63 (biases of norm 4e-7, both sides ~1e-13 off: the floors decide), and
  the demo's and torch.nn layers' models allclose (no float64 needed). The ratio of two rounding errors is itself
  noisy, so FACTOR sits above the largest of them: 3, dynamo's figure for small tensors.
- ORT's wrong squeeze-and-excitation gradients: torchvision EfficientNet-B0 4.3e5x (ORT's `fc2` gradient 9x
  its own norm off), RegNetY-400MF 4.9e4x, the demo's SE block 1.1e7x. Any factor up to 1e4 catches them.
- RELATIVE_FLOOR: 1e-4 of a tensor's own norm is never a divergence (fp32 sums of 1e4-1e6 terms round to ~1e-6 to
  1e-5 of it; PyTorch fp32 can be exact by luck on a small tensor). ABSOLUTE_FLOOR: 1e-7 of the norm of all
  gradients, for a parameter whose true gradient is ~0 (a bias before a norm: EfficientNet-B0's
  features.1.0.block.2.1.bias, true norm 2e-14, carries 1e-5 of rounding on both sides, 5e-9 of the total).

One PyTorch fp32 run is one sample of fp32's error, and where the computation is ill-posed (a ReLU or a max at a
tie: MNASNet's first-step gradients) or chaotic (a few AdamW steps) that sample can be far luckier than another:
`spread` is then the largest distance of a small ensemble of fp32 runs (ortlab.verdict.ensemble), and the
candidate is allowed FACTOR times that.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

FACTOR = 3.0  # the candidate may be this many times further from float64 than PyTorch fp32 is
RELATIVE_FLOOR = 1e-4  # ... plus this much of the float64 tensor's own norm (rounding of a sum of many terms)
ABSOLUTE_FLOOR = 1e-7  # ... plus this much of the norm of all float64 tensors judged together (a true ~0 value)
ALLCLOSE = 1e-6  # the fast path: candidate and PyTorch fp32 this close (relative) agree without float64


@dataclass
class Judged:
    """One tensor judged against float64: both distances, what was allowed, and whether it diverged."""

    candidate: float  # |candidate - float64|
    pytorch: float  # |PyTorch fp32 - float64|
    allowed: float  # FACTOR * max(pytorch, spread) + the floors
    norm: float  # |float64|
    diverged: bool
    spread: float | None = None  # the largest |fp32 run - float64| of the ensemble (None: no ensemble ran)

    @property
    def times_noise(self) -> float:
        """How many times PyTorch fp32's own error the candidate's is (inf when PyTorch fp32 is exact)."""
        return self.candidate / self.pytorch if self.pytorch > 0 else (math.inf if self.candidate > 0 else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(candidate: Any, pytorch: Any, exact: Any, scale: float = 0.0, factor: float = FACTOR,
          spread: float | None = None) -> Judged:
    """Judge the candidate backend's tensor against PyTorch fp32's, both measured from the float64 one (`exact`).
    `scale`: the norm of everything judged together (e.g. all float64 gradients), for the absolute floor;
    `spread`: the ensemble's largest fp32 distance to float64, when one ran (it widens what is allowed)."""
    exact = exact.double()
    cand = float((candidate.double().to(exact.device) - exact).norm())
    ref = float((pytorch.double().to(exact.device) - exact).norm())
    return decide(cand, ref, float(exact.norm()), scale, factor, spread)


def decide(candidate: float, pytorch: float, norm: float, scale: float = 0.0, factor: float = FACTOR,
           spread: float | None = None) -> Judged:
    """`judge` on the distances themselves."""
    noise = pytorch if spread is None or not math.isfinite(spread) else max(pytorch, spread)
    allowed = factor * noise + RELATIVE_FLOOR * norm + ABSOLUTE_FLOOR * scale
    diverged = not math.isfinite(candidate) or candidate > allowed
    return Judged(candidate, pytorch, allowed, norm, diverged, spread)


def close(candidate: Any, pytorch: Any, rtol: float = ALLCLOSE) -> bool:
    """The fast path: the candidate equals PyTorch fp32 up to rounding of the last bits (no float64 run needed)."""
    from ortlab.runs.sketch import apart, norm

    if not bool(candidate.isfinite().all()):
        return False
    return within(apart(candidate, pytorch), norm(pytorch), rtol)


def within(distance: float, norm: float, rtol: float = ALLCLOSE) -> bool:
    """Whether two tensors `distance` apart are equal up to rounding of the last bits, the reference's norm
    `norm` (the fast path's test, on a distance measured or estimated)."""
    return distance <= rtol * max(norm, 1e-30)


def judge_numbers(candidate: list[float], pytorch: list[float], exact: list[float], factor: float = FACTOR,
                  spread: float | None = None) -> Judged:
    """`judge` on plain numbers (a loss curve, a tensor's summary), as one vector."""
    return judge(vector(candidate), vector(pytorch), vector(exact), factor=factor, spread=spread)


def distance_numbers(a: list[float], b: list[float]) -> float:
    """|a - b| of two lists of numbers, as vectors."""
    return float((vector(a) - vector(b)).norm())


def vector(values: list[float]) -> Any:
    """Plain numbers (None: nan) as a float64 tensor."""
    import torch

    return torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)


def close_numbers(candidate: list[float], pytorch: list[float], rtol: float = ALLCLOSE) -> bool:
    """`close` on plain numbers."""
    import torch

    return close(torch.tensor(candidate, dtype=torch.float64), torch.tensor(pytorch, dtype=torch.float64), rtol)


def number(value: float) -> str:
    """A number as a person reads it: 3 significant digits, in powers of ten outside 1e-3..1e4 ("5.2e+39")."""
    if not math.isfinite(value):
        return "not finite" if math.isnan(value) else ("infinite" if value > 0 else "minus infinite")
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.3g}"
    return f"{value:.1e}"


def times(distance: float, noise: float) -> str:
    """How many times the PyTorch noise `distance` is, in words ("18x", "0.4x", "5.2e+05x"; "infinitely many
    times" when PyTorch is exact)."""
    if not math.isfinite(distance):
        return "not finite"
    if noise <= 0:
        return "infinitely many times" if distance > 0 else "0x"
    ratio = distance / noise
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x" if ratio < 1e4 else f"{ratio:.1e}x"


def percent(distance: float, norm: float) -> str:
    """`distance` as a percentage of `norm` ("110%", "3.1%", "4.2e-05%", "5.2e+39%")."""
    if norm <= 0 or not math.isfinite(distance):
        return number(distance)
    share = 100 * distance / norm
    if share >= 1e4:
        return f"{share:.1e}%"
    return f"{share:.0f}%" if share >= 10 else f"{share:.2g}%" if share >= 0.01 else f"{share:.1e}%"
