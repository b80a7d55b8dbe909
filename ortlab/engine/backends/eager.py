"""PyTorch eager: the model as written, the baseline every other backend is compared with."""

from ortlab.engine.backends import Backend


class Eager(Backend):
    name = "pytorch"
