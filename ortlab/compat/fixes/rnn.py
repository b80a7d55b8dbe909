"""Bidirectional GRU and LSTM run as two one-directional passes on the module's own weights (the reverse one on
the time-flipped sequence, its output flipped back), layer by layer, outputs concatenated as torch concatenates
them; and nn.RNN (either direction) written out as its cell, h = act(x W_ih^T + b_ih + h W_hh^T + b_hh), step by
step. ORT 1.19.2's GRU and LSTM training kernels run the forward direction only ("GRUTraining and GRUGrad kernel
only supports the forward direction for now"), and it has no gradient builder for ONNX RNN at all: bidirectional
taggers and speech encoders do not train. The same weights give the same outputs and gradients; dropout between
layers is applied as torch applies it. Packed sequences and LSTM projections (`proj_size`) are left to torch's
forward. nn.RNN's steps are unrolled at export: the graph holds the first batch's sequence length."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

from ortlab.compat.blockers import NO_GRADIENT, NO_GRADIENT_KERNEL, ORT_FAILED
from ortlab.compat.registry import Fix, FixKind

OPS = ("GRU", "LSTM", "RNN")


def _targets(model: Any) -> list[Any]:
    import torch

    out = []
    for m in model.modules():
        if isinstance(m, torch.nn.RNN) or (isinstance(m, torch.nn.GRU | torch.nn.LSTM) and m.bidirectional
                                           and not getattr(m, "proj_size", 0)):
            out.append(m)
    return out


def _weights(module: Any, layer: int, reverse: bool) -> list[Any]:
    suffix = f"_l{layer}" + ("_reverse" if reverse else "")
    names = [f"weight_ih{suffix}", f"weight_hh{suffix}"] + ([f"bias_ih{suffix}", f"bias_hh{suffix}"]
                                                            if module.bias else [])
    return [getattr(module, n) for n in names]


def _rnn_cell(x: Any, h: Any, weights: list[Any], nonlinearity: str) -> tuple[Any, Any]:
    """nn.RNN's recurrence over x (L, N, I) from h (N, H): (outputs (L, N, H), last h)."""
    import torch
    import torch.nn.functional as F

    w_ih, w_hh, *biases = weights
    b_ih, b_hh = biases if biases else (None, None)
    act = torch.tanh if nonlinearity == "tanh" else F.relu
    projected = F.linear(x, w_ih, b_ih)
    outs = []
    for t in range(x.shape[0]):
        h = act(projected[t] + F.linear(h, w_hh, b_hh))
        outs.append(h)
    return torch.stack(outs), h


def _one_direction(module: Any, x: Any, hx: Any, weights: list[Any]) -> tuple[Any, Any]:
    """One layer, one direction, time first: (outputs, final state as the module's hx is shaped)."""
    import torch

    if isinstance(module, torch.nn.RNN):
        out, h = _rnn_cell(x, hx, weights, module.nonlinearity)
        return out, h
    if isinstance(module, torch.nn.LSTM):
        out, h, c = torch._VF.lstm(x, (hx[0].unsqueeze(0), hx[1].unsqueeze(0)), weights, module.bias, 1, 0.0,
                                   module.training, False, False)
        return out, (h[0], c[0])
    out, h = torch._VF.gru(x, hx.unsqueeze(0), weights, module.bias, 1, 0.0, module.training, False, False)
    return out, h[0]


def forward(self: Any, input: Any, hx: Any = None, *, original: Any) -> Any:
    """The module's forward as two one-directional passes per layer (or the RNN cell written out)."""
    import torch
    import torch.nn.functional as F

    if isinstance(input, torch.nn.utils.rnn.PackedSequence):
        return original(input, hx)
    lstm = isinstance(self, torch.nn.LSTM)
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(1)
    if self.batch_first and batched:
        x = x.transpose(0, 1)
    directions = 2 if self.bidirectional else 1
    states = self.num_layers * directions
    if hx is None:
        zeros = torch.zeros(states, x.shape[1], self.hidden_size, dtype=x.dtype, device=x.device)
        hx = (zeros, zeros) if lstm else zeros
    elif not batched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1)) if lstm else hx.unsqueeze(1)
    finals = []
    for layer in range(self.num_layers):
        outs = []
        for d in range(directions):
            i = layer * directions + d
            h0 = (hx[0][i], hx[1][i]) if lstm else hx[i]
            seq = x.flip(0) if d else x
            out, h = _one_direction(self, seq, h0, _weights(self, layer, bool(d)))
            outs.append(out.flip(0) if d else out)
            finals.append(h)
        x = torch.cat(outs, dim=-1) if directions == 2 else outs[0]
        if self.dropout and self.training and layer < self.num_layers - 1:
            x = F.dropout(x, self.dropout, True)
    h_n: Any  # (h, c) for an LSTM, else h
    h_n = (torch.stack([h for h, _ in finals]), torch.stack([c for _, c in finals])) if lstm else torch.stack(finals)
    if self.batch_first and batched:
        x = x.transpose(0, 1)
    if not batched:
        x = x.squeeze(1)
        h_n = (h_n[0].squeeze(1), h_n[1].squeeze(1)) if lstm else h_n.squeeze(1)
    return x, h_n


@contextlib.contextmanager
def _apply(model: Any) -> Iterator[None]:
    import functools

    targets = _targets(model)
    try:
        for m in targets:
            m.forward = types.MethodType(functools.partial(forward, original=m.forward), m)
        yield
    finally:
        for m in targets:
            m.__dict__.pop("forward", None)


def _removes(blocker: Any) -> bool:
    return blocker.op in OPS and blocker.kind in (NO_GRADIENT, NO_GRADIENT_KERNEL, ORT_FAILED)


FIX = Fix("bidirectional-rnn", "bidirectional GRU/LSTM as two one-directional passes on the same weights, nn.RNN "
          "as its cell written out", FixKind.MODULE, removes=_removes, apply=_apply,
          applies_to=lambda model: bool(_targets(model)))
