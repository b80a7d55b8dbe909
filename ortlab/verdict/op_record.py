"""The recording under ortlab.verdict.ops: a localized module run forward and backward in PyTorch fp32 on the
inputs and output gradient it saw (a repro case, ortlab.verdict.repro_case.capture), every aten op recorded by a
dispatch mode with its inputs' producers, its outputs' values and where it ran (the module inside the localized
one; in backward, whose backward it is). What was recorded is kept while it is judged: at most BUDGET_BYTES."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BUDGET_BYTES = 2 << 30  # the recorded values kept at most

@dataclass
class Call:
    func: Any
    args: Any  # with each tensor replaced by its Ref
    kwargs: Any
    outputs: list[Any]  # _Refs of the tensor outputs, in pytree order (None where not a tensor)
    phase: str
    where: str


@dataclass(frozen=True)
class Ref:
    kind: str  # "op" or "leaf"
    index: int
    output: int = 0


@dataclass
class Recording:
    calls: list[Call] = field(default_factory=list)
    values: dict[Ref, Any] = field(default_factory=dict)  # each produced or leaf tensor as it was
    leaves: list[str] = field(default_factory=list)  # each leaf's name
    cut: int | None = None  # recording stopped before this op (BUDGET_BYTES)
    note: str | None = None


def record(data: dict[str, Any]) -> Recording:
    """The module of a repro case (capture) run forward and backward in PyTorch fp32, every aten op recorded."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    rec = Recording()
    module, args, kwargs = prepared(data)
    names = {id(p): n for n, p in module.named_parameters()}
    names.update({id(b): n for n, b in module.named_buffers()})
    produced: dict[int, Ref] = {}
    alive: list[Any] = []  # every tensor seen, kept so that no id is reused while recording
    stack: list[str] = []
    phase = ["forward"]
    used = [0]

    def leaf(t: Any, name: str) -> Ref:
        ref = Ref("leaf", len(rec.leaves))
        rec.leaves.append(name)
        rec.values[ref] = t.detach().clone()
        produced[id(t)] = ref
        alive.append(t)
        return ref

    def ref_of(t: Any) -> Ref:
        return produced.get(id(t)) or leaf(t, names.get(id(t), "constant"))

    def where_now() -> str:
        if phase[0] == "forward":
            return stack[-1] if stack else ""
        node = torch._C._current_autograd_node()
        if node is None:
            return ""
        owner = node.metadata.get("ortlab_module") if hasattr(node, "metadata") else None
        name = node.name().removeprefix("torch::autograd::")
        return f"{owner} ({name})" if owner else name

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if rec.cut is not None:
                return func(*args, **kwargs)
            index = len(rec.calls)
            spec = tree_map(lambda v: ref_of(v) if isinstance(v, torch.Tensor) else v, (args, kwargs))
            out = func(*args, **kwargs)
            flat, _ = tree_flatten(out)
            refs = []
            for k, t in enumerate(flat):
                if not isinstance(t, torch.Tensor):
                    refs.append(None)
                    continue
                ref = Ref("op", index, k)
                rec.values[ref] = t.detach().clone()
                used[0] += t.numel() * t.element_size()
                produced[id(t)] = ref
                alive.append(t)
                refs.append(ref)
            rec.calls.append(Call(func, spec[0], spec[1], refs, phase[0], where_now()))
            if used[0] > BUDGET_BYTES:
                rec.cut, rec.note = index + 1, f"the recorded values reached {BUDGET_BYTES >> 30} GiB"
            return out

    boundaries: list[set[Any]] = []  # each open module call's inputs' autograd nodes: where its backward ends

    def pre(path: str):
        def hook(m, a):
            stack.append(path)
            boundaries.append({t.grad_fn for t in _tensors(a) if getattr(t, "grad_fn", None) is not None})
        return hook

    def post(path: str):
        def hook(m, a, output):
            stack.pop()
            _tag(output, path, boundaries.pop())
        return hook

    for key, a in [*enumerate(args), *kwargs.items()]:
        if isinstance(a, torch.Tensor):
            leaf(a, f"input {key}")
    handles = [m.register_forward_pre_hook(pre(n)) for n, m in module.named_modules() if n]
    handles += [m.register_forward_hook(post(n)) for n, m in module.named_modules() if n]
    try:
        with Recorder():
            pairs = output_gradients(module(*args, **kwargs), data["grad_outputs"])
            for _, g in pairs:
                leaf(g, "gradient at the output")
            phase[0] = "backward"
            backward(pairs)
    finally:
        for h in handles:
            h.remove()
    return rec


def prepared(data: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
    """A repro case's module in its mode with every dropout off, and its arguments, the input whose gradient the
    localizer judged made a leaf that requires grad (its gradient flows)."""
    import torch

    module = data["module"]
    module.train(data["training"])
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
    args, kwargs = list(data["args"]), dict(data["kwargs"])
    key = data["input"]
    if key is not None:
        holder: Any = args if isinstance(key, int) else kwargs
        holder[key] = holder[key].detach().requires_grad_(True)
    return module, args, kwargs


def output_gradients(output: Any, grads: list[Any]) -> list[tuple[Any, Any]]:
    """Each tensor of a module's output that requires grad, with the gradient that reached it when the case was
    captured."""
    return [(o, g) for o, g in zip(_tensors(output), grads, strict=False) if g is not None and o.requires_grad]


def backward(pairs: list[tuple[Any, Any]]) -> None:
    """The backward pass from those outputs with those gradients."""
    import torch

    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])


def _tag(output: Any, path: str, boundary: set[Any]) -> None:
    """Name `path` in the autograd nodes the module's call made (from its outputs back to its inputs' nodes, the
    `boundary`) that are not named yet (the innermost module's post hook runs first), so that a backward op says
    whose backward it is."""
    seen, todo = set(), [t.grad_fn for t in _tensors(output) if getattr(t, "grad_fn", None) is not None]
    while todo:
        node = todo.pop()
        if node is None or node in seen or node in boundary or not hasattr(node, "metadata"):
            continue
        seen.add(node)
        if "ortlab_module" in node.metadata:
            continue
        node.metadata["ortlab_module"] = path
        todo.extend(n for n, _ in node.next_functions)


def _tensors(value: Any) -> list[Any]:
    from ortlab.verdict.repro_case import _tensors as flat

    return flat(value)
