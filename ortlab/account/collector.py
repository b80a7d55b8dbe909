"""Collector "memory": a burst's activation-memory account, written into the run as memory.json.

What is accounted is the burst's backend's memory account, an adapter its registry entry names
(ortlab.account.sources): what autograd saves in one step (PyTorch: before the burst; torch.compile: after it,
through the compiled module), or the execution graph ORT ran (ORTModule, which ORT writes only when the burst saves
its graphs: the option save_onnx). An account taken inside the process leaves no trace on the burst: the random
states (torch, CUDA, numpy, Python), the model's buffers and its gradients are put back afterwards (`untouched`).
On CUDA memory.json also holds the caching allocator's figures over the burst's steps (`allocator`: peak allocated
and reserved bytes, and at the end), read before anything the account runs: everything the process's tensors held,
beside the activation rows.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortlab.engine.backends import registered
from ortlab.engine.types import Collector
from ortlab.runs.memory import AUTOGRAD, FILE, missing


class MemoryCollector(Collector):
    """Collector "memory": memory.json with the account of this burst's backend (see the module's docstring)."""

    def __init__(self) -> None:
        self._data: dict[str, Any] | None = None

    def start(self, engine, cfg, run_dir: Path) -> None:
        self._data = registered(cfg.backend).memory.resolve()().before(engine, cfg)

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        from ortlab.runs.run import write_json

        allocator = _allocator(cfg)  # before the account below runs a step of its own
        after = registered(cfg.backend).memory.resolve()().after(engine, cfg, run_dir, status)
        if after is not None:
            self._data = after
        elif self._data is None:
            self._data = missing(AUTOGRAD, f"the burst ended ({status}) before the account was taken")
        write_json(run_dir / FILE, {**self._data, "allocator": allocator} if allocator else self._data)


def _allocator(cfg) -> dict[str, int] | None:
    """The CUDA allocator's figures since the burst's steps began (the engine resets its peaks there); None on the
    CPU."""
    from ortlab.engine.config import resolve_device
    from ortlab.engine.peak import PeakMemory

    return PeakMemory(resolve_device(cfg.device)).allocator()


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Inside the block, draw random numbers freely: torch's (CPU and CUDA), numpy's and Python's random states
    are put back afterwards."""
    import torch

    py, cpu = random.getstate(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    numpy_random: Any = None
    with contextlib.suppress(ImportError):
        import numpy

        numpy_random = numpy.random
    numpy_state = numpy_random.get_state() if numpy_random is not None else None
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if numpy_random is not None:
            numpy_random.set_state(numpy_state)


@contextlib.contextmanager
def untouched(model) -> Iterator[None]:
    """Run a forward and backward of `model` inside the block, and leave no trace: random states, buffers and
    gradients are what they were before (gradients cloned: backward may add into them in place)."""
    import torch

    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    try:
        with random_state_kept():
            yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for p, g in grads:
            p.grad = g
