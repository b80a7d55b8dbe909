"""Where collector "time" reads a backend's step time from: one adapter per way of profiling, which a backend's
registry entry names (`ortlab.engine.backends.Registered.time_source`), so that the collector never asks what
kind of backend it serves. The collector keeps the steps, their phases' wall clock and what profiling cost; a
source starts and stops its profiler around the profiled steps and turns what it read into time.json's rows.

`TorchProfiler`: torch.profiler on the profiled steps only (record_shapes off), with a record_function range per
module (forward hooks) and per phase; `TorchProfilerFused` without the module ranges (hooks added to a compiled
module would recompile it; its operators are fused across modules). On CUDA (ProfilerActivity.CUDA) the time
attributed is the GPU's: each kernel's, through its correlation id to the op, module and phase that launched it.
`OrtProfiler`: ORT's own profiler in the session of the backend's ORT wrap (every node's kernel time), switched on
as ORTModule creates its session at step 0 (ortlab._ort.profile_sessions) and ended after the last profiled step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.runs.files import json_lines, read_json
from ortlab.timing.collector import TRACE

ORT_PREFIX = "ort_profile"  # ORT writes <prefix>_<time>.json; read into time.json and trace.json, then removed
CUDA_KERNELS = "CUDA kernels (GPU time, by the op and phase that launched them)"
CUDA_OUTSIDE = ("the rest of the phase's wall time (the host's Python, launches, hooks, waits; below zero when the "
                "phase's kernels ran on after it ended: the GPU runs behind the host)")
TOP_KERNELS = 30  # kernel names kept per run (time.json's cuda_kernels)


class TimeSource:
    """What collector "time" asks of the way its burst's backend is profiled; one instance per burst. The
    collector (`self.c`) has the profiled `steps`, their phase marks (`_marks`), the model's module names
    (`_modules`) and the engine (`_engine`)."""

    def start(self, collector: Any, run_dir: Path) -> None:
        """In the collector's start, before the backend wraps the model."""
        self.c = collector

    def step_begin(self, step: int) -> None: ...

    def phase(self, step: int, name: str) -> None:
        """As a profiled step's phase `name` begins ("end": as the step ends)."""

    def step_end(self, step: int) -> None: ...

    def stop(self) -> None:
        """After the last profiled step, or as the burst ends (called again: it does nothing then)."""

    def close(self) -> None:
        """As the collector finishes, before stop: undo any global change."""

    def result(self, run_dir: Path) -> dict[str, Any]:
        """time.json's rows, once every profiled step was done."""
        raise NotImplementedError

    def discard(self, run_dir: Path) -> None:
        """Remove the profiler's own files from the run folder (read into time.json and trace.json)."""


class TorchProfiler(TimeSource):
    """torch.profiler on the profiled steps, with a record_function range per module and per phase."""

    module_ranges = True  # a range per module (forward hooks)

    def __init__(self) -> None:
        self._profiler: Any = None  # torch.profiler while it runs
        self._stopped: Any = None  # torch.profiler once it stopped
        self._hooks: list = []  # forward hook handles (profiled steps only)
        self._ranges: list = []  # open record_function ranges: modules
        self._phase_range: Any = None  # the open record_function range of the current phase

    def step_begin(self, step: int) -> None:
        if step == self.c.steps[0]:
            self._start()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.module_ranges:
            for name, module in self.c._engine.model.named_modules():
                self._hooks.append(module.register_forward_pre_hook(self._enter(name or "(root)")))
                self._hooks.append(module.register_forward_hook(self._exit))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profiler = profile(activities=activities, record_shapes=False)
        self._profiler.__enter__()

    def _enter(self, name: str):
        from torch.autograd.profiler import record_function

        label = f"module: {name}"

        def pre_hook(module, args):
            r = record_function(label)
            r.__enter__()
            self._ranges.append(r)

        return pre_hook

    def _exit(self, module, args, output):
        if self._ranges:
            self._ranges.pop().__exit__(None, None, None)

    def phase(self, step: int, name: str) -> None:
        if self._profiler is None:
            return
        from torch.autograd.profiler import record_function

        if self._phase_range is not None:
            self._phase_range.__exit__(None, None, None)
            self._phase_range = None
        if name != "end":
            self._phase_range = record_function(f"ortlab: step {step} {name}")
            self._phase_range.__enter__()

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._profiler is not None:
            if self._phase_range is not None:
                self._phase_range.__exit__(None, None, None)
                self._phase_range = None
            self._profiler.__exit__(None, None, None)
            self._stopped, self._profiler = self._profiler, None

    def result(self, run_dir: Path) -> dict[str, Any]:
        from ortlab.timing import profile

        compiled = not self.module_ranges
        steps = self.c.steps
        self._stopped.export_chrome_trace(str(run_dir / TRACE))
        events = read_json(run_dir / TRACE, {}).get("traceEvents", [])
        walls = {s: _phases(self.c._marks[s]) for s in steps}
        if any(e.get("cat") in profile.KERNELS for e in events):  # CUDA: the GPU's time, by what launched it
            rows, kernels = profile.cuda_rows(events, compiled=compiled)
            out = {**profile.breakdown(rows, walls, kernels=CUDA_KERNELS, outside=CUDA_OUTSIDE,
                                       waits=_waits(run_dir, steps)),
                   "device": "cuda", "cuda_kernels": kernels[:TOP_KERNELS],
                   "note": f"on CUDA: kernels are {CUDA_KERNELS}; outside is {CUDA_OUTSIDE}",
                   "tool": "torch.profiler with CUDA activity (record_shapes off) and the step's wall clock",
                   "trace": TRACE}
        else:
            out = {**profile.breakdown(profile.torch_rows(events, compiled=compiled), walls, kernels="PyTorch's ops",
                                       outside="outside PyTorch's ops (Python, hooks, the autograd engine)",
                                       waits=_waits(run_dir, steps)),
                   "tool": "torch.profiler (record_shapes off) and the step's wall clock", "trace": TRACE}
        if compiled:
            fused = "torch.compile fuses operators across modules: its kernels are not attributed to modules"
            out["note"] = f"{out['note']}; {fused}" if out.get("note") else fused
        return out


class TorchProfilerFused(TorchProfiler):
    """torch.profiler without module ranges: a compiled module's operators are fused across modules (and hooks
    added to it would recompile it)."""

    module_ranges = False


class OrtProfiler(TimeSource):
    """ORT's own profiler in the session of the backend's ORT wrap. ORT cannot start it later than the session's
    creation, so it also runs, discarded, in the steps before the first profiled one. The rest of each phase is
    outside ORT's kernels: ORTModule's Python, input and output handling, DLPack, the loss (a PythonOp's call back
    into PyTorch runs inside its node: ORT's kernel time, listed apart with its function)."""

    def __init__(self) -> None:
        self._profile: tuple[Path | None, int] | None = None
        self._python_ops: dict[str, str] = {}

    def start(self, collector: Any, run_dir: Path) -> None:
        from ortlab import _ort

        super().start(collector, run_dir)
        _ort.profile_sessions(str(run_dir / ORT_PREFIX))

    def step_end(self, step: int) -> None:
        if step == 0:
            from ortlab import _ort

            _ort.profile_sessions(None)  # ORTModule created its session: later ones (another burst) do not

    def stop(self) -> None:
        if self._profile is None:
            internals = self.c._engine.current.ort_internals()  # the burst's ORT wrap (a recorded loop: the user's)
            if internals is not None:
                self._profile = internals.end_profiling()
                self._python_ops = internals.python_ops()

    def close(self) -> None:
        from ortlab import _ort

        _ort.profile_sessions(None)

    def discard(self, run_dir: Path) -> None:
        for other in run_dir.glob(f"{ORT_PREFIX}_*.json"):
            other.unlink()

    def result(self, run_dir: Path) -> dict[str, Any]:
        from ortlab.runs.run import write_json
        from ortlab.timing import profile

        path, start_ns = self._profile or (None, 0)
        if path is None:
            return {"error": "ORT's profiler did not run: ORTModule did not create a session in this burst (it fell "
                             "back to PyTorch, or failed before; a recorded loop: the recorder must start before the "
                             "ORTModule's first step)"}
        steps, marks = self.c.steps, self.c._marks
        windows = {s: _windows(m, 1) for s, m in marks.items()}
        rows, trace = profile.ort_rows(read_json(path, {}), start_ns, windows, self.c._modules)
        write_json(run_dir / TRACE, trace)
        return {**profile.breakdown(rows, {s: _phases(marks[s]) for s in steps}, kernels="ORT's kernels",
                                    outside="outside ORT's kernels (ORTModule's Python, input/output handling, "
                                            "DLPack, the loss)",
                                    python_ops=self._python_ops, waits=_waits(run_dir, steps)),
                "tool": "ORT's profiler (ORT's kernels) and the step's wall clock", "trace": TRACE,
                "note": (f"ORT's profiler starts with ORTModule's session: it also ran, discarded, in steps 0 to "
                         f"{steps[0] - 1}; the optimizer is PyTorch's")}


def _waits(run_dir: Path, steps: list[int]) -> dict[int, float] | None:
    """A rank's wait for the slowest rank in each profiled step (its metrics' wait_s, ortlab.engine.balance); None
    for a single process."""
    rows = [r for r in json_lines(run_dir / "metrics.jsonl") if isinstance(r, dict)]
    waits = {r["step"]: r["wait_s"] for r in rows if r.get("step") in steps and r.get("wait_s") is not None}
    return waits or None


def _windows(marks: dict[str, tuple[int, int]], clock: int) -> dict[str, tuple[int, int]]:
    """A step's phases as (start, end) on one of the marks' clocks (0: perf_counter_ns, 1: epoch ns): each phase
    lasts until the next mark, the last until "end"."""
    ordered = sorted(marks.items(), key=lambda kv: kv[1][0])
    return {name: (at[clock], ordered[i + 1][1][clock]) for i, (name, at) in enumerate(ordered[:-1])}


def _phases(marks: dict[str, tuple[int, int]]) -> dict[str, float]:
    """A profiled step's phases in seconds, from its marks (they add up to the step's time)."""
    return {p: (hi - lo) / 1e9 for p, (lo, hi) in _windows(marks, 0).items()}
