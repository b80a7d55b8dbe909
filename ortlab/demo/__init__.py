"""The bundled demo: a tiny GPT-style character model trained on the opening of Alice in Wonderland."""

from __future__ import annotations

import math
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
        self.n_head = n_head
        self.scale = 1.0 / math.sqrt(d_model // n_head)  # a Python float: no tracer warning at export
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(seq_len, seq_len)).view(1, 1, seq_len, seq_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
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


def gpt(n_layer: int = 2, d_model: int = 64, n_head: int = 4, seq_len: int = 64, batch_size: int = 8,
        dropout: float = 0.1, attention: str = "linear") -> Workload:
    """The demo workload. `attention="mha"` uses nn.MultiheadAttention, which ORTModule fails to export."""
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
    return Workload(model, batch, loss, name=name, batch_size=batch_size)
