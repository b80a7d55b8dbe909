"""A model whose forward branches on a flag an ORTModule option flips: ORT freezes the branch at export, so the
candidate that sets the option trains another model than PyTorch (which runs without it)."""

import os

import torch
from torch import nn
from torch.nn import functional as F

from ortlab import Workload

FLAG = "ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT"  # set to "0" by deepcopy_before_model_export=False


class Flipped(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if os.environ.get(FLAG) == "0":  # the option changes the model
            h = 3 * h + x
        return self.out(h)


def flipped(width: int = 16):
    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(8, width, generator=g),), torch.randn(8, width, generator=g)

    return Workload(Flipped(width), batch, F.mse_loss, name="flipped by an option", batch_size=8)
