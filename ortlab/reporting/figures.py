"""The report's figures, drawn from its plain data and embedded as PNG data URIs (no file beside the page, nothing
fetched): the loss curves, the modules' time, the memory timelines. Small on purpose: 90 dpi, a few tens of kB."""

from __future__ import annotations

import base64
import io
from typing import Any

DPI = 90


def data_uri(fig) -> str:
    """A matplotlib Figure as a PNG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def losses(series: dict[str, list[float | None]]) -> str | None:
    from ortlab.common.plots import loss_figure

    if not series:
        return None
    clean = {k: [float("nan") if v is None else v for v in values] for k, values in series.items()}
    return data_uri(loss_figure(clean, "loss per step"))


def modules(data: dict[str, Any]) -> str | None:
    """The modules' kernel time per run (ortlab.timing.figures.modules_figure), from the section's data."""
    import pandas as pd

    from ortlab.timing.figures import modules_figure

    if not data.get("index"):
        return None
    frame = pd.DataFrame(data["values"], index=data["index"], columns=data["columns"], dtype=float)
    return data_uri(modules_figure(frame))


def timelines(items: list[dict[str, Any]]) -> str | None:
    """Live activation MB along each ORTModule account's execution order, the yield dotted, the peak marked."""
    from matplotlib.figure import Figure

    drawn = [i for i in items if i.get("timeline")]
    if not drawn:
        return None
    fig = Figure(figsize=(8, 3), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for item in drawn:
        t = item["timeline"]
        xs = [k * t["every"] for k in range(len(t["live_mb"]))]
        label = f"{item['run']}: peak {item.get('peak_mb') or 0:.2f} MB"
        (line,) = ax.plot(xs, t["live_mb"], linewidth=1.5, label=label)
        if t.get("yield") is not None:
            ax.axvline(t["yield"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("step of ORT's execution order (dotted: the yield between forward and backward)")
    ax.set_ylabel("live activations (MB)")
    ax.set_title("live activation memory, step by step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return data_uri(fig)
