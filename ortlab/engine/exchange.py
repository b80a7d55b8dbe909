"""What the ranks of a distributed burst tell each other every step (a checksum per parameter, the Stop flag, the
forward time and the batch's load), carried by DistributedDataParallel's own gradient all-reduce.

The rows ride as the gradient of a parameter of ortlab's own (the rider, world_size rows wide), which DDP buckets
and all-reduces with the model's gradients: each rank's backward gives the rider a block with this rank's row in
its own slot and zeros in the others', so that the all-reduce's sum is the gather. No collective of ortlab's own
and no Python communication hook run per step: on 2 CPU ranks one more all-gather per step cost 2-3% of the demo's
step, and a Python hook in place of DDP's built-in all-reduce (with its own division and copy of the bucket) 1-3%.
Values travel as float32, the gradients' dtype; the checksums are exact integers (a parameter's bits summed as
int32, wrapping), sent as two 16-bit halves that float32 holds exactly (DDP's averaging, undone here, moves them by
far less than the rounding to integers that follows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ortlab.common.kernels import sums_kernel

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Checksums:
    """Per parameter the sum of its bits read as integers (int32, wrapping), as an unsigned 32-bit number: any
    change of any bit changes it (barring a collision), and unlike a float sum it does not depend on the order of
    summation (which differs between machines that vectorize differently). The integer views are made once:
    optimizers update parameters in place, so a step costs one sum per parameter, or, when every parameter is a
    contiguous 32-bit tensor on the CPU, one call of ortlab.common.kernels' C loop over all of them (a torch sum per
    parameter costs ~10 us of dispatch: 0.3 ms a step on the demo's 29)."""

    def __init__(self, parameters: Sequence[torch.Tensor]):
        with torch.no_grad():
            self._views = [_bits(p.detach()) for p in parameters]
        self._kernel = None
        if self._views and all(v.dtype == torch.int32 and v.is_cpu and v.is_contiguous() for v in self._views):
            self._kernel = sums_kernel()
        if self._kernel is not None:  # the views keep the parameters' memory alive, so these addresses stay valid
            self._addresses: np.ndarray = np.array([v.data_ptr() for v in self._views], np.int64)
            self._counts: np.ndarray = np.array([v.numel() for v in self._views], np.int64)
            self._sums: np.ndarray = np.zeros(len(self._views), np.uint32)

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
    """One rank's side. The model trains inside `carrier(module)` (DDP wraps the carrier, so that the rider is one of
    its parameters); `post` the step's row before the backward and backward through `ride(loss)`; `collect` after
    the backward returns the Table. A row posted without a backward (the check after the last update) is
    all-gathered by `collect` itself."""

    def __init__(self, rank: int, world: int, n_parameters: int, n_figures: int):
        self.rank, self.world = rank, world
        self.n, self.k = n_parameters, n_figures
        self.width = 2 * n_parameters + 1 + n_figures
        self.rider: torch.nn.Parameter | None = None
        self._row: torch.Tensor | None = None  # posted, not yet sent
        self._carried = False  # the posted row rides in this step's backward

    def carrier(self, module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """`module` with the rider beside it, to be wrapped by DistributedDataParallel."""
        self.rider = torch.nn.Parameter(torch.zeros(self.world * self.width, device=device))
        return _Carrier(module, self.rider)

    def post(self, sums: list[int], stop: bool, figures: Sequence[float] = ()) -> None:
        """This rank's row for the step (figures left out are NaN)."""
        halves = [h for s in sums for h in (s >> 16, s & 0xFFFF)]
        figures = [*figures, *[math.nan] * (self.k - len(figures))]
        self._row = torch.tensor([*halves, float(stop), *figures], dtype=torch.float32)
        self._carried = False

    def ride(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss`, unchanged, with the rider's gradient attached: the posted row (zeros when nothing was posted; DDP
        expects a gradient for every parameter in every backward)."""
        if self.rider is None:
            raise RuntimeError("ride() before carrier(): the rider parameter does not exist yet")
        block = torch.zeros(self.world, self.width, dtype=torch.float32, device=self.rider.device)
        if self._row is not None:
            block[self.rank] = self._row.to(self.rider.device) * self.world  # DDP averages: the sum is what is sent
            self._carried = True
        return _Ride.apply(loss, self.rider, block.view(-1))

    def collect(self, device: torch.device) -> Table:
        if self._carried and self.rider is not None and self.rider.grad is not None:  # ride() ran
            block = self.rider.grad.view(self.world, self.width)
            self.rider.grad = None
        else:
            block = self._gather(device)
        self._row, self._carried = None, False
        rows = block.cpu().tolist()
        return Table(checksums=[[(round(r[2 * i]) << 16) | round(r[2 * i + 1]) for i in range(self.n)] for r in rows],
                     stop=[round(r[2 * self.n]) != 0 for r in rows], figures=[r[2 * self.n + 1:] for r in rows])

    def _gather(self, device: torch.device) -> torch.Tensor:
        if self._row is None:
            raise RuntimeError("collect() before post(): no row to send")
        row = self._row.to(device)
        everyone = torch.empty(self.world * self.width, dtype=torch.float32, device=device)
        dist.all_gather_into_tensor(everyone, row)
        return everyone.view(self.world, self.width)


class _Carrier(torch.nn.Module):
    """The trained module and the rider: DDP's parameters are the module's and the rider."""

    def __init__(self, module: torch.nn.Module, rider: torch.nn.Parameter):
        super().__init__()
        self.module = module
        self.rider = rider

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class _Ride(torch.autograd.Function):
    """The identity on the loss whose backward gives the rider its block."""

    @staticmethod
    def forward(ctx, loss, rider, block):
        ctx.save_for_backward(block)
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        (block,) = ctx.saved_tensors
        return grad, block, None
