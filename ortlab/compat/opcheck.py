"""Every operator of an exported graph tried on ORT alone, so that all blockers show at once, not only the first
that ORTModule would stop at: each distinct node (operator and input types) becomes a one-node model; ORT loads
it (type constraints, a kernel on the CPU) and, when the node lies between a trained input and an output, builds
its gradient graph with ORTModule's own graph builder and loads that (a gradient, and kernels for it)."""

from __future__ import annotations

from typing import Any

from ortlab.compat.blockers import (
    INVALID_TYPE,
    NO_GRADIENT,
    NO_GRADIENT_KERNEL,
    NO_KERNEL,
    Blocker,
    frames,
    model_line,
    module_path,
)
from ortlab.compat.errors import FORWARD_ONLY, read_error
from ortlab.compat.probe import ATEN_DOMAIN, Exported, unconverted

# ORT runs a PythonOp through PyTorch (an autograd.Function, its own backward): nothing of ORT's to try.
_SKIP = {("com.microsoft", "PythonOp"), ("", "Constant")}
_FLOATS = {1, 10, 11, 16}  # onnx FLOAT, FLOAT16, DOUBLE, BFLOAT16


def gradient_path(exported: Exported) -> tuple[set[str], set[str]]:
    """(float values that depend on a trained input, float values an output depends on): a node with an input in
    the first and an output in both needs a gradient. Integer and bool values carry none (shapes, masks); values
    of unknown type count as float."""
    graph = exported.model.graph
    types = exported.types()

    def floating(name: str) -> bool:  # a value nobody typed (after an unconverted operator) may carry a gradient
        return name not in types or types[name].tensor_type.elem_type in _FLOATS

    forward = set(exported.trained)
    for node in graph.node:
        if any(i in forward for i in node.input):
            forward.update(o for o in node.output if floating(o))
    backward = {o.name for o in graph.output if floating(o.name)}
    for node in reversed(graph.node):
        if any(o in backward for o in node.output):
            backward.update(i for i in node.input if floating(i))
    return forward, backward


def check_nodes(exported: Exported) -> tuple[list[Blocker], list[str]]:
    """The blockers ORT has for the graph's operators, one per failing node (merge them with blockers.merge),
    and the operators that could not be judged alone (ORT crashed on, or failed for, their one-node graph: the
    whole-model step judges them)."""
    types = exported.types()
    forward, backward = gradient_path(exported)
    constants = {n.output[0]: n for n in exported.model.graph.node if n.op_type == "Constant" and n.domain == ""}
    trials: dict[tuple, tuple] = {}  # signature -> (one-node model, trained inputs, op type): _try's arguments
    nodes: list[tuple[Any, tuple]] = []
    for node in exported.model.graph.node:
        if (node.domain, node.op_type) in _SKIP or unconverted(node) or _has_subgraph(node):
            continue
        inputs = [i for i in node.input if i]
        if any(i not in types for i in inputs):
            continue  # a type nobody could infer: the whole-model step covers it
        trained = list(dict.fromkeys(i for i in inputs if i in forward and types[i].tensor_type.elem_type in _FLOATS))
        needs_grad = bool(trained) and any(o in backward and o in forward for o in node.output)
        signature = (op_name(node), tuple(types[i].tensor_type.elem_type for i in inputs),
                     tuple(i in trained for i in inputs) if needs_grad else None,
                     tuple(i in constants for i in inputs))
        if signature not in trials:
            outputs = [o for o in node.output if o in backward and o in forward] if needs_grad else None
            model = _one_node(exported.model, node, inputs, types, constants, outputs)
            trials[signature] = (model.SerializeToString(), trained if needs_grad else None, node.op_type)
        nodes.append((node, signature))
    results = dict(zip(trials, _run_isolated(list(trials.values())), strict=True))
    out = []
    for node, signature in nodes:
        failure = results[signature]
        if failure in (None, CRASHED, UNCHECKED):
            continue
        kind, error = failure
        read = read_error(error)
        op = op_name(node) if kind in (INVALID_TYPE, NO_KERNEL, NO_GRADIENT) else (read.op or op_name(node))
        stack = frames(node.doc_string)
        dtypes = [read.dtype] if read.dtype else []
        out.append(Blocker(kind, op, read.line(), _STAGE[kind], node.name, module_path(node.name),
                           model_line(stack), stack, dtypes))
    unchecked = sorted({signature[0] for signature, result in results.items() if result in (CRASHED, UNCHECKED)})
    return out, unchecked


CRASHED = "crashed"  # ORT ended the process trying a one-node graph (it does for some contrib ops' gradients)
UNCHECKED = "unchecked"  # ORT failed on the one-node graph for a reason of that graph, not of the operator


def _run_isolated(trials: list[tuple]) -> list[Any]:
    """`_try` for every trial, in a forked child: a segmentation fault in ORT's graph builder (seen with
    SoftmaxCrossEntropyLossInternal alone) costs that trial, not the check. Without fork: in this process."""
    import json
    import os

    if not hasattr(os, "fork"):
        return [_try(*trial) for trial in trials]
    results: list[Any] = [None] * len(trials)
    pending = list(range(len(trials)))
    while pending:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: try, report each result as a line, never return into the caller's code
            import faulthandler

            faulthandler.disable()  # a crash here is expected and handled by the parent: no report of it
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            with os.fdopen(write_end, "w") as out:
                for i in pending:
                    out.write(json.dumps([i, _try(*trials[i])]) + "\n")
                    out.flush()
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as lines:
            done = dict(json.loads(line) for line in lines if line.strip())
        os.waitpid(pid, 0)
        for i, result in done.items():
            results[int(i)] = tuple(result) if isinstance(result, list) else result
        left = [i for i in pending if i not in done]
        if left:  # the child died on left[0]
            results[left[0]] = CRASHED
            left = left[1:]
        pending = left
    return results


_STAGE = {INVALID_TYPE: "ORT graph", NO_KERNEL: "session", NO_GRADIENT: "gradient graph",
          NO_GRADIENT_KERNEL: "session"}


def op_name(node) -> str:
    """The operator a person knows: ORT's ATen fallback nodes by their ATen operator ("aten::_adaptive_avg_pool2d")."""
    if node.domain == ATEN_DOMAIN:
        if node.op_type != "ATen":
            return f"aten::{node.op_type}"
        operator = next((a.s.decode() for a in node.attribute if a.name == "operator"), "?")
        return f"aten::{operator}"
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _has_subgraph(node) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _one_node(model, node, inputs: list[str], types: dict[str, Any], constants: dict[str, Any],
              outputs: list[str] | None = None):
    """A model of `node` alone: inputs that are constants in the exported graph stay constants (ORT's gradient
    builders read some, e.g. an ignore_index), the others are graph inputs typed and shaped as there; its outputs
    are `outputs` (for a gradient: those that carry one to the model's outputs) or all of the node's."""
    import onnx

    unique = list(dict.fromkeys(inputs))
    graph_inputs = [onnx.ValueInfoProto(name=i, type=types[i]) for i in unique if i not in constants]
    kept = [o for o in (node.output if outputs is None else outputs) if o]
    # each output leaves through an Identity: ORT's loader removes a node whose output is a graph output and
    # that does nothing (a Cast to the same type), which would leave the graph without that output
    exits = [onnx.helper.make_node("Identity", [o], [f"{o}.out"]) for o in kept]
    graph_outputs = [onnx.ValueInfoProto(name=f"{o}.out", type=types[o]) if o in types
                     else onnx.ValueInfoProto(name=f"{o}.out") for o in kept]
    graph = onnx.helper.make_graph([*(constants[i] for i in unique if i in constants), node, *exits], "one_node",
                                   graph_inputs, graph_outputs)
    one = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    return one


def _try(data: bytes, trained: list[str] | None, op: str) -> tuple[str, str] | str | None:
    """None when ORT can run the one-node model (and build and run its gradient, when `trained` names inputs that
    need one); else the blocker kind and ORT's error; UNCHECKED when ORT failed in a way that says more about the
    one-node graph than about the operator (the whole-model step judges it)."""
    from ortlab import _ort

    if trained:
        try:
            data = _ort.gradient_graph(data, trained)
        except _ort.GradientBuildError as e:
            # the builder fails on the node itself (not registered, an output it needs missing, ...), except
            # where it needs the shapes ORT's symbolic shape inference gives the whole graph and a one-node
            # graph lacks (broadcasting gradients), and where a node reads one input twice (x * x: the one-node
            # graph's input then gets two gradient definitions, which the whole graph sums)
            return UNCHECKED if "GetShape" in str(e) or "Duplicate definition" in str(e) else (NO_GRADIENT, str(e))
        except Exception as e:
            return _load_failure(str(e), op, trained)
    try:
        _session(data)
    except Exception as e:
        return _load_failure(str(e), op, trained)
    return None


def _load_failure(text: str, op: str, trained: list[str] | None) -> tuple[str, str] | str:
    if "Type Error" in text:
        return INVALID_TYPE, text
    if FORWARD_ONLY in text:  # the training kernels of GRU and LSTM reject the reverse direction
        return NO_GRADIENT_KERNEL, text
    if "Could not find an implementation" in text:
        named = read_error(text).op
        return (NO_GRADIENT_KERNEL if trained and named not in (None, op) else NO_KERNEL), text
    return UNCHECKED


def _session(data: bytes) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
