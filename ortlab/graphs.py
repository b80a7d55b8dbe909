"""ORTModule's exported graphs, stage by stage: what each stage holds, what it changed, and where a node sits.

With `save_onnx` ORTModule writes `PREFIX_STAGE_MODE.onnx` for every stage it builds: torch_exported,
post_processed, optimized_pre_grad (training only), optimized and execution_model, per mode (training,
inference). `ortlab.graphs(run_or_folder)` reads any folder of such files, made by ortlab or not.
"""

from __future__ import annotations

import html
import re
import sys
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

STAGES = ("torch_exported", "post_processed", "optimized_pre_grad", "optimized", "execution_model")
MODES = ("training", "inference")
KINDS = ("forward", "gradient", "recompute", "yield")  # what a node of a training graph does
_FILE = re.compile(rf"^(?P<prefix>.*)_(?P<stage>{'|'.join(STAGES)})_(?P<mode>{'|'.join(MODES)})\.onnx$")
_OP_PART = re.compile(r"^[A-Z][A-Za-z0-9]*(_\d+)?(_Grad)?$")  # `MatMul_3`, `Add_Grad`: an op, not a module
_GRAD_TENSOR = re.compile(r"_grad(_\d+)?$")
_PARAM_PREFIX = "_original_module."  # ORTModule's flattened module names every parameter input like this


class GraphsError(ValueError):
    """No stage files where they were looked for, or a stage, node or prefix that is not there."""


# --------------------------------------------------------------------------------------------- one stage


@dataclass(frozen=True)
class _Node:
    name: str
    op: str  # domain::op_type, e.g. ai.onnx::MatMul, com.microsoft::FusedMatMul
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def op_key(domain: str, op_type: str) -> str:
    """`domain::op`, with ONNX's default domain spelled out so that com.microsoft ops stay distinct."""
    return f"{domain or 'ai.onnx'}::{op_type}"


def node_kind(name: str, op_type: str, outputs: tuple[str, ...]) -> str:
    """forward, gradient, recompute or yield, from the names ORT's gradient builder and memory optimizer give."""
    if op_type == "YieldOp":
        return "yield"
    if name.endswith("_recompute") or any(o.endswith("_recompute") for o in outputs):
        return "recompute"
    if ("_Grad" in name or name.startswith("AccumulateGrad_") or op_type.endswith("Grad")
            or any(_GRAD_TENSOR.search(o) for o in outputs)):
        return "gradient"
    return "forward"


def module_scope(name: str) -> str:
    """The PyTorch module a node came from, from the exporter's name: `/_original_module/blocks/blocks.0/attn/
    MatMul` -> `blocks.0.attn`. Empty for nodes that ORT named itself (fusions such as `BiasGelu_token_1`)."""
    at = name.find("/")
    if at < 0:
        return ""
    parts: list[str] = []
    for part in name[at:].split("/")[1:-1]:
        if not part or part == "_original_module":
            continue
        if _OP_PART.match(part):
            break
        if parts and part.startswith(parts[-1] + "."):  # `blocks/blocks.0`: a container and its child
            parts[-1] = part
        else:
            parts.append(part)
    return ".".join(parts)


def _dtype_name(elem_type: int) -> str:
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"
    return {"float": "float32", "double": "float64"}.get(name, name)


def _itemsize(elem_type: int) -> int:
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 0


def _value_info(v) -> tuple[str, str, tuple | None, int]:
    t = v.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim) \
        if t.HasField("shape") else None
    return v.name, _dtype_name(t.elem_type), dims, t.elem_type


def _numel(dims) -> int | None:
    if dims is None or any(not isinstance(d, int) for d in dims):
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def _shape_text(dims) -> str:
    return "?" if dims is None else "[" + ", ".join(str(d) for d in dims) + "]"


class Stage:
    """One stage file. Parsed on first use; plain data out (dicts and DataFrames)."""

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
        """The onnx ModelProto (external tensor data is not loaded: only the graph matters here)."""
        import onnx

        try:
            return onnx.load(str(self.path), load_external_data=False)
        except Exception as e:
            raise GraphsError(f"{self.path} is not a readable ONNX model: {type(e).__name__}: {e}") from None

    @cached_property
    def _parsed(self) -> dict[str, Any]:
        g = self.model.graph
        nodes = []
        for n in g.node:
            outputs = tuple(n.output)
            nodes.append(_Node(n.name, op_key(n.domain, n.op_type), node_kind(n.name, n.op_type, outputs),
                               tuple(n.input), outputs))
        inits = [(t.name, t.data_type, tuple(t.dims)) for t in g.initializer]
        return {"nodes": nodes, "inputs": [_value_info(v) for v in g.input],
                "outputs": [_value_info(v) for v in g.output], "initializers": inits,
                "opsets": {o.domain or "ai.onnx": o.version for o in self.model.opset_import}}

    @property
    def node_list(self) -> list[_Node]:
        return self._parsed["nodes"]

    @property
    def node_count(self) -> int:
        return len(self.node_list)

    @cached_property
    def _by_name(self) -> dict[str, _Node]:
        return {n.name: n for n in self.node_list}

    @cached_property
    def _producer(self) -> dict[str, _Node]:
        return {o: n for n in self.node_list for o in n.outputs if o}

    @cached_property
    def _consumers(self) -> dict[str, list[_Node]]:
        out: dict[str, list[_Node]] = defaultdict(list)
        for n in self.node_list:
            for i in n.inputs:
                if i:
                    out[i].append(n)
        return out

    def node(self, name: str) -> _Node:
        try:
            return self._by_name[name]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name, list(self._by_name), n=3, cutoff=0.6)
            hint = f"; close: {', '.join(close)}" if close else "; search(text) finds nodes by name, op or module"
            raise GraphsError(f"no node named {name!r} in stage {self.label}{hint}") from None

    def histogram(self):
        """Node count per `domain::op`, most frequent first (a pandas Series)."""
        import pandas as pd

        counts = Counter(n.op for n in self.node_list)
        s = pd.Series(dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), dtype=int, name="count")
        s.index.name = "op"
        return s

    def kinds(self) -> dict[str, int]:
        counts = Counter(n.kind for n in self.node_list)
        return {k: counts.get(k, 0) for k in KINDS}

    def _input_role(self, name: str) -> str:
        if self._user_inputs is not None:
            return "user input" if name in self._user_inputs else "parameter"
        return "parameter" if name.startswith(_PARAM_PREFIX) else "user input"

    @property
    def inputs(self):
        """Graph inputs with dtype and shape, user inputs apart from parameters (ORTModule feeds parameters as
        graph inputs, not initializers)."""
        import pandas as pd

        rows = [{"name": name, "role": self._input_role(name), "dtype": dtype, "shape": _shape_text(dims),
                 "rank": None if dims is None else len(dims), "elements": _numel(dims),
                 "requires_grad": name in self._requires_grad or None}
                for name, dtype, dims, _ in self._parsed["inputs"]]
        df = pd.DataFrame(rows, columns=["name", "role", "dtype", "shape", "rank", "elements", "requires_grad"])
        return df.astype({"rank": "Int64", "elements": "Int64"})

    @property
    def outputs(self):
        """Graph outputs: the user's outputs and, in training graphs, the gradients ORT returns."""
        import pandas as pd

        rows = [{"name": name, "role": "gradient" if _GRAD_TENSOR.search(name) else "output", "dtype": dtype,
                 "shape": _shape_text(dims)} for name, dtype, dims, _ in self._parsed["outputs"]]
        return pd.DataFrame(rows, columns=["name", "role", "dtype", "shape"])

    def size(self) -> dict[str, int]:
        """Parameters (graph inputs that are not user inputs) and initializers, in elements and bytes, and the
        file's size. Parameter elements count static shapes only."""
        params = [(dims, elem) for name, _, dims, elem in self._parsed["inputs"]
                  if self._input_role(name) == "parameter"]
        p_elems = sum(_numel(dims) or 0 for dims, _ in params)
        p_bytes = sum((_numel(dims) or 0) * _itemsize(elem) for dims, elem in params)
        i_elems = sum(_numel(dims) or 0 for _, _, dims in self._parsed["initializers"])
        i_bytes = sum((_numel(dims) or 0) * _itemsize(t) for _, t, dims in self._parsed["initializers"])
        return {"parameters": len(params), "parameter_elements": p_elems, "parameter_bytes": p_bytes,
                "initializers": len(self._parsed["initializers"]), "initializer_elements": i_elems,
                "initializer_bytes": i_bytes, "file_bytes": self.path.stat().st_size}

    def summary(self) -> dict[str, Any]:
        inputs = self._parsed["inputs"]
        users = [i for i in inputs if self._input_role(i[0]) == "user input"]
        return {"mode": self.mode, "stage": self.name, "nodes": self.node_count, **self.kinds(),
                "op_types": len({n.op for n in self.node_list}),
                "user_inputs": len(users), "parameters": len(inputs) - len(users),
                "outputs": len(self._parsed["outputs"]), **{k: v for k, v in self.size().items() if k != "parameters"},
                "file": self.path.name}

    @cached_property
    def nodes(self):
        """Every node: name, op (domain::op), kind, module scope, inputs and outputs."""
        import pandas as pd

        return pd.DataFrame({
            "name": [n.name for n in self.node_list], "op": [n.op for n in self.node_list],
            "kind": [n.kind for n in self.node_list], "module": [module_scope(n.name) for n in self.node_list],
            "inputs": [list(n.inputs) for n in self.node_list], "outputs": [list(n.outputs) for n in self.node_list],
        })

    def search(self, text: str, by: str = "any", limit: int | None = 200):
        """Nodes whose name, op type (`MatMul`, `com.microsoft::FusedMatMul`) or module scope (`blocks.0.attn`,
        `/blocks.0/attn`) contains `text`, case-insensitively."""
        allowed = ("any", "name", "op", "module")
        if by not in allowed:
            raise GraphsError(f"search by {by!r} is not allowed; allowed: {', '.join(allowed)}")
        needle = text.strip().lower()
        if not needle:
            raise GraphsError("search text is empty; give part of a node name, an op type or a module scope")
        scope = ".".join(p for p in re.split(r"[/.]", needle.replace("_original_module", "")) if p)
        df = self.nodes
        hit = False
        if by in ("any", "name"):
            hit = hit | df["name"].str.lower().str.contains(needle, regex=False)
        if by in ("any", "op"):
            hit = hit | df["op"].str.lower().str.contains(needle, regex=False)
        if by in ("any", "module") and scope:
            mods = df["module"].str.lower()
            hit = hit | (mods == scope) | mods.str.startswith(scope + ".") | mods.str.contains(scope, regex=False)
        out = df[hit].drop(columns=["inputs", "outputs"]).reset_index(drop=True)
        return out.head(limit) if limit else out

    def neighbourhood(self, node: str, hops: int = 1, max_nodes: int = 40) -> Neighbourhood:
        """The node, its producers `hops` steps up and its consumers `hops` steps down (graph inputs and outputs
        included as small pseudo-nodes), nearest first, at most `max_nodes`."""
        if not isinstance(hops, int) or hops < 1:
            raise GraphsError(f"hops {hops!r} is not allowed; allowed: a whole number >= 1")
        center = self.node(node)
        graph_inputs = {v[0] for v in self._parsed["inputs"]}
        graph_outputs = {v[0] for v in self._parsed["outputs"]}
        distance: dict[str, int] = {center.name: 0}
        order = [center.name]
        truncated = 0
        for direction in (-1, 1):
            frontier = [center]
            for hop in range(1, hops + 1):
                nxt = []
                for n in frontier:
                    near = ([self._producer[t] for t in n.inputs if t in self._producer] if direction < 0
                            else [c for t in n.outputs for c in self._consumers.get(t, ())])
                    for m in near:
                        if m.name in distance:
                            continue
                        if len(order) >= max_nodes:
                            truncated += 1
                            continue
                        distance[m.name] = direction * hop
                        order.append(m.name)
                        nxt.append(m)
                frontier = nxt
        members = [self._by_name[n] for n in order]
        names = set(order)
        edges: list[tuple[str, str, str]] = []
        pseudo: dict[str, str] = {}
        for n in members:
            for t in n.inputs:
                p = self._producer.get(t)
                if p is not None and p.name in names:
                    edges.append((p.name, n.name, t))
                elif t in graph_inputs:
                    pseudo.setdefault("in:" + t, "input")
                    edges.append(("in:" + t, n.name, t))
            for t in n.outputs:
                if t in graph_outputs:
                    pseudo.setdefault("out:" + t, "output")
                    edges.append((n.name, "out:" + t, t))
        rows = [{"name": n.name, "op": n.op, "kind": n.kind, "module": module_scope(n.name),
                 "distance": distance[n.name]} for n in members]
        rows += [{"name": key, "op": "", "kind": kind, "module": "", "distance": None} for key, kind in pseudo.items()]
        return Neighbourhood(center.name, hops, self.label, rows, edges, truncated)

    def __repr__(self) -> str:
        return f"Stage({self.label!r}, file={self.path.name!r})"


# --------------------------------------------------------------------------------------------- a diff


@dataclass
class StageDiff:
    """What changed from stage `a` to stage `b`: op counts, nodes removed (and what they were fused into),
    nodes added (gradient, recompute, fusion or other), nodes whose op changed. Nodes are matched by name,
    which ORT keeps for nodes it does not touch."""

    a: str
    b: str
    nodes_a: int
    nodes_b: int
    ops: Any  # DataFrame: op, a, b, change (only ops whose count changed)
    added: Any  # DataFrame: name, op, kind, how
    removed: Any  # DataFrame: name, op, fused_into
    changed: Any  # DataFrame: name, op_a, op_b

    @property
    def gradient(self):
        """Nodes the gradient graph added."""
        return self.added[self.added["kind"] == "gradient"].reset_index(drop=True)

    @property
    def recompute(self):
        """Recompute nodes the memory optimizer added (`*_recompute`)."""
        return self.added[self.added["kind"] == "recompute"].reset_index(drop=True)

    @property
    def fused(self):
        """Nodes of `a` that went into a fused node of `b` (by name or by producing the same tensor)."""
        return self.removed[self.removed["fused_into"].notna()].reset_index(drop=True)

    def summary(self) -> dict[str, Any]:
        how = Counter(self.added["how"])
        return {"a": self.a, "b": self.b, "nodes_a": self.nodes_a, "nodes_b": self.nodes_b,
                "added": len(self.added), "removed": len(self.removed), "changed_op": len(self.changed),
                "gradient": how.get("gradient", 0), "recompute": how.get("recompute", 0),
                "fused_away": len(self.fused), "fusion_nodes": how.get("fusion", 0),
                "ops_added": sorted(self.ops.loc[self.ops["a"] == 0, "op"]),
                "ops_removed": sorted(self.ops.loc[self.ops["b"] == 0, "op"])}

    def table(self):
        """The per-op change table (what the chart draws)."""
        return self.ops

    def chart(self, top: int = 20):
        """Per-op count changes (largest first) and what the added and removed nodes were."""
        from matplotlib.figure import Figure

        ops = self.ops.head(top).iloc[::-1]
        fig = Figure(figsize=(9, max(2.6, 0.26 * len(ops) + 1.2)), dpi=100, layout="constrained")
        left, right = fig.subplots(1, 2, width_ratios=(3, 1))
        colors = ["#2a9d47" if c > 0 else "#c0392b" for c in ops["change"]]
        left.barh(range(len(ops)), ops["change"], color=colors)
        left.set_yticks(range(len(ops)), [f"{o}  ({a}\u2192{b})" for o, a, b in zip(ops["op"], ops["a"], ops["b"],
                                                                                  strict=True)], fontsize=8)
        left.axvline(0, color="#555", lw=0.8)
        left.set_xlabel("change in node count")
        delta = self.nodes_b - self.nodes_a
        left.set_title(f"{self.a} \u2192 {self.b}: {self.nodes_a} \u2192 {self.nodes_b} nodes ({delta:+d})",
                       fontsize=10)
        if not len(ops):
            left.text(0.5, 0.5, "no op count changed", ha="center", va="center", transform=left.transAxes)
        s = self.summary()
        labels = ["gradient", "recompute", "fusion", "other added", "fused away", "removed"]
        values = [s["gradient"], s["recompute"], s["fusion_nodes"],
                  s["added"] - s["gradient"] - s["recompute"] - s["fusion_nodes"], s["fused_away"],
                  s["removed"] - s["fused_away"]]
        bar_colors = [_KIND_COLORS["gradient"][1], _KIND_COLORS["recompute"][1], "#1f77b4", "#7f7f7f", "#f4a261",
                      "#c0392b"]
        right.barh(range(len(labels))[::-1], values, color=bar_colors)
        right.set_yticks(range(len(labels))[::-1], labels, fontsize=8)
        for y, v in zip(range(len(labels))[::-1], values, strict=True):
            right.text(v, y, f" {v}", va="center", fontsize=8)
        right.set_xlabel("nodes")
        right.set_title("added / removed", fontsize=10)
        right.margins(x=0.25)
        return fig

    def __repr__(self) -> str:
        s = self.summary()
        return (f"StageDiff({self.a!r} -> {self.b!r}: {self.nodes_a} -> {self.nodes_b} nodes, +{s['added']} "
                f"-{s['removed']}, gradient {s['gradient']}, recompute {s['recompute']}, fused away {s['fused_away']})")


def diff_stages(a: Stage, b: Stage) -> StageDiff:
    import pandas as pd

    ca, cb = Counter(n.op for n in a.node_list), Counter(n.op for n in b.node_list)
    ops = [(op, ca.get(op, 0), cb.get(op, 0)) for op in set(ca) | set(cb) if ca.get(op, 0) != cb.get(op, 0)]
    ops.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    ops_df = pd.DataFrame([{"op": o, "a": x, "b": y, "change": y - x} for o, x, y in ops],
                          columns=["op", "a", "b", "change"])
    a_names, b_names = a._by_name, b._by_name
    added_nodes = [n for n in b.node_list if n.name not in a_names]
    removed_nodes = [n for n in a.node_list if n.name not in b_names]
    # A fused node is named after a node it replaced (`.../MatMul/MatMulScaleFusion/`) or produces its output.
    by_prefix: dict[str, str] = {}
    for n in sorted(added_nodes, key=lambda n: n.kind == "recompute"):  # the fused node before its recompute copy
        at = n.name.find("/", 1)
        while at > 0:
            by_prefix.setdefault(n.name[:at], n.name)
            at = n.name.find("/", at + 1)
    added_set = {n.name for n in added_nodes}
    fused_into = {}
    for n in removed_nodes:
        target = by_prefix.get(n.name)
        if target is None:
            for t in n.outputs:
                p = b._producer.get(t)
                if p is not None and p.name in added_set:
                    target = p.name
                    break
        fused_into[n.name] = target
    targets = {t for t in fused_into.values() if t}
    added_rows = []
    for n in added_nodes:
        if n.kind in ("gradient", "recompute"):
            how = n.kind
        elif n.name in targets or "Fusion" in n.name or "_token_" in n.name:
            how = "fusion"
        else:
            how = "other"
        added_rows.append({"name": n.name, "op": n.op, "kind": n.kind, "how": how})
    removed_rows = [{"name": n.name, "op": n.op, "fused_into": fused_into[n.name]} for n in removed_nodes]
    changed_rows = [{"name": n.name, "op_a": a_names[n.name].op, "op_b": n.op} for n in b.node_list
                    if n.name in a_names and a_names[n.name].op != n.op]
    return StageDiff(a.label, b.label, a.node_count, b.node_count, ops_df,
                     pd.DataFrame(added_rows, columns=["name", "op", "kind", "how"]),
                     pd.DataFrame(removed_rows, columns=["name", "op", "fused_into"]),
                     pd.DataFrame(changed_rows, columns=["name", "op_a", "op_b"]))


# --------------------------------------------------------------------------------------------- neighbourhood


_KIND_COLORS = {  # fill, stroke
    "forward": ("#e8f0fe", "#4a6fa5"), "gradient": ("#fdebd9", "#d9822b"), "recompute": ("#efe3fb", "#8e44ad"),
    "yield": ("#fff3bf", "#b7950b"), "input": ("#f1f3f5", "#868e96"), "output": ("#e6f4ea", "#2f9e44"),
}


@dataclass
class Neighbourhood:
    """A node and its producers and consumers some hops out: a table, and an SVG drawn by ortlab (no server,
    no browser extension: it renders in a static notebook) or by graphviz when its `dot` is installed."""

    center: str
    hops: int
    stage: str
    rows: list[dict[str, Any]]
    edges: list[tuple[str, str, str]]  # (from, to, tensor)
    truncated: int = 0

    @property
    def nodes(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["name", "op", "kind", "module", "distance"])

    def to_dot(self) -> str:
        lines = ["digraph G {", '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
        for r in self.rows:
            fill, stroke = _KIND_COLORS.get(r["kind"], _KIND_COLORS["forward"])
            if r["op"] == "":
                label = _dot_escape(_short(r["name"].split(":", 1)[1]))
            else:
                label = _dot_escape(r["op"].split("::")[-1]) + "\\n" + _dot_escape(_short(r["name"]))
            extra = ", penwidth=3" if r["name"] == self.center else ""
            shape = ", shape=ellipse" if r["op"] == "" else ""
            lines.append(f'  "{_dot_escape(r["name"])}" [label="{label}", fillcolor="{fill}", '
                         f'color="{stroke}"{shape}{extra}];')
        for src, dst, tensor in self.edges:
            lines.append(f'  "{_dot_escape(src)}" -> "{_dot_escape(dst)}" [tooltip="{_dot_escape(tensor)}"];')
        lines.append("}")
        return "\n".join(lines)

    def svg(self, engine: str = "auto") -> str:
        """SVG text. engine: "auto" (graphviz if `dot` is on PATH, else ortlab), "ortlab" or "graphviz"."""
        import shutil

        allowed = ("auto", "ortlab", "graphviz")
        if engine not in allowed:
            raise GraphsError(f"engine {engine!r} is not allowed; allowed: {', '.join(allowed)}")
        dot = shutil.which("dot")
        if engine == "graphviz" and not dot:
            raise GraphsError("engine 'graphviz' needs graphviz's `dot` on PATH; use engine='ortlab'")
        if engine != "ortlab" and dot:
            import subprocess

            try:
                r = subprocess.run([dot, "-Tsvg"], input=self.to_dot(), capture_output=True, text=True, timeout=20)
                if r.returncode == 0 and "<svg" in r.stdout:
                    return r.stdout[r.stdout.find("<svg"):]
            except (OSError, subprocess.TimeoutExpired):
                pass
            if engine == "graphviz":
                raise GraphsError("graphviz's `dot` failed to render this neighbourhood; use engine='ortlab'")
        return _render_svg(self)

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        more = f", {self.truncated} more not shown" if self.truncated else ""
        return f"Neighbourhood({self.center!r}, hops={self.hops}, stage={self.stage!r}, nodes={len(self.rows)}{more})"


def _short(name: str, width: int = 34) -> str:
    name = name.removeprefix(_PARAM_PREFIX)
    parts = [p for p in name.split("/") if p and p != "_original_module"]
    text = "/".join(parts[-2:]) if parts else name
    return text if len(text) <= width else "\u2026" + text[-(width - 1):]


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _render_svg(nb: Neighbourhood) -> str:
    """A layered drawing: every edge points down, layers by longest path, order by the barycentre of
    neighbours; deterministic for the same input."""
    ids = [r["name"] for r in nb.rows]
    info = {r["name"]: r for r in nb.rows}
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    seen = set()
    for s, d, _ in nb.edges:
        if (s, d) not in seen and s != d:
            seen.add((s, d))
            succ[s].append(d)
            pred[d].append(s)
    # longest-path layering (Kahn); a cycle cannot occur in an ONNX graph, but stay total if it did
    indeg = {i: len(pred[i]) for i in ids}
    rank = dict.fromkeys(ids, 0)
    queue = [i for i in ids if indeg[i] == 0]
    done = 0
    while queue:
        n = queue.pop(0)
        done += 1
        for m in succ[n]:
            rank[m] = max(rank[m], rank[n] + 1)
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    # graph inputs sit right above their consumer rather than at the top
    for i in ids:
        if info[i]["kind"] == "input" and succ[i]:
            rank[i] = max(0, min(rank[m] for m in succ[i]) - 1)
    layers: dict[int, list[str]] = defaultdict(list)
    for i in ids:
        layers[rank[i]].append(i)

    def box(i):
        r = info[i]
        if r["op"] == "":
            label = _short(i.split(":", 1)[1], 28)
            return max(60, 6.2 * len(label) + 18), 22
        return max(70, 6.4 * max(len(r["op"].split("::")[-1]), len(_short(i))) + 18), 36

    sizes = {i: box(i) for i in ids}
    gap_x, gap_y, margin, legend_h = 14, 34, 12, 26
    xs: dict[str, float] = {}

    def place(layer: list[str]) -> None:
        x = 0.0
        for i in layer:
            xs[i] = x + sizes[i][0] / 2
            x += sizes[i][0] + gap_x

    for r in sorted(layers):
        place(layers[r])
    for sweep in range(4):  # barycentre ordering, down then up
        order = sorted(layers) if sweep % 2 == 0 else sorted(layers, reverse=True)
        for r in order:
            nbrs = pred if sweep % 2 == 0 else succ

            def key(i, nbrs=nbrs):
                near = [xs[m] for m in nbrs[i] if m in xs]
                return (sum(near) / len(near)) if near else xs[i]

            layers[r].sort(key=key)
            place(layers[r])
    widths = {r: sum(sizes[i][0] for i in layers[r]) + gap_x * (len(layers[r]) - 1) for r in layers}
    legend = [(kind, 22 + 6.2 * len(kind)) for kind in ("forward", "gradient", "recompute", "yield", "input", "output")]
    note = f"{nb.truncated} more not shown" if nb.truncated else ""
    total_w = max([*widths.values(), sum(w for _, w in legend) + 6.2 * len(note) + 8])
    for r in layers:  # centre each layer
        shift = (total_w - widths[r]) / 2
        for i in layers[r]:
            xs[i] += shift
    ys: dict[int, float] = {}
    y = margin + legend_h
    for r in sorted(layers):
        h = max(sizes[i][1] for i in layers[r])
        ys[r] = y + h / 2
        y += h + gap_y
    width, height = total_w + 2 * margin, y - gap_y + margin
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif">',
           '<defs><marker id="ortlab-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#666"/></marker></defs>',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>']
    lx = margin
    for kind, w in legend:
        fill, stroke = _KIND_COLORS[kind]
        out.append(f'<rect x="{lx:.1f}" y="{margin}" width="12" height="12" rx="2" fill="{fill}" stroke="{stroke}"/>'
                   f'<text x="{lx + 16:.1f}" y="{margin + 10}" font-size="10" fill="#333">{kind}</text>')
        lx += w
    if note:
        out.append(f'<text x="{lx + 8:.1f}" y="{margin + 10}" font-size="10" fill="#c0392b">{note}</text>')
    for s, d in sorted(seen, key=lambda e: (ids.index(e[0]), ids.index(e[1]))):
        x1, y1 = xs[s], ys[rank[s]] + sizes[s][1] / 2
        x2, y2 = xs[d], ys[rank[d]] - sizes[d][1] / 2
        my = (y1 + y2) / 2
        tensors = ", ".join(t for a, b, t in nb.edges if a == s and b == d)
        out.append(f'<path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {my:.1f}, {x2:.1f} {my:.1f}, {x2:.1f} {y2 - 1:.1f}" '
                   f'fill="none" stroke="#888" stroke-width="1.2" marker-end="url(#ortlab-arrow)">'
                   f'<title>{html.escape(tensors)}</title></path>')
    for i in ids:
        r, (w, h) = info[i], sizes[i]
        x, yc = xs[i] - w / 2, ys[rank[i]]
        fill, stroke = _KIND_COLORS.get(r["kind"], _KIND_COLORS["forward"])
        if i == nb.center:
            stroke, sw = "#d6336c", 3
        else:
            sw = 1.2
        tip = html.escape(i if r["op"] == "" else f"{r['op']}  {i}")
        out.append(f'<g><title>{tip}</title>')
        if r["op"] == "":
            out.append(f'<rect x="{x:.1f}" y="{yc - h / 2:.1f}" width="{w:.1f}" height="{h}" rx="{h / 2}" '
                       f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>'
                       f'<text x="{xs[i]:.1f}" y="{yc + 4:.1f}" font-size="10" text-anchor="middle" fill="#333">'
                       f'{html.escape(_short(i.split(":", 1)[1], 28))}</text></g>')
        else:
            out.append(f'<rect x="{x:.1f}" y="{yc - h / 2:.1f}" width="{w:.1f}" height="{h}" rx="4" '
                       f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>'
                       f'<text x="{xs[i]:.1f}" y="{yc - 3:.1f}" font-size="12" font-weight="bold" '
                       f'text-anchor="middle" fill="#222">{html.escape(r["op"].split("::")[-1])}</text>'
                       f'<text x="{xs[i]:.1f}" y="{yc + 11:.1f}" font-size="9.5" text-anchor="middle" fill="#555">'
                       f'{html.escape(_short(i))}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- a folder


@dataclass(frozen=True)
class StageFile:
    path: Path
    prefix: str
    stage: str
    mode: str


def find_stage_files(folder: str | Path) -> list[StageFile]:
    """Every `PREFIX_STAGE_MODE.onnx` directly in `folder`, in stage order."""
    folder = Path(folder)
    found = []
    for p in folder.glob("*.onnx") if folder.is_dir() else ():
        m = _FILE.match(p.name)
        if m:
            found.append(StageFile(p, m["prefix"], m["stage"], m["mode"]))
    return sorted(found, key=lambda f: (f.prefix, MODES.index(f.mode), STAGES.index(f.stage)))


@dataclass
class Graphs:
    """The stage files of one ORTModule export (one prefix), per mode, and what a run recorded about it."""

    folder: Path
    prefix: str
    files: dict[tuple[str, str], Path]  # (mode, stage) -> file
    run: Any = None  # the ortlab Run, when the folder belongs to one
    _stages: dict[tuple[str, str], Stage] = field(default_factory=dict, repr=False)

    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if any(k[0] == m for k in self.files)]

    def stages(self, mode: str = "training") -> list[str]:
        self._check_mode(mode)
        return [s for s in STAGES if (mode, s) in self.files]

    def _check_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise GraphsError(f"mode {mode!r} has no stage files in {self.folder}; modes here: {', '.join(self.modes)}")

    def stage(self, name: str | None = None, mode: str = "training") -> Stage:
        """One stage (default: the execution model, what ORT runs)."""
        present = self.stages(mode)
        name = name or present[-1]
        if name not in present:
            raise GraphsError(f"stage {name!r} is not in {self.folder} for mode {mode}; stages there: "
                              f"{', '.join(present)}")
        key = (mode, name)
        if key not in self._stages:
            user, grad = self._ort_inputs()
            self._stages[key] = Stage(self.files[key], name, mode, self.prefix, user, grad)
        return self._stages[key]

    def _ort_inputs(self) -> tuple[set[str] | None, set[str]]:
        info = (self.run.ort.get("post_export") or {}) if self.run is not None else {}
        user = set(info["user_inputs"]) if info.get("user_inputs") is not None else None
        return user, set(info.get("graph_inputs_requiring_grad") or [])

    def summary(self, mode: str | None = None):
        """One row per stage: node counts by kind, op types, inputs, outputs, sizes."""
        import pandas as pd

        modes = [mode] if mode else self.modes
        rows = [self.stage(s, m).summary() for m in modes for s in self.stages(m)]
        return pd.DataFrame(rows)

    def diff(self, a: str | None = None, b: str | None = None, mode: str = "training") -> StageDiff:
        """Stage a -> stage b (default: the first and the last stage of the mode)."""
        present = self.stages(mode)
        return diff_stages(self.stage(a or present[0], mode), self.stage(b or present[-1], mode))

    def diffs(self, mode: str = "training"):
        """Each stage against the one before it: one summary row per step."""
        import pandas as pd

        present = self.stages(mode)
        rows = [self.diff(x, y, mode).summary() for x, y in zip(present, present[1:], strict=False)]
        return pd.DataFrame(rows)

    def search(self, text: str, stage: str | None = None, mode: str = "training", by: str = "any",
               limit: int | None = 200):
        return self.stage(stage, mode).search(text, by, limit)

    def neighbourhood(self, node: str, hops: int = 1, stage: str | None = None, mode: str = "training",
                      max_nodes: int = 40) -> Neighbourhood:
        return self.stage(stage, mode).neighbourhood(node, hops, max_nodes)

    @property
    def transitions(self):
        """Why ORTModule exported (the run's transition table) and the input schema behind each export: the
        recorded old -> new schema of a re-export, else the user inputs of the exported graph."""
        import pandas as pd

        cols = ["run", "step", "action", "reason", "input_schema", "ort_exported"]
        t = self.run.transitions if self.run is not None else pd.DataFrame()
        if not len(t):
            return pd.DataFrame(columns=cols)
        mode = "training" if "training" in self.modes else self.modes[0]
        first = self.stage(self.stages(mode)[0], mode).inputs
        users = first[first["role"] == "user input"]
        exported = ", ".join(f"{r.name}: {r.dtype}, rank {r.rank}" for r in users.itertuples())

        def schema(row):
            change = (row.get("changes") or {}).get("input_schema")
            if change:
                return f"{change['old']} -> {change['new']}"
            return exported if row.get("ort_exported") else ""

        t = t.assign(input_schema=[schema(r) for r in t.to_dict(orient="records")])
        return t[[c for c in cols if c in t.columns]]

    def chart(self, mode: str = "training"):
        """Node count per stage, stacked by kind."""
        from matplotlib.figure import Figure

        df = self.summary(mode)
        fig = Figure(figsize=(7, 3), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        bottom = [0] * len(df)
        for kind in KINDS:
            ax.bar(df["stage"], df[kind], bottom=bottom, label=kind, color=_KIND_COLORS[kind][1])
            bottom = [b + v for b, v in zip(bottom, df[kind], strict=True)]
        for x, total in enumerate(df["nodes"]):
            ax.text(x, total, str(total), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("nodes")
        ax.set_title(f"{self.prefix} ({mode}): nodes per stage")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
        ax.set_ylim(0, max(df["nodes"].max(), 1) * 1.12)
        return fig

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "prefix": self.prefix, "modes": self.modes,
                "stages": self.summary().to_dict(orient="records"),
                "diffs": {m: self.diffs(m).to_dict(orient="records") for m in self.modes}}

    def __repr__(self) -> str:
        per_mode = ", ".join(f"{m}: {len(self.stages(m))} stages" for m in self.modes)
        return f"Graphs(prefix={self.prefix!r}, {per_mode})"


def graphs(source: Any, prefix: str | None = None) -> Graphs:
    """The exported graphs of a run (a Run or its folder) or of any folder of ORTModule stage files."""
    from ortlab.run import Run, RunError, load_run

    run = source if isinstance(source, Run) else None
    folder = Path(run.path if run is not None else source).expanduser()
    if not folder.exists():
        raise GraphsError(f"{folder} does not exist; give a run, a run folder or a folder of ORTModule stage files")
    if run is None and (folder / "meta.json").is_file():
        try:
            run = load_run(folder)
        except RunError:
            run = None
    candidates = [folder]
    if run is not None:
        saved = (run.meta.get("effective_options") or {}).get("save_onnx_path")
        candidates = [Path(saved)] if saved else []
        candidates += [run.path / "onnx", run.path]
    elif (folder / "onnx").is_dir():
        candidates.insert(0, folder / "onnx")
    for where in candidates:
        files = find_stage_files(where)
        if files:
            break
    else:
        raise GraphsError(_nothing_found(folder, run))
    prefixes = sorted({f.prefix for f in files})
    if prefix is None and len(prefixes) > 1:
        raise GraphsError(f"{where} holds the stage files of several exports; pick one with prefix=: "
                          f"{', '.join(prefixes)}")
    prefix = prefix if prefix is not None else prefixes[0]
    if prefix not in prefixes:
        raise GraphsError(f"no stage files with prefix {prefix!r} in {where}; prefixes there: {', '.join(prefixes)}")
    chosen = {(f.mode, f.stage): f.path for f in files if f.prefix == prefix}
    return Graphs(where, prefix, chosen, run)


def _nothing_found(folder: Path, run) -> str:
    expected = f"files named PREFIX_STAGE_MODE.onnx, STAGE one of {', '.join(STAGES)}, MODE training or inference"
    if run is None:
        return f"no ORTModule stage files in {folder} ({expected})"
    options = run.meta.get("effective_options") or {}
    if run.backend != "ortmodule":
        why = f"it is a {run.backend} burst: only ORTModule bursts export graphs"
    elif not options.get("save_onnx"):
        why = "it ran without save_onnx: run the burst with options={'save_onnx': True}"
    elif run.transitions.get("ort_exported", []).tolist() == [False] or (
            len(run.transitions) and not run.transitions["ort_exported"].fillna(False).any()):
        why = "ORT did not export in this burst (it reused the ORTModule of an earlier burst): see that burst's graphs"
    else:
        why = "ORT wrote none (the burst may have failed before the export)"
    return f"no ORTModule stage files for run {run.path.name}: {why}"


# --------------------------------------------------------------------------------------------- CLI


def register_cli(subparsers) -> None:
    """Add `graphs RUN [--json] [--stage S] [--diff A B] [--search TEXT] [--mode M]` to ortlab's CLI."""
    p = subparsers.add_parser("graphs", help="ORTModule's exported graphs: stages, diffs, node search")
    p.add_argument("run", metavar="RUN", help="a run folder or any folder of ORTModule stage files")
    p.add_argument("--json", action="store_true")
    p.add_argument("--stage", help=f"one stage in detail: {', '.join(STAGES)}")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="what changed from stage A to stage B")
    p.add_argument("--search", metavar="TEXT", help="nodes by name, op type or module scope (in --stage, default: "
                                                     "the execution model)")
    p.add_argument("--mode", choices=MODES, default="training")
    p.add_argument("--prefix", help="which export, when the folder holds several")
    p.set_defaults(func=_cmd_graphs)


def _cmd_graphs(args) -> int:
    import json

    try:
        g = graphs(args.run, prefix=args.prefix)
        if args.search:
            df = g.search(args.search, args.stage, args.mode)
            data, text = df.to_dict(orient="records"), df.to_string(index=False) if len(df) else "no matching nodes"
        elif args.diff:
            d = g.diff(args.diff[0], args.diff[1], args.mode)
            data = {**d.summary(), "ops": d.ops.to_dict(orient="records"),
                    "fused": d.fused.to_dict(orient="records")}
            text = _diff_text(d)
        elif args.stage:
            st = g.stage(args.stage, args.mode)
            data = {"summary": st.summary(), "histogram": st.histogram().to_dict(),
                    "inputs": st.inputs.to_dict(orient="records"), "outputs": st.outputs.to_dict(orient="records")}
            text = _stage_text(st)
        else:
            data = {**g.to_dict(), "transitions": g.transitions.to_dict(orient="records")}
            text = _graphs_text(g)
    except GraphsError as e:
        print(f"ortlab graphs: {e}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2, default=str) if args.json else text)
    return 0


def _graphs_text(g: Graphs) -> str:
    cols = ["stage", "nodes", "forward", "gradient", "recompute", "op_types", "user_inputs", "parameters", "outputs"]
    lines = [f"{g.folder}  (prefix {g.prefix!r})"]
    for mode in g.modes:
        lines += ["", f"{mode}:", g.summary(mode)[cols].to_string(index=False), "", "what each stage changed:"]
        d = g.diffs(mode)
        if len(d):
            d = d.assign(step=d["a"].str.split("/").str[-1] + " -> " + d["b"].str.split("/").str[-1])
            lines.append(d[["step", "nodes_a", "nodes_b", "added", "removed", "fused_away", "gradient",
                            "recompute"]].to_string(index=False))
    t = g.transitions
    if len(t):
        lines += ["", "why ORTModule exported:", t.to_string(index=False)]
    return "\n".join(lines)


def _stage_text(st: Stage) -> str:
    s = st.summary()
    lines = [f"{st.label}: {s['nodes']} nodes ({', '.join(f'{k} {s[k]}' for k in KINDS)}), {s['op_types']} op types, "
             f"parameters {s['parameter_elements']:,} elements ({s['parameter_bytes'] / 2**20:.2f} MB), "
             f"file {s['file_bytes'] / 2**20:.2f} MB", "", "ops:", st.histogram().to_string(), "",
             "inputs:", st.inputs.to_string(index=False), "", "outputs:", st.outputs.to_string(index=False)]
    return "\n".join(lines)


def _diff_text(d: StageDiff) -> str:
    lines = [repr(d), ""]
    lines.append(d.ops.to_string(index=False) if len(d.ops) else "no op count changed")
    if len(d.fused):
        lines += ["", "fused away:", d.fused.to_string(index=False)]
    return "\n".join(lines)


class _CallableModule(types.ModuleType):
    """`ortlab.graphs(run)` is the entry point and `ortlab.graphs` is also this module: whichever of the two a
    name lookup finds, calling it works."""

    def __call__(self, *args: Any, **kwargs: Any) -> Graphs:
        return graphs(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
