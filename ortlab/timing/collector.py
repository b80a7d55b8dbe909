"""Collector "time": a few chosen steps after warm-up profiled on the burst's backend, written as time.json
(each step's forward, backward and optimizer; time per module, operator type and ORT graph node) and
trace.json (a Chrome/Perfetto trace) in the run folder.

ORTModule: ORT's own profiler (every node's kernel time), switched on as ORTModule creates its session at step 0
(ortlab._ort.profile_sessions; so a burst with this collector exports anew) and ended after the last profiled
step: ORT cannot start it later, so it also runs, discarded, in the steps before the first profiled one. The
rest of each phase is outside ORT's kernels: ORTModule's Python, input and output handling, DLPack, the loss
(a PythonOp's call back into PyTorch runs inside its node: ORT's kernel time, listed apart with its function).

PyTorch and torch.compile: torch.profiler on the profiled steps only (record_shapes off), with a record_function
range per module (forward hooks, PyTorch only: hooks added to a compiled module would recompile it) and per phase.
On CUDA (ProfilerActivity.CUDA) the time attributed is the GPU's: each kernel's, through its correlation id to the
op, module and phase that launched it (the host's op times are what launching costs there). Steps after the last
profiled one run without any of it: their median against the profiled steps' is what profiling cost.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from ortlab.engine.backends import registered
from ortlab.engine.types import Collector, TimeSource
from ortlab.timing.errors import TimeError

FILE = "time.json"
TRACE = "trace.json"
ORT_PREFIX = "ort_profile"  # ORT writes <prefix>_<time>.json; read into time.json and trace.json, then removed
CUDA_KERNELS = "CUDA kernels (GPU time, by the op and phase that launched them)"
CUDA_OUTSIDE = ("the rest of the phase's wall time (the host's Python, launches, hooks, waits; below zero when the "
                "phase's kernels ran on after it ended: the GPU runs behind the host)")
TOP_KERNELS = 30  # kernel names kept per run (time.json's cuda_kernels)


def profiled_steps(settings: dict[str, Any] | None, burst_steps: int | None) -> list[int]:
    """The steps to profile: `steps` as given (distinct, from 1 to the last step), or by default 2, 3 and 4
    (1, 2, 3 in a burst of fewer than 6 steps; fewer in a shorter one). Step 0 exports and warms up.
    `burst_steps` None: a recorded loop, whose length is not known."""
    settings = settings or {}
    if not isinstance(settings, dict) or set(settings) - {"steps"}:
        raise TimeError(f"time settings {settings!r} are not allowed; allowed: {{'steps': [2, 3, 4]}} or {{}}")
    steps = settings.get("steps")
    last = burst_steps if burst_steps is not None else 10**9
    if last < 2:
        raise TimeError("the time collector needs a burst of at least 2 steps: step 0 exports and warms up, a "
                        "later step is profiled")
    if steps is None:
        first = 2 if last >= 6 else 1
        return list(range(first, min(first + 3, last)))
    ok = (isinstance(steps, list | tuple) and len(steps) > 0 and all(type(s) is int for s in steps)
          and len(set(steps)) == len(steps) and all(1 <= s < last for s in steps))
    if not ok:
        upto = f"from 1 to {last - 1}" if burst_steps is not None else "from 1"
        raise TimeError(f"time steps {steps!r} are not allowed; allowed: a list of distinct steps {upto} (step 0 "
                        "exports and warms up), e.g. [2, 3, 4]")
    return sorted(steps)


class TimeCollector(Collector):
    """Collector "time": `collect={"time": {"steps": [2, 3, 4]}}` (see the module's docstring)."""

    changes_graph = True  # ORT's profiler is set when ORTModule creates its session: a wrap of its own
    times_phases = True

    def __init__(self, steps: list[int] | None = None):
        self._asked = steps
        self.steps: list[int] = []
        self.graph_key = "time"
        self._source = TimeSource.TORCH_PROFILER  # the burst's backend's (its registry entry)
        self._profiled: frozenset[int] = frozenset()
        self._started = 0  # perf_counter_ns at the current step's forward
        self._walls: dict[int, float] = {}  # step -> its time in seconds (every step)
        self._marks: dict[int, dict[str, tuple[int, int]]] = {}  # profiled step -> phase -> (perf ns, epoch ns)
        self._engine = None
        self._profiler = None  # torch.profiler while it runs
        self._stopped = None  # torch.profiler once it stopped
        self._hooks: list = []  # forward hook handles (PyTorch, profiled steps only)
        self._ranges: list = []  # open record_function ranges: modules
        self._phase_range = None  # the open record_function range of the current phase
        self._ort_profile: tuple[Path | None, int] | None = None
        self._python_ops: dict[str, str] = {}
        self._modules: set[str] = set()

    def start(self, engine, cfg, run_dir: Path) -> None:
        self.steps = profiled_steps({} if self._asked is None else {"steps": self._asked}, cfg.steps)
        self._profiled = frozenset(self.steps)
        self._source, self._engine = registered(cfg.backend).time_source, engine
        self._modules = {name for name, _ in engine.model.named_modules() if name}
        self.graph_key = f"time (ORT's profiler, {run_dir.name})"  # each burst its own session
        if self._source is TimeSource.ORT_PROFILER:
            from ortlab import _ort

            _ort.profile_sessions(str(run_dir / ORT_PREFIX))

    # -- each step

    def step_begin(self, step: int) -> None:
        if step == self.steps[0] and self._source is not TimeSource.ORT_PROFILER:
            self._start_torch()

    def phase(self, step: int, name: str) -> None:
        now = time.perf_counter_ns()
        if name in ("forward", "loop"):
            self._started = now
        elif name == "end":
            self._walls[step] = (now - self._started) / 1e9
        if step in self._profiled:
            self._marks.setdefault(step, {})[name] = (now, time.time_ns())
            if self._profiler is not None:
                self._annotate(step, name)

    def step_end(self, step: int) -> None:
        if step == 0 and self._source is TimeSource.ORT_PROFILER:
            from ortlab import _ort

            _ort.profile_sessions(None)  # ORTModule created its session: later ones (another burst) do not
        if step == self.steps[-1]:
            self._stop()

    # -- the profilers

    def _start_torch(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self._source is TimeSource.TORCH_PROFILER:  # not when fused: hooks on a compiled module recompile it
            for name, module in self._engine.model.named_modules():
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

    def _annotate(self, step: int, name: str) -> None:
        from torch.autograd.profiler import record_function

        if self._phase_range is not None:
            self._phase_range.__exit__(None, None, None)
            self._phase_range = None
        if name != "end":
            self._phase_range = record_function(f"ortlab: step {step} {name}")
            self._phase_range.__enter__()

    def _stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._profiler is not None:
            if self._phase_range is not None:
                self._phase_range.__exit__(None, None, None)
                self._phase_range = None
            self._profiler.__exit__(None, None, None)
            self._stopped, self._profiler = self._profiler, None
        elif self._source is TimeSource.ORT_PROFILER and self._ort_profile is None:
            internals = self._engine.current.ort_internals()  # the burst's ORT wrap (a recorded loop: the user's)
            if internals is not None:
                self._ort_profile = internals.end_profiling()
                self._python_ops = internals.python_ops()

    # -- the result

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        from ortlab.run import write_json

        if self._source is TimeSource.ORT_PROFILER:
            from ortlab import _ort

            _ort.profile_sessions(None)
        self._stop()
        done = [s for s in self.steps if "end" in self._marks.get(s, {})]
        data: dict[str, Any] = {"backend": cfg.backend, "steps": self.steps, "cost": self._cost()}
        try:
            if len(done) < len(self.steps):
                data["error"] = (f"the burst ended ({status}) after {len(self._walls)} steps, before its profiled "
                                 f"steps {self.steps} were done")
            elif self._source is TimeSource.ORT_PROFILER:
                data.update(self._ort_result(run_dir))
            else:
                data.update(self._torch_result(run_dir, self._source is TimeSource.TORCH_PROFILER_FUSED))
        finally:
            for other in run_dir.glob(f"{ORT_PREFIX}_*.json"):  # ORT's own files, read into time.json and trace.json
                other.unlink()
        write_json(run_dir / FILE, data)

    def _ort_result(self, run_dir: Path) -> dict[str, Any]:
        from ortlab.run import write_json
        from ortlab.timing import profile

        path, start_ns = self._ort_profile or (None, 0)
        if path is None:
            return {"error": "ORT's profiler did not run: ORTModule did not create a session in this burst (it fell "
                             "back to PyTorch, or failed before; a recorded loop: the recorder must start before the "
                             "ORTModule's first step)"}
        windows = {s: _windows(m, 1) for s, m in self._marks.items()}
        rows, trace = profile.ort_rows(json.loads(path.read_text()), start_ns, windows, self._modules)
        write_json(run_dir / TRACE, trace)
        return {**profile.breakdown(rows, {s: _phases(self._marks[s]) for s in self.steps}, kernels="ORT's kernels",
                                    outside="outside ORT's kernels (ORTModule's Python, input/output handling, "
                                            "DLPack, the loss)",
                                    python_ops=self._python_ops, waits=_waits(run_dir, self.steps)),
                "tool": "ORT's profiler (ORT's kernels) and the step's wall clock", "trace": TRACE,
                "note": (f"ORT's profiler starts with ORTModule's session: it also ran, discarded, in steps 0 to "
                         f"{self.steps[0] - 1}; the optimizer is PyTorch's")}

    def _torch_result(self, run_dir: Path, compiled: bool) -> dict[str, Any]:
        from ortlab.timing import profile

        self._stopped.export_chrome_trace(str(run_dir / TRACE))
        events = json.loads((run_dir / TRACE).read_text()).get("traceEvents", [])
        walls = {s: _phases(self._marks[s]) for s in self.steps}
        if any(e.get("cat") in profile.KERNELS for e in events):  # CUDA: the GPU's time, by what launched it
            rows, kernels = profile.cuda_rows(events, compiled=compiled)
            out = {**profile.breakdown(rows, walls, kernels=CUDA_KERNELS, outside=CUDA_OUTSIDE,
                                       waits=_waits(run_dir, self.steps)),
                   "device": "cuda", "cuda_kernels": kernels[:TOP_KERNELS],
                   "note": f"on CUDA: kernels are {CUDA_KERNELS}; outside is {CUDA_OUTSIDE}",
                   "tool": "torch.profiler with CUDA activity (record_shapes off) and the step's wall clock",
                   "trace": TRACE}
        else:
            out = {**profile.breakdown(profile.torch_rows(events, compiled=compiled), walls, kernels="PyTorch's ops",
                                       outside="outside PyTorch's ops (Python, hooks, the autograd engine)",
                                       waits=_waits(run_dir, self.steps)),
                   "tool": "torch.profiler (record_shapes off) and the step's wall clock", "trace": TRACE}
        if compiled:
            fused = "torch.compile fuses operators across modules: its kernels are not attributed to modules"
            out["note"] = f"{out['note']}; {fused}" if out.get("note") else fused
        return out

    def _cost(self) -> dict[str, Any]:
        """What profiling cost: the profiled steps' median time against the median of the steps after them."""
        profiled = [self._walls[s] for s in self.steps if s in self._walls]
        after = [w for s, w in self._walls.items() if s > self.steps[-1]]
        out: dict[str, Any] = {"profiled_median_s": statistics.median(profiled) if profiled else None,
                               "unprofiled_median_s": statistics.median(after) if after else None,
                               "unprofiled_steps": len(after)}
        if profiled and after:
            out["ratio"] = out["profiled_median_s"] / out["unprofiled_median_s"]
        else:
            out["reason"] = "no step ran after the profiled ones: run more steps to measure what profiling cost"
        return out


def _waits(run_dir: Path, steps: list[int]) -> dict[int, float] | None:
    """A rank's wait for the slowest rank in each profiled step (its metrics' wait_s, ortlab.balance); None for a
    single process."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
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
