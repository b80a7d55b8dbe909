"""Models for the activation-statistics tests: the demo with a difference injected into one module from a
chosen step on, with randomness that escapes parity mode, and one whose modules return structured outputs and
tap."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ortlab import Workload
from ortlab.activations import tap
from ortlab.demo import gpt


def injected(module: str = "blocks.1.mlp.0", step: int | None = None, scale: float = 1.01,
             **kwargs) -> Workload:
    """The demo GPT whose `module` multiplies its output by `scale` from `step` on. The switch is a buffer
    that `batch(step)` sets, so it works inside ORTModule's graph too (persistent buffers are graph inputs). A
    huge `scale` (3e38) overflows: the values beyond +-1.13 become inf, and the loss nan after them."""
    w = gpt(**kwargs)
    target = dict(w.model.named_modules())[module]
    target.register_buffer("inject_on", torch.zeros(()))  # persistent: a graph input, not a constant
    target.register_forward_hook(lambda m, args, out: out + out * ((scale - 1) * m.inject_on))
    batch = w.batch

    def switched(i: int):
        target.inject_on.fill_(1.0 if step is not None and i >= step else 0.0)
        return batch(i)

    return Workload(w.model, switched, w.loss, name=f"demo, {module} x{scale} from step {step}",
                    batch_size=w.batch_size)


def handmade_dropout(module: str = "blocks.0.attn", p: float = 0.1, **kwargs) -> Workload:
    """The demo GPT where `module`'s output is masked with `torch.rand`: no dropout module or F.dropout call,
    so parity mode's dropout switch does not reach it."""
    w = gpt(**kwargs)
    target = dict(w.model.named_modules())[module]

    def mask(m, args, out):
        return out * (torch.rand_like(out) >= p) / (1 - p) if m.training else out

    target.register_forward_hook(mask)
    return w


class _Doubling(nn.Module):
    """Doubles gradients with tensor hooks of its own, as user code does: one on a tensor the collector has hooked
    already (its linear layer's output), one on a tensor before the collector sees it (its own output)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        y = self.lin(x)
        y.register_hook(self._double)
        out = y * 1.0
        out.register_hook(self._double)
        return out

    def _double(self, grad):
        self.calls += 1
        return grad * 2


def own_grad_hooks(batch_size: int = 3) -> Workload:
    """A model whose own tensor hooks double gradients; its head is frozen, so the gradient of `0` is the same
    every step: 2 * batch_size * head.weight.sum() in total, and that of `0.lin` the same (the collector's hook
    runs before the model's hook registered after it)."""
    model = nn.Sequential(_Doubling(), nn.Linear(4, 1))
    model[1].requires_grad_(False)

    def batch(i: int):
        return torch.randn(batch_size, 4, generator=torch.Generator().manual_seed(i)), None

    return Workload(model, batch, lambda out, target: out.sum(), name="own gradient hooks",
                    batch_size=batch_size)


def own_rng(module: str = "blocks.0.mlp.1", **kwargs) -> Workload:
    """The demo GPT where `module` adds noise from its own generator, which no seed resets: not
    deterministic."""
    w = gpt(**kwargs)
    target = dict(w.model.named_modules())[module]
    generator = torch.Generator().manual_seed(1234)
    target.register_forward_hook(
        lambda m, args, out: out + 1e-3 * torch.randn(out.shape, generator=generator))
    return w


Pair = namedtuple("Pair", "first second")


@dataclass
class Output:
    hidden: torch.Tensor
    extra: dict


class Cache:
    """Like transformers' cache objects: tensors in lists on a plain object."""

    def __init__(self, keys: list[torch.Tensor]):
        self.key_cache = keys
        self.seen = 3


class Splitter(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, 2 * d)

    def forward(self, x):
        a, b = self.lin(x).chunk(2, dim=-1)
        return Pair(a, b), "a label", 7


class Mixer(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, pair):
        h = tap("mixer_product", pair.first * torch.sigmoid(pair.second))
        h = self.lin(h)
        return Output(h, {"gate": torch.sigmoid(pair.second), "note": None}), Cache([h.detach() * 2])


class Structured(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.split = Splitter(d)
        self.mix = Mixer(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        pair, _, _ = self.split(self.emb(idx))
        out, _cache = self.mix(pair)
        return {"logits": self.head(out.hidden), "gate": out.extra["gate"]}


def structured(batch_size: int = 4, seq_len: int = 6) -> Workload:
    model = Structured()

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, 16, (batch_size, seq_len), generator=g)
        return idx, idx

    def loss(out, target):
        return F.cross_entropy(out["logits"].reshape(-1, 16), target.reshape(-1))

    return Workload(model, batch, loss, name="structured outputs", batch_size=batch_size)


def tiny_t5(batch_size: int = 2, seq_len: int = 8) -> Workload:
    """A transformers T5 from a tiny random config (no download). Its decoder returns an EncoderDecoderCache,
    which ORT's own StatisticsSubscriber cannot flatten; its attention calls F.dropout, which parity mode
    turns off."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
                      num_heads=2, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config)

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(1, 64, (batch_size, seq_len), generator=g)
        return {"input_ids": ids, "decoder_input_ids": ids}, ids

    def loss(out, ids):
        return F.cross_entropy(out["logits"].reshape(-1, 64), ids.reshape(-1))

    return Workload(model, batch, loss, name="tiny T5", batch_size=batch_size)
