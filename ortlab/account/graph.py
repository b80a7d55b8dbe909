"""An execution model read for the account: nodes in file order, and every tensor's concrete shape.

ORT saves the execution model with the shapes its symbolic shape inference found, in symbols of the dynamic
input axes (`idx_dim0*idx_dim1`). They are evaluated at the burst's values. The recompute nodes a memory plan
adds carry no saved shape: ORT gives each `X_recompute` the type and shape of `X`, so they are copied from
`X`. What is still unknown goes through ONNX's shape inference with every known shape fixed, then the schemas
of ORT's own ops; what remains is reported as uncertain, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ortlab.account.dims import evaluate, names_in
from ortlab.account.errors import AccountError
from ortlab.graphs.names import PYTHON_OPS, is_tap

# onnx.TensorProto element type -> bytes per element (strings have no fixed size: absent)
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16,
            16: 2, 17: 1, 18: 1, 19: 1, 20: 1}
DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
          9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
          15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
          20: "float8e5m2fnuz"}
RECOMPUTE_SUFFIX = "_recompute"

Dim = int | str | None  # a saved dimension: a number, a symbolic expression, or nothing
Typed = tuple[int, tuple[Dim, ...] | None]  # (elem_type, dims as saved; None: unknown rank)
Concrete = tuple[int, tuple[int, ...]]  # (elem_type, concrete dims)


@dataclass
class ExecGraph:
    """The nodes of an execution model in file order (ORT's default execution order) and the saved types."""

    path: Path
    names: list[str]
    ops: list[str]
    domains: list[str]
    inputs: list[tuple[str, ...]]
    outputs: list[tuple[str, ...]]
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: dict[str, Concrete]
    saved: dict[str, Typed]
    yield_attrs: dict[int, dict[str, list[int]]] = field(default_factory=dict)  # YieldOp's int attributes
    # PythonOp / PythonOpGrad: output k is input reuse_maps[i][k]'s tensor (-1: its own), from tensor_reuse_map
    reuse_maps: dict[int, list[int]] = field(default_factory=dict)
    taps: int = 0  # PythonOps (and their PythonOpGrads) that are ortlab's statistics taps
    model: Any = field(repr=False, default=None)

    def __len__(self) -> int:
        return len(self.names)


def _type_of(value_info) -> Typed | None:
    t = value_info.type
    if t.WhichOneof("value") != "tensor_type":
        return None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            dims.append(d.dim_value)
        else:
            dims.append((d.dim_param or None) if which == "dim_param" else None)
    return tt.elem_type, tuple(dims)


def read_graph(path: str | Path) -> ExecGraph:
    """Read an execution model (external tensor data is never loaded: only the graph matters here)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise AccountError(f"{path} is not a file; give a run, a run folder, a folder of ORTModule stage "
                           "files or an execution model .onnx")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends: a damaged or foreign file
        raise AccountError(f"{path} is not a readable ONNX model: {type(e).__name__}: {e}") from None
    g = model.graph
    if not len(g.node):
        raise AccountError(f"{path} holds a graph without nodes: nothing to account for")
    saved: dict[str, Typed] = {}
    for vi in (*g.value_info, *g.input, *g.output):
        typed = _type_of(vi)
        if typed is not None:
            saved[vi.name] = typed
    initializers = {t.name: (t.data_type, tuple(t.dims)) for t in g.initializer}
    saved.update(initializers)
    nodes = g.node
    yield_attrs = {i: {a.name: list(a.ints) for a in n.attribute}
                   for i, n in enumerate(nodes) if n.op_type == "YieldOp"}
    reuse_maps = {i: list(a.ints) for i, n in enumerate(nodes) if n.op_type in PYTHON_OPS
                  for a in n.attribute if a.name == "tensor_reuse_map"}
    taps = sum(is_tap(n.op_type, next((a.s.decode(errors="replace") for a in n.attribute if a.name == "func_name"),
                                      "")) for n in nodes if n.op_type.startswith("PythonOp"))
    return ExecGraph(path=path, names=[n.name for n in nodes], ops=[n.op_type for n in nodes],
                     domains=[n.domain for n in nodes], inputs=[tuple(n.input) for n in nodes],
                     outputs=[tuple(n.output) for n in nodes], graph_inputs=[i.name for i in g.input],
                     graph_outputs=[o.name for o in g.output], initializers=initializers, saved=saved,
                     yield_attrs=yield_attrs, reuse_maps=reuse_maps, taps=taps, model=model)


def input_symbols(g: ExecGraph) -> dict[str, list[tuple[str, int]]]:
    """Symbol -> [(graph input, axis)] for the symbolic dimensions of the graph inputs (not initializers)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name in g.graph_inputs:
        if name in g.initializers:
            continue
        _, dims = g.saved.get(name, (0, None))
        for axis, d in enumerate(dims or ()):
            if isinstance(d, str):
                out.setdefault(d, []).append((name, axis))
    return out


def dims_from_inputs(g: ExecGraph, input_shapes: Mapping[str, Any]) -> dict[str, int]:
    """Symbol values read off concrete input shapes ({input name: shape}); a conflict or a stranger is an
    error naming it."""
    known = set(g.graph_inputs)
    values: dict[str, int] = {}
    for name, shape in input_shapes.items():
        if name not in known:
            inputs = ", ".join(n for n in g.graph_inputs if n not in g.initializers)
            raise AccountError(f"input_shapes names {name!r}, which is not an input of {g.path.name}; its "
                               f"inputs: {inputs}")
        _, dims = g.saved.get(name, (0, None))
        shape = tuple(int(s) for s in shape)
        if dims is not None and len(dims) != len(shape):
            raise AccountError(f"input_shapes[{name!r}] = {shape} has rank {len(shape)}; the graph's {name} "
                               f"has rank {len(dims)}")
        for axis, (d, v) in enumerate(zip(dims or (), shape, strict=False)):
            if isinstance(d, int) and d != v:
                raise AccountError(f"input_shapes[{name!r}] axis {axis} is {v}; the graph fixes it at {d}")
            if isinstance(d, str):
                if values.get(d, v) != v:
                    raise AccountError(f"input_shapes give {d} two values: {values[d]} and {v}")
                values[d] = v
    return values


@dataclass
class Shapes:
    """Concrete shapes: name -> (elem_type, dims); where each came from; what stays unknown and why."""

    concrete: dict[str, Concrete]
    source: dict[str, str]  # "graph", "recompute" (copied from the original tensor) or "inferred"
    unknown: dict[str, str]  # name -> why its size is not known


def _concrete(dims: tuple[Dim, ...] | None, values: Mapping[str, int],
              cache: dict[str, int | None]) -> tuple[tuple[int, ...] | None, str]:
    """Concrete dims, or the reason there are none."""
    if dims is None:
        return None, "no shape saved"
    out = []
    for d in dims:
        if isinstance(d, int):
            out.append(d)
            continue
        if d is None:
            return None, "a dimension without value or symbol"
        if d not in cache:
            cache[d] = evaluate(d, values)
        if cache[d] is None:
            missing = sorted(names_in(d) - set(values))
            if missing:
                return None, f"symbol {', '.join(missing)} has no value"
            return None, f"dimension {d!r} does not evaluate to a whole number"
        out.append(cast(int, cache[d]))
    return tuple(out), ""


def resolve(g: ExecGraph, values: Mapping[str, int], infer: bool = True) -> Shapes:
    """Every tensor's concrete shape at `values` (symbol -> int)."""
    concrete: dict[str, Concrete] = {}
    source: dict[str, str] = {}
    unknown: dict[str, str] = {}
    cache: dict[str, int | None] = {}
    names = [n for outs in g.outputs for n in outs if n]
    for name in (*g.graph_inputs, *g.initializers, *names):
        if name in concrete or name in unknown:
            continue
        elem, dims = g.saved.get(name, (0, None))
        dims, why = _concrete(dims, values, cache)
        if dims is None:
            unknown[name] = why
        else:
            concrete[name], source[name] = (elem, dims), "graph"
    for name in [n for n in unknown if n.endswith(RECOMPUTE_SUFFIX)]:
        base = name[: -len(RECOMPUTE_SUFFIX)]
        if base in concrete:
            concrete[name], source[name] = concrete[base], "recompute"
            del unknown[name]
    for fill in ((_infer,) if infer else ()) + (_ort_rules,):
        if not unknown:
            break
        for name, typed in fill(g, concrete, set(unknown)).items():
            concrete[name], source[name] = typed, "inferred"
            del unknown[name]
    return Shapes(concrete, source, unknown)


def _ort_rules(g: ExecGraph, known: Mapping[str, Concrete], wanted: set[str]) -> dict[str, Concrete]:
    """Outputs of ORT's own ops that ONNX cannot infer, from their schemas: ConcatTraining's second output
    (`per_input_length`) holds one int64 per input; a YieldOp's outputs are the gradients of its inputs, minus
    the non-differentiable ones, of the input's shape where `full_shape_outputs` says so."""
    found: dict[str, Concrete] = {}
    for i, outs in enumerate(g.outputs):
        if g.ops[i] == "ConcatTraining" and len(outs) > 1 and outs[1] in wanted:
            found[outs[1]] = (7, (sum(1 for t in g.inputs[i] if t),))
        elif g.ops[i] == "YieldOp":
            attrs = g.yield_attrs.get(i, {})
            skip = set(attrs.get("non_differentiable_outputs", ()))
            full = set(attrs.get("full_shape_outputs", ()))
            grads = [k for k in range(len(g.inputs[i])) if k not in skip]
            for out, k in zip(outs, grads, strict=False):
                if out in wanted and k in full and g.inputs[i][k] in known:
                    found[out] = known[g.inputs[i][k]]
    return found


def _infer(g: ExecGraph, known: Mapping[str, Concrete], wanted: set[str]) -> dict[str, Concrete]:
    """ONNX shape inference (with data propagation, for shape arithmetic) over the graph with every known
    shape fixed. ONNX does not know ORT's contrib and training ops: inference flows around them."""
    import onnx
    from onnx import helper, shape_inference

    model = onnx.ModelProto()
    model.CopyFrom(g.model)
    graph = model.graph
    del graph.value_info[:]
    for vi in graph.input:
        if vi.name in known:
            vi.CopyFrom(helper.make_tensor_value_info(vi.name, *known[vi.name]))
    fixed = set(g.graph_inputs) | set(g.graph_outputs) | set(g.initializers)
    graph.value_info.extend(helper.make_tensor_value_info(name, elem, dims)
                            for name, (elem, dims) in known.items() if name not in fixed)
    try:
        inferred = shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
        return {}
    found: dict[str, Concrete] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.output):
        typed = _type_of(vi) if vi.name in wanted else None
        if typed and typed[0] and typed[1] is not None and all(isinstance(d, int) for d in typed[1]):
            found[vi.name] = (typed[0], tuple(int(d) for d in typed[1] if isinstance(d, int)))
    return found


def nbytes(typed: Concrete) -> int | None:
    """Bytes of a concrete (elem_type, dims); None for a type without fixed size (strings)."""
    elem, dims = typed
    size = ITEMSIZE.get(elem)
    if size is None:
        return None
    for d in dims:
        size *= d
    return size
