"""Collector "time": a few chosen steps after warm-up profiled on the burst's backend, written as time.json
(each step's forward, backward and optimizer; time per module, operator type and ORT graph node) and
trace.json (a Chrome/Perfetto trace) in the run folder.

How a backend is profiled is its registry entry's time source (ortlab.timing.sources: torch.profiler with a range
per module, without them for a compiled module, or ORT's own profiler in the session of its ORT wrap, switched on
as ORTModule creates it: a burst with this collector exports anew). This collector keeps what every source shares:
the profiled steps, each phase's wall clock and what profiling cost. Steps after the last profiled one run without
any of it: their median against the profiled steps' is what profiling cost.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from ortlab.engine.backends import registered
from ortlab.engine.types import Collector
from ortlab.timing.errors import TimeError

FILE = "time.json"
TRACE = "trace.json"


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
        self._source: Any = None  # the burst's backend's (its registry entry's), made in start
        self._profiled: frozenset[int] = frozenset()
        self._started = 0  # perf_counter_ns at the current step's forward
        self._walls: dict[int, float] = {}  # step -> its time in seconds (every step)
        self._marks: dict[int, dict[str, tuple[int, int]]] = {}  # profiled step -> phase -> (perf ns, epoch ns)
        self._engine = None
        self._modules: set[str] = set()

    def start(self, engine, cfg, run_dir: Path) -> None:
        self.steps = profiled_steps({} if self._asked is None else {"steps": self._asked}, cfg.steps)
        self._profiled = frozenset(self.steps)
        self._source, self._engine = registered(cfg.backend).time_source.resolve()(), engine
        self._modules = {name for name, _ in engine.model.named_modules() if name}
        self.graph_key = f"time (ORT's profiler, {run_dir.name})"  # each burst its own session
        self._source.start(self, run_dir)

    # -- each step

    def step_begin(self, step: int) -> None:
        self._source.step_begin(step)

    def phase(self, step: int, name: str) -> None:
        now = time.perf_counter_ns()
        if name in ("forward", "loop"):
            self._started = now
        elif name == "end":
            self._walls[step] = (now - self._started) / 1e9
        if step in self._profiled:
            self._marks.setdefault(step, {})[name] = (now, time.time_ns())
            self._source.phase(step, name)

    def step_end(self, step: int) -> None:
        self._source.step_end(step)
        if step == self.steps[-1]:
            self._source.stop()

    # -- the result

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        from ortlab.runs.run import write_json

        if self._source is None:
            raise TimeError(f"the burst ended ({status}) before collector time started")
        self._source.close()
        self._source.stop()
        done = [s for s in self.steps if "end" in self._marks.get(s, {})]
        data: dict[str, Any] = {"backend": cfg.backend, "steps": self.steps, "cost": self._cost()}
        try:
            if len(done) < len(self.steps):
                data["error"] = (f"the burst ended ({status}) after {len(self._walls)} steps, before its profiled "
                                 f"steps {self.steps} were done")
            else:
                data.update(self._source.result(run_dir))
        finally:
            self._source.discard(run_dir)  # the profiler's own files, read into time.json and trace.json
        write_json(run_dir / FILE, data)

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

