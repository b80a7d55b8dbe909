"""Optional per-burst data collection (recompute plans, activation statistics): the protocol and the registry."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.loop import Engine

# name -> "module:Class", loaded lazily in whichever process runs the burst. A collector class is built with the
# keyword arguments given in BurstConfig.collect[name].
COLLECTORS: dict[str, str] = {
    "memory": "ortlab.account.collector:MemoryCollector",  # the activation-memory account (memory.json)
    "plans": "ortlab.recompute.collector:PlanCollector",  # the memory optimizer's recompute plans (ORTModule bursts)
    "stats": "ortlab.activations.collect:StatsCollector",  # per-step activation and gradient statistics
    "time": "ortlab.timing.collector:TimeCollector",  # where a step's time goes: profiled steps (time.json)
}


class Collector:
    """What a collector implements; every method is optional. `changes_graph = True` means its instrumentation
    is part of the exported graph, so a burst with it needs its own ORTModule wrap (`graph_key` names it).
    `times_phases = True`: the engine also calls `phase` as each step's forward, backward and optimizer begin and
    as the step ends (only such collectors: the others cost nothing there)."""

    changes_graph = False
    graph_key: str | None = None
    times_phases = False

    def start(self, engine: Engine, cfg: BurstConfig, run_dir: Path) -> None:
        """Before the first step and before ORTModule wraps the model."""

    def step_begin(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def phase(self, step: int, name: str) -> None:
        """With times_phases: "forward", "backward", "optimizer" as each begins, "end" once the step's loss is
        read (the step's time as the engine measures it ends there); a recorded loop (ortlab.record): "loop" as
        each iteration begins, "end" at its rec.step()."""

    def finish(self, engine: Engine, cfg: BurstConfig, run_dir: Path, status: str) -> None:
        """Always called (also after a failure): write results into run_dir and undo any global change."""


def make_collectors(collect: dict[str, dict]) -> dict[str, Collector]:
    """The collectors a burst asked for, by name (sorted, so the order is stable)."""
    out = {}
    for name, kwargs in sorted(collect.items()):
        module, _, attr = COLLECTORS[name].partition(":")
        out[name] = getattr(importlib.import_module(module), attr)(**(kwargs or {}))
    return out


def graph_key(collectors: dict[str, Collector]) -> tuple[str, ...]:
    """What the collectors put into the exported graph: part of what an ORTModule wrap is built for."""
    return tuple(sorted((c.graph_key or name) for name, c in collectors.items() if c.changes_graph))
