"""The machine a burst runs on, as far as its timings go: the cores this process actually gets (its CPU affinity and
a container's CPU quota, not the host's count), torch's threads fitted to them, and what a run records of the
machine (whether it was busy is read from that record by ortlab.runs.busy).
Threads beyond the cores spin against each other (torch's and ORT's pools, other jobs' threads) and a step can
take 10-50x as long; a summary that does not say so compares noise.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabWarning
from ortlab.runs.clock import CPU, WALL


class OversubscribedWarning(OrtlabWarning):
    """More ranks than cores: they share the cores and their timings say little."""


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def _cgroup_quota() -> float | None:
    try:  # cgroup v2: "max 100000" or "200000 100000"
        limit, every = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(every)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def fit_threads(threads: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """Set torch's intra-op threads for a burst and describe the machine for the run's meta: cores, threads, who
    chose them, the load average before the burst (`Contention` adds how long the burst waited for a core).
    `threads` (the burst's setting, on the CPU): that many; else torch's capped at the cores this process gets
    (unless the user set OMP_NUM_THREADS). The caller restores torch's threads after a burst with a setting."""
    import torch

    cores = available_cores()
    note = None
    if threads is not None and device != "cpu":
        note = f"threads {threads} ignored: the step runs on {device}, timed by the wall time it waits for"
    if threads is not None and device == "cpu":
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        chosen = "threads setting"
    elif os.environ.get("OMP_NUM_THREADS"):
        chosen = "OMP_NUM_THREADS"
    elif torch.get_num_threads() > cores:
        torch.set_num_threads(cores)
        chosen = "ortlab (the cores this process gets)"
    else:
        chosen = "torch's default"
    machine = {"cores": cores, "threads": torch.get_num_threads(), "threads_from": chosen, "load": load_average()}
    return {**machine, "threads_note": note} if note else machine


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable processes), None where the system has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def cpu_wait_seconds() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core (the kernel's schedstat): what other
    work on the machine cost it. None where the kernel does not say."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


_warned: set[int] = set()


def warn_oversubscribed(ranks: int) -> None:
    """Warn (once per process and rank count) when ranks on this machine outnumber its cores."""
    cores = available_cores()
    if ranks > cores and ranks not in _warned:
        _warned.add(ranks)
        warnings.warn(f"{ranks} ranks on {cores} core{'s' if cores > 1 else ''}: they take turns on the cores, so "
                      "each step takes several times as long and the timings say little about the model",
                      OversubscribedWarning, stacklevel=3)


class StepClock:
    """A step's wall time and, with `cpu` (a step on the CPU), the CPU time of the thread that runs it, which other
    processes' turns on the cores leave out (ortlab.runs.clock). `start()` before the step, `stop()` after it, in the
    same thread: the row's columns."""

    def __init__(self, cpu: bool):
        self.cpu = cpu
        self._wall, self._cpu = 0.0, 0.0

    def start(self) -> None:
        self._cpu = time.thread_time() if self.cpu else 0.0
        self._wall = time.perf_counter()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall
        return {WALL: wall, CPU: time.thread_time() - self._cpu} if self.cpu else {WALL: wall}


class Contention:
    """The share of a burst's wall time its thread spent waiting for a core, from `start()` to `share()`."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        self._wait, self._wall = cpu_wait_seconds(), time.monotonic()

    def share(self) -> float | None:
        wait, wall = cpu_wait_seconds(), time.monotonic() - self._wall
        if wait is None or self._wait is None or wall <= 0:
            return None
        return round((wait - self._wait) / wall, 3)
