"""How the Lab's panels lay out what they show, one way for all: rows of controls that wrap at the panel's width,
tables that fit it (readable headers with their units, one spelling for a missing value, rows of normal height,
bytes in MB), figures no wider than the panel, and the colour of each status (a Stop is grey, not a failure's red).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

import ipywidgets as W

from ortlab.runs.facts import MISSING  # a value that is not there, in every table of the Lab (and ortlab's)
from ortlab.runs.run import ENDED_EARLY, RunStatus

LONG = 40  # characters beyond which a table cell's text wraps in a column of its own width
MB = 2**20  # ortlab's MB (memory.md): what the memory account and the process figures count in
STOPPED = ENDED_EARLY  # a user's Stop (interrupted, stopped)
COLORS = {RunStatus.OK: "#080", RunStatus.FALLBACK: "#d35400", RunStatus.INTERRUPTED: "#666", RunStatus.STOPPED: "#666",
          RunStatus.RUNNING: "#666"}
FAILED = "#c00"
# what a snake_case column's last word says of its unit
_UNITS = {"ms": "ms", "s": "s", "mb": "MB", "pct": "%", "bytes": "MB"}
_WORDS = {"rss": "resident set", "mb": "MB", "ms": "ms", "pct": "%", "ort": "ORT", "id": "id", "expr": "expression"}

# The Lab's stylesheet (scoped to the Lab): rows wrap, a control is never wider than its row, figures and preformatted
# text fit the panel, the tabs wrap onto a second line rather than shrink to unreadable stubs. ipywidgets' HTML
# widgets set a line height of one control row (28 px) for their content, which makes every table row as tall:
# their content gets a text line height. Where the widgets render, the Lab's static results (ortlab.widgets.static,
# for front ends without widgets) are hidden, output and all.
STYLE = """<style>
.ortlab-lab .widget-hbox, .ortlab-lab .jupyter-widget-hbox { flex-wrap: wrap; row-gap: 2px; }
.ortlab-lab .widget-inline-hbox, .ortlab-lab .jupyter-widget-inline-hbox { max-width: 100%; min-width: 0; }
.ortlab-lab img.widget-image, .ortlab-lab img.jupyter-widget-image { max-width: 100%; height: auto; margin: 2px 0; }
.ortlab-lab .widget-html-content pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.ortlab-lab .widget-html-content { line-height: 1.4; min-width: 0; max-width: 100%; }
.ortlab-lab .widget-html-content table { line-height: 1.35; }
.ortlab-lab > .lm-TabBar .lm-TabBar-content { flex-wrap: wrap; }
.ortlab-lab > .lm-TabBar .lm-TabBar-tab { flex: 0 1 auto !important; min-width: fit-content !important; }
.ortlab-lab .widget-toggle-buttons .widget-toggle-button { width: auto; }
.ortlab-lab .widget-checkbox { height: auto; min-height: var(--jp-widgets-inline-height); }
.ortlab-lab .widget-checkbox label > span { white-space: normal; overflow-wrap: anywhere; line-height: 1.3; }
.jp-OutputArea-child:has(.ortlab-static), .output_area:has(.ortlab-static), .ortlab-static { display: none !important; }
</style>"""


def row(*children: W.Widget, **layout: Any) -> W.HBox:
    """Controls side by side, wrapping onto the next line when the panel is narrower than they are."""
    return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap", align_items="center", width="100%",
                                                  **layout))


def flexible(widget: W.Widget, basis: str, most: str | None = None) -> W.Widget:
    """A control that takes `basis` when there is room, up to `most`, and shrinks to its row's width."""
    widget.layout.width, widget.layout.flex, widget.layout.min_width = "auto", f"1 1 {basis}", "0"
    widget.layout.max_width = most or "100%"
    return widget


def checkbox(description: str, value: bool = False, tooltip: str | None = None) -> W.Checkbox:
    """A checkbox as wide as its label (ipywidgets' default is 300 px and an 80 px indent)."""
    return W.Checkbox(value=value, description=description, indent=False, tooltip=tooltip,
                      layout=W.Layout(width="auto", margin="0 16px 0 0"))


def header(name: Any) -> str:
    """A column's name as a person reads it: `median_step_ms` -> "median step (ms)", `saving_bytes` -> "saving
    (MB)"; names with spaces are already readable."""
    text = str(name)
    if " " in text or "_" not in text:
        return text
    words = text.split("_")
    unit = _UNITS.get(words[-1].lower()) if len(words) > 1 else None
    if unit:
        words = words[:-1]
    shown = " ".join(_WORDS.get(w.lower(), w) for w in words)
    return f"{shown} ({unit})" if unit else shown


def cell(value: Any, digits: int = 4) -> str:
    """A value as a table shows it: MISSING for None and NaN, yes/no, numbers to `digits` significant figures
    (whole numbers of 10,000 and more in full, never 1.049e+06), lists joined."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
        return MISSING  # None, NaN and pandas' NA alike
    if isinstance(value, bool):
        return "yes" if value else "no"
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # a numpy scalar
        try:
            return cell(value.item(), digits)
        except (TypeError, ValueError):
            pass
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if value != 0 and (abs(value) >= 10 ** digits or abs(value) < 1e-3):
            return f"{value:.0f}" if abs(value) >= 10 ** digits else f"{value:.{max(1, digits - 2)}e}"
        return f"{value:.{digits}g}"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v, digits) for v in value) or MISSING
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v, digits)}" for k, v in value.items()) or MISSING
    text = str(value)
    return text if text not in ("", "None", "nan", "NaN") else MISSING


def table(df: Any, index: bool = False, digits: int = 4, headers: dict[str, str] | None = None,
          empty: str = "") -> str:
    """A DataFrame as HTML that fits its panel: readable headers with units (`headers` overrides), bytes columns
    (`*_bytes`) in MB, MISSING for what is not there, numbers right-aligned, long text wrapped."""
    if df is None or not len(df):
        return empty
    if index:  # the index as the first columns, an unnamed level headed by nothing
        df = df.copy()
        df.index = df.index.set_names([name if name else " " * (i + 1) for i, name in enumerate(df.index.names)])
    frame = df.reset_index() if index else df
    columns = list(frame.columns)
    heads = [(headers or {}).get(str(c)) or header(c).strip() for c in columns]
    rows = []
    for values in frame.itertuples(index=False, name=None):
        tds = []
        for column, value in zip(columns, values, strict=True):
            if str(column).endswith("_bytes") and isinstance(value, int | float) and not isinstance(value, bool):
                value = value / MB
            number = isinstance(value, int | float) and not isinstance(value, bool)
            text = html.escape(cell(value, digits))
            # numbers whole; words whole; an identifier or a path (one long token) breaks anywhere, but never into a
            # column of one letter; a sentence wraps in a bounded column rather than squeeze the others
            style = "text-align:right;white-space:nowrap" if number else "text-align:left"
            if len(text) > LONG:
                text = f"<div style='max-width:22em;min-width:6em;overflow-wrap:anywhere'>{text}</div>"
            elif len(text) > 10 and " " not in text:
                text = f"<div style='min-width:4.5em;overflow-wrap:anywhere'>{text}</div>"
            tds.append(f"<td style='{style};padding:1px 4px;vertical-align:top'>{text}</td>")
        rows.append(f"<tr>{''.join(tds)}</tr>")
    # a header's words stay whole up to 7 letters ("verdict", "outcome"); longer ones break where the panel is narrow
    ths = "".join(f"<th style='text-align:left;padding:2px 4px;vertical-align:bottom;font-weight:600;"
                  f"overflow-wrap:anywhere;min-width:{0.62 * min(7, max(map(len, h.split()), default=1)):.1f}em'>"
                  f"{html.escape(h)}</th>" for h in heads)
    return ("<div style='max-width:100%;overflow-x:auto'><table style='border-collapse:collapse;font-size:12px;"
            f"line-height:1.35;max-width:100%'><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody>"
            "</table></div>")


def stop_button(tooltip: str) -> W.Button:
    """The Stop button, one look in every panel (Burst, Tune): disabled until something runs."""
    return W.Button(description="Stop", button_style="warning", icon="stop", disabled=True, tooltip=tooltip)


def status_color(status: str | None) -> str:
    """The colour of a run's status: green ok, orange fallback, grey for a user's Stop, red for a failure."""
    return COLORS.get(status or "", FAILED)


def status_word(status: str | None) -> str:
    """A status in words: a user's Stop reads "stopped" (interrupted and stopped alike)."""
    return "stopped" if status in STOPPED else str(status)


def snake(text: str) -> bool:
    """Whether `text` is a snake_case name (what a table header should not be)."""
    return bool(re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", text))
