"""The move of a distributed job across stacks: each backend's ranks on its own stack with its own strategy (ORTModule
with DDP or ZeRO-1 on the ort stack, torch.compile with FSDP2 on the newest torch), every rank from one snapshot.

A strategy is each backend's (`ortmodule=ddp,compile=fsdp2`, or one for all), refused in one line before any rank
starts where the backend or its stack cannot take it: checked here (ortlab.engine.config.BurstConfig) and, for a
backend placed on another stack, by that stack's Python, whose torch is the one its ranks run (FSDP2 on the CPU needs
a newer torch than the ort stack's). Each distributed parity burst is judged against one process of the same global
batch as it ends (ortlab.verdict.sharded, in a worker of its stack). Here the runs are judged against each other from
their folders: whether they started alike (one snapshot, every rank's batches, the same settings), which makes
their verdicts verdicts against the same one process; a run without its verdict is judged again by `ortlab judge
RUN` in its stack's Python. What each rank cost (memory, step time, time in communication) the move report sets
side by side (ortlab.move.report)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ortlab.engine.backends import BurstError, Placed, label
from ortlab.stacks.table import STACKS, Stack

SETTINGS = ("seed", "optimizer", "lr", "steps", "precision", "sampler", "nproc", "nnodes")  # what must agree

_CHECK_THERE = """\
import json, sys
from ortlab.engine.config import BurstConfig, BurstError
for backend, settings in json.loads(sys.argv[1]):
    try:
        BurstConfig(backend=backend, **settings)
    except BurstError as e:
        print(f"{backend}: {e}")
        sys.exit(3)
"""


class StrategyRefused(BurstError):
    """A strategy a backend, or the stack it is placed on, cannot take: the line names both and what is allowed."""


def strategies(placed: Sequence[Placed], value: Any, kwargs: dict[str, Any], here: Stack) -> dict[str, Any]:
    """Each placed backend's strategy (ortlab.engine.config.backend_strategies), every one checked before any rank
    starts: here by BurstConfig, and for a backend on another stack by that stack's Python as well (its torch)."""
    from ortlab.engine.config import BurstConfig, backend_strategies, made_elsewhere
    from ortlab.engine.session import checked

    wanted = backend_strategies(value, [p.backend for p in placed])
    there: dict[Stack, list[tuple[str, dict[str, Any]]]] = {}
    for p in placed:
        settings = {**checked(kwargs), "strategy": wanted[p.backend]}
        if p.stack == here:
            BurstConfig(backend=p.backend, **settings)
            continue
        with made_elsewhere():  # the backend and the strategy here; what its torch takes, there
            BurstConfig(backend=p.backend, **settings)
        if kwargs.get("nproc", 1) > 1:
            there.setdefault(p.stack, []).append((p.backend, settings))
    for stack, asked in there.items():
        refused = checked_there(stack, asked)
        if refused:
            raise StrategyRefused(refused)
    return wanted


def checked_there(stack: Stack, asked: list[tuple[str, dict[str, Any]]]) -> str | None:
    """The first of `asked` (backend, BurstConfig keywords) that `stack`'s Python refuses, as one line naming the
    backend and the stack; None when it takes all of them."""
    from ortlab.engine.stack_env import StackError, worker_interpreter

    python, env = worker_interpreter(stack)
    done = subprocess.run([python, "-c", _CHECK_THERE, json.dumps(asked, default=str)], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode == 3:
        backend, _, line = done.stdout.strip().splitlines()[-1].partition(": ")
        return f"{backend}@{stack} (torch {STACKS[stack].torch}): {line}"
    if done.returncode != 0:
        said = [s for s in done.stderr.splitlines() if s.strip()]
        raise StackError(f"the {stack} stack's Python could not check the strategies: "
                         f"{said[-1] if said else f'it exited {done.returncode}'}")
    return None


def judge(runs: dict[str, Any], placed: Sequence[Placed], progress: bool = False) -> dict[str, str]:
    """The distributed runs judged against each other from their folders (module docstring), each verdict.json
    noting it; a run without a verdict against one process judged again in its stack's Python. Returns why a
    backend has no verdict ({} when each has one)."""
    from ortlab.runs.run import ENDED_EARLY
    from ortlab.verdict.sharded import AGAINST

    ran = {b: r for b, r in runs.items() if r.status not in ENDED_EARLY}
    stacks = {p.backend: p.stack for p in placed}
    failed: dict[str, str] = {}
    for backend, run in ran.items():
        if AGAINST not in ((run.read_json("verdict.json") or {}).get("headline") or ""):
            failed.update(judge_again(stacks.get(backend), run, progress))
    if len(ran) > 1:
        line = alike(list(ran.values()))
        for run in ran.values():
            _note(run, line)
        if progress:
            print(f"ortlab: {line}", file=sys.stderr, flush=True)
    return failed


def alike(runs: Sequence[Any]) -> str:
    """Whether distributed runs started alike, from their folders, in words: one snapshot, each rank's batches
    (its judge.json), the same settings. Their verdicts against one process are then against the same one."""
    from ortlab.verdict import record

    names = ", ".join(f"{label(r.backend)} {r.meta.get('strategy', '?')} ({r.path.name})" for r in runs)
    configs = [r.meta.get("config") or {} for r in runs]
    for key in SETTINGS:
        if len({json.dumps(c.get(key), default=str) for c in configs}) > 1:
            return f"not judged against each other: {names} did not start alike ({key} " \
                   f"{' vs '.join(repr(c.get(key)) for c in configs)})"
    kept = [[record.read(rank) for rank in sorted(r.ranks, key=lambda x: int(x.path.name))] for r in runs]
    if any(not ranks or None in ranks for ranks in kept):
        return f"not judged against each other: {names}: a rank recorded no judge.json (not a parity burst)"
    snapshots = {ranks[0]["snapshot"] for ranks in kept}
    if len(snapshots) > 1 or any(k["snapshot"] not in snapshots for ranks in kept for k in ranks):
        return f"not judged against each other: {names} did not start from one snapshot"
    for rank, batches in enumerate(zip(*kept, strict=False)):
        if len({json.dumps(b["batches"]) for b in batches}) > 1:
            return f"not judged against each other: {names}: rank {rank} trained on other batches"
    steps = len(kept[0][0]["batches"])
    return (f"judged against each other from their folders: {names} started alike (snapshot "
            f"{next(iter(snapshots))[:12]}, every rank's {steps} batches, the same settings), so each verdict is "
            "against the same one process of the global batch")


def judge_again(stack: Stack | None, run: Any, progress: bool = False) -> dict[str, str]:
    """`ortlab judge RUN` of a distributed run's folder in `stack`'s Python (where its backend runs); a failure
    becomes a "not judged" verdict in its folder (cross_stack's, with the stderr's tail) and {backend: line}."""
    from ortlab.comparison.cross_stack import judge_there

    announce = (f"ortlab: judging {label(run.backend)} ({run.path.name}) against one process of the same global "
                f"batch in the {stack or 'this'} stack's Python") if progress else None
    return judge_there(stack, [str(run.path)], [run], judged=lambda done: done.returncode in (0, 1) and bool(
        (run.read_json("verdict.json") or {}).get("status")), announce=announce)


def _note(run: Any, line: str) -> None:
    """`line` among the notes of the run's verdict.json (a folder that cannot be written keeps its verdict)."""
    import contextlib

    from ortlab.runs.run import write_json

    verdict = run.read_json("verdict.json")
    if not verdict or line in (verdict.get("notes") or []):
        return
    verdict["notes"] = [*(verdict.get("notes") or []), line]
    with contextlib.suppress(OSError):
        write_json(run.path / "verdict.json", verdict)


__all__ = ["StrategyRefused", "alike", "checked_there", "judge", "judge_again", "strategies"]
