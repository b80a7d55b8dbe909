"""Activation memory you can trust: an exact account from ORTModule's execution graph, PyTorch's beside it.

`memory(run)` (also `ortlab.memory`) walks a run's execution model in ORT's execution order, at the burst's
shapes, as ORT's allocation planner does: peak live activation bytes, where and in which phase (forward,
yield, backward) it peaks, the live-bytes timeline, the largest tensors alive then and the PyTorch module each
comes from; parameters, gradients, inputs and optimizer state counted apart. `torch_memory(workload)` puts
the same question to PyTorch: what autograd saves for backward. `timeline_figure(a, b)` overlays accounts.

Modules: dims (symbolic dimensions evaluated), graph (the graph read, shapes resolved), order (ORT's execution
orders), liveness (ORT's allocation planner walked), account (`MemoryAccount`), build (`memory`),
torch_account (`torch_memory`), figures (`timeline_figure`), collector (the burst collector "memory"), record
(its memory.json, and what a run's summary shows of it). Importing this package imports neither onnx,
torch, pandas nor matplotlib. No public name below equals a module's name.
"""

from ortlab.account.account import MemoryAccount
from ortlab.account.build import memory
from ortlab.account.errors import AccountError
from ortlab.account.figures import timeline_figure
from ortlab.account.torch_account import TorchAccount, torch_memory

__all__ = ["AccountError", "MemoryAccount", "TorchAccount", "memory", "timeline_figure", "torch_memory"]
