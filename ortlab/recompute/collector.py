"""Collector "plans": a burst writes ORT's recompute plans (and its execution graph's recompute nodes)."""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path
from typing import Any

from ortlab.engine.types import Collector
from ortlab.recompute.observer import read_plans, recompute_nodes
from ortlab.recompute.table import PLANS_FILE

# The execution graph's recompute nodes per ORTModule: ORT saves the stage files only when it exports, and a
# later burst that reuses the wrap writes its onnx/ folder empty.
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PlanCollector(Collector):
    """Collector "plans": after the first ORTModule step, writes ORT's recompute plans into plans.json (ORTModule
    bursts only: its registry entry serves backends with ONNX stages, and config refuses the others).

    `steady_peak=True` resets the process's peak-memory counter after step 0, so the run's peak_mem_mb of
    later steps measures training steps, not the export (which dominates the first step's peak on the CPU)."""

    def __init__(self, steady_peak: bool = False):
        self.steady_peak = bool(steady_peak)
        self._engine = None
        self._cfg = None
        self._run_dir: Path | None = None
        self._data: dict[str, Any] | None = None

    def start(self, engine, cfg, run_dir: Path) -> None:
        self._engine, self._cfg, self._run_dir = engine, cfg, run_dir

    def step_begin(self, step: int) -> None:
        if step == 1 and self.steady_peak:
            _reset_peak(self._engine)

    def step_end(self, step: int) -> None:
        if step == 0:  # the collector serves backends with ONNX stages only (ortlab.engine.collectors)
            with contextlib.suppress(Exception):  # must not fail the burst; finish() retries and reports
                self._collect()

    def _collect(self) -> None:
        from ortlab.runs.run import write_json

        data = read_plans(self._engine)
        data["steady_peak"] = self.steady_peak
        self._data = data
        write_json(self._run_dir / PLANS_FILE, data)  # now: a worker that dies later keeps the plans

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        internals = engine.current.ort_internals()
        if internals is None:
            return
        if self._data is None:
            self._collect()  # failed or stopped after ORT built its session, or before: then no plans
        path = internals.stage_path("execution_model")
        ort_module = internals.ort_module
        if path is not None:
            _GRAPHS[ort_module] = recompute_nodes(path)
        if ort_module in _GRAPHS:  # a reused wrap did not export: its graph is in the burst that exported it
            self._data["execution_graph"] = _GRAPHS[ort_module]
        from ortlab.runs.run import write_json

        write_json(run_dir / PLANS_FILE, self._data)


def _reset_peak(engine) -> None:
    from ortlab.engine.peak import PeakMemory

    memory = PeakMemory(next(engine.model.parameters()).device)
    memory.reset()
    memory.close()
