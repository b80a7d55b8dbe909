"""One stage file read: its nodes (with kind and module scope), op histogram, inputs, outputs and size.

Parsed on first use, plain data out (dicts and DataFrames). External tensor data is never loaded: only the
graph matters here, and a stage of a large model stays cheap to open.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab._ort import ORIGINAL_MODULE
from ortlab.graphs.errors import GraphsError
from ortlab.graphs.names import KINDS, PARAM_PREFIX, is_gradient_tensor, is_tap, module_scope, node_kind, op_key

if TYPE_CHECKING:
    from ortlab.graphs.neighbourhood import Neighbourhood

_SEARCH_BY = ("any", "name", "op", "module")


@dataclass(frozen=True)
class Node:
    name: str
    op: str  # domain::op_type, e.g. ai.onnx::MatMul, com.microsoft::FusedMatMul
    kind: str  # one of KINDS
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tap: bool = False  # ortlab's statistics tap (a PythonOp of ortlab's own, not the model's)


@dataclass(frozen=True)
class _Value:
    """A graph input, output or initializer: its name, dtype and shape (None: unknown rank)."""

    name: str
    dtype: str
    dims: tuple | None
    elem_type: int

    @property
    def numel(self) -> int | None:
        if self.dims is None or any(not isinstance(d, int) for d in self.dims):
            return None
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of a static shape, 0 when the shape or the dtype's size is unknown."""
        import onnx

        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(self.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            return 0
        return (self.numel or 0) * itemsize

    @property
    def shape(self) -> str:
        return "?" if self.dims is None else "[" + ", ".join(str(d) for d in self.dims) + "]"


def _func_name(node) -> str:
    """A PythonOp's func_name attribute (the autograd Function it runs), "" for other nodes."""
    if not node.op_type.startswith("PythonOp"):
        return ""
    return next((a.s.decode(errors="replace") for a in node.attribute if a.name == "func_name"), "")


def _dtype_name(elem_type: int) -> str:
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"
    return {"float": "float32", "double": "float64"}.get(name, name)


def _value(v) -> _Value:
    t = v.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim) \
        if t.HasField("shape") else None
    return _Value(v.name, _dtype_name(t.elem_type), dims, t.elem_type)


class Stage:
    """One stage file: `name` (e.g. execution_model) in `mode` (training or inference) of export `prefix`."""

    def __init__(self, path: Path, stage: str, mode: str, prefix: str, user_inputs: set[str] | None = None,
                 requires_grad: set[str] | None = None):
        self.path = Path(path)
        self.name = stage
        self.mode = mode
        self.prefix = prefix
        self._user_inputs = user_inputs  # from ORT's own post-export record when the run has one
        self._requires_grad = requires_grad or set()

    @property
    def label(self) -> str:
        return f"{self.mode}/{self.name}"

    @cached_property
    def model(self):
        """The onnx ModelProto, without external tensor data."""
        import onnx

        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except Exception as e:
            raise GraphsError(f"{self.path} is not a readable ONNX model: {type(e).__name__}: {e}") from None
        if not model.HasField("graph"):  # a 0-byte or cut file parses as an empty model: not "0 nodes"
            raise GraphsError(f"{self.path} is not an ONNX model ({self.path.stat().st_size} bytes, no graph): "
                              "damaged or cut short")
        return model

    @cached_property
    def node_list(self) -> list[Node]:
        """Every node of the file, ortlab's statistics taps included (`tap` marks them)."""
        return [Node(n.name, op_key(n.domain, n.op_type), node_kind(n.name, n.op_type, tuple(n.output)),
                     tuple(n.input), tuple(n.output), is_tap(n.op_type, _func_name(n)))
                for n in self.model.graph.node]

    @cached_property
    def model_nodes(self) -> list[Node]:
        """The model's nodes: without ortlab's statistics taps, which a burst collecting statistics adds (a
        PythonOp and a PythonOpGrad per observed tensor). Counts and histograms are of these."""
        return [n for n in self.node_list if not n.tap]

    @property
    def taps(self) -> int:
        """How many of the file's nodes are ortlab's statistics taps (PythonOp and PythonOpGrad)."""
        return len(self.node_list) - len(self.model_nodes)

    @property
    def taps_note(self) -> str:
        """What a view says about ortlab's taps in this graph ("" when there are none)."""
        if not self.taps:
            return ""
        return (f"ortlab's statistics taps: {self.taps} more nodes (PythonOp, PythonOpGrad), not the model's and not "
                "counted here; they return their input (only an 8-byte context of their own) but can keep ORT from "
                "fusing the ops on either side")

    @cached_property
    def _inputs(self) -> list[_Value]:
        return [_value(v) for v in self.model.graph.input]

    @cached_property
    def _outputs(self) -> list[_Value]:
        return [_value(v) for v in self.model.graph.output]

    @cached_property
    def _initializers(self) -> list[_Value]:
        return [_Value(t.name, _dtype_name(t.data_type), tuple(t.dims), t.data_type)
                for t in self.model.graph.initializer]

    @property
    def node_count(self) -> int:
        """The model's nodes (ortlab's statistics taps apart: `taps`)."""
        return len(self.model_nodes)

    @property
    def graph_input_names(self) -> set[str]:
        return {v.name for v in self._inputs}

    @property
    def graph_output_names(self) -> set[str]:
        return {v.name for v in self._outputs}

    @cached_property
    def nodes_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.node_list}

    @cached_property
    def producer_of(self) -> dict[str, Node]:
        """Tensor name -> the node that computes it."""
        return {o: n for n in self.node_list for o in n.outputs if o}

    @cached_property
    def consumers_of(self) -> dict[str, list[Node]]:
        """Tensor name -> the nodes that read it."""
        out: dict[str, list[Node]] = defaultdict(list)
        for n in self.node_list:
            for i in n.inputs:
                if i:
                    out[i].append(n)
        return out

    def node(self, name: str) -> Node:
        try:
            return self.nodes_by_name[name]
        except KeyError:
            from ortlab.errors import close_names

            close = close_names(name, self.nodes_by_name)
            hint = (f"; close: {', '.join(close)}" if close
                    else "; search(text) finds nodes by name, op or module")
            raise GraphsError(f"no node named {name!r} in stage {self.label}{hint}") from None

    def histogram(self):
        """The model's node count per `domain::op`, most frequent first (a pandas Series); ortlab's statistics
        taps are not counted (`taps`)."""
        import pandas as pd

        counts = Counter(n.op for n in self.model_nodes)
        s = pd.Series(dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), dtype=int, name="count")
        s.index.name = "op"
        return s

    def kinds(self) -> dict[str, int]:
        counts = Counter(n.kind for n in self.model_nodes)
        return {k: counts.get(k, 0) for k in KINDS}

    def _role(self, name: str) -> str:
        if self._user_inputs is not None:
            return "user input" if name in self._user_inputs else "parameter"
        return "parameter" if name.startswith(PARAM_PREFIX) else "user input"

    @property
    def inputs(self):
        """Graph inputs with dtype and shape, user inputs apart from parameters (ORTModule feeds parameters as
        graph inputs, not initializers)."""
        import pandas as pd

        rows = [{"name": v.name, "role": self._role(v.name), "dtype": v.dtype, "shape": v.shape,
                 "rank": None if v.dims is None else len(v.dims), "elements": v.numel,
                 "requires_grad": v.name in self._requires_grad or None} for v in self._inputs]
        df = pd.DataFrame(rows, columns=["name", "role", "dtype", "shape", "rank", "elements",
                                         "requires_grad"])
        return df.astype({"rank": "Int64", "elements": "Int64"})

    @property
    def outputs(self):
        """Graph outputs: the user's outputs and, in training graphs, the gradients ORT returns."""
        import pandas as pd

        rows = [{"name": v.name, "role": "gradient" if is_gradient_tensor(v.name) else "output",
                 "dtype": v.dtype, "shape": v.shape} for v in self._outputs]
        return pd.DataFrame(rows, columns=["name", "role", "dtype", "shape"])

    def size(self) -> dict[str, int]:
        """Parameters (graph inputs that are not user inputs) and initializers, in elements and bytes, and the
        file's size. Parameter elements count static shapes only."""
        params = [v for v in self._inputs if self._role(v.name) == "parameter"]
        return {"parameters": len(params), "parameter_elements": sum(v.numel or 0 for v in params),
                "parameter_bytes": sum(v.nbytes for v in params), "initializers": len(self._initializers),
                "initializer_elements": sum(v.numel or 0 for v in self._initializers),
                "initializer_bytes": sum(v.nbytes for v in self._initializers),
                "file_bytes": self.path.stat().st_size}

    def summary(self) -> dict[str, Any]:
        users = sum(self._role(v.name) == "user input" for v in self._inputs)
        size = self.size()
        del size["parameters"]
        return {"mode": self.mode, "stage": self.name, "nodes": self.node_count, **self.kinds(),
                "op_types": len({n.op for n in self.model_nodes}), "ortlab_taps": self.taps, "user_inputs": users,
                "parameters": len(self._inputs) - users, "outputs": len(self._outputs), **size,
                "file": self.path.name}

    @cached_property
    def nodes(self):
        """Every node: name, op (domain::op), kind, module scope, inputs and outputs, and `ortlab_tap` (True for
        ortlab's statistics taps)."""
        import pandas as pd

        nodes = self.node_list
        return pd.DataFrame({
            "name": [n.name for n in nodes], "op": [n.op for n in nodes], "kind": [n.kind for n in nodes],
            "module": [module_scope(n.name) for n in nodes], "inputs": [list(n.inputs) for n in nodes],
            "outputs": [list(n.outputs) for n in nodes], "ortlab_tap": [n.tap for n in nodes],
        })

    def search(self, text: str, by: str = "any", limit: int | None = 200):
        """Nodes whose name, op type (`MatMul`, `com.microsoft::FusedMatMul`) or module scope
        (`blocks.0.attn`, `/blocks.0/attn`) contains `text`, case-insensitively; `by` is one of any, name,
        op, module."""
        if by not in _SEARCH_BY:
            raise GraphsError(f"search by {by!r} is not allowed; allowed: {', '.join(_SEARCH_BY)}")
        needle = text.strip().lower()
        if not needle:
            raise GraphsError("search text is empty; give part of a node name, an op type or a module scope")
        scope = ".".join(p for p in re.split(r"[/.]", needle.replace(ORIGINAL_MODULE, "")) if p)
        df = self.nodes
        hit = False
        if by in ("any", "name"):
            hit = hit | df["name"].str.lower().str.contains(needle, regex=False)
        if by in ("any", "op"):
            hit = hit | df["op"].str.lower().str.contains(needle, regex=False)
        if by in ("any", "module") and scope:
            hit = hit | df["module"].str.lower().str.contains(scope, regex=False)
        out = df[hit].drop(columns=["inputs", "outputs"]).reset_index(drop=True)
        return out.head(limit) if limit else out

    def neighbourhood(self, node: str, hops: int = 1, max_nodes: int = 40) -> Neighbourhood:
        """The node, its producers `hops` steps up and its consumers `hops` steps down (graph inputs and
        outputs included as small pseudo-nodes), nearest first, at most `max_nodes`."""
        from ortlab.graphs.neighbourhood import find_neighbourhood

        return find_neighbourhood(self, node, hops, max_nodes)

    def __repr__(self) -> str:
        return f"Stage({self.label!r}, file={self.path.name!r})"
