"""Statistics of one tensor into a row of the stats table, the same code in both backends so that identical
tensors give identical rows: a one-pass C kernel for float32 on the CPU (see ortlab.common.kernels), else numpy; a
tensor on a GPU is summarized on its device with the rest of its step (ortlab.activations.batched), whose rows
reach the host in one copy when the collector flushes."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from ortlab.activations.batched import Batched
from ortlab.common.kernels import stats_kernel

_F32 = torch.float32


class Summarizer:
    """Statistics of one tensor: min, max, sum, sum of squares, centred sum of squares (std that is right for
    any mean), counts of nan, inf and zeros, and `k` values at evenly spaced flat positions. Reductions are in
    fp32 or wider (fp16/bf16 are widened first); min/max/sums are over the finite values when there are nan or
    inf. float32 on the CPU goes through a one-pass C kernel (see ortlab.common.kernels), the rest through numpy; a
    tensor on another device through torch on that device, its row written at `flush` (ortlab.activations.batched).
    `batched`: CPU tensors take the device path too (its tests; ORTLAB_STATS_KERNEL=torch)."""

    def __init__(self, k: int, batched: bool | None = None):
        self.k = k
        self.kernel = stats_kernel()
        self.batched = os.environ.get("ORTLAB_STATS_KERNEL") == "torch" if batched is None else batched
        self.device = Batched(self.positions)  # the rows waiting for `flush`
        self.used: set[str] = set()  # which CPU paths summarized: "numpy" ("c": the kernel, when there is one)
        self.on_device = False  # whether tensors were summarized on their device (ortlab.activations.batched)
        self.used_c = False  # whether the C kernel summarized any (a CUDA burst: none, though it is compiled)
        self._index: dict[int, tuple[np.ndarray, int, int]] = {}  # n -> (positions, their address, count)
        # id(rows) -> (rows, samples, address of rows, bytes per row, address of samples, bytes per sample row):
        # the collector passes the same two buffers every call, so their addresses are looked up once
        self._dest: dict[int, tuple[np.ndarray, np.ndarray, int, int, int, int]] = {}

    def positions(self, n: int) -> np.ndarray:
        return self._positions(n)[0]

    def _positions(self, n: int) -> tuple[np.ndarray, int, int]:
        entry = self._index.get(n)
        if entry is None:
            idx = np.unique(np.linspace(0, n - 1, min(self.k, n)).round().astype(np.int64))
            entry = self._index[n] = (idx, idx.ctypes.data, len(idx))
        return entry

    def _bind(self, rows: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int, int, int]:
        dest = self._dest[id(rows)] = (rows, samples, rows.ctypes.data, rows.strides[0], samples.ctypes.data,
                                       samples.strides[0])
        return dest

    def __call__(self, t: torch.Tensor, rows: np.ndarray, samples: np.ndarray, i: int) -> None:
        """Summarize `t` into rows[i] (FIELDS) and samples[i]. Called for every observed tensor of every step: the
        kernel's path checks only what it needs (no detach, no device object, one call into C). A tensor on
        another device: its row is written at `flush`."""
        if t.dtype is _F32 and t.is_cpu and self.kernel is not None and not self.batched:
            self.used_c = True
            if not t.is_contiguous():
                t = t.detach().contiguous()
            n = t.numel()
            idx = self._index.get(n) or self._positions(n)
            dest = self._dest.get(id(rows))
            if dest is None or dest[0] is not rows or dest[1] is not samples:
                dest = self._bind(rows, samples)
            if self.kernel(t.data_ptr(), n, idx[1], idx[2], dest[2] + i * dest[3], dest[4] + i * dest[5]):
                self._nonfinite(t.detach().numpy().reshape(-1), rows[i])  # nan or inf: over the finite values
            return
        if (not t.is_cpu or self.batched) and self.device.add(t.detach(), rows, samples, i):
            self.on_device = True
            return
        self._generic(t.detach(), rows[i], samples[i])

    def flush(self) -> None:
        """Write the rows of the tensors summarized on their device since the last flush (one copy to the host
        per device; nothing to do when there are none)."""
        if self.device.waiting:
            self.device.flush()

    def clear(self) -> None:
        """Drop the rows still waiting for `flush` (a step that did not end)."""
        self.device.clear()

    def describe(self) -> str:
        """Which paths summarized ("c": float32 on the CPU, "numpy", "torch": on the device; joined by "+")."""
        cpu = {"c"} if self.used_c else set()
        return "+".join(sorted(self.used | cpu | ({"torch"} if self.on_device else set()))) or "numpy"

    def _generic(self, t: torch.Tensor, row: np.ndarray, samples: np.ndarray) -> None:
        if t.is_complex() or t.is_sparse:
            row[0] = t.numel()
            return
        if not t.numel():
            row[0] = 0
            row[3:9] = 0  # no values: sums and counts 0, min and max undefined
            return
        self.used.add("numpy")
        narrow_float = t.dtype in (torch.float16, torch.bfloat16)
        if narrow_float or (not t.is_floating_point() and t.dtype != torch.float64):
            t = t.to(torch.float32 if t.is_floating_point() else torch.float64)
        a = t.numpy().reshape(-1)
        n = a.size
        row[0] = n
        if n == 0:
            row[3:9] = 0  # no values: sums and counts 0, min and max undefined
            return
        mn, mx, s = a.min(), a.max(), float(t.sum())
        if math.isfinite(mn) and math.isfinite(mx) and math.isfinite(s):
            row[6:9] = (0, 0, n - np.count_nonzero(a != 0))
            self._moments(a, float(mn), float(mx), s, float(np.dot(a, a)), row)
        else:
            self._nonfinite(a, row)
        idx = self.positions(n)
        samples[: len(idx)] = a[idx]

    @staticmethod
    def _moments(a: np.ndarray, mn: float, mx: float, s: float, ss: float, row: np.ndarray) -> None:
        m = a.size
        css = ss - s * s / m
        if s * s / m > 0.5 * ss:  # |mean| dominates: the one-pass formula loses digits, take two passes
            d = a - a.dtype.type(s / m)
            css = float(np.dot(d, d))
        row[1:6] = (mn, mx, s, ss, max(css, 0.0))

    def _nonfinite(self, a: np.ndarray, row: np.ndarray) -> None:
        finite = np.isfinite(a)
        nan = np.count_nonzero(np.isnan(a))
        f = a[finite].astype(np.float64)
        row[6:9] = (nan, a.size - nan - f.size, f.size - np.count_nonzero(f))
        if f.size:
            self._moments(f, float(f.min()), float(f.max()), float(f.sum()), float(np.dot(f, f)), row)
        else:  # nothing finite: no min or max, empty sums
            row[1:6] = (np.nan, np.nan, 0.0, 0.0, 0.0)
