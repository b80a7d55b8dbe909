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


def batch_norm_cnn(batch_size: int = 8, sum_loss: bool = False):
    """A small CNN with BatchNorm: under DDP each rank normalizes its own half of the batch, one process the whole
    batch (a distributed run that really trains differently, unless its BatchNorm is synchronized). `sum_loss`: the
    loss summed over the batch instead of averaged."""
    import torch
    from torch import nn

    from ortlab import Workload

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def batch(i):
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(batch_size, 3, 8, 8, generator=g) * 2 + 1, torch.randint(0, 4, (batch_size,), generator=g)

    reduction = "sum" if sum_loss else "mean"
    return Workload(model, batch, lambda out, y: nn.functional.cross_entropy(out, y, reduction=reduction),
                    name="batch-norm-cnn", batch_size=batch_size)


def plain_cnn(batch_size: int = 8, sum_loss: bool = False):
    """The same CNN without BatchNorm: nothing per rank (with `sum_loss`, only the loss's reduction differs)."""
    import torch
    from torch import nn

    from ortlab import Workload

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def batch(i):
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(batch_size, 3, 8, 8, generator=g) * 2 + 1, torch.randint(0, 4, (batch_size,), generator=g)

    reduction = "sum" if sum_loss else "mean"
    return Workload(model, batch, lambda out, y: nn.functional.cross_entropy(out, y, reduction=reduction),
                    name="plain-cnn", batch_size=batch_size)


def other_data(rank: int = 1, **kwargs):
    """Rank `rank` trains on other batches than its share of the global batch (its data depends on the process)."""
    w = gpt(**kwargs)
    inner = w.batch

    def batch(i):
        return inner(i + 1000 if int(os.environ.get("RANK", 0)) == rank else i)

    w.batch = batch
    return w
