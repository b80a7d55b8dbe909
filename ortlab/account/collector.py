"""Collector "memory": a burst's activation-memory account, written into the run as memory.json.

PyTorch bursts: what autograd saves for backward in one step on the first batch, taken in start(), before the
first step (torch.compile bursts: at finish(), through the compiled module), without a trace on the burst: the
random states (torch, CUDA, numpy, Python), the model's buffers (a BatchNorm's running statistics) and its
gradients are put back afterwards, so the burst's losses are those of a burst without it. ORTModule bursts: the
account of the execution graph ORT ran, at finish(), which ORT writes only when the burst saves its graphs (the
option save_onnx).
On CUDA memory.json also holds the caching allocator's figures over the burst's steps (`allocator`: peak allocated
and reserved bytes, and at the end), read before anything the account runs: everything the process's tensors held,
beside the activation rows.
"""

from __future__ import annotations

import contextlib
import random
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortlab.account.record import AUTOGRAD, COUNTS, FILE, GRAPH, missing
from ortlab.engine.backends import label, registered
from ortlab.engine.types import Collector, MemoryAccount

# ORTModule -> its execution model: ORT writes the graphs only when it exports, and a later burst that reuses
# the wrap has none of its own.
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

NO_SAVE_ONNX = ("ORT writes its execution graph only when the burst saves its graphs: run it with save_onnx on "
                "(options={'save_onnx': True}; CLI: ortlab burst --save-graphs; the Lab: 'save exported graphs')")


class MemoryCollector(Collector):
    """Collector "memory": memory.json with the account of this burst's backend (see the module's docstring)."""

    def __init__(self):
        self._data: dict[str, Any] | None = None

    def start(self, engine, cfg, run_dir: Path) -> None:
        if registered(cfg.backend).memory is MemoryAccount.AUTOGRAD:
            self._data = _autograd(engine, cfg)

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        from ortlab.run import write_json

        allocator = _allocator(cfg)  # before the account below runs a step of its own
        account = registered(cfg.backend).memory
        if account is MemoryAccount.GRAPH:
            self._data = _graph(engine, cfg, run_dir, status)
        elif account is MemoryAccount.AUTOGRAD_RUNNER and engine.runner is not None and status == "ok":
            self._data = _autograd(engine, cfg, runner=engine.runner)  # what the burst's (compiled) graphs save
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
    try:
        import numpy as np

        numpy_state = np.random.get_state()
    except ImportError:
        np = numpy_state = None
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if np is not None:
            np.random.set_state(numpy_state)


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


def _autograd(engine, cfg, runner: Any = None) -> dict[str, Any]:

    from ortlab.account.torch_account import torch_memory
    from ortlab.compat.errors import root_message
    from ortlab.engine import precision
    from ortlab.engine.config import resolve_device

    device = resolve_device(cfg.device)
    try:
        with untouched(engine.model), precision.autocast(cfg.precision, device):
            account = torch_memory(engine.workload, device=str(device), runner=runner)
    except Exception as e:  # the account must not cost the burst
        return missing(AUTOGRAD, f"autograd's account failed: {type(e).__name__}: {root_message(e)}")
    counts = COUNTS[AUTOGRAD] if runner is None else (
        f"{label(cfg.backend)}: the storages its compiled graphs save for backward in one step on the first batch; "
        "parameters, inputs and what the loss saves apart")
    return {"kind": AUTOGRAD, "counts": counts, **account.to_dict()}


def _graph(engine, cfg, run_dir: Path, status: str) -> dict[str, Any]:
    from ortlab.account.build import account_of
    from ortlab.compat.errors import root_message
    from ortlab.run import load_run

    if not cfg.effective_options()["save_onnx"]:
        return missing(GRAPH, NO_SAVE_ONNX)
    internals = engine.current.ort_internals()  # a backend whose memory account is its ORT wrap's graph
    if internals is None:
        return missing(GRAPH, f"the burst ended ({status}) before ORTModule wrapped the model: no execution graph")
    ort_module = internals.ort_module
    if status == "fallback":
        return missing(GRAPH, "ORTModule fell back to PyTorch: no ORT execution graph ran in this burst")
    path = internals.stage_path("execution_model")
    note = None
    if path is not None:
        _GRAPHS[ort_module] = path
    elif ort_module in _GRAPHS and _GRAPHS[ort_module].is_file():
        path = _GRAPHS[ort_module]
        note = f"ORT did not export in this burst: the graph is that of the burst whose ORTModule it reused, {path}"
    else:
        return missing(GRAPH, "ORT saved no execution graph for this burst: it ended before ORT built its session, "
                              "or it reused the ORTModule of an earlier burst that did not save its graphs")
    try:
        with random_state_kept():
            inputs, _ = engine.feed.batch(0)  # this burst's first batch (its sampler's, its rank's)
        info = internals.post_export()
        account = account_of(path, load_run(run_dir), input_shapes=engine.current.graph_input_shapes(inputs),
                             user_inputs=None if info is None else info.user_inputs)
    except Exception as e:  # the account must not cost the burst
        return missing(GRAPH, f"the account of {path.name} failed: {type(e).__name__}: {root_message(e)}")
    data = {"kind": GRAPH, "counts": COUNTS[GRAPH], **account.to_dict(timeline=True)}
    if note:
        data["note"] = note
    return data
