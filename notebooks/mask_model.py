"""A model as people write it today: the attention-mask code of transformers 5 in small (positions of packed
sequences found with torch.diff, numbered with a cumulative sum of a bool mask), over a small MLP.
Notebook 08 asks whether it runs on ORTModule."""

import torch
from torch import nn

import ortlab


class PackedMLP(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, vocab))

    def forward(self, ids, positions):
        step = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)  # 1 inside a sequence
        sequence = (step != 1).cumsum(-1)  # which packed sequence each token is in
        h = self.embed(ids) * (1.0 + sequence.unsqueeze(-1))
        return self.mlp(h)


def make(batch_size: int = 4, seq_len: int = 16):
    vocab = 64

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
        cut = seq_len // 2  # two sequences packed in every row
        positions = torch.cat([torch.arange(cut), torch.arange(seq_len - cut)]).expand(batch_size, -1)
        return (ids[:, :-1], positions), ids[:, 1:]

    def loss(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    return ortlab.Workload(PackedMLP(vocab), batch, loss, name="packed MLP", batch_size=batch_size)
