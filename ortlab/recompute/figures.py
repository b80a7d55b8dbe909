"""Figures of plans and plan sweeps (matplotlib, no pyplot state)."""

from __future__ import annotations


def what_if_figure(table, top: int | None = 12):
    """Bar chart of a what_if() table: saving per plan at the burst's shapes and at the what-if shapes."""
    from matplotlib.figure import Figure

    rows = table.head(top) if top else table
    fig = Figure(figsize=(7, 0.4 * len(rows) + 1.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    y = range(len(rows))
    labels = [f"{p}: {c.rsplit(':', 1)[0]}" for p, c in zip(rows["plan"], rows["cluster_id"], strict=True)]
    for shift, column, dims in ((0.2, "saving_bytes", "base_dims"), (-0.2, "what_if_bytes", "dims")):
        label = dims_label(table.attrs.get(dims))
        ax.barh([v + shift for v in y], rows[column] / 2**20, height=0.4, label=label)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted saving (MiB)")
    ax.set_title("recompute plans: saving at other shapes")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def dims_label(dims) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((dims or {}).items())) or "burst shapes"


def _labelled_scatter(table, x: str, y: str, size: tuple[float, float]):
    """A figure with one labelled point per plan set that has both values; returns (fig, ax, rows used)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ok = table.dropna(subset=[x, y])
    ax.scatter(ok[x], ok[y])
    for name, px, py in zip(ok["set"], ok[x], ok[y], strict=True):
        ax.annotate(name, (px, py), textcoords="offset points", xytext=(4, 4), fontsize=8)
    return fig, ax, ok


def pareto_figure(table):
    """Peak memory against median step time, one point per plan set; the non-dominated sets on a line."""
    fig, ax, ok = _labelled_scatter(table, "median_step_ms", "peak_mem_mb", (6.5, 4))
    front = _front(list(zip(ok["median_step_ms"], ok["peak_mem_mb"], strict=True)))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), linestyle="--", alpha=0.5, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_xlabel("median step time (ms)")
    ax.set_ylabel("peak memory after step 0 (MB)")
    ax.set_title("recompute plan sets: memory vs time")
    ax.grid(alpha=0.3)
    return fig


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    front, best = [], float("inf")
    for x, y in sorted(points):
        if y < best:
            front.append((x, y))
            best = y
    return front


def saving_figure(table):
    """Predicted saving (ORT's expressions) against measured saving (peak memory vs the no-plan set)."""
    fig, ax, ok = _labelled_scatter(table, "predicted_saving_mb", "measured_saving_mb", (5.5, 4))
    hi = max([1.0, *ok["predicted_saving_mb"], *ok["measured_saving_mb"]])
    ax.plot([0, hi], [0, hi], linestyle=":", color="gray", label="measured = predicted")
    ax.set_xlabel("predicted saving (MB)")
    ax.set_ylabel("measured saving (MB)")
    ax.set_title("recompute: predicted vs measured")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
