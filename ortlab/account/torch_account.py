"""`torch_memory(workload)`: what PyTorch's autograd saves for backward in one training step, per module.

Every tensor autograd saves passes through `torch.autograd.graph.saved_tensors_hooks`; the pack hook notes
its storage (tensors sharing a storage count once: views, an output saved by two ops) and the module whose
forward was running. The saved bytes are live from the save until autograd drops the saved reference in
backward, so their peak is the stash, what ORT's account calls `stashed_bytes`. Parameters, buffers and
inputs that autograd saves are PyTorch's own tensors: counted apart, as in ORT's account. What the loss
saves is counted apart too: ORTModule's graph ends at the model's outputs, the loss runs in PyTorch anyway.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

MB = 2**20
WHAT = ("What is counted: the storages autograd saves for backward (saved_tensors_hooks), once each "
        "however many ops save them, attributed to the module whose forward saved them first; live from the "
        "save until autograd drops the saved reference in backward. Not counted: forward values nobody saves "
        "(freed at once), backward temporaries and gradients, the allocator's caching. Parameters, buffers "
        "and inputs that autograd saves are counted apart (PyTorch holds them anyway), and so is what the "
        "loss saves: ORTModule's graph ends at the model's outputs.")


@dataclass
class TorchAccount:
    """Bytes autograd saves for backward during one forward and backward of a workload."""

    model: str
    inputs: dict[str, list[int]]  # input position or name -> shape
    saved_bytes: int  # activations the model's forward saves (unique storages)
    peak_saved_bytes: int  # most saved activation bytes alive at once (the model's and the loss's)
    loss_saved_bytes: int  # what the loss function saves (outside ORTModule's graph)
    state_saved_bytes: int  # parameters and buffers autograd saves (no new memory: PyTorch holds them anyway)
    input_saved_bytes: int
    tensors: int  # unique saved activation storages of the model
    per_module: list[dict[str, Any]]  # module, tensors, bytes; largest first
    top_tensors: list[dict[str, Any]]  # the largest saved storages: module, shape, dtype, bytes, saved_by
    what: str = field(repr=False, default=WHAT)

    def per_module_frame(self):
        import pandas as pd

        return pd.DataFrame(self.per_module, columns=["module", "tensors", "bytes"])

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "model", "inputs", "saved_bytes", "peak_saved_bytes", "loss_saved_bytes", "state_saved_bytes",
            "input_saved_bytes", "tensors", "per_module", "top_tensors", "what")}

    def report(self, n: int = 10) -> str:
        head = (f"saved for backward by {self.model}: {self.saved_bytes / MB:.3f} MB in {self.tensors} "
                f"tensors (peak {self.peak_saved_bytes / MB:.3f} MB with the loss's "
                f"{self.loss_saved_bytes / MB:.3f} MB)")
        return "\n".join([head, "", self.per_module_frame().head(n).to_string(index=False), "", self.what])


class _Packed:
    """What autograd keeps instead of the tensor, so that a finalizer can note when autograd drops it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor):
        self.tensor = tensor


def _workload(source: Any, inputs: Any, loss: Any, model_kwargs: dict | None, seed: int):
    import torch

    from ortlab.account.errors import AccountError
    from ortlab.workload import ModelRef, Workload

    if isinstance(source, Workload):
        return source
    if isinstance(source, torch.nn.Module):
        if inputs is None:
            raise AccountError("torch_memory(model) needs inputs=: the model's inputs for one step (a "
                               "tensor, a tuple of arguments or a dict of keyword arguments)")
        return Workload(source, lambda step: (inputs, None), loss or _sum_loss, name=type(source).__name__)
    torch.manual_seed(seed)
    return ModelRef.of(source, **(model_kwargs or {})).build()


def _sum_loss(outputs, _target):
    import torch

    flat, _ = torch.utils._pytree.tree_flatten(outputs)
    return sum(t.float().sum() for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point())


def torch_memory(workload_or_model: Any = None, inputs: Any = None, loss: Any = None, *,
                 model_kwargs: dict | None = None, step: int = 0, seed: int = 0,
                 device: str = "cpu", runner: Any = None) -> TorchAccount:
    """What autograd saves for backward in one training step: of a Workload, a model factory as
    `ortlab.Session` takes it (default: the demo), or an nn.Module with `inputs=` (and optionally `loss=`;
    default: the sum of its outputs); on `device`, with the inputs of step `step`. `runner`: the module to run
    instead of the model (its compiled module: what the compiled graphs save, attributed to "(compiled)")."""
    import torch

    from ortlab.workload import to_device

    work = _workload(workload_or_model, inputs, loss, model_kwargs, seed)
    model = work.model.to(device).train()
    batch_inputs, target = to_device(work.batch(step), torch.device(device))
    state = {p.untyped_storage().data_ptr() for p in (*model.parameters(), *model.buffers())}
    flat, _ = torch.utils._pytree.tree_flatten(batch_inputs)
    given = {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor)}
    names = {m: n or "(model)" for n, m in model.named_modules()}
    stack: list[str] = []
    seen: dict[int, dict[str, Any]] = {}  # storage -> what was saved there first
    holders: dict[int, int] = {}  # storage -> saved references autograd still keeps
    live = [0, 0]  # saved bytes alive now, the most so far
    apart = {"state": 0, "input": 0}

    def drop(key: int) -> None:
        holders[key] -= 1
        if not holders[key]:
            live[0] -= seen[key]["bytes"]

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in state or key in given:
            if key not in seen:
                seen[key] = {"bytes": 0}
                apart["state" if key in state else "input"] += storage.nbytes()
            return t
        if key not in seen:
            seen[key] = {"module": stack[-1] if stack else "(loss)", "shape": list(t.shape),
                         "dtype": str(t.dtype).removeprefix("torch."), "bytes": storage.nbytes(),
                         "saved_by": type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"}
        if not holders.get(key):
            live[0] += seen[key]["bytes"]
            live[1] = max(live)
        holders[key] = holders.get(key, 0) + 1
        packed = _Packed(t)
        weakref.finalize(packed, drop, key)
        return packed

    def unpack(packed):
        return packed.tensor if isinstance(packed, _Packed) else packed

    def enter(module, args) -> None:  # a hook that returned a value would replace the module's input/output
        stack.append(names[module])

    def leave(module, args, output) -> None:
        stack.pop()

    # module hooks name who saved what; a compiled module runs graphs, not modules (and hooks would be traced)
    hooks = [] if runner is not None else [
        h for m in names for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    if runner is not None:
        stack.append("(compiled)")
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            value = work.forward_loss(runner if runner is not None else model, batch_inputs, target)
        value.backward()
    finally:
        for h in hooks:
            h.remove()
    return _result(work, batch_inputs, seen, live[1], apart)


def _shapes(batch_inputs) -> dict[str, list[int]]:
    import torch

    if isinstance(batch_inputs, dict):
        return {str(k): list(v.shape) for k, v in batch_inputs.items() if isinstance(v, torch.Tensor)}
    items = batch_inputs if isinstance(batch_inputs, tuple | list) else (batch_inputs,)
    return {str(i): list(v.shape) for i, v in enumerate(items) if isinstance(v, torch.Tensor)}


def _result(work, batch_inputs, seen: dict[int, dict[str, Any]], peak: int,
            apart: dict[str, int]) -> TorchAccount:
    saved = [r for r in seen.values() if "module" in r]
    per: dict[str, list[int]] = {}
    for r in saved:
        counts = per.setdefault(r["module"], [0, 0])
        counts[0] += 1
        counts[1] += r["bytes"]
    per_module = [{"module": m, "tensors": c, "bytes": b}
                  for m, (c, b) in sorted(per.items(), key=lambda kv: (-kv[1][1], kv[0]))]
    model_saved = [r for r in saved if r["module"] != "(loss)"]
    return TorchAccount(
        model=work.name or type(work.model).__name__, inputs=_shapes(batch_inputs),
        saved_bytes=sum(r["bytes"] for r in model_saved), peak_saved_bytes=peak,
        loss_saved_bytes=per.get("(loss)", [0, 0])[1], state_saved_bytes=apart["state"],
        input_saved_bytes=apart["input"], tensors=len(model_saved), per_module=per_module,
        top_tensors=sorted(model_saved, key=lambda r: -r["bytes"])[:20])
