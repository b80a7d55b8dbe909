"""What the exporter warns about while ORTModule exports (torch's TracerWarnings), as data: each is a place where
the exported graph froze a Python decision (a branch on a tensor, a tensor read as a number, a loop length) that
the model may take differently on other inputs. Captured as it happens, with the file, line and module."""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

# The start of a TracerWarning's message -> what it means for the graph
KINDS = (
    ("Converting a tensor to a Python boolean", "tensor used as a Python bool",
     "a branch on a tensor's value or shape is baked into the graph: write it with torch.where, or keep the "
     "decision outside the model"),
    ("Converting a tensor to a Python number", "tensor read as a Python number",
     ".item()/float()/int() is baked in as a constant: keep it a tensor"),
    ("Converting a tensor to a Python integer", "tensor read as a Python number",
     "int() of a tensor is baked in as a constant: keep it a tensor"),
    ("Converting a tensor to a Python float", "tensor read as a Python number",
     "float() of a tensor is baked in as a constant: keep it a tensor"),
    ("Converting a tensor to a Python index", "tensor used as a Python index",
     "the index is baked in as a constant: index with a tensor (torch.gather, index_select)"),
    ("Converting a tensor to a NumPy array", "tensor converted to NumPy", "the values are baked in as constants"),
    ("Iterating over a tensor", "iteration over a tensor", "the number of iterations is baked in"),
    ("torch.tensor results are registered as constants", "torch.tensor(...) baked as a constant",
     "values computed in Python are baked in: build the tensor from tensors (torch.stack)"),
    ("ONNX Preprocess - Removing mutation", "in-place update of a buffer dropped by the exporter",
     "ORT's graph will not update this buffer: the fix pytorch-buffers"),
)
# Warnings of other categories that say the graph lost something (the exporter's UserWarnings)
_OTHER = ("ONNX Preprocess - Removing mutation",)
SHOWN = 2  # module paths named as examples in a grouped note or cause


def classify(message: str) -> tuple[str, str]:
    """(kind, advice) of a TracerWarning's message."""
    for start, kind, advice in KINDS:
        if message.startswith(start):
            return kind, advice
    return "traced Python", "the trace may not generalize to other inputs"


def record(message: str, filename: str | None, lineno: int | None, module: str | None, step: int | None,
           module_type: str | None = None, in_torch: bool = False) -> dict[str, Any]:
    """A hazard as data. `filename` None: no frame of the user's code was on the stack (the module names the place);
    `in_torch`: torch's own code warned (a check inside torch.nn, such as F.batch_norm's batch size); such a hazard
    is `harmless`: not the user's to rewrite."""
    from ortlab.common.readable import short_path

    kind, advice = classify(message)
    file = short_path(filename) if filename else None
    place = (f"{file}:{lineno}" if file else "") + (f" (module {module})" if module else "")
    when = f" at step {step}" if step is not None else ""
    return {"kind": kind, "file": file, "line": lineno if file else None, "module": module,
            "module_type": module_type, "in_torch": in_torch, "harmless": harmless({"in_torch": in_torch}),
            "step": step, "message": message.splitlines()[0], "advice": advice,
            "text": f"export hazard at {place.strip() or 'the export'}{when}: {kind}; {advice}"}


def harmless(hazard: dict[str, Any]) -> bool:
    """Whether a hazard is known harmless and not the user's: torch's own code warned (a check inside torch.nn,
    such as F.batch_norm's batch-size check, traced on the batch it checks); never advice to rewrite the user's
    lines (`ortlab check` notes it; the verdict's causes name it only in their note)."""
    return bool(hazard.get("in_torch"))


def in_torch(filename: str | None) -> bool:
    """Whether a warning came from torch.nn's own modules and functions."""
    return filename is not None and bool(_TORCH_NN.search(filename.replace("\\", "/")))


def unique(hazards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One hazard per kind and line (a loop in forward warns once per iteration)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for h in hazards:
        seen.setdefault((h["kind"], h["file"], h["line"], None if h["file"] else h.get("module")), h)
    return list(seen.values())


@contextlib.contextmanager
def captured(model: Any, step: int | None, found: list[dict[str, Any]]) -> Iterator[None]:
    """Record the TracerWarnings of the block into `found` (with the innermost module of `model` whose forward
    was running); every other warning is shown as it would have been."""
    from torch.jit import TracerWarning

    names = {id(m): (n, type(m).__name__) for n, m in model.named_modules()}
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, TracerWarning) or str(message).startswith(_OTHER):
            inside = in_torch(filename)
            if frame_kind(filename) != "user":  # warned inside a library: the user's line called it
                filename, lineno = _caller()
            name, module_type = _module(names)
            found.append(record(str(message), filename, lineno, name, step, module_type, inside))
        else:
            original(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.filterwarnings("always", category=TracerWarning)
        warnings.filterwarnings("always", message=_OTHER[0])
        warnings.showwarning = show
        yield


# Walking out from where torch warned: torch's frames and ortlab's that run inside the model's forward (its fixes,
# its statistics taps) are skipped; ORT's and the rest of ortlab's (the engine, check) are the model's caller, past
# which no line of the model's code is. ortlab's own files are known by its folder (a path such as
# ~/.cache/ortlab/env-*/site-packages/torchvision is a user's library); its demo models are a user's code.
_OWN = str(Path(__file__).resolve().parents[1]) + "/"
_INSIDE = (f"{_OWN}compat/fixes/", f"{_OWN}activations/")
_TORCH_NN = re.compile(r"/torch/nn/")  # torch.nn's own modules and functions (F.batch_norm's batch-size check)


def frame_kind(filename: str) -> str:
    """"skip" (torch, ortlab inside the model), "stop" (ORT, ortlab around the model) or "user"."""
    name = (filename if Path(filename).is_absolute() else str(Path(filename).absolute())).replace("\\", "/")
    if "/torch/" in name or name.startswith(_INSIDE):
        return "skip"
    if "/onnxruntime/" in name or (name.startswith(_OWN) and not name.startswith(f"{_OWN}demo/")):
        return "stop"
    return "user"


def _caller() -> tuple[str | None, int | None]:
    """The innermost frame of the model's code on the stack (the user's line that made torch warn); (None, None)
    when there is none (a warning after the trace: the module then names the place)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        kind = "skip" if frame.f_code.co_filename == warnings.__file__ else frame_kind(frame.f_code.co_filename)
        if kind == "user":
            return frame.f_code.co_filename, frame.f_lineno
        if kind == "stop":
            return None, None
        frame = frame.f_back
    return None, None


def _module(names: dict[int, tuple[str, str]]) -> tuple[str | None, str | None]:
    """The innermost module of the model whose forward is on the stack: its path and class."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in names and frame.f_code.co_name == "forward":
            name, module_type = names[id(owner)]
            return name or "(root)", module_type
        frame = frame.f_back
    return None, None


def harmless_note(hazards: list[dict[str, Any]], when: str = " in this burst") -> str | None:
    """The hazards that are no cause, grouped by kind and module type, in one note (`ortlab check` says the same of
    torch's own checks)."""
    if not hazards:
        return None
    parts = []
    for (kind, module_type), group in grouped(hazards, lambda h: (h["kind"], h.get("module_type") or "")).items():
        places = list(dict.fromkeys(p for h in group if (p := place(h)) is not None))
        modules = list(dict.fromkeys(h.get("module") for h in group if h.get("module")))
        inside = " (torch's own check)" if all(h.get("in_torch") for h in group) else ""
        count = (f" in {len(modules)} {module_type or 'model'} module{'s' if len(modules) > 1 else ''}"
                 if modules else "")
        parts.append(f"{kind}{count}{inside}" + (f" at {examples(places)}" if places else ""))
    return f"export hazards seen, harmless{when}: " + "; ".join(parts)


def grouped(items: list[dict[str, Any]], key: Any) -> dict[Any, list[dict[str, Any]]]:
    """`items` by `key`, in their first order (hazards and causes are grouped alike)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def place(h: dict[str, Any]) -> str | None:
    """Where a hazard is: its line in the user's code, else its module."""
    return f"{h['file']}:{h['line']}" if h.get("file") else (f"module {h['module']}" if h.get("module") else None)


def examples(names: list[str]) -> str:
    """The first few names, as examples."""
    shown = ", ".join(f"`{n}`" for n in names[:SHOWN])
    return ("e.g. " if len(names) > SHOWN else "") + shown
