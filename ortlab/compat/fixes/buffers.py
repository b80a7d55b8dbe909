"""Buffers that forward mutates (a BatchNorm's running statistics and batch count, a counter) advanced by
PyTorch: ORTModule 1.19.2 gets them wrong in two ways. The export's own forward updates them once more than
training does, and ORT's graph either does not carry the update back at all (a counter, `num_batches_tracked`)
or writes it with its own formula (a BatchNorm's running statistics); after a few steps the model in eval mode is
not the one PyTorch would have trained. With this fix whatever ORT's forward (and the export) wrote into the
buffers is undone, and the module runs once in PyTorch without gradients, which updates them exactly as PyTorch
training does. It costs one forward per step."""

from ortlab.compat.blockers import BUFFER_UPDATE
from ortlab.compat.registry import Fix, FixKind, engine_side

FIX = Fix("pytorch-buffers", "buffers that forward mutates advanced by PyTorch, not by the export", FixKind.ENGINE,
          removes=lambda b: b.kind == BUFFER_UPDATE and b.op == "buffers", apply=engine_side)
