"""What changed from one stage to another: op counts, nodes added (gradient, recompute, fusion), nodes removed
(and the fused node they went into), nodes whose op changed.

Nodes are matched by name, which ORT keeps for the nodes it does not touch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortlab.graphs.stage import Node, Stage


@dataclass
class StageDiff:
    """Stage `a` -> stage `b` (labels such as `training/optimized`) as tables."""

    a: str
    b: str
    nodes_a: int
    nodes_b: int
    ops: Any  # DataFrame: op, a, b, change (only ops whose count changed), largest change first
    added: Any  # DataFrame: name, op, kind, how (gradient, recompute, fusion, other)
    removed: Any  # DataFrame: name, op, fused_into (None: folded away or eliminated)
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
        """Per-op count changes (the `top` largest) and what the added and removed nodes were."""
        from ortlab.graphs.figures import diff_chart

        return diff_chart(self, top)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"StageDiff({self.a!r} -> {self.b!r}: {self.nodes_a} -> {self.nodes_b} nodes, +{s['added']} "
                f"-{s['removed']}, gradient {s['gradient']}, recompute {s['recompute']}, "
                f"fused away {s['fused_away']})")


def _fused_into(b: Stage, added: list[Node], removed: list[Node]) -> dict[str, str | None]:
    """Removed node -> the added node that replaced it: one named after it (`.../MatMul/MatMulScaleFusion/`)
    or one that produces a tensor it produced."""
    by_prefix: dict[str, str] = {}
    for n in sorted(added, key=lambda n: n.kind == "recompute"):  # the fused node before its recompute copy
        at = n.name.find("/", 1)
        while at > 0:
            by_prefix.setdefault(n.name[:at], n.name)
            at = n.name.find("/", at + 1)
    added_names = {n.name for n in added}
    out: dict[str, str | None] = {}
    for n in removed:
        target = by_prefix.get(n.name)
        if target is None:
            producers = (b.producer_of.get(t) for t in n.outputs)
            target = next((p.name for p in producers if p is not None and p.name in added_names), None)
        out[n.name] = target
    return out


def _how(n: Node, fusion_targets: set[str]) -> str:
    if n.kind in ("gradient", "recompute"):
        return n.kind
    if n.name in fusion_targets or "Fusion" in n.name or "_token_" in n.name:
        return "fusion"
    return "other"


def diff_stages(a: Stage, b: Stage) -> StageDiff:
    """What changed from stage `a` to stage `b` (any two stages; ORT's own order is the meaningful one)."""
    import pandas as pd

    ca, cb = Counter(n.op for n in a.model_nodes), Counter(n.op for n in b.model_nodes)
    ops = [(op, ca.get(op, 0), cb.get(op, 0)) for op in set(ca) | set(cb) if ca.get(op, 0) != cb.get(op, 0)]
    ops.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    ops_df = pd.DataFrame([{"op": o, "a": x, "b": y, "change": y - x} for o, x, y in ops],
                          columns=["op", "a", "b", "change"])
    a_names, b_names = a.nodes_by_name, b.nodes_by_name
    added = [n for n in b.model_nodes if n.name not in a_names]
    removed = [n for n in a.model_nodes if n.name not in b_names]
    fused_into = _fused_into(b, added, removed)
    targets = {t for t in fused_into.values() if t}
    added_rows = [{"name": n.name, "op": n.op, "kind": n.kind, "how": _how(n, targets)} for n in added]
    removed_rows = [{"name": n.name, "op": n.op, "fused_into": fused_into[n.name]} for n in removed]
    changed_rows = [{"name": n.name, "op_a": a_names[n.name].op, "op_b": n.op} for n in b.model_nodes
                    if n.name in a_names and a_names[n.name].op != n.op]
    return StageDiff(a.label, b.label, a.node_count, b.node_count, ops_df,
                     pd.DataFrame(added_rows, columns=["name", "op", "kind", "how"]),
                     pd.DataFrame(removed_rows, columns=["name", "op", "fused_into"]),
                     pd.DataFrame(changed_rows, columns=["name", "op_a", "op_b"]))
