"""The model exported the way ORTModule exports it, kept for diagnosis: the same exporter settings and symbolics,
but operators the exporter cannot convert stay in the graph (as `org.pytorch.aten` nodes) instead of ending the
export at the first, and every node keeps the Python stack that produced it (its doc_string)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab._ort import ORIGINAL_MODULE  # the user's module's name: node names come out as ORT's own

ATEN_DOMAIN = "org.pytorch.aten"  # unconverted ATen operators (and ORT's ATen fallback op, type "ATen")


@dataclass
class Exported:
    """The probe export: the ONNX model, which graph inputs train, and the warnings the exporter gave."""

    model: Any  # onnx.ModelProto
    trained: list[str]  # graph inputs that require gradients (parameters, and input tensors that require grad)
    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    unflattened: list[tuple[str, type]] = field(default_factory=list)  # outputs ORTModule cannot flatten: (where, type)
    _types: dict[str, Any] | None = field(default=None, repr=False)

    def types(self) -> dict[str, Any]:
        """Every value's onnx TypeProto (inputs, outputs, intermediates): what the exporter recorded, completed by
        ONNX's shape inference (the exporter leaves many intermediates untyped)."""
        import onnx

        if self._types is None:
            g = onnx.shape_inference.infer_shapes(self.model, strict_mode=False, data_prop=True).graph
            self._types = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)
                           if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
        return self._types

    def unconverted(self) -> Iterator[Any]:
        """The nodes of ATen operators the exporter has no symbolic for."""
        return (n for n in self.model.graph.node if unconverted(n))


def unconverted(node: Any) -> bool:
    """An ATen operator the exporter left as it is (ORT's own ATen fallback nodes have type "ATen")."""
    return node.domain == ATEN_DOMAIN and node.op_type != "ATen"


class _Flat:
    """The user's inputs as a flat tuple of tensors (what ORTModule exports with), and back."""

    def __init__(self, inputs: Any):
        import torch.utils._pytree as pytree

        if not isinstance(inputs, tuple | list | dict):
            inputs = (inputs,)
        self.leaves, self.spec = pytree.tree_flatten(inputs)
        self.is_tensor = [_is_tensor(v) for v in self.leaves]
        self.tensors = tuple(v for v, t in zip(self.leaves, self.is_tensor, strict=True) if t)

    def rebuild(self, tensors: tuple) -> Any:
        import torch.utils._pytree as pytree

        it = iter(tensors)
        return pytree.tree_unflatten([next(it) if t else v for v, t in zip(self.leaves, self.is_tensor, strict=True)],
                                     self.spec)


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def output_tensors(value: Any) -> list[Any]:
    """The tensors in a model's output (tensors, tuples, lists, dicts, Hugging Face ModelOutputs, dataclasses)."""
    import dataclasses
    from collections.abc import Mapping

    if _is_tensor(value):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in output_tensors(v)]
    if isinstance(value, tuple | list):
        return [t for v in value for t in output_tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in output_tensors(getattr(value, f.name))]
    return []


def unflattenable(value: Any, where: str = "output") -> list[tuple[str, type]]:
    """The objects in a model's output that ORTModule cannot flatten (its schema takes tensors, None, numbers,
    strings, sequences and mappings only: "Unsupported flatten data type"), as (where, type): a Hugging Face
    decoder's KV cache at "output.past_key_values"."""
    from collections.abc import Mapping, Sequence

    if value is None or isinstance(value, str | int | float | bool) or _is_tensor(value):
        return []
    if isinstance(value, Mapping):
        return [x for k, v in value.items() for x in unflattenable(v, f"{where}.{k}")]
    if isinstance(value, Sequence):
        return [x for i, v in enumerate(value) for x in unflattenable(v, f"{where}[{i}]")]
    return [(where, type(value))]


def export(model: Any, inputs: Any, opset: int = 17, log: Path | None = None) -> Exported:
    """Export `model` on `inputs` as ORTModule would (training mode, parameters as graph inputs, every input
    dimension dynamic), leaving unconvertible operators in the graph. Raises what the exporter raises when the
    export fails for another reason (a tracing error)."""
    import onnx
    import torch

    from ortlab import _ort
    from ortlab.common.capture import captured_output
    from ortlab.workload import call_model

    _ort.register_export_symbolics(opset)
    flat = _Flat(inputs)
    unflattened: list[tuple[str, type]] = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            setattr(self, ORIGINAL_MODULE, model)

        def forward(self, *tensors):
            outputs = call_model(getattr(self, ORIGINAL_MODULE), flat.rebuild(tensors))
            unflattened[:] = unflattenable(outputs)
            return tuple(output_tensors(outputs))

    names = [f"input{i}" for i in range(len(flat.tensors))]
    dynamic = {n: {d: f"{n}_dim{d}" for d in range(t.dim())} for n, t in zip(names, flat.tensors, strict=True)}
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught, \
            captured_output(log or Path("/dev/null")):  # verbose export prints the whole graph
        warnings.simplefilter("always")
        torch.onnx.export(
            Probe(), flat.tensors, buffer, input_names=names, opset_version=opset, do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING, verbose=True, export_params=False,
            keep_initializers_as_inputs=True, dynamic_axes=dynamic, autograd_inlining=False,
            operator_export_type=torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH)
    proto = onnx.load_model_from_string(buffer.getvalue())
    trained = [f"{ORIGINAL_MODULE}.{n}" for n, p in model.named_parameters() if p.requires_grad]
    trained += [n for n, t in zip(names, flat.tensors, strict=True) if t.requires_grad and t.is_floating_point()]
    graph_inputs = {i.name for i in proto.graph.input}
    return Exported(proto, [n for n in trained if n in graph_inputs], list(caught), unflattened)
