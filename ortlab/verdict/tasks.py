"""The verdict's evidence computed where the model is: in the worker that holds the Engine, or in this process.

The engine knows none of them: a Driver (ortlab.verdict.driver) sends one by reference, "module:function" (the
names below), and the engine calls it with itself and the burst's config (`Engine.task`), as the backend registry
names its adapters. Each returns plain data that crosses the worker's pipe."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab.errors import InputError

GRADIENT_CHECK = f"{__name__}:gradient_check"
ENSEMBLE = f"{__name__}:ensemble"
LOCALIZE = f"{__name__}:localize"


def gradient_check(engine: Any, cfg: Any, fixes: tuple[str, ...] | list[str] = (), burst: bool = False,
                   float64: str = "auto", peak: dict[str, Any] | None = None) -> dict[str, Any]:
    """The first batch's gradients on PyTorch and on `cfg`'s backend from the initial snapshot
    (ortlab.verdict.gradients; a float64 step where they are not allclose), with the ORTModule burst's fixes.
    ORTModule: in parity mode through the last burst's ORTModule when it was exported in parity mode without
    instrumentation (no export), otherwise a fresh one (one export). torch.compile: through the last burst's
    compiled module (its settings). `burst`: also `cfg`'s steps in float64 PyTorch ("float64": its losses and
    end state, ortlab.verdict.reference), when `float64` (ortlab.verdict.cost: "auto", "burst", "first-step")
    and its estimated need (`peak`: the PyTorch burst's peak memory, and where it was measured) allow."""
    from ortlab.engine import precision
    from ortlab.engine.config import resolve_device
    from ortlab.verdict import reference
    from ortlab.verdict.gradients import first_step

    reference_run, first64, error = None, True, None
    if burst:
        burst, error = float64_burst_fits(engine, cfg, float64, peak)
    if burst:  # first: its first step's float64 gradients serve the check too
        try:
            reference_run, first64 = reference.burst(engine.workload, engine._feed(cfg), engine.initial,
                                                     cfg.optimizer, cfg.lr, cfg.steps, cfg.seed)
        except reference.NoFloat64 as e:
            error = str(e)
    engine.initial.restore(engine.model)
    batches = engine.workload.micro_batches(engine.feed.batch, 0)  # the first optimizer step's
    runner, exports = engine.backend(cfg.backend).gradient_runner(engine, cfg, tuple(fixes), batches[0])
    device = next((p.device for p in engine.model.parameters()), resolve_device(cfg.device))
    # in the burst's precision on both backends (float64 is never autocast): PyTorch's own distance to float64
    # in that precision is what the other backend's is measured against
    with cfg.effective_options().applied(), precision.autocast(cfg.precision, device):
        check = first_step(engine.workload, fixes, cfg.seed, runner=runner, batches=batches, exact=first64 or True)
    out = {**check.to_dict(), "exported": exports}
    if precision.note(cfg.precision):
        out["notes"] = [*out.get("notes", []), precision.note(cfg.precision)]
    if reference_run is not None or error is not None:
        out["float64"] = reference_run if error is None else {"error": error}
    return out


def float64_burst_fits(engine: Any, cfg: Any, float64: str, peak: dict[str, Any] | None) -> tuple[bool, str | None]:
    """Whether the float64 burst runs for `cfg` on this engine's model (ortlab.verdict.cost), and why not."""
    from ortlab.engine.config import resolve_device
    from ortlab.verdict import cost

    device = next((p.device for p in engine.model.parameters()), resolve_device(cfg.device))
    return cost.decide(engine.model, str(cfg.optimizer), device, float64, peak)


def ensemble(engine: Any, cfg: Any, fixes: tuple[str, ...] | list[str] = (), hints: dict | None = None
             ) -> dict[str, Any]:
    """fp32 runs of `cfg`'s steps from the initial snapshot whose rounding differs from PyTorch's, the first
    with the fixes' formulas (ortlab.verdict.ensemble; `hints`: where they start and stop): their losses and
    end states."""
    from ortlab.verdict.ensemble import burst_members

    out = burst_members(engine.workload, engine._feed(cfg), engine.initial, cfg.optimizer, cfg.lr, cfg.steps,
                        cfg.seed, tuple(fixes), hints)
    engine.initial.restore(engine.model)
    return out


def localize(engine: Any, cfg: Any, fixes: tuple[str, ...] | list[str] = (),
             progress: Callable[[int, dict[str, Any]], None] | None = None, repro: str | Path | None = None,
             known: dict[str, Any] | None = None, origin: str = "") -> dict[str, Any]:
    """The smallest module whose run alone on `cfg`'s backend (ORTModule with `fixes`, torch.compile with its
    settings) reproduces the first batch's gradient divergence against float64, from the initial snapshot
    (ortlab.verdict.localize; `known`: a localization made before, reused; `progress(count, row)` after each module
    tried, the row as Tried.to_dict()), and the ops inside that module judged one by one (ortlab.verdict.ops); with
    `repro` a folder, the regression test of that module is written there (ortlab.verdict.repro)."""
    from ortlab.verdict.localize import Localization
    from ortlab.verdict.localize import localize as bisect

    alone = engine.backend(cfg.backend).alone(cfg, tuple(fixes), Path(os.devnull))  # their output is not kept
    if alone is None:
        raise InputError(f"backend {cfg.backend!r} is the reference: there is nothing of it to localize")
    engine.initial.restore(engine.model)
    batch = engine.feed.batch(0)
    told = (lambda n, row: progress(n, row.to_dict())) if progress else None
    with cfg.effective_options().applied():
        found = Localization.from_dict(known) if known else bisect(engine.workload, batch, alone, cfg.seed, told)
        if found.found and found.ops is None:
            from ortlab.verdict.ops import inside

            engine.initial.restore(engine.model)
            found.ops = inside(engine.workload, batch, found.path or "", alone, cfg.seed,
                               _op_progress(progress, found, alone.who))
    if repro is not None and found.found:
        from ortlab.verdict.repro_case import write

        engine.initial.restore(engine.model)
        found.repro = write(engine.workload, batch, found, Path(repro), cfg.seed, origin, backend_case(cfg))
    return found.to_dict()


def _op_progress(progress: Callable[[int, dict[str, Any]], None] | None, found: Any, who: str
                 ) -> Callable[[int, int], None] | None:
    """The ops judged so far as the localizer's progress rows (about ten of them, the last at the end): judging a
    module's ops one compile at a time takes a second an op."""
    if progress is None:
        return None
    import time

    started, where = time.perf_counter(), f"ops inside {found.path or 'the whole model'}"

    def told(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(len(found.tried) + done, {"path": where, "class_name": who, "verdict": f"{done} of {total} "
                     "judged", "seconds": time.perf_counter() - started})
    return told


def backend_case(cfg: Any) -> dict[str, Any]:
    """What a repro script needs to run the module on `cfg`'s backend: its name and each backend's own settings
    (torch.compile's, under its BurstConfig field)."""
    from ortlab.engine.backends import checked_settings

    return {"backend": cfg.backend, **checked_settings(cfg)}
