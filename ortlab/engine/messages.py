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
class RunTask:
    """Run what `task` ("module:function") names on the worker's engine for `config` (Engine.task), with `kwargs`;
    with `progress`, the task is handed a callback whose calls come back as Tried. The worker answers Tried...
    then Checked (the task's plain-data answer)."""

    task: str
    config: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    progress: bool = False


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
    """A task's progress: how many so far and the latest row (the localizer: each module tried)."""

    count: int
    row: dict[str, Any]


@dataclass(frozen=True)
class Checked:
    report: dict[str, Any]  # CheckReport.to_dict(), or a task's answer


@dataclass(frozen=True)
class Failed:
    """A request that could not be served. `bad_input` errors are the caller's (InputError); the rest are not."""

    kind: str
    message: str
    bad_input: bool = False
    traceback: str | None = None
