"""Every layer the torch.nn fixes rewrite, bare and in its variants (masks, directions, groups, modes), in one model:
one ORTModule export tries them all. Parameterless layers get a learned gain in front, so that their gradient
reaches a parameter."""

import torch
import torch.nn.functional as F
from torch import nn

from ortlab import Workload


def _g(seed):
    return torch.Generator().manual_seed(seed)


class Bare(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 2.0, 12))
        self.activations = nn.ModuleList([nn.Hardswish(), nn.Hardsigmoid(), nn.Mish(), nn.Softplus(2, 3),
                                          nn.ELU(0.5), nn.SELU(), nn.CELU(1.3)])
        self.prelu = nn.PReLU(4)
        self.shuffle, self.unshuffle = nn.PixelShuffle(2), nn.PixelUnshuffle(2)
        self.instance1 = nn.InstanceNorm1d(8, affine=True)
        self.instance2 = nn.InstanceNorm2d(4)
        self.instance3 = nn.InstanceNorm3d(4, affine=True, track_running_stats=True)
        self.rms = nn.RMSNorm([3, 8])
        self.gru = nn.GRU(8, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.lstm = nn.LSTM(8, 4, bidirectional=True)
        self.rnn = nn.RNN(8, 4, bidirectional=True, nonlinearity="relu")
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.attention_kv = nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, kdim=6, vdim=5)
        self.decoder = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0)
        self.bag_sum = nn.EmbeddingBag(10, 4, mode="sum")
        self.bag_mean = nn.EmbeddingBag(10, 4, mode="mean", padding_idx=0)
        self.bag_max = nn.EmbeddingBag(10, 4, mode="max", include_last_offset=True)
        self.embedding = nn.Embedding(10, 4, max_norm=1.0)
        self.up1 = nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.ConvTranspose2d(4, 4, (3, 2), stride=(2, 3), padding=(1, 0), groups=2, dilation=(1, 2))
        self.up3 = nn.ConvTranspose3d(4, 2, 2, stride=2, bias=False)
        self.drop = nn.ModuleList([nn.Dropout1d(0.2), nn.Dropout2d(0.2), nn.AlphaDropout(0.2)])
        self.classes = nn.Linear(8, 5)

    def forward(self, image, seq, volume, ids, offsets, weights, labels):
        g = self.gain
        out = [act(image * g[i]) for i, act in enumerate(self.activations)]
        out += [self.prelu(image), self.unshuffle(self.shuffle(image * g[7])), self.instance1(seq.transpose(1, 2)),
                self.instance2(image), self.instance3(volume), self.rms(seq * g[8])]
        out += [self.gru(seq)[0], self.gru(seq)[1], self.lstm(seq)[0], self.lstm(seq)[1][1], self.rnn(seq)[0]]
        causal = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)
        padding = torch.tensor([[False, False, True], [False, False, False]])
        attended, weights_ = self.attention(seq, seq, seq, attn_mask=causal, key_padding_mask=padding,
                                            average_attn_weights=False)
        out += [attended, weights_]
        time_first = seq.transpose(0, 1)
        out += [self.attention_kv(time_first, time_first[..., :6], time_first[..., :5], need_weights=False)[0],
                self.decoder(time_first, time_first, tgt_mask=causal.float() * -1e9)]
        out += [self.bag_sum(ids, offsets, per_sample_weights=weights), self.bag_mean(ids.reshape(2, 4)),
                self.bag_max(ids, torch.cat([offsets, offsets.new_tensor([8])])), self.embedding(ids)]
        out += [self.up1(seq.transpose(1, 2)[:, :4]), self.up2(image), self.up3(volume)]
        out += [F.interpolate(image * g[9], scale_factor=2, mode="bilinear"),
                F.interpolate(image * g[9], size=(5, 7), mode="bilinear", align_corners=True),
                F.interpolate(seq.transpose(1, 2) * g[10], scale_factor=1.5, mode="linear"),
                F.interpolate(volume * g[11], scale_factor=2, mode="trilinear")]
        out += [self.drop[0](seq.transpose(1, 2) * g[0]), self.drop[1](image * g[1]), self.drop[2](image * g[2])]
        loss = F.cross_entropy(self.classes(seq).reshape(-1, 5), labels, label_smoothing=0.1, ignore_index=4)
        return torch.cat([o.reshape(-1) for o in out] + [loss.reshape(1)])


def _inputs(step):
    ids = torch.randint(0, 10, (8,), generator=_g(100 + step))
    ids[1] = 0
    return {"image": torch.randn(2, 4, 4, 4, generator=_g(step)), "seq": torch.randn(2, 3, 8, generator=_g(step)),
            "volume": torch.randn(1, 4, 2, 2, 2, generator=_g(step)), "ids": ids,
            "offsets": torch.tensor([0, 3, 3, 6]), "weights": torch.rand(8, generator=_g(step)),
            "labels": torch.randint(0, 5, (6,), generator=_g(200 + step))}


def bare():
    model = Bare()
    size = model(**_inputs(0)).numel()

    def batch(step):
        return _inputs(step), torch.randn(size, generator=_g(300 + step))

    return Workload(model, batch, lambda out, target: F.mse_loss(torch.sin(3 * out), target), name="bare layers",
                    batch_size=2)
