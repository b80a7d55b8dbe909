"""matplotlib figures from ortlab's data (runs, comparisons); nothing here touches widgets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def loss_figure(series: Mapping[str, Sequence[float]], title: str = "loss per step"):
    """One line per backend (or run): {label: [loss at step 0, 1, ...]}."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(6, 3), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]  # identical curves (parity mode) stay visible on top of each other
    for i, (label, values) in enumerate(series.items()):
        ax.plot(range(len(values)), list(values), styles[i % len(styles)], marker="." if len(values) < 40 else None,
                label=label, linewidth=1.5 + (len(series) - i - 1))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    return fig


def figure_png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
