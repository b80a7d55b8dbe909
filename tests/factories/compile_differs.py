"""A small model whose torch.compile run really differs from eager in one op: a custom op (`ortlab_test::gain`,
x * 2 in eager) whose inductor decomposition, registered here, computes x * 2.02. What a wrong lowering in a
compiler looks like to the verdict; imported by the worker with the factory, so only its process is affected."""

import torch
from torch import nn

from ortlab.workload import Workload


@torch.library.custom_op("ortlab_test::gain", mutates_args=())
def gain(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


@gain.register_fake
def _(x):
    return torch.empty_like(x)


gain.register_autograd(lambda ctx, grad: grad * 2.0)


def _register() -> None:
    try:
        from torch._inductor.decomposition import register_decomposition
    except ImportError:
        return
    register_decomposition(torch.ops.ortlab_test.gain.default)(lambda x: x * 2.02)


_register()


class Gained(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        return self.out(gain(torch.tanh(self.inp(x))))


def model(width: int = 16) -> Workload:
    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)

    return Workload(Gained(width), batch, nn.functional.mse_loss, name="a model torch.compile lowers wrongly",
                    batch_size=6)
