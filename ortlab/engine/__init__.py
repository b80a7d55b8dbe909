"""Bursts: the training loop in named steps (`loop`), what differs per backend (`backends`: the registry and
one module each; the ORT backend keeps its ORTModule wrap, `wrapper`), the plain types and contracts every
module shares (`types`), the worker process, its typed messages and its client (`worker`, `messages`,
`client`), and the kernel-side `Session`."""

from ortlab.engine.config import BurstConfig
from ortlab.engine.types import BurstError, Collector

__all__ = ["BurstConfig", "BurstError", "Collector", "Engine", "Session", "WorkerError"]


def __getattr__(name: str):  # torch is imported only when the loop or the session is needed
    if name == "Engine":
        from ortlab.engine.loop import Engine

        return Engine
    if name == "Session":
        from ortlab.engine.session import Session

        return Session
    if name == "WorkerError":
        from ortlab.engine.client import WorkerError

        return WorkerError
    raise AttributeError(f"module 'ortlab.engine' has no attribute {name!r}")
