"""What stops a model from training on ORTModule: one `Blocker` per cause, with the module and the Python line
that produced it, and the fixes that remove it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ortlab._ort import ORIGINAL_MODULE
from ortlab.common.readable import short_path

# What kind of blocker, in the order ORTModule meets them.
UNSUPPORTED_OP = "unsupported operator"  # the exporter has no ONNX symbolic for an ATen operator at this opset
EXPORT_FAILED = "export failed"  # tracing or exporting failed for another reason
UNSUPPORTED_OUTPUT = "unsupported output"  # forward returns an object ORTModule cannot flatten (a KV cache)
INVALID_TYPE = "invalid type"  # ORT rejects an operator's input type (ONNX type constraints)
NO_KERNEL = "no kernel"  # ORT has no kernel for the operator and types on this device
NO_GRADIENT = "no gradient"  # ORT's gradient builder has no gradient for the operator
NO_GRADIENT_KERNEL = "no gradient kernel"  # the gradient operator exists but has no kernel on this device
ORT_FAILED = "ORT failed"  # the whole model, in ORTModule: a failure the per-operator checks did not foresee
# ORTModule trains, but another model than the user's (ortlab.verdict):
WRONG_GRADIENT = "wrong gradient"  # the first step's gradients differ from PyTorch's (dropout off)
BAKED_INPUT = "baked input"  # an argument the graph bakes in takes other values in later batches
BUFFER_UPDATE = "buffer update"  # forward mutates buffers; ORT's graph does not carry the updates
FROZEN_FLOW = "frozen control flow"  # later batches take Python paths the export did not (ORT's outputs differ)
KINDS = (UNSUPPORTED_OP, EXPORT_FAILED, UNSUPPORTED_OUTPUT, INVALID_TYPE, NO_KERNEL, NO_GRADIENT, NO_GRADIENT_KERNEL,
         ORT_FAILED, WRONG_GRADIENT, BAKED_INPUT, FROZEN_FLOW, BUFFER_UPDATE)

_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_LIBRARY = ("/torch/", "/onnxruntime/", "/ortlab/compat/", "/ortlab/engine/")
_CALL = "/ortlab/workload.py"  # where ortlab calls the model (a torch.nn container's layers have no line of their own)


@dataclass
class Blocker:
    """One reason the model cannot train on ORTModule as it is. `count` nodes share it (same kind, operator,
    types and source line); `node` is the first of them."""

    kind: str
    op: str
    message: str
    stage: str  # where ORTModule meets it: "export", "ORT graph", "gradient graph", "session", "training step"
    node: str | None = None
    module: str | None = None  # the module path, e.g. "transformer.h.0.attn" ("" for the root module); a group's
    # paths, each named ("bn1, layer1.0.bn1 (2 BatchNorm2d modules)"), for a blocker of several modules
    source: str | None = None  # the model's own line: "file.py:772 in find_packed_sequence_indices"
    stack: list[str] = field(default_factory=list)  # the Python frames, innermost first
    dtypes: list[str] = field(default_factory=list)
    count: int = 1
    fixes: list[str] = field(default_factory=list)  # ortlab fixes that removed it, exporting again (compat.advice)
    tried: list[str] = field(default_factory=list)  # fixes that claimed it and left it there: never named again
    remedy: str | None = None  # what a person can do when no fix exists
    cuda: bool | None = None  # whether ORT 1.19.2 has what is missing on CUDA (None: not known)
    modules: list[str] = field(default_factory=list)  # every module holding `op`, where the graph has it in several

    @property
    def key(self) -> tuple:
        return self.kind, self.op, tuple(self.dtypes), self.source

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Blocker:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def line(self) -> str:
        """One line a person reads: what, where in the model, and what to do."""
        modules = "modules" if self.module and ", " in self.module else "module"  # a group: every one named
        where = ", ".join(x for x in (f"{modules} {self.module}" if self.module else None,
                                      f"at {self.source}" if self.source else None) if x)
        types = f" on {', '.join(self.dtypes)}" if self.dtypes else ""
        device = "" if self.cuda is None else "; ORT has it on CUDA" if self.cuda else "; not on CUDA either"
        text = f"{self.kind}: {self.op}{types}" + (f" ({where}{device})" if where else f" ({device[2:]})" if device
                                                   else "")
        if self.count > 1:
            text += f", {self.count} nodes"
        if self.fixes:
            text += f"; fix: {', '.join(self.fixes)}"
        elif self.remedy:
            text += f"; {self.remedy}"
        return text


def frames(doc_string: str) -> list[str]:
    """The exporter's source stack of a node (its doc_string with verbose export), innermost first."""
    return [line.strip() for line in doc_string.splitlines() if _FRAME.match(line.strip())]


def model_line(stack: list[str]) -> str | None:
    """The innermost frame that is the model's code, not torch's or ortlab's: "transformers/masking_utils.py:772
    in find_packed_sequence_indices" (a file inside a package is named from its top package)."""
    for frame in stack:
        m = _FRAME.match(frame)
        if m and m["file"].replace("\\", "/").endswith(_CALL):
            return None  # past ortlab's call of the model: what follows is the caller's code, not the model's
        if m and not any(part in m["file"].replace("\\", "/") for part in _LIBRARY):
            return f"{short_path(m['file'])}:{m['line']} in {m['func']}"
    return None


def module_path(node_name: str) -> str | None:
    """The module path a node name carries ("/_original_module/transformer/h.0/attn/MatMul" -> "transformer.h.0.
    attn"); None for nodes the exporter did not name after a module."""
    if not node_name or not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")[:-1]
    # a called container's children carry its name again ("/stem/stem.2/HardSwish": module stem.2); the root's
    # carry the name of ORTModule's wrapper ("/_original_module/_original_module.1/...": module 1)
    out = []
    for before, part in zip(["", *parts], parts, strict=False):
        out.append(part.removeprefix(f"{before}.") if before else part)
    if out and out[0] == ORIGINAL_MODULE:
        out = out[1:]
    return ".".join(out)


def merge(blockers: list[Blocker]) -> list[Blocker]:
    """One blocker per cause: same kind, op, types and source line become one, with the count of nodes."""
    out: dict[tuple, Blocker] = {}
    for b in blockers:
        if b.key in out:
            out[b.key].count += b.count
        else:
            out[b.key] = b
    return sorted(out.values(), key=lambda b: (KINDS.index(b.kind) if b.kind in KINDS else len(KINDS), b.op))
