"""The worker protocol: every message between the kernel side (Session) and the worker process, in one place.

Messages are pickled over a socket pair; both ends are this package, so they are plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# -- kernel -> worker


@dataclass(frozen=True)
class Init:
    """Build the workload and take its snapshot; the worker answers Ready or Failed."""

    kind: str
    target: Any
    kwargs: tuple
    label: str
    seed: int
    import_options: dict[str, Any]
    snapshot: str | None = None
    reason: str | None = None  # why a new worker was started (the first transition row says so)
    changes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunBurst:
    """Run one burst; the worker answers Started, Step..., then Done (or Failed before it started)."""

    config: dict[str, Any]


@dataclass(frozen=True)
class RunCheck:
    """Check the model for ORTModule (ortlab.compat.check); the worker answers Checked or Failed."""

    fixes: Any
    options: dict[str, Any]
    out: str | None


@dataclass(frozen=True)
class RunGradientCheck:
    """Compare the first step's gradients of both backends (ortlab.verdict); with `burst`, also the burst's steps in
    float64 PyTorch; the worker answers Checked."""

    config: dict[str, Any]
    fixes: tuple[str, ...]
    burst: bool = False


@dataclass(frozen=True)
class RunEnsemble:
    """fp32 runs of the burst's steps whose rounding differs from PyTorch's (ortlab.verdict.ensemble; `hints`:
    where they start and stop); the worker answers Checked."""

    config: dict[str, Any]
    fixes: tuple[str, ...]
    hints: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunLocalize:
    """Localize the first step's gradient divergence (ortlab.verdict.localize), optionally writing its repro;
    the worker answers Tried... then Checked (the Localization's dict)."""

    config: dict[str, Any]
    fixes: tuple[str, ...]
    repro: str | None = None
    known: dict[str, Any] | None = None
    origin: str = ""


@dataclass(frozen=True)
class Shutdown:
    pass


# -- worker -> kernel


@dataclass(frozen=True)
class Ready:
    model: dict[str, Any]


@dataclass(frozen=True)
class Started:
    path: str


@dataclass(frozen=True)
class Step:
    row: dict[str, Any]


@dataclass(frozen=True)
class Done:
    path: str


@dataclass(frozen=True)
class Tried:
    """One module tried by the localizer: how many so far and its row (Tried.to_dict())."""

    count: int
    row: dict[str, Any]


@dataclass(frozen=True)
class Checked:
    report: dict[str, Any]  # CheckReport.to_dict(), or the gradient check's dict


@dataclass(frozen=True)
class Failed:
    """A request that could not be served. `bad_input` errors are the caller's (InputError); the rest are not."""

    kind: str
    message: str
    bad_input: bool = False
    traceback: str | None = None
