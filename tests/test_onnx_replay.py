"""ONNX nodes replayed in torch (ortlab.verdict.onnx_replay), checked against ORT's own kernels: a node whose
replay computed something else than ORT would be blamed on every graph that holds it."""

import pytest
import torch

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from ortlab.verdict.onnx_replay import NotReplayed, replay  # noqa: E402

pytestmark = pytest.mark.ort  # ORT's training build runs the com.microsoft gradient ops


def _ort(node, inputs):
    """The node run alone by an ORT session on the CPU."""
    import onnxruntime

    names = [n for n in node.input if n]
    types = {torch.float32: TensorProto.FLOAT, torch.int64: TensorProto.INT64, torch.bool: TensorProto.BOOL}
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(n, types[t.dtype], None)
                                             for n, t in zip(names, inputs, strict=True)],
                              [onnx.ValueInfoProto(name=o) for o in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [torch.from_numpy(r) for r in session.run(None, {n: t.numpy() for n, t in zip(names, inputs,
                                                                                         strict=True)})]


def _node(op, n_in, n_out=1, domain="", **attrs):
    return helper.make_node(op, [f"i{k}" for k in range(n_in)], [f"o{k}" for k in range(n_out)], domain=domain,
                            **attrs)


g = torch.Generator().manual_seed(0)
X = torch.randn(2, 3, 4, 5, generator=g)
DY = torch.randn(2, 3, 4, 5, generator=g)
CASES = [
    (_node("Mul", 2), [X, torch.randn(2, 3, 1, 1, generator=g)]),
    (_node("Sum", 3), [X, DY, X]),
    (_node("Sigmoid", 1), [X]),
    (_node("Conv", 3, pads=[1, 1, 1, 1], strides=[1, 1]), [X, torch.randn(6, 3, 3, 3, generator=g),
                                                            torch.randn(6, generator=g)]),
    (_node("Gemm", 3, transB=1, alpha=0.5, beta=2.0), [X[0, 0], torch.randn(7, 5, generator=g),
                                                       torch.randn(7, generator=g)]),
    (_node("ReduceMean", 1, axes=[2, 3], keepdims=1), [X]),
    (_node("ReduceSum", 2, keepdims=0), [X, torch.tensor([1, 3])]),
    (_node("Softmax", 1, axis=-1), [X]),
    (_node("Transpose", 1, perm=[0, 2, 1, 3]), [X]),
    (_node("Reshape", 2), [X, torch.tensor([0, 3, -1])]),
    (_node("Slice", 4), [X, torch.tensor([1]), torch.tensor([4]), torch.tensor([2])]),
    (_node("Split", 2, 2, axis=3),
     [X, torch.tensor([2, 3])]),
    (_node("Gather", 2, axis=1), [X, torch.tensor([[2, 0], [1, 1]])]),
    (_node("Where", 3), [X > 0, X, DY]),
    (_node("Trilu", 1, upper=0), [X]),
    (_node("LayerNormalization", 3, 3, axis=-1, epsilon=1e-5), [X, torch.randn(5, generator=g),
                                                                torch.randn(5, generator=g)]),
    (_node("SigmoidGrad", 2, domain="com.microsoft"), [DY, X.sigmoid()]),
    (_node("ReluGrad", 2, domain="com.microsoft"), [DY, X.relu()]),
    (_node("QuickGeluGrad", 2, domain="com.microsoft", alpha=1.702), [DY, X]),
    (_node("QuickGelu", 1, domain="com.microsoft", alpha=1.702), [X]),
    (_node("GeluGrad", 2, domain="com.microsoft"), [DY, X]),
    (_node("FastGeluGrad", 2, domain="com.microsoft"), [DY, X]),
    (_node("SoftmaxGrad_13", 2, domain="com.microsoft", axis=-1), [DY, X.softmax(-1)]),
    (_node("FastGelu", 2, domain="com.microsoft"), [X, torch.randn(5, generator=g)]),
    (_node("LayerNormalizationGrad", 5, 3, domain="com.microsoft", axis=-1),
     [DY, X, torch.randn(5, generator=g), X.mean(-1, keepdim=True), (X.var(-1, unbiased=False, keepdim=True)
                                                                     + 1e-5).rsqrt()]),
    (_node("ConvGrad", 3, 3, domain="com.microsoft", pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=1,
           kernel_shape=[1, 1]), [torch.randn(2, 6, 4, 5, generator=g), X, torch.randn(6, 3, 1, 1, generator=g)]),
]


@pytest.mark.parametrize("node,inputs", CASES, ids=[f"{c[0].domain or 'ai.onnx'}.{c[0].op_type}" for c in CASES])
def test_a_replay_computes_what_orts_kernel_computes(node, inputs):
    pytest.importorskip("onnxruntime")
    ort = _ort(node, inputs)
    mine = replay(node, inputs, torch.float32)
    for a, b in zip(ort, mine, strict=False):
        if b is None:
            continue
        assert a.shape == b.shape, (node.op_type, a.shape, b.shape)
        assert torch.allclose(a.to(b.dtype), b, rtol=1e-4, atol=1e-5), (node.op_type, float((a - b).abs().max()))


def test_an_op_without_a_replay_says_so():
    with pytest.raises(NotReplayed, match=r"no float64 replay of ai\.onnx\.NonMaxSuppression"):
        replay(_node("NonMaxSuppression", 2), [X, X], torch.float64)
    with pytest.raises(NotReplayed, match="asymmetric pads"):
        replay(_node("Conv", 2, pads=[0, 1, 0, 0]), [X, torch.randn(6, 3, 1, 1)], torch.float64)
