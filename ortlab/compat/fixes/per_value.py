"""One ORTModule graph per distinct value of an argument the export baked in (a flag in `if use_residual:`, a
loop count in `range(n)`, a mode string), and per input shape when the export traced shape-dependent Python:
ORTModule turns such arguments into constants and its re-export check compares types, not values, so a later
step with another value trains the graph of the first. With this fix ortlab keeps a graph for every value it
meets (each new value is one export and a transitions row); all graphs share the module's parameters, so the
optimizer state is one. Not under DDP (several processes): DDP wraps one module. Branches on tensor values and
`.item()` are not arguments: their line is named, and the rewrite is the model's (torch.where; keep it a
tensor)."""

from ortlab.compat.blockers import BAKED_INPUT
from ortlab.compat.registry import Fix, FixKind, engine_side

FIX = Fix("graph-per-value", "an ORTModule graph per distinct value of an argument the export baked in", FixKind.ENGINE,
          removes=lambda b: b.kind == BAKED_INPUT, apply=engine_side)
