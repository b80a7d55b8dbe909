"""The first step's float64 gradients one block at a time: the yardstick of the gradient check without a float64
copy of the model.

A float64 copy of the whole model costs 16 bytes a parameter (its weights and gradients), on top of everything
training holds: more than training itself at 1B parameters. The float64 step does not need it. The model's own
forward runs on float64 inputs, and each unit of its module tree (a block that a ModuleList or Sequential repeats, and
every other module holding parameters: embeddings, the final norm, the head) runs through an autograd Function that
casts that unit's weights to float64 for the moment it runs, keeps only its float64 inputs, and in backward runs the
unit again from them (activation checkpointing, in float64) to take its float64 gradients, which are handed to a sink
and freed before the next unit's. The arithmetic is the same float64 step, up to the order float64 sums in (the
check's test compares it with a float64 copy of the whole model, to 1e-12); what stays in memory is one unit's
float64 weights and gradients, and the float64 activations at the units' boundaries.

Parameters that belong to no unit (a tensor a container holds itself, a position embedding on the root) and the
buffers outside the units are cast in place for the step and put back after: they are judged "whole" with the
rest of the model around them, and said so. A model whose units cannot be replayed alone (an op inside one without
a float64 kernel, state a unit keeps between calls that a second call changes) raises NoFloat64 naming the unit;
the caller then takes the whole-model float64 step where it fits, and says which it used.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ortlab.verdict.reference import NoFloat64, double, keep_float64

Sink = Callable[[str, torch.Tensor], None]  # (parameter name, its float64 gradient): called once per parameter


@dataclass
class Unit:
    """One module replayed alone: its path, the module, its parameters (the model's names for them)."""

    path: str
    module: torch.nn.Module
    names: dict[str, str]  # the unit's local parameter name -> the model's name (a tied weight: one of its names)


@dataclass
class Plan:
    """How the model is cut: its units, and what stays whole (parameters and buffers owned by no unit)."""

    units: list[Unit]
    whole_parameters: list[str]
    whole_buffers: list[str]

    @property
    def largest(self) -> int:
        """The largest unit's parameter count: what one unit's float64 replay holds (8 bytes each, twice)."""
        return max((sum(p.numel() for p in u.module.parameters()) for u in self.units), default=0)

    def describe(self) -> str:
        blocks = len(self.units)
        whole = self.whole_parameters
        return (f"float64 block by block ({blocks} units"
                + (f"; {len(whole)} parameter{'s' if len(whole) > 1 else ''} outside them judged whole: "
                   f"{', '.join(whole[:3])}{'...' if len(whole) > 3 else ''}" if whole else "") + ")")


def plan(model: torch.nn.Module) -> Plan:
    """The units of `model`: each child (holding parameters) of a ModuleList or Sequential of at least two such
    children is a block; a module with parameters and no child holding any is a unit of its own; the rest is
    descended into. Parameters and buffers owned by no unit stay whole."""
    units: list[Unit] = []
    names_of = _names(model)

    def holds(m: torch.nn.Module) -> bool:
        return any(True for _ in m.parameters())

    def visit(m: torch.nn.Module, prefix: str) -> None:
        children = [(n, c) for n, c in m.named_children() if holds(c)]
        repeated = isinstance(m, torch.nn.ModuleList | torch.nn.Sequential) and len(children) >= 2
        if repeated or not children:
            for n, c in (children if repeated else [("", m)]):
                path = f"{prefix}{n}" if repeated else prefix.rstrip(".")
                if not holds(c) or (c is model and not repeated):
                    continue
                local = {ln: names_of[id(p)] for ln, p in c.named_parameters(remove_duplicate=False)}
                units.append(Unit(path, c, local))
            return
        for n, c in children:
            visit(c, f"{prefix}{n}.")

    visit(model, "")
    in_units = {id(p) for u in units for p in u.module.parameters()}
    buffers_in = {id(b) for u in units for b in u.module.buffers()}
    whole = [n for n, p in model.named_parameters() if id(p) not in in_units]
    whole_buffers = [n for n, b in model.named_buffers() if id(b) not in buffers_in]
    return Plan(units, whole, whole_buffers)


def _names(model: torch.nn.Module) -> dict[int, str]:
    """Each parameter's name in the model (the first, for a tied one), by identity."""
    out: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), n)
    return out


def step(workload: Any, batches: list[tuple[Any, Any]], sink: Sink, seed: int = 0,
         the_plan: Plan | None = None) -> float:
    """One float64 forward and backward of the workload's model (every micro-batch, dropout off) unit by unit:
    `sink(name, gradient)` once per trained parameter that gets a gradient, as soon as its last use is done (the
    gradient is float64, on the model's device, and freed after the call unless the sink keeps it). Returns the
    float64 loss (the sum of the micro-batches'). The model is as before afterwards (weights, buffers, gradients).
    Raises NoFloat64 when the model or a unit cannot run in float64, naming which."""
    from ortlab.common.parity import parity

    model = workload.model
    chosen = the_plan or plan(model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    runner = _Runner(chosen, trained, sink)
    saved_grads = {n: p.grad for n, p in model.named_parameters()}
    was_training = model.training
    model.train()
    try:
        with _whole_in_float64(model, chosen), runner.patched(), parity(model, True, seed), keep_float64():
            for p in model.parameters():
                p.grad = None
            try:
                loss = 0.0
                for j, (inputs, target) in enumerate(batches):  # workload.backward's loop, the last one marked
                    runner.last = j == len(batches) - 1  # a gradient is final only in the last micro-batch
                    out = workload.forward_loss(model, double(inputs), double(target))
                    out.backward()
                    loss += float(out.detach())
            except NoFloat64:
                raise
            except Exception as e:
                raise NoFloat64(f"the model does not run in float64 block by block: {type(e).__name__}: "
                                f"{_first_line(e)}") from e
            for name, p in model.named_parameters():  # the whole parameters' float64 gradients
                if name in trained and p.grad is not None and name not in runner.delivered:
                    sink(name, p.grad.detach())
                    runner.delivered.add(name)
                p.grad = None
        runner.flush()  # a parameter whose last use was never reached backward (it got no gradient)
    finally:
        for n, p in model.named_parameters():
            p.grad = saved_grads.get(n)
        model.train(was_training)
    return loss


class _Runner:
    """The units' forwards replaced for one float64 step, and their gradients collected: a parameter's float64
    gradient accumulates over the units (and calls) that use it and is handed to the sink after its last use."""

    def __init__(self, chosen: Plan, trained: set[str], sink: Sink):
        self.plan, self.trained, self.sink = chosen, trained, sink
        self.pending: dict[str, int] = {}  # parameter -> calls whose backward has not run yet
        self.grads: dict[str, torch.Tensor] = {}  # parameter -> float64 gradient so far
        self.delivered: set[str] = set()
        self.last = True  # in the step's last micro-batch (`step` sets it): a parameter done now is done
        # an input of every call that requires grad: a unit whose inputs do not (an embedding of token ids) is
        # still part of the graph, so that its backward runs and its weights get their gradients
        device = next((p.device for u in chosen.units for p in u.module.parameters()), torch.device("cpu"))
        self.anchor = torch.zeros((), dtype=torch.float64, device=device, requires_grad=True)

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        saved = []
        for unit in self.plan.units:
            original = unit.module.forward
            saved.append((unit.module, "forward" in unit.module.__dict__, unit.module.__dict__.get("forward")))
            unit.module.forward = self._replacement(unit, original)
        try:
            yield
        finally:
            for module, had, value in saved:
                if had:
                    module.forward = value
                else:
                    del module.forward

    def _replacement(self, unit: Unit, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self.call(unit, original, args, kwargs)

        return forward

    def call(self, unit: Unit, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        leaves, spec = tree_flatten((args, kwargs))
        where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        holder: dict[str, Any] = {}
        for name in set(unit.names.values()):
            self.pending[name] = self.pending.get(name, 0) + 1
        outputs = _Replay.apply(self, unit, original, leaves, spec, where, holder, self.anchor,
                                *[leaves[i] for i in where])
        out_leaves = list(holder["leaves"])
        for i, t in zip(holder["where"], outputs, strict=True):
            out_leaves[i] = t
        return tree_unflatten(out_leaves, holder["spec"])

    def run(self, unit: Unit, original: Callable[..., Any], leaves: list, spec: Any, where: list[int],
            tensors: tuple, grad: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        """The unit's forward on `tensors` in place of the tensor leaves, its weights and buffers in float64
        (leaves requiring grad when `grad`): (its output, the float64 weights by local name)."""
        from torch.utils._pytree import tree_unflatten

        values = list(leaves)
        for i, t in zip(where, tensors, strict=True):
            values[i] = t
        args, kwargs = tree_unflatten(values, spec)
        weights = {ln: p.detach().double().requires_grad_(grad and p.requires_grad)
                   for ln, p in unit.module.named_parameters(remove_duplicate=False)}
        buffers = {ln: (b.detach().double() if b.is_floating_point() else b.detach().clone())
                   for ln, b in unit.module.named_buffers(remove_duplicate=False)}
        try:  # the mode again: a backward on another thread (CUDA's) does not inherit the forward's
            with _swapped(unit.module, weights, buffers), keep_float64():
                out = original(*args, **kwargs)
        except NoFloat64:
            raise
        except Exception as e:
            raise NoFloat64(f"unit {unit.path or '(root)'} ({type(unit.module).__name__}) cannot be replayed alone in "
                            f"float64: {type(e).__name__}: {_first_line(e)}") from e
        return out, weights

    def collect(self, unit: Unit, grads: dict[str, torch.Tensor | None]) -> None:
        """The float64 gradients of one call of `unit` (by local name) accumulated in place; a parameter's handed
        on after its last call."""
        done: dict[str, torch.Tensor | None] = {}
        for local, g in grads.items():
            name = unit.names[local]
            if g is not None and name in self.trained:
                before = done.get(name)
                done[name] = g if before is None else before.add_(g)
            else:
                done.setdefault(name, None)
        for name, g in done.items():
            if g is not None:
                self.grads[name] = g if name not in self.grads else self.grads[name].add_(g)
            self.pending[name] -= 1
            if self.pending[name] == 0 and self.last and name in self.grads:
                self._deliver(name)

    def _deliver(self, name: str) -> None:
        grad = self.grads.pop(name)
        if name not in self.delivered:
            self.delivered.add(name)
            self.sink(name, grad)

    def flush(self) -> None:
        for name in list(self.grads):
            self._deliver(name)


class _Replay(torch.autograd.Function):
    """One call of a unit: forward without a graph (its float64 inputs kept), backward by running it again."""

    @staticmethod
    def forward(ctx: Any, runner: _Runner, unit: Unit, original: Callable[..., Any], leaves: list, spec: Any,
                where: list[int], holder: dict[str, Any], anchor: torch.Tensor, *tensors: torch.Tensor) -> Any:
        from torch.utils._pytree import tree_flatten

        with torch.no_grad():
            out, _ = runner.run(unit, original, leaves, spec, where, tensors, grad=False)
        out_leaves, out_spec = tree_flatten(out)
        out_where = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        holder.update(leaves=out_leaves, spec=out_spec, where=out_where)
        ctx.runner, ctx.unit, ctx.original = runner, unit, original
        ctx.leaves, ctx.spec, ctx.where = leaves, spec, where
        ctx.save_for_backward(*tensors)
        outputs = tuple(out_leaves[i] for i in out_where)
        ctx.mark_non_differentiable(*[t for t in outputs if not t.is_floating_point()])
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        from torch.utils._pytree import tree_flatten

        saved = ctx.saved_tensors
        inputs = tuple(t.detach().requires_grad_(t.is_floating_point() and need)
                       for t, need in zip(saved, ctx.needs_input_grad[8:], strict=True))
        with torch.enable_grad():
            out, weights = ctx.runner.run(ctx.unit, ctx.original, ctx.leaves, ctx.spec, ctx.where, inputs, grad=True)
            out_leaves, _ = tree_flatten(out)
            pairs = [(o, g) for o, g in zip((v for v in out_leaves if isinstance(v, torch.Tensor)), grads,
                                            strict=True) if g is not None and o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        del out, pairs
        found = {local: None if w.grad is None else w.grad.detach() for local, w in weights.items()}
        del weights  # the float64 weights go before the gradients are accumulated
        ctx.runner.collect(ctx.unit, found)
        return (None,) * 8 + tuple(t.grad if t.requires_grad else None for t in inputs)


@contextlib.contextmanager
def _swapped(module: torch.nn.Module, weights: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]
             ) -> Iterator[None]:
    """The module's parameters and buffers (by local name) replaced by these tensors inside the block."""
    saved = []
    for table, values in (("_parameters", weights), ("_buffers", buffers)):
        for name, t in values.items():
            owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            attr = name.rpartition(".")[2]
            store = getattr(owner, table)
            saved.append((store, attr, store[attr]))
            store[attr] = t
    try:
        yield
    finally:
        for store, attr, value in reversed(saved):
            store[attr] = value


@contextlib.contextmanager
def _whole_in_float64(model: torch.nn.Module, chosen: Plan) -> Iterator[None]:
    """The parameters outside every unit cast to float64 in place for the block, and the buffers outside them
    replaced by copies (float64 where floating), then put back as they were."""
    saved = []
    with torch.no_grad():
        for name in chosen.whole_parameters:
            p = model.get_parameter(name)
            if p.is_floating_point() and p.dtype != torch.float64:
                saved.append((p, p.data))
                p.data = p.data.double()
        for name in chosen.whole_buffers:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            attr = name.rpartition(".")[2]
            b = owner._buffers.get(attr)
            if b is not None:  # a copy: what the forward changes in place (a counter, running statistics) is dropped
                saved.append((owner, (attr, b)))
                owner._buffers[attr] = b.double() if b.is_floating_point() else b.clone()
    try:
        yield
    finally:
        for target, value in reversed(saved):
            if isinstance(target, torch.nn.Module):
                attr, b = value
                target._buffers[attr] = b
            else:
                target.data = value


@dataclass
class Distances:
    """What a float64 step measured, per trained parameter: its norm, each fp32 step's distance to it, and the
    float64 gradients kept (those a later judgement needs again: `keep`)."""

    loss: float
    norms: dict[str, float] = field(default_factory=dict)
    to: dict[str, dict[str, float]] = field(default_factory=dict)  # fp32 step's name -> parameter -> distance
    kept: dict[str, torch.Tensor] = field(default_factory=dict)
    how: str = "float64 step"
    estimated: set[str] = field(default_factory=set)  # parameters whose distances were estimated (ortlab.runs.sketch)
    note: str | None = None  # how the float64 step was taken, where a reader should know (taken whole, and why)

    @property
    def scale(self) -> float:
        return math.sqrt(sum(n * n for n in self.norms.values()))


def measure(workload: Any, batches: list[tuple[Any, Any]], steps: dict[str, Any], seed: int = 0,
            keep: Callable[[str, dict[str, float], float], bool] | None = None) -> Distances:
    """The float64 step taken block by block, measured against fp32 steps (`steps`: name -> gradients.Step) as
    its gradients arrive: each parameter's float64 norm and each step's distance to it; `keep(name, distances,
    norm)` says which float64 gradients to keep (on the CPU)."""
    from ortlab.runs import sketch

    chosen = plan(workload.model)
    out = Distances(0.0, how=chosen.describe())

    def sink(name: str, g64: torch.Tensor) -> None:
        norm = float(g64.norm())
        out.norms[name] = norm
        measured = {}
        summarized = any(isinstance(s.grads.get(name), sketch.Summary) for s in steps.values())
        reference = sketch.summarize(g64, name) if summarized else g64  # sketched once, for every step
        for label, s in steps.items():
            g = s.grads.get(name)
            if g is None:
                continue
            d, exact = sketch.distance(g, reference, name)  # a recorded summary: estimated from the sketches
            measured[label] = d
            out.to.setdefault(label, {})[name] = d
            if not exact:
                out.estimated.add(name)
        if keep is not None and keep(name, measured, norm):
            out.kept[name] = g64.to("cpu", copy=True)

    out.loss = step(workload, batches, sink, seed, chosen)
    return out


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
