"""A rank's time in communication (ortlab.engine.ranks): how long in each step a collective was in flight.

Every collective the strategies issue from Python is timed where torch.distributed names it: DDP's gradient
all-reduce once its reducer hands each bucket to a comm hook (torch's own `allreduce_hook`, the same average),
ZeRO-1's broadcasts of the updated shards, FSDP2's all-gathers and reduce-scatters. A collective is in flight from
its call until its work completes (an asynchronous one's future, a synchronous one's return); a step's time in
communication is the union of those intervals within the step, so overlapping buckets count once and the share of
the step is at most 1. It includes the time waiting for the slowest rank inside a collective. No profiler: two
clock reads and a future callback per collective."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

# the collectives timed, where this torch has them (FSDP2 in 2.14 calls all_gather_single / reduce_scatter_single)
TIMED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
         "reduce_scatter_tensor", "reduce_scatter_single", "_all_gather_base", "_reduce_scatter_base")


class CommClock:
    """The intervals during which collectives were in flight, since the last `begin()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a future's callback runs on the backend's thread
        self._spans: list[tuple[float, float]] = []
        self._since = 0.0
        self._undo: list[Callable[[], None]] = []

    def begin(self) -> None:
        """A step begins: forget what came before."""
        with self._lock:
            self._spans, self._since = [], time.perf_counter()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._spans.append((max(start, self._since), end))

    def seconds(self) -> float:
        """The time since `begin()` with at least one collective in flight (the union of their intervals)."""
        with self._lock:
            spans = sorted(s for s in self._spans if s[1] > s[0])
        total, reach = 0.0, float("-inf")
        for start, end in spans:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    def timed(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        """`collective` timed: until its work's future completes (async_op=True), else until it returns."""
        @functools.wraps(collective)
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            work = collective(*args, **kwargs)
            if work is None:  # async_op=False: done as it returns
                self.add(start, time.perf_counter())
                return work
            try:
                work.get_future().then(lambda _: self.add(start, time.perf_counter()))
            except Exception:  # a work without a future: its launch is all that can be timed
                self.add(start, time.perf_counter())
            return work

        return call

    def install(self) -> CommClock:
        """Time torch.distributed's collectives in this process (the rank's own: nothing else runs in it)."""
        import torch.distributed as dist

        for name in TIMED:
            original = getattr(dist, name, None)
            if original is None or getattr(original, "_ortlab_timed", False):
                continue
            wrapped = self.timed(original)
            wrapped._ortlab_timed = True  # type: ignore[attr-defined]
            setattr(dist, name, wrapped)
            self._undo.append(functools.partial(setattr, dist, name, original))
        return self

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def hook_ddp(ddp: Any) -> None:
    """DDP's gradient all-reduce through torch's `allreduce_hook` (the same average: each bucket divided by the world
    size, then summed), so that it goes through torch.distributed.all_reduce, which the clock times; DDP's own C++
    reducer would not."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.allreduce_hook)


def step_fields(comm_s: float, step_s: float) -> dict[str, float]:
    """The step row's figures: seconds with a collective in flight, and their share of the step."""
    return {"comm_s": comm_s, "comm_share": min(1.0, comm_s / step_s) if step_s > 0 else 0.0}


__all__ = ["CommClock", "hook_ddp", "step_fields"]
