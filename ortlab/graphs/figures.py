"""matplotlib figures of the graphs views: nodes per stage, and what a stage diff changed. Loaded only when a
chart is asked for, so that reading graphs never imports matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortlab.graphs.names import KINDS
from ortlab.graphs.svg import KIND_COLORS

if TYPE_CHECKING:
    from ortlab.graphs.diff import StageDiff


def stages_chart(summary, title: str):
    """Node count per stage stacked by kind, from a summary table (one row per stage, as Graphs.summary)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    bottom = [0] * len(summary)
    for kind in KINDS:
        ax.bar(summary["stage"], summary[kind], bottom=bottom, label=kind, color=KIND_COLORS[kind][1])
        bottom = [b + v for b, v in zip(bottom, summary[kind], strict=True)]
    for x, total in enumerate(summary["nodes"]):
        ax.text(x, total, str(total), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("nodes")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_ylim(0, max(summary["nodes"].max(), 1) * 1.12)
    return fig


def diff_chart(d: StageDiff, top: int = 20):
    """Left: the `top` largest per-op count changes. Right: what the added and removed nodes were."""
    from matplotlib.figure import Figure

    ops = d.ops.head(top).iloc[::-1]
    fig = Figure(figsize=(9, max(2.6, 0.26 * len(ops) + 1.2)), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 1))
    colors = ["#2a9d47" if c > 0 else "#c0392b" for c in ops["change"]]
    left.barh(range(len(ops)), ops["change"], color=colors)
    labels = [f"{o}  ({a}\u2192{b})" for o, a, b in zip(ops["op"], ops["a"], ops["b"], strict=True)]
    left.set_yticks(range(len(ops)), labels, fontsize=8)
    left.axvline(0, color="#555", lw=0.8)
    left.set_xlabel("change in node count")
    delta = d.nodes_b - d.nodes_a
    left.set_title(f"{d.a} \u2192 {d.b}: {d.nodes_a} \u2192 {d.nodes_b} nodes ({delta:+d})", fontsize=10)
    if not len(ops):
        left.text(0.5, 0.5, "no op count changed", ha="center", va="center", transform=left.transAxes)
    s = d.summary()
    other_added = s["added"] - s["gradient"] - s["recompute"] - s["fusion_nodes"]
    bars = [("gradient", s["gradient"], KIND_COLORS["gradient"][1]),
            ("recompute", s["recompute"], KIND_COLORS["recompute"][1]),
            ("fusion", s["fusion_nodes"], "#1f77b4"), ("other added", other_added, "#7f7f7f"),
            ("fused away", s["fused_away"], "#f4a261"),
            ("removed", s["removed"] - s["fused_away"], "#c0392b")]
    ys = range(len(bars))[::-1]
    right.barh(ys, [v for _, v, _ in bars], color=[c for _, _, c in bars])
    right.set_yticks(ys, [name for name, _, _ in bars], fontsize=8)
    for y, (_, v, _) in zip(ys, bars, strict=True):
        right.text(v, y, f" {v}", va="center", fontsize=8)
    right.set_xlabel("nodes")
    right.set_title("added / removed", fontsize=10)
    right.margins(x=0.25)
    return fig
