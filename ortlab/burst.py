"""The training loop: a burst of N steps on one backend, from the same snapshot every time, written as a run."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ortlab.capture import captured_output, parse_feature_table
from ortlab.options import Options, ReadAt
from ortlab.run import RunWriter, new_run_dir
from ortlab.snapshot import Snapshot
from ortlab.workload import ModelRef, call_model, to_device
from ortlab.wrapper import Transition, Wrapper, failure_stage, root_message

BACKENDS = ("pytorch", "ortmodule")

# Optional per-burst data collection, by name -> "module:Class". A collector class is built with the
# keyword arguments given in BurstConfig.collect[name] and implements Collector below. Loaded lazily, in
# whichever process runs the burst.
COLLECTORS: dict[str, str] = {
    "plans": "ortlab.recompute:PlanCollector",  # the memory optimizer's recompute plans (ORTModule bursts)
    "stats": "ortlab.activations.collect:StatsCollector",  # per-step activation and gradient statistics
}
OPTIMIZERS = ("adamw", "sgd", "fused_adam", "fp16_optimizer")
PRECISIONS = ("fp32", "fp16")
DEVICES = ("auto", "cpu", "cuda")


class BurstError(ValueError):
    """A burst that cannot start as asked (bad argument, device or optimizer not available here)."""


@dataclass(frozen=True)
class BurstConfig:
    backend: str = "ortmodule"
    steps: int = 20
    options: Options = field(default_factory=Options)
    optimizer: str = "adamw"
    lr: float = 1e-3
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    parity: bool = False
    out: str = "runs"
    name: str | None = None
    collect: dict[str, dict[str, Any]] = field(default_factory=dict)  # collector name -> its keyword arguments

    def __post_init__(self):
        def check(label, value, allowed):
            if value not in allowed:
                raise BurstError(f"{label} {value!r} is not allowed; allowed: {', '.join(allowed)}")

        check("backend", self.backend, BACKENDS)
        check("optimizer", self.optimizer, OPTIMIZERS)
        check("precision", self.precision, PRECISIONS)
        check("device", self.device, DEVICES)
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise BurstError(f"steps {self.steps!r} is not allowed; allowed: a whole number >= 1")
        if not (isinstance(self.lr, int | float) and self.lr > 0):
            raise BurstError(f"lr {self.lr!r} is not allowed; allowed: a number > 0")
        if not isinstance(self.options, Options):
            object.__setattr__(self, "options", Options(self.options))
        unknown = sorted(set(self.collect) - set(COLLECTORS))
        if unknown:
            raise BurstError(f"collector {unknown[0]!r} is not known; known: {', '.join(sorted(COLLECTORS))}")

    def effective_options(self) -> Options:
        """The options ORT runs with: parity mode turns the compute optimizer off (exact PyTorch compute)."""
        return self.options.replace(enable_compute_optimizer=False) if self.parity else self.options

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = self.options.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BurstConfig:
        return cls(**{**d, "options": Options(d.get("options") or {})})


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise BurstError("device 'cuda' is not available here: torch sees no CUDA GPU; use device='cpu' or 'auto'")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def make_optimizer(name: str, params, lr: float, device: torch.device):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if device.type != "cuda":
        raise BurstError(f"optimizer {name!r} is not available on the CPU: ORT's {name} runs CUDA kernels only; "
                         "use adamw or sgd here")
    if name == "fused_adam":
        from onnxruntime.training.optim import FusedAdam

        return FusedAdam(params, lr=lr)
    raise BurstError("optimizer 'fp16_optimizer' wraps a DeepSpeed or Apex optimizer; ortlab trains with "
                     "torch.autocast + GradScaler for fp16 instead (precision='fp16')")


class Collector:
    """What a collector implements; every method is optional. `changes_graph = True` means its instrumentation
    is part of the exported graph, so a burst with it needs its own ORTModule wrap."""

    changes_graph = False

    def start(self, engine: Engine, cfg: BurstConfig, run_dir: Path) -> None:
        """Before the first step and before ORTModule wraps the model."""

    def step_begin(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def finish(self, engine: Engine, cfg: BurstConfig, run_dir: Path, status: str) -> None:
        """Always called (also after a failure): write results into run_dir and undo any global change."""


def _make_collectors(cfg: BurstConfig) -> list[Collector]:
    import importlib

    out = []
    for name, kwargs in sorted(cfg.collect.items()):
        module, _, attr = COLLECTORS[name].partition(":")
        out.append(getattr(importlib.import_module(module), attr)(**(kwargs or {})))
    return out


class _PeakMemory:
    """Peak memory of this process: CUDA allocator peak, or on the CPU the peak resident set (VmHWM), which is
    coarse: it counts every allocation of the process, not only the model's. Read per step, so it must be cheap:
    one pread of an open /proc file (~10 us)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._fd: int | None = None
        if not self.cuda:
            with contextlib.suppress(OSError):
                self._fd = os.open("/proc/self/status", os.O_RDONLY)

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)

    def peak_mb(self) -> float | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        if self._fd is not None:
            status = os.pread(self._fd, 4096, 0)
            at = status.find(b"VmHWM:")
            if at >= 0:
                return int(status[at + 6 : status.find(b"kB", at)]) / 1024
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def _parity(model: torch.nn.Module, enabled: bool, seed: int) -> Iterator[None]:
    """Seeds always; with parity also dropout 0 and deterministic algorithms, all restored afterwards."""
    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed)
    if not enabled:
        yield
        return
    saved_p = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            saved_p[name] = module.p
            module.p = 0.0
    saved_det = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved_det[0], warn_only=saved_det[1])
        modules = dict(model.named_modules())
        for name, p in saved_p.items():
            modules[name].p = p


@functools.cache
def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("onnxruntime-training", "onnx", "ortlab"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


StepCallback = Callable[[dict[str, Any]], None]


class Engine:
    """A workload, its initial snapshot and the current ORTModule wrap. It runs bursts in this process; the
    worker process holds one, and `in_process=True` uses one directly."""

    def __init__(self, ref: ModelRef, seed: int = 0, import_options: Options | None = None,
                 snapshot: str | Path | None = None):
        self.ref = ref
        self.import_options = import_options or Options()
        torch.manual_seed(seed)
        self.workload = ref.build()
        self.model = self.workload.model
        self.initial = Snapshot.load(snapshot) if snapshot else Snapshot.take(self.model)
        self.wrapper = Wrapper(self.model)
        self.pending_transition: Transition | None = None  # e.g. "new worker", set by the worker

    def check_import_options(self, options: Options) -> None:
        mine = self.import_options.with_read_at(ReadAt.IMPORT)
        theirs = options.with_read_at(ReadAt.IMPORT)
        if mine != theirs:
            raise BurstError(
                f"import-time options differ from this process's ({theirs} vs {mine}): ORT reads them once per process; "
                "run the burst through a worker (the default) so ortlab can start a new one, or restart the kernel")

    def run(self, cfg: BurstConfig, on_step: StepCallback | None = None, on_start: Callable[[Path], None] | None = None,
            should_stop: Callable[[], bool] | None = None):
        """Run one burst and return its folder. KeyboardInterrupt (or `should_stop()` turning true, checked after
        each step, for bursts on a background thread) ends it cleanly ("interrupted"); a failure gives a "failed"
        run with its log and a one-sentence reason; neither raises."""
        options = cfg.effective_options()
        if cfg.backend == "ortmodule":
            self.check_import_options(options)
        device = resolve_device(cfg.device)
        if cfg.precision == "fp16" and device.type != "cuda":
            raise BurstError("precision 'fp16' needs CUDA (torch.autocast float16 + GradScaler); use fp32 on the CPU")
        self.model.to(device)
        self.initial.restore(self.model)
        optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), cfg.lr, device)
        if self.initial.optimizer is not None and cfg.optimizer in ("adamw", "sgd"):
            with contextlib.suppress(ValueError, KeyError):
                optimizer.load_state_dict(self.initial.optimizer)

        collectors = _make_collectors(cfg)
        path = new_run_dir(cfg.out, cfg.backend, cfg.name)
        writer = RunWriter(path, {
            "backend": cfg.backend, "config": cfg.to_dict(), "effective_options": options.to_dict(),
            "model": {"factory": self.ref.describe(), **self.workload.describe()},
            "device": str(device), "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "versions": versions(), "pid": os.getpid(),
        })
        if on_start:
            on_start(path)
        log_path = path / "log.txt"
        status, extra, transitions, ort_info = "ok", {}, [], {}
        memory = _PeakMemory(device)
        scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
        self.model.train()
        stage = "setup"
        graph_collectors = tuple(sorted(getattr(c, "graph_key", None) or name  # graph_key: what it puts in the graph
                                        for name, c in zip(sorted(cfg.collect), collectors, strict=True)
                                        if c.changes_graph))
        with captured_output(log_path), options.applied(), _parity(self.model, cfg.parity, cfg.seed):
            try:
                if cfg.backend == "ortmodule":
                    import onnxruntime

                    onnxruntime.set_seed(cfg.seed)
                runner = self.model
                stage = "collectors"
                for c in collectors:
                    c.start(self, cfg, path)
                memory.reset()
                for step in range(cfg.steps):
                    stage = "data"
                    inputs, target = to_device(self.workload.batch(step), device)
                    if step == 0 and cfg.backend == "ortmodule":
                        stage = "wrap"
                        runner, row = self.wrapper.prepare(options, cfg.parity, inputs, path.name, path / "onnx",
                                                           extra_key=graph_collectors)
                        if self.pending_transition is not None:
                            row = Transition(path.name, 0, self.pending_transition.action,
                                             f"{self.pending_transition.reason}; then {row.action}: {row.reason}",
                                             {**self.pending_transition.changes, **row.changes})
                            self.pending_transition = None
                        transitions.append(row)
                    for c in collectors:
                        c.step_begin(step)
                    started = time.perf_counter()
                    stage = "forward"
                    with torch.autocast(device.type, dtype=torch.float16, enabled=scaler is not None):
                        outputs = call_model(runner, inputs)
                        stage = "loss"
                        loss = self.workload.loss(outputs, target)
                    stage = "backward"
                    (scaler.scale(loss) if scaler else loss).backward()
                    stage = "optimizer"
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    loss_value = float(loss.detach())  # waits for the device
                    elapsed = time.perf_counter() - started
                    row = {"step": step, "loss": loss_value, "step_time_s": elapsed,
                           "samples_per_s": (self.workload.batch_size or 1) / elapsed if elapsed > 0 else None,
                           "peak_mem_mb": memory.peak_mb()}
                    if cfg.backend == "ortmodule" and self.wrapper.exported_since_last_check():
                        row["exported"] = True
                        if step == 0:
                            transitions[-1].ort_exported = True
                        else:
                            transitions.append(Transition(path.name, step, "re-export", "ORT exported again mid-burst", {}, True))
                    elif step == 0 and transitions:
                        transitions[-1].ort_exported = False
                    for c in collectors:
                        c.step_end(step)
                    writer.step(row)
                    if on_step:
                        on_step(row)
                    if should_stop is not None and should_stop():
                        raise KeyboardInterrupt
                stage = "done"
            except KeyboardInterrupt:
                status = "interrupted"
                extra["error"] = f"interrupted by the user during step {_step_of(writer)} ({stage})"
            except Exception as e:
                status = "failed"
                where = stage
                if cfg.backend == "ortmodule" and stage in ("wrap", "forward", "backward"):
                    where = failure_stage(e) or f"ORTModule {stage}"
                extra["error"] = f"{cfg.backend} burst failed in {where} at step {_step_of(writer)}: {root_message(e)}"
                extra["failed_stage"] = where
                if "shape inference" in where and any(
                        isinstance(m, torch.nn.MultiheadAttention) for m in self.model.modules()):
                    extra["hint"] = ("torch.nn.MultiheadAttention is a known cause: ORT 1.19.2's symbolic shape inference "
                                     "fails on its export; write attention with Linear/view/matmul (as ortlab.demo does)")
                print(f"[ortlab] {extra['error']}\n{traceback.format_exc()}", flush=True)
            finally:
                for c in collectors:
                    try:
                        c.finish(self, cfg, path, status)
                    except Exception as e:  # a collector must not lose the run
                        extra.setdefault("collector_errors", []).append(f"{type(c).__name__}: {root_message(e)}")
                        print(f"[ortlab] collector {type(c).__name__} failed:\n{traceback.format_exc()}", flush=True)
                if cfg.backend == "ortmodule" and self.wrapper.ort_module is not None:
                    ort_info = self._ort_info(exported=any(t.ort_exported for t in transitions) or status == "failed")
        if cfg.backend == "ortmodule":
            ort_info["features"] = parse_feature_table(log_path.read_text(encoding="utf-8", errors="replace"))
            if ort_info.get("fallback") and status == "ok":
                extra["warning"] = f"ORTModule fell back to PyTorch: {ort_info['fallback']}"
            writer.write("ort.json", ort_info)
            writer.write("transitions.json", [t.to_dict() for t in transitions])
        memory.close()
        writer.finish(status, **extra)
        return path

    def _ort_info(self, exported: bool) -> dict[str, Any]:
        """ORT's state after the burst; the init overhead only when this burst paid it (it exported)."""
        info: dict[str, Any] = {"exported": exported}
        readers = [("post_export", self.wrapper.post_export), ("fallback", self.wrapper.fallback)]
        if exported:
            readers.append(("overhead", self.wrapper.overhead))
        for key, fn in readers:
            try:
                info[key] = fn()
            except Exception as e:  # ORT internals differ or are missing after a failure
                info[key] = None
                info.setdefault("unreadable", {})[key] = root_message(e)
        return info


def _step_of(writer: RunWriter) -> int:
    path = writer.path / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0
