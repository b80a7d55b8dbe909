"""Which of a run's step times its speed is judged by, and how that clock is said. Every step records its wall time,
`step_time_s` (what a person waits for). A step on the CPU that runs on one thread (torch's intra-op threads: 1, by
the burst's `threads` setting or OMP_NUM_THREADS=1) also records `step_cpu_s`, the CPU time of that thread, which
other processes' turns on the cores do not touch, and is judged by it: on a shared machine the wall time measures the
neighbours. With more threads the CPU time measures them too (each thread spins at the end of an op for the others,
which wait for a core) and favours whichever backend spins less on the calling thread, so such steps keep the wall
time, with the machine's load in their noise (benchmarks/step_clock.py measured every candidate: a step's wall time
less its thread's waits for a core is off by a scheduler tick now and then; the process's CPU time counts ORT's
intra-op threads spinning). On CUDA the step time is the wall time the GPU was waited for, as before. Runs recorded
before the CPU time are judged by their wall time, and say so. A leaf: the engine writes these columns, views and
drivers read them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

WALL = "step_time_s"  # the step's wall time (every run)
CPU = "step_cpu_s"  # the CPU time of the thread that ran the step (CPU runs from when it was measured)

SHORT = {CPU: "CPU time", WALL: "wall time"}  # a table's cell: "median step" was timed by it


def column(metrics: Any) -> str:
    """The column a run's speed is judged by: the step's CPU time where every step has it, else the wall time."""
    if metrics is not None and CPU in metrics and len(metrics) and not metrics[CPU].isna().any():
        return CPU
    return WALL


def common(columns: Iterable[str]) -> str:
    """The clock several runs can be compared by: the CPU time only when all of them have it."""
    columns = list(columns)
    return CPU if columns and all(c == CPU for c in columns) else WALL


def said(chosen: str, device: str | None = None) -> str:
    """The clock in words, for a recommendation or a noise; why wall time where it is the wall time."""
    if chosen == CPU:
        return "each step's CPU time on its thread (other processes do not count)"
    if device == "cuda":
        return "wall time (the GPU's work waited for)"
    return ("wall time (other processes' turns count: a step's CPU time is recorded when it runs on one thread: "
            "--threads 1, threads=1, or threads 1 in the Lab's Burst panel)")
