"""A fourth backend, for tests/test_backends.py: PyTorch eager with its own seed. What adding a backend takes is
this module and one line in ortlab.engine.backends.BACKENDS (the test adds it), naming the adapters it declares
for the collectors: its own here, so that the test sees the collectors ask them and nothing else."""

import torch

from ortlab.account.sources import Account, Autograd
from ortlab.activations.taps import Hooks
from ortlab.engine.backends.eager import Eager
from ortlab.timing.sources import TorchProfiler

SEED_OFFSET = 1000  # its random numbers (dropout, a sampler's shuffle) are not PyTorch's


class Toy(Eager):
    name = "toy"

    def begin(self, engine, b) -> None:
        torch.manual_seed(b.cfg.seed + SEED_OFFSET)


class ToyTime(TorchProfiler):
    """torch.profiler with module ranges, its time.json saying it was the toy's source."""

    def result(self, run_dir):
        return {**super().result(run_dir), "tool": "the toy's torch.profiler"}


class ToyAccount(Account):
    """What autograd saves in one step, taken after the burst instead of before it."""

    def after(self, engine, cfg, run_dir, status):
        return {**Autograd().before(engine, cfg), "note": "the toy's account, taken after the burst"}


class ToyTaps(Hooks):
    """Forward hooks attached for the whole burst, each call counted."""

    hooks_stay = True
    calls = 0

    def hook(self, fn):
        def counted(*args):
            type(self).calls += 1
            return fn(*args)

        return counted
