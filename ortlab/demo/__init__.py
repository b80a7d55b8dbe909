"""The bundled demo: a tiny GPT-style character model trained on the opening of Alice in Wonderland."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from importlib import resources

import torch
from torch import nn
from torch.nn import functional as F

from ortlab.workload import Workload


def text() -> str:
    return resources.files(__package__).joinpath("alice.txt").read_text(encoding="utf-8")


class CausalSelfAttention(nn.Module):
    """Attention from Linear/view/matmul: nn.MultiheadAttention fails ORT's symbolic shape inference."""

    def __init__(self, d_model: int, n_head: int, seq_len: int, dropout: float):
        super().__init__()
        self.n_head, self.d_model, self.head_dim = n_head, d_model, d_model // n_head  # ints: no tracer warning
        self.scale = 1.0 / math.sqrt(d_model // n_head)  # a Python float: no tracer warning at export
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(seq_len, seq_len)).view(1, 1, seq_len, seq_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=2)
        q = q.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, seq_len: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, seq_len, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MHABlock(nn.Module):
    """The same block with torch's nn.MultiheadAttention, which ORTModule 1.19.2 cannot export for training."""

    def __init__(self, d_model: int, n_head: int, seq_len: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_head, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d_model=64, n_layer=2, n_head=4, seq_len=64, dropout=0.1, block=Block):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[block(d_model, n_head, seq_len, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos[:, : idx.shape[1]])
        return self.head(self.ln_f(self.blocks(x)))


class Passages(Sequence):
    """Variable-length training samples: passage i is `seq_len // 8` to `seq_len` characters (plus the next one,
    the last target) from a place in the text, both drawn from a generator seeded by i alone."""

    def __init__(self, data: torch.Tensor, seq_len: int, size: int):
        self.data, self.seq_len, self.size = data, seq_len, size
        self.shortest = max(2, seq_len // 8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        i = operator.index(i)
        if not 0 <= i < self.size:
            raise IndexError(i)
        g = torch.Generator().manual_seed(2_000_003 * i + 29)
        length = int(torch.randint(self.shortest, self.seq_len + 1, (1,), generator=g))
        start = int(torch.randint(0, len(self.data) - length - 1, (1,), generator=g))
        return self.data[start : start + length + 1]


def passage_length(sample: torch.Tensor) -> int:
    """A passage's complexity: the tokens the model reads."""
    return len(sample) - 1


def pad_passages(samples: list[torch.Tensor]):
    """Inputs padded with 0 and targets with -100 (cross_entropy's ignore_index) to the longest passage: padding
    comes after the tokens, so causal attention never reads it and the loss ignores it."""
    longest = max(len(s) - 1 for s in samples)
    x = torch.zeros(len(samples), longest, dtype=torch.long)
    y = torch.full((len(samples), longest), -100, dtype=torch.long)
    for row, s in enumerate(samples):
        x[row, : len(s) - 1] = s[:-1]
        y[row, : len(s) - 1] = s[1:]
    return x, y


def gpt(n_layer: int = 2, d_model: int = 64, n_head: int = 4, seq_len: int = 64, batch_size: int = 8,
        dropout: float = 0.1, attention: str = "linear", variable_length: bool = False,
        dataset_size: int = 512) -> Workload:
    """The demo workload. `attention="mha"` uses nn.MultiheadAttention, which ORTModule fails to export.

    `variable_length=True` gives a dataset of `dataset_size` passages of different lengths (ortlab.demo.Passages),
    batches padded to their longest passage and a complexity (the length), so that samplers can balance ranks."""
    if not isinstance(variable_length, bool):
        raise ValueError(f"variable_length={variable_length!r}: allowed are True and False")
    if not isinstance(dataset_size, int) or isinstance(dataset_size, bool) or dataset_size < 1:
        raise ValueError(f"dataset_size={dataset_size!r}: allowed is a whole number >= 1")
    if attention not in ("linear", "mha"):
        raise ValueError(f"attention={attention!r}: allowed are 'linear' and 'mha'")
    for label, value, low in (("n_layer", n_layer, 1), ("d_model", d_model, 1), ("n_head", n_head, 1),
                              ("seq_len", seq_len, 2), ("batch_size", batch_size, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{label}={value!r}: allowed is a whole number >= {low}")
    if d_model % n_head:
        raise ValueError(f"d_model={d_model} is not a multiple of n_head={n_head}")
    if not (isinstance(dropout, int | float) and 0 <= dropout < 1):
        raise ValueError(f"dropout={dropout!r}: allowed is a number in [0, 1)")
    corpus = text()
    chars = sorted(set(corpus))
    data = torch.tensor([chars.index(c) for c in corpus], dtype=torch.long)
    block = Block if attention == "linear" else MHABlock
    model = TinyGPT(len(chars), d_model, n_layer, n_head, seq_len, dropout, block)

    def batch(step: int):
        g = torch.Generator().manual_seed(1_000_003 * step + 17)
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
        x = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
        y = torch.stack([data[s + 1 : s + seq_len + 1] for s in starts.tolist()])
        return x, y

    def loss(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    name = f"TinyGPT(n_layer={n_layer}, d_model={d_model}, seq_len={seq_len}, attention={attention})"
    if variable_length:
        return Workload(model, None, loss, name=f"{name[:-1]}, variable_length)", batch_size=batch_size,
                        dataset=Passages(data, seq_len, dataset_size), collate=pad_passages,
                        complexity=passage_length)
    return Workload(model, batch, loss, name=name, batch_size=batch_size)
