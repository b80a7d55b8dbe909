"""What ONNX Runtime 1.19.2 lacks for the common torch.nn layers, read from its source: for each operator a
blocker names, whether ORT has it on CUDA, where, and what a person can do instead. `ortlab check` attaches this
to the blockers it finds (`Blocker.cuda`, and the remedy when no ortlab fix removes it).

Gradient builders (orttraining/orttraining/core/graph/gradient_builder_registry.cc) are the same on every device:
an operator without one has no gradient on CUDA either. Gradient kernels are per device: ConvTransposeGrad and
ResizeGrad have CUDA kernels (orttraining/orttraining/training_ops/cuda/nn/conv_transpose_grad.cc,
orttraining/orttraining/training_ops/cuda/tensor/resize_grad.cc) and no CPU one; the GRU and LSTM training kernels
exist on the CPU only (orttraining/orttraining/training_ops/cpu/rnn/), forward direction only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    cuda: bool  # whether ORT 1.19.2 has what is missing on CUDA
    where: str  # ORT's source that decides it
    alternative: str  # what to write instead, keeping the math where possible


_BUILDERS = "orttraining/orttraining/core/graph/gradient_builder_registry.cc"
_NO_BUILDER = "no gradient builder on any device"

KNOWN: dict[str, Known] = {
    "ConvTransposeGrad": Known(True, "orttraining/orttraining/training_ops/cuda/nn/conv_transpose_grad.cc (CUDA "
                               "only)", "the fix conv-transpose (a convolution of the zero-stuffed input: the same "
                               "math), or nearest upsampling followed by a Conv2d (another model)"),
    "ResizeGrad": Known(True, "orttraining/orttraining/training_ops/cuda/tensor/resize_grad.cc (CUDA only, 4-D)",
                        "the fix linear-interpolation (matrix products: the same math), or mode='nearest', whose "
                        "gradient ORT builds without ResizeGrad (another model)"),
    "GRU": Known(False, "orttraining/orttraining/training_ops/cpu/rnn/gru_io_utils.cc (forward direction only; no "
                 "CUDA kernel)", "the fix bidirectional-rnn (two one-directional passes on the same weights)"),
    "LSTM": Known(False, "orttraining/orttraining/training_ops/cpu/rnn/lstm_io_utils.cc (forward direction only; "
                  "no CUDA kernel)", "the fix bidirectional-rnn (two one-directional passes on the same weights)"),
    "RNN": Known(False, f"{_BUILDERS}: {_NO_BUILDER}", "the fix bidirectional-rnn (the cell written out), or nn.GRU"),
    "aten::ctc_loss": Known(False, "torch.onnx has no symbolic for it at any opset (not ORT's)",
                            "compute the CTC loss outside the module that ORTModule wraps (the model returns the "
                            "log-probabilities; PyTorch computes the loss and its gradient)"),
}
for _op in ("HardSwish", "HardSigmoid", "Softplus", "Elu", "Selu", "Celu", "PRelu", "DepthToSpace", "SpaceToDepth",
            "InstanceNormalization"):
    KNOWN[_op] = Known(False, f"{_BUILDERS}: {_NO_BUILDER}", "the ortlab fix named with it (the same math written "
                       "with operators ORT differentiates)")


def known(op: str) -> Known | None:
    return KNOWN.get(op) or KNOWN.get(op.removesuffix("Grad"))
