"""A comparison across stacks: ORTModule on the ort stack (torch 2.6) beside torch.compile on the newest torch, each
backend in a worker of its own stack, judged against PyTorch as one process would judge them.

Stay or move is asked of the torch a user moves to, which cannot share a process with ORTModule. So each backend
is placed on a stack (`pytorch,ortmodule@ort,compile@current`; without `@`, ORTModule goes to the ort stack and
every other backend stays where this process runs), its worker started with that stack's Python and environment
(ortlab.engine.stack_env), every worker from one snapshot saved once to a file. The bursts record their first step
(parity mode), and each run is judged against PyTorch's from the two folders (ortlab.verdict.folders): here, float64
computed once for the runs judged here, where the backend runs in this process; else by `ortlab judge` in the
backend's own stack's Python (ORTModule from the current stack), where the causes of a divergence (`ortlab check`'s
fixes, the localization) can be looked for. Either way the verdict is written into the run's folder and read there.
With `nproc` > 1 each backend's ranks run on its stack with its own strategy (ortlab.comparison.distributed: the move
of a distributed job), each run judged against one process of the same global batch.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.comparison import distributed
from ortlab.engine.backends import REFERENCE, BurstError, Placed, label, named_backends
from ortlab.engine.stack_env import StackError
from ortlab.errors import InputError
from ortlab.stacks.table import STACKS, Stack, running, this_stack

if TYPE_CHECKING:
    from ortlab.comparison.summary import Comparison


class CrossStackError(InputError):
    """A comparison that cannot run across stacks as asked: the line says why and what to do."""


def default_stack(backend: str, here: Stack | None = None) -> Stack:
    """Where a backend runs when no stack is named: here when the stacks' table runs it here (ortlab.stacks.table),
    else the first stack it runs on (ORTModule from the current stack: the ort stack)."""
    here = here or this_stack()
    stacks = running(backend)
    return here if here in stacks or not stacks else stacks[0]


def placements(value: str | Sequence[str] | None) -> tuple[Placed, ...] | None:
    """The placed backends of `--backends` when one of them names a stack ("compile@current"), else None (a
    comparison in this process: ortlab.engine.backends.parse_backends reads it). Both read it with
    ortlab.engine.backends.named_backends."""
    if value is None or not any(p.stack is not None for p in named_backends(value)):
        return None
    return parse_placed(value)


def parse_placed(value: str | Sequence[str], here: Stack | None = None) -> tuple[Placed, ...]:
    """"pytorch,ortmodule@ort,compile@current" -> the placed backends, PyTorch first (added here when not named),
    read by ortlab.engine.backends.named_backends; a backend without a stack goes where default_stack says. A bad
    backend or stack, a backend the stacks' table does not run on the stack named, a backend twice: BurstError /
    StackError, one line."""
    here = here or this_stack()
    placed: list[Placed] = []
    for named in named_backends(value):
        one = Placed(named.backend, named.stack or default_stack(named.backend, here))
        twice = next((p for p in placed if p.backend == one.backend), None)
        if twice is not None:
            raise BurstError(f"{str(named)!r}: {one.backend} is already placed ({twice}); a comparison has each "
                             f"backend once, on one stack (compare {one.backend} on the other stack in a second "
                             "comparison)")
        placed.append(one)
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

    from ortlab.runs.snapshot import Snapshot
    from ortlab.verdict.record import snapshot_hash

    torch.manual_seed(seed)
    snapshot = Snapshot.take(ref.build().model)
    folder = Path(out).expanduser().resolve() / ".snapshots"
    path = folder / f"{snapshot_hash(snapshot)[:16]}.pt"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        snapshot.save(path)
    return path


def compare_stacks(model: Any, backends: str | Sequence[str] = "pytorch,ortmodule@ort,compile@current",
                   steps: int = 20, options: Any = None, *, model_kwargs: dict[str, Any] | None = None,
                   out: str | Path = "runs", **kwargs: Any) -> Comparison:
    """The Comparison of `backends` placed on their stacks ("BACKEND@STACK"; without one, ORTModule on the ort
    stack and the others here): `ortlab compare --backends ...` from Python. Every worker from one snapshot, each
    run judged against PyTorch's; its columns and recommendation name each stack and torch. `model`: an import path
    ("module:function", "file.py:function") or a factory defined in a module (a notebook's cannot cross Python
    versions: CrossStackError says what to do); `kwargs`: Session.burst's (with nproc > 1, `strategy` one for all or
    each backend's: "ortmodule=ddp,compile=fsdp2")."""
    return compare(model, dict(model_kwargs or {}), parse_placed(backends), steps, options, out=out, **kwargs)


def compare(model: Any, model_kwargs: dict[str, Any], placed: Sequence[Placed], steps: int = 20,
            options: Any = None, *, out: str | Path = "runs", model_seed: int = 0, snapshot: str | Path | None = None,
            on_step: Callable[[str, dict], None] | None = None, **kwargs: Any):
    """Each placed backend's burst in a worker of its stack, from one saved snapshot, each judged against PyTorch's
    run from the folders: a Comparison whose columns name the stack and torch of each. `model_seed`: the seed the
    model is built under (a Session's `seed`); `snapshot`: the file every worker starts from (None: the model's
    own start, saved once); `on_step(backend, row)` after each step; `kwargs`: Session.burst's. Parity mode is
    required (the verdict reads the first steps the parity bursts record)."""
    from ortlab.comparison import drift
    from ortlab.comparison.summary import Comparison
    from ortlab.engine.config import made_elsewhere
    from ortlab.engine.session import Session
    from ortlab.runs.run import ENDED_EARLY
    from ortlab.workload import ModelRef

    here = this_stack()
    if not kwargs.get("parity", True):
        why = "a comparison across stacks judges each run from the first step its parity burst records"
        raise CrossStackError(f"{why}: burst in parity mode (parity=True)", cli=f"{why}: drop --no-parity")
    if kwargs.get("nnodes", 1) > 1:
        raise CrossStackError("a comparison across stacks runs each backend's ranks on this machine: --nnodes is "
                              "for a comparison on one stack (--nproc runs the ranks here)")
    ref = ModelRef.of(model, **model_kwargs)
    check_crossable(ref)
    from ortlab.engine.stack_env import environment

    for stack in dict.fromkeys(p.stack for p in placed if p.stack != here):  # built (or refused) before any burst
        environment(stack)
    strategies = distributed.strategies(placed, kwargs.pop("strategy", None), kwargs, here)  # refused: no rank ran
    kwargs = {"parity": True, **kwargs}
    snapshot = snapshot or save_snapshot(ref, model_seed, out)
    sessions: dict[Stack, Session] = {}
    runs: dict[str, Any] = {}
    stopped = False  # a Stop came as a burst ended (Session.stop_asked)
    try:
        for p in placed:
            if p.stack not in sessions:
                sessions[p.stack] = Session(ref, out=out, seed=model_seed, snapshot=snapshot, stack=str(p.stack))
            step = (lambda row, b=p.backend: on_step(b, row)) if on_step else None
            elsewhere = made_elsewhere() if p.stack != here else contextlib.nullcontext()
            with elsewhere:  # the worker checks what runs there; this process may not run it (ORTModule)
                runs[p.backend] = sessions[p.stack].burst(p.backend, steps, options, on_step=step, **kwargs,
                                                          strategy=strategies[p.backend])
            stopped = sessions[p.stack].stop_asked
            if runs[p.backend].status in ENDED_EARLY or stopped:
                break
        reference = next((p for p in placed if p.backend == REFERENCE), None)
        if reference is not None:  # PyTorch timed again after the others on the CPU, in its own stack's worker
            with made_elsewhere() if reference.stack != here else contextlib.nullcontext():
                drift.after(sessions[reference.stack], runs, steps, options,
                            {**kwargs, "strategy": strategies[REFERENCE]}, stopped=stopped)
    finally:
        for session in sessions.values():
            session.close()
    if kwargs.get("nproc", 1) > 1:  # each judged against one process as it ended; here both from the folders
        distributed.judge(runs, placed, progress=kwargs.get("progress", False))
    else:
        judge(runs, placed, progress=kwargs.get("progress", False))
    return Comparison(runs=runs, backends=tuple(p.backend for p in placed), stacks=stacks_of(placed, runs))


def judge(runs: dict[str, Any], placed: Sequence[Placed] = (), progress: bool = False) -> dict[str, str]:
    """Each other backend's run against PyTorch's, from their folders, each verdict.json written into its run's
    folder. Where each pair is judged: judging_plan (here two at a time, one float64 session serving both; a
    backend that cannot run here in its own stack's Python). Returns why each backend whose judging failed there
    has no verdict (its run folder holds a "not judged" one saying why); empty when every pair was judged."""
    from ortlab.runs.run import ENDED_EARLY
    from ortlab.verdict.folders import judge_runs

    pytorch = runs.get(REFERENCE)
    if pytorch is None or pytorch.status in ENDED_EARLY:
        return {}
    here = this_stack()
    ran = [b for b, r in runs.items() if b != REFERENCE and r.status not in ENDED_EARLY]
    failed: dict[str, str] = {}
    for stack, backends in judging_plan(ran, {p.backend: p.stack for p in placed}, here):
        pair = [runs[b] for b in backends]
        if stack != here:
            failed.update(judge_elsewhere(stack, pytorch, pair, progress))
            continue
        if progress:
            names = " and ".join(label(r.backend) for r in pair)
            print(f"ortlab: judging {names} against PyTorch from their run folders (float64 here, torch "
                  f"{_torch_here()})", file=sys.stderr, flush=True)
        if len(pair) == 2:
            judge_runs(pair[0], pair[1], reference=pytorch)
        else:
            judge_runs(pytorch, pair[0])
    return failed


def judged_on(backend: str, stack: Stack | None, here: Stack | None = None,
              runs_here: Callable[[str], bool] | None = None) -> Stack:
    """The stack whose Python judges `backend`'s run against PyTorch's: this process's when the backend runs here
    (its causes, `ortlab check`'s fixes and the localization, need the backend in the judging process), else the
    stack its run was made on (ORTModule from the current stack: the ort stack). `runs_here(backend)`: whether a
    backend runs in this process (default: its registry's check, ortlab.engine.backends.unavailable)."""
    from ortlab.engine.backends import unavailable

    here = here or this_stack()
    runs_here = runs_here or (lambda b: unavailable(b) is None)
    if runs_here(backend):
        return here
    return stack or default_stack(backend, here)


def judging_plan(backends: Sequence[str], stacks: dict[str, Stack], here: Stack | None = None,
                 runs_here: Callable[[str], bool] | None = None) -> list[tuple[Stack, tuple[str, ...]]]:
    """Which backends are judged together against PyTorch, and in which stack's Python (judged_on): two at a
    time per stack, in the order given (`stacks`: where each backend ran)."""
    here = here or this_stack()
    groups: dict[Stack, list[str]] = {}
    for backend in backends:
        groups.setdefault(judged_on(backend, stacks.get(backend), here, runs_here), []).append(backend)
    return [(stack, tuple(names[i:i + 2])) for stack, names in groups.items() for i in range(0, len(names), 2)]


def judge_elsewhere(stack: Stack, pytorch: Any, others: Sequence[Any], progress: bool = False) -> dict[str, str]:
    """`ortlab judge` of one or two runs against PyTorch's, run by `stack`'s Python and environment (those its
    workers use: ortlab.engine.stack_env), which writes each verdict.json with the causes it finds there. A
    failure (no JSON back): a "not judged" verdict written into each run's folder with its one-line error, the
    stderr's tail kept beside it (JUDGE_LOG), that line on stderr, and {backend: line} returned; the runs stay."""
    names = " and ".join(label(r.backend) for r in others)
    first = [str(others[0].path), str(others[1].path), "--reference", str(pytorch.path)] if len(others) == 2 \
        else [str(pytorch.path), str(others[0].path)]
    announce = (f"ortlab: judging {names} against PyTorch from their run folders in the {stack} stack's Python "
                f"(float64 there, torch {STACKS[stack].torch}), where {names} runs") if progress else None
    return judge_there(stack, first, others, lambda done: _judged(done.stdout, others), announce)


def judge_there(stack: Stack | None, args: Sequence[str], runs: Sequence[Any], judged: Callable[[Any], bool],
                announce: str | None = None) -> dict[str, str]:
    """`ortlab judge ARGS --json` run by `stack`'s Python and environment (those its workers use:
    ortlab.engine.stack_env; `announce` said first); `judged(done)` tells whether it gave `runs` their verdicts.
    Otherwise a "not judged" verdict is written into each run's folder with the one-line error, the stderr's tail
    kept beside it (JUDGE_LOG), that line on stderr, and {backend: line} returned; the runs stay."""
    import subprocess

    from ortlab.engine.stack_env import worker_interpreter

    why = None
    try:
        python, env = worker_interpreter(stack)
        if announce:
            print(announce, file=sys.stderr, flush=True)
        done = subprocess.run([python, "-m", "ortlab.cli", "judge", *args, "--json"], env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
    except (OSError, StackError) as e:
        done, why = None, str(e)
    if done is not None and judged(done):
        return {}
    said = [] if done is None else [line for line in done.stderr.splitlines() if line.strip()]
    if why is None:
        why = next((s for s in reversed(said) if s.startswith("ortlab judge: ")), None) or \
            (said[-1] if said else f"it exited {done.returncode if done else '?'} with no verdict")
    line = f"not judged: judging in the {stack or 'this'} stack's Python failed: {why.removeprefix('ortlab judge: ')}"
    names = " and ".join(label(r.backend) for r in runs)
    print(f"ortlab: {names}: {line}", file=sys.stderr, flush=True)
    for run in runs:
        _not_judged(run, line, said[-TAIL:])
    return {r.backend: line for r in runs}


JUDGE_LOG = "judge-stderr.log"  # in the run's folder: the failed judging process's stderr, its last TAIL lines
TAIL = 40


def _judged(stdout: str, others: Sequence[Any]) -> bool:
    """Whether `ortlab judge --json` printed a verdict on each run (exit 1 is a diverged verdict, not a failure)."""
    import json

    judged = None
    lines = stdout.splitlines(keepends=True)
    for i in (i for i, line in enumerate(lines) if line.rstrip() == "["):  # after whatever a library printed
        with contextlib.suppress(ValueError):
            judged = json.loads("".join(lines[i:]))
            break
    done = {str(Path(j.get("other", "")).resolve()) for j in judged if isinstance(j, dict) and j.get("verdict")} \
        if isinstance(judged, list) else set()
    return all(str(Path(r.path).resolve()) in done for r in others)


def _not_judged(run: Any, line: str, tail: Sequence[str]) -> None:
    """A "not judged" verdict.json in the run's folder saying why, and the judging process's stderr tail beside."""
    from ortlab.runs.run import write_json
    from ortlab.verdict.judge import FILE, NOT_JUDGED, Verdict

    notes = []
    if tail:
        with contextlib.suppress(OSError):
            (Path(run.path) / JUDGE_LOG).write_text("\n".join(tail) + "\n", encoding="utf-8")
            notes.append(f"the judging process's stderr ends in {Path(run.path) / JUDGE_LOG}")
    with contextlib.suppress(OSError):  # a folder that cannot be written: the line on stderr still says why
        write_json(Path(run.path) / FILE, Verdict(NOT_JUDGED, line, notes=notes).to_dict())


def stacks_of(placed: Sequence[Placed], runs: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each backend's stack and the torch its run recorded (the lock's pin when it has no run)."""
    out = {}
    for p in placed:
        run = runs.get(p.backend)
        torch = (run.versions.get("torch") if run is not None else None) or STACKS[p.stack].torch
        out[p.backend] = {"stack": str(p.stack), "torch": str(torch).split("+")[0]}
    return out


def _torch_here() -> str:
    import torch

    return torch.__version__.split("+")[0]


__all__ = ["CrossStackError", "Placed", "check_crossable", "compare", "crosses", "judge", "judge_elsewhere",
           "judge_there", "judged_on", "judging_plan", "parse_placed", "placements"]
