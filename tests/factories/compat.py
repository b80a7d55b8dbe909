"""Small models with ORTModule export blockers, for `ortlab check`, the fixes and the fallback status."""

import torch
from torch import nn

from ortlab import Workload


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(4, 8, generator=g),), torch.randn(4, 8, generator=g)


class Fixable(nn.Module):
    """torch.diff on the trained path and a cumulative sum of a bool mask: both fixed by ortlab."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        d = torch.diff(h, dim=-1, prepend=h[..., :1])  # line: diff
        positions = (x > 0).cumsum(-1)  # line: cumsum
        return self.out(d * positions)


class Blocked(Fixable):
    """Four blockers of four kinds at once: two fixable, an operator the exporter lacks and one ORT cannot
    differentiate."""

    def forward(self, x):
        y = super().forward(x)
        rounded = torch.round(self.inp(x))  # line: round
        counts = torch.histc(x, bins=4)  # line: histc
        return y + rounded + counts.sum()


def fixable():
    return Workload(Fixable(), _batch, nn.functional.mse_loss, name="fixable", batch_size=4)


def blocked():
    return Workload(Blocked(), _batch, nn.functional.mse_loss, name="blocked", batch_size=4)
