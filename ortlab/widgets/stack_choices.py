"""Which stacks the Burst panel offers a backend on: the stacks' table (ortlab.stacks.table) and the environments
ready here (ortlab.engine.stack_env)."""

from __future__ import annotations

from ortlab.engine.backends import BACKENDS, REFERENCE, unavailable
from ortlab.stacks.table import STACKS, Stack, this_stack


def stack_choices(backends: list[str]) -> dict[str, list[tuple[str, str]]]:
    """For each backend that another stack can run too (the stacks' table says where each runs), the stacks it can
    run on (its environment exists or can be built here: ortlab.engine.stack_env.ready), each named with its torch;
    none when no other stack is ready."""
    from ortlab.engine.stack_env import ready
    from ortlab.stacks.table import running

    here = this_stack()
    others = [s for s in Stack if s != here and ready(s) is None]
    shown = lambda s: (f"{s} (torch {STACKS[s].torch}){', here' if s == here else ''}", str(s))  # noqa: E731
    return {b: [shown(here), *(shown(s) for s in others if s in running(b))] for b in backends
            if here in running(b) and any(s in running(b) for s in others)}


def elsewhere_choices() -> dict[str, list[str]]:
    """The comparisons with a backend that cannot run in this process but runs, as the stacks' table says, on
    another stack that is ready here (ORTModule, from the current stack): "ortmodule@ort" -> PyTorch here and
    ORTModule in the ort stack's worker."""
    from ortlab.engine.stack_env import ready
    from ortlab.stacks.table import running

    here = this_stack()
    where = {b: next((s for s in running(b) if s != here and ready(s) is None), None) for b in BACKENDS
             if unavailable(b) is not None}
    return {f"{b}@{stack}": [REFERENCE, b] for b, stack in where.items() if stack is not None}
