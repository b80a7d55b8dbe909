"""The Lab's last results as plain HTML (the loss plot inline as a base64 PNG, the verdict, the facts table), for
wherever no widget front end runs: an exported HTML (`jupyter nbconvert --to html`), GitHub, nbviewer, a notebook
reopened without its kernel. The Lab shows it as an output of its own beside its widget view, updated after every
burst; where the widget view renders, the Lab's stylesheet hides it (STATIC_CLASS), so JupyterLab shows the widgets
alone."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

STATIC_CLASS = "ortlab-static"  # the Lab's stylesheet (ortlab.widgets.layout.STYLE) hides it where the widgets run
NOTE = ("the Lab's last results, as they were when the notebook was saved: "
        "run the notebook for the Lab itself")


def png_img(png: bytes, alt: str, width: str = "600px") -> str:
    """A PNG inline (data URI): an HTML page that carries its figures."""
    data = base64.b64encode(png).decode("ascii")
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}' style='max-width:100%;width:{width}'>"


def loss_png(runs: Sequence) -> bytes | None:
    """The runs' loss curves as one PNG, as the Burst tab draws them (None: no run has a step)."""
    from ortlab.common.plots import figure_png, loss_figure

    curves = {r.backend: list(r.losses) for r in runs if len(r.metrics)}
    return figure_png(loss_figure(curves)) if curves else None


def results_html(header: str, runs: Sequence, status: str = "", loss: bytes | None = None,
                 distances: bytes | None = None) -> str:
    """The last burst's results as one self-contained block: the model (`header`, HTML), the runs by name, `status`
    (HTML: each run's outcome, the verdict, the recommendation), the loss plot (`loss`: PNG, drawn from the runs when
    not given), the verdict's distances (PNG) and the facts table (ortlab.runs.facts, as the CLI prints them)."""
    from ortlab.runs import facts
    from ortlab.widgets.layout import table

    parts = [f"<div class='{STATIC_CLASS}' style='font-family:sans-serif;font-size:13px;line-height:1.4'>", header,
             f"<p style='color:#666;margin:2px 0'><i>{html.escape(NOTE)}</i></p>"]
    if not runs:
        parts.append("<p>no burst yet</p></div>")
        return "".join(parts)
    names = ", ".join(f"{r.backend} ({r.path.name})" for r in runs)
    parts.append(f"<p style='margin:2px 0'><b>last burst</b> {html.escape(names)}</p>")
    if status:
        parts.append(f"<div style='margin:4px 0'>{status}</div>")
    loss = loss if loss is not None else loss_png(runs)
    if loss:
        parts.append(png_img(loss, "loss per step"))
    if distances:
        parts.append(png_img(distances, "gradients against float64", "700px"))
    frame = facts.frame([r.summary() for r in runs], [r.backend for r in runs])
    parts.append("<p style='margin:6px 0 2px'><b>Results</b></p>" + table(frame, index=True))
    parts.append("</div>")
    return "".join(parts)


def bundle(text: str) -> dict[str, str]:
    """The MIME bundle of the static output: HTML, and a line for a plain-text front end."""
    return {"text/html": text, "text/plain": "ortlab Lab: last results (HTML)"}
