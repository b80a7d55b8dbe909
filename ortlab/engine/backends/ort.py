"""ORTModule: one wrap per option set and fixes (ortlab.engine.wrapper), the compatibility fixes applied for the
burst, each step's inputs followed (a graph per baked value with the fix graph-per-value), the export's hazards
captured as they happen, a fallback to PyTorch never reported as ok, ORT's own state recorded (ort.json,
transitions.json)."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ortlab.common.capture import parse_feature_table
from ortlab.compat import hazards
from ortlab.compat.errors import failure_stage, root_message
from ortlab.engine.backends import Alone, Backend
from ortlab.engine.collectors import graph_key
from ortlab.engine.types import Burst, Engine, Transition
from ortlab.engine.wrapper import Wrapper, input_schema
from ortlab.runs import files
from ortlab.runs.run import RunStatus
from ortlab.workload import call_model

MHA_HINT = ("torch.nn.MultiheadAttention is a known cause: ORT 1.19.2's symbolic shape inference fails on its "
            "export (the fix explicit-attention writes it out on the module's own weights)")
# The burst's stages whose failures come from inside ORTModule (failure_stage names them from ORT's traceback)
ORT_STAGES = ("wrap", "forward", "backward")


@dataclass
class OrtState:
    """What an ORTModule burst keeps while it runs."""

    fixes: tuple[str, ...] = ()  # the compatibility fixes applied (ortlab.compat.registry)
    hazards: list[dict[str, Any]] = field(default_factory=list)  # what the exporter warned about (ortlab.verdict)
    exporting: list[dict[str, Any]] | None = None  # this step's export hazards, while ORTModule exports
    ignored: set[tuple] = field(default_factory=set)  # (input, value) the graph did not follow, once each
    fallback_step: int | None = None  # ORTModule had fallen back to PyTorch by the end of this step
    failed_inside: bool = False  # the failure came from inside ORTModule (export, graph building, session)
    error: BaseException | None = None  # that failure (its traceback names the node ORT was processing)
    info: dict[str, Any] = field(default_factory=dict)  # ort.json
    threads: int | None = None  # the intra-op threads of the sessions ORTModule builds for this burst (None: ORT's)


class OrtBackend(Backend):
    name = "ortmodule"

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.wrapper = Wrapper(model)  # the ORTModule of the current option set, kept between bursts
        self._auto_fixes: dict[tuple, tuple[tuple[str, ...], list[dict]]] = {}  # fixes="auto", worked out once

    def ort_internals(self) -> Any:
        return self.wrapper.internals()

    def graph_input_shapes(self, inputs: Any) -> dict[str, list[int]]:
        return self.wrapper.input_shapes(inputs)

    def begin(self, engine: Engine, b: Burst) -> None:
        import onnxruntime

        onnxruntime.set_seed(b.cfg.seed)
        b.state = OrtState()
        from ortlab import _ort
        from ortlab.engine.machine import available_cores

        cores = available_cores()  # ORT's own default counts the host's cores, not the ones this process gets
        threads = cores if cores < (os.cpu_count() or cores) else None
        if b.writer.meta.get("device") == "cpu" and torch.get_num_threads() == 1:  # the step on one thread (its
            threads = 1  # threads setting, OMP_NUM_THREADS=1): ORT's ops too, so its thread's CPU time counts them
        b.state.threads = threads
        with contextlib.suppress(_ort.OrtInternalsError):
            _ort.session_threads(threads)
            b.writer.meta.setdefault("machine", {})["ort_threads"] = threads  # None: ORT's default (its cores)

    def wrap(self, engine: Engine, b: Burst, inputs: Any) -> Any:
        """The ORTModule for this burst's options and fixes (new, re-wrapped or reused), and the transition row
        saying why."""
        fixes = self._apply_fixes(engine, b, inputs)
        runner, row = self.wrapper.prepare(b.options, b.cfg.parity, inputs, b.path.name, b.path / "onnx",
                                           extra_key=graph_key(b.collectors), fixes=fixes, threads=b.state.threads)
        if engine.pending_transition is not None:
            pending, engine.pending_transition = engine.pending_transition, None
            row = Transition(b.path.name, 0, pending.action, f"{pending.reason}; then {row.action}: {row.reason}",
                             {**pending.changes, **row.changes})
        b.transitions.append(row)
        return runner

    def gradient_runner(self, engine: Engine, cfg: Any, fixes: tuple[str, ...],
                        batch: tuple[Any, Any]) -> tuple[Any, bool]:
        """In parity mode the last burst's ORTModule when it was exported in parity mode without instrumentation
        (no export); otherwise None: the check exports a fresh one."""
        runner = self.wrapper.parity_wrap(cfg.effective_options(), fixes, batch[0]) if cfg.parity else None
        return runner, runner is None

    def alone(self, cfg: Any, fixes: tuple[str, ...], log: Any) -> Alone:
        """A fresh ORTModule over the module (fallback is a failure), the fixes applied to the model, the compute
        optimizer off (it moves ops across the module's boundary), ORT's output into `log`."""
        from ortlab import _ort
        from ortlab.common.capture import captured_output
        from ortlab.compat import registry
        from ortlab.options import Options

        def ran(runner: Any) -> None:
            wrap = _ort.Wrap(runner, True)
            if (fell_back := wrap.fallback()) is not None:
                raise fell_back
            if wrap.exported_model() is None:
                raise RuntimeError("the ORTModule put in its place was never called (its parent calls it another "
                                   "way or keeps another reference to it)")

        @contextlib.contextmanager
        def around(model: Any) -> Iterator[None]:
            with Options(enable_compute_optimizer=False).applied(), captured_output(log), \
                    registry.applied(model, list(fixes)):
                yield

        def graph(runner: Any) -> tuple[Any, list[str]]:
            wrap = _ort.Wrap(runner, True)
            info = wrap.post_export()
            return wrap.training_model(), list(info.user_inputs) if info else []

        return Alone("ORT", _ort.new_ortmodule, ran, around, graph=graph)

    def _apply_fixes(self, engine: Engine, b: Burst, inputs: Any) -> tuple[str, ...]:
        """The compatibility fixes this burst trains with (ortlab.compat.registry), applied until the burst ends.
        "auto": the ones `ortlab check` recommends for the model (worked out once per option set, parity mode,
        instrumentation and input schema)."""
        from ortlab.compat import registry

        asked = b.cfg.fixes
        record: dict[str, Any] = {"asked": asked if asked == registry.AUTO else list(asked)}
        if asked == registry.AUTO:
            from ortlab.compat.check import check

            key = (repr(sorted(b.options.to_dict().items())), b.cfg.parity, graph_key(b.collectors),
                   repr(input_schema(inputs)))
            if key not in self._auto_fixes:
                report = check(engine.workload, registry.AUTO, b.options["onnx_opset_version"])
                self._auto_fixes[key] = (tuple(report.fixes), [x.to_dict() for x in report.blockers])
            names, record["found"] = self._auto_fixes[key]
        else:
            names = tuple(asked)  # parse() left "auto" or a tuple of names
        b.stack.enter_context(registry.applied(engine.model, names))
        b.state.fixes = tuple(names)
        record["applied"] = list(names)
        b.extra["fixes"] = record
        return tuple(names)

    @contextlib.contextmanager
    def forward(self, engine: Engine, b: Burst, step: int, inputs: Any) -> Iterator[None]:
        """Inputs the graph cannot follow are met first; an export's warnings are captured; with the fix
        pytorch-buffers (or embedding-max-norm), what ORT wrote into buffers is undone and a PyTorch pass without
        gradients advances them (and renormalizes embedding rows)."""
        from ortlab.compat import registry

        self._follow_inputs(engine, b, step, inputs)
        state = b.state
        state.exporting = [] if self.wrapper.export_pending else None
        kept = _buffers(engine.model) if set(registry.PYTORCH_PASS) & set(state.fixes) else None
        with hazards.captured(engine.model, step, state.exporting) if state.exporting is not None \
                else contextlib.nullcontext():
            yield
        if kept is not None:
            _restore_buffers(kept)
            b.stage = "buffers"
            with torch.no_grad():
                call_model(engine.model, inputs)

    def _follow_inputs(self, engine: Engine, b: Burst, step: int, inputs: Any) -> None:
        """Inputs the current graph cannot follow (ortlab.compat.inputs): a graph of their own with the fix
        graph-per-value (not under DDP: its module is fixed), else a transitions row and a record, once each."""
        per_value = "graph-per-value" in b.state.fixes and not b.cfg.distributed
        runner, row, ignored = self.wrapper.follow(inputs, b.path.name, step, per_value, b.options,
                                                   b.path / "onnx")
        if row is not None:
            b.runner = runner
            b.transitions.append(row)
        for change in ignored:
            if (change["input"], change["new"]) in b.state.ignored:
                continue
            b.state.ignored.add((change["input"], change["new"]))
            baked = ("the value was baked into it" if change["what"] == "value" else
                     "its export traced shape-dependent Python")
            text = (f"step {step}: {change['input']} {change['old']} -> {change['new']}, ORT reused the graph "
                    f"exported for {change['old']} ({baked})")
            b.transitions.append(Transition(b.path.name, step, "reused graph", text, {"inputs": [change]}, False))
            b.extra.setdefault("ignored_inputs", []).append({**change, "step": step, "text": text})

    def after_step(self, engine: Engine, b: Burst, step: int, inputs: Any, row: dict[str, Any]) -> None:
        """Whether ORT exported in this step, from ORT's own record (the transition row is ortlab's guess); what
        a new graph was exported with; a fallback to PyTorch at step 0."""
        wrapper, state = self.wrapper, b.state
        if wrapper.exported_since_last_check():
            row["exported"] = True
            if step == 0:
                b.transitions[-1].ort_exported = True
            elif b.transitions[-1].action != "new graph" or b.transitions[-1].step != step:
                b.transitions.append(Transition(b.path.name, step, "re-export", "ORT exported again mid-burst", {},
                                                True))
            else:
                b.transitions[-1].ort_exported = True
        elif step == 0 and b.transitions:
            b.transitions[-1].ort_exported = False
        if state.exporting is not None and row.get("exported"):
            wrapper.exported(inputs, hazards.unique(state.exporting))
            state.hazards += state.exporting
        state.exporting = None
        if step == 0 and wrapper.fallback_error() is not None:
            state.fallback_step = 0

    def where_failed(self, engine: Engine, b: Burst, error: BaseException) -> str | None:
        if b.stage not in ORT_STAGES:
            return None
        b.state.failed_inside = True
        b.state.error = error
        where = failure_stage(error) or f"ORTModule {b.stage}"
        if "shape inference" in where and any(isinstance(m, torch.nn.MultiheadAttention)
                                              for m in engine.model.modules()):
            b.extra["hint"] = MHA_HINT
        return where

    def outcome(self, engine: Engine, b: Burst) -> None:
        """The export's hazards; a fallback to PyTorch, which makes the burst not "ok" (its steps are PyTorch's:
        stage, reason, operator, node); and, for a fallback or a failure inside ORTModule, the blockers `ortlab
        check` finds and the fixes that remove them."""
        from ortlab.compat.errors import fallback_record

        wrapper, state = self.wrapper, b.state
        found = state.hazards or (wrapper.watch.hazards if wrapper.watch is not None else [])
        if found:  # this burst's export's, or those of the export whose graph it reused
            b.extra["hazards"] = hazards.unique(found)
        error = wrapper.fallback_error()
        if error is not None:
            when = "at step 0 (every step ran on PyTorch)" if state.fallback_step == 0 else "during the burst"
            b.extra["fallback"] = fallback_record(error, state.fallback_step)
            if b.status == RunStatus.OK:
                b.status = RunStatus.FALLBACK
                b.extra["error"] = f"ORTModule fell back to PyTorch {when}: {b.extra['fallback']['reason']}"
        if (error is not None or (b.status == RunStatus.FAILED and state.failed_inside)) and b.first_inputs is not None:
            self._locate_blockers(engine, b, error if error is not None else state.error)

    def _locate_blockers(self, engine: Engine, b: Burst, error: BaseException | None) -> None:
        """What `ortlab check` finds on the first batch, with the fixes this burst applied still on, and the fixes
        that remove it, verified as check verifies them (exporting again with them); a failure inside ORT that the
        per-operator checks do not meet is named by its node, module and source line."""
        from ortlab.compat.advice import recommend, verified
        from ortlab.compat.check import find, unverified
        from ortlab.compat.failures import step_failure

        try:
            found = find(engine.model, b.first_inputs, b.options["onnx_opset_version"])
            fixes, _, _ = verified(engine.model, b.first_inputs, found, b.options["onnx_opset_version"],
                                   applied=b.state.fixes)
        except Exception as e:  # locating is a courtesy: it must not lose the run
            b.extra["blockers_error"] = root_message(e)
            return
        blockers = found.blockers
        if not blockers and error is not None and "fallback" not in b.extra:
            # met by the whole graph only: a fix for it is seen to work by a training step (check), not here
            blockers = [step_failure(error, found.exported)]
            recommend(blockers, engine.model, b.state.fixes)
            unverified(blockers, [])
        b.extra["blockers"] = [x.to_dict() for x in blockers]
        if "fallback" in b.extra and blockers:
            first = blockers[0]
            b.extra["fallback"].update(op=b.extra["fallback"].get("op") or first.op, module=first.module,
                                       source=first.source)
        if fixes:
            cause = f"{b.extra['hint']}; " if b.extra.get("hint") else ""  # a known cause named on the failure
            b.extra["hint"] = (f"{cause}fixes {', '.join(fixes)} remove what ORTModule met here (verified by "
                               "exporting again with them): burst with fixes=\"auto\" (--fix auto); `ortlab check` "
                               "lists every blocker")
        elif blockers:
            b.extra.setdefault("hint", blockers[0].line())

    def finish(self, engine: Engine, b: Burst) -> None:
        """ORT's state after the burst; the init overhead only when this burst paid it (it exported)."""
        wrapper = self.wrapper
        if wrapper.ort_module is None:
            return
        exported = any(t.ort_exported for t in b.transitions) or b.status == RunStatus.FAILED
        info: dict[str, Any] = {"exported": exported}
        first = b.first_inputs
        readers = [("post_export", wrapper.post_export), ("fallback", wrapper.fallback),
                   ("input_shapes", (lambda: wrapper.input_shapes(first)) if first is not None else dict)]
        if exported:
            readers.append(("overhead", wrapper.overhead))
        for key, read in readers:
            try:
                info[key] = read()
            except Exception as e:  # ORT internals differ or are missing after a failure
                info[key] = None
                info.setdefault("unreadable", {})[key] = root_message(e)
                print(f"[ortlab] reading ORT's {key} failed:\n{traceback.format_exc()}", flush=True)
        b.state.info = info

    def write(self, engine: Engine, b: Burst) -> None:
        info = b.state.info
        info["features"] = parse_feature_table(files.text(b.path / "log.txt"))
        b.writer.write("ort.json", info)
        b.writer.write("transitions.json", [t.to_dict() for t in b.transitions])


def _buffers(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(buffer, buffer.detach().clone()) for buffer in model.buffers()]


def _restore_buffers(kept: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for buffer, saved in kept:
            buffer.copy_(saved)
