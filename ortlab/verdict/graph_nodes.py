"""Below the module for ORTModule: the nodes of its training graph (forward and gradient nodes, in the order ORT
runs them), each node's output judged against the same node replayed in float64 on the inputs ORT gave it, so
that a node is "diverged here" only where its own error exceeds PyTorch fp32's and "inherited" where its inputs
already carried the difference (the table of ortlab.verdict.ops, for a backend that runs whole graphs).

The localized module runs once on ORTModule (`Alone.wrap`, its fixes applied) on the inputs and output gradient
it saw on the first batch; ORT's training graph of it (`Alone.graph`: the graph ORT built, gradient nodes
included) is run again by an ORT session on the CPU with the gradient ORT would receive from PyTorch (the YieldOp
between forward and backward) given as an input and every node's output kept. Each node is then replayed in
torch (ortlab.verdict.onnx_replay) in float64 and in fp32 on those same inputs, and along two chains from the
graph's inputs. A node no replay covers is not judged; ORT's value stands in for it downstream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortlab.errors import OrtlabError
from ortlab.verdict.ops import DIVERGED_HERE, Op, OpTable, input_norm, judge_outputs, status_of

if TYPE_CHECKING:
    from ortlab.engine.backends import Alone

GRADIENT_IN = "gradient at the output"


class GraphNotJudged(OrtlabError, RuntimeError):
    """The graph cannot be run again here (an input ortlab cannot feed, a graph ORT will not load)."""


def inside(data: dict[str, Any], alone: Alone, path: str = "") -> OpTable:
    """The OpTable of ORT's training graph of the module in `data` (a repro case: ortlab.verdict.repro_case)."""
    import torch

    table = OpTable(path, alone.who)
    graph, values, names, yielded = _run(data, alone)
    produced: dict[str, int] = {}
    made = {o for n in graph.node for o in n.output}  # the rest are the graph's inputs and initializers
    chain64: dict[str, Any] = {k: _float(v, torch.float64) for k, v in values.items() if k not in made}
    chain32: dict[str, Any] = {k: _float(v, torch.float32) for k, v in chain64.items()}
    for index, node in enumerate(graph.node):  # the YieldOp taken out: the first `yielded` nodes are the forward
        ins = [values.get(i) if i else None for i in node.input]
        outs = [values.get(o) for o in node.output]
        label = f"{node.domain or 'ai.onnx'}.{node.op_type}"
        producers = [f"#{produced[i]}" if i in produced else names.get(i, i) for i in node.input if i]
        op = Op(index, label, "forward" if index < yielded else "backward", _where(node.name), producers,
                list(outs[0].shape) if outs and outs[0] is not None else [], basis="graph")
        table.ops.append(op)
        try:
            own64, own32 = _replay(node, ins, torch.float64), _replay(node, ins, torch.float32)
            c64 = _replay(node, [chain64.get(i) if i else None for i in node.input], torch.float64)
            c32 = _replay(node, [chain32.get(i) if i else None for i in node.input], torch.float32)
        except Exception as e:  # a node without a replay is not judged; ORT's value goes on in both chains
            from ortlab.compat.errors import root_message

            op.note = f"not replayed in float64: {root_message(e)}"
            own64 = c64 = [_float(v, torch.float64) for v in outs]
            own32 = c32 = [_float(v, torch.float32) for v in outs]
        else:
            scale = input_norm(ins)
            op.own = judge_outputs(outs, own32, own64, scale)
            op.carried = judge_outputs(outs, c32, c64, scale)
            op.status = status_of(op.own, op.carried)
        misshapen = _misshapen(node, values)
        if misshapen and op.status != DIVERGED_HERE:  # a gradient that is not its tensor's shape: every node
            op.status, op.note = DIVERGED_HERE, misshapen  # reading it computes on what it is not
        for name, a, b in zip(node.output, c64, c32, strict=False):
            if name:
                chain64[name], chain32[name], produced[name] = a, b, index
    return table


def _run(data: dict[str, Any], alone: Alone) -> tuple[Any, dict[str, Any], dict[str, str], int]:
    """The module on the backend for one forward and backward; its training graph without the YieldOp, run again
    by an ORT session with every node output kept: (the graph, every tensor by name, a readable name for each
    graph input, how many nodes run before the YieldOp: the forward)."""
    import onnx
    import onnxruntime
    import torch
    from onnx import numpy_helper

    from ortlab._ort import ORIGINAL_MODULE
    from ortlab.verdict.op_record import _tensors, backward, output_gradients, prepared

    prefix = f"{ORIGINAL_MODULE}."  # what ORTModule's export puts before the module's own parameter names
    module, args, kwargs = prepared(data)
    with alone.around(module):
        runner = alone.wrap(module)
        outputs = _tensors(runner(*args, **kwargs))
        backward(output_gradients(outputs, data["grad_outputs"]))
        alone.ran(runner)
        trained, user_inputs = alone.graph(runner)  # type: ignore[misc]  # asked only where it has one
    graph = onnx.ModelProto()
    graph.CopyFrom(trained)
    y = next((n for n in graph.graph.node if n.op_type == "YieldOp"), None)
    yielded = list(graph.graph.node).index(y) if y is not None else len(graph.graph.node)
    feeds: dict[str, Any] = {}
    names: dict[str, str] = {}
    given = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    for i in graph.graph.input:
        if i.name in user_inputs and user_inputs.index(i.name) < len(given):
            feeds[i.name], names[i.name] = given[user_inputs.index(i.name)].detach(), f"input {i.name}"
        elif i.name.removeprefix(prefix) in state:
            feeds[i.name] = state[i.name.removeprefix(prefix)].detach()
            names[i.name] = i.name.removeprefix(prefix)
        else:
            raise GraphNotJudged(f"ORT's graph input {i.name!r} is neither an input nor a parameter of the module")
    if y is not None:
        graph.graph.node.remove(y)
        for k, name in enumerate(y.output):  # the gradient of the k-th forward output, which PyTorch gives ORT
            grad = data["grad_outputs"][k] if k < len(data["grad_outputs"]) else None
            value = grad if grad is not None else torch.zeros_like(outputs[k])
            feeds[name], names[name] = value.detach(), GRADIENT_IN
            graph.graph.input.append(onnx.helper.make_tensor_value_info(name, _onnx_type(value), None))
    kept = {o.name for o in graph.graph.output}
    for node in graph.graph.node:
        for o in node.output:
            if o and o not in kept:
                graph.graph.output.append(onnx.ValueInfoProto(name=o))
                kept.add(o)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL  # the nodes as built
    try:
        session = onnxruntime.InferenceSession(graph.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        results = session.run(None, {k: v.cpu().numpy() for k, v in feeds.items()})
    except Exception as e:
        raise GraphNotJudged(f"ORT cannot run its training graph again here: {e}") from None
    values = {k: v.cpu() for k, v in feeds.items()}
    values.update({i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.graph.initializer})
    values.update({o.name: torch.from_numpy(r) for o, r in zip(session.get_outputs(), results, strict=True)})
    return graph.graph, values, names, yielded


def _misshapen(node: Any, values: dict[str, Any]) -> str | None:
    """Where a node writes the gradient of a tensor (ORT names it "<tensor>_grad") in another shape than the
    tensor's: the gradient of a broadcast that was never reduced, say. None when its outputs are as they should."""
    for name in node.output:
        forward = name[:-len("_grad")] if name.endswith("_grad") else None
        if forward and forward in values and name in values and values[name] is not None and \
                tuple(values[name].shape) != tuple(values[forward].shape):
            return (f"it writes the gradient of {_where(forward)} in shape {list(values[name].shape)}, where that "
                    f"tensor is {list(values[forward].shape)} (a broadcast's gradient not reduced to its input's "
                    "shape): every node that reads it computes on what it is not")
    return None


def _replay(node: Any, inputs: list[Any], dtype: Any) -> list[Any]:
    from ortlab.verdict.onnx_replay import replay

    return replay(node, inputs, dtype)


def _float(value: Any, dtype: Any) -> Any:
    return value.to(dtype) if value is not None and value.is_floating_point() else value


def _onnx_type(t: Any) -> int:
    import torch
    from onnx import TensorProto

    return {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE,
            torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}.get(t.dtype, TensorProto.FLOAT)


def _where(name: str) -> str:
    """A node's name without ORTModule's prefix for the user's module ("/<it>/fc2/Conv_Grad/ConvGrad_0" ->
    "fc2/Conv_Grad/ConvGrad_0")."""
    from ortlab._ort import ORIGINAL_MODULE

    return name.replace(f"/{ORIGINAL_MODULE}", "").lstrip("/")
