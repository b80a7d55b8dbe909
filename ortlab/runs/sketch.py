"""A gradient kept in a fixed size: what a parity run records of its first step by default, so that a comparison of
any size writes tens of MB, not its gradients (GPT-2 small's are 0.5 GB a run), and can still be judged against
float64 in another process (`ortlab judge`).

The verdict judges distances: |candidate - float64| against |PyTorch fp32 - float64|, per parameter. A linear sketch
keeps them: a count sketch S (each coordinate added, with a sign, into one of WIDTH buckets, both chosen by a hash of
its position and the parameter's name) is linear, S(a) - S(b) = S(a - b), and |S(x)| estimates |x| without bias,
with a relative error of about 1/sqrt(2 * WIDTH) (1.1% at 4096 buckets) for any x, whatever its values. So each
side sketches its own gradient (the float64 side computes the same sketch of its own, in float64) and the
distances are estimated from the sketches; what is judged near the line (within UNCERTAIN of what is allowed) is
said to be undecided rather than guessed. A tensor of at most EXACT values is kept whole (biases, norms: exact).
Beside the sketch: the norm, the sum and whether every value is finite, computed exactly.

The hash is integer arithmetic modulo a prime (no random generator): the same buckets on every torch, device and
stack, so a sketch made by ORTModule's run on torch 2.6 and one made of float64 on torch 2.14 line up.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

FORMAT = "ortlab-gradient-summary-1"
WIDTH = 4096  # buckets per tensor: 32 kB of float64 each
EXACT = 4096  # a tensor of at most this many values is kept whole (exact distances)
UNCERTAIN = 0.06  # an estimated distance within this share of what is allowed cannot decide (5 standard errors of
# the ratio of two estimates at WIDTH 4096)
_PRIME = 2_147_483_647  # 2^31 - 1: products of two residues stay below 2^62 (int64, no overflow)
_CHUNK = 1 << 22  # values hashed at a time (the int64 temporaries: 32 MB each)


@dataclass
class Summary:
    """One gradient, summarized: its size, norm, sum and finiteness exactly; its values when small, else a count
    sketch of them (float64)."""

    numel: int
    norm: float
    sum: float
    finite: bool
    buckets: torch.Tensor | None = None  # [WIDTH] float64, or None when `values` holds the tensor
    values: torch.Tensor | None = None  # the whole tensor, flattened (small ones)

    def to_dict(self) -> dict[str, Any]:
        return {"numel": self.numel, "norm": self.norm, "sum": self.sum, "finite": self.finite,
                **({"buckets": self.buckets} if self.buckets is not None else {"values": self.values})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Summary:
        return cls(int(d["numel"]), float(d["norm"]), float(d["sum"]), bool(d["finite"]), d.get("buckets"),
                   d.get("values"))

    def nbytes(self) -> int:
        t = self.buckets if self.buckets is not None else self.values
        return 0 if t is None else t.numel() * t.element_size()


def _keys(name: str) -> tuple[int, int, int, int]:
    """The hash's four constants for a parameter, from its name (the same everywhere)."""
    digest = hashlib.sha256(name.encode()).digest()
    a, b, c, d = (int.from_bytes(digest[i: i + 8], "little") for i in (0, 8, 16, 24))
    return 1 + a % (_PRIME - 1), b % _PRIME, 1 + c % (_PRIME - 1), d % _PRIME


def summarize(t: torch.Tensor, name: str) -> Summary:
    """The summary of `t` (any floating dtype, any device): computed in float64 on its device, kept on the CPU."""
    flat = t.detach().reshape(-1)
    if flat.numel() <= EXACT:
        values = flat.to("cpu", torch.float64, copy=True)
        return Summary(flat.numel(), float(values.norm()), float(values.sum()), bool(torch.isfinite(values).all()),
                       values=values)
    finite = bool(torch.isfinite(flat).all())
    total = sum(float(flat[i: i + _CHUNK].double().sum()) for i in range(0, flat.numel(), _CHUNK))
    return Summary(flat.numel(), norm(flat), total, finite, buckets=sketch(flat, name).cpu())


def sketch(flat: torch.Tensor, name: str) -> torch.Tensor:
    """The count sketch of a flat tensor (any floating dtype, summed in float64 a chunk at a time): WIDTH buckets,
    each the signed sum of the values hashed to it."""
    a, b, c, d = _keys(name)
    out = torch.zeros(WIDTH, dtype=torch.float64, device=flat.device)
    n = flat.numel()
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        i = torch.arange(start, stop, dtype=torch.int64, device=flat.device)
        if stop > _PRIME:  # positions past 2^31 fold in their high part (no product overflows)
            i = (i % _PRIME + (i // _PRIME) * 1_000_003) % _PRIME
        bucket = (i * a + b) % _PRIME % WIDTH
        sign = ((i * c + d) % _PRIME % 2) * 2 - 1
        out.index_add_(0, bucket, flat[start:stop].double() * sign.to(torch.float64))
        del i, bucket, sign
    return out


def distance(a: Summary | torch.Tensor, b: Summary | torch.Tensor, name: str) -> tuple[float, bool]:
    """|a - b| and whether it is exact: exact for two tensors, or where a summary holds the whole tensor; else
    estimated from the sketches (a tensor is sketched here). inf when either side is not finite."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return apart(a, b), True
    sa, sb = (x if isinstance(x, Summary) else None for x in (a, b))
    if (sa is not None and not sa.finite) or (sb is not None and not sb.finite):
        return math.inf, True
    va, vb = (_values(x) for x in (a, b))
    if va is not None and vb is not None:
        return apart(va, vb), True
    ka, kb = (_buckets(x, name) for x in (a, b))
    return float((ka.to(kb.device) - kb).norm()), False


def _values(x: Summary | torch.Tensor) -> torch.Tensor | None:
    """The whole tensor, flat in float64, when it is at hand (a small summary's, or a tensor of at most EXACT)."""
    if isinstance(x, Summary):
        return x.values
    return x.detach().reshape(-1).double() if x.numel() <= EXACT else None


def _buckets(x: Summary | torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(x, Summary):
        return x.buckets if x.buckets is not None else sketch(x.values.to(torch.float64), name)
    return sketch(x.detach().reshape(-1), name)


def apart(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| in float64, a chunk at a time: no float64 copy of a whole gradient (a 1B model's embedding's is 2 GB)."""
    return _length(a, b)


def norm(x: Summary | torch.Tensor) -> float:
    """|x| in float64 (a chunk at a time for a tensor)."""
    return x.norm if isinstance(x, Summary) else _length(x)


def _length(a: torch.Tensor, b: torch.Tensor | None = None) -> float:
    """|a| or |a - b|, summed in float64 over chunks of _CHUNK values."""
    fa = a.detach().reshape(-1)
    fb = None if b is None else b.detach().reshape(-1).to(a.device)
    total = 0.0
    for start in range(0, fa.numel(), _CHUNK):
        d = fa[start: start + _CHUNK].double()
        if fb is not None:
            d = d - fb[start: start + _CHUNK].double()
        total += float(torch.dot(d, d))
    return math.sqrt(total)


def finite(x: Summary | torch.Tensor) -> bool:
    return x.finite if isinstance(x, Summary) else bool(torch.isfinite(x).all())
