"""The tuning's pareto figure (matplotlib, no pyplot state)."""

from __future__ import annotations

from ortlab.common.plots import label_points, pareto_front

GREY = "#aaaaaa"


def pareto_figure(table, best: str | None = None):
    """Median step time against the accounted activation peak, one point per setting: the baseline a star,
    rejected settings grey crosses, the best ringed, the non-dominated agreeing settings joined by a line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ok = table.dropna(subset=["median_step_ms", "activation_mb"])
    rejected = ok["outcome"].isin(["rejected", "failed", "not judged", "stopped"])
    base = ok["candidate"] == "baseline"
    kept = ok[~rejected & ~base]
    ax.scatter(kept["median_step_ms"], kept["activation_mb"], color="tab:blue", label="agrees with PyTorch")
    ax.scatter(ok[rejected]["median_step_ms"], ok[rejected]["activation_mb"], color=GREY, marker="x",
               label="rejected (diverged) or failed")
    ax.scatter(ok[base]["median_step_ms"], ok[base]["activation_mb"], color="black", marker="*", s=160,
               label="baseline (defaults)", zorder=3)
    chosen = ok[ok["candidate"] == best] if best and best != "baseline" else ok.iloc[0:0]
    ax.scatter(chosen["median_step_ms"], chosen["activation_mb"], facecolors="none", edgecolors="tab:red", s=260,
               linewidths=2, label="best", zorder=4)
    names: dict[tuple[float, float], list[tuple[str, bool]]] = {}  # settings at one point share a label
    for name, x, y, grey in zip(ok["candidate"], ok["median_step_ms"], ok["activation_mb"], rejected, strict=True):
        names.setdefault((x, y), []).append((name, grey))
    front = pareto_front(list(zip(ok[~rejected]["median_step_ms"], ok[~rejected]["activation_mb"], strict=True)))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), linestyle="--", alpha=0.5, color="tab:blue", label="pareto front")
    ax.set_xlabel("median step time after warm-up (ms)")
    ax.set_ylabel("activation peak, accounted (MB)")
    ax.set_title("ortlab tune: step time vs activation memory", fontsize=10)
    ax.grid(alpha=0.3)
    ax.margins(0.15)  # room around the outer points for their names
    fig.legend(fontsize=7, loc="outside lower center", ncols=3)
    label_points(ax, list(names), ["\n".join(n for n, _ in group) for group in names.values()],
                 [GREY if all(g for _, g in group) else "black" for group in names.values()])
    return fig
