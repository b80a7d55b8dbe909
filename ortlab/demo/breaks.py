"""A model torch.compile cannot capture whole: Python in its forward that dynamo does not trace (a print), and
a branch on the batch size, for graph breaks and re-compilations (`ortlab burst --backend compile --model
ortlab.demo.breaks:model`)."""

import torch
from torch import nn
from torch.nn import functional as F

from ortlab import Workload


class Chatty(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        print(f"batch of {x.shape[0]}")  # line: break
        return self.out(h)


def model(batch_sizes: tuple[int, ...] = (8,)):
    """`batch_sizes` cycle from step to step: more than one makes torch.compile re-compile for the new shape."""

    def batch(step):
        g = torch.Generator().manual_seed(step)
        n = batch_sizes[step % len(batch_sizes)]
        return (torch.randn(n, 16, generator=g),), torch.randn(n, 16, generator=g)

    return Workload(Chatty(), batch, F.mse_loss, name="chatty", batch_size=batch_sizes[0])
