"""The verdict as a picture a user can check: per parameter, each backend's distance to float64 PyTorch (the first
step's gradients), the line up to which the other backend is allowed to be off, and the flagged ones marked."""

from __future__ import annotations

from typing import Any


def distances_figure(verdict: Any, who: str = "ORTModule"):
    """A matplotlib Figure from a Verdict (or its dict): parameters in model order on x, distance to float64 on a log
    y axis: PyTorch fp32 (grey), the other backend (blue; red and named where it diverged), what was allowed
    (FACTOR x PyTorch's + the floors). None when the gradients were not judged against float64."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    data = verdict.to_dict() if hasattr(verdict, "to_dict") else verdict
    grads = data.get("gradients") or {}
    rows = grads.get("distances")
    if not rows:
        return None
    tiny = min([v for r in rows for v in (r["to_float64"], r["pytorch_to_float64"]) if v and v > 0] or [1e-12]) / 10
    x = range(len(rows))
    fig = Figure(figsize=(8, 3.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    spread = grads.get("members") and any(r.get("spread") is not None for r in rows)
    ax.plot(x, [max(r["allowed"], tiny) for r in rows], "-", color="#bbb", linewidth=1,
            label=f"allowed ({grads.get('factor', 3):g}x {'fp32' if spread else 'PyTorch'}'s + floors)")
    ax.scatter(x, [max(r["pytorch_to_float64"], tiny) for r in rows], s=10, color="#777", label="PyTorch fp32")
    if spread:  # the ensemble's largest distance (ortlab.verdict.ensemble)
        ax.scatter(x, [max(r.get("spread") or 0.0, tiny) for r in rows], s=10, color="#777", marker="_",
                   label=f"fp32 runs, largest ({len(grads['members'])} more)")
    ok = [(i, r) for i, r in enumerate(rows) if not r["diverged"]]
    bad = [(i, r) for i, r in enumerate(rows) if r["diverged"]]
    ax.scatter([i for i, _ in ok], [max(r["to_float64"], tiny) for _, r in ok], s=10, color="#1f77b4", label=who)
    if bad:
        ax.scatter([i for i, _ in bad], [max(r["to_float64"], tiny) for _, r in bad], s=28, color="#c00",
                   marker="x", label=f"{who}: diverged ({len(bad)})")
        for i, r in bad[:5]:
            ax.annotate(r["parameter"], (i, max(r["to_float64"], tiny)), fontsize=7, color="#c00",
                        xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("parameter (model order)")
    ax.set_ylabel("|gradient - float64|")
    ax.set_title("first-step gradients: each backend's distance to float64 PyTorch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
