"""matplotlib figures of an ActivationDiff: a tensor x step heatmap and one tensor over the steps."""

from __future__ import annotations

import numpy as np

from ortlab.activations.errors import ActivationsError


def _matrix(diff, metric: str, max_tensors: int):
    """Rows (phase, name) in execution order, columns steps, values log10 of the metric (score: difference
    over tolerance; 0 is the tolerance)."""
    t = diff.table
    col = "score" if metric == "score" else f"rel_{metric}"
    if col not in t:
        raise ActivationsError(f"metric {metric!r} is not known; known: score, mean, std, min, max, norm, "
                               "samples, zero")
    first_step = t.groupby(["phase", "name"])["seq"].min()
    rows = first_step.sort_values().index.tolist()
    if len(rows) > max_tensors:  # keep the worst tensors (and the first divergence), in execution order
        worst = t.groupby(["phase", "name"])[col].max().sort_values(ascending=False)
        keep = set(worst.index[:max_tensors])
        if diff.first is not None:
            keep.add((diff.first.phase, diff.first.name))
        rows = [r for r in rows if r in keep]
    steps = sorted(t["step"].unique())
    pivot = t.pivot_table(index=["phase", "name"], columns="step", values=col, aggfunc="max")
    m = pivot.reindex(index=rows, columns=steps).to_numpy(float)
    with np.errstate(divide="ignore"):
        values = np.log10(np.where(m > 0, m, np.nan))
    values = np.where(m == 0, -np.inf, values)
    return rows, steps, values


def diff_heatmap(diff, metric: str = "score", max_tensors: int = 80):
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    rows, steps, values = _matrix(diff, metric, max_tensors)
    height = min(2 + 0.16 * len(rows), 30)
    fig = Figure(figsize=(min(4 + 0.25 * len(steps), 14), height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    shown = np.where(np.isneginf(values), -4.0, values)
    masked = np.ma.masked_invalid(shown)
    center = 0.0 if metric == "score" else float(np.log10(getattr(diff.tolerances, metric)))
    norm = TwoSlopeNorm(vcenter=center, vmin=min(center - 4, np.nanmin(shown, initial=center - 1)),
                        vmax=max(center + 2, np.nanmax(shown, initial=center + 1)))
    image = ax.imshow(masked, aspect="auto", interpolation="nearest", cmap="RdYlBu_r", norm=norm)
    label = ("log10(difference / tolerance)" if metric == "score"
             else f"log10(relative difference of {metric})")
    fig.colorbar(image, ax=ax, label=label, shrink=0.8)
    ax.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=7)
    ax.set_yticks(range(len(rows)), [name if phase == "forward" else f"grad {name}" for phase, name in rows],
                  fontsize=6 if len(rows) > 40 else 8)
    ax.set_xlabel("step")
    ax.set_title(f"{diff.a} vs {diff.b}: {metric}" + ("" if diff.first else " (no divergence)"), fontsize=9)
    forward = sum(1 for phase, _ in rows if phase == "forward")
    if 0 < forward < len(rows):
        ax.axhline(forward - 0.5, color="black", linewidth=0.8)
    if diff.first is not None and (diff.first.phase, diff.first.name) in rows:
        y = rows.index((diff.first.phase, diff.first.name))
        x = steps.index(diff.first.step)
        from matplotlib.patches import Rectangle

        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
        ax.annotate("first divergence", (x, y), xytext=(6, -6), textcoords="offset points", fontsize=8)
    return fig


def tensor_over_steps(diff, name: str, phase: str = "forward"):
    from matplotlib.figure import Figure

    t = diff.over_steps(name, phase)
    fig = Figure(figsize=(10, 5), dpi=100, layout="constrained")
    axes = fig.subplots(2, 3)
    for ax, metric in zip(axes.flat, ("mean", "std", "min", "max", "norm"), strict=False):
        ax.plot(t.index, t[f"{metric}_a"], marker=".", label=diff.a)
        ax.plot(t.index, t[f"{metric}_b"], marker="x", linestyle="--", label=diff.b)
        ax.set_title(metric, fontsize=9)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    ax = axes.flat[5]
    score = t["score"].to_numpy(float)
    ax.semilogy(t.index, np.where(score > 0, score, np.nan), marker=".", color="tab:red")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_title("difference / tolerance", fontsize=9)
    ax.grid(alpha=0.3)
    if diff.first is not None and diff.first.name == name and diff.first.phase == phase:
        for a in axes.flat:
            a.axvline(diff.first.step, color="tab:red", alpha=0.4)
    for a in axes[1]:
        a.set_xlabel("step")
    fig.suptitle(f"{'grad ' if phase == 'backward' else ''}{name}", fontsize=10)
    return fig
