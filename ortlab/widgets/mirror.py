"""The Lab in any front end that runs anywidget (marimo, and JupyterLab, Notebook 7, VS Code, Colab): one anywidget
that mirrors a tree of ipywidgets as JSON and draws it with a small JavaScript renderer shipped in the package
(mirror.js: no CDN, no build step). Nothing is written twice: a click or a changed value in the browser is routed
back to the real widget (`button.click()`, `widget.value = ...`), and every change of a real widget's traits is
pushed to the browser as that widget's node, so every panel works as it does in JupyterLab.

The state (`root`, `nodes`: model id -> node) is kept current in place, so that a view opened later starts from what
the widgets show now; changes travel as custom messages of the changed nodes alone (a burst's progress does not
resend the Lab's few hundred widgets)."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as W
import traitlets

ESM = Path(__file__).with_name("mirror.js")

# Each kind the renderer draws: the ipywidgets classes it stands for (the first that matches, in this order), and
# the traits a node carries beside the ones every widget has (description, disabled, tooltip, layout, classes).
KINDS: tuple[tuple[str, tuple[type, ...], tuple[str, ...]], ...] = (
    ("tab", (W.Tab,), ("titles", "selected_index")),
    ("accordion", (W.Accordion,), ("titles", "selected_index")),
    ("vbox", (W.VBox,), ()),
    ("hbox", (W.HBox,), ()),
    ("box", (W.Box,), ()),
    ("html", (W.HTML, W.HTMLMath), ("value",)),
    ("label", (W.Label,), ("value",)),
    ("button", (W.Button,), ("button_style", "icon")),
    ("toggles", (W.ToggleButtons,), ("index", "button_style")),
    ("select", (W.Select, W.SelectMultiple), ("index", "rows")),
    ("dropdown", (W.Dropdown, W.RadioButtons), ("index",)),
    ("checkbox", (W.Checkbox, W.ToggleButton), ("value",)),
    ("logslider", (W.FloatLogSlider,), ("value", "min", "max", "step", "base")),
    ("slider", (W.IntSlider, W.FloatSlider), ("value", "min", "max", "step")),
    ("progress", (W.IntProgress, W.FloatProgress), ("value", "min", "max", "bar_style")),
    ("number", (W.IntText, W.BoundedIntText, W.FloatText, W.BoundedFloatText), ("value",)),
    ("text", (W.Text, W.Textarea, W.Password), ("value", "placeholder")),
    ("image", (W.Image,), ("value", "format")),
)
COMMON = ("description", "disabled", "tooltip")
SHOWN_PRIVATE = ("_dom_classes", "_options_labels")  # the private traits a node shows (classes, a choice's labels)
LAYOUT = ("display", "width", "max_width", "min_width", "flex", "flex_flow", "align_items", "margin")


def kind_of(widget: W.Widget) -> tuple[str, tuple[str, ...]]:
    """The renderer's kind of a widget and the traits its node carries ("unknown": drawn as its name)."""
    for kind, classes, traits in KINDS:
        if isinstance(widget, classes):
            return kind, traits
    return "unknown", ()


def _plain(name: str, value: Any) -> Any:
    if name == "value" and isinstance(value, bytes | memoryview):  # an Image's PNG
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, tuple):
        return list(value)
    return value


def node_of(widget: W.Widget) -> dict[str, Any]:
    """One widget as the renderer draws it: its kind, traits, labels (a selection's options), layout, classes and
    children (by model id)."""
    kind, traits = kind_of(widget)
    node: dict[str, Any] = {"id": widget.model_id, "kind": kind}
    for name in (*COMMON, *traits):
        if widget.has_trait(name):
            node[name] = _plain(name, getattr(widget, name))
    if kind in ("toggles", "select", "dropdown"):
        node["labels"] = list(widget._options_labels)
    if kind == "number":
        node["integer"] = isinstance(widget, W.IntText | W.BoundedIntText)
    if kind == "unknown":
        node["name"] = type(widget).__name__
    layout = getattr(widget, "layout", None)
    if layout is not None:
        node["layout"] = {k: v for k in LAYOUT if (v := getattr(layout, k, None))}
    node["classes"] = list(getattr(widget, "_dom_classes", ()))
    if isinstance(widget, W.Box):
        node["children"] = [c.model_id for c in widget.children]
    return node


class Mirror(anywidget.AnyWidget):
    """`Mirror(widget)`: the widget tree under `widget` as one anywidget. `nodes` and `root` are its state; `handle`
    what the browser asks (a click, a value, a tab); every change of a mirrored widget is sent as its node."""

    _esm = ESM
    root = traitlets.Unicode("").tag(sync=True)
    nodes = traitlets.Dict().tag(sync=True)

    def __init__(self, widget: W.Widget, **kwargs: Any):
        super().__init__(**kwargs)
        self.target = widget
        self._watched: dict[str, W.Widget] = {}
        self._lock = threading.RLock()
        nodes: dict[str, Any] = {}
        self._walk(widget, nodes)
        self.nodes = nodes
        self.root = widget.model_id
        self.on_msg(self._on_msg)

    def _walk(self, widget: W.Widget, nodes: dict[str, Any]) -> None:
        """Every widget under `widget` as a node in `nodes`, each watched from then on (once)."""
        nodes[widget.model_id] = node_of(widget)
        if widget.model_id not in self._watched:
            self._watched[widget.model_id] = widget
            widget.observe(lambda change, w=widget: self._changed(w, change))
            layout = getattr(widget, "layout", None)
            if layout is not None:
                layout.observe(lambda change, w=widget: self._changed(w, change), names=list(LAYOUT))
        for child in getattr(widget, "children", ()) if isinstance(widget, W.Box) else ():
            self._walk(child, nodes)

    def _changed(self, widget: W.Widget, change: dict) -> None:
        """A trait of a mirrored widget changed: its node (and new children's) updated in place and sent."""
        name = change.get("name", "")
        if name in ("comm", "keys", "log") or (name.startswith("_") and name not in SHOWN_PRIVATE):
            return
        if self.comm is None or getattr(widget, "comm", None) is None or "nodes" not in self._trait_values:
            return  # closed (the mirror or the widget), or still being built
        with self._lock:
            changed: dict[str, Any] = {}
            if name == "children":  # new widgets under it are watched from now on
                self._walk(widget, changed)
            else:
                changed[widget.model_id] = node_of(widget)
            self.nodes.update(changed)  # in place: a view opened later starts from here
            self.send({"type": "nodes", "nodes": changed})  # in the order the changes were made

    def _on_msg(self, _widget: Any, content: dict, _buffers: Any = None) -> None:
        self.handle(content)

    def handle(self, event: dict) -> None:
        """What the browser asks, done on the real widget: {"event": "click" | "value" | "index" | "selected",
        "id": model id, "value": ...}. A value the widget refuses is answered with the widget's own node."""
        widget = self._watched.get(str(event.get("id")))
        if widget is None:
            return
        what, value = event.get("event"), event.get("value")
        try:
            if what == "click" and isinstance(widget, W.Button):
                widget.click()
            elif what == "index":
                widget.index = None if value is None else int(value)
            elif what == "selected":
                widget.selected_index = None if value is None else int(value)
            elif what == "value":
                if isinstance(widget, W.IntText | W.BoundedIntText | W.IntSlider):
                    value = int(float(value))
                elif isinstance(widget, W.FloatText | W.BoundedFloatText | W.FloatSlider | W.FloatLogSlider):
                    value = float(value)
                elif isinstance(widget, W.Checkbox | W.ToggleButton):
                    value = bool(value)
                widget.value = value
        except (traitlets.TraitError, ValueError, TypeError):
            pass
        with self._lock:  # the widget's node as it is now (a bounded value clamped, a refused one restored)
            node = self.nodes[widget.model_id] = node_of(widget)
            self.send({"type": "nodes", "nodes": {widget.model_id: node}})
