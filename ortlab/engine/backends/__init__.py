"""What differs between the backends a burst trains on (PyTorch eager, ORTModule, torch.compile), behind one
small interface: the engine's loop, the collectors and the views stay backend-blind.

A backend is asked, in this order, during one burst: `begin` (before the collectors start), `wrap` (at step 0:
the module that trains), `forward` (a context around every step's forward), `after_step`, `where_failed` (when
the burst failed), `outcome` (as the burst ends, before the collectors finish: what the run's status and record
must say), `finish` (after the collectors, inside the run's captured output) and `write` (its own files).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortlab.engine.loop import Engine, _Burst

# name -> "module:Class", loaded on first use (ORTModule's and torch.compile's imports cost seconds)
BACKENDS = {
    "pytorch": "ortlab.engine.backends.eager:Eager",
    "ortmodule": "ortlab.engine.backends.ort:OrtBackend",
    "compile": "ortlab.engine.backends.compiled:Compiled",
}
NAMES = tuple(BACKENDS)


class Backend:
    """The default: train the model as it is (PyTorch eager). One instance per Engine: it may keep what it built
    for earlier bursts (an ORTModule, a compiled module)."""

    name = "pytorch"

    def begin(self, engine: Engine, b: _Burst) -> None:
        """Before the collectors start and the first step."""

    def wrap(self, engine: Engine, b: _Burst, inputs: Any) -> Any:
        """At step 0: the module that trains (the model itself here); transitions rows go into b.transitions."""
        return engine.model

    @contextlib.contextmanager
    def forward(self, engine: Engine, b: _Burst, step: int, inputs: Any) -> Iterator[None]:
        """Around each step's forward (the code after the forward runs only when it succeeded)."""
        yield

    def after_step(self, engine: Engine, b: _Burst, step: int, inputs: Any, row: dict[str, Any]) -> None:
        """After each step's optimizer update: add to the step's row."""

    def where_failed(self, engine: Engine, b: _Burst, error: BaseException) -> str | None:
        """Where inside the backend a failure came from (None: the burst's own stage names it)."""
        return None

    def outcome(self, engine: Engine, b: _Burst) -> None:
        """As the burst ends (any status), before the collectors finish."""

    def finish(self, engine: Engine, b: _Burst) -> None:
        """After the collectors finished, inside the run's captured output."""

    def write(self, engine: Engine, b: _Burst) -> None:
        """The backend's own files in the run folder, after the output capture closed."""


def make(name: str) -> Backend:
    module, _, attr = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)()
