"""`ortlab repro`: a gradient divergence shrunk to one module and written as a script a user keeps.

The localizer (`ortlab.verdict.localize`) names the smallest module whose run alone on the backend (ORTModule,
torch.compile) reproduces the divergence; this writes that module as a regression test needing only torch (and
onnxruntime-training for ORTModule): the
script (ortlab/verdict/repro_script.py with its CASE filled in) and, beside it, a .pt file with the module
(pickled: its class is imported from the user's package or file), its state, the activations at its input and
the gradient that reached its output, captured with hooks on the run's first batch, every dropout off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.engine.backends import BACKENDS, has
from ortlab.verdict.localize import LOCALIZED, Localization, Tried, localization_of
from ortlab.verdict.repro_case import ReproError


@dataclass
class Repro:
    """The localization of a run's gradient divergence and the regression test written for it (None when the
    divergence did not reproduce in any module)."""

    run: str
    localization: Localization
    script: Path | None = None
    data: Path | None = None

    @property
    def text(self) -> str:
        """What was found and written, as `ortlab repro` prints it."""
        if self.script is None or self.data is None:
            return self.localization.text
        return (f"{self.localization.text}\nwrote {self.script} (and {self.data.name} beside it); run it: "
                f"{run_command(self.script)} (exit 1 while {self.localization.who}'s gradient is wrong)")

    def to_dict(self) -> dict[str, Any]:
        """The repro as plain data (`ortlab repro --json`)."""
        return {"run": self.run, "localization": self.localization.to_dict(),
                "script": str(self.script) if self.script else None, "data": str(self.data) if self.data else None}

    def __str__(self) -> str:
        return self.text


def run_command(script: Path) -> str:
    """The command that runs a repro script from any shell: this Python by its absolute path (the one with torch
    and onnxruntime-training; a shell's `python` may have neither), the script by its absolute path."""
    import shlex
    import sys

    return f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(script).resolve()))}"


def repro(run: Any, out: str | Path | None = None, *, model: Any = None, model_kwargs: dict | None = None,
          in_process: bool = False, progress: Callable[[int, Tried], None] | None = None) -> Repro:
    """The Repro of an ORTModule or torch.compile run (a Run or its folder) whose verdict diverged on gradients:
    the smallest module that reproduces the divergence alone (and, torch.compile, the first op inside it), and
    the script written into `out` (default: the run's folder, `repro/`) that shows it with bare ORTModule or
    torch.compile (exit 1 while the backend's gradient is wrong). The localization is
    stored in the run's verdict.json (key "localized") and reused. `model`: the factory, when the run cannot
    name it (a callable from a notebook)."""
    from ortlab.compat.registry import parse
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.session import Session
    from ortlab.runs.run import Run, load_run, write_json
    from ortlab.verdict import procedure
    from ortlab.verdict.judge import FILE

    run = run if isinstance(run, Run) else load_run(run)
    verdict = _diverged_on_gradients(run)
    known = localization_of(verdict)  # `ortlab repro`'s before, or the verdict's own search (torch.compile)
    if known is not None and known.get("path") is None:  # localized before: no module reproduces it
        return Repro(run.path.name, Localization.from_dict(known))
    factory, kwargs, seed, snapshot = _rebuild(run, model, model_kwargs)
    config = BurstConfig.from_dict(run.meta["config"])
    fixes = parse(tuple((run.meta.get("fixes") or {}).get("applied") or ()))
    folder = Path(out).expanduser().resolve() if out is not None else run.path / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    with Session(factory, kwargs, out=run.path.parent, in_process=in_process, seed=seed, snapshot=snapshot) as s:
        found = procedure.localize_module(s, config.options, fixes, config.seed, progress, folder, known,
                                          origin=f"the first batch of run {run.path.name}", backend=run.backend,
                                          compile=config.compile)
    if not known:
        write_json(run.path / FILE, {**verdict, LOCALIZED: {**found.to_dict(), "repro": None}})
    script = Path(found.repro["script"]) if found.repro else None
    return Repro(run.path.name, found, script, script.with_suffix(".pt") if script else None)


def _diverged_on_gradients(run: Any) -> dict[str, Any]:
    from ortlab.verdict.judge import DIVERGED, FILE

    name = run.path.name
    if run.backend not in BACKENDS or has(run.backend, "reference"):
        raise ReproError(f"run {name} is a {run.backend} run; ortlab repro needs an ORTModule or torch.compile run "
                         "whose verdict diverged on gradients")
    verdict = run.read_json(FILE)
    if not isinstance(verdict, dict):
        raise ReproError(f"run {name} has no verdict; compare it with PyTorch first (ortlab burst --backend both "
                         "--parity)")
    if verdict.get("status") != DIVERGED:
        raise ReproError(f"run {name}'s verdict is {verdict.get('status')!r}: nothing to reproduce (ortlab repro "
                         "needs a verdict that diverged on gradients)")
    if (verdict.get("gradients") or {}).get("agree", True):
        raise ReproError(f"run {name} diverged, but its first step's gradients agree: ortlab repro shrinks "
                         "gradient divergences only")
    return verdict


def _rebuild(run: Any, model: Any, model_kwargs: dict | None) -> tuple[Any, dict, int, str | None]:
    """The factory, its arguments, the seed and snapshot the run's model was built with."""
    from ortlab.workload import ModelRef

    rebuild = (run.meta.get("model") or {}).get("rebuild") or {}
    seed, snapshot = rebuild.get("seed", 0), rebuild.get("snapshot")
    if model is not None:
        return model, dict(model_kwargs or {}), seed, snapshot
    if rebuild.get("ref"):
        return ModelRef.from_dict(rebuild["ref"]), {}, seed, snapshot
    raise ReproError(f"run {run.path.name} does not say how to build its model again (a factory passed as a "
                     "callable, or an older run); pass it: ortlab repro RUN --model module:callable")
