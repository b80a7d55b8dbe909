"""Record a training loop the user already has, with or without ORTModule, as a run folder every view reads.

    with ortlab.record(model, out="runs", collect={"stats": {}}) as rec:   # nn.Module, ORTModule, torch.compile
        for batch in loader:
            loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
            rec.step(loss=loss)

It runs in the user's process by design and only observes: it never changes the training (losses are the same
with and without it). Create it before the first step: an ORTModule's statistics hooks must be in place when it
exports.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab import _ort
from ortlab.common import held
from ortlab.errors import InputError
from ortlab.options import Options
from ortlab.runs.run import RunStatus
from ortlab.wrapping import info_of

HANGING_LEVELS = ("INFO", "DEVINFO", "VERBOSE")


class RecordError(InputError):
    """A recorder that cannot start as asked."""


@dataclass
class _Trained:
    """What collectors read of the backend that trains (an Engine's `current` backend, the contract's methods
    ortlab.engine.types.Backend names for them): the user's own ORTModule, if the loop trains one."""

    ort_module: Any = None

    def ort_internals(self) -> _ort.Wrap | None:
        return None if self.ort_module is None else _ort.Wrap(self.ort_module, True)

    def graph_input_shapes(self, inputs: Any) -> dict[str, list[int]]:
        return {}  # read only by the memory account, which a recorded loop does not run


@dataclass
class _Host:
    """What a collector sees of the process that trains: the user's torch module and its backend."""

    model: Any
    current: _Trained


def _in_jupyter_kernel() -> bool:
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return bool(get) and type(get()).__name__ == "ZMQInteractiveShell"


class Recorder:
    """Writes metrics per step, ORT's options, overhead and transitions (for an ORTModule), a log of ORT's
    Python logger, the collectors' data, and the exported graphs when ORT saved them."""

    def __init__(self, model: Any, out: str | Path = "runs", collect: dict[str, dict] | None = None,
                 name: str | None = None, batch_size: int | None = None, origin: str = "recorded loop",
                 meta: dict[str, Any] | None = None):
        import torch

        if not isinstance(model, torch.nn.Module):
            raise RecordError(f"model {type(model).__name__} is not allowed; allowed: a torch.nn.Module, an "
                              "ORTModule or a torch.compile'd module")
        self.ortmodule = _ort.is_ortmodule(model)
        if self.ortmodule and _in_jupyter_kernel() and _ort.log_level(model) in HANGING_LEVELS:
            raise RecordError(f"ORTModule log level {_ort.log_level(model)} hangs a Jupyter kernel (ORT's C++ output "
                              "fills the kernel's pipe); build it with DebugOptions(log_level=LogLevel.WARNING), or "
                              "run the loop as a script, or use ortlab.Session bursts (they run in a worker)")
        collect = checked_collect(collect)
        from ortlab._dynamo import compiled_inner
        from ortlab.engine.config import BurstConfig

        compiled = compiled_inner(model)
        self.model = model
        self.inner = _ort.inner_module(model) if self.ortmodule else compiled if compiled is not None else model
        backend = "ortmodule" if self.ortmodule else "compile" if compiled is not None else "pytorch"
        self.cfg = BurstConfig(backend=backend, out=str(out), name=name, collect=collect,
                               options=Options.from_environ())
        self.batch_size = batch_size
        self.origin, self.extra_meta = origin, dict(meta or {})
        self.path: Path | None = None
        self.steps = 0

    # -- the context

    def __enter__(self) -> Recorder:
        import torch

        from ortlab.engine.collectors import make_collectors
        from ortlab.engine.peak import PeakMemory
        from ortlab.runs.run import RunWriter, new_run_dir
        from ortlab.stacks.table import recorded
        from ortlab.stacks.versions import versions

        device = next((p.device for p in self.inner.parameters()), torch.device("cpu"))
        self.collectors = make_collectors(self.cfg.collect)
        label = "recorded" if self.origin == "recorded loop" else self.origin.rpartition(".")[2].lower()
        self.path = new_run_dir(self.cfg.out, self.cfg.backend, self.cfg.name or f"{label}-{self.cfg.backend}")
        params = sum(p.numel() for p in self.inner.parameters())
        self.writer = RunWriter(self.path, {
            "backend": self.cfg.backend, "recorded": True, "config": self.cfg.to_dict(),
            "effective_options": self._options().to_dict(),
            "model": {"factory": self.origin, "name": type(self.inner).__name__,
                      "class": type(self.inner).__qualname__,
                      "parameters": params, "batch_size": self.batch_size},
            "device": str(device), "versions": versions(), "stack": recorded(), "pid": os.getpid(), **self.extra_meta,
        })
        # ORT's loggers into the run's log.txt, with what ortlab.wrap held back from the notebook before it
        self._log_context = held.run_log(self.path / "log.txt")
        self._log_context.__enter__()
        self.memory = PeakMemory(device)
        self.memory.reset()
        self.transitions: list[dict[str, Any]] = []
        self._export = _ort.Wrap(self.model, True).exported_model() if self.ortmodule else None
        self._started = time.time()
        for c in self.collectors.values():
            c.start(self._host(), self.cfg, self.path)
            c.step_begin(0)
        self.timers = [c for c in self.collectors.values() if c.times_phases]  # one phase: the loop's iteration
        for c in self.timers:
            c.phase(0, "loop")
        self._last = time.perf_counter()
        return self

    def _host(self) -> _Host:
        return _Host(self.inner, _Trained(self.model if self.ortmodule else None))

    def step(self, loss: Any = None, **metrics: Any) -> None:
        """One training step ended: its loss (a tensor or a number) and any other numbers to keep."""
        for c in self.timers:
            c.phase(self.steps, "end")
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        row: dict[str, Any] = {"step": self.steps, "loss": _number(loss), "step_time_s": elapsed,
                               "samples_per_s": self.batch_size / elapsed if self.batch_size and elapsed > 0 else None,
                               **self.memory.figures()}
        row.update({k: _number(v) for k, v in metrics.items()})
        if self.ortmodule:
            self._note_export(row)
        for c in self.collectors.values():
            c.step_end(self.steps)
        self.writer.step(row)
        self.steps += 1
        for c in self.collectors.values():
            c.step_begin(self.steps)
        for c in self.timers:
            c.phase(self.steps, "loop")

    def __exit__(self, exc_type, exc, tb) -> None:
        status = RunStatus.OK if exc_type is None else RunStatus.INTERRUPTED if exc_type is KeyboardInterrupt \
            else RunStatus.FAILED
        extra: dict[str, Any] = {}
        if exc is not None:
            extra["error"] = f"the recorded loop ended at step {self.steps} with {type(exc).__name__}: {exc}"
        for c in self.collectors.values():
            try:
                c.finish(self._host(), self.cfg, self.path, status)
            except Exception as e:  # a collector must not lose the run
                extra.setdefault("collector_errors", []).append(f"{type(c).__name__}: {e}")
        self._log_context.__exit__(None, None, None)
        if self.ortmodule:
            self._write_ort_files()
            wrapped = info_of(self.model)
            if wrapped is not None:  # ortlab.wrap's fixes, as a burst records its own
                extra["fixes"] = {k: v for k, v in wrapped.to_dict().items() if k != "options"}
            error = _ort.Wrap(self.model, True).fallback()
            if error is not None:  # the user's ORTModule ran their loop on PyTorch: never "ok"
                from ortlab.compat.errors import fallback_record

                extra["fallback"] = fallback_record(error, None)
                if status == RunStatus.OK:
                    status = RunStatus.FALLBACK
                    extra["error"] = f"ORTModule fell back to PyTorch: {extra['fallback']['reason']}"
        if self.steps:
            from ortlab.verdict import state

            state.write(self.inner, self.path)  # what ortlab.judge compares of two recorded loops
        self.memory.close()
        self.writer.finish(status, **extra)

    # -- ORTModule

    def _options(self) -> Options:
        if not self.ortmodule:
            return Options()
        save, folder, prefix = _ort.onnx_save_settings(self.model)
        extra = {"log_level": _ort.log_level(self.model)}
        if save:
            extra.update(save_onnx=True, save_onnx_path=folder, onnx_prefix=prefix)
        wrapped = info_of(self.model)  # ortlab.wrap's options, which it sets around each forward
        return (wrapped.options if wrapped is not None else Options.from_environ()).replace(**extra)

    def _note_export(self, row: dict[str, Any]) -> None:
        info = _ort.Wrap(self.model, self.inner.training).exported_model()
        if info is not None and info is not self._export:
            self._export = info
            row["exported"] = True
            first = not self.transitions
            self.transitions.append({"run": self.path.name, "step": self.steps,
                                     "action": "wrap" if first else "re-export",
                                     "reason": "first export" if first else "ORT exported again mid-loop",
                                     "changes": {}, "ort_exported": True})

    def _write_ort_files(self) -> None:
        wrap = _ort.Wrap(self.model, True)
        info: dict[str, Any] = {"exported": bool(self.transitions)}
        for key, read in (("post_export", lambda: (wrap.post_export() or None) and wrap.post_export().to_dict()),
                          ("overhead", wrap.init_overhead), ("fallback", lambda: _fallback(wrap))):
            try:
                info[key] = read()
            except Exception as e:  # ORT's state may be missing after a failure
                info[key] = None
                info.setdefault("unreadable", {})[key] = f"{type(e).__name__}: {e}"
        self.writer.write("ort.json", info)
        self.writer.write("transitions.json", self.transitions)
        save, folder, _ = _ort.onnx_save_settings(self.model)
        if save:  # a copy of the stage graphs ORT wrote during the loop, where the Graphs view looks
            fresh = [f for f in Path(folder).glob("*.onnx") if f.stat().st_mtime >= self._started - 1]
            if fresh:
                (self.path / "onnx").mkdir(exist_ok=True)
                for f in fresh:
                    shutil.copy2(f, self.path / "onnx" / f.name)


def checked_collect(collect: dict[str, dict] | None) -> dict[str, dict]:
    """The collectors a recorded loop can run ("stats", "time"), their settings checked."""
    collect = dict(collect or {})
    if set(collect) - {"stats", "time"}:
        raise RecordError(f"collect {sorted(collect)} is not allowed for a recorded loop; allowed: 'stats', 'time'")
    if "time" in collect:
        from ortlab.timing.collector import profiled_steps

        profiled_steps(collect["time"], None)
    return collect


def _fallback(wrap: _ort.Wrap) -> str | None:
    from ortlab.compat.errors import root_message

    exc = wrap.fallback()
    return None if exc is None else f"{type(exc).__name__}: {root_message(exc)}"


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().float().item()
    value = float(value)
    return value if math.isfinite(value) else None


def record(model: Any, out: str | Path = "runs", collect: dict[str, dict] | None = None, name: str | None = None,
           batch_size: int | None = None) -> Recorder:
    """A recorder for the loop that trains `model` (see the module docstring); use it as a context manager."""
    return Recorder(model, out=out, collect=collect, name=name, batch_size=batch_size)
