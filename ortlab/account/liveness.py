"""Which buffers are live at each step of the execution order, as ORT's allocation planner decides it.

Read off onnxruntime 1.19.2's `allocation_planner.cc` for the CPU execution provider, with the session options
ORTModule sets (`enable_mem_reuse=False`: a freed buffer is never handed to a new tensor, so no arena reuse
to model). What remains of the planner is exact:
- a tensor is freed after its last consumer runs; an output nobody reads, right after its producer; graph
  inputs, initializers and graph outputs (the parameter gradients) are never freed by the graph;
- kernels that alias (Reshape, Squeeze, Unsqueeze, Flatten, Identity, ExpandDims) write into their input's
  buffer, which then lives as long as either tensor is needed; so do the PythonOp outputs that its
  `tensor_reuse_map` attribute says are an input's tensor (ortlab's statistics taps return their input);
- kernels that may work in place (unary activations, Softmax, LogSoftmax, Cast, Clip, ...) reuse their input's
  buffer when this node is its last reader and ORT's static shapes are the same size;
- the YieldOp's outputs (the output gradients PyTorch passes in) are external: live to the end of backward;
  the forward outputs a node hands the YieldOp are never written in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from ortlab.account.errors import AccountError
from ortlab.account.graph import ITEMSIZE, RECOMPUTE_SUFFIX, ExecGraph, Typed

# (domain, op) -> [(input slot, output slot)] from the CPU kernels' KernelDefBuilder().Alias / .MayInplace
_Slots = dict[tuple[str, str], tuple[tuple[int, int], ...]]
_ALIAS: _Slots = {("", op): ((0, 0),) for op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")}
_ALIAS |= {("com.microsoft", "ExpandDims"): ((0, 0),), ("", "BatchNormalization"): ((3, 1), (4, 2)),
           ("com.microsoft", "BatchNormInternal"): ((3, 1), (4, 2))}
_IN_PLACE = {("", op): ((0, 0),) for op in (
    "Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu", "Sigmoid", "Softplus", "Softsign", "Tanh", "Celu",
    "ThresholdedRelu", "Softmax", "LogSoftmax", "Cast", "Clip", "Shrink", "Scatter", "ScatterElements",
    "Trilu")}
_IN_PLACE |= {("", op): ((0, 0),) for op in ("ParametricSoftplus", "ScaledTanh")}
EXTERNAL_OPS = ("YieldOp",)  # kernels whose outputs PyTorch allocates (KernelDefBuilder().ExternalOutputs())


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


@dataclass
class Plan:
    """Buffers and their lives. A buffer is named by its root tensor (the one that allocated it)."""

    order: list[int]  # node positions in execution order
    buffer_of: dict[str, str]  # tensor -> root tensor of its buffer
    start: dict[str, int]  # root -> step that allocates it (-1: exists before the graph runs)
    end: dict[str, int]  # root -> last step it is alive
    kind: dict[str, str]  # root -> activation, gradient, parameter, input or constant
    size: dict[str, int | None]  # root -> bytes (None: unknown)
    yield_step: int | None
    writes: dict[str, list[tuple[int, str]]]  # root -> (step, tensor) for the root and each in-place write

    @property
    def steps(self) -> int:
        return len(self.order)

    def holder(self, root: str, step: int) -> str:
        """The tensor whose values the buffer holds at `step`: the last one written into it by then (views
        only name the same bytes again)."""
        name = root
        for at, tensor in self.writes.get(root, ()):
            if at > step:
                break
            name = tensor
        return name

    def members(self) -> dict[str, list[str]]:
        """Root -> every tensor in its buffer (the root first)."""
        out: dict[str, list[str]] = {r: [r] for r in self.start}
        for t, r in self.buffer_of.items():
            if t != r:
                out[r].append(t)
        return out


def _same_size(a: Typed | None, b: Typed | None) -> bool:
    """ORT's SameSize on static shapes: equal element size, same rank, each dimension the same number or the
    same symbol; unknown shapes are not the same size."""
    if a is None or b is None or a[1] is None or b[1] is None:
        return False
    if ITEMSIZE.get(a[0]) is None or ITEMSIZE.get(a[0]) != ITEMSIZE.get(b[0]) or len(a[1]) != len(b[1]):
        return False
    return all(x == y and x is not None and x != "" for x, y in zip(a[1], b[1], strict=True))


def static_shapes(g: ExecGraph) -> dict[str, Typed]:
    """ORT's own (symbolic) shapes as its planner sees them: the saved ones, and a recompute tensor's from the
    tensor it recomputes (ORT creates it with that type)."""
    out = dict(g.saved)
    for outs in g.outputs:
        for t in outs:
            if t.endswith(RECOMPUTE_SUFFIX) and t not in out and t[: -len(RECOMPUTE_SUFFIX)] in out:
                out[t] = out[t[: -len(RECOMPUTE_SUFFIX)]]
    return out


def plan(g: ExecGraph, order: Sequence[int], sizes: Mapping[str, int | None],
         parameters: set[str] | None = None) -> Plan:
    """Walk the nodes in `order` as ORT's planner does. `sizes`: tensor -> bytes; `parameters`: graph inputs
    that are parameters (default: those whose gradient the graph outputs)."""
    static = static_shapes(g)
    outputs, initializers = set(g.graph_outputs), set(g.initializers)
    inputs = [t for t in g.graph_inputs if t not in initializers]
    if parameters is None:
        parameters = {t for t in inputs if f"{t}_grad" in outputs}
    producer = {t: i for i, outs in enumerate(g.outputs) for t in outs if t}
    written = set(producer) | set(g.graph_inputs) | initializers
    for i, names in enumerate(g.inputs):
        for t in names:
            if t and t not in written:
                raise AccountError(f"{g.path.name}: node {g.names[i]!r} reads {t!r}, which no node writes "
                                   "and no graph input or initializer holds: not a complete graph")
    first_reader: dict[str, int] = {}  # ORT looks at the first consumer by node index; here: file position
    use: dict[str, int] = {}
    for i, names in enumerate(g.inputs):
        for t in names:
            if t:
                use[t] = use.get(t, 0) + 1
                first_reader.setdefault(t, i)
    for outs in g.outputs:
        for t in outs:
            if t:
                use[t] = use.get(t, 0) + 1
    for t in (*g.graph_inputs, *initializers, *outputs):
        use[t] = use.get(t, 0) + 1
    feeds_yield = {producer[t] for t, i in first_reader.items() if t in producer and g.ops[i] in EXTERNAL_OPS}
    external = {t for i, outs in enumerate(g.outputs) if g.ops[i] in EXTERNAL_OPS for t in outs if t}

    buffer_of: dict[str, str] = {}
    writes: dict[str, list[tuple[int, str]]] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    kind: dict[str, str] = {}
    for t in (*g.graph_inputs, *initializers):
        buffer_of[t], start[t] = t, -1
        kind[t] = "constant" if t in initializers else "parameter" if t in parameters else "input"

    def reusable(i: int, k: int) -> tuple[str | None, bool]:
        """The input whose buffer output k takes over, and whether the kernel writes into it (in place)."""
        if i in feeds_yield:
            return None, False  # "Inputs of Yields are essentially the outputs for FW partial subgraph"
        key, ins = (_domain(g.domains[i]), g.ops[i]), g.inputs[i]
        for a, b in _ALIAS.get(key, ()):
            if b == k and a < len(ins) and ins[a]:
                return ins[a], False
        reuse = g.reuse_maps.get(i)  # a PythonOp returning (a view of) its input: ortlab's statistics taps
        if reuse and k < len(reuse) and 0 <= reuse[k] < len(ins) and ins[reuse[k]]:
            return ins[reuse[k]], False
        for a, b in _IN_PLACE.get(key, ()):
            if (b == k and a < len(ins) and ins[a] and ins[a] not in external and use[buffer_of[ins[a]]] == 1
                    and _same_size(static.get(ins[a]), static.get(g.outputs[i][k]))):
                return ins[a], True
        return None, False

    last = len(order) - 1
    for step, i in enumerate(order):
        outs = g.outputs[i]
        is_external = g.ops[i] in EXTERNAL_OPS
        for k, t in enumerate(outs):
            if not t:
                continue
            reused, in_place = (None, False) if is_external or t in outputs else reusable(i, k)
            if reused is None:
                buffer_of[t], start[t], end[t] = t, step, last
                # graph outputs live to the end; those of a training graph are the parameter gradients
                kind[t] = "gradient" if t in outputs and t.endswith("_grad") else "activation"
            else:
                root = buffer_of[reused]
                buffer_of[t] = root
                use[root] += use[t]
                if in_place:
                    writes.setdefault(root, []).append((step, t))
        for t in g.inputs[i]:
            if t and t not in external:
                root = buffer_of[t]
                use[root] -= 1
                if not use[root]:
                    end[root] = step
        if not is_external:
            for t in outs:
                if t:
                    root = buffer_of[t]
                    use[root] -= 1
                    if not use[root]:
                        end[root] = step
    yields = [step for step, i in enumerate(order) if g.ops[i] in EXTERNAL_OPS]
    size = {r: sizes.get(r) for r in start}
    yield_step = yields[0] if len(yields) == 1 else None
    return Plan(list(order), buffer_of, start, end, kind, size, yield_step, writes)


@dataclass
class Timeline:
    """Per step of the execution order: bytes of live activation buffers, of live parameter gradients, and the
    number of live activation buffers whose size is unknown."""

    live: list[int]
    gradients: list[int]
    uncertain: list[int]


def timeline(p: Plan) -> Timeline:
    n = p.steps
    live, grads, unknown = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for root, s in p.start.items():
        if s < 0:
            continue
        kind, size, e = p.kind[root], p.size[root], p.end[root] + 1
        if kind == "activation":
            if size is None:
                unknown[s] += 1
                unknown[e] -= 1
            else:
                live[s] += size
                live[e] -= size
        elif kind == "gradient" and size is not None:
            grads[s] += size
            grads[e] -= size
    return Timeline(list(accumulate(live[:n])), list(accumulate(grads[:n])), list(accumulate(unknown[:n])))


def alive_at(p: Plan, step: int, kinds: tuple[str, ...] = ("activation",)) -> list[str]:
    """Roots of the buffers of these kinds alive during `step`, largest first (unknown sizes last)."""
    roots = [r for r, s in p.start.items() if p.kind[r] in kinds and s <= step <= p.end[r] and s >= 0]
    return sorted(roots, key=lambda r: (p.size[r] is None, -(p.size[r] or 0), r))
