"""The training loop: a burst of N steps on one backend, from the same snapshot every time, written as a run.

`Engine.run` is a few named steps: prepare (device, optimizer, collectors, run folder), the step loop (wrap on
the first ORTModule step, train, record), the outcome (ok / interrupted / failed with the stage named) and
finalisation (collectors, ORT's own data, the run's final status, always written).
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

from ortlab.capture import captured_output, parse_feature_table
from ortlab.compat.errors import failure_stage, root_message
from ortlab.engine.collectors import Collector, graph_key, make_collectors
from ortlab.engine.config import BurstConfig, BurstError, make_optimizer, resolve_device
from ortlab.engine.parity import parity
from ortlab.engine.peak import PeakMemory
from ortlab.engine.sampling import Feed
from ortlab.engine.wrapper import Transition, Wrapper, input_schema
from ortlab.options import Options, ReadAt
from ortlab.run import RunWriter, new_run_dir
from ortlab.snapshot import Snapshot
from ortlab.verdict import hazards
from ortlab.versions import versions
from ortlab.workload import ModelRef, call_model, to_device

StepCallback = Callable[[dict[str, Any]], None]

MHA_HINT = ("torch.nn.MultiheadAttention is a known cause: ORT 1.19.2's symbolic shape inference fails on its "
            "export; write attention with Linear/view/matmul (as ortlab.demo does)")
# Where a failure inside ORTModule is met (ortlab.compat.errors.failure_stage names them; "ORTModule <stage>" else)
ORT_STAGES = ("wrap", "forward", "backward")


@dataclass
class _Burst:
    """The state of one burst while it runs."""

    cfg: BurstConfig
    options: Options
    device: torch.device
    path: Path
    writer: RunWriter
    optimizer: Any
    collectors: dict[str, Collector]
    memory: PeakMemory
    feed: Feed
    scaler: Any = None
    runner: Any = None  # the module that trains: the model, or its ORTModule
    first_inputs: Any = None  # step 0's inputs: their shapes size the exported graph's symbolic dimensions
    stage: str = "setup"  # what the burst is doing now: named in a failure
    steps_done: int = 0
    forward_s: float = 0.0  # the last step's forward and loss: this process's own work (ortlab.engine.ranks)
    status: str = "ok"
    fixes: contextlib.ExitStack | None = None  # the compatibility fixes applied for this burst, undone as it ends
    fixes_applied: tuple[str, ...] = ()  # the names of those fixes
    hazards: list[dict[str, Any]] = field(default_factory=list)  # what the exporter warned about (ortlab.verdict)
    ignored: set[tuple] = field(default_factory=set)  # (input, value) the graph did not follow, once each
    fallback_step: int | None = None  # ORTModule had fallen back to PyTorch by the end of this step
    failed_in_ort: bool = False  # the failure came from inside ORTModule (its export, graph building or session)
    extra: dict[str, Any] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    ort_info: dict[str, Any] = field(default_factory=dict)

    @property
    def ortmodule(self) -> bool:
        return self.cfg.backend == "ortmodule"

    @property
    def pytorch_buffers(self) -> bool:
        return self.ortmodule and "pytorch-buffers" in self.fixes_applied


class Engine:
    """A workload, its initial snapshot and the current ORTModule wrap. It runs bursts in this process; the
    worker process holds one, and `in_process=True` uses one directly."""

    time_forward = False  # wait for the device after the forward (a rank compares its forward time with the others')

    def __init__(self, ref: ModelRef, seed: int = 0, import_options: Options | None = None,
                 snapshot: str | Path | None = None):
        self.ref = ref
        self.import_options = import_options or Options()
        torch.manual_seed(seed)
        self.workload = ref.build()
        self.model = self.workload.model
        self.initial = Snapshot.load(snapshot) if snapshot else Snapshot.take(self.model)
        self.wrapper = Wrapper(self.model)
        self.feed = Feed(self.workload)  # the batches of the current burst (set for each burst: its sampler)
        self.pending_transition: Transition | None = None  # e.g. "new worker", set by the worker
        self._auto_fixes: dict[tuple, tuple[tuple[str, ...], list[dict]]] = {}  # fixes="auto", worked out once

    def check(self, fixes: Any = "auto", options: Options | None = None, out: str | Path | None = None):
        """Check the model for ORTModule from the initial snapshot (ortlab.compat.check): every blocker, the fixes
        that remove them, one training step to confirm. Written to a folder `<stamp>-check` under `out`."""
        from ortlab.compat.check import check

        options = options or Options()
        folder = new_run_dir(out, "check") if out is not None else None
        self.initial.restore(self.model)
        with options.applied():
            return check(self.workload, fixes, options["onnx_opset_version"], folder)

    def gradient_check(self, cfg: BurstConfig, fixes: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
        """The first batch's gradients on both backends from the initial snapshot (ortlab.verdict.gradients), with
        the ORTModule burst's fixes. In parity mode through the last burst's ORTModule when it was exported
        in parity mode without instrumentation (no export); otherwise a fresh one (one export)."""
        from ortlab.verdict.gradients import first_step

        self.initial.restore(self.model)
        batch = self.feed.batch(0)
        reuse = self.wrapper.parity_wrap(cfg.effective_options(), fixes, batch[0]) if cfg.parity else None
        with cfg.effective_options().applied():
            check = first_step(self.workload, fixes, cfg.seed, ortmodule=reuse, batch=batch)
        return {**check.to_dict(), "exported": reuse is None}

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
        folder is made."""
        b = self._prepare(cfg)
        try:
            if on_start:
                on_start(b.path)
            with captured_output(b.path / "log.txt"), b.options.applied(), parity(self.model, cfg.parity, cfg.seed), \
                    contextlib.ExitStack() as b.fixes:
                try:
                    self._train(b, on_step, should_stop)
                except KeyboardInterrupt:
                    b.status = "interrupted"
                    b.extra["error"] = f"interrupted by the user during step {b.steps_done} ({b.stage})"
                except Exception as e:
                    self._failed(b, e)
                finally:
                    if b.ortmodule:
                        self._ort_outcome(b)
                    self._finish_collectors(b)
                    if b.ortmodule and self.wrapper.ort_module is not None:
                        b.ort_info = self._ort_info(
                            exported=any(t.ort_exported for t in b.transitions) or b.status == "failed",
                            first_inputs=b.first_inputs)
            self._write_ort_files(b)
            if b.steps_done:
                from ortlab.verdict import state

                state.write(self.model, b.path)
        finally:
            b.memory.close()
            b.writer.finish(b.status, **b.extra)  # a run never stays "running" once its burst ended
        return b.path

    # -- the named steps

    def _prepare(self, cfg: BurstConfig) -> _Burst:
        options = cfg.effective_options()
        if cfg.backend == "ortmodule":
            self.check_import_options(options)
        device = resolve_device(cfg.device)
        if cfg.precision == "fp16" and device.type != "cuda":
            raise BurstError("precision 'fp16' needs CUDA (torch.autocast float16 + GradScaler); use fp32 on the CPU")
        feed = self.feed = self._feed(cfg)
        self.model.to(device)
        self.initial.restore(self.model)
        if cfg.perturb:
            with torch.no_grad():
                for p in self.model.parameters():
                    if p.is_floating_point():
                        p.mul_(1 + cfg.perturb)
        optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), cfg.lr, device)
        if self.initial.optimizer is not None and cfg.optimizer in ("adamw", "sgd"):
            with contextlib.suppress(ValueError, KeyError):
                optimizer.load_state_dict(self.initial.optimizer)
        collectors = make_collectors(cfg.collect)
        path = self._run_dir(cfg)
        writer = RunWriter(path, {
            "backend": cfg.backend, "config": cfg.to_dict(), "effective_options": options.to_dict(),
            "model": {"factory": self.ref.describe(), **self.workload.describe()},
            "device": str(device), "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "versions": versions(), "pid": os.getpid(),
        })
        scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
        self.model.train()
        return _Burst(cfg, options, device, path, writer, optimizer, collectors, PeakMemory(device), feed, scaler,
                      runner=self.model)

    def _feed(self, cfg: BurstConfig) -> Feed:
        """The batches this process trains on (a rank of a distributed burst: its share)."""
        return Feed(self.workload, cfg.sampler, seed=cfg.seed)

    def _run_dir(self, cfg: BurstConfig) -> Path:
        """A new folder for the burst's run (a rank of a distributed burst writes into its run's ranks/<r>)."""
        return new_run_dir(cfg.out, cfg.backend, cfg.name)

    def _train(self, b: _Burst, on_step: StepCallback | None, should_stop: Callable[[], bool] | None) -> None:
        if b.ortmodule:
            import onnxruntime

            onnxruntime.set_seed(b.cfg.seed)
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
        b.stage = "data"
        inputs, target = to_device(b.feed.batch(step), b.device)
        exporting = False
        if b.ortmodule:
            if step == 0:
                b.stage = "wrap"
                b.first_inputs = inputs
                self._wrap(b, inputs)
            self._follow_inputs(b, step, inputs)
            exporting = self.wrapper.export_pending
        for c in b.collectors.values():
            c.step_begin(step)
        started = time.perf_counter()
        b.stage = "forward"
        # no autocast context at all in fp32: even a disabled one sets the device's autocast dtype and nesting,
        # which cost 1-3% of an ORTModule step in benchmarks/distributed_overhead.py
        fp16 = torch.autocast(b.device.type, dtype=torch.float16) if b.scaler else contextlib.nullcontext()
        found: list[dict[str, Any]] = []
        kept = _buffers(self.model) if b.pytorch_buffers else None
        with fp16, hazards.captured(self.model, step, found) if exporting else contextlib.nullcontext():
            outputs = call_model(b.runner, inputs)
        if kept is not None:  # fix pytorch-buffers: what ORT wrote into buffers (and the export's forward) undone,
            _restore_buffers(kept)  # then they advance as PyTorch advances them
            b.stage = "buffers"
            with torch.no_grad(), fp16:
                call_model(self.model, inputs)
        with fp16:
            b.stage = "loss"
            loss = self.workload.loss(outputs, target)
        if self.time_forward and b.device.type == "cuda":
            torch.cuda.synchronize()  # the forward's kernels are asynchronous
        b.forward_s = time.perf_counter() - started
        loss = self._before_backward(b, step, loss)
        b.stage = "backward"
        (b.scaler.scale(loss) if b.scaler else loss).backward()
        b.stage = "optimizer"
        if b.scaler:
            b.scaler.step(b.optimizer)
            b.scaler.update()
        else:
            b.optimizer.step()
        b.optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())  # waits for the device
        elapsed = time.perf_counter() - started
        row = {"step": step, "loss": loss_value, "step_time_s": elapsed,
               "samples_per_s": (self.workload.batch_size or 1) / elapsed if elapsed > 0 else None,
               "peak_mem_mb": b.memory.peak_mb()}
        row.update(b.feed.load(step) or {})
        if b.ortmodule:
            self._note_export(b, step, row)
            if exporting and row.get("exported"):
                self.wrapper.exported(inputs, hazards.unique(found))
                b.hazards += found
            if step == 0 and self.wrapper.fallback_error() is not None:
                b.fallback_step = 0
        for c in b.collectors.values():
            c.step_end(step)
        return row

    def _before_backward(self, b: _Burst, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The loss to backward through, after the forward of `step` (a rank of a distributed burst attaches its
        exchange row to it, with its forward time)."""
        return loss

    def _wrap(self, b: _Burst, inputs: Any) -> None:
        """The ORTModule for this burst's options and fixes (new, re-wrapped or reused) and the transition row
        saying why."""
        fixes = self._apply_fixes(b, inputs)
        b.runner, row = self.wrapper.prepare(b.options, b.cfg.parity, inputs, b.path.name, b.path / "onnx",
                                             extra_key=graph_key(b.collectors), fixes=fixes)
        if self.pending_transition is not None:
            pending, self.pending_transition = self.pending_transition, None
            row = Transition(b.path.name, 0, pending.action, f"{pending.reason}; then {row.action}: {row.reason}",
                             {**pending.changes, **row.changes})
        b.transitions.append(row)

    def _apply_fixes(self, b: _Burst, inputs: Any) -> tuple[str, ...]:
        """The compatibility fixes this ORTModule burst trains with (ortlab.compat.registry), applied until the
        burst ends. "auto": the ones `ortlab check` recommends for the model (worked out once per option set,
        parity mode, instrumentation and input schema)."""
        from ortlab.compat import registry

        asked = b.cfg.fixes
        record: dict[str, Any] = {"asked": asked if asked == registry.AUTO else list(asked)}
        if asked == registry.AUTO:
            from ortlab.compat.check import check

            key = (repr(sorted(b.options.to_dict().items())), b.cfg.parity, graph_key(b.collectors),
                   repr(input_schema(inputs)))
            if key not in self._auto_fixes:
                report = check(self.workload, registry.AUTO, b.options["onnx_opset_version"])
                self._auto_fixes[key] = (tuple(report.fixes), [x.to_dict() for x in report.blockers])
            names, record["found"] = self._auto_fixes[key]
        else:
            names = asked
        b.fixes.enter_context(registry.applied(self.model, names))
        b.fixes_applied = tuple(names)
        record["applied"] = list(names)
        b.extra["fixes"] = record
        return tuple(names)

    def _follow_inputs(self, b: _Burst, step: int, inputs: Any) -> None:
        """Inputs the current graph cannot follow (ortlab.verdict.inputs): a graph of their own with the fix
        graph-per-value (not under DDP: its module is fixed), else a transitions row and a record, once each."""
        per_value = "graph-per-value" in b.fixes_applied and not b.cfg.distributed
        runner, row, ignored = self.wrapper.follow(inputs, b.path.name, step, per_value, b.options, b.path / "onnx")
        if row is not None:
            b.runner = runner
            b.transitions.append(row)
        for change in ignored:
            if (change["input"], change["new"]) in b.ignored:
                continue
            b.ignored.add((change["input"], change["new"]))
            baked = ("the value was baked into it" if change["what"] == "value" else
                     "its export traced shape-dependent Python")
            text = (f"step {step}: {change['input']} {change['old']} -> {change['new']}, ORT reused the graph "
                    f"exported for {change['old']} ({baked})")
            b.transitions.append(Transition(b.path.name, step, "reused graph", text, {"inputs": [change]}, False))
            b.extra.setdefault("ignored_inputs", []).append({**change, "step": step, "text": text})

    def _ort_outcome(self, b: _Burst) -> None:
        """What an ORTModule burst records as it ends: the export's hazards; a fallback to PyTorch, which makes
        the burst not "ok" (its steps are PyTorch's: stage, reason, operator, node); and, for a fallback or a
        failure inside ORTModule, the blockers `ortlab check` finds and the fixes that remove them."""
        from ortlab.compat.errors import fallback_record

        found = b.hazards or (self.wrapper.watch.hazards if self.wrapper.watch is not None else [])
        if found:  # this burst's export's, or those of the export whose graph it reused
            b.extra["hazards"] = hazards.unique(found)
        error = self.wrapper.fallback_error() if self.wrapper.ort_module is not None else None
        if error is not None:
            when = "at step 0 (every step ran on PyTorch)" if b.fallback_step == 0 else "during the burst"
            b.extra["fallback"] = fallback_record(error, b.fallback_step)
            if b.status == "ok":
                b.status = "fallback"
                b.extra["error"] = f"ORTModule fell back to PyTorch {when}: {b.extra['fallback']['reason']}"
        if (error is not None or (b.status == "failed" and b.failed_in_ort)) and b.first_inputs is not None:
            self._locate_blockers(b)

    def _locate_blockers(self, b: _Burst) -> None:
        """What `ortlab check` finds on the first batch, with the fixes this burst applied still on."""
        from ortlab.compat.check import find, recommend

        try:
            found = find(self.model, b.first_inputs, b.options["onnx_opset_version"])
        except Exception as e:  # locating is a courtesy: it must not lose the run
            b.extra["blockers_error"] = root_message(e)
            return
        fixes = recommend(found.blockers, self.model)
        b.extra["blockers"] = [x.to_dict() for x in found.blockers]
        if "fallback" in b.extra and found.blockers:
            first = found.blockers[0]
            b.extra["fallback"].update(op=b.extra["fallback"].get("op") or first.op, module=first.module,
                                       source=first.source)
        applied = set(b.extra.get("fixes", {}).get("applied", []))
        new = [f for f in fixes if f not in applied]
        if new:
            b.extra["hint"] = (f"fixes {', '.join(new)} remove what ORTModule met here: burst with fixes=\"auto\" "
                               "(--fix auto); `ortlab check` lists every blocker")
        elif found.blockers:
            b.extra.setdefault("hint", found.blockers[0].line())

    def _note_export(self, b: _Burst, step: int, row: dict[str, Any]) -> None:
        """Whether ORT exported in this step, from ORT's own record (the transition row is ortlab's guess)."""
        if self.wrapper.exported_since_last_check():
            row["exported"] = True
            if step == 0:
                b.transitions[-1].ort_exported = True
            else:
                again = Transition(b.path.name, step, "re-export", "ORT exported again mid-burst", {}, True)
                b.transitions.append(again)
        elif step == 0 and b.transitions:
            b.transitions[-1].ort_exported = False

    def _failed(self, b: _Burst, e: Exception) -> None:
        """A failed burst: the stage named (inside ORTModule: from ORT's traceback), a hint when one is known."""
        b.status = "failed"
        where = b.stage
        if b.ortmodule and b.stage in ORT_STAGES:
            where = failure_stage(e) or f"ORTModule {b.stage}"
            b.failed_in_ort = True
        b.extra["error"] = f"{b.cfg.backend} burst failed in {where} at step {b.steps_done}: {root_message(e)}"
        b.extra["failed_stage"] = where
        if "shape inference" in where and any(isinstance(m, torch.nn.MultiheadAttention) for m in self.model.modules()):
            b.extra["hint"] = MHA_HINT
        print(f"[ortlab] {b.extra['error']}\n{traceback.format_exc()}", flush=True)

    def _finish_collectors(self, b: _Burst) -> None:
        for c in b.collectors.values():
            try:
                c.finish(self, b.cfg, b.path, b.status)
            except Exception as e:  # a collector must not lose the run
                b.extra.setdefault("collector_errors", []).append(f"{type(c).__name__}: {root_message(e)}")
                print(f"[ortlab] collector {type(c).__name__} failed:\n{traceback.format_exc()}", flush=True)

    def _write_ort_files(self, b: _Burst) -> None:
        if not b.ortmodule:
            return
        b.ort_info["features"] = parse_feature_table((b.path / "log.txt").read_text(encoding="utf-8", errors="replace"))
        b.writer.write("ort.json", b.ort_info)
        b.writer.write("transitions.json", [t.to_dict() for t in b.transitions])

    def _ort_info(self, exported: bool, first_inputs: Any = None) -> dict[str, Any]:
        """ORT's state after the burst; the init overhead only when this burst paid it (it exported)."""
        info: dict[str, Any] = {"exported": exported}
        shapes = (lambda: self.wrapper.input_shapes(first_inputs)) if first_inputs is not None else dict
        readers = [("post_export", self.wrapper.post_export), ("fallback", self.wrapper.fallback),
                   ("input_shapes", shapes)]
        if exported:
            readers.append(("overhead", self.wrapper.overhead))
        for key, fn in readers:
            try:
                info[key] = fn()
            except Exception as e:  # ORT internals differ or are missing after a failure
                info[key] = None
                info.setdefault("unreadable", {})[key] = root_message(e)
        return info


def _buffers(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(buffer, buffer.detach().clone()) for buffer in model.buffers()]


def _restore_buffers(kept: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for buffer, saved in kept:
            buffer.copy_(saved)
