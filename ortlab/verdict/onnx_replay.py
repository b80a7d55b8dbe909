"""ONNX nodes replayed in torch, in any dtype: what an ORT graph node computes, computed again in float64 (and in
PyTorch fp32) on the inputs ORT gave it, so that each node of ORTModule's training graph can be judged against
float64 (ortlab.verdict.graph_nodes).

The table covers what ORTModule's exports of common layers hold: element-wise ops, Conv, MatMul/Gemm, reductions,
shape ops, the gradient ops ORT's graph builder writes (com.microsoft ConvGrad, ReluGrad, SigmoidGrad, TanhGrad,
...) and ORT's ATen nodes (the aten op itself). A node whose op is not here is not judged (`NotReplayed`), and its
ORT value stands in for it downstream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ortlab.errors import OrtlabError

OUTPUTS = "__outputs"  # how many outputs the node has (an attribute the replays read, not ONNX's)


class NotReplayed(OrtlabError, NotImplementedError):
    """No torch replay of this ONNX op (or of this use of it)."""


def replay(node: Any, inputs: list[Any], dtype: Any) -> list[Any]:
    """The outputs of `node` (an onnx NodeProto) on `inputs` (torch tensors or None), floating inputs cast to
    `dtype` (torch.float64 or torch.float32)."""
    import torch

    key = (node.domain or "ai.onnx", node.op_type)
    if key not in _OPS:
        raise NotReplayed(f"no float64 replay of {key[0]}.{key[1]}")
    cast = [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    out = _OPS[key]({**_attributes(node), OUTPUTS: len(node.output)}, cast, dtype)
    return list(out) if isinstance(out, tuple | list) else [out]


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(t: Any) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _conv_args(a: dict[str, Any], spatial: int) -> dict[str, Any]:
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotReplayed("Conv with auto_pad")
    pads = list(a.get("pads", [0] * 2 * spatial))
    if pads[:spatial] != pads[spatial:]:
        raise NotReplayed("Conv with asymmetric pads")
    return {"stride": list(a.get("strides", [1] * spatial)), "padding": pads[:spatial],
            "dilation": list(a.get("dilations", [1] * spatial)), "groups": int(a.get("group", 1))}


def _conv(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    import torch

    args = _conv_args(a, x[1].dim() - 2)
    return torch.ops.aten.convolution(x[0], x[1], x[2] if len(x) > 2 else None, args["stride"], args["padding"],
                                      args["dilation"], False, [0] * (x[1].dim() - 2), args["groups"])


def _conv_grad(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft ConvGrad(dY, X, W) -> dX, dW, dB."""
    import torch

    dy, inp, w = x[:3]
    args = _conv_args(a, w.dim() - 2)
    return torch.ops.aten.convolution_backward(dy, inp, w, [w.shape[0]], args["stride"], args["padding"],
                                               args["dilation"], False, [0] * (w.dim() - 2), args["groups"],
                                               [True, True, True])


def _reduce(fn: str) -> Callable[[dict[str, Any], list[Any], Any], Any]:
    def run(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
        axes = a.get("axes")
        if axes is None and len(x) > 1 and x[1] is not None:
            axes = _ints(x[1])
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return x[0]
            axes = list(range(x[0].dim()))
        return getattr(x[0], fn)(dim=list(axes), keepdim=keep)
    return run


def _gemm(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    first = x[0].t() if a.get("transA", 0) else x[0]
    second = x[1].t() if a.get("transB", 0) else x[1]
    out = a.get("alpha", 1.0) * (first @ second)
    return out + a.get("beta", 1.0) * x[2] if len(x) > 2 and x[2] is not None else out


def _reshape(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    shape = _ints(x[1])
    shape = [x[0].shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return x[0].reshape(shape)


def _unsqueeze(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    axes = list(a["axes"]) if "axes" in a else _ints(x[1])
    out = x[0]
    for axis in sorted(ax % (out.dim() + len(axes)) for ax in axes):
        out = out.unsqueeze(axis)
    return out


def _squeeze(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    axes = list(a["axes"]) if "axes" in a else (_ints(x[1]) if len(x) > 1 and x[1] is not None else None)
    return x[0].squeeze() if axes is None else x[0].squeeze(tuple(axes))


def _cast(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    import torch
    from onnx import TensorProto

    floating = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
    if a["to"] in floating:
        return x[0].to(dtype)
    table = {TensorProto.INT64: torch.int64, TensorProto.INT32: torch.int32, TensorProto.BOOL: torch.bool}
    if a["to"] not in table:
        raise NotReplayed(f"Cast to ONNX type {a['to']}")
    return x[0].to(table[a["to"]])


def _aten(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """ORT's ATen node: the aten op itself, its int64 inputs as the ints or int lists aten takes."""
    import torch

    name = a["operator"].decode() if isinstance(a["operator"], bytes) else a["operator"]
    overload = a.get("overload_name", b"")
    overload = (overload.decode() if isinstance(overload, bytes) else overload) or "default"
    try:
        op = getattr(getattr(torch.ops.aten, name), overload)
    except AttributeError:
        raise NotReplayed(f"aten::{name}.{overload}") from None
    args = []
    for t in x:
        if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool:
            args.append(int(t) if t.dim() == 0 else _ints(t))
        else:
            args.append(t)
    return op(*args)


def _quick_gelu_grad(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft QuickGeluGrad(dY, X): dY * d/dX [X * sigmoid(alpha X)]."""
    alpha = float(a.get("alpha", 1.702))
    s = (alpha * x[1]).sigmoid()
    return x[0] * (s + alpha * x[1] * s * (1 - s))


def _gelu_grad(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft GeluGrad(dY, X): dY * (Phi(X) + X phi(X)), the erf form."""
    import math

    cdf = 0.5 * (1 + (x[1] / math.sqrt(2)).erf())
    pdf = (-0.5 * x[1] * x[1]).exp() / math.sqrt(2 * math.pi)
    return x[0] * (cdf + x[1] * pdf)


def _layer_norm(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """LayerNormalization(X, scale, B) -> Y, Mean, InvStdDev (reduced from `axis` on, kept as 1s)."""
    axis = int(a.get("axis", -1)) % x[0].dim()
    dims = tuple(range(axis, x[0].dim()))
    mean = x[0].mean(dim=dims, keepdim=True)
    inv = ((x[0] - mean).pow(2).mean(dim=dims, keepdim=True) + float(a.get("epsilon", 1e-5))).rsqrt()
    y = (x[0] - mean) * inv * x[1]
    return (y + x[2] if len(x) > 2 and x[2] is not None else y), mean, inv


def _softmax_grad(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft SoftmaxGrad_13(dY, Y): Y * (dY - sum(dY * Y) over `axis`)."""
    axis = int(a.get("axis", -1))
    return x[1] * (x[0] - (x[0] * x[1]).sum(dim=axis, keepdim=True))


def _vjp(fn: Callable[..., Any], dy: Any, *xs: Any) -> tuple[Any, ...]:
    """The gradients of fn(*xs) against `dy`, by autograd (a gradient op replayed from its forward)."""
    import torch

    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) for x in xs]
        return torch.autograd.grad(fn(*leaves), leaves, dy)


def _gelu(p: Any) -> Any:
    from torch.nn import functional

    return functional.gelu(p)


def _fast_gelu(p: Any) -> Any:
    import math

    return 0.5 * p * (1 + (math.sqrt(2 / math.pi) * (p + 0.044715 * p ** 3)).tanh())


def _layer_norm_grad(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft LayerNormalizationGrad(dY, X, scale, mean, inv_std) -> dX, dscale, dbias: the forward's
    gradients by autograd (its statistics recomputed from X, as they were made)."""
    import torch

    dy, inp, scale = x[:3]
    bias = torch.zeros_like(scale)
    a = {k: v for k, v in a.items() if k != OUTPUTS}
    return _vjp(lambda i, s, b: _layer_norm(a, [i, s, b], dtype)[0], dy, inp, scale, bias)[:3]


def _slice(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    starts, ends = _ints(x[1]), _ints(x[2])
    axes = _ints(x[3]) if len(x) > 3 and x[3] is not None else list(range(len(starts)))
    steps = _ints(x[4]) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    index = [slice(None)] * x[0].dim()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step < 0:
            raise NotReplayed("Slice with a negative step")
        index[axis] = slice(start, min(end, x[0].shape[axis]), step)
    return x[0][tuple(index)]


def _split(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    axis = int(a.get("axis", 0))
    sizes = _ints(x[1]) if len(x) > 1 and x[1] is not None else list(a.get("split", []))
    if not sizes:
        count = a[OUTPUTS]
        sizes = [-(-x[0].shape[axis] // count)] * count
        sizes[-1] = x[0].shape[axis] - sum(sizes[:-1])
    return x[0].split(sizes, dim=axis)


def _gather(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    axis = int(a.get("axis", 0)) % x[0].dim()
    index = x[1] % x[0].shape[axis]
    flat = x[0].index_select(axis, index.reshape(-1))
    return flat.reshape((*x[0].shape[:axis], *index.shape, *x[0].shape[axis + 1:]))


def _shape(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    import torch

    dims = list(x[0].shape)[int(a.get("start", 0)):a.get("end")]
    return torch.tensor(dims, dtype=torch.int64)


def _concat_training(a: dict[str, Any], x: list[Any], dtype: Any) -> Any:
    """com.microsoft ConcatTraining -> the concatenation and each input's length along the axis."""
    import torch

    parts, axis = [t for t in x if t is not None], int(a["axis"])
    return torch.cat(parts, dim=axis), torch.tensor([t.shape[axis] for t in parts], dtype=torch.int64)


def _elementwise(fn: Callable[..., Any]) -> Callable[[dict[str, Any], list[Any], Any], Any]:
    return lambda a, x, dtype: fn(*x)


def _torch(name: str) -> Callable[..., Any]:
    import torch

    return getattr(torch, name)


_OPS: dict[tuple[str, str], Callable[[dict[str, Any], list[Any], Any], Any]] = {
    ("ai.onnx", "Identity"): lambda a, x, d: x[0],
    ("ai.onnx", "Add"): _elementwise(lambda p, q: p + q),
    ("ai.onnx", "Sub"): _elementwise(lambda p, q: p - q),
    ("ai.onnx", "Mul"): _elementwise(lambda p, q: p * q),
    ("ai.onnx", "Div"): _elementwise(lambda p, q: p / q),
    ("ai.onnx", "Pow"): _elementwise(lambda p, q: p ** q),
    ("ai.onnx", "Sum"): lambda a, x, d: sum(x[1:], x[0]),
    ("ai.onnx", "Neg"): _elementwise(lambda p: -p),
    ("ai.onnx", "Abs"): _elementwise(lambda p: p.abs()),
    ("ai.onnx", "Relu"): _elementwise(lambda p: p.clamp_min(0)),
    ("ai.onnx", "Sigmoid"): _elementwise(lambda p: p.sigmoid()),
    ("ai.onnx", "Tanh"): _elementwise(lambda p: p.tanh()),
    ("ai.onnx", "Exp"): _elementwise(lambda p: p.exp()),
    ("ai.onnx", "Log"): _elementwise(lambda p: p.log()),
    ("ai.onnx", "Sqrt"): _elementwise(lambda p: p.sqrt()),
    ("ai.onnx", "Erf"): _elementwise(lambda p: p.erf()),
    ("ai.onnx", "Reciprocal"): _elementwise(lambda p: p.reciprocal()),
    ("ai.onnx", "MatMul"): _elementwise(lambda p, q: p @ q),
    ("ai.onnx", "Gemm"): _gemm,
    ("ai.onnx", "Conv"): _conv,
    ("ai.onnx", "ReduceMean"): _reduce("mean"),
    ("ai.onnx", "ReduceSum"): _reduce("sum"),
    ("ai.onnx", "GlobalAveragePool"): lambda a, x, d: x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True),
    ("ai.onnx", "Softmax"): lambda a, x, d: x[0].softmax(int(a.get("axis", -1))),
    ("ai.onnx", "Transpose"): lambda a, x, d: x[0].permute(*(a.get("perm") or reversed(range(x[0].dim())))),
    ("ai.onnx", "Reshape"): _reshape,
    ("ai.onnx", "Flatten"): lambda a, x, d: x[0].reshape(
        int(x[0].shape[:int(a.get("axis", 1))].numel()), -1),
    ("ai.onnx", "Unsqueeze"): _unsqueeze,
    ("ai.onnx", "Squeeze"): _squeeze,
    ("ai.onnx", "Cast"): _cast,
    ("ai.onnx", "Expand"): lambda a, x, d: x[0] * x[0].new_ones(_ints(x[1])),
    ("ai.onnx", "Concat"): lambda a, x, d: _torch("cat")([t for t in x if t is not None], dim=int(a["axis"])),
    ("com.microsoft", "ConvGrad"): _conv_grad,
    ("com.microsoft", "ReluGrad"): lambda a, x, d: x[0] * (x[1] > 0).to(x[0].dtype),
    ("com.microsoft", "SigmoidGrad"): lambda a, x, d: x[0] * x[1] * (1 - x[1]),
    ("com.microsoft", "TanhGrad"): lambda a, x, d: x[0] * (1 - x[1] * x[1]),
    ("com.microsoft", "FusedMatMul"): lambda a, x, d: a.get("alpha", 1.0) * (
        (x[0].transpose(-1, -2) if a.get("transA", 0) else x[0]) @
        (x[1].transpose(-1, -2) if a.get("transB", 0) else x[1])),
    ("org.pytorch.aten", "ATen"): _aten,
    ("com.microsoft", "QuickGelu"): lambda a, x, d: x[0] * (float(a.get("alpha", 1.702)) * x[0]).sigmoid(),
    ("com.microsoft", "QuickGeluGrad"): _quick_gelu_grad,
    ("com.microsoft", "Gelu"): _elementwise(lambda p: _gelu(p)),
    ("com.microsoft", "BiasGelu"): _elementwise(lambda p, q: _gelu(p + q)),
    ("com.microsoft", "GeluGrad"): _gelu_grad,
    ("com.microsoft", "SoftmaxGrad_13"): _softmax_grad,
    ("ai.onnx", "LayerNormalization"): _layer_norm,
    ("com.microsoft", "LayerNormalizationGrad"): _layer_norm_grad,
    ("com.microsoft", "FastGelu"): lambda a, x, d: _fast_gelu(x[0] + x[1] if len(x) > 1 and x[1] is not None else x[0]),
    ("com.microsoft", "FastGeluGrad"): lambda a, x, d: _vjp(_fast_gelu, x[0], x[1])[0],
    ("com.microsoft", "ConcatTraining"): _concat_training,
    ("ai.onnx", "Shape"): _shape,
    ("ai.onnx", "Gather"): _gather,
    ("ai.onnx", "Slice"): _slice,
    ("ai.onnx", "Split"): _split,
    ("ai.onnx", "Equal"): _elementwise(lambda p, q: p == q),
    ("ai.onnx", "Where"): _elementwise(lambda c, p, q: _torch("where")(c, p, q)),
    ("ai.onnx", "Trilu"): lambda a, x, d: (x[0].triu if a.get("upper", 1) else x[0].tril)(
        int(x[1]) if len(x) > 1 and x[1] is not None else 0),
}
