"""Optional per-burst data collection (recompute plans, activation statistics, the memory account, time): the
registry. The contract, `Collector`, is in ortlab.engine.types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortlab.engine.refs import Ref
from ortlab.engine.types import BurstError, Collector, Config
from ortlab.errors import did_you_mean

__all__ = ["COLLECTORS", "Collector", "Registered", "check", "graph_key", "make_collectors"]


@dataclass(frozen=True)
class Registered:
    """One collector: where its class is (loaded lazily in whichever process runs the burst, built with the
    keyword arguments given in BurstConfig.collect[name]), which backends it serves and how its settings are
    checked before anything starts."""

    target: Ref[Callable[..., Collector]]  # its class, in its own package (above the engine: ortlab.engine.refs)
    serves: str | None = None  # the backend registry's flag it needs (ortlab.engine.backends.Registered); None: all
    why: str = ""  # said when a backend without it is refused
    settings: Ref[Callable[[dict[str, Any], int], object]] | None = None  # (settings, burst steps): raises on bad

    def load(self) -> Callable[..., Collector]:
        return self.target.resolve()


COLLECTORS: dict[str, Registered] = {
    # the activation-memory account (memory.json)
    "memory": Registered(Ref("ortlab.account.collector:MemoryCollector")),
    "plans": Registered(Ref("ortlab.recompute.collector:PlanCollector"), serves="onnx_stages",
                        why="it reads ORT's recompute plans"),  # the memory optimizer's recompute plans
    # per-step activation and gradient statistics
    "stats": Registered(Ref("ortlab.activations.collect:StatsCollector")),
    "time": Registered(Ref("ortlab.timing.collector:TimeCollector"),  # where a step's time goes: profiled steps
                       settings=Ref("ortlab.timing.collector:profiled_steps")),
}


def check(cfg: Config) -> None:
    """The collectors `cfg` asks for are known, serve its backend and have good settings (one line if not)."""
    from ortlab.engine.backends import BACKENDS, registered

    unknown = sorted(set(cfg.collect) - set(COLLECTORS))
    if unknown:
        raise BurstError(f"collector {unknown[0]!r} is not known; known: {', '.join(sorted(COLLECTORS))}"
                         f"{did_you_mean(unknown[0], COLLECTORS)}")
    backend = registered(cfg.backend)
    for name, settings in sorted(cfg.collect.items()):
        entry = COLLECTORS[name]
        if entry.serves is not None and not getattr(backend, entry.serves):
            served = ", ".join(n for n, r in BACKENDS.items() if getattr(r, entry.serves))
            raise BurstError(f"collector {name!r} is not allowed on backend {cfg.backend!r} ({entry.why}); allowed "
                             f"on: {served}")
        if entry.settings is not None:
            entry.settings.resolve()(settings, cfg.steps)


def make_collectors(collect: dict[str, dict[str, Any]]) -> dict[str, Collector]:
    """The collectors a burst asked for, by name (sorted, so the order is stable)."""
    return {name: COLLECTORS[name].load()(**(kwargs or {})) for name, kwargs in sorted(collect.items())}


def graph_key(collectors: dict[str, Collector]) -> tuple[str, ...]:
    """What the collectors put into the exported graph: part of what an ORTModule wrap is built for."""
    return tuple(sorted((c.graph_key or name) for name, c in collectors.items() if c.changes_graph))
