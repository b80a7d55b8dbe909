"""Test factories for distributed bursts: the demo, but one rank misbehaves (the rank comes from torch's
launcher, RANK in the environment)."""

import os
import signal

from ortlab.demo import gpt


def _on_rank(rank: int, step: int, act, **kwargs):
    w = gpt(**kwargs)
    inner, world = w.batch, int(os.environ.get("WORLD_SIZE", 1))

    def batch(i):  # i = step * world_size + rank
        if int(os.environ.get("RANK", 0)) == rank and i // world >= step:
            act()
        return inner(i)

    w.batch = batch
    return w


def killed(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` dies hard (like a segfault in ORT) at `step`."""
    return _on_rank(rank, step, lambda: os.kill(os.getpid(), signal.SIGKILL), **kwargs)


def raises(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` fails with a Python error at `step`."""
    def act():
        raise RuntimeError("bad batch on purpose")

    return _on_rank(rank, step, act, **kwargs)



def hangs(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` is stuck (like ORT in C++) from `step` on: the others wait for it in a collective."""
    import time

    return _on_rank(rank, step, lambda: time.sleep(3600), **kwargs)
