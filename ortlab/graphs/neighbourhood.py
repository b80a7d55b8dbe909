"""Where a node sits: its producers and consumers some hops out, as a table, a DOT text and an SVG."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ortlab.graphs.errors import GraphsError
from ortlab.graphs.names import module_scope, short_name
from ortlab.graphs.svg import KIND_COLORS, render_svg

if TYPE_CHECKING:
    from ortlab.graphs.stage import Stage

_ENGINES = ("auto", "ortlab", "graphviz")


@dataclass
class Neighbourhood:
    """A node and its producers and consumers some hops out: a table, and an SVG drawn by ortlab (no server,
    no browser extension: it renders in a static notebook) or by graphviz when its `dot` is installed.
    Graph inputs and outputs are pseudo-nodes named `in:TENSOR` and `out:TENSOR` with an empty op."""

    center: str
    hops: int
    stage: str
    rows: list[dict[str, Any]]  # name, op, kind, module, distance (negative: producers; None: pseudo-nodes)
    edges: list[tuple[str, str, str]]  # (from, to, tensor)
    truncated: int = 0

    @property
    def nodes(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["name", "op", "kind", "module", "distance"])

    def to_dot(self) -> str:
        lines = ["digraph G {",
                 '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
        for r in self.rows:
            fill, stroke = KIND_COLORS.get(r["kind"], KIND_COLORS["forward"])
            if r["op"] == "":
                label = _dot_escape(short_name(r["name"].split(":", 1)[1]))
            else:
                label = _dot_escape(r["op"].split("::")[-1]) + "\\n" + _dot_escape(short_name(r["name"]))
            extra = ", penwidth=3" if r["name"] == self.center else ""
            shape = ", shape=ellipse" if r["op"] == "" else ""
            lines.append(f'  "{_dot_escape(r["name"])}" [label="{label}", fillcolor="{fill}", '
                         f'color="{stroke}"{shape}{extra}];')
        for src, dst, tensor in self.edges:
            lines.append(f'  "{_dot_escape(src)}" -> "{_dot_escape(dst)}" [tooltip="{_dot_escape(tensor)}"];')
        lines.append("}")
        return "\n".join(lines)

    def svg(self, engine: str = "auto", overlay: Any = None) -> str:
        """SVG text. engine: "auto" (graphviz if `dot` is on PATH, else ortlab), "ortlab" or "graphviz". `overlay`:
        a graphs.overlay.Overlay whose colours and values the nodes show (drawn by ortlab)."""
        import shutil

        if engine not in _ENGINES:
            raise GraphsError(f"engine {engine!r} is not allowed; allowed: {', '.join(_ENGINES)}")
        if overlay is not None:
            shown = {r["name"]: (overlay.colors[r["name"]], f"{overlay.values[r['name']]:.4g} ({overlay.unit})")
                     for r in self.rows if r["name"] in overlay.values}
            return render_svg(self.center, self.rows, self.edges, self.truncated, shown)
        dot = shutil.which("dot")
        if engine == "graphviz" and not dot:
            raise GraphsError("engine 'graphviz' needs graphviz's `dot` on PATH; use engine='ortlab'")
        if engine != "ortlab" and dot:
            import subprocess

            try:
                r = subprocess.run([dot, "-Tsvg"], input=self.to_dot(), capture_output=True, text=True,
                                   timeout=20)
                if r.returncode == 0 and "<svg" in r.stdout:
                    return r.stdout[r.stdout.find("<svg"):]
            except (OSError, subprocess.TimeoutExpired):
                pass
            if engine == "graphviz":
                raise GraphsError("graphviz's `dot` failed to render this neighbourhood; use engine='ortlab'")
        return render_svg(self.center, self.rows, self.edges, self.truncated)

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        more = f", {self.truncated} more not shown" if self.truncated else ""
        return (f"Neighbourhood({self.center!r}, hops={self.hops}, stage={self.stage!r}, "
                f"nodes={len(self.rows)}{more})")


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def find_neighbourhood(stage: Stage, node: str, hops: int = 1, max_nodes: int = 40) -> Neighbourhood:
    """Breadth-first up the producers and down the consumers of `node`, nearest first, at most `max_nodes`
    (the rest counted in `truncated`)."""
    if not isinstance(hops, int) or hops < 1:
        raise GraphsError(f"hops {hops!r} is not allowed; allowed: a whole number >= 1")
    center = stage.node(node)
    producer, consumers = stage.producer_of, stage.consumers_of
    distance: dict[str, int] = {center.name: 0}
    order = [center.name]
    truncated = 0
    for direction in (-1, 1):
        frontier = [center]
        for hop in range(1, hops + 1):
            nxt = []
            for n in frontier:
                near = ([producer[t] for t in n.inputs if t in producer] if direction < 0
                        else [c for t in n.outputs for c in consumers.get(t, ())])
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
    members = [stage.nodes_by_name[n] for n in order]
    names = set(order)
    graph_inputs, graph_outputs = stage.graph_input_names, stage.graph_output_names
    edges: list[tuple[str, str, str]] = []
    pseudo: dict[str, str] = {}
    for n in members:
        for t in n.inputs:
            p = producer.get(t)
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
    rows += [{"name": key, "op": "", "kind": kind, "module": "", "distance": None}
             for key, kind in pseudo.items()]
    return Neighbourhood(center.name, hops, stage.label, rows, edges, truncated)
