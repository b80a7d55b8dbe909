"""Statistics of many tensors at once, on their device (CUDA): the rows of a whole step reach the host in one copy.

Summarizing each tensor where it is observed and copying its row to the host costs a synchronisation per tensor:
on a GPU that made a step with statistics 5x as long as one without. Here an observed tensor is only kept where it
is observed, and the tensors kept are reduced together with segmented reductions (min, max, sums, counts, the
centred sum of squares in a second pass) when they hold more than `BUDGET` bytes or when the collector asks; every
row reaches the host in one copy per device at `flush` (once per step, before the optimizer).

Kept how: the model may change a tensor in place after it was observed (a ReLU with inplace=True after the module
that produced it), so a tensor is copied (float32; float64 and integers as float64) the first time its slot is
seen, and its version counter, which every in-place change bumps, is checked when it is reduced: a slot whose
tensor was left alone is kept by reference from then on (no copy: what a step pays per tensor on a GPU is mostly
the launches), one that was changed is copied every step. A referenced tensor found changed loses its row for
that step (left empty, counted in `lost`) and is copied from then on. Tensors whose memory is reused behind
torch's back (ORT's outputs at a PythonOp, CUDA graphs' pools) are always copied (`always_copy`).

The rows mean what ortlab.activations.summarize's do (the same FIELDS, the same sample positions, min/max/sums over
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


LAYOUTS = 64  # the sample indices of this many step layouts (the numels in turn) kept on their device


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One vector of every tensor's values in turn, in their logical order (float32 or float64: fp16/bf16 are
    widened): torch's own flattening, one call for all of them."""
    try:
        from torch._utils import _flatten_dense_tensors
    except ImportError:  # a torch without it: a reshape per tensor
        return torch.cat([t.reshape(-1) for t in tensors])
    return _flatten_dense_tensors(tensors)


# A kept tensor: (its values: a copy or the tensor, its numel, rows, samples, i, the tensor whose version is checked
# or None, its version when kept, its slot's key)
Kept = tuple[torch.Tensor, int, np.ndarray, np.ndarray, int, "torch.Tensor | None", int, tuple[int, int]]


class Batched:
    """Observed tensors and where their rows go (rows[i], samples[i]), reduced in groups on the device; `flush`
    writes every row to the host. `positions(n)`: the flat positions of the samples of a tensor of n values
    (summarize's). See the module's docstring for when a tensor is copied."""

    always_copy = False  # the tensors' memory may be reused without an in-place op (ORT's PythonOps, CUDA graphs)

    def __init__(self, positions: Callable[[int], np.ndarray]):
        self._positions = positions
        self._pending: list[Kept] = []
        self._bytes = 0
        self._reduced: list[tuple[torch.Tensor, list[tuple[np.ndarray, np.ndarray, int]], np.ndarray,
                                  np.ndarray]] = []  # (rows on the device, destinations, numels, sample counts)
        self._safe: set[tuple[int, int]] = set()  # slots (id(rows), i) whose tensor was left alone: kept by reference
        self._changed: set[tuple[int, int]] = set()  # slots whose tensor was changed in place: copied
        self._layouts: dict[tuple, tuple[torch.Tensor, np.ndarray]] = {}  # (device, numels) -> (indices, counts)
        self.lost = 0  # rows left empty: a referenced tensor changed in place before it was reduced

    def add(self, t: torch.Tensor, rows: np.ndarray, samples: np.ndarray, i: int) -> bool:
        """Keep `t` (detached) for rows[i] and samples[i]; False for a tensor this path does not take (empty,
        complex, sparse: the caller summarizes it at once)."""
        n = t.numel()
        if not n or t.is_complex() or t.is_sparse:
            return False
        key = (id(rows), i)
        floating = t.is_floating_point()
        if key in self._safe and floating and not self.always_copy:
            self._pending.append((t, n, rows, samples, i, t, t._version, key))
        else:
            wide = t.dtype is torch.float64 or not floating
            copy = t.to(torch.float64 if wide else torch.float32, copy=True, memory_format=torch.contiguous_format)
            watched = None if self.always_copy or key in self._changed else t  # learn whether it changes
            self._pending.append((copy, n, rows, samples, i, watched, t._version if watched is not None else 0, key))
        self._bytes += n * t.element_size()
        if self._bytes > BUDGET:
            self._reduce()
        return True

    def clear(self) -> None:
        """Forget what was added and not yet written (a step that did not end)."""
        self._pending, self._reduced, self._bytes = [], [], 0

    @property
    def waiting(self) -> bool:
        return bool(self._pending or self._reduced)

    def _checked(self, pending: list[Kept]) -> list[Kept]:
        """The kept tensors whose values are still those observed; the slots learn whether theirs change."""
        out = []
        for item in pending:
            values, _n, _r, _s, _i, watched, version, key = item
            if watched is None:
                out.append(item)
                continue
            changed = watched._version != version
            if values is not watched:  # a copy: right either way; the slot learns
                (self._changed if changed else self._safe).add(key)
                out.append(item)
            elif changed:  # a reference that changed: its values are gone
                self._safe.discard(key)
                self._changed.add(key)
                self.lost += 1
            else:
                out.append(item)
        return out

    def _reduce(self) -> None:
        """The pending tensors' rows, computed on their device (per device); nothing reaches the host."""
        pending, self._pending, self._bytes = self._checked(self._pending), [], 0
        by_device: dict[Any, list[Kept]] = {}
        for item in pending:
            by_device.setdefault(item[0].device, []).append(item)
        for device, items in by_device.items():
            sizes = tuple(item[1] for item in items)
            index, counts = self._layout(device, sizes)
            m = len(sizes)
            x = _flat([item[0] for item in items]).double()
            rows = _rows(x, index[:m], index[m: 2 * m + 1], sum(sizes))
            picked = torch.index_select(x, 0, index[2 * m + 1:])
            del x
            self._reduced.append((torch.cat([rows.reshape(-1), picked]), [item[2:5] for item in items],
                                  np.array(sizes, np.int64), counts))

    def _layout(self, device: Any, sizes: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
        """On `device`: the tensors' numels, their offsets in the flat vector of all of them (and its end), then
        their samples' positions in it; and each one's sample count. A step observes the same tensors every time:
        kept, so that neither is made nor copied to the device again."""
        found = self._layouts.get((device, sizes))
        if found is not None:
            return found
        numels = np.array(sizes, np.int64)
        positions = [self._positions(n) for n in sizes]
        counts = np.array([len(p) for p in positions], np.int64)
        starts = np.cumsum(numels) - numels
        index = torch.from_numpy(np.concatenate([numels, starts, [numels.sum()],
                                                 *(p + s for p, s in zip(positions, starts, strict=True))]))
        if device.type == "cuda":  # pinned: the copy does not wait for the device (a step whose shapes change)
            index = index.pin_memory().to(device, non_blocking=True)
        elif index.device != device:
            index = index.to(device)
        if len(self._layouts) >= LAYOUTS:
            self._layouts.clear()
        self._layouts[(device, sizes)] = index, counts
        return index, counts

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


def _rows(x: torch.Tensor, lengths: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """[tensors, _WIDTH] on x's device: each segment's min and max of the finite values (inf / -inf when there are
    none), sum, sum of squares and centred sum of squares of the finite values, nan count, nan + inf count, zeros."""
    bad = ~torch.isfinite(x)
    finite = x.masked_fill(bad, 0.0)

    def seg(values: torch.Tensor, how: str) -> torch.Tensor:  # offsets: no prefix sum of the lengths per call
        return torch.segment_reduce(values, how, offsets=offsets, unsafe=True)

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
    groups: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for j, (r, s, i) in enumerate(dests):
        js, ids = groups.setdefault((id(r), id(s)), ([], []))
        js.append(j)
        ids.append(i)
    for js, ids in groups.values():
        r, s, _ = dests[js[0]]
        js_, slots = np.array(js), np.array(ids)
        r[slots] = rows[js_]
        width = s.shape[1] if s.ndim == 2 else 0
        if not width:
            continue
        full = counts[js_] == width
        if full.any():
            s[slots[full]] = picked[offsets[js_[full]][:, None] + np.arange(width)]
        for j, slot in zip(js_[~full], slots[~full], strict=True):
            s[slot, : counts[j]] = picked[offsets[j]: offsets[j] + counts[j]]
