"""What the names in an exported graph say: a node's op, its kind (forward, gradient, recompute, yield), the
PyTorch module it came from. ORT's gradient builder, its memory optimizer and the exporter name things
consistently, and the names are all a stage file keeps of where a node came from."""

from __future__ import annotations

import re

from ortlab._ort import ORIGINAL_MODULE

PYTHON_OPS = ("PythonOp", "PythonOpGrad")  # ORT's nodes that call an autograd.Function back in PyTorch
KINDS = ("forward", "gradient", "recompute", "yield")  # what a node of a training graph does
# the autograd Function of ortlab's statistics taps (ortlab.activations.pythonop.Tap): a PythonOp's func_name
TAP_FUNCTION = "ortlab.activations.pythonop.Tap"
PARAM_PREFIX = f"{ORIGINAL_MODULE}."  # ORTModule's flattened module names every parameter input like this
_OP_PART = re.compile(r"^[A-Z][A-Za-z0-9]*(_\d+)?(_Grad)?$")  # `MatMul_3`, `Add_Grad`: an op, not a module
_GRAD_TENSOR = re.compile(r"_grad(_\d+)?$")


def op_key(domain: str, op_type: str) -> str:
    """`domain::op`, with ONNX's default domain spelled out so that com.microsoft ops stay distinct."""
    return f"{domain or 'ai.onnx'}::{op_type}"


def is_tap(op_type: str, func_name: str) -> bool:
    """A PythonOp (or its PythonOpGrad) that is ortlab's statistics tap, not the model's."""
    return op_type in PYTHON_OPS and func_name == TAP_FUNCTION


def is_gradient_tensor(name: str) -> bool:
    return _GRAD_TENSOR.search(name) is not None


def node_kind(name: str, op_type: str, outputs: tuple[str, ...]) -> str:
    """forward, gradient, recompute or yield, from the names that ORT's gradient builder and memory
    optimizer give."""
    if op_type == "YieldOp":
        return "yield"
    if name.endswith("_recompute") or any(o.endswith("_recompute") for o in outputs):
        return "recompute"
    if ("_Grad" in name or name.startswith("AccumulateGrad_") or op_type.endswith("Grad")
            or any(is_gradient_tensor(o) for o in outputs)):
        return "gradient"
    return "forward"


def user_scope(part: str) -> str:
    """A scope of an exported name as the user's model names it: ORTModule's wrapper prefixes the children of the
    module it wraps (`_original_module.0` in a top-level nn.Sequential; `_original_module._original_module.0` where
    a wrapper wraps a wrapper), and the user's module is `0`."""
    while part.startswith(PARAM_PREFIX):
        part = part[len(PARAM_PREFIX):]
    return part


def module_scope(name: str) -> str:
    """The PyTorch module a node came from, from the exporter's name: `/_original_module/blocks/blocks.0/attn/
    MatMul` -> `blocks.0.attn`. Empty for nodes that ORT named itself (fusions such as `BiasGelu_token_1`)."""
    at = name.find("/")
    if at < 0:
        return ""
    parts: list[str] = []
    for part in name[at:].split("/")[1:-1]:
        part = user_scope(part)
        if not part or part == ORIGINAL_MODULE:
            continue
        if _OP_PART.match(part):
            break
        if parts and part.startswith(parts[-1] + "."):  # `blocks/blocks.0`: a container and its child
            parts[-1] = part
        else:
            parts.append(part)
    return ".".join(parts)


def short_name(name: str, width: int = 34) -> str:
    """The last two parts of a node or tensor name, at most `width` characters: a label for a drawing."""
    name = name.removeprefix(PARAM_PREFIX)
    parts = [p for p in name.split("/") if p and p != ORIGINAL_MODULE]
    text = "/".join(parts[-2:]) if parts else name
    return text if len(text) <= width else "\u2026" + text[-(width - 1):]
