"""Small CNNs for the localizer and `ortlab repro`: a squeeze-and-excitation block nested two levels down (ORT's
gradient through its global average pool is wrong on the CPU), and the same network with the pool written as a
mean (ORT's gradients right). Plain torch: a repro script that imports these classes needs no ortlab."""

import torch
from torch import nn
from torch.nn import functional as F


class SqueezeExcite(nn.Module):
    def __init__(self, channels, squeeze, mean=False):
        super().__init__()
        self.mean = mean
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        pooled = x.mean((2, 3), keepdim=True) if self.mean else self.avgpool(x)
        return x * self.gate(self.fc2(self.act(self.fc1(pooled))))


class Block(nn.Module):
    def __init__(self, channels, mean=False):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.se = SqueezeExcite(channels, channels // 2, mean)
        self.project = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        return x + self.project(self.se(self.conv(x)))


class Net(nn.Module):
    def __init__(self, mean=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8, mean), Block(8, mean))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.blocks(F.relu(self.stem(x))).mean((2, 3)))


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(2, 3, 12, 12, generator=g),), torch.randint(0, 10, (2,), generator=g)


def nested():
    """The SE block at blocks.<i>.se: ORT's gradient is wrong there."""
    return Net(), _batch, F.cross_entropy


def correct():
    """The same network with the pool as a mean: ORT's gradients are right."""
    return Net(mean=True), _batch, F.cross_entropy
