"""The time tables drawn: the modules' kernel time, backends side by side (matplotlib, no pyplot state)."""

from __future__ import annotations

from typing import Any


def modules_figure(modules: Any, top: int = 12):
    """Horizontal bars per module (the `top` costliest in any run), one bar per run side by side: ms per step."""
    from matplotlib.figure import Figure

    frame = modules.head(top).fillna(0.0)[::-1]
    fig = Figure(figsize=(8, 0.45 * max(len(frame), 2) + 1.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    runs = list(frame.columns)
    height = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        positions = [k + (i - (len(runs) - 1) / 2) * height for k in range(len(frame))]
        ax.barh(positions, frame[run].to_numpy(), height=height, label=run)
    ax.set_yticks(range(len(frame)), [str(m) for m in frame.index])
    ax.set_xlabel("ms per step (kernels and ops, forward + backward)")
    ax.set_title("where the time goes, by module")
    ax.grid(axis="x", alpha=0.3)
    if runs:
        ax.legend()
    return fig
