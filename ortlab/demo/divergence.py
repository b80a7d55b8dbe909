"""Models on which ORTModule 1.19.2 trains another model than PyTorch without an error, and two it trains right:
Python control flow frozen at export (a flag, a loop count, a mode string, a branch on a value or on a shape,
`.item()`), buffers mutated in forward (a counter, BatchNorm), a squeeze-and-excitation block whose ORT
gradients are wrong. Each batch is deterministic in its step; flags and sizes change from step to step.
`ortlab burst --model ortlab.demo.divergence:flag --parity` shows the verdict; `--fix auto` the cure.
docs/convergence.md ("When ORTModule trains a different model") measures them (scripts/divergence.py)."""

import torch
from torch import nn
from torch.nn import functional as F

from ortlab import Workload

WIDTH = 16


def _x(step, batch=8):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch, WIDTH, generator=g), torch.randn(batch, WIDTH, generator=g)


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)


class Flag(Body):
    def forward(self, x, use_residual):
        h = torch.tanh(self.inp(x))
        if use_residual:  # line: flag
            h = h + x
        return self.out(h)


class Loop(Body):
    def forward(self, x, n):
        h = self.inp(x)
        for _ in range(n):  # line: loop
            h = torch.tanh(h)
        return self.out(h)


class Mode(Body):
    def forward(self, x, mode):
        h = torch.tanh(self.inp(x))
        if mode == "neg":  # line: mode
            h = -h
        return self.out(h)


class ValueBranch(Body):
    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if h.mean() > 0.0:  # line: value
            h = h * 2
        return self.out(h)


class ShapeBranch(Body):
    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if x.shape[0] > 8:  # line: shape
            h = h * 2
        return self.out(h)


class Item(Body):
    def forward(self, x):
        h = torch.tanh(self.inp(x))
        k = int(h.abs().sum().item() * 10) % 5 + 1  # line: item
        return self.out(h * k)


class Temperature(Body):
    def forward(self, x, temperature):
        return self.out(torch.tanh(self.inp(x)) / temperature)


class Counter(Body):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.seen += x.shape[0]  # line: counter
        return self.out(torch.tanh(self.inp(x)))


class Norm(Body):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(WIDTH)

    def forward(self, x):
        return self.out(torch.tanh(self.norm(self.inp(x))))


class SqueezeExcite(nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, 4, 1)
        self.fc2 = nn.Conv2d(4, channels, 1)
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        h = F.relu(self.conv(x))
        scale = torch.sigmoid(self.fc2(F.relu(self.fc1(self.avgpool(h)))))
        return self.head((h * scale).mean((2, 3)))


class Clean(Body):
    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))


def _workload(model, batch, name):
    return Workload(model, batch, F.mse_loss, name=name, batch_size=8)


def flag():
    return _workload(Flag(), lambda s: ((_x(s)[0], s % 2 == 1), _x(s)[1]), "flag")


def loop():
    return _workload(Loop(), lambda s: ((_x(s)[0], 1 + s % 3), _x(s)[1]), "loop")


def mode():
    return _workload(Mode(), lambda s: ((_x(s)[0], "neg" if s % 2 else "pos"), _x(s)[1]), "mode")


def value_branch():
    return _workload(ValueBranch(), lambda s: ((_x(s)[0],), _x(s)[1]), "value branch")


def shape_branch():
    def batch(s):
        x, y = _x(s, 4 if s % 2 == 0 else 12)
        return (x,), y

    return _workload(ShapeBranch(), batch, "shape branch")


def item():
    return _workload(Item(), lambda s: ((_x(s)[0],), _x(s)[1]), "item")


def temperature():
    return _workload(Temperature(), lambda s: ((_x(s)[0], 0.5 + s % 3), _x(s)[1]), "temperature")


def counter():
    return _workload(Counter(), lambda s: ((_x(s)[0],), _x(s)[1]), "counter")


def norm():
    return _workload(Norm(), lambda s: ((_x(s)[0],), _x(s)[1]), "batch norm")


def squeeze_excite():
    def batch(s):
        g = torch.Generator().manual_seed(s)
        return (torch.randn(2, 3, 16, 16, generator=g),), torch.randint(0, 10, (2,), generator=g)

    return Workload(SqueezeExcite(), batch, F.cross_entropy, name="squeeze-and-excitation", batch_size=2)


def clean():
    return _workload(Clean(), lambda s: ((_x(s)[0],), _x(s)[1]), "clean")


CASES = ("flag", "loop", "mode", "value_branch", "shape_branch", "item", "temperature", "counter", "norm",
         "squeeze_excite", "clean")
