"""The live-bytes timeline of one or more accounts overlaid (two runs, two plans), each peak marked and its
largest tensors named: what PyTorch's memory visualizer shows for CUDA, here for ORTModule's graph."""

from __future__ import annotations

from collections.abc import Sequence

from ortlab.account.account import MB, MemoryAccount
from ortlab.account.errors import AccountError


def _label(tensor: dict) -> str:
    """`blocks.1.attn: Softmax_output_0 (0.50 MB)`: the module and the tensor's last name part."""
    name = tensor["name"].rsplit("/", 1)[-1]
    name = name if len(name) <= 32 else "\u2026" + name[-31:]
    where = f"{tensor['module']}: " if tensor.get("module") else ""
    return f"{where}{name} ({(tensor['bytes'] or 0) / MB:.2f} MB)"


def timeline_figure(*accounts: MemoryAccount, labels: Sequence[str] | None = None, top: int = 3,
                    title: str = "live activation memory, step by step"):
    """A matplotlib Figure (no pyplot state): live activation MB per step of each account's execution order,
    the YieldOp as a dotted line, each peak marked with its `top` largest tensors named."""
    from matplotlib.figure import Figure

    if not accounts:
        raise AccountError("timeline_figure needs at least one MemoryAccount")
    if any(not isinstance(a, MemoryAccount) for a in accounts):
        raise AccountError("timeline_figure takes MemoryAccounts (from ortlab.memory(run))")
    labels = list(labels) if labels is not None else [a.run or a.source.rsplit("/", 1)[-1] for a in accounts]
    if len(labels) != len(accounts):
        raise AccountError(f"{len(labels)} labels for {len(accounts)} accounts")
    fig = Figure(figsize=(8, 3.6 + 0.4 * len(accounts)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    # each peak's words go in a band above every curve (the axis is raised to make room), one band per account,
    # an arrow to its peak: never over a curve, never outside the axes
    band = 0.08 * (1 + top)  # of the axis height, per account's label
    highest = max(a.peak_activation_bytes / MB for a in accounts) or 1.0
    ceiling = highest / max(0.2, 1 - band * len(accounts) - 0.04)
    for i, (a, label) in enumerate(zip(accounts, labels, strict=True)):
        live = [v / MB for v in a.steps["live"]]
        peak_mb = a.peak_activation_bytes / MB
        (line,) = ax.plot(range(len(live)), live, linewidth=1.6, label=f"{label}: peak {peak_mb:.2f} MB")
        color = line.get_color()
        if a.yield_index is not None:
            ax.axvline(a.yield_index, color=color, linestyle=":", linewidth=1)
        ax.plot([a.peak_index], [peak_mb], "o", color=color)
        names = "\n".join(_label(t) for t in a.top_tensors[:top])
        left = a.peak_index < 0.5 * max(1, len(live))
        ax.annotate(f"peak ({a.peak_phase})\n{names}", (a.peak_index, peak_mb),
                    xytext=(a.peak_index, ceiling * (1 - 0.02 - band * i)), textcoords="data", fontsize=7,
                    color=color, va="top", ha="left" if left else "right",
                    arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.6, "alpha": 0.6})
    ax.set_xlabel("step of ORT's execution order (dotted: the yield between forward and backward)")
    ax.set_ylabel("live activations (MB)")
    ax.set_title(title)
    ax.set_ylim(0, ceiling)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=min(2, len(accounts)))
    return fig
