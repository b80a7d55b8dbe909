"""Statistics of many tensors at once, on their device (CUDA): the rows of a whole step reach the host in one copy.

Summarizing each tensor where it is observed and copying its row to the host costs a synchronisation per tensor:
on a GPU that made a step with statistics 5x as long as one without. Here each observed tensor is only copied
where it is observed (one copy on the device, widened to float32 as summarize widens fp16/bf16; float64 and
integers to float64), because the model may change it in place later (a ReLU with inplace=True after the
module that produced it). The copies are reduced together with segmented reductions (min, max, sums, counts,
the centred sum of squares in a second pass) when they hold more than `BUDGET` bytes or when the collector asks,
and every row reaches the host in one copy per device at `flush` (once per step, before the optimizer). The
rows mean what ortlab.activations.summarize's do (the same FIELDS, the same sample positions, min/max/sums over
the finite values, nan, inf and zero counts): tests run this path on CPU tensors against the C kernel and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

BUDGET = 64 * 2**20  # bytes of copies held on the device before they are reduced there (no copy to the host)
_WIDTH = 8  # per tensor on the device: min, max, sum, sumsq, css, nan count, nan + inf count, zero count


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One vector of every tensor's values in turn (float64 when any is)."""
    return torch.cat([t.reshape(-1) for t in tensors])


class Batched:
    """Copies of observed tensors and where their rows go (rows[i], samples[i]), reduced in groups on the device;
    `flush` writes every row to the host. `positions(n)`: the flat positions of the samples of a tensor of n
    values (summarize's)."""

    def __init__(self, positions: Callable[[int], np.ndarray]):
        self._positions = positions
        self._pending: list[tuple[torch.Tensor, np.ndarray, np.ndarray, int]] = []
        self._bytes = 0
        self._reduced: list[tuple[torch.Tensor, list[tuple[np.ndarray, np.ndarray, int]], np.ndarray,
                                  np.ndarray]] = []  # (rows on the device, destinations, numels, sample counts)

    def add(self, t: torch.Tensor, rows: np.ndarray, samples: np.ndarray, i: int) -> None:
        """Keep a copy of `t` (detached, real, dense, not empty) for rows[i] and samples[i]."""
        wide = t.dtype is torch.float64 or not t.is_floating_point()
        copy = t.to(torch.float64 if wide else torch.float32, copy=True, memory_format=torch.contiguous_format)
        self._pending.append((copy, rows, samples, i))
        self._bytes += copy.numel() * copy.element_size()
        if self._bytes > BUDGET:
            self._reduce()

    def clear(self) -> None:
        """Forget what was added and not yet written (a step that did not end)."""
        self._pending, self._reduced, self._bytes = [], [], 0

    @property
    def waiting(self) -> bool:
        return bool(self._pending or self._reduced)

    def _reduce(self) -> None:
        """The pending copies' rows, computed on their device (per device); nothing reaches the host."""
        pending, self._pending, self._bytes = self._pending, [], 0
        by_device: dict[Any, list[tuple[torch.Tensor, np.ndarray, np.ndarray, int]]] = {}
        for item in pending:
            by_device.setdefault(item[0].device, []).append(item)
        for device, items in by_device.items():
            copies = [c for c, *_ in items]
            numels = np.fromiter((c.numel() for c in copies), np.int64, len(copies))
            positions = [self._positions(int(n)) for n in numels]
            counts = np.fromiter((len(p) for p in positions), np.int64, len(positions))
            starts = np.cumsum(numels) - numels
            where = np.concatenate([numels, *(p + s for p, s in zip(positions, starts, strict=True))])
            index = torch.from_numpy(where)
            if device.type == "cuda":  # pinned, so that the copy does not wait for the device
                index = index.pin_memory().to(device, non_blocking=True)
            elif index.device != device:
                index = index.to(device)
            x = _flat(copies).double()
            rows = _rows(x, index[: len(copies)], int(numels.sum()))
            picked = torch.index_select(x, 0, index[len(copies):])
            del x
            self._reduced.append((torch.cat([rows.reshape(-1), picked]), [(r, s, i) for _, r, s, i in items],
                                  numels, counts))

    def flush(self) -> None:
        """Every row added since the last flush, written to its destination: one copy to the host per device."""
        if self._pending:
            self._reduce()
        if not self._reduced:
            return
        reduced, self._reduced = self._reduced, []
        by_device: dict[Any, list[int]] = {}
        for k, (values, *_) in enumerate(reduced):
            by_device.setdefault(values.device, []).append(k)
        for ks in by_device.values():
            parts = [reduced[k][0] for k in ks]
            host = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu().numpy()
            at = 0
            for k in ks:
                values, dests, numels, counts = reduced[k]
                _write(host[at: at + values.numel()], dests, numels, counts)
                at += values.numel()


def _rows(x: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """[tensors, _WIDTH] on x's device: each segment's min and max of the finite values (inf / -inf when there are
    none), sum, sum of squares and centred sum of squares of the finite values, nan count, nan + inf count, zeros."""
    bad = ~torch.isfinite(x)
    finite = x.masked_fill(bad, 0.0)

    def seg(values: torch.Tensor, how: str) -> torch.Tensor:
        return torch.segment_reduce(values, how, lengths=lengths, unsafe=True)

    s = seg(finite, "sum")
    nonfinite = seg(bad.to(x.dtype), "sum")
    mean = s / (lengths.to(x.dtype) - nonfinite).clamp_min(1.0)
    centred = (finite - mean.repeat_interleave(lengths, output_size=total)).masked_fill_(bad, 0.0)
    return torch.stack([seg(x.masked_fill(bad, math.inf), "min"), seg(x.masked_fill(bad, -math.inf), "max"), s,
                        seg(finite * finite, "sum"), seg(centred * centred, "sum"),
                        seg(torch.isnan(x).to(x.dtype), "sum"), nonfinite, seg((x == 0).to(x.dtype), "sum")], 1)


def _write(host: np.ndarray, dests: list[tuple[np.ndarray, np.ndarray, int]], numels: np.ndarray,
           counts: np.ndarray) -> None:
    """One reduced group's rows (FIELDS) and samples into their destinations, one numpy assignment per
    destination array where it can."""
    m = len(dests)
    block = host[: m * _WIDTH].reshape(m, _WIDTH)
    picked = host[m * _WIDTH:]
    nan, nonfinite = block[:, 5], block[:, 6]
    none_finite = nonfinite == numels
    rows = np.column_stack([numels, block[:, :5], nan, nonfinite - nan, block[:, 7]])
    rows[none_finite, 1:3] = np.nan  # no finite value: no min or max (the sums are 0)
    offsets = np.cumsum(counts) - counts
    groups: dict[tuple[int, int], list[int]] = {}
    for j, (r, s, _i) in enumerate(dests):
        groups.setdefault((id(r), id(s)), []).append(j)
    for js in groups.values():
        r, s, _ = dests[js[0]]
        js_ = np.array(js)
        slots = np.array([dests[j][2] for j in js])
        r[slots] = rows[js_]
        width = s.shape[1] if s.ndim == 2 else 0
        if not width:
            continue
        full = counts[js_] == width
        if full.any():
            s[slots[full]] = picked[offsets[js_[full]][:, None] + np.arange(width)]
        for j, slot in zip(js_[~full], slots[~full], strict=True):
            s[slot, : counts[j]] = picked[offsets[j]: offsets[j] + counts[j]]
