"""Which of a run's step times its speed is judged by, and how that clock is said. On the CPU each step records two:
`step_time_s`, its wall time (what a person waits for), and `step_cpu_s`, the CPU time of the thread that ran it,
which other processes' turns on the cores do not touch: on a shared machine the wall time measures the neighbours
(benchmarks/step_clock.py: a step's wall time less its thread's waits for a core is off by a scheduler tick now and
then, and the process's CPU time counts ORT's intra-op threads spinning while they wait for work). On CUDA the step
time is the wall time the GPU was waited for, as before. Runs recorded before the CPU time was measured are judged by
their wall time, and say so. A leaf: the engine writes these columns, views and drivers read them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

WALL = "step_time_s"  # the step's wall time (every run)
CPU = "step_cpu_s"  # the CPU time of the thread that ran the step (CPU runs from when it was measured)

SHORT = {CPU: "CPU time (other processes excluded)", WALL: "wall time"}


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
    return "wall time (other processes' turns count: the runs did not record a step's CPU time)"
