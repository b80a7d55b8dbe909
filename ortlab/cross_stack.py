"""A comparison across stacks: ORTModule on the ort stack (torch 2.6) beside torch.compile on the newest torch, each
backend in a worker of its own stack, judged against PyTorch as one process would judge them.

Stay or move is asked of the torch a user moves to, which cannot share a process with ORTModule. So each backend
is placed on a stack (`pytorch,ortmodule@ort,compile@current`; without `@`, ORTModule goes to the ort stack and
every other backend stays where this process runs), its worker started with that stack's Python and environment
(ortlab.engine.stack_env), every worker from one snapshot saved once to a file. The bursts record their first step
(parity mode), and each run is judged against PyTorch's from the two folders (ortlab.verdict.folders), float64
computed here once for the comparison.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.engine.backends import ALIASES, BACKENDS, REFERENCE, BurstError, label
from ortlab.engine.stack_env import StackError, parse_stack
from ortlab.errors import InputError, did_you_mean
from ortlab.stacks import STACKS, Stack, this_stack


class CrossStackError(InputError):
    """A comparison that cannot run across stacks as asked: the line says why and what to do."""


@dataclass(frozen=True)
class Placed:
    """A backend and the stack its worker runs on."""

    backend: str
    stack: Stack

    def __str__(self) -> str:
        return f"{self.backend}@{self.stack}"


def only_on_ort(backend: str) -> bool:
    """Whether the backend runs on the ort stack only (it has a check of its own for the process: ORTModule)."""
    return BACKENDS[backend].unavailable is not None


def default_stack(backend: str, here: Stack | None = None) -> Stack:
    """Where a backend runs when no stack is named: ORTModule on the ort stack, every other one here."""
    return Stack.ORT if only_on_ort(backend) else (here or this_stack())


def placements(value: str | Sequence[str] | None) -> tuple[Placed, ...] | None:
    """The placed backends of `--backends` when one of them names a stack ("compile@current"), else None (a
    comparison in this process: ortlab.engine.backends.parse_backends reads it)."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return parse_placed(items) if any("@" in item for item in items) else None


def parse_placed(value: str | Sequence[str], here: Stack | None = None) -> tuple[Placed, ...]:
    """"pytorch,ortmodule@ort,compile@current" -> the placed backends, PyTorch first (added here when not named).
    A bad backend or stack, a backend twice, ORTModule on the current stack: BurstError / StackError, one line."""
    here = here or this_stack()
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    placed: list[Placed] = []
    for item in items:
        name, at, stack_name = item.partition("@")
        name = name.strip()
        if name in ALIASES:
            raise BurstError(f"{item!r}: {name} stands for several backends; name each with its stack, e.g. "
                             "pytorch,ortmodule@ort,compile@current")
        if name not in BACKENDS:
            raise BurstError(f"backend {name!r} (in {item!r}) is not allowed; allowed: {', '.join(BACKENDS)}, each "
                             f"optionally @stack{did_you_mean(name, BACKENDS)}")
        if at and not stack_name.strip():
            raise StackError(f"{item!r} names no stack after '@'; allowed: {', '.join(Stack)}")
        stack = parse_stack(stack_name.strip()) if at else default_stack(name, here)
        if only_on_ort(name) and stack != Stack.ORT:
            raise StackError(f"{item!r}: {label(name)} runs on the ort stack only (onnxruntime-training 1.19.2 has "
                             f"no wheel past Python 3.11 and loads up to torch 2.6); use {name}@ort")
        twice = next((p for p in placed if p.backend == name), None)
        if twice is not None:
            raise BurstError(f"{item!r}: {name} is already placed ({twice}); a comparison has each backend once, "
                             f"on one stack (compare {name} on the other stack in a second comparison)")
        placed.append(Placed(name, stack))
    if not any(p.backend == REFERENCE for p in placed):
        placed.insert(0, Placed(REFERENCE, here))
    if len(placed) < 2:
        raise BurstError(f"a comparison needs two backends or more, not {', '.join(map(str, placed))}; e.g. "
                         "pytorch,ortmodule@ort,compile@current")
    return tuple(sorted(placed, key=lambda p: p.backend != REFERENCE))


def crosses(placed: Sequence[Placed], here: Stack | None = None) -> bool:
    """Whether a backend runs on another stack than this process's."""
    here = here or this_stack()
    return any(p.stack != here for p in placed)


def check_crossable(ref: Any) -> None:
    """CrossStackError for a model no other stack's Python can build: a notebook's factory, pickled for this
    Python's version only."""
    if ref.kind == "pickle":
        raise CrossStackError(f"model {ref.describe()} is a factory defined in this notebook or script, pickled for "
                              f"Python {sys.version_info[0]}.{sys.version_info[1]}, which another stack's Python "
                              "cannot load: put it in a module or a .py file and give it as 'module:function' or "
                              "'file.py:function'")


def save_snapshot(ref: Any, seed: int, out: str | Path) -> Path:
    """The starting snapshot every worker of the comparison loads, built here as a worker builds it (the factory
    under `seed`) and saved once, named by its SHA-256 under `<out>/.snapshots/` (the runs name the file)."""
    import torch

    from ortlab.snapshot import Snapshot
    from ortlab.verdict.record import snapshot_hash

    torch.manual_seed(seed)
    snapshot = Snapshot.take(ref.build().model)
    folder = Path(out).expanduser().resolve() / ".snapshots"
    path = folder / f"{snapshot_hash(snapshot)[:16]}.pt"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        snapshot.save(path)
    return path


def compare(model: Any, model_kwargs: dict[str, Any], placed: Sequence[Placed], steps: int = 20,
            options: Any = None, *, out: str | Path = "runs", model_seed: int = 0, snapshot: str | Path | None = None,
            on_step: Callable[[str, dict], None] | None = None, **kwargs: Any):
    """Each placed backend's burst in a worker of its stack, from one saved snapshot, each judged against PyTorch's
    run from the folders: a Comparison whose columns name the stack and torch of each. `model_seed`: the seed the
    model is built under (a Session's `seed`); `snapshot`: the file every worker starts from (None: the model's
    own start, saved once); `on_step(backend, row)` after each step; `kwargs`: Session.burst's. Parity mode is
    required (the verdict reads the first steps the parity bursts record)."""
    from ortlab.engine.config import made_elsewhere
    from ortlab.engine.session import Session
    from ortlab.run import ENDED_EARLY
    from ortlab.summary import Comparison
    from ortlab.workload import ModelRef

    here = this_stack()
    if not kwargs.get("parity", True):
        why = "a comparison across stacks judges each run from the first step its parity burst records"
        raise CrossStackError(f"{why}: burst in parity mode (parity=True)", cli=f"{why}: drop --no-parity")
    if kwargs.get("nproc", 1) > 1 or kwargs.get("nnodes", 1) > 1:
        raise CrossStackError("a comparison across stacks runs one process per backend: --nproc and --nnodes are "
                              "for a comparison on one stack")
    ref = ModelRef.of(model, **model_kwargs)
    check_crossable(ref)
    from ortlab.engine.stack_env import environment

    for stack in dict.fromkeys(p.stack for p in placed if p.stack != here):  # built (or refused) before any burst
        environment(stack)
    kwargs = {"parity": True, **kwargs}
    snapshot = snapshot or save_snapshot(ref, model_seed, out)
    sessions: dict[Stack, Session] = {}
    runs: dict[str, Any] = {}
    try:
        for p in placed:
            if p.stack not in sessions:
                sessions[p.stack] = Session(ref, out=out, seed=model_seed, snapshot=snapshot, stack=str(p.stack))
            step = (lambda row, b=p.backend: on_step(b, row)) if on_step else None
            elsewhere = made_elsewhere() if p.stack != here else contextlib.nullcontext()
            with elsewhere:  # the worker checks what runs there; this process may not run it (ORTModule)
                runs[p.backend] = sessions[p.stack].burst(p.backend, steps, options, on_step=step, **kwargs)
            if runs[p.backend].status in ENDED_EARLY:
                break
    finally:
        for session in sessions.values():
            session.close()
    judge(runs, progress=kwargs.get("progress", False))
    return Comparison(runs=runs, backends=tuple(p.backend for p in placed), stacks=stacks_of(placed, runs))


def judge(runs: dict[str, Any], progress: bool = False) -> None:
    """Each other backend's run against PyTorch's, from their folders (ortlab.verdict.folders.judge_runs writes
    each verdict.json). Two at a time against PyTorch's as the reference: one float64 session serves both."""
    from ortlab.run import ENDED_EARLY
    from ortlab.verdict.folders import judge_runs

    pytorch = runs.get(REFERENCE)
    if pytorch is None or pytorch.status in ENDED_EARLY:
        return
    others = [r for b, r in runs.items() if b != REFERENCE and r.status not in ENDED_EARLY]
    for i in range(0, len(others), 2):
        pair = others[i:i + 2]
        if progress:
            names = " and ".join(label(r.backend) for r in pair)
            print(f"ortlab: judging {names} against PyTorch from their run folders (float64 here, torch "
                  f"{_torch_here()})", file=sys.stderr, flush=True)
        if len(pair) == 2:
            judge_runs(pair[0], pair[1], reference=pytorch)
        else:
            judge_runs(pytorch, pair[0])


def stacks_of(placed: Sequence[Placed], runs: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each backend's stack and the torch its run recorded (the lock's pin when it has no run)."""
    out = {}
    for p in placed:
        run = runs.get(p.backend)
        torch = ((run.meta.get("versions") or {}).get("torch") if run is not None else None) or STACKS[p.stack].torch
        out[p.backend] = {"stack": str(p.stack), "torch": str(torch).split("+")[0]}
    return out


def _torch_here() -> str:
    import torch

    return torch.__version__.split("+")[0]


__all__ = ["CrossStackError", "Placed", "check_crossable", "compare", "crosses", "parse_placed", "placements"]
