"""Figure areas that show nothing until they hold a figure (an empty image is a broken-image icon in JupyterLab)."""

from __future__ import annotations

import ipywidgets as W


def figure_area(width: str | None = None, max_width: str | None = "100%") -> W.Image:
    """A PNG image widget, hidden while its value is empty, shown as soon as a figure is set; never wider than its
    panel (`width` is what it takes where there is room)."""
    image = W.Image(format="png", layout=W.Layout(width=width, max_width=max_width, display="none"))

    def toggle(change) -> None:
        image.layout.display = None if change["new"] else "none"

    image.observe(toggle, names="value")
    return image
