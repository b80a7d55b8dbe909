"""The training loop: a burst of N steps on one backend, from the same snapshot every time, written as a run.

`Engine.run` is a few named steps: prepare (device, optimizer, collectors, run folder), the step loop (the
backend wraps the model at step 0, train, record), the outcome (ok / interrupted / failed with the stage named)
and finalisation (collectors, the backend's own data, the end state, the run's final status, always written).
What differs between PyTorch, ORTModule and torch.compile is in ortlab.engine.backends.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ortlab.common.capture import captured_output
from ortlab.common.lazy import named
from ortlab.common.parity import parity
from ortlab.compat.errors import root_message
from ortlab.engine import precision
from ortlab.engine.backends import Backend, make, registered
from ortlab.engine.collectors import Collector, make_collectors
from ortlab.engine.config import BurstConfig, optimizer_for, resolve_device
from ortlab.engine.headroom import refuse_unfit
from ortlab.engine.machine import Contention, StepClock, fit_threads
from ortlab.engine.peak import PeakMemory
from ortlab.engine.sampling import Feed
from ortlab.engine.types import BurstError, Evidence, Transition
from ortlab.options import Options, ReadAt
from ortlab.runs import evidence
from ortlab.runs.run import RunStatus, RunWriter, new_run_dir
from ortlab.runs.snapshot import Snapshot
from ortlab.stacks import table as stacks
from ortlab.stacks.versions import versions
from ortlab.workload import ModelRef, call_model, to_device

StepCallback = Callable[[dict[str, Any]], None]

@dataclass
class _Burst:
    """The state of one burst while it runs."""

    cfg: BurstConfig
    options: Options
    device: torch.device
    path: Path
    writer: RunWriter
    optimizer: Any
    scheduler: Any  # the workload's LR scheduler (Workload.optimizer), stepped after each optimizer step; or None
    collectors: dict[str, Collector]
    timers: list[Collector]  # the collectors told each step's phases (Collector.times_phases)
    memory: PeakMemory
    feed: Feed
    backend: Backend
    scaler: Any = None
    runner: Any = None  # the module that trains: the model, its ORTModule or its compiled module
    first_inputs: Any = None  # step 0's inputs: their shapes size the exported graph's symbolic dimensions
    last_inputs: Any = None  # the last micro-batch's inputs (the step's, without accumulation)
    stage: str = "setup"  # what the burst is doing now: named in a failure
    steps_done: int = 0
    forward_s: float = 0.0  # the last step's forward and loss: this process's own work (ortlab.engine.ranks)
    status: str = RunStatus.OK  # a RunStatus
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # what the burst enters for its length
    # (fixes, observers): Engine.run enters its own
    state: Any = None  # the backend's own state during the burst
    began: bool = False  # the backend began the burst (its outcome, finish and write are due)
    first: dict[str, Any] | None = None  # a parity burst's first step (ortlab.runs.evidence): judged elsewhere
    extra: dict[str, Any] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    clock: StepClock = field(default_factory=lambda: StepClock(True))  # each step's times (ortlab.runs.clock)



class Engine:
    """A workload, its initial snapshot and what each backend built (the ORTModule wrap, the compiled module). It
    runs bursts in this process; the worker process holds one, and `in_process=True` uses one directly."""

    time_forward = False  # wait for the device after the forward (a rank compares its forward time with the others')
    cpu_clock = True  # on the CPU, one thread: each step's CPU time beside its wall time (ortlab.runs.clock; a
    # rank's step waits on the others)

    def __init__(self, ref: ModelRef, seed: int = 0, import_options: Options | None = None,
                 snapshot: str | Path | None = None):
        self.ref = ref
        self.seed, self.snapshot = seed, str(snapshot) if snapshot else None  # how a run's model is built again
        self.import_options = import_options or Options()
        torch.manual_seed(seed)
        self.workload = ref.build()
        self.model = self.workload.model
        self.initial = Snapshot.load(snapshot) if snapshot else Snapshot.take(self.model)
        self.feed = Feed(self.workload)  # the batches of the current burst (set for each burst: its sampler)
        self.pending_transition: Transition | None = None  # e.g. "new worker", set by the worker
        self.backends: dict[str, Backend] = {}  # one of each, made on first use (each may keep what it built)
        self.runner: Any = None  # the module the current (or last) burst trains
        self.current: Backend | None = None  # the backend of the current (or last) burst

    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            self.backends[name] = make(name, self.model)
        return self.backends[name]

    def check(self, fixes: Any = "auto", options: Options | None = None, out: str | Path | None = None):
        """Check the model for ORTModule from the initial snapshot (ortlab.compat.check): every blocker, the fixes
        that remove them, one training step to confirm. Written to a folder `<stamp>-check` under `out`."""
        from ortlab.compat.check import check

        options = options or Options()
        folder = new_run_dir(out, "check") if out is not None else None
        self.initial.restore(self.model)
        with options.applied():
            return check(self.workload, fixes, options["onnx_opset_version"], folder)

    def task(self, ref: str, cfg: BurstConfig, **kwargs: Any) -> dict[str, Any]:
        """Run what `ref` ("module:function") names on this engine's model for `cfg`: `function(engine, cfg,
        **kwargs)`, its plain-data answer returned. The engine knows no task: whoever asks names it, as the backend
        registry names its adapters (a Driver sends the verdict's evidence this way, in the worker or here)."""
        return named(ref)(self, cfg, **kwargs)

    def check_import_options(self, options: Options) -> None:
        mine = self.import_options.with_read_at(ReadAt.IMPORT)
        theirs = options.with_read_at(ReadAt.IMPORT)
        if mine != theirs:
            raise BurstError(
                f"import-time options differ from this process's ({theirs} vs {mine}): ORT reads them once per "
                "process; "
                "run the burst through a worker (the default) so ortlab can start a new one, or restart the kernel")

    def run(self, cfg: BurstConfig, on_step: StepCallback | None = None, on_start: Callable[[Path], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> Path:
        """Run one burst and return its folder. KeyboardInterrupt (or `should_stop()` turning true, checked after
        each step, for bursts on a background thread) ends it cleanly ("interrupted"); a failure gives a "failed"
        run with its log and a one-sentence reason; neither raises. Bad arguments raise BurstError before any
        folder is made. A `threads` setting holds for the burst: torch's threads are set back after it."""
        threads = torch.get_num_threads()
        try:
            return self._run(cfg, on_step, on_start, should_stop)
        finally:
            if cfg.threads is not None and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    def _run(self, cfg: BurstConfig, on_step: StepCallback | None, on_start: Callable[[Path], None] | None,
             should_stop: Callable[[], bool] | None) -> Path:
        b = self._prepare(cfg)
        contention = Contention()
        try:
            if on_start:
                on_start(b.path)
            with captured_output(b.path / "log.txt"), b.options.applied(), parity(self.model, cfg.parity, cfg.seed), \
                    contextlib.ExitStack() as b.stack:
                try:
                    self._train(b, on_step, should_stop)
                except KeyboardInterrupt:
                    b.status = RunStatus.INTERRUPTED
                    b.extra["error"] = f"interrupted by the user during step {b.steps_done} ({b.stage})"
                except Exception as e:
                    self._failed(b, e)
                finally:
                    if b.began:
                        b.backend.outcome(self, b)
                    self._finish_collectors(b)
                    if b.began:
                        b.backend.finish(self, b)
            if b.began:
                b.backend.write(self, b)
            if b.steps_done:
                evidence.write_state(self.model, b.path)
            if b.first is not None and b.steps_done:
                self._record(b)
        except KeyboardInterrupt:  # Ctrl-C while the burst's outputs were being entered or written: said, not "ok"
            b.status = RunStatus.INTERRUPTED
            b.extra.setdefault("error", f"interrupted by the user after step {b.steps_done} ({b.stage}), while "
                                        "the run's files were written: some may be missing")
        finally:
            b.memory.close()
            b.extra["machine"] = {**b.writer.meta.get("machine", {}), "cpu_wait": contention.share()}
            b.writer.finish(b.status, **b.extra)  # a run never stays "running" once its burst ended
        return b.path

    # -- the named steps

    def _prepare(self, cfg: BurstConfig) -> _Burst:
        options = cfg.effective_options()
        wanted = registered(cfg.backend).imports(options)
        if wanted is not None:
            self.check_import_options(wanted)
        device = resolve_device(cfg.device)  # the precision fits it and the backend: BurstConfig checked
        unfit = refuse_unfit(self.model, str(cfg.optimizer), device, self.ref.describe())
        if unfit:  # said before the burst starts, not found out by the kernel's OOM killer mid-step
            raise BurstError(unfit)
        feed = self.feed = self._feed(cfg)
        self.model.to(device)
        self.initial.restore(self.model)
        if cfg.perturb:
            with torch.no_grad():
                for p in self.model.parameters():
                    if p.is_floating_point():
                        p.mul_(1 + cfg.perturb)
        if cfg.distributed and self.workload.own_step:
            raise BurstError("a workload that brings its own training step (a Trainer's loss, optimizer, "
                             "accumulation or clipping) runs in one process: use nproc=1 and nnodes=1")
        optimizer, scheduler = optimizer_for(self.workload, self.model, cfg.optimizer, cfg.lr, device)
        if self.initial.optimizer is not None and cfg.optimizer in ("adamw", "sgd", "auto"):
            with contextlib.suppress(ValueError, KeyError):
                optimizer.load_state_dict(self.initial.optimizer)
        collectors = make_collectors(cfg.collect)
        path = self._run_dir(cfg)
        writer = RunWriter(path, {
            "backend": cfg.backend, "config": cfg.to_dict(), "effective_options": options.to_dict(),
            "model": {"factory": self.ref.describe(), **self.workload.describe(),
                      "rebuild": {"ref": self.ref.to_dict(), "seed": self.seed, "snapshot": self.snapshot}},
            "device": str(device), "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "versions": versions(), "stack": stacks.recorded(), "pid": os.getpid(),
            "machine": fit_threads(cfg.threads, device.type),  # torch's threads for the burst: its setting
            "optimizer": type(optimizer).__name__,  # what "auto" became (the workload's own, else AdamW)
            "scheduler": type(scheduler).__name__ if scheduler is not None else None,
        })
        try:  # from here the folder says "running": whatever ends the burst before it runs must say so too
            scaler = precision.scaler(cfg.precision)
            self.model.train()
            timers = [c for c in collectors.values() if c.times_phases]
            self.current = self.backend(cfg.backend)
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt)
            writer.finish(RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED,
                          error="interrupted by the user before its first step" if interrupted
                          else f"the burst could not start: {type(e).__name__}: {e}")
            raise
        return _Burst(cfg, options, device, path, writer, optimizer, scheduler, collectors, timers, PeakMemory(device),
                      feed, self.current, scaler, runner=self.model,
                      clock=StepClock(device.type == "cpu" and self.cpu_clock and torch.get_num_threads() == 1))

    def _feed(self, cfg: BurstConfig) -> Feed:
        """The batches this process trains on (a rank of a distributed burst: its share)."""
        return Feed(self.workload, cfg.sampler, seed=cfg.seed)

    def _run_dir(self, cfg: BurstConfig) -> Path:
        """A new folder for the burst's run (a rank of a distributed burst writes into its run's ranks/<r>)."""
        return new_run_dir(cfg.out, cfg.backend, cfg.name)

    def _train(self, b: _Burst, on_step: StepCallback | None, should_stop: Callable[[], bool] | None) -> None:
        b.stage = "backend"
        b.backend.begin(self, b)
        b.began = True
        b.stage = "collectors"
        for c in b.collectors.values():
            c.start(self, b.cfg, b.path)
        b.memory.reset()
        for step in range(b.cfg.steps):
            row = self._step(b, step)
            b.stage = "writing the run"
            b.writer.step(row)
            b.steps_done = step + 1
            if on_step:
                on_step(row)
            if should_stop is not None and should_stop():
                raise KeyboardInterrupt
        b.stage = "done"

    def _step(self, b: _Burst, step: int) -> dict[str, Any]:
        """One optimizer step: each micro-batch's forward and backward (one unless the workload accumulates), then
        the workload's clipping, the optimizer's and the scheduler's step. Phases: "forward" as the first
        micro-batch begins, "backward" as the last one's backward does."""
        work, total = self.workload, 0.0
        first = self._batch(b, step, 0)  # at step 0 the backend wraps the model on it, before the step begins
        for c in b.collectors.values():
            c.step_begin(step)
        b.clock.start()
        for j in range(work.accumulation):
            total += self._micro(b, step, j, first if j == 0 else self._batch(b, step, j))
        if step == 0 and b.cfg.parity:  # before the optimizer moves the gradients (a rank's: after their reduction)
            b.first = evidence.gradients(self.model, total, b.scaler, full=b.cfg.evidence == Evidence.FULL)
        for c in b.timers:
            c.phase(step, "optimizer")
        b.stage = "optimizer"
        work.optimizer_step(self.model, b.optimizer, b.scheduler, b.scaler)
        times = b.clock.stop()  # wall time, and on the CPU the step's CPU time (ortlab.runs.clock)
        for c in b.timers:
            c.phase(step, "end")
        elapsed = times["step_time_s"]
        row = {"step": step, "loss": total, **times,
               "samples_per_s": (work.batch_size or 1) * work.accumulation / elapsed if elapsed > 0 else None,
               **b.memory.figures()}
        row.update(b.feed.load(step) or {})
        b.backend.after_step(self, b, step, b.last_inputs, row)
        for c in b.collectors.values():
            c.step_end(step)
        return row

    def _batch(self, b: _Burst, step: int, j: int) -> tuple[Any, Any]:
        """Micro-batch `j` of `step` on the burst's device; the first of the burst is the one the backend wraps
        the model on."""
        b.stage = "data"
        inputs, target = to_device(b.feed.batch(step * self.workload.accumulation + j), b.device)
        if step == 0 and j == 0:
            b.stage = "wrap"
            b.first_inputs = inputs
            b.runner = self.runner = self._runner(b, b.backend.wrap(self, b, inputs))
        b.last_inputs = inputs
        return inputs, target

    def _micro(self, b: _Burst, step: int, j: int, batch: tuple[Any, Any]) -> float:
        """Micro-batch `j` of `step`: forward, loss, backward; its loss (waits for the device)."""
        inputs, target = batch
        last = j == self.workload.accumulation - 1
        started = time.perf_counter()
        if j == 0:
            for c in b.timers:
                c.phase(step, "forward")
        b.stage = "forward"
        with precision.autocast(b.cfg.precision, b.device):  # none at all in fp32 (ortlab.engine.precision)
            if self.workload.step_loss is not None:  # the trainer's own step: forward and loss in one
                with b.backend.forward(self, b, step, inputs):
                    loss = self.workload.forward_loss(b.runner, inputs, target)
            else:
                with b.backend.forward(self, b, step, inputs):
                    outputs = call_model(b.runner, inputs)
                b.stage = "loss"
                assert self.workload.loss is not None  # a Workload has loss or step_loss (ortlab.workload)
                loss = self.workload.loss(outputs, target)
        if self.time_forward and b.device.type == "cuda":
            torch.cuda.synchronize()  # the forward's kernels are asynchronous
        b.forward_s = time.perf_counter() - started
        loss = self._before_backward(b, step, loss)
        if last:
            for c in b.timers:
                c.phase(step, "backward")
        b.stage = "backward"
        (b.scaler.scale(loss) if b.scaler else loss).backward()
        return float(loss.detach())  # waits for the device

    def _runner(self, b: _Burst, runner: Any) -> Any:
        """The module the burst's steps call, from the backend's (a rank of a distributed burst puts DDP
        around it)."""
        return runner

    def _before_backward(self, b: _Burst, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The loss to backward through, after the forward of `step` (a rank of a distributed burst attaches its
        exchange row to it, with its forward time)."""
        return loss

    def _record(self, b: _Burst) -> None:
        """What a verdict in another process needs (ortlab.runs.evidence); a failure is named, the run kept."""
        try:
            evidence.write_record(b.path, b.first, self.initial, self.workload, self._feed(b.cfg), b.cfg.seed,
                                  b.steps_done)
        except Exception as e:
            b.extra["record_error"] = f"{evidence.RECORD_FILE} not written: {root_message(e)}"

    def _failed(self, b: _Burst, e: Exception) -> None:
        """A failed burst: the stage named (inside a backend: where the backend says), a hint when one is known."""
        b.status = RunStatus.FAILED
        where = (b.backend.where_failed(self, b, e) if b.began else None) or b.stage
        b.extra["error"] = f"{b.cfg.backend} burst failed in {where} at step {b.steps_done}: {root_message(e)}"
        b.extra["failed_stage"] = where
        print(f"[ortlab] {b.extra['error']}\n{traceback.format_exc()}", flush=True)

    def _finish_collectors(self, b: _Burst) -> None:
        for c in b.collectors.values():
            try:
                c.finish(self, b.cfg, b.path, b.status)
            except Exception as e:  # a collector must not lose the run
                b.extra.setdefault("collector_errors", []).append(f"{type(c).__name__}: {root_message(e)}")
                print(f"[ortlab] collector {type(c).__name__} failed:\n{traceback.format_exc()}", flush=True)
