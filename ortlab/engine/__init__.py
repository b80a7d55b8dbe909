"""Bursts: the training loop in named steps (`loop`), what differs per backend (`backends`: the registry and
one module each; the ORT backend keeps its ORTModule wrap, `wrapper`), the plain types and contracts every
module shares (`types`), the worker process, its typed messages and its client (`worker`, `messages`,
`client`), the kernel-side `Session`, how evenly ranks were loaded (`balance`) and what runs on this machine
(`diagnosis`, `ortlab doctor`)."""

from ortlab.common.lazy import lazy as _lazy
from ortlab.engine.config import BurstConfig
from ortlab.engine.types import BurstError, Collector

__all__ = ["BurstConfig", "BurstError", "Collector", "Engine", "Session", "WorkerError"]

# torch is imported only when the loop or the session is needed
__getattr__, __dir__ = _lazy(__name__, {"Engine": "ortlab.engine.loop", "Session": "ortlab.engine.session",
                                        "WorkerError": "ortlab.engine.client"}, globals())
