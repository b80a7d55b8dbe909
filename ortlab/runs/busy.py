"""Whether a run's timings were taken beside other work, read from the record of its machine in meta.json
(written by the engine: ortlab.engine.machine): a leaf, so that a run's summary says it without importing the
engine."""

from __future__ import annotations

from typing import Any

BUSY_WAIT = 0.10  # the share of a burst's time spent waiting for a core above which other work competed for them
BUSY_LOAD = 1.0  # (runs that did not measure the wait) the load average before a burst, per core


def busy(machine: dict[str, Any] | None) -> str | None:
    """Why a burst's timings are not representative, or None: the share of its time it waited for a core
    (`cpu_wait`, measured over the burst), or, for runs without it, the load average before it began."""
    machine = machine or {}
    wait = machine.get("cpu_wait")
    if wait is not None:
        return f"it waited for a core {wait:.0%} of the time" if wait > BUSY_WAIT else None
    cores, load = machine.get("cores"), machine.get("load")
    if cores and load is not None and load > BUSY_LOAD * cores:
        return f"load average {load:.1f} on {cores} core{'s' if cores > 1 else ''} before it began"
    return None
