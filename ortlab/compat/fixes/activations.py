"""Activation functions that ORT 1.19.2 cannot differentiate written with operators it can: the exporter writes
nn.Hardswish, nn.Hardsigmoid, nn.Mish and nn.Softplus (both as Softplus), nn.ELU, nn.SELU, nn.CELU and nn.PReLU
as the ONNX operators of those names, and ORT has no gradient builder for any of them ("The gradient builder has
not been registered: HardSwish"): MobileNetV3 (Hardswish), YOLO-style detectors (Mish) and ELU/PReLU networks do
not train. Rewritten with ReLU, Where, Exp, Log, Tanh (all with ORT gradients), each is the same function:

    hardsigmoid(x) = (relu(x + 3) - relu(x - 3)) / 6          hardswish(x) = x * hardsigmoid(x)
    softplus(x) = relu(x) + log(1 + exp(-|x|)), x where beta * x > threshold     mish(x) = x * tanh(softplus(x))
    elu(x) = x if x > 0 else alpha * (exp(min(x, 0)) - 1)      selu = scale * elu(x, alpha) (torch's constants)
    celu(x) = x if x > 0 else alpha * (exp(min(x, 0) / alpha) - 1)   prelu(x) = relu(x) - w * relu(-x)

The gradients are PyTorch's to rounding (at exactly x = +-3 for the hard functions they take the other one-sided
limit). `inplace=True` is computed out of place: the input is needed for the gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ortlab.compat.blockers import NO_GRADIENT
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind

OPS = ("HardSwish", "HardSigmoid", "Softplus", "Elu", "Selu", "Celu", "PRelu")
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _hardsigmoid(x: Any) -> Any:
    import torch.nn.functional as F

    return (F.relu(x + 3) - F.relu(x - 3)) / 6


def _softplus(x: Any) -> Any:
    import torch
    import torch.nn.functional as F

    return F.relu(x) + torch.log(1 + torch.exp(-torch.abs(x)))


def _elu(x: Any, alpha: float, inner: float = 1.0) -> Any:
    import torch
    import torch.nn.functional as F

    return torch.where(x > 0, x, alpha * (torch.exp(-F.relu(-x) / inner) - 1))


def hardsigmoid(input: Any, inplace: bool = False, *, original: Any) -> Any:
    return _hardsigmoid(input)


def hardswish(input: Any, inplace: bool = False, *, original: Any) -> Any:
    return input * _hardsigmoid(input)


def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0, *, original: Any) -> Any:
    import torch

    scaled = input * beta
    return torch.where(scaled > threshold, input, _softplus(scaled) / beta)


def mish(input: Any, inplace: bool = False, *, original: Any) -> Any:
    import torch

    return input * torch.tanh(_softplus(input))


def elu(input: Any, alpha: float = 1.0, inplace: bool = False, *, original: Any) -> Any:
    return _elu(input, alpha)


def selu(input: Any, inplace: bool = False, *, original: Any) -> Any:
    return SELU_SCALE * _elu(input, SELU_ALPHA)


def celu(input: Any, alpha: float = 1.0, inplace: bool = False, *, original: Any) -> Any:
    return _elu(input, alpha, alpha)


def prelu(input: Any, weight: Any, *, original: Any) -> Any:
    import torch.nn.functional as F

    if input.dim() >= 2 and weight.numel() > 1:
        weight = weight.reshape((-1,) + (1,) * (input.dim() - 2))
    return F.relu(input) - weight * F.relu(-input)


REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "hardsigmoid": hardsigmoid, "hardswish": hardswish, "softplus": softplus, "mish": mish, "elu": elu,
    "selu": selu, "celu": celu, "prelu": prelu}


FIX = Fix("activations", "F.hardswish, hardsigmoid, softplus, mish, elu, selu, celu and prelu written with relu, "
          "where, exp and log", FixKind.MODULE, removes=lambda b: b.kind == NO_GRADIENT and b.op in OPS,
          apply=replacing(REPLACEMENTS))
