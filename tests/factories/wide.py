"""A wide MLP of a size set by its arguments (50M parameters by default: 200 MB of fp32 weights), for the tests of
the verdict's memory: big enough that its float64 evidence costs gigabytes, quick to train and to export."""

import torch
from torch import nn

from ortlab.workload import Workload


def mlp(width: int = 2880, depth: int = 6, classes: int = 10, batch: int = 4) -> Workload:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, classes))

    def data(step: int):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(batch, width, generator=g),), torch.randint(0, classes, (batch,), generator=g)

    return Workload(model, data, nn.functional.cross_entropy, name=f"wide MLP ({width}x{depth})", batch_size=batch)
