"""Test factories for distributed bursts: the demo, but one rank misbehaves (the rank comes from torch's
launcher, RANK in the environment)."""

import os
import signal

from ortlab.demo import gpt


def _on_rank(rank: int, step: int, act, **kwargs):
    w = gpt(**kwargs)
    inner, world, model = w.batch, int(os.environ.get("WORLD_SIZE", 1)), w.model

    def batch(i):  # i = step * world_size + rank
        if int(os.environ.get("RANK", 0)) == rank and i // world >= step:
            act(model)
        return inner(i)

    w.batch = batch
    return w


def killed(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` dies hard (like a segfault in ORT) at `step`."""
    return _on_rank(rank, step, lambda _: os.kill(os.getpid(), signal.SIGKILL), **kwargs)


def raises(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` fails with a Python error at `step`."""
    def act(_):
        raise RuntimeError("bad batch on purpose")

    return _on_rank(rank, step, act, **kwargs)



def hangs(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` is stuck (like ORT in C++) from `step` on: the others wait for it in a collective."""
    import time

    return _on_rank(rank, step, lambda _: time.sleep(3600), **kwargs)


def drifts(rank: int = 1, step: int = 1, **kwargs):
    """Rank `rank` changes a weight by itself from `step` on (a bug DDP does not see: it averages gradients only),
    after the step's parameters were checked: the next step begins out of sync."""
    import torch

    def act(model):
        with torch.no_grad():
            model.head.weight[0, 0] += 1.0

    return _on_rank(rank, step, act, **kwargs)
