"""Save what a panel shows: a small button beside a figure (PNG) or a table (CSV) that writes it into the runs
folder (`<out>/exports/`) and shows the path it wrote, for a report or a slide."""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as W

FOLDER = "exports"


def save(out: str | Path, name: str, data: Any) -> Path:
    """Write `data` (PNG bytes, or a DataFrame as CSV) to `<out>/exports/<stamp>-<name>.<png|csv>`; the path."""
    folder = Path(out).expanduser().resolve() / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if isinstance(data, bytes | bytearray | memoryview):
        path = _free(folder, f"{stamp}-{name}", ".png")
        path.write_bytes(bytes(data))
    else:
        path = _free(folder, f"{stamp}-{name}", ".csv")
        data.to_csv(path, index=False)
    return path


def _free(folder: Path, stem: str, suffix: str) -> Path:
    path, i = folder / f"{stem}{suffix}", 1
    while path.exists():
        path, i = folder / f"{stem}-{i}{suffix}", i + 1
    return path


class SaveButton(W.HBox):
    """`SaveButton("loss curve", lambda: png_bytes_or_dataframe, lambda: out_folder)`: hidden until `what()` has
    something to save; a click writes it and shows where."""

    def __init__(self, name: str, what: Callable[[], Any], out: Callable[[], str | Path], kind: str = "PNG"):
        self.name, self.what, self.out = name, what, out
        self.button = W.Button(description=f"save {kind}", icon="download", tooltip=f"write the {name} into the "
                               f"runs folder ({FOLDER}/)", layout=W.Layout(width="auto"))
        self.said = W.HTML()
        self.button.on_click(lambda _: self.save())
        self.last: Path | None = None
        super().__init__([self.button, self.said], layout=W.Layout(flex_flow="row wrap", align_items="center"))

    def save(self) -> Path | None:
        data = self.what()
        if data is None or (hasattr(data, "__len__") and not len(data)):
            self.said.value = "<span style='color:#666'>nothing to save yet</span>"
            return None
        try:
            self.last = save(self.out(), self.name.replace(" ", "-"), data)
        except OSError as e:  # a folder that cannot be written: said here
            self.said.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return None
        self.said.value = f"<span style='color:#666'>saved <code>{html.escape(shown_path(self.last))}</code></span>"
        return self.last


def shown_path(path: Path) -> str:
    """A path as a person reads it: relative to the working folder when inside it, else absolute."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:
        return str(path)
