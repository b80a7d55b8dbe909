"""ORT's failures as blockers: a failed ORTModule step read (the node from ORT's message or, where it names none,
from the frame that was processing it; its module and source line from the probe export), and the graph patterns
ORT 1.19.2 fails on without naming a node, or crashes the process on, found in the probe export before a step
meets them."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from ortlab.compat.blockers import (
    INVALID_TYPE,
    NO_GRADIENT,
    NO_GRADIENT_KERNEL,
    NO_KERNEL,
    ORT_FAILED,
    UNSUPPORTED_OP,
    UNSUPPORTED_OUTPUT,
    Blocker,
    frames,
    model_line,
    module_path,
)
from ortlab.compat.errors import FORWARD_ONLY, failure_stage, read_error, root_message

NO_BIAS_NORM = "LayerNormalization"
NO_BIAS_MESSAGE = ("ORT 1.19.2's gradient builder names the gradient of a missing (optional) bias '_grad': one such "
                   "node crashes the process, several fail with \"Duplicate definition of name (_grad)\" (LayerNorm "
                   "with bias=False, timm's LayerNorm2dNoBias)")


def known_failures(exported: Any) -> list[Blocker]:
    """Nodes of the probe export that ORT 1.19.2 fails on when it builds the whole model's gradient graph, which
    the per-operator check cannot see: LayerNormalization without a bias, whose weight is trained."""
    trained = set(exported.trained)
    out = []
    for node in exported.model.graph.node:
        if node.op_type == NO_BIAS_NORM and (len(node.input) < 3 or not node.input[2]) and node.input[1] in trained:
            stack = frames(node.doc_string)
            out.append(Blocker(ORT_FAILED, NO_BIAS_NORM, NO_BIAS_MESSAGE, "gradient graph", node.name,
                               module_path(node.name), model_line(stack), stack))
    return out


def step_failure(e: BaseException, exported: Any) -> Blocker:
    """A failed ORTModule step as a blocker: the kind from ORT's message, the node from the message or, where ORT
    names none (a bare assertion in its shape inference), from the frame that was processing it; its module and
    source line from the probe export."""
    from ortlab import _ort

    message = root_message(e)
    read = read_error(message)
    lowered = message.lower()
    kind = (INVALID_TYPE if "type error" in lowered else NO_GRADIENT_KERNEL if FORWARD_ONLY in message
            else NO_KERNEL if "could not find an implementation" in lowered
            else NO_GRADIENT if "gradient" in lowered else UNSUPPORTED_OP if "exporting the operator" in lowered
            else ORT_FAILED)
    name, op = read.node, read.op
    unflattened = re.search(r"Unsupported flatten data type: <class '([\w.]+)'>", message)
    if unflattened:  # an output (the KV cache) ORTModule's schema cannot hold: check's probe export names where
        return Blocker(UNSUPPORTED_OUTPUT, unflattened[1].rpartition(".")[2], message, "ORTModule's first forward",
                       module="")
    if name is None and (processing := _ort.failing_node(e)) is not None:
        name, op = processing[0], op or processing[1]
    node = _node(exported, name)
    stack = frames(node.doc_string) if node is not None else []
    stage = failure_stage(e) or "training step"
    inferring = re.search(r"inferring an? (\w+) node", stage)
    op = op or (node.op_type if node is not None else inferring[1] if inferring else type(e).__name__)
    if message == type(e).__name__:  # a bare assertion: where it was raised
        message = f"{message} in {stage}"
    remedy = _shape_remedy(exported, node) if "shape inference" in stage and node is not None else None
    return Blocker(kind, op, message, stage, name, module_path(name or ""), model_line(stack), stack,
                   [read.dtype] if read.dtype else [], remedy=remedy)


def _shape_remedy(exported: Any, node: Any) -> str:
    """What to do when ORT's symbolic shape inference fails on `node`: where its inputs come from, and the known
    cause when one of them is a Split whose sizes the graph computes (`chunk` of a dimension it does not divide
    evenly, traced with dynamic shapes), whose outputs it cannot type."""
    nodes = {o: n for n in exported.model.graph.node for o in n.output}
    producers = [nodes[i] for i in node.input if i in nodes]
    computed = [p for p in producers if p.op_type == "Split" and len(p.input) > 1 and p.input[1] in nodes
                and nodes[p.input[1]].op_type != "Constant"]
    where = "; ".join(dict.fromkeys(f"{p.op_type} at {model_line(frames(p.doc_string)) or p.name}"
                                    for p in producers))
    if computed:
        return (f"no ortlab fix: ORT's symbolic shape inference cannot type the outputs of a Split whose sizes the "
                f"graph computes ({where}; e.g. Tensor.chunk of a dimension it does not divide evenly): split with "
                "sizes known at export (torch.split(x, [sizes], dim) with Python ints), or keep this module out "
                "of ORTModule")
    return (f"no ortlab fix: ORT's symbolic shape inference failed on this node, whose inputs come from {where}: "
            "write those lines with shapes known at export, or keep this module out of ORTModule")


def _node(exported: Any, name: str | None) -> Any:
    if exported is None or not name:
        return None
    with contextlib.suppress(StopIteration):
        return next(n for n in exported.model.graph.node if n.name == name)
    return None
