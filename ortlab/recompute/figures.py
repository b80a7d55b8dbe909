"""Figures of plans and plan sweeps (matplotlib, no pyplot state)."""

from __future__ import annotations

from ortlab.common.plots import pareto_front


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
    ax.set_xlabel("predicted saving (MB)")  # MB = 2**20 bytes, as every figure and table of ortlab
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
    """Accounted activation peak against median step time, one point per plan set; the non-dominated sets on a
    line. The peak is the account's (ORT's execution graph at the burst's shapes), not the process's memory."""
    fig, ax, ok = _labelled_scatter(table, "median_step_ms", "accounted_peak_mb", (6.5, 4))
    front = pareto_front(list(zip(ok["median_step_ms"], ok["accounted_peak_mb"], strict=True)))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), linestyle="--", alpha=0.5, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_xlabel("median step time (ms)")
    ax.set_ylabel("activation peak, accounted (MB)")
    ax.set_title("recompute plan sets: accounted activation peak vs time", fontsize=10)
    fig.supxlabel("peak: the activation buffers alive at one step of ORT's execution graph (parameters, gradients, "
                  "optimizer state\nand the rest of the process not counted; the process's peak is the sweep's "
                  "process_peak_mb)", fontsize=7, color="gray")
    ax.grid(alpha=0.3)
    return fig



def saving_figure(table):
    """ORT's predicted saving against the accounted ones, per plan set: what leaves the stash (kept for
    backward) and what the activation peak falls by (each the no-plan set's minus the set's), joined by a line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ok = table.dropna(subset=["predicted_saving_mb", "stash_saving_mb", "accounted_saving_mb"])
    x, stash, peak = ok["predicted_saving_mb"], ok["stash_saving_mb"], ok["accounted_saving_mb"]
    ax.vlines(x, peak, stash, color="gray", alpha=0.4, linewidth=1)
    ax.scatter(x, stash, marker="o", label="kept for backward (stash), accounted")
    ax.scatter(x, peak, marker="^", label="activation peak, accounted")
    names: dict[tuple[float, float], list[str]] = {}
    for name, px, py in zip(ok["set"], x, stash, strict=True):  # sets at one point share a label
        names.setdefault((round(px, 3), round(py, 3)), []).append(name)
    for (px, py), group in names.items():
        ax.annotate("\n".join(group), (px, py), textcoords="offset points", xytext=(4, 4), fontsize=7)
    hi = max([1.0, *x, *stash, *peak])
    ax.plot([0, hi], [0, hi], linestyle=":", color="gray", label="accounted = predicted")
    ax.set_xlabel("ORT's predicted saving (MB)")
    ax.set_ylabel("accounted saving vs no plan (MB)")
    ax.set_title("recompute: ORT's prediction vs the memory account", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return fig
