"""Options panel: every registry option with a control of its type, grouped by feature area."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from ortlab.options import REGISTRY, SPECS, Kind, OptionError, Options, OptionSpec, ReadAt


def _control(spec: OptionSpec) -> W.Widget:
    label = spec.env or f"{spec.name} (DebugOptions)"
    # as wide as the panel allows, up to 620 px; the name takes at most 360 px and half of that (its tooltip and the
    # export lines below say it whole)
    common = {"description": label, "style": {"description_width": "min(360px, 55%)"},
              "layout": W.Layout(width="100%", max_width="620px", min_width="0"),
              "tooltip": f"{spec.description}. {spec.restart_note[0].upper()}{spec.restart_note[1:]}."}
    if spec.kind is Kind.BOOL:  # label on the right, full width (an indented one is cut at 360px)
        common["style"] = {"description_width": "initial"}
        common["layout"] = W.Layout(width="auto", max_width="100%")
        return W.Checkbox(value=bool(spec.default), indent=False, **common)
    if spec.choices:
        return W.Dropdown(options=list(spec.choices), value=spec.default, **common)
    return W.Text(value=str(spec.default), placeholder=spec.allowed(), continuous_update=False, **common)


class OptionsPanel(W.VBox):
    """Edit an ortlab.Options with the right control per option. Invalid input is shown at its control; the
    panel's `options` holds the last valid set. `reference` is the set the last ORTModule burst used, so the
    panel can say what the next burst will cost (nothing, a re-wrap, or a new worker)."""

    def __init__(self, cuda_available: bool | None = None, on_change: Callable[[Options], None] | None = None,
                 start: Options | None = None):
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        self.cuda_available = cuda_available
        self.on_change = on_change
        self.controls: dict[str, W.Widget] = {}
        self.status: dict[str, W.HTML] = {}
        self.errors: dict[str, str] = {}
        self.options = Options()
        self.reference: Options | None = None
        areas: dict[str, list[W.Widget]] = {}
        for spec in REGISTRY:
            control = _control(spec)
            status = W.HTML()
            if spec.needs_cuda and not cuda_available:
                control.disabled = True
                status.value = "<span style='color:#888'>needs CUDA: no GPU here</span>"
            control.observe(self._changed, names="value")
            self.controls[spec.name], self.status[spec.name] = control, status
            areas.setdefault(spec.area, []).append(W.HBox([control, status]))
        self.accordion = W.Accordion(children=[W.VBox(rows) for rows in areas.values()], titles=tuple(areas))
        self.export_lines = W.HTML()
        self.notice = W.HTML()
        self.reset_button = W.Button(description="Reset to defaults", icon="undo")
        self.reset_button.on_click(lambda _: self.reset())
        super().__init__([self.notice, self.accordion, W.HTML("<b>The same in a shell:</b>"), self.export_lines,
                          self.reset_button])
        if start:  # e.g. ORTMODULE_* variables already set in the shell that started Jupyter
            self.set(**start.to_dict())
        self._refresh()

    def reset(self) -> None:
        for spec in REGISTRY:
            typed = spec.kind is Kind.BOOL or spec.choices
            self.controls[spec.name].value = spec.default if typed else str(spec.default)

    def set(self, **values) -> None:
        """Set controls from Python values (what a click or typing would do)."""
        for name, value in values.items():
            spec = SPECS[name]
            self.controls[name].value = value if spec.kind is Kind.BOOL or spec.choices else str(value)

    def _changed(self, _change) -> None:
        self._refresh()
        if self.on_change and not self.errors:
            self.on_change(self.options)

    def _refresh(self) -> None:
        values, self.errors = {}, {}
        for spec in REGISTRY:
            raw = self.controls[spec.name].value
            try:
                typed = spec.parse(raw) if raw != "" or spec.kind in (Kind.PATH, Kind.TEXT) else spec.default
            except OptionError as e:
                self.errors[spec.name] = str(e)
                self.status[spec.name].value = f"<span style='color:#c00'>{html.escape(spec.allowed())} allowed</span>"
                continue
            if typed != spec.default:
                values[spec.name] = typed
                self.status[spec.name].value = (f"<b style='color:#d35400'>changed</b> "
                                                f"(default {html.escape(repr(spec.default))}"
                                                f"; {spec.read_at.value})")
            elif not (spec.needs_cuda and not self.cuda_available):
                self.status[spec.name].value = ""
        self.options = Options(values)
        lines = self.options.export_lines()
        self.export_lines.value = f"<pre>{html.escape(lines) if lines else '# all defaults'}</pre>"
        self.notice.value = self._notice()

    def _notice(self) -> str:
        if self.errors:
            names = ", ".join(sorted(self.errors))
            return f"<span style='color:#c00'>invalid: {html.escape(names)} (left at the default until fixed)</span>"
        if self.reference is None:
            return "The next ORTModule burst exports the model (first export)."
        diff = self.reference.diff(self.options)
        if not diff:
            return "Same options as the last ORTModule burst: it reuses the ORTModule (no re-export)."
        imports = [k for k in diff if SPECS[k].read_at is ReadAt.IMPORT]
        if imports:
            return (f"<b>Next burst starts a new worker</b>: {', '.join(imports)} "
                    "read only when onnxruntime is imported.")
        return f"<b>Next burst re-wraps and re-exports</b>: changed {', '.join(diff)}."

    def __repr__(self) -> str:
        return f"OptionsPanel({len(REGISTRY)} options, changed={sorted(self.options)}, invalid={sorted(self.errors)})"
