"""Bursts: the training loop in named steps (`loop`), the ORTModule wrapper and its transitions (`wrapper`),
the worker process and its typed messages (`worker`, `messages`), and the kernel-side `Session`."""

from ortlab.engine.collectors import Collector
from ortlab.engine.config import BurstConfig, BurstError

__all__ = ["BurstConfig", "BurstError", "Collector", "Engine", "Session", "WorkerError"]


def __getattr__(name: str):  # torch is imported only when the loop or the session is needed
    if name == "Engine":
        from ortlab.engine.loop import Engine

        return Engine
    if name in ("Session", "WorkerError"):
        from ortlab.engine import session as _session

        return getattr(_session, name)
    raise AttributeError(f"module 'ortlab.engine' has no attribute {name!r}")
