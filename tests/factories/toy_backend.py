"""A fourth backend, for tests/test_backends.py: PyTorch eager with its own seed. What adding a backend takes is
this module and one line in ortlab.engine.backends.BACKENDS (the test adds it)."""

import torch

from ortlab.engine.backends.eager import Eager

SEED_OFFSET = 1000  # its random numbers (dropout, a sampler's shuffle) are not PyTorch's


class Toy(Eager):
    name = "toy"

    def begin(self, engine, b) -> None:
        torch.manual_seed(b.cfg.seed + SEED_OFFSET)
