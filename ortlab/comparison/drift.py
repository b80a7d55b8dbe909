"""The reference timed again after the others: a comparison's guard against the machine's drift between bursts.

Within a burst the steps' spread narrows the interval as steps are added, but a shared CPU's speed moves from one
burst to the next: on 2 cores with a busy neighbour the demo's PyTorch step moved 20.8, 16.5, 13.0, 12.8 ms of its
thread's CPU time over four bursts a few seconds apart, and ORTModule's ratio to it read 0.81x in the first pair and
1.08-1.12x in the last three, each pair's interval about +-5 % (2026-11-28). One pair of bursts cannot see that.
So on the CPU a comparison (`after`) runs the reference's burst once more after the others (the same settings, kept
under the reference's folder as ortlab's own run, never among the user's): its two bursts then sit on either side of
the others in time, their pooled median is centred on them, and how far the two differ is the drift that
`ortlab.comparison.speed` gives every backend's median (`between`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

PURPOSE = "speed"  # the repeat's purpose in its meta.json (ortlab.runs.groups.mark_asked)
NAME = "speed-again"
SAYS = "timing PyTorch again after the others (a shared machine's speed drifts between bursts)"


def after(session: Any, runs: Mapping[str, Any], steps: int, options: Any, kwargs: Mapping[str, Any],
          stopped: bool, announce: Callable[[], None] | None = None) -> Any | None:
    """After a comparison's bursts (`runs` by backend, in `session`, the reference's, with Session.burst's
    `kwargs`): PyTorch's burst once more where it is `wanted` and no Stop came (`stopped`: one came as a burst
    ended), `announce` said first; its run, or None. What Session.compare, the Burst panel and a comparison across
    stacks each call."""
    from ortlab.engine.backends import REFERENCE

    reference = runs.get(REFERENCE)
    if reference is None or stopped or not wanted(reference, runs, kwargs):
        return None
    if announce is not None:
        announce()
    return again(session, reference, steps, options, kwargs)


def wanted(reference: Any, runs: Mapping[str, Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether to time the reference again: it and every other backend finished, on the CPU, in one process."""
    from ortlab.runs.run import RunStatus

    others = [r for r in runs.values() if r is not reference]
    return (bool(others) and all(r.status == RunStatus.OK for r in (reference, *others))
            and reference.meta.get("device") == "cpu" and int(kwargs.get("nproc") or 1) == 1
            and int(kwargs.get("nnodes") or 1) == 1)


def again(session: Any, reference: Any, steps: int, options: Any, kwargs: Mapping[str, Any]) -> Any | None:
    """The reference's burst once more, as ortlab's own run under its folder (None where it failed: the comparison
    keeps its runs and times them without it). A step callback of the user's does not see its steps."""
    try:
        with session.asking(reference.path, PURPOSE):
            return session.burst(reference.backend, steps, options, **{**kwargs, "name": NAME, "on_step": None})
    except KeyboardInterrupt:
        raise
    except Exception:  # a failed extra burst never costs the comparison it was adding to
        return None


def repeats_of(run: Any) -> list[Any]:
    """The bursts ortlab ran to time `run` again (`again`), finished and identical to it."""
    from ortlab.comparison.recommend import same_burst
    from ortlab.runs import groups

    folder = groups.own_folder(run.path)
    if not folder.is_dir():
        return []
    return [r for r in groups.in_folder(folder, asked=True)
            if (groups.asked_by(r) or {}).get("purpose") == PURPOSE and same_burst(r, run)]
