"""The one-call forms of a Session: `ortlab.session` (the shared session of a model), `ortlab.burst` and
`ortlab.check` (a burst or a check of a model without holding a Session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.engine.session import Session
from ortlab.options import Options
from ortlab.runs.run import Run

_sessions: dict[tuple, Session] = {}


def session(model: Any = None, out: str | Path = "runs", **model_kwargs: Any) -> Session:
    """The shared session for a model (and output folder): repeated `ortlab.burst()` calls reuse its worker."""
    from ortlab.workload import ModelRef

    key = (ModelRef.of(model, **model_kwargs).key, str(Path(out).expanduser().resolve()))
    if key not in _sessions:
        _sessions[key] = Session(model, model_kwargs, out=out)
    return _sessions[key]


def burst(model: Any = None, backend: str = "ortmodule", steps: int = 20, options: Options | dict | None = None, *,
          out: str | Path = "runs", in_process: bool = False, model_kwargs: dict | None = None, **kwargs: Any) -> Run:
    """Run N training steps of `model` (default: the bundled demo) on one backend and return the Run.

    `model` is a factory: 'module:callable', 'path.py:callable' or a callable returning ortlab.Workload.
    Other keywords: optimizer, lr, seed, precision, device, parity, name, progress, on_step (see Session.burst).
    """
    model_kwargs = model_kwargs or {}
    if in_process:
        with Session(model, model_kwargs, out=out, in_process=True) as s:
            return s.burst(backend, steps, options, **kwargs)
    return session(model, out, **model_kwargs).burst(backend, steps, options, **kwargs)



def check(model: Any = None, fixes: Any = "auto", options: Options | dict | None = None, *, out: str | Path = "runs",
          in_process: bool = False, model_kwargs: dict | None = None):
    """Will `model` (a factory, as for `burst`; default: the demo) train on ORTModule? A CheckReport: every
    blocker with its module and source line, the fixes that remove them, and one ORTModule training step with
    them. See Session.check."""
    model_kwargs = model_kwargs or {}
    if in_process:
        with Session(model, model_kwargs, out=out, in_process=True) as s:
            return s.check(fixes, options)
    return session(model, out, **model_kwargs).check(fixes, options)
