"""What the ranks of a distributed burst tell each other every step (a checksum per parameter, the Stop flag, the
forward time and the batch's load), carried by DistributedDataParallel's own gradient all-reduce.

A DDP communication hook appends a block of world_size rows to the first gradient bucket, this rank's row in its
own slot and zeros in the others', so that the all-reduce's sum is the gather. No collective of ortlab's own runs
per step: on 2 CPU ranks one more all-gather per step cost 2-3% of the demo's step (a gloo round trip, and every
rank waiting once more for the slowest). Values travel as float32, the bucket's dtype; the checksums are exact
integers (a parameter's bits summed as int32, wrapping), sent as two 16-bit halves that float32 holds exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ortlab.kernels import sums_kernel

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Checksums:
    """Per parameter the sum of its bits read as integers (int32, wrapping), as an unsigned 32-bit number: any
    change of any bit changes it (barring a collision), and unlike a float sum it does not depend on the order of
    summation (which differs between machines that vectorize differently). The integer views are made once:
    optimizers update parameters in place, so a step costs one sum per parameter, or, when every parameter is a
    contiguous 32-bit tensor on the CPU, one call of ortlab.kernels' C loop over all of them (a torch sum per
    parameter costs ~10 us of dispatch: 0.3 ms a step on the demo's 29)."""

    def __init__(self, parameters: Sequence[torch.Tensor]):
        with torch.no_grad():
            self._views = [_bits(p.detach()) for p in parameters]
        self._kernel = None
        if self._views and all(v.dtype == torch.int32 and v.is_cpu and v.is_contiguous() for v in self._views):
            self._kernel = sums_kernel()
        if self._kernel is not None:  # the views keep the parameters' memory alive, so these addresses stay valid
            self._addresses = np.array([v.data_ptr() for v in self._views], np.int64)
            self._counts = np.array([v.numel() for v in self._views], np.int64)
            self._sums = np.zeros(len(self._views), np.uint32)

    def __call__(self) -> list[int]:
        if self._kernel is not None:
            self._kernel(self._addresses.ctypes.data, self._counts.ctypes.data, len(self._views),
                         self._sums.ctypes.data)
            return self._sums.tolist()
        with torch.no_grad():
            sums = torch.stack([v.sum(dtype=torch.int32) for v in self._views])
        return [s & 0xFFFFFFFF for s in sums.tolist()]


def _bits(t: torch.Tensor) -> torch.Tensor:
    dtype = _BITS.get(t.element_size())
    return t.view(dtype) if dtype is not None else t.contiguous().view(torch.int8)


@dataclass
class Table:
    """One step's exchange: every rank's checksums, Stop flag and figures (rows in rank order)."""

    checksums: list[list[int]]
    stop: list[bool]
    figures: list[list[float]]

    def first_difference(self) -> int | None:
        """The index of the first parameter whose checksum differs between ranks (None: all in sync)."""
        first = self.checksums[0]
        for row in self.checksums[1:]:
            if row != first:
                return next(i for i, (a, b) in enumerate(zip(first, row, strict=True)) if a != b)
        return None


class Exchange:
    """One rank's side. `post` the step's row before the backward; the comm hook (`install`) carries it in the
    first bucket's all-reduce; `collect` after the optimizer step returns the Table. When no bucket carried it
    (no float32 gradients, or the check after the last update) `collect` all-gathers it by itself."""

    def __init__(self, rank: int, world: int, n_parameters: int, n_figures: int):
        self.rank, self.world = rank, world
        self.n, self.k = n_parameters, n_figures
        self.width = 2 * n_parameters + 1 + n_figures
        self._row: torch.Tensor | None = None  # posted, not yet sent
        self._block: torch.Tensor | None = None  # world x width, once an all-reduce carried the rows

    def install(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(None, self._hook)

    def post(self, sums: list[int], stop: bool, figures: Sequence[float] = ()) -> None:
        """This rank's row for the step (figures left out are NaN)."""
        halves = [h for s in sums for h in (s >> 16, s & 0xFFFF)]
        figures = [*figures, *[math.nan] * (self.k - len(figures))]
        self._row = torch.tensor([*halves, float(stop), *figures], dtype=torch.float32)
        self._block = None

    def collect(self, device: torch.device) -> Table:
        if self._block is None:
            self._block = self._gather(device)
        block, self._block = self._block.cpu().tolist(), None
        return Table(checksums=[[(int(r[2 * i]) << 16) | int(r[2 * i + 1]) for i in range(self.n)] for r in block],
                     stop=[r[2 * self.n] != 0 for r in block], figures=[r[2 * self.n + 1:] for r in block])

    def _gather(self, device: torch.device) -> torch.Tensor:
        row, self._row = self._row.to(device), None
        everyone = torch.empty(self.world * self.width, dtype=torch.float32, device=device)
        dist.all_gather_into_tensor(everyone, row)
        return everyone.view(self.world, self.width)

    def _hook(self, group, bucket):  # unannotated: DDP checks a hook's annotations against its own classes
        """DDP's default averaging all-reduce (`allreduce_hook`), the posted row riding along on the first bucket
        (DDP starts buckets in the same order on every rank, so every rank's first call is the same bucket)."""
        grads = bucket.buffer()
        grads.div_(self.world)
        row, n = self._row, grads.numel()
        if row is None or grads.dtype != torch.float32:
            return dist.all_reduce(grads, async_op=True).get_future().then(lambda fut: fut.value()[0])
        self._row = None
        block = torch.zeros(self.world, self.width, dtype=torch.float32, device=grads.device)
        block[self.rank] = row.to(grads.device)
        joined = torch.cat([grads, block.view(-1)])

        def split(fut: torch.futures.Future) -> torch.Tensor:
            out = fut.value()[0]
            self._block = out[n:].view(self.world, self.width)
            return out[:n]

        return dist.all_reduce(joined, async_op=True).get_future().then(split)
